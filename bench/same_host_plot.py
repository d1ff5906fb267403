"""The picture of bench/dataplane.sh --same_host: p50 latency against GEMM size at
concurrency 1, one line per path (gRPC, shm staging, shm DMA, ring, CUDA IPC, all-resident),
with the ideal H2D(A+B) + kernel + D2H(C) at the pinned cudaMemcpy rate beside them.

usage: same_host_plot.py SAME_HOST.csv OUT.png
"""
import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def operand_mib(shape: str) -> float:
    """A, B and C of an MxNxK fp16 GEMM, in MiB: what the data plane moves."""
    m, n, k = (int(x) for x in shape.split("x"))
    return 2 * (m * k + k * n + m * n) / 2**20


def main(csv_path: str, png: str) -> None:
    rows = list(csv.DictReader(open(csv_path)))
    lines = {}  # path → [(MiB, p50 ms)]
    ideal = []
    kernel = {}  # the ideal's kernel: the first row's with a kernel time (the staging run's)
    for r in rows:
        if r["kernel_ms"] and r["shape"] not in kernel:
            kernel[r["shape"]] = float(r["kernel_ms"])
    for r in rows:
        if r["path"] == "pinned memcpy":
            if r["shape"] in kernel:
                h2d, d2h = (float(x) for x in r["ideal_ms"].split("+"))
                ideal.append((operand_mib(r["shape"]), h2d + kernel[r["shape"]] + d2h))
        elif r["concurrency"] == "1" and float(r["p50_ms"] or 0) > 0:
            lines.setdefault(r["path"], []).append((operand_mib(r["shape"]), float(r["p50_ms"])))
    fig, ax = plt.subplots(figsize=(8, 5.5))
    for path, points in sorted(lines.items()):
        points.sort()
        ax.plot(*zip(*points), "o-", label=path)
    if ideal:
        ideal.sort()
        ax.plot(*zip(*ideal), "k--", label="ideal: H2D(A+B) + kernel + D2H(C), pinned")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("A + B + C (MiB, fp16)")
    ax.set_ylabel("p50 latency per GEMM, concurrency 1 (ms)")
    ax.set_title("Same-host data plane: gRPC against shared memory, ring and CUDA IPC")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=110)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
