"""NASNet-A (Zoph et al., 2018): a stem, then stacks of normal cells split by reduction cells.

Each cell runs five pairs of operations (separable convolutions, pooling, identity) on two
hidden states, adds each pair, and concatenates the results it did not use: the wide,
branchy graph Pesto and Placeto place. Cell wiring follows TensorFlow-slim's
``nasnet_utils`` (NASNet-A normal and reduction cells) and ``build_nasnet_large``
(ImageNet stem of two reduction cells, ``skip_reduction_layer_input``, auxiliary head
before the second reduction). Drop-path is left out (it is a training-time mask).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .blocks import ImageClassifier, image_batch
from .registry import require, zoo_model

__all__ = ["NASNet", "Cell", "nasnet", "NORMAL_CELL", "REDUCTION_CELL"]

NORMAL_CELL = (
    (
        "separable_5x5",
        "separable_3x3",
        "separable_5x5",
        "separable_3x3",
        "avg_pool_3x3",
        "identity",
        "avg_pool_3x3",
        "avg_pool_3x3",
        "separable_3x3",
        "identity",
    ),
    (0, 1, 1, 1, 0, 1, 1, 1, 0, 0),
    (1, 0, 0, 0, 0, 0, 0),
)
REDUCTION_CELL = (
    (
        "separable_5x5",
        "separable_7x7",
        "max_pool_3x3",
        "separable_7x7",
        "avg_pool_3x3",
        "separable_5x5",
        "identity",
        "avg_pool_3x3",
        "separable_3x3",
        "max_pool_3x3",
    ),
    (0, 1, 0, 1, 0, 1, 3, 2, 2, 0),
    (1, 1, 1, 0, 0, 0, 0),
)
"""(operations, hidden state each reads, hidden states used inside the cell) of NASNet-A."""

EPS = 1e-3


def _relu_conv_bn(in_channels: int, out_channels: int, stride: int = 1) -> nn.Sequential:
    return nn.Sequential(
        nn.ReLU(), nn.Conv2d(in_channels, out_channels, 1, stride, bias=False), nn.BatchNorm2d(out_channels, eps=EPS)
    )


class SeparableConvs(nn.Module):
    """``separable_kxk_2``: twice (ReLU, depthwise kxk, pointwise 1x1, BatchNorm); stride on the first."""

    def __init__(self, in_channels: int, out_channels: int, kernel: int, stride: int):
        super().__init__()
        layers = []
        for step, channels in enumerate((in_channels, out_channels)):
            layers += [
                nn.ReLU(),
                nn.Conv2d(
                    channels, channels, kernel, stride if step == 0 else 1, kernel // 2, groups=channels, bias=False
                ),
                nn.Conv2d(channels, out_channels, 1, bias=False),
                nn.BatchNorm2d(out_channels, eps=EPS),
            ]
        self.layers = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


class Pool(nn.Module):
    """3x3 average or max pooling ('SAME', padding not averaged), then 1x1 conv + BN if channels change."""

    def __init__(self, kind: str, in_channels: int, out_channels: int, stride: int):
        super().__init__()
        self.kind, self.stride = kind, stride
        self.project = (
            nn.Sequential(nn.Conv2d(in_channels, out_channels, 1, bias=False), nn.BatchNorm2d(out_channels, eps=EPS))
            if in_channels != out_channels
            else None
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = (
            F.avg_pool2d(x, 3, self.stride, 1, count_include_pad=False)
            if self.kind == "avg"
            else F.max_pool2d(x, 3, self.stride, 1)
        )
        return x if self.project is None else self.project(x)


class FactorizedReduction(nn.Module):
    """Halve the grid without losing pixels: two strided 1x1 paths, the second shifted by one."""

    def __init__(self, in_channels: int, out_channels: int):
        super().__init__()
        self.path1 = nn.Conv2d(in_channels, out_channels // 2, 1, bias=False)
        self.path2 = nn.Conv2d(in_channels, out_channels // 2, 1, bias=False)
        self.bn = nn.BatchNorm2d(out_channels, eps=EPS)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(x)
        shifted = F.pad(x, (0, 1, 0, 1))[:, :, 1:, 1:]
        return self.bn(torch.cat([self.path1(x[:, :, ::2, ::2]), self.path2(shifted[:, :, ::2, ::2])], dim=1))


def _operation(name: str, in_channels: int, out_channels: int, stride: int) -> nn.Module:
    if name.startswith("separable"):
        return SeparableConvs(in_channels, out_channels, int(name[-1]), stride)
    if name.endswith("pool_3x3"):
        return Pool(name[:3], in_channels, out_channels, stride)
    if stride > 1 or in_channels != out_channels:  # "identity" that must change shape
        return _relu_conv_bn(in_channels, out_channels, stride)
    return nn.Identity()


class Cell(nn.Module):
    """One NASNet-A cell on hidden states (this cell's input ``x``, the one before it ``prev``).

    Parameters
    ----------
    spec : tuple
        :data:`NORMAL_CELL` or :data:`REDUCTION_CELL`.
    in_channels, prev_channels : int
        Channels of ``x`` and ``prev`` (``prev_channels`` None: the cell reads ``x`` twice).
    prev_larger : bool
        ``prev`` has twice ``x``'s grid side (a reduction lies between them).
    filters : int
        Channels of every branch.
    stride : int
        2 for a reduction cell: applied by the operations reading the two input states.
    """

    def __init__(self, spec, in_channels: int, prev_channels: int | None, prev_larger: bool, filters: int, stride: int):
        super().__init__()
        operations, reads, used = spec
        self.reads = reads
        if prev_channels is None:
            self.prev, prev_out = None, in_channels
        elif prev_larger:
            self.prev, prev_out = FactorizedReduction(prev_channels, filters), filters
        elif prev_channels != filters:
            self.prev, prev_out = _relu_conv_bn(prev_channels, filters), filters
        else:
            self.prev, prev_out = nn.Identity(), filters
        self.beginning = _relu_conv_bn(in_channels, filters)
        channels = [filters, prev_out] + [filters] * 5
        self.ops = nn.ModuleList(
            _operation(name, channels[state], filters, stride if state < 2 else 1)
            for name, state in zip(operations, reads)
        )
        self.concat = [i for i, in_use in enumerate(used) if not in_use]
        self.out_channels = sum(channels[i] for i in self.concat)

    def forward(self, x: torch.Tensor, prev: torch.Tensor | None) -> torch.Tensor:
        states = [self.beginning(x), x if self.prev is None else self.prev(prev)]
        for pair in range(5):
            left, right = 2 * pair, 2 * pair + 1
            states.append(self.ops[left](states[self.reads[left]]) + self.ops[right](states[self.reads[right]]))
        return torch.cat([states[i] for i in self.concat], dim=1)


class AuxHead(nn.Module):
    """NASNet's auxiliary classifier: ReLU, 5x5/3 average pool, 1x1 conv 128, conv over the grid to 768, fc."""

    def __init__(self, in_channels: int, grid: int, classes: int):
        super().__init__()
        side = (grid - 5) // 3 + 1
        self.proj = nn.Sequential(nn.Conv2d(in_channels, 128, 1, bias=False), nn.BatchNorm2d(128, eps=EPS), nn.ReLU())
        self.conv = nn.Sequential(nn.Conv2d(128, 768, side, bias=False), nn.BatchNorm2d(768, eps=EPS), nn.ReLU())
        self.fc = nn.Linear(768, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.conv(self.proj(F.avg_pool2d(F.relu(x), 5, 3))).flatten(1))


class NASNet(ImageClassifier):
    """NASNet-A for ImageNet: ``cells`` normal cells per stack, three stacks, ``filters`` in the first.

    Module names follow TF-slim: ``cell_stem_0``, ``cell_stem_1``, ``cell_0``.., ``reduction_cell_0``,
    ``reduction_cell_1``, ``aux_head``. The loss adds 0.4 x the auxiliary head's loss.
    """

    aux_weight = 0.4

    def __init__(
        self, cells: int, filters: int, stem_filters: int, image_size: int, classes: int, aux: bool, dropout: float
    ):
        super().__init__()
        self.conv0 = nn.Conv2d(3, stem_filters, 3, 2, bias=False)
        self.conv0_bn = nn.BatchNorm2d(stem_filters, eps=EPS)
        grid = (image_size - 3) // 2 + 1
        # (channels, grid side) of each hidden state; index 0 is "no state" (the stem reads its input twice)
        self._shapes: list[tuple[int, int] | None] = [None, (stem_filters, grid)]
        self._wiring: list[tuple[str, int]] = []  # (module name, index of its ``prev`` state)
        for stem in range(2):
            self._add_cell(f"cell_stem_{stem}", REDUCTION_CELL, filters // 4 * 2**stem, 2, len(self._shapes) - 2)
        total = 3 * cells
        reductions = [total // 3, 2 * total // 3]
        scaling = 1
        self.aux_after = f"cell_{reductions[1] - 1}" if aux else None
        for number in range(total):
            prev_index = len(self._shapes) - 2  # skip_reduction_layer_input: chosen before any reduction
            if number in reductions:
                scaling *= 2
                self._add_cell(
                    f"reduction_cell_{reductions.index(number)}",
                    REDUCTION_CELL,
                    filters * scaling,
                    2,
                    len(self._shapes) - 2,
                )
            self._add_cell(f"cell_{number}", NORMAL_CELL, filters * scaling, 1, prev_index)
            if self.aux_after == f"cell_{number}":
                self.aux_head = AuxHead(*self._shapes[-1], classes)
        self.dropout = nn.Dropout(dropout)
        self.fc = nn.Linear(self._shapes[-1][0], classes)

    def _add_cell(self, name: str, spec, filters: int, stride: int, prev_index: int) -> None:
        in_channels, grid = self._shapes[-1]
        prev = self._shapes[prev_index]
        cell = Cell(
            spec, in_channels, None if prev is None else prev[0], prev is not None and prev[1] != grid, filters, stride
        )
        self.add_module(name, cell)
        self._wiring.append((name, prev_index))
        self._shapes.append((cell.out_channels, (grid - 1) // stride + 1))

    def _run(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        states: list[torch.Tensor | None] = [None, self.conv0_bn(self.conv0(images))]
        aux = None
        for name, prev_index in self._wiring:
            states.append(getattr(self, name)(states[-1], states[prev_index]))
            if name == self.aux_after:
                aux = self.aux_head(states[-1])
        x = F.adaptive_avg_pool2d(F.relu(states[-1]), 1).flatten(1)
        return self.fc(self.dropout(x)), aux

    def logits(self, images: torch.Tensor) -> torch.Tensor:
        return self._run(images)[0]

    def forward(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        main, aux = self._run(images)
        loss = F.cross_entropy(main, labels)
        return loss if aux is None else loss + self.aux_weight * F.cross_entropy(aux, labels)


@zoo_model(
    "nasnet",
    paper_batch=32,
    reference="Pesto section 5 (NASNet, batch 32; 6 cells x 168 filters); Zoph et al. (2018), "
    "NASNet-A Large (6 @ 4032), 331x331 images",
    description="NASNet-A Large: stem, 3 stacks of 6 normal cells (168 filters) split by 2 reduction cells",
    tiny={"cells": 1, "filters": 8, "stem_filters": 8, "image_size": 72, "classes": 10},
)
def nasnet(
    batch_size: int,
    cells: int = 6,
    filters: int = 168,
    stem_filters: int = 96,
    image_size: int = 331,
    classes: int = 1000,
    aux: bool = True,
    dropout: float = 0.5,
):
    """NASNet-A; ``cells`` normal cells per stack, ``filters`` per branch in the first stack (doubled per reduction)."""
    require("nasnet", filters % 4 == 0, f"filters must be a multiple of 4, got {filters}")
    grid = ((image_size - 3) // 2 + 1 + 7) // 8  # grid side at the auxiliary head: conv0, then 3 halvings
    require("nasnet", image_size >= 32, f"image_size must be at least 32, got {image_size}")
    require(
        "nasnet",
        not aux or grid >= 5,
        f"the auxiliary head needs a grid of at least 5 (image_size >= 67), got image_size {image_size}; "
        f"pass aux=false",
    )
    return (
        NASNet(cells, filters, stem_filters, image_size, classes, aux, dropout),
        image_batch(batch_size, 3, image_size, classes),
    )
