#!/usr/bin/env python3
"""Writes src/estimate/conv_workspaces_sm90.tsv, the cuDNN convolution workspaces the
estimate charges on a GPU of compute capability 9.0 with 132 multiprocessors (H100 SXM,
H200), from what an NVIDIA H200 measured inside each call
(tests/data/gpu-truth/h200-2026-11-26/workspaces.csv, whose README says how).

A line a distinct call: `op args<TAB>bytes`. `args` are the measured row's, but for a
backward call without `bias_sizes` (the meta kernel that looks the call up does not get
them; the output mask says whether a bias gradient is asked for). `bytes` is the
smallest `transient` measured for that call (the most it held at once above what it
left): a larger one is the same request served from a cached block the allocator did
not split (it replays that itself).

    python3 scripts/conv-workspace-table.py
"""

import csv
import os

ROOT = os.path.dirname(os.path.abspath(__file__)) + "/.."
SOURCE = "tests/data/gpu-truth/h200-2026-11-26/workspaces.csv"
TABLE = "src/estimate/conv_workspaces_sm90.tsv"


def tokens(args):
    """`T.. T.. None [2 2] [3 3] False 1` split into its tokens (lists kept whole)."""
    out, cur, depth = [], "", 0
    for c in args:
        depth += (c == "[") - (c == "]")
        if c == " " and depth == 0:
            if cur:
                out.append(cur)
            cur = ""
            continue
        cur += c
    if cur:
        out.append(cur)
    return out


def key(op, args):
    t = tokens(args)
    if op == "convolution_backward":
        del t[3]
    return op + " " + " ".join(t)


def main():
    smallest = {}
    with open(os.path.join(ROOT, SOURCE), newline="") as f:
        for row in csv.DictReader(f):
            if row["op"] not in ("convolution", "convolution_backward"):
                continue
            k = key(row["op"], row["args"])
            smallest[k] = min(smallest.get(k, 1 << 62), int(row["transient"]))
    with open(os.path.join(ROOT, TABLE), "w") as out:
        out.write(
            "# cuDNN convolution workspaces an NVIDIA H200 measured (PyTorch 2.11.0+cu130,\n"
            "# cudnn.benchmark off, 2026-11-26): a call's arguments and the most it held at\n"
            "# once above what it left. Written from\n"
            f"# {SOURCE} by scripts/conv-workspace-table.py.\n"
        )
        for k in sorted(smallest):
            out.write(f"{k}\t{smallest[k]}\n")
    print(f"{TABLE}: {len(smallest)} calls")


if __name__ == "__main__":
    main()
