"""
Look inside the models: the papers' analyses. (The speed and memory benchmark is bench.py.)

    python analyze.py spectra    --ckpt out/x/ckpt.pt --out out/analysis   # QK and OV eigenvalues vs depth
    python analyze.py lyapunov   --ckpt out/x/ckpt.pt --out out/analysis --text "the company said it"
    python analyze.py activation --ckpt a/ckpt.pt --ckpt b/ckpt.pt --out out/analysis   # TransJect eq. 5-6
    python analyze.py experts    --ckpt out/transject/ckpt.pt --out out/analysis         # TransJect fig. 5, 7
    python analyze.py cluster    --out out/analysis                                     # DiffEqFormer C.8
    python analyze.py attnstd    --run out/a --run out/b --out out/analysis  # SimpleTRON fig. 5 (train.py --attn_std_interval)
    python analyze.py curves     out/a out/b --out out/analysis             # loss curves (or --table NAME)

Each subcommand writes OUT/SUBCOMMAND.json, at least one OUT/SUBCOMMAND*.png and prints a summary;
python analyze.py SUBCOMMAND --help says which models it applies to and lists its flags with their defaults.
Row-vector convention throughout, as in the papers: a token is a row x, a linear map is x W, so the
PyTorch weight of nn.Linear (out, in) is W^T.

spectra    per head h, QK_h = W_Q^h (W_K^h)^T and OV_h = W_V^h W_O^h (D x D, rank <= d = D / H; biases and
           1/sqrt(d) left out: DiffEqFormer paper, section 5.1, fig. 2). Their nonzero eigenvalues are those
           of the d x d products (W_K^h)^T W_Q^h and W_O^h W_V^h (AB and BA share their nonzero eigenvalues),
           which is what we compute. Discrete models: one point per layer; DiffEqFormer: W(t) on a grid of t.
lyapunov   token-level Lyapunov exponents (DiffEqFormer section 5.2, appendix B): along the stored Euler
           trajectory X_k, J_ji(t_k) = d f_j / d x_i (D x D, torch.func.jacrev), the tangent equation
           dQ/dt = J_ji Q from Q = I with the same Euler steps, Householder QR after every step (written
           out below), lambda = sum_k log|diag R_k| / T. This is the paper's quantity, and it is not the
           flow's own sensitivity for i != j: it follows prod_k (I + dt J_ji(t_k)), one off-diagonal block
           alone, while d x_j(1) / d x_i(0) mixes every block along the way (the product of the full
           (N D) x (N D) step Jacobians). --k K follows only the K most expanding directions (default 8 of D).
activation TransJect eq. 5, the activation factor A^(l) = E_X E_{i != j} |X_i^l - X_j^l| / |X_i^0 - X_j^0|,
           and eq. 6, the differential entropy of each token's D coordinates (their empirical density:
           a Gaussian kernel density estimate, leave-one-out), per layer, for any model of the project.
experts    TransJect's mixture-of-experts weights and its residual weights alpha_l / L (figures 5, 7).
cluster    DiffEqFormer appendix C.8: one attention head, 40 tokens on the unit sphere in 3-D, 200 Euler steps
           on [0, 10], weights W(t) = g(t) W_0 (W_0 = I by default, Geshkovski et al.'s clustering case),
           g = 1 (weight sharing) or 1 + t^k; trajectories, cluster number and spread at the end and over time.
attnstd    SimpleTRON fig. 5: per block, the standard deviation of the attention weights (Q K^T / sqrt(n) for
           SimpleTRON, Q K^T / sqrt(d) for softmax, the softmax left out, as the paper's caption says) and of
           the attention sublayer's output, over training, from the records train.py --attn_std_interval N
           writes into log.jsonl (one fixed val batch, every N steps).
curves     the training curves of train.py runs from their log.jsonl (curves.py): train loss (moving average)
           and val loss; val accuracy or, for a language model, val perplexity. Runs of one folder that differ only by
           seed (experiments.py's out/exp/TABLE/ROW-sSEED) are one line, their mean, and a band from the lowest
           to the highest seed; the summary gives each row's last val loss and accuracy or perplexity.
"""

import argparse
import contextlib
import json
import math
import os
import re
import signal
import sys

if __name__ == "__main__":                                   # Ctrl-C while torch loads: stop at once, quietly
    signal.signal(signal.SIGINT, signal.SIG_DFL)             # (data.run_main reports it in one line once running)

import numpy as np  # noqa: E402
import data  # noqa: E402  (data first: it loads torch, and a TORCH_* setting torch refuses is one line there)
import torch  # noqa: E402

os.environ["MPLBACKEND"] = "Agg"                            # files only (an unknown backend would stop the import)
import matplotlib.pyplot as plt  # noqa: E402

import curves  # noqa: E402
import tasks   # noqa: E402  (registers every task)
from config import (TASK_FLAGS, Parser, Refusal, UsageError, check_value, check_vocabulary,  # noqa: E402
                    load_checkpoint, model_call, model_of_checkpoint)


@contextlib.contextmanager
def one_thread():
    """Run many tiny tensor operations on one thread: a parallel region per operation costs more than it
    saves, and on a CPU shared with other programs a great deal more (measured: 0.03 s vs 9 s for cluster)."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(old)


# ==== The mathematics. Plain functions of tensors, each checked by tests/test_analyze.py.

def head_spectra(Wq, Wk, Wv, Wo, n_head):
    """Eigenvalues of QK_h = W_Q^h (W_K^h)^T and OV_h = W_V^h W_O^h for every head h.

    Wq, Wk, Wv: (D, D) tensors, arrays or lists, in the row convention (q = x Wq); head h owns columns h*d:(h+1)*d.
    Wo: (D, D) (y = concat(heads) Wo), head h owns rows h*d:(h+1)*d; None means no output map (identity).
    Returns (qk, ov), complex128 arrays (H, d): the d eigenvalues of each head that can be nonzero
    (the D x D products have rank <= d; their other D - d eigenvalues are 0).
    """
    Wq, Wk, Wv = (torch.as_tensor(W).detach().double().cpu() for W in (Wq, Wk, Wv))
    D = Wq.shape[0]
    Wo = torch.eye(D, dtype=torch.float64) if Wo is None else torch.as_tensor(Wo).detach().double().cpu()
    d = D // n_head
    qk, ov = [], []
    for h in range(n_head):
        s = slice(h * d, (h + 1) * d)
        qk.append(torch.linalg.eigvals(Wk[:, s].T @ Wq[:, s]))    # same nonzero spectrum as Wq_h Wk_h^T
        ov.append(torch.linalg.eigvals(Wo[s, :] @ Wv[:, s]))      # same nonzero spectrum as Wv_h Wo_h
    return torch.stack(qk).numpy(), torch.stack(ov).numpy()


def householder_qr(A):
    """A (..., n, k) with n >= k -> Q (..., n, k) with orthonormal columns and R (..., k, k) upper
    triangular, A = Q R. Batched Householder reflections; the diagonal of R may be negative."""
    A = A.clone()
    *batch, n, k = A.shape
    vs = []
    for j in range(k):
        x = A[..., j:, j]                                    # (..., n - j) the column below the diagonal
        norm = x.norm(dim=-1)
        sign = torch.where(x[..., 0] >= 0, 1.0, -1.0).to(A.dtype)
        alpha = -sign * norm                                 # reflect x onto alpha e_1, no cancellation
        v = x.clone()
        v[..., 0] = v[..., 0] - alpha
        vnorm = v.norm(dim=-1, keepdim=True)
        v = torch.where(vnorm > 0, v / vnorm.clamp_min(torch.finfo(A.dtype).tiny), torch.zeros_like(v))
        sub = A[..., j:, j:]                                 # apply H = I - 2 v v^T to the trailing block
        A[..., j:, j:] = sub - 2 * v[..., :, None] * (v[..., None, :] @ sub)
        vs.append(v)
    R = torch.triu(A[..., :k, :])
    Q = torch.eye(n, k, dtype=A.dtype, device=A.device).expand(*batch, n, k).clone()
    for j in reversed(range(k)):                             # Q = H_0 H_1 ... H_{k-1} I[:, :k]
        v = vs[j]
        Q[..., j:, :] = Q[..., j:, :] - 2 * v[..., :, None] * (v[..., None, :] @ Q[..., j:, :])
    return Q, R


@torch.no_grad()
def lyapunov_spectrum(jacobians, dt, k=None, qr_every=1):
    """Lyapunov exponents of the tangent equation dQ/dt = J(t) Q, Q(0) = I, by Euler steps
    Q <- Q + dt J_s Q, re-orthonormalised by QR (Q R = the propagated Q) after every step:

        lambda_i = sum_s log |R_s[i, i]| / T,    T = dt * (number of steps).

    jacobians: an iterable of (..., n, n) tensors J_s, one per step (a leading batch is allowed).
    k: how many exponents (columns of Q) to follow, default n. qr_every: re-orthonormalise after every
    this many steps (1: every step; a QR of a product is the product of the QRs, so the result is the same
    while nothing overflows). Returns (..., k) in the order of Q's columns, which is largest first once the
    directions have converged (the first k columns span the k most expanding directions).
    """
    with one_thread():
        return _lyapunov_spectrum(jacobians, dt, k, qr_every)


def _lyapunov_spectrum(jacobians, dt, k, qr_every):
    Q = logs = None
    steps = 0
    for J in jacobians:
        J = J.double()
        if Q is None:
            n = J.shape[-1]
            k = n if k is None else k
            Q = torch.eye(n, k, dtype=J.dtype, device=J.device).expand(*J.shape[:-2], n, k)
            logs = torch.zeros(*J.shape[:-2], k, dtype=J.dtype, device=J.device)
        Q = Q + dt * (J @ Q)                                 # one Euler step of the tangent equation
        steps += 1
        if steps % qr_every == 0:
            Q, R = householder_qr(Q)
            logs = logs + R.diagonal(dim1=-2, dim2=-1).abs().log()
    if Q is None:
        raise ValueError("no Jacobians: the trajectory has no steps")
    if steps % qr_every:
        Q, R = householder_qr(Q)
        logs = logs + R.diagonal(dim1=-2, dim2=-1).abs().log()
    return logs / (dt * steps)


def token_jacobians(f, X, t):
    """All D x D blocks J[j, :, i, :] = d f(X, t)_j / d x_i of a vector field f: (N, D) -> (N, D) at X (N, D),
    in the column convention J[j, a, i, b] = d f_{j,a} / d x_{i,b}. One jacrev call (torch.func), with
    attention written out (the math backend of scaled_dot_product_attention, which vmap batches)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    with sdpa_kernel([SDPBackend.MATH]):
        return torch.func.jacrev(lambda Z: f(Z, t))(X)       # (N, D, N, D)


@torch.no_grad()
def token_lyapunov(f, trajectory, times, dt, k=None, outputs=None):
    """Token-level Lyapunov exponents (DiffEqFormer section 5.2): for output token j and input token i,
    integrate dQ/dt = J_ji(t) Q along the stored trajectory (X_s, evaluated at times[s]).
    For i != j this propagates prod_s (I + dt J_ji(t_s)): one block of the step Jacobians on its own, the paper's
    definition, not the block (j, i) of the flow's Jacobian d x_j(1) / d x_i(0), which mixes all blocks.

    f(X, t): the vector field, (N, D) -> (N, D). trajectory: X_0 .. X_{S-1}, each (N, D), the states where
    the S Euler steps evaluate f. outputs: the output tokens j (default all).
    Returns exponents (len(outputs), N, k) sorted largest first; entry [j, i] belongs to the pair (out j, in i).
    """
    outputs = list(range(trajectory[0].shape[0]) if outputs is None else outputs)

    def blocks():
        for X, t in zip(trajectory, times):
            with torch.enable_grad():
                J = token_jacobians(f, X.detach(), t)        # (N, D, N, D)
            yield J[outputs].permute(0, 2, 1, 3)             # (len(outputs), N, D, D): [j, i] = J_ji
    return lyapunov_spectrum(blocks(), dt, k).sort(dim=-1, descending=True).values


def activation_factor(X0, Xl, mask=None):
    """TransJect eq. 5 for each sequence: E_{i != j} |X_i^l - X_j^l| / |X_i^0 - X_j^0|.
    X0, Xl: (B, N, D); mask: (B, N) real tokens or None. Pairs with X_i^0 = X_j^0 are left out.
    Returns (B,) float64: nan for a sequence without a pair (one real token), whose factor is undefined."""
    X0, Xl = X0.double(), Xl.double()
    d0, dl = torch.cdist(X0, X0), torch.cdist(Xl, Xl)       # (B, N, N)
    N = X0.shape[1]
    pair = ~torch.eye(N, dtype=torch.bool, device=X0.device)[None]
    if mask is not None:
        pair = pair & mask[:, :, None] & mask[:, None, :]
    pair = pair & (d0 > 0)
    ratio = torch.where(pair, dl / torch.where(pair, d0, 1.0), 0.0)   # no 0/0 in the pairs left out
    return ratio.sum((1, 2)) / pair.sum((1, 2))           # (no pair: 0 / 0, nan)


def differential_entropy(x, chunk_elems=2 ** 22):
    """Differential entropy (nats) of the samples along the last dimension, H = E[-log p(x)], with p the
    empirical density: a leave-one-out Gaussian kernel density estimate, Silverman's bandwidth
    h = 0.9 min(std, IQR / 1.349) n^(-1/5). x: (..., n), n >= 2 -> (...,). All samples equal -> -inf
    (TransJect: equal coordinates drive the entropy to minus infinity). Computed in chunks of rows."""
    shape, n = x.shape[:-1], x.shape[-1]
    rows = x.reshape(-1, n).double()
    step = max(1, chunk_elems // (n * n))
    return torch.cat([_kde_entropy(rows[i:i + step]) for i in range(0, len(rows), step)]).reshape(shape)


def _kde_entropy(x):                                         # x (M, n) -> (M,)
    n = x.shape[-1]
    std = x.std(dim=-1)
    q = torch.quantile(x, torch.tensor([0.25, 0.75], dtype=x.dtype, device=x.device), dim=-1)
    iqr = (q[1] - q[0]) / 1.349
    spread = torch.where(iqr > 0, torch.minimum(std, iqr), std)
    h = 0.9 * spread * n ** -0.2                             # (M,)
    hh = torch.where(h > 0, h, 1.0)[:, None, None]           # h = 0 (all samples equal): -inf below
    z = (x[:, :, None] - x[:, None, :]) / hh                 # (M, n, n)
    logk = (-0.5 * z ** 2).masked_fill(torch.eye(n, dtype=torch.bool, device=x.device), -math.inf)  # leave one out
    logp = torch.logsumexp(logk, dim=-1) - math.log(n - 1) - torch.log(hh[:, 0]) - 0.5 * math.log(2 * math.pi)
    H = -logp.mean(dim=-1)
    return torch.where(h > 0, H, torch.full_like(H, -math.inf))


def sphere(X):
    return X / X.norm(dim=-1, keepdim=True)


def simulate_attention_ode(x0, Wq, Wk, Wv, g, T=10.0, steps=200):
    """DiffEqFormer appendix C.8: an attention-only ODE with one head, tokens on the unit sphere
    (the normalisation of a LayerNorm), weights W(t) = g(t) W_0:

        dx_i/dt = P_x_i( sum_j softmax_j(<x_i Q(t), x_j K(t)>) x_j V(t) ),  P_x the projection onto
                  the tangent space of the sphere at x (Geshkovski et al.'s self-attention dynamics),

    by `steps` Euler steps on [0, T], each followed by x <- x / |x|. x0: (N, D). Returns (steps + 1, N, D)."""
    dt = T / steps
    X = sphere(x0.double())
    Wq, Wk, Wv = (W.double() for W in (Wq, Wk, Wv))
    traj = [X]
    with one_thread():
        for s in range(steps):
            gt = float(g(s * dt))
            P = torch.softmax((X @ Wq * gt) @ (X @ Wk * gt).T, dim=-1)     # (N, N) attention
            F = P @ (X @ Wv * gt)                                            # (N, D)
            F = F - (F * X).sum(-1, keepdim=True) * X                        # tangent to the sphere
            X = sphere(X + dt * F)
            traj.append(X)
    return torch.stack(traj)


def cluster_number(X, eps=0.05):
    """Number of clusters of the points X (N, D): the connected components of the graph joining two points
    closer than eps (single linkage). N points that never met give N; a full collapse gives 1."""
    close = (torch.cdist(X, X) <= eps).numpy()
    label = list(range(len(X)))

    def root(a):
        while label[a] != a:
            label[a] = label[label[a]]
            a = label[a]
        return a
    for i, j in zip(*np.nonzero(close)):
        label[root(i)] = root(j)
    return len({root(i) for i in range(len(X))})


def spread(X):
    """Mean distance between two different points of X (N, D) (points spread uniformly on the unit sphere
    in 3-D: 4/3; a collapse to one point: 0)."""
    return torch.pdist(X).mean().item()


# ==== Checkpoints, models and their insides

def load(path, device="cpu"):
    """(model, checkpoint) of a train.py checkpoint, in eval mode."""
    ckpt = load_checkpoint(path)                            # UsageError if missing, unreadable or not train.py's
    model = model_of_checkpoint(ckpt, path)
    return model.to(device).eval(), ckpt


def ode_model(model):
    """True for a DiffEqFormer (a model that integrates an ODE in depth)."""
    return hasattr(model, "vector_field")


def attention_weights(model, times=None):
    """[(depth, Wq, Wk, Wv, Wo or None)] in the row convention, one entry per layer (discrete models,
    depth = 1..L) or per time t of the grid (DiffEqFormer, depth = t). n_head is model.config.n_head."""
    D = model.config.n_embd
    out = []
    if ode_model(model):
        for t in model_times(model) if times is None else times:
            W = model.attention_weights(float(t))
            out.append((float(t), W["q"], W["k"], W["v"], W.get("o")))
        return out
    for layer, block in enumerate(model.blocks, 1):
        W = block.attn.qkv.weight.detach()                   # (3D, D) = [Wq^T; Wk^T; Wv^T]
        Wo = getattr(block.attn.out, "weight", None)         # nn.Linear, OrthogonalLinear; nn.Identity: none
        out.append((layer, W[:D].T, W[D:2 * D].T, W[2 * D:].T, None if Wo is None else Wo.detach().T))
    return out


def spectra_lacks(model):
    """The first thing attention_weights reads that the model lacks, or None (a model without blocks: blocks[0])."""
    if ode_model(model):
        return next((f"{f}()" for f in ("attention_weights", "times") if not callable(getattr(model, f, None))), None)
    D = model.config.n_embd
    for i, attn in enumerate(getattr(block, "attn", None) for block in getattr(model, "blocks", None) or [None]):
        W, Wo = (getattr(getattr(attn, name, None), "weight", None) for name in ("qkv", "out"))
        if not (torch.is_tensor(W) and W.shape == (3 * D, D)):
            return f"blocks[{i}].attn.qkv with a weight (3 n_embd, n_embd)"    # (TransJect's X U Sigma V: none)
        if not (hasattr(attn, "out") and (Wo is None or torch.is_tensor(Wo) and Wo.shape == (D, D))):
            return f"blocks[{i}].attn.out with a weight (n_embd, n_embd) or none"
    return None


def model_times(model):
    """The times t at which the ODE model evaluates its vector field (one per Euler step)."""
    return [float(t) for t in model.times()]


def layer_states(model, idx, name=None):
    """Hidden states of every layer: ([X^0, X^1, ..., X^L] each (B', N, D), mask (B', N) or None).
    X^0 is what enters the first layer (embeddings), X^l what leaves layer l (DiffEqFormer: the state after
    Euler step l). A model may provide hidden_states(idx) -> (list, mask), else its `blocks` are hooked."""
    name = name or type(model).__module__                   # (model_call names it in a failure's line)
    if hasattr(model, "hidden_states"):
        out, where = model_call(name, "hidden_states", model.hidden_states, idx), "its hidden_states(idx) returned"
        return checked_states(*(out if isinstance(out, tuple) and len(out) == 2 else (out, None)), name, where)
    blocks = getattr(model, "blocks", None) or getattr(model, "layers", None)
    if blocks is None:
        raise UsageError(f"cannot read the layers of {type(model).__module__}.Model")
    states, masks = [], []

    def first(block, args, kwargs):
        states.append(args[0].detach())
        masks.append(args[1] if len(args) > 1 and isinstance(args[1], torch.Tensor) else kwargs.get("mask"))

    def after(block, args, kwargs, output):
        states.append((output[0] if isinstance(output, tuple) else output).detach())
    handles = [blocks[0].register_forward_pre_hook(first, with_kwargs=True)]
    handles += [b.register_forward_hook(after, with_kwargs=True) for b in blocks]
    try:
        with torch.no_grad():
            model_call(name, "forward", model, idx)
    finally:
        for h in handles:
            h.remove()
    return checked_states(states, masks[0] if masks else None, name, "its blocks gave")


def checked_states(states, mask, name, where):
    """layer_states' (states, mask: bool or None), or a Refusal line unless they are what its docstring says."""
    size = lambda v: tuple(v.shape) if torch.is_tensor(v) else v if v is None else type(v).__name__  # noqa: E731
    S = list(states) if isinstance(states, (list, tuple)) else None
    if not (S and all(torch.is_tensor(s) and s.dim() == 3 and s.is_floating_point() and s.shape == S[0].shape
                      for s in S) and (mask is None or torch.is_tensor(mask) and mask.shape == S[0].shape[:2])):
        got = data.one_line([size(s) for s in S] if S is not None else size(states), 150)
        raise Refusal(f"model {name!r}: {where} states {got} and mask {size(mask)}; analyze.py reads [X^0, ..., X^L], "
                      "float tensors of one shape (B, N, D), and a mask (B, N) or None")
    return S, mask if mask is None or mask.dtype == torch.bool else mask != 0


def task_of(ckpt):
    a = ckpt.get("args", {})
    kw = dict(cache_dir=a.get("cache_dir", "data"), data_dir=a.get("data_dir"), seed=a.get("seed", 0),
              tokenizer=a.get("tokenizer") or "gpt2", **{k: a[k] for k in TASK_FLAGS if k in a})
    if "block_size" in ckpt["config"]:
        kw["block_size"] = ckpt["config"]["block_size"]
    task = data.load_task(a.get("task", "listops"), **kw)
    check_vocabulary(ckpt.get("vocabulary"), task.vocabulary, task.name)   # (a text changed since: ids moved)
    return task


def sample_batch(ckpt, n_seq, max_len, seed=0):
    """n_seq examples of the checkpoint's task (val split, else test, else train), cut to max_len tokens."""
    task, vocab = task_of(ckpt), ckpt["config"]["vocab_size"]
    if task.vocab_size > vocab:                              # (more: a --vocab_size above the task's, ids unused)
        raise UsageError(f"task {task.name} has {task.vocab_size:,} ids but the checkpoint's model reads {vocab:,}: "
                         "its data changed since training, or the checkpoint is another run's")
    name = next((s for s in ("val", "test", "train") if task.has(s)), None)
    if name is None:
        raise UsageError(f"task {task.name} has no data to analyse")
    x, _ = task.split(name).sample(n_seq, np.random.default_rng(seed))
    return x[..., :max_len]


def encode_text(text, ckpt):
    """Token ids (1, N) and their labels for a sentence, as the run's language model read its text: Penn Treebank
    words (unknown words -> <unk>), its characters (--tokenizer char), or its tiktoken encoding (byte, gpt2 ...)."""
    a, cfg, recorded = ckpt.get("args", {}), ckpt["config"], ckpt.get("vocabulary")   # (train.py records it)
    task, tokenizer = a.get("task"), a.get("tokenizer") or "gpt2"
    if task == "ptb" and tokenizer != "char":                # (a run before train.py recorded them: its files' words)
        words = recorded or sorted(set(tasks.lm.read_words(tasks.lm.ptb_files(a.get("data_dir") or os.path.join(
            a.get("cache_dir") or "data", "ptb"))["train"])))
        vocab = {w: i for i, w in enumerate(words, start=1)}   # as tasks.lm.ptb numbers them
        labels = text.split()                                # a word as typed, else lower-cased (PTB's), else <unk>
        ids = [vocab.get(w, vocab.get(w.lower(), vocab.get("<unk>"))) for w in labels]
        if None in ids:                                      # (a vocabulary without <unk>: no stand-in)
            raise UsageError(f"--text: word {labels[ids.index(None)]!r} is not in the run's vocabulary, which has no "
                             "<unk> to stand in for it")
    elif tokenizer == "char":                                # the characters the run's cache numbered
        chars = recorded or data.load_task(task, cache_dir=a.get("cache_dir") or "data", data_dir=a.get("data_dir"),
                                           tokenizer="char").meta["chars"]
        if not isinstance(chars, str):                       # (a damaged checkpoint: words for a char run)
            raise UsageError(f"the checkpoint's vocabulary is a {type(chars).__name__}, not a char run's characters")
        ids, labels = tasks.lm.char_ids(text, chars, "--text").tolist(), list(text)
    elif tokenizer == "byte":                                # id = byte (256: <|endoftext|>), given as such
        ids = list(text.encode(errors="surrogateescape"))    # (a byte that is not UTF-8, as the shell passed it)
        labels = [chr(b) if 32 <= b < 127 else f"\\x{b:02x}" for b in ids]
    else:
        enc = tasks.sources.get_tokenizer(tokenizer, task)
        ids = enc.encode_ordinary(text)
        labels = [enc.decode([i], errors="replace") for i in ids]
    if not ids or max(ids) >= cfg["vocab_size"]:             # (past the model's ids: its data changed since training)
        raise UsageError("--text is empty" if not ids else f"--text: {labels[ids.index(max(ids))]!r} is id {max(ids)}, "
                         f"past the model's {cfg['vocab_size']:,} ids: the run's data changed since training")
    if len(ids) > cfg["block_size"]:                         # (honoured whole or refused: never cut)
        raise UsageError(f"--text is {len(ids):,} tokens, and the model reads at most its block_size "
                         f"{cfg['block_size']:,}: give a shorter --text")
    return torch.tensor([ids]), labels


# ==== Output helpers

def write_json(out, name, obj):                             # (in the folder main made)
    path = os.path.join(out, f"{name}.json")
    data.atomic_write_text(path, json.dumps(obj, indent=1, default=float) + "\n")
    return path


def save_fig(fig, out, name):                                # (whole or not at all: an earlier PNG survives a failure)
    path = os.path.join(out, f"{name}.png")
    data.atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=110, bbox_inches="tight"))
    plt.close(fig)
    return path


def label_of(path, ckpt):
    return f"{ckpt['model_name']} ({os.path.basename(os.path.dirname(os.path.abspath(path)))})"


def cx(z):
    return [[float(v.real), float(v.imag)] for v in np.ravel(z)]


# ==== Subcommands

def cmd_spectra(args):
    (model, ckpt), = args.models
    H = model.config.n_head
    times = np.linspace(0.0, 1.0, args.grid).tolist() if args.grid else None
    rows, has_out = [], False
    for depth, Wq, Wk, Wv, Wo in attention_weights(model, times):
        qk, ov = head_spectra(Wq, Wk, Wv, Wo, H)
        rows.append({"depth": depth, "qk": [cx(e) for e in qk], "ov": [cx(e) for e in ov]})
        has_out = has_out or Wo is not None
    ode = ode_model(model)
    axis = "depth t (ODE time)" if ode else "layer"
    fig, axes = plt.subplots(2, 2, figsize=(12, 8), sharex=True)
    colors = plt.cm.tab10(np.arange(H) % 10)
    width = (rows[-1]["depth"] - rows[0]["depth"]) / max(len(rows) - 1, 1)
    ov_title = "OV = W_V^h W_O^h" if has_out else "OV = W_V^h (no output map W_O)"   # the product the model has
    for col, key, title in ((0, "qk", "QK = W_Q^h W_K^h\u1d40"), (1, "ov", ov_title)):
        ax, axm = axes[0, col], axes[1, col]
        for h in range(H):
            xs, ys, mags = [], [], []
            for r in rows:
                e = np.array(r[key][h])
                jitter = (h - (H - 1) / 2) * 0.6 * width / max(H, 1)
                x = r["depth"] + jitter
                if ode:                                      # heads side by side, but inside t in [0, 1]
                    x = min(max(x, 0.0), 1.0)
                xs += [x] * len(e)
                ys += list(e[:, 0])
                mags.append(np.abs(e[:, 0] + 1j * e[:, 1]).max())
            ax.scatter(xs, ys, s=9, color=colors[h], alpha=0.6, label=f"head {h}")
            axm.plot([r["depth"] for r in rows], mags, "-o", ms=3, color=colors[h], label=f"head {h}")
        ax.axhline(0, color="gray", lw=0.6)
        ax.tick_params(labelbottom=True)
        ax.set(title=f"{title}: eigenvalues (real part)", ylabel="Re(eigenvalue)")
        axm.set(title=f"{key.upper()}: largest |eigenvalue| per head", ylabel="max |eigenvalue|", xlabel=axis)
        ax.legend(fontsize=7, ncol=2)
        if not ode:
            axm.set_xticks([r["depth"] for r in rows])
            continue
        axm.set_xlim(-0.03, 1.03)
        for a in (ax, axm) if args.grid else ():             # where the trained solver evaluates W(t)
            for t in model_times(model):
                a.axvline(t, color="gray", ls=":", lw=0.8)
    grid_note = "\n(dotted: the times t at which the model's solver evaluates W(t); between them W(t) was never trained)" \
        if ode and args.grid else ""
    fig.suptitle(f"Spectra of the attention weights per head vs {axis}: {curves.literal(label_of(args.ckpt[0], ckpt))}"
                 f"{grid_note}")
    png = save_fig(fig, args.out, "spectra")
    out = {"ckpt": args.ckpt[0], "model": ckpt["model_name"], "axis": axis, "n_head": H, "ov": ov_title,
           "note": "per head, the d eigenvalues of QK_h and OV_h that can be nonzero, [real, imag]; "
                   "biases and 1/sqrt(d) left out", "rows": rows}
    path = write_json(args.out, "spectra", out)
    for key in ("qk", "ov"):
        first = max(abs(complex(*v)) for h in rows[0][key] for v in h)
        last = max(abs(complex(*v)) for h in rows[-1][key] for v in h)
        pos = np.mean([v[0] > 0 for r in rows for h in r[key] for v in h])
        print(f"{key.upper()}: max |eigenvalue| {first:.3g} at {axis} {rows[0]['depth']:g} -> {last:.3g} at "
              f"{rows[-1]['depth']:g}; {100 * pos:.0f}% of eigenvalues have a positive real part")
    print(f"wrote {path}, {png}")


def cmd_lyapunov(args):
    (model, ckpt), = args.models
    idx, labels = args.tokens
    N, shown = idx.shape[1], [curves.literal(label) for label in labels]   # (drawn as typed)
    with torch.no_grad():
        traj = model.trajectory(idx)                         # states where the Euler steps evaluate f
    times, dt = model_times(model), model.dt()
    X = [s[0].double() for s in traj[:len(times)]]
    model.double()

    def f(Z, t):
        return model.vector_field(Z[None], t)[0]
    lam = token_lyapunov(f, X, times, dt, k=args.k)          # (N out, N in, k)
    model.float()
    causal = torch.ones(N, N, dtype=torch.bool).tril()       # output j sees inputs i <= j
    top = lam[..., 0].masked_fill(~causal, float("nan")).numpy()
    j = args.position % N
    off = top[np.tril_indices(N, -1)]
    vmax = float(np.nanmax(off)) if off.size else None      # the diagonal (i = j) is far larger: it saturates
    fig, axes = plt.subplots(2, 1, figsize=(max(8, 0.45 * N + 3), 11), gridspec_kw={"height_ratios": [3, 2]})
    im = axes[0].imshow(top, cmap="magma", vmax=vmax)
    axes[0].set_xticks(range(N), shown, rotation=60, ha="right", fontsize=8)
    axes[0].set_yticks(range(N), shown, fontsize=8)
    axes[0].set(xlabel="input token i (perturbed)", ylabel="output token j")
    axes[0].set_title("largest token-level Lyapunov exponent \u03bb\u2081(j, i); colours scaled to i < j "
                      "(the diagonal i = j is larger and saturates)", fontsize=10)
    fig.colorbar(im, ax=axes[0], label="\u03bb\u2081")
    ax = axes[1]
    if j > 0:
        vals = top[j, :j]
        ax.bar(range(j), vals, color=plt.cm.magma(0.15 + 0.7 * (vals - vals.min()) / max(np.ptp(vals), 1e-12)))
        ax.set_xticks(range(j), shown[:j], rotation=60, ha="right", fontsize=8)
    ax.axhline(0, color="gray", lw=0.6)
    ax.set(xlabel="input token i", ylabel="\u03bb\u2081(j, i)")
    ax.set_title(curves.literal(f"sensitivity of output token j = {j} ({labels[j]!r}, which predicts the next word) "
                                f"to each earlier token; to itself: \u03bb\u2081 = {top[j, j]:.3f}"), fontsize=10)
    fig.tight_layout()
    png = save_fig(fig, args.out, "lyapunov")
    out = {"ckpt": args.ckpt[0], "text": args.text, "tokens": labels, "output_position": j,
           "steps": len(times), "dt": dt, "k": args.k,
           "largest": [[None if math.isnan(v) else float(v) for v in row] for row in top],
           "exponents_of_output": lam[j, :j + 1].tolist()}
    path = write_json(args.out, "lyapunov", out)
    order = np.argsort(-top[j, :j])
    print(f"output token {j} ({labels[j]!r}): largest exponent to itself {top[j, j]:.3f}; among earlier tokens "
          "most sensitive to " + ", ".join(f"{labels[i]!r} ({top[j, i]:.3f})" for i in order[:5]))
    print(f"wrote {path}, {png}")


def cmd_activation(args):
    results = []
    for path, (model, ckpt), x in zip(args.ckpt, args.models, args.batches):
        states, mask = layer_states(model, x, ckpt["model_name"])
        X0 = states[0]
        m = mask if mask is not None else torch.ones(X0.shape[:2], dtype=torch.bool)
        act, ent = [], []
        for Xl in states:
            act.append([v for v in activation_factor(X0, Xl, mask).tolist() if not math.isnan(v)])   # (no pair)
            per_token = differential_entropy(Xl)             # (B, N) entropy of each token's coordinates
            fin = torch.isfinite(per_token) & m
            ent.append(((per_token.where(fin, 0)).sum(1) / fin.sum(1).clamp_min(1)).tolist())
        results.append({"ckpt": path, "model": ckpt["model_name"], "label": label_of(path, ckpt),
                        "task": ckpt.get("args", {}).get("task"), "n_seq": int(X0.shape[0]),
                        "tokens": int(m.sum()), "activation_factor": act, "entropy": ent})
    fig, axes = plt.subplots(1, 2, figsize=(13, 5))
    n = len(results)
    for key, ax, ylabel in (("activation_factor", axes[0], "activation factor A^(l) (eq. 5)"),
                            ("entropy", axes[1], "differential entropy (nats, eq. 6)")):
        for r_i, r in enumerate(results):
            L = len(r[key])
            pos = np.arange(L) + (r_i - (n - 1) / 2) * 0.8 / n
            color = plt.cm.tab10(r_i % 10)
            ax.boxplot(r[key], positions=pos, widths=0.7 / n, patch_artist=True, showfliers=True,
                       boxprops=dict(facecolor=color, edgecolor=color), medianprops=dict(color="black"),
                       whiskerprops=dict(color=color), capprops=dict(color=color),
                       flierprops=dict(markeredgecolor=color, markersize=3))
            ax.plot([], [], color=color, lw=6, label=curves.literal(r["label"]))
        L = max(len(r[key]) for r in results)
        ax.set_xticks(range(L), [str(l) for l in range(L)])
        ax.set(xlabel="layer l (0 = embeddings)", ylabel=ylabel)
        ax.legend(fontsize=8)
    axes[0].axhline(1.0, color="gray", lw=0.6, ls="--")
    axes[0].set_yscale("log")                                # ticks between the decades too: 29.5 and 55 readable
    curves.log_ticks(axes[0], "y", [v for r in results for a in r["activation_factor"] for v in a] + [1.0])
    axes[0].set_title("distance between tokens at layer l over that at the input")
    axes[1].set_title("entropy of each token's coordinates, averaged over the sequence")
    fig.suptitle(f"Activation factor (TransJect eq. 5) and entropy (eq. 6) per layer ({args.n_seq} sequences each)")
    png = save_fig(fig, args.out, "activation")
    path = write_json(args.out, "activation", {"note": "one value per sequence (of two tokens at least) and "
                                               "layer; layer 0 is the input to the first layer", "models": results})
    for r in results:
        print(f"{r['label']}: median activation factor per layer " +
              " ".join(f"{np.median(a):.3g}" for a in r["activation_factor"]) +
              " | entropy " + " ".join(f"{np.median(e):.3g}" for e in r["entropy"]))
    print(f"wrote {path}, {png}")


def cmd_experts(args):
    results = []
    for path, (model, ckpt), x in zip(args.ckpt, args.models, args.batches):
        with torch.no_grad():                                # per layer (B, E), or (B, L, E) for head lm
            lam = [w.detach().double().reshape(-1, w.shape[-1]) for w in model.expert_weights(x)]
        res = {k: float(v) for k, v in model.residual_weights().items()}
        results.append({"ckpt": path, "label": label_of(path, ckpt), "task": ckpt.get("args", {}).get("task"),
                        "n_layer": len(lam), "n_expert": lam[0].shape[-1], "n_weight_vectors": lam[0].shape[0],
                        "expert_weights": [w.tolist() for w in lam], "residual_weights": res,
                        "bound_1_over_L": 1 / len(lam)})
    n = len(results)
    fig, axes = plt.subplots(2, n, figsize=(6.5 * n, 8.5), squeeze=False)
    for col, r in enumerate(results):
        ax = axes[0, col]
        E = r["n_expert"]
        for l, w in enumerate(r["expert_weights"]):
            ax.hist(np.ravel(w), bins=50, range=(0, 1), histtype="step", lw=1.5, label=f"layer {l + 1}")
        ax.axvline(1 / E, color="gray", ls="--", lw=0.8, label=f"1/E = {1 / E:.2f} (balanced)")
        ax.set(xlabel="expert weight \u03bb_e (softmax over the experts)",
               ylabel=f"count ({r['n_weight_vectors']} weight vectors x {E} experts)")
        ax.set_title(curves.literal(f"{r['label']}, {r['task']}: expert weights (paper fig. 7)"), fontsize=10)
        ax.legend(fontsize=8)
        ax = axes[1, col]
        names = list(r["residual_weights"])
        bars = ax.bar(range(len(names)), [r["residual_weights"][k] for k in names], color="tab:blue")
        ax.bar_label(bars, fmt="%.4f", fontsize=8)
        ax.axhline(1 / 3, color="tab:red", ls="--", lw=0.8, label="1/3 (injective below)")
        ax.axhline(r["bound_1_over_L"], color="gray", ls=":", lw=0.8, label="1/L (the largest sigmoid(a)/L)")
        ax.set_xticks(range(len(names)), names)
        ax.set_ylabel("residual weight \u03b1_l / L")
        ax.set_title("residual weights per layer (paper fig. 5)", fontsize=10)
        ax.legend(fontsize=8)
    fig.suptitle("TransJect: mixture-of-experts weights and residual weights")
    fig.tight_layout()
    png = save_fig(fig, args.out, "experts")
    path = write_json(args.out, "experts", {"note": "expert_weights[l]: one softmax vector over the experts per "
                                            "sample (head lm: per prefix); residual_weights: alpha_l / L",
                                            "models": results})
    for r in results:
        print(f"{r['label']}:")
        for l, w in enumerate(map(np.array, r["expert_weights"])):
            print(f"  layer {l + 1}: mean expert weights " + " ".join(f"{v:.3f}" for v in w.mean(0)) +
                  f" (min {w.min():.3f}, max {w.max():.3f}); residual weight "
                  f"{list(r['residual_weights'].values())[l]:.4f}")
    print(f"wrote {path}, {png}")


def read_attention_std(run):
    """The attention-std records that train.py --attn_std_interval wrote into RUN/log.jsonl, and the run's label."""
    path = os.path.join(run, "log.jsonl")
    if problem := data.file_problem(path):
        raise UsageError(f"--run {run}: {path} {problem} (a folder of python train.py ... --attn_std_interval N)")
    records = curves.std_records(path)
    if not records:
        raise UsageError(f"--run {run}: its log.jsonl has no attention std; train it with --attn_std_interval N")
    label = os.path.basename(os.path.abspath(run))
    meta = os.path.join(run, "metrics.json")
    if not data.file_problem(meta):
        with data.reading(meta, "is damaged"), open(meta, encoding="utf-8-sig") as f:
            acc = dict(json.load(f)).get("test_acc")          # (not a JSON object: damaged too)
        if data.finite(acc) and not 0 <= acc <= 1:
            raise UsageError(f"--run {run}: {meta} is damaged: its test_acc {acc:g} is not an accuracy (0 to 1)")
        label += f" (test acc {100 * acc:.1f}%)" if data.finite(acc) else ""
    return records, label


def cmd_attnstd(args):
    """SimpleTRON's Fig. 5: the standard deviation of each block's attention weights (Q K^T / sqrt(n) for
    SimpleTRON, Q K^T / sqrt(d) for softmax without the softmax) and of its attention output, over training."""
    fig, axes = plt.subplots(len(args.run), 2, figsize=(12, 3.2 * len(args.run) + 0.6), squeeze=False, sharex=True)
    results = []
    for row, (run, (records, label)) in enumerate(zip(args.run, args.logs)):
        steps = [r["step"] for r in records]
        n_block = len(records[0]["score_std"])
        colors = plt.cm.viridis(np.linspace(0, 0.9, n_block))
        for col, key, title in ((0, "score_std", "std of the attention weights"),
                                (1, "attn_std", "std of the attention output")):
            ax = axes[row, col]
            for l in range(n_block):
                ax.plot(steps, [r[key][l] for r in records], color=colors[l], lw=1.5, label=f"block {l + 1}")
            ax.set_yscale("log" if min(min(r[key]) for r in records) > 0 else "linear")   # (0: a single score)
            ax.set_title(f"{curves.literal(label)}: {title}", fontsize=9)
            ax.grid(True, alpha=0.3)
            if row == len(args.run) - 1:
                ax.set_xlabel("training step")
        axes[row, 0].legend(fontsize=7, ncol=2)
        results.append({"run": run, "label": label, "steps": steps,
                        **{key: [[r[key][l] for r in records] for l in range(n_block)]
                           for key in ("score_std", "attn_std")}})
    fig.suptitle("Attention over training (SimpleTRON fig. 5): weights Q Kᵀ / √n (SimpleTRON) or "
                 "Q Kᵀ / √d (softmax, before the softmax)", fontsize=10)
    fig.tight_layout()
    png = save_fig(fig, args.out, "attnstd")
    path = write_json(args.out, "attnstd", {"note": "score_std[l][i], attn_std[l][i]: block l at steps[i]",
                                            "runs": results})
    for r in results:
        print(f"{r['label']}: step {r['steps'][0]} -> {r['steps'][-1]}")
        for l, (a, b) in enumerate(zip(r["score_std"], r["attn_std"])):
            print(f"  block {l + 1}: weights std {a[0]:.3g} -> {a[-1]:.3g} (max {max(a):.3g}); "
                  f"output std {b[0]:.3g} -> {b[-1]:.3g}")
    print(f"wrote {path}, {png}")


def table_runs(name):
    """Every run of python experiments.py NAME: the folders of out/exp/NAME with a log.jsonl (not its evaluations
    of checkpoints, which train nothing, nor its data)."""
    folder = os.path.join("out", "exp", name)
    if problem := data.file_problem(folder, folder=True):
        raise UsageError(f"--table {name}: {folder} {problem} (python experiments.py {name} writes it; run from "
                         "the project's folder)")
    runs = [os.path.join(folder, d) for d in sorted(os.listdir(folder))]
    runs = [run for run in runs if os.path.lexists(os.path.join(run, "log.jsonl"))]   # (one broken: refused later)
    if not runs:
        raise UsageError(f"--table {name}: no run in {folder} has a log.jsonl yet")
    return runs


def cmd_curves(args):
    """The training curves of train.py runs (curves.py); the seeds of one row as their mean and a band."""
    png = os.path.join(args.out, "curves.png")
    rows = curves.plot_runs(args.runs, png)
    path = write_json(args.out, "curves", {"note": "per row, the last val values that all its seeds have: their "
                                           "mean, min and max (val_acc a fraction)", "runs": args.runs, "rows": rows})
    for row in rows:
        print(curves.last_values(row))
    print(f"wrote {path}, {png}")


def cluster_start(seed, N=40, D=3, weights="identity", scale=0.3):
    """Tokens uniform in [-1, 1]^D (C.8) and W_0 for Q, K, V: "identity" (Geshkovski et al.'s
    Q = K = V = I, the case in which weight-shared self-attention provably clusters) or "random"
    (I + scale * Gaussian, one draw for each of Q, K, V)."""
    gen = torch.Generator().manual_seed(seed)
    x0 = torch.rand(N, D, generator=gen, dtype=torch.float64) * 2 - 1
    W = [torch.eye(D, dtype=torch.float64) + scale * torch.randn(D, D, generator=gen, dtype=torch.float64)
         for _ in range(3)]
    return x0, [torch.eye(D, dtype=torch.float64)] * 3 if weights == "identity" else W


def growth(degree):
    """g(t) = 1 (constant: weight sharing) for degree 0, else 1 + t^degree."""
    return (lambda t: 1.0) if degree == 0 else (lambda t: 1.0 + t ** degree)


def cmd_cluster(args):
    degrees = [int(d) for d in args.degrees.split(",")]
    x0, (Wq, Wk, Wv) = cluster_start(args.seed, args.tokens, weights=args.weights)
    runs = []
    for deg in degrees:
        traj = simulate_attention_ode(x0, Wq, Wk, Wv, growth(deg), T=args.T, steps=args.steps)
        runs.append({"degree": deg, "g": "1" if deg == 0 else f"1 + t^{deg}",
                     "clusters": cluster_number(traj[-1], args.eps), "spread": spread(traj[-1]),
                     "spread_start": spread(traj[0]), "final": traj[-1].tolist(), "traj": traj})
        with one_thread():
            runs[-1].update(clusters_t=[cluster_number(X, args.eps) for X in traj], spread_t=[spread(X) for X in traj])
    fig = plt.figure(figsize=(4.6 * len(runs), 9.5))
    grid = fig.add_gridspec(2, 2 * len(runs), height_ratios=[3, 2], wspace=0.5)
    ts = np.linspace(0, args.T, args.steps + 1)
    for n, r in enumerate(runs):
        ax = fig.add_subplot(grid[0, 2 * n:2 * n + 2], projection="3d")
        tr = r.pop("traj").numpy()                           # (not in the JSON)
        for i in range(tr.shape[1]):
            ax.plot(tr[:, i, 0], tr[:, i, 1], tr[:, i, 2], lw=0.6, alpha=0.45, color="tab:blue")
        ax.scatter(*tr[0].T, s=12, facecolors="none", edgecolors="gray", label="start")
        ax.scatter(*tr[-1].T, s=22, color="tab:red", label="end")
        ax.set(xlabel="x\u2081", ylabel="x\u2082", zlabel="x\u2083")
        ax.set_title(f"g(t) = {r['g']}\n{r['clusters']} cluster{'s' if r['clusters'] != 1 else ''}, spread {r['spread']:.2f}", fontsize=10)
        if n == 0:
            ax.legend(fontsize=8, loc="upper left")
    axc, axs = fig.add_subplot(grid[1, :len(runs)]), fig.add_subplot(grid[1, len(runs):])
    axc.set(xlabel="time t", ylabel=f"number of clusters (radius {args.eps:g})", title="clusters over time")
    axs.set(xlabel="time t", ylabel="mean distance between tokens",
            title="spread over time (uniform on the sphere: 4/3)")
    for ax, key in ((axc, "clusters_t"), (axs, "spread_t")):
        for n, r in enumerate(runs):
            ax.plot(ts, r[key], color=plt.cm.viridis(n / max(len(runs) - 1, 1)), label=f"g = {r['g']}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"Attention-only ODE, one head, {x0.shape[0]} tokens on the sphere, {args.steps} Euler steps "
                 f"on [0, {args.T:g}], W(t) = g(t) W\u2080 (DiffEqFormer C.8)")
    png = save_fig(fig, args.out, "cluster")
    out = {"tokens": int(x0.shape[0]), "D": 3, "steps": args.steps, "T": args.T, "seed": args.seed, "eps": args.eps,
           "weights": args.weights,
           "note": "clusters: connected components of points closer than eps at the end; spread: mean "
                   "distance between two tokens at the end (uniform on the sphere: 4/3, collapse: 0)", "runs": runs}
    path = write_json(args.out, "cluster", out)
    for r in runs:
        print(f"g(t) = {r['g']:>9}: {r['clusters']:2d} cluster{'s' if r['clusters'] != 1 else ' '}, spread {r['spread']:.3f} (start {r['spread_start']:.3f})")
    print(f"wrote {path}, {png}")


# ==== Command line

# name: (what it computes, the models or files it applies to); --help shows both and the docstring's paragraph
SUBCOMMANDS = {
    "spectra": ("eigenvalues of QK and OV per head against depth (DiffEqFormer fig. 2)",
                "a checkpoint with query, key and value weights: SimpleTRON, softmax or DiffEqFormer (not TransJect)"),
    "lyapunov": ("token-level Lyapunov exponents over a sentence (DiffEqFormer section 5.2)",
                 "DiffEqFormer checkpoints of a language model"),
    "activation": ("activation factor and entropy per layer (TransJect eq. 5, 6)",
                   "checkpoints of any model, several side by side"),
    "experts": ("expert weights and residual weights per layer (TransJect fig. 5, 7)", "TransJect checkpoints"),
    "cluster": ("tokens of an attention-only ODE gathering into clusters (DiffEqFormer C.8)",
                "no model (a simulation of one attention head)"),
    "attnstd": ("attention std per block over training (SimpleTRON fig. 5)",
                "runs of SimpleTRON or softmax trained with train.py --attn_std_interval N"),
    "curves": ("loss and accuracy or perplexity over training; the seeds of a row as their mean and a band",
               "runs of train.py of any model (folders with a log.jsonl)")}
CKPT = {"spectra": "a ckpt.pt of train.py", "lyapunov": "a ckpt.pt of train.py",
        "activation": "a ckpt.pt of train.py (several allowed: side by side)",
        "experts": "a ckpt.pt of train.py (several allowed: one column each)"}
SEEDED = {"activation": "of the val sequences drawn", "experts": "of the val sequences drawn",
          "cluster": "of the tokens' start and of W_0 (--weights random)"}


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """The docstrings as written, and every flag's default where it has one."""

    def _get_help_string(self, action):
        shown = action.default is None or action.default is False or "%(default)" in (action.help or "")
        return action.help if shown or action.default is argparse.SUPPRESS else f"{action.help} [default: %(default)s]"


def subcommand_doc(name):
    """The paragraph of the module docstring that begins with the subcommand's name."""
    found = re.search(rf"^{name} +(.*?)(?=^(?:{'|'.join(SUBCOMMANDS)}) |\Z)", __doc__ or "", re.M | re.S)
    return "\n".join(line.strip() for line in found.group(1).strip().splitlines()) if found else ""


def parse(argv):
    p = Parser(description=__doc__ or "Look inside the models: the papers' analyses.", formatter_class=HelpFormatter)
    sub = p.add_subparsers(dest="command", metavar="SUBCOMMAND", parser_class=Parser)
    s = {}
    for name, (what, models) in SUBCOMMANDS.items():
        s[name] = sub.add_parser(name, help=f"{what}. For: {models}", formatter_class=HelpFormatter,
                                 description=f"{what}.\nFor: {models}.\n\n{subcommand_doc(name)}")
        s[name].add_argument("--out", default="out/analysis", help=f"folder for {name}.json and the plots")
        if name in CKPT:
            s[name].add_argument("--ckpt", action="append", metavar="PATH", help=CKPT[name])
        if name in SEEDED:
            s[name].add_argument("--seed", type=int, default=0, help="random seed " + SEEDED[name])
    s["spectra"].add_argument("--grid", type=int, default=0, help="ODE models: W(t) at this many times t in [0, 1] "
                              "(0: at the model's own Euler steps)")
    s["lyapunov"].add_argument("--text", default="the company said it expects to report a loss for the year",
                               help="the sentence (Penn Treebank words, a ListOps expression, or bytes)")
    s["lyapunov"].add_argument("--position", type=int, default=-1, help="output token drawn (-1: the last)")
    s["lyapunov"].add_argument("--k", type=int, default=8, help="exponents to compute per token pair")
    for name in ("activation", "experts"):
        s[name].add_argument("--n_seq", type=int, default=16, help="sequences of the task's val split")
        s[name].add_argument("--max_len", type=int, default=512, help="cut sequences to this many tokens")
    s["attnstd"].add_argument("--run", action="append", help="a folder of train.py --attn_std_interval N (several: "
                              "a row of panels each)")
    s["cluster"].add_argument("--tokens", type=int, default=40, help="tokens on the sphere")
    s["cluster"].add_argument("--steps", type=int, default=200, help="Euler steps")
    s["cluster"].add_argument("--T", type=float, default=10.0, help="time horizon (step = T / steps)")
    s["cluster"].add_argument("--degrees", default="0,1,2,4", help="g(t) = 1 + t^k for these k (0: constant)")
    s["cluster"].add_argument("--eps", type=float, default=0.05, help="cluster radius on the unit sphere")
    s["cluster"].add_argument("--weights", default="identity", choices=("identity", "random"),
                              help="W_0: identity (Q = K = V = I) or random (I + 0.3 Gaussian)")
    s["curves"].add_argument("runs", nargs="*", metavar="RUN", help="a folder of python train.py ... (its "
                             "out_dir); ROW-s0, ROW-s1, ...: one row, the mean of its seeds")
    s["curves"].add_argument("--table", metavar="NAME", help="every run of python experiments.py NAME (out/exp/NAME/*)")
    args = p.parse_args(argv)
    if args.command is None:
        raise UsageError("give a subcommand: " + ", ".join(SUBCOMMANDS) + " (python analyze.py --help)")
    return args


# How much a subcommand may be asked to do: beyond, it would run for hours or fill the memory (and the estimates
# gain nothing). W(t) at --grid times (an eigenproblem per head each); --n_seq sequences (means over them); cluster:
# --tokens points, the distances between all pairs at each of --steps steps for each degree (1,000 tokens x 100
# steps: about 8 s on a 2-core CPU; fewer than 100 tokens cost as much as 100), g(t) = 1 + t^k below 10^20.
MOST = {"grid": 10_000, "n_seq": 10_000, "tokens": 1_000, "steps": 100_000, "T": 1_000}
MOST_GROWTH, MOST_PAIRS = 20, 5e9  # decimal digits of g; tokens^2 x steps x degrees: some 10 minutes


def check(args):
    """Every flag and input of the subcommand, before any work, each a line naming the flag or file, its value and
    what is allowed. The inputs are read here: args.models, (model, checkpoint) for each --ckpt, with args.batches
    (their task's sequences: activation, experts) or args.tokens (the ids and labels of --text: lyapunov); args.logs
    (attnstd); args.runs (curves, with --table's)."""
    for name, value in vars(args).items():
        check_value(name, value)
        if name in MOST and value > MOST[name]:
            raise UsageError(f"--{name} {value:,}: allowed is at most {MOST[name]:,} (python analyze.py {args.command} "
                             "--help)")
    if data.writable_problem(args.out):
        raise UsageError(f"--out {args.out or repr(args.out)}: {data.writable_problem(args.out)}")
    for path in (os.path.join(args.out, f"{args.command}.{kind}") for kind in ("json", "png")):   # what it writes
        if os.path.lexists(path) and not (os.path.isfile(path) and os.access(path, os.W_OK)):
            raise UsageError(f"--out {args.out}: {path} is there and is no file this command can write over (a "
                             "folder?); move it away or choose another --out")
    if args.command == "activation" and args.max_len < 2:
        raise UsageError(f"--max_len {args.max_len}: the activation factor compares two tokens of a sequence; "
                         "allowed is at least 2")
    if args.command in CKPT:
        check_models(args)
    elif args.command == "cluster":
        degrees = [int(d) for d in args.degrees.split(",")]
        if len(set(degrees)) < len(degrees) or len(degrees) > 8 or any(
                d > 999 or d * math.log10(args.T) >= MOST_GROWTH for d in degrees):
            raise UsageError(f"--degrees {args.degrees} with --T {args.T:g}: allowed are at most 8 different degrees "
                             f"k <= 999, with g(t) = 1 + t^k below 1e{MOST_GROWTH} (one panel each)")
        pairs = max(args.tokens, 100) ** 2 * args.steps * len(degrees)
        if pairs > MOST_PAIRS:
            raise UsageError(f"--tokens {args.tokens:,} x --steps {args.steps:,} x {len(degrees)} --degrees: "
                             f"{pairs:.1e} distances (tokens^2 a step), allowed {MOST_PAIRS:.0e}, some 10 minutes on a "
                             "CPU: fewer tokens, steps or degrees")
    elif args.command == "attnstd":
        if not args.run:
            raise UsageError("attnstd needs --run DIR, a run of train.py --attn_std_interval N (several allowed)")
        if given_twice(args.run):
            raise UsageError(f"attnstd: the run {given_twice(args.run)} is given twice (once is its row of panels)")
        args.logs = [read_attention_std(run) for run in args.run]
    elif args.command == "curves":
        args.runs = list(args.runs) + (table_runs(args.table) if args.table else [])
        if not args.runs:
            raise UsageError("curves needs run folders (python analyze.py curves out/a out/b) or --table NAME")
        if "" in args.runs:
            raise UsageError("curves: a run folder is an empty string; give the folder of a train.py run")
        if given_twice(args.runs):
            raise UsageError(f"curves: the run {given_twice(args.runs)} is given twice (once is its line)")
        for run in args.runs:
            if problem := curves.log_problem(path := os.path.join(run, "log.jsonl")):
                raise UsageError(f"{run}: {path} {problem} (a folder of python train.py ...)")


def given_twice(paths):
    """The first of paths that names a file or folder named before it, or None."""
    return next((p for i, p in enumerate(paths) if os.path.realpath(p) in map(os.path.realpath, paths[:i])), None)


def check_models(args):
    """The checkpoints of spectra, lyapunov, activation and experts, loaded and checked for the subcommand."""
    cmd, paths = args.command, args.ckpt or []
    if not paths or len(paths) > 1 and cmd in ("spectra", "lyapunov"):
        raise UsageError(f"{cmd} takes {'one --ckpt PATH' if cmd in ('spectra', 'lyapunov') else '--ckpt PATH'} "
                         f"({CKPT[cmd]}; python analyze.py {cmd} --help)")
    if given_twice(paths):
        raise UsageError(f"{cmd}: the checkpoint {given_twice(paths)} is given twice (--ckpt once is its column)")
    args.models = [load(path) for path in paths]
    for path, (model, ckpt) in zip(paths, args.models):
        holds = f"{path} holds {ckpt['model_name']}{'' if model.config.head == 'lm' else ' (a classifier)'}"
        if cmd == "spectra" and (lacks := spectra_lacks(model)):
            raise UsageError(f"spectra reads each block's attn.qkv (W_Q, W_K, W_V) and attn.out (W_O; nn.Identity: "
                             f"none), or an ODE model's attention_weights(t) and times(); {holds}, which has no "
                             f"{lacks} (TransJect: X U Sigma V, no W_Q W_K^T; a new model: name its maps so)")
        if cmd == "spectra" and args.grid and not (ode_model(model) and not getattr(model.config, "discrete", False)):
            raise UsageError(f"--grid is for an ODE model (DiffEqFormer, not discretised): W(t) at any t; {holds}")
        if cmd == "lyapunov" and not (ode_model(model) and model.config.head == "lm"):
            raise UsageError(f"lyapunov needs a DiffEqFormer checkpoint of a language model (an ODE in depth); {holds}")
        if cmd == "experts" and not (hasattr(model, "expert_weights") and hasattr(model, "residual_weights")):
            raise UsageError(f"experts needs a TransJect checkpoint; {holds}")
    if cmd == "lyapunov":
        args.tokens = encode_text(args.text, args.models[0][1])
        N = args.tokens[0].shape[1]
        if not -N <= args.position < N:
            raise UsageError(f"--position {args.position}: --text gives {N} tokens, so allowed is {-N} to {N - 1}")
        if args.k > args.models[0][0].config.n_embd:        # (a token's state has n_embd directions)
            raise UsageError(f"--k {args.k}: allowed is at most the width, n_embd {args.models[0][0].config.n_embd}")
    if cmd in ("activation", "experts"):
        args.batches = [sample_batch(ckpt, args.n_seq, args.max_len, args.seed) for _, ckpt in args.models]


COMMANDS = {"spectra": cmd_spectra, "lyapunov": cmd_lyapunov, "activation": cmd_activation,
            "experts": cmd_experts, "cluster": cmd_cluster, "attnstd": cmd_attnstd, "curves": cmd_curves}


def main(argv=None):
    args = parse(sys.argv[1:] if argv is None else argv)
    check(args)
    os.makedirs(args.out, exist_ok=True)
    return COMMANDS[args.command](args)


if __name__ == "__main__":
    data.run_main(main, UsageError)
