#!/usr/bin/env bash
# Run the ahead-of-time compile check (python -m procap.kernels.compile_check) under another Triton version.
#
#   tools/compile_check_triton.sh VERSION [compile_check args...]     e.g. tools/compile_check_triton.sh 3.6.0
#
# Register allocation, and so spills, depend on the Triton version (its code generation and the ptxas it bundles),
# so a kernel clean under this machine's Triton can spill under the GPU image's. The scratch virtualenv lives
# outside the repository, in ${TMPDIR:-/tmp}/procap-triton-VERSION, and is reused; it sees the system packages
# (torch, procap's dependencies) and holds only that Triton, installed without dependencies so pip never replaces
# torch. PYTHON picks the interpreter (default python3; it must import torch). The full table and JSON report are
# written beside the virtualenv; the summary, any failing variants and the exit status are the check's.
set -euo pipefail

if [[ $# -lt 1 || ! $1 =~ ^[0-9]+\.[0-9]+(\.[0-9]+)?$ ]]; then
    echo "usage: $0 TRITON_VERSION [compile_check args...]   (e.g. 3.6.0)" >&2
    exit 2
fi
version=$1
shift
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv="${TMPDIR:-/tmp}/procap-triton-$version"
python=${PYTHON:-python3}

installed() {
    "$venv/bin/python" -c 'import triton; print(triton.__version__)' 2>/dev/null || true
}

if [[ ! -x $venv/bin/python ]]; then
    echo "creating $venv" >&2
    "$python" -m venv --system-site-packages "$venv"
fi
if [[ $(installed) != "$version" ]]; then
    # --no-deps: the wheel's torch requirement would otherwise pull a second torch into the venv.
    "$venv/bin/python" -m pip install --quiet --no-deps "triton==$version"
fi
if [[ $(installed) != "$version" ]]; then
    echo "$venv does not import triton $version (found: $(installed))" >&2
    exit 1
fi

table="$venv/compile_check.txt"
report="$venv/compile_check.json"
status=0
# The interpreter would replace the compiler, so TRITON_INTERPRET must not reach the check; PYTHONPATH makes it
# import this checkout whatever procap the system packages hold.
(cd "$root" && env -u TRITON_INTERPRET PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}" \
    "$venv/bin/python" -m procap.kernels.compile_check --json "$report" "$@") >"$table" || status=$?

# The header, every variant not marked ok, and the closing summary line.
awk 'NR == 1 || ($NF != "ok" && !/ -> FAILED$/)' "$table"
tail -n 1 "$table"
echo "table: $table" >&2
echo "report: $report" >&2
exit "$status"
