#!/usr/bin/env bash
# One device call comparing ours with the peer (FlashInfer 0.7.2, ../shared/tools/peer-flashinfer.sh),
# from the repository root: our modules built in parallel while the peer's (the host-cost and
# attention cases) build in the background; the whole tests/ directory; then, on an idle
# machine, the host cost of ours and the peer and the headline attention cases of ours and the
# peer, each pair merged into one results file.
#   usage (device): bash tools/gpu_vs_peer.sh COMMIT
#   env: BUDGET (s, default 525); WHEELS (default .gpu/wheels), PEER_TAR (default
#        .gpu/peer/flashinfer-peer.tar.xz); OURS_SITE: an installed set to measure instead of the
#        source tree (e.g. a release's wheels; then no AOT and no tests); SKIP_TESTS=1
# Back in $OUT: log.txt, pytest.log, host-cost.json, attention.json (or each side's file where
# the merge could not run).
set -uo pipefail
commit=${1:?commit}
source tools/gpu_lib.sh; gpu_setup 525 peer
( peer nice -n 5 python3 benchmarks/host_cost.py warmup && echo hc-ready > /tmp/peer-hc
  peer nice -n 5 python3 benchmarks/attention_vs_peer.py warmup && echo ready > /tmp/peer-attn
) > /tmp/peer-warmup.log 2>&1 &
if [ -z "${OURS_SITE:-}" ]; then
  log "aot"
  ( time ours python3 -m flashinfer.aot --jobs 16 ) > /tmp/aot.log 2>&1; tail -4 /tmp/aot.log >> $OUT/log.txt
fi
if [ -z "${OURS_SITE:-}" ] && [ "${SKIP_TESTS:-0}" != 1 ]; then
  t=$(( $(left) - 170 )); log "tests (timeout ${t}s)"
  ours timeout $t python3 -m pytest tests -q -p no:cacheprovider --maxfail=60 \
    -rfEs > $OUT/pytest.log 2>&1
  log "pytest exit $?: $(tail -1 $OUT/pytest.log)"
  grep -E "^(FAILED|ERROR)" $OUT/pytest.log | head -30 >> $OUT/log.txt
fi
while [ ! -f /tmp/peer-hc ] && [ $(left) -gt 130 ]; do sleep 2; done
log "host cost"
ours python3 benchmarks/host_cost.py measure --label ours /tmp/hc-ours.json > /tmp/hc.log 2>&1
[ -f /tmp/peer-hc ] && peer python3 benchmarks/host_cost.py measure --label peer /tmp/hc-peer.json >> /tmp/hc.log 2>&1
ours python3 benchmarks/host_cost.py merge $OUT/host-cost.json --ours /tmp/hc-ours.json \
  --peer /tmp/hc-peer.json --commit $commit >> $OUT/log.txt 2>&1 || {
  tail -20 /tmp/hc.log >> $OUT/log.txt; cp /tmp/hc-*.json $OUT/ 2>/dev/null; }
# The peer's attention modules (its fa3 prefill among them) take minutes to build: wait for
# them while the budget still holds both measurements (about 90 s).
while [ ! -f /tmp/peer-attn ] && [ $(left) -gt 100 ]; do sleep 2; done
log "attention (peer ready: $(cat /tmp/peer-attn 2>/dev/null || echo no))"
[ $(left) -gt 60 ] && ours timeout $(( $(left) - 45 )) python3 benchmarks/attention_vs_peer.py \
  measure --label ours /tmp/attn-ours.json > /tmp/attn.log 2>&1
[ -f /tmp/peer-attn ] && [ $(left) -gt 40 ] && peer timeout $(( $(left) - 8 )) python3 \
  benchmarks/attention_vs_peer.py measure --label peer /tmp/attn-peer.json >> /tmp/attn.log 2>&1
ours python3 benchmarks/attention_vs_peer.py merge $OUT/attention.json --ours /tmp/attn-ours.json \
  --peer /tmp/attn-peer.json --commit $commit >> $OUT/log.txt 2>&1 || {
  tail -20 /tmp/attn.log >> $OUT/log.txt; cp /tmp/attn-*.json $OUT/ 2>/dev/null; }
tail -5 /tmp/peer-warmup.log >> $OUT/log.txt
log "done"
