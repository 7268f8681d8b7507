"""Which shipped GPU profile and node type a CUDA device name stands for (``torch.cuda.get_device_name``), so that a
profile measured by ``plansim profile`` lands where the cost model reads it (``measured/<gpu>.yaml``) and the
validator predicts on the same GPU.

>>> device_profile("NVIDIA H100 80GB HBM3")
('h100-sxm5-80gb', 'dgx-h100')
>>> device_profile("NVIDIA A100-SXM4-40GB")
('a100-sxm4-40gb', 'dgx-a100')
>>> device_profile("AMD EPYC 7763") is None
True
"""

from __future__ import annotations

import re

__all__ = ["device_profile"]

#: (pattern on the device name, GPU profile, node type holding that GPU class), first match wins. The A100 40 GB
#: profile has no node of its own: its node is the DGX A100 (whose profile names the 80 GB part).
_DEVICES = (
    (r"H200", "h200-sxm-141gb", "hgx-h200"),
    (r"H100", "h100-sxm5-80gb", "dgx-h100"),
    (r"A100.*40\s*GB", "a100-sxm4-40gb", "dgx-a100"),
    (r"A100", "a100-sxm4-80gb", "dgx-a100"),
    (r"V100", "v100-sxm2-32gb", "dgx-1"),
    (r"4090", "rtx-4090", "pcie-4x4090"),
    (r"3090", "rtx-3090", "pcie-4x4090"),
)


def device_profile(device_name: str) -> tuple[str, str] | None:
    """(GPU profile, node type) for a CUDA device name, or None when no shipped profile matches."""
    for pattern, gpu, node in _DEVICES:
        if re.search(pattern, device_name, flags=re.IGNORECASE):
            return gpu, node
    return None
