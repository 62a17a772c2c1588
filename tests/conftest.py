"""Test configuration: hardware markers and an isolated JIT cache.

GPU tests carry ``@pytest.mark.gpu`` and are skipped, with the reason shown in the summary, when
no CUDA device is visible; on a GPU machine they run. Compiling tests carry
``@pytest.mark.nvcc``. The whole session builds into a fresh workspace unless
FLASHINFER_WORKSPACE_BASE is set, so a run never reuses a stale module from ~/.cache.
"""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest
import torch

HAS_GPU = torch.cuda.is_available()
HAS_NVCC = shutil.which("nvcc") is not None or os.path.exists("/usr/local/cuda/bin/nvcc")

if "FLASHINFER_WORKSPACE_BASE" not in os.environ:
    os.environ["FLASHINFER_WORKSPACE_BASE"] = tempfile.mkdtemp(prefix="flashinfer-tests-")
if not HAS_GPU and "FLASHINFER_CUDA_ARCH_LIST" not in os.environ:
    # Without a GPU there is nothing to detect: compile for the H100 we test on.
    os.environ["FLASHINFER_CUDA_ARCH_LIST"] = "9.0a"


def pytest_collection_modifyitems(config, items):
    no_gpu = pytest.mark.skip(reason="needs a CUDA GPU (none visible)")
    no_nvcc = pytest.mark.skip(reason="needs nvcc (not found)")
    free = torch.cuda.mem_get_info()[0] if HAS_GPU else 0
    too_small = pytest.mark.skip(reason=f"needs > 20 GB free GPU memory, {free / 2**30:.0f} GB free")
    for item in items:
        if ("gpu" in item.keywords or "large" in item.keywords) and not HAS_GPU:
            item.add_marker(no_gpu)
        elif "large" in item.keywords and free < 20 * 2**30:
            item.add_marker(too_small)
        if "nvcc" in item.keywords and not HAS_NVCC:
            item.add_marker(no_nvcc)
