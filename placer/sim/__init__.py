"""Simulation: the reference execution model, bounds, plan validation and timeline export."""

from .bounds import fastest_durations, lower_bound
from .simulator import SimResult, Transfers, simulate, simulate_bound, simulate_plan
from .validation import validate

__all__ = [
    "SimResult",
    "Transfers",
    "simulate",
    "simulate_bound",
    "simulate_plan",
    "validate",
    "lower_bound",
    "fastest_durations",
]
