#!/usr/bin/env bash
# Render a demo report.html with headless Chromium into a PNG screenshot: a visual check that the page is
# self-contained (the embedded images show with no network) and that the captions are legible.
#
# usage: tools/render_report.sh REPORT.html OUT.png [WIDTH [HEIGHT]]     (default 1400 x 4000 pixels)
#
# Needs chromium on PATH (Debian: apt-get install chromium). Runs with --no-sandbox because containers often run
# as root, and with a throw-away profile so that parallel runs do not share one. Exit code 2 with one line on
# stderr when the browser or the report is missing, or when no screenshot was written.
set -euo pipefail

usage="usage: tools/render_report.sh REPORT.html OUT.png [WIDTH [HEIGHT]]"
[ $# -ge 2 ] && [ $# -le 4 ] || { echo "$usage" >&2; exit 2; }
report=$1
out=$2
width=${3:-1400}
height=${4:-4000}
browser=$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)
[ -n "$browser" ] || { echo "render_report.sh: no chromium on PATH (Debian: apt-get install chromium)" >&2; exit 2; }
[ -f "$report" ] || { echo "render_report.sh: report $report does not exist" >&2; exit 2; }
[[ "$width" =~ ^[0-9]+$ && "$height" =~ ^[0-9]+$ ]] || { echo "render_report.sh: WIDTH and HEIGHT must be pixels" >&2; exit 2; }

profile=$(mktemp -d)
tmp="$out.tmp.png"
trap 'rm -rf "$profile" "$tmp"' EXIT
# The screenshot goes to a temporary name and is renamed when complete (nothing half-written at OUT).
"$browser" --headless --no-sandbox --disable-gpu --hide-scrollbars --no-first-run \
    --user-data-dir="$profile" --window-size="$width,$height" --screenshot="$tmp" \
    "file://$(realpath "$report")" >/dev/null 2>&1 || true
[ -s "$tmp" ] || { echo "render_report.sh: $browser wrote no screenshot of $report" >&2; exit 2; }
mv "$tmp" "$out"
echo "wrote $out (${width}x${height})"
