#!/usr/bin/env bash
# One device call for flashinfer.topk, from the source tree: time our first-call JIT alone,
# start the peer's (FlashInfer 0.7.2) top-k build in the background, run tests/test_topk.py,
# benchmark ours (harness + the shared timer), then the peer with the same timer if it built.
#   usage (device, from the checkout): bash tools/gpu_topk.sh COMMIT
#   env: WHEELS (dir of the tvm-ffi/safetensors wheels), PEER_TAR, PEER_BUILD_S, TEST_TIMEOUT,
#        SAFE_DIR (another checkout, tested and benchmarked instead if this one's tests fail)
set -uo pipefail
commit=${1:?commit}
export PYTHONUNBUFFERED=1
python3 -m pip install -q --upgrade --no-index --no-deps --no-compile --target /tmp/site \
  "${WHEELS:-../wheels}"/*.whl || exit 1
export FLASHINFER_CUDA_ARCH_LIST=9.0a
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee $OUT/gpu.txt

tree_env() {  # $1: checkout dir, $2: workspace
  export PYTHONPATH=/tmp/site:$1/packages/flashinfer-python:$1/tests FLASHINFER_WORKSPACE_BASE=$2
}

first_call() {  # $1: log name
  /usr/bin/time -f "first call (JIT) wall %e s, %P cpu" python3 -c "
import torch, flashinfer
v, i = flashinfer.top_k(torch.randn(2, 1000, device='cuda'), 5)
torch.cuda.synchronize()" > $OUT/$1 2>&1
  tail -1 $OUT/$1
}

run_tests() {  # $1: tag
  timeout "${TEST_TIMEOUT:-170}" python3 -m pytest tests/test_topk.py -q -p no:cacheprovider \
    --maxfail=30 --junitxml=$OUT/junit$1.xml > $OUT/pytest$1.log 2>&1
  local rc=$?
  echo "pytest$1 exit $rc"; grep -E "^(FAILED|ERROR)|passed|failed" $OUT/pytest$1.log | head -20
  return $rc
}

bench() {  # $1: tag
  timeout 150 python3 benchmarks/run.py --commit "$commit$1" --ops topk --out $OUT/bench$1.json \
    > $OUT/bench$1.log 2>&1; echo "bench$1 exit $?"
  timeout 90 python3 benchmarks/bench_topk.py --out $OUT/ours$1.json > $OUT/ours$1.log 2>&1
  echo "ours$1 exit $?"; cat $OUT/ours$1.log
}

# 1. our first call: JIT of the topk module with nothing else running
tree_env "$PWD" /tmp/fi-ws
first_call jit.log
# 2. the peer's top-k module, in the background
mkdir -p /tmp/peer && tar -xJf "${PEER_TAR:-../peer/flashinfer-peer.tar.xz}" -C /tmp/peer
(cd /tmp && PYTHONPATH=/tmp/peer:/tmp/site FLASHINFER_WORKSPACE_BASE=/tmp/peer-ws \
  timeout "${PEER_BUILD_S:-330}" python3 -c "
import time; t = time.time()
import flashinfer.topk as t_
t_.get_topk_module(); print('peer topk module built in %.1f s' % (time.time() - t))
" > $OUT/peer_build.log 2>&1; echo "peer build exit $? after ${PEER_BUILD_S:-330} s limit" \
  >> $OUT/peer_build.log) &
peer=$!
# 3-4. tests, then ours: the harness (ceilings + cases) and the shared timer
if run_tests ""; then
  bench ""
elif [ -n "${SAFE_DIR:-}" ]; then
  echo "tests failed: testing and benchmarking $SAFE_DIR instead"
  here=$PWD; cd "$SAFE_DIR"; tree_env "$PWD" /tmp/fi-ws-safe
  first_call jit_safe.log
  run_tests _safe && bench _safe
  cd "$here"
fi
# 5. the peer, with the same timer, in its own process
wait $peer; tail -2 $OUT/peer_build.log
if grep -q "built in" $OUT/peer_build.log; then
  (cd /tmp && PYTHONPATH=/tmp/peer:/tmp/site FLASHINFER_WORKSPACE_BASE=/tmp/peer-ws \
    timeout 60 python3 $OLDPWD/benchmarks/bench_topk.py --peer --out $OUT/peer.json) \
    > $OUT/peer.log 2>&1
  echo "peer exit $?"; tail -12 $OUT/peer.log
fi
