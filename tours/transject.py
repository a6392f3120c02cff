# %% [markdown]
# # A guided tour of TransJect
#
# Sengupta, Akhtar, Chakraborty, *Manifold-Preserving Transformers are Effective for Short-Long Range Encoding*
# (Findings of EMNLP 2023), and this project's `transject.py`.
#
# **The idea.** Linear attention without its normalisation, with orthogonal $W^Q, W^K, W^V$, collapses to
# $X U \Sigma V$: two orthogonal matrices around the eigenvalues of $X^\top X$, no $n \times n$ matrix at all.
# Scale $\Sigma$ so that its largest entry is 1, wrap the attention and the feed-forward layer in residuals
# weighted by $\alpha_l / L < 1 / L$, and every map of a layer becomes injective and Lipschitz: the distance
# between two tokens changes, layer after layer, only by a bounded factor. The paper argues that such
# distance-preserving ("manifold-preserving") layers encode short and long sequences better.
#
# **What this tour shows.** Each equation of the paper on tiny tensors, computed by a written-out loop or a
# dense formula and checked by an `assert` against the line of `transject.py` that computes it; pictures of
# what the constraints do (orthogonality of the Cayley map, the spectrum $\Sigma$, distances between tokens
# before and after a layer against the bound of Theorem 2, Lyapunov exponents through a deep stack); a small
# TransJect trained for about a minute with the project's own `train.py`; exercises.
#
# **How long.** Under a minute top to bottom (45 s on an idle 2-core CPU, ListOps generated on the first run),
# most of it the training.

# %%
# Set-up. On Google Colab: clone your copy of the project (set REPO to its address) and install its requirements.
# Anywhere else: find the project's folder (the one that holds train.py) and work from there.
import os
import signal
import subprocess
import sys

REPO = "https://github.com/YOUR-NAME/YOUR-COPY.git"      # Colab only: the address of your copy of this project
if "google.colab" in sys.modules:
    ROOT = "/content/project"
    if not os.path.isdir(ROOT):
        if "YOUR-NAME" in REPO:
            sys.exit("error: set REPO in this cell to the address of your copy of the project, then run it again")
        subprocess.run(["git", "clone", "--depth", "1", REPO, ROOT], check=True)
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "-r", f"{ROOT}/requirements.txt"], check=True)
else:
    ROOT = os.path.dirname(os.path.abspath(__file__)) if "__file__" in globals() else os.getcwd()
    while not os.path.isfile(os.path.join(ROOT, "train.py")):
        if os.path.dirname(ROOT) == ROOT:
            sys.exit("error: open this tour from inside the project (the folder that holds train.py)")
        ROOT = os.path.dirname(ROOT)
os.chdir(ROOT)                                            # train.py's out/ and data/ go there
sys.path.insert(0, ROOT)                                  # before tours/: the model file, not the tour of its name


def run_python(*args):
    """python ARGS in a process of its own, its output printed as it comes; returns its exit status. When the tour
    stops first (Ctrl-C, SIGTERM, an error), the process is stopped too: none goes on working alone."""
    print("$ python", *args, flush=True)
    with subprocess.Popen([sys.executable, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as p:
        try:
            for line in p.stdout:
                print(line, end="", flush=True)
        except BaseException:
            p.terminate()                                 # SIGTERM: it ends as the programs do, its workers too
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
            raise
    return p.returncode


if "ipykernel" not in sys.modules:                        # python tours/NAME.py: no flags; MPLBACKEND a backend
    def stop_quietly(kind, error, trace):                 # Ctrl-C, or the reader of stdout gone (... | head -1):
        if issubclass(kind, BrokenPipeError):             # end as the project's programs do, without a traceback
            from data import stopped_by_pipe
            stopped_by_pipe()
        if issubclass(kind, KeyboardInterrupt) or kind.__name__ == "Interrupted":   # (train.py's, between steps)
            print("interrupted: the tour stopped; the files it wrote before are as they were", file=sys.stderr)
            os._exit(130)                                 # (sys.exit is no use in an excepthook)
        if kind.__name__ == "Terminated":                 # SIGTERM (data.terminate, below): exit status 143
            print("terminated: the tour stopped; the files it wrote before are as they were", file=sys.stderr)
            os._exit(143)
        sys.__excepthook__(kind, error, trace)
    sys.excepthook = stop_quietly
    signal.signal(signal.SIGINT, signal.default_int_handler)   # (a background job starts with Ctrl-C ignored)
    sys.stdout.reconfigure(line_buffering=True)           # each line as it is printed, to a pipe too
    if sys.argv[1:]:
        sys.exit(f"error: a tour reads no flags ({' '.join(sys.argv[1:])}): run python {sys.argv[0]} alone")
    try:
        import matplotlib  # noqa: F401
    except ValueError:
        sys.exit(f"error: MPLBACKEND={os.environ.get('MPLBACKEND')} names no backend of matplotlib's (e.g. TkAgg, "
                 "QtAgg, Agg): set one, or unset it")
    from data import terminate                            # SIGTERM raised where the tour is, as Ctrl-C is: run_python
    signal.signal(signal.SIGTERM, terminate)              # stops its process, and the tour ends in one line

# %%
import json
import math

import matplotlib
import numpy as np
import torch
import torch.nn.functional as F

import analyze                               # the papers' analyses (it selects Agg for the PNG files it writes)
import data                                  # the data API, and the tasks it knows
import tasks                                 # noqa: F401 (registers every task with data)
import train                                 # the project's training program
import transject                             # the model file this tour reads
from tasks.listops_rules import listops_baselines

if "ipykernel" in sys.modules:               # a notebook: figures inline (again, after analyze's Agg)
    from IPython import get_ipython
    get_ipython().run_line_magic("matplotlib", "inline")
else:
    matplotlib.use("Agg")                    # a script: the figures are drawn, not shown
import matplotlib.pyplot as plt

torch.manual_seed(0)
torch.set_printoptions(precision=4, sci_mode=False)

# %% [markdown]
# ## 1. Orthogonal matrices from the Cayley map
#
# Every matrix of TransJect that the paper calls orthogonal ($U_e$, $V_e$ of each expert, $W_1$, $W_2$ of the
# feed-forward layer, the token embedding) is made by the Cayley map of a skew-symmetric matrix. A free parameter
# $P$ gives $A = P - P^\top$ (so $A^\top = -A$), and
#
# $$W = (I - A)(I + A)^{-1}.$$
#
# Why $W$ is orthogonal: $I - A$ and $(I + A)^{-1}$ commute, and $(I - A)^\top = I + A$, so
# $W^\top W = (I + A)^{-\top}(I - A)^\top (I - A)(I + A)^{-1} = (I - A)^{-1}(I + A)(I - A)(I + A)^{-1} = I$.
# $A$'s eigenvalues are imaginary, $i\theta$, so $I + A$ is always invertible and $W$'s eigenvalues
# $(1 - i\theta)/(1 + i\theta)$ lie on the unit circle. Gradient descent moves $P$ freely and $W$ stays
# orthogonal: no projection step, no penalty. The file computes it with one linear solve,
# `transject.cayley(A)`; here is the formula written out with an explicit inverse, in float64.

# %%
d = 5
P = torch.randn(d, d, dtype=torch.float64)
I = torch.eye(d, dtype=torch.float64)
A = P - P.T                                          # skew-symmetric
W_formula = (I - A) @ torch.linalg.inv(I + A)         # the equation, as written
W = transject.cayley(transject.skew(P))               # the file's line
assert torch.allclose(transject.skew(P), A) and torch.allclose(A.T, -A)
assert torch.allclose(W, W_formula, atol=1e-12)
assert torch.allclose(W.T @ W, I, atol=1e-12)         # orthogonal ...
assert abs(torch.linalg.det(W).item() - 1) < 1e-12    # ... and a rotation (det +1)
print("W^T W =\n", W.T @ W)

# %% [markdown]
# What does an ordinary matrix do instead? Take $M = P / \sqrt{d}$, the file's own initialisation of $P$
# before the Cayley map. The figure compares the two: how much each stretches a random vector
# ($\|x W\| / \|x\|$), where their eigenvalues lie, and how close $W^\top W$ stays to $I$ in float32 as $d$
# grows (the model trains in float32).

# %%
torch.manual_seed(1)
dims = [4, 8, 16, 32, 64, 128, 256, 512]
err_cayley, err_plain = [], []
for n in dims:
    P_n = torch.randn(n, n) / math.sqrt(n)                # float32, as in training
    W_n = transject.cayley(transject.skew(P_n))
    err_cayley.append((W_n.T @ W_n - torch.eye(n)).abs().max().item())
    err_plain.append((P_n.T @ P_n - torch.eye(n)).abs().max().item())
assert max(err_cayley) < 1e-5                             # orthogonal to float32 precision at every size
d = 64
P64 = torch.randn(d, d, dtype=torch.float64) / math.sqrt(d)
W64 = transject.cayley(transject.skew(P64))
x = torch.randn(2000, d, dtype=torch.float64)
stretch_W, stretch_M = (x @ W64).norm(dim=1) / x.norm(dim=1), (x @ P64).norm(dim=1) / x.norm(dim=1)
eig_W, eig_M = torch.linalg.eigvals(W64), torch.linalg.eigvals(P64)
assert torch.allclose(stretch_W, torch.ones_like(stretch_W))        # W keeps every length ...
assert torch.allclose(eig_W.abs(), torch.ones(d, dtype=torch.float64))   # ... its eigenvalues on the unit circle

# %%
fig, axes = plt.subplots(1, 3, figsize=(15, 4.3))
axes[0].hist(stretch_M.numpy(), bins=40, color="tab:red", alpha=0.7, label="plain M = P/\u221ad")
axes[0].axvline(1.0, color="tab:blue", lw=3, label="Cayley W: every vector exactly 1")
axes[0].set(xlabel="\u2016x M\u2016 / \u2016x\u2016 for 2,000 random x", ylabel="count",
            title=f"How much a {d} \u00d7 {d} matrix stretches a vector")
t = np.linspace(0, 2 * np.pi, 200)
axes[1].plot(np.cos(t), np.sin(t), color="gray", lw=0.8, label="unit circle")
axes[1].scatter(eig_M.real, eig_M.imag, s=12, color="tab:red", label="plain M")
axes[1].scatter(eig_W.real, eig_W.imag, s=12, color="tab:blue", label="Cayley W")
axes[1].set(xlabel="real part", ylabel="imaginary part", title="Eigenvalues", aspect="equal")
axes[2].loglog(dims, err_plain, "o-", color="tab:red", label="plain M")
axes[2].loglog(dims, err_cayley, "o-", color="tab:blue", label="Cayley W (float32)")
axes[2].axhline(torch.finfo(torch.float32).eps, color="gray", ls=":", label="float32 machine epsilon")
axes[2].set(xlabel="size d", ylabel="max |W\u1d40W \u2212 I|", title="Distance from orthogonal")
for ax in axes:
    ax.legend(fontsize=8)
fig.tight_layout()
plt.show()

# %% [markdown]
# ## 2. The injective embedding (§3.5)
#
# A sum $\mathrm{Emb}(x_t) + PE_t$ can give two different (token, position) pairs the same vector; a
# concatenation cannot. TransJect's first layer input is
#
# $$X^{(0)}_t = \mathrm{Concat}\big(c\,E[x_t],\ PE_t\big), \qquad
#   PE_{t, 2i} = \sin\!\big(t / 10000^{2i/k}\big),\quad PE_{t, 2i+1} = \cos\!\big(t / 10000^{2i/k}\big),$$
#
# each half $k = d/2$ wide. $E$ (vocabulary $\times$ $k$) has orthonormal columns: the first $k$ columns of a
# Cayley map of the skew matrix $\begin{pmatrix} S & -B^\top \\ B & 0 \end{pmatrix}$, which
# `transject.semi_orthogonal(S, B)` computes blockwise, without the vocabulary $\times$ vocabulary solve.
# The scale $c$ is the file's own addition (docs/transject.md): it gives a token, on average, the norm of its
# position encoding. Below: the blockwise columns against the full Cayley map, and the file's
# `InjectiveEmbedding` against the formula with a loop over positions.

# %%
torch.manual_seed(2)
k, m = 3, 4
S = transject.skew(torch.randn(k, k, dtype=torch.float64))
Bm = torch.randn(m, k, dtype=torch.float64)
A_full = torch.cat([torch.cat([S, -Bm.T], 1), torch.cat([Bm, torch.zeros(m, m, dtype=torch.float64)], 1)])
assert torch.allclose(transject.semi_orthogonal(S, Bm), transject.cayley(A_full)[:, :k], atol=1e-12)

config = transject.Config(vocab_size=12, block_size=16, n_layer=2, n_embd=8, n_experts=3, dropout=0.0,
                          head="cls", n_classes=4, sigma="exact")
model = transject.Model(config).double().eval()
idx = torch.tensor([[3, 5, 7, 2, 9, 0, 0], [1, 4, 4, 8, 11, 6, 2]])    # two sequences, id 0 is padding
mask = idx != 0
k = config.n_embd // 2
E = model.embed.weight()                                  # (vocab, k) = c E
assert torch.allclose(E.T @ E, model.embed.c ** 2 * torch.eye(k, dtype=torch.float64))   # orthogonal columns
X0 = model.embed(idx)                                     # (B, n, d), the file's line
for b in range(idx.shape[0]):
    for t in range(idx.shape[1]):
        pe = [f(t / 10000 ** (2 * i / k)) for i in range(k // 2) for f in (math.sin, math.cos)]
        row = torch.cat([E[idx[b, t]], torch.tensor(pe, dtype=torch.float64)])
        assert torch.allclose(X0[b, t], row, atol=1e-6)   # PE is kept in float32 by the file
print("X0 of the first sequence, first 3 tokens:\n", X0[0, :3])

# %% [markdown]
# ## 3. Orthogonal attention: $X U \Sigma V$ (Theorem 1, equations 9–10)
#
# Linear attention without normalisation is $(X W^Q)(X W^K)^\top (X W^V)$: an $n \times n$ matrix of scores
# times the values. Regroup the product around $X^\top X$ ($d \times d$) and diagonalise that symmetric matrix,
# $X^\top X = \tilde Q \Sigma \tilde Q^\top$:
#
# $$\mathrm{Attention}(Q, K, V) = X\,\underbrace{W^Q W^{K\top} \tilde Q}_{\text{orthogonal}}\;
#   \underbrace{\Sigma}_{\text{diagonal}}\; \underbrace{\tilde Q^\top W^V}_{\text{orthogonal}} \qquad (9)$$
#
# $$\mathrm{Attention}(Q, K, V) = X U \Sigma V \qquad (10)$$
#
# With orthogonal $W$'s, $U$ and $V$ are orthogonal, and TransJect learns $U$ and $V$ directly (one pair per
# expert $e$) and applies an ELU: $F_e(X) = \mathrm{ELU}(X U_e \Sigma V_e)$. The cost is $O(n d^2)$, never
# $O(n^2 d)$. Below: the $n \times n$ form as a double loop over token pairs, then (10), then the file's
# line. To isolate the attention in the file's per-token layer function `transject.layer_step`, we give it
# one expert, residual weight 1 and a zero feed-forward layer: then it returns $X + \mathrm{ELU}(X U \Sigma V)$.

# %%
torch.manual_seed(3)
n, d = 5, 4
X = torch.randn(n, d, dtype=torch.float64)
W_Q, W_K, W_V = (transject.cayley(transject.skew(torch.randn(d, d, dtype=torch.float64))) for _ in range(3))
Q, K, V_ = X @ W_Q, X @ W_K, X @ W_V
attention = torch.zeros(n, d, dtype=torch.float64)
for i in range(n):                                        # the n x n form: token i reads every token j
    for j in range(n):
        attention[i] += (Q[i] @ K[j]) * V_[j]
Sigma_, Q_tilde = torch.linalg.eigh(X.T @ X)              # X^T X = Q~ Sigma Q~^T
U, V = W_Q @ W_K.T @ Q_tilde, Q_tilde.T @ W_V             # (9)
assert torch.allclose(attention, X @ U @ torch.diag(Sigma_) @ V, atol=1e-10)   # (10)
I = torch.eye(d, dtype=torch.float64)
assert torch.allclose(U.T @ U, I) and torch.allclose(V.T @ V, I)    # U and V orthogonal
zero = torch.zeros(2, d, d, dtype=torch.float64)          # W_1 = W_2 = 0: the feed-forward layer adds ELU(0) = 0
w = dict(U=U[None], V=V[None], W=zero, b1=0, b2=0, alpha_L=1.0)
out = transject.layer_step(None, X[None], torch.ones(1, n, 1, dtype=torch.float64), Sigma_[None, None], w)[0]
assert torch.allclose(out - X, F.elu(attention), atol=1e-10)   # the file's F_e = ELU(X U Sigma V)
print("Attn(X) from the n x n loop and from X U Sigma V agree; largest |difference|:",
      (attention - X @ U @ torch.diag(Sigma_) @ V).abs().max().item())

# %% [markdown]
# ## 4. The spectrum $\Sigma$ (§3.2, Corollary 2)
#
# $\Sigma$ is computed once per sequence, from the embeddings $X^{(0)}$ of its real tokens, and every layer
# reuses it. The activation bound of $x \mapsto x U \Sigma V$ is the largest entry of $\Sigma$ (Lemma 2:
# orthogonal maps keep lengths), so the paper makes it 1 ("a stochastic $X^\top X$", Corollary 2); the file
# divides by the largest entry. With $G = X^{(0)\top} X^{(0)} = \sum_t x_t^\top x_t$ (padding left out), the
# file has three ways to get $\Sigma$ (`Config.sigma`):
#
# - **exact**: the eigenvalues of $G$, i.e. the squared singular values of $X^{(0)}$:
#   $\Sigma = \sigma(X^{(0)})^2 / \max_i \sigma_i(X^{(0)})^2$.
# - **learned** (the paper's approximation, $O(n d^2)$, no eigensolver): a learned orthogonal $U_s$ with
#   columns $u_i$ and the best diagonal for $\|G - U_s \Sigma U_s^\top\|_F$,
#   $$\Sigma_{ii} = u_i^\top G\, u_i = \sum_t (x_t \cdot u_i)^2, \qquad
#   \text{reconstruction loss} = \frac{\|G - U_s \Sigma U_s^\top\|_F^2}{\|G\|_F^2}
#   = 1 - \frac{\sum_i \Sigma_{ii}^2}{\|G\|_F^2},$$
#   zero exactly when $U_s$ holds $G$'s eigenvectors. It is added to the task loss and trains $U_s$ alone.
# - **random** (Random-TransJect): drawn once, then trained like any weight.
#
# Below: `Model.spectrum` against singular values computed another way, and against the loop over tokens.

# %%
Sigma, _ = model.spectrum(X0, mask)                       # exact: (B, 1, d)
for b in range(idx.shape[0]):
    s2 = torch.linalg.svdvals(X0[b][mask[b]]) ** 2         # squared singular values of the real tokens
    s2 = torch.cat([torch.zeros(config.n_embd - len(s2), dtype=s2.dtype), s2.flip(0)])  # n < d tokens: d - n zeros
    assert torch.allclose(Sigma[b, 0], s2 / s2.max(), atol=1e-12)     # ascending, largest 1
print("exact Sigma of the two sequences (5 and 7 real tokens, d = 8):\n", Sigma[:, 0])

torch.manual_seed(4)
learned = transject.Model(transject.Config(**{**config.__dict__, "sigma": "learned"})).double().train()
X0_l = learned.embed(idx)
Sigma_l, recon = learned.spectrum(X0_l, mask)             # training mode: also the reconstruction loss
U_s = transject.cayley(transject.skew(learned.P_s))
losses = []
for b in range(idx.shape[0]):
    G = sum(torch.outer(X0_l[b, t], X0_l[b, t]) for t in range(idx.shape[1]) if mask[b, t])
    diag = torch.stack([U_s[:, i] @ G @ U_s[:, i] for i in range(config.n_embd)])
    assert torch.allclose(Sigma_l[b, 0], diag / diag.max(), atol=1e-12)
    losses.append(((G - U_s @ torch.diag(diag) @ U_s.T) ** 2).sum() / (G ** 2).sum())
assert torch.allclose(recon, sum(losses) / len(losses), atol=1e-12)
print(f"reconstruction loss with a random U_s: {recon.item():.3f} (0 when U_s holds G's eigenvectors)")

# %% [markdown]
# ## 5. One layer: injective residual, experts, orthogonal feed-forward (equations 2–4, §3.4)
#
# Each expert $e$ has its own attention $F_e$ and its own residual step (the injective residual, IR):
#
# $$X^{(l, e)} = X^{(l-1)} + \frac{\alpha_l}{L} F_e(X^{(l-1)}), \qquad \alpha_l = \mathrm{sigmoid}(a_l) \in (0, 1) \qquad (2)$$
#
# and the layer mixes the experts with one convex weight vector per sequence (the mixture of experts, MOE):
#
# $$X^{(l)} = \sum_{e=1}^{E} \lambda_e^{(l)} X^{(l, e)}, \qquad \sum_{e=1}^{E} \lambda_e^{(l)} = 1 \qquad (3)$$
#
# ($\lambda$ is a softmax of a linear gate on the sequence's mean token; since $\sum_e \lambda_e = 1$ the file
# computes (3) as $X + \frac{\alpha_l}{L}\sum_e \lambda_e F_e(X)$). Then the orthogonal residual feed-forward
# layer (ORF, §3.4), with $W_1, W_2$ orthogonal:
#
# $$\mathrm{ORF}(X^{(l)}) = X^{(l)} + \frac{\alpha_l}{L}\,\mathrm{ELU}\big(\mathrm{ELU}(X^{(l)} W_1 + b_1) W_2 + b_2\big),$$
#
# $$\mathrm{SubLayer}^{(l)}(X^{(l-1)}) = \mathrm{ORF} \circ \mathrm{MOE} \circ \mathrm{IR}(X^{(l-1)}). \qquad (4)$$
#
# The loop below computes (4) token by token, each expert's $X^{(l,e)}$ separately as (2) and (3) write it,
# and must agree with `Layer.forward` (the gate, $a_l$ and the biases are set to random values first, so that
# nothing is trivially zero or uniform).

# %%
torch.manual_seed(5)
block = model.blocks[0]
with torch.no_grad():
    block.a.fill_(1.0)
    block.gate.weight.normal_()
    block.b.normal_()
out = block(X0, mask, Sigma)                              # the file's layer, all tokens and experts at once
U, V, W = transject.cayley(transject.skew(block.P)).split([config.n_experts, config.n_experts, 2])
a_L = torch.sigmoid(block.a) / config.n_layer             # alpha_l / L
loop = torch.zeros_like(X0)
for b in range(idx.shape[0]):
    real = [X0[b, t] for t in range(idx.shape[1]) if mask[b, t]]
    lam = torch.softmax(block.gate.weight @ (sum(real) / len(real)), dim=0)     # one vector per sequence
    assert abs(lam.sum().item() - 1) < 1e-12
    for t in range(idx.shape[1]):
        x = X0[b, t]
        X_le = [x + a_L * F.elu(x @ U[e] @ torch.diag(Sigma[b, 0]) @ V[e]) for e in range(config.n_experts)]  # (2)
        x = sum(lam[e] * X_le[e] for e in range(config.n_experts))                                            # (3)
        loop[b, t] = x + a_L * F.elu(F.elu(x @ W[0] + block.b[0]) @ W[1] + block.b[1])                        # ORF
assert torch.allclose(out, loop, atol=1e-12)
print("Layer.forward and the loop agree; largest |difference|:", (out - loop).abs().max().item())

# %% [markdown]
# ## 6. The isometry: distances between tokens before and after a layer (equation 1, Theorem 2)
#
# A map $f$ is Lipschitz with bound $K$ when
#
# $$\|f(x) - f(y)\| \le K \|x - y\| \qquad (1)$$
#
# Theorem 2 says each layer (4) is injective and Lipschitz with a data-independent bound; its proof (A.6)
# gives $\|f(x) - f(y)\| < (1 + 3/L)^2 \|x - y\|$. Given $\Sigma$ and $\lambda$, a tighter two-sided bound
# follows from the same facts: $x \mapsto \sum_e \lambda_e F_e(x)$ and the ORF's branch are 1-Lipschitz
# (orthogonal maps, $|\Sigma_{ii}| \le 1$, $\mathrm{ELU}' \in (0, 1]$), so each residual step $x + a\,g(x)$ with
# $a = \alpha_l / L$ changes a distance by a factor in $[1 - a, 1 + a]$, and the layer by a factor in
#
# $$\Big[(1 - \tfrac{\alpha_l}{L})^2,\ (1 + \tfrac{\alpha_l}{L})^2\Big] \subset \Big(0,\ (1 + \tfrac{3}{L})^2\Big).$$
#
# The lower end is above 0: two different tokens never land on the same point (injective). In a classifier
# ("cls" head) all tokens of a sequence share $\Sigma$ and $\lambda$, so the bound holds for every pair of
# tokens of a sequence. Below: a layer of the size we train later ($d = 64$, 4 experts, $L = 2$, exact
# $\Sigma$) with $\alpha_l$ at its ceiling (the trained model's gates end there), on 16 random sequences of 20
# tokens. We first check that `transject.layer_step`, the file's per-token form of the layer given $\Sigma$
# and $\lambda$, is the layer, then run the same function with the three constraints taken away: the raw
# parameters $P$ instead of their Cayley maps, the eigenvalues of $G$ as they are (not scaled to largest
# entry 1), and residual weight 1 instead of $\alpha_l / L$.

# %%
torch.manual_seed(6)
L = 2
big = transject.Model(transject.Config(vocab_size=16, block_size=32, n_layer=L, n_embd=64, n_experts=4,
                                       dropout=0.0, head="cls", n_classes=10, sigma="exact")).eval()
layer = big.blocks[0]
with torch.no_grad():
    layer.a.fill_(6.0)                                    # alpha_l = sigmoid(6) = 0.998: alpha_l / L near 1/L
    layer.gate.weight.normal_()
    layer.b.normal_()
idx_r = torch.randint(1, 16, (16, 20))
mask_r = idx_r != 0


def cayley_weights(block):
    """The weights Layer.forward makes from its parameters, in the form layer_step takes."""
    U, V, W = transject.cayley(transject.skew(block.P)).split([block.E, block.E, 2])
    return dict(U=U, V=V, W=W, b1=block.b[0], b2=block.b[1], alpha_L=block.alpha() / block.L)


def unconstrained_weights(block):
    """The same parameters without the constraints: the raw P instead of their Cayley maps, residual weight 1."""
    E = block.E
    return dict(U=block.P[:E], V=block.P[E:2 * E], W=block.P[2 * E:], b1=block.b[0], b2=block.b[1], alpha_L=1.0)


# %%
with torch.no_grad():
    X_in = big.embed(idx_r)
    Sigma_r, _ = big.spectrum(X_in, mask_r)               # (B, 1, d), largest entry 1 (Corollary 2)
    Sigma_raw = torch.linalg.eigvalsh(X_in.transpose(1, 2) @ X_in)[:, None]   # the eigenvalues of G as they are
    assert torch.allclose(Sigma_r, Sigma_raw / Sigma_raw.amax(-1, keepdim=True), atol=1e-5)
    lam_r = layer.expert_weights(X_in, mask_r).expand(-1, 20, -1)     # (B, n, E), the same for every token
    X_out = layer(X_in, mask_r, Sigma_r)
    assert torch.allclose(X_out, transject.layer_step(layer, X_in, lam_r, Sigma_r, cayley_weights(layer)), atol=1e-5)
    X_plain = transject.layer_step(layer, X_in, lam_r, Sigma_raw, unconstrained_weights(layer))
pairs = ~torch.eye(20, dtype=torch.bool)
d_in = torch.cdist(X_in, X_in)[:, pairs]                  # every pair of tokens of each sequence
d_out, d_plain = torch.cdist(X_out, X_out)[:, pairs], torch.cdist(X_plain, X_plain)[:, pairs]
a = layer.alpha().item() / L
lo, hi = (1 - a) ** 2, (1 + a) ** 2
ratio = d_out / d_in
assert ((ratio >= lo - 1e-4) & (ratio <= hi + 1e-4)).all()           # Theorem 2, pair by pair
print(f"alpha_l/L = {a:.3f}: bound [{lo:.3f}, {hi:.3f}], paper's (1+3/L)^2 = {(1 + 3 / L) ** 2:.2f}; "
      f"TransJect ratios in [{ratio.min():.3f}, {ratio.max():.3f}], "
      f"unconstrained in [{(d_plain / d_in).min():.3f}, {(d_plain / d_in).max():.3f}]")

# %% [markdown]
# The paper summarises the ratios by their mean, the *activation factor* of layer $l$:
#
# $$\mathbb{A}^{(l)} = \mathbb{E}_X\, \mathbb{E}_{i \ne j} \left[ \frac{\|X_i^{(l)} - X_j^{(l)}\|}{\|X_i^{(0)} - X_j^{(0)}\|} \right] \qquad (5)$$
#
# `analyze.activation_factor` computes it per sequence (`python analyze.py activation` draws it for
# trained checkpoints); here against a plain double loop over token pairs.

# %%
A_file = analyze.activation_factor(X_in, X_out, mask_r)  # (B,) one value per sequence
for b in range(3):
    r = [((X_out[b, i] - X_out[b, j]).norm() / (X_in[b, i] - X_in[b, j]).norm()).item()
         for i in range(20) for j in range(20) if i != j]
    assert abs(A_file[b].item() - sum(r) / len(r)) < 1e-5
print("activation factor (5) of the first sequences:", A_file[:4].numpy().round(4))

# %%
fig, axes = plt.subplots(1, 2, figsize=(13, 5))
top = d_in.max().item() * 1.05
for ax, d_after, name, color in ((axes[0], d_out, "TransJect layer", "tab:blue"),
                                 (axes[1], d_plain, "the same layer, unconstrained", "tab:red")):
    ax.scatter(d_in.flatten(), d_after.flatten(), s=3, alpha=0.3, color=color, label=name)
    ax.plot([0, top], [0, top], color="black", lw=0.8, label="distance kept (ratio 1)")
    ax.fill_between([0, top], [0, lo * top], [0, hi * top], color="tab:green", alpha=0.15,
                    label=f"Theorem 2 given \u03a3, \u03bb: ratio in [{lo:.2f}, {hi:.2f}]")
    ax.plot([0, top], [0, (1 + 3 / L) ** 2 * top], color="gray", ls="--",
            label=f"paper's bound (1+3/L)\u00b2 = {(1 + 3 / L) ** 2:.2f}")
    ax.set(xlabel="distance between two tokens before the layer", ylabel="distance after the layer",
           title=f"{name}: {d_in.numel():,} token pairs", xlim=(0, top),
           ylim=(0, max(top * hi, d_after.max().item()) * 1.05))
    ax.legend(fontsize=8, loc="upper left")
fig.tight_layout()
plt.show()

# %% [markdown]
# ## 7. Lyapunov exponents: how a deep stack stretches a token
#
# Distances after one layer are bounded; what about many? Follow one token through $L$ layers and ask how
# its layers stretch a small change $\delta x$: $\delta x^{(L)} = M_L \cdots M_1\, \delta x$ with
# $M_l = \partial x^{(l)} / \partial x^{(l-1)}$, the token's $d \times d$ Jacobian at layer $l$ (given $\Sigma$
# and $\lambda$, a token moves alone: the Jacobian between two different tokens is zero, and the code below
# checks it). The Lyapunov exponents are the average log-stretch per layer along $d$ orthogonal directions:
# propagate $Q_l R_l = M_l Q_{l-1}$ (QR after each layer, $Q_0 = I$) and
#
# $$\lambda_i = \frac{1}{L} \sum_{l=1}^{L} \log |(R_l)_{ii}|.$$
#
# `analyze.lyapunov_spectrum` does exactly this for the tangent equation of an ODE, with Euler steps
# $Q \leftarrow Q + \Delta t\, J_l Q$ (DiffEqFormer's analysis); with $J_l = M_l - I$ and $\Delta t = 1$ each step
# is one layer. `analyze.token_jacobians` gives the Jacobians. By the bound above every exponent of TransJect
# lies in $[2 \log(1 - \alpha/L),\ 2 \log(1 + \alpha/L)]$, at any depth. Two checks: that band, and
# $\sum_i \lambda_i = \frac{1}{L} \log|\det(M_L \cdots M_1)| = \frac{1}{L} \sum_l \log|\det M_l|$ (the volume
# the layers stretch). We use 32 layers in float64, 16 wide, 10 tokens.

# %%
def lyapunov(stack, idx, plain=False):
    """For each token of one sequence idx (1, n): the Lyapunov exponents (n, d) of the stack, largest first, given
    its Sigma and lambda. plain: without the constraints (unconstrained_weights, Sigma not scaled)."""
    mask = idx != 0
    with torch.no_grad():
        X = stack.embed(idx)[0]                           # (n, d)
        Sigma, _ = stack.spectrum(X[None], mask)
        if plain:
            Sigma = torch.linalg.eigvalsh(X.T @ X)[None, None]
    n, d = X.shape
    M_minus_I = []
    for block in stack.blocks:
        with torch.no_grad():
            lam = block.expert_weights(X[None], mask).expand(-1, n, -1)
            w = unconstrained_weights(block) if plain else cayley_weights(block)

        def step(Z, l):                                   # x^(l) - x^(l-1) for every token, Z (n, d)
            return transject.layer_step(block, Z[None], lam, Sigma, w)[0] - Z
        J = analyze.token_jacobians(step, X, 0)           # (n, d, n, d): d step_j / d x_i
        assert all(J[j, :, i].abs().max() == 0 for j in range(n) for i in range(n) if i != j)  # tokens move alone
        M_minus_I.append(torch.stack([J[j, :, j] for j in range(n)]))   # (n, d, d)
        with torch.no_grad():
            X = X + step(X, 0)
    lyap = analyze.lyapunov_spectrum(M_minus_I, dt=1.0)  # (n, d)
    I = torch.eye(d, dtype=X.dtype)                       # log|det(M_L ... M_1)| = sum_l log|det M_l|
    log_det = sum(torch.linalg.slogdet(I + J).logabsdet for J in M_minus_I)
    assert torch.allclose(lyap.sum(-1) * len(M_minus_I), log_det, atol=1e-8)
    return lyap.sort(dim=-1, descending=True).values


# %%
torch.manual_seed(7)
L_deep, idx_d = 32, torch.randint(1, 16, (1, 10))
spectra, bands = {}, {}
for name, a_l, plain in (("TransJect at initialisation (a_l = -2)", -2.0, False),
                         ("TransJect, alpha_l at its ceiling (a_l = 6)", 6.0, False),
                         ("unconstrained: raw P, \u03a3 not scaled, residual weight 1", -2.0, True)):
    torch.manual_seed(8)
    stack = transject.Model(transject.Config(vocab_size=16, block_size=32, n_layer=L_deep, n_embd=16, n_experts=4,
                                             dropout=0.0, head="cls", n_classes=10, sigma="exact")).double().eval()
    with torch.no_grad():
        for block in stack.blocks:
            block.a.fill_(a_l)
            block.gate.weight.normal_()
            block.b.normal_()
    spectra[name] = lyapunov(stack, idx_d, plain)
    a = torch.sigmoid(torch.tensor(a_l)).item() / L_deep
    bands[name] = (2 * math.log(1 - a), 2 * math.log(1 + a))
    if not plain:
        assert spectra[name].max() <= bands[name][1] + 1e-9 and spectra[name].min() >= bands[name][0] - 1e-9
    print(f"{name}: exponents in [{spectra[name].min():.4f}, {spectra[name].max():.4f}]"
          + ("" if plain else f", bound [{bands[name][0]:.4f}, {bands[name][1]:.4f}]"))

# %%
fig, axes = plt.subplots(1, 2, figsize=(13, 4.8))
colors = ["tab:cyan", "tab:blue", "tab:red"]
for (name, lyap), color in zip(spectra.items(), colors):
    for ax in axes if "TransJect" in name else axes[:1]:
        ax.plot(range(1, lyap.shape[1] + 1), lyap.median(0).values, "o-", ms=3, color=color, label=name)
        ax.fill_between(range(1, lyap.shape[1] + 1), lyap.min(0).values, lyap.max(0).values, color=color, alpha=0.2)
lo_b, hi_b = bands["TransJect, alpha_l at its ceiling (a_l = 6)"]
axes[1].axhspan(lo_b, hi_b, color="tab:green", alpha=0.12, label="bound 2 log(1 \u00b1 \u03b1/L) at the ceiling")
axes[0].set_title(f"Lyapunov spectrum of a {L_deep}-layer stack (median and range over 10 tokens)")
axes[1].set_title("TransJect alone, with the band of Theorem 2")
for ax in axes:
    ax.axhline(0, color="gray", lw=0.6)
    ax.set(xlabel="exponent index i (largest first)", ylabel="\u03bb\u1d62: mean log-stretch per layer")
    ax.legend(fontsize=8)
fig.tight_layout()
plt.show()

# %% [markdown]
# With the constraints, the stretch per layer stays inside the band whatever the depth (here well inside
# it), so the whole stack stretches a token by at most $(1 + \alpha/L)^{2L} < e^2$ (the paper's $e^6$, with its
# factor 3). Without them the exponents fan out: along some directions a small change of the input grows
# by a factor $e^{\lambda_1} \approx 7$ per layer, along others it shrinks, and a deep stack forgets those
# directions while it blows up the first ones.

# %% [markdown]
# ## 8. Train a small TransJect
#
# The project's `train.py`, called in-process: small ListOps (nested `MIN`/`MAX`/`MED`/`SM` expressions of
# depth 3, 5–20 tokens; 20,000 training trees generated on the first run and cached under `data/`), 2 layers,
# $d = 64$, 4 experts, learned $\Sigma$, max pooling, 4,000 steps of 32 trees (about 40 seconds on a 2-core
# CPU). The run writes `out/tour-transject/` (`--overwrite true` replaces the previous run of this tour).
#
# The data are prepared first by `python -m tasks.listops` (nanoGPT's `prepare.py` step), in a process of its
# own: the generator draws its trees in a pool of worker processes, and a worker started from this script
# would run the whole script again before it could help.

# %%
LISTOPS = ["--listops_depth", "3", "--listops_args", "2,3", "--listops_len", "5,20",
           "--listops_sizes", "20000,1000,1000"]
status = run_python("-m", "tasks.listops", *LISTOPS)   # generates once; later runs find data/
if status:                                           # its one line above says why
    sys.exit(f"error: python -m tasks.listops stopped (exit status {status})")
OUT = os.path.join("out", "tour-transject")
try:                                               # a bad flag or folder: one line, as on the command line
    train.main(["--model", "transject", "--task", "listops", *LISTOPS, "--max_iters", "4000", "--batch_size", "32",
                "--eval_interval", "500", "--log_interval", "500", "--pool", "max", "--seed", "0",
                "--out_dir", OUT, "--overwrite", "true"])
except (train.UsageError, data.DataError) as e:
    sys.exit(f"error: {e}")

# %% [markdown]
# `log.jsonl` holds one record per step (train loss, accuracy of the batch) and one per evaluation
# (`val_loss`, `val_acc` on 20 batches of val); `metrics.json` the final evaluation on all of val and test.
# Three rules give the accuracy a scale (`tasks/listops_rules.py`): answer the most frequent label; read
# only the top-level operator; read the top-level operator and its digits but not its subtrees.

# %%
records = [json.loads(line) for line in open(os.path.join(OUT, "log.jsonl"))]
steps = np.array([r["step"] for r in records if "loss" in r])
losses = np.array([r["loss"] for r in records if "loss" in r])
val = [r for r in records if "val_loss" in r]
metrics = json.load(open(os.path.join(OUT, "metrics.json")))
model_t, ckpt = analyze.load(os.path.join(OUT, "ckpt.pt"))      # the trained model, in eval mode
task = data.load_task("listops", **{k: v for k, v in ckpt["args"].items() if k.startswith("listops_")})
rules = listops_baselines(task.split("train"), test=task.split("test"))["test"]
print(f"test accuracy {metrics['test_acc']:.1%} on {metrics['n_test']:,} trees; rules: majority "
      f"{rules['majority']:.1%}, top-level operator {rules['top_operator']:.1%}, "
      f"top-level digits {rules['top_digits']:.1%}")

# %%
fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
smooth = np.convolve(losses, np.ones(50) / 50, mode="valid")
axes[0].plot(steps, losses, color="tab:blue", alpha=0.25, lw=0.8, label="train loss (one batch)")
axes[0].plot(steps[49:], smooth, color="tab:blue", label="train loss, mean of the last 50 steps")
axes[0].plot([r["step"] for r in val], [r["val_loss"] for r in val], "o-", color="tab:orange", label="val loss")
axes[0].set(xlabel="step", ylabel="cross-entropy (nats)", title="TransJect on small ListOps: loss")
axes[1].plot([r["step"] for r in val], [r["val_acc"] for r in val], "o-", color="tab:orange", label="val accuracy")
axes[1].axhline(metrics["test_acc"], color="tab:blue", label=f"test accuracy at the end ({metrics['test_acc']:.1%})")
for (key, name), ls in zip((("majority", "majority label"), ("top_operator", "top-level operator rule"),
                            ("top_digits", "top-level digits rule")), (":", "-.", "--")):
    axes[1].axhline(rules[key], color="gray", ls=ls, label=f"{name} ({rules[key]:.1%})")
axes[1].set(xlabel="step", ylabel="accuracy", title="Accuracy against three rules")
for ax in axes:
    ax.legend(fontsize=8)
fig.tight_layout()
plt.show()

# %% [markdown]
# The model passes the top-level digits rule, so it evaluates some nested subtrees, but not by much: on this
# task TransJect trails the project's other models (docs/results.md, "Small ListOps"), and its val accuracy
# climbs slowly after the first few hundred steps. docs/transject.md discusses why: its mixing has one
# $\Sigma$ per sequence and no token-to-token weights.
#
# ## 9. The trained model: distances, gates and the learned spectrum
#
# Does the trained model keep the bound on real ListOps trees? `analyze.layer_states` returns $X^{(0)}, X^{(1)},
# X^{(2)}$ for a batch of val trees; each layer's ratios must lie between $(1 \mp \alpha_l/L)^2$ with the
# trained $\alpha_l$ (`Model.residual_weights`). Then the spectrum: for the same trees, the exact
# eigenvalues of $G$ against the learned $\Sigma_{ii} = u_i^\top G u_i$ with the trained $U_s$ and with a random
# orthogonal $U_s$, and the reconstruction loss of each.

# %%
x_val, _ = task.split("val").sample(64, np.random.default_rng(0))   # 64 val trees, token ids (B, n)
states, mask_v = analyze.layer_states(model_t, x_val)    # [X0, X1, X2], each (B, n, d)
gates = [v.item() for v in model_t.residual_weights().values()]   # alpha_l / L
keep = mask_v[:, :, None] & mask_v[:, None, :] & ~torch.eye(x_val.shape[1], dtype=torch.bool)
layer_ratios = []
for l, a in enumerate(gates, 1):
    before, after = torch.cdist(states[l - 1], states[l - 1]), torch.cdist(states[l], states[l])
    r = (after / before)[keep & (before > 0)]             # every pair of real tokens of a tree
    assert r.min() >= (1 - a) ** 2 - 1e-4 and r.max() <= (1 + a) ** 2 + 1e-4
    layer_ratios.append(r)
    print(f"layer {l}: alpha_l/L = {a:.3f}, ratios in [{r.min():.3f}, {r.max():.3f}], "
          f"bound [{(1 - a) ** 2:.3f}, {(1 + a) ** 2:.3f}]")
act = [analyze.activation_factor(states[0], X, mask_v).median().item() for X in states]
print("median activation factor (5) per layer, from X0:", np.round(act, 3))

# %%
fig, ax = plt.subplots(figsize=(8, 4.5))
for l, (r, a, color) in enumerate(zip(layer_ratios, gates, ("tab:blue", "tab:purple")), 1):
    ax.hist(r.numpy(), bins=60, histtype="step", lw=1.5, color=color,
            label=f"layer {l}: \u03b1/L = {a:.3f}, mean ratio {r.mean():.3f}")
    for edge in ((1 - a) ** 2, (1 + a) ** 2):
        ax.axvline(edge, color=color, ls="--", lw=1)
ax.axvline(1.0, color="gray", lw=0.6)
ax.set(xlabel="distance after the layer / distance before (pairs of real tokens)", ylabel="token pairs",
       title=f"Trained TransJect on {x_val.shape[0]} val trees; dashed: (1 \u2213 \u03b1/L)\u00b2 of each layer")
ax.legend(fontsize=8)
fig.tight_layout()
plt.show()

# %% [markdown]
# The gates $a_l$ went from $-2$ to their ceiling ($\alpha_l / L \approx 1/L$): training asked for as much
# residual as the injective form allows. Every ratio stays inside its band, as Theorem 2 promises, but the
# distribution sits above 1: the trained layers spread the tokens of a tree apart (the activation factor grows
# layer by layer) rather than keep distances as they were.
#
# Every diagonal of $G$ in an orthonormal basis sums to the trace of $G$, the sum of its eigenvalues: the
# learned $\Sigma$ redistributes the same total, and it equals the eigenvalues only in the eigenvector basis.
# The code checks that, and (for the default `--sigma learned`) that the $\Sigma$ the trained layers use is
# $u_i^\top G u_i$ with the trained $U_s$, scaled to largest entry 1.

# %%
torch.manual_seed(9)
d = model_t.config.n_embd
Xm = states[0].double() * mask_v[..., None]               # real tokens only
G = Xm.transpose(1, 2) @ Xm                               # (B, d, d), one G per tree
exact = torch.linalg.eigvalsh(G).flip(-1)                 # (B, d), largest first


def diagonal(U):                                          # Sigma_ii = u_i^T G u_i for the columns of U
    return torch.einsum("bjk,ji,ki->bi", G, U, U)


bases = {"a random orthogonal U_s": transject.cayley(transject.skew(torch.randn(d, d, dtype=torch.float64)))}
with torch.no_grad():
    sigma_model = model_t.spectrum(states[0], mask_v)[0][:, 0].double()   # (B, d), what the layers use
    if model_t.config.sigma == "learned":
        bases["the trained U_s"] = transject.cayley(transject.skew(model_t.P_s)).double()
        trained = diagonal(bases["the trained U_s"])
        assert torch.allclose(sigma_model, trained / trained.amax(-1, keepdim=True), atol=1e-5)
for U in bases.values():
    assert torch.allclose(diagonal(U).sum(-1), exact.sum(-1))   # the trace, whatever the basis
recons = {name: 1 - (diagonal(U) ** 2).sum(-1) / (G ** 2).sum((-2, -1)) for name, U in bases.items()}
for name, rec in recons.items():
    print(f"reconstruction loss with {name}: median {rec.median():.3f} over {len(rec)} trees")

# %%
fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
i = torch.arange(1, d + 1)
axes[0].semilogy(i, exact[0] / exact[0, 0], "o-", ms=3, color="black", label="exact: eigenvalues of G")
axes[0].semilogy(i, sigma_model[0].sort(descending=True).values, "o-", ms=3, color="tab:blue",
                 label=f"the trained model's \u03a3 (--sigma {model_t.config.sigma})")
rand = diagonal(bases["a random orthogonal U_s"])[0].sort(descending=True).values
axes[0].semilogy(i, rand / rand[0], "o-", ms=3, color="tab:red", label="u\u1d62\u1d40 G u\u1d62 with a random U_s")
axes[0].set(xlabel="index i (largest first)", ylabel="\u03a3\u1d62\u1d62 / largest", ylim=(1e-6, 2),
            title=f"The spectrum \u03a3 of one val tree ({int(mask_v[0].sum())} tokens, d = {d})")
basis_colors = {"a random orthogonal U_s": "tab:red", "the trained U_s": "tab:blue"}
for name, rec in recons.items():
    axes[1].hist(rec.numpy(), bins=30, range=(0, 1), alpha=0.6, label=name, color=basis_colors[name])
axes[1].axvline(0, color="black", lw=2, label="G's eigenvectors (0 by construction)")
axes[1].set(xlabel="\u2016G \u2212 U_s \u03a3 U_s\u1d40\u2016\u00b2 / \u2016G\u2016\u00b2", ylabel="val trees",
            title="Reconstruction loss of the learned \u03a3 (\u00a73.2)")
for ax in axes:
    ax.legend(fontsize=8)
fig.tight_layout()
plt.show()

# %% [markdown]
# A tree of $n$ tokens has a rank-$n$ $G$: only $n$ of its $d$ eigenvalues are nonzero (the black line drops
# off the plot). A random basis spreads the same total over all $d$ entries, and its reconstruction loss is
# near 1. The reconstruction loss has pulled the trained $U_s$ a long way toward the eigenvectors of the
# trees' $G$ (one $U_s$ for all trees, so it cannot reach 0 for each), and the learned $\Sigma$ now follows
# the exact spectrum over its large entries.
#
# ## Exercises
#
# Each changes one thing; rerun the tour from the cell you changed (or all of it: under a minute).
#
# 1. **Random-TransJect.** In section 8 add `"--sigma", "random"` (or `"exact"`) to the training flags. What
#    happens to the test accuracy? In section 9's spectrum figure, the model's $\Sigma$ is now one trained
#    vector for every tree: how far is it from the tree's own eigenvalues? (The paper finds Random-TransJect
#    better on AG News, Pathfinder and Image, worse on PTB.)
# 2. **Freeze the residual weights.** Add `"--gate_lr_scale", "0"`: $\alpha_l$ stays at $\mathrm{sigmoid}(-2)
#    = 0.12$, so $\alpha_l / L = 0.06$. Look at section 9: how narrow is the band now, where are the
#    activation factors, and what did the accuracy lose? (`metrics.json`'s `gates` says how far each $a_l$
#    moved in the default run.)
# 3. **One expert.** Add `"--n_experts", "1"`: equation (3) becomes a single term. Compare the accuracy with
#    the four-expert run (the paper: dropping the mixture costs 4.7 points on IMDb).
# 4. **Which constraint keeps the distances?** Section 6's unconstrained layer drops three things at once.
#    Give back one at a time and rerun that cell and the figure: the scaled spectrum (`Sigma_r` in place of
#    `Sigma_raw`), the small residual weight (`dict(unconstrained_weights(layer), alpha_L=layer.alpha() / L)`),
#    or the Cayley maps (`dict(cayley_weights(layer), alpha_L=1.0)`). Which one alone brings the ratios back
#    inside the green band? Is that a guarantee or luck? (Compare the spectral norm of the raw $P$,
#    `torch.linalg.matrix_norm(layer.P, ord=2)`, with the 1 the proof needs.)
# 5. **Depth.** In section 7 set `L_deep = 8`, then `128`. TransJect's band $2\log(1 \pm \alpha/L)$ narrows
#    like $1/L$: does the stack's total stretch, $L$ times its largest exponent, stay below $2\alpha$? What
#    happens to the unconstrained stack's total stretch as $L$ grows (watch for overflow)?
