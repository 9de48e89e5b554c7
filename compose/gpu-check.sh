#!/usr/bin/env bash
# GPU check of laneway's vllm backend (vLLM's async engine in process), on a
# machine with an NVIDIA GPU and this repository checked out:
#
#   LANEWAY_BACKEND_VLLM_MODEL_DIR=/models/SmolLM2-135M-Instruct bash compose/gpu-check.sh
#
# It installs laneway[gpu,test] into a virtualenv of its own, runs the GPU
# tests (tests/integration/test_vllm.py: a batch of different prompts,
# concurrent batches, a deadline cut, greedy answers alone = batched; the
# backend's decisions and the vLLM API it calls, tests/unit/workers/) and the
# batching bench (batches of 1, 8 and 32), and writes the figures to one file,
# whose path it prints last. The install is not timed; the tests and the
# bench run under 5 minutes (each has a timeout).
#
# What it needs, checked first (each failure says what is missing):
#   - an NVIDIA GPU and a driver for CUDA 13 (PyPI's torch 2.13.0 is built
#     for CUDA 13.0: driver R580 or newer): `nvidia-smi -L` lists the GPU;
#   - Python 3.11+ with venv (PYTHON, default python3) and ~15 GB of disk;
#   - LANEWAY_BACKEND_VLLM_MODEL_DIR: a local Hugging Face model directory
#     (config.json, tokenizer files, *.safetensors) of an instruct model with a
#     chat template, e.g. HuggingFaceTB/SmolLM2-135M-Instruct (~270 MB).
#     Nothing is downloaded from the Hugging Face Hub;
#   - the packages of laneway[gpu,test] (vllm 0.27.x, PyPI's CUDA torch
#     2.13.0, ...): from a package index pip reaches (its own configuration,
#     PIP_INDEX_URL), or, with no network, from GPU_CHECK_WHEELHOUSE, a folder
#     of wheels made on a machine with one, for this platform and Python:
#       pip wheel -w WHEELHOUSE '.[gpu,test]' pip 'setuptools>=77'
#     (pip wheel also builds llama-cpp-python, which PyPI has as source only;
#     without its wheel it compiles here: a C/C++ compiler and CMake).
#
# Environment:
#   GPU_CHECK_VENV        the virtualenv (.venv-gpu); reused once installed
#                         from the current pyproject.toml
#   GPU_CHECK_OUT         where the figures go ($OUT if set, else ./gpu-check-out)
#   GPU_CHECK_WHEELHOUSE  install from these wheels only (pip --no-index)
#   GPU_CHECK_SKIP_INSTALL=1  use the virtualenv as it is
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$(pwd)
PYTHON=${PYTHON:-python3}
VENV=${GPU_CHECK_VENV:-.venv-gpu}
OUT_DIR=${GPU_CHECK_OUT:-${OUT:-gpu-check-out}}
WHEELHOUSE=${GPU_CHECK_WHEELHOUSE:-}
MODEL_DIR=${LANEWAY_BACKEND_VLLM_MODEL_DIR:-}
TESTS_TIMEOUT_S=130
BENCH_TIMEOUT_S=130
KILL_AFTER_S=10  # past a timeout, SIGKILL what did not stop (an engine-core process)

# Nothing may reach the Hub or report usage.
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1

die() {
    echo "gpu-check: FAILED: $*" >&2
    exit 1
}
step() { echo "gpu-check: $*"; }

# -- what it needs ------------------------------------------------------------

command -v nvidia-smi >/dev/null || die "no nvidia-smi: this needs an NVIDIA GPU and its driver"
GPUS=$(nvidia-smi -L 2>&1) || die "nvidia-smi -L failed: $GPUS"
grep -q GPU <<<"$GPUS" || die "nvidia-smi lists no GPU: $GPUS"
step "GPU: $GPUS"

command -v "$PYTHON" >/dev/null || die "no $PYTHON: set PYTHON to a Python 3.11+"
"$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
    || die "$PYTHON is $("$PYTHON" -V 2>&1); laneway needs Python 3.11+"

[ -n "$MODEL_DIR" ] || die "set LANEWAY_BACKEND_VLLM_MODEL_DIR to a local Hugging Face model
  directory (config.json, tokenizer, *.safetensors), e.g. SmolLM2-135M-Instruct; nothing is downloaded"
[ -f "$MODEL_DIR/config.json" ] || die "$MODEL_DIR has no config.json (LANEWAY_BACKEND_VLLM_MODEL_DIR)"
compgen -G "$MODEL_DIR/*.safetensors" >/dev/null || die "$MODEL_DIR has no *.safetensors weights"
compgen -G "$MODEL_DIR/tokenizer*" >/dev/null || die "$MODEL_DIR has no tokenizer files"
MODEL_DIR=$(cd "$MODEL_DIR" && pwd)
export LANEWAY_BACKEND_VLLM_MODEL_DIR=$MODEL_DIR
step "model: $MODEL_DIR"

if [ -n "$WHEELHOUSE" ]; then
    [ -d "$WHEELHOUSE" ] || die "GPU_CHECK_WHEELHOUSE=$WHEELHOUSE is not a folder"
    WHEELHOUSE=$(cd "$WHEELHOUSE" && pwd)
fi
mkdir -p "$OUT_DIR"
OUT_DIR=$(cd "$OUT_DIR" && pwd)
# A run killed at its timeout writes no report: never read an older run's.
rm -f "$OUT_DIR"/tests.xml "$OUT_DIR"/tests.txt "$OUT_DIR"/bench.json "$OUT_DIR"/bench.txt

# -- install ------------------------------------------------------------------

MARKER=$VENV/.gpu-check-installed
if [ "${GPU_CHECK_SKIP_INSTALL:-0}" = 1 ]; then
    [ -x "$VENV/bin/python" ] || die "GPU_CHECK_SKIP_INSTALL=1 but $VENV has no python"
elif [ -f "$MARKER" ] && [ "$MARKER" -nt pyproject.toml ]; then
    step "reusing $VENV (installed from this pyproject.toml)"
else
    started=$SECONDS
    "$PYTHON" -m venv "$VENV" || die "$PYTHON -m venv failed (Debian/Ubuntu: apt-get install python3-venv)"
    PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)
    if [ -n "$WHEELHOUSE" ]; then
        SOURCE=(--no-index --find-links "$WHEELHOUSE")
        step "installing laneway[gpu,test] from the wheels in $WHEELHOUSE only"
    else
        SOURCE=()
        # Fail in seconds, not after pip's retries, when no index answers.
        "${PIP[@]}" index versions vllm --timeout 15 --retries 0 >/dev/null 2>&1 \
            || die "no package index answers (pip index versions vllm failed). Give pip an index
  (PIP_INDEX_URL) or a folder of wheels: GPU_CHECK_WHEELHOUSE=DIR, made elsewhere with
  pip wheel -w DIR '.[gpu,test]' pip 'setuptools>=77' for this platform and Python"
        if ! command -v cmake >/dev/null || ! command -v c++ >/dev/null; then
            step "warning: no cmake or c++: llama-cpp-python (a base dependency) cannot compile here"
        fi
        step "installing laneway[gpu,test] (vllm 0.27.x, CUDA torch 2.13.0, ~10 GB; llama-cpp-python compiles)"
    fi
    "${PIP[@]}" install --quiet "${SOURCE[@]}" --upgrade pip \
        || die "pip could not upgrade itself in $VENV"
    "${PIP[@]}" install "${SOURCE[@]}" -e ".[gpu,test]" \
        || die "pip install -e '.[gpu,test]' failed (above: the missing package or the conflict)"
    touch "$MARKER"
    step "installed in $((SECONDS - started)) s"
fi
case $VENV in
    /*) PY=$VENV/bin/python ;;
    *) PY=$ROOT/$VENV/bin/python ;;
esac

VERSIONS=$("$PY" - <<'EOF'
import importlib.metadata as md
import torch
cuda = torch.version.cuda
print(f"vllm {md.version('vllm')}, torch {torch.__version__} (CUDA {cuda}), "
      f"transformers {md.version('transformers')}")
if cuda is None:
    raise SystemExit("torch is a CPU build: laneway[gpu] needs PyPI's CUDA build of torch 2.13.0")
if not torch.cuda.is_available():
    raise SystemExit("torch sees no CUDA device (driver too old for its CUDA build?)")
print(f"device: {torch.cuda.get_device_name(0)}")
EOF
) || die "the installed packages cannot use the GPU: $VERSIONS"
step "$VERSIONS"

# -- tests and bench ----------------------------------------------------------

status=0
step "GPU tests (at most ${TESTS_TIMEOUT_S} s)"
tests_started=$SECONDS
# Eager mode: the engine loads in seconds; the bench below measures the
# compiled engine with CUDA graphs, as served.
LANEWAY_BACKEND_VLLM_ENFORCE_EAGER=true timeout -k "$KILL_AFTER_S" "$TESTS_TIMEOUT_S" "$PY" -m pytest \
    tests/integration/test_vllm.py tests/unit/workers/test_vllm.py tests/unit/workers/test_vllm_api.py \
    -p no:cacheprovider -rA -s --junitxml "$OUT_DIR/tests.xml" 2>&1 | tee "$OUT_DIR/tests.txt" \
    || status=1
tests_s=$((SECONDS - tests_started))
TESTS=$("$PY" - "$OUT_DIR/tests.xml" <<'EOF'
import sys
import xml.etree.ElementTree as ET
try:
    suite = ET.parse(sys.argv[1]).getroot()
except (OSError, ET.ParseError) as exc:
    raise SystemExit(f"no test report ({exc}): the tests were killed at the timeout or never ran")
suite = suite.find("testsuite") if suite.tag == "testsuites" else suite
counts = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
print(", ".join(f"{v} {k}" for k, v in counts.items()))
if counts["failures"] or counts["errors"] or counts["skipped"] or not counts["tests"]:
    raise SystemExit(1)
EOF
) || status=1
step "tests: ${TESTS:-no report} in ${tests_s} s"

step "GPU bench, batches of 1, 8 and 32 (at most ${BENCH_TIMEOUT_S} s)"
timeout -k "$KILL_AFTER_S" "$BENCH_TIMEOUT_S" "$PY" -m streams.bench.gpu --batch-sizes 1,8,32 \
    --requests 32 --max-tokens 64 --out "$OUT_DIR/bench.json" 2>&1 | tee "$OUT_DIR/bench.txt" \
    || status=1

# -- figures ------------------------------------------------------------------

FIGURES=$OUT_DIR/gpu-check.txt
{
    echo "laneway gpu-check, $(date -u +%Y-%m-%dT%H:%M:%SZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
    echo "$GPUS"
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
    echo "$VERSIONS"
    echo "model: $MODEL_DIR"
    echo
    echo "tests: ${TESTS:-no report} in ${tests_s} s"
    grep -E "^(PASSED|FAILED|ERROR|SKIPPED)|vLLM engine loaded|concurrent batches" "$OUT_DIR/tests.txt" || true
    echo
    sed -n '/^bench_gpu:/,$p' "$OUT_DIR/bench.txt"
    echo
    echo "result: $([ "$status" = 0 ] && echo PASSED || echo FAILED)"
} >"$FIGURES"

cat "$FIGURES"
echo
echo "gpu-check: figures written to $FIGURES"
exit "$status"
