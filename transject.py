"""
TransJect: a transformer whose layers are injective and keep the distances between tokens within a bound.

Paper: Sengupta, Akhtar, Chakraborty, "Manifold-Preserving Transformers are Effective for Short-Long Range
Encoding" (Findings of EMNLP 2023). Non-normalised linear attention with orthogonal W_Q, W_K, W_V reduces to

    Attn(X) = X U Σ V        U, V learnable orthogonal d x d, Σ the eigenvalues of X^T X      (Thm. 1)

so no n x n matrix is formed (O(n d^2)) and, with Σ scaled so that its largest entry is 1, Attn cannot expand
a distance. Every map of the layer is kept injective and Lipschitz:

    X0_t  = concat(Emb(x_t), PE_t)             Emb semi-orthogonal (scaled), PE sinusoidal, d/2 each (§3.5)
    F_e(X) = ELU(X U_e Σ V_e)                   one (U_e, V_e) per expert; Σ from X0, shared      (Thm. 1)
    X^(l,e) = X + (α_l / L) F_e(X)              α_l = sigmoid(a_l) in (0, 1), starts near 0       (eq. 2)
    X^(l)  = Σ_e λ_e X^(l,e)                   λ = softmax over experts, one vector per sample   (eq. 3)
    X      = X + (α_l / L) ELU(ELU(X W1 + b1) W2 + b2)     W1, W2 orthogonal d x d               (§3.4)

Per token, given Σ and λ, F_e and the FFN have Lipschitz constant <= 1 (orthogonal maps, |Σ| <= 1, ELU' in
(0, 1]), so each layer maps a pair of tokens of a sequence to a pair whose distance changed by a factor in
[(1 - α_l/L)^2, (1 + α_l/L)^2]: injective for any L, inside the paper's bound (1 + 3/L)^2 (Thm. 2).
This holds for heads "cls" and "match", where one Σ and one λ serve every token of a sequence. In the causal
"lm" form (ours) token t uses its own prefix's Σ_t and λ_t, so two tokens go through different maps and the
bound does not hold between them (weights optimised against it reach distance ratios far beyond it).

Σ (Config.sigma), computed once from X0 over the real tokens and normalised so its largest entry is 1
(the paper's "stochastic X^T X", Cor. 2); G = X0^T X0:
    exact  : the eigenvalues of G (torch.linalg.eigvalsh).
    learned: the paper's approximation. A learnable orthogonal U_s; Σ_ii = u_i^T G u_i = sum_t (x_t . u_i)^2,
             the best diagonal for ||G - U_s Σ U_s^T||_F, in O(n d^2). The reconstruction loss
             ||G - U_s Σ U_s^T||_F^2 / ||G||_F^2 = 1 - sum_i Σ_ii^2 / ||G||_F^2 is zero exactly when U_s holds
             G's eigenvectors; it is added to the task loss (weight Config.sigma_loss_weight) and trains U_s
             alone, and the task loss trains everything but U_s (Ũ = argmin of the reconstruction, §3.2).
    random : Random-TransJect. Σ drawn once at initialisation and then trained by the task loss.
Head "lm" (our causal form; the paper's model is an encoder): Σ_t and λ_t from prefix sums over tokens 1..t,
so position t never sees a later token; still O(n d^2), no n x n tensor.

Orthogonal matrices: every one is the hand-written Cayley map of a skew-symmetric matrix (cayley below),
materialised once per forward pass (all experts of a layer in one batched solve). The token embedding
(vocab x d/2) has orthonormal columns (orthonormal rows if vocab < d/2): the first columns of a Cayley map,
computed blockwise without the vocab x vocab solve (semi_orthogonal below).

The authors' public code (github.com/victor7246/TransJect) does not do what the paper says; fixed here:
  - Σ was redrawn at random on every forward pass (training and evaluation, so evaluation was not
    deterministic) and never learned. Here: three modes above; evaluation is deterministic.
  - The "X^T X ~ U Σ U^T" reconstruction multiplied element-wise (Hadamard) where the paper has matrix
    products, so its loss did not measure the reconstruction; padding was summed into X^T X. Here: matrix
    products (in the form Σ_ii = u_i^T G u_i) and padding masked out of G, of the expert gate and of pooling.
  - The residual weight was tanh(a)/L (negative values allowed); here sigmoid(a)/L in (0, 1/L) as eq. 2.
  - The bias of V was added to the matrix Σ V^T, i.e. to each of its d rows: a rank-one, non-orthogonal
    term of spectral norm ~ sqrt(d) |b| ~ 13 at d = 512, which breaks the bound. Here the attention has no
    bias (Thm. 1 has none); the FFN keeps b1, b2 of §3.4, which only translate (see OrthogonalFFN).
  - The embedding was an unconstrained nn.Embedding and its position encoding used the wrong exponents;
    here a semi-orthogonal embedding and Vaswani et al.'s sinusoids.
  - The language model had no causal mask (with eigenvalues on it saw the future); here the prefix form.
  - A softmax before the cross-entropy (double softmax); here logits go to F.cross_entropy.

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
    n_layer: int = 2          # L
    n_head: int = 1           # the interface's name; TransJect has no heads, its n_experts take their place
    n_embd: int = 64          # d; token embedding and position encoding are d/2 each
    dropout: float = 0.1      # on each residual branch
    bias: bool = True         # b1, b2 of the orthogonal residual FFN (§3.4), and the output layers' biases
    # the task's head
    head: str = "cls"         # "cls": one sequence -> class, "match": a pair -> class, "lm": next token
    n_classes: int = 10       # cls/match only
    # this model's own fields
    n_experts: int = 4        # E, experts per layer (eq. 3)
    sigma: str = "learned"    # Σ: "exact" (eigenvalues), "learned" (the paper's approximation), "random"
    sigma_loss_weight: float = 0.1  # weight of the reconstruction loss added to the task loss (sigma="learned")
    pool: str = "mean"        # cls/match: "mean" (IMDb, AG News) or "max" (LRA) over the real tokens (B.1)
    checkpointing: bool = False  # recompute each layer in the backward pass instead of storing its activations

    def __post_init__(self):
        choices = dict(head=("cls", "match", "lm"), sigma=("exact", "learned", "random"), pool=("mean", "max"))
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {', '.join(allowed)}, not {getattr(self, name)!r}")
        if self.n_embd % 4:
            raise ValueError(f"n_embd ({self.n_embd}) must be a multiple of 4: two halves of sine/cosine pairs")
        if self.n_experts < 1 or self.n_layer < 1:
            raise ValueError("n_experts and n_layer must be at least 1")
        if self.sigma_loss_weight < 0:
            raise ValueError(f"sigma_loss_weight must be >= 0, not {self.sigma_loss_weight}")


# ----------------------------------------------------------------------------------------------
# Orthogonal maps

def skew(P):
    """A = P - P^T: a skew-symmetric matrix (A^T = -A) from a free parameter P (..., n, n)."""
    return P - P.transpose(-2, -1)


def cayley(A):
    """The Cayley map W = (I - A)(I + A)^{-1} of a skew-symmetric A (..., n, n). W^T W = I, det W = +1:
    A's eigenvalues are imaginary, i theta, so I + A is invertible and W's eigenvalues (1 - i theta)/(1 + i theta)
    have modulus 1 and come in conjugate pairs (or are 1). I - A and (I + A)^{-1} commute, so we solve
    (I + A) W = I - A."""
    I = torch.eye(A.shape[-1], dtype=A.dtype, device=A.device)
    return torch.linalg.solve(I + A, I - A)


def semi_orthogonal(S, B):
    """The first k columns of cayley(A) for the skew-symmetric A = [[S, -B^T], [B, 0]] ((k+m) x (k+m); S k x k
    skew, B m x k): a (k+m) x k matrix with orthonormal columns, in O((k+m) k^2) instead of O((k+m)^3).
    Solving (I + A) Y = [I; 0] by blocks gives Y = [M^-1; -B M^-1] with M = I + S + B^T B, so
        cayley(A)[:, :k] = (I - A) Y = [(I - S - B^T B) M^-1; -2 B M^-1]."""
    I = torch.eye(S.shape[-1], dtype=S.dtype, device=S.device)
    BtB = B.T @ B
    return torch.linalg.solve(I + S + BtB, torch.cat([I - S - BtB, -2 * B]), left=False)  # (k+m, k)


# ----------------------------------------------------------------------------------------------
# Masked sums: padding (mask False) never enters one

def masked_mean(X, mask, causal):
    """Mean over the real tokens: (B, 1, d); causal: over the real tokens 1..t, (B, L, d)."""
    m = mask[..., None].to(X.dtype)                          # (B, L, 1)
    if causal:
        return (X * m).cumsum(1) / m.cumsum(1).clamp_min(1)
    return (X * m).sum(1, keepdim=True) / m.sum(1, keepdim=True).clamp_min(1)


class InjectiveEmbedding(nn.Module):
    """X0_t = concat(Emb(x_t), PE_t) (§3.5): concatenation keeps token and position apart (a sum could map two
    different (token, position) pairs to one vector). Emb = c E with E semi-orthogonal: vocab x d/2 with
    orthonormal columns, or orthonormal rows when the vocabulary is smaller than d/2 (then distinct tokens are
    orthogonal). The constant c (ours) gives a token the norm of its position encoding on average: E's rows have
    mean squared norm min(V, k) / V, PE's rows k / 2. Without it, at V = 10,000 and k = 64, tokens have norm 0.08
    beside positions of norm 5.7 (measured on PTB: validation perplexity 644 instead of 299 after 400 steps).
    c scales the token half only, so it changes how much token and position differences weigh in a distance
    (that is its purpose): distances between different tokens grow by c, those between positions do not. The
    map stays injective.

    Initialisation (ours): E starts as a uniformly random (Haar) semi-orthogonal matrix written in this
    parametrisation, so every row has about the same norm, sqrt(min(V, k) / V) before c. A small random S and B
    would not do that: the first k rows of the Cayley map (Y1 below) would carry almost all of the norm
    (measured at V = 10,001, k = 64: rows of norm 28-42 after c against 4.8 for every other token)."""

    def __init__(self, config):
        super().__init__()
        k, V = config.n_embd // 2, config.vocab_size
        n, m = min(V, k), abs(V - k)
        self.c = math.sqrt(k * V / (2 * n))                  # mean |c E_x|^2 = k / 2 = |PE_t|^2
        # Y = [Y1; Y2] (n + m, n) with orthonormal columns, turned on the right so that Y1 is symmetric positive
        # semi-definite (the rows keep their norms). Such a Y is semi_orthogonal(0, B) with B = -Y2 (I + Y1)^-1:
        # with S = 0, Y1 = (I - B^T B)(I + B^T B)^-1 and Y2 = -2 B (I + B^T B)^-1, and I + B^T B = 2 (I + Y1)^-1.
        Y = torch.linalg.qr(torch.randn(n + m, n, dtype=torch.float64)).Q
        W, _, Zt = torch.linalg.svd(Y[:n])
        Y = Y @ (Zt.T @ W.T)                                 # Y1 = W diag(s) W^T
        I = torch.eye(n, dtype=torch.float64)
        self.S = nn.Parameter(torch.zeros(n, n))             # skew part S - S^T
        self.B = nn.Parameter(torch.linalg.solve(I + Y[:n], -Y[n:], left=False).float())   # (m, n)
        self.transpose = V < k
        # PE_{t, 2i} = sin(t / 10000^(2i/k)), PE_{t, 2i+1} = cos(t / 10000^(2i/k))        (Vaswani et al.)
        t = torch.arange(config.block_size, dtype=torch.float32)[:, None]
        angle = t / 10000 ** (torch.arange(0, k, 2, dtype=torch.float32) / k)   # (block_size, k/2)
        self.register_buffer("PE", torch.stack([angle.sin(), angle.cos()], -1).flatten(1), persistent=False)

    def weight(self):
        E = semi_orthogonal(skew(self.S), self.B)            # (max(V, k), min(V, k)) orthonormal columns
        return self.c * (E.T if self.transpose else E)       # (V, k)

    def forward(self, idx):                                  # idx (B, L) -> X0 (B, L, d)
        B, L = idx.shape
        return torch.cat([self.weight()[idx], self.PE[:L].expand(B, L, -1)], dim=-1)


class Layer(nn.Module):
    """One TransJect layer, SubLayer = ORF ∘ MOE ∘ IR (eq. 4)."""

    def __init__(self, config):
        super().__init__()
        d, self.E, self.L = config.n_embd, config.n_experts, config.n_layer
        self.causal = config.head == "lm"
        # skew parts of U_1..U_E, V_1..V_E (orthogonal attention) and W_1, W_2 (FFN), made orthogonal together
        self.P = nn.Parameter(torch.randn(2 * self.E + 2, d, d) / math.sqrt(d))
        self.a = nn.Parameter(torch.tensor(-2.0))            # α_l = sigmoid(a_l) = 0.12 at init (ReZero-like)
        self.gate = nn.Linear(d, self.E, bias=False)          # expert logits from the sample's summary
        nn.init.zeros_(self.gate.weight)                      # λ_e = 1/E at init
        # b1, b2 of §3.4: a translation, (x W + b) - (y W + b) = (x - y) W, changes no distance, so the bound holds
        self.b = nn.Parameter(torch.zeros(2, d)) if config.bias else None
        self.drop = nn.Dropout(config.dropout)

    def alpha(self):
        return torch.sigmoid(self.a)                         # α_l in (0, 1)                 (eq. 2)

    def expert_weights(self, X, mask):
        """λ (B, 1, E), one convex weight vector per sample from the mean of its real tokens (eq. 3);
        causal: (B, L, E), λ_t from the mean of tokens 1..t."""
        return self.gate(masked_mean(X, mask, self.causal)).softmax(-1)

    def forward(self, X, mask, Sigma):                       # X (B, L, d), mask (B, L), Sigma (B, 1 or L, d)
        U, V, W = cayley(skew(self.P)).split([self.E, self.E, 2])   # (E, d, d), (E, d, d), (2, d, d)
        alpha_L = self.alpha() / self.L
        lam = self.expert_weights(X, mask)                   # (B, 1 or L, E)
        # F_e(X) = ELU(X U_e Σ V_e), all experts at once                                      (Thm. 1)
        F_e = F.elu(((X[:, None] @ U) * Sigma[:, None]) @ V)  # (B, E, L, d)
        # X^(l) = sum_e λ_e (X + α_l/L F_e(X)) = X + α_l/L sum_e λ_e F_e(X), since sum_e λ_e = 1    (eq. 2, 3)
        X = X + alpha_L * self.drop(torch.einsum("ble,beld->bld", lam, F_e))
        # ORF(X) = X + α_l/L ELU(ELU(X W1 + b1) W2 + b2)                                       (§3.4)
        b1, b2 = (0, 0) if self.b is None else self.b
        return X + alpha_L * self.drop(F.elu(F.elu(X @ W[0] + b1) @ W[1] + b2))


class Model(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = c = config
        d = c.n_embd
        self.embed = InjectiveEmbedding(c)
        if c.sigma == "learned":                             # U_s = cayley(skew(P_s)), learned eigenvectors
            self.P_s = nn.Parameter(torch.randn(d, d) / math.sqrt(d))
        elif c.sigma == "random":                            # Random-TransJect: one draw, then trained
            self.Sigma = nn.Parameter(torch.rand(d))
        self.blocks = nn.ModuleList(Layer(c) for _ in range(c.n_layer))
        if c.head == "lm":
            self.lm_head = nn.Linear(d, c.vocab_size, bias=c.bias)
        else:                                                # the final feed-forward classifier (B.1)
            d_in = d if c.head == "cls" else 4 * d           # match: on [u, v, u*v, u-v]
            self.classifier = nn.Sequential(nn.Linear(d_in, d), nn.ReLU(), nn.Linear(d, c.n_classes))

    def spectrum(self, X0, mask):
        """Σ (§3.2) from the initial embeddings X0 (B, L, d) and the real tokens mask (B, L): (B, 1, d), or for
        head lm (B, L, d) with row t from tokens 1..t. Largest entry 1. Also the reconstruction loss."""
        c, causal = self.config, self.config.head == "lm"
        if c.sigma == "random":
            return (self.Sigma / self.Sigma.abs().max())[None, None], 0.0
        X = X0 * mask[..., None].to(X0.dtype)                # padded rows zeroed: they add nothing to G
        recon = 0.0
        if c.sigma == "exact":                               # eigenvalues of G = X^T X (or of the prefix G_t)
            if causal:
                G = (X[..., :, None] * X[..., None, :]).cumsum(1)   # (B, L, d, d) G_t = sum_{s<=t} x_s^T x_s
            else:
                G = (X.transpose(1, 2) @ X)[:, None]         # (B, 1, d, d)
            Sigma = torch.linalg.eigvalsh(G.double()).to(X.dtype)  # (B, 1 or L, d) ascending; float64: the
                                                             # first prefixes have rank t < d, many equal zeros
        else:
            U_s = cayley(skew(self.P_s))                     # (d, d) columns u_i
            # Σ_ii = u_i^T G u_i = sum_t (x_t . u_i)^2, with U_s fixed: the task loss does not move U_s
            Z2 = (X @ U_s.detach()) ** 2                     # (B, L, d)
            Sigma = Z2.cumsum(1) if causal else Z2.sum(1, keepdim=True)
            if self.training:
                # 1 - sum_i Σ_ii^2 / ||G||_F^2 = ||G - U_s Σ U_s^T||_F^2 / ||G||_F^2, on whole sequences with X
                # fixed: it trains U_s alone (toward G's eigenvectors) and so never sees a prediction
                Xd = X.detach()
                G = Xd.transpose(1, 2) @ Xd                  # (B, d, d)
                Sigma_s = ((Xd @ U_s) ** 2).sum(1)           # (B, d)
                recon = (1 - Sigma_s.pow(2).sum(-1) / G.pow(2).sum((-2, -1)).clamp_min(1e-12)).mean()
        # "stochastic X^T X": largest entry 1 (a scale, so G's 1/n is left out)      (Cor. 2)
        return Sigma / Sigma.amax(-1, keepdim=True).clamp_min(1e-12), recon

    def encode(self, idx):
        """Token ids (B, L) -> X^(L) (B, L, d), the mask of real tokens (B, L), the reconstruction loss."""
        mask = idx != 0
        X = self.embed(idx)                                  # X^(0)                              (§3.5)
        Sigma, recon = self.spectrum(X, mask)                # computed once, shared by all layers
        for block in self.blocks:                            # checkpointing: the same values, less memory
            if self.config.checkpointing and self.training:
                X = recompute(block, X, mask, Sigma, use_reentrant=False)
            else:
                X = block(X, mask, Sigma)
        return X, mask, recon

    def pool(self, X, mask):                                 # (B, L, d) -> (B, d) over the real tokens (B.1)
        if self.config.pool == "max":
            return X.masked_fill(~mask[..., None], -math.inf).amax(1)
        return masked_mean(X, mask, causal=False)[:, 0]

    def forward(self, idx, targets=None):
        c = self.config
        if c.head == "lm":
            X, _, recon = self.encode(idx)
            logits = self.lm_head(X)                         # (B, L, V)
            loss = None if targets is None else F.cross_entropy(
                logits.flatten(0, 1).float(), targets.flatten(), ignore_index=-1)
        else:
            if c.head == "cls":
                X, mask, recon = self.encode(idx)
                feats = self.pool(X, mask)                   # (B, d)
            else:                                            # one shared encoder on both documents
                B = idx.shape[0]
                X, mask, recon = self.encode(idx.flatten(0, 1))
                u, v = self.pool(X, mask).view(B, 2, -1).unbind(1)
                feats = torch.cat([u, v, u * v, u - v], dim=-1)   # (B, 4d)
            logits = self.classifier(feats)                  # (B, n_classes)
            loss = None if targets is None else F.cross_entropy(logits.float(), targets)
        if loss is not None:                                 # recon is 0 in evaluation: eval losses are the task's
            loss = loss + c.sigma_loss_weight * recon
        return logits, loss

    # --- generation: nanoGPT's generate; the state and the maths are in the section Generation below ---

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None):
        """Continue each row of idx (B, L) by max_new_tokens sampled tokens: (B, L + max_new_tokens).
        nanoGPT's semantics (logits of the last position / temperature, top_k, softmax, multinomial; top_k=1 is
        greedy), computed recurrently from running sums for Σ_t and λ_t; in eval mode, no dropout."""
        check_generation(self, idx, "idx", temperature, top_k)
        was_training, block_size = self.training, self.config.block_size
        self.eval()
        try:
            state = None
            for _ in range(max_new_tokens):
                if state is None or state.t == block_size:  # the prompt, or a full window: (re)build the state
                    context = idx[:, -block_size:]           # from the last block_size tokens
                    logits, state = self.prefill(context, context.shape[1] + max_new_tokens)  # capped at block_size
                else:                                        # one token: constant cost
                    logits = self.decode(idx[:, -1:], state)
                idx = torch.cat([idx, sample_next(logits, temperature, top_k)], dim=1)
        finally:
            self.train(was_training)
        return idx

    @torch.no_grad()
    def prefill(self, idx, capacity=None):
        """Read a prompt idx (B, L) in the prefix-sum form: (logits of its last position (B, V), the state).
        capacity is the interface's (the KV cache size of other models); the state here has a fixed size."""
        check_generation(self, idx)
        state = GenerationState(self)
        return read_tokens(self, idx, state), state

    @torch.no_grad()
    def decode(self, idx_next, state):
        """One more token per row, idx_next (B, 1), after the state's tokens: its logits (B, V); the state
        is updated in place."""
        if idx_next.dim() != 2 or idx_next.shape[1] != 1:
            raise ValueError(f"decode takes one token per row, (B, 1), not {tuple(idx_next.shape)}")
        return read_tokens(self, idx_next, state)

    # for analyze.py (figures 5 and 7 of the paper)
    @torch.no_grad()
    def expert_weights(self, idx):
        """λ^(l) of every layer: a list of (B, E) tensors ((B, L, E) for head lm, one per prefix)."""
        idx = idx.reshape(-1, idx.shape[-1])
        mask = idx != 0
        X = self.embed(idx)
        Sigma, _ = self.spectrum(X, mask)
        out = []
        for block in self.blocks:
            out.append(block.expert_weights(X, mask).squeeze(1))
            X = block(X, mask, Sigma)
        return out

    def residual_weights(self):
        """α_l / L of every layer (eq. 2)."""
        return {f"layer {l + 1}": block.alpha().detach() / block.L for l, block in enumerate(self.blocks)}


# ----------------------------------------------------------------------------------------------
# Generation (nanoGPT's model.generate), inference only: eval mode, no dropout, every orthogonal matrix
# (embedding, U_s, U_e, V_e, W1, W2) made once per call.
#
# The causal model is recurrent: Σ_t and λ_t are functions of prefix sums, so a state of fixed size carries
# everything a new token needs. With m_s = 1 for a real token and 0 for padding (id 0), x_s = X0_s:
#     n_t     = n_{t-1} + m_s                                   real tokens among 1..t
#     learned: z_t = z_{t-1} + m_t (x_t U_s)^2  (d,)            Σ_t,ii = z_t,i = sum_s (x_s . u_i)^2    (§3.2)
#     exact  : G_t = G_{t-1} + m_t x_t^T x_t   (d x d)          Σ_t = eigvalsh(G_t): O(d^3) per token
#     random : Σ constant
#     Σ_t / max_i Σ_t,i                                                                               (Cor. 2)
#     per layer l, with X_t the layer's input:
#     s_t^(l) = s_{t-1}^(l) + m_t X_t (d,)                     λ_t = softmax(gate(s_t / max(n_t, 1)))   (eq. 3)
# and the rest of a layer (eq. 2, 3, §3.4) acts on each token alone. A new token costs O(E d^2) per layer
# (exact Σ: plus one d x d eigendecomposition) at any context length. The prompt is read in the prefix-sum
# form (cumulative sums over its tokens, as the forward), which leaves the sums of its last token.
#
# Context beyond block_size: the position encodings stop at block_size (the forward cannot read more), so, as
# nanoGPT, the model sees only the last block_size tokens. Once the state holds block_size tokens it is rebuilt
# from the last block_size tokens before the next one: every token of the window moves one position down, so
# its X0_s, and with it every sum above, changes (nothing can be subtracted out). Each such token costs one
# forward over block_size tokens, bounded by block_size, never by the text's length.


class GenerationState:
    """What generation keeps between tokens: t, the positions read so far; n (B, 1) real tokens among them;
    z: the running sum behind Σ (learned (B, d); exact G_t (B, d, d) in float64; random None); s[l] (B, d) the
    running sum of layer l's inputs; the weights made once. Sigma (B, T, d) and lam[l] (B, T, E) are the Σ_t
    and λ_t of the tokens read last (for inspection)."""

    def __init__(self, model):
        c = model.config
        self.t = 0
        self.n = self.z = self.s = None                     # set by the first read_tokens
        self.Sigma, self.lam = None, [None] * c.n_layer
        self.E = model.embed.weight()                                   # (V, d/2) c E, semi-orthogonal
        self.U_s = cayley(skew(model.P_s)) if c.sigma == "learned" else None   # (d, d) columns u_i
        self.layers = []
        for block in model.blocks:
            U, V, W = cayley(skew(block.P)).split([block.E, block.E, 2])      # (E, d, d), (E, d, d), (2, d, d)
            b1, b2 = (0, 0) if block.b is None else block.b
            self.layers.append(dict(U=U, V=V, W=W, b1=b1, b2=b2, alpha_L=block.alpha() / block.L))

    def nbytes(self):                                       # the size of the running sums
        return sum(x.numel() * x.element_size() for x in (self.n, self.z, *self.s) if x is not None)


def layer_step(block, X, lam, Sigma, w):
    """Layer.forward for T tokens X (B, T, d) given their λ_t (B, T, E) and Σ_t (B, T, d)."""
    # F_e(X) = ELU(X U_e Σ V_e), all experts at once                                          (Thm. 1)
    F_e = F.elu(((X[:, None] @ w["U"]) * Sigma[:, None]) @ w["V"])   # (B, E, T, d)
    # X^(l) = X + α_l/L sum_e λ_e F_e(X)                                                        (eq. 2, 3)
    X = X + w["alpha_L"] * torch.einsum("bte,betd->btd", lam, F_e)
    # ORF(X) = X + α_l/L ELU(ELU(X W1 + b1) W2 + b2)                                             (§3.4)
    return X + w["alpha_L"] * F.elu(F.elu(X @ w["W"][0] + w["b1"]) @ w["W"][1] + w["b2"])


def read_tokens(model, idx, state):
    """Run the tokens idx (B, T) through the model after the state's tokens: logits of the last (B, V).
    Every running sum continues from the state: prefix sums over the T tokens, added to the state's."""
    c, (B, T), t0 = model.config, idx.shape, state.t
    if t0 + T > c.block_size:
        raise ValueError(f"the state holds {t0} tokens; {T} more exceed block_size {c.block_size}")
    X0 = torch.cat([state.E[idx], model.embed.PE[t0:t0 + T].expand(B, T, -1)], dim=-1)   # (B, T, d)  (§3.5)
    m = (idx != 0)[..., None].to(X0.dtype)                  # (B, T, 1) real tokens
    if state.n is None:                                      # an empty state: the sums start at zero
        d = c.n_embd
        state.n = X0.new_zeros(B, 1)
        state.s = [X0.new_zeros(B, d) for _ in model.blocks]
        state.z = (X0.new_zeros(B, d) if c.sigma == "learned" else
                   X0.new_zeros(B, d, d, dtype=torch.float64) if c.sigma == "exact" else None)
    n = state.n[:, None] + m.cumsum(1)                      # (B, T, 1) n_t
    X = X0 * m                                               # padding adds nothing
    if c.sigma == "random":
        Sigma = (model.Sigma / model.Sigma.abs().max())[None, None]   # (1, 1, d)
    else:
        if c.sigma == "learned":                             # z_t = z_{t-1} + (x_t U_s)^2                (§3.2)
            z = state.z[:, None] + ((X @ state.U_s) ** 2).cumsum(1)   # (B, T, d)
            Sigma = z
        else:                                                # G_t = G_{t-1} + x_t^T x_t, in float64
            z = state.z[:, None] + (X[..., :, None] * X[..., None, :]).double().cumsum(1)   # (B, T, d, d)
            Sigma = torch.linalg.eigvalsh(z).to(X0.dtype)    # (B, T, d)
        state.z = z[:, -1]
        Sigma = Sigma / Sigma.amax(-1, keepdim=True).clamp_min(1e-12)  # largest entry 1            (Cor. 2)
    state.Sigma = Sigma
    X = X0
    for l, (block, w) in enumerate(zip(model.blocks, state.layers)):
        s = state.s[l][:, None] + (X * m).cumsum(1)          # (B, T, d) s_t = s_{t-1} + m_t X_t
        state.s[l] = s[:, -1]
        lam = block.gate(s / n.clamp_min(1)).softmax(-1)     # (B, T, E) λ_t from the mean of 1..t       (eq. 3)
        state.lam[l] = lam
        X = layer_step(block, X, lam, Sigma, w)
    state.n = n[:, -1]
    state.t += T
    return model.lm_head(X[:, -1])                           # (B, V)


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
