#!/usr/bin/env bash
# The whole GPU check, on a GPU machine with PyTorch 2.11.0+cu130 (see bundle.sh).
# Prints each step's output, then a short table of what passed; record it in
# docs/gpu-validation.md with the device, the driver and the date.
#
#   ./run.sh                          # everything
#   ./run.sh --quick                  # the transformer cases of gpt2, bert-base, vit-b16 only,
#                                     # six GPU truth cases (truth.py cases --quick)
#   ./run.sh --models gpt2,llama3.2-1b
#   ./run.sh --no-transformers --measure-all
#                                     # no transformer or plan lever cases; every GPU truth
#                                     # case measured, eager and from its traced file, and
#                                     # the held-out models, with memory snapshots of the
#                                     # traced and held-out runs (no estimate: that runs
#                                     # anywhere)
#
# Other arguments go to builtin_mirrors.py (the transformer cases); the other checks always
# run. Each step runs under its own timeout, the most valuable first; the summary gives
# each step's seconds. SKIP=REGEX leaves out the steps whose names match it, ONLY=REGEX
# runs only those (a rerun, or a short call); TRUTH_JOBS=N measures the GPU truth cases of
# --measure-all N processes at a time (4); TRUTH_MODELS="A B" limits them to those models,
# TRACE_DEVICE=cuda:0 traces them on the GPU (a file traced on the CPU keeps the tensors
# tracing baked in on the CPU: transformers' masks fail on CUDA). OUT=DIR: where the packed snapshots of the
# traced runs go (else out/).
set -uo pipefail
cd "$(dirname "$0")"
TRANSFORMERS_ARGS=()  # expanded as ${A[@]+"${A[@]}"}: empty is fine under set -u on old bash
QUICK="" NO_TRANSFORMERS="" MEASURE_ALL=""
for a in "$@"; do
  case "$a" in
    --no-transformers) NO_TRANSFORMERS=1 ;;
    --measure-all) MEASURE_ALL=1 ;;
    *) [ "$a" = --quick ] && QUICK=--quick; TRANSFORMERS_ARGS+=("$a") ;;
  esac
done
# The binaries come xz-compressed (bundle.sh); the pinned packages as wheels.
for f in bin/*.xz; do
  [ -e "$f" ] || continue
  python3 -c "import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], 'wb'))" \
    "$f" "./$(basename "${f%.xz}")" && chmod +x "./$(basename "${f%.xz}")" && rm "$f"
done
if ls wheels/*.whl >/dev/null 2>&1 && [ ! -d pylib ]; then
  python3 -m pip install --quiet --no-index --no-deps --target pylib wheels/*.whl
fi
TORCH_LIB=$(python3 -c "import torch, os; print(os.path.join(os.path.dirname(torch.__file__), 'lib'))")
export LD_LIBRARY_PATH="$TORCH_LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"

declare -a names results
# step NAME SECONDS COMMAND...: the command under a timeout.
step() {
  local name=$1 limit=$2 t0=$SECONDS; shift 2
  # SKIP=REGEX ./run.sh ...: the steps whose names match are left out (a rerun).
  if [ -n "${SKIP:-}" ] && [[ $name =~ $SKIP ]]; then
    echo; echo "=== $name: skipped (SKIP)"; return
  fi
  # ONLY=REGEX ./run.sh ...: only the steps whose names match run.
  if [ -n "${ONLY:-}" ] && ! [[ $name =~ $ONLY ]]; then
    echo; echo "=== $name: skipped (ONLY)"; return
  fi
  echo; echo "=== $name: $*"
  local rc=0
  if [ "$(type -t "$1")" = function ]; then
    # timeout runs programs, not this script's functions: a bash given them, and the
    # variables they read.
    timeout "$limit" bash -c "$(declare -p QUICK EST_GPU TRANSFORMERS_ARGS 2>/dev/null); $(declare -f); \"\$@\"" step "$@" || rc=$?
  else
    timeout "$limit" "$@" || rc=$?
  fi
  if [ $rc = 0 ]; then results+=("ok"); else results+=("FAILED ($rc)"); fi
  results[-1]+=" $((SECONDS - t0)) s"
  names+=("$name")
}
mkdir -p out
# First: the profiler's cost on the GPU (benches/overhead.rs), the modes taking turns
# of two steps (the last one timed, after a step of its own process as in a training
# loop), 20 rounds of 20 timed steps each (enough to see 1%: the control child's ratio
# says what the run cannot tell from none): the launch-bound MLP proxy (a small step:
# the CPU only launches, so the profiler's per-op and per-allocation cost shows in
# full), then two GPU-bound steps, ResNet-50 at 64x3x224x224 with SGD and GPT-2 small at
# 8x1024 with AdamW, where every mode should be within 1%.
step "overhead on cuda, launch-bound MLP step" 150 ./overhead --device cuda --model mlp --rounds 20 --steps 20
# Several GPUs' ranks on this one (ranks_truth.py): FSDP2 and DDP with the fake process
# group, ranks 0 and N-1, a loop copying its batches on a side stream; each case a process
# of its own, RANKS_JOBS (8) at a time: out/ranks/measured.csv and a memory snapshot of
# each (out/ranks/snapshots/CASE.pickle), packed into OUT (or out/) as
# ranks.tar.xz.part-* with the CSV beside them. The truth of multi-stream replay and of
# the sharded estimate.
ranks_truth() {
  local dir=${OUT:-out} rc=0
  rm -rf out/ranks && mkdir -p out/ranks/snapshots out/ranks/err
  python3 ranks_truth.py columns >out/ranks/measured.csv
  # shellcheck disable=SC2016
  PYTHONPATH=pylib python3 ranks_truth.py cases $QUICK \
    | xargs -P "${RANKS_JOBS:-8}" -L 1 sh -c 'PYTHONPATH=pylib PYTHONUNBUFFERED=1 python3 ranks_truth.py measure "$0" --out out/ranks/snapshots $([ "$1" = frames ] && echo --frames) 2>out/ranks/err/$0.txt || { echo "$0: FAILED: $(tail -n 1 out/ranks/err/$0.txt)" >&2; exit 1; }' \
    >>out/ranks/measured.csv || rc=1
  cat out/ranks/measured.csv
  mkdir -p "$dir" && rm -f "$dir"/ranks.tar.xz.part-*
  tar -cf - -C out ranks | xz -T0 -6 --block-size=16MiB | split -b 15M - "$dir/ranks.tar.xz.part-"
  [ "${PIPESTATUS[*]}" = "0 0 0" ] || rc=1
  cp out/ranks/measured.csv "$dir/ranks_measured.csv" || rc=1
  ls -l "$dir"
  return $rc
}
step "ranks on one GPU (FSDP2, DDP, side stream), with snapshots" 200 ranks_truth
# Where the small step's time goes, as the kernel counts it (perf, where this machine
# has it): the plain loop and the default profiler, 400 steps each after the warm-up.
perf_small_step() {
  command -v perf >/dev/null || { echo "perf: not on this machine (nothing measured)"; return 1; }
  local mode
  for mode in baseline profiled; do
    echo "--- $mode"
    env $([ $mode = baseline ] && echo TCH_MEMPROF_DISABLE=1) TCH_MEMPROF_BENCH_MODE=$mode \
      perf stat -e task-clock,context-switches,cpu-migrations,page-faults,instructions,cycles \
      ./overhead --device cuda --model mlp --steps 400 >/dev/null || return 1
  done
}
step "perf stat of the launch-bound step on cuda" 60 perf_small_step
# The GPU-bound steps in fewer rounds (the GPU's time varies little from step to step,
# and one session's GPU time is 15 minutes): ResNet-50 8 rounds of 8 steps, GPT-2 6 of 6,
# step by step (`--turn 1`: a GPU-bound step's time is the GPU's, whatever the CPU's
# caches hold, and two steps a turn would double the step's device time).
step "overhead on cuda, ResNet-50 64x3x224x224 SGD" 100 ./overhead --device cuda --model resnet50 --rounds 8 --steps 8 --turn 1
step "overhead on cuda, GPT-2 small 8x1024 AdamW" 130 ./overhead --device cuda --model gpt2 --rounds 6 --steps 6 --turn 1
step "allocated == allocator counter, calls, snapshots, OOM" 60 ./cuda_test --include-ignored --nocapture --test-threads 1
step "CUDA-style accounting of blocks made before the session (CPU)" 60 ./cuda_accounting_test --nocapture
weights_shown() {
  ./resnet_profile --device cuda --batch_size 16 --output out/resnet.png || return 1
  # The step timeline's weights on CUDA: ResNet-152's 241 MB, not 0.
  grep -h "Max Weights Memory" out/memory_summary_bs16.txt memory_summary_bs16.txt 2>/dev/null | head -n 1
  ! grep -qh "Max Weights Memory (GB): 0.000" out/memory_summary_bs16.txt memory_summary_bs16.txt 2>/dev/null
}
step "step timeline on cuda shows the weights" 120 weights_shown
# The earlier versions' measurement (ResNet-18 at 8x3x64x64, Adam), for comparison.
step "overhead of each profiler mode on cuda (ResNet-18 step)" 180 ./overhead --device cuda --rounds 6 --steps 40 --turn 1
step "deployment table on cuda (a clean allocator per model)" 120 ./deployment_peak --device cuda --explain --output out/deployment_peak.csv

# The GPU truth cases: the models traced here as they were measured (gpu_truth.py, on
# this machine's CPUs), estimated, and measured on the GPU, three processes at a time.
truth_cases() {
  local rc=0 model mode input args
  rm -rf out/truth && mkdir -p out/truth/est
  local cases; cases=$(PYTHONPATH=pylib python3 truth.py cases $QUICK) || return 1
  # shellcheck disable=SC2046
  PYTHONPATH=pylib python3 gpu_truth.py --measured-batch --out out/truth/files $(cut -d' ' -f1 <<<"$cases" | sort -u) || return 1
  while read -r model mode input; do
    args=(estimate "out/truth/files/$model.$mode.pt" --input "$input" --csv)
    [ "$mode" = train ] && args+=(--train --optimizer adamw)
    [ -n "$EST_GPU" ] && args+=(--gpu "$EST_GPU")
    ./tch-memprof "${args[@]}" >"out/truth/est/$model.$mode.csv" 2>"out/truth/est/$model.$mode.err" || rc=1
  done <<<"$cases"
  echo "model,mode,input,weights_allocated,measured_allocated,measured_reserved" >out/truth/measured.csv
  xargs -P 3 -L 1 sh -c 'PYTHONPATH=pylib python3 truth.py measure "$0" "$1"' <<<"$(cut -d' ' -f1,2 <<<"$cases")" \
    >>out/truth/measured.csv || rc=1
  python3 truth.py table --measured out/truth/measured.csv --estimates out/truth/est --reference truth_h200.csv || rc=1
  return $rc
}
step "quickstart on cuda" 60 ./quickstart --device cuda --epochs 2 --iterations 5
# watch on a CUDA run's files: the reserved column (not resident), the caching
# allocator's columns read, the screen as a terminal of 120 columns shows it.
step "watch of the CUDA quickstart's files" 20 ./tch-memprof watch memory_csv_data --snapshot 120x30
step "optimizations on cuda" 120 ./optimizations --device cuda --output out/comparison.csv
for leak in "" --graph --outputs --cache; do
  step "leak_hunt ${leak:-clean} on cuda" 60 ./leak_hunt --device cuda $leak
done
step "leak_hunt --graph with snapshots on cuda" 60 ./leak_hunt --device cuda --graph --snapshot out/leak_graph.pickle
step "snapshots open in torch.cuda._memory_viz" 60 python3 viewer_check.py

# Transformers: the estimate of each case (builtin_mirrors.py --list-cases), then the same
# models in PyTorch measured on cuda:0, then the two side by side.
GPU_NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)
if EST_GPU=$(python3 builtin_join.py --gpu-name "$GPU_NAME"); then
  echo "estimates for --gpu $EST_GPU ($GPU_NAME)"
else
  EST_GPU=""
  echo "warning: the estimate knows no GPU named '$GPU_NAME': estimating for its generic GPU"
fi
estimate_transformers() {
  local rc=0 cases model input est_input mode autocast args
  rm -rf out/estimate && mkdir -p out/estimate
  cases=$(python3 builtin_mirrors.py --list-cases ${TRANSFORMERS_ARGS[@]+"${TRANSFORMERS_ARGS[@]}"}) || return 1
  while read -r model input est_input mode autocast; do
    args=(estimate --model "$model" --input "$est_input" --csv)
    [ "$mode" = train ] && args+=(--train --optimizer adamw)
    [ "$autocast" != off ] && args+=(--autocast "$autocast")
    [ -n "$EST_GPU" ] && args+=(--gpu "$EST_GPU")
    local f="out/estimate/${model}_${input}_${mode}_${autocast}"
    echo "./tch-memprof ${args[*]}"
    if ./tch-memprof "${args[@]}" </dev/null >"$f.csv" 2>"$f.err"; then
      cat "$f.csv"
    else
      echo "FAILED: $(tail -n 3 "$f.err")"; rm -f "$f.csv"; rc=1
    fi
  done <<<"$cases"
  return $rc
}
# measure_cases CSV [DIR]: every GPU truth case of the reference (truth_h200.csv)
# measured into CSV, TRUTH_JOBS (4) processes at a time (the estimates run anywhere); with
# DIR, each run from its traced file there (DIR/MODEL.MODE.pt, every train-* from the train
# file) instead of the eager module, with a memory snapshot of each run written to
# out/traced/snapshots/MODEL.MODE.pickle (for `tch-memprof replay`).
measure_cases() {
  local snapshots=""
  if [ -n "${2:-}" ]; then snapshots=out/traced/snapshots && mkdir -p "$snapshots"; fi
  echo "model,mode,input,weights_allocated,measured_allocated,measured_reserved" >"$1"
  # The models with grouped-query attention first (where eager and the trace part ways),
  # then the ViT and Swin ones, then the rest: a run its timeout cuts short has those.
  # sort -s keeps the reference's order within each group.
  tail -n +2 truth_h200.csv | cut -d, -f1,2 \
    | awk -F, -v only="${TRUTH_MODELS:-}" 'only == "" || index(" " only " ", " " $1 " ")' \
    | awk -F, '{ print ($1 ~ /smollm|qwen|llama|mistral|gemma/ ? 0 : $1 ~ /vit|swin/ ? 1 : 2), $1, $2 }' \
    | sort -s -n -k1,1 | cut -d' ' -f2- \
    | TRACED="${2:-}" SNAPSHOTS="$snapshots" xargs -P "${TRUTH_JOBS:-4}" -L 1 sh -c 'PYTHONPATH=pylib python3 truth.py measure "$0" "$1" ${TRACED:+--traced "$TRACED/$0.${1%%-*}.pt"} ${SNAPSHOTS:+--snapshot "$SNAPSHOTS/$0.$1.pickle"}' \
    >>"$1"
}
measure_all() {
  PYTHONPATH=pylib python3 -c "import transformers, timm, torchvision; print('transformers', transformers.__version__, 'timm', timm.__version__, 'torchvision', torchvision.__version__)"
  measure_cases out/truth_measured_all.csv
}
# The held-out models (gpu_truth.py's HELD_OUT: never used to fit the estimate), measured
# eagerly as the others were, TRUTH_JOBS at a time, each with a memory snapshot of its run
# (out/held_out/snapshots/MODEL.MODE.pickle): runs the replay was not built on either.
measure_held_out() {
  local f=out/held_out_measured.csv rc=0
  rm -rf out/held_out && mkdir -p out/held_out/snapshots
  echo "model,mode,input,weights_allocated,measured_allocated,measured_reserved" >"$f"
  PYTHONPATH=pylib python3 truth.py cases --held-out | cut -d' ' -f1,2 \
    | xargs -P "${TRUTH_JOBS:-4}" -L 1 sh -c 'PYTHONPATH=pylib python3 truth.py measure "$0" "$1" --snapshot "out/held_out/snapshots/$0.$1.pickle"' \
    >>"$f" || rc=1
  cat "$f"
  return $rc
}
# The same cases run from their traced files (what a tch user loading them runs, and
# what the estimate predicts), traced here as they were measured.
measure_traced() {
  rm -rf out/traced && mkdir -p out/traced
  local t0=$SECONDS
  # shellcheck disable=SC2086
  PYTHONPATH=pylib python3 gpu_truth.py --measured-batch ${TRACE_DEVICE:+--device "$TRACE_DEVICE"} \
    --out out/traced/files ${TRUTH_MODELS:-} >/dev/null || return 1
  echo "traced in $((SECONDS - t0)) s"
  measure_cases out/truth_measured_traced.csv out/traced/files
}
# The snapshots of the traced and held-out runs and their CSVs, xz-compressed into a tar
# split in 15 MiB pieces (snapshots.tar.xz.part-aa, ...; `cat` them back together), and
# the CSVs beside them as they are: in OUT, whose files a GPU machine hands back (eight
# at most), or else in out/.
pack_snapshots() {
  local dir=${OUT:-out} what=() f
  for f in truth_measured_traced.csv traced/snapshots held_out_measured.csv held_out/snapshots; do
    [ -e "out/$f" ] && what+=("$f")
  done
  ls out/traced/snapshots/*.pickle out/held_out/snapshots/*.pickle >/dev/null 2>&1 \
    || ls out/*/snapshots/*.pickle >/dev/null 2>&1 || { echo "no snapshots in out/*/snapshots"; return 1; }
  mkdir -p "$dir" && rm -f "$dir"/snapshots.tar.xz.part-*
  # xz's threads split its input in blocks, by default three times its dictionary (192 MiB
  # at -9): smaller blocks, or -T0 compresses all of it on one core.
  tar -cf - -C out "${what[@]}" \
    | xz -T0 -9 --block-size=16MiB | split -b 15M - "$dir/snapshots.tar.xz.part-"
  [ "${PIPESTATUS[*]}" = "0 0 0" ] || return 1
  for f in truth_measured_traced.csv held_out_measured.csv; do
    [ -e "out/$f" ] && { cp "out/$f" "$dir/" || return 1; }
  done
  ls -l "$dir"
  local parts; parts=$(find "$dir" -maxdepth 1 -name 'snapshots.tar.xz.part-*' | wc -l)
  [ "$parts" -le 5 ] || { echo "$parts pieces: with the CSVs and the log, over the eight files a GPU machine hands back"; return 1; }
}
if [ -n "$MEASURE_ALL" ]; then
  step "GPU truth cases, every one, measured" 300 measure_all
  step "held-out models measured, with snapshots" 150 measure_held_out
  step "GPU truth cases, every one, run from their traced files" 300 measure_traced
  step "snapshots of the traced and held-out runs packed" 90 pack_snapshots
else
  step "GPU truth cases: estimated beside measured" 300 truth_cases
fi
if [ -n "$NO_TRANSFORMERS" ]; then
  echo; echo "=== summary (in $SECONDS s)"
  for i in "${!names[@]}"; do printf '%-55s %s\n' "${names[$i]}" "${results[$i]}"; done
  exit 0
fi
step "transformers estimated (tch-memprof estimate)" 120 estimate_transformers
step "transformers measured on cuda (PyTorch)" 300 \
  python3 builtin_mirrors.py ${TRANSFORMERS_ARGS[@]+"${TRANSFORMERS_ARGS[@]}"} --out out/transformers_measured.csv
step "transformers predicted beside measured" 60 python3 builtin_join.py \
  --measured out/transformers_measured.csv --estimates out/estimate --out out/transformers_joined.csv

step "plan levers (allocator settings, checkpointing) measured and estimated" 300 \
  python3 plan_levers.py --estimate ./tch-memprof ${EST_GPU:+--gpu "$EST_GPU"} --out out/plan_levers.csv

echo; echo "=== summary (in $SECONDS s)"
for i in "${!names[@]}"; do printf '%-55s %s\n' "${names[$i]}" "${results[$i]}"; done
