"""
DiffEqFormer: a transformer as a neural ODE in depth t whose weights are functions of t.

Paper: Tong, Nguyen-Tang, Lee, Tran, Choi, "Neural ODE Transformers: Analyzing Internal Dynamics and
Adaptive Fine-tuning" (ICLR 2025). The paper text lost its formulas; docs/diffeqformer.md
restates them and the equation numbers below are the paper's. Row-vector convention: a token is a row
x in R^D, a sequence X in R^{N x D}, and t in [0, 1] is depth.

    dX/dt = f(X, t) = Attn(LN1(X; t); t) + MLP(LN2(X; t); t)                    (eq. 2-5)

attention and MLP read the same X (in parallel, not one after the other). Every weight of f is a function
of t made by a small hypernetwork (eq. 6, appendix A):

    phi(t) = [t, sin(1000 t w_k), cos(1000 t w_k)]_{k<S},  w_k = 10000^(-k/S)    (no parameters)
    e(t)   = Lin2(SiLU(Lin1(phi(t)))) in R^{d_t}                      (one small MLP per module)
    P(t)   = P_0 + sum_i e_i(t) P_i = [1, e(t)] P                     (P: the (1 + d_t) x numel rows P_0..P_dt)

for P = W_QKV, W_O, W_1, W_2, their biases, and gamma - 1, beta of the two LayerNorms. P_0 starts at zero,
the W_i small and normal (W(t) starts with GPT-2's std 0.02), the LayerNorm rows at zero (a plain
LayerNorm at init). Config.weights = "shared" is the weight-shared ODE baseline: only P_0, no hypernetwork.

The model integrates X from t = 0 (the embeddings) to t = 1 with n_layer fixed steps of odeint (hand-written
Euler, midpoint or RK4; Config.method). The paper's Euler step evaluates f at the right end of the step:

    X_{k+1} = X_k + dt f(X_k, t_{k+1}),  t_{k+1} = (k + 1) dt,  dt = 1 / n_layer

All weights of one forward (every step, every solver stage) come from ONE batched pass through the
hypernetworks, so a step costs per token exactly what a GPT block costs; Config.checkpointing recomputes
each step in the backward pass (torch.utils.checkpoint) instead of storing its activations.

Adaptive fine-tuning (section 6.2): model.discretize(n) evaluates W(t_k) on a new Euler grid of n steps and
returns an ordinary n-block transformer (block k: X + dt f_k(X), with its own stored weights), fine-tuned
fully or, after .with_lora(r, alpha), with LoRA on every linear map and trainable embeddings.

The checkpoint contract: a model is rebuilt from its config alone, Model(Config(**config)), and its
state_dict then loads. Three Config fields say which structure it is:
    discrete = False               the ODE model: hypernetworks in .temporal, n_layer solver steps
    discrete = True                the discretised model: n_layer stored blocks in .blocks (Euler only)
    lora_r = r > 0 (discrete only) every linear map of the blocks is a LoRALinear of rank r with scale
                                   lora_scale = alpha / r; only LoRA, embeddings (and a classifier head)
                                   are trainable, which the constructor sets, so a resumed run is frozen alike
model.discretize(n) returns Model(replace(config, discrete=True, n_layer=n, method="euler")), and
.with_lora(r, alpha) returns Model(replace(config, lora_r=r, lora_scale=alpha / r)), each with the weights in.

For analysis (analyze.py), both forms expose times() (t_1..t_n, where the Euler steps evaluate f), dt(),
vector_field(X, t), attention_weights(t) (row convention: q = x W_q) and hidden_states(idx) / trajectory(idx).

The model interface, identical in every model file of this project:
    config = Config(vocab_size=..., block_size=..., head="cls"|"match"|"lm", n_classes=..., ...)
    model = Model(config)
    logits, loss = model(idx, targets=None)
idx is (B, L) int64 for heads "cls" and "lm", (B, 2, L) for "match"; token id 0 is padding.
logits are (B, n_classes) for "cls"/"match" and (B, L, vocab_size) for "lm"; loss is None without
targets (lm targets use -1 for positions to ignore).
"""

import math
from dataclasses import dataclass, replace
from functools import partial
from types import SimpleNamespace

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint as recompute


@dataclass
class Config:
    # nanoGPT's names
    vocab_size: int = 32      # token ids 0..vocab_size-1, id 0 is padding
    block_size: int = 1024    # the longest input sequence, idx.shape[-1]
    n_layer: int = 4          # solver steps on [0, 1] (the paper's layers); discrete: blocks
    n_head: int = 4
    n_embd: int = 128
    dropout: float = 0.0
    bias: bool = True
    # the task's head
    head: str = "lm"          # "cls": one sequence -> class, "match": a pair -> class, "lm": next token
    n_classes: int = 10       # cls/match only
    # this model's own fields
    style: str = "gpt"        # "gpt": LayerNorm, GELU, learned positions; "llama": RMSNorm, SwiGLU, RoPE
    weights: str = "temporal"  # "temporal": W(t) by hypernetworks (eq. 6); "shared": one W for all t
    time_dim: int = 20        # d_t, the size of e(t) and of the hypernetworks' hidden layer
    time_freqs: int = 128     # S: phi(t) has 2S + 1 features
    method: str = "euler"     # fixed-step solver: "euler" (the paper's), "midpoint", "rk4"
    checkpointing: bool = False  # recompute each step in the backward pass instead of storing it
    # the discretised model (model.discretize(n), section 6.2) and LoRA on it (model.with_lora(r, alpha))
    discrete: bool = False    # True: n_layer ordinary blocks with stored weights, block k = X + dt f_k(X)
    lora_r: int = 0           # LoRA rank on every linear map of the blocks (0: none, all weights trainable)
    lora_scale: float = 1.0   # LoRA's alpha / r

    def __post_init__(self):
        choices = dict(head=("cls", "match", "lm"), style=("gpt", "llama"), weights=("temporal", "shared"),
                       method=("euler", "midpoint", "rk4"))
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {', '.join(allowed)}, not {getattr(self, name)!r}")
        if self.n_embd % self.n_head or (self.style == "llama" and (self.n_embd // self.n_head) % 2):
            raise ValueError(f"n_embd ({self.n_embd}) must be a multiple of n_head ({self.n_head}), "
                             "with an even head size for RoPE")
        for name in ("n_layer", "time_dim", "time_freqs"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, not {getattr(self, name)}")
        if self.discrete and self.method != "euler":
            raise ValueError("a discrete model is an Euler grid: method must be euler")
        if self.lora_r < 0 or (self.lora_r and not self.discrete):
            raise ValueError("lora_r > 0 is for discrete models (model.discretize(n).with_lora(r, alpha))")


# ----------------------------------------------------------------------------------------------
# Fixed-step solvers for dx/dt = f(x, t), hand-written

def rk_step(f, x, t, h, method):
    """One step from (x, t) to t + h."""
    if method == "euler":       # the paper's: f at the right end of the step (still first order)
        return x + h * f(x, t + h)
    if method == "midpoint":    # second order
        return x + h * f(x + h / 2 * f(x, t), t + h / 2)
    k1 = f(x, t)                # rk4, the classical fourth-order Runge-Kutta method
    k2 = f(x + h / 2 * k1, t + h / 2)
    k3 = f(x + h / 2 * k2, t + h / 2)
    k4 = f(x + h * k3, t + h)
    return x + h / 6 * (k1 + 2 * k2 + 2 * k3 + k4)


def odeint(f, x0, n_steps, method="euler", t0=0.0, t1=1.0, trajectory=False, checkpoint=False):
    """Integrate dx/dt = f(x, t) from x(t0) = x0 to t1 in n_steps equal steps of `method`.
    Returns x(t1), or (x(t1), [x0, x1, ..., x_n]) with trajectory=True. checkpoint: recompute each step
    in the backward pass (torch.utils.checkpoint) instead of storing its activations."""
    h = (t1 - t0) / n_steps
    x, xs = x0, [x0]
    for k in range(n_steps):
        t = t0 + k * h
        x = recompute(rk_step, f, x, t, h, method, use_reentrant=False) if checkpoint else rk_step(f, x, t, h, method)
        xs.append(x)
    return (x, xs) if trajectory else x


def stage_times(method, n_steps, t0=0.0, t1=1.0):
    """Every t at which odeint evaluates f, in order: recorded from a dry run, so the floats are identical."""
    seen = []
    odeint(lambda x, t: seen.append(t) or x, 0.0, n_steps, method, t0, t1)
    return seen


# ----------------------------------------------------------------------------------------------
# Time-dependent weights (eq. 6, appendix A)

def time_features(t, S):
    """phi(t) = [t, sin(1000 t w_k), cos(1000 t w_k)]_{k<S}, w_k = 10000^(-k/S). t (T,) -> (T, 2S + 1)."""
    w = 10000 ** (-torch.arange(S, dtype=t.dtype, device=t.device) / S)          # (S,)
    angle = 1000 * t[:, None] * w                                                 # (T, S)
    return torch.cat([t[:, None], angle.sin(), angle.cos()], dim=-1)


def rms_norm(x, weight, eps=1e-5):
    """Llama's RMSNorm: x / sqrt(mean(x^2) + eps) * gamma."""
    return x * torch.rsqrt(x.square().mean(-1, keepdim=True) + eps) * weight


class Temporal(nn.Module):
    """Base of the time-dependent modules: each has its own e(t) = Lin2(SiLU(Lin1(phi(t)))) (eq. 6) and
    makes its tensors as P(t) = [1, e(t)] P. With weights="shared" there is no e(t): P(t) = P_0."""

    def __init__(self, c):
        super().__init__()
        self.e = None if c.weights == "shared" else nn.Sequential(
            nn.Linear(2 * c.time_freqs + 1, c.time_dim), nn.SiLU(), nn.Linear(c.time_dim, c.time_dim))
        self.rows = 1 if self.e is None else 1 + c.time_dim                     # P_0, P_1, ..., P_dt

    def basis(self, phi):                                                        # (T, 2S + 1) -> (T, rows)
        one = phi.new_ones(len(phi), 1)
        return one if self.e is None else torch.cat([one, self.e(phi)], dim=-1)  # [1, e(t)]

    def at(self, phi):
        """The module's map x -> y at each time: a list of T callables, from one batched pass."""
        tensors = [[None] * len(phi) if p is None else p.unbind(0) for p in self(phi)]
        return [self.map(*p) for p in zip(*tensors)]


class TemporalLinear(Temporal):
    """x -> x W(t)^T + b(t),  W(t) = W_0 + sum_i e_i(t) W_i,  b(t) = b_0 + sum_i e_i(t) b_i   (eq. 6)."""

    def __init__(self, c, d_in, d_out):
        super().__init__(c)
        self.shape = (d_out, d_in)                                               # PyTorch's (out, in) layout
        self.W = nn.Parameter(torch.zeros(self.rows, d_out * d_in))             # rows W_0, W_1, ..., flattened
        self.b = nn.Parameter(torch.zeros(self.rows, d_out)) if c.bias else None
        with torch.no_grad():
            if self.e is None:                                                   # shared: W = W_0, GPT-2's init
                nn.init.normal_(self.W, std=0.02)
            else:                                                                # W_0 = 0, W_i ~ N(0, s^2) with s
                e = self.e(time_features(torch.linspace(0, 1, 257), c.time_freqs))  # such that W(t) has std
                nn.init.normal_(self.W[1:], std=0.02 / e.square().sum(-1).mean().sqrt())  # 0.02 on average

    def forward(self, phi):                                                      # -> W (T, out, in), b (T, out)
        E = self.basis(phi)                                                      # (T, rows)
        return (E @ self.W).view(-1, *self.shape), None if self.b is None else E @ self.b

    @staticmethod
    def map(W, b):
        return partial(F.linear, weight=W, bias=b)


class TemporalLayerNorm(Temporal):
    """LN(X; t) = gamma(t) * normalise(X) + beta(t), gamma(t) = 1 + [1, e(t)] G, beta(t) = [1, e(t)] H with
    G, H zero at init: a plain LayerNorm (style gpt) or RMSNorm without beta (style llama) to start with."""

    def __init__(self, c):
        super().__init__(c)
        self.layer_norm = c.style == "gpt"
        self.G = nn.Parameter(torch.zeros(self.rows, c.n_embd))
        self.H = nn.Parameter(torch.zeros(self.rows, c.n_embd)) if self.layer_norm and c.bias else None

    def forward(self, phi):                                                      # -> gamma (T, D), beta (T, D)
        E = self.basis(phi)                        # in the parameters' precision, under autocast too (as LayerNorm's)
        return 1 + (E @ self.G).to(self.G.dtype), None if self.H is None else (E @ self.H).to(self.H.dtype)

    def map(self, gamma, beta):
        if self.layer_norm:
            return partial(F.layer_norm, normalized_shape=gamma.shape, weight=gamma, bias=beta, eps=1e-5)
        return partial(rms_norm, weight=gamma)


def mlp_width(c):
    """GELU MLP: 4D; SwiGLU: 8D/3 for each of its two input maps, the same parameters and FLOPs."""
    return 4 * c.n_embd if c.style == "gpt" else 8 * c.n_embd // 3


class TemporalWeights(nn.Module):
    """The time-dependent modules of f: LN1, W_QKV, W_O, LN2, W_1, W_2 (with their biases)."""

    def __init__(self, c):
        super().__init__()
        D, hidden = c.n_embd, mlp_width(c)
        self.ln1, self.ln2 = TemporalLayerNorm(c), TemporalLayerNorm(c)
        self.qkv = TemporalLinear(c, D, 3 * D)
        self.o = TemporalLinear(c, D, D)
        self.fc = TemporalLinear(c, D, hidden * (1 if c.style == "gpt" else 2))  # SwiGLU: gate and input
        self.proj = TemporalLinear(c, hidden, D)
        self.S = c.time_freqs

    def forward(self, t):
        """The raw tensors at the times t (T,): {name: (weight (T, ...), bias (T, ...) or None)}."""
        phi = time_features(t, self.S)
        return {name: module(phi) for name, module in self.named_children()}

    def maps(self, t):
        """The maps of f at each of the times t (T,): one namespace (ln1, qkv, o, ln2, fc, proj) per time.
        One batched pass through every hypernetwork, for all steps and solver stages of a forward."""
        phi = time_features(t, self.S)                                           # (T, 2S + 1)
        per_module = {name: module.at(phi) for name, module in self.named_children()}
        return [SimpleNamespace(**{name: maps[k] for name, maps in per_module.items()}) for k in range(len(t))]


# ----------------------------------------------------------------------------------------------
# The vector field f(X, t) (eq. 2-5), shared by the ODE model and the discretised one

def rope(x):
    """Rotary position embedding (Su et al.): rotate channel pairs (i, i + d/2) of position p by p 10000^(-2i/d).
    x (B, H, L, d)."""
    L, d = x.shape[-2:]
    theta = 10000 ** (-torch.arange(0, d, 2, dtype=x.dtype, device=x.device) / d)  # (d/2,)
    angle = torch.arange(L, dtype=x.dtype, device=x.device)[:, None] * theta      # (L, d/2)
    cos, sin = angle.cos(), angle.sin()
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def vector_field(X, w, c, mask=None, training=False):
    """f(X, t) = Attn(LN1(X; t); t) + MLP(LN2(X; t); t), both on the same X (eq. 2).
    X (B, L, D); w: the maps of time t (w.ln1, w.qkv, w.o, w.ln2, w.fc, w.proj); mask (B, L) of real tokens
    for the cls/match heads (None for lm, which is causal)."""
    B, L, D = X.shape
    H = c.n_head
    # (4) multi-head softmax attention: Q = X W_Q(t) + b_Q(t), K and V alike, then W_O(t) + b_O(t)
    q, k, v = w.qkv(w.ln1(X)).view(B, L, 3, H, D // H).permute(2, 0, 3, 1, 4)   # each (B, H, L, d)
    if c.style == "llama":
        q, k = rope(q), rope(k)
    attn_mask = None if mask is None else mask[:, None, None, :]                 # (B, 1, 1, L) keys that exist
    Y = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=c.head == "lm")
    attn = w.o(Y.transpose(1, 2).reshape(B, L, D))                               # (B, L, D) heads concatenated
    # (5) MLP: GELU(X W_1(t) + b_1(t)) W_2(t) + b_2(t), or SwiGLU
    Z = w.fc(w.ln2(X))                                                           # (B, L, hidden) or (B, L, 2 hidden)
    if c.style == "gpt":
        Z = F.gelu(Z)
    else:
        gate, Z = Z.chunk(2, dim=-1)
        Z = F.silu(gate) * Z
    mlp = w.proj(Z)                                                              # (B, L, D)
    return F.dropout(attn, c.dropout, training) + F.dropout(mlp, c.dropout, training)


# ----------------------------------------------------------------------------------------------
# The discretised model's blocks: stored weights, optionally LoRA

class LoRALinear(nn.Linear):
    """x W^T + b + s (x A^T) B^T: a frozen linear map plus a trainable rank-r update (LoRA, Hu et al. 2021),
    s = alpha / r; B starts at zero, so the map starts unchanged."""

    def __init__(self, d_in, d_out, bias, r, scale):
        super().__init__(d_in, d_out, bias=bias)
        self.scale = scale
        self.lora_A = nn.Parameter(torch.empty(r, d_in))
        self.lora_B = nn.Parameter(torch.zeros(d_out, r))
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))                    # as nn.Linear (and peft)

    def forward(self, x):
        return super().forward(x) + self.scale * F.linear(F.linear(x, self.lora_A), self.lora_B)

    def merged_weight(self):                                                     # W + s B A, (out, in)
        return self.weight + self.scale * self.lora_B @ self.lora_A


class RMSNorm(nn.Module):
    def __init__(self, D):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(D))

    def forward(self, x):
        return rms_norm(x, self.weight)


def make_norm(c):
    return nn.LayerNorm(c.n_embd, eps=1e-5, bias=c.bias) if c.style == "gpt" else RMSNorm(c.n_embd)


class Step(nn.Module):
    """The weights of one Euler step of the discretised model, W(t_k) materialised: the same maps as
    TemporalWeights.maps gives for one time, as ordinary modules."""

    def __init__(self, c):
        super().__init__()
        D, hidden = c.n_embd, mlp_width(c)
        Linear = partial(LoRALinear, r=c.lora_r, scale=c.lora_scale) if c.lora_r else nn.Linear
        self.ln1, self.ln2 = make_norm(c), make_norm(c)
        self.qkv = Linear(D, 3 * D, bias=c.bias)
        self.o = Linear(D, D, bias=c.bias)
        self.fc = Linear(D, hidden * (1 if c.style == "gpt" else 2), bias=c.bias)
        self.proj = Linear(hidden, D, bias=c.bias)


# ----------------------------------------------------------------------------------------------
# The model

class Model(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = c = config
        self.wte = nn.Embedding(c.vocab_size, c.n_embd)
        # learned positions (style gpt; llama rotates q and k instead); cls has one more, for its CLS token
        self.wpe = nn.Embedding(c.block_size + (c.head != "lm"), c.n_embd) if c.style == "gpt" else None
        self.cls = nn.Parameter(torch.zeros(1, 1, c.n_embd)) if c.head != "lm" else None
        if c.discrete:
            self.blocks = nn.ModuleList(Step(c) for _ in range(c.n_layer))
        else:
            self.temporal = TemporalWeights(c)
        self.ln_f = make_norm(c)
        if c.head == "lm":                                                       # tied input and output embeddings
            self.lm_head = nn.Linear(c.n_embd, c.vocab_size, bias=False)
            self.lm_head.weight = self.wte.weight
        else:                                                                    # LRA's classifier, as simpletron.py
            hidden = 4 * c.n_embd
            if c.head == "cls":
                self.classifier = nn.Sequential(nn.Linear(c.n_embd, hidden), nn.ReLU(), nn.Linear(hidden, c.n_classes))
            else:                                                                # on [u, v, u*v, u-v]
                self.classifier = nn.Sequential(nn.Linear(4 * c.n_embd, hidden), nn.ReLU(),
                                                nn.Linear(hidden, hidden // 2), nn.ReLU(),
                                                nn.Linear(hidden // 2, c.n_classes))
        for name, module in self.named_modules():                                # GPT-2 init, except the
            if not name.startswith("temporal"):                                  # hypernetworks (see there)
                if isinstance(module, (nn.Linear, nn.Embedding)):
                    nn.init.normal_(module.weight, std=0.02)
                if isinstance(module, nn.Linear) and module.bias is not None:
                    nn.init.zeros_(module.bias)
        for module in self.modules():                                            # normal_ above overwrote A
            if isinstance(module, LoRALinear):
                nn.init.kaiming_uniform_(module.lora_A, a=math.sqrt(5))
        if c.lora_r:                                                             # LoRA fine-tuning (section 6.2):
            for name, p in self.named_parameters():                              # low-rank updates, embeddings
                p.requires_grad_("lora_" in name or name.split(".")[0] in ("wte", "wpe", "cls", "classifier"))

    def num_params(self):
        return sum(p.numel() for p in self.parameters())

    # --- the flow X(0) -> X(1) ------------------------------------------------------------------

    def embed(self, idx):
        """Token ids (B, L) -> X(0) (B, L', D) and the mask of real tokens (B, L') or None (lm)."""
        B, L = idx.shape
        X = self.wte(idx)                                                        # (B, L, D)
        mask = idx != 0                                                          # (B, L) real tokens
        if self.cls is not None:                                                 # prepend the CLS token
            X = torch.cat([self.cls.expand(B, 1, -1), X], dim=1)
            mask = F.pad(mask, (1, 0), value=True)
        if self.wpe is not None:
            X = X + self.wpe.weight[: X.shape[1]]
        X = F.dropout(X, self.config.dropout, self.training)
        return X, (None if self.config.head == "lm" else mask)

    def step_maps(self, method, dtype, device):
        """{t: the maps of f at t} for every t at which odeint evaluates f with this method."""
        c = self.config
        times = stage_times(method, c.n_layer)
        if c.discrete:                                                           # block k holds W(t_{k+1})
            return dict(zip(times, self.blocks))
        unique = sorted(set(times))
        return dict(zip(unique, self.temporal.maps(torch.tensor(unique, dtype=dtype, device=device))))

    def flow(self, X, mask, trajectory=False):
        """Integrate dX/dt = f(X, t) from t = 0 to 1: X(1), or (X(1), [X_0, ..., X_n]) with trajectory."""
        c = self.config
        maps = self.step_maps(c.method, X.dtype, X.device)

        def f(X, t):
            return vector_field(X, maps[t], c, mask, self.training)
        return odeint(f, X, c.n_layer, c.method, trajectory=trajectory, checkpoint=c.checkpointing and self.training)

    def encode(self, idx):
        X, mask = self.embed(idx)
        return self.ln_f(self.flow(X, mask)), mask

    def forward(self, idx, targets=None):
        if self.config.head == "lm":
            h, _ = self.encode(idx)
            logits = self.lm_head(h)                                             # (B, L, V)
            loss = None if targets is None else F.cross_entropy(
                logits.flatten(0, 1).float(), targets.flatten(), ignore_index=-1)
            return logits, loss
        if self.config.head == "cls":
            feats = self.encode(idx)[0][:, 0]                                    # (B, D) the CLS token
        else:                                                                    # one shared encoder on both documents
            B = idx.shape[0]
            uv = self.encode(idx.flatten(0, 1))[0][:, 0]                         # (2B, D)
            u, v = uv.view(B, 2, -1).unbind(1)
            feats = torch.cat([u, v, u * v, u - v], dim=-1)                      # (B, 4D)
        logits = self.classifier(feats)                                          # (B, n_classes)
        loss = None if targets is None else F.cross_entropy(logits.float(), targets)
        return logits, loss

    # --- generation: nanoGPT's generate; the KV caches and the maths are in the section Generation below --

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None):
        """Continue each row of idx (B, L) by max_new_tokens sampled tokens: (B, L + max_new_tokens).
        nanoGPT's semantics (logits of the last position / temperature, top_k, softmax, multinomial; top_k=1 is
        greedy), with a KV cache per evaluation of f; every solver, the ODE and the discretised model."""
        check_generation(self, idx, "idx", temperature, top_k)
        was_training, block_size = self.training, self.config.block_size
        self.eval()
        try:
            state = None
            for _ in range(max_new_tokens):
                if state is None or state.t == block_size:  # the prompt, or a full window: (re)build the caches
                    context = idx[:, -block_size:]           # from the last block_size tokens
                    logits, state = self.prefill(context, context.shape[1] + max_new_tokens)  # capped at block_size
                else:                                        # one token: attends to the cached keys and values
                    logits = self.decode(idx[:, -1:], state)
                idx = torch.cat([idx, sample_next(logits, temperature, top_k)], dim=1)
        finally:
            self.train(was_training)
        return idx

    @torch.no_grad()
    def prefill(self, idx, capacity=None):
        """Read a prompt idx (B, L) in the parallel form: (logits of its last position (B, V), the state).
        capacity: the most tokens the state will hold (the KV caches' size; default block_size)."""
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

    # --- adaptive fine-tuning (section 6.2) -----------------------------------------------------

    @torch.no_grad()
    def discretize(self, n_steps):
        """The ordinary n_steps-block transformer of the Euler grid t_k = k / n_steps: block k stores
        W(t_{k+1}), gamma(t_{k+1}), ... of this ODE model and computes X + dt f_k(X); embeddings, final norm
        and head are copied. On the model's own grid (n_steps = n_layer, method euler) its logits are the
        ODE model's."""
        if self.config.discrete:
            raise ValueError("this model is discrete already; discretize the ODE model it came from")
        p = self.wte.weight
        model = Model(replace(self.config, discrete=True, n_layer=n_steps, method="euler")).to(p.device, p.dtype)
        shared = {k: v for k, v in self.state_dict().items() if not k.startswith("temporal.")}
        missing, unexpected = model.load_state_dict(shared, strict=False)
        assert not unexpected and all(k.startswith("blocks.") for k in missing), (missing, unexpected)
        t = torch.tensor(model.times(), dtype=p.dtype, device=p.device)
        for name, (weight, bias) in self.temporal(t).items():                    # one batched pass, all steps
            for k, block in enumerate(model.blocks):
                getattr(block, name).weight.copy_(weight[k])
                if bias is not None:
                    getattr(block, name).bias.copy_(bias[k])
        return model.train(self.training)

    @torch.no_grad()
    def with_lora(self, rank, alpha):
        """This discrete model with LoRA of rank r and scale alpha / r on every linear map of its blocks;
        only LoRA and the embeddings (and a classifier head) train. The logits are unchanged (B = 0)."""
        if not self.config.discrete or self.config.lora_r:
            raise ValueError("LoRA goes on a discretised model without LoRA: model.discretize(n).with_lora(r, alpha)")
        p = self.wte.weight
        model = Model(replace(self.config, lora_r=rank, lora_scale=alpha / rank)).to(p.device, p.dtype)
        missing, unexpected = model.load_state_dict(self.state_dict(), strict=False)
        assert not unexpected and all("lora_" in k for k in missing), (missing, unexpected)
        return model.train(self.training)

    # --- for analysis (analyze.py): the Euler grid, f, W(t), the trajectory ---------------------

    def times(self):
        """t_1, ..., t_n: where the n Euler steps evaluate f (the right end of each step)."""
        return stage_times("euler", self.config.n_layer)

    def dt(self):
        return 1.0 / self.config.n_layer

    def maps_at(self, t):
        if not self.config.discrete:
            p = self.wte.weight
            return self.temporal.maps(torch.tensor([float(t)], dtype=p.dtype, device=p.device))[0]
        k = round(float(t) * self.config.n_layer) - 1
        if not (0 <= k < self.config.n_layer and abs(self.times()[k] - t) < 1e-9):
            raise ValueError(f"t = {t} is not on the discrete model's grid {self.times()}")
        return self.blocks[k]

    def vector_field(self, X, t, mask=None):
        """f(X, t) (eq. 2), X (B, L, D). A discrete model knows f only on its grid, f_k at t_{k+1}."""
        return vector_field(X, self.maps_at(t), self.config, mask, self.training)

    @torch.no_grad()
    def attention_weights(self, t):
        """W_Q, W_K, W_V, W_O at time t, (D, D) each, in the row convention q = x W_q (biases left out)."""
        D = self.config.n_embd
        if self.config.discrete:
            block = self.maps_at(t)
            Wqkv, Wo = (m.merged_weight() if isinstance(m, LoRALinear) else m.weight for m in (block.qkv, block.o))
        else:
            p = self.wte.weight
            phi = time_features(torch.tensor([float(t)], dtype=p.dtype, device=p.device), self.config.time_freqs)
            Wqkv, Wo = self.temporal.qkv(phi)[0][0], self.temporal.o(phi)[0][0]
        return {"q": Wqkv[:D].T, "k": Wqkv[D:2 * D].T, "v": Wqkv[2 * D:].T, "o": Wo.T}

    @torch.no_grad()
    def hidden_states(self, idx):
        """[X_0, X_1, ..., X_n] (embeddings, then the state after each step; no final norm), and the mask.
        A pair (B, 2, L) of the match head is read as forward encodes it: 2B sequences, each state (2B, L', D)."""
        X, mask = self.embed(idx.flatten(0, -2))                                 # (B, L) or (B, 2, L) -> (B', L)
        return self.flow(X, mask, trajectory=True)[1], mask

    def trajectory(self, idx):
        """[X_0, ..., X_n] for one sequence batch: X_k is where step k evaluates f (analyze.py's Lyapunov)."""
        return self.hidden_states(idx)[0]


# ----------------------------------------------------------------------------------------------
# Generation (nanoGPT's model.generate), inference only: eval mode, no dropout.
#
# In the causal model a token's state X_t(τ) at depth τ depends on the tokens 1..t alone, and f's attention at
# an evaluation reads the keys and values of the earlier tokens at that same evaluation. odeint evaluates f in
# a fixed order: n_layer steps x (1 stage for euler, 2 for midpoint, 4 for rk4); evaluation e of f is at the
# time τ_e = stage_times(method, n_layer)[e], on the stage input Z_e (X_k, or X_k + h/2 k_1, ...). So the KV
# cache is one per evaluation e (not one per layer):
#     K_e, V_e (B, H, t, d)  the keys and values of LN1(Z_e; τ_e) of tokens 1..t                      (eq. 4)
# and a new token runs the same solver on its own row, appending its k, v to each K_e, V_e and attending to
# them: O(t d) per head and evaluation. All three solvers, the ODE model and the discretised one (Euler
# only, its blocks hold W(t_k)). The weights W(τ_e) of every evaluation come from one batched pass through
# the hypernetworks in prefill (step_maps, as a forward makes them) and are kept in the state: once per
# generate call, not per token (and once more for each rebuild beyond block_size, below).
#
# Context beyond block_size: the learned positions (style gpt) stop at block_size, so, as nanoGPT, the model
# sees only the last block_size tokens (style llama too, for the same behaviour). Once the caches hold
# block_size tokens they are rebuilt from the last block_size tokens before the next one: every token of the
# window moves one position down, which changes every key and value. Each such token costs one forward over
# block_size tokens (what nanoGPT pays for every token).


class GenerationState:
    """What generation keeps between tokens: t, the tokens read so far; capacity, the most it will hold (default,
    and at most, block_size); maps, {τ: the maps of f at τ} made once; caches[e] {"K", "V": (B, H, capacity, d),
    first t filled} for each evaluation e of f."""

    def __init__(self, model, capacity):
        c, p = model.config, model.wte.weight
        self.t, self.capacity = 0, min(capacity or c.block_size, c.block_size)
        self.maps = model.step_maps(c.method, p.dtype, p.device)   # W(τ) of every step and stage, one pass
        self.caches = [{} for _ in stage_times(c.method, c.n_layer)]

    def nbytes(self):                                        # the size of the KV caches
        return sum(x.numel() * x.element_size() for cache in self.caches for x in cache.values())


def rope_from(x, start):
    """rope for the positions start, start + 1, ...: the new token after the cached ones. x (B, H, T, d)."""
    T, d = x.shape[-2:]
    theta = 10000 ** (-torch.arange(0, d, 2, dtype=x.dtype, device=x.device) / d)  # (d/2,)
    angle = torch.arange(start, start + T, dtype=x.dtype, device=x.device)[:, None] * theta   # (T, d/2)
    cos, sin = angle.cos(), angle.sin()
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def cached_vector_field(X, w, c, cache, t0, capacity):
    """vector_field (eq. 2-5) for T new tokens X (B, T, D) at positions t0..t0+T-1, with the keys and values of
    the t0 earlier tokens at this evaluation in cache (updated): the prompt (t0 = 0) or one token (T = 1)."""
    B, T, D = X.shape
    H = c.n_head
    # (4) Q = X W_Q(t) + b_Q(t), K and V alike
    q, k, v = w.qkv(w.ln1(X)).view(B, T, 3, H, D // H).permute(2, 0, 3, 1, 4)   # each (B, H, T, d)
    if c.style == "llama":
        q, k = (rope(q), rope(k)) if t0 == 0 else (rope_from(q, t0), rope_from(k, t0))
    if t0 == 0:
        cache["K"] = k.new_empty(B, H, capacity, D // H)                         # (B, H, capacity, d)
        cache["V"] = torch.empty_like(cache["K"])
    cache["K"][:, :, t0:t0 + T], cache["V"][:, :, t0:t0 + T] = k, v
    if t0 == 0:                                                                  # the prompt: the forward's
        Y = F.scaled_dot_product_attention(q, k, v, is_causal=True)              # causal attention
    else:                                                                        # softmax(q_t K_{1..t}^T / sqrt(d)) V
        K, V = cache["K"][:, :, :t0 + 1], cache["V"][:, :, :t0 + 1]              # (B, H, t, d): one new token
        Y = torch.softmax(q @ K.transpose(-2, -1) / math.sqrt(K.shape[-1]), dim=-1) @ V              # (B, H, 1, d)
    attn = w.o(Y.transpose(1, 2).reshape(B, T, D))                               # (B, T, D)
    # (5) MLP on each token alone
    Z = w.fc(w.ln2(X))
    if c.style == "gpt":
        Z = F.gelu(Z)
    else:
        gate, Z = Z.chunk(2, dim=-1)
        Z = F.silu(gate) * Z
    return attn + w.proj(Z)


def read_tokens(model, idx, state):
    """Integrate the new tokens idx (B, T) from t = 0 to 1 beside the cached ones: logits of the last (B, V)."""
    c, T, t0 = model.config, idx.shape[1], state.t                              # idx (B, T)
    if t0 + T > state.capacity:
        raise ValueError(f"the state holds {t0} tokens; {T} more exceed its capacity {state.capacity} "
                         f"(block_size {c.block_size})")
    X = model.wte(idx)                                                           # (B, T, D) X(0)
    if model.wpe is not None:
        X = X + model.wpe.weight[t0:t0 + T]
    caches = iter(state.caches)                                                  # evaluation e uses caches[e]

    def f(X, t):
        return cached_vector_field(X, state.maps[t], c, next(caches), t0, state.capacity)
    X = odeint(f, X, c.n_layer, c.method)                                        # the same solver as flow()
    state.t += T
    return model.lm_head(model.ln_f(X[:, -1]))                                   # (B, V)


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
