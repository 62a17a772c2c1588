#!/usr/bin/env bash
# One device call for issue 22's FA2 rows: our modules (the GPU tests' attention, cascade and
# page modules and benchmarks/tuning/fa2_tiles.py's variants) built 16 at a time while the peer
# (FlashInfer 0.7.2) and a base tree (the package before the change, at base/) build theirs in
# the background; the attention GPU tests; then, on an idle GPU, the variants (fa2_tiles.py) and
# the public rows of ours, the base tree and the peer (attention_vs_peer.py), merged.
#   usage (device, from the repository root): bash tools/gpu_fa2.sh COMMIT
#   env: BUDGET (s, default 345), TEST_S (most seconds for the tests, default 80)
# Back in $OUT: log.txt, pytest-prefill.log, pytest-rest.log, fa2-tiles.json, attention.json (ours vs the peer),
# attention-base.json (the base tree vs the peer).
set -uo pipefail
commit=${1:?commit}
source tools/gpu_lib.sh; gpu_setup 345 peer
rm -f /tmp/peer-ready /tmp/base-ready  # a warm machine keeps /tmp from an earlier call
base() { PYTHONPATH=/tmp/site:$PWD/base/packages/flashinfer-python:$PWD/tests FLASHINFER_WORKSPACE_BASE=/tmp/base-ws "$@"; }
PEER_CASES="batch decode,fa2,single decode"
( peer nice -n 5 python3 benchmarks/attention_vs_peer.py warmup --cases "$PEER_CASES" \
    && echo ready > /tmp/peer-ready ) > /tmp/peer-warmup.log 2>&1 &
( base nice -n 5 python3 benchmarks/attention_vs_peer.py warmup && echo ready > /tmp/base-ready
) > /tmp/base-warmup.log 2>&1 &
log "build"
ours timeout $(( $(left) - 215 )) python3 benchmarks/tuning/fa2_tiles.py build --with-tests \
  > /tmp/build.log 2>&1
log "build exit $?: $(tail -1 /tmp/build.log)"
t=$(( $(left) - 145 )); [ $t -gt ${TEST_S:-80} ] && t=${TEST_S:-80}
log "tests (timeout ${t}s)"
# Two processes side by side (the GPU is not timed here): test_prefill.py, and the rest.
ours timeout $t python3 -m pytest tests/test_prefill.py -q -p no:cacheprovider --maxfail=30 \
  -rfEs > $OUT/pytest-prefill.log 2>&1 &
tp=$!
ours timeout $t python3 -m pytest tests/test_decode.py tests/test_cascade.py \
  tests/test_attention_plan.py tests/test_attention_validation.py tests/test_package_layout.py \
  -q -p no:cacheprovider --maxfail=30 -rfEs > $OUT/pytest-rest.log 2>&1
wait $tp
for f in $OUT/pytest-*.log; do
  log "$(basename $f): $(tail -1 $f)"; grep -E "^(FAILED|ERROR)" $f | head -10 >> $OUT/log.txt
done
log "variants (peer ready: $(cat /tmp/peer-ready 2>/dev/null || echo no), base ready: $(cat /tmp/base-ready 2>/dev/null || echo no))"
ours timeout $(( $(left) - 85 )) python3 benchmarks/tuning/fa2_tiles.py measure $OUT/fa2-tiles.json \
  > /tmp/tiles.log 2>&1; log "fa2_tiles exit $?"; grep -E "check|us$" /tmp/tiles.log >> $OUT/log.txt
log "public rows"
ours timeout 38 python3 benchmarks/attention_vs_peer.py measure --label ours /tmp/attn-ours.json \
  > /tmp/attn.log 2>&1
[ -f /tmp/peer-ready ] && peer timeout 35 python3 benchmarks/attention_vs_peer.py measure \
  --label peer --cases "$PEER_CASES" /tmp/attn-peer.json >> /tmp/attn.log 2>&1
[ -f /tmp/base-ready ] && [ $(left) -gt 15 ] && base timeout $(( $(left) - 6 )) python3 \
  benchmarks/attention_vs_peer.py measure --label base /tmp/attn-base.json >> /tmp/attn.log 2>&1
for side in ours base; do
  ours python3 benchmarks/attention_vs_peer.py merge $OUT/attention-$side.json \
    --ours /tmp/attn-$side.json --peer /tmp/attn-peer.json --commit $commit >> $OUT/log.txt 2>&1 \
    || { tail -5 /tmp/attn.log >> $OUT/log.txt; cp /tmp/attn-$side.json $OUT/ 2>/dev/null; }
done
tail -n 3 /tmp/peer-warmup.log /tmp/base-warmup.log >> $OUT/log.txt
tar -czf $OUT/logs.tgz /tmp/build.log /tmp/tiles.log /tmp/attn.log /tmp/peer-warmup.log \
  /tmp/base-warmup.log 2>/dev/null
log "done"
