"""Graph transforms that run before placement: colocation, merging, coarsening, fusion, op splitting, replication,
micro-batches.

Every one is registered by name and honours one contract (:mod:`placer.transform.base`): called as
:func:`apply_transform`, it returns a :class:`TransformResult` holding the new graph and the map between its
nodes and the original's, and states which costs and memory it conserves. :mod:`placer.transform.checks`
checks every registered transform against that statement.
"""

from . import coarsen, colocate, fusion, merge, microbatch, replicate, split  # noqa: F401  (they register their transforms)
from .base import (
    Ensures,
    NodeMap,
    Transform,
    TransformResult,
    apply_transform,
    available_transforms,
    get_transform,
    register_transform,
)

__all__ = [
    "Ensures",
    "NodeMap",
    "Transform",
    "TransformResult",
    "apply_transform",
    "available_transforms",
    "get_transform",
    "register_transform",
]
