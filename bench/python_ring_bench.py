#!/usr/bin/python3
"""Python GEMMs of shared buffers through the submission ring vs as unary Gemm calls naming the
regions, one client, closed loop, concurrency 1: c.gemm(A, B, out=C) with A, B and
C all from c.shared_buffer, on the native core (the ring is the native core's); ring=False is
the unary path. Prints req/s, p50 and p99 of each, the windows interleaved so that a noisy
neighbour hits both alike.

    /usr/bin/python3 bench/python_ring_bench.py --server=unix:/tmp/ringrun/hgemm.sock \\
        [--shape=64x64x64] [--window_s=1] [--windows=4] [--warmup_s=0.5]

The server needs --allow_shared_memory. Needs the hgemm package with its library
(pip install ./client/python, or PYTHONPATH=client/python and $HGEMM_NATIVE_LIB).
"""
import argparse
import os
import sys
import time
import uuid

import numpy as np

try:
    import hgemm
except ImportError:  # run from a clone without installing
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "client",
                                    "python"))
    import hgemm


def run_window(client, a, b, out, seconds: float) -> list:
    """Latencies (ms) of back-to-back GEMMs for `seconds`."""
    latencies = []
    end = time.perf_counter() + seconds
    while True:
        start = time.perf_counter()
        if start >= end:
            return latencies
        client.gemm(a, b, out=out)
        latencies.append((time.perf_counter() - start) * 1e3)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--server", required=True, help="unix:PATH of the server's socket")
    parser.add_argument("--shape", default="64x64x64", help="MxNxK")
    parser.add_argument("--window_s", type=float, default=1.0)
    parser.add_argument("--windows", type=int, default=4, help="per path, interleaved")
    parser.add_argument("--warmup_s", type=float, default=0.5)
    args = parser.parse_args()
    m, n, k = (int(x) for x in args.shape.split("x"))
    if hgemm.info()["core"] != "native":
        print(f"the native core does not load: {hgemm.info()['reason']}", file=sys.stderr)
        return 1
    rng = np.random.default_rng(1)
    paths = {}
    for name, ring in (("ring", True), ("unary", False)):
        client = hgemm.Client(args.server, ring=ring, timeout=60,
                              client_id=f"ringbench-{uuid.uuid4().hex[:8]}")
        a, b, out = (client.shared_buffer((m, k)), client.shared_buffer((k, n)),
                     client.shared_buffer((m, n)))
        a[:] = rng.uniform(-1, 1, (m, k))
        b[:] = rng.uniform(-1, 1, (k, n))
        run_window(client, a, b, out, args.warmup_s)
        ref = np.asarray(a, np.float64) @ np.asarray(b, np.float64)
        error = np.linalg.norm(out - ref) / np.linalg.norm(ref)
        if error > 1e-3:
            print(f"{name}: C is wrong (relative error {error:.2e})", file=sys.stderr)
            return 1
        paths[name] = (client, a, b, out, [])
    for _ in range(args.windows):
        for client, a, b, out, latencies in paths.values():
            latencies += run_window(client, a, b, out, args.window_s)
    print(f"{args.shape}, c=1, {args.windows} x {args.window_s} s per path")
    print("| path | req/s | p50 ms | p99 ms |")
    print("| --- | --- | --- | --- |")
    for name, (client, _, _, _, latencies) in paths.items():
        seconds = args.windows * args.window_s
        print(f"| python {name} | {len(latencies) / seconds:.0f} | "
              f"{np.percentile(latencies, 50):.3f} | {np.percentile(latencies, 99):.3f} |")
        client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
