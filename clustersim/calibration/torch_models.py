"""Catalog models built in plain torch, for timing them on the local device (``calibrate model``).

The shapes are the catalog's (catalogs/models.yaml), so the parameter tensors are the ones
workloads/transformer.py and workloads/resnet.py count (tests check both agree):

- transformer, style bert: learned token, position and token-type embeddings with LayerNorm,
  post-LayerNorm blocks (fused QKV, GELU MLP, dropout 0.1 as in BERT), pooler, MLM transform with
  the decoder tied to the word embedding, NSP classifier; loss = MLM + NSP cross-entropy;
- style gpt: learned token and position embeddings, pre-LayerNorm blocks, causal attention, final
  LayerNorm, LM head tied (unless ``tied_head: false``); next-token cross-entropy;
- style llama: token embedding, pre-RMSNorm blocks without biases, SwiGLU MLP, grouped-query
  attention (``kv_heads``), causal attention, final RMSNorm, untied head (unless ``tied_head``);
  rotary position embedding is left out (a few elementwise ops per block);
- ResNet: torchvision's ResNet v1.5 bottlenecks (stride on the 3x3 conv) from blocks and width.

``build`` makes the model, ``batch`` random inputs for it; ``loss_of(model, batch)`` runs one
forward including the loss.
"""

from __future__ import annotations

import math

from clustersim.catalog import ResNetArch, TransformerArch

BERT_DROPOUT = 0.1  # hidden and attention dropout of BERT (Devlin et al. 2019) and GPT-2
LN_EPS = 1e-12  # BERT's LayerNorm epsilon (HF BertConfig.layer_norm_eps); GPT/LLaMA use torch defaults


def build(torch, arch, device: str, attention: str = "sdpa"):
    """The model of a catalog architecture, on ``device``."""
    if isinstance(arch, ResNetArch):
        model = _resnet(torch, arch).to(device)
        return model.to(memory_format=torch.channels_last) if device == "cuda" else model
    return _transformer(torch, arch, attention).to(device)


def batch(torch, arch, micro_batch: int, seq_len: int, device: str) -> dict:
    """Random inputs and labels for one micro-batch (ResNet: ``seq_len`` is the image side)."""
    if isinstance(arch, ResNetArch):
        images = torch.randn(micro_batch, 3, seq_len, seq_len, device=device)
        if device == "cuda":
            images = images.to(memory_format=torch.channels_last)
        return {"images": images, "labels": torch.randint(0, arch.num_classes, (micro_batch,), device=device)}
    tokens = torch.randint(0, arch.vocab, (micro_batch, seq_len), device=device)
    out = {"tokens": tokens, "labels": torch.randint(0, arch.vocab, (micro_batch, seq_len), device=device)}
    if arch.style == "bert":
        out["token_types"] = torch.zeros_like(tokens)
        out["next_sentence"] = torch.randint(0, 2, (micro_batch,), device=device)
    return out


def loss_of(model, batch):
    return model(**batch)


def _norm(torch, arch: TransformerArch):
    nn = torch.nn
    if arch.style == "llama":
        return nn.RMSNorm(arch.hidden)
    return nn.LayerNorm(arch.hidden, eps=LN_EPS if arch.style == "bert" else 1e-5)


def _attention(torch, arch: TransformerArch, attention: str):
    nn, F = torch.nn, torch.nn.functional
    h, a = arch.hidden, arch.heads
    kv = h * (arch.kv_heads or a) // a
    llama, causal = arch.style == "llama", arch.style != "bert"
    p = BERT_DROPOUT if not llama else 0.0

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = nn.Linear(h, h + 2 * kv, bias=not llama)
            self.out = nn.Linear(h, h, bias=not llama)

        def forward(self, x):
            b, s, _ = x.shape
            q, k, v = self.qkv(x).split([h, kv, kv], dim=-1)
            q = q.view(b, s, a, h // a).transpose(1, 2)
            groups = a // (arch.kv_heads or a)
            k = k.view(b, s, -1, h // a).transpose(1, 2).repeat_interleave(groups, dim=1)
            v = v.view(b, s, -1, h // a).transpose(1, 2).repeat_interleave(groups, dim=1)
            drop = p if self.training else 0.0
            if attention == "sdpa":
                y = F.scaled_dot_product_attention(q, k, v, dropout_p=drop, is_causal=causal)
            else:  # "eager": the explicit softmax(QK^T / sqrt(d)) V of the original implementations
                scores = q @ k.transpose(-2, -1) / math.sqrt(h // a)
                if causal:
                    mask = torch.ones(s, s, dtype=torch.bool, device=x.device).triu(1)
                    scores = scores.masked_fill(mask, float("-inf"))
                y = F.dropout(scores.softmax(-1), drop, self.training) @ v
            return self.out(y.transpose(1, 2).reshape(b, s, h))

    return Attention()


def _block(torch, arch: TransformerArch, attention: str):
    nn, F = torch.nn, torch.nn.functional
    h, f = arch.hidden, arch.ffn
    llama, bert = arch.style == "llama", arch.style == "bert"
    p = BERT_DROPOUT if not llama else 0.0

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.attn = _attention(torch, arch, attention)
            self.norm1, self.norm2 = _norm(torch, arch), _norm(torch, arch)
            if llama:
                self.gate = nn.Linear(h, f, bias=False)
                self.up = nn.Linear(h, f, bias=False)
                self.down = nn.Linear(f, h, bias=False)
            else:
                self.up = nn.Linear(h, f)
                self.down = nn.Linear(f, h)
            self.drop = nn.Dropout(p)

        def mlp(self, x):
            if llama:
                return self.down(F.silu(self.gate(x)) * self.up(x))
            return self.down(F.gelu(self.up(x)))

        def forward(self, x):
            if bert:  # post-LayerNorm
                x = self.norm1(x + self.drop(self.attn(x)))
                return self.norm2(x + self.drop(self.mlp(x)))
            x = x + self.drop(self.attn(self.norm1(x)))
            return x + self.drop(self.mlp(self.norm2(x)))

    return Block()


def _transformer(torch, arch: TransformerArch, attention: str):
    nn, F = torch.nn, torch.nn.functional
    h = arch.hidden
    llama, bert = arch.style == "llama", arch.style == "bert"
    p = BERT_DROPOUT if not llama else 0.0

    def norm():
        return _norm(torch, arch)

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.tokens = nn.Embedding(arch.vocab, h)
            self.positions = nn.Embedding(arch.max_positions, h) if arch.max_positions else None
            self.types = nn.Embedding(arch.token_types, h) if arch.token_types else None
            self.embed_norm = norm() if bert else None
            self.drop = nn.Dropout(p)
            self.blocks = nn.ModuleList(_block(torch, arch, attention) for _ in range(arch.layers))
            tied = arch.tied_head if arch.tied_head is not None else not llama
            if bert:
                self.pooler = nn.Linear(h, h)
                self.transform = nn.Linear(h, h)
                self.transform_norm = norm()
                self.decoder_bias = nn.Parameter(torch.zeros(arch.vocab))
                self.nsp = nn.Linear(h, 2)
            else:
                self.final_norm = norm()
                self.head = None if tied else nn.Linear(h, arch.vocab, bias=False)

        def forward(self, tokens, labels, token_types=None, next_sentence=None):
            s = tokens.shape[1]
            x = self.tokens(tokens)
            if self.positions is not None:
                x = x + self.positions(torch.arange(s, device=tokens.device))
            if self.types is not None and token_types is not None:
                x = x + self.types(token_types)
            if self.embed_norm is not None:
                x = self.embed_norm(x)
            x = self.drop(x)
            for block in self.blocks:
                x = block(x)
            if bert:
                pooled = torch.tanh(self.pooler(x[:, 0]))
                y = self.transform_norm(F.gelu(self.transform(x)))
                logits = F.linear(y, self.tokens.weight, self.decoder_bias)
                mlm = F.cross_entropy(logits.view(-1, arch.vocab), labels.view(-1))
                return mlm + F.cross_entropy(self.nsp(pooled), next_sentence)
            x = self.final_norm(x)
            logits = self.head(x) if self.head is not None else F.linear(x, self.tokens.weight)
            return F.cross_entropy(logits[:, :-1].reshape(-1, arch.vocab), labels[:, 1:].reshape(-1))

    return Model()


def _resnet(torch, arch: ResNetArch):
    nn, F = torch.nn, torch.nn.functional
    expansion = 4  # bottleneck output channels = 4 x its width (He et al. 2016, Table 1)

    class Bottleneck(nn.Module):
        def __init__(self, cin: int, width: int, stride: int):
            super().__init__()
            cout = width * expansion
            self.conv1, self.bn1 = nn.Conv2d(cin, width, 1, bias=False), nn.BatchNorm2d(width)
            self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
            self.bn2 = nn.BatchNorm2d(width)
            self.conv3, self.bn3 = nn.Conv2d(width, cout, 1, bias=False), nn.BatchNorm2d(cout)
            self.down = None
            if stride != 1 or cin != cout:
                self.down = nn.Sequential(
                    nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout)
                )

        def forward(self, x):
            y = F.relu(self.bn1(self.conv1(x)))
            y = F.relu(self.bn2(self.conv2(y)))
            y = self.bn3(self.conv3(y))
            return F.relu(y + (x if self.down is None else self.down(x)))

    class ResNet(nn.Module):
        def __init__(self):
            super().__init__()
            w = arch.width
            self.stem = nn.Sequential(
                nn.Conv2d(3, w, 7, stride=2, padding=3, bias=False), nn.BatchNorm2d(w), nn.ReLU(inplace=True)
            )
            stages, cin = [], w
            for i, n in enumerate(arch.blocks):
                width = w * 2**i
                for j in range(n):
                    stages.append(Bottleneck(cin, width, 2 if (j == 0 and i > 0) else 1))
                    cin = width * expansion
            self.stages = nn.Sequential(*stages)
            self.fc = nn.Linear(cin, arch.num_classes)

        def forward(self, images, labels):
            x = F.max_pool2d(self.stem(images), 3, stride=2, padding=1)
            x = torch.flatten(F.adaptive_avg_pool2d(self.stages(x), 1), 1)
            return F.cross_entropy(self.fc(x), labels)

    return ResNet()
