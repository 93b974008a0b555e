#!/usr/bin/env bash
# Runs a command with the pinned libtorch available to tch's build and to the binaries it makes.
#
#   scripts/with-libtorch.sh cargo test
#
# - If LIBTORCH is set, that libtorch is used as it is (it must be 2.11.0 for tch 0.24.0).
# - Otherwise the PyPI wheel torch==2.11.0 is installed once into a virtual environment in a
#   per-user cache (${TCH_MEMPROF_CACHE:-${XDG_CACHE_HOME:-~/.cache}/tch-memprof}) and reused after.
#   Its torch/ folder is a complete libtorch (lib/ and include/).
set -euo pipefail

TORCH_VERSION=2.11.0

if [ -n "${LIBTORCH:-}" ]; then
  if [ ! -d "$LIBTORCH/lib" ] || ! ls "$LIBTORCH"/lib/libtorch_cpu.* >/dev/null 2>&1; then
    echo "with-libtorch: LIBTORCH=$LIBTORCH has no lib/libtorch_cpu.*; unset it to use the pinned wheel" >&2
    exit 2
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
      command -v "$py" >/dev/null || { echo "with-libtorch: python3 is needed to install libtorch (or set LIBTORCH)" >&2; exit 2; }
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
