#!/usr/bin/env bash
# The merge's validation call (one device call, from the repository root): AOT of the attention,
# page and cascade modules (16 jobs), the GPU test files, then ours and the peer (FlashInfer
# 0.7.2) on a few benchmarks/attention_vs_peer.py cases, merged into one record (ours alone,
# marked so, where the peer's JIT build did not finish: start with few peer cases; its fa3
# modules take minutes each). The peer builds after our AOT, not beside it, one process per
# case substring.
#   usage (device): COMMIT=abc1234 bash tools/gpu_validate.sh "CASE,SUBSTRINGS"
#   env: BUDGET (s, default 305), TESTS (pytest files, default the attention files), AOT_S
#        (most seconds for the AOT, default 150), MODULES (aot --only list, default every
#        attention module and page, cascade), TAIL_S (seconds kept for the timings after the
#        tests, default 75), ROUNDS (the cases timed that many times, interleaved; default 1),
#        PEER_FIRST=1 (the peer builds beside our AOT:
#        for cases whose peer modules are the long pole, e.g. its fa3 at head_dim 256)
# Back in $OUT: log.txt, pytest.log, junit.xml (what ran, also when the time limit stopped it),
# attention.json, a-ours.json / a-peer.json, logs.tgz.
set -uo pipefail
source tools/gpu_lib.sh; gpu_setup 305 peer
CASES="${1:?attention_vs_peer --cases}"
rm -f /tmp/peer-ready /tmp/a-ours.json /tmp/a-peer.json  # a warm machine keeps /tmp
peer_warmup() {  # one process per case substring: the peer's JIT builds run side by side
  ( i=0; IFS=,; for c in $CASES; do i=$((i + 1))
      peer nice -n 5 python3 benchmarks/attention_vs_peer.py warmup --cases "$c" \
        > /tmp/peer-warm-$i.log 2>&1 &
    done; wait; echo done > /tmp/peer-ready ) &
}
[ "${PEER_FIRST:-0}" = 1 ] && peer_warmup
mods=${MODULES:-$(ours python3 -c "
from flashinfer import aot
print(','.join(s.name for s in aot.registered_specs()
               if s.name.startswith('attention_') or s.name in ('page', 'cascade')))")}
log "aot ($(echo "$mods" | tr , '\n' | wc -l) modules)"
( time ours timeout ${AOT_S:-150} python3 -m flashinfer.aot --jobs 16 --only "$mods" ) > /tmp/aot.log 2>&1
log "aot: $(tail -4 /tmp/aot.log | tr '\n' ' ')"
[ "${PEER_FIRST:-0}" = 1 ] || peer_warmup
t=$(( $(left) - ${TAIL_S:-75} )); log "tests (timeout ${t}s)"
ours timeout -s INT $t python3 -m pytest -q -p no:cacheprovider --maxfail=40 -rfE \
  --junitxml=$OUT/junit.xml ${TESTS:-tests/test_sm90_head_dims.py tests/test_prefill.py \
  tests/test_attention_head_dims.py tests/test_decode.py tests/test_attention_fp8.py \
  tests/test_cascade.py tests/test_attention_spec_sinks.py tests/test_serving_engines.py \
  tests/test_package_layout.py} > $OUT/pytest.log 2>&1
log "pytest exit $?: $(tail -1 $OUT/pytest.log)"
grep -E "^(FAILED|ERROR)" $OUT/pytest.log | head -20 | tee -a $OUT/log.txt
log "ours"; ours timeout $(( $(left) - 40 )) python3 benchmarks/attention_vs_peer.py measure \
  --label ours --rounds ${ROUNDS:-1} --cases "$CASES" /tmp/a-ours.json > /tmp/a.log 2>&1; log "ours exit $?"
while [ ! -f /tmp/peer-ready ] && [ $(left) -gt 35 ]; do sleep 2; done
log "peer (ready: $(cat /tmp/peer-ready 2>/dev/null))"
[ -f /tmp/peer-ready ] && peer timeout $(( $(left) - 6 )) python3 benchmarks/attention_vs_peer.py \
  measure --label peer --rounds ${ROUNDS:-1} --cases "$CASES" /tmp/a-peer.json >> /tmp/a.log 2>&1
ours python3 benchmarks/attention_vs_peer.py merge $OUT/attention.json --ours /tmp/a-ours.json \
  --peer /tmp/a-peer.json --commit ${COMMIT:-?} >> $OUT/log.txt 2>&1 || tail -15 /tmp/a.log >> $OUT/log.txt
cp /tmp/a-*.json $OUT/ 2>/dev/null
tar -czf $OUT/logs.tgz /tmp/aot.log /tmp/a.log /tmp/peer-warm-*.log 2>/dev/null
log "done"
