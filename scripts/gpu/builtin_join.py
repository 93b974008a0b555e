"""Sets the estimate of each transformer case beside its measurement on the GPU.

    python3 builtin_join.py --gpu-name "NVIDIA H100 80GB HBM3"   # -> h100
    python3 builtin_join.py --measured out/transformers_measured.csv \\
        --estimates out/estimate [--out out/transformers_joined.csv]

--gpu-name maps a name as `nvidia-smi --query-gpu=name` prints it to the `--gpu` name of
`tch-memprof estimate` (printed; exit 1 when the GPU is not one the estimate knows).

The join reads builtin_mirrors.py's CSV and, for each row, the CSV `tch-memprof estimate
--csv` wrote for the same case to ESTIMATES/<model>_<input>_<mode>_<autocast>.csv (run.sh
writes them), and prints predicted beside measured peak allocated and peak reserved with
the error ((predicted - measured) / measured, in %), and the attention backend the
estimate chose (its `attention` column) beside the SDPA backend CUDA ran. A case with no
estimate (its run failed: see the .err file beside it) or no measurement reads n/a.
Exit 1 when a case that was not skipped (too large for this GPU) lacks either.
"""
import argparse
import csv
import os
import re
import sys

# nvidia-smi name (lower case, alphanumerics only) -> the estimate's --gpu name: the
# first rule whose substrings all occur in the name wins.
GPU_NAMES = [
    (["h200"], "h200"),
    (["h100"], "h100"),  # SXM, PCIe, NVL: Hopper's cuBLAS workspace (NVL's memory differs)
    (["a100", "40gb"], "a100-40gb"),
    (["a100"], "a100-80gb"),
    (["l40s"], "l40s"),
    (["l4"], "l4"),
    (["a10"], "a10"),  # A10 and A10G
    (["rtx4090"], "rtx4090"),
    (["rtx3090"], "rtx3090"),
    (["v100", "16gb"], "v100-16gb"),
    (["v100"], "v100-32gb"),
    (["t4"], "t4"),
]


def estimate_gpu(name):
    key = re.sub(r"[^a-z0-9]", "", name.lower())
    for parts, gpu in GPU_NAMES:
        if all(p in key for p in parts):
            return gpu
    return None


def gib(b):
    return f"{int(b) / (1 << 30):.2f}" if b not in ("", None) else "n/a"


def err(pred, meas):
    if pred in ("", None) or meas in ("", None) or int(meas) == 0:
        return "n/a"
    return f"{(int(pred) - int(meas)) / int(meas) * 100:+.1f}"


def read_estimate(path):
    """The first row of an estimate's --csv, or None."""
    if not os.path.exists(path):
        return None
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    return rows[0] if rows else None


def join(measured, estimates):
    with open(measured, newline="") as f:
        rows = list(csv.DictReader(f))
    out = []
    for m in rows:
        key = "_".join([m["model"], m["input"], m["mode"], m["autocast"]])
        e = read_estimate(os.path.join(estimates, key + ".csv")) or {}
        pa, pr = e.get("peak_allocated_bytes", ""), e.get("peak_reserved_bytes", "")
        ma, mr = m["measured_allocated"], m["measured_reserved"]
        est_attn = e.get("attention", "n/a" if not e else "(no column)")
        out.append({
            "model": m["model"], "input": m["input"], "mode": m["mode"],
            "autocast": m["autocast"],
            "predicted_allocated": pa, "measured_allocated": ma,
            "error_allocated_pct": err(pa, ma),
            "predicted_reserved": pr, "measured_reserved": mr,
            "error_reserved_pct": err(pr, mr),
            "attention_estimate": est_attn, "sdpa_measured": m["sdpa_backend"] or "n/a",
            "estimate_autocast": e.get("autocast", ""),
            "note": m["note"] if e else (m["note"] + "; no estimate").lstrip("; "),
        })
    return out


def print_table(rows):
    head = ["model", "input", "mode", "autocast", "alloc pred GiB", "meas GiB", "err %",
            "reserved pred GiB", "meas GiB", "err %", "attention est", "sdpa ran", "note"]
    lines = [head]
    for r in rows:
        lines.append([r["model"], r["input"], r["mode"], r["autocast"],
                      gib(r["predicted_allocated"]), gib(r["measured_allocated"]),
                      r["error_allocated_pct"], gib(r["predicted_reserved"]),
                      gib(r["measured_reserved"]), r["error_reserved_pct"],
                      r["attention_estimate"], r["sdpa_measured"], r["note"]])
    widths = [max(len(str(l[i])) for l in lines) for i in range(len(head))]
    for l in lines:
        print("  ".join(str(c).ljust(w) for c, w in zip(l, widths)).rstrip())


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gpu-name", help="map an nvidia-smi GPU name to the estimate's --gpu")
    p.add_argument("--measured", help="builtin_mirrors.py's CSV")
    p.add_argument("--estimates", help="the folder of the estimates' CSVs")
    p.add_argument("--out", help="also write the joined table as CSV")
    a = p.parse_args()
    if a.gpu_name is not None:
        gpu = estimate_gpu(a.gpu_name)
        if gpu is None:
            print(f"no --gpu name known for {a.gpu_name!r}", file=sys.stderr)
            sys.exit(1)
        print(gpu)
        return
    if not (a.measured and a.estimates):
        p.error("give --gpu-name, or --measured and --estimates")
    rows = join(a.measured, a.estimates)
    print_table(rows)
    if a.out:
        with open(a.out, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else ["model"])
            w.writeheader()
            w.writerows(rows)
    missing = [r for r in rows if not r["note"].startswith("skipped")
               and "n/a" in (r["error_allocated_pct"], r["error_reserved_pct"])]
    sys.exit(1 if missing else 0)


if __name__ == "__main__":
    main()
