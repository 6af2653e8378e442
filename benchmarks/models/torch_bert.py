"""A 2-layer BERT encoder as a PyTorch module (on embeddings: attention with separate Q, K and V
projections, LayerNorm, a GELU feed-forward), for the PyTorch ways in: ``from_torch`` and ``.pt2``
with a dynamic sequence, ``torch.compile``. Needs torch (not imported by ``benchmarks.models``)."""

from __future__ import annotations

import torch


class _Attention(torch.nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v, self.o = (torch.nn.Linear(d, d) for _ in range(4))

    def forward(self, x):
        b, n, d = x.shape
        q, k, v = (p(x).reshape(b, n, self.heads, d // self.heads).transpose(1, 2) for p in (self.q, self.k, self.v))
        a = torch.softmax(q @ k.transpose(-2, -1) * (d // self.heads) ** -0.5, dim=-1)
        return self.o((a @ v).transpose(1, 2).reshape(b, n, d))


class Bert(torch.nn.Module):
    """``layers`` BERT layers of width ``d`` on an input ``(batch, seq, d)``."""

    def __init__(self, d: int = 64, heads: int = 4, ffn: int = 128, layers: int = 2):
        super().__init__()
        self.attn = torch.nn.ModuleList([_Attention(d, heads) for _ in range(layers)])
        self.norm1 = torch.nn.ModuleList([torch.nn.LayerNorm(d, eps=1e-12) for _ in range(layers)])
        self.ffn = torch.nn.ModuleList([torch.nn.Sequential(torch.nn.Linear(d, ffn), torch.nn.GELU(),
                                                            torch.nn.Linear(ffn, d)) for _ in range(layers)])
        self.norm2 = torch.nn.ModuleList([torch.nn.LayerNorm(d, eps=1e-12) for _ in range(layers)])

    def forward(self, x):
        for attn, norm1, ffn, norm2 in zip(self.attn, self.norm1, self.ffn, self.norm2):
            x = norm1(x + attn(x))
            x = norm2(x + ffn(x))
        return x
