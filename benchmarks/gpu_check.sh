#!/usr/bin/env bash
# GPU check of rh3dgs: from a checkout on a CUDA GPU machine, with nothing else prepared, build the CUDA kernels, run
# the device-parametrised tests' CUDA cases and the GPU benchmark, and exit non-zero when anything fails or any
# comparison is out of tolerance. Target: 8 minutes on one H100. Results: benchmarks/results/gpu_check/
# (gpu_check.md / .json, log.txt, the step logs).
#
#   bash benchmarks/gpu_check.sh             # run it (a GPU machine)
#   bash benchmarks/gpu_check.sh --dry-run   # any machine: check the steps' prerequisites, say what it would run
#   bash benchmarks/gpu_check.sh --prepare   # a machine with network: the offline bundle (.gpu_check/) for a GPU
#                                            # machine without network whose python3 holds torch (see below)
#   --steps a,b,...   only these steps (env, toolchain, build, tests, ops, nstrain; the report always)
#
# Steps:
#   env        the Python environment: $PY if set; else .venv (make install's) if there; else, with the prepared
#              bundle .gpu_check/wheelhouse, a --system-site-packages venv (.gpu_check/venv) over python3's packages
#              (its torch) plus the bundle's wheels, offline (pip --no-index --no-deps); else `make install`
#              (network: the pinned requirements).
#   toolchain  nvcc: $CUDA_HOME, PATH, or the PyPI toolchain of torch's CUDA version, fetched where none is found
#              (scripts/setup_system.sh cuda; scripts/cuda_toolchain.py); exported as CUDA_HOME and on PATH.
#   build      rh3dgs's extension with its CUDA kernels (RH3DGS_BUILD_CUDA=1, the GPU's arch, in place) and, at the
#              same time, gsplat's JIT extension (its projection, SH and binning kernels serve rh3dgs on CUDA, and
#              splatfacto); then every CUDA op must be registered for the CUDA dispatch key.
#   tests      the CUDA cases of the device-parametrised tests (pytest -k cuda: ops, render, lift, a training step).
#   ops        benchmarks/gpu_check.py ops: op agreement with the CPU kernels, 1280x720 FPS (RGB, RGB + 16 latents,
#              relevancy frame) on a real splat and a 1M-Gaussian scene beside splatfacto's, the 1M scene's lift.
#   nstrain    benchmarks/gpu_check.py nstrain: ns-train rh3dgs-lite vs splatfacto, s/iteration and PSNR.
#   report     gpu_check.md / .json: every step, test and comparison; the exit status.
#
# Environment: PY (interpreter to use as it is), OUT_DIR (results), RH3DGS_GPU_BUNDLE (default .gpu_check),
# GPU_CHECK_PYTHON_VERSION (--prepare: the GPU machine's Python, default 3.12), MAX_JOBS (builds; default: cores / 2).
# The bundle: the wheels of benchmarks/gpu_check_wheels.txt (what the tests and ns-train import beyond a CUDA
# image's python3: nerfstudio and gsplat without their dependency trees, tyro, viser...; no torch) and a copy of the
# real splats that load without conversion (shared/realdata/splats/*.ply, never committed); carry it with the
# checkout (git-ignored, a few tens of MB): --prepare where there is network, copy the checkout with .gpu_check to
# the GPU machine, run the script there, bring back benchmarks/results/gpu_check (gpu_check.md, .json, log.txt).
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
MODE=run
STEPS="env,toolchain,build,tests,ops,nstrain"
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) MODE=dry ;;
    --prepare) MODE=prepare ;;
    --steps) STEPS="$2"; shift ;;
    --steps=*) STEPS="${1#--steps=}" ;;
    -h | --help) sed -n '2,35s/^# \{0,1\}//p' "$0"; exit 0 ;;
    *) echo "gpu_check.sh: unknown argument '$1' (--dry-run, --prepare, --steps a,b; --help)" >&2; exit 2 ;;
  esac
  shift
done
OUT="${OUT_DIR:-benchmarks/results/gpu_check}"
BUNDLE="${RH3DGS_GPU_BUNDLE:-.gpu_check}"
WHEELS=benchmarks/gpu_check_wheels.txt
# the ops with a CUDA kernel: those csrc/cuda registers (tests/test_cuda_build.py pins the list)
CUDA_OPS=$(grep -oh 'm\.impl("[a-z_0-9]*"' csrc/cuda/*.cu | sed -e 's/m\.impl("//' -e 's/"//' | tr '\n' ' ')
TEST_FILES="tests/test_ops_rasterize.py tests/test_ops_aggregate.py tests/test_ops_lic.py tests/test_ops_relevancy.py
tests/test_ops_binning.py tests/test_ops_projection.py tests/test_ops_sh.py tests/test_ops_guided.py
tests/test_ops_gsplat.py tests/test_rendering.py tests/test_lifting.py tests/test_nerfstudio.py"
T0=$(date +%s)
PROBLEMS=0
say() { echo "=== [$(( $(date +%s) - T0 )) s] $*"; }
want() { [[ ",$STEPS," == *",$1,"* ]]; }
problem() { echo "PROBLEM: $*"; PROBLEMS=$((PROBLEMS + 1)); LAST_PROBLEM="$*"; }
# stop WHY: a run that cannot go on: the report of what ran (where the interpreter works), exit 1
stop() {
  echo "STOPPED: $*"
  "${PY:-false}" benchmarks/gpu_check.py report --out "$OUT" > /dev/null 2>&1
  say "stopped: $*; results in $OUT"
  exit 1
}

# ---------------------------------------------------------------------------------------------------- --prepare
if [ "$MODE" = prepare ]; then
  PYV="${GPU_CHECK_PYTHON_VERSION:-3.12}"
  PYDL="${PY:-python3}"
  mkdir -p "$BUNDLE/wheelhouse" || exit 1
  say "wheels of $WHEELS for CPython $PYV (manylinux x86_64) into $BUNDLE/wheelhouse"
  plats=()
  for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do
    plats+=(--platform "$p")
  done
  "$PYDL" -m pip download -q --no-deps --only-binary=:all: --python-version "$PYV" --implementation cp \
    "${plats[@]}" -d "$BUNDLE/wheelhouse" -r "$WHEELS" || { echo "pip download failed (above)"; exit 1; }
  real=""
  for d in "${RH3DGS_REALDATA:-}" "$ROOT/shared/realdata" "$ROOT/../shared/realdata" "$ROOT/../../shared/realdata"; do
    [ -n "$d" ] && [ -d "$d/splats" ] && { real="$d"; break; }
  done
  if [ -n "$real" ] && [ -d "$real/splats" ]; then
    mkdir -p "$BUNDLE/realdata/splats"
    for f in "$real"/splats/*.ply "$real"/splats/LICENSE*; do
      case "$f" in *.compressed.ply | *'*'*) continue ;; esac
      cp "$f" "$BUNDLE/realdata/splats/"
    done
    say "real splats from $real/splats: $(ls "$BUNDLE/realdata/splats" | tr '\n' ' ')"
  else
    say "no shared/realdata/splats found: the GPU run will skip the real splat (stated in its report)"
  fi
  say "bundle $BUNDLE: $(du -sh "$BUNDLE" | cut -f1) ($(ls "$BUNDLE/wheelhouse" | wc -l) wheels); the checkout: $(git ls-files | xargs du -cb 2>/dev/null | tail -1 | cut -f1) bytes"
  echo "carry $BUNDLE with the checkout; on the GPU machine: bash benchmarks/gpu_check.sh"
  exit 0
fi

if [ "$MODE" = run ]; then
  mkdir -p "$OUT"
  rm -f "$OUT/steps.tsv" "$OUT/tests.xml" "$OUT/ops.json" "$OUT/nstrain.json"
  exec > >(tee "$OUT/log.txt") 2>&1
fi
export PYTHONUNBUFFERED=1
[ "$MODE" = dry ] && echo "gpu_check.sh DRY RUN: checks each step's prerequisites and says what it would run; runs nothing heavy"

# step NAME SECONDS STATUS NOTE: one line of steps.tsv (the report's table)
record() { [ "$MODE" = run ] && printf '%s\t%s\t%s\t%s\n' "$1" "$3" "$2" "${4:-}" >> "$OUT/steps.tsv"; return 0; }
# timed NAME LIMIT CMD...: run CMD with a time limit, record ok / FAILED / TIMEOUT
timed() {
  local name=$1 limit=$2 t rc
  shift 2
  t=$(date +%s)
  timeout "$limit" "$@"
  rc=$?
  local secs=$(( $(date +%s) - t ))
  if [ $rc -eq 0 ]; then record "$name" "$secs" ok; elif [ $rc -eq 124 ]; then record "$name" "$secs" TIMEOUT "over ${limit} s"; else record "$name" "$secs" FAILED "exit $rc"; fi
  return $rc
}
would() { echo "  would run: $*"; }

# ------------------------------------------------------------------------------------------------------- machine
say "machine"
GPU=1
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; then
  :
else
  GPU=0
  if [ "$MODE" = run ]; then echo "no nvidia-smi answering: not a GPU machine"; record machine 0 FAILED "no GPU"; exit 1; fi
  echo "no nvidia-smi answering: this is not a GPU machine (a real run stops here; the dry run goes on)"
fi
echo "cores: $(nproc)"
JOBS="${MAX_JOBS:-$(( $(nproc) > 3 ? $(nproc) / 2 : 1 ))}"

# ------------------------------------------------------------------------------------------------------------- env
say "env: the Python environment"
ENV_KIND=""
if [ -n "${PY:-}" ]; then
  ENV_KIND="PY=$PY"
elif [ -x .venv/bin/python ]; then
  PY=.venv/bin/python; ENV_KIND=".venv (make install)"
elif [ -d "$BUNDLE/wheelhouse" ]; then
  ENV_KIND="offline bundle: a venv over python3's packages + $BUNDLE/wheelhouse"
  PY="$BUNDLE/venv/bin/python"
else
  ENV_KIND="make install (network: .venv with requirements.txt)"
  PY=.venv/bin/python
fi
echo "environment: $ENV_KIND"
t=$(date +%s)
if [[ "$ENV_KIND" == offline* ]]; then
  base=$(command -v python3 || true)
  [ -n "$base" ] || problem "no python3 on PATH for the offline venv"
  if [ -n "$base" ] && ! "$base" -c "import torch" 2>/dev/null; then
    problem "python3 ($base) has no torch: the offline bundle reuses the system's torch (or set PY)"
  fi
  missing=$(sed -e 's/#.*//' -e '/^\s*$/d' "$WHEELS" | while read -r spec; do
              name=${spec%%==*}; ver=${spec#*==}
              ls "$BUNDLE/wheelhouse" | grep -qi "^$(echo "$name" | tr '-' '_' )-$ver[-.]\|^$name-$ver[-.]" || echo "$spec"; done)
  [ -z "$missing" ] || problem "wheels missing from $BUNDLE/wheelhouse: $missing (run --prepare again)"
  if [ "$MODE" = dry ]; then
    would "$base -m venv --system-site-packages --without-pip $BUNDLE/venv (+ a .pth to python3's own site-packages where python3 is itself a venv)"
    would "$base -m pip install --no-index --no-deps --find-links $BUNDLE/wheelhouse --target <its site-packages> -r $WHEELS"
  elif want env && [ $PROBLEMS -eq 0 ]; then
    t=$(date +%s)
    # no pip in the venv (no ensurepip needed): python3's own pip installs into it
    [ -x "$PY" ] || "$base" -m venv --system-site-packages --without-pip "$BUNDLE/venv" \
      || { record env 0 FAILED "venv"; stop "python3 -m venv failed (above)"; }
    site=$("$PY" -c 'import site; print(site.getsitepackages()[0])')
    # python3 itself a venv (an image's /opt/.../.venv): --system-site-packages reaches only its base; add its own
    "$base" -c "import site, sys; sys.prefix != sys.base_prefix and print('\n'.join(site.getsitepackages()))" \
      > "$site/rh3dgs-system-python.pth"
    if "$base" -m pip install -q --no-index --no-deps --upgrade --find-links "$BUNDLE/wheelhouse" --target "$site" \
         -r "$WHEELS"; then
      record env $(( $(date +%s) - t )) ok "$ENV_KIND"
    else
      record env $(( $(date +%s) - t )) FAILED "offline pip install"; stop "offline install failed (above)"
    fi
    ENV_RECORDED=1
  fi
elif [[ "$ENV_KIND" == make* ]]; then
  if [ "$MODE" = dry ]; then
    would "make install RH3DGS_BUILD_CUDA=1   (scripts/setup_system.sh build, .venv, pip install -r requirements.txt, the toolchain step, the build)"
    command -v make >/dev/null || problem "no make on PATH"
  elif want env; then
    timed env 1800 make install RH3DGS_BUILD_CUDA=1 || stop "make install failed (above)"
    ENV_RECORDED=1
  fi
fi
if [ "$MODE" = run ] && [ $PROBLEMS -gt 0 ]; then record env 0 FAILED "$LAST_PROBLEM"; stop "$LAST_PROBLEM"; fi
if [ -x "$PY" ] || command -v "$PY" >/dev/null 2>&1; then
  "$PY" -c "import sys, torch; print('python', sys.version.split()[0], '| torch', torch.__version__, '| CUDA build', torch.version.cuda, '| GPU visible', torch.cuda.is_available())" \
    || { problem "$PY cannot import torch"; [ "$MODE" = run ] && stop "$PY cannot import torch"; }
  [ "$MODE" = run ] && want env && [ -z "${ENV_RECORDED:-}" ] && record env $(( $(date +%s) - t )) ok "$ENV_KIND"
  HAVE_PY=1
else
  HAVE_PY=0
  [ "$MODE" = run ] && stop "no interpreter $PY"
  echo "$PY is not there yet: the checks that need it wait for the env step"
fi

# ------------------------------------------------------------------------------------------------------ toolchain
say "toolchain: nvcc"
if [ $HAVE_PY = 1 ]; then
  if [[ "$ENV_KIND" == offline* ]] && [ -z "${CUDA_HOME:-}" ] && ! command -v nvcc >/dev/null 2>&1 \
       && [ -x /usr/local/cuda/bin/nvcc ]; then
    export CUDA_HOME=/usr/local/cuda  # offline nothing can be fetched: the image's toolkit, off PATH
  fi
  if [ "$MODE" = dry ]; then
    PYTHON="$PY" scripts/setup_system.sh --dry-run cuda 2>&1 | sed 's/^/  /'
    [ "${PIPESTATUS[0]}" = 0 ] || problem "scripts/setup_system.sh cuda failed (above)"
  elif want toolchain; then
    timed toolchain 600 env PYTHON="$PY" scripts/setup_system.sh cuda || stop "no CUDA compiler could be had (above)"
  fi
  if home=$("$PY" scripts/cuda_toolchain.py home 2>&1); then
    tab=$'\t'
    export CUDA_HOME="${home%%"$tab"*}"
    export PATH="$CUDA_HOME/bin:$PATH"
    echo "CUDA toolkit: $CUDA_HOME (found through ${home##*"$tab"})"
  elif [ "$MODE" = dry ]; then
    echo "  no CUDA toolkit yet (${home}): the run will fetch the PyPI toolchain"
  fi
elif [ -n "${CUDA_HOME:-}" ] && [ -x "$CUDA_HOME/bin/nvcc" ]; then
  echo "CUDA toolkit: $CUDA_HOME (found through CUDA_HOME)"
elif command -v nvcc >/dev/null 2>&1; then
  echo "CUDA toolkit: $(command -v nvcc) (found through PATH)"
else
  echo "no nvcc on PATH and no \$CUDA_HOME: after the env step, will fetch the PyPI toolchain of torch's CUDA version (scripts/setup_system.sh cuda)"
fi

# ---------------------------------------------------------------------------------------------------------- build
say "build: rh3dgs's CUDA kernels and gsplat's JIT extension (MAX_JOBS=$JOBS each)"
ARCH=""
[ $GPU = 1 ] && [ $HAVE_PY = 1 ] && ARCH=$("$PY" -c "import torch; c = torch.cuda.get_device_capability(); print(f'{c[0]}.{c[1]}')" 2>/dev/null)
BUILD=(env RH3DGS_BUILD_CUDA=1 TORCH_CUDA_ARCH_LIST="${ARCH:-9.0}" MAX_JOBS="$JOBS" "$PY" setup.py -q build_ext --inplace)
GSPLAT=(env TORCH_CUDA_ARCH_LIST="${ARCH:-9.0}" MAX_JOBS="$JOBS" "$PY" -c "from gsplat.cuda._backend import _C; assert _C is not None, 'gsplat found no nvcc'")
REGISTERED=("$PY" -c "
import sys, torch
from rh3dgs.ops._backend import has_native_kernel
missing = [op for op in '$CUDA_OPS'.split() if not has_native_kernel(op, torch.device('cuda'))]
print('CUDA ops registered:', '$CUDA_OPS' if not missing else 'MISSING ' + ' '.join(missing))
sys.exit(1 if missing else 0)")
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
if [ "$MODE" = dry ]; then
  would "${BUILD[*]}    (in the background, log: $OUT/build.log)"
  would "${GSPLAT[*]}    (at the same time, log: $OUT/gsplat-build.log)"
  would "the check that $CUDA_OPS are registered for the CUDA dispatch key"
  for tool in c++ ninja; do command -v $tool >/dev/null 2>&1 || [ -x "$(dirname "$PY")/$tool" ] || problem "no $tool on PATH"; done
  [ $HAVE_PY = 1 ] && { "$PY" -c "import gsplat" 2>/dev/null && echo "  gsplat $("$PY" -c 'import gsplat; print(gsplat.__version__)') importable" || echo "  gsplat not importable yet (the env step installs it)"; }
elif want build; then
  t=$(date +%s)
  timeout 900 "${BUILD[@]}" > "$OUT/build.log" 2>&1 &
  pid_ours=$!
  timeout 900 "${GSPLAT[@]}" > "$OUT/gsplat-build.log" 2>&1 &
  pid_gsplat=$!
  wait $pid_ours; rc_ours=$?
  echo "rh3dgs build: exit $rc_ours in $(( $(date +%s) - t )) s"; tail -3 "$OUT/build.log"
  wait $pid_gsplat; rc_gsplat=$?
  echo "gsplat JIT build: exit $rc_gsplat in $(( $(date +%s) - t )) s"; tail -3 "$OUT/gsplat-build.log"
  secs=$(( $(date +%s) - t ))
  if [ $rc_ours -ne 0 ]; then record build "$secs" FAILED "rh3dgs build (build.log)"; stop "the rh3dgs build failed"; fi
  [ $rc_gsplat -eq 0 ] || record gsplat-build "$secs" FAILED "gsplat JIT build (gsplat-build.log)"
  if "${REGISTERED[@]}"; then record build "$secs" ok "CUDA ops registered"; else record build "$secs" FAILED "CUDA ops not registered"; fi
fi

# ---------------------------------------------------------------------------------------------------------- tests
say "tests: the CUDA cases of the device-parametrised tests"
# shellcheck disable=SC2086
PYTEST=("$PY" -m pytest -q -p no:cacheprovider -k cuda $TEST_FILES)
if [ "$MODE" = dry ]; then
  would "${PYTEST[*]} --junitxml $OUT/tests.xml"
  if [ $HAVE_PY = 1 ]; then
    n=$("${PYTEST[@]}" --collect-only 2>&1 | grep -c "::")
    if [ "$n" -gt 0 ]; then echo "  $n CUDA cases collected"; else problem "no CUDA test case collected: ${PYTEST[*]} --collect-only"; fi
  fi
elif want tests; then
  timed tests 420 "${PYTEST[@]}" --junitxml "$OUT/tests.xml" --maxfail=20
fi

# ------------------------------------------------------------------------------------------------------------ ops
say "ops: agreement, frame rates at 1280x720, the lift of 1M Gaussians"
if [ "$MODE" = dry ]; then
  would "$PY benchmarks/gpu_check.py ops --device cuda --out $OUT"
  [ -f benchmarks/gpu_check.py ] || problem "benchmarks/gpu_check.py is missing"
  if [ $HAVE_PY = 1 ]; then
    "$PY" -c "
import sys; sys.path.insert(0, 'benchmarks')
import gpu_check as g
r = g.realdata_dir()
print('  real splats:', 'none found: skipped (stated in the report)' if r is None else r / 'splats')" || problem "benchmarks/gpu_check.py does not import"
  fi
elif want ops; then
  timed ops 600 "$PY" benchmarks/gpu_check.py ops --device cuda --out "$OUT"
fi

# -------------------------------------------------------------------------------------------------------- nstrain
say "nstrain: ns-train rh3dgs-lite vs splatfacto"
if [ "$MODE" = dry ]; then
  would "$PY benchmarks/gpu_check.py nstrain --out $OUT   (1000 iterations each, nerfstudio's train entry in-process)"
  [ $HAVE_PY = 1 ] && { "$PY" -c "import nerfstudio.scripts.train" 2>/dev/null && echo "  nerfstudio importable" || echo "  nerfstudio not importable yet (the env step installs it)"; }
elif want nstrain; then
  timed nstrain 600 "$PY" benchmarks/gpu_check.py nstrain --out "$OUT"
fi

# --------------------------------------------------------------------------------------------------------- report
if [ "$MODE" = dry ]; then
  would "$PY benchmarks/gpu_check.py report --out $OUT   (gpu_check.md / .json; exit 1 on any failure)"
  say "dry run done: $PROBLEMS problem(s)"
  [ $PROBLEMS -eq 0 ]
  exit
fi
say "report"
"$PY" benchmarks/gpu_check.py report --out "$OUT"
rc=$?
say "done in $(( $(date +%s) - T0 )) s; results in $OUT (gpu_check.md)"
exit $rc
