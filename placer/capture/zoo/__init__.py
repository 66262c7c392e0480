"""The placement papers' models, written in plain PyTorch at configurable size.

:data:`ZOO` maps a name to a :class:`ZooEntry` whose ``factory(batch_size, **size_options)``
returns ``(model, inputs)`` with ``model(*inputs)`` the scalar training loss. Defaults are
the papers' configurations; ``entry.tiny`` is a configuration small enough for tests.
Factories create every tensor without an explicit device, so building under
``with torch.device("meta"):`` takes no memory, and they seed torch, so building is
deterministic.

Examples
--------
>>> from placer.capture.zoo import ZOO
>>> model, inputs = ZOO["lenet"].factory(4)
>>> model(*inputs).shape
torch.Size([])
"""

from . import language, nasnet, recurrent, vision  # noqa: F401 - importing registers their models
from .registry import SEED, ZOO, ZooEntry

__all__ = ["ZOO", "ZooEntry", "SEED"]
