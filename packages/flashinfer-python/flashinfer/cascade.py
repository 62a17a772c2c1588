"""Cascade attention: merging attention states (:func:`merge_state`,
:func:`merge_state_in_place`, :func:`merge_states`; the math is in
:mod:`flashinfer.attention.merge`) and :class:`MultiLevelCascadeAttentionWrapper`, one batch
prefill per level of shared KV prefixes, merged. The public names only; the engine is
:mod:`flashinfer.attention`."""

from .attention.merge import merge_state, merge_state_in_place, merge_states
from .attention.multilevel import MultiLevelCascadeAttentionWrapper

__all__ = ["MultiLevelCascadeAttentionWrapper", "merge_state", "merge_state_in_place",
           "merge_states"]
