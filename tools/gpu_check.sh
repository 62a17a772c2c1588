#!/usr/bin/env bash
# One call on the GPU machine: install the carried wheels, precompile every module, run the whole
# test suite (GPU tests for real), run the benchmarks. Everything lands in $OUT.
#   usage (device): bash tools/gpu_check.sh COMMIT [pytest args...]
set -uo pipefail
commit=${1:?commit}; shift
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
python3 -m pip install -q --upgrade --no-index --no-deps --no-compile --target /tmp/site .gpu/wheels/*.whl || exit 1
export FLASHINFER_WORKSPACE_BASE=$(mktemp -d /tmp/fi-ws.XXXX) MAX_JOBS=16
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee $OUT/gpu.txt
python3 -c "import flashinfer, torch; print(flashinfer.__file__, flashinfer.__version__, torch.__version__)"
( time python3 -m flashinfer.aot --jobs ${AOT_JOBS:-16} ) 2>&1 | tee $OUT/aot.log
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  timeout ${TEST_TIMEOUT:-330} python3 -m pytest tests -q --maxfail=40 --ignore=tests/jit --junitxml=$OUT/junit.xml -p no:cacheprovider "$@" 2>&1 | tee $OUT/pytest.log | tail -40
fi
if [ "${SKIP_BENCH:-0}" != 1 ]; then
  python3 benchmarks/run.py --commit "$commit" --ops "${BENCH_OPS:-jit,tutorial,norm,activation,rope}" --out $OUT/bench.json 2>&1 | tee $OUT/bench.log
fi
