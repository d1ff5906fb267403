#!/usr/bin/python3
"""One resident matrix up and down, next to raw TCP of the same bytes: the upload/download
asymmetry of the data plane, measured per path with repetitions and medians.

Per round, in this order (rounds alternate the paths, so that a noisy moment hits them all):
  * tcp      bench/tcp_ceiling, one socket: the bytes up (--shape=16xNxN, B) and down
             (--shape=NxNx1, C), each exchange's p50 of --repeat=3
  * cpp      hgemm_client --shape=16xNxN --resident=b: "uploaded B once in X ms" (UploadMatrix
             from GemmClient, the C++ core)
  * native / grpcio   hgemm.Client.upload then .download of an NxN float16 matrix, on each
             Python core ($HGEMM_TRANSPORT); native is the C++ core through the C ABI
Prints per path and direction the median ms and GB/s over the rounds, each one's median ratio to
raw TCP of the same round (the machine's load moves both), the median CPU ms of the server
(--server_pid: from /proc) and of the Python client per transfer, the load average at the start
and end, and (--csv) every sample.

    /usr/bin/python3 bench/transfer_bench.py --server=127.0.0.1:50051 --bin=DIR \\
        [--server_pid=PID] [--native_lib=libhgemm_client.so] [--n=8192] [--rounds=7] \\
        [--csv=out.csv]
--bin holds hgemm_client and tcp_ceiling. Without --native_lib (or if it does not load) the
native core is skipped. Needs numpy and, for grpcio, grpcio.
"""
import argparse
import csv
import os
import re
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def uptime() -> str:
    return " ".join(open("/proc/loadavg").read().split()[:3])


def server_cpu_ms(pid: int) -> float:
    """utime + stime of `pid` in ms (0 without a pid)."""
    if not pid:
        return 0.0
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * 1e3 / os.sysconf("SC_CLK_TCK")


def tcp_ms(bin_dir: str, shape: str) -> float:
    out = subprocess.run([os.path.join(bin_dir, "tcp_ceiling"), f"--shape={shape}", "--sockets=1",
                          "--repeat=3"], check=True, capture_output=True, text=True).stdout
    return float(out.strip().splitlines()[-1].split()[3])


def cpp_upload_ms(bin_dir: str, server: str, n: int) -> float:
    out = subprocess.run([os.path.join(bin_dir, "hgemm_client"), f"--server={server}",
                          f"--shape=16x{n}x{n}", "--resident=b"], check=True,
                         capture_output=True, text=True).stdout
    return float(re.search(r"uploaded B once in ([0-9.]+) ms", out).group(1))


PY_ROUND = r"""
import os, resource, sys, time
import numpy as np
sys.path.insert(0, sys.argv[1])
import hgemm
n, server, pid = int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
def server_ms():
    if not pid:
        return 0.0
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) * 1e3 / os.sysconf("SC_CLK_TCK")
def client_ms():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return (r.ru_utime + r.ru_stime) * 1e3
a = np.random.default_rng(0).standard_normal((n, n)).astype(np.float16)
with hgemm.Client(server) as c:
    c.upload(np.zeros((16, 16), np.float16)).release()  # the connection, outside the timing
    s0, c0, t = server_ms(), client_ms(), time.perf_counter()
    m = c.upload(a)
    up = time.perf_counter() - t
    s1, c1 = server_ms(), client_ms()
    t = time.perf_counter()
    back = m.download()
    down = time.perf_counter() - t
    s2, c2 = server_ms(), client_ms()
    m.release()
assert np.array_equal(back.view(np.uint16), a.view(np.uint16))
print(up * 1e3, s1 - s0, c1 - c0, down * 1e3, s2 - s1, c2 - c1)
"""


def python_ms(core: str, server: str, n: int, native_lib: str, pid: int):
    """(ms, server CPU ms, client CPU ms) of the upload, then of the download."""
    env = dict(os.environ, HGEMM_TRANSPORT=core)
    if native_lib:
        env["HGEMM_NATIVE_LIB"] = native_lib
    out = subprocess.run([sys.executable, "-c", PY_ROUND,
                          os.path.join(HERE, "..", "client", "python"), str(n), server, str(pid)],
                         check=True, capture_output=True, text=True, env=env).stdout
    values = [float(x) for x in out.split()]
    return values[:3], values[3:]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--server", required=True)
    p.add_argument("--bin", required=True, help="directory of hgemm_client and tcp_ceiling")
    p.add_argument("--native_lib", default="")
    p.add_argument("--server_pid", type=int, default=0, help="for the server's CPU time")
    p.add_argument("--n", type=int, default=8192, help="the matrix is n x n float16")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--paths", default="tcp,cpp,native,grpcio")
    p.add_argument("--csv", default="")
    args = p.parse_args()
    paths = args.paths.split(",")
    if "native" in paths and not args.native_lib:
        print("no --native_lib: the native core is skipped")
        paths.remove("native")
    nbytes = 2 * args.n * args.n
    samples = []  # (round, path, direction, ms, server CPU ms, client CPU ms)
    print(f"load average at the start: {uptime()}")
    for r in range(args.rounds):
        for path in paths:
            if path == "tcp":
                samples.append((r, path, "up", tcp_ms(args.bin, f"16x{args.n}x{args.n}"), "", ""))
                samples.append((r, path, "down", tcp_ms(args.bin, f"{args.n}x{args.n}x1"), "",
                                ""))
            elif path == "cpp":
                before = server_cpu_ms(args.server_pid)
                ms = cpp_upload_ms(args.bin, args.server, args.n)
                # The server's CPU includes the client's one GEMM (16 rows): an upper bound.
                samples.append((r, path, "up", ms, server_cpu_ms(args.server_pid) - before, ""))
            else:
                up, down = python_ms(path, args.server, args.n, args.native_lib,
                                     args.server_pid)
                samples += [(r, path, "up", *up), (r, path, "down", *down)]
    print(f"load average at the end: {uptime()}")
    print(f"{nbytes / 2**20:.0f} MiB, {args.rounds} rounds: median ms (min-max), GB/s of the "
          "median, median ratio to raw TCP of the same round and direction, median CPU ms of "
          "the server and of the client per transfer")
    print("| path | direction | ms | GB/s | × raw TCP | server CPU ms | client CPU ms |")
    print("|---|---|---|---|---|---|---|")
    tcp = {(s[0], s[2]): s[3] for s in samples if s[1] == "tcp"}
    for path in paths:
        for direction in ("up", "down"):
            mine = [s for s in samples if s[1] == path and s[2] == direction]
            if not mine:
                continue
            ms = [s[3] for s in mine]
            med = statistics.median(ms)
            ratio = statistics.median(tcp[(s[0], direction)] / s[3] for s in mine)
            cpu = [statistics.median(s[i] for s in mine) if mine[0][i] != "" else None
                   for i in (4, 5)]
            cpu_cells = [f"{c:.0f}" if c is not None else "" for c in cpu]
            print(f"| {path} | {direction} | {med:.0f} ({min(ms):.0f}-{max(ms):.0f}) | "
                  f"{nbytes / med / 1e6:.2f} | {ratio:.2f} | " + " | ".join(cpu_cells) + " |")
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["round", "path", "direction", "ms", "server_cpu_ms", "client_cpu_ms"])
            w.writerows(samples)


if __name__ == "__main__":
    main()
