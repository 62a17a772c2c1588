#!/usr/bin/env bash
# One device call for issue 22's batched FA2 rows (ragged 16 x 1024, paged 8 x 2048): our
# modules of benchmarks/probes/fa2_batch.py (variants, trace build) built 16 at a time while
# the peer (FlashInfer 0.7.2) builds its fa2 modules in the background; then, while the GPU
# tests' modules build (TESTS=1, niced), on the GPU: our rows (fa2_batch.py ours), the peer's
# (fa2_batch.py public), Nsight Compute on the ragged row of both (NCU=1), and the attention
# GPU tests in the time left (TESTS=1).
#   usage (device, from the repository root; .gpu/wheels and .gpu/peer beside it or in it):
#     bash tools/gpu_fa2_batch.sh COMMIT
#   env: BUDGET (s, default 345), TESTS, NCU (0 or 1)
# Back in $OUT: log.txt, fa2-batch-ours.json, fa2-batch-peer.json, pytest-*.log, ncu.tgz,
# logs.tgz.
set -uo pipefail
commit=${1:?commit}
source tools/gpu_lib.sh; gpu_setup 345 peer
( peer nice -n 5 python3 benchmarks/probes/fa2_batch.py warmup ) > /tmp/peer-warmup.log 2>&1 &
peer_pid=$!
log "build"
ours timeout $(( $(left) - 190 )) python3 benchmarks/probes/fa2_batch.py build > /tmp/build.log 2>&1
log "build exit $?: $(tail -1 /tmp/build.log)"
if [ "${TESTS:-0}" = 1 ]; then
  ( ours nice -n 10 python3 benchmarks/probes/fa2_batch.py build --tests ) > /tmp/build-tests.log 2>&1 &
fi
wait $peer_pid; log "peer warmup exit $?"
ours timeout 85 python3 benchmarks/probes/fa2_batch.py ours $OUT/fa2-batch-ours.json \
  > /tmp/ours.log 2>&1; log "ours exit $?"; grep -E "^(trace|check)|us$" /tmp/ours.log >> $OUT/log.txt
peer timeout 45 python3 benchmarks/probes/fa2_batch.py public $OUT/fa2-batch-peer.json \
  > /tmp/peer.log 2>&1; log "peer exit $?"; grep -E "us$" /tmp/peer.log >> $OUT/log.txt
if [ "${NCU:-0}" = 1 ]; then
  mkdir -p /tmp/ncu
  for side in ours peer; do
    [ $(left) -lt 60 ] && break
    $side timeout 30 ncu --clock-control none --section SpeedOfLight \
      --section LaunchStats --section Occupancy --section WarpStateStats \
      --section InstructionStats --section ComputeWorkloadAnalysis \
      --section MemoryWorkloadAnalysis_Tables \
      --kernel-name "regex:attention_kernel|Prefill" --launch-skip 2 --launch-count 1 \
      -o /tmp/ncu/ragged-$side python3 benchmarks/probes/ncu_attention.py ragged_fa2 \
      > /tmp/ncu/ragged-$side.log 2>&1
    log "ncu ragged $side exit $?"
    ncu --import /tmp/ncu/ragged-$side.ncu-rep --page details > /tmp/ncu/ragged-$side.txt 2>&1
  done
  tar -czf $OUT/ncu.tgz -C /tmp ncu 2>/dev/null
fi
if [ "${TESTS:-0}" = 1 ]; then
  t=$(( $(left) - 12 ))
  log "tests (timeout ${t}s; modules built so far: $(ls /tmp/fi-ws/*/cached_ops 2>/dev/null | wc -l))"
  ours timeout -s INT $t python3 -m pytest tests/test_prefill.py tests/test_cascade.py tests/test_decode.py \
    -q -p no:cacheprovider --maxfail=20 -rfEs > $OUT/pytest.log 2>&1
  log "pytest: $(tail -1 $OUT/pytest.log)"; grep -E "^(FAILED|ERROR)" $OUT/pytest.log | head -10 >> $OUT/log.txt
fi
tar -czf $OUT/logs.tgz /tmp/build.log /tmp/build-tests.log /tmp/ours.log /tmp/peer.log \
  /tmp/peer-warmup.log 2>/dev/null
log "done"
