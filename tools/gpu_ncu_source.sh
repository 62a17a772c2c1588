#!/usr/bin/env bash
# One device call: Nsight Compute's source page (every SASS instruction's executed count and
# stall samples) of one attention case's kernel, ours and the peer (FlashInfer 0.7.2) in their
# own processes, one launch each (the second of the case's warm-up calls). The peer's JIT builds
# in the background while ours AOT-builds MODULES. Read them with
# benchmarks/probes/ncu_source_counts.py.
#   usage (device): MODULES=aot,names bash tools/gpu_ncu_source.sh CASE
#   env: BUDGET (s, default 400); KERNELS (ncu --kernel-name regex, default the Hopper and FA2
#        kernels of ours and the peer's prefill kernels)
# Back in $OUT: log.txt, src-ours.csv.gz, src-peer.csv.gz, raw-ours.csv.gz, raw-peer.csv.gz.
set -uo pipefail
source tools/gpu_lib.sh; gpu_setup 400 peer
case=${1:?case of benchmarks/probes/ncu_attention.py}
kernels=${KERNELS:-"attention_kernel|PrefillWithKVCacheKernel|BatchPrefillWith"}
rm -f /tmp/peer-ready
( peer python3 benchmarks/probes/ncu_attention.py $case > /tmp/peer-warm.log 2>&1
  echo "exit $?" > /tmp/peer-ready ) &
[ -n "${MODULES:-}" ] && ours python3 -m flashinfer.aot --jobs 16 --only "$MODULES" > /tmp/aot.log 2>&1
log "aot exit $?"
while [ ! -f /tmp/peer-ready ] && [ $(left) -gt 150 ]; do sleep 1; done
for side in ours peer; do
  $side timeout 100 ncu --clock-control none --kernel-name regex:"$kernels" --launch-skip 1 \
    --launch-count 1 --section SourceCounters --section WarpStateStats -f -o /tmp/rep-$side \
    python3 benchmarks/probes/ncu_attention.py $case > /tmp/ncu-$side.log 2>&1
  log "ncu $side exit $?"
  ncu --import /tmp/rep-$side.ncu-rep --page source --csv --print-source sass > $OUT/src-$side.csv
  ncu --import /tmp/rep-$side.ncu-rep --page raw --csv > $OUT/raw-$side.csv 2>/dev/null
  log "source page $side: $(wc -c < $OUT/src-$side.csv) bytes"
done
gzip -f $OUT/src-*.csv $OUT/raw-*.csv
log "done"
