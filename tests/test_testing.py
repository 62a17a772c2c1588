import pytest
import torch

from flashinfer import testing


def test_attention_flops():
    # non-causal: 2 matmuls of 2*Sq*Skv*D each, per head
    assert testing.attention_flops(1, 4, 8, 128, 128, 2, False) == 2 * 2 * 4 * 8 * 256
    # causal, Sq == Skv: the lower triangle incl. the diagonal
    assert testing.attention_flops(1, 4, 4, 64, 64, 1, True) == 2 * 10 * 128
    # causal, bottom-right aligned: every row also sees the Skv - Sq prefix
    assert testing.attention_flops(1, 2, 5, 64, 64, 1, True) == 2 * (2 * 3 + 3) * 128
    with pytest.raises(ValueError, match="qo_seqlen"):
        testing.attention_flops(1, 5, 2, 64, 64, 1, True)
    assert testing.attention_tflops_per_sec(1, 4, 8, 128, 128, 2, False, 1.0) == pytest.approx(
        2 * 2 * 4 * 8 * 256 / 1e-3 / 1e12)


@pytest.mark.gpu
@pytest.mark.parametrize("graph", [False, True])
def test_bench_gpu_time_returns_positive_milliseconds(graph):
    x = torch.randn(1 << 24, device="cuda")
    times = testing.bench_gpu_time(lambda: x.mul_(1.0001), repeat_iters=20, dry_run_iters=3,
                                   use_cuda_graph=graph)
    assert len(times) == 20 and all(0 < t < 100 for t in times)


@pytest.mark.gpu
def test_bench_gpu_time_passes_inputs():
    seen = []
    x = torch.ones(4, device="cuda")
    testing.bench_gpu_time(lambda a, b=0: seen.append((a is x, b)), repeat_iters=2,
                           dry_run_iters=1, input_args=(x,), input_kwargs={"b": 3})
    assert seen and all(s == (True, 3) for s in seen)
