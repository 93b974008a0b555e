#!/usr/bin/env bash
# Runs the test suite on another tch version, without touching this tree (all of it but
# the model corpus's held-out set, of the corpus one model of each family, and the few
# tests listed below):
#
#   scripts/compat.sh 0.26.0            # tch 0.26.0, libtorch 2.13.0
#   scripts/compat.sh 0.26.0 --release  # extra arguments go to `cargo test`
#
# It copies the tree's files (tracked and untracked-but-not-ignored) to a scratch folder
# (${TCH_MEMPROF_COMPAT_DIR:-target/compat}/tch-VERSION), moves that copy's Cargo.lock to the
# given tch (and the torch-sys it requires), provisions the libtorch that torch-sys expects
# (scripts/with-libtorch.sh reads it from the resolved torch-sys), and runs `cargo test` there.
# The copy builds in a folder of its own (target/compat/build-tch-VERSION, kept between runs):
# sharing this tree's target/ is unsafe, as Cargo hashes a path package by its path relative
# to the workspace, so the copy's build script would share a build with this tree's and one
# would run the other's stale build script.
set -euo pipefail

[ $# -ge 1 ] || { echo "usage: scripts/compat.sh TCH_VERSION [cargo test args...]" >&2; exit 2; }
version="$1"
shift
[[ "$version" =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || {
  echo "compat: '$version' is not a version x.y.z (e.g. 0.26.0)" >&2
  exit 2
}

root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
compat="${TCH_MEMPROF_COMPAT_DIR:-$root/target/compat}"
scratch="$compat/tch-$version"
export CARGO_TARGET_DIR="$compat/build-tch-$version"

rm -rf "$scratch"
mkdir -p "$scratch"
# The tree as git sees it (a clone's files, plus work not yet committed), never target/.
git ls-files -z --cached --others --exclude-standard |
  while IFS= read -r -d '' f; do [ -e "$f" ] && printf '%s\0' "$f"; done |
  (cd "$root" && xargs -0 cp --parents -t "$scratch")

cd "$scratch"
# tch pins its torch-sys exactly, so moving tch moves torch-sys with it.
cargo update --quiet -p tch --precise "$version"
resolved=$(cargo metadata --format-version 1 --locked | python3 -c '
import json, sys
m = json.load(sys.stdin)
print(", ".join(p["name"] + " " + p["version"] for p in m["packages"] if p["name"] in ("tch", "torch-sys")))
')
echo "compat: $scratch resolves $resolved" >&2
scripts/with-libtorch.sh sh -c 'echo "compat: libtorch $TCH_MEMPROF_TORCH_VERSION at $LIBTORCH" >&2'
# The suite but the held-out set of the model corpus, which runs with the crate's own lock
# only (tests/corpus.rs).
export TCH_MEMPROF_COMPAT="tch $version"
# Of the model corpus, one model of each family (decoders with and without grouped-query
# attention, encoders, an encoder-decoder's encoder, vision transformers, convolution
# nets of torchvision and timm, a speech model): each traced and exported by the other
# libtorch and estimated by it. The whole corpus runs with the crate's own lock (the
# compat step with the whole corpus took 22 of CI's 55 minutes on a 2-core machine).
export TCH_MEMPROF_CORPUS_MODELS="${TCH_MEMPROF_CORPUS_MODELS:-hf-gpt2 hf-llama hf-mistral \
hf-bert hf-t5-encoder hf-vit hf-wav2vec2 tv-resnet18 tv-mobilenet-v3-small \
tv-efficientnet-b0 tv-swin timm-vit-tiny timm-convnext-atto timm-levit}"
# Left out here, each run with the crate's own lock: tests that hold predictions to data
# recorded on a GPU or to files exported by the crate's own libtorch (gpu_truth,
# ranks_truth, plan, export_script: what they exercise of libtorch, the dry run and the
# export, the corpus's subset exercises on this one), and the doc tests (examples of the
# API, which does not change with tch). They took about 4 of CI's minutes here. And
# watch's: the terminal view reads CSV files and draws text, nothing of tch; its tests
# run the quickstart example, which `--test` targets do not build.
skip=" gpu_truth ranks_truth plan export_script watch "
targets=(--lib --bins)
for t in tests/*.rs; do
  name=$(basename "$t" .rs)
  [[ "$skip" == *" $name "* ]] || targets+=(--test "$name")
done
exec scripts/with-libtorch.sh cargo test --locked "${targets[@]}" "$@"
