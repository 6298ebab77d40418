#!/usr/bin/env bash
# One GPU run in a few commands of under 10 minutes each, on a machine that starts bare and has no network.
#
#   bash bench/gpu_check.sh setup     # the compiled ops (carried, or compiled there), the GPU-facing tests with -n
#   bash bench/gpu_check.sh e2e       # end-to-end at k = 2 (eager fp32; fast at batch 1/8/32/128) and the stages
#   bash bench/gpu_check.sh kernels   # masking, VQ, GroupNorm+SiLU and attention benchmarks, attention backends
#   bash bench/gpu_check.sh train     # one optimizer step of stage 1 and stage 2, fused kernels against eager
#   bash bench/gpu_check.sh profile   # bench/gpu_tune.py: named variants, every kernel at b1 and b32, the table last
#   bash bench/gpu_check.sh ncu       # ncu of the GN statistics kernel (largest b32 launch) and finalize (b1)
#   bash bench/gpu_check.sh suite     # the whole test suite with -n 14 (the quick demo deselected), wheels from .whl/
#
# `all` runs setup, e2e, kernels and train in a row. What a lent machine needs (docs/gpu.md, "Running on a lent machine"):
#
# - No virtual environment and no pip: the image's python3 (itself a virtualenv interpreter, so a venv made from it
#   would not see torch) runs the checkout directly with PYTHONPATH set to the repository root.
# - One deadline per step (STEP_DEADLINE seconds, default 540): every inner command gets what is left of it minus
#   a reserve for the report, so the step always ends with its results written, inside a 10-minute command.
# - Results go to --out, by default $OUT when it is set (the only folder a lent machine sends back, at most 8
#   files): result.json (device, versions, commands, test counts, benchmarks, summary), parts.tgz (logs, JUnit XML,
#   benchmark JSON) and caches.tgz (the Triton and Inductor caches and procap's compiled ops, PROCAP_CACHE).
# - Carried between calls: copy caches.tgz into .gpu-carry/ (ignored by git) and name .gpu-carry in the next call's
#   carry; the caches are unpacked and the compiled ops are loaded instead of compiled again.
# - Packages the image lacks (pycocoevalcap): wheels downloaded beforehand into .whl/ (ignored by git; docs/gpu.md
#   says how) and named in the carry; the suite step installs them into /tmp/site and puts it on PYTHONPATH.
#
#   --dry-run   every step on a CPU (a small test selection, the benchmark suites at their CPU shapes, no tuning)
#   --out DIR   where the results go (default: $OUT, else a new temporary directory)
# Environment: PYTHON (default python3), STEP_DEADLINE, GPU_CHECK_TESTS (test paths for setup), GPU_CHECK_BUILD=0
# (no compiled ops rather than compile them: PROCAP_SKIP_EXT=1), GPU_CHECK_KERNELS_K (a pytest -k filter for the kernel benchmarks),
# GPU_TUNE_ARGS (arguments for bench/gpu_tune.py in the profile step), GPU_CHECK_CARRY (the carry folder),
# GPU_CHECK_SUITE_TESTS (test paths for suite), GPU_CHECK_SUITE_WORKERS (default 14), GPU_CHECK_WHEELS (default
# .whl), GPU_CHECK_SITE (where the wheels go, default /tmp/site).
set -uo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
DRY_RUN=0
OUT_DIR="${OUT:-}"
STEPS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) DRY_RUN=1 ;;
    --out) OUT_DIR="$2"; shift ;;
    setup|e2e|kernels|train|profile|ncu|suite) STEPS+=("$1") ;;
    all) STEPS+=(setup e2e kernels train) ;;
    *) echo "gpu_check.sh: unknown argument '$1' (steps: setup, e2e, kernels, train, profile, ncu, suite, all;" \
         "options: --dry-run, --out DIR)" >&2
       exit 2 ;;
  esac
  shift
done
if [ ${#STEPS[@]} -eq 0 ]; then
  echo "gpu_check.sh: name a step: setup, e2e, kernels, train, profile, ncu, suite or all" >&2
  exit 2
fi
PYTHON="${PYTHON:-python3}"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
if [ "$DRY_RUN" = 0 ] && ! "$PYTHON" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "gpu_check.sh: no CUDA GPU is visible; use --dry-run on a CPU machine" >&2
  exit 2
fi
[ -n "$OUT_DIR" ] || OUT_DIR="$(mktemp -d -t procap-gpu-check-XXXXXX)"
mkdir -p "$OUT_DIR"
PARTS="$(mktemp -d -t procap-gpu-check-parts-XXXXXX)"  # packed into parts.tgz: $OUT_DIR keeps few files
mkdir -p "$PARTS/steps"
STEP_DEADLINE="${STEP_DEADLINE:-540}"
REPORT_RESERVE=30  # seconds kept back from every step for the report and the packing
CARRY="${GPU_CHECK_CARRY:-$ROOT/.gpu-carry}"
export TRITON_CACHE_DIR="$CARRY/cache/triton" TORCHINDUCTOR_CACHE_DIR="$CARRY/cache/inductor"
mkdir -p "$TRITON_CACHE_DIR" "$TORCHINDUCTOR_CACHE_DIR"
# procap's compiled ops live with those caches, so they are carried too; a dry run keeps the user's cache, which the
# test suite has filled, so that its commands do not compile them each into an empty one
[ "$DRY_RUN" = 1 ] || export PROCAP_CACHE="${PROCAP_CACHE:-$CARRY/cache/procap}"
[ "${GPU_CHECK_BUILD:-1}" != 0 ] || export PROCAP_SKIP_EXT=1
[ -f "$CARRY/caches.tgz" ] && tar -xzf "$CARRY/caches.tgz" -C "$CARRY/cache" 2>/dev/null
export GPU_CHECK_DRY="$DRY_RUN"

record() {  # record STEP NAME EXIT SECONDS COMMAND: one JSON line per inner command, merged per step
  "$PYTHON" - "$PARTS/steps/$1.json" "$1" "$2" "$3" "$4" "$5" <<'EOF'
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

seconds_left() {  # what the current step's deadline leaves for one more command
  echo $((STEP_END - $(date +%s) - REPORT_RESERVE))
}

run_bounded() {  # run_bounded STEP NAME CMD...: run within the step's deadline, log to PARTS/NAME.log, record it
  local step="$1" name="$2"
  shift 2
  local limit
  limit=$(seconds_left)
  if [ "$limit" -lt 5 ]; then
    echo "gpu_check: [$step] $name skipped: the step's deadline is reached"
    record "$step" "$name" 124 0 "skipped (deadline): $*"
    return
  fi
  echo "gpu_check: [$step] $name (at most ${limit}s): $*"
  local start code
  start=$(date +%s)
  timeout --kill-after=10 "$limit" "$@" >"$PARTS/$name.log" 2>&1
  code=$?
  tail -n 3 "$PARTS/$name.log"
  [ "$code" = 0 ] || echo "gpu_check: [$step] $name exited with $code (log in parts.tgz: $name.log)"
  record "$step" "$name" "$code" "$(($(date +%s) - start))" "$*"
}

xdist_args() {  # parallel tests where pytest-xdist is installed (the GPU image has it)
  if "$PYTHON" -c "import xdist" 2>/dev/null; then echo "-n ${GPU_CHECK_WORKERS:-8}"; fi
}

extension() {  # the compiled ops: from the carried cache, else compiled into it (for the visible GPU's architecture)
  run_bounded setup extension_load env MAX_JOBS=16 "$PYTHON" -c "from procap.kernels import _ext; \
print('compiled ops loaded:', _ext.load(), _ext.load_error() or ''); \
print('cpu ops:', _ext.has_kernel('vq_nearest', 'cpu'), 'cuda ops:', _ext.has_kernel('vq_nearest', 'cuda'))"
}

step_setup() {
  run_bounded setup environment bash -c "nvidia-smi || echo 'no nvidia-smi'; $PYTHON -c 'import sys, torch, triton; \
print(sys.prefix, sys.base_prefix); print(torch.__version__, torch.version.cuda, triton.__version__, \
torch.cuda.is_available())'"
  local missing
  missing=$("$PYTHON" - <<'EOF'
import importlib.util
need = ["torch", "triton", "numpy", "PIL", "cv2", "h5py", "safetensors", "tqdm", "pycocoevalcap", "pytest",
        "pytest_benchmark", "hypothesis", "setuptools"]
print(" ".join(m for m in need if importlib.util.find_spec(m) is None))
EOF
)
  [ -z "$missing" ] || echo "gpu_check: missing packages (nothing is downloaded; carry them as wheels): $missing"
  record setup missing_packages "$([ -z "$missing" ] && echo 0 || echo 1)" 0 "check imports: ${missing:-none missing}"
  extension
  local tests="${GPU_CHECK_TESTS:-}"
  if [ -z "$tests" ]; then
    if [ "$DRY_RUN" = 1 ]; then tests="tests/kernels/test_dispatch.py tests/fast/test_nvtx.py"
    else tests="tests/kernels tests/fast tests/commands/test_caption_and_profile.py tests/test_attention.py tests/model"; fi
  fi
  # shellcheck disable=SC2046,SC2086  # the test paths and the xdist arguments are words
  run_bounded setup tests "$PYTHON" -m pytest $tests -q -x -p no:cacheprovider $(xdist_args) \
    --junitxml="$PARTS/tests.xml"
}

step_e2e() {
  # k = 2 only; eager fp32 at batch 32 (the paper's protocol), the fast path at 1/8/32/128, stages at 1/32.
  run_bounded e2e e2e_bench env PROCAP_BENCH_K=2 "$PYTHON" -m pytest bench/test_e2e.py --benchmark-only -q \
    -p no:cacheprovider -k "${GPU_CHECK_E2E_K:-not compiled}" --benchmark-json="$PARTS/e2e.bench.json"
  run_bounded e2e stages env PROCAP_BENCH_BATCHES="$([ "$DRY_RUN" = 1 ] && echo 1,4 || echo 1,32)" \
    "$PYTHON" -m pytest bench/test_stages.py --benchmark-only -q -p no:cacheprovider \
    --benchmark-json="$PARTS/stages.bench.json"
}

step_kernels() {
  run_bounded kernels kernel_bench "$PYTHON" -m pytest bench/test_masking.py bench/test_vq.py \
    bench/test_groupnorm.py bench/test_attention.py --benchmark-only -q -p no:cacheprovider \
    ${GPU_CHECK_KERNELS_K:+-k "$GPU_CHECK_KERNELS_K"} --benchmark-json="$PARTS/kernels.bench.json"
  # every attention backend (and the split-K decode kernels) on the encoder's and the decoding step's shapes: the
  # results feed auto's MEASURED_ORDER (docs/gpu.md, "Attention backend by measurement")
  run_bounded kernels attention_backends "$PYTHON" bench/attention_backends.py --out "$PARTS/attention_backends.json" \
    $([ "$DRY_RUN" = 1 ] && echo --dry-run)
}

step_train() {
  # stage 1 and stage 2 at batch 8 and 32 (clevr, bf16 autocast) with the fused kernels and the eager references;
  # the dry run: the tiny preset at batch 2 on the CPU
  run_bounded train train_bench "$PYTHON" -m pytest bench/test_train.py --benchmark-only -q -p no:cacheprovider \
    --benchmark-json="$PARTS/train.bench.json"
}

step_profile() {
  if [ "$DRY_RUN" = 1 ]; then  # tuning needs CUDA: the dry run checks that the script starts
    run_bounded profile tune "$PYTHON" bench/gpu_tune.py --list
    return
  fi
  # shellcheck disable=SC2086  # GPU_TUNE_ARGS are words
  run_bounded profile tune "$PYTHON" bench/gpu_tune.py --deadline $(($(seconds_left) - 120)) \
    --out "$PARTS/tune.json" ${GPU_TUNE_ARGS:-}
  cat "$PARTS/tune.log"  # the compact table is the tail of the command's output
}

# ncu's sections for the GroupNorm kernels: launch configuration, achieved occupancy (and what limits it), DRAM and
# cache throughput, and where warps stall (barriers, memory dependencies).
NCU_SECTIONS=(--section LaunchStats --section Occupancy --section MemoryWorkloadAnalysis --section WarpStateStats)

ncu_command() {  # ncu_command NAME KERNEL BATCH: the ncu line for KERNEL's first launch in a BATCH-pair call
  # The workload is `procap profile` on the clevr preset with random weights, uncaptured (--no-graphs): its first
  # call launches each kernel in pipeline order, so the statistics kernel's first launch is the first norm's, on
  # the level-0 tensor (the largest), and the finalize's first launch merges the most chunks. --clock-control none:
  # the clocks the timed runs had, not ncu's locked base clock.
  echo ncu --clock-control none "${NCU_SECTIONS[@]}" -k "regex:$2" --launch-count 1 -f -o "$PARTS/ncu_$1" \
    "$PYTHON" -m procap profile --preset clevr --batch-size "$3" --steps 1 --no-trace --no-graphs
}

step_ncu() {
  local name kernel batch
  for spec in "gn_stats_b32 _group_norm_stats_kernel 32" "gn_finalize_b1 _group_norm_finalize_kernel 1"; do
    read -r name kernel batch <<<"$spec"
    # shellcheck disable=SC2207  # the command's words (no spaces inside them)
    local cmd=($(ncu_command "$name" "$kernel" "$batch"))
    if [ "$DRY_RUN" = 1 ]; then  # ncu needs a GPU: the dry run says what would run
      echo "gpu_check: [ncu] $name: ${cmd[*]}"
      record ncu "$name" 0 0 "dry run, not run: ${cmd[*]}"
    elif ! command -v ncu >/dev/null; then
      echo "gpu_check: [ncu] no ncu on PATH: $name not profiled"
      record ncu "$name" 1 0 "ncu missing: ${cmd[*]}"
    else
      run_bounded ncu "ncu_$name" "${cmd[@]}"
      # the report's details as text beside it, for reading without Nsight Compute
      run_bounded ncu "ncu_${name}_details" ncu --import "$PARTS/ncu_$name.ncu-rep" --page details --csv
    fi
  done
}

carried_wheels() {  # install .whl/*.whl into GPU_CHECK_SITE and put it on PYTHONPATH (subprocesses inherit it)
  local dir="${GPU_CHECK_WHEELS:-$ROOT/.whl}" site="${GPU_CHECK_SITE:-/tmp/site}" wheels
  # Only what the interpreter lacks: PYTHONPATH comes before site-packages, so a carried copy of an installed
  # package would shadow it (the slim pycocoevalcap, without its jars, beside Java on a CPU machine's dry run).
  wheels=$("$PYTHON" - "$dir" <<'EOF'
import glob, importlib.metadata, os, sys
for path in sorted(glob.glob(os.path.join(sys.argv[1], "*.whl"))):
    name = os.path.basename(path).split("-")[0]
    try:
        version = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        print(path)
    else:
        print(f"gpu_check: [suite] {name} {version} is installed: {os.path.basename(path)} not used", file=sys.stderr)
EOF
)
  if [ -z "$wheels" ]; then
    echo "gpu_check: [suite] nothing to install from $dir"
    return
  fi
  mkdir -p "$site"
  # --upgrade: a warm machine keeps /tmp/site from an earlier call, and pip --target would otherwise keep the old copy
  # shellcheck disable=SC2086  # the wheel paths are words (no spaces in wheel names)
  if "$PYTHON" -m pip --version >/dev/null 2>&1; then
    run_bounded suite wheels "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target "$site" $wheels
  else  # an interpreter without pip: a pure-Python wheel unpacked is the same as installed with --target
    run_bounded suite wheels "$PYTHON" -c "import sys, zipfile; [zipfile.ZipFile(w).extractall(sys.argv[1]) \
for w in sys.argv[2:]]" "$site" $wheels
  fi
  export PYTHONPATH="$PYTHONPATH:$site"
}

step_suite() {
  carried_wheels
  local java coco
  java=$(command -v java >/dev/null && echo "java on PATH" || echo "no java: procap's tokenizer, METEOR refused")
  # a module procap imports, not the bare name: pycocoevalcap 1.2 is a namespace package, which any folder satisfies
  if coco=$("$PYTHON" -c "import glob, os, pycocoevalcap.bleu.bleu as m
d = os.path.dirname(os.path.dirname(m.__file__))
print(d, 'with its jars' if glob.glob(d + '/tokenizer/*.jar') else 'without its jars')" 2>/dev/null); then
    # the slim wheel (docs/gpu.md) has no jars: right without Java, wrong beside it
    case "$java $coco" in "java on PATH"*"without its jars") java="$java, so the Java-scored tests will fail" ;; esac
    echo "gpu_check: [suite] pycocoevalcap at $coco ($java)"
    record suite pycocoevalcap 0 0 "pycocoevalcap: at $coco; $java"
  else
    echo "gpu_check: [suite] pycocoevalcap is MISSING: the caption-metric tests will fail (carry its wheel in .whl/:" \
      "docs/gpu.md, 'Running on a lent machine')"
    record suite pycocoevalcap 1 0 "pycocoevalcap: missing (no wheel carried in .whl/); $java"
  fi
  local tests="${GPU_CHECK_SUITE_TESTS:-}" workers=""
  if [ -z "$tests" ]; then
    tests="tests"  # the dry run: two small files, one of them scoring captions through pycocoevalcap
    [ "$DRY_RUN" = 0 ] || tests="tests/commands/test_choices.py tests/eval/test_evaluate.py::test_perfect_predictions_beat_wrong_ones"
  fi
  local checkpoint=tests/convert/data/clevr_like/model.chkpt
  # the machine's copy of 2026-11-26 lacked the authors' checkpoint, which most of tests/convert reads
  if [ "$tests" = tests ] && [ ! -f "$checkpoint" ]; then
    tests="tests --ignore tests/convert"
    echo "gpu_check: [suite] tests/convert left out: $checkpoint (tracked, 22 MB) did not come with the checkout"
    record suite authors_checkpoint 1 0 "tests/convert left out: $checkpoint is missing"
  fi
  # -n only on the GPU: the dry run's few files start faster in one process than in workers
  if [ "$DRY_RUN" = 0 ] && "$PYTHON" -c "import xdist" 2>/dev/null; then
    workers="-n ${GPU_CHECK_SUITE_WORKERS:-14}"
  fi
  # The quick demo trains on the CPU for minutes (docs/gpu.md). A module that fails to import is counted as an error
  # rather than stopping the run; junit_family=xunit1 writes each test's file, so the report names failing tests by
  # their pytest ids.
  # shellcheck disable=SC2086  # the test paths and the worker arguments are words
  run_bounded suite suite "$PYTHON" -m pytest $tests -q -rfE -p no:cacheprovider $workers \
    --deselect tests/test_demo.py::test_quick_demo_end_to_end --continue-on-collection-errors \
    -o junit_family=xunit1 --junitxml="$PARTS/suite.xml"
}

finish() {  # the results of the steps so far into OUT_DIR: result.json, parts.tgz, caches.tgz
  "$PYTHON" bench/gpu_check_report.py --parts "$PARTS" --out "$OUT_DIR/result.json"
  tar -czf "$OUT_DIR/parts.tgz" -C "$PARTS" .
  tar -czf "$OUT_DIR/caches.tgz.tmp" -C "$CARRY/cache" . 2>/dev/null
  if [ "$(stat -c %s "$OUT_DIR/caches.tgz.tmp" 2>/dev/null || echo 0)" -le $((16 * 1024 * 1024)) ]; then
    mv "$OUT_DIR/caches.tgz.tmp" "$OUT_DIR/caches.tgz"
  else
    rm -f "$OUT_DIR/caches.tgz.tmp"
    echo "gpu_check: the caches are over 16 MiB and are not returned"
  fi
}

for step in "${STEPS[@]}"; do
  STEP_END=$(($(date +%s) + STEP_DEADLINE))
  rm -f "$PARTS/steps/$step.json"
  "step_$step"
  finish
done
failed=$("$PYTHON" -c "import json, glob; print(sum(not json.load(open(p))['ok'] for p in glob.glob('$PARTS/steps/*.json')))")
echo "gpu_check: results in $OUT_DIR ($(ls "$OUT_DIR" | tr '\n' ' ')); steps with a failed command: $failed"
[ "$failed" = 0 ]
