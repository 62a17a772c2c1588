"""FlashInfer kernel binaries of one release. This skeleton holds none yet."""
