#!/usr/bin/env bash
# One call on the GPU machine for flashinfer.sampling: our first-call JIT time, the GPU tests,
# the benchmark (ours through run.py with ceilings, then ours and FlashInfer 0.7.2 with one
# timer; the peer's sampling module JIT-compiles in the background meanwhile).
# Writes at most 8 files to $OUT (the device tool's limit).
#   usage (device, from the repository root): [GPU_DIR=...] bash tools/gpu_sampling.sh COMMIT [pytest args]
set -uo pipefail
commit=${1:?commit}; shift
root=$PWD
gpu=${GPU_DIR:-.gpu}  # holds wheels/ and peer/ (the device checkout's .gpu)
log=$OUT/log.txt
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $gpu/wheels/*.whl || exit 1
export PYTHONUNBUFFERED=1 MAX_JOBS=16 FLASHINFER_CUDA_ARCH_LIST=9.0a
export PYTHONPATH=/tmp/site:$root/packages/flashinfer-python FLASHINFER_WORKSPACE_BASE=/tmp/fi-ws
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader | tee -a $log
# 1. First-call JIT of our module, alone on the machine.
python3 -c "import time; t = time.time(); import flashinfer.sampling as s; s.get_sampling_module(); print(f'sampling first-call JIT: {time.time() - t:.1f} s')" 2>&1 | tee -a $log
# 2. The peer's JIT in the background.
mkdir -p /tmp/peer && tar -xJf $gpu/peer/flashinfer-peer.tar.xz -C /tmp/peer
(cd benchmarks && PYTHONPATH=/tmp/peer:/tmp/site FLASHINFER_WORKSPACE_BASE=/tmp/peer-ws \
  python3 bench_sampling.py --warm --peer >/tmp/peer_warm.log 2>&1) &
peer=$!
# 3. Tests.
timeout ${TEST_TIMEOUT:-240} python3 -m pytest tests/test_sampling.py -q -p no:cacheprovider "$@" 2>&1 | tee $OUT/pytest.log | tail -25
# 4. Benchmarks: ours (harness, then the shared timer), A/B variants, the peer.
python3 benchmarks/run.py --commit "$commit" --ops sampling --out $OUT/run.json 2>&1 | tail -20 | tee -a $log
cd benchmarks
python3 bench_sampling.py --standalone $OUT/ours.json >>$log 2>&1
wait $peer; tail -3 /tmp/peer_warm.log | tee -a $log
PYTHONPATH=/tmp/peer:/tmp/site FLASHINFER_WORKSPACE_BASE=/tmp/peer-ws \
  python3 bench_sampling.py --standalone $OUT/peer.json --peer >>$log 2>&1
python3 bench_sampling.py --merge $OUT/ours.json $OUT/peer.json $OUT/run.json --out $OUT/bench.json
