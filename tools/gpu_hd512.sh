#!/usr/bin/env bash
# head_dim 512 on the FA2 kernel (issue 21), one device call from the repository root: AOT of
# the wide-head attention modules (512 and 192 / 128, with page and cascade), their tests, then
# the two hd512 rows of benchmarks/attention_vs_peer.py for ours, for ours built with tuning
# macros (A/B, JIT builds started in the background at the beginning), and for the peer
# (FlashInfer 0.7.2, warm-up one process per case from the start), merged into one record.
#   usage (device): COMMIT=abc1234 bash tools/gpu_hd512.sh
#   env: BUDGET (s, default 310); VARIANTS: "label|cases|macros;..." (default below; "none":
#        ours and the peer only); RESERVE: seconds kept after the tests for the timings
#        (default 150), PEER_RESERVE after ours for the peer (default: RESERVE - 50)
# Back in $OUT: log.txt, pytest.log, attention.json, a-ours.json, a-peer.json, logs.tgz (every
# label's a-*.json and the build and timing logs).
set -uo pipefail
source tools/gpu_lib.sh; gpu_setup 310 peer
DEC="hd512 16 x kv 8192 (tensor"; PRE="paged prefill hd512"; CASES="$DEC,$PRE"
VARIANTS=${VARIANTS:-"kv32|$PRE|-DFLASHINFER_ATTENTION_CTA1_MMA_KV=2;streams3|$DEC|-DFLASHINFER_ATTENTION_CTA0_WARPS_KV_WIDE=3"}
rm -f /tmp/peer-ready /tmp/a-*.json /tmp/rope.log
( i=0; for c in "$DEC" "$PRE"; do i=$((i + 1))
    peer nice -n 5 python3 benchmarks/attention_vs_peer.py warmup --cases "$c" \
      > /tmp/peer-warm-$i.log 2>&1 &
  done; wait; echo done > /tmp/peer-ready ) &
# Our variants' JIT builds (the macros are part of the JIT cache key), side by side.
VS=(); [ "$VARIANTS" = none ] || IFS=';' read -ra VS <<< "$VARIANTS"
RESERVE=${RESERVE:-150}
for v in "${VS[@]+"${VS[@]}"}"; do IFS='|' read -r label cases flags <<< "$v"
  FLASHINFER_EXTRA_CUDAFLAGS="$flags" ours nice -n 5 python3 benchmarks/attention_vs_peer.py \
    warmup --cases "$cases" > /tmp/warm-$label.log 2>&1 &
done
# The RoPE variants the tests build (not registered for AOT), one process each, beside the AOT.
for v in "'causal', 'ROPE_LLAMA', False" "'none', 'ROPE_LLAMA', True"; do
  ours python3 -c "from flashinfer.attention.runtime import get_attention_module
from flashinfer.jit.attention import AttentionVariant
get_attention_module(AttentionVariant('float16', 'float16', 512, $v))" >> /tmp/rope.log 2>&1 &
done
mods=$(ours python3 -c "
from flashinfer import aot
print(','.join(s.name for s in aot.registered_specs()
               if '_d512_' in s.name or '_d192_' in s.name or s.name in ('page', 'cascade')))")
log "aot ($(echo "$mods" | tr , '\n' | wc -l) modules)"
( time ours timeout 150 python3 -m flashinfer.aot --jobs 16 --only "$mods" ) > /tmp/aot.log 2>&1
log "aot: $(tail -4 /tmp/aot.log | tr '\n' ' ')"
t=$(( $(left) - RESERVE )); log "tests (timeout ${t}s)"
ours timeout -s INT $t python3 -m pytest -q -p no:cacheprovider --maxfail=20 -rfE \
  tests/test_attention_head_dims.py > $OUT/pytest.log 2>&1
log "pytest exit $?: $(tail -1 $OUT/pytest.log)"
grep -E "^(FAILED|ERROR)" $OUT/pytest.log | head -20 | tee -a $OUT/log.txt
log "ours"; ours timeout $(( $(left) - ${PEER_RESERVE:-$((RESERVE - 50))} )) python3 \
  benchmarks/attention_vs_peer.py measure --label ours --cases "$CASES" /tmp/a-ours.json > /tmp/a.log 2>&1; log "ours exit $?"
wait_peer() { while [ ! -f /tmp/peer-ready ] && [ $(left) -gt 20 ]; do sleep 2; done; }
wait_peer; log "peer (ready: $(cat /tmp/peer-ready 2>/dev/null))"
[ -f /tmp/peer-ready ] && peer timeout $(( $(left) - 8 )) python3 \
  benchmarks/attention_vs_peer.py measure --label peer --cases "$CASES" /tmp/a-peer.json \
  >> /tmp/a.log 2>&1; log "peer exit $?"
ours python3 benchmarks/attention_vs_peer.py merge $OUT/attention.json --ours /tmp/a-ours.json \
  --peer /tmp/a-peer.json --commit ${COMMIT:-?} >> $OUT/log.txt 2>&1 || tail -15 /tmp/a.log >> $OUT/log.txt
for v in "${VS[@]+"${VS[@]}"}"; do IFS='|' read -r label cases flags <<< "$v"
  [ $(left) -lt 25 ] && { log "no time for $label"; continue; }
  FLASHINFER_EXTRA_CUDAFLAGS="$flags" ours timeout $(( $(left) - 8 )) python3 \
    benchmarks/attention_vs_peer.py measure --label "$label" --cases "$cases" \
    /tmp/a-$label.json >> /tmp/a.log 2>&1; log "$label exit $?"
done
ours python3 - <<'EOF' 2>&1 | tee -a $OUT/log.txt
import glob, json
for f in sorted(glob.glob("/tmp/a-*.json")):
    d = json.load(open(f))
    for r in d["rows"]:
        print(f"{d['label']:9s} {r['name'][:48]:48s} {r['median_us']:9.1f} us")
EOF
cp /tmp/a-ours.json /tmp/a-peer.json $OUT/ 2>/dev/null
tar -czf $OUT/logs.tgz /tmp/a-*.json /tmp/rope.log /tmp/aot.log /tmp/a.log /tmp/peer-warm-*.log /tmp/warm-*.log 2>/dev/null
log "done"
