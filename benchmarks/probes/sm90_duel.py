"""Ours and FlashInfer 0.7.2 taking turns on one case, with the board's clock, power and energy
logged for each turn (issue 21's 192/128 row: our rounds fell in two groups 12% apart, and
back to back the board ran at its 700 W cap with the SM clock throttled,
benchmarks/notes/sm90-dynamic-claims.md). One long-lived worker process per side (the two
packages are both named ``flashinfer``); the driver hands each a turn in rotation, so both sides
meet the same power state, and reads NVML around every turn:

- ``hot S``: back-to-back CUDA-graph replays of one call for S seconds (the sustained state);
  us per call, and mJ per call from the board's energy counter;
- ``cold N``: N replays, each after a 256 MiB read (a cold L2) with a pause before it, as
  benchmarks/tuning/sm90_vs_peer.py times them.

    python benchmarks/probes/sm90_duel.py OUT.json --sides peer,default,"whole tiles" \\
        [--case 13] [--rounds 6] [--hot-s 1.5] [--cold 20]

Environment: OURS_PATH and PEER_PATH, the PYTHONPATH of each side (tools/gpu_lib.sh's). A side
other than ``peer`` names a variant of benchmarks/tuning/sm90_vs_peer.py (its modules are built
on first use). GPU only.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve()


def worker(side: str, case_index: int) -> int:
    """Serve turns on stdin ("hot S", "cold N", "quit"), one JSON line per turn on stdout."""
    sys.path.insert(0, str(HERE.parents[1] / "tuning"))
    import sm90_vs_peer as sv  # noqa: E402 (the benchmark's cases and variants)
    import torch

    if side != "peer":
        sv._use(sv._specs(sv.VARIANTS[side]))
    case = sv.cases([case_index])[0]
    case.fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        case.fn()
    graph.replay()
    torch.cuda.synchronize()
    flush = torch.randn(64 << 20, device="cuda")
    print(json.dumps({"ready": case.name}), flush=True)
    for line in sys.stdin:
        cmd, _, arg = line.strip().partition(" ")
        if cmd == "quit":
            break
        if cmd == "hot":
            # Batches of 10 replays between events until arg seconds of GPU time.
            spent, calls, batches = 0.0, 0, []
            while spent < float(arg) * 1e3:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(10):
                    graph.replay()
                end.record()
                end.synchronize()
                ms = start.elapsed_time(end)
                spent += ms
                calls += 10
                batches.append(ms * 100.0)  # us per call
            print(json.dumps({"us": spent * 1e3 / calls, "calls": calls,
                              "batch_median_us": statistics.median(batches)}), flush=True)
        elif cmd == "cold":
            times = []
            for _ in range(int(arg)):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                flush.sum()
                start.record()
                graph.replay()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) * 1e3)
            print(json.dumps({"us": statistics.median(times), "calls": len(times),
                              "all_us": [round(x, 1) for x in times]}), flush=True)
    return 0


class Nvml:
    """The board's SM clock, power, clock-event reasons and energy counter (libnvidia-ml)."""

    def __init__(self):
        self.lib = ctypes.CDLL("libnvidia-ml.so.1")
        if self.lib.nvmlInit_v2() != 0:
            raise RuntimeError("nvmlInit failed")
        self.h = ctypes.c_void_p()
        self.lib.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(self.h))

    def energy_mj(self) -> int:
        e = ctypes.c_ulonglong()
        self.lib.nvmlDeviceGetTotalEnergyConsumption(self.h, ctypes.byref(e))
        return e.value

    def sample(self) -> tuple[int, float, int]:
        clk, mw, why = ctypes.c_uint(), ctypes.c_uint(), ctypes.c_ulonglong()
        self.lib.nvmlDeviceGetClockInfo(self.h, 1, ctypes.byref(clk))  # NVML_CLOCK_SM
        self.lib.nvmlDeviceGetPowerUsage(self.h, ctypes.byref(mw))
        self.lib.nvmlDeviceGetCurrentClocksThrottleReasons(self.h, ctypes.byref(why))
        return clk.value, mw.value / 1e3, why.value


def turn(nvml: Nvml, proc, cmd: str) -> dict:
    """One command to a worker, with NVML sampled every 10 ms while it runs."""
    samples, done = [], threading.Event()

    def sampler():
        while not done.is_set():
            samples.append(nvml.sample())
            time.sleep(0.01)

    e0 = nvml.energy_mj()
    th = threading.Thread(target=sampler)
    th.start()
    proc.stdin.write(cmd + "\n")
    proc.stdin.flush()
    reply = json.loads(proc.stdout.readline())
    done.set()
    th.join()
    e1 = nvml.energy_mj()
    clocks = [s[0] for s in samples] or [0]
    watts = [s[1] for s in samples] or [0.0]
    reply.update({
        "mj_per_call": round((e1 - e0) / max(reply["calls"], 1), 2),
        "sm_mhz_mean": round(statistics.mean(clocks)), "sm_mhz_min": min(clocks),
        "watts_mean": round(statistics.mean(watts), 1), "watts_max": round(max(watts), 1),
        # SW power cap (0x4) and HW slowdown (0x8) among the samples' clock-event reasons
        "power_capped_share": round(sum(1 for s in samples if s[2] & 0x4) / max(len(samples), 1), 2),
    })
    reply["us"] = round(reply["us"], 2)
    return reply


def driver(args) -> int:
    sides = [s for s in args.sides.split(",") if s]
    nvml = Nvml()
    procs = {}
    for side in sides:
        env = dict(os.environ)
        if side == "peer":
            env.update(PYTHONPATH=os.environ["PEER_PATH"], FLASHINFER_WORKSPACE_BASE="/tmp/peer-ws")
        else:
            env.update(PYTHONPATH=os.environ["OURS_PATH"], FLASHINFER_WORKSPACE_BASE="/tmp/fi-ws")
        procs[side] = subprocess.Popen(
            [sys.executable, str(HERE), "worker", side, str(args.case)], env=env, text=True,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    names = {}
    for side, proc in procs.items():  # each builds and captures its case first
        line = proc.stdout.readline()
        if not line:
            raise SystemExit(f"worker {side!r} died before it was ready")
        names[side] = json.loads(line)["ready"]
        print(f"ready: {side}: {names[side]}", flush=True)
    rounds = []
    for rnd in range(args.rounds):
        order = sides[rnd % len(sides):] + sides[:rnd % len(sides)]
        row = {"order": order, "hot": {}, "cold": {}}
        for side in order:
            row["hot"][side] = turn(nvml, procs[side], f"hot {args.hot_s}")
        for side in order:
            row["cold"][side] = turn(nvml, procs[side], f"cold {args.cold}")
        rounds.append(row)
        print(f"round {rnd + 1}: " + "  ".join(
            f"{s}: hot {row['hot'][s]['us']:.1f} us {row['hot'][s]['sm_mhz_mean']} MHz "
            f"{row['hot'][s]['watts_mean']} W {row['hot'][s]['mj_per_call']} mJ, "
            f"cold {row['cold'][s]['us']:.1f}" for s in order), flush=True)
    for proc in procs.values():
        proc.stdin.write("quit\n")
        proc.stdin.flush()
        proc.wait(timeout=60)
    summary = {}
    for side in sides:
        summary[side] = {k: statistics.median(r[mode][side][key] for r in rounds)
                         for k, mode, key in (("hot_us", "hot", "us"), ("cold_us", "cold", "us"),
                                              ("hot_mj_per_call", "hot", "mj_per_call"),
                                              ("hot_sm_mhz", "hot", "sm_mhz_mean"),
                                              ("hot_watts", "hot", "watts_mean"),
                                              ("cold_sm_mhz", "cold", "sm_mhz_mean"))}
    if "peer" in summary:
        for side in sides:
            if side != "peer":
                summary[side]["hot_speed_vs_peer"] = round(
                    summary["peer"]["hot_us"] / summary[side]["hot_us"], 3)
                summary[side]["cold_speed_vs_peer"] = round(
                    summary["peer"]["cold_us"] / summary[side]["cold_us"], 3)
    print(json.dumps(summary, indent=1), flush=True)
    Path(args.out).write_text(json.dumps({"case": names, "sides": sides, "rounds": rounds,
                                          "summary": summary, "hot_s": args.hot_s,
                                          "cold": args.cold}, indent=1) + "\n")
    return 0


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["worker"]:
        return worker(argv[1], int(argv[2]))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--sides", default="peer,default")
    ap.add_argument("--case", type=int, default=13, help="index into sm90_vs_peer.CASES")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--hot-s", type=float, default=1.5)
    ap.add_argument("--cold", type=int, default=20)
    return driver(ap.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
