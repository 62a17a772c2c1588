#!/usr/bin/env bash
# One device call for the fp8 decode work (issue 21): the fp8 decode variants compiled side by
# side while the GPU tests run (four processes, JIT builds in parallel), then the variants timed
# on a quiet GPU (benchmarks/tuning/fp8_decode.py). Everything to $OUT.
#   run from .gpu/fp8dec (the wheels in ../wheels, or WHEELS=DIR)
#   env: BUDGET (s, default 340), TESTS (pytest groups, ';'-separated), VARIANTS (names, ','-sep.)
set -uo pipefail
T0=$(date +%s); BUDGET=${BUDGET:-340}
left() { echo $(( BUDGET - ($(date +%s) - T0) )); }
log() { echo "[$(( $(date +%s) - T0 ))s] $*" | tee -a $OUT/log.txt; }
export PYTHONUNBUFFERED=1 FLASHINFER_CUDA_ARCH_LIST=9.0a MAX_JOBS=16
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site ${WHEELS:-../wheels}/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD/packages/flashinfer-python:$PWD/tests FLASHINFER_WORKSPACE_BASE=/tmp/fi-ws
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader >> $OUT/log.txt
IFS=',' read -ra V <<< "${VARIANTS:-}"
( python3 benchmarks/tuning/fp8_decode.py --build "${V[@]}" > /tmp/build.log 2>&1; echo "build exit $?" >> /tmp/build.log ) &
IFS=';' read -ra G <<< "${TESTS:-tests/test_attention_fp8.py -k decode;tests/test_attention_fp8.py -k 'not decode';tests/test_decode.py}"
i=0; pids=()
for g in "${G[@]}"; do
  ( eval timeout $(( $(left) - 150 )) python3 -m pytest -q -p no:cacheprovider --maxfail=20 -rfE $g > /tmp/pytest-$i.log 2>&1; echo "exit $?" >> /tmp/pytest-$i.log ) &
  pids+=($!); i=$((i+1))
done
wait
for f in /tmp/pytest-*.log; do log "$f: $(tail -2 $f | tr '\n' ' ')"; grep -E "^(FAILED|ERROR)" $f | head -8 | tee -a $OUT/log.txt; done
log "$(tail -2 /tmp/build.log | tr '\n' ' ')"
log "sweep"
timeout $(( $(left) - 10 )) python3 benchmarks/tuning/fp8_decode.py $OUT/fp8-sweep.json "${V[@]}" > /tmp/sweep.log 2>&1
log "sweep exit $?"; grep -E "^(  |==|check|ceilings)" /tmp/sweep.log | cut -c1-110 >> $OUT/log.txt
tar -czf $OUT/logs.tgz /tmp/pytest-*.log /tmp/build.log /tmp/sweep.log 2>/dev/null
log "done"
