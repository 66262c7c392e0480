"""Attention models of the placement papers: the Transformer (encoder-decoder), BERT-large, GPT-2.

Attention is written out as matmul + softmax (see :class:`~.blocks.MultiHeadAttention`),
so every op of a captured step is a plain aten kernel.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .blocks import FeedForward, MultiHeadAttention, normal_init, token_batch
from .registry import require, zoo_model

__all__ = ["Transformer", "BertForMaskedLM", "GPT2", "transformer", "bert_large", "gpt2"]

_LANGUAGE_TINY = {"layers": 2, "hidden": 32, "heads": 2, "ff": 64, "vocab": 101, "seq_len": 8}


def _check_attention(name: str, hidden: int, heads: int) -> None:
    require(name, hidden % heads == 0, f"hidden ({hidden}) must be a multiple of heads ({heads})")


# ----------------------------------------------------------------------------- Transformer


class EncoderLayer(nn.Module):
    """Post-norm layer of Vaswani et al.: ``x = LN(x + attention(x)); x = LN(x + FFN(x))``."""

    def __init__(self, hidden: int, heads: int, ff: int, dropout: float):
        super().__init__()
        self.self_attention = MultiHeadAttention(hidden, heads, dropout)
        self.self_attention_norm = nn.LayerNorm(hidden)
        self.feed_forward = FeedForward(hidden, ff, dropout)
        self.feed_forward_norm = nn.LayerNorm(hidden)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.self_attention_norm(x + self.dropout(self.self_attention(x)))
        return self.feed_forward_norm(x + self.dropout(self.feed_forward(x)))


class DecoderLayer(nn.Module):
    """Causal self-attention, attention over the encoder output, feed-forward; each post-norm."""

    def __init__(self, hidden: int, heads: int, ff: int, dropout: float):
        super().__init__()
        self.self_attention = MultiHeadAttention(hidden, heads, dropout, causal=True)
        self.self_attention_norm = nn.LayerNorm(hidden)
        self.cross_attention = MultiHeadAttention(hidden, heads, dropout)
        self.cross_attention_norm = nn.LayerNorm(hidden)
        self.feed_forward = FeedForward(hidden, ff, dropout)
        self.feed_forward_norm = nn.LayerNorm(hidden)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, memory: torch.Tensor) -> torch.Tensor:
        x = self.self_attention_norm(x + self.dropout(self.self_attention(x)))
        x = self.cross_attention_norm(x + self.dropout(self.cross_attention(x, memory)))
        return self.feed_forward_norm(x + self.dropout(self.feed_forward(x)))


def sinusoid_table(length: int, hidden: int) -> torch.Tensor:
    """Fixed positional encodings of Vaswani et al. (2017), section 3.5."""
    position = torch.arange(length, dtype=torch.float32).unsqueeze(1)
    frequency = torch.exp(torch.arange(0, hidden, 2, dtype=torch.float32) * (-math.log(10000.0) / hidden))
    table = torch.zeros(length, hidden)
    table[:, 0::2] = torch.sin(position * frequency)
    table[:, 1::2] = torch.cos(position * frequency[: hidden // 2])
    return table


class Transformer(nn.Module):
    """Encoder-decoder Transformer (Vaswani et al., 2017) with one shared source/target vocabulary.

    As in the paper (section 3.4) the embedding matrix is shared by the source and target
    embeddings and the pre-softmax projection; the loss is label-smoothed (0.1) cross-entropy.
    """

    label_smoothing = 0.1

    def __init__(self, layers: int, hidden: int, heads: int, ff: int, vocab: int, length: int, dropout: float):
        super().__init__()
        self.embedding = nn.Embedding(vocab, hidden)
        self.register_buffer("positions", sinusoid_table(length, hidden), persistent=False)
        self.dropout = nn.Dropout(dropout)
        self.encoder = nn.ModuleList(EncoderLayer(hidden, heads, ff, dropout) for _ in range(layers))
        self.decoder = nn.ModuleList(DecoderLayer(hidden, heads, ff, dropout) for _ in range(layers))
        nn.init.normal_(self.embedding.weight, std=hidden**-0.5)  # tensor2tensor's, for the shared matrix

    def _embed(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embedding(tokens) * math.sqrt(self.embedding.embedding_dim)
        return self.dropout(x + self.positions[: tokens.shape[1]])

    def forward(self, source: torch.Tensor, target: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        memory = self._embed(source)
        for layer in self.encoder:
            memory = layer(memory)
        x = self._embed(target)
        for layer in self.decoder:
            x = layer(x, memory)
        logits = x @ self.embedding.weight.t()
        return F.cross_entropy(logits.flatten(0, 1), labels.flatten(), label_smoothing=self.label_smoothing)


@zoo_model(
    "transformer",
    paper_batch=32,
    tiny=_LANGUAGE_TINY,
    reference="Pesto section 5 (32 sentences); Vaswani et al. (2017), base model (Table 3)",
    description="Transformer base: 6+6 post-norm layers, d_model 512, 8 heads, FFN 2048, shared 37k vocabulary",
)
def transformer(
    batch_size: int,
    layers: int = 6,
    hidden: int = 512,
    heads: int = 8,
    ff: int = 2048,
    vocab: int = 37000,
    seq_len: int = 128,
    dropout: float = 0.1,
):
    """Transformer on source and target sentences of ``seq_len`` tokens (32 x 128 = FastT's 4096 tokens)."""
    _check_attention("transformer", hidden, heads)
    model = Transformer(layers, hidden, heads, ff, vocab, seq_len, dropout)
    return model, (
        token_batch(batch_size, seq_len, vocab),
        token_batch(batch_size, seq_len, vocab),
        token_batch(batch_size, seq_len, vocab),
    )


# ----------------------------------------------------------------------------- BERT


class BertLayer(nn.Module):
    """Post-norm BERT layer (GELU feed-forward, LayerNorm eps 1e-12)."""

    def __init__(self, hidden: int, heads: int, ff: int, dropout: float):
        super().__init__()
        self.attention = MultiHeadAttention(hidden, heads, dropout)
        self.attention_norm = nn.LayerNorm(hidden, eps=1e-12)
        self.feed_forward = FeedForward(hidden, ff, 0.0, activation="gelu")
        self.output_norm = nn.LayerNorm(hidden, eps=1e-12)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.attention_norm(x + self.dropout(self.attention(x)))
        return self.output_norm(x + self.dropout(self.feed_forward(x)))


class BertForMaskedLM(nn.Module):
    """BERT encoder (Devlin et al., 2019) with the masked-LM head of pre-training.

    The head runs only at the masked positions (as the reference TensorFlow code gathers
    them); its output projection is the word embedding matrix plus a bias.
    """

    def __init__(self, layers: int, hidden: int, heads: int, ff: int, vocab: int, positions: int, dropout: float):
        super().__init__()
        self.word_embeddings = nn.Embedding(vocab, hidden)
        self.position_embeddings = nn.Embedding(positions, hidden)
        self.token_type_embeddings = nn.Embedding(2, hidden)
        self.embedding_norm = nn.LayerNorm(hidden, eps=1e-12)
        self.dropout = nn.Dropout(dropout)
        self.encoder = nn.ModuleList(BertLayer(hidden, heads, ff, dropout) for _ in range(layers))
        self.mlm_transform = nn.Linear(hidden, hidden)
        self.mlm_norm = nn.LayerNorm(hidden, eps=1e-12)
        self.mlm_bias = nn.Parameter(torch.zeros(vocab))
        normal_init(self, std=0.02)

    def forward(
        self, tokens: torch.Tensor, segments: torch.Tensor, masked_positions: torch.Tensor, masked_labels: torch.Tensor
    ) -> torch.Tensor:
        position_ids = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.word_embeddings(tokens) + self.position_embeddings(position_ids) + self.token_type_embeddings(segments)
        x = self.dropout(self.embedding_norm(x))
        for layer in self.encoder:
            x = layer(x)
        index = masked_positions.unsqueeze(-1).expand(-1, -1, x.shape[-1])
        masked = self.mlm_norm(F.gelu(self.mlm_transform(x.gather(1, index))))
        logits = masked @ self.word_embeddings.weight.t() + self.mlm_bias
        return F.cross_entropy(logits.flatten(0, 1), masked_labels.flatten())


@zoo_model(
    "bert_large",
    paper_batch=16,
    tiny={**_LANGUAGE_TINY, "predictions": 2, "positions": 16},
    reference="FastT section 6 (Bert-large, batch 16, sequence length 64); Devlin et al. (2019)",
    description="BERT-large: 24 layers, hidden 1024, 16 heads, FFN 4096, 30522 vocabulary, masked-LM head",
)
def bert_large(
    batch_size: int,
    layers: int = 24,
    hidden: int = 1024,
    heads: int = 16,
    ff: int = 4096,
    vocab: int = 30522,
    seq_len: int = 64,
    positions: int = 512,
    predictions: int | None = None,
    dropout: float = 0.1,
):
    """BERT with the masked-LM loss on ``predictions`` positions per sequence (default 15% of ``seq_len``)."""
    _check_attention("bert_large", hidden, heads)
    require("bert_large", seq_len <= positions, f"seq_len ({seq_len}) exceeds positions ({positions})")
    predictions = predictions or max(1, round(0.15 * seq_len))
    require("bert_large", predictions <= seq_len, f"predictions ({predictions}) exceed seq_len ({seq_len})")
    model = BertForMaskedLM(layers, hidden, heads, ff, vocab, positions, dropout)
    inputs = (
        token_batch(batch_size, seq_len, vocab),
        token_batch(batch_size, seq_len, 2),
        token_batch(batch_size, predictions, seq_len),
        token_batch(batch_size, predictions, vocab),
    )
    return model, inputs


# ----------------------------------------------------------------------------- GPT-2


class GPT2Block(nn.Module):
    """Pre-norm decoder block of GPT-2: ``x + attn(LN(x))``, ``x + MLP(LN(x))``."""

    def __init__(self, hidden: int, heads: int, dropout: float):
        super().__init__()
        self.ln_1 = nn.LayerNorm(hidden)
        self.attn = MultiHeadAttention(hidden, heads, dropout, causal=True)
        self.ln_2 = nn.LayerNorm(hidden)
        self.mlp = FeedForward(hidden, 4 * hidden, 0.0, activation="gelu_tanh")
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.dropout(self.attn(self.ln_1(x)))
        return x + self.dropout(self.mlp(self.ln_2(x)))


class GPT2(nn.Module):
    """GPT-2 (Radford et al., 2019): decoder-only, output projection tied to the token embedding.

    ``lm_head.weight`` *is* ``wte.weight`` (one Parameter); the loss is next-token cross-entropy.
    """

    def __init__(self, layers: int, hidden: int, heads: int, vocab: int, positions: int, dropout: float):
        super().__init__()
        self.wte = nn.Embedding(vocab, hidden)
        self.wpe = nn.Embedding(positions, hidden)
        self.drop = nn.Dropout(dropout)
        self.h = nn.ModuleList(GPT2Block(hidden, heads, dropout) for _ in range(layers))
        self.ln_f = nn.LayerNorm(hidden)
        self.lm_head = nn.Linear(hidden, vocab, bias=False)
        self.lm_head.weight = self.wte.weight
        normal_init(self, std=0.02)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.drop(self.wte(tokens) + self.wpe(positions))
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits[:, :-1].flatten(0, 1), tokens[:, 1:].flatten())


@zoo_model(
    "gpt2",
    paper_batch=512,
    tiny={k: v for k, v in _LANGUAGE_TINY.items() if k != "ff"},
    reference="Radford et al. (2019), section 2.3 (batch 512, context 1024); GPT-2 small (124M)",
    description="GPT-2 small: 12 pre-norm decoder layers, hidden 768, 12 heads, 50257 vocabulary, tied output",
)
def gpt2(
    batch_size: int,
    layers: int = 12,
    hidden: int = 768,
    heads: int = 12,
    vocab: int = 50257,
    seq_len: int = 1024,
    positions: int = 1024,
    dropout: float = 0.1,
):
    """GPT-2; ``layers``/``hidden``/``heads`` give the larger sizes (24/1024/16 medium, 48/1600/25 XL)."""
    _check_attention("gpt2", hidden, heads)
    require("gpt2", 2 <= seq_len <= positions, f"seq_len must be in [2, positions={positions}], got {seq_len}")
    return GPT2(layers, hidden, heads, vocab, positions, dropout), (token_batch(batch_size, seq_len, vocab),)
