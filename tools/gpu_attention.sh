#!/usr/bin/env bash
# One device call for attention work, from the source tree: build the attention modules in
# parallel, run the attention GPU tests, benchmark. Everything lands in $OUT.
#   usage (device): bash tools/gpu_attention.sh COMMIT [pytest args...]
#   env: TESTS (default: prefill, decode, cascade test files), TEST_TIMEOUT, SKIP_TESTS,
#        SKIP_BENCH, BENCH_OPS (default attention), MODULES (aot --only list; default: all
#        attention modules plus page and cascade)
set -uo pipefail
commit=${1:?commit}; shift
export PYTHONUNBUFFERED=1
python3 -m pip install -q --upgrade --no-index --no-deps --no-compile --target /tmp/site \
  .gpu/wheels/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD/packages/flashinfer-python:$PWD/tests
export FLASHINFER_WORKSPACE_BASE=${FLASHINFER_WORKSPACE_BASE:-/tmp/fi-ws} FLASHINFER_CUDA_ARCH_LIST=9.0a
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee $OUT/gpu.txt
modules=${MODULES:-$(python3 -c "
from flashinfer import aot
print(','.join(s.name for s in aot.registered_specs()
               if s.name.startswith('attention_') or s.name in ('page', 'cascade')))")}
( time python3 -m flashinfer.aot --jobs 16 --only "$modules" ) > $OUT/aot.log 2>&1
tail -3 $OUT/aot.log
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  timeout ${TEST_TIMEOUT:-300} python3 -m pytest ${TESTS:-tests/test_prefill.py tests/test_decode.py tests/test_cascade.py} \
    -q -p no:cacheprovider --maxfail=25 --junitxml=$OUT/junit.xml "$@" > $OUT/pytest.log 2>&1
  echo "pytest exit $?"; grep -E "^(FAILED|ERROR)|passed|failed" $OUT/pytest.log | head -40
fi
if [ "${SKIP_BENCH:-0}" != 1 ]; then
  timeout ${BENCH_TIMEOUT:-240} python3 benchmarks/run.py --commit "$commit" --ops "${BENCH_OPS:-attention}" \
    --out $OUT/bench.json > $OUT/bench.log 2>&1
  echo "bench exit $?"
  python3 - <<'PY'
import json, os
d = json.load(open(os.environ["OUT"] + "/bench.json"))
print("ceilings", {k: round(v, 1) if isinstance(v, float) else v for k, v in d["ceilings"].items()})
for r in d["cases"]:  # the schema of benchmarks/schema.py
    pct = r.get("pct_of_" + r.get("ceiling", "copy"), r.get("TFLOPs", ""))
    print(f"{r['name'][:58]:58s} {r['median_us']:10.1f} us  {pct}")
PY
fi
