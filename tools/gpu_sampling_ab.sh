#!/usr/bin/env bash
# One call on the GPU machine for a change to the sampling draws: this tree (the branch, under
# the lead's checkout as .gpu/<name>), optional variant trees beside it, the checkout it sits in
# (the baseline: the same commit without the change) and FlashInfer 0.7.2, one timer
# (bench_sampling.time_us), one process each. Order: the peer's JIT in the background (unless
# its workspace is already there), the first-call JIT of this tree (timed; the others build
# alongside), the read/copy ceilings, the sampling GPU tests of this tree and each variant,
# then baseline / this tree / variants / peer / this tree again on the sampling cases.
#   usage (device, from the checkout root):
#     OUT=... [VARIANTS="name:dir ..."] [TEST_TREES="ours ..."] [BUDGET=s] bash .gpu/<name>/tools/gpu_sampling_ab.sh
# Writes log.txt, ceilings.json, pytest-<tree>.log and <tree>.json per timed tree.
set -uo pipefail
root=$PWD
cd "$(dirname "$0")/.." || exit 1
here=$PWD
source tools/gpu_lib.sh
gpu_setup 320
[ -d /tmp/peer/flashinfer ] || { mkdir -p /tmp/peer && tar -xJf "$GPU_DIR/peer/flashinfer-peer.tar.xz" -C /tmp/peer; }
CASES=${CASES:-"sampling_from,top_p_sampling,top_k_sampling,min_p_sampling,top_k_top_p_sampling"}
# tree name -> source dir, JIT workspace
declare -A DIR=([ours]=$here [base]=$root) WS=([ours]=/tmp/fi-ws-$$ [base]=/tmp/base-ws)
names=(ours)
for v in ${VARIANTS:-}; do
  n=${v%%:*}; DIR[$n]=$root/${v#*:}; WS[$n]=/tmp/ws-$n-$$; names+=("$n")
done
env_of() {  # env_of NAME: the environment of tree NAME (its package, its JIT workspace)
  echo "PYTHONPATH=/tmp/site:${DIR[$1]}/packages/flashinfer-python:${DIR[$1]}/tests FLASHINFER_WORKSPACE_BASE=${WS[$1]}"
}
in_tree() { local n=$1; shift; env $(env_of $n) "$@"; }
# The background builds run at the lowest CPU priority. At full priority, single rows of the
# first benches measured 2-3x their time in one call of wave 22 (the peer's nvcc jobs on every
# core, most likely delaying the host's graph launch between the timer's two events).
(cd benchmarks && peer nice -n 19 python3 bench_sampling.py --warm --peer --only "$CASES" >/tmp/peer_warm.log 2>&1
 echo "peer warm exit $?" >>/tmp/peer_warm.log) &
for n in base "${names[@]:1}"; do
  (in_tree $n nice -n 19 python3 -c "import flashinfer.sampling as s; s.get_sampling_module()" >/tmp/jit-$n.log 2>&1
   echo "jit $n exit $?" >>/tmp/jit-$n.log) &
done
in_tree ours python3 -c "import time; t = time.time(); import flashinfer.sampling as s; s.get_sampling_module(); print(f'sampling first-call JIT: {time.time() - t:.1f} s (the peer, the baseline and the variants build alongside)')" 2>&1 | tail -2 | tee -a $OUT/log.txt
if [ ! -s /tmp/ceilings.json ]; then
  in_tree ours python3 -c "
import json, sys; sys.path.insert(0, 'benchmarks'); import harness
json.dump(harness.measure_ceilings(), open('/tmp/ceilings.json', 'w'), indent=1)" >/tmp/ceil.log 2>&1
fi
cp /tmp/ceilings.json $OUT/ 2>/dev/null; log "ceilings $(tr -d '\n ' < /tmp/ceilings.json | cut -c1-120)"
for n in ${TEST_TREES:-${names[@]}}; do  # TEST_TREES: the trees to test (default all)
  while [ $n != ours ] && ! grep -q "jit $n exit" /tmp/jit-$n.log; do sleep 1; done
  (cd ${DIR[$n]} && timeout ${TEST_TIMEOUT:-60} env $(env_of $n) python3 -m pytest tests/test_sampling.py -q -p no:cacheprovider --maxfail=25) >$OUT/pytest-$n.log 2>&1
  log "pytest $n exit $? $(tail -1 $OUT/pytest-$n.log)"; grep -E "^(FAILED|ERROR)" $OUT/pytest-$n.log | head -8
done
bench() {  # bench NAME OUTNAME [--peer]
  local n=$1 o=$2; shift 2
  [ "$(left)" -gt 15 ] || { log "no time for $o"; return; }
  (cd $here/benchmarks && timeout $(( $(left) - 8 )) env $(env_of $n) python3 bench_sampling.py --standalone $OUT/$o.json --only "$CASES" "$@") >>$OUT/log.txt 2>&1
  log "bench $o exit $?"
}
grep -q "jit base exit" /tmp/jit-base.log || sleep 5
bench base base
for n in "${names[@]}"; do bench $n $n; done
# The peer's sampling JIT takes ~2 minutes: wait for it while the budget allows.
while ! grep -q "peer warm exit" /tmp/peer_warm.log && [ "$(left)" -gt 60 ]; do sleep 2; done
if grep -q "peer warm exit 0" /tmp/peer_warm.log; then
  (cd benchmarks && timeout $(( $(left) - 8 )) env PYTHONPATH=/tmp/peer:/tmp/site FLASHINFER_WORKSPACE_BASE=/tmp/peer-ws python3 bench_sampling.py --standalone $OUT/peer.json --peer --only "$CASES") >>$OUT/log.txt 2>&1
  log "bench peer exit $?"
else
  log "peer not built: $(tail -1 /tmp/peer_warm.log)"
fi
bench ours ours2
python3 - "$OUT" base "${names[@]}" peer ours2 <<'EOF' 2>&1 | tee -a $OUT/log.txt
import json, os, sys
out, tags = sys.argv[1], sys.argv[2:]
rows = {}
for tag in tags:
    p = os.path.join(out, tag + ".json")
    if os.path.exists(p):
        for name, r in json.load(open(p))["cases"].items():
            rows.setdefault(name, {})[tag] = r.get("median_us")
for name, r in rows.items():
    print(f"{name[:50]:<50} " + " ".join(f"{t}={r.get(t)}" for t in tags))
EOF
log done
