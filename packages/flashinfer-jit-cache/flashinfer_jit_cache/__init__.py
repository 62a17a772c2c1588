"""Precompiled FlashInfer modules. Modules live in ``modules/<uri>/<name>.so``; flashinfer finds
them by URI. This skeleton holds none yet."""
