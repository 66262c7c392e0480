"""Capture a multi-billion-parameter GPT-2-like training step on the meta device.

    python bench/capture_giant.py                         # 6.7B: 32 layers, width 4096, batch 8 x 1024
    python bench/capture_giant.py --layers 2 --width 256  # a quick check

The model (GPT-3 paper's 6.7B shape: 32 layers, width 4096, 32 heads, context 1024, GPT-2's
50257-token vocabulary, output projection tied to the embedding) is built under
``torch.device("meta")`` and its whole Adam training step captured with fake tensors.
Prints parameters, capture seconds (wall and CPU), nodes, edges, resident state, FLOPs and the process's
peak resident memory.
"""

from __future__ import annotations

import argparse
import resource
import time

import torch
from torch import nn

from placer.capture import capture


class Block(nn.Module):
    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln_1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.ln_2 = nn.LayerNorm(width)
        self.fc = nn.Linear(width, 4 * width)
        self.out = nn.Linear(4 * width, width)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = (
            y.view(b, t, self.heads, d // self.heads).transpose(1, 2) for y in self.qkv(self.ln_1(x)).split(d, dim=2)
        )
        a = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.out(nn.functional.gelu(self.fc(self.ln_2(x))))


class GPT(nn.Module):
    def __init__(self, vocab: int, context: int, width: int, heads: int, layers: int):
        super().__init__()
        self.wte = nn.Embedding(vocab, width)
        self.wpe = nn.Embedding(context, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(width)
        self.lm_head = nn.Linear(width, vocab, bias=False)
        self.lm_head.weight = self.wte.weight

    def forward(self, tokens, targets):
        x = self.wte(tokens) + self.wpe(torch.arange(tokens.shape[1], device=tokens.device))
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--width", type=int, default=4096)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--context", type=int, default=1024)
    parser.add_argument("--vocab", type=int, default=50257)
    args = parser.parse_args()
    with torch.device("meta"):
        model = GPT(args.vocab, args.context, args.width, args.heads, args.layers)
        tokens = torch.randint(0, args.vocab, (args.batch, args.context))
        targets = torch.randint(0, args.vocab, (args.batch, args.context))
    params = sum(p.numel() for p in model.parameters())
    started, cpu_started = time.perf_counter(), time.process_time()
    step = capture(model, (tokens, targets), optimizer="adam")
    seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - cpu_started
    g = step.graph
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print(
        f"GPT {args.layers} layers x {args.width}, {params / 1e9:.2f}B parameters, batch {args.batch} x {args.context}, Adam"
    )
    print(
        f"captured in {seconds:.1f} s wall, {cpu_seconds:.1f} s CPU (wall is higher on a busy machine): {g.num_nodes} nodes, {g.num_edges} edges, "
        f"resident state {g.param_bytes.sum() / 2**30:.1f} GiB, {g.flops.sum() / 1e12:.1f} TFLOP per step, "
        f"peak host memory of this process {peak:.2f} GiB"
    )
    print("reproduce: python bench/capture_giant.py " + " ".join(f"--{k} {v}" for k, v in vars(args).items()))


if __name__ == "__main__":
    main()
