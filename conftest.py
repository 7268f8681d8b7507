"""Collection settings shared by the tests and the doctests of ``plansim/``."""

import importlib.util
import os

# Modules that import torch at the top are doctested only where the ``profile`` extra (torch) is installed; their
# tests skip without it (pytest.importorskip).
_NEED_TORCH = ["plansim/profiling/torch_models.py", "plansim/profiling/profiler.py", "plansim/validation/train.py"]
collect_ignore = [] if importlib.util.find_spec("torch") else _NEED_TORCH

# Notebooks run under pytest (nbmake) headless and at their small sizes: the kernels they start inherit this
# environment. A notebook reads PLANSIM_SMALL to shorten its long sweeps; run by hand it shows the full sizes.
os.environ.setdefault("MPLBACKEND", "Agg")
os.environ.setdefault("PLANSIM_SMALL", "1")

# No progress lines on stderr (plansim.report.progress) in the tests: an error must stay one line on stderr however
# long the command ran; tests/test_progress.py turns it back on.
os.environ.setdefault("PLANSIM_PROGRESS", "off")
