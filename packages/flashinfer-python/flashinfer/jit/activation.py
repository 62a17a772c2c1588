"""Build spec of the activation module (silu/gelu/gelu_tanh and mul)."""

from .core import JitSpec


def gen_activation_module() -> JitSpec:
    return JitSpec(name="activation", sources=("activation.cu",))
