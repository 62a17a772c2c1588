#!/usr/bin/env bash
# One device call: a few Nsight Compute metrics of one attention case (benchmarks/probes/
# ncu_attention.py CASE), ours and the peer (FlashInfer 0.7.2) in their own processes, every
# kernel of the case's warm-up calls (the attention kernel is the long one). The peer's JIT
# builds in the background while ours AOT-builds MODULES.
#   usage (device): MODULES=aot,names bash tools/gpu_ncu_vs_peer.sh CASE
#   env: METRICS (default: DRAM bytes read / written, L2 hit rate, duration), BUDGET (s, 200),
#        NCU_ARGS (more ncu options, e.g. "--section SpeedOfLight --section WarpStateStats")
# Back in $OUT: log.txt, ncu-ours.txt, ncu-peer.txt.
set -uo pipefail
source tools/gpu_lib.sh; gpu_setup 200 peer
case=${1:?case of benchmarks/probes/ncu_attention.py}
metrics=${METRICS:-dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct,gpu__time_duration.sum}
( peer python3 benchmarks/probes/ncu_attention.py $case > /tmp/peer-warm.log 2>&1
  echo "exit $?" > /tmp/peer-ready ) &
[ -n "${MODULES:-}" ] && ours python3 -m flashinfer.aot --jobs 16 --only "$MODULES" > /tmp/aot.log 2>&1
log "aot exit $?"
for side in ours peer; do
  [ $side = peer ] && while [ ! -f /tmp/peer-ready ] && [ $(left) -gt 40 ]; do sleep 1; done
  $side timeout $(( $(left) - 10 )) ncu --clock-control none ${NCU_ARGS:-} --metrics "$metrics" \
    python3 benchmarks/probes/ncu_attention.py $case > $OUT/ncu-$side.txt 2>&1
  log "ncu $side exit $?: $(grep -c gpu__time_duration $OUT/ncu-$side.txt) kernels"
done
