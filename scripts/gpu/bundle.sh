#!/usr/bin/env bash
# Builds everything the GPU check needs on the development machine (the GPU machines
# have no Rust toolchain and no network) into gpu_bundle/, to be copied to a GPU machine
# and run there:
#
#   scripts/gpu/bundle.sh            # here
#   cd gpu_bundle && ./run.sh        # there (PyTorch 2.11.0+cu130 installed)
#
# The binaries are xz-compressed (run.sh unpacks them with Python's lzma); the wheels of
# the packages the GPU truth cases pin (transformers, timm), and of the two transformers
# checks the versions of at import (huggingface_hub, tokenizers: the GPU machine's are
# those of its newer transformers), come along, installed there into a folder of the
# bundle that comes first on PYTHONPATH. The bundle stays under 64 MiB (checked). See
# docs/gpu-validation.md.
set -euo pipefail
cd "$(dirname "$0")/../.."
scripts/with-libtorch.sh cargo build --release --examples
scripts/with-libtorch.sh cargo build --release --bin tch-memprof
# Where cargo put them: CARGO_TARGET_DIR when set (relative to this folder, as cargo reads
# it here), else target/.
target_dir="${CARGO_TARGET_DIR:-target}"
# test_bin KIND NAME: the executable of a test (KIND test) or a bench (KIND bench).
test_bin() {
  scripts/with-libtorch.sh cargo "$1" --no-run --"$1" "$2" --message-format=json $([ "$1" = test ] && echo --release) \
    | grep -o "\"executable\":\"[^\"]*/$2-[^\"]*\"" | cut -d'"' -f4 | head -n 1
}
rm -rf gpu_bundle && mkdir -p gpu_bundle/bin gpu_bundle/wheels
cp "$(test_bin test cuda)" gpu_bundle/bin/cuda_test
cp "$(test_bin test cuda_accounting)" gpu_bundle/bin/cuda_accounting_test
cp "$(test_bin bench overhead)" gpu_bundle/bin/overhead
for e in quickstart resnet_profile leak_hunt optimizations deployment_peak; do
  cp "$target_dir/release/examples/$e" gpu_bundle/bin/
done
cp "$target_dir/release/tch-memprof" gpu_bundle/bin/
xz -T0 -6 gpu_bundle/bin/*
cp scripts/gpu/run.sh scripts/gpu/viewer_check.py scripts/gpu/builtin_mirrors.py \
  scripts/gpu/builtin_join.py scripts/gpu/plan_levers.py scripts/gpu/truth.py \
  scripts/gpu/ranks_truth.py \
  scripts/gpu_truth.py scripts/corpus.py \
  tests/data/gpu-truth/h200-2026-11-26/measured.csv gpu_bundle/
mv gpu_bundle/measured.csv gpu_bundle/truth_h200.csv
py="$(scripts/with-libtorch.sh scripts/corpus-env.sh)"
"$py" -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
  -d gpu_bundle/wheels transformers==4.57.6 timm==1.0.31 \
  "huggingface_hub==$("$py" -c 'from importlib.metadata import version; print(version("huggingface_hub"))')" \
  "tokenizers==$("$py" -c 'from importlib.metadata import version; print(version("tokenizers"))')" \
  --platform manylinux2014_x86_64 --python-version 3.12
size=$(du -sm gpu_bundle | cut -f1)
[ "$size" -le 64 ] || { echo "bundle.sh: gpu_bundle/ is $size MiB, over the 64 MiB a GPU machine takes" >&2; exit 1; }
echo "gpu_bundle/ is ready ($size MiB): copy it to the GPU machine and run ./run.sh there"
