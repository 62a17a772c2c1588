#!/usr/bin/env bash
# One device call for the Hopper prefill kernel (issue 22), from the repository root: the peer's
# fa3 modules build in the background (one process per case group) while ours build; our
# variants are checked and timed (benchmarks/tuning/sm90_vs_peer.py), then the peer in its own
# process, then the Hopper GPU tests. Everything lands in $OUT.
#   usage (device): bash tools/gpu_sm90.sh COMMIT [VARIANT ...]
#   env: WHEELS (default .gpu/wheels), PEER_TAR (default .gpu/peer/flashinfer-peer.tar.xz),
#        BUDGET (s, default 340), TESTS (pytest args, default the Hopper tests of test_prefill.py),
#        STRESS (variant names, spaces as _), STRESS_N, TEST_MODULES (aot --only list the
#        tests need beyond the sweep's; "all": every attention module; "hopper": those with
#        the Hopper kernel), ALT_FLAGS (nvcc
#        flags of a second test run, e.g. a variant's -DFLASHINFER_ATTENTION_... macros),
#        PEER_GROUPS (space-separated groups of CASES indices the peer builds in parallel),
#        TESTS_K (the tests' -k expression), MAXFAIL (default 1), TESTS_FIRST (set: the tests
#        run before the peer is timed, leaving it 90 s), PEER_CASES (CASES indices the peer
#        times, comma-separated; default all: a case not warmed up builds inside the timing),
#        QUIET (set: the sweep's timing waits for the other builds; raise SWEEP_TIMEOUT)
set -uo pipefail
commit=${1:?commit}; shift
source tools/gpu_lib.sh; gpu_setup 340 peer
rm -f /tmp/peer-ready /tmp/aot-tests-done /tmp/aot-alt-done
log "peer warmup (background)"
groups=${PEER_GROUPS:-0,1,5,7,8 2,3,4,9 6}
for group in $groups; do
  ( peer nice -n ${PEER_NICE:-5} python3 benchmarks/tuning/sm90_vs_peer.py peer /dev/null --warmup --cases $group \
      > /tmp/peer-warm-$group.log 2>&1; echo "$group exit $?" >> /tmp/peer-ready ) &
done
test_modules=${TEST_MODULES:-attention_ragged_bf16_obf16_d64_none_none,attention_paged_bf16_obf16_d64_causal_none,attention_ragged_f16_of16_d128_causal_none}
[ "$test_modules" = all ] && test_modules=$(ours python3 -c "
from flashinfer import aot
print(','.join(s.name for s in aot.registered_specs() if s.name.startswith('attention_')))")
# "hopper": every registered module with the Hopper kernel (head_dim 64, 128, 256, 192 / 128).
[ "$test_modules" = hopper ] && test_modules=$(ours python3 -c "
from flashinfer import aot
from flashinfer.jit.attention import precompiled_variants
print(','.join(v.name for v in precompiled_variants() if v.has_sm90))")
# "wide": those at head_dim 256 and 192 / 128 (custom masks: fp16 ragged only).
[ "$test_modules" = wide ] && test_modules=$(ours python3 -c "
from flashinfer.jit.attention import precompiled_variants
print(','.join(v.name for v in precompiled_variants() if v.has_sm90 and v.head_dim in (192, 256)
               and (v.mask_mode != 'custom' or (v.dtype_q == 'float16' and not v.paged))))")
( ours nice -n ${AOT_NICE:-5} python3 -m flashinfer.aot --jobs ${AOT_JOBS:-12} --only "$test_modules" \
    > /tmp/aot-tests.log 2>&1; echo done > /tmp/aot-tests-done ) &
hopper_modules=attention_ragged_bf16_obf16_d64_causal_none,attention_ragged_bf16_obf16_d128_causal_none,attention_ragged_bf16_obf16_d128_none_none,attention_ragged_bf16_obf16_d64_none_none,attention_paged_bf16_obf16_d64_causal_none,attention_paged_bf16_obf16_d128_causal_none,attention_ragged_f16_of16_d128_causal_none
if [ -n "${ALT_FLAGS:-}" ]; then
  ( ours env FLASHINFER_EXTRA_CUDAFLAGS="$ALT_FLAGS" nice -n 5 python3 -m flashinfer.aot --jobs 8 \
      --only $hopper_modules > /tmp/aot-alt.log 2>&1; echo done > /tmp/aot-alt-done ) &
fi
log "ours: build, check, time"
t=$(( $(left) - 80 )); [ $t -gt ${SWEEP_TIMEOUT:-150} ] && t=${SWEEP_TIMEOUT:-150}
# QUIET=1: the sweep times once the tests' AOT and the peer's warm-up builds are done (/tmp/quiet),
# not beside them (rows of one call drifted by up to 15% that way: sm90-head-dims.md).
rm -f /tmp/quiet
if [ -n "${QUIET:-}" ]; then
  ( n=$(echo $groups | wc -w)
    while { [ ! -f /tmp/aot-tests-done ] || [ "$(cat /tmp/peer-ready 2>/dev/null | wc -l)" -lt $n ]; } \
          && [ $(left) -gt 150 ]; do sleep 1; done; touch /tmp/quiet ) &
fi
ours timeout $t nice -n ${SWEEP_NICE:-0} python3 benchmarks/tuning/sm90_vs_peer.py ours /tmp/ours.json "$@" \
  ${QUIET:+--wait /tmp/quiet --wait-s $t} > $OUT/ours.log 2>&1
log "ours exit $?"
grep -E "^check|built|^== " $OUT/ours.log >> $OUT/log.txt
for v in ${STRESS:-}; do  # variants whose short cases replay STRESS_N times (a hang ends at 40 s)
  ours timeout 40 python3 benchmarks/tuning/sm90_vs_peer.py stress "${v//_/ }" ${STRESS_N:-3000} \
    >> $OUT/stress.log 2>&1
  log "stress ${v//_/ } exit $?"
done
run_tests() {  # $1: seconds to leave for what follows
  while [ ! -f /tmp/aot-tests-done ] && [ $(left) -gt 40 ]; do sleep 2; done
  log "tests"
  local t=$(( $(left) - $1 )); [ $t -lt 20 ] && t=20
  ours timeout $t python3 -m pytest ${TESTS:-tests/test_prefill.py -k hopper} \
    ${TESTS_K:+-k "$TESTS_K"} -q -p no:cacheprovider --maxfail=${MAXFAIL:-1} -rfEs \
    > $OUT/pytest.log 2>&1
  log "pytest exit $?: $(tail -1 $OUT/pytest.log)"
  grep -E "^(FAILED|ERROR)" $OUT/pytest.log | head -10 >> $OUT/log.txt
}
run_peer() {
  local n_groups=$(echo $groups | wc -w)
  while [ "$(cat /tmp/peer-ready 2>/dev/null | wc -l)" -lt $n_groups ] && [ $(left) -gt 70 ]; do sleep 2; done
  log "peer ready: $(cat /tmp/peer-ready 2>/dev/null | tr '\n' ' ')"
  peer timeout $(( $(left) - ${1:-45} )) python3 benchmarks/tuning/sm90_vs_peer.py peer /tmp/peer.json \
    ${PEER_CASES:+--cases $PEER_CASES} > $OUT/peer.log 2>&1
  log "peer exit $?"
  ours python3 benchmarks/tuning/sm90_vs_peer.py merge $OUT/sm90-vs-peer.json --ours /tmp/ours.json \
    --peer /tmp/peer.json --commit $commit > $OUT/table.txt 2>&1 || cp /tmp/ours.json /tmp/peer.json $OUT/ 2>/dev/null
}
if [ -n "${TESTS_FIRST:-}" ]; then  # the tests before the peer's timing (its builds go on meanwhile)
  run_tests 90
  run_peer 8
else
  run_peer
  run_tests 5
fi
if [ -n "${ALT_FLAGS:-}" ]; then
  while [ ! -f /tmp/aot-alt-done ] && [ $(left) -gt 25 ]; do sleep 2; done
  log "tests with $ALT_FLAGS"
  ours env FLASHINFER_EXTRA_CUDAFLAGS="$ALT_FLAGS" timeout $(( $(left) - 3 )) python3 -m pytest \
    ${TESTS:-tests/test_prefill.py -k hopper} -q -p no:cacheprovider -x -rfEs > $OUT/pytest-alt.log 2>&1
  log "pytest (alt) exit $?: $(tail -1 $OUT/pytest-alt.log)"
fi
for f in /tmp/peer-warm-*.log; do echo "== $f"; tail -n 3 "$f"; done > $OUT/peer-warm.txt 2>&1
log "done"
