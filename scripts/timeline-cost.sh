#!/usr/bin/env bash
# Where the step timeline's cost goes, measured by sampling rather than by timing (timing on
# a small shared machine is noisier than the cost): runs the overhead bench's child for the
# default profiler and for the profiler with the step timeline under `perf record`, and
# prints the share of CPU samples spent in the bench binary (the native hooks, the replay,
# the rest of tch-memprof, and tch's thin Rust side) and in libtorch's RecordFunction machinery that the op callback
# makes it run. Needs perf (Debian: linux-perf).
#
#   scripts/timeline-cost.sh [--steps N]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
command -v perf >/dev/null || { echo "timeline-cost: perf is needed (apt-get install linux-perf)" >&2; exit 2; }
steps=40
[ "${1:-}" = "--steps" ] && steps="$2"
bench=$(scripts/with-libtorch.sh cargo bench --bench overhead --no-run --message-format=json 2>/dev/null |
  python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "overhead" and m.get("executable"):
        print(m["executable"])
')
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for mode in profiled timeline; do
  TCH_MEMPROF_BENCH_MODE=$mode perf record -q -F 2000 -o "$tmp/$mode.data" "$bench" --steps "$steps" >/dev/null 2>"$tmp/$mode.err"
  perf report -q -i "$tmp/$mode.data" --no-children --sort dso,sym --stdio -g none 2>/dev/null |
    python3 -c '
import os, re, sys
mode, steps, exe = sys.argv[1], sys.argv[2], os.path.basename(sys.argv[3])
own = rf = 0.0
for line in sys.stdin:
    m = re.match(r"\s*([0-9.]+)%\s+(\S+)\s+\[.\]\s+(.*)", line)
    if not m:
        continue
    share, dso, sym = float(m.group(1)), m.group(2), m.group(3)
    # The bench binary holds the native layer, tch-memprof and tch\x27s Rust side (the
    # training loop itself spends its time in libtorch).
    if exe.startswith(dso) or dso.startswith(exe[:15]):
        own += share
    elif re.search(r"RecordFunction|record_function|ThreadLocalDebugInfo|ObserverContext", sym):
        rf += share
print(f"{mode:<9} {steps} steps: profiler code {own:.2f}% of CPU samples, RecordFunction {rf:.2f}%")
'  "$mode" "$steps" "$bench"
done
