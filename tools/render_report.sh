#!/usr/bin/env bash
# Render a demo report.html with headless Chromium into a PNG screenshot: a visual check that the page is
# self-contained (the embedded images show with no network) and that the captions are legible.
#
# usage: tools/render_report.sh REPORT.html OUT.png [WIDTH [HEIGHT]]     (default: 1400 wide, the page's height)
#
# Without HEIGHT the browser first lays the page out at WIDTH and reports its height, and the screenshot is that
# tall: a fixed height cut the demo's 5,400 px page at 4,000 px.
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
height=${4:-page}
browser=$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)
[ -n "$browser" ] || { echo "render_report.sh: no chromium on PATH (Debian: apt-get install chromium)" >&2; exit 2; }
[ -f "$report" ] || { echo "render_report.sh: report $report does not exist" >&2; exit 2; }
[[ "$width" =~ ^[0-9]+$ && "$height" =~ ^([0-9]+|page)$ ]] || { echo "render_report.sh: WIDTH and HEIGHT must be pixels" >&2; exit 2; }

profile=$(mktemp -d)
tmp="$out.tmp.png"
trap 'rm -rf "$profile" "$tmp"' EXIT
if [ "$height" = page ]; then
    # A copy of the page that writes its own height into the DOM once everything (the embedded images too) is laid
    # out; --dump-dom prints that DOM.
    probe="$profile/probe.html"
    marker='<script>addEventListener("load", () => document.body.setAttribute("data-page-height", Math.ceil(document.documentElement.scrollHeight)))</script>'
    sed "s#</body>#$marker</body>#" "$report" > "$probe"
    height=$("$browser" --headless --no-sandbox --disable-gpu --hide-scrollbars --no-first-run \
        --user-data-dir="$profile" --window-size="$width,1000" --virtual-time-budget=10000 --dump-dom \
        "file://$probe" 2>/dev/null | grep -o 'data-page-height="[0-9]*"' | grep -o '[0-9][0-9]*' | head -n 1 || true)
    [ -n "$height" ] || { echo "render_report.sh: $browser did not report the height of $report" >&2; exit 2; }
fi
# The screenshot goes to a temporary name and is renamed when complete (nothing half-written at OUT).
"$browser" --headless --no-sandbox --disable-gpu --hide-scrollbars --no-first-run \
    --user-data-dir="$profile" --window-size="$width,$height" --screenshot="$tmp" \
    "file://$(realpath "$report")" >/dev/null 2>&1 || true
[ -s "$tmp" ] || { echo "render_report.sh: $browser wrote no screenshot of $report" >&2; exit 2; }
mv "$tmp" "$out"
echo "wrote $out (${width}x${height})"
