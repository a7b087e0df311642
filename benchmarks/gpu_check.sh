#!/usr/bin/env bash
# GPU check of rh3dgs (issues "nerfstudio plugin" and "performance"): run on a machine with a CUDA GPU.
#
#   bash benchmarks/gpu_check.sh            # PY=... to choose the interpreter (default: .venv, else python3)
#
# Steps (each says SKIP with the reason when its prerequisites are missing; target: < 8 minutes):
#   1. build the CUDA kernels (RH3DGS_BUILD_CUDA=1, arch of the visible GPU) and check they are registered;
#   2. ops on CUDA vs the CPU kernels (values and gradients) + render FPS of RGB and RGB + semantic
#      at 1280x720 (benchmarks/gpu_check.py);
#   3. `ns-train rh3dgs-lite` on the synthetic scene on CUDA, and nerfstudio's own `splatfacto` with the
#      same budget on the same data; ns-eval PSNR of both and seconds per iteration.
# Everything is printed and written to benchmarks/results/gpu_check/ (log, gpu_check.md / .json).
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
OUT="${OUT_DIR:-benchmarks/results/gpu_check}"
mkdir -p "$OUT"
exec > >(tee "$OUT/log.txt") 2>&1
if [ -z "${PY:-}" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
BIN="$(dirname "$(command -v "$PY")")"
T0=$(date +%s)
say() { echo "=== [$(( $(date +%s) - T0 )) s] $*"; }
export PYTHONUNBUFFERED=1

say "machine"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || { echo "no nvidia-smi: not a GPU machine"; exit 1; }
"$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'available', torch.cuda.is_available())" || exit 1

say "1. build the CUDA kernels"
ARCH=$("$PY" -c "import torch; c=torch.cuda.get_device_capability(); print(f'{c[0]}.{c[1]}')")
if command -v nvcc >/dev/null; then
  RH3DGS_BUILD_CUDA=1 TORCH_CUDA_ARCH_LIST="$ARCH" "$PY" -m pip install -q --no-build-isolation --no-deps -e . \
    || { echo "CUDA build FAILED"; exit 1; }
else
  echo "SKIP build: no nvcc on PATH (ops run through gsplat's CUDA rasterizer where they can)"
fi
"$PY" -c "
import torch
from rh3dgs.ops._backend import has_native_kernel
for op in ('rasterize_fwd', 'rasterize_bwd', 'aggregate_sphere'):
    print(op, 'CUDA kernel:', has_native_kernel(op, torch.device('cuda')))"

say "2. ops on CUDA vs CPU, frame rates"
"$PY" benchmarks/gpu_check.py --device cuda --out "$OUT" || echo "gpu_check.py FAILED"

say "3. ns-train rh3dgs-lite vs splatfacto on CUDA"
if [ -x "$BIN/ns-train" ] && "$PY" -c "import nerfstudio" 2>/dev/null; then
  export NERFSTUDIO_METHOD_CONFIGS="rh3dgs=rh3dgs.nerfstudio.config:rh3dgs_method,rh3dgs-lite=rh3dgs.nerfstudio.config:rh3dgs_lite_method"
  WORK="$(mktemp -d)"
  "$PY" -c "
from pathlib import Path
from rh3dgs.data.synthetic import SceneConfig, make_scene, write_dataset
from rh3dgs.data.teacher_sim import simulate_teacher
s = make_scene(SceneConfig(num_views=24, image_size=128, gaussians_per_unit_area=6000.0))
write_dataset(s, Path('$WORK/data'), progress=False)
simulate_teacher(Path('$WORK/data'), progress=False)"
  COMMON=(--vis tensorboard --output-dir "$WORK/out" --timestamp run --viewer.quit-on-train-completion True
          --max-num-iterations 1000 --steps-per-save 1000)
  for method in rh3dgs-lite splatfacto; do
    extra=()
    [ "$method" = rh3dgs-lite ] && extra=(--machine.device-type cuda --pipeline.datamanager.teacher-cache-dir "$WORK/cache")
    [ "$method" = splatfacto ] && extra=(--pipeline.model.background-color black)
    t=$(date +%s)
    if "$BIN/ns-train" "$method" "${COMMON[@]}" --experiment-name "$method" "${extra[@]}" --data "$WORK/data" \
         > "$OUT/ns-train-$method.log" 2>&1; then
      secs=$(( $(date +%s) - t ))
      cfg="$WORK/out/$method/$method/run/config.yml"
      "$BIN/ns-eval" --load-config "$cfg" --output-path "$OUT/eval-$method.json" > /dev/null 2>&1
      "$PY" -c "
import json; r = json.load(open('$OUT/eval-$method.json'))['results']
print('$method: %d s for 1000 iterations (%.1f ms/it incl. start-up), held-out PSNR %.3f dB' % ($secs, $secs * 1000 / 1000, r['psnr'])
      + ('' if 'sem_cos' not in r else ', sem_cos %.3f' % r['sem_cos']))" || echo "$method: ns-eval FAILED"
    else
      echo "$method: ns-train FAILED (see $OUT/ns-train-$method.log)"; tail -20 "$OUT/ns-train-$method.log"
    fi
  done
else
  echo "SKIP: nerfstudio / ns-train not installed for $PY"
fi
say "done in $(( $(date +%s) - T0 )) s; results in $OUT"
