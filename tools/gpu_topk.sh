#!/usr/bin/env bash
# One device call for flashinfer.topk, from the source tree: time our first-call JIT alone,
# start the peer's (FlashInfer 0.7.2) top-k build in the background, run tests/test_topk.py,
# benchmark ours (harness + the shared timer), then the peer with the same timer if it built.
#   usage (device, from the checkout): bash tools/gpu_topk.sh COMMIT
#   env: WHEELS (dir of the tvm-ffi/safetensors wheels), PEER_TAR, PEER_BUILD_S, TEST_TIMEOUT
set -uo pipefail
commit=${1:?commit}
export PYTHONUNBUFFERED=1
python3 -m pip install -q --upgrade --no-index --no-deps --no-compile --target /tmp/site \
  "${WHEELS:-../wheels}"/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD/packages/flashinfer-python:$PWD/tests
export FLASHINFER_WORKSPACE_BASE=/tmp/fi-ws FLASHINFER_CUDA_ARCH_LIST=9.0a
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee $OUT/gpu.txt
# 1. our first call: JIT of the topk module with nothing else running
/usr/bin/time -f "first call (JIT) wall %e s, %P cpu" python3 -c "
import torch, flashinfer
v, i = flashinfer.top_k(torch.randn(2, 1000, device='cuda'), 5)
torch.cuda.synchronize()" > $OUT/jit.log 2>&1
tail -2 $OUT/jit.log
# 2. the peer's top-k module, in the background
mkdir -p /tmp/peer && tar -xJf "${PEER_TAR:-../peer/flashinfer-peer.tar.xz}" -C /tmp/peer
(cd /tmp && PYTHONPATH=/tmp/peer:/tmp/site FLASHINFER_WORKSPACE_BASE=/tmp/peer-ws \
  timeout "${PEER_BUILD_S:-330}" python3 -c "
import time; t = time.time()
import flashinfer.topk as t_
t_.get_topk_module(); print('peer topk module built in %.1f s' % (time.time() - t))
" > $OUT/peer_build.log 2>&1; echo "peer build exit $?" >> $OUT/peer_build.log) &
peer=$!
# 3. tests
timeout "${TEST_TIMEOUT:-170}" python3 -m pytest tests/test_topk.py -q -p no:cacheprovider \
  --maxfail=30 --junitxml=$OUT/junit.xml > $OUT/pytest.log 2>&1
echo "pytest exit $?"; grep -E "^(FAILED|ERROR)|passed|failed" $OUT/pytest.log | head -30
# 4. ours: the harness (ceilings + cases), then the shared timer
timeout 150 python3 benchmarks/run.py --commit "$commit" --ops topk --out $OUT/bench.json \
  > $OUT/bench.log 2>&1; echo "bench exit $?"
timeout 90 python3 benchmarks/bench_topk.py --out $OUT/ours.json > $OUT/ours.log 2>&1
echo "ours exit $?"; cat $OUT/ours.log
# 5. the peer, with the same timer, in its own process
wait $peer; cat $OUT/peer_build.log | tail -3
if grep -q "built in" $OUT/peer_build.log; then
  (cd /tmp && PYTHONPATH=/tmp/peer:/tmp/site FLASHINFER_WORKSPACE_BASE=/tmp/peer-ws \
    timeout 90 python3 $OLDPWD/benchmarks/bench_topk.py --peer --out $OUT/peer.json) \
    > $OUT/peer.log 2>&1
  echo "peer exit $?"; cat $OUT/peer.log | tail -12
fi
