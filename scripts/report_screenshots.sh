#!/usr/bin/env bash
# Renders `smelt profile --html` reports for a small model (2 fused steps) and a large one
# (200 fused steps) and takes a screenshot of each in headless Chromium:
#   docs/img/report-small.png, docs/img/report-large.png
# Installs Debian's chromium when it is missing. Usage: scripts/report_screenshots.sh
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v chromium > /dev/null; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# 100 blocks of linear + exact GELU: a GEMM and a fused kernel each, 200 steps
{
  printf 'graph deep_mlp(%%x: f32[64,256]'
  for i in $(seq 0 99); do printf ', %%w%d: f32[256,256]' "$i"; done
  printf ') {\n'
  prev=x
  for i in $(seq 0 99); do
    printf '  %%h%d = linear(%%%s, %%w%d)\n  %%a%d = gelu(%%h%d)\n' "$i" "$prev" "$i" "$i" "$i"
    prev="a$i"
  done
  printf '  return %%%s\n}\n' "$prev"
} > "$work/deep_mlp.smelt"

cargo build --release --quiet --bin smelt
smelt="${CARGO_TARGET_DIR:-target}/release/smelt"
"$smelt" profile examples/models/linear_regression.smelt --repeat 20 --html "$work/small.html"
"$smelt" profile "$work/deep_mlp.smelt" --repeat 5 --html "$work/large.html"

mkdir -p docs/img
shot() {
  chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
    --disable-background-networking --disable-component-update --disable-sync \
    --user-data-dir="$work/profile-$1" --hide-scrollbars \
    --window-size=1280,"$2" --screenshot="docs/img/report-$1.png" "file://$work/$1.html" \
    2> "$work/chromium-$1.log" || { cat "$work/chromium-$1.log"; exit 1; }
}
shot small 2200
shot large 2600
ls -l docs/img/report-small.png docs/img/report-large.png
