#!/usr/bin/env bash
# Builds everything the GPU check needs on the development machine (the GPU machines
# have no Rust toolchain) into gpu_bundle/, to be copied to a GPU machine and run there:
#
#   scripts/gpu/bundle.sh            # here
#   cd gpu_bundle && ./run.sh        # there (PyTorch 2.11.0+cu130 installed)
#
# See docs/gpu-validation.md.
set -euo pipefail
cd "$(dirname "$0")/../.."
scripts/with-libtorch.sh cargo build --release --examples
scripts/with-libtorch.sh cargo build --release --bin tch-memprof
cuda_test=$(scripts/with-libtorch.sh cargo test --release --no-run --test cuda --message-format=json \
  | grep -o '"executable":"[^"]*cuda-[^"]*"' | cut -d'"' -f4 | head -n 1)
rm -rf gpu_bundle && mkdir -p gpu_bundle
cp "$cuda_test" gpu_bundle/cuda_test
for e in quickstart resnet_profile leak_hunt optimizations deployment_peak; do
  cp "target/release/examples/$e" gpu_bundle/
done
cp target/release/tch-memprof gpu_bundle/
cp scripts/gpu/run.sh scripts/gpu/viewer_check.py scripts/gpu/transformers.py \
  scripts/gpu/transformers_join.py scripts/gpu/plan_levers.py gpu_bundle/
echo "gpu_bundle/ is ready: copy it to the GPU machine and run ./run.sh there"
