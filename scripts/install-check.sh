#!/usr/bin/env bash
# Installs the tch-memprof command the way the README says (`cargo install --locked
# --path .` through scripts/with-libtorch.sh) into a scratch folder, then runs
# `tch-memprof estimate --model resnet18` from there with LD_LIBRARY_PATH unset: the
# installed binary must find libtorch by itself (the rpath its build script sets).
#
#   scripts/install-check.sh            # a debug build in the suite's target folder (CI)
#   scripts/install-check.sh --release  # the README's release build, in its own folder
#
# The estimate must count ResNet-18's weights as PyTorch publishes them: 11,689,512 f32
# parameters and the batch norms' 9,600 f32 running statistics (2 x the 4,800 channels of
# its 20 batch norms), 46,796,448 bytes.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
dest="$(mktemp -d)"
trap 'rm -rf "$dest"' EXIT

if [ "${1:-}" = "--release" ]; then
  profile=()
else
  # The suite's own build: the install then only copies what `cargo test` built.
  profile=(--debug --target-dir "${CARGO_TARGET_DIR:-$root/target}")
fi
scripts/with-libtorch.sh cargo install --quiet --locked --path . "${profile[@]}" --root "$dest"

bin="$dest/bin/tch-memprof"
[ -x "$bin" ] || { echo "install-check: no $bin after cargo install" >&2; exit 1; }
out=$(env -u LD_LIBRARY_PATH -u LIBTORCH "$bin" estimate --model resnet18 --csv) || {
  echo "install-check: the installed tch-memprof failed (above)" >&2
  exit 1
}
weights=$(printf '%s\n' "$out" | python3 -c '
import csv, sys
rows = list(csv.DictReader(sys.stdin))
print(rows[0]["weights_bytes"] if rows else "")
')
if [ "$weights" != "46796448" ]; then
  echo "install-check: resnet18 weights_bytes is '$weights', expected 46796448 ((11,689,512 + 9,600) x 4)" >&2
  printf '%s\n' "$out" >&2
  exit 1
fi
echo "install-check: cargo install --locked --path . gave a tch-memprof that runs without LD_LIBRARY_PATH (resnet18 weights 46796448 B)"
