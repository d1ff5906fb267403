#!/usr/bin/env python3
"""Plot kernel_bench CSV: TFLOP/s per variant and shape, one panel per accumulation, with cuBLAS
as the reference line of each shape.

usage: kernel_bench_plot.py BENCH.csv OUT.png
"""
import csv
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def case(r):
    """The x-axis label: the shape (or, beyond plain GEMMs, the mode and case), with the layout
    and types where not NN fp16 (older CSVs have none of these columns)."""
    mode = r.get("mode", "plain")
    s = f'{r["m"]}x{r["n"]}x{r["k"]}' if mode == "plain" else f'{mode} {r["case"]}'
    form = f'{r.get("layout", "NN")} {r.get("types", "fp16")}'
    return s if form == "NN fp16" else f"{s} {form}"


def main(src, dst):
    rows = [r for r in csv.DictReader(open(src)) if float(r["tflops"]) > 0]
    device = rows[0]["device"] if rows else "?"
    shapes = []
    for r in rows:
        s = case(r)
        if s not in shapes:
            shapes.append(s)
    accs = [a for a in ("fp16", "fp32") if any(r["acc"] == a for r in rows)]
    fig, axes = plt.subplots(len(accs), 1, figsize=(max(12, 1.8 * len(shapes)), 5 * len(accs)),
                             squeeze=False)
    for ax, acc in zip(axes[:, 0], accs):
        table = defaultdict(dict)
        for r in rows:
            if r["acc"] == acc:
                table[r["variant"]][case(r)] = float(r["tflops"])
        variants = [v for v in table if v != "cublas"]
        width = 0.8 / max(1, len(variants))
        for i, v in enumerate(variants):
            xs = [j + (i - len(variants) / 2) * width for j, s in enumerate(shapes)
                  if s in table[v]]
            ys = [table[v][s] for s in shapes if s in table[v]]
            ax.bar(xs, ys, width, label=v)
        for j, s in enumerate(shapes):
            if s in table.get("cublas", {}):
                ax.hlines(table["cublas"][s], j - 0.45, j + 0.45, colors="black", linewidth=2,
                          label="cublas" if j == 0 else None)
        ax.set_xticks(range(len(shapes)))
        ax.set_xticklabels(shapes, rotation=20)
        ax.set_ylabel("TFLOP/s")
        ax.set_title(f"{acc} accumulation on {device} (black line: cuBLAS, same run)")
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
        ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(dst, dpi=110)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
