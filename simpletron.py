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

BERT's weights (Section 5.3, "using weights from pretrained BERT model, we were able to perform fine-tuning on
SimpleTRON"): from_bert(state_dict, config_json) builds BERT's exact block (Config.emb_norm, final_norm=False,
learned_cls=False, layer_norm_eps, mlp_hidden) with a Hugging Face BERT's weights; with attention="softmax" it is
BERT itself, with the default simple attention it is SimpleTRON on BERT's weights (docs/bert.md).

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
    attention: str = "simple"  # "simple" (SimpleTRON), "softmax" (vanilla Transformer / GPT) or "softmax_naive"
                               # (the same with its L x L scores written out: the naive baseline of speed tables)
    causal_scale: str = "sqrt_t"  # head lm, simple attention: y_t = Q_t (sum_{s<=t} K_s^T V_s) times 1/sqrt(t)
                               # ("sqrt_t"), 1/t ("t"), 1/sqrt(block_size) ("sqrt_block") or 1 ("none"); all but
                               # sqrt_t: our extension
    chunk: int = 64            # head lm, simple attention: tokens per chunk of the causal form (speed and memory only)
    variant: str = "res"       # "simple" | "res" | "resl" (Table 1) | "vanilla" (ordinary block)
    norm: str = "post"         # "post": LayerNorm after each residual sum (Transformer/BERT, the paper's
                               # Fig. 4); "pre": LayerNorm before each sublayer (GPT-2, nanoGPT);
                               # "rezero": x + α f(x), α from 0, no LayerNorm (ReZero)
    orthogonal: bool = False   # every weight matrix of the blocks orthogonal (Orthogonal Transformer)
    residual_init: bool = False  # GPT-2: the projections into the residual stream at std 0.02/sqrt(2 n_layer)
    mlp_ratio: int = 4         # MLP width = mlp_ratio * n_embd (Table 3: 256 -> 1024)
    freeze_qkv: bool = False   # attention transfer (Section 4.2): q/k/v are not trained
    # BERT's exact block (from_bert below); the defaults are this file's own model
    layer_norm_eps: float = 1e-5  # every LayerNorm's eps (BERT: 1e-12)
    emb_norm: bool = False     # a LayerNorm on the embeddings, word + position (BERT)
    final_norm: bool = True    # a LayerNorm after the last block (BERT has none)
    learned_cls: bool = True   # cls/match heads: prepend a learned CLS token; False: the ids carry their own
                               # CLS at position 0 (BERT's [CLS]) and the head reads it there
    mlp_hidden: int = 0        # MLP width; 0: mlp_ratio * n_embd (BERT's intermediate_size)
    checkpointing: bool = False  # recompute each block in the backward pass instead of storing its activations

    def __post_init__(self):
        choices = dict(head=("cls", "match", "lm"), attention=("simple", "softmax", "softmax_naive"),
                       variant=("simple", "res", "resl", "vanilla"), norm=("post", "pre", "rezero"),
                       causal_scale=("sqrt_t", "t", "sqrt_block", "none"))
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {', '.join(allowed)}, not {getattr(self, name)!r}")
        if self.chunk < 1:
            raise ValueError(f"chunk must be >= 1, not {self.chunk}")
        if self.residual_init and self.orthogonal:
            raise ValueError("residual_init sets the scale of ordinary weights; orthogonal ones have none")
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
    """SimpleTRON, bidirectional: Q_h (K_h^T V_h) / sqrt(n), n = number of real tokens. The paper's scale, always:
    Config.causal_scale changes the causal form only."""
    if mask is not None:
        k = k * mask[:, None, :, None]                       # padded tokens add nothing to K^T V
        n = mask.sum(1).clamp(min=1)[:, None, None, None]    # (B, 1, 1, 1) real tokens
    else:
        n = torch.tensor(q.shape[2])
    # SimpleAttention(Q_h, K_h, V_h) = Q_h (K_h^T V_h) / sqrt(n)                  (Section 3)
    KV = k.transpose(-2, -1) @ v                             # (B, H, d, d)
    return q @ (KV / n.to(q.dtype).sqrt())                   # (B, H, L, d); scaled while d x d; padded rows unread


def causal_n(t, causal_scale="sqrt_t", block_size=None):
    """The n of the causal form's 1/sqrt(n) at positions t (counted from 1: an int, or a tensor of them), by
    Config.causal_scale. The paper's n counts the tokens summed over, so n = t is its causal reading (the default);
    the three others are our extension, for an ablation of the scale:
        "sqrt_t"      n = t            y_t = Q_t S_t / sqrt(t)
        "t"           n = t^2          y_t = Q_t S_t / t: the mean of Q_t K_s^T V_s over s <= t
        "sqrt_block"  n = block_size   y_t = Q_t S_t / sqrt(block_size), one constant at every position
        "none"        n = 1            y_t = Q_t S_t
    """
    if causal_scale == "sqrt_t":
        return t
    if causal_scale == "t":
        return t * t
    if causal_scale in ("sqrt_block", "none"):               # a constant, of t's type and shape
        return t * 0 + (block_size if causal_scale == "sqrt_block" else 1)
    raise ValueError(f"causal_scale must be one of sqrt_t, t, sqrt_block, none, not {causal_scale!r}")


def causal_simple_attention(q, k, v, chunk=64, causal_scale="sqrt_t", block_size=None):
    """SimpleTRON, causal. Our extension for language modelling (the paper is encoder only):

        y_t = Q_t (sum_{s<=t} K_s^T V_s) / sqrt(n(t)),   n(t) = t by default (causal_n: Config.causal_scale)

    computed chunk by chunk in O(L d^2 + L chunk d): a running d x d state carries K^T V of all
    earlier chunks, and a masked chunk x chunk product adds the chunk's own tokens. The chunk (>= 1) changes
    the order of the sums, not the result.
    """
    B, H, L, d = q.shape
    pad = -L % chunk
    N = (L + pad) // chunk
    # (B, H, N, C, d), laid out in memory in this order once (padded, or copied) rather than in each product
    q, k, v = ((F.pad(x, (0, 0, 0, pad)) if pad else x.contiguous()).view(B, H, N, chunk, d) for x in (q, k, v))
    KV = k.transpose(-2, -1) @ v                             # (B, H, N, d, d) each chunk's K^T V
    S = KV.cumsum(2) - KV                                    # (B, H, N, d, d) sum over earlier chunks
    inter = q @ S                                            # (B, H, N, C, d)
    intra = (q @ k.transpose(-2, -1)).tril() @ v             # (B, H, N, C, d) s <= t inside the chunk
    y = (inter + intra).view(B, H, N * chunk, d)            # (B, H, L + pad, d)
    if pad:                                                  # (sliced only when padded: a slice's backward
        y = y[:, :, :L]                                      # copies the gradient into a new zero tensor)
    t = torch.arange(1, L + 1, device=q.device, dtype=q.dtype)
    return y * causal_n(t, causal_scale, block_size).rsqrt()[:, None]   # (B, H, L, d) y_t / sqrt(n(t))


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
        self.causal_scale, self.block_size, self.chunk = config.causal_scale, config.block_size, config.chunk
        Linear = OrthogonalLinear if config.orthogonal else nn.Linear
        # Q = X Q* + q*, K = X K* + k*, V = X V* + v*, as one (D, 3D) linear     (Section 3)
        self.qkv = Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.qkv.requires_grad_(not config.freeze_qkv)
        # the optional output linear W after the concatenated heads
        has_out = config.variant in ("resl", "vanilla") or config.attention != "simple"
        self.out = Linear(config.n_embd, config.n_embd, bias=config.bias) if has_out else nn.Identity()
        self.drop = nn.Dropout(config.dropout)

    def forward(self, x, mask):                              # x (B, L, D), mask (B, L) or None
        B, L, D = x.shape
        q, k, v = (z.view(B, L, self.n_head, D // self.n_head).transpose(1, 2)  # (B, H, L, d) each
                   for z in self.qkv(x).split(D, dim=2))
        if self.kind == "softmax":
            y = softmax_attention(q, k, v, mask, self.causal)
        elif self.kind == "softmax_naive":                  # the same numbers, O(L^2) memory
            y = softmax_attention_reference(q, k, v, mask, self.causal)
        elif self.causal:
            y = causal_simple_attention(q, k, v, self.chunk, self.causal_scale, self.block_size)
        else:
            y = simple_attention(q, k, v, mask)
        y = y.transpose(1, 2).reshape(B, L, D)               # concatenate the heads
        return self.drop(self.out(y))


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        hidden = config.mlp_hidden or config.mlp_ratio * config.n_embd
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
            self.ln1 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_eps, bias=config.bias)
            self.ln2 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_eps, bias=config.bias)
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
        # learnable positions (Table 3); the cls head has one more, for its learned CLS token
        learned_cls = c.head != "lm" and c.learned_cls
        self.wpe = nn.Embedding(c.block_size + learned_cls, c.n_embd)
        self.cls = nn.Parameter(torch.zeros(1, 1, c.n_embd)) if learned_cls else None
        self.ln_e = nn.LayerNorm(c.n_embd, eps=c.layer_norm_eps, bias=c.bias) if c.emb_norm else nn.Identity()
        self.drop = nn.Dropout(c.dropout)
        self.blocks = nn.ModuleList(Block(c) for _ in range(c.n_layer))
        final_norm = c.final_norm and c.norm != "rezero"
        self.ln_f = nn.LayerNorm(c.n_embd, eps=c.layer_norm_eps, bias=c.bias) if final_norm else nn.Identity()
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
        if c.residual_init:                                  # GPT-2 / nanoGPT: the projections into the residual
            for name, p in self.named_parameters():          # stream start smaller, by 1/sqrt(2 n_layer)
                if name.endswith(("attn.out.weight", "mlp.proj.weight")):
                    nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * c.n_layer))

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
        x = self.drop(self.ln_e(x + self.wpe.weight[: x.shape[1]]))  # ln_e: BERT's embedding LayerNorm
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
            feats = self.encode(idx)[0][:, 0]                # (B, D) the CLS token (learned, or the ids' own)
        else:                                                # one shared encoder on both documents
            B = idx.shape[0]
            uv = self.encode(idx.flatten(0, 1))[0][:, 0]     # (2B, D)
            u, v = uv.view(B, 2, -1).unbind(1)
            feats = torch.cat([u, v, u * v, u - v], dim=-1)  # (B, 4D)
        logits = self.classifier(feats)                      # (B, n_classes)
        loss = None if targets is None else F.cross_entropy(logits.float(), targets)
        return logits, loss

    # --- generation: nanoGPT's generate; the state and the maths are in the section Generation below ---

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None):
        """Continue each row of idx (B, L) by max_new_tokens sampled tokens: (B, L + max_new_tokens).
        nanoGPT's semantics (logits of the last position / temperature, top_k, softmax, multinomial; top_k=1 is
        greedy), computed recurrently (SimpleTRON) or with a KV cache (softmax); in eval mode, no dropout."""
        check_generation(self, idx, "idx", temperature, top_k)
        was_training, block_size = self.training, self.config.block_size
        self.eval()
        try:
            state = None
            for _ in range(max_new_tokens):
                if state is None or state.t == block_size:  # the prompt, or a full window: (re)build the state
                    context = idx[:, -block_size:]           # from the last block_size tokens
                    logits, state = self.prefill(context, context.shape[1] + max_new_tokens)  # capped at block_size
                else:                                        # one token: constant cost (SimpleTRON)
                    logits = self.decode(idx[:, -1:], state)
                idx = torch.cat([idx, sample_next(logits, temperature, top_k)], dim=1)
        finally:
            self.train(was_training)
        return idx

    @torch.no_grad()
    def prefill(self, idx, capacity=None):
        """Read a prompt idx (B, L) in the parallel form: (logits of its last position (B, V), the state).
        capacity: the most tokens the state will hold (the KV cache's size; default block_size)."""
        check_generation(self, idx)
        state = GenerationState(self, capacity)
        return read_tokens(self, idx, state), state

    @torch.no_grad()
    def decode(self, idx_next, state):
        """One more token per row, idx_next (B, 1), after the state's tokens: its logits (B, V); the state
        is updated in place."""
        if idx_next.dim() != 2 or idx_next.shape[1] != 1:
            raise ValueError(f"decode takes one token per row, (B, 1), not {tuple(idx_next.shape)}")
        return read_tokens(self, idx_next, state)


@torch.no_grad()
def transfer_attention(source, target):
    """Attention transfer (Section 4.2): copy a trained SimpleTRON's q/k/v into a softmax model of the
    same shape and freeze them; everything else of the target is trained afresh."""
    for src, dst in zip(source.blocks, target.blocks, strict=True):
        dst.attn.qkv.load_state_dict(src.attn.qkv.state_dict())
        dst.attn.qkv.requires_grad_(False)
    target.config.freeze_qkv = True


@torch.no_grad()
def attention_std(model, x):
    """SimpleTRON's Fig. 5, per block, on the ids x (B, L): the standard deviation of the attention weights as the
    paper defines them, Q K^T / sqrt(n) for SimpleTRON (n real tokens; causal: causal_n's n(t) of the model's
    causal_scale) and Q K^T / sqrt(d) for softmax (the softmax left out), over every real (query, key) pair (s <= t
    when causal); and the standard deviation of the attention sublayer's output (B, L, D) over the real tokens.
    Written out dense: a measurement, not the model's path. Returns {"score_std": [one per block],
    "attn_std": [...]}."""
    was_training, seen = model.training, []
    model.eval()
    hooks = [block.attn.register_forward_hook(lambda module, inputs, output: seen.append((module, *inputs, output)))
             for block in model.blocks]
    try:
        model(x)
    finally:
        for h in hooks:
            h.remove()
        model.train(was_training)
    score_std, attn_std = [], []
    for attn, h, mask, y in seen:                            # h (B, L, D) the block's input to attention
        B, L, D = h.shape
        H = attn.n_head
        q, k, _ = (z.view(B, L, H, D // H).transpose(1, 2).double() for z in attn.qkv(h).split(D, dim=2))
        real = torch.ones(B, L, dtype=torch.bool, device=h.device) if mask is None else mask
        pairs = real[:, None, :, None] & real[:, None, None, :]              # (B, 1, L, L)
        if attn.causal:
            pairs = pairs & torch.ones(L, L, dtype=torch.bool, device=h.device).tril()
        if attn.kind == "simple":                            # n: real tokens (causal: n(t), t the prefix length)
            n = (causal_n(torch.arange(1, L + 1, device=h.device).double(), attn.causal_scale, attn.block_size)
                 [None, None, :, None] if attn.causal else real.sum(1).double()[:, None, None, None])
        else:
            n = torch.tensor(float(D // H))
        scores = q @ k.transpose(-2, -1) / n.sqrt()          # (B, H, L, L)
        score_std.append(spread(scores[pairs.expand(B, H, L, L)]))
        attn_std.append(spread(y[real].double()))            # over the real tokens' (D) outputs
    return {"score_std": score_std, "attn_std": attn_std}


def spread(values):
    """The unbiased standard deviation of the numbers in values; 0 for fewer than two (one head, one row, one real
    token: one score, which has no spread, where the unbiased estimate is NaN)."""
    return values.std().item() if values.numel() > 1 else 0.0


# ----------------------------------------------------------------------------------------------
# Generation (nanoGPT's model.generate), inference only: eval mode, no dropout, every weight made once
# per call (the Orthogonal Transformer's Cayley maps included).
#
# Causal SimpleTRON is a recurrent network. With S_t the d x d state of one head after t tokens,
#
#     S_t = S_{t-1} + K_t^T V_t,   S_0 = 0                                     (causal form of Section 3)
#     y_t = Q_t S_t / sqrt(n(t)),  n(t) = t by default (causal_n: Config.causal_scale)
#
# which is causal_simple_attention's y_t = Q_t (sum_{s<=t} K_s^T V_s) / sqrt(n(t)) one token at a time. The state
# of a layer is S (B, H, d, d) and the count t: a new token costs O(H d^2) per layer at any context length.
# The softmax GPT cannot be summed up like this: it keeps every K_s, V_s (the KV cache, (B, H, t, d) per
# layer) and a new token attends to all t of them, O(t d) per head.
#
# The prompt is read in the parallel form (causal_simple_attention, or the causal SDPA), which also leaves
# the state; then one token per step. Context beyond block_size: the learned positions stop at block_size,
# so, as nanoGPT, the model sees only the last block_size tokens. Once the state holds block_size tokens it
# is rebuilt from the last block_size tokens in the parallel form before the next one: every token of the
# window moves one position down, so every K_s, V_s changes and the old state cannot be reused (subtracting
# the oldest K^T V would leave the others at their old positions). Each such token costs one forward over
# block_size tokens (what nanoGPT pays for every token), bounded by block_size, never by the text's length.


class GenerationState:
    """What generation keeps between tokens. t: the tokens read so far (their positions 0..t-1); capacity: the
    most it will hold (default, and at most, block_size); layers[l]: simple attention {"S": (B, H, d, d)},
    softmax {"K", "V": (B, H, capacity, d), first t filled}; weights[l]: the layer's maps with their weights made
    once (see frozen)."""

    def __init__(self, model, capacity):
        self.t, self.capacity = 0, min(capacity or model.config.block_size, model.config.block_size)
        self.layers = [{} for _ in model.blocks]
        self.weights = [frozen(block) for block in model.blocks]

    def nbytes(self):                                       # the size of the per-layer state
        return sum(x.numel() * x.element_size() for layer in self.layers for x in layer.values())


def frozen(block):
    """The maps of one block with their weights made once: x -> x W^T + b for qkv, out, fc, proj."""
    def linear(m):
        if isinstance(m, nn.Identity):
            return m
        W = m.weight                                         # OrthogonalLinear: the Cayley map, made here
        return lambda x: F.linear(x, W, m.bias)
    return {name: linear(m) for name, m in (("qkv", block.attn.qkv), ("out", block.attn.out),
                                           ("fc", block.mlp.fc), ("proj", block.mlp.proj))}


def causal_simple_attention_step(q, k, v, S, t, causal_scale="sqrt_t", block_size=None):
    """One token of causal_simple_attention, as a recurrence. q, k, v (B, H, 1, d) of the t-th token (t counts
    from 1), S (B, H, d, d) = sum_{s<t} K_s^T V_s. Returns y_t (B, H, 1, d) and S_t."""
    S = S + k.transpose(-2, -1) @ v                          # S_t = S_{t-1} + K_t^T V_t        (B, H, d, d)
    n = causal_n(t, causal_scale, block_size)                # t by default
    return q @ S / math.sqrt(n), S                           # y_t = Q_t S_t / sqrt(n(t))       (B, H, 1, d)


def attention_step(attn, x, cache, w, t0, capacity):
    """SelfAttention.forward for T new tokens x (B, T, D) at positions t0..t0+T-1: either the prompt (t0 = 0,
    the parallel form) or one token (T = 1) after the t0 tokens in cache, which it updates."""
    B, T, D = x.shape
    q, k, v = (z.view(B, T, attn.n_head, D // attn.n_head).transpose(1, 2)   # (B, H, T, d) each
               for z in w["qkv"](x).split(D, dim=2))
    if attn.kind != "simple":                                # the KV cache
        if t0 == 0:
            cache["K"] = k.new_empty(*k.shape[:2], capacity, k.shape[-1])   # (B, H, capacity, d)
            cache["V"] = torch.empty_like(cache["K"])
        cache["K"][:, :, t0:t0 + T], cache["V"][:, :, t0:t0 + T] = k, v
        if t0 == 0:                                          # the prompt: the forward's causal attention
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:                                                # softmax(q_t K_{1..t}^T / sqrt(d)) V_{1..t}
            K, V = cache["K"][:, :, :t0 + 1], cache["V"][:, :, :t0 + 1]                  # (B, H, t, d)
            y = torch.softmax(q @ K.transpose(-2, -1) / math.sqrt(K.shape[-1]), dim=-1) @ V   # (B, H, 1, d)
    elif t0 == 0:                                            # the prompt: the chunked parallel form, and the
        y = causal_simple_attention(q, k, v, attn.chunk, attn.causal_scale, attn.block_size)   # state after it:
        cache["S"] = k.transpose(-2, -1) @ v                 # S_T = sum_{s<=T} K_s^T V_s     (B, H, d, d)
    else:
        y, cache["S"] = causal_simple_attention_step(q, k, v, cache["S"], t0 + 1, attn.causal_scale, attn.block_size)
    return w["out"](y.transpose(1, 2).reshape(B, T, D))      # concatenate the heads


def block_step(block, x, cache, w, t0, capacity):
    """Block.forward for the new tokens x (B, T, D); the MLP and the norms act on each token alone."""
    def attn(z):
        return attention_step(block.attn, z, cache, w, t0, capacity)

    def mlp(z):
        return w["proj"](F.gelu(w["fc"](z)))
    if block.rezero:
        h = x + block.alpha * attn(x)
        h = h + block.alpha * mlp(h)
    elif block.pre:
        h = x + attn(block.ln1(x))
        h = h + mlp(block.ln2(h))
    else:
        h = block.ln1(x + attn(x))
        h = block.ln2(h + mlp(h))
    return h + x if block.extra_skip else h


def read_tokens(model, idx, state):
    """Run the tokens idx (B, T) through the model after the state's tokens: logits of the last (B, V)."""
    t0, T = state.t, idx.shape[1]
    if t0 + T > min(state.capacity, model.config.block_size):
        raise ValueError(f"the state holds {t0} tokens; {T} more exceed its capacity {state.capacity} "
                         f"(block_size {model.config.block_size})")
    x = model.ln_e(model.wte(idx) + model.wpe.weight[t0:t0 + T])  # (B, T, D) token + position (ln_e: emb_norm)
    for block, cache, w in zip(model.blocks, state.layers, state.weights):
        x = block_step(block, x, cache, w, t0, state.capacity)
    state.t += T
    return model.lm_head(model.ln_f(x[:, -1]))               # (B, V)


def check_generation(model, idx, name="the prompt", temperature=1.0, top_k=None):
    """The one-line errors of generate and prefill: a language model, nanoGPT's sampling settings, and token
    ids idx (B, L) with L >= 1 (name: what the message calls idx)."""
    if model.config.head != "lm":
        raise ValueError(f"generation needs a language model (head lm), not head {model.config.head}")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, not {temperature} (top_k=1 is greedy)")
    if top_k is not None and top_k < 1:
        raise ValueError(f"top_k must be at least 1 or None, not {top_k}")
    if idx.dim() != 2 or idx.shape[1] < 1:
        raise ValueError(f"{name} must be (B, L) token ids with L >= 1, not of shape {tuple(idx.shape)}")


def sample_next(logits, temperature=1.0, top_k=None):
    """nanoGPT's sampling: logits (B, V) of the last position -> next token ids (B, 1)."""
    logits = logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits
    logits = logits / temperature
    if top_k is not None:                                    # keep the k largest, mask the rest
        v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
        logits = logits.masked_fill(logits < v[:, [-1]], -math.inf)
    return torch.multinomial(F.softmax(logits, dim=-1), num_samples=1)


# ----------------------------------------------------------------------------------------------
# BERT's weights (Section 5.3): "the layers are identical to BERT's", so a pretrained BERT loads into this
# file's post-LN block and fine-tunes. BERT's encoder, in eval mode, on ids [CLS] ... [SEP] 0-padded:
#     X = LN_e(word[ids] + pos[0..L-1] + type[0])
#     per layer:  X = LN_1(X + Attention(X W_Q, X W_K, X W_V) W_O)        (the output linear: variant vanilla)
#                 X = LN_2(X + GELU(X W_1) W_2)                           (GELU with erf, eps = layer_norm_eps)
#     last hidden state = X                                               (no final LayerNorm)

def config_from_bert(bert_config, **overrides):
    """Config of BERT's exact block from a Hugging Face BERT config.json (a dict), then `overrides`.

    The default variant is "vanilla" (the output linear W_O = attention.output.dense, no extra skip): with
    attention="softmax" this is BERT itself, and with the default attention="simple" it is SimpleTRON on BERT's
    weights, BERT's own block with only the attention changed. variant="resl" (the paper's Table 1 variant with
    the linear) adds the extra skip of Fig. 4 on top, which BERT's weights were not trained with."""
    c = bert_config
    if c.get("model_type", "bert") != "bert" or c.get("position_embedding_type", "absolute") != "absolute":
        raise ValueError(f"not a BERT config (model_type {c.get('model_type')!r}, position_embedding_type "
                         f"{c.get('position_embedding_type')!r}): from_bert reads BERT with absolute positions")
    if c.get("hidden_act", "gelu") != "gelu":
        raise ValueError(f"hidden_act {c['hidden_act']!r}: from_bert reads BERT's GELU (erf), hidden_act 'gelu'")
    # BERT's own: its weights' shapes and where its LayerNorms sit (and their eps), its [CLS] among the ids
    own = dict(vocab_size=c["vocab_size"], n_embd=c["hidden_size"], n_head=c["num_attention_heads"],
               mlp_hidden=c["intermediate_size"], bias=True, layer_norm_eps=c.get("layer_norm_eps", 1e-12),
               emb_norm=True, final_norm=False, learned_cls=False)
    for k, v in own.items():
        if k in overrides and overrides[k] != v:
            raise ValueError(f"{k} is BERT's own ({v}), not {overrides[k]}")
    fields = dict(own, n_layer=c["num_hidden_layers"], block_size=c["max_position_embeddings"],
                  dropout=c.get("hidden_dropout_prob", 0.1), head="cls", attention="simple",
                  variant="vanilla", norm="post")
    fields.update(overrides)
    if not 1 <= fields["n_layer"] <= c["num_hidden_layers"]:
        raise ValueError(f"n_layer {fields['n_layer']}: this BERT has {c['num_hidden_layers']} layers; keep 1 to "
                         f"{c['num_hidden_layers']} of them")
    if not 1 <= fields["block_size"] <= c["max_position_embeddings"]:
        raise ValueError(f"block_size {fields['block_size']}: this BERT has {c['max_position_embeddings']} positions")
    if fields["head"] == "lm" or fields["norm"] != "post" or fields.get("orthogonal"):
        raise ValueError("BERT's weights fit the post-LN encoder (norm 'post', head 'cls' or 'match', not "
                         "orthogonal)")
    return Config(**fields)


@torch.no_grad()
def from_bert(state_dict, bert_config, **overrides):
    """A Model with a Hugging Face BERT's weights: state_dict of BertModel (keys embeddings.*, encoder.*) or of a
    model holding it (keys bert.*), bert_config its config.json as a dict, overrides any Config fields but BERT's
    shape (config_from_bert). Buffers (position_ids, token_type_ids), the pooler and the pretraining heads (cls.*)
    are not used; the classifier is new. The first n_layer layers and block_size positions are kept (variants
    simple and res: not BERT's output linear either). Token type 0 is folded into the positions: every token is
    of type 0. BERT's [CLS] is in the ids (learned_cls False) and pad id is 0, so with attention="softmax"
    model.encode(ids) is BERT's last hidden state at the real tokens (in training, BERT's dropout of the
    attention probabilities is not applied: this file has none)."""
    config = config_from_bert(bert_config, **overrides)
    sd = {}
    for k, v in state_dict.items():                          # BertModel's names; TF-converted gamma/beta too
        k = k[5:] if k.startswith("bert.") else k
        sd[k.replace("LayerNorm.gamma", "LayerNorm.weight").replace("LayerNorm.beta", "LayerNorm.bias")] = v

    def get(name):
        if name not in sd:
            raise ValueError(f"the BERT state dict has no {name} (nor bert.{name})")
        return sd[name]

    def put(param, value, name):
        if param.shape != value.shape:
            raise ValueError(f"BERT's {name} is {tuple(value.shape)}, its config.json makes it {tuple(param.shape)}")
        param.copy_(value)

    model = Model(config)
    for param, name in ((model.wte.weight, "embeddings.word_embeddings.weight"),
                        (model.ln_e.weight, "embeddings.LayerNorm.weight"),
                        (model.ln_e.bias, "embeddings.LayerNorm.bias")):
        put(param, get(name), name)
    # pos[0..L-1] + type[0]: every token is of type 0, so its embedding is a constant, added to every position
    put(model.wpe.weight, get("embeddings.position_embeddings.weight")[:config.block_size]
        + get("embeddings.token_type_embeddings.weight")[0], "embeddings.position_embeddings.weight")
    for i, block in enumerate(model.blocks):
        p = f"encoder.layer.{i}."
        pairs = [(block.attn.out, "attention.output.dense"), (block.ln1, "attention.output.LayerNorm"),
                 (block.mlp.fc, "intermediate.dense"), (block.mlp.proj, "output.dense"),
                 (block.ln2, "output.LayerNorm")]
        for ours, theirs in pairs[isinstance(block.attn.out, nn.Identity):]:  # variants simple/res drop W_O
            for part in ("weight", "bias"):
                put(getattr(ours, part), get(f"{p}{theirs}.{part}"), f"{p}{theirs}.{part}")
        # W_Q, W_K, W_V stacked (3D, D) as one linear: split(D) gives q, k, v in this order
        for part in ("weight", "bias"):
            put(getattr(block.attn.qkv, part),
                torch.cat([get(f"{p}attention.self.{n}.{part}") for n in ("query", "key", "value")]),
                f"{p}attention.self.{{query,key,value}}.{part}")
    return model
