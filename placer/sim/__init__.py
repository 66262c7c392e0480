"""Simulation: the reference execution model, bounds and timeline export."""

from .bounds import fastest_durations, lower_bound
from .simulator import SimResult, Transfers, simulate, simulate_bound, simulate_plan

__all__ = ["SimResult", "Transfers", "simulate", "simulate_bound", "simulate_plan", "lower_bound",
           "fastest_durations"]
