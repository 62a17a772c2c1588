#!/bin/bash
# The sampling module's first-call JIT on the device: for each tree given (a source checkout,
# e.g. one unpacked with `git archive REV | tar -x -C .gpu/NAME`), ROUNDS times in turn, in a
# fresh workspace and with nothing else building: `import flashinfer.sampling`, then
# get_sampling_module() (compile + link + load; the build's own seconds from its record), and
# each unit's nvcc seconds (a launcher that times every nvcc command).
# Writes $OUT/jit.json. Usage: GPU_DIR=.gpu bash tools/gpu_jit.sh TREE... (ROUNDS=2).
set -uo pipefail
source "$(dirname "$0")/gpu_lib.sh"
gpu_setup 300
rounds=${ROUNDS:-2}
for r in $(seq "$rounds"); do
  for tree in "$@"; do
    ws=$(mktemp -d /tmp/jit-ws.XXXX)
    printf '#!/bin/bash\ns=$(date +%%s.%%N); "$@"; rc=$?\necho "$(date +%%s.%%N) $s ${@: -1}" >> %s/units.txt; exit $rc\n' \
      "$ws" > "$ws/timed"
    chmod +x "$ws/timed"
    PYTHONPATH=/tmp/site:$tree/packages/flashinfer-python FLASHINFER_WORKSPACE_BASE=$ws \
      FLASHINFER_NVCC_LAUNCHER=$ws/timed python3 -c "
import json, time, pathlib, sys
t0 = time.perf_counter()
import flashinfer.sampling as s
t1 = time.perf_counter()
s.get_sampling_module()
t2 = time.perf_counter()
units = {}
for line in pathlib.Path('$ws/units.txt').read_text().splitlines():
    end, start, target = line.split()
    units[pathlib.Path(target).name] = round(float(end) - float(start), 2)
build = [json.loads(p.read_text())['build_seconds'] for p in pathlib.Path('$ws').rglob('*.json')
         if p.read_text().lstrip().startswith('{') and 'build_seconds' in p.read_text()]
print(json.dumps({'tree': '$tree', 'round': $r, 'import_s': round(t1 - t0, 2),
                  'first_call_s': round(t2 - t1, 2), 'build_s': build, 'units_s': units}))
" | tee -a "$OUT/jit.jsonl" | python3 -c "
import json, sys
d = json.loads(sys.stdin.read())
u = sorted(d['units_s'].items(), key=lambda kv: -kv[1])
print(d['tree'], 'round', d['round'], 'import', d['import_s'], 's, first call', d['first_call_s'], 's (build', d['build_s'], 's); longest:', ', '.join(f'{k} {v:.1f}' for k, v in u[:5]))
" | tee -a "$OUT/log.txt"
    rm -rf "$ws"
  done
done
