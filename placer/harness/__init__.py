"""Harnesses that measure by capturing, placing and running.

They sit above the cost models, the algorithms and the runtime, which they
drive: :mod:`~placer.harness.profiling` times a captured step node by node,
:mod:`~placer.harness.calibrate` fits a cluster's links and message costs
from timed runs, :mod:`~placer.harness.standard_eval` is Celeritas' Standard
Evaluation of operation costs, and :mod:`~placer.harness.feedback` turns the
times of a measured run into costs and a profile (FastT's measure-and-replan
loop, ``placer tune``).
"""
