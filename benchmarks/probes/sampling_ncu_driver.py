"""Three calls of each sampling kernel at 128 x 128256 fp32 for Nsight Compute (the first calls
JIT-compile and warm up; profile with --launch-skip): sampling_from_probs, top_k_sampling_from_probs
(k = 50), top_k_renorm_probs (k = 50), top_p_sampling_from_probs (p = 0.9). SampleKernel launches
per round: plain, top-k, top-p (the renorm is TransformKernel)."""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import bench_sampling  # noqa: E402

import flashinfer  # noqa: E402

_, probs = bench_sampling._inputs(128)
for _ in range(3):
    flashinfer.sampling_from_probs(probs)
    flashinfer.top_k_sampling_from_probs(probs, 50)
    flashinfer.top_k_renorm_probs(probs, 50)
    flashinfer.top_p_sampling_from_probs(probs, 0.9)
torch.cuda.synchronize()
