#!/usr/bin/env bash
# The whole GPU check, on a GPU machine with PyTorch 2.11.0+cu130 (see bundle.sh).
# Prints each step's output, then a short table of what passed; record it in
# docs/gpu-validation.md with the device, the driver and the date.
set -uo pipefail
cd "$(dirname "$0")"
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

echo; echo "=== summary"
for i in "${!names[@]}"; do printf '%-55s %s\n' "${names[$i]}" "${results[$i]}"; done
