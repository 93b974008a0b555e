#!/usr/bin/env bash
# Compiles the native layer (every .cpp under src/native/) against another libtorch's headers, syntax
# only, with the C++ standard build.rs would pick from that libtorch's version header:
# a check for libtorch versions no tch release pairs with (2.12), where the whole suite
# cannot run. Downloads the wheel's files without its dependencies (about 1 GB, once).
#
#   scripts/native-syntax-check.sh 2.12.0
set -euo pipefail
[ $# -eq 1 ] && [[ "$1" =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || { echo "usage: scripts/native-syntax-check.sh X.Y.Z" >&2; exit 2; }
version="$1"
root="$(cd "$(dirname "$0")/.." && pwd)"
cache="${TCH_MEMPROF_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tch-memprof}/headers-$version"
if [ ! -f "$cache/.complete" ]; then
  rm -rf "$cache"
  python3 -m pip install --quiet --disable-pip-version-check --no-deps --target "$cache" "torch==$version"
  touch "$cache/.complete"
fi
inc="$cache/torch/include"
minor=$(sed -n 's/^#define TORCH_VERSION_MINOR \([0-9]*\).*/\1/p' "$inc/torch/headeronly/version.h")
std=c++17
[ "${minor:-0}" -ge 13 ] && std=c++20
status=0
while IFS= read -r f; do
  if g++ -std=$std -fsyntax-only -DNDEBUG -D_GLIBCXX_USE_CXX11_ABI=1 -Wall -Wno-unused-parameter \
      -Wno-deprecated-declarations -I"$inc" -I"$inc/torch/csrc/api/include" "$f"; then
    echo "native-syntax-check: ${f#$root/src/native/} compiles against libtorch $version ($std)"
  else
    status=1
  fi
done < <(find "$root/src/native" -name '*.cpp' | sort)
exit $status
