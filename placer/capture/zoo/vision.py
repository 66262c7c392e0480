"""Convolutional image classifiers of the placement papers: LeNet, AlexNet, VGG-19, ResNet, Inception-v3.

Module names follow torchvision's, so that op ``layer`` labels read like the published
diagrams (``layer3.4.conv2``, ``Mixed_6c.branch7x7dbl_3``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .blocks import ConvBN, ImageClassifier, image_batch, scaled
from .registry import require, zoo_model

__all__ = [
    "LeNet",
    "AlexNet",
    "VGG",
    "ResNet",
    "Bottleneck",
    "InceptionV3",
    "lenet",
    "alexnet",
    "vgg19",
    "resnet50",
    "resnet101",
    "resnet152",
    "resnet200",
    "inception_v3",
]

FASTT = "FastT (Yi et al., 2020), Table 1"


# ----------------------------------------------------------------------------- LeNet-5


class LeNet(ImageClassifier):
    """LeNet-5 (LeCun et al., 1998): two convolutions with pooling, three fully connected layers."""

    def __init__(self, channels: int, image_size: int, classes: int):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, 6, 5)
        self.conv2 = nn.Conv2d(6, 16, 5)
        side = ((image_size - 4) // 2 - 4) // 2
        self.fc1 = nn.Linear(16 * side * side, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, classes)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = F.relu(self.fc1(x.flatten(1)))
        return self.fc3(F.relu(self.fc2(x)))


@zoo_model(
    "lenet",
    paper_batch=256,
    reference=FASTT + "; LeNet-5 of LeCun et al. (1998), 61.7k parameters",
    description="LeNet-5: 2 conv + 3 fully connected layers on 32x32 grey images",
    tiny={},
)
def lenet(batch_size: int, image_size: int = 32, channels: int = 1, classes: int = 10):
    """LeNet-5 on ``channels`` x ``image_size``² images (the paper: 1 x 32²)."""
    require("lenet", image_size >= 16, f"image_size must be at least 16, got {image_size}")
    return LeNet(channels, image_size, classes), image_batch(batch_size, channels, image_size, classes)


# ----------------------------------------------------------------------------- AlexNet


class AlexNet(ImageClassifier):
    """AlexNet (Krizhevsky et al., 2012), single-tower form as in torchvision (61.1M parameters)."""

    def __init__(self, width: int, hidden: int, classes: int, dropout: float):
        super().__init__()
        c1, c2, c3, c4 = (scaled(c, width, 64) for c in (64, 192, 384, 256))
        self.features = nn.Sequential(
            nn.Conv2d(3, c1, 11, stride=4, padding=2),
            nn.ReLU(),
            nn.MaxPool2d(3, 2),
            nn.Conv2d(c1, c2, 5, padding=2),
            nn.ReLU(),
            nn.MaxPool2d(3, 2),
            nn.Conv2d(c2, c3, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(c3, c4, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(c4, c4, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(3, 2),
        )
        self.avgpool = nn.AdaptiveAvgPool2d(6)
        self.classifier = nn.Sequential(
            nn.Dropout(dropout),
            nn.Linear(c4 * 36, hidden),
            nn.ReLU(),
            nn.Dropout(dropout),
            nn.Linear(hidden, hidden),
            nn.ReLU(),
            nn.Linear(hidden, classes),
        )

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.avgpool(self.features(x)).flatten(1))


@zoo_model(
    "alexnet",
    paper_batch=256,
    reference=FASTT + "; Krizhevsky et al. (2012)",
    description="AlexNet: 5 conv + 3 fully connected layers (4096 wide), 224x224 images",
    tiny={"image_size": 64, "width": 4, "hidden": 32, "classes": 10},
)
def alexnet(
    batch_size: int,
    image_size: int = 224,
    width: int = 64,
    hidden: int = 4096,
    classes: int = 1000,
    dropout: float = 0.5,
):
    """AlexNet; ``width`` is the first convolution's channels (others scale with it)."""
    require("alexnet", image_size >= 63, f"image_size must be at least 63, got {image_size}")
    return AlexNet(width, hidden, classes, dropout), image_batch(batch_size, 3, image_size, classes)


# ----------------------------------------------------------------------------- VGG-19

VGG19_LAYOUT = (64, 64, "M", 128, 128, "M", 256, 256, 256, 256, "M", 512, 512, 512, 512, "M", 512, 512, 512, 512, "M")


class VGG(ImageClassifier):
    """VGG (Simonyan & Zisserman, 2015), configuration E (19 weight layers) by default."""

    def __init__(self, layout, width: int, hidden: int, classes: int, dropout: float):
        super().__init__()
        layers: list[nn.Module] = []
        channels = 3
        for item in layout:
            if item == "M":
                layers.append(nn.MaxPool2d(2, 2))
            else:
                out = scaled(item, width, 64)
                layers += [nn.Conv2d(channels, out, 3, padding=1), nn.ReLU()]
                channels = out
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d(7)
        self.classifier = nn.Sequential(
            nn.Linear(channels * 49, hidden),
            nn.ReLU(),
            nn.Dropout(dropout),
            nn.Linear(hidden, hidden),
            nn.ReLU(),
            nn.Dropout(dropout),
            nn.Linear(hidden, classes),
        )

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.avgpool(self.features(x)).flatten(1))


@zoo_model(
    "vgg19",
    paper_batch=64,
    reference=FASTT + "; Simonyan & Zisserman (2015), configuration E",
    description="VGG-19: 16 3x3 conv + 3 fully connected layers (4096 wide), 224x224 images",
    tiny={"image_size": 32, "width": 4, "hidden": 32, "classes": 10},
)
def vgg19(
    batch_size: int,
    image_size: int = 224,
    width: int = 64,
    hidden: int = 4096,
    classes: int = 1000,
    dropout: float = 0.5,
):
    """VGG-19; ``width`` is the first block's channels (64 in the paper, later blocks scale with it)."""
    require("vgg19", image_size >= 32, f"image_size must be at least 32, got {image_size}")
    return VGG(VGG19_LAYOUT, width, hidden, classes, dropout), image_batch(batch_size, 3, image_size, classes)


# ----------------------------------------------------------------------------- ResNet

RESNET_BLOCKS = {
    14: (1, 1, 1, 1),
    26: (2, 2, 2, 2),
    50: (3, 4, 6, 3),
    101: (3, 4, 23, 3),
    152: (3, 8, 36, 3),
    200: (3, 24, 36, 3),
}
"""Bottleneck blocks per stage by depth (He et al., 2016, Table 1; 200 from He et al., 2016b)."""


class Bottleneck(nn.Module):
    """1x1 reduce, 3x3 (stride on the 3x3 as in torchvision's ResNet v1.5), 1x1 expand, residual."""

    expansion = 4

    def __init__(self, in_channels: int, planes: int, stride: int):
        super().__init__()
        out = planes * self.expansion
        self.conv1 = nn.Conv2d(in_channels, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, out, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out)
        self.downsample = ConvBN(in_channels, out, 1, stride, relu=False) if stride != 1 or in_channels != out else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        y = F.relu(self.bn1(self.conv1(x)))
        y = F.relu(self.bn2(self.conv2(y)))
        return F.relu(self.bn3(self.conv3(y)) + identity)


class ResNet(ImageClassifier):
    """ResNet with bottleneck blocks (He et al., 2016): stem, four stages ``layer1``..``layer4``, fc."""

    def __init__(self, blocks: tuple[int, ...], width: int, classes: int):
        super().__init__()
        self.conv1 = nn.Conv2d(3, width, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        channels = width
        for stage, count in enumerate(blocks):
            planes = width * 2**stage
            layer = []
            for index in range(count):
                layer.append(Bottleneck(channels, planes, 2 if index == 0 and stage > 0 else 1))
                channels = planes * Bottleneck.expansion
            self.add_module(f"layer{stage + 1}", nn.Sequential(*layer))
        self.stages = len(blocks)
        self.fc = nn.Linear(channels, classes)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 3, 2, 1)
        for stage in range(self.stages):
            x = getattr(self, f"layer{stage + 1}")(x)
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))


def _resnet(name: str, batch_size: int, depth: int, image_size: int, width: int, classes: int):
    require(name, depth in RESNET_BLOCKS, f"depth must be one of {sorted(RESNET_BLOCKS)}, got {depth}")
    require(name, image_size >= 32, f"image_size must be at least 32, got {image_size}")
    return ResNet(RESNET_BLOCKS[depth], width, classes), image_batch(batch_size, 3, image_size, classes)


_RESNET_TINY = {"depth": 14, "image_size": 32, "width": 4, "classes": 10}
_RESNET_DOC = "ResNet-{0}: bottleneck blocks {1}, BatchNorm, 224x224 images"


@zoo_model(
    "resnet50",
    paper_batch=64,
    tiny=_RESNET_TINY,
    reference="Placeto/FastT image-model batch (64); He et al. (2016), Table 1",
    description=_RESNET_DOC.format(50, RESNET_BLOCKS[50]),
)
def resnet50(batch_size: int, depth: int = 50, image_size: int = 224, width: int = 64, classes: int = 1000):
    """ResNet-50 (``depth`` picks another bottleneck depth: 14, 26, 50, 101, 152, 200)."""
    return _resnet("resnet50", batch_size, depth, image_size, width, classes)


@zoo_model(
    "resnet101",
    paper_batch=64,
    tiny=_RESNET_TINY,
    reference="Placeto/FastT image-model batch (64); He et al. (2016), Table 1",
    description=_RESNET_DOC.format(101, RESNET_BLOCKS[101]),
)
def resnet101(batch_size: int, depth: int = 101, image_size: int = 224, width: int = 64, classes: int = 1000):
    """ResNet-101."""
    return _resnet("resnet101", batch_size, depth, image_size, width, classes)


@zoo_model(
    "resnet152",
    paper_batch=32,
    tiny=_RESNET_TINY,
    reference="FastT deep-ResNet batch (32, Table 1); He et al. (2016), Table 1",
    description=_RESNET_DOC.format(152, RESNET_BLOCKS[152]),
)
def resnet152(batch_size: int, depth: int = 152, image_size: int = 224, width: int = 64, classes: int = 1000):
    """ResNet-152."""
    return _resnet("resnet152", batch_size, depth, image_size, width, classes)


@zoo_model(
    "resnet200",
    paper_batch=32,
    tiny=_RESNET_TINY,
    reference=FASTT + " (ResNet200, batch 32); He et al. (2016b)",
    description=_RESNET_DOC.format(200, RESNET_BLOCKS[200]),
)
def resnet200(batch_size: int, depth: int = 200, image_size: int = 224, width: int = 64, classes: int = 1000):
    """ResNet-200."""
    return _resnet("resnet200", batch_size, depth, image_size, width, classes)


# ----------------------------------------------------------------------------- Inception-v3


class _Inception(nn.Module):
    """Parallel branches, each a sequence of convolutions (or a pool then convolutions), concatenated.

    ``branches`` maps a branch name to its steps: ``(name, out, kernel, stride, padding)`` for
    a ConvBN, or ``("avgpool"|"maxpool", stride)`` for a 3x3 pooling.
    """

    def __init__(self, in_channels: int, branches: dict, scale):
        super().__init__()
        self.plan = []
        self.out_channels = 0
        for branch, steps in branches.items():
            channels, names = in_channels, []
            for step in steps:
                if step[0] in ("avgpool", "maxpool"):
                    names.append(step)
                    continue
                name, out, kernel, stride, padding = step
                out = scale(out)
                self.add_module(name, ConvBN(channels, out, kernel, stride, padding, eps=1e-3))
                names.append(name)
                channels = out
            self.plan.append(names)
            self.out_channels += channels

    def _run(self, x: torch.Tensor, steps) -> torch.Tensor:
        for step in steps:
            if isinstance(step, tuple):
                kind, stride = step
                x = F.avg_pool2d(x, 3, stride, 1) if kind == "avgpool" else F.max_pool2d(x, 3, stride)
            else:
                x = getattr(self, step)(x)
        return x

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self._run(x, steps) for steps in self.plan], dim=1)


def _block_a(pool: int) -> dict:
    return {
        "1x1": [("branch1x1", 64, 1, 1, 0)],
        "5x5": [("branch5x5_1", 48, 1, 1, 0), ("branch5x5_2", 64, 5, 1, 2)],
        "3x3dbl": [("branch3x3dbl_1", 64, 1, 1, 0), ("branch3x3dbl_2", 96, 3, 1, 1), ("branch3x3dbl_3", 96, 3, 1, 1)],
        "pool": [("avgpool", 1), ("branch_pool", pool, 1, 1, 0)],
    }


def _block_b() -> dict:
    return {
        "3x3": [("branch3x3", 384, 3, 2, 0)],
        "3x3dbl": [("branch3x3dbl_1", 64, 1, 1, 0), ("branch3x3dbl_2", 96, 3, 1, 1), ("branch3x3dbl_3", 96, 3, 2, 0)],
        "pool": [("maxpool", 2)],
    }


def _block_c(c7: int) -> dict:
    row, col = ((1, 7), (0, 3)), ((7, 1), (3, 0))
    return {
        "1x1": [("branch1x1", 192, 1, 1, 0)],
        "7x7": [
            ("branch7x7_1", c7, 1, 1, 0),
            ("branch7x7_2", c7, row[0], 1, row[1]),
            ("branch7x7_3", 192, col[0], 1, col[1]),
        ],
        "7x7dbl": [
            ("branch7x7dbl_1", c7, 1, 1, 0),
            ("branch7x7dbl_2", c7, col[0], 1, col[1]),
            ("branch7x7dbl_3", c7, row[0], 1, row[1]),
            ("branch7x7dbl_4", c7, col[0], 1, col[1]),
            ("branch7x7dbl_5", 192, row[0], 1, row[1]),
        ],
        "pool": [("avgpool", 1), ("branch_pool", 192, 1, 1, 0)],
    }


def _block_d() -> dict:
    return {
        "3x3": [("branch3x3_1", 192, 1, 1, 0), ("branch3x3_2", 320, 3, 2, 0)],
        "7x7x3": [
            ("branch7x7x3_1", 192, 1, 1, 0),
            ("branch7x7x3_2", 192, (1, 7), 1, (0, 3)),
            ("branch7x7x3_3", 192, (7, 1), 1, (3, 0)),
            ("branch7x7x3_4", 192, 3, 2, 0),
        ],
        "pool": [("maxpool", 2)],
    }


class InceptionE(nn.Module):
    """Mixed_7b/7c: the 3x3 branches fork into parallel 1x3 and 3x1 convolutions."""

    def __init__(self, in_channels: int, scale):
        super().__init__()
        c320, c384, c448, c192 = scale(320), scale(384), scale(448), scale(192)
        self.branch1x1 = ConvBN(in_channels, c320, 1, eps=1e-3)
        self.branch3x3_1 = ConvBN(in_channels, c384, 1, eps=1e-3)
        self.branch3x3_2a = ConvBN(c384, c384, (1, 3), padding=(0, 1), eps=1e-3)
        self.branch3x3_2b = ConvBN(c384, c384, (3, 1), padding=(1, 0), eps=1e-3)
        self.branch3x3dbl_1 = ConvBN(in_channels, c448, 1, eps=1e-3)
        self.branch3x3dbl_2 = ConvBN(c448, c384, 3, padding=1, eps=1e-3)
        self.branch3x3dbl_3a = ConvBN(c384, c384, (1, 3), padding=(0, 1), eps=1e-3)
        self.branch3x3dbl_3b = ConvBN(c384, c384, (3, 1), padding=(1, 0), eps=1e-3)
        self.branch_pool = ConvBN(in_channels, c192, 1, eps=1e-3)
        self.out_channels = c320 + 4 * c384 + c192

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b3 = self.branch3x3_1(x)
        d3 = self.branch3x3dbl_2(self.branch3x3dbl_1(x))
        return torch.cat(
            [
                self.branch1x1(x),
                self.branch3x3_2a(b3),
                self.branch3x3_2b(b3),
                self.branch3x3dbl_3a(d3),
                self.branch3x3dbl_3b(d3),
                self.branch_pool(F.avg_pool2d(x, 3, 1, 1)),
            ],
            dim=1,
        )


class InceptionAux(nn.Module):
    """Auxiliary classifier on the 17x17 grid (after Mixed_6e)."""

    def __init__(self, in_channels: int, classes: int, scale):
        super().__init__()
        self.conv0 = ConvBN(in_channels, scale(128), 1, eps=1e-3)
        self.conv1 = ConvBN(scale(128), scale(768), 5, eps=1e-3)
        self.fc = nn.Linear(scale(768), classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv1(self.conv0(F.avg_pool2d(x, 5, 3)))
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))


class InceptionV3(ImageClassifier):
    """Inception-v3 (Szegedy et al., 2016) with torchvision's module structure and names.

    The training loss is ``CE(main) + aux_weight * CE(aux)`` when the auxiliary head is on.
    """

    aux_weight = 0.4

    def __init__(self, width: int, classes: int, aux: bool, dropout: float):
        super().__init__()
        scale = lambda c: scaled(c, width, 32)  # noqa: E731 - channel scaling shared by every block
        self.Conv2d_1a_3x3 = ConvBN(3, scale(32), 3, 2, eps=1e-3)
        self.Conv2d_2a_3x3 = ConvBN(scale(32), scale(32), 3, eps=1e-3)
        self.Conv2d_2b_3x3 = ConvBN(scale(32), scale(64), 3, padding=1, eps=1e-3)
        self.Conv2d_3b_1x1 = ConvBN(scale(64), scale(80), 1, eps=1e-3)
        self.Conv2d_4a_3x3 = ConvBN(scale(80), scale(192), 3, eps=1e-3)
        channels = scale(192)
        blocks = [
            ("Mixed_5b", _block_a(32)),
            ("Mixed_5c", _block_a(64)),
            ("Mixed_5d", _block_a(64)),
            ("Mixed_6a", _block_b()),
            ("Mixed_6b", _block_c(128)),
            ("Mixed_6c", _block_c(160)),
            ("Mixed_6d", _block_c(160)),
            ("Mixed_6e", _block_c(192)),
            ("Mixed_7a", _block_d()),
        ]
        for name, branches in blocks:
            block = _Inception(channels, branches, scale)
            self.add_module(name, block)
            channels = block.out_channels
            if name == "Mixed_6e":
                self.AuxLogits = InceptionAux(channels, classes, scale) if aux else None
        for name in ("Mixed_7b", "Mixed_7c"):
            block = InceptionE(channels, scale)
            self.add_module(name, block)
            channels = block.out_channels
        self.dropout = nn.Dropout(dropout)
        self.fc = nn.Linear(channels, classes)

    def _features(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        x = self.Conv2d_2b_3x3(self.Conv2d_2a_3x3(self.Conv2d_1a_3x3(x)))
        x = F.max_pool2d(x, 3, 2)
        x = F.max_pool2d(self.Conv2d_4a_3x3(self.Conv2d_3b_1x1(x)), 3, 2)
        for name in ("Mixed_5b", "Mixed_5c", "Mixed_5d", "Mixed_6a", "Mixed_6b", "Mixed_6c", "Mixed_6d", "Mixed_6e"):
            x = getattr(self, name)(x)
        aux = self.AuxLogits(x) if self.AuxLogits is not None else None
        for name in ("Mixed_7a", "Mixed_7b", "Mixed_7c"):
            x = getattr(self, name)(x)
        return self.fc(self.dropout(F.adaptive_avg_pool2d(x, 1).flatten(1))), aux

    def logits(self, images: torch.Tensor) -> torch.Tensor:
        return self._features(images)[0]

    def forward(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        main, aux = self._features(images)
        loss = F.cross_entropy(main, labels)
        return loss if aux is None else loss + self.aux_weight * F.cross_entropy(aux, labels)


def _inception_grid(image_size: int) -> int:
    """Side of the 17x17 grid (after Mixed_6e) for a given input side."""
    side = (image_size - 3) // 2 + 1 - 2  # Conv2d_1a (stride 2), Conv2d_2a
    side = (side - 3) // 2 + 1 - 2  # max pool, Conv2d_4a
    side = (side - 3) // 2 + 1  # max pool -> 35x35
    return (side - 3) // 2 + 1  # Mixed_6a -> 17x17


@zoo_model(
    "inception_v3",
    paper_batch=64,
    reference="Placeto appendix A.1 (batch 64, 299x299) and FastT Table 1 (64); Szegedy et al. (2016)",
    description="Inception-v3: stem, Mixed_5b..Mixed_7c blocks of parallel branches, aux head, 299x299",
    tiny={"width": 4, "classes": 10, "image_size": 75, "aux": False},
)
def inception_v3(
    batch_size: int, image_size: int = 299, width: int = 32, classes: int = 1000, aux: bool = True, dropout: float = 0.5
):
    """Inception-v3; ``width`` is the stem's first channels (32 in the paper, every block scales with it)."""
    grid = _inception_grid(image_size)
    require("inception_v3", grid >= 3, f"image_size must be at least 75, got {image_size}")
    require(
        "inception_v3",
        not aux or grid >= 17,
        f"the auxiliary head needs image_size >= 299 (a 17x17 grid), got {image_size}; pass aux=false",
    )
    return InceptionV3(width, classes, aux, dropout), image_batch(batch_size, 3, image_size, classes)
