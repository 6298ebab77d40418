#!/usr/bin/env bash
# One short GPU run: install, build, GPU tests, end-to-end and stage benchmarks, kernel benchmarks -> one JSON.
#
#   bash bench/gpu_check.sh setup      # ~5 min: offline install + extension build, the GPU-facing tests
#   bash bench/gpu_check.sh e2e        # ~8 min: end-to-end at k = 2 (eager fp32; fast at batch 1/8/32/128,
#                                      #         whole-forward graph, torch.compile) and the per-stage breakdown
#   bash bench/gpu_check.sh kernels    # ~6 min: masking, VQ, GroupNorm+SiLU and attention benchmarks
#
# Three commands of under 10 minutes each on one H100 (each inner command is bounded by `timeout`); `all` runs them
# in a row. After every step the parts gathered so far are assembled into one results JSON (device, versions,
# commands, date, git commit, test counts, benchmarks, summary): bench/results/<device>-<date>-gpu-check.json.
#
# Nothing is fetched: the project is installed with `pip install --no-index --no-deps --no-build-isolation -e .` into
# a virtual environment that sees the machine's packages (.venv-gpu-check), so the machine's own environment is left
# as it is. A failed extension build falls back to the Triton / PyTorch paths (setup.py says so in the log).
#
#   --dry-run   run every step on a CPU: the same install and build, a small test selection, the benchmark suites at
#               their CPU shapes; parts and the JSON go to --out (default: a new temporary directory), not bench/results
#   --out DIR   where the parts and the results JSON go
# Environment: PYTHON (default python3), GPU_CHECK_TESTS (test paths for the setup step).
set -uo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
DRY_RUN=0
OUT=""
STEPS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) DRY_RUN=1 ;;
    --out) OUT="$2"; shift ;;
    setup|e2e|kernels) STEPS+=("$1") ;;
    all) STEPS+=(setup e2e kernels) ;;
    *) echo "gpu_check.sh: unknown argument '$1' (steps: setup, e2e, kernels, all; options: --dry-run, --out DIR)" >&2
       exit 2 ;;
  esac
  shift
done
if [ ${#STEPS[@]} -eq 0 ]; then
  echo "gpu_check.sh: name a step: setup, e2e, kernels or all" >&2
  exit 2
fi
if [ -z "$OUT" ]; then
  if [ "$DRY_RUN" = 1 ]; then OUT="$(mktemp -d -t procap-gpu-check-XXXXXX)"; else OUT="$ROOT/bench/results/gpu-check-parts"; fi
fi
PARTS="$OUT"
mkdir -p "$PARTS/steps"
SYSTEM_PYTHON="${PYTHON:-python3}"
VENV="$ROOT/.venv-gpu-check"
export PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1

py() {  # the venv's python once the setup step has made it, the system one before
  if [ -x "$VENV/bin/python" ]; then "$VENV/bin/python" "$@"; else "$SYSTEM_PYTHON" "$@"; fi
}

record() {  # record STEP NAME EXIT SECONDS COMMAND: one JSON line per inner command, merged per step
  py - "$PARTS/steps/$1.json" "$1" "$2" "$3" "$4" "$5" <<'EOF'
import json, os, sys
path, step, name, code, seconds, command = sys.argv[1:7]
record = json.load(open(path)) if os.path.exists(path) else {"step": step, "commands": []}
record["commands"].append({"name": name, "command": command, "exit_code": int(code), "seconds": float(seconds),
                           "timed_out": int(code) in (124, 137)})
record["command"] = "bash bench/gpu_check.sh " + step + (" --dry-run" if os.environ.get("GPU_CHECK_DRY") == "1" else "")
record["ok"] = all(c["exit_code"] == 0 for c in record["commands"])
tmp = path + ".tmp"
json.dump(record, open(tmp, "w"), indent=1)
os.replace(tmp, path)
EOF
}

run_bounded() {  # run_bounded STEP NAME SECONDS CMD...: run with a time limit, log to PARTS/NAME.log, record it
  local step="$1" name="$2" limit="$3"
  shift 3
  echo "gpu_check: [$step] $name: $*"
  local start end code
  start=$(date +%s)
  timeout --kill-after=20 "$limit" "$@" >"$PARTS/$name.log" 2>&1
  code=$?
  end=$(date +%s)
  tail -n 3 "$PARTS/$name.log"
  [ "$code" = 0 ] || echo "gpu_check: [$step] $name exited with $code (log: $PARTS/$name.log)"
  record "$step" "$name" "$code" "$((end - start))" "$*"
}

install_and_build() {  # install_and_build STEP: the venv, the editable install (builds the extension), a load check
  run_bounded "$1" venv 120 "$SYSTEM_PYTHON" -m venv --system-site-packages "$VENV"
  run_bounded "$1" install 300 "$VENV/bin/python" -m pip install --no-index --no-deps --no-build-isolation -e .
  run_bounded "$1" extension 60 "$VENV/bin/python" -c "from procap.kernels import _ext; \
print('extension loaded:', _ext.AVAILABLE, _ext.LOAD_ERROR or ''); \
print('cpu ops:', _ext.has_kernel('vq_nearest', 'cpu'), 'cuda ops:', _ext.has_kernel('vq_nearest', 'cuda'))"
}

step_setup() {
  run_bounded setup environment 60 bash -c "nvidia-smi || echo 'no nvidia-smi'; $SYSTEM_PYTHON -c 'import torch, triton; \
print(torch.__version__, torch.version.cuda, triton.__version__, torch.cuda.is_available())'"
  local missing
  missing=$("$SYSTEM_PYTHON" - <<'EOF'
import importlib.util
need = ["torch", "triton", "numpy", "PIL", "cv2", "h5py", "safetensors", "tqdm", "pycocoevalcap", "pytest",
        "pytest_benchmark", "hypothesis", "setuptools"]
print(" ".join(m for m in need if importlib.util.find_spec(m) is None))
EOF
)
  if [ -n "$missing" ]; then
    echo "gpu_check: missing packages (nothing is downloaded; install them from a local wheelhouse): $missing"
  fi
  record setup missing_packages "$([ -z "$missing" ] && echo 0 || echo 1)" 0 "check imports: ${missing:-none missing}"
  install_and_build setup
  local tests="${GPU_CHECK_TESTS:-}"
  if [ -z "$tests" ]; then
    if [ "$DRY_RUN" = 1 ]; then tests="tests/kernels/test_dispatch.py tests/fast/test_nvtx.py"
    else tests="tests/kernels tests/fast tests/test_attention.py tests/model"; fi
  fi
  # shellcheck disable=SC2086  # the test paths are words
  run_bounded setup tests 420 "$VENV/bin/python" -m pytest $tests -q -p no:cacheprovider --junitxml="$PARTS/tests.xml"
}

step_e2e() {
  # k = 2 only; eager fp32 at batch 32 (the paper's protocol), the fast path at 1/8/32/128, stages at 1/32.
  run_bounded e2e e2e_bench 420 env PROCAP_BENCH_K=2 "$VENV/bin/python" -m pytest bench/test_e2e.py \
    --benchmark-only -q -p no:cacheprovider --benchmark-json="$PARTS/e2e.bench.json"
  run_bounded e2e stages 150 env PROCAP_BENCH_BATCHES="$([ "$DRY_RUN" = 1 ] && echo 1,4 || echo 1,32)" \
    "$VENV/bin/python" -m pytest bench/test_stages.py --benchmark-only -q -p no:cacheprovider \
    --benchmark-json="$PARTS/stages.bench.json"
}

step_kernels() {
  run_bounded kernels kernel_bench 540 "$VENV/bin/python" -m pytest bench/test_masking.py bench/test_vq.py \
    bench/test_groupnorm.py bench/test_attention.py --benchmark-only -q -p no:cacheprovider \
    --benchmark-json="$PARTS/kernels.bench.json"
}

export GPU_CHECK_DRY="$DRY_RUN"
if [ "$DRY_RUN" = 0 ] && ! "$SYSTEM_PYTHON" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "gpu_check.sh: no CUDA GPU is visible; use --dry-run on a CPU machine" >&2
  exit 2
fi
# One results file per run of the three steps: named by the device and the date of the parts' first step.
device=$("$SYSTEM_PYTHON" -c "import torch, re; n = torch.cuda.get_device_name(0) if torch.cuda.is_available() \
else 'cpu'; print(re.sub(r'[^a-z0-9]+', '-', n.lower()).strip('-'))")
[ -f "$PARTS/date" ] || date +%F >"$PARTS/date"
result_dir="$ROOT/bench/results"
[ "$DRY_RUN" = 1 ] && result_dir="$OUT"
RESULT="$result_dir/$device-$(cat "$PARTS/date")-gpu-check.json"
for step in "${STEPS[@]}"; do
  rm -f "$PARTS/steps/$step.json"
  if [ "$step" != setup ] && [ ! -x "$VENV/bin/python" ]; then
    # A machine that starts bare for every command (as lent GPU machines do) has lost the setup step's venv:
    # install and build again (about a minute), without the setup step's tests.
    echo "gpu_check: no $VENV here (a fresh machine?): installing and building before the $step step"
    install_and_build "$step"
  fi
  "step_$step"
  py bench/gpu_check_report.py --parts "$PARTS" --out "$RESULT"
done
failed=$(py -c "import json, glob; print(sum(not json.load(open(p))['ok'] for p in glob.glob('$PARTS/steps/*.json')))")
echo "gpu_check: parts in $PARTS; steps with a failed command: $failed"
[ "$failed" = 0 ]
