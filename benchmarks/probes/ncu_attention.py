"""One attention case run a few times, for Nsight Compute to profile its kernel.

    ncu --clock-control none --set full --kernel-name regex:attention_kernel \
        --launch-skip 2 --launch-count 1 -o REPORT python benchmarks/probes/ncu_attention.py CASE

CASE is one of the keys of CASES (the issue's prefill and decode rows). GPU only.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # harness, bench_*

import bench_attention as ba  # noqa: E402
import torch  # noqa: E402

CASES = {
    "paged": lambda: ba._paged_prefill(8, 2048, 0.0, ""),
    "ragged": lambda: ba._ragged_prefill(16, 1024, 0.0, ""),
    "single": lambda: ba._single_prefill(16384, 0.0, ""),
    "ragged_fa2": lambda: ba._ragged_prefill(16, 1024, None, "", "fa2"),
    "paged_fa2": lambda: ba._paged_prefill(8, 2048, None, "", "fa2"),
    "single_fa2": lambda: ba._single_prefill(16384, None, "", "fa2"),
    "decode1": lambda: ba._decode(1, 32768, True, 0.0, ""),
    "decode64": lambda: ba._decode(64, 4096, True, 0.0, ""),
    "mla": lambda: _mla(),  # ragged 192 / 128 causal 16 x 1024, 128 heads
}


def _mla():
    import attention_vs_peer

    return attention_vs_peer._mla_ragged_prefill(16, 1024, 128)


def main() -> int:
    if len(sys.argv) != 2 or sys.argv[1] not in CASES:
        print(f"usage: ncu_attention.py {{{','.join(CASES)}}}", file=sys.stderr)
        return 2
    case = CASES[sys.argv[1]]()
    for _ in range(4):
        case.fn()
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
