"""The attention engine. The public names live in :mod:`flashinfer.prefill`,
:mod:`flashinfer.decode` and :mod:`flashinfer.cascade`; this package is what they are made of,
imported one way (faces -> the modules below -> ``jit``, ``knobs``, ``utils``):

=============== ===========================================================================
``plan``        host scheduling: the CTA shape, the KV split, the work items (pure, CPU)
``runtime``     option parsing, the workspaces, the parameter record and the launch
``wrapper``     argument checks and ``BatchAttentionBase``, the plan/run base of the wrappers
``single``      ``single_prefill_with_kv_cache``, ``single_decode_with_kv_cache``
``prefill``     the paged and ragged batch prefill wrappers
``decode``      the batch decode wrappers
``merge``       ``merge_state``, ``merge_state_in_place``, ``merge_states`` (base-2 lse)
``multilevel``  ``MultiLevelCascadeAttentionWrapper``
=============== ===========================================================================

Below Python, one op's five layers: ``include/flashinfer/attention/`` (kernels, and
``launch.cuh``: the CTA shapes and which kernel a plan's shape launches; ``tuning.cuh``: the
numeric tuning parameters) -> ``csrc/attention.cu`` (the binding) -> ``flashinfer/jit/attention.py``
(the module spec of one variant) -> this package -> ``flashinfer/aot.py`` (the precompiled
variants).
"""
