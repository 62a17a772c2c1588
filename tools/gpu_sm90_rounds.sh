#!/usr/bin/env bash
# One device call for a variant A/B of the Hopper kernel on a few cases (issues 21 and 22): the
# peer's modules, the tests' modules and our variants build side by side; once every build is
# done, our variants are timed in interleaved rounds (benchmarks/tuning/sm90_vs_peer.py ours
# --rounds), then the peer in its own process (same cases, same rounds); then the test file on
# the tree's default build and, where a variant beat the default clearly (every round of it
# under every round of the default), that file's tests of the variant's head dims with its
# flags (FLASHINFER_EXTRA_CUDAFLAGS). Everything lands in $OUT.
#   usage (device): bash tools/gpu_sm90_rounds.sh COMMIT VARIANT ...   ("default" first)
#   env: CASES (CASES indices of sm90_vs_peer.py, default 13: ragged 192/128 16 x 1024),
#        ROUNDS (default 5), BUDGET (s, default 320), TESTS (default tests/test_sm90_head_dims.py),
#        WIN_K (pytest -k of the winner's tests, default heads1: 192 / 128), WIN_HEAD_DIM (the
#        head_dim of the modules built with the winner's flags, default 192), TOPIC (record)
set -uo pipefail
commit=${1:?commit}; shift
source tools/gpu_lib.sh; gpu_setup 320 peer
rm -f /tmp/peer-ready /tmp/aot-done /tmp/quiet
cases=${CASES:-13}; rounds=${ROUNDS:-5}; sweep=benchmarks/tuning/sm90_vs_peer.py
log "peer warm-up, tests' modules, our variants: building"
( peer python3 $sweep peer /dev/null --warmup --cases $cases > $OUT/peer-warm.log 2>&1
  echo "exit $?" > /tmp/peer-ready ) &
# The modules of the Hopper kernel at head_dim 256 and 192 / 128 (custom masks: fp16 ragged).
wide=$(ours python3 -c "
from flashinfer.jit.attention import precompiled_variants
print(','.join(v.name for v in precompiled_variants() if v.has_sm90 and v.head_dim in (192, 256)
               and (v.mask_mode != 'custom' or (v.dtype_q == 'float16' and not v.paged))))")
( ours nice -n 5 python3 -m flashinfer.aot --jobs 12 --only "$wide" > /tmp/aot.log 2>&1
  echo "exit $?" > /tmp/aot-done ) &
( while { [ ! -f /tmp/aot-done ] || [ ! -f /tmp/peer-ready ]; } && [ $(left) -gt 170 ]; do
    sleep 1; done; log "quiet (peer $(cat /tmp/peer-ready 2>/dev/null), aot $(cat /tmp/aot-done 2>/dev/null))"
  touch /tmp/quiet ) &
ours timeout $(( $(left) - 95 )) python3 $sweep ours /tmp/ours.json "$@" --cases $cases \
  --rounds $rounds --wait /tmp/quiet --wait-s 240 > $OUT/ours.log 2>&1
log "ours exit $?"
grep -E "^check|^built" $OUT/ours.log >> $OUT/log.txt
peer timeout $(( $(left) - 80 )) python3 $sweep peer /tmp/peer.json --cases $cases \
  --rounds $rounds > $OUT/peer.log 2>&1
log "peer exit $?"
ours python3 $sweep merge $OUT/sm90-rounds.json --ours /tmp/ours.json --peer /tmp/peer.json \
  --commit $commit --topic ${TOPIC:-sm90-rounds} > $OUT/table.txt 2>&1 \
  || cp /tmp/ours.json /tmp/peer.json $OUT/ 2>/dev/null
cat $OUT/table.txt
# The clear winner's flags among the kernel variants (nothing where none).
win=$(ours python3 - <<'EOF'
import json, statistics
v = json.load(open("/tmp/ours.json"))["variants"]
base = {r["name"]: r.get("rounds_us", [r["median_us"]]) for r in v["default"]["rows"]}
best = None
for label, e in v.items():
    if any(f.startswith("PLAN_") for f in e["flags"]):
        continue  # plan-side: the default's modules
    for r in e["rows"]:
        us, ref = r.get("rounds_us", [r["median_us"]]), base.get(r["name"])
        if ref and max(us) < min(ref) and (best is None or statistics.median(us) < best[0]):
            best = (statistics.median(us), label, e["flags"])
if best:
    print(" ".join(f"-DFLASHINFER_ATTENTION_{f}" for f in best[2]))
EOF
)
log "clear winner's flags: '${win}'"
while [ ! -f /tmp/aot-done ] && [ $(left) -gt 60 ]; do sleep 2; done
reserve=3; [ -n "$win" ] && reserve=45  # the winner's builds and tests after these
t=$(( $(left) - reserve )); [ $t -lt 20 ] && t=20
ours timeout $t python3 -m pytest ${TESTS:-tests/test_sm90_head_dims.py} -q -p no:cacheprovider \
  -rfEs > $OUT/pytest.log 2>&1
log "pytest exit $?: $(tail -1 $OUT/pytest.log)"
grep -E "^(FAILED|ERROR)" $OUT/pytest.log | head -10 >> $OUT/log.txt
if [ -n "$win" ] && [ $(left) -gt 25 ]; then
  mods=$(ours python3 -c "
from flashinfer.jit.attention import precompiled_variants
print(','.join(v.name for v in precompiled_variants() if v.has_sm90 and v.head_dim == ${WIN_HEAD_DIM:-192}))")
  ours env FLASHINFER_EXTRA_CUDAFLAGS="$win" timeout $(( $(left) - 20 )) python3 -m flashinfer.aot \
    --jobs 16 --only "$mods" > /tmp/aot-win.log 2>&1
  log "winner's modules exit $?"
  ours env FLASHINFER_EXTRA_CUDAFLAGS="$win" timeout $(( $(left) - 3 )) python3 -m pytest \
    ${TESTS:-tests/test_sm90_head_dims.py} -k "${WIN_K:-heads1}" -q -p no:cacheprovider -rfEs \
    > $OUT/pytest-win.log 2>&1
  log "pytest (winner) exit $?: $(tail -1 $OUT/pytest-win.log)"
fi
tail -3 /tmp/aot.log >> $OUT/log.txt
log "done"
