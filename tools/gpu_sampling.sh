#!/usr/bin/env bash
# One call on the GPU machine for flashinfer.sampling (<= 360 s): the peer's (FlashInfer 0.7.2)
# top-k and sampling modules build in the background from the start; our first-call JIT, the GPU
# tests, the benchmark (ours through run.py with ceilings, ours and the peer with one timer, our
# one-CTA-per-row path on a few cases), and the peer's top-k if its module built in time.
# Workspaces live in KEEP_DIR, so a second call on the same (warm) machine reuses the peer's
# builds. Writes at most 8 files to $OUT (the device tool's limit).
#   usage (device, from the checkout): GPU_DIR=<dir with wheels/ and peer/> \
#     KEEP_DIR=<persistent dir> bash tools/gpu_sampling.sh COMMIT [pytest args]
# Optional: SKIP_PEER_TOPK=1 (do not build the peer's top-k module), SKIP_ONE_CTA=1 (no one-CTA
# path benchmark), TEST_TIMEOUT / OURS_TIMEOUT / RUN_TIMEOUT (seconds) to fit a shorter call.
set -uo pipefail
commit=${1:?commit}; shift
root=$PWD
gpu=${GPU_DIR:-.gpu}
keep=${KEEP_DIR:-/tmp}
log=$OUT/log.txt
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $gpu/wheels/*.whl || exit 1
export PYTHONUNBUFFERED=1 MAX_JOBS=16 FLASHINFER_CUDA_ARCH_LIST=9.0a
export PYTHONPATH=/tmp/site:$root/packages/flashinfer-python FLASHINFER_WORKSPACE_BASE=$keep/fi-ws
peer_env=(env PYTHONPATH=/tmp/peer:/tmp/site FLASHINFER_WORKSPACE_BASE=$keep/peer-ws)
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader | tee -a $log
# 0. The peer: its top-k module (did not build in 330 s before), then its sampling module.
mkdir -p /tmp/peer && [ -d /tmp/peer/flashinfer ] || tar -xJf $gpu/peer/flashinfer-peer.tar.xz -C /tmp/peer
[ -n "${SKIP_PEER_TOPK:-}" ] && echo "peer topk: skipped (SKIP_PEER_TOPK; its JIT did not finish in 5+ min before)" > /tmp/peer_topk.log || \
(cd /tmp && "${peer_env[@]}" timeout $((${PEER_TOPK_END:-315} - SECONDS)) python3 -c "
import time; t = time.time()
import flashinfer.topk as t_
t_.get_topk_module(); print('peer topk module built in %.1f s' % (time.time() - t))
" > /tmp/peer_topk.log 2>&1; echo "peer topk build exit $? at ${SECONDS} s of the call" >> /tmp/peer_topk.log) &
ptopk=$!
(cd benchmarks && "${peer_env[@]}" python3 bench_sampling.py --warm --peer >/tmp/peer_warm.log 2>&1) &
peer=$!
# 1. Our first-call JIT (the peer's builds run alongside).
python3 -c "import time; t = time.time(); import flashinfer.sampling as s; s.get_sampling_module(); print(f'sampling first-call JIT: {time.time() - t:.1f} s (peer builds alongside)')" 2>&1 | tee -a $log
# 2. Tests.
timeout ${TEST_TIMEOUT:-150} python3 -m pytest tests/test_sampling.py -q -p no:cacheprovider --maxfail=25 "$@" > $OUT/pytest.log 2>&1
echo "pytest exit $? at ${SECONDS} s"; grep -E "^(FAILED|ERROR)|passed|failed" $OUT/pytest.log | head -30
# 3. Benchmarks: ours with the shared timer, the one-CTA path, the harness (ceilings), the peer.
cd benchmarks
timeout ${OURS_TIMEOUT:-70} python3 bench_sampling.py --standalone $OUT/ours.json >>$log 2>&1; echo "ours exit $? at ${SECONDS} s"
[ -z "${SKIP_ONE_CTA:-}" ] && timeout 40 python3 bench_sampling.py --standalone /tmp/one_cta.json --no-cluster \
  --only "top_p_sampling_from_probs 128,sampling_from_probs,top_k_sampling,softmax" >>$log 2>&1
echo "one-CTA path exit $? at ${SECONDS} s"
timeout ${RUN_TIMEOUT:-90} python3 run.py --commit "$commit" --ops sampling --out $OUT/run.json >/tmp/run.log 2>&1
echo "run.py exit $? at ${SECONDS} s"; tail -4 /tmp/run.log
wait $peer; tail -2 /tmp/peer_warm.log | tee -a $log
timeout 70 "${peer_env[@]}" python3 bench_sampling.py --standalone $OUT/peer.json --peer >>$log 2>&1
echo "peer exit $? at ${SECONDS} s"
python3 bench_sampling.py --merge $OUT/ours.json $OUT/peer.json $OUT/run.json --out $OUT/bench.json 2>&1 | cut -c1-160
# 4. The peer's top-k, if it built: ours and theirs on the top-k shapes with one timer.
wait $ptopk; tail -2 /tmp/peer_topk.log | tee -a $log
if grep -q "built in" /tmp/peer_topk.log && [ $SECONDS -lt 320 ]; then
  cd $root
  timeout $((345 - SECONDS)) python3 benchmarks/bench_topk.py --out /tmp/topk_ours.json >/tmp/topk_ours.log 2>&1
  (cd /tmp && timeout $((350 - SECONDS)) "${peer_env[@]}" python3 $root/benchmarks/bench_topk.py --peer --out /tmp/topk_peer.json) >/tmp/topk_peer.log 2>&1
  tail -12 /tmp/topk_ours.log /tmp/topk_peer.log
fi
cd $root
cp /tmp/peer_topk.log /tmp/peer_warm.log /tmp/run.log /tmp/one_cta.json /tmp/topk_*.json /tmp/topk_*.log $OUT/ 2>/dev/null
(cd $OUT && tar -czf extra.tgz peer_topk.log peer_warm.log run.log one_cta.json topk_* 2>/dev/null; rm -f peer_topk.log peer_warm.log run.log one_cta.json topk_*)
echo "done at ${SECONDS} s"
