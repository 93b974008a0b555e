#!/usr/bin/env bash
# Runs a command with the libtorch that the resolved tch needs, available to tch's build and to
# the binaries it makes.
#
#   scripts/with-libtorch.sh cargo test
#
# - The libtorch version is the one the torch-sys that Cargo resolved for the package in the
#   current folder expects: `cargo metadata` names torch-sys's manifest, and its build script
#   declares `const TORCH_VERSION` (torch-sys 0.24.0 -> 2.11.0, 0.26.0 -> 2.13.0). So after
#   `cargo update -p tch --precise 0.26.0` this script provisions 2.13.0 by itself.
#   TORCH_VERSION=x.y.z in the environment overrides that.
# - If LIBTORCH is set, that libtorch is used as it is (its version must be the one above, or
#   torch-sys's build refuses it unless LIBTORCH_BYPASS_VERSION_CHECK is set).
# - Otherwise the PyPI wheel torch==VERSION is installed once into a virtual environment in a
#   per-user cache (${TCH_MEMPROF_CACHE:-${XDG_CACHE_HOME:-~/.cache}/tch-memprof}/torch-VERSION)
#   and reused after. Its torch/ folder is a complete libtorch (lib/ and include/).
set -euo pipefail

die() { echo "with-libtorch: $*" >&2; exit 2; }

resolve_torch_version() {
  local manifest meta
  # What `cargo build` would resolve: the lock as it is, updated as cargo would update it
  # for a dependency added to Cargo.toml, created if missing.
  meta=$(cargo metadata --format-version 1) || die "\`cargo metadata\` failed in $(pwd) (see above)"
  manifest=$(printf '%s' "$meta" | python3 -c '
import json, sys
m = json.load(sys.stdin)
print(next((p["manifest_path"] for p in m["packages"] if p["name"] == "torch-sys"), ""))
')
  [ -n "$manifest" ] || die "cannot find torch-sys in \`cargo metadata\` of $(pwd) (run it from the package's folder, or set TORCH_VERSION)"
  local build_rs
  build_rs="$(dirname "$manifest")/build.rs"
  local v
  v=$(sed -n 's/^const TORCH_VERSION: &str = "\([0-9][0-9.]*\)";.*/\1/p' "$build_rs" | head -n 1)
  [ -n "$v" ] || die "no \`const TORCH_VERSION\` in $build_rs (set TORCH_VERSION=x.y.z)"
  echo "$v"
}

TORCH_VERSION="${TORCH_VERSION:-$(resolve_torch_version)}"
export TCH_MEMPROF_TORCH_VERSION="$TORCH_VERSION"

if [ -n "${LIBTORCH:-}" ]; then
  if [ ! -d "$LIBTORCH/lib" ] || ! ls "$LIBTORCH"/lib/libtorch_cpu.* >/dev/null 2>&1; then
    die "LIBTORCH=$LIBTORCH has no lib/libtorch_cpu.*; unset it to use the wheel torch==$TORCH_VERSION"
  fi
else
  cache="${TCH_MEMPROF_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tch-memprof}"
  venv="$cache/torch-$TORCH_VERSION"
  mkdir -p "$cache"
  if [ ! -f "$venv/.complete" ]; then
    # One installer at a time (two test runs started together must not race).
    exec 9>"$cache/.lock"
    flock 9
    if [ ! -f "$venv/.complete" ]; then
      echo "with-libtorch: installing torch==$TORCH_VERSION (libtorch) into $venv, once" >&2
      py="${PYTHON:-python3}"
      command -v "$py" >/dev/null || die "python3 is needed to install libtorch (or set LIBTORCH)"
      rm -rf "$venv.partial"
      "$py" -m venv "$venv.partial"
      "$venv.partial/bin/python" -m pip install --quiet --disable-pip-version-check "torch==$TORCH_VERSION"
      rm -rf "$venv"
      mv "$venv.partial" "$venv"
      # A venv's scripts name their folder; the moved venv is only used for its files.
      touch "$venv/.complete"
    fi
    flock -u 9
  fi
  site=$(ls -d "$venv"/lib/python3*/site-packages | head -n 1)
  export LIBTORCH="$site/torch"
fi

exec "$@"
