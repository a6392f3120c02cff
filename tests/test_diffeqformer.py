"""DiffEqFormer: the solvers' orders and formulas, time-dependent weights, the vector field, discretisation and
LoRA, gradients, and step-count fine-tuning through train.py."""

import dataclasses
import math
import os

import pytest
import torch
import torch.nn as nn

import config
import diffeqformer as dq
import simpletron
import train

F64 = torch.float64


def tiny(**kw):
    cfg = dict(vocab_size=23, block_size=12, n_layer=3, n_head=2, n_embd=8, time_dim=4, time_freqs=6, head="lm")
    return dq.Config(**{**cfg, **kw})


def model_of(seed=0, dtype=F64, perturb=True, everything=False, **kw):
    """A tiny model in eval mode. perturb: move the zero-initialised rows (W_0, LayerNorm) off zero, so that
    every part of the parametrisation is exercised; everything: every other parameter too (CLS, biases, ln_f)."""
    torch.manual_seed(seed)
    m = dq.Model(tiny(**kw)).to(dtype).eval()
    if perturb:
        with torch.no_grad():
            for name, p in m.named_parameters():
                if name.startswith("temporal.") or everything:
                    p.add_(0.05 * torch.randn_like(p))
    return m


def tokens(B=2, L=9, seed=1, vocab=23):
    return torch.randint(1, vocab, (B, L), generator=torch.Generator().manual_seed(seed))


# ----------------------------------------------------------------------------------------------
# The reference: the paper's formulas written out slowly in float64, one token, one head, one time at a time.
# It reads the model's parameters by name only; every computation on them is its own.

def ref_phi(t, S):
    """phi(t) = [t, sin(1000 t w_k), cos(1000 t w_k)]_{k<S}, w_k = 10000^(-k/S)."""
    w = [10000 ** (-k / S) for k in range(S)]
    return torch.tensor([t] + [math.sin(1000 * t * wk) for wk in w] + [math.cos(1000 * t * wk) for wk in w], dtype=F64)


def ref_e(module, t, S):
    """e(t) = Lin2(SiLU(Lin1(phi(t)))), SiLU(z) = z sigmoid(z)."""
    lin1, lin2 = [m for m in module.e.modules() if isinstance(m, nn.Linear)]
    z = lin1.weight @ ref_phi(t, S) + lin1.bias
    z = z / (1 + torch.exp(-z))
    return lin2.weight @ z + lin2.bias


def ref_rows(module, P, t, S):
    """P(t) = P_0 + sum_i e_i(t) P_i (eq. 6); shared weights: P_0."""
    if module.e is None:
        return P[0]
    e = ref_e(module, t, S)
    out = P[0].clone()
    for i in range(len(e)):
        out = out + e[i] * P[1 + i]
    return out


def widths(c):
    """(out, in) of W_QKV, W_O, W_1, W_2: GELU MLP 4D; SwiGLU 8D/3 for each of its two input maps."""
    D = c.n_embd
    hidden = 4 * D if c.style == "gpt" else 8 * D // 3
    return {"qkv": (3 * D, D), "o": (D, D), "fc": (hidden * (1 if c.style == "gpt" else 2), D), "proj": (D, hidden)}


def ref_weights(model, t):
    """{name: (weight (out, in) or gamma, bias or beta or None)} of f at time t, from the ODE model's rows."""
    c, T = model.config, model.temporal
    w = {}
    for name, shape in widths(c).items():
        mod = getattr(T, name)
        w[name] = (ref_rows(mod, mod.W, t, c.time_freqs).reshape(shape),
                   None if mod.b is None else ref_rows(mod, mod.b, t, c.time_freqs))
    for name in ("ln1", "ln2"):
        mod = getattr(T, name)
        w[name] = (1 + ref_rows(mod, mod.G, t, c.time_freqs),
                   None if mod.H is None else ref_rows(mod, mod.H, t, c.time_freqs))
    return w


def ref_block_weights(block):
    """The same dict from a discrete model's stored block: W + s B A for a LoRA map."""
    w = {}
    for name in ("qkv", "o", "fc", "proj"):
        lin = getattr(block, name)
        W = lin.weight
        if hasattr(lin, "lora_A"):
            W = W + lin.scale * lin.lora_B @ lin.lora_A
        w[name] = (W, lin.bias)
    for name in ("ln1", "ln2"):
        ln = getattr(block, name)
        w[name] = (ln.weight, getattr(ln, "bias", None))
    return w


def ref_norm(x, gamma, beta, style):
    """LayerNorm (gpt): (x - mean) / sqrt(var + 1e-5) gamma + beta; RMSNorm (llama): x / sqrt(mean x^2 + 1e-5) gamma."""
    if style == "gpt":
        mu = x.mean(-1, keepdim=True)
        var = ((x - mu) ** 2).mean(-1, keepdim=True)
        y = (x - mu) / torch.sqrt(var + 1e-5) * gamma
        return y if beta is None else y + beta
    return x / torch.sqrt((x ** 2).mean(-1, keepdim=True) + 1e-5) * gamma


def ref_rope(x):
    """x (L, d): position p rotates the channel pair (i, i + d/2) by the angle p 10000^(-2i/d)."""
    L, d = x.shape
    y = x.clone()
    for p in range(L):
        for i in range(d // 2):
            a = p * 10000 ** (-2 * i / d)
            y[p, i] = x[p, i] * math.cos(a) - x[p, i + d // 2] * math.sin(a)
            y[p, i + d // 2] = x[p, i + d // 2] * math.cos(a) + x[p, i] * math.sin(a)
    return y


def linear(x, W, b):
    return x @ W.T if b is None else x @ W.T + b


def ref_attention(x, w, c, keys):
    """Multi-head attention on one normalised sequence x (L, D): per head, a dense softmax over the allowed keys
    (causal for lm; real tokens only, `keys`, for cls/match) of q_i k_j / sqrt(d), then W_O."""
    L, D = x.shape
    H, d = c.n_head, c.n_embd // c.n_head
    qkv = linear(x, *w["qkv"])                                           # (L, 3D): [q | k | v], head h at h*d
    heads = []
    for h in range(H):
        q, k, v = (qkv[:, part * D + h * d: part * D + (h + 1) * d] for part in range(3))
        if c.style == "llama":
            q, k = ref_rope(q), ref_rope(k)
        y = torch.zeros(L, d, dtype=F64)
        for i in range(L):
            allowed = [j for j in range(L) if (c.head != "lm" or j <= i) and (keys is None or keys[j])]
            s = torch.stack([q[i] @ k[j] / math.sqrt(d) for j in allowed])
            p = torch.exp(s - s.max())
            p = p / p.sum()
            for a, j in enumerate(allowed):
                y[i] = y[i] + p[a] * v[j]
        heads.append(y)
    return linear(torch.cat(heads, -1), *w["o"])


def ref_mlp(x, w, c):
    """GELU (exact, with erf) or SwiGLU: SiLU(gate) * input, gate the first half of W_1's output."""
    z = linear(x, *w["fc"])
    if c.style == "gpt":
        z = 0.5 * z * (1 + torch.erf(z / math.sqrt(2)))
    else:
        hidden = z.shape[-1] // 2
        gate, z = z[:, :hidden], z[:, hidden:]
        z = gate / (1 + torch.exp(-gate)) * z
    return linear(z, *w["proj"])


def ref_f(X, w, c, keys=None):
    """f(X, t) = Attn(LN1(X)) + MLP(LN2(X)) on one sequence X (L, D): both branches read the same X (eq. 2)."""
    return (ref_attention(ref_norm(X, *w["ln1"], c.style), w, c, keys)
            + ref_mlp(ref_norm(X, *w["ln2"], c.style), w, c))


def ref_solve(f, X, n, method):
    """n steps on [0, 1]: the paper's Euler X + h f(X, t + h), midpoint, classical RK4. Returns [X_0, ..., X_n]."""
    h, xs = 1.0 / n, [X]
    for k in range(n):
        t = k * h
        if method == "euler":
            X = X + h * f(X, t + h)
        elif method == "midpoint":
            X = X + h * f(X + h / 2 * f(X, t), t + h / 2)
        else:
            k1 = f(X, t)
            k2 = f(X + h / 2 * k1, t + h / 2)
            k3 = f(X + h / 2 * k2, t + h / 2)
            k4 = f(X + h * k3, t + h)
            X = X + h / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
        xs.append(X)
    return xs


def ref_embed(model, seq):
    """One sequence (L,) -> X(0) (L', D) and its real tokens (L',) or None: token rows, a CLS row first
    (cls/match), learned positions added (gpt)."""
    c = model.config
    X = model.wte.weight[seq]
    keys = None
    if c.head != "lm":
        X = torch.cat([model.cls.reshape(1, -1), X])
        keys = [True] + [bool(tok != 0) for tok in seq]
    if c.style == "gpt":
        X = X + model.wpe.weight[:len(X)]
    return X, keys


def ref_trajectory(model, seq):
    c = model.config
    X, keys = ref_embed(model, seq)
    if c.discrete:
        blocks = [ref_block_weights(b) for b in model.blocks]
        f = lambda X, t: ref_f(X, blocks[round(t * c.n_layer) - 1], c, keys)          # noqa: E731
    else:
        f = lambda X, t: ref_f(X, ref_weights(model, t), c, keys)                     # noqa: E731
    return ref_solve(f, X, c.n_layer, c.method)


def ref_encode(model, seq):
    """X(1) after the final norm (LayerNorm or RMSNorm)."""
    ln = model.ln_f
    return ref_norm(ref_trajectory(model, seq)[-1], ln.weight, getattr(ln, "bias", None), model.config.style)


def ref_mlp_head(layers, x):
    """The classifier: Linear, ReLU, ..., Linear."""
    for n, lin in enumerate(layers):
        x = linear(x, lin.weight, lin.bias)
        if n < len(layers) - 1:
            x = torch.clamp(x, min=0)
    return x


def ref_cross_entropy(logits, targets):
    """Mean over the targets that are not -1 of logsumexp(logits) - logits[target]."""
    terms = [torch.logsumexp(z, 0) - z[y] for z, y in zip(logits, targets.tolist()) if y != -1]
    return sum(terms) / len(terms)


def ref_forward(model, idx, targets=None):
    c = model.config
    if c.head == "lm":
        logits = torch.stack([ref_encode(model, seq) @ model.wte.weight.T for seq in idx])   # tied embeddings
        loss = None if targets is None else ref_cross_entropy(logits.flatten(0, 1), targets.flatten())
        return logits, loss
    layers = [m for m in model.classifier.modules() if isinstance(m, nn.Linear)]
    if c.head == "cls":
        feats = torch.stack([ref_encode(model, seq)[0] for seq in idx])               # the CLS row
    else:
        u = torch.stack([ref_encode(model, pair[0])[0] for pair in idx])
        v = torch.stack([ref_encode(model, pair[1])[0] for pair in idx])
        feats = torch.cat([u, v, u * v, u - v], -1)
    logits = ref_mlp_head(layers, feats)
    return logits, None if targets is None else ref_cross_entropy(logits, targets)


# ----------------------------------------------------------------------------------------------
# Solvers

ORDERS = {"euler": 1, "midpoint": 2, "rk4": 4}


def measured_order(f, x0, exact, method, t1, ns=(32, 64, 128, 256)):
    errors = [(dq.odeint(f, x0, n, method, 0.0, t1) - exact).abs().max().item() for n in ns]
    return [math.log2(a / b) for a, b in zip(errors, errors[1:])]


@pytest.mark.parametrize("method", ORDERS)
def test_convergence_orders_autonomous(method):
    # x'' = -x as a system: x(t) = (cos t, -sin t) from (1, 0)
    def f(x, t):
        return torch.stack([x[1], -x[0]])
    x0 = torch.tensor([1.0, 0.0], dtype=F64)
    exact = torch.tensor([math.cos(2.0), -math.sin(2.0)], dtype=F64)
    orders = measured_order(f, x0, exact, method, 2.0)
    assert all(abs(p - ORDERS[method]) < 0.15 for p in orders), orders


@pytest.mark.parametrize("method", ORDERS)
def test_convergence_orders_non_autonomous(method):
    # x' = cos(t) x + t: not autonomous. x(t) = e^{sin t} (1 + int_0^t s e^{-sin s} ds), the integral by
    # composite Simpson on 20,001 points (error ~1e-17)
    def f(x, t):
        return math.cos(t) * x + t
    s = torch.linspace(0, 2.0, 20_001, dtype=F64)
    g = s * torch.exp(-torch.sin(s))
    integral = (2.0 / 20_000 / 3) * (g[0] + g[-1] + 4 * g[1:-1:2].sum() + 2 * g[2:-1:2].sum())
    exact = math.exp(math.sin(2.0)) * (1 + integral)
    orders = measured_order(f, torch.tensor(1.0, dtype=F64), exact, method, 2.0)
    assert all(abs(p - ORDERS[method]) < 0.15 for p in orders), orders


@pytest.mark.parametrize("method,taylor_terms", [("euler", 1), ("midpoint", 2), ("rk4", 4)])
def test_step_maps_of_a_linear_system_are_the_taylor_polynomials_of_exp(method, taylor_terms):
    # for x' = A x, an explicit RK step of order p is x -> R(hA) x, R the Taylor polynomial of exp of degree p;
    # the reference is built from torch.matrix_power, and n -> infinity reaches torch.linalg.matrix_exp
    g = torch.Generator().manual_seed(0)
    A = torch.randn(4, 4, generator=g, dtype=F64)
    x0 = torch.randn(4, generator=g, dtype=F64)
    n, h = 7, 0.5 / 7
    R = sum(torch.linalg.matrix_power(h * A, j) / math.factorial(j) for j in range(taylor_terms + 1))
    x = dq.odeint(lambda x, t: A @ x, x0, n, method, 0.0, 0.5)
    torch.testing.assert_close(x, torch.linalg.matrix_power(R, n) @ x0, rtol=1e-13, atol=1e-13)
    exact = torch.linalg.matrix_exp(0.5 * A) @ x0                            # and the limit is exp(tA) x0
    fine = dq.odeint(lambda x, t: A @ x, x0, 56, method, 0.0, 0.5)
    assert (fine - exact).abs().max() < 2 * (x - exact).abs().max() / 8 ** taylor_terms


def test_euler_evaluates_at_the_right_end_of_each_step():
    # x' = a(t) x: the paper's Euler is x_{k+1} = (1 + h a(t_{k+1})) x_k
    a = [0.3, -1.2, 2.0, 0.7]
    x = dq.odeint(lambda x, t: a[round(t * 4) - 1] * x, torch.tensor(1.0, dtype=F64), 4, "euler")
    assert x.item() == pytest.approx(math.prod(1 + 0.25 * ak for ak in a), rel=1e-15)
    assert dq.stage_times("euler", 4) == [0.25, 0.5, 0.75, 1.0]
    assert dq.stage_times("midpoint", 2) == [0.0, 0.25, 0.5, 0.75]
    assert dq.stage_times("rk4", 1) == [0.0, 0.5, 0.5, 1.0]
    xs = dq.odeint(lambda x, t: x, torch.tensor(1.0), 3, trajectory=True)[1]
    assert len(xs) == 4 and xs[0].item() == 1.0


# ----------------------------------------------------------------------------------------------
# Time-dependent weights

def test_time_features():
    t = torch.tensor([0.0, 0.3], dtype=F64)
    phi = dq.time_features(t, 5)
    assert phi.shape == (2, 11)
    w = 10000 ** (-torch.arange(5, dtype=F64) / 5)
    torch.testing.assert_close(phi[1], torch.cat([t[1:], torch.sin(300 * w), torch.cos(300 * w)]))


@pytest.mark.parametrize("style", ["gpt", "llama"])
def test_temporal_norm_at_init_is_layernorm(style):
    torch.manual_seed(0)
    c = tiny(style=style)
    norm = dq.TemporalLayerNorm(c).double()
    X = 3 * torch.randn(2, 5, 8, dtype=F64) + 1
    if style == "gpt":
        ref = torch.nn.LayerNorm(8).double()(X)
    else:
        ref = X / X.square().mean(-1, keepdim=True).add(1e-5).sqrt()
    maps = norm.at(dq.time_features(torch.tensor([0.0, 0.37, 1.0], dtype=F64), c.time_freqs))
    for ln in maps:
        torch.testing.assert_close(ln(X), ref, rtol=1e-12, atol=1e-12)
    with torch.no_grad():                                     # trained: gamma and beta depend on t
        norm.G.normal_()
    gammas = norm(dq.time_features(torch.tensor([0.2, 0.8], dtype=F64), c.time_freqs))[0]
    assert not torch.allclose(gammas[0], gammas[1])


def test_weights_at_init_have_gpt2_scale():
    torch.manual_seed(0)
    m = dq.Model(tiny(n_embd=64, time_dim=20, time_freqs=128))
    W = m.temporal.fc(dq.time_features(torch.linspace(0, 1, 50), 128))[0]  # (50, 256, 64)
    assert 0.015 < W.std().item() < 0.025


def test_weights_vary_smoothly_in_t_and_are_constant_when_shared():
    m = model_of()
    S = m.config.time_freqs
    W = lambda t: m.temporal.qkv(dq.time_features(torch.tensor([t], dtype=F64), S))[0][0]   # noqa: E731
    t = 0.4
    d1, d2, d4 = ((W(t + h) - W(t)).norm().item() for h in (1e-5, 5e-6, 2.5e-6))
    assert d1 / d2 == pytest.approx(2, rel=0.01) and d2 / d4 == pytest.approx(2, rel=0.01)  # differentiable
    assert (W(0.1) - W(0.9)).norm() > 0.1 * W(0.1).norm()                    # and really time-dependent
    shared = model_of(weights="shared")
    assert shared.temporal.qkv.e is None
    Ws = shared.temporal(torch.tensor([0.0, 0.3, 1.0], dtype=F64))
    for weight, bias in Ws.values():
        assert torch.equal(weight[0], weight[1]) and torch.equal(weight[0], weight[2])
        assert bias is None or torch.equal(bias[0], bias[2])
    dense = sum(p.numel() for p in model_of(perturb=False).temporal.qkv.parameters())
    assert sum(p.numel() for p in shared.temporal.qkv.parameters()) == 3 * 8 * 8 + 3 * 8   # one GPT W_QKV, b_QKV
    assert dense > 5 * (3 * 8 * 8)


def test_all_weights_come_from_one_pass_per_forward():
    m = model_of(method="rk4", n_layer=4)
    calls = []
    for module in m.temporal.children():
        module.register_forward_hook(lambda mod, args, out: calls.append(args[0].shape[0]))
    m(tokens())
    # six time-dependent modules, each called once with every time rk4 needs: t_k, t_k + h/2 -> 2n + 1 times
    assert calls == [2 * 4 + 1] * 6


# ----------------------------------------------------------------------------------------------
# The vector field and the model

def test_a_step_costs_per_token_what_a_gpt_block_costs():
    # FLOPs of a training step (forward and backward) grow with the tokens exactly as GPT's of the same shape;
    # the hypernetworks add a fixed cost per forward, independent of the number of tokens
    from torch.utils.flop_counter import FlopCounterMode
    shape = dict(vocab_size=50, block_size=16, n_layer=3, n_head=2, n_embd=16, dropout=0.0, head="lm")
    gpt = simpletron.Model(simpletron.Config(**shape, attention="softmax", variant="vanilla", norm="pre"))
    ode = dq.Model(dq.Config(**shape, time_dim=8, time_freqs=16))

    def flops(model, B):
        x = tokens(B, 16, vocab=50)
        with FlopCounterMode(display=False) as counter:
            model(x, x)[1].backward()
        return counter.get_total_flops()
    assert flops(ode, 4) - flops(ode, 2) == flops(gpt, 4) - flops(gpt, 2)
    assert flops(ode, 2) > flops(gpt, 2)


def test_vector_field_is_attention_plus_mlp_in_parallel():
    m = model_of()
    X = torch.randn(2, 6, 8, dtype=F64)
    t = 0.6
    w = m.temporal.maps(torch.tensor([t], dtype=F64))[0]
    # written out: per head softmax(Q K^T / sqrt(d) + causal) V, W_O; GELU MLP; both on the same X
    D, H, d = 8, 2, 4
    q, k, v = w.qkv(w.ln1(X)).split(D, dim=-1)
    heads = []
    for h in range(H):
        s = slice(h * d, (h + 1) * d)
        scores = q[..., s] @ k[..., s].transpose(-1, -2) / math.sqrt(d)
        scores = scores.masked_fill(~torch.ones(6, 6, dtype=torch.bool).tril(), -math.inf)
        heads.append(scores.softmax(-1) @ v[..., s])
    ref = w.o(torch.cat(heads, -1)) + w.proj(torch.nn.functional.gelu(w.fc(w.ln2(X))))
    torch.testing.assert_close(m.vector_field(X, t), ref, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("kw", [dict(), dict(style="llama"), dict(method="rk4"), dict(weights="shared")])
def test_lm_is_causal(kw):
    m = model_of(**kw)
    x = tokens(B=1, L=10)
    y = x.clone()
    y[0, 6] = (x[0, 6] % 22) + 1                                             # change token 6
    a, b = m(x)[0], m(y)[0]
    torch.testing.assert_close(a[:, :6], b[:, :6], rtol=0, atol=0)           # earlier positions: bit for bit
    assert (a[:, 6:] - b[:, 6:]).abs().amax(-1).min() > 1e-8                # later ones all see it


def test_rope_scores_depend_on_the_offset_only():
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 1, 1, 1, 8, generator=g, dtype=F64).expand(2, 1, 1, 12, 8).unbind(0)
    s = dq.rope(q)[0, 0] @ dq.rope(k)[0, 0].T                                # (12, 12) q at m, k at n
    for off in range(-3, 4):
        diag = torch.diagonal(s, off)
        torch.testing.assert_close(diag, diag[:1].expand_as(diag), rtol=1e-12, atol=1e-12)


def test_cls_padding_is_ignored():
    m = model_of(head="cls", n_classes=3)
    x = tokens(B=2, L=7)
    padded = torch.cat([x, torch.zeros(2, 4, dtype=torch.long)], dim=1)
    torch.testing.assert_close(m(x)[0], m(padded)[0], rtol=1e-12, atol=1e-12)


def test_checkpointing_gives_the_same_gradients():
    grads = []
    for ckpt in (False, True):
        m = model_of(checkpointing=ckpt, method="midpoint").train()
        loss = m(tokens(), tokens(seed=2))[1]
        loss.backward()
        grads.append(torch.cat([p.grad.flatten() for p in m.parameters()]))
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-10, atol=1e-12)


# ----------------------------------------------------------------------------------------------
# Discretisation and LoRA (section 6.2)

def rebuilt(model):
    """The model rebuilt from its config alone, as train.py does with a checkpoint."""
    other = dq.Model(dq.Config(**dataclasses.asdict(model.config))).to(F64).eval()
    other.load_state_dict(model.state_dict())
    return other


@pytest.mark.parametrize("kw", [dict(), dict(style="llama"), dict(weights="shared"), dict(head="cls", n_classes=4),
                                dict(bias=False)])
def test_discretized_model_reproduces_the_ode_model(kw):
    m = model_of(**kw)
    x = tokens()
    d = m.discretize(m.config.n_layer)
    assert d.config.discrete and len(d.blocks) == 3 and not hasattr(d, "temporal")
    torch.testing.assert_close(d(x)[0], m(x)[0], rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(rebuilt(d)(x)[0], m(x)[0], rtol=1e-10, atol=1e-10)
    # the discrete model is the Euler grid of the ODE: the same trajectory, times and f
    for a, b in zip(m.hidden_states(x)[0], d.hidden_states(x)[0]):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)
    X = torch.randn(2, 5, 8, dtype=F64)
    assert d.times() == m.times() == [1 / 3, 2 / 3, 1.0]
    torch.testing.assert_close(d.vector_field(X, d.times()[1]), m.vector_field(X, m.times()[1]))
    # another grid is another model: 6 steps of half the size
    assert len(m.discretize(6).blocks) == 6
    with pytest.raises(ValueError):
        d.discretize(4)


def test_discretized_model_matches_in_float32():
    torch.manual_seed(0)
    m = dq.Model(tiny(n_embd=32, n_layer=4, time_dim=8, time_freqs=32)).eval()
    x = tokens(L=12)
    assert (m.discretize(4)(x)[0] - m(x)[0]).abs().max() <= 1e-4


def test_discretized_models_converge_to_the_ode_solution():
    # finer Euler grids approach the RK4 solution at rate O(dt). With weights="shared" (f autonomous): W(t) of
    # the temporal model oscillates with sin(1000 t), resolved only for dt << 1/1000
    m = model_of(n_layer=2, weights="shared")
    x = tokens()
    ref = dq.Model(dataclasses.replace(m.config, n_layer=64, method="rk4")).to(F64).eval()
    ref.load_state_dict(m.state_dict())
    exact = ref(x)[0]
    errors = [(m.discretize(n)(x)[0] - exact).abs().max().item() for n in (8, 16, 32)]
    assert all(1.6 < a / b < 2.4 for a, b in zip(errors, errors[1:])), errors


def test_lora_starts_unchanged_and_trains_only_lora_and_embeddings():
    m = model_of()
    d = m.discretize(4)
    lo = d.with_lora(2, alpha=4.0)
    x, y = tokens(), tokens(seed=3)
    torch.testing.assert_close(lo(x)[0], d(x)[0], rtol=0, atol=0)
    assert lo.config.lora_r == 2 and lo.config.lora_scale == 2.0
    trainable = {n for n, p in lo.named_parameters() if p.requires_grad}
    assert trainable == {"wte.weight", "wpe.weight"} | {f"blocks.{k}.{name}.lora_{ab}" for k in range(4)
                                                        for name in ("qkv", "o", "fc", "proj") for ab in "AB"}
    before = {n: p.detach().clone() for n, p in lo.named_parameters()}
    opt = torch.optim.AdamW([p for p in lo.parameters() if p.requires_grad], lr=1e-2)
    lo.train()
    for _ in range(2):
        lo(x, y)[1].backward()
        opt.step()
        opt.zero_grad()
    for n, p in lo.named_parameters():
        assert torch.equal(p, before[n]) != (n in trainable), n            # exactly the trainable ones moved
    # the LoRA model is rebuilt from its config alone, frozen alike
    again = rebuilt(lo)
    assert {n for n, p in again.named_parameters() if p.requires_grad} == trainable
    torch.testing.assert_close(again(x)[0], lo.eval()(x)[0], rtol=0, atol=0)
    # its attention weights include the low-rank update
    blk = lo.blocks[1]
    W = blk.qkv.weight + 2.0 * blk.qkv.lora_B @ blk.qkv.lora_A
    torch.testing.assert_close(lo.attention_weights(lo.times()[1])["k"], W[8:16].T)
    with pytest.raises(ValueError):
        m.with_lora(2, 4.0)                                                  # LoRA goes on a discrete model


def test_config_validation():
    for good in (dict(time_freqs=1, time_dim=1, n_layer=1), dict(style="llama", n_embd=8, n_head=2),
                 dict(n_embd=6, n_head=2), dict(discrete=True, lora_r=1)):          # odd head size: fine without RoPE
        tiny(**good)
    for bad in (dict(style="bert"), dict(weights="tied"), dict(method="rk45"), dict(n_embd=10, n_head=4),
                dict(lora_r=2), dict(discrete=True, method="rk4"), dict(time_dim=0), dict(time_freqs=0), dict(n_layer=0),
                dict(style="llama", n_embd=6, n_head=2), dict(head="seq"), dict(lora_r=-1, discrete=True)):
        with pytest.raises(ValueError):
            tiny(**bad)


# ----------------------------------------------------------------------------------------------
# Every part against the reference above

def test_time_features_with_numbers():
    # S = 2: w = (1, 10000^(-1/2) = 0.01); t = 0.003: angles 1000 t w = (3, 0.03); order [t, sin, cos]
    phi = dq.time_features(torch.tensor([0.003], dtype=F64), 2)[0]
    torch.testing.assert_close(phi, torch.tensor([0.003, math.sin(3), math.sin(0.03), math.cos(3), math.cos(0.03)],
                                                 dtype=F64), rtol=1e-13, atol=1e-13)
    # S = 4, t = 0.5: w = (1, 0.1, 0.01, 0.001), angles (500, 50, 5, 0.5)
    phi = dq.time_features(torch.tensor([0.0, 0.5], dtype=F64), 4)
    angles = [500, 50, 5, 0.5]
    torch.testing.assert_close(phi[1], torch.tensor([0.5] + [math.sin(a) for a in angles] + [math.cos(a) for a in angles],
                                                    dtype=F64), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(phi[0], torch.tensor([0.0] * 5 + [1.0] * 4, dtype=F64))
    torch.testing.assert_close(dq.time_features(torch.tensor([0.37], dtype=F64), 6)[0], ref_phi(0.37, 6))


def test_solver_steps_by_hand():
    # one step of each solver for x' = x^2 + t from x = 0.5 at t = 0.2, h = 0.1, worked out
    f = lambda x, t: x ** 2 + t                                               # noqa: E731
    euler = 0.5 + 0.1 * (0.5 ** 2 + 0.3)                                      # f at the right end, t + h
    k1 = 0.5 ** 2 + 0.2
    mid = 0.5 + 0.1 * ((0.5 + 0.05 * k1) ** 2 + 0.25)
    k2 = (0.5 + 0.05 * k1) ** 2 + 0.25
    k3 = (0.5 + 0.05 * k2) ** 2 + 0.25
    k4 = (0.5 + 0.1 * k3) ** 2 + 0.3
    rk4 = 0.5 + 0.1 / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
    assert euler == pytest.approx(0.555, rel=1e-15) and mid == pytest.approx(0.552300625, rel=1e-15)
    for method, expected in (("euler", euler), ("midpoint", mid), ("rk4", rk4)):
        assert dq.rk_step(f, 0.5, 0.2, 0.1, method) == pytest.approx(expected, rel=1e-14), method
        x = torch.tensor(0.5, dtype=F64)
        assert dq.odeint(f, x, 1, method, 0.2, 0.3).item() == pytest.approx(expected, rel=1e-14), method


@pytest.mark.parametrize("method,stages", [("euler", [1.0]), ("midpoint", [0.0, 0.5]),
                                           ("rk4", [0.0, 0.5, 0.5, 1.0])])
def test_odeint_steps_and_times(method, stages):
    # n equal steps h = (t1 - t0) / n; f is evaluated at t0 + k h + c h for each stage c, in order
    seen = []

    def f(x, t):
        seen.append(t)
        return torch.stack([x[1], -x[0] + t])
    x0 = torch.tensor([1.0, -0.5], dtype=F64)
    x1, xs = dq.odeint(f, x0, 3, method, t0=0.2, t1=0.8, trajectory=True)
    h = 0.2
    assert seen == pytest.approx([0.2 + k * h + c * h for k in range(3) for c in stages], abs=1e-14)
    assert dq.stage_times(method, 3, 0.2, 0.8) == pytest.approx(seen, abs=0)
    assert len(xs) == 4 and xs[0] is x0 and torch.equal(xs[-1], x1)
    # the same steps on [0, 1] with the field rescaled to the interval: g(y, s) = 0.6 f(y, 0.2 + 0.6 s)
    g = lambda x, s: 0.6 * torch.stack([x[1], -x[0] + 0.2 + 0.6 * s])       # noqa: E731
    for a, b in zip(xs, ref_solve(g, x0, 3, method)):
        torch.testing.assert_close(a, b, rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("kw", [dict(), dict(style="llama"), dict(weights="shared"), dict(bias=False)])
def test_temporal_tensors_are_the_hypernetwork_rows(kw):
    m = model_of(**kw)
    c = m.config
    times = [0.0, 0.123, 0.5, 1.0]
    got = m.temporal(torch.tensor(times, dtype=F64))                          # {name: (weight (T, ...), bias)}
    assert set(got) == {"ln1", "qkv", "o", "ln2", "fc", "proj"}
    for k, t in enumerate(times):
        ref = ref_weights(m, t)
        for name, (weight, bias) in got.items():
            torch.testing.assert_close(weight[k], ref[name][0], rtol=1e-12, atol=1e-12)
            if ref[name][1] is None:
                assert bias is None, name
            else:
                torch.testing.assert_close(bias[k], ref[name][1], rtol=1e-12, atol=1e-12)
    if c.weights == "temporal":                                               # W really depends on t
        assert (got["qkv"][0][1] - got["qkv"][0][2]).abs().max() > 1e-3


@pytest.mark.parametrize("kw", [dict(), dict(style="llama"), dict(head="cls", n_classes=3),
                                dict(head="cls", n_classes=3, style="llama", bias=False)])
def test_vector_field_against_the_reference(kw):
    m = model_of(everything=True, **kw)
    g = torch.Generator().manual_seed(5)
    X = torch.randn(2, 6, 8, generator=g, dtype=F64)
    mask = None
    if m.config.head != "lm":                                                 # padding: keys 4, 5 of sequence 1
        mask = torch.ones(2, 6, dtype=torch.bool)
        mask[1, 4:] = False
    for t in (0.3, 0.75):
        w = ref_weights(m, t)
        got = m.vector_field(X, t, mask)
        for b in range(2):
            ref = ref_f(X[b], w, m.config, None if mask is None else mask[b].tolist())
            torch.testing.assert_close(got[b], ref, rtol=1e-11, atol=1e-11)
    # small X: the norms' eps = 1e-5 matters
    torch.testing.assert_close(m.vector_field(1e-3 * X, 0.3, mask)[0],
                               ref_f(1e-3 * X[0], ref_weights(m, 0.3), m.config, None), rtol=1e-11, atol=1e-11)


CONFIGS = [dict(), dict(style="llama", method="rk4"), dict(head="cls", n_classes=3, method="midpoint"),
           dict(head="match", n_classes=3, style="llama", weights="shared"), dict(head="cls", n_classes=4, bias=False),
           dict(method="rk4", weights="shared", n_layer=2), dict(head="match", n_classes=2, method="rk4")]


@pytest.mark.parametrize("kw", CONFIGS)
def test_model_forward_against_the_reference(kw):
    m = model_of(everything=True, **kw)
    c = m.config
    g = torch.Generator().manual_seed(7)
    if c.head == "lm":
        idx = torch.randint(1, 23, (2, 5), generator=g)
        targets = torch.randint(0, 23, (2, 5), generator=g)
        targets[0, 1] = targets[1, 4] = -1                                    # ignored positions
    else:
        idx = torch.randint(1, 23, (2, 2, 5) if c.head == "match" else (2, 5), generator=g)
        idx[1, ..., 3:] = 0                                                   # padding
        targets = torch.randint(0, c.n_classes, (2,), generator=g)
    logits, loss = m(idx, targets)
    ref_logits, ref_loss = ref_forward(m, idx, targets)
    torch.testing.assert_close(logits, ref_logits, rtol=1e-10, atol=1e-10)
    assert loss.item() == pytest.approx(ref_loss.item(), rel=1e-6)            # the loss is taken in float32
    assert m(idx)[1] is None
    if c.head != "match":                                                     # the stored trajectory, no final norm
        states, mask = m.hidden_states(idx)
        assert len(states) == c.n_layer + 1
        for b, seq in enumerate(idx):
            for a, r in zip(states, ref_trajectory(m, seq)):
                torch.testing.assert_close(a[b], r, rtol=1e-10, atol=1e-10)
        if c.head == "lm":
            assert mask is None
        else:
            assert torch.equal(mask, torch.cat([torch.ones(2, 1, dtype=torch.bool), idx != 0], 1))


def test_dropout_is_on_embeddings_and_both_branches():
    # p = 1 in training: X(0) = 0 and f = 0, so X(1) = 0 and every position's logits are ln_f(0) W_E^T = beta W_E^T;
    # in eval mode the same model is the reference (no dropout)
    m = model_of(everything=True)
    m.config.dropout = 1.0
    x = tokens(L=5)
    torch.testing.assert_close(m(x)[0], ref_forward(m, x)[0], rtol=1e-10, atol=1e-10)
    m.train()
    expected = (m.ln_f.bias @ m.wte.weight.T).expand(2, 5, -1)
    torch.testing.assert_close(m(x)[0], expected, rtol=1e-12, atol=1e-12)
    X = torch.randn(2, 5, 8, dtype=F64)
    assert m.vector_field(X, 0.5).abs().max() == 0


def test_rope_and_rms_norm_with_numbers():
    # d = 4: channel pairs (0, 2) and (1, 3) rotate by p * 1 and p * 10000^(-1/2) = p / 100
    x = torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=F64).expand(1, 1, 3, 4)
    y = dq.rope(x)[0, 0]
    torch.testing.assert_close(y[0], x[0, 0, 0])                               # position 0 is not rotated
    for p in (1, 2):
        a, b = p * 1.0, p * 0.01
        torch.testing.assert_close(y[p], torch.tensor([
            1 * math.cos(a) - 3 * math.sin(a), 2 * math.cos(b) - 4 * math.sin(b),
            3 * math.cos(a) + 1 * math.sin(a), 4 * math.cos(b) + 2 * math.sin(b)], dtype=F64), rtol=1e-14, atol=1e-14)
    z = torch.randn(6, 8, dtype=F64, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(dq.rope(z[None, None])[0, 0], ref_rope(z), rtol=1e-13, atol=1e-13)
    # RMSNorm of (3, 4): mean square 12.5, gamma (2, -1)
    out = dq.rms_norm(torch.tensor([3.0, 4.0], dtype=F64), torch.tensor([2.0, -1.0], dtype=F64))
    torch.testing.assert_close(out, torch.tensor([6.0, -4.0], dtype=F64) / math.sqrt(12.5 + 1e-5), rtol=1e-15, atol=0)


@pytest.mark.parametrize("n", [5, 2])
def test_discretize_on_another_grid_reads_w_at_the_new_times(n):
    # temporal weights (not shared: there W(t) is one matrix and any time would do); block k holds W(t_{k+1}),
    # t_k = k / n on the NEW grid, and the discrete model is the Euler solution of the ODE's own f on it
    m = model_of(everything=True, n_layer=3)
    d = m.discretize(n)
    assert d.config.n_layer == n and d.config.discrete and d.times() == pytest.approx([(k + 1) / n for k in range(n)])
    assert d.dt() == pytest.approx(1 / n) and not d.training and d.wte.weight.dtype == F64
    for k, block in enumerate(d.blocks):
        ref, got = ref_weights(m, (k + 1) / n), ref_block_weights(block)
        for name in ref:
            for a, b in zip(got[name], ref[name]):
                torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    x = tokens(L=5)
    logits = d(x)[0]
    for b, seq in enumerate(x):
        X0, keys = ref_embed(m, seq)
        traj = ref_solve(lambda X, t: ref_f(X, ref_weights(m, t), m.config, keys), X0, n, "euler")
        torch.testing.assert_close(d.hidden_states(x)[0][-1][b], traj[-1], rtol=1e-10, atol=1e-10)
        ref = ref_norm(traj[-1], m.ln_f.weight, m.ln_f.bias, "gpt") @ m.wte.weight.T
        torch.testing.assert_close(logits[b], ref, rtol=1e-10, atol=1e-10)
    assert m.discretize(3).train().training and m.train().discretize(2).training


def test_lora_forward_uses_the_scale():
    # x W^T + b + s (x A^T) B^T, s = alpha / r; merged_weight W + s B A
    torch.manual_seed(0)
    lin = dq.LoRALinear(5, 3, bias=True, r=2, scale=1.7).double()
    with torch.no_grad():
        lin.lora_B.normal_()
        lin.bias.normal_()
    x = torch.randn(4, 5, dtype=F64)
    W, b, A, B = lin.weight, lin.bias, lin.lora_A, lin.lora_B
    torch.testing.assert_close(lin(x), x @ W.T + b + 1.7 * (x @ A.T) @ B.T, rtol=1e-13, atol=1e-13)
    torch.testing.assert_close(lin.merged_weight(), W + 1.7 * B @ A, rtol=1e-13, atol=1e-13)
    # the whole LoRA model (B moved off zero) against the reference with W + s B A in every block
    m = model_of(everything=True)
    lo = m.discretize(3).with_lora(2, alpha=3.0)
    assert lo.config.lora_scale == 1.5
    assert not lo.training and m.discretize(3).train().with_lora(2, 3.0).training   # the mode carries over
    with torch.no_grad():
        for name, p in lo.named_parameters():
            if "lora_B" in name:
                p.normal_(std=0.3)
    x = tokens(L=5)
    torch.testing.assert_close(lo(x)[0], ref_forward(lo, x)[0], rtol=1e-10, atol=1e-10)
    assert (lo(x)[0] - m(x)[0]).abs().max() > 1e-3                          # the update changed the model


def test_lora_a_starts_as_nn_linear_and_b_at_zero():
    torch.manual_seed(0)
    lo = dq.Model(tiny(n_embd=32, discrete=True, lora_r=4, lora_scale=2.0))
    for name in ("qkv", "fc", "proj"):
        lin = getattr(lo.blocks[0], name)
        bound = 1 / math.sqrt(lin.in_features)                               # kaiming_uniform_(a=sqrt(5))
        A = lin.lora_A
        assert A.abs().max() <= bound and A.abs().max() > 0.9 * bound, name
        assert A.std().item() == pytest.approx(bound / math.sqrt(3), rel=0.15), name
        assert torch.equal(lin.lora_B, torch.zeros_like(lin.lora_B))
    # the draw itself: nn.Linear's weight and bias, then A from the same generator (uninitialised memory, which
    # can hold a freed weight of the same shape, would pass the statistics above)
    torch.manual_seed(3)
    lin = dq.LoRALinear(32, 16, True, 4, 2.0)
    torch.manual_seed(3)
    ref = torch.nn.Linear(32, 16)
    A = torch.empty(4, 32)
    torch.nn.init.uniform_(A, -1 / math.sqrt(32), 1 / math.sqrt(32))  # kaiming_uniform_(a=sqrt(5)): bound 1/sqrt(in)
    assert torch.equal(lin.weight, ref.weight) and torch.equal(lin.bias, ref.bias)
    torch.testing.assert_close(lin.lora_A, A, rtol=0, atol=1e-7)


def n_params(c):
    """The parameter count from the formulas: hypernetwork Lin1 (2S+1 -> d_t), Lin2 (d_t -> d_t) per module,
    rows P_0..P_dt of every tensor; or one GPT block per step (discrete), LoRA r (in + out) per map."""
    D, V = c.n_embd, c.vocab_size
    dt, S = c.time_dim, c.time_freqs
    maps = widths(c)
    n = V * D + D * (c.head != "lm")                                          # wte (tied lm head), CLS
    if c.style == "gpt":
        n += (c.block_size + (c.head != "lm")) * D                            # learned positions (+ CLS)
    norm = D * (1 + (c.style == "gpt" and c.bias))                            # gamma, beta
    n += norm                                                                 # ln_f
    if c.discrete:
        per_step = 2 * norm + sum(o * i + o * c.bias + c.lora_r * (i + o) for o, i in maps.values())
        n += c.n_layer * per_step
    else:
        rows = 1 if c.weights == "shared" else 1 + dt
        hyper = 0 if c.weights == "shared" else (2 * S + 1) * dt + dt + dt * dt + dt
        n += sum(hyper + rows * (o * i + o * c.bias) for o, i in maps.values()) + 2 * (hyper + rows * norm)
    if c.head == "cls":
        n += D * 4 * D + 4 * D + 4 * D * c.n_classes + c.n_classes
    elif c.head == "match":
        n += 4 * D * 4 * D + 4 * D + 4 * D * 2 * D + 2 * D + 2 * D * c.n_classes + c.n_classes
    return n


@pytest.mark.parametrize("kw", [dict(), dict(style="llama"), dict(weights="shared"), dict(bias=False),
                                dict(head="cls", n_classes=3), dict(head="match", n_classes=2, style="llama"),
                                dict(discrete=True), dict(discrete=True, style="llama", lora_r=2),
                                dict(discrete=True, head="cls", bias=False, lora_r=3, n_layer=5)])
def test_parameter_counts_from_the_formulas(kw):
    c = tiny(n_embd=12, n_head=2, **kw)
    m = dq.Model(c)
    assert m.num_params() == sum(p.numel() for p in m.parameters()) == n_params(c)
    if c.head == "lm":
        assert m.lm_head.weight is m.wte.weight


def test_init():
    torch.manual_seed(0)
    c = tiny(n_embd=64, n_head=4, time_dim=20, time_freqs=128, vocab_size=300, block_size=64, head="cls")
    m = dq.Model(c)
    for name, mod in m.temporal.named_children():                            # W_0 = 0, biases 0, LayerNorm rows 0
        for p in (getattr(mod, k, None) for k in ("b", "G", "H")):
            assert p is None or torch.equal(p, torch.zeros_like(p)), name
        if hasattr(mod, "W"):
            assert torch.equal(mod.W[0], torch.zeros_like(mod.W[0]))
            # W_i ~ N(0, s^2), s = 0.02 / sqrt(mean_t |e(t)|^2) over 257 times: W(t) has mean square 0.02^2
            t = torch.linspace(0, 1, 257)
            W = mod(dq.time_features(t, 128))[0]
            assert W.square().mean().item() == pytest.approx(0.02 ** 2, rel=0.06), name
            e = mod.e(dq.time_features(t, 128))
            s = 0.02 / e.square().sum(-1).mean().sqrt()
            assert mod.W[1:].std().item() == pytest.approx(s.item(), rel=0.03), name
    first = next(l for l in m.classifier.modules() if isinstance(l, nn.Linear))
    for p in (m.wte.weight, m.wpe.weight, first.weight):                      # GPT-2: N(0, 0.02), biases 0
        assert p.std().item() == pytest.approx(0.02, rel=0.05)
    assert all(torch.equal(p, torch.zeros_like(p)) for n, p in m.classifier.named_parameters() if "bias" in n)
    assert torch.equal(m.cls, torch.zeros_like(m.cls))
    assert torch.equal(m.ln_f.weight, torch.ones(64)) and torch.equal(m.ln_f.bias, torch.zeros(64))
    shared = dq.Model(tiny(n_embd=64, weights="shared"))
    assert shared.temporal.fc.W.std().item() == pytest.approx(0.02, rel=0.05)
    assert torch.equal(shared.temporal.fc.b, torch.zeros_like(shared.temporal.fc.b))


@pytest.mark.parametrize("kw", [dict(), dict(head="cls", n_classes=3, style="llama"), dict(discrete=True),
                                dict(discrete=True, lora_r=2, head="match", n_classes=2)])
def test_which_parameters_receive_gradient(kw):
    m = model_of(everything=True, **kw).train()
    g = torch.Generator().manual_seed(0)
    if m.config.head == "lm":
        x = torch.randint(1, 23, (2, 12), generator=g)                       # every position of wpe used
        y = torch.randint(0, 23, (2, 12), generator=g)
    else:
        x = torch.randint(1, 23, (2, 2, 11) if m.config.head == "match" else (2, 11), generator=g)
        y = torch.randint(0, m.config.n_classes, (2,), generator=g)
    m(x, y)[1].backward()
    for name, p in m.named_parameters():
        frozen = m.config.lora_r and not ("lora_" in name or name.split(".")[0] in ("wte", "wpe", "cls", "classifier"))
        if frozen:
            assert not p.requires_grad and p.grad is None, name
        else:
            assert p.grad is not None and p.grad.abs().max() > 0, name


def test_attention_weights_times_and_grid():
    m = model_of(everything=True)
    D = 8
    for t in (0.25, 2 / 3):
        W = m.attention_weights(t)
        Wqkv, Wo = ref_weights(m, t)["qkv"][0], ref_weights(m, t)["o"][0]
        for key, ref in (("q", Wqkv[:D].T), ("k", Wqkv[D:2 * D].T), ("v", Wqkv[2 * D:].T), ("o", Wo.T)):
            torch.testing.assert_close(W[key], ref, rtol=1e-12, atol=1e-12)
    assert m.times() == pytest.approx([1 / 3, 2 / 3, 1.0]) and m.dt() == pytest.approx(1 / 3)
    for method in ("midpoint", "rk4"):                                        # the Euler grid, whatever the solver
        assert model_of(perturb=False, method=method, n_layer=4).times() == pytest.approx([0.25, 0.5, 0.75, 1.0])
    d = m.discretize(4)
    X = torch.randn(1, 4, D, dtype=F64)
    for k, t in enumerate(d.times()):                                          # f_k of the grid at t_{k+1}
        torch.testing.assert_close(d.vector_field(X, t)[0], ref_f(X[0], ref_block_weights(d.blocks[k]), d.config),
                                   rtol=1e-11, atol=1e-11)
        torch.testing.assert_close(d.attention_weights(t)["v"], d.blocks[k].qkv.weight[2 * D:].T)
    for off_grid in (0.1, 0.0, 1.25):
        with pytest.raises(ValueError):
            d.vector_field(X, off_grid)


# ----------------------------------------------------------------------------------------------
# train.py: pretrain, fine-tune with another step count and LoRA, evaluate the fine-tuned checkpoint

@pytest.fixture(scope="module")
def ptb(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ptb")
    g = torch.Generator().manual_seed(0)
    words = [f"w{i}" for i in range(30)] + ["<unk>"]
    for split, n in (("train", 3000), ("valid", 400), ("test", 400)):
        ids = torch.randint(0, len(words), (n,), generator=g).tolist()
        lines = [" ".join(words[i] for i in ids[j:j + 20]) for j in range(0, n, 20)]
        (folder / f"ptb.{split}.txt").write_text("\n".join(lines) + "\n")
    return folder


def test_train_finetune_with_other_steps_and_lora(ptb, tmp_path):
    common = ["--task", "ptb", "--data_dir", str(ptb), "--batch_size", "4", "--eval_iters", "2", "--log_interval", "1"]
    tiny_flags = ["--n_layer", "2", "--n_embd", "16", "--n_head", "2", "--time_dim", "4", "--time_freqs", "8",
                  "--block_size", "16"]
    base = tmp_path / "base"
    train.main(["--model", "diffeqformer", *common, *tiny_flags, "--max_iters", "3", "--out_dir", str(base)])
    ft = tmp_path / "ft"
    m = train.main(["--init_from", str(base / "ckpt.pt"), *common, "--steps", "3", "--lora_rank", "2",
                    "--lora_alpha", "4", "--max_iters", "3", "--out_dir", str(ft)])
    ckpt = torch.load(ft / "ckpt.pt", map_location="cpu", weights_only=True)   # (trained on a GPU if there is one)
    assert ckpt["config"]["discrete"] and ckpt["config"]["n_layer"] == 3
    assert ckpt["config"]["lora_r"] == 2 and ckpt["config"]["lora_scale"] == 2.0
    base_ckpt = torch.load(base / "ckpt.pt", map_location="cpu", weights_only=True)
    src = base_ckpt["model"]
    assert not any(k.startswith("temporal.") for k in ckpt["model"])
    # LoRA: the frozen block weights are those discretize made from the base model
    base_model = config.build_model("diffeqformer", base_ckpt["config"])
    base_model.load_state_dict(src)
    expected = base_model.discretize(3).blocks[2].fc.weight
    assert torch.equal(ckpt["model"]["blocks.2.fc.weight"], expected)
    assert not torch.equal(ckpt["model"]["wte.weight"], src["wte.weight"])  # embeddings trained
    again = train.main(["--init_from", str(ft / "ckpt.pt"), "--eval_only", *common[:4], "--out_dir", str(tmp_path / "ev")])
    assert again["val_loss"] == pytest.approx(m["val_loss"], rel=1e-6)
    one = train.main(["--init_from", str(base / "ckpt.pt"), *common, "--steps", "1", "--lora_rank", "0",
                      "--max_iters", "1", "--out_dir", str(tmp_path / "one")])   # the fewest steps: one Euler step
    assert one["config"]["n_layer"] == 1 and one["config"]["discrete"]
    # --steps on a model that is not a DiffEqFormer ODE is a usage error
    with pytest.raises(train.UsageError):
        train.main(["--init_from", str(ft / "ckpt.pt"), *common, "--steps", "2", "--out_dir", str(tmp_path / "x")])
    other = tmp_path / "simpletron"                          # nor on another model
    train.main(["--model", "simpletron", *common, "--n_layer", "1", "--n_embd", "16", "--n_head", "2",
                "--block_size", "16", "--max_iters", "1", "--out_dir", str(other)])
    with pytest.raises(train.UsageError, match="needs --init_from CKPT, a checkpoint of the DiffEqFormer ODE"):
        train.main(["--init_from", str(other / "ckpt.pt"), *common, "--steps", "2", "--out_dir", str(tmp_path / "y")])
    for flags in (["--steps", "2"], ["--lora_rank", "2"], ["--steps", "2", "--lora_rank", "2"]):   # nor without a source
        with pytest.raises(train.UsageError, match="needs --init_from CKPT"):
            train.main(["--model", "diffeqformer", *common, *tiny_flags, *flags, "--out_dir", str(tmp_path / "z")])
    assert os.path.exists(ft / "metrics.json")


def test_config_defaults():
    """What Model(Config()) builds (train.py's presets override them): a change here changes every user's model."""
    assert dataclasses.asdict(dq.Config()) == dict(vocab_size=32, block_size=1024, n_layer=4,
        n_head=4, n_embd=128, dropout=0.0, bias=True, head="lm", n_classes=10, style="gpt",
        weights="temporal", time_dim=20, time_freqs=128, method="euler", checkpointing=False,
        discrete=False, lora_r=0, lora_scale=1.0)
