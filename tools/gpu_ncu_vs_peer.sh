#!/usr/bin/env bash
# One device call: Nsight Compute on one attention case (benchmarks/probes/ncu_attention.py
# CASE), ours and the peer (FlashInfer 0.7.2) in their own processes. The peer's JIT builds in
# the background while ours AOT-builds MODULES. Two modes:
#   - metrics (default): a few metrics of every kernel of the case's warm-up calls (the
#     attention kernel is the long one);
#   - SOURCE=1: the source page of the attention kernel's second launch, every SASS
#     instruction's executed count and stall samples, as CSV (read them with
#     benchmarks/probes/ncu_source_counts.py).
#   usage (device): MODULES=aot,names [SOURCE=1] bash tools/gpu_ncu_vs_peer.sh CASE
#   env: METRICS (default: DRAM bytes read / written, L2 hit rate, duration), NCU_ARGS (more ncu
#        options, e.g. "--section SpeedOfLight --section WarpStateStats"), BUDGET (s, 200;
#        SOURCE=1: 400), KERNELS (SOURCE=1: ncu --kernel-name regex, default the Hopper and FA2
#        kernels of ours and the peer's prefill kernels)
# Back in $OUT: log.txt and ncu-ours.txt, ncu-peer.txt (metrics) or src-ours.csv.gz,
# src-peer.csv.gz, raw-ours.csv.gz, raw-peer.csv.gz (SOURCE=1).
set -uo pipefail
source tools/gpu_lib.sh
if [ "${SOURCE:-0}" = 1 ]; then gpu_setup 400 peer; else gpu_setup 200 peer; fi
case=${1:?case of benchmarks/probes/ncu_attention.py}
metrics=${METRICS:-dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct,gpu__time_duration.sum}
rm -f /tmp/peer-ready  # a warm machine keeps /tmp
( peer python3 benchmarks/probes/ncu_attention.py $case > /tmp/peer-warm.log 2>&1
  echo "exit $?" > /tmp/peer-ready ) &
[ -n "${MODULES:-}" ] && ours python3 -m flashinfer.aot --jobs 16 --only "$MODULES" > /tmp/aot.log 2>&1
log "aot exit $?"
for side in ours peer; do
  [ $side = peer ] && while [ ! -f /tmp/peer-ready ] && [ $(left) -gt 40 ]; do sleep 1; done
  if [ "${SOURCE:-0}" = 1 ]; then
    $side timeout $(( $(left) - 20 )) ncu --clock-control none \
      --kernel-name regex:"${KERNELS:-attention_kernel|PrefillWithKVCacheKernel|BatchPrefillWith}" \
      --launch-skip 1 --launch-count 1 --section SourceCounters --section WarpStateStats \
      ${NCU_ARGS:-} -f -o /tmp/rep-$side python3 benchmarks/probes/ncu_attention.py $case \
      > /tmp/ncu-$side.log 2>&1
    log "ncu $side exit $?"
    ncu --import /tmp/rep-$side.ncu-rep --page source --csv --print-source sass > $OUT/src-$side.csv
    ncu --import /tmp/rep-$side.ncu-rep --page raw --csv > $OUT/raw-$side.csv 2>/dev/null
    log "source page $side: $(wc -c < $OUT/src-$side.csv) bytes"
  else
    $side timeout $(( $(left) - 10 )) ncu --clock-control none ${NCU_ARGS:-} --metrics "$metrics" \
      python3 benchmarks/probes/ncu_attention.py $case > $OUT/ncu-$side.txt 2>&1
    log "ncu $side exit $?: $(grep -c gpu__time_duration $OUT/ncu-$side.txt) kernels"
  fi
done
[ "${SOURCE:-0}" = 1 ] && gzip -f $OUT/src-*.csv $OUT/raw-*.csv
log "done"
