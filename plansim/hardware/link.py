"""A link as the cost model sees it: an effective bandwidth and a per-message latency (alpha-beta model)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Link"]


@dataclass(frozen=True)
class Link:
    """Effective bandwidth (bytes/s, link efficiency already applied) and latency (s) of one hop or one group.

    >>> Link(bandwidth_Bps=100e9, latency_s=5e-6).beta_s_per_byte
    1e-11
    """

    bandwidth_Bps: float
    latency_s: float

    @property
    def beta_s_per_byte(self) -> float:
        """Seconds per byte: the beta of the alpha-beta model."""
        return 1.0 / self.bandwidth_Bps
