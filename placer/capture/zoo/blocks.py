"""Building blocks shared by the zoo's models."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "ImageClassifier",
    "ConvBN",
    "image_batch",
    "MultiHeadAttention",
    "FeedForward",
    "LSTMLayer",
    "StackedLSTM",
    "token_batch",
    "scaled",
    "normal_init",
]


def scaled(channels: int, width: int, base: int) -> int:
    """``channels`` of the published network scaled by ``width / base``, at least 1."""
    return max(1, round(channels * width / base))


def normal_init(model: nn.Module, std: float) -> None:
    """BERT/GPT-2 initialisation: weights of linear and embedding layers ~ N(0, std), biases 0."""
    for module in model.modules():
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=std)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)


class ImageClassifier(nn.Module):
    """An image network whose ``forward(images, labels)`` is the mean cross-entropy loss."""

    def logits(self, images: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def forward(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(self.logits(images), labels)


def image_batch(batch_size: int, channels: int, image_size: int, classes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random images (N, C, H, W) and class labels (N,), built on the current default device."""
    return (torch.randn(batch_size, channels, image_size, image_size), torch.randint(classes, (batch_size,)))


def token_batch(batch_size: int, length: int, vocab: int) -> torch.Tensor:
    """Random token ids (N, length) in ``[0, vocab)``."""
    return torch.randint(vocab, (batch_size, length))


class ConvBN(nn.Module):
    """Convolution without bias, BatchNorm, optional ReLU (Inception's BasicConv2d, ResNet's stem)."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size,
        stride=1,
        padding=0,
        eps: float = 1e-5,
        relu: bool = True,
    ):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, stride, padding, bias=False)
        self.bn = nn.BatchNorm2d(out_channels, eps=eps)
        self.relu = relu

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.bn(self.conv(x))
        return F.relu(x) if self.relu else x


class MultiHeadAttention(nn.Module):
    """Multi-head scaled dot-product attention written out (matmul, softmax), as in the papers.

    Explicit matmuls rather than ``scaled_dot_product_attention`` keep the captured graph
    to kernels that every device kind and FLOP counter knows.
    """

    def __init__(self, hidden: int, heads: int, dropout: float, causal: bool = False):
        super().__init__()
        self.heads, self.causal = heads, causal
        self.query = nn.Linear(hidden, hidden)
        self.key = nn.Linear(hidden, hidden)
        self.value = nn.Linear(hidden, hidden)
        self.output = nn.Linear(hidden, hidden)
        self.dropout = nn.Dropout(dropout)

    def _split(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, hidden = x.shape
        return x.view(batch, length, self.heads, hidden // self.heads).transpose(1, 2)

    def forward(self, x: torch.Tensor, memory: torch.Tensor | None = None) -> torch.Tensor:
        source = x if memory is None else memory
        q, k, v = self._split(self.query(x)), self._split(self.key(source)), self._split(self.value(source))
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        if self.causal:
            length = x.shape[1]
            future = torch.ones(length, length, dtype=torch.bool, device=x.device).triu(1)
            scores = scores.masked_fill(future, float("-inf"))
        context = self.dropout(scores.softmax(dim=-1)) @ v
        return self.output(context.transpose(1, 2).flatten(2))


class FeedForward(nn.Module):
    """Position-wise two-layer network: ``hidden -> inner -> hidden``."""

    def __init__(self, hidden: int, inner: int, dropout: float, activation: str = "relu"):
        super().__init__()
        self.inner = nn.Linear(hidden, inner)
        self.outer = nn.Linear(inner, hidden)
        self.dropout = nn.Dropout(dropout)
        self.activation = activation

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inner(x)
        if self.activation == "relu":
            x = F.relu(x)
        else:  # "gelu" (exact erf form, BERT) or "gelu_tanh" (GPT-2's tanh approximation)
            x = F.gelu(x, approximate="tanh" if self.activation == "gelu_tanh" else "none")
        return self.outer(self.dropout(x))


class LSTMLayer(nn.Module):
    """One LSTM layer at one time step: ``LSTMCell`` on ``[x, extra]``, dropout, optional residual.

    Everything a layer does per step lives in this module, so that every op of a captured
    step carries its layer's name (the expert baseline splits by it).
    """

    def __init__(self, input_size: int, hidden: int, dropout: float = 0.0, residual: bool = False):
        super().__init__()
        self.cell = nn.LSTMCell(input_size, hidden)
        self.dropout = nn.Dropout(dropout)
        self.residual = residual

    def forward(
        self, x: torch.Tensor, state: tuple[torch.Tensor, torch.Tensor], extra: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        h, c = self.cell(x if extra is None else torch.cat([x, extra], dim=-1), state)
        out = self.dropout(h)
        return (x + out if self.residual else out), (h, c)


class StackedLSTM(nn.Module):
    """LSTM layers unrolled over time (one :class:`LSTMLayer` per layer, shared by all steps).

    Unrolling keeps every step's matmuls and gates as separate aten ops in a captured graph
    (the placement papers place the unrolled TensorFlow graph). Every layer also reads
    ``extra_inputs`` features per step (the attention context, see GNMT), and layers from
    index ``residual_from`` on add their input to their output.
    """

    def __init__(
        self,
        input_size: int,
        hidden: int,
        layers: int,
        dropout: float = 0.0,
        residual_from: int | None = None,
        extra_inputs: int = 0,
    ):
        super().__init__()
        self.hidden = hidden
        self.layers = nn.ModuleList(
            LSTMLayer(
                (input_size if i == 0 else hidden) + extra_inputs,
                hidden,
                dropout,
                residual=residual_from is not None and i >= residual_from,
            )
            for i in range(layers)
        )

    def initial_state(self, x: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        zeros = x.new_zeros(x.shape[0], self.hidden)
        return [(zeros, zeros) for _ in self.layers]

    def step(
        self, x: torch.Tensor, state: list[tuple[torch.Tensor, torch.Tensor]], extra: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, list]:
        """One time step through every layer; returns the top output and the new state."""
        new_state = []
        for layer, layer_state in zip(self.layers, state):
            x, layer_state = layer(x, layer_state, extra)
            new_state.append(layer_state)
        return x, new_state

    def forward(self, sequence: torch.Tensor) -> torch.Tensor:
        """(N, T, input_size) -> (N, T, hidden), from a zero state."""
        state = self.initial_state(sequence)
        outputs = []
        for t in range(sequence.shape[1]):
            out, state = self.step(sequence[:, t], state)
            outputs.append(out)
        return torch.stack(outputs, dim=1)
