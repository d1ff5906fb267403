#!/usr/bin/env python3
"""Plots hgemm_load CSV: payload GB/s, ratio to the echo baseline, and p99 latency against
concurrency (or rate), one colour per shape and mode; the service solid, the echo dashed.

usage: load_plot.py LOAD.csv [MORE.csv ...] OUT.png [--summary OUT.md]
--summary writes a Markdown table per series: best service GB/s and its ratio to the echo,
p50/p99 at the lowest and highest load, the server's queue vs kernel time at the lowest, and at
the best point the share of the client's mean latency spent inside the server (server_total_ms;
the rest is transport: serialization, copies, the network stack).
"""
import argparse
import csv
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter  # noqa: E402

PLAIN = FuncFormatter(lambda v, _: f"{v:g}")


def load(paths):
    rows = []
    for path in paths:
        with open(path, newline="") as f:
            for r in csv.DictReader(f):
                for key in ("concurrency", "requests", "errors", "windows", "stable"):
                    r[key] = int(r[key] or 0)
                for key in ("rate_per_s", "requests_per_s", "mean_ms", "p50_ms", "p90_ms", "p99_ms",
                            "gflops", "payload_gb_per_s", "server_queue_ms", "server_kernel_ms",
                            "server_h2d_ms", "server_d2h_ms", "server_total_ms", "ratio_to_echo"):
                    r[key] = float(r[key]) if r.get(key) not in (None, "") else None
                rows.append(r)
    return rows


def x_of(r):
    return r["rate_per_s"] if r["rate_per_s"] else r["concurrency"]


def series(rows):
    """(shape or mix, mode) → target → rows sorted by load. A mix is plotted as a whole (its
    "mix" rows); its per-shape rows stay in the CSV and the table."""
    out = defaultdict(lambda: defaultdict(list))
    for r in rows:
        mix = r.get("shapes") or r["shape"]
        if "," in mix and r["shape"] != "mix":
            continue
        name = r["shape"] if r["shape"] != "mix" else "mix " + mix
        out[(name, r["mode"])][r["target"]].append(r)
    for by_target in out.values():
        for lst in by_target.values():
            lst.sort(key=x_of)
    return out


def plot(rows, png):
    s = series(rows)
    open_loop = any(r["rate_per_s"] for r in rows)
    fig, axes = plt.subplots(1, 3, figsize=(17, 5.2))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, ((shape, mode), by_target) in enumerate(sorted(s.items())):
        c = colours[i % len(colours)]
        label = f"{shape} {mode}"
        for target, style in (("service", "-o"), ("echo", "--x")):
            pts = [r for r in by_target.get(target, []) if r["requests"] > 0]
            if not pts:
                continue
            xs = [x_of(r) for r in pts]
            axes[0].plot(xs, [r["payload_gb_per_s"] for r in pts], style, color=c,
                         label=f"{label} ({target})")
            axes[2].plot(xs, [r["p99_ms"] for r in pts], style, color=c,
                         label=f"{label} ({target})")
        pts = [r for r in by_target.get("service", []) if r["ratio_to_echo"] is not None]
        if pts:
            axes[1].plot([x_of(r) for r in pts], [r["ratio_to_echo"] for r in pts], "-o", color=c,
                         label=label)
    xlabel = "offered rate (calls/s)" if open_loop else "concurrency (calls in flight)"
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(PLAIN)
        ax.set_xlabel(xlabel)
        ax.grid(True, which="both", alpha=0.3)
    for ax in (axes[0], axes[2]):  # shapes differ by orders of magnitude
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(PLAIN)
        ax.yaxis.set_minor_formatter(NullFormatter())
    axes[0].set_ylabel("payload GB/s (A+B+C bytes)")
    axes[0].set_title("throughput: service (solid) vs gRPC echo (dashed)")
    axes[1].set_ylabel("service GB/s / echo GB/s")
    axes[1].axhline(0.8, color="grey", linestyle=":", label="target 0.8")
    axes[1].set_title("ratio to the transport baseline")
    axes[2].set_ylabel("p99 latency (ms, client side)")
    axes[2].set_title("p99 latency")
    for ax in axes:
        ax.legend(fontsize=7)
    device = rows[0]["device"] if rows else "?"
    backend = rows[0]["backend"] if rows else "?"
    fig.suptitle(f"hgemm-serve under load: {device} ({backend} backend), "
                 "server and client on 127.0.0.1")
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def summary(rows, path):
    s = series(rows)
    device = rows[0]["device"] if rows else "?"
    lines = [f"Device: {device} ({rows[0]['backend'] if rows else '?'} backend); "
             "client, server and echo on 127.0.0.1.", "",
             "| shape | mode | best GB/s (conc) | echo GB/s there | ratio | "
             "p50/p99 ms, lowest load | p50/p99 ms, highest load | "
             "queue / kernel ms, lowest load | server share of latency at best | errors |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for (shape, mode), by_target in sorted(s.items()):
        svc = [r for r in by_target.get("service", []) if r["requests"] > 0]
        if not svc:
            continue
        best = max(svc, key=lambda r: r["payload_gb_per_s"])
        lo, hi = svc[0], svc[-1]
        echo = {x_of(r): r for r in by_target.get("echo", [])}.get(x_of(best))
        errors = sum(r["errors"] for r in by_target.get("service", []))
        # server_total / client mean: the rest is transport (serialization, copies, network stack)
        share = (best["server_total_ms"] or 0) / best["mean_ms"] if best["mean_ms"] else 0
        echo_cols = (f"{echo['payload_gb_per_s']:.3f} | {best['ratio_to_echo'] or 0:.2f}" if echo
                     else "- | -")
        lines.append(
            f"| {shape} | {mode} | {best['payload_gb_per_s']:.3f} ({x_of(best):g}) | {echo_cols} | "
            f"{lo['p50_ms']:.3f} / {lo['p99_ms']:.3f} | {hi['p50_ms']:.3f} / {hi['p99_ms']:.3f} | "
            f"{lo['server_queue_ms'] or 0:.3f} / {lo['server_kernel_ms'] or 0:.3f} | "
            f"{share:.0%} | {errors} |")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("files", nargs="+", help="CSV file(s), then the PNG to write")
    p.add_argument("--summary", help="also write a Markdown summary table here")
    a = p.parse_args()
    if len(a.files) < 2 or not a.files[-1].endswith(".png"):
        p.error("give one or more CSV files and then OUT.png")
    rows = load(a.files[:-1])
    if not rows:
        sys.exit("load_plot.py: no rows")
    plot(rows, a.files[-1])
    print(f"wrote {a.files[-1]}")
    if a.summary:
        summary(rows, a.summary)
        print(f"wrote {a.summary}")


if __name__ == "__main__":
    main()
