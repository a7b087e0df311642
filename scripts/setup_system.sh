#!/usr/bin/env bash
# rh3dgs set-up outside pip: the system packages and the browser driver that `make install`,
# `make demo` and `make test` need, installed only where missing. Idempotent: when everything
# is there it prints nothing and changes nothing (a few milliseconds).
#
#   scripts/setup_system.sh [--dry-run] GROUP...
#
#   build  a C++ compiler, $PYTHON with its venv module and headers    (make install, make demo)
#   test   headless chromium, node + npm, and the browser driver: tests/browser/node_modules
#          installed from tests/browser/package-lock.json (`npm ci`, only when node_modules is
#          missing or was installed from another version of the lock file)   (make test)
#   colmap COLMAP and ffmpeg, which `ns-process-data images` calls for SfM poses and seed points,
#          and libusb (open3d, imported by `ns-export`): the real-data benchmark's fox path
#          (benchmarks/bench_real.py, part of `make bench`)
#   cuda   the CUDA compiler for rh3dgs's CUDA kernels, only where $PYTHON's torch is a CUDA build, no
#          toolkit is found ($CUDA_HOME, nvcc on PATH, or this one installed before) and RH3DGS_BUILD_CUDA
#          is not 0: the PyPI toolchain of torch's CUDA version (nvidia-cuda-nvcc, -nvvm, -cuda-crt,
#          -cuda-cccl, -cuda-runtime; about 270 MB) into $PYTHON's environment with pip, where setup.py
#          finds it (scripts/cuda_toolchain.py)                          (make install, before the build)
#
# System packages come from apt-get (Debian / Ubuntu): run directly as root, through sudo
# otherwise (sudo asks for the password on a terminal). Where neither works (not root and no
# sudo, no apt-get, apt-get fails) it names the packages to install and exits 1.
#
#   --dry-run   (or RH3DGS_SETUP_DRY_RUN=1) print the commands it would run, change nothing
#   PYTHON             the interpreter the venv is made from (default: python3); cuda: the venv's own
#   RH3DGS_CHROMIUM    a chromium binary to use instead of `chromium` on PATH (the tests read it too)
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
DRY_RUN=${RH3DGS_SETUP_DRY_RUN:-0}
GROUPS_WANTED=()
for arg in "$@"; do
  case "$arg" in
    --dry-run) DRY_RUN=1 ;;
    build | test | colmap | cuda) GROUPS_WANTED+=("$arg") ;;
    -h | --help) sed -n '2,27s/^# \{0,1\}//p' "$0"; exit 0 ;;
    *) echo "scripts/setup_system.sh: unknown argument '$arg' (groups: build, test, colmap, cuda; --dry-run)" >&2; exit 2 ;;
  esac
done
[ ${#GROUPS_WANTED[@]} -gt 0 ] || GROUPS_WANTED=(build test)

say() { echo "rh3dgs set-up: $*" >&2; }

# run CMD...: print it; execute it unless this is a dry run
run() {
  echo "+ $*" >&2
  [ "$DRY_RUN" = 1 ] || "$@"
}

chromium_path() {
  if [ -n "${RH3DGS_CHROMIUM:-}" ]; then
    [ -x "$RH3DGS_CHROMIUM" ] && echo "$RH3DGS_CHROMIUM"
  else
    command -v chromium
  fi
}

# Each need: Debian package | what it is for | check (a shell command that succeeds when present)
NEEDS_build=(
  "python3|Python interpreter $PYTHON|command -v \"\$PYTHON\""
  "g++|C++ compiler, builds rh3dgs's native extension|command -v c++ || command -v g++"
  "python3-venv|venv module of $PYTHON, creates .venv|\"\$PYTHON\" -c 'import ensurepip, venv'"
  "python3-dev|Python.h of $PYTHON, builds the native extension|\"\$PYTHON\" -c 'import os, sys, sysconfig; sys.exit(not os.path.isfile(os.path.join(sysconfig.get_paths()[\"include\"], \"Python.h\")))'"
)
NEEDS_test=(
  "chromium|headless browser of the browser tests|chromium_path"
  "nodejs|node, runs the browser driver (playwright-core)|command -v node"
  "npm|installs the browser driver from tests/browser/package-lock.json|command -v npm"
)
NEEDS_colmap=(
  "colmap|structure from motion, run by ns-process-data images (poses + seed points)|command -v colmap"
  "ffmpeg|image copies and downscales of ns-process-data images|command -v ffmpeg"
  "libusb-1.0-0|libusb-1.0.so.0, needed to import open3d (ns-export)|\"\$PYTHON\" -c 'import ctypes; ctypes.CDLL(\"libusb-1.0.so.0\")'"
)
NEEDS_cuda=()  # pip packages, not Debian ones: see the cuda step below

# missing_needs: "package|purpose" of each need of the wanted groups whose check fails
missing_needs() {
  local group need rest
  for group in "${GROUPS_WANTED[@]}"; do
    local -n needs="NEEDS_$group"
    for need in "${needs[@]}"; do
      rest=${need#*|}
      eval "${rest#*|}" >/dev/null 2>&1 || echo "${need%%|*}|${rest%%|*}"
    done
  done
}

# cannot_install REASON PACKAGE...: the packages and how to get them, then exit 1
cannot_install() {
  local reason=$1
  shift
  say "cannot install $*: $reason."
  if [ -n "${RH3DGS_CHROMIUM:-}" ] && [ ! -x "$RH3DGS_CHROMIUM" ]; then
    say "(RH3DGS_CHROMIUM=$RH3DGS_CHROMIUM is set but is not an executable file)"
  fi
  say "install them yourself, e.g.: sudo apt-get install -y $* (or your system's package manager),"
  say "or set RH3DGS_CHROMIUM to a chromium binary; then run the make target again."
  exit 1
}

install_packages() {
  local -a sudo=()
  if [ "$(id -u)" != 0 ]; then
    command -v sudo >/dev/null 2>&1 || cannot_install "not root, and sudo is not installed" "$@"
    sudo=(sudo)
  fi
  command -v apt-get >/dev/null 2>&1 || cannot_install "no apt-get on this machine (not Debian / Ubuntu)" "$@"
  [ "$DRY_RUN" = 1 ] || say "installing $* (apt-get${sudo:+ through sudo})"
  run "${sudo[@]}" apt-get update -qq || cannot_install "apt-get update failed" "$@"
  run "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" \
    || cannot_install "apt-get install failed" "$@"
}

mapfile -t missing < <(missing_needs)
if [ ${#missing[@]} -gt 0 ]; then
  for need in "${missing[@]}"; do say "missing ${need%%|*} (${need#*|})"; done
  install_packages "${missing[@]%%|*}"
  if [ "$DRY_RUN" != 1 ]; then
    mapfile -t still < <(missing_needs)
    [ ${#still[@]} -eq 0 ] || cannot_install "still not found after apt-get install" "${still[@]%%|*}"
  fi
fi

if [[ " ${GROUPS_WANTED[*]} " == *" test "* ]]; then
  lock=tests/browser/package-lock.json
  stamp=tests/browser/node_modules/.rh3dgs-package-lock.json  # copy of the lock npm ci installed
  if ! cmp -s "$lock" "$stamp"; then
    [ "$DRY_RUN" = 1 ] || say "installing the browser driver from $lock (npm ci)"
    run npm ci --prefix tests/browser --no-audit --no-fund \
      || { say "npm ci failed (above): the browser driver named in $lock could not be installed"; exit 1; }
    run cp "$lock" "$stamp"
  fi
fi

if [[ " ${GROUPS_WANTED[*]} " == *" cuda "* ]]; then
  case "${RH3DGS_BUILD_CUDA:-auto}" in
    0 | false | no | off) ;;  # no CUDA kernels wanted: no compiler either
    *)
      # the requirements to install, one a line; nothing for a CPU build of torch or a toolkit found
      need=$("$PYTHON" scripts/cuda_toolchain.py need) \
        || { say "cannot tell whether $PYTHON needs the CUDA compiler (scripts/cuda_toolchain.py need failed, above)"; exit 1; }
      if [ -n "$need" ]; then
        mapfile -t specs <<< "$need"
        say "no CUDA compiler found for $PYTHON's CUDA build of torch: will fetch the PyPI toolchain (${specs[*]})"
        run "$PYTHON" -m pip install -q "${specs[@]}" \
          || { say "pip could not install the PyPI toolchain (above): install a CUDA toolkit and put its nvcc on PATH"; exit 1; }
      fi
      ;;
  esac
fi
