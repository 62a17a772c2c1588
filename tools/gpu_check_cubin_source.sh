#!/usr/bin/env bash
# GPU check of the cubin path from the SOURCE TREE (no flashinfer wheel installed): the cubin
# tests build their own release for the visible GPU with tools/cubin_build.py (nvcc), pin it for
# the session, and compare every cubin-served op with its JIT twin (compiled from the tree); the
# tampered-cubin test runs only here (with a wheel installed it is skipped: the wheel is
# read-only). Only the wheels the GPU image lacks (apache-tvm-ffi, click) are installed, from
# $WHEELS_DIR (tools/prepare_gpu_dist.sh puts them in .gpu/wheels_set; carry ".gpu").
#   usage (device, repo root): OUT=... bash tools/gpu_check_cubin_source.sh [pytest args...]
# Writes $OUT/pytest_cubin_source.log and $OUT/junit_cubin_source.xml; exit 0 only if all pass.
set -uo pipefail
OUT=${OUT:-/tmp/fi-src-out}; mkdir -p "$OUT"
wheels=${WHEELS_DIR:-.gpu/wheels_set}
site=/tmp/fi-src-site
rm -rf "$site"
# apache-tvm-ffi: the one prepare_gpu_dist.sh fetched, else the one kept in .gpu/wheels.
deps=$(ls "$wheels"/apache_tvm_ffi-*.whl .gpu/wheels/apache_tvm_ffi-*.whl 2>/dev/null | head -1)
deps="$deps $(ls "$wheels"/click-*.whl 2>/dev/null | head -1)"
[ -n "${deps// /}" ] || { echo "no apache-tvm-ffi wheel in $wheels: run tools/prepare_gpu_dist.sh first"; exit 2; }
python3 -m pip install -q --no-index --no-deps --target "$site" $deps || exit 1
# The tree's package first; nothing may supply a release: no flashinfer-cubin on the path, no
# pin or repository from the environment (the tests build and pin their own).
export PYTHONPATH=$PWD/packages/flashinfer-python:$PWD/tests:$site PYTHONUNBUFFERED=1
unset FLASHINFER_CUBINS_REPOSITORY FLASHINFER_CUBIN_MANIFEST_SHA256 FLASHINFER_NO_DOWNLOAD \
  FLASHINFER_CUBIN_DIR FLASHINFER_CUDA_ARCH_LIST FLASHINFER_DISABLE_JIT
export FLASHINFER_WORKSPACE_BASE=$(mktemp -d /tmp/fi-src-ws.XXXX) MAX_JOBS=16
python3 - <<'EOF' 2>&1 | tee "$OUT/source_env.txt"
import importlib.util, flashinfer, torch
print("flashinfer", flashinfer.__version__, "from", flashinfer.__file__)
print("flashinfer_cubin importable:", importlib.util.find_spec("flashinfer_cubin") is not None)
print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name())
EOF
grep -q "/packages/flashinfer-python/flashinfer/" "$OUT/source_env.txt" \
  || { echo "FAIL: flashinfer is not imported from the source tree"; exit 1; }
grep -q "flashinfer_cubin importable: False" "$OUT/source_env.txt" \
  || { echo "FAIL: a flashinfer-cubin is importable; the source check needs none"; exit 1; }
# The loader's CPU tests ride along: test_loader checks the ctypes structs against this
# machine's cuda.h. (The rest of tests/artifacts needs requests, moto and hatchling.)
timeout "${TEST_TIMEOUT:-220}" python3 -m pytest tests/test_cubin_backend.py \
  tests/artifacts/test_loader.py tests/artifacts/test_cubin_kernels.py -q -p no:cacheprovider --junitxml="$OUT/junit_cubin_source.xml" "$@" 2>&1 \
  | tee "$OUT/pytest_cubin_source.log" | tail -25
rc=${PIPESTATUS[0]}
echo "gpu_check_cubin_source: rc=$rc"
exit "$rc"
