# %% [markdown]
# # SimpleTRON: attention without the softmax, a tour you can run
#
# Yorsh, Vančura, Kordík, Kovalenko, Vašata, Mikolov, *SimpleTRON: Simple Transformer with O(N) Complexity*
# (2021, [arXiv:2111.15588](https://arxiv.org/abs/2111.15588)). The model is `simpletron.py` in this project's
# root; its notes are `docs/simpletron.md`.
#
# One idea: take the softmax out of attention, and the product can be computed in another order, so that the
# n × n matrix of token pairs is never formed. This tour builds that idea on tiny tensors, checks every equation
# by an `assert` against `simpletron.py`'s own function beside a written-out loop, measures what it buys (time
# and memory against the sequence length), and trains SimpleTRON beside the softmax Transformer for about a
# minute.
#
# Run it as a notebook (Jupyter, VS Code, Colab: `tours/simpletron.ipynb`) or as a script,
# `python tours/simpletron.py`: under a minute on a 2-core CPU. As a script it draws no figure on screen (set
# `MPLBACKEND`, e.g. `MPLBACKEND=TkAgg`, to see them in windows).

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
import matplotlib
if "ipykernel" not in sys.modules and "MPLBACKEND" not in os.environ:
    matplotlib.use("Agg")                                 # a script: the figures are drawn, not shown
import json  # noqa: E402
import math  # noqa: E402
import time  # noqa: E402

import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import simpletron  # noqa: E402

torch.manual_seed(0)
print(f"torch {torch.__version__}, CUDA GPU: {torch.cuda.is_available()}")

# %% [markdown]
# ## 1. Softmax attention forms an n × n matrix
#
# One head of a Transformer reads n tokens as three n × d matrices, the queries Q, keys K and values V (each a
# linear map of the token vectors). Every query is compared with every key, and the n × n scores are normalised
# row by row:
#
# $$\mathrm{Attention}(Q, K, V) = \mathrm{softmax}\!\left(\frac{Q K^\top}{\sqrt d}\right) V,
# \qquad y_t = \sum_{s=1}^{n} \frac{\exp(q_t \cdot k_s / \sqrt d)}{\sum_{r=1}^{n} \exp(q_t \cdot k_r / \sqrt d)}\, v_s .$$
#
# The right-hand form, one token $t$ at a time, is the loop below. `simpletron.py` computes the same with
# `softmax_attention` (PyTorch's fused kernel, `F.scaled_dot_product_attention`) and `softmax_attention_reference`
# (the n × n matrix written out). Their tensors are `(B, H, n, d)`: batch, heads, tokens, head width.

# %%
n, d = 6, 4
q, k, v = (torch.randn(1, 1, n, d, dtype=torch.float64) for _ in range(3))   # (B, H, n, d): one batch, one head

y = torch.zeros(n, d, dtype=torch.float64)
for t in range(n):                                        # one query at a time
    scores = [q[0, 0, t] @ k[0, 0, s] / math.sqrt(d) for s in range(n)]
    weights = [math.exp(x) / sum(math.exp(z) for z in scores) for x in scores]
    y[t] = sum(w * v[0, 0, s] for s, w in enumerate(weights))

assert torch.allclose(simpletron.softmax_attention_reference(q, k, v, None, causal=False)[0, 0], y)
assert torch.allclose(simpletron.softmax_attention(q, k, v, None, causal=False)[0, 0], y)
print("softmax attention: the loop, the written-out matrix and the fused kernel agree")

# %% [markdown]
# ## 2. Without the softmax, the product can be reordered
#
# SimpleTRON (Section 3 of the paper) drops the softmax and scales by the number of tokens n instead of the
# head width d:
#
# $$\mathrm{SimpleAttention}(Q, K, V) = \frac{1}{\sqrt n}\, Q \left(K^\top V\right).$$
#
# Without the softmax, attention is a product of three matrices, and matrix products are associative:
# $(Q K^\top) V = Q (K^\top V)$. The left order forms the n × n matrix $Q K^\top$ (n² d multiplications); the right
# order forms $K^\top V = \sum_s k_s^\top v_s$, a d × d matrix, once for the whole sequence (n d² multiplications),
# and every query then reads it:
#
# $$y_t = \frac{1}{\sqrt n} \sum_{s=1}^{n} (q_t \cdot k_s)\, v_s = \frac{1}{\sqrt n}\, q_t \Big(\sum_{s=1}^{n} k_s^\top v_s\Big).$$
#
# For n tokens the cost is linear in n. The loop below computes both sides; `simpletron.simple_attention` is the
# file's function.

# %%
y_pairs = torch.zeros(n, d, dtype=torch.float64)          # the left side: every (t, s) pair, n x n of them
for t in range(n):
    y_pairs[t] = sum((q[0, 0, t] @ k[0, 0, s]) * v[0, 0, s] for s in range(n)) / math.sqrt(n)

S = sum(torch.outer(k[0, 0, s], v[0, 0, s]) for s in range(n))   # the right side: K^T V, d x d
y_state = torch.stack([q[0, 0, t] @ S for t in range(n)]) / math.sqrt(n)

assert torch.allclose(y_pairs, y_state)                   # associativity
assert torch.allclose(simpletron.simple_attention(q, k, v, None)[0, 0], y_pairs)
print(f"SimpleAttention: n x n = {n * n} pair products or a d x d = {d * d} state, the same numbers")

# %% [markdown]
# **Padding.** A batch pads shorter sequences with token 0. SimpleTRON zeroes the padded keys, so they add nothing
# to $K^\top V$, and n counts the real tokens only: a padded sequence gives its real tokens the same outputs as the
# sequence alone.

# %%
mask = torch.tensor([[True] * 4 + [False] * 2])           # (B, n): 4 real tokens, 2 padded
padded = simpletron.simple_attention(q, k, v, mask)[0, 0, :4]
alone = simpletron.simple_attention(q[:, :, :4], k[:, :, :4], v[:, :, :4], None)[0, 0]
assert torch.allclose(padded, alone)
print("padding: the 4 real tokens read the same state with or without 2 padded tokens")

# %% [markdown]
# **What each order forms.** On the left, the n × n matrix softmax attention normalises (here n = 32 tokens, one
# head); on the right, the d × d state SimpleTRON forms instead (d = 8), drawn at the same scale: one cell a number.

# %%
n_pic, d_pic = 32, 8
qp, kp, vp = (torch.randn(1, 1, n_pic, d_pic) for _ in range(3))
A = (qp @ kp.transpose(-2, -1) / math.sqrt(d_pic)).softmax(-1)[0, 0]   # (n, n)
S_pic = (kp.transpose(-2, -1) @ vp)[0, 0]                               # (d, d)

fig, axes = plt.subplots(1, 2, figsize=(10, 4.8))
titles = (f"softmax attention: softmax(QKᵀ/√d)\nn × n = {n_pic} × {n_pic} = {n_pic**2:,} numbers",
          f"SimpleTRON: the state KᵀV\nd × d = {d_pic} × {d_pic} = {d_pic**2} numbers")
for ax, M, title in zip(axes, (A, S_pic), titles):
    ax.imshow(M, cmap="viridis", extent=(0, M.shape[1], M.shape[0], 0))
    ax.set_xlim(0, n_pic)
    ax.set_ylim(n_pic, 0)
    ax.set_title(title, fontsize=11)
axes[0].set_xlabel("key s")
axes[0].set_ylabel("query t")
axes[1].set_xlabel("value dimension")
axes[1].set_ylabel("key dimension")
fig.suptitle("What attention holds for one head: it grows with the text (left) or stays d × d (right)")
fig.tight_layout()
plt.show()

# %% [markdown]
# ## 3. Time and memory against the length
#
# Softmax attention costs $O(n^2 d)$ time and, written out, $O(n^2)$ memory; SimpleTRON costs $O(n d^2)$ and
# $O(n d)$. Below, one attention layer of 4 heads of width d = 32 on n = 256 … 4,096 tokens:
#
# - **time**: the forward pass, the best of 3, of `softmax_attention_reference` (the n × n matrix written out),
#   `softmax_attention` (the fused kernel, which never stores the n × n matrix but still computes all of it) and
#   `simple_attention`;
# - **memory**: the bytes autograd keeps for the backward pass (`torch.autograd.graph.saved_tensors_hooks` sees
#   every tensor saved), what training needs per layer.

# %%
def best_ms(fn, repeats=3):
    """The fastest of `repeats` calls of fn, in milliseconds (after one call to warm up)."""
    with torch.no_grad():
        fn()
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return 1000 * min(times)


def saved_bytes(fn):
    """The bytes of the tensors that autograd saves for the backward pass of fn() (each storage once)."""
    storages = {}

    def pack(t):
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(storages.values())


ATTENTIONS = {
    "softmax, written out (n × n)": lambda q, k, v: simpletron.softmax_attention_reference(q, k, v, None, False),
    "softmax, fused kernel": lambda q, k, v: simpletron.softmax_attention(q, k, v, None, False),
    "SimpleTRON, Q (KᵀV) / √n": lambda q, k, v: simpletron.simple_attention(q, k, v, None),
}
lengths, H, d_head = [256, 512, 1024, 2048, 4096], 4, 32
ms = {name: [] for name in ATTENTIONS}
mib = {name: [] for name in ATTENTIONS}
for L in lengths:
    qkv = [torch.randn(1, H, L, d_head, requires_grad=True) for _ in range(3)]
    for name, attention in ATTENTIONS.items():
        ms[name].append(best_ms(lambda: attention(*qkv)))
        mib[name].append(saved_bytes(lambda: attention(*qkv)) / 2**20)
    print(f"n = {L:5,}: " + " | ".join(f"{name.split(',')[-1].strip()} {ms[name][-1]:6.1f} ms {mib[name][-1]:5.1f} MiB"
                                      for name in ATTENTIONS))

written, fused, simple = (mib[name] for name in ATTENTIONS)
assert written[-1] / written[-2] > 3.5                    # n x n: twice the tokens, about four times the memory
assert simple[-1] / simple[-2] < 2.01 and fused[-1] / fused[-2] < 2.01   # linear: twice the tokens, twice
assert simple[-1] < written[-1] / 20

fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(11, 4.2))
for name in ATTENTIONS:
    ax_t.plot(lengths, ms[name], "o-", label=name)
    ax_m.plot(lengths, mib[name], "o-", label=name)
for ax, ylabel in ((ax_t, "forward time (ms)"), (ax_m, "saved for the backward pass (MiB)")):
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(lengths, [f"{L:,}" for L in lengths])
    ax.set_xlabel("tokens n")
    ax.set_ylabel(ylabel)
    ax.grid(True, which="both", alpha=0.3)
ax_t.set_title("time: n² for softmax, n for SimpleTRON")
ax_m.set_title("memory: the written-out n × n grows as n²")
ax_t.legend(fontsize=9)
fig.suptitle(f"One attention layer, {H} heads of width {d_head}, on this machine's CPU")
fig.tight_layout()
plt.show()

# %% [markdown]
# The fused kernel (flash attention) keeps memory linear too, by recomputing the n × n scores in blocks, but its
# time still grows as n²; SimpleTRON's time is linear because its work is. (Two slopes on a log-log plot: 1 for
# linear, 2 for quadratic. At short lengths fixed costs flatten the curves.)

# %% [markdown]
# ## 4. Causal SimpleTRON: a running d × d state
#
# A language model may not read ahead: token t sees tokens 1 … t only. The paper is encoder-only; this project
# adds the causal form (our extension, `causal_simple_attention`), with the paper's n read as the number of tokens
# summed over, n = t:
#
# $$y_t = \frac{1}{\sqrt t}\, q_t\, S_t, \qquad S_t = \sum_{s \le t} k_s^\top v_s = S_{t-1} + k_t^\top v_t, \quad S_0 = 0.$$
#
# That is a recurrent network whose state $S_t$ is d × d whatever t is. `causal_simple_attention` computes it for
# a whole sequence at once, chunk by chunk (a masked chunk × chunk product inside a chunk, the running state
# between chunks: the chunk length changes the order of the sums, not the result), and
# `causal_simple_attention_step` one token at a time, the way generation does.

# %%
y_loop, S_t = torch.zeros(n, d, dtype=torch.float64), torch.zeros(d, d, dtype=torch.float64)
for t in range(1, n + 1):                                 # t counts from 1
    S_t = S_t + torch.outer(k[0, 0, t - 1], v[0, 0, t - 1])   # S_t = S_{t-1} + k_t^T v_t
    y_loop[t - 1] = q[0, 0, t - 1] @ S_t / math.sqrt(t)       # y_t = q_t S_t / sqrt(t)

for chunk in (1, 4, 64):
    assert torch.allclose(simpletron.causal_simple_attention(q, k, v, chunk=chunk)[0, 0], y_loop)
state = torch.zeros(1, 1, d, d, dtype=torch.float64)
for t in range(1, n + 1):                                 # the file's recurrence, one token per call
    token = slice(t - 1, t)
    y_t, state = simpletron.causal_simple_attention_step(q[:, :, token], k[:, :, token], v[:, :, token], state, t)
    assert torch.allclose(y_t[0, 0, 0], y_loop[t - 1])
print("causal SimpleTRON: the loop, the chunked parallel form (chunks 1, 4, 64) and the recurrence agree")

# %% [markdown]
# **Generation.** A GPT keeps every earlier key and value (its KV cache) and each new token attends to all of
# them; causal SimpleTRON keeps $S_t$ per head and layer. Below, two tiny untrained language models of the same
# shape (2 layers, 4 heads, 64 wide) read prompts of growing length with `model.prefill`: the state each keeps,
# and a check that reading one more token with `model.decode` (the recurrence) gives the logits of the full
# forward pass (the parallel form).

# %%
shape = dict(vocab_size=32, block_size=2048, n_layer=2, n_head=4, n_embd=64, dropout=0.0, head="lm")
models = {"SimpleTRON": simpletron.Model(simpletron.Config(**shape)).eval(),
          "GPT (softmax, KV cache)": simpletron.Model(simpletron.Config(**shape, attention="softmax",
                                                                        variant="vanilla")).eval()}
contexts = [64, 256, 512, 1024, 2048]
idx = torch.randint(1, 32, (1, 2048))
state_kib = {name: [] for name in models}
for name, model in models.items():
    for T in contexts:
        _, st = model.prefill(idx[:, :T], capacity=T)
        state_kib[name].append(st.nbytes() / 1024)
    with torch.no_grad():                                 # the recurrence and the parallel form agree
        _, st = model.prefill(idx[:, :100], capacity=101)
        assert torch.allclose(model.decode(idx[:, 100:101], st), model(idx[:, :101])[0][:, -1], atol=1e-5)
H_m, d_m = shape["n_head"], shape["n_embd"] // shape["n_head"]
n_layer = shape["n_layer"]
assert all(kib * 1024 == n_layer * H_m * d_m * d_m * 4 for kib in state_kib["SimpleTRON"])   # S: L H d d floats
assert all(kib * 1024 == n_layer * 2 * H_m * T * d_m * 4                                      # K, V: L 2 H t d
           for kib, T in zip(state_kib["GPT (softmax, KV cache)"], contexts))

fig, ax = plt.subplots(figsize=(6.5, 4))
for name in models:
    ax.plot(contexts, state_kib[name], "o-", label=name)
    ax.annotate(f"{state_kib[name][-1]:,.0f} KiB", (contexts[-1], state_kib[name][-1]), textcoords="offset points",
                xytext=(-10, 8), ha="right")
ax.set_xscale("log", base=2)
ax.set_yscale("log")
ax.set_xticks(contexts, [f"{T:,}" for T in contexts])
ax.set_ylim(4, 1e4)
ax.set_xlabel("tokens read")
ax.set_ylabel("state kept between tokens (KiB)")
ax.set_title("Generation: the KV cache grows, SimpleTRON's d × d state does not", fontsize=11)
ax.legend(loc="center right")
ax.grid(True, which="both", alpha=0.3)
fig.tight_layout()
plt.show()

# %% [markdown]
# ## 5. What a d × d state can hold: the recall limit
#
# While it generates, causal SimpleTRON keeps nothing but $S_t$ (per head and layer), so whatever it must recall
# later has to be in that d × d matrix. Store P key–value pairs in it as the causal state does,
# $S = \sum_{i=1}^{P} k_i^\top v_i$, and read pair i back with its key:
#
# $$k_i S = \|k_i\|^2\, v_i + \sum_{j \ne i} (k_i \cdot k_j)\, v_j .$$
#
# The first term is the answer, the sum is interference. **The prediction, before the measurement:**
#
# - orthonormal keys make every $k_i \cdot k_j$ zero and the read exact, but a d-dimensional space has only d
#   orthogonal directions: exact recall for **P ≤ d pairs**, no more;
# - random unit keys overlap, $\mathbb{E}\,(k_i \cdot k_j)^2 = 1/d$, so with random unit values the interference
#   relative to the answer is $\mathbb{E}\,\|k_i S - v_i\|^2 / \|v_i\|^2 = (P - 1)/d$: as large as the answer
#   itself at P ≈ d, and growing past it. A noisy read is still right while it lies nearer $v_i$ than any of the
#   P − 1 other values (each lies about $\sqrt{1/d + P/d^2}$ from it, against 1 for $v_i$): a wider d tolerates
#   more pairs before the reads fail;
# - softmax attention keeps all P keys (its KV cache grows with P) and a sharp softmax weighs only the key that
#   matches best: right for every P.
#
# The measurement, with no training: for d = 16, 32, 64 and P = 1 … 4d, 100 draws of P random unit values and P
# keys (random unit, or orthonormal while P ≤ d). SimpleTRON reads them with `causal_simple_attention` on a
# sequence of the P pairs followed by P query tokens that write nothing ($k = v = 0$) and ask with $q = k_i$;
# softmax attention with `softmax_attention`, the queries scaled by 1,000 (a trained $W_Q$ learns such a sharp
# scale). A read is right when it is nearer $v_i$ than any other stored value (the largest dot product).

# %%
def unit(x):
    return x / x.norm(dim=-1, keepdim=True)


def simpletron_reads(keys, values):
    """Store P pairs (B, P, d) in causal SimpleTRON's state, then read each with its key: k_i S_P, (B, P, d)."""
    B, P, d = keys.shape
    nothing = torch.zeros_like(keys)
    q, k, v = (torch.cat(halves, 1)[:, None] for halves in      # (B, 1, 2P, d): P pairs, then P queries
               ((nothing, keys), (keys, nothing), (values, nothing)))
    t = torch.arange(P + 1, 2 * P + 1, dtype=keys.dtype)        # the queries' positions
    return simpletron.causal_simple_attention(q, k, v)[:, 0, P:] * t.sqrt()[:, None]   # undo the 1/sqrt(t)


def softmax_reads(keys, values, sharpness=1000.0):
    """Softmax attention of each key (scaled by `sharpness`) over the P stored pairs: (B, P, d)."""
    return simpletron.softmax_attention(sharpness * keys[:, None], keys[:, None], values[:, None], None,
                                        causal=False)[:, 0]


def accuracy(reads, values):
    """The share of reads nearer their own value than any other stored value (largest dot product)."""
    right = (reads @ values.transpose(1, 2)).argmax(-1) == torch.arange(values.shape[1])
    return right.double().mean().item()


keys, values = unit(torch.randn(2, 5, 4, dtype=torch.float64)), unit(torch.randn(2, 5, 4, dtype=torch.float64))
S_P = sum(torch.einsum("bi,bj->bij", keys[:, i], values[:, i]) for i in range(5))   # sum of outer products k^T v
state = torch.zeros(2, 1, 4, 4, dtype=torch.float64)
for t in range(1, 6):                                     # the file's recurrence writes the same state
    _, state = simpletron.causal_simple_attention_step(keys[:, None, t - 1:t], keys[:, None, t - 1:t],
                                                       values[:, None, t - 1:t], state, t)
assert torch.allclose(state[:, 0], S_P)
assert torch.allclose(simpletron_reads(keys, values), keys @ S_P)   # the read of pair i is k_i S_P

torch.manual_seed(0)
DRAWS, recall = 100, {}
for d_r in (16, 32, 64):
    for P in [2 ** i for i in range(int(math.log2(4 * d_r)) + 1)]:
        values, keys = unit(torch.randn(2, DRAWS, P, d_r))           # float32, as a model computes
        reads = simpletron_reads(keys, values)
        row = dict(random=accuracy(reads, values), softmax=accuracy(softmax_reads(keys, values), values),
                   interference=((reads - values).norm(dim=-1) ** 2).mean().item())
        if P <= d_r:                                      # P orthonormal keys: rows of a random orthogonal matrix
            ortho = torch.linalg.qr(torch.randn(DRAWS, d_r, d_r)).Q.transpose(1, 2)[:, :P]
            ortho_reads = simpletron_reads(ortho, values)
            assert torch.allclose(ortho_reads, values, atol=1e-5)    # exact up to P = d (float32)
            row["orthogonal"] = accuracy(ortho_reads, values)
        recall[d_r, P] = row

for d_r in (16, 32, 64):
    Ps = sorted(P for dd, P in recall if dd == d_r)
    noise = [recall[d_r, P]["interference"] for P in Ps]
    assert all(a < b for a, b in zip(noise, noise[1:]))   # interference grows with P ...
    assert all(abs(recall[d_r, P]["interference"] / ((P - 1) / d_r) - 1) < 0.15 for P in Ps if P >= 4)  # ... as (P-1)/d
    right = [recall[d_r, P]["random"] for P in Ps]
    assert all(a >= b for a, b in zip(right, right[1:])) and right[0] == 1.0 > right[-1]   # ... and reads fail
    assert all(recall[d_r, P]["softmax"] == 1.0 for P in Ps)
    print(f"d = {d_r}: random keys right " + ", ".join(f"P={P} {recall[d_r, P]['random']:.0%}" for P in Ps)
          + "; orthonormal keys and softmax 100%")

# %%
fig, (ax_a, ax_i) = plt.subplots(1, 2, figsize=(12, 4.5))
for d_r, color in zip((16, 32, 64), ("C0", "C1", "C2")):
    Ps = sorted(P for dd, P in recall if dd == d_r)
    ax_a.plot(Ps, [recall[d_r, P]["random"] for P in Ps], "o-", color=color, label=f"d = {d_r}: random keys")
    ax_a.plot([P for P in Ps if P <= d_r], [recall[d_r, P]["orthogonal"] for P in Ps if P <= d_r], "s",
              color=color, mfc="none", ms=9, label=f"d = {d_r}: orthonormal keys (P ≤ d only)")
    ax_a.axvline(d_r, color=color, ls=":", lw=1)
    ax_i.plot([(P - 1) / d_r for P in Ps[1:]], [recall[d_r, P]["interference"] for P in Ps[1:]], "o", color=color,
              label=f"d = {d_r}, P = 2 … {Ps[-1]}")
ax_a.axhline(1.0, color="black", lw=1, label="softmax attention, every d (keeps all P keys)")
ax_a.set(xlabel="pairs stored P (dotted lines: P = d)", ylabel="share of pairs read back right", ylim=(0, 1.05),
         title="Recall from one d × d state, no training")
ax_a.set_xscale("log", base=2)
ax_a.legend(fontsize=8, loc="lower left")
ratio = torch.logspace(-2, 0.7, 50)
ax_i.plot(ratio, ratio, color="black", lw=1, label="predicted: (P − 1)/d")
ax_i.set(xscale="log", yscale="log", xlabel="(P − 1) / d", ylabel="mean ‖k_i S − v_i‖² / ‖v_i‖²",
         title="Interference of random keys: measured (dots) and predicted")
ax_i.legend(fontsize=8, loc="upper left")
for ax in (ax_a, ax_i):
    ax.grid(True, which="both", alpha=0.3)
fig.tight_layout()
plt.show()

# %% [markdown]
# The measurement agrees with the prediction: orthonormal keys read back exactly up to P = d (no more fit), the
# interference of random keys follows (P − 1)/d for every d, and their reads fail from about P = d for d = 16,
# later for the wider states, and for every d once P is a few times d. Softmax attention
# pays with a state that grows with P; SimpleTRON's stays d × d (times heads and layers). A trained model does
# not pick its keys freely for any text, so its limit lies between the two curves. The recall experiments
# ([../docs/recall.md](../docs/recall.md)) train SimpleTRON, the GPT, TransJect and DiffEqFormer on multi-query
# associative recall and plot accuracy against the size of each model's state.

# %% [markdown]
# ## 6. The block (Fig. 4, Table 1)
#
# Around the attention, SimpleTRON keeps the Transformer's post-LN block, with two changes the paper's Table 1
# compares: no output linear $W_O$ after the heads, and an extra skip, the block's input added again at its
# output. The default variant, *res*, is
#
# $$h = \mathrm{LN}_1\big(x + \mathrm{SimpleAttention}(x W_Q + b_Q,\; x W_K + b_K,\; x W_V + b_V)\big),$$
# $$\mathrm{block}(x) = \mathrm{LN}_2\big(h + \mathrm{GELU}(h W_1 + b_1) W_2 + b_2\big) + x .$$
#
# Written out below with the block's own weights, against `simpletron.Block` (heads concatenated: each head reads
# its own d = D / H columns of Q, K and V).
#
# | variant | output linear $W_O$ | extra skip |
# |---|---|---|
# | simple | no | no |
# | res (default) | no | yes |
# | resl | yes | yes |
# | vanilla (the ordinary Transformer block) | yes | no |

# %%
config = simpletron.Config(n_layer=1, n_head=2, n_embd=8, dropout=0.0)   # variant "res", norm "post"
block = simpletron.Block(config).double()
x = torch.randn(1, 5, 8, dtype=torch.float64)                            # (B, n, D)
D, Hb, L_x = 8, 2, x.shape[1]

Q, K, V = (x[0] @ block.attn.qkv.weight.T + block.attn.qkv.bias).split(D, dim=-1)   # (n, D) each
heads, dh = [], D // Hb
for h in range(Hb):                                                     # head h: its own dh columns
    Qh, Kh, Vh = (M[:, h * dh:(h + 1) * dh] for M in (Q, K, V))
    heads.append(Qh @ (Kh.T @ Vh) / math.sqrt(L_x))                     # Q_h (K_h^T V_h) / sqrt(n)
attention = torch.cat(heads, dim=-1)                                    # (n, D), no W_O
ln1, ln2, mlp = block.ln1, block.ln2, block.mlp
h = F.layer_norm(x[0] + attention, (D,), ln1.weight, ln1.bias, ln1.eps)
m = F.gelu(h @ mlp.fc.weight.T + mlp.fc.bias) @ mlp.proj.weight.T + mlp.proj.bias
out = F.layer_norm(h + m, (D,), ln2.weight, ln2.bias, ln2.eps) + x[0]   # + x: the extra skip

assert torch.allclose(block(x, None)[0], out)
print("the res block: written out with its weights, it is simpletron.Block")

# %% [markdown]
# ## 7. Train it: SimpleTRON beside the softmax Transformer on ListOps (about a minute)
#
# ListOps (Nangia and Bowman, 2018; a task of the Long Range Arena) asks for the value of a nested expression of
# digits and four operators on lists: MIN, MAX, MED (the median) and SM (the sum modulo 10). For example
# `[MAX 2 9 [MIN 4 7 ] 0 ]` is 9. The answer is one of ten digits, read from the model's state of a learnt CLS
# token. Here the small setting of the README's quickstart: depth 3, 2–3 arguments per operator, 5–20 tokens,
# 20,000 training trees generated on the first run (`recipes/quickstart.txt`), trained longer: 3,000 steps of 32
# trees at a learning rate of 1e-3 (the recipe of `python experiments.py listops-small`), each model about 17
# seconds on an idle 2-core CPU.
#
# The training is the project's own: `python train.py`, run here as a separate process with the flags you would
# type (`@recipes/quickstart.txt` reads the recipe's flags from that file; those after it override them). Each
# run writes its folder under `out/tour-simpletron/`: `log.jsonl` (a record per step), `metrics.json`, `ckpt.pt`.

# %%
def train_py(*flags):
    """python train.py FLAGS in a process of its own (the set-up cell's run_python), its output printed as it comes."""
    status = run_python("train.py", *flags)
    if status:
        sys.exit(f"error: train.py stopped (exit status {status}); its line above says why")


STEPS = 3000
for name in ("simpletron", "softmax"):
    train_py("@recipes/quickstart.txt", "--model", name, "--max_iters", str(STEPS), "--lr", "1e-3",
             "--log_interval", "500", "--out_dir", f"out/tour-simpletron/{name}", "--overwrite", "true")

# %% [markdown]
# The loss curves, from each run's `log.jsonl`: the training loss of every step (a moving average over 50 steps)
# and the val loss at each evaluation (every 500 steps, on 640 val trees).

# %%
def read_log(folder):
    with open(os.path.join(folder, "log.jsonl")) as f:
        return [json.loads(line) for line in f]


fig, ax = plt.subplots(figsize=(7.5, 4.2))
for (name, label), color in zip((("simpletron", "SimpleTRON"), ("softmax", "softmax Transformer")), ("C0", "C1")):
    log = read_log(f"out/tour-simpletron/{name}")
    steps = [r["step"] for r in log if "loss" in r]
    loss = torch.tensor([r["loss"] for r in log if "loss" in r])
    smooth = loss.unfold(0, 50, 1).mean(1)                # the mean of steps s-49 .. s
    ax.plot(steps, loss, color=color, alpha=0.15, lw=0.6)
    ax.plot(steps[49:], smooth, color=color, label=f"{label}: train (mean of 50 steps)")
    evals = [(r["step"], r["val_loss"]) for r in log if "val_loss" in r]
    ax.plot(*zip(*evals), "o--", color=color, label=f"{label}: val")
ax.set_xlabel("step")
ax.set_ylabel("cross-entropy (nats)")
ax.set_ylim(0.8, 2.5)
ax.set_title("Small ListOps: training and val loss")
ax.legend(fontsize=9)
ax.grid(True, alpha=0.3)
fig.tight_layout()
plt.show()

# %% [markdown]
# **Accuracy**, on the 1,000 test trees, beside three rules that read only the top of each tree
# (`tasks/listops_rules.py`): the most frequent answer; the most frequent answer for the root's operator; and the
# best guess from the root's operator and its own digits, its nested lists taken as unknown. A model above the
# last rule evaluates nested lists.

# %%
import numpy as np  # noqa: E402

import data  # noqa: E402
from tasks.listops_format import listops_string  # noqa: E402
from tasks.listops_rules import listops_baselines  # noqa: E402

task = data.load_task("listops", listops_depth=3, listops_args="2,3", listops_len="5,20",
                      listops_sizes="20000,1000,1000")
task.open(training=True)
test = task.split("test")
tokens, labels = test.sample(3, np.random.default_rng(0))     # three test trees and their answers
for ids, label in zip(tokens, labels):
    print(f"{listops_string(ids[ids > 0]):60s} = {int(label)}")

rules = listops_baselines(task.split("train"), test=test)["test"]
results = {"the most frequent answer": rules["majority"], "the root's operator": rules["top_operator"],
           "the root's operator and its own digits": rules["top_digits"]}
for name, label in (("simpletron", "SimpleTRON"), ("softmax", "softmax Transformer")):
    with open(f"out/tour-simpletron/{name}/metrics.json") as f:
        results[f"{label}, {STEPS:,} steps"] = json.load(f)["test_acc"]
for name, acc in results.items():
    print(f"{name:42s} {100 * acc:5.1f}%")

# %% [markdown]
# ## Exercises
#
# 1. **Why 1/√n.** In section 2, take random q, k, v of n = 16, 256 and 4,096 tokens and compute the standard
#    deviation of `Q (Kᵀ V)` with and without the factor 1/√n. *Look for:* without it the outputs grow like √n (a
#    sum of n terms of random sign), so a model trained on short texts would see larger numbers on long ones; with
#    it they stay the same size at every length. Why is 1/√d, the softmax's scale, no use here?
# 2. **Where the curves cross.** In section 3, set `d_head = 128` and then `16`, and add n = 64 and 128 to
#    `lengths`. *Look for:* SimpleTRON's n d² against softmax's n² d: the written-out softmax is the faster one while
#    n is below about d, and the crossing moves with d.
# 3. **The block's wiring.** Train again with `--variant simple`, `--variant resl` and `--variant vanilla` (Table 1),
#    then each with `--n_layer 6`. *Look for:* at 2 layers the variants end close together; deeper, the paper's
#    §5.2 finds that SimpleTRON trains only without the output linear or with the extra skip, so *vanilla* (the
#    linear and no skip) should fall behind. Do the curves in `log.jsonl` show it?
# 4. **Only the attention changed.** Train `--model simpletron --attention softmax`: SimpleTRON's own block with
#    softmax attention (which brings its output linear). *Look for:* how much of the difference between the two
#    curves above the attention alone explains.
# 5. **The causal scale.** In section 4, read $y_t = q_t S_t / t$ (the running mean: `causal_scale="t"` in
#    `causal_simple_attention` and `causal_simple_attention_step`) and change the loop to match. *Look for:* the
#    recurrence $S_t$ is unchanged, only its read-out; plot the standard deviation of $y_t$ against t for both
#    scales.
