#!/usr/bin/env bash
# GPU check of the artifact path, offline, with the flashinfer-cubin wheel installed.
#
# Prepare HERE (CPU machine): bash tools/prepare_gpu_dist.sh (cubins for sm_90a as a repository
#   and its lock in .gpu/artifacts/; the three wheels of the set, flashinfer-python pinning that
#   release, in .gpu/wheels_set/). Run on the device (carry ".gpu"):
#   WHEELS_DIR=.gpu/wheels_set bash tools/gpu_check_artifacts.sh     (or tools/gpu_check_dist.sh)
#
# It installs the carried wheels into a private target, pins the carried release if the
# flashinfer-python wheel pins none, turns downloads off (FLASHINFER_NO_DOWNLOAD=1, an empty
# store), then: `flashinfer artifacts status` (nothing may be missing), tools/gpu_check_artifacts.py
# (every covered op, cubin vs JIT, bit-equal; graph/stream; timings; tampered cubin refused) and
# tests/test_cubin_backend.py. Everything lands in $OUT; exit 0 only if all passed.
set -uo pipefail
OUT=${OUT:-/tmp/fi-art-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
site=/tmp/fi-art-site
rm -rf "$site"
# Bytecode compiled at install, as pip does for a user: the first-call figure must not include
# compiling flashinfer's and tvm_ffi's Python sources (~100 ms on the GPU machine).
python3 -m pip install -q --no-index --no-deps --target "$site" \
  "${WHEELS_DIR:-.gpu/wheels}"/*.whl || exit 1
export PYTHONPATH="$site"
export FLASHINFER_WORKSPACE_BASE=$(mktemp -d /tmp/fi-art-ws.XXXX) MAX_JOBS=16
export FLASHINFER_NO_DOWNLOAD=1 FLASHINFER_CUBIN_DIR=$(mktemp -d /tmp/fi-art-store.XXXX)
unset FLASHINFER_CUBINS_REPOSITORY
pinned=$(python3 -c "from flashinfer.artifacts import resolve; p = resolve._build_pin(); print(getattr(p, 'MANIFEST_SHA256', None) or '')")
if [ -z "$pinned" ]; then
  export FLASHINFER_CUBIN_MANIFEST_SHA256=$(python3 -c "import json; print(json.load(open('.gpu/artifacts/lock.json'))['manifest_sha256'])")
  echo "flashinfer-python pins no release: trusting the carried lock $FLASHINFER_CUBIN_MANIFEST_SHA256" | tee "$OUT/pin.txt"
else
  echo "flashinfer-python pins $pinned" | tee "$OUT/pin.txt"
fi
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee "$OUT/gpu.txt"
rc=0
# Offline, with the wheel: every file of the release must be there (the CLI when click is
# installed, the same function directly otherwise).
if python3 -c "import click" 2>/dev/null; then
  python3 -m flashinfer artifacts status 2>&1 | tee "$OUT/status.txt"
else
  python3 -c "
from collections import Counter
from flashinfer.artifacts import resolve
rows = resolve.release_status(resolve.pinned_release())
c = Counter(s for _, s in rows)
print(f'{len(rows)} files; in flashinfer-cubin: {c[\"wheel\"]}, in store: {c[\"present\"]}, missing: {c[\"missing\"]}, corrupt: {c[\"corrupt\"]}')
" 2>&1 | tee "$OUT/status.txt"
fi
grep -q "missing: 0, corrupt: 0" "$OUT/status.txt" || { echo "FAIL: files missing offline"; rc=1; }
python3 tools/gpu_check_artifacts.py --out "$OUT/artifacts_gpu.json" 2>&1 | tee "$OUT/check.log" || rc=1
timeout ${TEST_TIMEOUT:-300} python3 -m pytest tests/test_cubin_backend.py -q -p no:cacheprovider \
  --junitxml="$OUT/junit_cubin.xml" 2>&1 | tee "$OUT/pytest_cubin.log" | tail -15
[ "${PIPESTATUS[0]}" = 0 ] || rc=1
echo "gpu_check_artifacts: rc=$rc"
exit $rc
