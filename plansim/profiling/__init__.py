"""Measuring real training on real GPUs: the kernel profile's schema (``schema``, plain pydantic), the kernel sweep
of ``plansim profile`` (``profiler``) and the validator's PyTorch models (``torch_models``); the last two need the
``profile`` extra (torch). Importing this package does not import torch."""
