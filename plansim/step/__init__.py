"""The training step, defined once for both engines: what they derive first (``prepare``), and what a stage holds
for the whole step (``memory``). The analytic engine is the closed form of what the lowering builds task by task."""

from plansim.step.prepare import (
    PreparedStep,
    hierarchical_local,
    p2p_message_bytes,
    prepare_step,
    shard_algorithm,
    tied_copy_params,
    tp_pricer,
)

__all__ = [
    "PreparedStep",
    "hierarchical_local",
    "p2p_message_bytes",
    "prepare_step",
    "shard_algorithm",
    "tied_copy_params",
    "tp_pricer",
]
