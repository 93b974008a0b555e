#!/usr/bin/env bash
# The whole GPU check, on a GPU machine with PyTorch 2.11.0+cu130 (see bundle.sh).
# Prints each step's output, then a short table of what passed; record it in
# docs/gpu-validation.md with the device, the driver and the date.
#
#   ./run.sh                          # everything
#   ./run.sh --quick                  # the transformer cases of gpt2, bert-base, vit-b16 only
#   ./run.sh --models gpt2,llama3.2-1b
#
# Arguments go to transformers.py (the transformer cases); the other checks always run.
set -uo pipefail
cd "$(dirname "$0")"
TRANSFORMERS_ARGS=("$@")  # expanded as ${A[@]+"${A[@]}"}: empty is fine under set -u on old bash
TORCH_LIB=$(python3 -c "import torch, os; print(os.path.join(os.path.dirname(torch.__file__), 'lib'))")
export LD_LIBRARY_PATH="$TORCH_LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"

declare -a names results
step() {
  local name=$1; shift
  echo; echo "=== $name: $*"
  if "$@"; then results+=("ok"); else results+=("FAILED ($?)"); fi
  names+=("$name")
}
step "allocated == allocator counter, calls, snapshots, OOM" ./cuda_test --nocapture --test-threads 1
step "quickstart on cuda" ./quickstart --device cuda --epochs 2 --iterations 5
step "step timeline on cuda" ./resnet_profile --device cuda --batch_size 16 --output out/resnet.png
step "deployment table on cuda" ./deployment_peak --device cuda --explain --output out/deployment_peak.csv
step "optimizations on cuda" ./optimizations --device cuda --output out/comparison.csv
for leak in "" --graph --outputs --cache; do
  step "leak_hunt ${leak:-clean} on cuda" ./leak_hunt --device cuda $leak
done
mkdir -p out
step "leak_hunt --graph with snapshots on cuda" ./leak_hunt --device cuda --graph --snapshot out/leak_graph.pickle
step "snapshots open in torch.cuda._memory_viz" python3 viewer_check.py

# Transformers: the estimate of each case (transformers.py --list-cases), then the same
# models in PyTorch measured on cuda:0, then the two side by side.
GPU_NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)
if EST_GPU=$(python3 transformers_join.py --gpu-name "$GPU_NAME"); then
  echo "estimates for --gpu $EST_GPU ($GPU_NAME)"
else
  EST_GPU=""
  echo "warning: the estimate knows no GPU named '$GPU_NAME': estimating for its generic GPU"
fi
estimate_transformers() {
  local rc=0 cases model input est_input mode autocast args
  rm -rf out/estimate && mkdir -p out/estimate
  cases=$(python3 transformers.py --list-cases ${TRANSFORMERS_ARGS[@]+"${TRANSFORMERS_ARGS[@]}"}) || return 1
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
step "transformers estimated (tch-memprof estimate)" estimate_transformers
step "transformers measured on cuda (PyTorch)" \
  python3 transformers.py ${TRANSFORMERS_ARGS[@]+"${TRANSFORMERS_ARGS[@]}"} --out out/transformers_measured.csv
step "transformers predicted beside measured" python3 transformers_join.py \
  --measured out/transformers_measured.csv --estimates out/estimate --out out/transformers_joined.csv

step "plan levers (allocator settings, checkpointing) measured and estimated" \
  python3 plan_levers.py --estimate ./tch-memprof ${EST_GPU:+--gpu "$EST_GPU"} --out out/plan_levers.csv

echo; echo "=== summary"
for i in "${!names[@]}"; do printf '%-55s %s\n' "${names[$i]}" "${results[$i]}"; done
