"""PyTorch modules for the PyTorch ways in (``from_torch``, ``.pt2`` with a dynamic sequence,
``torch.compile``): a 2-layer BERT encoder on embeddings (attention with separate Q, K and V
projections, LayerNorm, a GELU feed-forward), a transformers Llama returning its logits and
its key/value cache (``use_cache=True``), and ResNet-50 as torchvision defines it, without
torchvision (which does not import beside this machine's CPU torch). Needs torch (not imported
by ``benchmarks.models``), and transformers for the Llama."""

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


class _Bottleneck(torch.nn.Module):
    """torchvision's ResNet v1.5 bottleneck: 1x1, 3x3 (with the stride), 1x1 x4, each conv
    without bias and followed by a batch norm; a projection when the shape changes."""

    def __init__(self, cin: int, planes: int, stride: int):
        super().__init__()
        out = 4 * planes

        def conv_bn(a, b, k, s=1):
            return torch.nn.Sequential(torch.nn.Conv2d(a, b, k, s, k // 2, bias=False), torch.nn.BatchNorm2d(b))

        self.conv1, self.conv2, self.conv3 = conv_bn(cin, planes, 1), conv_bn(planes, planes, 3, stride), conv_bn(planes, out, 1)
        self.downsample = conv_bn(cin, out, 1, stride) if stride != 1 or cin != out else None

    def forward(self, x):
        y = self.conv3(torch.relu(self.conv2(torch.relu(self.conv1(x)))))
        return torch.relu(y + (x if self.downsample is None else self.downsample(x)))


class ResNet50(torch.nn.Module):
    """ResNet-50 (``torchvision.models.resnet50``'s layers; ``width`` 64 is its stem's channels) on
    ``(batch, 3, H, W)``, random weights and batch-norm statistics (seed 0), in eval mode."""

    def __init__(self, width: int = 64, classes: int = 1000):
        super().__init__()
        torch.manual_seed(0)
        self.stem = torch.nn.Sequential(torch.nn.Conv2d(3, width, 7, 2, 3, bias=False), torch.nn.BatchNorm2d(width),
                                        torch.nn.ReLU(), torch.nn.MaxPool2d(3, 2, 1))
        blocks, cin = [], width
        for stage, count in enumerate((3, 4, 6, 3)):
            for b in range(count):
                blocks.append(_Bottleneck(cin, width * 2**stage, 2 if b == 0 and stage > 0 else 1))
                cin = 4 * width * 2**stage
        self.blocks = torch.nn.Sequential(*blocks)
        self.fc = torch.nn.Linear(cin, classes)
        for m in self.modules():
            if isinstance(m, torch.nn.BatchNorm2d):  # statistics a trained model would have, not 0 and 1
                m.running_mean.uniform_(-0.1, 0.1)
                m.running_var.uniform_(0.5, 1.5)
        self.eval()

    def forward(self, x):
        return self.fc(torch.flatten(torch.nn.functional.adaptive_avg_pool2d(self.blocks(self.stem(x)), 1), 1))
