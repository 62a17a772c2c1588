#!/usr/bin/env bash
# The tooling of issue 23 on a GPU, in one call; everything lands in $OUT.
#   usage (device, repo root): bash tools/gpu_tooling.sh [COMMIT]
# 1. the benchmark CLI over benchmarks/testlists/all_routines.txt (every routine, --refcheck):
#    $OUT/cli_all_routines.csv and a results record $OUT/<date>-<device>-<commit>-cli-routines.json
#    (copy it into benchmarks/results/, then python benchmarks/index.py)
# 2. the tooling tests, GPU-marked ones for real (each trace template's reference vs its op)
# 3. a level-10 dump of tools/tooling_workload.py (.pt, then .safetensors) and its replay
# 4. a trace dump of the same workload: $OUT/fi_trace/*.json
set -uo pipefail
: "${OUT:?set OUT}"
commit=${1:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
WHEELS=${WHEELS:-$(ls -d .gpu/wheels ../wheels 2>/dev/null | head -1)}
export PYTHONUNBUFFERED=1 MAX_JOBS=${MAX_JOBS:-16} FLASHINFER_CUDA_ARCH_LIST=${FLASHINFER_CUDA_ARCH_LIST:-9.0a}
export FLASHINFER_WORKSPACE_BASE=${FLASHINFER_WORKSPACE_BASE:-/tmp/fi-ws}
if [ -n "$WHEELS" ]; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/site "$WHEELS"/*.whl || exit 1
fi
export PYTHONPATH=/tmp/site:$PWD/packages/flashinfer-python:$PWD/tests${PYTHONPATH:+:$PYTHONPATH}
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv | tee $OUT/gpu.txt
device=$(python3 -c "import torch; n=torch.cuda.get_device_name().lower(); print('h200' if 'h200' in n else 'h100' if 'h100' in n else n.split()[-1])")
status=0
if [ "${SKIP_AOT:-0}" != 1 ]; then  # compile every module first, 16 cores in parallel
  ( time timeout ${AOT_TIMEOUT:-400} python3 -m flashinfer.aot --jobs ${AOT_JOBS:-16} ) > $OUT/aot.log 2>&1 \
    || echo "aot: rc=$? (the JIT compiles what is missing on first use)" | tee -a $OUT/aot.log
fi

echo "== 1. benchmark CLI, every routine with --refcheck"
python3 benchmarks/flashinfer_benchmark.py --testlist benchmarks/testlists/all_routines.txt \
  --output_path $OUT/cli_all_routines.csv --generate_repro_command \
  --record "$OUT/$(date -u +%F)-$device-$commit-cli-routines.json" --commit "$commit" \
  > $OUT/cli.log 2>&1 || status=1
grep -E "^\[(PERF|ERROR|WARNING)\]" $OUT/cli.log | cut -c1-150 | tail -60
python3 - $OUT/cli_all_routines.csv <<'PY'
import csv, os, sys
if not os.path.exists(sys.argv[1]):
    sys.exit("CLI: no CSV written (see cli.log)")
rows = list(csv.DictReader(open(sys.argv[1])))
timed = [r for r in rows if r["median_time_ms"]]
fails = [f"{r['routine']}/{r['backend']}" for r in rows if r["refcheck"] == "FAIL"]
errors = [f"{r['routine']}/{r['backend']}: {r['note'][:80]}" for r in rows if not r["median_time_ms"]]
print(f"CLI: {len(rows)} rows, {len(timed)} timed, refcheck FAIL: {fails or 'none'}")
print("not timed:", *errors, sep="\n  ")
PY

echo "== 2. tooling tests (GPU-marked for real)"
timeout ${TEST_TIMEOUT:-400} python3 -m pytest -q -p no:cacheprovider tests/test_fi_trace.py \
  tests/test_api_dump.py tests/test_flashinfer_benchmark.py tests/test_api_logging.py \
  --junitxml=$OUT/junit_tooling.xml > $OUT/pytest_tooling.log 2>&1 || status=1
tail -25 $OUT/pytest_tooling.log

echo "== 3. level-10 dump and replay of real ops"
for fmt in pt safetensors; do
  dir=/tmp/fi-dumps-$fmt; rm -rf $dir
  st=0; [ $fmt = safetensors ] && st=1
  FLASHINFER_LOGLEVEL=10 FLASHINFER_LOGDEST=$OUT/level10-$fmt.log FLASHINFER_DUMP_DIR=$dir \
    FLASHINFER_DUMP_SAFETENSORS=$st python3 tools/tooling_workload.py > $OUT/workload-$fmt.log 2>&1 || status=1
  tail -3 $OUT/workload-$fmt.log
  python3 -m flashinfer replay --dir $dir > $OUT/replay-$fmt.log 2>&1 || status=1
  tail -4 $OUT/replay-$fmt.log
  cp "$(ls -d $dir/*/ | head -1)metadata.json" $OUT/dump-metadata-example-$fmt.json 2>/dev/null
  cp $dir/session.jsonl $OUT/dump-session-$fmt.jsonl 2>/dev/null
  echo "dumped calls ($fmt): $(ls -d $dir/*/ | wc -l), $(du -sh $dir | cut -f1)"
done

echo "== 4. trace dump of the workload"
rm -rf $OUT/fi_trace
FLASHINFER_TRACE_DUMP=1 FLASHINFER_TRACE_DUMP_DIR=$OUT/fi_trace python3 tools/tooling_workload.py \
  > $OUT/trace-workload.log 2>&1 || status=1
ls $OUT/fi_trace | tee $OUT/fi_trace.txt
echo "gpu_tooling.sh: status $status"
exit $status
