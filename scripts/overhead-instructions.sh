#!/usr/bin/env bash
# The profiler's cost per training step in instructions, which the machine's timing noise
# does not move: the overhead bench's children (benches/overhead.rs: ResNet-18, Adam, one
# libtorch thread) run under `valgrind --tool=callgrind`, each mode at two step counts;
# the difference, divided by the steps between them, is one step's instructions without
# start-up. Prints each mode's instructions a step and its ratio to the plain loop, then
# where the default profiler's extra instructions go (`callgrind_annotate`'s functions,
# per step, against the plain loop's, grouped by library), and the step timeline's
# against the default profiler's.
#
#   scripts/with-libtorch.sh scripts/overhead-instructions.sh                  # 1x3x16x16
#   scripts/with-libtorch.sh scripts/overhead-instructions.sh --batch 8 --image 64
#   scripts/with-libtorch.sh scripts/overhead-instructions.sh --model mlp      # launch-bound
#
# The default input is small: the step keeps every op, allocation and Adam update of the
# timed bench's (8x3x64x64), so the profiler's instructions are the same, while the
# convolutions' arithmetic shrinks and a child runs in about 90 seconds under callgrind
# (at 8x3x64x64, a child ran over 17 minutes without finishing); the profiler's ratio there is an upper bound of
# its ratio at the larger input.
# Instructions are not time: a cache miss or a page fault costs no instruction, so this
# complements the timed bench (`cargo bench --bench overhead`), it does not replace it.
# Two children run at a time; the whole takes about 6 minutes on 2 cores.
set -euo pipefail

command -v valgrind >/dev/null || {
  echo "overhead-instructions: valgrind is needed (Debian's package valgrind)" >&2
  exit 2
}
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
shape=("$@")
[ ${#shape[@]} -gt 0 ] || shape=(--batch 1 --image 16)
bench=$(cargo bench --bench overhead --no-run 2>&1 | sed -n 's/.*Executable .*(\(.*\))$/\1/p' | tail -n 1)
[ -x "$bench" ] || { echo "overhead-instructions: the overhead bench did not build" >&2; exit 2; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
# The bench's own malloc pins (benches/overhead.rs, MALLOC_PINNED).
export MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=4294967296 MALLOC_TOP_PAD_=268435456
few=2
many=6

run() {
  local mode=$1 steps=$2
  local disable=()
  [ "$mode" = baseline ] && disable=(TCH_MEMPROF_DISABLE=1)
  env "${disable[@]}" TCH_MEMPROF_BENCH_MODE="$mode" valgrind --tool=callgrind \
    --callgrind-out-file="$out/$mode.$steps" "$bench" --steps "$steps" --threads 1 \
    "${shape[@]}" >/dev/null 2>"$out/$mode.$steps.log" || {
    echo "overhead-instructions: the $mode child failed:" >&2
    tail -n 5 "$out/$mode.$steps.log" >&2
    return 1
  }
}

modes=(baseline core profiled timeline)
for mode in "${modes[@]}"; do
  run "$mode" "$few" &
  run "$mode" "$many"
  wait $!
done

total() { sed -n 's/^summary: *\([0-9]*\).*/\1/p' "$out/$1"; }
echo "instructions a training step (the overhead bench's ${shape[*]}), callgrind,"
echo "from $few and $many steps after 5 warm-up steps:"
base=$(( ($(total "baseline.$many") - $(total "baseline.$few")) / (many - few) ))
for mode in "${modes[@]}"; do
  step=$(( ($(total "$mode.$many") - $(total "$mode.$few")) / (many - few) ))
  python3 -c "print(f'  {\"$mode\":<9} {$step:>15,} instructions  ratio {$step / $base:.4f}')"
done
# Where the default mode's and the timeline's extra instructions go, per step, grouped
# by function.
python3 - "$out" "$few" "$many" <<'PY'
import collections, re, subprocess, sys
out, few, many = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])

def functions(path):
    text = subprocess.run(["callgrind_annotate", "--threshold=100", path],
                          capture_output=True, text=True, check=True).stdout
    counts = collections.Counter()
    for line in text.splitlines():
        m = re.match(r"\s*([\d,]+) \([^)]*\)\s+(.*)$", line)
        if m and "PROGRAM TOTALS" not in line:
            counts[m.group(2)] += int(m.group(1).replace(",", ""))
    return counts

def per_step(mode):
    a, b = functions(f"{out}/{mode}.{many}"), functions(f"{out}/{mode}.{few}")
    return {k: (a[k] - b[k]) / (many - few) for k in set(a) | set(b)}

groups = [
    ("libtorch's RecordFunction (op records)",
     lambda k: "RecordFunction" in k or "StepCallbacks" in k),
    ("op inputs packed as IValues", lambda k: "IValue" in k or "c10::List" in k),
    ("glibc malloc and free", lambda k: "malloc.c" in k or "arena.c" in k),
    ("the native hooks (memprof::)",
     lambda k: ("memprof::" in k or "memprof_flops::" in k) and "tch_memprof::" not in k),
    ("the Rust side (tch_memprof::)", lambda k: "tch_memprof::" in k),
]
def breakdown(mode, base, what):
    a, b = per_step(mode), per_step(base)
    extra = {k: a.get(k, 0) - b.get(k, 0) for k in set(a) | set(b)}
    total = sum(extra.values())
    print(f"{what}: {total:,.0f} extra instructions a step, by function:")
    for name, match in groups:
        part = sum(v for k, v in extra.items() if match(k))
        print(f"  {name:<40} {part:>12,.0f}  {100 * part / total:5.1f}%")

breakdown("profiled", "baseline", "the default profiler over the plain loop")
breakdown("timeline", "profiled", "the step timeline over the default profiler")
PY
