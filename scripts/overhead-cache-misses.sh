#!/usr/bin/env bash
# The profiler's first-level cache misses per training step, simulated, which the
# machine's timing noise does not move: the overhead bench's children
# (benches/overhead.rs) run under `valgrind --tool=cachegrind --cache-sim=yes`, each mode
# at two step counts; the difference, divided by the steps between them, is one step's
# instructions (Ir), instruction-cache misses (I1mr) and data-cache read and write misses
# (D1mr, D1mw) without start-up. Between two allocations of a step of small ops,
# libtorch's own work evicts the hooks' code and data from the first-level caches, so
# each line a hook touches is a miss: the instruction count
# (scripts/overhead-instructions.sh) does not see them, the timed bench does. cachegrind
# models this machine's caches (its header says which); the counts are deterministic,
# layout-sensitive for the instruction cache (a change that moves code moves the I1
# misses of code it did not touch by a few hundred a step).
#
#   scripts/with-libtorch.sh scripts/overhead-cache-misses.sh                 # --model mlp
#   scripts/with-libtorch.sh scripts/overhead-cache-misses.sh --model attention
set -euo pipefail

command -v valgrind >/dev/null || {
  echo "overhead-cache-misses: valgrind is needed (Debian's package valgrind)" >&2
  exit 2
}
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
shape=("$@")
[ ${#shape[@]} -gt 0 ] || shape=(--model mlp)
bench=$(cargo bench --bench overhead --no-run 2>&1 | sed -n 's/.*Executable .*(\(.*\))$/\1/p' | tail -n 1)
[ -x "$bench" ] || { echo "overhead-cache-misses: the overhead bench did not build" >&2; exit 2; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
# The bench's own malloc pins (benches/overhead.rs, MALLOC_PINNED).
export MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=4294967296 MALLOC_TOP_PAD_=268435456
few=2
many=8

run() {
  local mode=$1 steps=$2
  local disable=()
  [ "$mode" = baseline ] && disable=(TCH_MEMPROF_DISABLE=1)
  env "${disable[@]}" TCH_MEMPROF_BENCH_MODE="$mode" valgrind --tool=cachegrind --cache-sim=yes \
    --cachegrind-out-file="$out/$mode.$steps" "$bench" --steps "$steps" --threads 1 \
    "${shape[@]}" >/dev/null 2>"$out/$mode.$steps.log" || {
    echo "overhead-cache-misses: the $mode child failed:" >&2
    tail -n 5 "$out/$mode.$steps.log" >&2
    return 1
  }
}

modes=(baseline core profiled)
for mode in "${modes[@]}"; do
  run "$mode" "$few" &
  run "$mode" "$many"
  wait $!
done

python3 - "$out" "$few" "$many" "${shape[*]}" <<'PY'
import sys
out, few, many, shape = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]

def summary(path):
    events = summary_line = None
    for line in open(path):
        if line.startswith("events:"):
            events = line.split()[1:]
        elif line.startswith("summary:"):
            summary_line = [int(x) for x in line.split()[1:]]
    return dict(zip(events, summary_line))

def per_step(mode):
    a, b = summary(f"{out}/{mode}.{many}"), summary(f"{out}/{mode}.{few}")
    return {k: (a[k] - b[k]) / (many - few) for k in a}

shown = ["Ir", "I1mr", "D1mr", "D1mw"]
print(f"a training step of the overhead bench's {shape}, cachegrind, from {few} and "
      f"{many} steps after its warm-up steps:")
print(f"  {'mode':<9}" + "".join(f"{k:>13}" for k in shown))
base = per_step("baseline")
for mode in ["baseline", "core", "profiled"]:
    s = per_step(mode)
    print(f"  {mode:<9}" + "".join(f"{s[k]:>13,.0f}" for k in shown))
    if mode != "baseline":
        print(f"  {'  extra':<9}" + "".join(f"{s[k] - base[k]:>+13,.0f}" for k in shown))
PY
