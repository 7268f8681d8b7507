"""The framework a test runs a pipeline schedule under (``frameworks/*.yaml``, rule ``schedules``): Megatron-LM, the
default, runs 1F1B and interleaved 1F1B only, so GPipe and ZB-H1 run under ``fsdp`` (torch's pipelining schedules,
as torchtitan runs them)."""

from __future__ import annotations

from plansim.strategy.frameworks import load_framework


def framework_for(schedule: str) -> str:
    """``megatron`` where Megatron-LM runs ``schedule``, else ``fsdp``."""
    return "megatron" if schedule in load_framework("megatron").rules.schedules.value else "fsdp"


def under(schedule: str) -> str:
    """What to append to a strategy string that runs ``schedule``: ``,framework=fsdp`` or nothing."""
    name = framework_for(schedule)
    return "" if name == "megatron" else f",framework={name}"
