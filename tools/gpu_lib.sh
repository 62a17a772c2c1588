# The prologue the timed device drivers (tools/gpu_*.sh) share; source it after
# `set -uo pipefail`, then call `gpu_setup DEFAULT_BUDGET_S [peer]`:
#   - finds the folder with wheels/ and peer/: GPU_DIR, else .gpu, else .. (a copy of a
#     worktree under the lead's .gpu/<name>); WHEELS and PEER_TAR override its parts;
#   - installs the wheels into /tmp/site and, with "peer", unpacks FlashInfer 0.7.2 into
#     /tmp/peer (a warm machine keeps /tmp: stale ready-flags are the caller's to clear);
#   - exports PYTHONUNBUFFERED, FLASHINFER_CUDA_ARCH_LIST (9.0a unless set) and MAX_JOBS (16);
#   - defines left (seconds left of BUDGET, default DEFAULT_BUDGET_S), log (a line stamped
#     with the call's seconds, to stdout and $OUT/log.txt), ours and peer (run a command with
#     our source tree, OURS_SITE first where set, or the peer on the path, each with its own
#     JIT workspace: two packages named flashinfer never share a process);
#   - writes the GPU's name and clocks into $OUT/log.txt.
gpu_setup() {
  : "${OUT:?set OUT}"
  GPU_T0=$(date +%s); BUDGET=${BUDGET:-${1:?default budget in seconds}}
  GPU_DIR=${GPU_DIR:-$( [ -d .gpu/wheels ] && echo .gpu || echo ..)}
  export PYTHONUNBUFFERED=1 FLASHINFER_CUDA_ARCH_LIST=${FLASHINFER_CUDA_ARCH_LIST:-9.0a}
  export MAX_JOBS=${MAX_JOBS:-16}
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site \
    "${WHEELS:-$GPU_DIR/wheels}"/*.whl || exit 1
  if [ "${2:-}" = peer ]; then
    mkdir -p /tmp/peer && tar -xJf "${PEER_TAR:-$GPU_DIR/peer/flashinfer-peer.tar.xz}" -C /tmp/peer
  fi
  OURS="${OURS_SITE:+$OURS_SITE:}/tmp/site:$PWD/packages/flashinfer-python:$PWD/tests"
  nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader \
    >> "$OUT/log.txt"
}
left() { echo $(( BUDGET - ($(date +%s) - GPU_T0) )); }
log() { echo "[$(( $(date +%s) - GPU_T0 ))s] $*" | tee -a "$OUT/log.txt"; }
ours() { PYTHONPATH=$OURS FLASHINFER_WORKSPACE_BASE=/tmp/fi-ws "$@"; }
peer() { PYTHONPATH=/tmp/peer:/tmp/site FLASHINFER_WORKSPACE_BASE=/tmp/peer-ws "$@"; }
