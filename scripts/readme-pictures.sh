#!/usr/bin/env bash
# The README's pictures, remade from the examples: the committed files are this script's
# output, each marked with the command that made it (a PNG text chunk that
# `python3 scripts/pictures.py check`, run by CI, requires of every picture the README and
# docs/ link).
#
#   scripts/readme-pictures.sh        # under a minute on 2 cores once the examples are built
#
# - assets/report.png: the HTML report of the quickstart's run (`cargo run --example
#   quickstart -- --device cpu --html --label quickstart`: its default 3 epochs x 20
#   iterations, with step 2 examined op by op and the blocks idle at its peak), the whole
#   page rendered 960 pixels wide in headless Chromium. Refused unless the page is that
#   run's: titled by its label, its idle blocks at lines of examples/quickstart.rs, no
#   temporary folder and no test file in it.
# - docs/images/resnet152_bs2_timeline.png: ResNet-152's live memory by category over one
#   forward and backward pass at batch 2 on the CPU (`cargo run --example resnet_profile
#   -- --batch_size 2 --device cpu`), the plot the example writes.
#
# The examples run in Cargo's dev profile: its line tables give the idle blocks' source
# lines (the release profile has none), and libtorch does the work either way. Runs on the
# CPU, so the pictures are the same on any machine but for timings and resident bytes.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
say() { echo "readme-pictures: $*" >&2; }
command -v chromium >/dev/null || { say "chromium is needed (Debian's package chromium)"; exit 2; }

work=target/readme-pictures
rm -rf "$work"
mkdir -p "$work"
profile="$work/chromium-profile"
chrome() {
  chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --no-first-run \
    --disable-background-networking --disable-component-update --disable-sync \
    --user-data-dir="$root/$profile" "$@" 2>/dev/null
}

# 1. The quickstart's report. It runs at the repository's root, as the README runs it:
# its source lines are shown relative to the working folder.
quick=(--device cpu --html --label quickstart)
scripts/with-libtorch.sh cargo run --quiet --example quickstart -- "${quick[@]}" >"$work/quickstart.txt"
page=$(sed -n '/^HTML report:$/{n;s/^ *//;p}' "$work/quickstart.txt")
[ -f "$page" ] || { say "the quickstart printed no HTML report (see $work/quickstart.txt)"; exit 1; }
stem=${page%_report.html}
# Its files move out of memory_csv_data/, where the user's own runs go.
mkdir -p "$work/quickstart"
mv "$stem"_* "$work/quickstart/"
page="$work/quickstart/$(basename "$page")"
grep -q '<title>tch-memprof: quickstart</title>' "$page" ||
  { say "$page: not titled by the run's label"; exit 1; }
grep -q 'examples/quickstart.rs:[0-9]' "$page" ||
  { say "$page: no source line of examples/quickstart.rs (the idle blocks' lines)"; exit 1; }
if grep -qE '\.tmp|tests/' "$page"; then
  say "$page: names a temporary folder or a test file, not the quickstart's run"
  exit 1
fi
# The page's height at 960 pixels: measured in the browser, then the whole page drawn.
cat >"$work/measure.html" <<EOF
<html><body><iframe src="file://$root/$page" style="width:960px;height:400px;border:0"
onload="document.getElementById('h').textContent='height='+this.contentDocument.documentElement.scrollHeight"></iframe>
<p id=h></p></body></html>
EOF
height=$(chrome --allow-file-access-from-files --window-size=960,600 --virtual-time-budget=10000 \
  --dump-dom "file://$root/$work/measure.html" | sed -n 's/.*height=\([0-9][0-9]*\).*/\1/p' | head -n 1)
[ -n "$height" ] && [ "$height" -gt 300 ] || { say "could not measure the report's height"; exit 1; }
chrome --window-size=960,"$height" --screenshot="$root/assets/report.png" "file://$root/$page" >/dev/null
python3 scripts/pictures.py tag assets/report.png \
  "scripts/readme-pictures.sh: the HTML report of cargo run --example quickstart -- ${quick[*]}"
say "assets/report.png: 960x$height, the report of $(head -n 1 "$work/quickstart.txt")"

# 2. ResNet-152's step at batch 2.
resnet=(--batch_size 2 --device cpu)
scripts/with-libtorch.sh cargo run --quiet --example resnet_profile -- "${resnet[@]}" \
  --output "$work/resnet152_bs2.png" >"$work/resnet_profile.txt"
grep -q '^Peak reached during' "$work/resnet_profile.txt" ||
  { say "resnet_profile printed no peak (see $work/resnet_profile.txt)"; exit 1; }
cp "$work/resnet152_bs2.png" docs/images/resnet152_bs2_timeline.png
python3 scripts/pictures.py tag docs/images/resnet152_bs2_timeline.png \
  "scripts/readme-pictures.sh: the plot of cargo run --example resnet_profile -- ${resnet[*]}"
say "docs/images/resnet152_bs2_timeline.png: $(grep '^Total Peak' "$work/resnet_profile.txt")"
python3 scripts/pictures.py check >/dev/null
