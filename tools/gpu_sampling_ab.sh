#!/usr/bin/env bash
# One call on the GPU machine (<= 330 s) for a change to the sampling draws: this tree (the
# branch, under the lead's checkout as .gpu/<name>) against the checkout it sits in (the
# baseline: the same commit's ops without the change) and FlashInfer 0.7.2, one timer
# (bench_sampling.time_us), three processes. Order: the peer's JIT in the background, our
# first-call JIT (timed), the baseline's JIT in the background, the read/copy ceilings, the
# sampling GPU tests, then ours / baseline / peer / ours again on the sampling cases.
#   usage (device, from the checkout root): OUT=... bash .gpu/<name>/tools/gpu_sampling_ab.sh
# Writes log.txt, pytest.log, ceilings.json, ours.json, base.json, peer.json, ours2.json.
set -uo pipefail
root=$PWD
cd "$(dirname "$0")/.." || exit 1
source tools/gpu_lib.sh
gpu_setup 325 peer
base() { PYTHONPATH=/tmp/site:$root/packages/flashinfer-python FLASHINFER_WORKSPACE_BASE=/tmp/base-ws "$@"; }
CASES=${CASES:-"sampling_from,top_p_sampling,top_k_sampling,min_p_sampling,top_k_top_p_sampling"}
(cd benchmarks && peer python3 bench_sampling.py --warm --peer --only "$CASES" >/tmp/peer_warm.log 2>&1; echo "peer warm exit $?" >>/tmp/peer_warm.log) &
ours python3 -c "import time; t = time.time(); import flashinfer.sampling as s; s.get_sampling_module(); print(f'sampling first-call JIT: {time.time() - t:.1f} s (the peer builds alongside)')" 2>&1 | tail -3 | tee -a $OUT/log.txt
(base python3 -c "import flashinfer.sampling as s; s.get_sampling_module()" >/tmp/base_jit.log 2>&1; echo "base jit exit $?" >>/tmp/base_jit.log) &
ours python3 -c "
import json, sys; sys.path.insert(0, 'benchmarks'); import harness
json.dump(harness.measure_ceilings(), open('$OUT/ceilings.json', 'w'), indent=1)" >/tmp/ceil.log 2>&1
log "ceilings exit $? $(cut -c1-200 $OUT/ceilings.json | tr -d '\n ' | cut -c1-160)"
timeout ${TEST_TIMEOUT:-130} bash -c "PYTHONPATH=$OURS FLASHINFER_WORKSPACE_BASE=/tmp/fi-ws python3 -m pytest tests/test_sampling.py -q -p no:cacheprovider --maxfail=25" >$OUT/pytest.log 2>&1
log "pytest exit $?"; grep -E "^(FAILED|ERROR)|passed|failed" $OUT/pytest.log | head -20
cd benchmarks
timeout 45 bash -c "PYTHONPATH=$OURS FLASHINFER_WORKSPACE_BASE=/tmp/fi-ws python3 bench_sampling.py --standalone $OUT/ours.json --only '$CASES'" >>$OUT/log.txt 2>&1
log "ours exit $?"
tail -1 /tmp/base_jit.log | tee -a $OUT/log.txt
(cd $root/benchmarks && timeout 45 bash -c "PYTHONPATH=/tmp/site:$root/packages/flashinfer-python FLASHINFER_WORKSPACE_BASE=/tmp/base-ws python3 bench_sampling.py --standalone $OUT/base.json --only '$CASES'") >>$OUT/log.txt 2>&1
log "base exit $?"
while ! grep -q "peer warm exit" /tmp/peer_warm.log && [ "$(left)" -gt 60 ]; do sleep 2; done
tail -2 /tmp/peer_warm.log | tee -a $OUT/log.txt
[ "$(left)" -gt 50 ] && timeout $(( $(left) - 40 )) bash -c "PYTHONPATH=/tmp/peer:/tmp/site FLASHINFER_WORKSPACE_BASE=/tmp/peer-ws python3 bench_sampling.py --standalone $OUT/peer.json --peer --only '$CASES'" >>$OUT/log.txt 2>&1
log "peer exit $?"
[ "$(left)" -gt 30 ] && timeout $(( $(left) - 8 )) bash -c "PYTHONPATH=$OURS FLASHINFER_WORKSPACE_BASE=/tmp/fi-ws python3 bench_sampling.py --standalone $OUT/ours2.json --only '$CASES'" >>$OUT/log.txt 2>&1
log "ours again exit $?"
python3 - "$OUT" <<'EOF' 2>&1 | tee -a $OUT/log.txt
import json, os, sys
out = sys.argv[1]
rows = {}
for tag in ("ours", "base", "peer", "ours2"):
    p = os.path.join(out, tag + ".json")
    if os.path.exists(p):
        for name, r in json.load(open(p))["cases"].items():
            rows.setdefault(name, {})[tag] = r.get("median_us")
for name, r in rows.items():
    print(f"{name[:58]:<58} " + " ".join(f"{t}={r.get(t)}" for t in ("ours", "ours2", "base", "peer")))
EOF
log done
