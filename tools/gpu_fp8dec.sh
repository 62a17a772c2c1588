#!/usr/bin/env bash
# One device call for the fp8 decode work (issue 21): the decode variants of
# benchmarks/tuning/fp8_decode.py compiled while the GPU tests run (one process per test group,
# JIT builds in parallel) and FlashInfer 0.7.2 (the peer) warms up, then on a quiet GPU the
# variants timed, then ours and the peer on benchmarks/attention_vs_peer.py's cases. To $OUT.
#   run from the repository root or a copy under .gpu/<name> (tools/gpu_lib.sh finds the wheels)
#   env: BUDGET (s, default 340), TESTS (pytest groups, ';'-separated), VARIANTS (names,
#        ';'-separated; default all), CASES / PEER_CASES (attention_vs_peer --cases for ours /
#        the peer; no CASES: no comparison), COMMIT (for the merged record), CAND_FLAGS and
#        CAND_TESTS (one more pytest group run with FLASHINFER_EXTRA_CUDAFLAGS=$CAND_FLAGS: a
#        tuning candidate's build under the tests)
set -uo pipefail
CASES=${CASES:-}; PEER_CASES=${PEER_CASES:-$CASES}
source tools/gpu_lib.sh; gpu_setup 340 ${CASES:+peer}
if [ -n "$CASES" ]; then
  ( peer nice -n 5 python3 benchmarks/attention_vs_peer.py warmup --cases "$PEER_CASES" > /tmp/peer-warm.log 2>&1; echo done > /tmp/peer-ready ) &
fi
IFS=';' read -ra V <<< "${VARIANTS:-}"
( ours python3 benchmarks/tuning/fp8_decode.py --build "${V[@]}" > /tmp/build.log 2>&1; echo "build exit $?" >> /tmp/build.log ) &
pids=($!)
IFS=';' read -ra G <<< "${TESTS:-tests/test_attention_fp8.py -k decode;tests/test_attention_fp8.py -k 'not decode';tests/test_decode.py}"
i=0
for g in "${G[@]}"; do
  ( eval ours timeout $(( $(left) - ${BENCH_S:-150} )) python3 -m pytest -q -p no:cacheprovider --maxfail=20 -rfE $g > /tmp/pytest-$i.log 2>&1; echo "exit $?" >> /tmp/pytest-$i.log ) &
  pids+=($!); i=$((i+1))
done
if [ -n "${CAND_FLAGS:-}" ]; then
  ( export FLASHINFER_EXTRA_CUDAFLAGS="$CAND_FLAGS"; eval ours timeout $(( $(left) - ${BENCH_S:-150} )) python3 -m pytest -q -p no:cacheprovider --maxfail=20 -rfE ${CAND_TESTS:-tests/test_attention_fp8.py -k decode} > /tmp/pytest-cand.log 2>&1; echo "exit $?" >> /tmp/pytest-cand.log ) &
  pids+=($!)
fi
wait "${pids[@]}"
for f in /tmp/pytest-*.log; do log "$f: $(tail -2 $f | tr '\n' ' ')"; grep -E "^(FAILED|ERROR)" $f | head -8 | tee -a $OUT/log.txt; done
log "$(tail -2 /tmp/build.log | tr '\n' ' ')"
log "sweep"
ours timeout $(( $(left) - ${AFTER_SWEEP_S:-10} )) python3 benchmarks/tuning/fp8_decode.py $OUT/fp8-sweep.json "${V[@]}" > /tmp/sweep.log 2>&1
log "sweep exit $?"; grep -E "^(  |==|check|ceilings)" /tmp/sweep.log | cut -c1-110 >> $OUT/log.txt
if [ -n "$CASES" ]; then
  log "attention ours"; ours timeout $(( $(left) - 60 )) python3 benchmarks/attention_vs_peer.py measure --label ours --cases "$CASES" /tmp/a-ours.json > /tmp/a.log 2>&1
  while [ ! -f /tmp/peer-ready ] && [ $(left) -gt 45 ]; do sleep 2; done
  log "attention peer (ready: $(cat /tmp/peer-ready 2>/dev/null))"; peer timeout $(( $(left) - 6 )) python3 benchmarks/attention_vs_peer.py measure --label peer --cases "$PEER_CASES" /tmp/a-peer.json >> /tmp/a.log 2>&1
  ours python3 benchmarks/attention_vs_peer.py merge $OUT/attention.json --ours /tmp/a-ours.json --peer /tmp/a-peer.json --commit ${COMMIT:-?} >> $OUT/log.txt 2>&1 || tail -20 /tmp/a.log >> $OUT/log.txt
  cp /tmp/a-*.json $OUT/ 2>/dev/null
fi
tar -czf $OUT/logs.tgz /tmp/pytest-*.log /tmp/build.log /tmp/sweep.log /tmp/a.log /tmp/peer-warm.log 2>/dev/null
log "done"
