"""
SimpleTRON, and beside it the softmax Transformer / GPT that it simplifies.

Paper: Yorsh, Vancura, Kordik, Kovalenko, Vasata, Mikolov, "SimpleTRON: Simple Transformer with O(N)
Complexity" (2022). One head of softmax attention is

    Attention(Q_h, K_h, V_h) = softmax(Q_h K_h^T / sqrt(d)) V_h                   (Section 3)

and costs O(n^2 d) for n tokens. SimpleTRON drops the softmax, which lets the product be reordered:

    SimpleAttention(Q_h, K_h, V_h) = Q_h (K_h^T V_h) / sqrt(n)                    (Section 3)

K_h^T V_h is a d x d matrix, so the cost is O(n d^2): linear in the sequence length, and no n x n
matrix is ever formed. The block around it is the ordinary Transformer block; the paper's Table 1
compares three ways to wire it (Config.variant):

    simple : attention heads concatenated straight into the residual sum (no output linear)
    res    : simple + an extra skip: the block input is added again at the block output (Fig. 4)
    resl   : res + the output linear W_O after the heads
    vanilla: the output linear and no extra skip: the ordinary Transformer block

Config.attention = "softmax" swaps the attention for F.scaled_dot_product_attention with the same
q/k/v/o shapes, so the same file is the vanilla Transformer (head "cls"/"match") and GPT (head "lm"),
and trained SimpleTRON weights transfer into it (Section 4.2, transfer_attention below).

Two more baselines, those of the TransJect paper (Sengupta et al. 2023, Tables 1-3):
    Config.norm = "rezero"    Transformer + ReZero (Bachlechner et al. 2020): x + α f(x) for each sublayer,
                              α a learnable scalar per block starting at 0, and no LayerNorm anywhere
    Config.orthogonal = True  Orthogonal Transformer: every weight matrix of the blocks is orthogonal, made
                              by a hand-written Cayley map (W_Q, W_K, W_V, W_O; the MLP's 4D x D and D x 4D
                              as four orthogonal D x D blocks each)

The model interface, identical in every model file of this project:
    config = Config(vocab_size=..., block_size=..., head="cls"|"match"|"lm", n_classes=..., ...)
    model = Model(config)
    logits, loss = model(idx, targets=None)
idx is (B, L) int64 for heads "cls" and "lm", (B, 2, L) for "match"; token id 0 is padding.
logits are (B, n_classes) for "cls"/"match" and (B, L, vocab_size) for "lm"; loss is None without
targets (lm targets use -1 for positions to ignore).
"""

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint as recompute


@dataclass
class Config:
    # nanoGPT's names
    vocab_size: int = 32      # token ids 0..vocab_size-1, id 0 is padding
    block_size: int = 2000    # the longest input sequence, idx.shape[-1]
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    dropout: float = 0.1
    bias: bool = True
    # the task's head
    head: str = "cls"         # "cls": one sequence -> class, "match": a pair -> class, "lm": next token
    n_classes: int = 10       # cls/match only
    # this model's own fields
    attention: str = "simple"  # "simple" (SimpleTRON) or "softmax" (vanilla Transformer / GPT)
    variant: str = "res"       # "simple" | "res" | "resl" (Table 1) | "vanilla" (ordinary block)
    norm: str = "post"         # "post": LayerNorm after each residual sum (Transformer/BERT, the paper's
                               # Fig. 4); "pre": LayerNorm before each sublayer (GPT-2, nanoGPT);
                               # "rezero": x + α f(x), α from 0, no LayerNorm (ReZero)
    orthogonal: bool = False   # every weight matrix of the blocks orthogonal (Orthogonal Transformer)
    mlp_ratio: int = 4         # MLP width = mlp_ratio * n_embd (Table 3: 256 -> 1024)
    freeze_qkv: bool = False   # attention transfer (Section 4.2): q/k/v are not trained
    checkpointing: bool = False  # recompute each block in the backward pass instead of storing its activations

    def __post_init__(self):
        choices = dict(head=("cls", "match", "lm"), attention=("simple", "softmax"),
                       variant=("simple", "res", "resl", "vanilla"), norm=("post", "pre", "rezero"))
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {', '.join(allowed)}, not {getattr(self, name)!r}")
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd ({self.n_embd}) must be a multiple of n_head ({self.n_head})")


# ----------------------------------------------------------------------------------------------
# The Orthogonal Transformer's weights

def cayley(A):
    """W = (I - A)(I + A)^{-1}: orthogonal (det +1) for skew-symmetric A (..., n, n). I - A and (I + A)^{-1}
    commute, so we solve (I + A) W = I - A."""
    I = torch.eye(A.shape[-1], dtype=A.dtype, device=A.device)
    return torch.linalg.solve(I + A, I - A)


class OrthogonalLinear(nn.Module):
    """nn.Linear whose weight (n_out, n_in) is made of orthogonal m x m blocks, m = min(n_in, n_out), each the
    Cayley map of a skew-symmetric P - P^T: stacked (n_out > n_in) or side by side (n_out < n_in)."""

    def __init__(self, n_in, n_out, bias=True):
        super().__init__()
        m = min(n_in, n_out)
        self.P = nn.Parameter(torch.randn(max(n_in, n_out) // m, m, m) / math.sqrt(m))
        self.bias = nn.Parameter(torch.zeros(n_out)) if bias else None
        self.stacked = n_out >= n_in

    @property
    def weight(self):                                        # (n_out, n_in), made once per call
        W = cayley(self.P - self.P.transpose(-2, -1))        # (k, m, m) orthogonal blocks
        return W.flatten(0, 1) if self.stacked else W.transpose(0, 1).flatten(1)

    def forward(self, x):
        return F.linear(x, self.weight, self.bias)


# ----------------------------------------------------------------------------------------------
# Attention. Both take q, k, v of shape (B, H, L, d) and a mask (B, L) of real tokens, or None.

def simple_attention(q, k, v, mask):
    """SimpleTRON, bidirectional: Q_h (K_h^T V_h) / sqrt(n), n = number of real tokens."""
    if mask is not None:
        k = k * mask[:, None, :, None]                       # padded tokens add nothing to K^T V
        n = mask.sum(1).clamp(min=1)[:, None, None, None]    # (B, 1, 1, 1) real tokens
    else:
        n = torch.tensor(q.shape[2])
    # SimpleAttention(Q_h, K_h, V_h) = Q_h (K_h^T V_h) / sqrt(n)                  (Section 3)
    KV = k.transpose(-2, -1) @ v                             # (B, H, d, d)
    return q @ (KV / n.to(q.dtype).sqrt())                   # (B, H, L, d); scaled while d x d; padded rows unread


def causal_simple_attention(q, k, v, chunk=64):
    """SimpleTRON, causal. Our extension for language modelling (the paper is encoder only):

        y_t = Q_t (sum_{s<=t} K_s^T V_s) / sqrt(t)

    computed chunk by chunk in O(L d^2 + L chunk d): a running d x d state carries K^T V of all
    earlier chunks, and a masked chunk x chunk product adds the chunk's own tokens.
    """
    B, H, L, d = q.shape
    pad = -L % chunk
    if pad:
        q, k, v = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
    N = (L + pad) // chunk
    q, k, v = (x.reshape(B, H, N, chunk, d) for x in (q, k, v))  # (B, H, N, C, d)
    KV = k.transpose(-2, -1) @ v                             # (B, H, N, d, d) each chunk's K^T V
    S = KV.cumsum(2) - KV                                    # (B, H, N, d, d) sum over earlier chunks
    inter = q @ S                                            # (B, H, N, C, d)
    intra = (q @ k.transpose(-2, -1)).tril() @ v             # (B, H, N, C, d) s <= t inside the chunk
    y = (inter + intra).view(B, H, N * chunk, d)[:, :, :L]
    t = torch.arange(1, L + 1, device=q.device, dtype=q.dtype)
    return y * t.rsqrt()[:, None]                            # (B, H, L, d)


def softmax_attention(q, k, v, mask, causal):
    """The vanilla Transformer: softmax(Q_h K_h^T / sqrt(d) + mask) V_h, by the fused kernel."""
    attn_mask = None if mask is None else mask[:, None, None, :]  # (B, 1, 1, L) keys that exist
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=causal)


def softmax_attention_reference(q, k, v, mask, causal):
    """The same as softmax_attention, written out (O(L^2) memory); the tests hold the two equal."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (B, H, L, L)
    L = q.shape[2]
    if causal:
        scores = scores.masked_fill(~torch.ones(L, L, dtype=torch.bool, device=q.device).tril(), -math.inf)
    if mask is not None:
        scores = scores.masked_fill(~mask[:, None, None, :], -math.inf)
    return scores.softmax(-1) @ v


class SelfAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.n_head, self.kind = config.n_head, config.attention
        self.causal = config.head == "lm"
        Linear = OrthogonalLinear if config.orthogonal else nn.Linear
        # Q = X Q* + q*, K = X K* + k*, V = X V* + v*, as one (D, 3D) linear     (Section 3)
        self.qkv = Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.qkv.requires_grad_(not config.freeze_qkv)
        # the optional output linear W after the concatenated heads
        has_out = config.variant in ("resl", "vanilla") or config.attention == "softmax"
        self.out = Linear(config.n_embd, config.n_embd, bias=config.bias) if has_out else nn.Identity()
        self.drop = nn.Dropout(config.dropout)

    def forward(self, x, mask):                              # x (B, L, D), mask (B, L) or None
        B, L, D = x.shape
        q, k, v = (z.view(B, L, self.n_head, D // self.n_head).transpose(1, 2)  # (B, H, L, d) each
                   for z in self.qkv(x).split(D, dim=2))
        if self.kind == "softmax":
            y = softmax_attention(q, k, v, mask, self.causal)
        elif self.causal:
            y = causal_simple_attention(q, k, v)
        else:
            y = simple_attention(q, k, v, mask)
        y = y.transpose(1, 2).reshape(B, L, D)               # concatenate the heads
        return self.drop(self.out(y))


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        hidden = config.mlp_ratio * config.n_embd
        Linear = OrthogonalLinear if config.orthogonal else nn.Linear
        self.fc = Linear(config.n_embd, hidden, bias=config.bias)
        self.proj = Linear(hidden, config.n_embd, bias=config.bias)
        self.drop = nn.Dropout(config.dropout)

    def forward(self, x):
        return self.drop(self.proj(F.gelu(self.fc(x))))


class Block(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.attn, self.mlp = SelfAttention(config), MLP(config)
        self.rezero = config.norm == "rezero"
        if self.rezero:                                      # ReZero: α starts at 0, the block is the identity
            self.alpha = nn.Parameter(torch.zeros(()))
        else:
            self.ln1 = nn.LayerNorm(config.n_embd, bias=config.bias)
            self.ln2 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.pre = config.norm == "pre"
        self.extra_skip = config.variant in ("res", "resl")

    def forward(self, x, mask):
        if self.rezero:                                      # ReZero: x + α f(x), no LayerNorm
            h = x + self.alpha * self.attn(x, mask)
            h = h + self.alpha * self.mlp(h)
        elif self.pre:                                       # GPT-2: x + f(LN(x))
            h = x + self.attn(self.ln1(x), mask)
            h = h + self.mlp(self.ln2(h))
        else:                                                # Transformer / BERT: LN(x + f(x))
            h = self.ln1(x + self.attn(x, mask))
            h = self.ln2(h + self.mlp(h))
        # the extra skip of Fig. 4: the block input is added again at the block output
        return h + x if self.extra_skip else h


class Model(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = c = config
        self.wte = nn.Embedding(c.vocab_size, c.n_embd)
        # learnable positions (Table 3); the cls head has one more, for its CLS token
        self.wpe = nn.Embedding(c.block_size + (c.head != "lm"), c.n_embd)
        self.cls = nn.Parameter(torch.zeros(1, 1, c.n_embd)) if c.head != "lm" else None
        self.drop = nn.Dropout(c.dropout)
        self.blocks = nn.ModuleList(Block(c) for _ in range(c.n_layer))
        self.ln_f = nn.Identity() if c.norm == "rezero" else nn.LayerNorm(c.n_embd, bias=c.bias)
        if c.head == "lm":                                   # tied input and output embeddings
            self.lm_head = nn.Linear(c.n_embd, c.vocab_size, bias=False)
            self.lm_head.weight = self.wte.weight
        else:                                                # LRA's classifier: Dense, ReLU, (Dense, ReLU,) Dense
            hidden = c.mlp_ratio * c.n_embd
            if c.head == "cls":
                self.classifier = nn.Sequential(nn.Linear(c.n_embd, hidden), nn.ReLU(), nn.Linear(hidden, c.n_classes))
            else:                                            # on [u, v, u*v, u-v]
                self.classifier = nn.Sequential(nn.Linear(4 * c.n_embd, hidden), nn.ReLU(),
                                                nn.Linear(hidden, hidden // 2), nn.ReLU(),
                                                nn.Linear(hidden // 2, c.n_classes))
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(module):                               # GPT-2 / nanoGPT initialisation
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def num_params(self):
        return sum(p.numel() for p in self.parameters())

    def encode(self, idx):
        """Token ids (B, L) -> hidden states (B, L', D) and the mask of real tokens (B, L') or None."""
        B, L = idx.shape
        x = self.wte(idx)                                    # (B, L, D)
        mask = idx != 0                                      # (B, L) real tokens
        if self.cls is not None:                             # prepend the CLS token
            x = torch.cat([self.cls.expand(B, 1, -1), x], dim=1)
            mask = F.pad(mask, (1, 0), value=True)
        x = self.drop(x + self.wpe.weight[: x.shape[1]])
        if self.config.head == "lm":
            mask = None                                      # language models are not padded
        for block in self.blocks:                            # checkpointing: the same values, less memory
            if self.config.checkpointing and self.training:
                x = recompute(block, x, mask, use_reentrant=False)
            else:
                x = block(x, mask)
        return self.ln_f(x), mask

    def forward(self, idx, targets=None):
        if self.config.head == "lm":
            h, _ = self.encode(idx)
            logits = self.lm_head(h)                         # (B, L, V)
            loss = None if targets is None else F.cross_entropy(
                logits.flatten(0, 1).float(), targets.flatten(), ignore_index=-1)
            return logits, loss
        if self.config.head == "cls":
            feats = self.encode(idx)[0][:, 0]                # (B, D) the CLS token
        else:                                                # one shared encoder on both documents
            B = idx.shape[0]
            uv = self.encode(idx.flatten(0, 1))[0][:, 0]     # (2B, D)
            u, v = uv.view(B, 2, -1).unbind(1)
            feats = torch.cat([u, v, u * v, u - v], dim=-1)  # (B, 4D)
        logits = self.classifier(feats)                      # (B, n_classes)
        loss = None if targets is None else F.cross_entropy(logits.float(), targets)
        return logits, loss


@torch.no_grad()
def transfer_attention(source, target):
    """Attention transfer (Section 4.2): copy a trained SimpleTRON's q/k/v into a softmax model of the
    same shape and freeze them; everything else of the target is trained afresh."""
    for src, dst in zip(source.blocks, target.blocks, strict=True):
        dst.attn.qkv.load_state_dict(src.attn.qkv.state_dict())
        dst.attn.qkv.requires_grad_(False)
    target.config.freeze_qkv = True
