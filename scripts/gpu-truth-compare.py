#!/usr/bin/env python3
"""Two GPUs' measurements of the GPU truth cases side by side: for each (model, mode) of
both `measured.csv` files, the peaks allocated and reserved of each and their difference
in bytes, then how many cases have the same peak reserved and the same peak allocated.

    python3 scripts/gpu-truth-compare.py tests/data/gpu-truth/h100-2026-11-26 \
        tests/data/gpu-truth/h200-2026-11-26

A comparison of two data files (no crate code runs), which docs/gpu-validation.md quotes.
"""
import csv
import sys


def cases(folder):
    with open(f"{folder}/measured.csv", newline="") as f:
        return {
            (r["model"], r["mode"]): (int(r["measured_allocated"]), int(r["measured_reserved"]))
            for r in csv.DictReader(f)
        }


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: gpu-truth-compare.py FOLDER_A FOLDER_B (each holding measured.csv)")
    a, b = cases(sys.argv[1]), cases(sys.argv[2])
    both = sorted(a.keys() & b.keys())
    print(f"{'model':<28} {'mode':<14} {'alloc A-B':>14} {'resv A-B':>14}")
    same_resv = same_alloc = 0
    for key in both:
        (aa, ar), (ba, br) = a[key], b[key]
        same_resv += ar == br
        same_alloc += aa == ba
        print(f"{key[0]:<28} {key[1]:<14} {aa - ba:>14} {ar - br:>14}")
    print(
        f"{len(both)} cases in both ({len(a)} and {len(b)} in each): "
        f"{same_resv} the same peak reserved, {same_alloc} the same peak allocated"
    )


main()
