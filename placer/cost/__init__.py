"""Costs of a training step: analytic roofline per device kind, measured profiles,
communication calibration, and prediction across batch sizes (Celeritas Standard Evaluation).

Submodules are imported on use so that ``import placer.cost`` stays light (no torch).
"""

from .analytic import DEVICE_SPECS, annotate, node_time_s

__all__ = ["DEVICE_SPECS", "annotate", "node_time_s"]
