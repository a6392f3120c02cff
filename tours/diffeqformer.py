# %% [markdown]
# # A guided tour of DiffEqFormer: a transformer as an ODE in depth
#
# Tong, Nguyen-Tang, Lee, Tran, Choi, *Neural ODE Transformers: Analyzing Internal Dynamics and Adaptive
# Fine-tuning* (ICLR 2025, [arXiv:2503.01329](https://arxiv.org/abs/2503.01329)). The code is `diffeqformer.py`,
# its notes `docs/diffeqformer.md`.
#
# **The idea in three sentences.** A residual block computes $X + f(X)$, which is one Euler step of the
# differential equation $dX/dt = f(X, t)$; DiffEqFormer makes depth a continuous time $t \in [0, 1]$ and one
# transformer block the right-hand side $f$. Every weight of that block is a smooth function $W(t)$ of depth, made
# by a small hypernetwork from a Fourier embedding of $t$, so the model is a continuum of layers with a fixed
# number of parameters. Because depth is continuous, a trained model can be cut into any number of steps
# afterwards (`discretize(n)`) and fine-tuned at that depth.
#
# **What this tour shows.** Each equation of the model, computed by hand on tiny tensors and checked against
# `diffeqformer.py`'s own function by an `assert`: the time features and the hypernetwork $W(t)$, the attention
# and MLP of $f$, one Euler / midpoint / RK4 step, the whole flow, `discretize`. Then pictures: $W(t)$ along
# depth, the solvers' error against the number of steps with their orders measured, and what `discretize(n)`
# does. Then a minute of training on a small ListOps through the project's `train.py`, its loss curve and
# accuracy, and the trained model cut into other numbers of steps. Exercises at the end.
#
# It runs top to bottom in about a minute on two CPU cores.

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
from dataclasses import replace

import matplotlib
if "ipykernel" not in sys.modules:     # a script: no display, figures are drawn off screen
    matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import torch

import diffeqformer as deq             # the model file this tour reads

torch.manual_seed(0)
f64 = torch.float64                    # the hand computations run in float64: they agree to ~1e-12

# %% [markdown]
# ## 1. A tiny model to look inside
#
# Row vectors throughout: a token is a row $x \in \mathbb{R}^D$, a sequence $X \in \mathbb{R}^{N \times D}$. The
# model embeds the tokens into $X(0)$, integrates $X$ from $t = 0$ to $t = 1$, and reads the output from $X(1)$
# with a final LayerNorm and the (tied) output head. We build one with $D = 8$, 2 heads and 6 tokens, in float64,
# and fill every parameter with random numbers: at initialisation several tensors are zero (the $W_0$ rows, the
# LayerNorms' $G$ and $H$ below), and a check against zeros could not fail.

# %%
c = deq.Config(vocab_size=11, block_size=6, n_layer=3, n_head=2, n_embd=8, time_dim=3, time_freqs=4)
model = deq.Model(c).to(f64).eval()
with torch.no_grad():
    for p in model.parameters():
        p.normal_(0.0, 0.3)
idx = torch.randint(1, c.vocab_size, (1, 6))      # one sequence of 6 tokens (id 0 is padding)
X0 = model.embed(idx)[0].detach()                  # X(0) (1, 6, 8): token + position embeddings
print(f"{model.num_params():,} parameters; X(0) has shape {tuple(X0.shape)}")

# %% [markdown]
# ## 2. Weights as functions of depth: the hypernetwork (eq. 6, appendix A)
#
# A fixed feature vector of $t$, with no parameters: $t$ itself and $S$ sines and cosines whose frequencies
# $1000\,\omega_k$ run from 1000 down to about $0.1$,
#
# $$\varphi(t) = \big[\,t,\ \sin(1000\,t\,\omega_k)_{k<S},\ \cos(1000\,t\,\omega_k)_{k<S}\,\big],
# \qquad \omega_k = 10000^{-k/S} \qquad (2S + 1 \text{ numbers}).$$
#
# Written out with a loop, and checked against `time_features`:

# %%
t = torch.tensor([0.0, 0.3, 1.0], dtype=f64)
S = c.time_freqs
phi = torch.zeros(len(t), 2 * S + 1, dtype=f64)
for j in range(len(t)):
    phi[j, 0] = t[j]
    for k in range(S):
        omega_k = 10000 ** (-k / S)
        phi[j, 1 + k] = math.sin(1000 * float(t[j]) * omega_k)
        phi[j, 1 + S + k] = math.cos(1000 * float(t[j]) * omega_k)
assert torch.allclose(phi, deq.time_features(t, S), atol=1e-12)
print(phi.numpy().round(3))

# %% [markdown]
# Each time-dependent module (LN$_1$, $W_{QKV}$, $W_O$, LN$_2$, $W_1$, $W_2$) has its own small network
# $e(t) \in \mathbb{R}^{d_t}$, and each of its tensors is linear in $e(t)$:
#
# $$e(t) = \mathrm{Lin}_2\big(\mathrm{SiLU}(\mathrm{Lin}_1(\varphi(t)))\big), \qquad
# W(t) = W_0 + \sum_{i=1}^{d_t} e_i(t)\, W_i, \qquad b(t) = b_0 + \sum_{i=1}^{d_t} e_i(t)\, b_i. \tag{6}$$
#
# The file stores the rows $W_0, W_1, \dots, W_{d_t}$ flattened, one row each, in PyTorch's (out, in) layout;
# $\mathrm{SiLU}(z) = z\,\sigma(z)$. The sum over $i$ written out, against the module's own forward:

# %%
qkv = model.temporal.qkv                            # the module that makes W_QKV(t) and b_QKV(t)
lin1, lin2 = qkv.e[0], qkv.e[2]
z = phi @ lin1.weight.T + lin1.bias                 # (3, d_t)
e = (z * torch.sigmoid(z)) @ lin2.weight.T + lin2.bias   # (3, d_t): e(t) for the three times
rows = qkv.W.view(1 + c.time_dim, 3 * c.n_embd, c.n_embd)   # W_0, W_1, ..., W_dt, each (3D, D)
W = torch.stack([rows[0] + sum(e[j, i] * rows[1 + i] for i in range(c.time_dim)) for j in range(len(t))])
b = torch.stack([qkv.b[0] + sum(e[j, i] * qkv.b[1 + i] for i in range(c.time_dim)) for j in range(len(t))])
W_file, b_file = qkv(phi)                           # (3, 3D, D), (3, 3D)
assert torch.allclose(e, qkv.e(phi), atol=1e-12)
assert torch.allclose(W, W_file, atol=1e-12) and torch.allclose(b, b_file, atol=1e-12)

# %% [markdown]
# The LayerNorms are time-dependent too: $\gamma(t) = 1 + G_0 + \sum_i e_i(t)\, G_i$ and
# $\beta(t) = H_0 + \sum_i e_i(t)\, H_i$. $G$ and $H$ start at zero, so each LayerNorm starts as a plain one.

# %%
ln1 = model.temporal.ln1
e_ln = ln1.e(phi)                                   # LN1's own e(t), (3, d_t)
gamma = torch.stack([1 + ln1.G[0] + sum(e_ln[j, i] * ln1.G[1 + i] for i in range(c.time_dim)) for j in range(3)])
beta = torch.stack([ln1.H[0] + sum(e_ln[j, i] * ln1.H[1 + i] for i in range(c.time_dim)) for j in range(3)])
gamma_file, beta_file = ln1(phi)
assert torch.allclose(gamma, gamma_file, atol=1e-12) and torch.allclose(beta, beta_file, atol=1e-12)

# %% [markdown]
# **$W(t)$ along depth.** The highest frequency of $\varphi$ is $1000$: $W(t)$ has wiggles of period
# $2\pi / 1000 \approx 0.006$ on top of slow trends. The left panel shows the norm of $W_{QKV}(t)$ and two of its
# entries over all of $[0, 1]$; the right panel zooms into $[0, 0.05]$. A model with 3 Euler steps only ever
# evaluates $W$ at $t = 1/3, 2/3, 1$ (the dots): keep that in mind for section 5.

# %%
ts = torch.linspace(0, 1, 4001, dtype=f64)
with torch.no_grad():
    Wt = qkv(deq.time_features(ts, S))[0]          # (4001, 3D, D)
grid = torch.tensor(model.times(), dtype=f64)       # t_1, t_2, t_3 of the 3 Euler steps
fig, axes = plt.subplots(1, 2, figsize=(11, 3.6))
for ax, hi in zip(axes, (1.0, 0.05)):
    keep = ts <= hi
    ax.plot(ts[keep], Wt[keep].flatten(1).norm(dim=1), label=r"$\|W_{QKV}(t)\|_F$")
    ax.plot(ts[keep], Wt[keep, 0, 0], lw=0.8, label=r"$W_{QKV}(t)_{0,0}$")
    ax.plot(ts[keep], Wt[keep, 5, 3], lw=0.8, label=r"$W_{QKV}(t)_{5,3}$")
    on_grid = grid[grid <= hi]
    with torch.no_grad():
        ax.plot(on_grid, qkv(deq.time_features(on_grid, S))[0].flatten(1).norm(dim=1), "ko", label="Euler grid")
    ax.set(xlabel="depth t", ylabel="weight", title=f"W(t) of the tiny model, t in [0, {hi:g}]")
axes[0].legend(fontsize=8)
plt.tight_layout()
plt.show()

# %% [markdown]
# ## 3. The vector field: attention and MLP side by side (eq. 2–5)
#
# The state follows
#
# $$\frac{dX}{dt} = f(X, t) = \mathrm{Attn}\big(\mathrm{LN}_1(X; t); t\big)
# + \mathrm{MLP}\big(\mathrm{LN}_2(X; t); t\big), \tag{2-3}$$
#
# with attention and MLP reading the same $X$ (in parallel, not one after the other as in a GPT block), and
# $\mathrm{LN}(X; t) = \gamma(t) \odot \frac{X - \mu}{\sqrt{\sigma^2 + \epsilon}} + \beta(t)$ per token. The
# attention is causal multi-head softmax attention with time-dependent weights, for head $h$ of size $d_h$
#
# $$\mathrm{Attn}(Z; t) = \big[\,\mathrm{softmax}\big(Q_h K_h^\top / \sqrt{d_h} + M\big)\, V_h\,\big]_{h}\,
# W_O(t) + b_O(t), \qquad Q = Z\,W_Q(t) + b_Q(t),\ K, V \text{ alike}, \tag{4}$$
#
# $M$ the causal mask ($-\infty$ above the diagonal), and the MLP
#
# $$\mathrm{MLP}(Z; t) = \mathrm{GELU}\big(Z\, W_1(t) + b_1(t)\big)\, W_2(t) + b_2(t). \tag{5}$$
#
# First the weights of one time, $t = 0.3$: `model.temporal(t)` returns every tensor of $f$ at the times $t$,
# `{name: (weight, bias)}`, from one batched pass through the hypernetworks.

# %%
tt = 0.3
P = {name: (w[0], None if bias is None else bias[0])            # the tensors at this one time
     for name, (w, bias) in model.temporal(torch.tensor([tt], dtype=f64)).items()}
print({name: tuple(w.shape) for name, (w, _) in P.items()})


def layer_norm(X, gamma, beta, eps=1e-5):
    mu = X.mean(-1, keepdim=True)
    var = ((X - mu) ** 2).mean(-1, keepdim=True)
    return gamma * (X - mu) / torch.sqrt(var + eps) + beta


def gelu(z):                                         # the exact GELU, z * Phi(z)
    return 0.5 * z * (1 + torch.erf(z / math.sqrt(2)))

# %% [markdown]
# Eq. 4 with a loop over the heads, eq. 5, and their sum, against the file's `vector_field`:

# %%
X = X0[0]                                            # (L, D): the one sequence
L, D, H = X.shape[0], c.n_embd, c.n_head
d = D // H
Q, K, V = (layer_norm(X, *P["ln1"]) @ P["qkv"][0].T + P["qkv"][1]).split(D, dim=-1)   # (L, D) each
causal = torch.ones(L, L).triu(1).bool()             # token i sees tokens j <= i
heads = []
for h in range(H):
    s = slice(h * d, (h + 1) * d)
    scores = (Q[:, s] @ K[:, s].T / math.sqrt(d)).masked_fill(causal, -math.inf)    # (L, L)
    heads.append(torch.softmax(scores, dim=-1) @ V[:, s])                            # (L, d)
attn = torch.cat(heads, dim=-1) @ P["o"][0].T + P["o"][1]                            # (4)
mlp = gelu(layer_norm(X, *P["ln2"]) @ P["fc"][0].T + P["fc"][1]) @ P["proj"][0].T + P["proj"][1]   # (5)
f_ours = attn + mlp                                                                  # (2-3)
f_file = model.vector_field(X0, tt)[0]
assert torch.allclose(f_ours, f_file, atol=1e-12)
print(f"f(X, 0.3) by hand equals model.vector_field: max |difference| = {(f_ours - f_file).abs().max():.1e}")

# %% [markdown]
# ## 4. The solvers: one step of Euler, midpoint and RK4
#
# The paper integrates with explicit Euler, as many steps as a GPT has layers, $\Delta t = 1/n$, and evaluates
# $f$ at the *right* end of each step (§4; so step $k$ uses $W(t_{k+1})$, as block $k$ of a GPT uses its own
# weights):
#
# $$X_{k+1} = X_k + \Delta t\, f(X_k, t_{k+1}), \qquad t_{k} = k\,\Delta t. \tag{Euler}$$
#
# The file also has the two classical higher-order methods, which evaluate $f$ 2 and 4 times per step:
#
# $$X_{k+1} = X_k + \Delta t\, f\big(X_k + \tfrac{\Delta t}{2} f(X_k, t_k),\ t_k + \tfrac{\Delta t}{2}\big)
# \tag{midpoint}$$
#
# $$k_1 = f(X_k, t_k),\ k_2 = f(X_k + \tfrac{\Delta t}{2} k_1, t_k + \tfrac{\Delta t}{2}),\
# k_3 = f(X_k + \tfrac{\Delta t}{2} k_2, t_k + \tfrac{\Delta t}{2}),\ k_4 = f(X_k + \Delta t\, k_3, t_{k+1}),
# \quad X_{k+1} = X_k + \tfrac{\Delta t}{6}(k_1 + 2k_2 + 2k_3 + k_4). \tag{RK4}$$
#
# One step of each from $t_k = 0.5$ with $\Delta t = 0.25$, against the file's `rk_step`:

# %%
f = model.vector_field                               # f(X, t), X (B, L, D)
t0, dt = 0.5, 0.25
euler = X0 + dt * f(X0, t0 + dt)
midpoint = X0 + dt * f(X0 + dt / 2 * f(X0, t0), t0 + dt / 2)
k1 = f(X0, t0)
k2 = f(X0 + dt / 2 * k1, t0 + dt / 2)
k3 = f(X0 + dt / 2 * k2, t0 + dt / 2)
k4 = f(X0 + dt * k3, t0 + dt)
rk4 = X0 + dt / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
for method, ours in [("euler", euler), ("midpoint", midpoint), ("rk4", rk4)]:
    assert torch.allclose(ours, deq.rk_step(f, X0, t0, dt, method), atol=1e-12), method

# %% [markdown]
# The whole model: $n$ Euler steps from $X(0)$, then the final LayerNorm and the output head. The loop below is
# the model's forward; `model.flow` makes the weights of all its steps in one batched pass first, then calls the
# same solver (`odeint`).

# %%
n, X_k = c.n_layer, X0
for k in range(n):
    X_k = X_k + (1 / n) * f(X_k, (k + 1) / n)        # (Euler), t_{k+1} = (k + 1) / n
logits = model.lm_head(model.ln_f(X_k))              # (1, L, vocab_size)
with torch.no_grad():
    assert torch.allclose(X_k, model.flow(X0, None), atol=1e-10)
    assert torch.allclose(logits, model(idx)[0], atol=1e-10)
print("3 Euler steps by hand = model.flow = model(idx)")

# %% [markdown]
# ## 5. How accurate is each solver? Their orders, measured
#
# A method of order $p$ has an error at $t = 1$ that shrinks like $\Delta t^{\,p} = n^{-p}$: doubling the steps
# divides the error by $2^p$. On a log-log plot of error against $n$, the line has slope $-p$: Euler 1,
# midpoint 2, RK4 4. We measure $p$ as that slope between the two largest $n$,
# $p \approx \log_2\big(\mathrm{err}(n/2) / \mathrm{err}(n)\big)$. First on an equation whose exact answer we
# know, $x' = \cos(t)\, x$, $x(0) = 1$, so $x(1) = e^{\sin 1}$. `odeint` works on plain Python floats too.

# %%
methods = ["euler", "midpoint", "rk4"]
ns = [2 ** k for k in range(1, 9)]                   # 2 ... 256 steps
exact = math.exp(math.sin(1.0))
err = {m: [abs(deq.odeint(lambda x, t: math.cos(t) * x, 1.0, n, m) - exact) for n in ns] for m in methods}
order = {m: math.log2(err[m][-2] / err[m][-1]) for m in methods}   # the slope between the last two points
print({m: round(p, 3) for m, p in order.items()})
for m, p in zip(methods, (1, 2, 4)):
    assert abs(order[m] - p) < 0.05, (m, order[m])

# %% [markdown]
# Now the model's own ODE. There is no exact answer, so the reference is RK4 with $2^{13}$ steps. The same
# weights $W(t)$ are integrated with $n$ steps by building the model with `n_layer=n` (and `method`) and loading
# the same state dict: `n_layer` is only the number of solver steps.

# %%
def solve(n, method):
    m = deq.Model(replace(c, n_layer=n, method=method)).to(f64).eval()
    m.load_state_dict(model.state_dict())
    with torch.no_grad():
        return m.flow(X0, None)


ref = solve(2 ** 13, "rk4")
ns_model = [2 ** k for k in range(1, 12)]            # 2 ... 2048 steps
err_model = {m: [float((solve(n, m) - ref).norm() / (ref - X0).norm()) for n in ns_model] for m in methods}
order_model = {m: math.log2(err_model[m][-2] / err_model[m][-1]) for m in methods}
print({m: round(p, 3) for m, p in order_model.items()})
for m, p in zip(methods, (1, 2, 4)):
    assert abs(order_model[m] - p) < 0.15, (m, order_model[m])

# %%
fig, axes = plt.subplots(1, 2, figsize=(11, 4))
for ax, xs, errs, orders, title in [(axes[0], ns, err, order, r"$x' = \cos(t)\,x$ against $e^{\sin 1}$"),
                                    (axes[1], ns_model, err_model, order_model,
                                     "the tiny model's ODE against RK4, $2^{13}$ steps")]:
    for m in methods:
        ax.loglog(xs, errs[m], "o-", ms=3, label=f"{m}: order {orders[m]:.2f}")
    ax.set(xlabel="steps n", ylabel="error at t = 1 (relative)", title=title)
    ax.legend()
axes[1].axvline(1000 / (2 * math.pi), color="gray", ls=":")
axes[1].text(1000 / (2 * math.pi), 1e-7, " one step per period\n of sin(1000 t)", fontsize=8)
plt.tight_layout()
plt.show()

# %% [markdown]
# On the smooth problem (left) the slopes are the textbook orders from the first few steps on. On the model's ODE
# (right) they appear only beyond a few hundred steps: below that, every method misses by a tenth or more of how
# far $X$ moves, whatever its order. The reason is the wiggle of section 2: an order-$p$ error bound holds once
# $\Delta t$ resolves the fastest change of $f$, here $\sin(1000\,t)$, i.e. $\Delta t \ll 1/1000$. A trained
# model with a few to a few dozen steps is far from that regime: it does not approximate a flow, it *is* its few
# Euler steps, which is what the next section is about.

# %% [markdown]
# ## 6. `discretize(n)`: the ODE model as an ordinary $n$-block transformer (§6.2)
#
# `model.discretize(n)` evaluates $W(t)$ on the Euler grid $t_k = k/n$ and returns an ordinary transformer of $n$
# blocks: block $k$ stores $W(t_{k+1})$ (and $\gamma$, $\beta$, the biases) as plain weights and computes
#
# $$X_{k+1} = X_k + \tfrac{1}{n}\, f_k(X_k), \qquad f_k = f(\cdot\,; t_{k+1}) \text{ with the stored weights}.$$
#
# Its blocks can then be fine-tuned, fully or with LoRA (`.with_lora(r, alpha)`), at a depth chosen after
# pre-training. Three checks: the stored weights are $W(t_{k+1})$; on the model's own grid it computes exactly
# what the ODE model computes; on another grid it computes $n$ Euler steps of the same $f$.

# %%
d5 = model.discretize(5)
t_grid = torch.tensor([(k + 1) / 5 for k in range(5)], dtype=f64)
W_grid, b_grid = model.temporal.qkv(deq.time_features(t_grid, S))
for k, block in enumerate(d5.blocks):
    assert torch.allclose(block.qkv.weight, W_grid[k], atol=1e-12) and torch.allclose(block.qkv.bias, b_grid[k])
with torch.no_grad():
    assert torch.allclose(model.discretize(c.n_layer)(idx)[0], model(idx)[0], atol=1e-12)   # its own grid
    X5 = d5.flow(X0, None)
assert torch.allclose(X5, solve(5, "euler"), atol=1e-12)                                  # 5 Euler steps of f
print(type(d5.blocks[0]).__name__, "blocks:", [name for name, _ in d5.blocks[0].named_children()])

# %% [markdown]
# ## 7. Train a small DiffEqFormer (about a minute)
#
# The quickstart's small ListOps: nested expressions such as `[MAX 4 [MIN 2 7] 0]` of depth 3 with 5–20 tokens,
# the answer a digit 0–9 (a 10-class classification from the CLS token). First the data: 20,000 / 1,000 / 1,000
# trees, generated once into `data/` by `python -m tasks.listops` in a process of its own. (`train.py` would
# generate them too, with worker processes that re-import the script that started them: a script without an
# `if __name__ == "__main__":` guard, as this one, would start over in each worker.)

# %%
LISTOPS = dict(listops_depth="3", listops_args="2,3", listops_len="5,20", listops_sizes="20000,1000,1000")
listops_flags = [a for name, value in LISTOPS.items() for a in (f"--{name}", value)]
status = run_python("-m", "tasks.listops", *listops_flags)
if status:                                           # its one line above says why
    sys.exit(f"error: python -m tasks.listops stopped (exit status {status})")

# %% [markdown]
# The model: 2 Euler steps, 64 wide, 4 heads, $d_t = 8$; 3,000 steps of batch 32 through the project's own
# `train.py`, which writes `out/tour-diffeqformer/` (checkpoints, `log.jsonl`, `loss.png`, `metrics.json`).

# %%
import train                                          # noqa: E402 (the project's training program)


def train_main(argv):
    """train.main(argv), with a bad flag or folder one line as on the command line, not a traceback."""
    try:
        return train.main(argv)
    except (train.UsageError, train.data.DataError) as e:
        sys.exit(f"error: {e}")


flags = ["--model", "diffeqformer", "--task", "listops", "--n_layer", "2", "--n_head", "4", "--n_embd", "64",
         "--time_dim", "8", "--max_iters", "3000", "--batch_size", "32", "--lr", "1e-3", "--warmup", "100",
         "--eval_interval", "1000", "--log_interval", "500", "--seed", "0",
         "--out_dir", "out/tour-diffeqformer", "--overwrite", "true"]
metrics = train_main(flags + listops_flags)

# %% [markdown]
# The loss curve, from `log.jsonl` (one JSON record per step; the evaluations add `val_loss` records):

# %%
with open("out/tour-diffeqformer/log.jsonl") as file:
    log = [json.loads(line) for line in file]
steps = [r["step"] for r in log if "loss" in r]
loss = np.array([r["loss"] for r in log if "loss" in r])
smooth = np.convolve(loss, np.ones(50) / 50, mode="valid")     # the mean of 50 steps
val = [(r["step"], r["val_loss"]) for r in log if "val_loss" in r]
plt.figure(figsize=(7, 4))
plt.plot(steps, loss, lw=0.5, alpha=0.5, label="train loss (one batch)")
plt.plot(steps[49:], smooth, label="train loss, mean of 50 steps")
plt.plot(*zip(*val), "o-", label="val loss")
plt.axhline(math.log(10), color="gray", ls=":", label="ln 10: a uniform guess")
plt.xlabel("step"); plt.ylabel("cross-entropy (nats)"); plt.title("DiffEqFormer on small ListOps")
plt.legend(loc="lower left"); plt.show()
print(f"test accuracy {metrics['test_acc']:.1%} on {metrics['n_test']:,} trees "
      f"(the README: majority class 10.4%, the top-level operator rule 16.9%, the top-level digits rule 42.0%)")

# %% [markdown]
# ## 8. The trained model: its $W(t)$, and cut into other numbers of steps
#
# Training saw $W$ only at the two times of its grid, $t = 0.5$ and $t = 1$. Below, $\|W_{QKV}(t)\|$ of the
# trained model, and what `discretize(n)` stores: a staircase, block $k$ holding $W(t_{k+1})$ over
# $(t_k, t_{k+1}]$. On the right, the test accuracy of `discretize(n)` with no fine-tuning: $n = 2$ is the trained
# model; another $n$ samples $W(t)$ at times training never constrained and runs a different computation. That is
# why §6.2 fine-tunes after discretising (section 9).

# %%
trained = deq.Model(deq.Config(**metrics["config"]))
trained.load_state_dict(torch.load("out/tour-diffeqformer/ckpt.pt", weights_only=True)["model"])
trained.eval()
with torch.no_grad():
    norm_t = trained.temporal.qkv(deq.time_features(ts.float(), trained.config.time_freqs))[0].flatten(1).norm(dim=1)
    stairs = {}
    for n in (2, 4, 8):
        blocks = trained.discretize(n).blocks
        stairs[n] = [float(b.qkv.weight.norm()) for b in blocks]

# %%
import data                                           # noqa: E402 (the project's data API)

test = data.load_task("listops", **LISTOPS).split("test")


@torch.no_grad()
def accuracy(m):
    right = sum(int((m(x)[0].argmax(-1) == y).sum()) for x, y in test.batches(500))
    return right / len(test)


n_steps = [1, 2, 3, 4, 6, 8, 16]
acc = [accuracy(trained.discretize(n)) for n in n_steps]
assert abs(acc[1] - metrics["test_acc"]) <= 0.002  # discretize(2) is the trained model (up to float rounding)
print({n: f"{a:.1%}" for n, a in zip(n_steps, acc)})

# %%
fig, axes = plt.subplots(1, 2, figsize=(11, 4))
axes[0].plot(ts, norm_t, lw=0.6, color="gray", label=r"$\|W_{QKV}(t)\|_F$")
for n, values in stairs.items():
    edges = [k / n for k in range(n + 1)]
    axes[0].stairs(values, edges, baseline=None, lw=1.5, label=f"discretize({n}): block k holds $W(t_{{k+1}})$")
axes[0].set(xlabel="depth t", ylabel="norm", title="the trained model's W(t) and what discretize stores")
axes[0].legend(fontsize=8, loc="lower right")
axes[1].plot(n_steps, acc, "o-")
axes[1].axvline(2, color="gray", ls=":", label="trained with 2 steps")
axes[1].set(xscale="log", xlabel="steps n of discretize(n)", ylabel="test accuracy",
            title="accuracy after discretize(n), no fine-tuning")
axes[1].set_xticks(n_steps, [str(n) for n in n_steps])
axes[1].legend()
plt.tight_layout()
plt.show()

# %% [markdown]
# ## 9. Adaptive fine-tuning: the trained model as 8 steps (§6.2)
#
# The paper's use of a continuous depth: pre-train once, then choose the depth for the new task, discretise, and
# fine-tune the blocks. `train.py --init_from CKPT --steps 8` does exactly `discretize(8)` on the checkpoint and
# trains the 8 blocks (all their weights; `--lora_rank r` trains LoRA adapters instead). 500 steps:

# %%
tuned = train_main(["--init_from", "out/tour-diffeqformer/ckpt.pt", "--steps", "8", "--max_iters", "500",
                   "--batch_size", "32", "--lr", "1e-3", "--warmup", "50", "--eval_interval", "500",
                   "--log_interval", "250", "--seed", "0", "--out_dir", "out/tour-diffeqformer-8",
                   "--overwrite", "true"] + listops_flags)
print(f"test accuracy: trained with 2 steps {metrics['test_acc']:.1%}; discretize(8) before fine-tuning "
      f"{acc[n_steps.index(8)]:.1%}; after 500 steps of fine-tuning {tuned['test_acc']:.1%}")

# %% [markdown]
# ## Exercises
#
# 1. **The fast wiggle.** In section 2, plot $\varphi(t)$'s first sine against $t \in [0, 0.05]$, then replace
#    `deq.time_features` by your own function with `1000` changed to `10` (assign it: `deq.time_features = ...`;
#    the modules look the name up at each call; change the `1000` of section 2's loop too) and rerun sections 2
#    and 5. What to look for: $W(t)$ becomes a
#    smooth curve, and in the right panel of section 5 the orders 1, 2, 4 appear from a few steps on, not only
#    beyond a few hundred.
# 2. **Where $f$ is evaluated.** Change the Euler step in section 4's loop to evaluate at the *left* end,
#    `f(X_k, k / n)`. What to look for: the assert against `model.flow` fails, and by how much compared with the
#    step itself. Written as a loop for section 5's smooth problem, the left-end step is first order too: both are
#    "Euler" as solvers, yet a model trained with right-end steps computes another function with left-end ones.
# 3. **Attention and MLP in sequence.** Rewrite `f_ours` in section 3 as a GPT block does, the MLP reading
#    $X + \mathrm{Attn}$ instead of $X$. What to look for: how large the difference to `model.vector_field` is
#    compared with $f$ itself. The sequential block is two sub-steps, attention then MLP (a Lie–Trotter
#    splitting, Lu et al. 2019); the parallel one is a single Euler step of $f = \mathrm{Attn} + \mathrm{MLP}$,
#    which is what lets §4.1 read the whole transformer as one ODE.
# 4. **LoRA, and other depths (§6.2).** In section 9, add `"--lora_rank", "4"` (only rank-4 adapters and the
#    embeddings train), then try `"--steps", "1"` and `"--steps", "16"`. What to look for: the number of trainable
#    parameters in the line train.py prints, and whether the fine-tuned accuracy comes back to the 2-step model's
#    from each starting point of section 8's right panel.
# 5. **Weight sharing.** Train again with `"--weights", "shared"` added to the flags of section 7 (one $W$ for
#    all $t$, the paper's weight-shared ODE baseline). What to look for: the number of parameters in the first
#    line, the test accuracy against the time-dependent model's, and the left panel of section 8 (flat: every
#    block of `discretize(n)` is the same).
