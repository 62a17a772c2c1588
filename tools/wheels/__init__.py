"""Tools for the built wheels of the set: ``check`` (metadata, pins, tags, RECORD, the jit-cache
manifest and its binaries' ELF needs) and ``index`` (a PEP 503 index per CUDA build)."""
