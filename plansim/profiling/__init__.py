"""Measuring real training on real GPUs (the ``profile`` extra: torch): the validator's PyTorch models with the
workload builders' architecture (``torch_models``). Importing this package does not import torch."""
