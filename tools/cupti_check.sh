#!/usr/bin/env bash
# One device call: the benchmark CLI's CUPTI timer against CUDA events on the same testlist.
# Installs the wheels of WHEEL_DIRS (no network: cupti-python, and pyelftools, which cupti-python
# 13.4 imports and the GPU image lacks; cuda-bindings and cuda-pathfinder are there), runs
# benchmarks/testlists/cupti_check.txt
# with --use_cuda_events (which also builds the JIT modules), then with --use_cupti (CUPTI or
# stop: exit 2 with the reason, e.g. a missing dependency), and compares the
# medians per row: rows of 20 us and more should agree within 10%. Everything lands in $OUT.
#   usage (device, repository root): bash tools/cupti_check.sh [WHEEL_DIR ...]
#   (default: .gpu/cupti .gpu/tooling)
set -uo pipefail
dirs=("$@")
[ $# -gt 0 ] || dirs=(.gpu/cupti .gpu/tooling)
export PYTHONUNBUFFERED=1 MAX_JOBS=${MAX_JOBS:-16}
wheels=()
for d in "${dirs[@]}"; do wheels+=("$d"/*.whl); done
python3 -m pip install -q --no-index --no-deps --target /tmp/site "${wheels[@]}" || exit 1
export PYTHONPATH=/tmp/site:$PWD/packages/flashinfer-python${PYTHONPATH:+:$PYTHONPATH}
export FLASHINFER_WORKSPACE_BASE=${FLASHINFER_WORKSPACE_BASE:-/tmp/fi-ws}
python3 - <<'PY' | tee $OUT/cupti_versions.txt
from importlib.metadata import PackageNotFoundError, version
for name in ("cupti-python", "pyelftools", "nvidia-cuda-cupti", "cuda-bindings",
             "cuda-pathfinder", "torch"):
    try:
        print(name, version(name))
    except PackageNotFoundError:
        print(name, "not installed")
PY
list=benchmarks/testlists/cupti_check.txt
python3 benchmarks/flashinfer_benchmark.py --testlist $list --use_cuda_events \
  --output_path $OUT/events.csv > $OUT/events.log 2>&1
echo "events exit $?"
python3 benchmarks/flashinfer_benchmark.py --testlist $list --use_cupti \
  --output_path $OUT/cupti.csv > $OUT/cupti.log 2>&1
rc=$?
echo "cupti exit $rc"; grep -E "CUPTI|cupti" $OUT/cupti.log | head -5
[ $rc = 0 ] || exit $rc
python3 - "$OUT/events.csv" "$OUT/cupti.csv" <<'PY'
import csv, sys
rows = [{(r["routine"], r["backend"], r["case_tag"], r["shape"]): r for r in csv.DictReader(open(p))}
        for p in sys.argv[1:]]
events, cupti = rows
bad = 0
for key, e in events.items():
    c = cupti.get(key)
    if not c or not e["median_time_ms"] or not c["median_time_ms"]:
        print("missing", key); bad += 1; continue
    te, tc = float(e["median_time_ms"]) * 1e3, float(c["median_time_ms"]) * 1e3
    off = tc / te - 1
    flag = "" if te < 20 or abs(off) <= 0.10 else "  <-- over 10%"
    bad += bool(flag) + (c["timer"] != "cupti")
    print(f"{key[0][:34]:34s} {key[1]:6s} {key[2]:6s} events {te:9.1f} us  cupti {tc:9.1f} us"
          f"  {100 * off:+6.1f}%  [{e['timer']}/{c['timer']}]{flag}")
print("disagreements:", bad)
sys.exit(1 if bad else 0)
PY
