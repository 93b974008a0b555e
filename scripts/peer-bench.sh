#!/usr/bin/env bash
# The peer bench, one command: the same CPU ResNet-18 step under plain tch, tch-memprof
# (default, timeline), plain PyTorch and torch.profiler(profile_memory, record_shapes), with
# the pinned wheel's Python (the one scripts/with-libtorch.sh installs). See benches/peer.py.
#
#   scripts/peer-bench.sh [--steps N] [--rounds N]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
bench=$(scripts/with-libtorch.sh cargo bench --bench overhead --no-run --message-format=json 2>/dev/null |
  python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "overhead" and m.get("executable"):
        print(m["executable"])
')
[ -x "$bench" ] || { echo "peer-bench: could not build the overhead bench" >&2; exit 2; }
# The wheel's own Python: torch is importable there.
exec scripts/with-libtorch.sh sh -c 'exec "$LIBTORCH/../../../../bin/python" "$0" "$@"' \
  benches/peer.py --rust-bench "$bench" "$@"
