#!/usr/bin/env bash
# Where the profiler's time goes on the launch-bound proxy, sampled: each mode's child of
# the overhead bench (benches/overhead.rs) runs STEPS steps under `perf record -e
# cpu-clock` (a software clock: it needs no hardware counter, so it works in a VM), and
# the script prints the share of the samples in the profiler's own functions (the native
# hooks, memprof::, and the Rust side, tch_memprof::) and its ten largest. A share is
# time spent in the profiler's code itself; a cache line it makes the rest of the step
# miss is not in it (the timed bench sees that). Complements the instruction count
# (scripts/overhead-instructions.sh), which does not see a locked instruction's cost.
#
#   scripts/with-libtorch.sh scripts/overhead-samples.sh                 # --model mlp, 1500 steps
#   scripts/with-libtorch.sh scripts/overhead-samples.sh --model attention --steps 1500
set -euo pipefail
command -v perf >/dev/null || {
  echo "overhead-samples: perf is needed (Debian's package linux-perf)" >&2
  exit 2
}
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
model=mlp
steps=1500
while [ $# -gt 0 ]; do
  case "$1" in
    --model) model=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    *) echo "overhead-samples: unknown option $1 (--model NAME, --steps N)" >&2; exit 2 ;;
  esac
done
bench=$(cargo bench --bench overhead --no-run 2>&1 | sed -n 's/.*Executable .*(\(.*\))$/\1/p' | tail -n 1)
[ -x "$bench" ] || { echo "overhead-samples: the overhead bench did not build" >&2; exit 2; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
# The bench's own malloc pins (benches/overhead.rs, MALLOC_PINNED).
export MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=4294967296 MALLOC_TOP_PAD_=268435456
echo "cpu-clock samples of the overhead bench's --model $model children, $steps steps each:"
for mode in baseline core profiled; do
  disable=()
  [ "$mode" = baseline ] && disable=(TCH_MEMPROF_DISABLE=1)
  env "${disable[@]}" TCH_MEMPROF_BENCH_MODE="$mode" perf record -q -e cpu-clock -F 5000 \
    -o "$out/$mode.data" "$bench" --steps "$steps" --threads 1 --model "$model" >/dev/null 2>"$out/$mode.log" || {
    echo "overhead-samples: the $mode child failed:" >&2
    tail -n 5 "$out/$mode.log" >&2
    exit 1
  }
  perf report -i "$out/$mode.data" --no-children --sort sym --stdio 2>/dev/null |
    grep -v '^#' | grep -v '^$' >"$out/$mode.txt"
  share=$(awk '/memprof::|tch_memprof::/ { gsub("%", "", $1); s += $1 } END { printf "%.2f", s }' "$out/$mode.txt")
  echo "  $mode: ${share}% of the samples in the profiler's own functions"
  if [ "$mode" != baseline ]; then
    grep -E 'memprof::|tch_memprof::' "$out/$mode.txt" | head -n 10 | sed 's/^/      /'
  fi
done
