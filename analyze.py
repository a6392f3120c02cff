"""
Look inside the models: the papers' analyses, and a speed and memory benchmark.

    python analyze.py spectra    --ckpt out/x/ckpt.pt --out out/analysis   # QK and OV eigenvalues vs depth
    python analyze.py lyapunov   --ckpt out/x/ckpt.pt --out out/analysis --text "the company said it"
    python analyze.py activation --ckpt a/ckpt.pt --ckpt b/ckpt.pt --out out/analysis   # TransJect eq. 5-6
    python analyze.py experts    --ckpt out/transject/ckpt.pt --out out/analysis         # TransJect fig. 5, 7
    python analyze.py cluster    --out out/analysis                                     # DiffEqFormer C.8
    python analyze.py attnstd    --run out/a --run out/b --out out/analysis  # SimpleTRON fig. 5 (train.py --attn_std_interval)
    python analyze.py speed      --out out/analysis --lengths 1024,4096 [--nanogpt /tmp/nanogpt/model.py]
    python analyze.py speed      --out out/generate --lengths '' --generate --contexts 256,1024,4096

Each subcommand writes OUT/SUBCOMMAND.json, at least one OUT/SUBCOMMAND*.png and prints a summary.
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
speed      training step (forward, backward, gradient clipping, AdamW) and inference forward of each model at
           each length, measured in interleaved rounds (medians; ratios as medians of per-round ratios); peak
           memory, tokens/s, FLOPs (torch.utils.flop_counter) and FLOP/s; our GPT beside nanoGPT's model.py
           at nanoGPT's CPU configuration (--nanogpt PATH, a file outside this project). --models may also
           name an attention function alone (simple_attention, causal_simple_attention, softmax_attention). On a shared CPU,
           --threads 1 --clock cpu measures CPU time, which other programs disturb far less than wall time.
           --generate adds generation: milliseconds per new token after a prompt of each --contexts length
           (model.prefill, untimed, then --new_tokens model.decode steps, timed), and the size of the state the
           model keeps (SimpleTRON, TransJect: fixed; softmax GPT, DiffEqFormer: the KV cache). With --lengths ''
           generation alone.
           --checkpointing adds each model's training step with Config.checkpointing (every block recomputed in
           the backward pass): its peak memory and time beside the plain step's, and the loss and gradient
           differences between the two (zero: recomputation repeats the same operations).
"""

import argparse
import contextlib
import ctypes
import dataclasses
import gc
import importlib.util
import json
import math
import os
import platform
import statistics
import sys
import time
import types

import numpy as np
import torch
import torch.nn as nn

import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

import data    # noqa: E402
import train   # noqa: E402

ROOT = os.path.dirname(os.path.abspath(__file__))


class UsageError(Exception):
    """Bad input: main() prints the message as one line and exits with status 2."""


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


# ==============================================================================================
# The mathematics. Plain functions of tensors, each checked by tests/test_analyze.py.

def head_spectra(Wq, Wk, Wv, Wo, n_head):
    """Eigenvalues of QK_h = W_Q^h (W_K^h)^T and OV_h = W_V^h W_O^h for every head h.

    Wq, Wk, Wv: (D, D) in the row convention (q = x Wq); head h owns columns h*d:(h+1)*d.
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
    N = trajectory[0].shape[0]
    outputs = list(range(N)) if outputs is None else list(outputs)

    def blocks():
        for X, t in zip(trajectory, times):
            with torch.enable_grad():
                J = token_jacobians(f, X.detach(), t)        # (N, D, N, D)
            yield J[outputs].permute(0, 2, 1, 3)             # (len(outputs), N, D, D): [j, i] = J_ji
    return lyapunov_spectrum(blocks(), dt, k).sort(dim=-1, descending=True).values


def activation_factor(X0, Xl, mask=None):
    """TransJect eq. 5 for each sequence: E_{i != j} |X_i^l - X_j^l| / |X_i^0 - X_j^0|.
    X0, Xl: (B, N, D); mask: (B, N) real tokens or None. Pairs with X_i^0 = X_j^0 are left out.
    Returns (B,) float64."""
    X0, Xl = X0.double(), Xl.double()
    d0, dl = torch.cdist(X0, X0), torch.cdist(Xl, Xl)       # (B, N, N)
    N = X0.shape[1]
    pair = ~torch.eye(N, dtype=torch.bool, device=X0.device)[None]
    if mask is not None:
        pair = pair & mask[:, :, None] & mask[:, None, :]
    pair = pair & (d0 > 0)
    ratio = torch.where(pair, dl / torch.where(pair, d0, 1.0), 0.0)   # no 0/0 in the pairs left out
    return ratio.sum((1, 2)) / pair.sum((1, 2)).clamp_min(1)


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


# ==============================================================================================
# Checkpoints, models and their insides

def load(path, device="cpu"):
    """(model, checkpoint) of a train.py checkpoint, in eval mode."""
    if path is None:
        raise UsageError("this subcommand needs --ckpt PATH (a ckpt.pt written by train.py)")
    ckpt = train.load_checkpoint(path)                      # train.UsageError if missing or unreadable
    if not isinstance(ckpt, dict) or not {"model_name", "config", "model"} <= set(ckpt):
        raise UsageError(f"{path} is not a train.py checkpoint (no model_name, config, model)")
    model = train.build_model(ckpt["model_name"], ckpt["config"])
    try:
        model.load_state_dict(ckpt["model"])
    except RuntimeError as e:
        raise UsageError(f"{path}: the weights do not fit the model ({str(e).splitlines()[0]})") from None
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
        times = model_times(model) if times is None else times
        for t in times:
            W = model.attention_weights(float(t))
            out.append((float(t), W["q"], W["k"], W["v"], W.get("o")))
        return out
    blocks = getattr(model, "blocks", None)
    if blocks is None or not all(hasattr(getattr(b, "attn", None), "qkv") for b in blocks):
        raise UsageError(f"spectra needs query/key/value weights; {type(model).__module__} has none "
                         "(TransJect's attention X U Sigma V has no W_Q W_K^T)")
    for layer, block in enumerate(blocks, 1):
        W = block.attn.qkv.weight.detach()                   # (3D, D) = [Wq^T; Wk^T; Wv^T]
        out_map = block.attn.out
        Wo = out_map.weight.detach().T if isinstance(out_map, nn.Linear) else None
        out.append((layer, W[:D].T, W[D:2 * D].T, W[2 * D:].T, Wo))
    return out


def model_times(model):
    """The times t at which the ODE model evaluates its vector field (one per Euler step)."""
    return [float(t) for t in model.times()]


def layer_states(model, idx):
    """Hidden states of every layer: ([X^0, X^1, ..., X^L] each (B', N, D), mask (B', N) or None).
    X^0 is what enters the first layer (embeddings), X^l what leaves layer l (DiffEqFormer: the state after
    Euler step l). A model may provide hidden_states(idx) -> (list, mask); otherwise its `blocks` are hooked."""
    if hasattr(model, "hidden_states"):
        states, mask = model.hidden_states(idx)
        return list(states), mask
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
            model(idx)
    finally:
        for h in handles:
            h.remove()
    mask = masks[0] if masks else None
    if mask is not None and mask.dtype != torch.bool:
        mask = mask != 0
    return states, mask


def task_of(ckpt):
    a = ckpt.get("args", {})
    kw = dict(cache_dir=a.get("cache_dir", "data"), data_dir=a.get("data_dir"), seed=a.get("seed", 0),
              tokenizer=a.get("tokenizer", "gpt2"))
    if "block_size" in ckpt["config"]:
        kw["block_size"] = ckpt["config"]["block_size"]
    return data.load_task(a.get("task", "listops"), **kw)


def sample_batch(ckpt, n_seq, max_len, seed=0):
    """n_seq examples of the checkpoint's task (val split, else test, else train), cut to max_len tokens."""
    task = task_of(ckpt)
    name = next((s for s in ("val", "test", "train") if task.has(s)), None)
    if name is None:
        raise UsageError(f"task {task.name} has no data to analyse")
    x, _ = task.split(name).sample(n_seq, np.random.default_rng(seed))
    return x[..., :max_len]


def encode_text(text, ckpt):
    """Token ids (1, N) and their labels for a sentence, with the checkpoint's task: Penn Treebank words
    (unknown words -> <unk>), ListOps symbols, or bytes (id = byte + 1) for anything else."""
    a, cfg = ckpt.get("args", {}), ckpt["config"]
    task = a.get("task")
    if task == "ptb":
        if not a.get("data_dir"):
            raise UsageError("the checkpoint's PTB run has no data_dir; its vocabulary cannot be rebuilt")
        words = data.read_words(data.ptb_files(a["data_dir"])["train"])
        vocab = {w: i for i, w in enumerate(sorted(set(words)), start=1)}   # as data.ptb builds it
        labels = text.lower().split()
        ids = [vocab.get(w, vocab.get("<unk>")) for w in labels]
    elif task == "listops":
        try:
            ids = data.listops_tokens(text).tolist()
        except ValueError as e:
            raise UsageError(f"--text is not a ListOps expression ({e})") from None
        labels = [data.LISTOPS_VOCAB[i] for i in ids]
    else:
        raw = text.encode()
        if cfg["vocab_size"] < 257:
            raise UsageError(f"task {task!r}: no tokenizer here for --text, and the vocabulary is too small for bytes")
        ids, labels = [b + 1 for b in raw], [chr(b) if 32 <= b < 127 else f"\\x{b:02x}" for b in raw]
    if not ids:
        raise UsageError("--text is empty")
    ids = ids[-cfg["block_size"]:]
    return torch.tensor([ids]), labels[-len(ids):]


# ==============================================================================================
# Output helpers

def write_json(out, name, obj):
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, f"{name}.json")
    data.atomic_write_text(path, json.dumps(obj, indent=1, default=float) + "\n")
    return path


def save_fig(fig, out, name):
    path = os.path.join(out, f"{name}.png")
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def label_of(path, ckpt):
    return f"{ckpt['model_name']} ({os.path.basename(os.path.dirname(os.path.abspath(path)))})"


def cx(z):
    return [[float(v.real), float(v.imag)] for v in np.ravel(z)]


# ==============================================================================================
# Subcommands

def cmd_spectra(args):
    model, ckpt = load(args.ckpt[0] if args.ckpt else None)
    H = model.config.n_head
    times = None
    if args.grid and not (ode_model(model) and not getattr(model.config, "discrete", False)):
        raise UsageError("--grid is for an ODE model (DiffEqFormer, not discretised): W(t) at any t")
    if args.grid:
        times = np.linspace(0.0, 1.0, args.grid).tolist()
    rows = []
    for depth, Wq, Wk, Wv, Wo in attention_weights(model, times):
        qk, ov = head_spectra(Wq, Wk, Wv, Wo, H)
        rows.append({"depth": depth, "qk": [cx(e) for e in qk], "ov": [cx(e) for e in ov]})
    ode = ode_model(model)
    axis = "depth t (ODE time)" if ode else "layer"
    fig, axes = plt.subplots(2, 2, figsize=(12, 8), sharex=True)
    colors = plt.cm.tab10(np.arange(H) % 10)
    width = (rows[-1]["depth"] - rows[0]["depth"]) / max(len(rows) - 1, 1)
    for col, key, title in ((0, "qk", "QK = W_Q^h W_K^h\u1d40"), (1, "ov", "OV = W_V^h W_O^h")):
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
        ax.set_title(f"{title}: eigenvalues (real part)")
        ax.set_ylabel("Re(eigenvalue)")
        axm.set_title(f"{key.upper()}: largest |eigenvalue| per head")
        axm.set_ylabel("max |eigenvalue|")
        axm.set_xlabel(axis)
        ax.legend(fontsize=7, ncol=2)
        if ode:
            axm.set_xlim(-0.03, 1.03)
        if not ode:
            axm.set_xticks([r["depth"] for r in rows])
        elif args.grid:                                      # where the trained solver evaluates W(t)
            for a in (ax, axm):
                for t in model_times(model):
                    a.axvline(t, color="gray", ls=":", lw=0.8)
    grid_note = "\n(dotted: the times t at which the model's solver evaluates W(t); between them W(t) was never trained)" \
        if ode and args.grid else ""
    fig.suptitle(f"Spectra of the attention weights per head vs {axis}: {label_of(args.ckpt[0], ckpt)}{grid_note}")
    png = save_fig(fig, args.out, "spectra")
    out = {"ckpt": args.ckpt[0], "model": ckpt["model_name"], "axis": axis, "n_head": H,
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
    model, ckpt = load(args.ckpt[0] if args.ckpt else None)
    if not ode_model(model):
        raise UsageError(f"lyapunov needs a DiffEqFormer checkpoint (a model that is an ODE in depth); "
                         f"{args.ckpt[0]} holds {ckpt['model_name']}")
    if model.config.head != "lm":
        raise UsageError("lyapunov reads the next-token sensitivity of a language model (head lm)")
    idx, labels = encode_text(args.text, ckpt)
    N = idx.shape[1]
    with torch.no_grad():
        traj = model.trajectory(idx)                         # states where the Euler steps evaluate f
    times, dt = model_times(model), model.dt()
    X = [s[0].double() for s in traj[:len(times)]]
    model.double()

    def f(Z, t):
        return model.vector_field(Z[None], t)[0]
    k = min(args.k, model.config.n_embd)
    lam = token_lyapunov(f, X, times, dt, k=k)               # (N out, N in, k)
    model.float()
    causal = torch.ones(N, N, dtype=torch.bool).tril()       # output j sees inputs i <= j
    top = lam[..., 0].masked_fill(~causal, float("nan")).numpy()
    j = args.position % N
    off = top[np.tril_indices(N, -1)]
    vmax = float(np.nanmax(off)) if off.size else None      # the diagonal (i = j) is far larger: it saturates
    fig, axes = plt.subplots(2, 1, figsize=(max(8, 0.45 * N + 3), 11), gridspec_kw={"height_ratios": [3, 2]})
    im = axes[0].imshow(top, cmap="magma", vmax=vmax)
    axes[0].set_xticks(range(N), labels, rotation=60, ha="right", fontsize=8)
    axes[0].set_yticks(range(N), labels, fontsize=8)
    axes[0].set_xlabel("input token i (perturbed)")
    axes[0].set_ylabel("output token j")
    axes[0].set_title("largest token-level Lyapunov exponent \u03bb\u2081(j, i); colours scaled to i < j "
                      "(the diagonal i = j is larger and saturates)", fontsize=10)
    fig.colorbar(im, ax=axes[0], label="\u03bb\u2081")
    ax = axes[1]
    if j > 0:
        vals = top[j, :j]
        ax.bar(range(j), vals, color=plt.cm.magma(0.15 + 0.7 * (vals - vals.min()) / max(np.ptp(vals), 1e-12)))
        ax.set_xticks(range(j), labels[:j], rotation=60, ha="right", fontsize=8)
    ax.axhline(0, color="gray", lw=0.6)
    ax.set_xlabel("input token i")
    ax.set_ylabel("\u03bb\u2081(j, i)")
    ax.set_title(f"sensitivity of output token j = {j} ({labels[j]!r}, which predicts the next word) to each "
                 f"earlier token; to itself: \u03bb\u2081 = {top[j, j]:.3f}", fontsize=10)
    fig.tight_layout()
    png = save_fig(fig, args.out, "lyapunov")
    out = {"ckpt": args.ckpt[0], "text": args.text, "tokens": labels, "output_position": j,
           "steps": len(times), "dt": dt, "k": k,
           "largest": [[None if math.isnan(v) else float(v) for v in row] for row in top],
           "exponents_of_output": lam[j, :j + 1].tolist()}
    path = write_json(args.out, "lyapunov", out)
    order = np.argsort(-top[j, :j])
    print(f"output token {j} ({labels[j]!r}): largest exponent to itself {top[j, j]:.3f}; among earlier tokens "
          "most sensitive to " + ", ".join(f"{labels[i]!r} ({top[j, i]:.3f})" for i in order[:5]))
    print(f"wrote {path}, {png}")


def cmd_activation(args):
    if not args.ckpt:
        raise UsageError("activation needs at least one --ckpt PATH")
    results = []
    for path in args.ckpt:
        model, ckpt = load(path)
        x = sample_batch(ckpt, args.n_seq, args.max_len, args.seed)
        states, mask = layer_states(model, x)
        X0 = states[0]
        m = mask if mask is not None else torch.ones(X0.shape[:2], dtype=torch.bool)
        act, ent = [], []
        for Xl in states:
            act.append(activation_factor(X0, Xl, mask).tolist())
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
            ax.plot([], [], color=color, lw=6, label=r["label"])
        L = max(len(r[key]) for r in results)
        ax.set_xticks(range(L), [str(l) for l in range(L)])
        ax.set_xlabel("layer l (0 = embeddings)")
        ax.set_ylabel(ylabel)
        ax.legend(fontsize=8)
    axes[0].axhline(1.0, color="gray", lw=0.6, ls="--")
    axes[0].set_yscale("log")
    axes[0].set_title("distance between tokens at layer l over that at the input")
    axes[1].set_title("entropy of each token's coordinates, averaged over the sequence")
    fig.suptitle(f"Activation factor (TransJect eq. 5) and entropy (eq. 6) per layer ({args.n_seq} sequences each)")
    png = save_fig(fig, args.out, "activation")
    path = write_json(args.out, "activation", {"note": "one value per sequence and layer; layer 0 is the "
                                               "input to the first layer", "models": results})
    for r in results:
        print(f"{r['label']}: median activation factor per layer " +
              " ".join(f"{np.median(a):.3g}" for a in r["activation_factor"]) +
              " | entropy " + " ".join(f"{np.median(e):.3g}" for e in r["entropy"]))
    print(f"wrote {path}, {png}")


def cmd_experts(args):
    if not args.ckpt:
        raise UsageError("experts needs --ckpt PATH of a TransJect checkpoint (several allowed)")
    results = []
    for path in args.ckpt:
        model, ckpt = load(path)
        if not hasattr(model, "expert_weights") or not hasattr(model, "residual_weights"):
            raise UsageError(f"experts needs a TransJect checkpoint; {path} holds {ckpt['model_name']}")
        x = sample_batch(ckpt, args.n_seq, args.max_len, args.seed)
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
        ax.set_xlabel("expert weight \u03bb_e (softmax over the experts)")
        ax.set_ylabel(f"count ({r['n_weight_vectors']} weight vectors x {E} experts)")
        ax.set_title(f"{r['label']}, {r['task']}: expert weights (paper fig. 7)", fontsize=10)
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
        for l, w in enumerate(r["expert_weights"]):
            w = np.array(w)
            print(f"  layer {l + 1}: mean expert weights " + " ".join(f"{v:.3f}" for v in w.mean(0)) +
                  f" (min {w.min():.3f}, max {w.max():.3f}); residual weight "
                  f"{list(r['residual_weights'].values())[l]:.4f}")
    print(f"wrote {path}, {png}")


def read_attention_std(run):
    """The attention-std records that train.py --attn_std_interval wrote into RUN/log.jsonl, and the run's label."""
    path = os.path.join(run, "log.jsonl")
    problem = data.file_problem(path)
    if problem:
        raise UsageError(f"--run {run}: {path} {problem} (a folder of python train.py ... --attn_std_interval N)")
    records = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            try:
                r = json.loads(line)
            except ValueError:
                raise UsageError(f"{path}, line {n}: not JSON; is this a train.py log?") from None
            if "score_std" in r:
                records.append(r)
    if not records:
        raise UsageError(f"--run {run}: its log.jsonl has no attention std; train it with --attn_std_interval N")
    label = os.path.basename(os.path.abspath(run))
    meta = os.path.join(run, "metrics.json")
    if not data.file_problem(meta):
        with open(meta) as f:
            m = json.load(f)
        acc = m.get("test_acc")
        label += f" (test acc {100 * acc:.1f}%)" if isinstance(acc, (int, float)) else ""
    return records, label


def cmd_attnstd(args):
    """SimpleTRON's Fig. 5: the standard deviation of each block's attention weights (Q K^T / sqrt(n) for
    SimpleTRON, Q K^T / sqrt(d) for softmax without the softmax) and of its attention output, over training."""
    if not args.run:
        raise UsageError("attnstd needs --run DIR, a run of train.py --attn_std_interval N (several allowed)")
    runs = [(run, *read_attention_std(run)) for run in args.run]
    fig, axes = plt.subplots(len(runs), 2, figsize=(12, 3.2 * len(runs) + 0.6), squeeze=False, sharex=True)
    results = []
    for row, (run, records, label) in enumerate(runs):
        steps = [r["step"] for r in records]
        n_block = len(records[0]["score_std"])
        colors = plt.cm.viridis(np.linspace(0, 0.9, n_block))
        for col, key, title in ((0, "score_std", "std of the attention weights"),
                                (1, "attn_std", "std of the attention output")):
            ax = axes[row, col]
            for l in range(n_block):
                ax.plot(steps, [r[key][l] for r in records], color=colors[l], lw=1.5, label=f"block {l + 1}")
            ax.set_yscale("log")
            ax.set_title(f"{label}: {title}", fontsize=9)
            ax.grid(True, alpha=0.3)
            if row == len(runs) - 1:
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


def cluster_start(seed, N=40, D=3, weights="identity", scale=0.3):
    """Tokens uniform in [-1, 1]^D (C.8) and W_0 for Q, K, V: "identity" (Geshkovski et al.'s
    Q = K = V = I, the case in which weight-shared self-attention provably clusters) or "random"
    (I + scale * Gaussian, one draw for each of Q, K, V)."""
    gen = torch.Generator().manual_seed(seed)
    x0 = torch.rand(N, D, generator=gen, dtype=torch.float64) * 2 - 1
    W = [torch.eye(D, dtype=torch.float64) + scale * torch.randn(D, D, generator=gen, dtype=torch.float64)
         for _ in range(3)]
    if weights == "identity":
        W = [torch.eye(D, dtype=torch.float64)] * 3
    return x0, W


def growth(degree):
    """g(t) = 1 (constant: weight sharing) for degree 0, else 1 + t^degree."""
    return (lambda t: 1.0) if degree == 0 else (lambda t: 1.0 + t ** degree)


def cmd_cluster(args):
    if args.tokens < 2 or args.steps < 1 or args.T <= 0:
        raise UsageError("cluster needs --tokens >= 2, --steps >= 1 and --T > 0")
    try:
        degrees = [int(d) for d in args.degrees.split(",")]
    except ValueError:
        raise UsageError(f"--degrees takes integers separated by commas, not {args.degrees!r}") from None
    if args.weights not in ("identity", "random"):
        raise UsageError("--weights is identity or random")
    x0, (Wq, Wk, Wv) = cluster_start(args.seed, args.tokens, weights=args.weights)
    runs = []
    for deg in degrees:
        traj = simulate_attention_ode(x0, Wq, Wk, Wv, growth(deg), T=args.T, steps=args.steps)
        runs.append({"degree": deg, "g": "1" if deg == 0 else f"1 + t^{deg}",
                     "clusters": cluster_number(traj[-1], args.eps), "spread": spread(traj[-1]),
                     "spread_start": spread(traj[0]),
                     "final": traj[-1].tolist(), "traj": traj})
        with one_thread():
            runs[-1].update(clusters_t=[cluster_number(X, args.eps) for X in traj], spread_t=[spread(X) for X in traj])
    fig = plt.figure(figsize=(4.6 * len(runs), 9.5))
    grid = fig.add_gridspec(2, 2 * len(runs), height_ratios=[3, 2], wspace=0.5)
    ts = np.linspace(0, args.T, args.steps + 1)
    for n, r in enumerate(runs):
        ax = fig.add_subplot(grid[0, 2 * n:2 * n + 2], projection="3d")
        tr = r["traj"].numpy()
        for i in range(tr.shape[1]):
            ax.plot(tr[:, i, 0], tr[:, i, 1], tr[:, i, 2], lw=0.6, alpha=0.45, color="tab:blue")
        ax.scatter(*tr[0].T, s=12, facecolors="none", edgecolors="gray", label="start")
        ax.scatter(*tr[-1].T, s=22, color="tab:red", label="end")
        ax.set_xlabel("x\u2081")
        ax.set_ylabel("x\u2082")
        ax.set_zlabel("x\u2083")
        ax.set_title(f"g(t) = {r['g']}\n{r['clusters']} cluster{'s' if r['clusters'] != 1 else ''}, spread {r['spread']:.2f}", fontsize=10)
        if n == 0:
            ax.legend(fontsize=8, loc="upper left")
    half = len(runs)
    axc = fig.add_subplot(grid[1, :half])
    axs = fig.add_subplot(grid[1, half:])
    for n, r in enumerate(runs):
        axc.plot(ts, r["clusters_t"], color=plt.cm.viridis(n / max(len(runs) - 1, 1)), label=f"g = {r['g']}")
        axs.plot(ts, r["spread_t"], color=plt.cm.viridis(n / max(len(runs) - 1, 1)), label=f"g = {r['g']}")
    axc.set_xlabel("time t")
    axc.set_ylabel(f"number of clusters (radius {args.eps:g})")
    axc.set_title("clusters over time")
    axs.set_xlabel("time t")
    axs.set_ylabel("mean distance between tokens")
    axs.set_title("spread over time (uniform on the sphere: 4/3)")
    for ax in (axc, axs):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"Attention-only ODE, one head, {x0.shape[0]} tokens on the sphere, {args.steps} Euler steps "
                 f"on [0, {args.T:g}], W(t) = g(t) W\u2080 (DiffEqFormer C.8)")
    png = save_fig(fig, args.out, "cluster")
    for r in runs:
        r["traj"] = None
        del r["traj"]
    out = {"tokens": int(x0.shape[0]), "D": 3, "steps": args.steps, "T": args.T, "seed": args.seed, "eps": args.eps,
           "weights": args.weights,
           "note": "clusters: connected components of points closer than eps at the end; spread: mean "
                   "distance between two tokens at the end (uniform on the sphere: 4/3, collapse: 0)",
           "runs": runs}
    path = write_json(args.out, "cluster", out)
    for r in runs:
        print(f"g(t) = {r['g']:>9}: {r['clusters']:2d} cluster{'s' if r['clusters'] != 1 else ' '}, spread {r['spread']:.3f} (start {r['spread_start']:.3f})")
    print(f"wrote {path}, {png}")


# ----------------------------------------------------------------------------------------------
# speed

_LIBC = None


def _libc():
    global _LIBC
    if _LIBC is None:
        try:
            _LIBC = ctypes.CDLL("libc.so.6")
        except OSError:
            _LIBC = False
    return _LIBC


def _rss_mb(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return float("nan")


def peak_memory(fn, device):
    """MiB that fn() needs at its peak above what was in use just before it.
    CUDA: torch.cuda.max_memory_allocated (tensors). CPU (Linux): the peak resident set size of the process
    (VmHWM, reset through /proc/self/clear_refs) minus the resident size before, after handing freed heap
    memory back to the system (malloc_trim) so that a reused allocation counts when it is touched again."""
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        fn()
        torch.cuda.synchronize()
        return (torch.cuda.max_memory_allocated() - base) / 2 ** 20
    gc.collect()
    libc = _libc()
    if libc:
        libc.malloc_trim(0)
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        base = _rss_mb("VmRSS")
        fn()
        return _rss_mb("VmHWM") - base
    except OSError:
        return float("nan")                                 # not Linux: no cheap peak RSS


def _sdpa_flops(q, k, v, dropout_p=0.0, is_causal=False, *args, **kwargs):
    from torch.utils.flop_counter import sdpa_flop_count
    f = sdpa_flop_count(q.shape, k.shape, v.shape)
    return f * (q.shape[-2] + 1) / (2 * q.shape[-2]) if is_causal else f


def _sdpa_backward_flops(grad_out, q, k, v, out, logsumexp, dropout_p, is_causal=False, *args, **kwargs):
    from torch.utils.flop_counter import sdpa_backward_flop_count
    f = sdpa_backward_flop_count(grad_out.shape, q.shape, k.shape, v.shape)
    return f * (q.shape[-2] + 1) / (2 * q.shape[-2]) if is_causal else f


def count_flops(fn):
    """Floating-point operations of fn() by torch.utils.flop_counter (matrix products and attention; the
    CPU attention kernel is registered here, a causal one counted for the half it computes)."""
    from torch.utils.flop_counter import FlopCounterMode
    aten = torch.ops.aten
    custom = {}
    if hasattr(aten, "_scaled_dot_product_flash_attention_for_cpu"):
        def fwd(*a, out_val=None, **kw):
            return _sdpa_flops(*a, **kw)

        def bwd(*a, out_val=None, **kw):
            return _sdpa_backward_flops(*a, **kw)
        fwd._get_raw = bwd._get_raw = True
        custom = {aten._scaled_dot_product_flash_attention_for_cpu: fwd,
                  aten._scaled_dot_product_flash_attention_for_cpu_backward: bwd}
    with FlopCounterMode(display=False, custom_mapping=custom) as counter:
        fn()
    return counter.get_total_flops()


# the models of train.py, and the softmax Transformer with its attention scores written out (TransJect's Table 4)
SPEED_MODELS = {**train.MODELS, "softmax_naive": ("simpletron", {"attention": "softmax_naive", "variant": "vanilla"})}


def speed_model(name, length, args, **extra):
    """The model `name` of SPEED_MODELS with the benchmark's shape (fields a model lacks are left out)."""
    fields = {f.name for f in dataclasses.fields(train.model_module(SPEED_MODELS[name][0]).Config)}
    cfg = dict(SPEED_MODELS[name][1], vocab_size=args.vocab, block_size=length, n_layer=args.n_layer, n_head=args.n_head,
               n_embd=args.n_embd, dropout=0.0, bias=True, head=args.head, n_classes=10, **extra)
    if args.time_dim:
        cfg["time_dim"] = args.time_dim
    if name == "softmax_naive":
        return train.model_module("simpletron").Model(train.model_module("simpletron").Config(
            **{k: v for k, v in cfg.items() if k in fields}))
    return train.build_model(name, {k: v for k, v in cfg.items() if k in fields})


# --models may also name one attention alone (simpletron.py's functions): q, k, v (batch, n_head, length, d)
ATTENTION = {"simple_attention": lambda m, q, k, v, mask: m.simple_attention(q, k, v, mask),
             "causal_simple_attention": lambda m, q, k, v, mask: m.causal_simple_attention(q, k, v),
             "softmax_attention": lambda m, q, k, v, mask: m.softmax_attention(q, k, v, mask, causal=False)}


def attention_steps(name, batch, length, args, device):
    """(train_step, infer_step) of one attention function alone: forward + backward, forward."""
    module = train.model_module("simpletron")
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(batch, args.n_head, length, args.n_embd // args.n_head, generator=g).to(device)
               .requires_grad_() for _ in range(3))
    mask = torch.ones(batch, length, dtype=torch.bool, device=device)

    def train_step():
        ATTENTION[name](module, q, k, v, mask).sum().backward()
        q.grad = k.grad = v.grad = None

    def infer_step():
        with torch.no_grad():
            ATTENTION[name](module, q, k, v, mask)
    return {"train": train_step, "infer": infer_step, "flops_train": train_step}


def make_steps(model, batch, length, vocab, head, device):
    """(train_step, infer_step) closures on a fixed random batch."""
    g = torch.Generator().manual_seed(0)
    x = torch.randint(1, vocab, (batch, length), generator=g).to(device)
    y = (torch.randint(0, vocab, (batch, length), generator=g) if head == "lm"
         else torch.randint(0, 10, (batch,), generator=g)).to(device)
    # train.py's AdamW (decay on matrices and embeddings only: nanoGPT's groups too), nanoGPT's CPU betas
    opt = train.make_optimizer(model, types.SimpleNamespace(weight_decay=0.1, lr=1e-3, beta1=0.9, beta2=0.99,
                                                            eps=1e-8, gate_lr_scale=30.0), device)

    def train_step():
        model.train()
        _, loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    def infer_step():
        model.eval()
        with torch.no_grad():
            model(x)

    def forward_backward():                                  # what the FLOP counter sees of a train step
        model.train()
        _, loss = model(x, y)
        loss.backward()
        opt.zero_grad(set_to_none=True)
    return {"train": train_step, "infer": infer_step, "flops_train": forward_backward}


def checkpointing_difference(model, recomputing, batch, length, vocab, head, device):
    """Largest |difference| of the loss and of any gradient between a model and its copy with checkpointing."""
    g = torch.Generator().manual_seed(1)
    x = torch.randint(1, vocab, (batch, length), generator=g).to(device)
    y = (torch.randint(0, vocab, (batch, length), generator=g) if head == "lm"
         else torch.randint(0, 10, (batch,), generator=g)).to(device)
    losses, grads = [], []
    for m in (model, recomputing):
        m.train()
        _, loss = m(x, y)
        loss.backward()
        losses.append(loss.item())
        grads.append([p.grad.clone() for p in m.parameters() if p.grad is not None])
        m.zero_grad(set_to_none=True)
    return abs(losses[0] - losses[1]), max((a - b).abs().max().item() for a, b in zip(*grads, strict=True))


def timed(fn, device, n=1, clock="wall"):
    """Milliseconds per call of fn, over n calls. clock "wall": elapsed time (CUDA: synchronised);
    "cpu": CPU time of this process (with one thread: the time on a core of its own, whatever else runs)."""
    now = time.process_time if clock == "cpu" else time.perf_counter
    if device == "cuda":
        torch.cuda.synchronize()
    t0 = now()
    for _ in range(n):
        fn()
    if device == "cuda":
        torch.cuda.synchronize()
    return (now() - t0) * 1000 / n


def load_nanogpt(path):
    """nanoGPT's model.py, imported from a path outside this project (never copied into it)."""
    path = os.path.abspath(path)
    if not os.path.isfile(path):
        raise UsageError(f"--nanogpt {path}: no such file (bring karpathy/nanoGPT's model.py beside the project)")
    if os.path.commonpath([path, ROOT]) == ROOT:
        raise UsageError("--nanogpt: keep nanoGPT's model.py outside this project (e.g. /tmp/nanogpt/model.py)")
    spec = importlib.util.spec_from_file_location("nanogpt_model", path)
    mod = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(mod)
    except Exception as e:
        raise UsageError(f"--nanogpt {path} does not import ({type(e).__name__}: {e})") from None
    if not hasattr(mod, "GPT") or not hasattr(mod, "GPTConfig"):
        raise UsageError(f"--nanogpt {path} has no GPT and GPTConfig: is it nanoGPT's model.py?")
    return mod


# nanoGPT's README CPU run (shakespeare_char; bias False is its train.py's default)
NANOGPT_CPU = dict(n_layer=4, n_head=4, n_embd=128, block_size=64, batch=12, vocab=65, bias=False)


def cmd_speed(args):
    device = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    models = [m.strip() for m in args.models.split(",") if m.strip()] if not args.compare_only else []
    for m in models:
        if m not in SPEED_MODELS and m not in ATTENTION:
            raise UsageError(f"unknown model {m!r} in --models; choose from {', '.join([*SPEED_MODELS, *ATTENTION])}")
        train.model_module(SPEED_MODELS[m][0] if m in SPEED_MODELS else "simpletron")  # UsageError if absent
    try:
        lengths = [int(v) for v in args.lengths.split(",") if v.strip()] if not args.compare_only else []
    except ValueError:
        raise UsageError(f"--lengths takes integers separated by commas, not {args.lengths!r}") from None
    if args.head not in ("lm", "cls"):
        raise UsageError("--head is lm or cls")
    try:
        args.context_list = [int(v) for v in args.contexts.split(",") if v.strip()] if args.generate else []
    except ValueError:
        raise UsageError(f"--contexts takes integers separated by commas, not {args.contexts!r}") from None
    if args.generate and (not args.context_list or min(args.context_list) < 1 or args.new_tokens < 1):
        raise UsageError("--generate needs --contexts of at least 1 token and --new_tokens of at least 1")
    nano = load_nanogpt(args.nanogpt) if args.nanogpt else None
    if args.clock not in ("wall", "cpu") or (args.clock == "cpu" and device == "cuda"):
        raise UsageError("--clock is wall, or cpu (CPU time; on a CPU device only)")
    threads = torch.get_num_threads()
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        _speed(args, device, models, lengths, nano)
    finally:
        torch.set_num_threads(threads)


def _speed(args, device, models, lengths, nano):
    torch.manual_seed(0)

    # every configuration: (record, steps)
    configs = []
    for L in lengths:
        for m in models:
            if m in ATTENTION:
                steps, params = attention_steps(m, args.batch, L, args, device), 0
            else:
                model = speed_model(m, L, args).to(device)
                steps = make_steps(model, args.batch, L, args.vocab, args.head, device)
                params = sum(p.numel() for p in model.parameters())
            for mode in ("infer",) if args.infer_only else ("train", "infer"):
                configs.append(({"model": m, "length": L, "mode": mode, "batch": args.batch, "params": params},
                                steps, mode))
            if args.checkpointing and m not in ATTENTION:    # the same weights, every block recomputed
                ck = speed_model(m, L, args, checkpointing=True).to(device)
                ck.load_state_dict(model.state_dict())
                loss_diff, grad_diff = checkpointing_difference(model, ck, args.batch, L, args.vocab, args.head, device)
                configs.append(({"model": m, "length": L, "mode": "train", "batch": args.batch, "params": params,
                                 "config": "checkpointing", "loss_diff": loss_diff, "grad_diff": grad_diff},
                                make_steps(ck, args.batch, L, args.vocab, args.head, device), "train"))
    c = NANOGPT_CPU
    ours = train.build_model("softmax", dict(train.MODELS["softmax"][1], vocab_size=c["vocab"], block_size=c["block_size"],
                                             n_layer=c["n_layer"], n_head=c["n_head"], n_embd=c["n_embd"], dropout=0.0,
                                             bias=c["bias"], head="lm", norm="pre")).to(device)
    # the comparison with nanoGPT runs unless this is generation alone (--generate --lengths '')
    pair = [("softmax", ours)] if (lengths or nano is not None or not args.generate) and not args.infer_only else []
    if nano is not None:
        with contextlib.redirect_stdout(open(os.devnull, "w")):
            theirs = nano.GPT(nano.GPTConfig(block_size=c["block_size"], vocab_size=c["vocab"], n_layer=c["n_layer"],
                                             n_head=c["n_head"], n_embd=c["n_embd"], dropout=0.0, bias=c["bias"])).to(device)
        pair.append(("nanogpt", theirs))
    for name, model in pair:
        steps = make_steps(model, c["batch"], c["block_size"], c["vocab"], "lm", device)
        configs.append(({"model": name, "length": c["block_size"], "mode": "train", "batch": c["batch"],
                         "config": "nanogpt-cpu", "params": sum(p.numel() for p in model.parameters())},
                        steps, "train"))

    print(f"speed on {device} ({torch.get_num_threads()} threads): {len(configs)} configurations, "
          f"{args.repeats} interleaved rounds", flush=True)
    for _, steps, mode in configs:                           # warm-up (allocations, AdamW state)
        steps[mode]()
    times = [[] for _ in configs]
    for r in range(args.repeats if configs else 0):          # interleaved: every round times everything once
        order = list(range(len(configs)))
        if r % 2:
            order.reverse()
        for i in order:
            rec, steps, mode = configs[i]
            n = args.inner if rec.get("config") == "nanogpt-cpu" else 1
            times[i].append(timed(steps[mode], device, n, args.clock))
        print(f"  round {r + 1}/{args.repeats} done", flush=True)
    records = []
    for (rec, steps, mode), ts in zip(configs, times):
        ms = statistics.median(ts)
        flops = count_flops(steps["flops_train" if mode == "train" else "infer"])
        mem = peak_memory(steps[mode], device)
        tokens = rec["batch"] * rec["length"]
        records.append({**rec, "ms": ms, "ms_all": ts, "peak_mem_mb": mem, "tokens_per_s": tokens / (ms / 1000),
                        "flops": flops, "flops_per_s": flops / (ms / 1000)})

    def find(model, L, mode, config=None):
        return next((r for r in records if r["model"] == model and r["length"] == L and r["mode"] == mode
                     and r.get("config") == config), None)
    def paired(a, b):                                        # median over rounds of a's time / b's time
        return float(np.median(np.array(a["ms_all"]) / np.array(b["ms_all"])))
    ratios = []
    for L in lengths:
        for mode in ("train", "infer"):
            for base, others in (("softmax", ("simpletron", "transject", "diffeqformer")),
                                 ("softmax_naive", ("simpletron", "transject", "softmax")),
                                 ("softmax_attention", ("simple_attention", "causal_simple_attention"))):
                g = find(base, L, mode)
                for other in others:
                    o = find(other, L, mode)
                    if g and o:
                        ratios.append({"what": f"{other} / {base} tokens per second", "length": L, "mode": mode,
                                       "ratio": paired(g, o)})
    for L in lengths:
        for m in models:
            a, b = find(m, L, "train"), find(m, L, "train", "checkpointing")
            if a and b:
                ratios.append({"what": f"{m} checkpointing / plain training step, peak memory ({b['peak_mem_mb']:.0f} "
                                       f"/ {a['peak_mem_mb']:.0f} MiB)", "length": L, "mode": "train",
                               "ratio": b["peak_mem_mb"] / a["peak_mem_mb"]})
                ratios.append({"what": f"{m} checkpointing / plain training step, time (loss difference "
                                       f"{b['loss_diff']:.1e}, largest gradient difference {b['grad_diff']:.1e})",
                               "length": L, "mode": "train", "ratio": paired(b, a)})
    if len(lengths) >= 2:
        mode = "infer" if args.infer_only else "train"
        for m in models:
            a, b = find(m, lengths[0], mode), find(m, lengths[-1], mode)
            if a and b:
                ratios.append({"what": f"{m} {'inference forward' if args.infer_only else 'training step'}, ms at "
                                       f"{lengths[-1]} / ms at {lengths[0]} tokens", "ratio": b["ms"] / a["ms"]})
    ng, og = find("nanogpt", c["block_size"], "train", "nanogpt-cpu"), find("softmax", c["block_size"], "train", "nanogpt-cpu")
    if args.generate:
        gen_records, gen_ratios = speed_generate(args, device, [m for m in models if m in train.MODELS])
        records += gen_records
        ratios += gen_ratios
    if ng:
        r = np.array(ng["ms_all"]) / np.array(og["ms_all"])
        ratios.append({"what": "nanoGPT / our GPT ms per iteration (nanoGPT CPU configuration, median of per-round "
                               f"ratios; quartiles {np.quantile(r, 0.25):.3f}-{np.quantile(r, 0.75):.3f})",
                       "ratio": paired(ng, og), "q25": float(np.quantile(r, 0.25)), "q75": float(np.quantile(r, 0.75))})

    machine = {"device": device, "cpu": platform.processor() or platform.machine(), "threads": torch.get_num_threads(),
               "clock": args.clock, "load_average": os.getloadavg() if hasattr(os, "getloadavg") else None,
               "cpus": os.cpu_count(), "torch": torch.__version__,
               "gpu": torch.cuda.get_device_name() if device == "cuda" else None}
    os.makedirs(args.out, exist_ok=True)
    path = write_json(args.out, "speed", records)
    write_json(args.out, "speed_summary", {"machine": machine, "ratios": ratios, "settings": vars(args),
                                           "peak_mem_mb": PEAK_MEM_NOTE[device == "cuda"]})
    md = speed_table(records, ratios, machine)
    data.atomic_write_text(os.path.join(args.out, "speed.md"), md)
    pngs = [plot_speed(records, args.out, machine)] if lengths else []
    if any(r["mode"] == "generate" for r in records):
        pngs.append(plot_generate(records, args.out, machine))
    print(md)
    print(f"wrote {path}, {os.path.join(args.out, 'speed.md')}" + "".join(f", {p}" for p in pngs))


PEAK_MEM_NOTE = {
    False: "CPU: peak resident memory of the process during the step minus the resident memory just before it "
           "(Linux VmHWM reset via /proc/self/clear_refs, freed heap returned with malloc_trim first): what the "
           "step itself needs on top of the model and optimizer state, in MiB",
    True: "CUDA: torch.cuda.max_memory_allocated during the step minus memory_allocated before it, in MiB"}


def speed_table(records, ratios, machine):
    clock = "CPU time of the process" if machine["clock"] == "cpu" else "wall time"
    load = machine.get("load_average")
    lines = [f"Machine: {machine['device']}" + (f" ({machine['gpu']})" if machine["gpu"] else
                                                 f", {machine['cpus']} CPU cores, {machine['threads']} torch threads") +
             f", torch {machine['torch']}; {clock}, medians of interleaved rounds" +
             (f"; load average at the end {load[0]:.1f}" if load else "") + ".", "",
             "| model | config | batch x tokens | mode | ms | tokens/s | peak MiB | GFLOP | GFLOP/s |",
             "|---|---|---|---|---:|---:|---:|---:|---:|"]
    gen = [r for r in records if r["mode"] == "generate"]
    records = [r for r in records if r["mode"] != "generate"]
    if not records:
        lines = lines[:2]
    for r in records:
        lines.append(f"| {r['model']} | {r.get('config', 'speed')} | {r['batch']} x {r['length']} | {r['mode']} | "
                     f"{r['ms']:.1f} | {r['tokens_per_s']:,.0f} | {r['peak_mem_mb']:.0f} | {r['flops'] / 1e9:.2f} | "
                     f"{r['flops_per_s'] / 1e9:.1f} |")
    if gen:
        lines += ["", f"Generation: milliseconds per new token after a prompt of `context` tokens (median over rounds "
                      f"of the mean of {gen[0]['new_tokens']} decode steps), the prefill of the prompt, and the size of "
                      "the state kept between tokens.", "",
                  "| model | batch x context | ms per new token | new tokens/s | prefill ms | state MiB |",
                  "|---|---|---:|---:|---:|---:|"]
        for r in gen:
            lines.append(f"| {r['model']} | {r['batch']} x {r['length']} | {r['ms']:.2f} | {r['tokens_per_s']:,.0f} | "
                         f"{r['prefill_ms']:.1f} | {r['state_mb']:.2f} |")
    lines.append("")
    for q in ratios:
        where = f" at {q['length']} tokens ({q['mode']})" if "length" in q else ""
        lines.append(f"- {q['what']}{where}: {q['ratio']:.2f}")
    return "\n".join(lines) + "\n"


def log_ticks(ax, axis, values):
    """Readable ticks on a log axis: at least two labelled values of 1-2-5 (or 1-1.5-2-3-...-8) times a power of
    ten inside the data's range, widened to the nearest such values when the data span less than that."""
    lo, hi = min(values) / 1.15, max(values) * 1.15
    decades = range(math.floor(math.log10(lo)) - 1, math.ceil(math.log10(hi)) + 1)
    for mantissas in ((1, 2, 5), (1, 1.5, 2, 3, 4, 5, 6, 7, 8)):
        cands = sorted(m * 10.0 ** e for e in decades for m in mantissas)
        ticks = [v for v in cands if lo <= v <= hi]
        if len(ticks) >= 3 or mantissas[-1] == 8:
            break
    if len(ticks) < 2:                                       # a narrow range: the candidates just outside
        lo, hi = max(v for v in cands if v <= lo), min(v for v in cands if v >= hi)
        ticks = [v for v in cands if lo <= v <= hi]
    getattr(ax, f"set_{axis}lim")(lo, hi)
    getattr(ax, f"set_{axis}ticks")(ticks, [f"{v:g}" for v in ticks])
    getattr(ax, f"{axis}axis").set_minor_locator(matplotlib.ticker.NullLocator())


def legend_below(fig, handles, ncol):
    """One legend for the figure, under its panels, where it hides no line."""
    fig.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, 0.02), ncol=ncol, fontsize=8, frameon=False)


def plot_speed(records, out, machine):
    from matplotlib.lines import Line2D
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8))
    rows = [r for r in records if "config" not in r and r["mode"] in ("train", "infer")]
    names = list(dict.fromkeys(r["model"] for r in rows))
    Ls = sorted({r["length"] for r in rows})
    for ax, key, ylabel in ((axes[0], "ms", "milliseconds per step"), (axes[1], "peak_mem_mb", "peak memory (MiB)")):
        ys = []
        for n_i, name in enumerate(names):
            for mode, ls in (("train", "-"), ("infer", "--")):
                rs = sorted((r for r in rows if r["model"] == name and r["mode"] == mode), key=lambda r: r["length"])
                if rs:
                    y = [max(r[key], 1e-3) for r in rs]
                    ys += y
                    ax.plot([r["length"] for r in rs], y, ls, marker="o", color=plt.cm.tab10(n_i))
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(Ls, [str(v) for v in Ls])
        ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
        if len(Ls) == 1:
            ax.set_xlim(Ls[0] / 1.5, Ls[0] * 1.5)
        if ys:
            log_ticks(ax, "y", ys)
        ax.set_xlabel("sequence length (tokens)")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="major", alpha=0.3)
    axes[0].set_title("time per training step and inference forward")
    axes[1].set_title("peak memory of the step above the model's")
    handles = [Line2D([], [], color=plt.cm.tab10(i), marker="o", label=name) for i, name in enumerate(names)]
    handles += [Line2D([], [], color="0.3", ls="-", label="solid: training step (forward, backward, AdamW)"),
                Line2D([], [], color="0.3", ls="--", label="dashed: inference forward")]
    legend_below(fig, handles, ncol=min(len(handles), 4))
    fig.suptitle(f"Speed on {machine['device']}" + (f" ({machine['gpu']})" if machine["gpu"] else
                                                     f", {machine['threads']} torch thread(s), "
                                                     f"{'CPU' if machine['clock'] == 'cpu' else 'wall'} time") +
                 f"; batch {rows[0]['batch']}, medians of interleaved rounds")
    return save_fig(fig, out, "speed")


# ----------------------------------------------------------------------------------------------
# speed --generate: milliseconds per new token against the context length

def generation_steps(model, batch, context, new_tokens, vocab, device):
    """(prefill, decode) closures: prefill reads a fixed random prompt of `context` tokens into a new state;
    decode runs new_tokens steps of model.decode on that state (fixed random tokens: the cost is what counts)."""
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(1, vocab, (batch, context), generator=g).to(device)
    tokens = torch.randint(1, vocab, (batch, new_tokens), generator=g).to(device)
    holder = {}

    def prefill():
        holder["state"] = model.prefill(prompt, capacity=context + new_tokens)[1]

    def decode():
        state = holder.pop("state")
        for i in range(new_tokens):
            model.decode(tokens[:, i:i + 1], state)
        holder["size"] = state.nbytes()
    return prefill, decode, holder


def speed_generate(args, device, models):
    """Generation benchmark: for each model and context, in interleaved rounds, a prefill of the prompt (timed
    on its own) and then new_tokens decode steps timed together: ms per new token. Records and ratios."""
    configs = []
    for L in args.context_list:
        for m in models:
            fields = {f.name for f in dataclasses.fields(train.model_module(m).Config)}
            cfg = dict(train.MODELS[m][1], vocab_size=args.vocab, block_size=L + args.new_tokens, n_layer=args.n_layer,
                       n_head=args.n_head, n_embd=args.n_embd, dropout=0.0, bias=True, head="lm")
            if args.time_dim:
                cfg["time_dim"] = args.time_dim
            model = train.build_model(m, {k: v for k, v in cfg.items() if k in fields}).to(device).eval()
            configs.append(({"model": m, "length": L, "mode": "generate", "batch": args.batch,
                             "new_tokens": args.new_tokens, "params": sum(p.numel() for p in model.parameters())},
                            generation_steps(model, args.batch, L, args.new_tokens, args.vocab, device)))
    print(f"generation on {device} ({torch.get_num_threads()} threads): {len(configs)} configurations, "
          f"{args.repeats} interleaved rounds of {args.new_tokens} new tokens", flush=True)
    with torch.no_grad():
        for _, (prefill, decode, _) in configs:              # warm-up
            prefill()
            decode()
        per_token = [[] for _ in configs]
        prefill_ms = [[] for _ in configs]
        for r in range(args.repeats):                        # interleaved: every round times everything once
            order = list(range(len(configs)))
            if r % 2:
                order.reverse()
            for i in order:
                prefill, decode, _ = configs[i][1]
                prefill_ms[i].append(timed(prefill, device, 1, args.clock))
                per_token[i].append(timed(decode, device, 1, args.clock) / args.new_tokens)
            print(f"  round {r + 1}/{args.repeats} done", flush=True)
    records = []
    for (rec, (_, _, holder)), ts, ps in zip(configs, per_token, prefill_ms):
        ms = statistics.median(ts)
        records.append({**rec, "ms": ms, "ms_all": ts, "tokens_per_s": rec["batch"] / (ms / 1000),
                        "prefill_ms": statistics.median(ps), "state_mb": holder["size"] / 2 ** 20})

    def find(model, L):
        return next((r for r in records if r["model"] == model and r["length"] == L), None)

    def paired(a, b):                                        # median over rounds of a's time / b's time
        return float(np.median(np.array(a["ms_all"]) / np.array(b["ms_all"])))
    ratios, Ls = [], args.context_list
    if len(Ls) >= 2:
        for m in models:
            ratios.append({"what": f"{m} ms per new token at a {Ls[-1]}-token context / at {Ls[0]} (median of "
                                   "per-round ratios)", "ratio": paired(find(m, Ls[-1]), find(m, Ls[0]))})
    if "softmax" in models:
        for L in Ls:
            for m in models:
                if m != "softmax":
                    ratios.append({"what": f"{m} / softmax ms per new token", "length": L, "mode": "generate",
                                   "ratio": paired(find(m, L), find("softmax", L))})
    return records, ratios


MARKERS = "osD^"


def plot_generate(records, out, machine):
    from matplotlib.lines import Line2D
    rows = [r for r in records if r["mode"] == "generate"]
    names = list(dict.fromkeys(r["model"] for r in rows))
    Ls = sorted({r["length"] for r in rows})
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8))
    for ax, key, ylabel in ((axes[0], "ms", "milliseconds per new token"),
                            (axes[1], "state_mb", "state kept between tokens (MiB)")):
        ys = []
        for n_i, name in enumerate(names):
            rs = sorted((r for r in rows if r["model"] == name), key=lambda r: r["length"])
            y = [max(r[key], 1e-4) for r in rs]
            ys += y                                          # later lines thinner: equal ones stay visible
            ax.plot([r["length"] for r in rs], y, "-", marker=MARKERS[n_i % 4], color=plt.cm.tab10(n_i),
                    lw=2.5 - 0.4 * n_i, ms=9 - 1.5 * n_i, alpha=0.85)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(Ls, [str(v) for v in Ls])
        ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
        if len(Ls) == 1:
            ax.set_xlim(Ls[0] / 1.5, Ls[0] * 1.5)
        log_ticks(ax, "y", ys)
        ax.set_xlabel("context: tokens before the new one")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="major", alpha=0.3)
    axes[0].set_title(f"time per new token (mean of {rows[0]['new_tokens']} decode steps)")
    axes[1].set_title("recurrent state (fixed) or KV cache (grows)")
    legend_below(fig, [Line2D([], [], color=plt.cm.tab10(i), marker=MARKERS[i % 4], label=name)
                       for i, name in enumerate(names)], ncol=len(names))
    fig.suptitle(f"Generation on {machine['device']}" + (f" ({machine['gpu']})" if machine["gpu"] else
                                                          f", {machine['threads']} torch thread(s), "
                                                          f"{'CPU' if machine['clock'] == 'cpu' else 'wall'} time") +
                 f"; batch {rows[0]['batch']}, medians of interleaved rounds")
    return save_fig(fig, out, "speed_generate")


# ==============================================================================================
# Command line

class Parser(argparse.ArgumentParser):
    def error(self, message):                                # one line, not a usage dump
        raise UsageError(f"{message} (python analyze.py --help)")


def parse(argv):
    p = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", metavar="SUBCOMMAND", parser_class=Parser)
    common = Parser(add_help=False)
    common.add_argument("--out", default="out/analysis", help="folder for SUBCOMMAND.json and the plots")
    common.add_argument("--ckpt", action="append", help="a train.py checkpoint (activation: several allowed)")
    common.add_argument("--seed", type=int, default=0)
    helps = {"spectra": "eigenvalues of QK and OV per head vs depth", "lyapunov": "token-level Lyapunov exponents",
             "activation": "activation factor and entropy per layer", "experts": "TransJect expert and residual weights",
             "cluster": "clustering simulation (DiffEqFormer C.8)", "speed": "speed and memory benchmark",
             "attnstd": "attention std per block over training (SimpleTRON fig. 5)"}
    s = {name: sub.add_parser(name, parents=[common], help=h) for name, h in helps.items()}
    s["spectra"].add_argument("--grid", type=int, default=0, help="ODE models: this many times t in [0, 1] "
                              "(default: the model's own steps)")
    s["lyapunov"].add_argument("--text", default="the company said it expects to report a loss for the year")
    s["lyapunov"].add_argument("--position", type=int, default=-1, help="the output token whose exponents are drawn")
    s["lyapunov"].add_argument("--k", type=int, default=8, help="exponents to compute per token pair")
    for name in ("activation", "experts"):
        s[name].add_argument("--n_seq", type=int, default=16, help="sequences of the task's val split")
        s[name].add_argument("--max_len", type=int, default=512, help="cut sequences to this many tokens")
    s["attnstd"].add_argument("--run", action="append", help="a folder of python train.py ... "
                              "--attn_std_interval N (several allowed: one row of panels each)")
    s["cluster"].add_argument("--tokens", type=int, default=40)
    s["cluster"].add_argument("--steps", type=int, default=200)
    s["cluster"].add_argument("--T", type=float, default=10.0, help="time horizon (step = T / steps)")
    s["cluster"].add_argument("--degrees", default="0,1,2,4", help="g(t) = 1 + t^k for these k (0: constant)")
    s["cluster"].add_argument("--eps", type=float, default=0.05, help="cluster radius on the unit sphere")
    s["cluster"].add_argument("--weights", default="identity", help="W_0: identity (Q = K = V = I) or random "
                              "(I + 0.3 Gaussian)")
    sp = s["speed"]
    sp.add_argument("--models", default="simpletron,softmax,transject,diffeqformer",
                    help="models of train.py, or one attention alone: " + ", ".join(ATTENTION))
    sp.add_argument("--lengths", default="1024,4096")
    sp.add_argument("--batch", type=int, default=1)
    sp.add_argument("--repeats", type=int, default=5, help="interleaved rounds (the median is reported)")
    sp.add_argument("--inner", type=int, default=10, help="nanoGPT configuration: steps per timing")
    sp.add_argument("--n_layer", type=int, default=4)
    sp.add_argument("--n_head", type=int, default=4)
    sp.add_argument("--n_embd", type=int, default=128)
    sp.add_argument("--vocab", type=int, default=256)
    sp.add_argument("--head", default="lm", help="lm (causal) or cls")
    sp.add_argument("--time_dim", type=int, default=0, help="DiffEqFormer's d_t (default: its Config's)")
    sp.add_argument("--device", default="auto", help="auto, cpu or cuda")
    sp.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's own choice)")
    sp.add_argument("--clock", default="wall", help="wall (elapsed) or cpu (CPU time of the process: with "
                    "--threads 1, robust to other programs sharing the CPU)")
    sp.add_argument("--nanogpt", help="path of karpathy/nanoGPT's model.py, outside this project")
    sp.add_argument("--infer_only", action="store_true", help="only the inference forward of each model (no training "
                    "step, no nanoGPT comparison): TransJect's Table 4 with --models transject,softmax,softmax_naive")
    sp.add_argument("--compare_only", action="store_true", help="only our GPT vs nanoGPT at nanoGPT's CPU config")
    sp.add_argument("--generate", action="store_true", help="also measure generation: ms per new token against the "
                    "context length (with --lengths '': generation alone)")
    sp.add_argument("--contexts", default="256,1024,4096", help="--generate: prompt lengths before the new tokens")
    sp.add_argument("--new_tokens", type=int, default=32, help="--generate: decode steps timed per round")
    sp.add_argument("--checkpointing", action="store_true", help="also each model's training step with activation "
                    "checkpointing (Config.checkpointing): peak memory, time, loss and gradient differences")
    args = p.parse_args(argv)
    if args.command is None:
        raise UsageError("give a subcommand: " + ", ".join(helps) + " (python analyze.py --help)")
    check(args)
    return args


# What each flag allows (those a subcommand has): name -> (test, what is allowed); floats must be finite.
LIMITS = {**{n: (lambda v: v >= 0, "an integer >= 0") for n in ("seed", "grid", "time_dim", "threads")},
          **{n: (lambda v: v >= 1, "an integer >= 1") for n in ("k", "n_seq", "max_len", "steps", "batch", "repeats",
                                                                 "inner", "n_layer", "n_head", "n_embd")},
          "tokens": (lambda v: v >= 2, "an integer >= 2"), "vocab": (lambda v: v >= 2, "an integer >= 2"),
          "T": (lambda v: v > 0, "a number > 0"), "eps": (lambda v: v > 0, "a number > 0"),
          "weights": (lambda v: v in ("identity", "random"), "identity or random"),
          "head": (lambda v: v in ("lm", "cls"), "lm or cls"), "clock": (lambda v: v in ("wall", "cpu"), "wall or cpu"),
          "device": (lambda v: v in ("auto", "cpu", "cuda"), "auto, cpu or cuda"),
          "degrees": (lambda v: all(d.strip().isdigit() for d in v.split(",")), "integers >= 0 separated by commas"),
          "lengths": (lambda v: all(d.strip().isdigit() and int(d) > 0 for d in v.split(",") if d.strip()),
                      "integers >= 1 separated by commas")}


def check(args):
    """Every flag, before any work: one line naming the flag, its value and what is allowed."""
    for name, value in vars(args).items():
        test, allowed = LIMITS.get(name, (lambda v: True, "a finite number"))
        if isinstance(value, float) and not math.isfinite(value) or value is not None and not test(value):
            raise UsageError(f"--{name} {value}: allowed is {allowed}")
    if getattr(args, "device", None) == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda: no CUDA device here; use --device cpu (or auto)")
    path = os.path.abspath(args.out)
    while not os.path.exists(path):
        path = os.path.dirname(path)
    if not os.path.isdir(path) or not os.access(path, os.W_OK | os.X_OK):
        raise UsageError(f"--out {args.out}: {path} is not a folder this command can write in")


COMMANDS = {"spectra": cmd_spectra, "lyapunov": cmd_lyapunov, "activation": cmd_activation,
            "experts": cmd_experts, "cluster": cmd_cluster, "speed": cmd_speed, "attnstd": cmd_attnstd}


def main(argv=None):
    args = parse(sys.argv[1:] if argv is None else argv)
    os.makedirs(args.out, exist_ok=True)
    return COMMANDS[args.command](args)


if __name__ == "__main__":
    try:
        main()
    except (UsageError, train.UsageError, data.DataError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
