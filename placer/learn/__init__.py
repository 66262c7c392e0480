"""Learned placement: graph families to train on, the Placeto policy and its REINFORCE training.

Submodules import torch on use; ``placer.learn.families`` needs only numpy.
"""
