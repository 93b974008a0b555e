#!/usr/bin/env python3
"""Writes src/estimate/conv_workspaces_sm90.tsv, the cuDNN convolution workspaces the
estimate charges on a GPU of compute capability 9.0 with 132 multiprocessors (H100 SXM,
H200), from what an NVIDIA H200 measured inside each call
(tests/data/gpu-truth/h200-2026-11-26/workspaces.csv, whose README says how).

A line a distinct call: `op args<TAB>bytes`, and for a backward call whose requests
were found in the allocator's trace `<TAB>data<TAB>weight`. `args` are the measured
row's, but for a backward call without `bias_sizes` (the meta kernel that looks the call
up does not get them; the output mask says whether a bias gradient is asked for).
`bytes` is the smallest `transient` measured for that call (the most it held at once
above what it left): a larger one is the same request served from a cached block the
allocator did not split (it replays that itself).

`data` and `weight` are the bytes a backward call asked for as the workspaces of its
data gradient and its weight gradient, read from the caching allocator's trace of the
same model's eager step on the same GPU (`traces/CASE.csv.gz` beside the source): the
engine's events (no Python frame) are walked with the case's backward calls in order;
a call's input gradient is the next request of the input's bytes, and a request freed
before any other is made is a workspace (the data gradient's after the input
gradient, the weight gradient's after the weight gradient). A call is kept only where
those sizes give its measured `transient` (the larger of the data workspace's block
less the weight gradient's and the weight workspace's block) within 2 MiB, the
allocator's rounding of a large block; where two runs differ, the larger of each.

    python3 scripts/conv-workspace-table.py
"""

import csv
import gzip
import os
import re

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


BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def nbytes(tensor):
    m = re.match(r"T([\dx]+):(\w+):", tensor)
    n = BYTES[m.group(2)]
    for d in m.group(1).split("x"):
        n *= int(d)
    return n


def block(n):
    return (n + 511) // 512 * 512


def requests(case, rows):
    """{key: (data, weight)} of `case`'s backward calls `rows`, found in its trace."""
    path = os.path.join(ROOT, os.path.dirname(SOURCE), "traces", case + ".csv.gz")
    if not os.path.exists(path):
        return {}
    with gzip.open(path, "rt", newline="") as f:
        ev = [
            (e["action"] == "alloc", int(e["addr"]), int(e["size"]))
            for e in csv.DictReader(f)
            if e["action"] in ("alloc", "free_requested") and e["frame"] == ""
        ]

    def next_alloc(at, size=None):
        return next(
            (i for i in range(at, len(ev)) if ev[i][0] and size in (None, ev[i][2])), None
        )

    def freed_first(i):
        """Where the request at i is freed, if before any other request."""
        for j in range(i + 1, len(ev)):
            if ev[j][0]:
                return None
            if ev[j][1] == ev[i][1]:
                return j
        return None

    def workspace(at):
        """(bytes, next index) of a workspace requested at `at`, else (0, at)."""
        k = next_alloc(at)
        if k is not None and freed_first(k) is not None:
            return ev[k][2], freed_first(k) + 1
        return 0, at

    def call_at(at, gi, gw):
        """(data, weight, next index) of the first requests from `at` that are the
        call's: its input gradient, a workspace or none, its weight gradient (the next
        request), a workspace or none."""
        first = gi if gi is not None else gw
        i = next_alloc(at, first)
        while i is not None:
            data, q = (0, i + 1)
            if gi is not None and gw is not None:
                data, q = workspace(i + 1)
                k = next_alloc(q)
                if k is None or ev[k][2] != gw:
                    i = next_alloc(i + 1, first)
                    continue
                q = k + 1
            weight, q = workspace(q)
            if gi is not None and gw is None:
                data, weight = weight, 0
            return data, weight, q
        return None

    found, at = {}, 0
    for row in rows:
        t = tokens(row["args"])
        mask = [m == "True" for m in t[-1].strip("[]").split()]
        gi = nbytes(t[1]) if mask[0] else None
        gw = nbytes(t[2]) if mask[1] else None
        if gi is None and gw is None:
            continue
        got = call_at(at, gi, gw)
        if got is None:
            continue
        data, weight, q = got
        held = max(block(data) - (block(gw) if gw else 0), block(weight), 0)
        if abs(held - int(row["transient"])) > 2 << 20:
            continue
        at = q
        k = key(row["op"], row["args"])
        old = found.get(k, (0, 0))
        found[k] = (max(old[0], data), max(old[1], weight))
    return found


def main():
    smallest, backward = {}, {}
    with open(os.path.join(ROOT, SOURCE), newline="") as f:
        for row in csv.DictReader(f):
            if row["op"] not in ("convolution", "convolution_backward"):
                continue
            k = key(row["op"], row["args"])
            smallest[k] = min(smallest.get(k, 1 << 62), int(row["transient"]))
            if row["op"] == "convolution_backward":
                backward.setdefault(row["case"], []).append(row)
    split = {}
    for case, rows in backward.items():
        for k, (data, weight) in requests(case, rows).items():
            old = split.get(k, (0, 0))
            split[k] = (max(old[0], data), max(old[1], weight))
    with open(os.path.join(ROOT, TABLE), "w") as out:
        out.write(
            "# cuDNN convolution workspaces an NVIDIA H200 measured (PyTorch 2.11.0+cu130,\n"
            "# cudnn.benchmark off, 2026-11-26): a call's arguments and the most it held at\n"
            "# once above what it left; for a backward call whose requests the\n"
            "# allocator's trace shows, the bytes its data and weight gradients' workspaces\n"
            "# asked for. Written from\n"
            f"# {SOURCE} by scripts/conv-workspace-table.py.\n"
        )
        for k in sorted(smallest):
            extra = "".join(f"\t{b}" for b in split[k]) if k in split else ""
            out.write(f"{k}\t{smallest[k]}{extra}\n")
    print(f"{TABLE}: {len(smallest)} calls, {len(split)} backward calls' requests")


if __name__ == "__main__":
    main()
