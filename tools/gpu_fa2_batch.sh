#!/usr/bin/env bash
# One device call for issue 22's batched FA2 rows (ragged 16 x 1024, paged 8 x 2048): our
# modules (benchmarks/probes/fa2_batch.py's variants and trace build, with the GPU tests'
# attention, cascade and page modules under TESTS=1) built 16 at a time while the peer
# (FlashInfer 0.7.2) builds its fa2 modules in the background; under TESTS=1 the attention GPU
# tests; then on an idle GPU our rows (fa2_batch.py ours), the peer's (fa2_batch.py public and,
# under PEER_ROWS=1, attention_vs_peer.py's fa2 and decode rows with ours beside them), and
# under NCU=1 Nsight Compute on the ragged and single rows of both.
#   usage (device, from the repository root): bash tools/gpu_fa2_batch.sh COMMIT
#   env: BUDGET (s, default 345), TESTS, PEER_ROWS, NCU (0 or 1)
# Back in $OUT: log.txt, fa2-batch-ours.json, fa2-batch-peer.json, pytest-*.log,
# attention.json (attention_vs_peer merged), ncu.tgz, logs.tgz.
set -uo pipefail
commit=${1:?commit}
start=$(date +%s)
left() { echo $(( ${BUDGET:-345} - ($(date +%s) - start) )); }
log() { echo "[$(( $(date +%s) - start ))s] $*" | tee -a $OUT/log.txt; }
export PYTHONUNBUFFERED=1 FLASHINFER_CUDA_ARCH_LIST=9.0a
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .gpu/wheels/*.whl || exit 1
rm -f /tmp/peer-ready
mkdir -p /tmp/peer && tar -xJf .gpu/peer/flashinfer-peer.tar.xz -C /tmp/peer
ours() { PYTHONPATH=/tmp/site:$PWD/packages/flashinfer-python:$PWD/tests FLASHINFER_WORKSPACE_BASE=/tmp/fi-ws "$@"; }
peer() { PYTHONPATH=/tmp/peer:/tmp/site FLASHINFER_WORKSPACE_BASE=/tmp/peer-ws "$@"; }
PEER_CASES="fa2,batch decode 64 x kv 4096,batch decode 1 x kv 32768,batch decode 128,single decode,!fp8,!sinks,!q_len"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv >> $OUT/log.txt
( peer nice -n 5 python3 benchmarks/probes/fa2_batch.py warmup \
    && { [ "${PEER_ROWS:-0}" = 0 ] || peer nice -n 5 python3 benchmarks/attention_vs_peer.py \
         warmup --cases "$PEER_CASES"; } && echo ready > /tmp/peer-ready ) > /tmp/peer-warmup.log 2>&1 &
log "build"
ours timeout $(( $(left) - 175 )) python3 benchmarks/probes/fa2_batch.py build \
  $([ "${TESTS:-0}" = 1 ] && echo --with-tests) > /tmp/build.log 2>&1
log "build exit $?: $(tail -1 /tmp/build.log)"
if [ "${TESTS:-0}" = 1 ]; then
  t=$(( $(left) - 170 )); [ $t -gt 90 ] && t=90
  log "tests (timeout ${t}s)"
  ours timeout $t python3 -m pytest tests/test_prefill.py -q -p no:cacheprovider --maxfail=30 \
    -rfEs > $OUT/pytest-prefill.log 2>&1 &
  tp=$!
  ours timeout $t python3 -m pytest tests/test_decode.py tests/test_cascade.py \
    tests/test_attention_plan.py -q -p no:cacheprovider --maxfail=30 -rfEs \
    > $OUT/pytest-rest.log 2>&1
  wait $tp
  for f in $OUT/pytest-*.log; do
    log "$(basename $f): $(tail -1 $f)"; grep -E "^(FAILED|ERROR)" $f | head -10 >> $OUT/log.txt
  done
fi
log "ours (peer ready: $(cat /tmp/peer-ready 2>/dev/null || echo no))"
ours timeout 80 python3 benchmarks/probes/fa2_batch.py ${OURS_MODE:-ours} $OUT/fa2-batch-ours.json \
  > /tmp/ours.log 2>&1; log "ours exit $?"; grep -E "^trace|us$" /tmp/ours.log >> $OUT/log.txt
wait  # the peer's builds
log "peer"
peer timeout 50 python3 benchmarks/probes/fa2_batch.py public $OUT/fa2-batch-peer.json \
  > /tmp/peer.log 2>&1; log "peer exit $?"; grep -E "us$" /tmp/peer.log >> $OUT/log.txt
if [ "${PEER_ROWS:-0}" = 1 ]; then
  ours timeout 45 python3 benchmarks/attention_vs_peer.py measure --label ours --cases \
    "$PEER_CASES" /tmp/attn-ours.json > /tmp/attn.log 2>&1
  peer timeout 45 python3 benchmarks/attention_vs_peer.py measure --label peer --cases \
    "$PEER_CASES" /tmp/attn-peer.json >> /tmp/attn.log 2>&1
  ours python3 benchmarks/attention_vs_peer.py merge $OUT/attention.json --ours \
    /tmp/attn-ours.json --peer /tmp/attn-peer.json --commit $commit >> $OUT/log.txt 2>&1 \
    || tail -5 /tmp/attn.log >> $OUT/log.txt
fi
if [ "${NCU:-0}" = 1 ]; then
  mkdir -p /tmp/ncu
  for c in ragged_fa2 single_fa2; do
    for side in ours peer; do
      [ $(left) -lt 25 ] && break
      $side timeout $(( $(left) - 8 )) ncu --clock-control none --section SpeedOfLight \
        --section LaunchStats --section Occupancy --section WarpStateStats \
        --section InstructionStats --section ComputeWorkloadAnalysis \
        --section MemoryWorkloadAnalysis_Tables \
        --kernel-name "regex:attention_kernel|Prefill" --launch-skip 2 --launch-count 1 \
        -o /tmp/ncu/$c-$side python3 benchmarks/probes/ncu_attention.py $c > /tmp/ncu/$c-$side.log 2>&1
      log "ncu $c $side exit $?"
      ncu --import /tmp/ncu/$c-$side.ncu-rep --page details > /tmp/ncu/$c-$side.txt 2>&1
    done
  done
  tar -czf $OUT/ncu.tgz -C /tmp ncu 2>/dev/null
fi
tail -n 3 /tmp/peer-warmup.log >> $OUT/log.txt
tar -czf $OUT/logs.tgz /tmp/build.log /tmp/ours.log /tmp/peer.log /tmp/peer-warmup.log \
  /tmp/attn.log 2>/dev/null
log "done"
