#!/usr/bin/env bash
# GPU check of the split wheels (issue 4), one device call. Installs the wheels carried in
# $WHEELS_DIR (flashinfer-python, the flashinfer-jit-cache built on the CPU machine, and
# apache-tvm-ffi, which the GPU image lacks) into a private directory, disables nvcc, and runs
# tools/gpu_check_wheels.py: correctness of every covered op against a torch reference, the first
# call of each (fresh processes, median of 5, target <= 50 ms), and the ops' GPU test files, all
# on the wheel's modules. Writes $OUT/wheels.json, $OUT/wheels-junit.xml, $OUT/wheels.log.
#   usage (device): bash tools/gpu_check_wheels.sh COMMIT [gpu_check_wheels.py options]
# WHEELS_DIR (default .gpu/wheels) is where the wheels are; tools/gpu_check_dist.sh sets it.
set -uo pipefail
commit=${1:-unknown}
shift || true
wheels=${WHEELS_DIR:-.gpu/wheels}
site=/tmp/fi-wheels-site
rm -rf "$site"
# Bytecode compiled at install, as pip does for a user: the first-call figure must not include
# compiling flashinfer's and tvm_ffi's Python sources (~100 ms on the GPU machine).
python3 -m pip install -q --no-index --no-deps --target "$site" "$wheels"/*.whl \
  || { echo "pip could not install $wheels/*.whl on this machine"; exit 1; }
export PYTHONPATH=$site PYTHONUNBUFFERED=1

# nvcc disabled three ways: FLASHINFER_NVCC is a binary that fails (and leaves a mark if run),
# CUDA_HOME points nowhere, and no directory on PATH holds an nvcc. FLASHINFER_DISABLE_JIT=1 makes
# any module the wheel does not cover an error instead of a compile.
nonvcc=/tmp/fi-nonvcc
rm -rf "$nonvcc" && mkdir -p "$nonvcc"
printf '#!/bin/sh\ntouch %s/was-run\nexit 1\n' "$nonvcc" > "$nonvcc/nvcc" && chmod +x "$nonvcc/nvcc"
path=""
IFS=: read -ra dirs <<< "$PATH"
for d in "${dirs[@]}"; do [ -x "$d/nvcc" ] || path="${path:+$path:}$d"; done
export PATH=$path FLASHINFER_NVCC=$nonvcc/nvcc CUDA_HOME=/nonexistent/cuda FLASHINFER_DISABLE_JIT=1
unset FLASHINFER_CUDA_ARCH_LIST  # the archs come from the GPU, as for a user
export FLASHINFER_WORKSPACE_BASE=$(mktemp -d /tmp/fi-ws.XXXX)  # an empty JIT cache

python3 -c "import flashinfer, flashinfer_jit_cache as jc, torch; print(flashinfer.__file__, flashinfer.__version__, jc.__version__, jc.arch_list(), torch.__version__)"
python3 tools/gpu_check_wheels.py --commit "$commit" --out "$OUT/wheels.json" \
  --junit "$OUT/wheels-junit.xml" "$@" 2>&1 | tee "$OUT/wheels.log" | tail -60
exit "${PIPESTATUS[0]}"
