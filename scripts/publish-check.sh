#!/usr/bin/env bash
# `cargo publish --dry-run`: packages the crate and builds the package on its own, as
# crates.io would, then removes the unpacked copy. Cargo builds that copy in this tree's
# target folder as the same crate, so its fingerprints (this crate's build script's, and
# any unit the next build finds unchanged) name the copy's files: left there, an edit to
# this tree's build.rs would be missed. Without the copy, they are rebuilt.
#
#   scripts/publish-check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
trap 'rm -rf "${CARGO_TARGET_DIR:-target}"/package/tch-memprof-*/' EXIT
scripts/with-libtorch.sh cargo publish --dry-run --locked "$@"
