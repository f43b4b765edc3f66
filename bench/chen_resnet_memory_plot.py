#!/usr/bin/python3
"""Plots bench/chen_resnet_memory's CSV: the peak bytes of one training step against the depth, one line per means,
log-log as Chen et al. (2016) draw their Figure (a power law y = a·x^b is a straight line), for the weights as tape
variables (solid) and as Parameters (dashed).

  /usr/bin/python3 bench/chen_resnet_memory_plot.py bench/results/chen_resnet_memory.csv docs/chen_resnet_memory.png

Needs matplotlib (Debian: python3-matplotlib).
"""
import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

MEANS = [
    ("plain", "no checkpointing"),
    ("dots", "per-block dots_saveable"),
    ("block", "per-block nothing_saveable"),
    ("dtr25", "DTR at 25 % of plain"),
    ("sqrt", "√n segments"),
    ("planner", "planner at its least budget"),
    ("dtr_least", "DTR at its least budget"),
]


def main(csv_path, png_path):
    with open(csv_path, newline="") as f:
        rows = list(csv.DictReader(f))
    fig, ax = plt.subplots(figsize=(7.5, 5))
    for index, (key, label) in enumerate(MEANS):
        colour = f"C{index}"
        for weights, style in (("tape", "-"), ("parameters", "--")):
            points = [(int(r["depth"]), int(r[f"{key}_peak_bytes"]) / 1e9)
                      for r in rows if r["weights"] == weights and r[f"{key}_peak_bytes"]]
            if points:
                x, y = zip(*points)
                ax.plot(x, y, style, marker="o", markersize=3, color=colour,
                        label=label if weights == "tape" else None)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("layers")
    ax.set_ylabel("peak of one training step (GB)")
    ax.set_title("ResNet, batch 32 × 3×224×224, float32 (solid: weights on the tape; dashed: Parameters)",
                 fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png_path, dpi=120)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
