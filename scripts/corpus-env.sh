#!/usr/bin/env bash
# Installs the model corpus's packages (transformers, torchvision, timm, at pinned
# versions from PyPI) into the Python of the torch wheel that LIBTORCH points into, once,
# and prints that Python's path. Run through scripts/with-libtorch.sh:
#
#   scripts/with-libtorch.sh scripts/corpus-env.sh
#
# torchvision is pinned to the release built for the wheel's torch (its version is read
# from the wheel); transformers and timm are pinned for every torch.
set -euo pipefail

die() { echo "corpus-env: $*" >&2; exit 2; }

[ -n "${LIBTORCH:-}" ] || die "LIBTORCH is not set (run through scripts/with-libtorch.sh)"
venv="$(cd "$LIBTORCH/../../../.." && pwd)"
py="$venv/bin/python3"
[ -x "$py" ] || die "no Python beside LIBTORCH=$LIBTORCH (a libtorch from a wheel's venv is needed to trace the corpus)"

torch_version=$("$py" -c 'import torch; print(torch.__version__.split("+")[0])')
case "$torch_version" in
  2.11.*) torchvision=0.26.0 ;;
  2.12.*) torchvision=0.27.0 ;;
  2.13.*) torchvision=0.28.0 ;;
  *) die "no torchvision pinned for torch $torch_version (add it to scripts/corpus-env.sh)" ;;
esac
requirements="transformers==4.57.6 timm==1.0.31 torchvision==$torchvision torch==$torch_version"
marker="$venv/.corpus-$(printf '%s' "$requirements" | sha256sum | cut -c1-16)"

if [ ! -f "$marker" ]; then
  exec 9>"$venv/.corpus-lock"
  flock 9
  if [ ! -f "$marker" ]; then
    echo "corpus-env: installing $requirements into $venv, once" >&2
    # shellcheck disable=SC2086
    "$py" -m pip install --quiet --disable-pip-version-check $requirements >&2
    touch "$marker"
  fi
  flock -u 9
fi
echo "$py"
