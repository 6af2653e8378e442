"""PyTorch modules for the PyTorch ways in (``from_torch``, ``.pt2`` with a dynamic sequence,
``torch.compile``): a 2-layer BERT encoder on embeddings (attention with separate Q, K and V
projections, LayerNorm, a GELU feed-forward), and a transformers Llama returning its logits and
its key/value cache (``use_cache=True``). Needs torch (not imported by ``benchmarks.models``),
and transformers for the Llama."""

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


def llama_with_cache(vocab: int = 100, hidden: int = 64, layers: int = 1, heads: int = 4, intermediate: int = 128,
                     positions: int = 64) -> torch.nn.Module:
    """A transformers ``LlamaForCausalLM`` (random weights, from a small config) as a module of
    ``ids`` returning the logits and each layer's keys and values: its cache starts empty, as a
    first (prefill) call's does."""
    from benchmarks.onnx_models import import_torchvision

    import_torchvision()  # before transformers' model classes: they import torchvision when it is installed
    import transformers

    config = transformers.LlamaConfig(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers,
                                      num_attention_heads=heads, num_key_value_heads=heads,
                                      intermediate_size=intermediate, max_position_embeddings=positions)
    torch.manual_seed(0)
    llama = transformers.LlamaForCausalLM(config).eval()

    class WithCache(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = llama

        def forward(self, ids):
            out = self.inner(input_ids=ids, use_cache=True)
            return (out.logits, *(t for layer in out.past_key_values.layers for t in (layer.keys, layer.values)))

    return WithCache().eval()
