#!/usr/bin/python3
"""Throughput of the Python client (client/python, `import hgemm`) next to hgemm_load (C++).

The points are the issue-16 comparison, the shapes of bench/load_run.sh:
  * 2048x2048x2048, unary, A and B sent, concurrency 16
  * 128x8192x8192 with B resident (uploaded once, A sent, C returned), unary and stream,
    concurrency 1 and 4
Closed loop: each worker has one call in flight, each with its own hgemm.Client (its own gRPC
channel and TCP connection, as hgemm_load's default --workers_per_channel=1). Every call goes
through the public API on numpy float16 arrays, so the numbers include the client's own costs
(serialising, copies, reassembling C): a "unary" call is c.gemm(A, B, mode="unary"); in
"stream" mode each worker keeps one GemmStream open (s = c.stream(), then s.gemm(A, B) per
GEMM), as hgemm_load's stream mode does. "py CPU ms" is this process's CPU time (user + system,
all threads) per GEMM: what the client costs, however fast the server is.

    /usr/bin/python3 bench/python_client_bench.py --server=127.0.0.1:50051 \\
        [--hgemm_load=bazel-bin/bench/hgemm_load] [--csv=py_bench.csv]

With --hgemm_load, every point is also run by hgemm_load (same shape, mode, resident mode and
concurrency) and the table shows the ratio python / C++ of requests per second (target ≥ 0.9).

Mode "shm" (same host: --server=unix:PATH of a server with --allow_shared_memory, resident
none): each worker's A, B and C live in shared buffers of its client (c.shared_buffer), and
each GEMM is c.gemm(A, B, out=C): a unary Gemm naming the regions, nothing sent but names
(hgemm_load: --transport=shm). --prepared: unary and shm GEMMs are g() of a PreparedGemm made
once per worker (g = c.prepare(A, B, out=C)): the client's checks and options once, one call
into the native core per GEMM.
hgemm_load's CPU time per GEMM ("C++ CPU ms") is its own user + system time over its measured
windows (its CSV's client_cpu_ms: no warm-up, no verification), the figure "py CPU ms" is
held against.

--transports: the client's cores to measure, each point once per core ($HGEMM_TRANSPORT for the
point's clients; default both): "native" (libhgemm_client.so, client/c; skipped with a line
when it does not load) and "grpcio". On the native core unary GEMMs, uploads and stream()s all
go through the library (hgemm.info()["features"], printed first, says which core serves what).

After the per-core table, a comparison table puts each point's cores and hgemm_load on one
line: req/s of grpcio, native and C++, each core's ratio to C++, and the CPU ms per GEMM of
each. The CSV has the per-core rows (cpp_client_cpu_ms: hgemm_load's CPU ms per GEMM).
--aio_points: the asyncio client on the native core next to the sync one, one client each:
KIND:MxNxK:C1,C2 with KIND "gemm" (c.gemm(A, B, mode="unary"): hgemm_gemm_async), "grouped"
(c.gemm_grouped([(A, B)] * 2): hgemm_gemm_grouped_start, run on the core's completion threads)
or "info" (c.info(): hgemm_server_info_json_start); sync: C threads in a closed loop, aio: C
tasks on one event loop (no thread of Python's; the table says how many Python threads the
process had meanwhile). "aio" is empty ("--aio_points" alone) to skip it.
Needs the hgemm package (pip install ./client/python, or PYTHONPATH=client/python).
"""
import argparse
import asyncio
import csv
import functools
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

try:
    import hgemm
except ImportError:  # run from a clone without installing
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                    "..", "client", "python"))
    import hgemm

DEFAULT_AIO_POINTS = ["gemm:256x256x256:1,16", "grouped:256x256x256:16", "info:1x1x1:16"]
DEFAULT_POINTS = [
    "2048x2048x2048:unary:none:16",
    "128x8192x8192:unary:b:1,4",
    "128x8192x8192:stream:b:1,4",
]


def parse_point(text):
    shape, mode, resident, conc = text.split(":")
    m, n, k = (int(x) for x in shape.split("x"))
    if mode not in ("unary", "stream", "shm") or resident not in ("none", "b"):
        raise ValueError(f"point {text!r}: mode unary|stream|shm, resident none|b")
    if mode == "shm" and resident != "none":
        raise ValueError(f"point {text!r}: shm takes resident none (A and B in shared buffers)")
    return (m, n, k), mode, resident, [int(c) for c in conc.split(",")]


def verify(c, a, b, rng):
    rows = rng.choice(a.shape[0], size=min(16, a.shape[0]), replace=False)
    ref = a[rows].astype(np.float32) @ b.astype(np.float32)
    err = np.linalg.norm(c[rows].astype(np.float32) - ref) / np.linalg.norm(ref)
    if not err < 1e-3:
        sys.exit(f"python_client_bench: wrong result (relative error {err:.3g})")


def clients_on(transport, count, args):
    """`count` clients on the core `transport` (the core is chosen when a client is made)."""
    before = os.environ.get("HGEMM_TRANSPORT")
    os.environ["HGEMM_TRANSPORT"] = transport
    try:
        return [hgemm.Client(args.server, timeout=args.timeout_s) for _ in range(count)]
    finally:
        if before is None:
            del os.environ["HGEMM_TRANSPORT"]
        else:
            os.environ["HGEMM_TRANSPORT"] = before


def transport_available(transport, args) -> bool:
    try:
        clients_on(transport, 1, args)[0].close()
        return True
    except OSError as e:
        print(f"python_client_bench: no {transport} core ({e}); skipping it", file=sys.stderr)
        return False


def run_point(args, transport, shape, mode, resident, concurrency, a, b):
    m, n, k = shape
    clients = clients_on(transport, concurrency, args)
    handles = [c.upload(b, label="bench B") if resident == "b" else None for c in clients]
    latencies, kernel_ms, errors = [], [], []
    lock = threading.Lock()
    start_measure = time.monotonic() + args.warmup_s
    stop = start_measure + args.duration_s

    streams = [c.stream() if mode == "stream" else None for c in clients]
    cpu_s = []  # this process's CPU time at the window's start and end

    def sample_cpu():
        for t in (start_measure, stop):
            time.sleep(max(0.0, t - time.monotonic()))
            cpu_s.append(_cpu_seconds())

    def worker(i):
        operand_b = handles[i] if handles[i] is not None else b
        operand_a = a
        options = {"details": True}
        if mode == "shm":  # A, B and C in the client's shared buffers: names only
            operand_a, operand_b = shared_copy(clients[i], a), shared_copy(clients[i], b)
            options["out"] = clients[i].shared_buffer((m, n))
        elif streams[i] is None:
            options["mode"] = "unary"
        if streams[i] is not None:
            gemm = functools.partial(streams[i].gemm, operand_a, operand_b, **options)
        elif args.prepared:
            gemm = clients[i].prepare(operand_a, operand_b, **options)
        else:
            gemm = functools.partial(clients[i].gemm, operand_a, operand_b, **options)
        while True:
            t0 = time.monotonic()
            if t0 >= stop:
                return
            try:
                r = gemm()
            except hgemm.Error as e:
                with lock:
                    errors.append(e.status)
                continue
            t1 = time.monotonic()
            if t0 >= start_measure and t1 <= stop:
                with lock:
                    latencies.append(t1 - t0)
                    kernel_ms.append(r.timing.kernel_ms)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(concurrency)]
    threads.append(threading.Thread(target=sample_cpu))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for s in streams:
        if s is not None:
            s.close()
    for c, h in zip(clients, handles):
        if h is not None:
            h.release()
        c.close()
    lat = np.array(latencies) * 1e3
    sent = 2 * m * k + (0 if resident == "b" else 2 * k * n)
    wire = 0 if mode == "shm" else sent + 2 * m * n
    rps = len(lat) / args.duration_s
    return {
        "core": transport, "prepared": bool(args.prepared and mode != "stream"),
        "shape": f"{m}x{n}x{k}", "mode": mode, "resident": resident, "concurrency": concurrency,
        "requests": len(lat), "errors": len(errors), "requests_per_s": rps,
        "p50_ms": float(np.percentile(lat, 50)) if len(lat) else float("nan"),
        "p99_ms": float(np.percentile(lat, 99)) if len(lat) else float("nan"),
        "payload_gb_per_s": rps * wire / 1e9,
        "gflops": rps * 2 * m * n * k / 1e9,
        "server_kernel_ms": float(np.mean(kernel_ms)) if kernel_ms else float("nan"),
        "client_cpu_ms": 1e3 * (cpu_s[1] - cpu_s[0]) / len(lat) if len(lat) else float("nan"),
    }


def aio_call(kind: str, a, b):
    """The call of an --aio_points KIND, as fn(client) → what to call or await."""
    if kind == "gemm":
        return lambda c: c.gemm(a, b, mode="unary")
    if kind == "grouped":
        return lambda c: c.gemm_grouped([(a, b), (a, b)])
    if kind == "info":
        return lambda c: c.info()
    raise ValueError(f"--aio_points kind {kind!r}: gemm, grouped or info")


def run_aio_point(args, kind: str, concurrency: int, a, b) -> dict:
    """req/s and CPU ms per call of `kind` on the native core: sync (threads) and aio (tasks)."""
    call = aio_call(kind, a, b)
    out = {}

    def window(count_calls):
        """Runs count_calls(stop) (→ calls made in the window) after warm-up; req/s, CPU ms."""
        start = time.monotonic() + args.warmup_s
        stop = start + args.duration_s
        calls, cpu = count_calls(start, stop)
        return calls / args.duration_s, 1e3 * cpu / calls if calls else float("nan")

    with clients_on("native", 1, args)[0] as c:
        def sync_calls(start, stop):
            counts, cpu = [0] * concurrency, []

            def worker(i):
                while time.monotonic() < stop:
                    t0 = time.monotonic()
                    call(c)
                    if t0 >= start and time.monotonic() <= stop:
                        counts[i] += 1
            threads = [threading.Thread(target=worker, args=(i,)) for i in range(concurrency)]
            for t in threads:
                t.start()
            time.sleep(max(0.0, start - time.monotonic()))
            cpu.append(_cpu_seconds())
            time.sleep(max(0.0, stop - time.monotonic()))
            cpu.append(_cpu_seconds())
            for t in threads:
                t.join()
            return sum(counts), cpu[1] - cpu[0]
        out["sync"] = window(sync_calls)

    async def aio_calls(start, stop):
        before = os.environ.get("HGEMM_TRANSPORT")
        os.environ["HGEMM_TRANSPORT"] = "native"
        try:
            client = hgemm.aio.Client(args.server, timeout=args.timeout_s)
        finally:
            if before is None:
                del os.environ["HGEMM_TRANSPORT"]
            else:
                os.environ["HGEMM_TRANSPORT"] = before
        counts, cpu, threads = [0] * concurrency, [], []

        async def worker(i):
            while time.monotonic() < stop:
                t0 = time.monotonic()
                await call(client)
                if t0 >= start and time.monotonic() <= stop:
                    counts[i] += 1

        async def sample():
            await asyncio.sleep(max(0.0, start - time.monotonic()))
            cpu.append(_cpu_seconds())
            threads.append(threading.active_count())
            await asyncio.sleep(max(0.0, stop - time.monotonic()))
            cpu.append(_cpu_seconds())
        try:
            await asyncio.gather(sample(), *(worker(i) for i in range(concurrency)))
        finally:
            await client.close()
        out["python_threads"] = threads[0]
        return sum(counts), cpu[1] - cpu[0]
    out["aio"] = window(lambda start, stop: asyncio.run(aio_calls(start, stop)))
    return out


def print_aio(rows) -> None:
    print()
    print("| kind | shape | conc | sync req/s | aio req/s | aio/sync | sync CPU ms | aio CPU ms | "
          "Python threads (aio) |")
    print("| --- | --- |" + " ---: |" * 7)
    for kind, shape, conc, r in rows:
        (sync_rps, sync_cpu), (aio_rps, aio_cpu) = r["sync"], r["aio"]
        print(f"| {kind} | {shape} | {conc} | {sync_rps:.1f} | {aio_rps:.1f} | "
              f"{aio_rps / sync_rps if sync_rps else float('nan'):.2f} | {sync_cpu:.2f} | "
              f"{aio_cpu:.2f} | {r['python_threads']} |")


def shared_copy(client, x):
    """x copied into a shared buffer of the client."""
    buffer = client.shared_buffer(x.shape)
    buffer[:] = x
    return buffer


def _cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def run_cpp(args, row):
    """hgemm_load at the row's point: (req/s, its CPU ms per GEMM over the measured windows),
    or None."""
    with tempfile.NamedTemporaryFile(suffix=".csv") as f:
        shm = row["mode"] == "shm"
        cmd = [args.hgemm_load, f"--server={args.server}", f"--shapes={row['shape']}",
               f"--mode={'unary' if shm else row['mode']}", f"--resident={row['resident']}",
               f"--transport={'shm' if shm else 'grpc'}",
               f"--concurrency={row['concurrency']}", f"--csv={f.name}", "--verify=1"]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            print(f"python_client_bench: hgemm_load failed ({r.returncode}):\n{r.stderr[-2000:]}",
                  file=sys.stderr)
            return None
        rows = [x for x in csv.DictReader(open(f.name))
                if x["target"] == ("shm" if shm else "service")]
        if not rows:
            return None
        cpu_ms = rows[0]["client_cpu_ms"]
        return float(rows[0]["requests_per_s"]), float(cpu_ms) if cpu_ms else float("nan")


def _number(x, digits: int) -> str:
    return "-" if x is None or x != x else f"{x:.{digits}f}"


def print_comparison(rows) -> None:
    """One line per point: grpcio, native and hgemm_load side by side."""
    points = {}
    for r in rows:
        key = (r["shape"], r["mode"], r["resident"], r["concurrency"])
        points.setdefault(key, {})[r["core"]] = r
    print()
    print("| shape | mode | resident | conc | grpcio req/s | native req/s | C++ req/s | "
          "grpcio/C++ | native/C++ | grpcio CPU ms | native CPU ms | C++ CPU ms |")
    print("| --- | --- | --- |" + " ---: |" * 9)
    for (shape, mode, resident, conc), by_core in points.items():
        grpcio, native = by_core.get("grpcio", {}), by_core.get("native", {})
        any_row = grpcio or native
        print(f"| {shape} | {mode} | {resident} | {conc} | "
              f"{_number(grpcio.get('requests_per_s'), 1)} | "
              f"{_number(native.get('requests_per_s'), 1)} | "
              f"{_number(any_row.get('cpp_requests_per_s'), 1)} | "
              f"{_number(grpcio.get('ratio'), 2)} | {_number(native.get('ratio'), 2)} | "
              f"{_number(grpcio.get('client_cpu_ms'), 2)} | "
              f"{_number(native.get('client_cpu_ms'), 2)} | "
              f"{_number(any_row.get('cpp_client_cpu_ms'), 2)} |")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__)
    p.add_argument("--server", default="127.0.0.1:50051")
    p.add_argument("--points", nargs="*", default=DEFAULT_POINTS,
                   help="MxNxK:unary|stream|shm:none|b:C1,C2,... (default: the issue-16 points)")
    p.add_argument("--warmup_s", type=float, default=2.0)
    p.add_argument("--duration_s", type=float, default=5.0)
    p.add_argument("--timeout_s", type=float, default=120.0)
    p.add_argument("--hgemm_load", help="path of hgemm_load: also run each point in C++")
    p.add_argument("--csv", help="write the rows as CSV")
    p.add_argument("--prepared", action="store_true",
                   help="unary and shm points call a PreparedGemm made once per worker "
                        "(g = c.prepare(A, B, ...); g() per GEMM) instead of c.gemm")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--transports", nargs="*", default=["native", "grpcio"],
                   choices=["native", "grpcio"], help="the client's cores to measure")
    p.add_argument("--aio_points", nargs="*", default=DEFAULT_AIO_POINTS,
                   help="KIND:MxNxK:C1,C2,... (KIND gemm|grouped|info): aio vs sync, native core")
    args = p.parse_args()
    transports = [t for t in args.transports if transport_available(t, args)]
    print(f"hgemm.info(): {hgemm.info()}")

    rng = np.random.default_rng(args.seed)
    with hgemm.Client(args.server, timeout=60) as c:
        info = c.info()
        device = info.devices[0].name if info.devices else "?"
        print(f"server {args.server}: {info.backend}, {device}, version {info.version}")
    rows = []
    for text in args.points:
        shape, mode, resident, concurrencies = parse_point(text)
        m, n, k = shape
        a = rng.uniform(-1, 1, (m, k)).astype(np.float16)
        b = rng.uniform(-1, 1, (k, n)).astype(np.float16)
        with hgemm.Client(args.server, timeout=args.timeout_s) as c, c.stream() as s:
            verify(s.gemm(a, b) if mode == "stream" else c.gemm(a, b, mode="unary"), a, b, rng)
        for conc in concurrencies:
            cpp = None  # hgemm_load's req/s at this point, run once for every core
            for transport in transports:
                row = run_point(args, transport, shape, mode, resident, conc, a, b)
                if cpp is None and args.hgemm_load:
                    cpp = run_cpp(args, row)
                cpp_rps, cpp_cpu_ms = cpp or (None, None)
                row["cpp_requests_per_s"] = cpp_rps
                row["ratio"] = row["requests_per_s"] / cpp_rps if cpp_rps else None
                row["cpp_client_cpu_ms"] = cpp_cpu_ms
                rows.append(row)
                # Each point as it ends, with its C++ figures: a run cut short keeps its ratios.
                print(f"  {transport}: {row['shape']} {mode} resident={resident} c={conc}: "
                      f"{row['requests_per_s']:.1f} req/s, {row['client_cpu_ms']:.2f} CPU ms; "
                      f"hgemm_load {_number(cpp_rps, 1)} req/s, {_number(cpp_cpu_ms, 2)} CPU ms; "
                      f"python/C++ {_number(row['ratio'], 3)}", file=sys.stderr)

    print()
    print("| core | shape | mode | resident | conc | req/s | p50 ms | p99 ms | GB/s wire | "
          "kernel ms | py CPU ms | C++ req/s | python/C++ |")
    print("| --- | --- | --- | --- |" + " ---: |" * 9)
    for r in rows:
        cpp = f"{r['cpp_requests_per_s']:.1f}" if r["cpp_requests_per_s"] else "-"
        ratio = f"{r['ratio']:.2f}" if r["ratio"] else "-"
        err = f" ({r['errors']} errors)" if r["errors"] else ""
        print(f"| {r['core']} | {r['shape']} | {r['mode']} | {r['resident']} | "
              f"{r['concurrency']} | "
              f"{r['requests_per_s']:.1f}{err} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} | "
              f"{r['payload_gb_per_s']:.2f} | {r['server_kernel_ms']:.3f} | "
              f"{r['client_cpu_ms']:.2f} | {cpp} | {ratio} |")
    print_comparison(rows)
    if args.aio_points and "native" in transports:
        aio_rows = []
        for text in args.aio_points:
            kind, shape, conc = text.split(":")
            m, n, k = (int(x) for x in shape.split("x"))
            a = rng.uniform(-1, 1, (m, k)).astype(np.float16)
            b = rng.uniform(-1, 1, (k, n)).astype(np.float16)
            for c in (int(x) for x in conc.split(",")):
                aio_rows.append((kind, shape, c, run_aio_point(args, kind, c, a, b)))
                print(f"  aio {kind} {shape} c={c}: {aio_rows[-1][3]}", file=sys.stderr)
        print_aio(aio_rows)
    if args.csv and rows:
        with open(args.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
