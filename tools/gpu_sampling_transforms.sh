#!/usr/bin/env bash
# One call on the GPU machine (<= 330 s) for flashinfer.sampling's transforms (softmax, top-p /
# top-k renorm, top-k mask) and chain speculative sampling: our first-call JIT (measured before
# the peer starts building), the GPU tests of tests/test_sampling.py and tests/test_topk.py
# while the peer (FlashInfer 0.7.2) builds its sampling module, the ceilings, then ours (the
# default kernels, and the transforms' persistent streaming kernel for the A/B) and the peer on
# the same cases with one timer (bench_sampling.time_us). At most 8 files in $OUT.
#   usage (device, from the checkout): bash tools/gpu_sampling_transforms.sh [pytest args]
set -uo pipefail
source tools/gpu_lib.sh
gpu_setup 330 peer
cases="copy 128,softmax,renorm,mask,chain"
log "$(ours python3 -c "import time; t = time.time(); import flashinfer.sampling as s; s.get_sampling_module(); print(f'sampling first-call JIT: {time.time() - t:.1f} s (alone)')" 2>&1 | tail -1)"
# The persistent kernel's test first, alone and short (a hang would cost the whole call).
timeout 60 env PYTHONPATH=$OURS FLASHINFER_WORKSPACE_BASE=/tmp/fi-ws python3 -m pytest \
  tests/test_sampling.py -q -p no:cacheprovider -x -k persistent > "$OUT/smoke.log" 2>&1
log "persistent smoke exit $?: $(tail -1 "$OUT/smoke.log")"
(cd benchmarks && peer timeout 250 python3 bench_sampling.py --warm --peer --only "$cases" > /tmp/peer_warm.log 2>&1; echo "peer warm-up exit $? at $(( $(date +%s) - GPU_T0 )) s" >> /tmp/peer_warm.log) &
peer_pid=$!
timeout "${TEST_TIMEOUT:-170}" env PYTHONPATH=$OURS FLASHINFER_WORKSPACE_BASE=/tmp/fi-ws \
  python3 -m pytest tests/test_sampling.py tests/test_topk.py -q -p no:cacheprovider --maxfail=20 "$@" \
  > "$OUT/pytest.log" 2>&1
log "pytest exit $?"; grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/pytest.log" | tail -25
cd benchmarks
timeout 60 env PYTHONPATH=$OURS python3 -c "import json, harness; json.dump(harness.measure_ceilings(), open('$OUT/ceilings.json', 'w'), indent=1)" >> "$OUT/log.txt" 2>&1
log "ceilings exit $?: $(tr -d '\n ' < "$OUT/ceilings.json" | cut -c1-160)"
timeout 50 env PYTHONPATH=$OURS FLASHINFER_WORKSPACE_BASE=/tmp/fi-ws python3 bench_sampling.py \
  --standalone "$OUT/ours.json" --only "$cases" 2>&1 | tee -a "$OUT/log.txt"
timeout 40 env PYTHONPATH=$OURS FLASHINFER_WORKSPACE_BASE=/tmp/fi-ws python3 bench_sampling.py \
  --standalone "$OUT/ours_persistent.json" --persistent --only "copy 128,softmax,renorm,mask" 2>&1 | tee -a "$OUT/log.txt"
wait $peer_pid; tail -2 /tmp/peer_warm.log | tee -a "$OUT/log.txt"
timeout $(( $(left) > 10 ? $(left) - 5 : 5 )) env PYTHONPATH=/tmp/peer:/tmp/site FLASHINFER_WORKSPACE_BASE=/tmp/peer-ws \
  python3 bench_sampling.py --standalone "$OUT/peer.json" --peer --only "$cases" 2>&1 | tee -a "$OUT/log.txt"
log "done"
