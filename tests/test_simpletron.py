"""SimpleTRON and its softmax baseline, each line of the maths held against a reference written out here the slow
obvious way (a loop over samples, heads and positions, a dense n x n matrix, a hand-worked case), in float64:
the attention functions, every Block wiring of Table 1 under every norm, the whole Model (CLS token, learned
positions, heads, loss), the Orthogonal Transformer's weights, attention transfer, parameter counts from the
papers' formulas, which parameters receive gradient, and the O(L) cost counted in FLOPs."""

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

import simpletron as st

DT = torch.float64


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny matrices: one thread is faster, and a second one waits for a core on a shared 2-core machine."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def qkv(B=2, H=3, L=37, d=5, dtype=DT, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, L, d, generator=g, dtype=dtype) for _ in range(3)]


# ----------------------------------------------------------------------------------------------
# References, written out without the code under test

# Table 1 and Fig. 4 of the SimpleTRON paper, and the ordinary Transformer block
HAS_OUT_LINEAR = {"simple": False, "res": False, "resl": True, "vanilla": True}   # (softmax attention: always)
EXTRA_SKIP = {"simple": False, "res": True, "resl": True, "vanilla": False}


def ref_cayley(A):
    """(I - A)(I + A)^{-1} with an explicit inverse."""
    I = torch.eye(A.shape[-1], dtype=A.dtype)
    return (I - A) @ torch.linalg.inv(I + A)


def ref_orthogonal_weight(P, n_in, n_out):
    """The Orthogonal Transformer's (n_out, n_in) weight: orthogonal m x m Cayley blocks of P_i - P_i^T,
    one under the other when n_out > n_in (each output block reads the whole input), side by side otherwise."""
    blocks = [ref_cayley(P[i] - P[i].T) for i in range(P.shape[0])]
    return torch.cat(blocks, dim=0 if n_out >= n_in else 1)


def ref_linear(lin, x, n_in, n_out):
    W = ref_orthogonal_weight(lin.P, n_in, n_out) if isinstance(lin, st.OrthogonalLinear) else lin.weight
    assert W.shape == (n_out, n_in)
    y = x @ W.T
    return y if lin.bias is None else y + lin.bias


def ref_layernorm(ln, x):
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)             # biased variance, eps 1e-5 (BERT, GPT-2)
    y = (x - mu) / torch.sqrt(var + 1e-5) * ln.weight
    return y if ln.bias is None else y + ln.bias


def gelu_erf(x):                                             # the exact GELU, x Phi(x)
    return 0.5 * x * (1 + torch.erf(x / math.sqrt(2)))


# Config.causal_scale, our extension: the factor of the causal y_t = Q_t (sum_{s<=t} K_s^T V_s) * scale(t), t from 1
CAUSAL_SCALE = {"sqrt_t": lambda t, block_size: 1 / math.sqrt(t),              # the default
                "t": lambda t, block_size: 1 / t,                              # the mean over s <= t
                "sqrt_block": lambda t, block_size: 1 / math.sqrt(block_size),  # one constant
                "none": lambda t, block_size: 1.0}


def ref_attention_heads(q, k, v, real, kind, causal, causal_scale="sqrt_t", block_size=None):
    """One sample, one head: q, k, v (L, d), real (L,) bool. A loop over query positions t."""
    L, d = q.shape
    y = torch.zeros_like(q)
    for t in range(L):
        keys = [s for s in range(L) if (real[s] and (not causal or s <= t))]
        if kind == "softmax":
            scores = torch.stack([q[t] @ k[s] for s in keys]) / math.sqrt(d)
            w = torch.exp(scores - scores.max())
            y[t] = sum(wi * v[s] for wi, s in zip(w / w.sum(), keys))
        elif causal:                                         # no softmax: sum_{s<=t} (q_t . k_s) v_s * scale(t + 1)
            y[t] = sum((q[t] @ k[s]) * v[s] for s in keys) * CAUSAL_SCALE[causal_scale](t + 1, block_size)
        else:                                                # sum_s (q_t . k_s) v_s / sqrt(n), n the real tokens:
            y[t] = sum((q[t] @ k[s]) * v[s] for s in keys) / math.sqrt(int(real.sum()))   # whatever causal_scale
    return y


def ref_self_attention(attn, x, mask, cfg, drop=1.0):
    B, L, D = x.shape
    H, d = cfg.n_head, D // cfg.n_head
    z = ref_linear(attn.qkv, x, D, 3 * D)                    # (B, L, 3D) = [Q | K | V], head h at h*d:(h+1)*d
    y = torch.zeros_like(x)
    for b in range(B):
        real = torch.ones(L, dtype=torch.bool) if mask is None else mask[b]
        for h in range(H):
            q, k, v = (z[b, :, part * D + h * d: part * D + (h + 1) * d] for part in range(3))
            y[b, :, h * d:(h + 1) * d] = ref_attention_heads(q, k, v, real, cfg.attention, cfg.head == "lm",
                                                             cfg.causal_scale, cfg.block_size)
    if HAS_OUT_LINEAR[cfg.variant] or cfg.attention == "softmax":
        y = ref_linear(attn.out, y, D, D)
    return drop * y


def ref_mlp(mlp, x, cfg, drop=1.0):
    D, hidden = cfg.n_embd, cfg.mlp_ratio * cfg.n_embd
    return drop * ref_linear(mlp.proj, gelu_erf(ref_linear(mlp.fc, x, D, hidden)), hidden, D)


def ref_block(block, x, mask, cfg, drops=(1.0, 1.0)):
    A = lambda h: ref_self_attention(block.attn, h, mask, cfg, drops[0])   # noqa: E731
    M = lambda h: ref_mlp(block.mlp, h, cfg, drops[1])                     # noqa: E731
    if cfg.norm == "post":                                   # LN(x + f(x)), twice
        h = ref_layernorm(block.ln1, x + A(x))
        h = ref_layernorm(block.ln2, h + M(h))
    elif cfg.norm == "pre":                                  # x + f(LN(x)), twice
        h = x + A(ref_layernorm(block.ln1, x))
        h = h + M(ref_layernorm(block.ln2, h))
    else:                                                    # ReZero: x + α f(x), twice, one α
        h = x + block.alpha * A(x)
        h = h + block.alpha * M(h)
    return h + x if EXTRA_SKIP[cfg.variant] else h


def ref_encode(model, idx, drops=(1.0, 1.0, 1.0)):
    """Embeddings (CLS first for cls/match), learned positions, the blocks, the final LayerNorm."""
    cfg = model.config
    B, L = idx.shape
    x = torch.stack([torch.stack([model.wte.weight[i] for i in row]) for row in idx])   # (B, L, D)
    mask = idx != 0
    if cfg.head != "lm":                                     # the CLS token is a real token, position 0
        x = torch.cat([model.cls.expand(B, 1, -1), x], 1)
        mask = torch.cat([torch.ones(B, 1, dtype=torch.bool), mask], 1)
    x = drops[0] * (x + model.wpe.weight[: x.shape[1]])
    mask = None if cfg.head == "lm" else mask                # language models are not padded
    for block in model.blocks:
        x = ref_block(block, x, mask, cfg, drops[1:])
    return x if cfg.norm == "rezero" else ref_layernorm(model.ln_f, x)


def ref_forward(model, idx, targets=None, drops=(1.0, 1.0, 1.0)):
    cfg = model.config
    relu = lambda z: z.clamp_min(0)                          # noqa: E731
    lin = lambda layer, z: z @ layer.weight.T + layer.bias   # noqa: E731
    if cfg.head == "lm":
        logits = ref_encode(model, idx, drops) @ model.wte.weight.T     # tied: lm head = wte
    else:
        if cfg.head == "cls":
            feats = ref_encode(model, idx, drops)[:, 0]      # the CLS token's state
        else:
            u, v = ref_encode(model, idx[:, 0], drops)[:, 0], ref_encode(model, idx[:, 1], drops)[:, 0]
            feats = torch.cat([u, v, u * v, u - v], -1)
        c = model.classifier
        if cfg.head == "cls":                                # Dense, ReLU, Dense
            logits = lin(c[2], relu(lin(c[0], feats)))
        else:                                                # Dense, ReLU, Dense, ReLU, Dense
            logits = lin(c[4], relu(lin(c[2], relu(lin(c[0], feats)))))
    if targets is None:
        return logits, None
    lp, t = logits.reshape(-1, logits.shape[-1]).log_softmax(-1), targets.reshape(-1)
    keep = t != -1                                           # lm: -1 is ignored
    return logits, -lp[keep].gather(1, t[keep, None]).mean()


def randomize(model, seed=0, scale=1.0):
    """Every parameter redrawn (none of the init's zeros and ones left), so that every path of the maths shows
    in the output; matrices ~ 1/sqrt(fan-in), vectors and scalars ~ 0.5 (LayerNorm gains, biases, ReZero's α)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            r = torch.randn(p.shape, generator=g, dtype=p.dtype)
            p.copy_(scale * r / math.sqrt(p.shape[-1]) if p.ndim >= 2 else 0.5 * r + 0.2)
    return model


def tiny(**kw):
    base = dict(vocab_size=20, block_size=32, n_layer=2, n_head=2, n_embd=16, dropout=0.0, n_classes=3)
    return st.Model(st.Config(**{**base, **kw})).double().eval()


def small(seed=0, **kw):
    """A randomized model small enough for the loop references."""
    base = dict(vocab_size=11, block_size=9, n_layer=2, n_head=2, n_embd=8, mlp_ratio=2, dropout=0.0, n_classes=3)
    torch.manual_seed(seed)
    return randomize(st.Model(st.Config(**{**base, **kw})).double().eval(), seed)


def small_batch(head, seed=0, L=7):
    """Two samples with padding (ids 0) for cls/match; for lm a few ids 0 inside (lm is not masked)."""
    g = torch.Generator().manual_seed(seed)
    if head == "match":
        idx = torch.randint(1, 11, (3, 2, L), generator=g)
        idx[0, 0, 4:], idx[1, 1, 2:], idx[2, 0, 1:] = 0, 0, 0
        return idx, torch.tensor([2, 0, 1])
    idx = torch.randint(1, 11, (3, L), generator=g)
    if head == "cls":
        idx[0, 4:], idx[2, :] = 0, 0                         # 4 real tokens; none (CLS only)
        return idx, torch.tensor([2, 0, 1])
    idx[0, 2], idx[1, 5] = 0, 0
    targets = torch.randint(0, 11, (3, L), generator=g)
    targets[0, :3], targets[2, 6] = -1, -1
    return idx, targets


# ----------------------------------------------------------------------------------------------
# The attention functions

def test_simple_attention_equals_quadratic_form_with_padding():
    q, k, v = qkv()
    mask = torch.ones(2, 37, dtype=torch.bool)
    mask[0, 30:] = False                                    # sample 0 has 30 real tokens, sample 1 has 37
    y = st.simple_attention(q, k, v, mask)
    for b, n in ((0, 30), (1, 37)):
        # the quadratic form on the real tokens only: (Q K^T) V / sqrt(n)
        ref = (q[b, :, :n] @ k[b, :, :n].transpose(-2, -1)) @ v[b, :, :n] / math.sqrt(n)
        torch.testing.assert_close(y[b, :, :n], ref, rtol=1e-12, atol=1e-12)


def test_simple_attention_loop_reference_with_scattered_padding():
    """Padding anywhere (not only at the end), a sample with one real token, one with none (output 0, not NaN);
    every row, padded ones included, is Q_t (sum over real s of K_s^T V_s) / sqrt(n)."""
    q, k, v = qkv(B=4, H=2, L=6, d=3)
    mask = torch.tensor([[1, 0, 1, 1, 0, 1], [1, 1, 1, 1, 1, 1], [0, 0, 1, 0, 0, 0], [0, 0, 0, 0, 0, 0]], dtype=torch.bool)
    y = st.simple_attention(q, k, v, mask)
    for b in range(3):
        for h in range(2):
            torch.testing.assert_close(y[b, h], ref_attention_heads(q[b, h], k[b, h], v[b, h], mask[b], "simple", False),
                                       rtol=1e-12, atol=1e-12)
    assert torch.equal(y[3], torch.zeros_like(y[3]))


def test_simple_attention_hand_worked():
    # d = 1: K^T V = 1*2 + 1*4 (the third token is padding) = 6, n = 2: y = q * 6 / sqrt(2)
    q = torch.tensor([1.0, 2.0, 3.0], dtype=DT).view(1, 1, 3, 1)
    k = torch.tensor([1.0, 1.0, 5.0], dtype=DT).view(1, 1, 3, 1)
    v = torch.tensor([2.0, 4.0, 6.0], dtype=DT).view(1, 1, 3, 1)
    y = st.simple_attention(q, k, v, torch.tensor([[True, True, False]]))
    torch.testing.assert_close(y.flatten(), torch.tensor([6.0, 12.0, 18.0], dtype=DT) / math.sqrt(2))
    # without a mask: n = 3, K^T V = 2 + 4 + 30 = 36
    torch.testing.assert_close(st.simple_attention(q, k, v, None).flatten(), torch.tensor([36.0, 72.0, 108.0], dtype=DT) / math.sqrt(3))


def test_simple_attention_without_mask_uses_full_length():
    q, k, v = qkv(L=11)
    ref = (q @ k.transpose(-2, -1)) @ v / math.sqrt(11)
    torch.testing.assert_close(st.simple_attention(q, k, v, None), ref, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("L", [1, 63, 64, 150])
def test_causal_simple_attention_equals_masked_quadratic_form(L):
    q, k, v = qkv(L=L)
    scores = (q @ k.transpose(-2, -1)).masked_fill(~torch.ones(L, L, dtype=torch.bool).tril(), 0)
    t = torch.arange(1, L + 1, dtype=torch.float64)
    ref = scores @ v / t.sqrt()[:, None]                    # y_t = Q_t (sum_{s<=t} K_s^T V_s) / sqrt(t)
    torch.testing.assert_close(st.causal_simple_attention(q, k, v, chunk=64), ref, rtol=1e-11, atol=1e-11)


@pytest.mark.parametrize("causal_scale", CAUSAL_SCALE)
@pytest.mark.parametrize("L,chunk", [(11, 4), (12, 4), (3, 8), (9, 1)])
def test_causal_simple_attention_loop_over_t(L, chunk, causal_scale):
    """y_t = Q_t (sum_{s<=t} K_s^T V_s) * scale(t), t = 1..L, one position at a time; any chunk size, every scale."""
    q, k, v = qkv(B=2, H=2, L=L, d=3)
    y = st.causal_simple_attention(q, k, v, chunk, causal_scale, block_size=16)
    if causal_scale == "sqrt_t":                             # the default, as the model calls it
        torch.testing.assert_close(st.causal_simple_attention(q, k, v, chunk=chunk), y, rtol=0, atol=0)
    for b in range(2):
        for h in range(2):
            state = torch.zeros(3, 3, dtype=DT)
            for t in range(L):
                state = state + torch.outer(k[b, h, t], v[b, h, t])
                torch.testing.assert_close(y[b, h, t], q[b, h, t] @ state * CAUSAL_SCALE[causal_scale](t + 1, 16),
                                           rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("causal_scale,want", [("sqrt_t", [1, 2 ** 0.5, 3 ** 0.5, 2, 5 ** 0.5]), ("t", [1] * 5),
                                               ("sqrt_block", [0.25, 0.5, 0.75, 1, 1.25]), ("none", [1, 2, 3, 4, 5])])
def test_causal_simple_attention_hand_worked(causal_scale, want):
    # q = k = v = 1, d = 1: y_t = t * scale(t): sqrt(t), t / t = 1, t / sqrt(16) = t / 4, t
    ones = torch.ones(1, 1, 5, 1, dtype=DT)
    torch.testing.assert_close(st.causal_simple_attention(ones, ones, ones, 2, causal_scale, 16).flatten(),
                               torch.tensor(want, dtype=DT))
    with pytest.raises(ValueError, match="causal_scale"):
        st.causal_simple_attention(ones, ones, ones, 2, "sqrt")


def test_the_default_causal_scale_gives_the_numbers_of_before_bit_for_bit():
    """causal_scale "sqrt_t" is what the code computed before the option: the unscaled sums times rsqrt(t) in the
    parallel form, divided by sqrt(t) in the recurrent step, the same bits in float32 and bfloat16."""
    for dtype in (torch.float32, torch.bfloat16):
        q, k, v = qkv(L=70, dtype=dtype)
        t = torch.arange(1, 71, dtype=dtype)
        unscaled = st.causal_simple_attention(q, k, v, 64, "none")
        assert torch.equal(st.causal_simple_attention(q, k, v), unscaled * t.rsqrt()[:, None])
        S = k[:, :, :4].transpose(-2, -1) @ v[:, :, :4]
        y, _ = st.causal_simple_attention_step(q[:, :, 4:5], k[:, :, 4:5], v[:, :, 4:5], S, 5, "none")
        assert torch.equal(st.causal_simple_attention_step(q[:, :, 4:5], k[:, :, 4:5], v[:, :, 4:5], S, 5)[0],
                           y / math.sqrt(5))


@pytest.mark.parametrize("causal", [False, True])
def test_softmax_fused_path_equals_reference(causal):
    q, k, v = qkv(L=20)
    mask = None if causal else torch.arange(20)[None, :] < torch.tensor([[14], [20]])
    y = st.softmax_attention(q, k, v, mask, causal)
    ref = st.softmax_attention_reference(q, k, v, mask, causal)
    torch.testing.assert_close(y, ref, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("causal", [False, True])
def test_softmax_attention_loop_reference(causal):
    """softmax(q_t . k_s / sqrt(d)) over the keys s that exist (and s <= t when causal), weights on v_s."""
    q, k, v = qkv(B=2, H=2, L=6, d=4)
    mask = torch.tensor([[1, 1, 0, 1, 1, 0], [1, 1, 1, 1, 1, 1]], dtype=torch.bool)
    for fn in (st.softmax_attention, st.softmax_attention_reference):
        y = fn(q, k, v, mask, causal)
        for b in range(2):
            for h in range(2):
                ref = ref_attention_heads(q[b, h], k[b, h], v[b, h], mask[b], "softmax", causal)
                torch.testing.assert_close(y[b, h], ref, rtol=1e-12, atol=1e-12)
        y = fn(q, k, v, None, causal)                        # no mask: every key exists
        ref = ref_attention_heads(q[1, 1], k[1, 1], v[1, 1], torch.ones(6, dtype=torch.bool), "softmax", causal)
        torch.testing.assert_close(y[1, 1], ref, rtol=1e-12, atol=1e-12)


# ----------------------------------------------------------------------------------------------
# O(L): counted in floating-point operations (torch.utils.flop_counter), not timed

def flops(fn, *args):
    with FlopCounterMode(display=False) as counter:
        fn(*args)
    return counter.get_total_flops()


def test_simple_attention_flops_are_linear_in_length():
    B, H, d = 1, 2, 8
    counts = {}
    for L in (128, 256, 512):
        q, k, v = (torch.randn(B, H, L, d) for _ in range(3))
        mask = torch.ones(B, L, dtype=torch.bool)
        # K^T V: 2 L d^2 per head, Q (K^T V): 2 L d^2 per head; no L x L product anywhere
        assert flops(st.simple_attention, q, k, v, None) == flops(st.simple_attention, q, k, v, mask) == 4 * B * H * L * d * d
        counts[L] = (flops(st.causal_simple_attention, q, k, v, 64),
                     flops(lambda q, k, v: (q @ k.transpose(-2, -1)) @ v, q, k, v))   # the quadratic form
    causal = [counts[L][0] for L in (128, 256, 512)]
    assert causal[1] == 2 * causal[0] and causal[2] == 4 * causal[0]                # linear in L
    assert causal[0] <= 8 * B * H * 128 * (d * d + 64 * d)                          # O(L (d^2 + chunk d))
    # the same counter sees a quadratic computation as quadratic: the check can fail
    quad = [counts[L][1] for L in (128, 256, 512)]
    assert quad[1] == 4 * quad[0] and quad[2] == 16 * quad[0]


@pytest.mark.parametrize("head", ["cls", "lm"])
def test_simpletron_model_flops_are_linear_in_length_and_softmax_is_not(head):
    """The whole forward costs a + b L for SimpleTRON (equal steps from L to 2L to 3L); the softmax model's
    reference attention grows faster (SDPA's kernel is not counted on CPU, so the reference is used)."""
    def model_flops(model, L, reference=False):
        idx = torch.randint(1, 20, (1, L), generator=torch.Generator().manual_seed(0))
        if reference:
            saved, st.softmax_attention = st.softmax_attention, st.softmax_attention_reference
        try:
            with torch.no_grad():
                return flops(model, idx)
        finally:
            if reference:
                st.softmax_attention = saved
    torch.manual_seed(0)
    simple = st.Model(st.Config(vocab_size=20, block_size=256, n_layer=2, n_head=2, n_embd=16, head=head)).eval()
    f = [model_flops(simple, L) for L in (64, 128, 192)]
    assert f[1] - f[0] == f[2] - f[1] > 0
    soft = st.Model(st.Config(vocab_size=20, block_size=256, n_layer=2, n_head=2, n_embd=16, head=head,
                              attention="softmax", variant="vanilla")).eval()
    f = [model_flops(soft, L, reference=True) for L in (64, 128, 192)]
    assert f[2] - f[1] > f[1] - f[0]


# ----------------------------------------------------------------------------------------------
# Blocks: Table 1's variants under each norm

def block_pair(variant_a, variant_b, D=16):
    """Two blocks with identical shared weights."""
    torch.manual_seed(0)
    a = st.Block(st.Config(n_embd=D, n_head=4, dropout=0.0, variant=variant_a)).double().eval()
    b = st.Block(st.Config(n_embd=D, n_head=4, dropout=0.0, variant=variant_b)).double().eval()
    b.load_state_dict(a.state_dict())
    return a, b


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_variants_differ_exactly_as_table_1(norm):
    x = torch.randn(2, 10, 16, dtype=torch.float64)
    mask = torch.ones(2, 10, dtype=torch.bool)
    # Simple vs Simple-Res: the same block, plus the block input added again at the output (Fig. 4)
    simple, res = block_pair("simple", "res")
    simple.pre = res.pre = norm == "pre"
    torch.testing.assert_close(res(x, mask) - simple(x, mask), x)
    # Simple-Res vs Simple-ResL: the output linear W after the heads is the only new parameter
    res_params = {n for n, _ in res.named_parameters()}
    torch.manual_seed(0)
    resl = st.Block(st.Config(n_embd=16, n_head=4, variant="resl"))
    assert {n for n, _ in resl.named_parameters()} - res_params == {"attn.out.weight", "attn.out.bias"}
    assert isinstance(res.attn.out, torch.nn.Identity) and isinstance(simple.attn.out, torch.nn.Identity)
    # Simple-ResL vs the vanilla block: again exactly the extra skip
    vanilla, resl = block_pair("vanilla", "resl")
    vanilla.pre = resl.pre = norm == "pre"
    torch.testing.assert_close(resl(x, mask) - vanilla(x, mask), x)


@pytest.mark.parametrize("attention", ["simple", "softmax"])
@pytest.mark.parametrize("norm", ["post", "pre", "rezero"])
@pytest.mark.parametrize("variant", ["simple", "res", "resl", "vanilla"])
def test_block_equals_reference(variant, norm, attention):
    """One block, with padding: post-LN LN(x + f(x)), pre-LN x + f(LN(x)), ReZero x + α f(x); the extra skip of
    res/resl; the output linear for resl/vanilla/softmax; GELU (erf) in the MLP."""
    torch.manual_seed(0)
    cfg = st.Config(n_embd=8, n_head=2, mlp_ratio=3, dropout=0.0, variant=variant, norm=norm, attention=attention)
    block = randomize(st.Block(cfg).double().eval(), seed=1)
    x = torch.randn(2, 6, 8, dtype=DT, generator=torch.Generator().manual_seed(2))
    mask = torch.tensor([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]], dtype=torch.bool)
    torch.testing.assert_close(block(x, mask), ref_block(block, x, mask, cfg), rtol=1e-11, atol=1e-11)


# ----------------------------------------------------------------------------------------------
# The whole model against the reference forward

@pytest.mark.parametrize("head", ["cls", "lm", "match"])
@pytest.mark.parametrize("attention", ["simple", "softmax"])
@pytest.mark.parametrize("norm", ["post", "pre", "rezero"])
@pytest.mark.parametrize("variant", ["simple", "res", "resl", "vanilla"])
def test_model_equals_reference_forward(variant, norm, attention, head):
    model = small(variant=variant, norm=norm, attention=attention, head=head)
    idx, targets = small_batch(head)
    logits, loss = model(idx, targets)
    ref_logits, ref_loss = ref_forward(model, idx, targets)
    torch.testing.assert_close(logits, ref_logits, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(loss, ref_loss.float(), rtol=1e-6, atol=1e-6)
    assert model(idx)[1] is None


@pytest.mark.parametrize("causal_scale", ["t", "sqrt_block", "none"])
@pytest.mark.parametrize("head", ["lm", "cls", "match"])
def test_model_equals_reference_forward_for_each_causal_scale(head, causal_scale):
    """lm: the reference's scale(t) (chunks of 3 on 7 tokens); cls/match keep the paper's 1/sqrt(n) whatever it says."""
    model = small(head=head, causal_scale=causal_scale, chunk=3)
    idx, _ = small_batch(head)
    torch.testing.assert_close(model(idx)[0], ref_forward(model, idx)[0], rtol=1e-10, atol=1e-10)


def test_the_model_gives_the_causal_form_its_chunk_scale_and_block_size(monkeypatch):
    seen, causal_simple_attention = [], st.causal_simple_attention
    monkeypatch.setattr(st, "causal_simple_attention",
                        lambda q, k, v, *args: seen.append(args) or causal_simple_attention(q, k, v, *args))
    model = tiny(head="lm", chunk=5, causal_scale="sqrt_block")
    model(torch.ones(1, 9, dtype=torch.long))
    model.prefill(torch.ones(1, 3, dtype=torch.long))        # generation's prompt, in the parallel form
    assert seen == [(5, "sqrt_block", 32)] * 4               # 2 layers, twice


@pytest.mark.parametrize("causal_scale", CAUSAL_SCALE)
def test_chunk_does_not_change_the_outputs(causal_scale):
    """Config.chunk only regroups the sums: chunks of 1, 7, 64 and 1000 tokens (one, padded) give the same logits of
    37 tokens in float32, up to rounding."""
    idx = torch.randint(1, 20, (2, 37), generator=torch.Generator().manual_seed(0))
    logits = {}
    for chunk in (1, 7, 64, 1000):
        torch.manual_seed(0)
        model = st.Model(st.Config(vocab_size=20, block_size=40, n_layer=2, n_head=2, n_embd=16, dropout=0.0,
                                   head="lm", causal_scale=causal_scale, chunk=chunk))
        logits[chunk] = randomize(model, seed=1).eval()(idx)[0]
    for chunk in (1, 7, 1000):
        torch.testing.assert_close(logits[chunk], logits[64], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("orthogonal,bias,head,norm", [(True, True, "cls", "post"), (True, False, "lm", "pre"),
                                                        (False, False, "cls", "pre"), (True, True, "match", "rezero"),
                                                        (False, False, "match", "post")])
def test_orthogonal_and_biasless_models_equal_reference_forward(orthogonal, bias, head, norm):
    for attention, variant in (("simple", "resl"), ("softmax", "vanilla"), ("simple", "simple")):
        model = small(variant=variant, norm=norm, attention=attention, head=head, orthogonal=orthogonal, bias=bias)
        idx, targets = small_batch(head, seed=1)
        logits, loss = model(idx, targets)
        ref_logits, ref_loss = ref_forward(model, idx, targets)
        torch.testing.assert_close(logits, ref_logits, rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(loss, ref_loss.float(), rtol=1e-6, atol=1e-6)


class Scale(torch.nn.Module):
    """Stands in for a dropout module: a known factor shows where the dropout is applied."""

    def __init__(self, s):
        super().__init__()
        self.s = s

    def forward(self, x):
        return self.s * x


@pytest.mark.parametrize("head,norm,attention,variant", [("cls", "post", "simple", "res"), ("lm", "pre", "softmax", "vanilla"),
                                                         ("cls", "rezero", "simple", "resl")])
def test_dropout_placement(head, norm, attention, variant):
    """Dropout on the embedding sum (tokens + positions), at the end of the attention branch (after W_O) and at
    the end of the MLP branch, and nowhere else; each with the configured rate."""
    model = small(variant=variant, norm=norm, attention=attention, head=head, dropout=0.3)
    drops = [m for m in model.modules() if isinstance(m, torch.nn.Dropout)]
    assert len(drops) == 1 + 2 * model.config.n_layer and all(m.p == 0.3 for m in drops)
    model.drop = Scale(1.5)
    for block in model.blocks:
        block.attn.drop, block.mlp.drop = Scale(0.5), Scale(-2.0)
    idx, targets = small_batch(head, seed=3)
    torch.testing.assert_close(model(idx)[0], ref_forward(model, idx, drops=(1.5, 0.5, -2.0))[0], rtol=1e-10, atol=1e-10)


def test_dropout_one_drops_every_branch():
    """p = 1 in training: the embeddings and every branch are zero; pre-LN: the final LayerNorm sees 0."""
    torch.manual_seed(0)
    model = randomize(tiny(norm="pre", dropout=1.0, head="lm"), seed=4).train()
    logits, _ = model(torch.randint(1, 20, (2, 5)))
    ln = model.ln_f
    torch.testing.assert_close(logits, (ln.bias @ model.wte.weight.T).expand(2, 5, -1))


def test_loss_is_float32_cross_entropy_of_bfloat16_logits():
    """The loss is computed from the logits in float32, also when the model runs in bfloat16."""
    for head in ("cls", "lm"):
        model = tiny(head=head).to(torch.bfloat16)
        idx = torch.randint(1, 20, (4, 12), generator=torch.Generator().manual_seed(0))
        y = idx if head == "lm" else torch.tensor([0, 1, 2, 0])
        logits, loss = model(idx, y)
        assert logits.dtype == torch.bfloat16 and loss.dtype == torch.float32
        ref = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), y.reshape(-1))
        assert loss.item() == pytest.approx(ref.item(), abs=1e-6)


@pytest.mark.parametrize("attention", ["simple", "softmax"])
def test_padding_does_not_change_a_cls_output(attention):
    torch.manual_seed(0)
    model = tiny(attention=attention)
    idx = torch.randint(1, 20, (3, 12))
    padded = torch.cat([idx, torch.zeros(3, 9, dtype=torch.long)], dim=1)
    torch.testing.assert_close(model(padded)[0], model(idx)[0], rtol=1e-12, atol=1e-12)


def test_n_counts_the_cls_token():
    """n in Q (K^T V) / sqrt(n) counts the real tokens and the CLS token: three tokens and padding give n = 4.
    The first block's attention output inside the model, against the formula written out by hand."""
    model = small(variant="simple", norm="post", n_layer=1)
    idx = torch.tensor([[3, 4, 5, 0, 0, 0, 0]])
    seen = {}
    model.blocks[0].attn.register_forward_hook(lambda mod, args, out: seen.update(y=out))
    model(idx)
    x = torch.cat([model.cls[0], model.wte.weight[idx[0]]]) + model.wpe.weight[:8]     # CLS + 7 positions
    z = x @ model.blocks[0].attn.qkv.weight.T + model.blocks[0].attn.qkv.bias           # (8, 3D)
    D, d = 8, 4
    for h in range(2):
        q, k, v = (z[:, part * D + h * d: part * D + (h + 1) * d] for part in range(3))
        ref = q @ (k[:4].T @ v[:4]) / math.sqrt(4)          # keys: CLS and the 3 tokens; n = 4
        torch.testing.assert_close(seen["y"][0, :, h * d:(h + 1) * d], ref, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("attention", ["simple", "softmax"])
def test_lm_head_is_causal(attention):
    torch.manual_seed(0)
    model = tiny(attention=attention, head="lm", norm="pre", block_size=100)
    idx = torch.randint(1, 20, (2, 100))
    later = idx.clone()
    later[:, 70:] = torch.randint(1, 20, (2, 30))
    a, b = model(idx)[0], model(later)[0]
    torch.testing.assert_close(a[:, :70], b[:, :70], rtol=1e-12, atol=1e-12)
    assert not torch.allclose(a[:, 70:], b[:, 70:])
    assert model.lm_head.weight is model.wte.weight         # tied embeddings


def test_match_head_is_symmetric_in_its_encoder():
    torch.manual_seed(0)
    model = tiny(head="match")
    pair = torch.randint(1, 20, (2, 2, 10))
    logits, loss = model(pair, torch.tensor([0, 1]))
    assert logits.shape == (2, 3) and loss.ndim == 0
    # the same shared encoder sees both documents: u from document 0 equals encode(document 0) alone
    u = model.encode(pair[:, 0])[0][:, 0]
    feats = torch.cat([u, u, u * u, u - u], -1)
    same = torch.stack([pair[:, 0], pair[:, 0]], 1)
    torch.testing.assert_close(model(same)[0], model.classifier(feats))


@pytest.mark.parametrize("head", ["cls", "lm"])
def test_a_tiny_model_learns(head):
    """Loss falls in a few dozen steps: cls learns to count small tokens (a global summary, what K^T V
    holds), lm learns to continue a cycle."""
    torch.manual_seed(0)
    model = tiny(head=head, norm="pre" if head == "lm" else "post").float().train()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(80):
        x = torch.randint(1, 20, (16, 12))
        if head == "cls":
            y = ((x < 7).sum(1) // 2).clamp(max=2)
        else:
            x = (torch.arange(13)[None, :] + torch.randint(0, 19, (16, 1))) % 19 + 1
            x, y = x[:, :-1], x[:, 1:]
        _, loss = model(x, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert sum(losses[-5:]) / 5 < 0.5 * sum(losses[:5]) / 5


# ----------------------------------------------------------------------------------------------
# Structure: parameter counts from the formulas, initialisation, gradients

def expected_params(cfg):
    """Counted from the papers' formulas. Per block: q/k/v 3D^2 (+ 3D biases); W_O D^2 (+ D) when present; the
    MLP D x rD and rD x D (+ rD + D); two LayerNorms 2D each (D without bias), or ReZero's one α. Orthogonal
    weights have the same count: k blocks P_i of m x m with k m^2 = n_in n_out."""
    D, r, V, T, C = cfg.n_embd, cfg.mlp_ratio, cfg.vocab_size, cfg.block_size, cfg.n_classes
    bias = 1 if cfg.bias else 0
    has_out = HAS_OUT_LINEAR[cfg.variant] or cfg.attention == "softmax"
    block = 3 * D * D + bias * 3 * D + has_out * (D * D + bias * D) + 2 * r * D * D + bias * (r * D + D)
    block += 1 if cfg.norm == "rezero" else 2 * (D + bias * D)
    total = cfg.n_layer * block + V * D                      # wte (the lm head is tied to it: no extra)
    total += 0 if cfg.norm == "rezero" else D + bias * D     # ln_f
    if cfg.head == "lm":
        return total + T * D                                 # one learned position per token
    total += (T + 1) * D + D                                 # positions for CLS + T tokens, the CLS vector
    if cfg.head == "cls":                                    # D -> rD -> C, with biases
        return total + D * r * D + r * D + r * D * C + C
    return total + 4 * D * r * D + r * D + r * D * (r * D // 2) + r * D // 2 + (r * D // 2) * C + C


@pytest.mark.parametrize("head", ["cls", "lm", "match"])
@pytest.mark.parametrize("variant,attention,norm,orthogonal,bias",
                         [("simple", "simple", "post", False, True), ("res", "simple", "pre", False, True),
                          ("resl", "simple", "post", False, False), ("vanilla", "simple", "post", False, True),
                          ("vanilla", "softmax", "pre", False, True), ("simple", "softmax", "post", False, True),
                          ("vanilla", "softmax", "rezero", False, True), ("res", "simple", "rezero", False, False),
                          ("vanilla", "softmax", "post", True, True), ("resl", "simple", "pre", True, False)])
def test_parameter_counts_follow_the_formulas(head, variant, attention, norm, orthogonal, bias):
    cfg = st.Config(vocab_size=30, block_size=17, n_layer=3, n_head=2, n_embd=12, mlp_ratio=4, n_classes=5, head=head,
                    variant=variant, attention=attention, norm=norm, orthogonal=orthogonal, bias=bias)
    model = st.Model(cfg)
    assert model.num_params() == sum(p.numel() for p in model.parameters()) == expected_params(cfg)
    # hand-counted case, the paper's Table 3 shape (SimpleTRON ListOps: 4 layers, D 256, MLP 1024) without
    # its embeddings: a Simple-Res block is 3*256^2 + 3*256 + 2*(4*256^2) + 5*256 + 4*256 = 723,968
    if (variant, attention, norm, orthogonal, bias) == ("res", "simple", "pre", False, True):
        big = st.Block(st.Config(n_embd=256, n_head=4, variant="res"))
        assert sum(p.numel() for p in big.parameters()) == 723_968


def test_initialisation_gpt2():
    """GPT-2 / nanoGPT: linear and embedding weights ~ N(0, 0.02), biases 0, LayerNorm (1, 0), CLS 0, ReZero's α 0,
    orthogonal blocks' P ~ N(0, 1/m); the lm head is the embedding."""
    torch.manual_seed(0)
    model = st.Model(st.Config(vocab_size=500, block_size=300, n_layer=2, n_head=2, n_embd=64, head="cls"))
    for name, p in model.named_parameters():
        if name.endswith("ln1.weight") or name.endswith("ln2.weight") or name == "ln_f.weight":
            assert torch.equal(p, torch.ones_like(p)), name
        elif p.ndim == 1 or name == "cls":
            assert torch.equal(p, torch.zeros_like(p)), name
        else:
            assert p.std().item() == pytest.approx(0.02, rel=0.1) and abs(p.mean().item()) < 0.005, name
    rz = st.Model(st.Config(vocab_size=50, block_size=30, n_layer=2, n_head=2, n_embd=64, norm="rezero", orthogonal=True))
    assert all(b.alpha.item() == 0 for b in rz.blocks)
    P = torch.cat([b.attn.qkv.P.flatten() for b in rz.blocks] + [b.mlp.proj.P.flatten() for b in rz.blocks])
    assert P.std().item() == pytest.approx(1 / 8, rel=0.1)
    assert all(torch.equal(b.mlp.fc.bias, torch.zeros(256)) for b in rz.blocks)


@pytest.mark.parametrize("head", ["cls", "lm", "match"])
@pytest.mark.parametrize("norm,attention,variant,orthogonal", [("post", "simple", "resl", False), ("rezero", "softmax", "vanilla", True),
                                                               ("pre", "simple", "simple", False)])
def test_every_parameter_receives_gradient(head, norm, attention, variant, orthogonal):
    model = small(head=head, norm=norm, attention=attention, variant=variant, orthogonal=orthogonal).train()
    idx, targets = small_batch(head)
    model(idx, targets)[1].backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_freeze_qkv_stops_exactly_the_qkv_gradients():
    model = small(freeze_qkv=True).train()
    idx, targets = small_batch("cls")
    model(idx, targets)[1].backward()
    for name, p in model.named_parameters():
        frozen = ".attn.qkv." in name
        assert p.requires_grad != frozen and (p.grad is None) == frozen, name


# ----------------------------------------------------------------------------------------------
# The Orthogonal Transformer's weights

def test_cayley_hand_worked_and_formula():
    # A = [[0, -t], [t, 0]]: (I - A)(I + A)^{-1} = [[1 - t^2, 2t], [-2t, 1 - t^2]] / (1 + t^2); t = 2: [[-3, 4], [-4, -3]] / 5
    A = torch.tensor([[0.0, -2.0], [2.0, 0.0]], dtype=DT)
    torch.testing.assert_close(st.cayley(A), torch.tensor([[-3.0, 4.0], [-4.0, -3.0]], dtype=DT) / 5)
    P = torch.randn(3, 6, 6, dtype=DT, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(st.cayley(P - P.transpose(-2, -1)), torch.stack([ref_cayley(p - p.T) for p in P]))


@pytest.mark.parametrize("n_in,n_out,bias", [(4, 12, True), (12, 4, True), (4, 4, False), (4, 8, False)])
def test_orthogonal_linear_block_layout(n_in, n_out, bias):
    torch.manual_seed(0)
    lin = st.OrthogonalLinear(n_in, n_out, bias=bias).double()
    assert lin.P.shape == (max(n_in, n_out) // min(n_in, n_out), min(n_in, n_out), min(n_in, n_out))
    assert (lin.bias is None) == (not bias)
    if bias:
        with torch.no_grad():
            lin.bias.normal_()
    W = ref_orthogonal_weight(lin.P, n_in, n_out)
    torch.testing.assert_close(lin.weight, W)
    x = torch.randn(3, n_in, dtype=DT)
    torch.testing.assert_close(lin(x), x @ W.T + (lin.bias if bias else 0))
    # k orthogonal blocks: stacked, W^T W = sum_i W_i^T W_i = k I; side by side, W W^T = k I
    k = max(n_in, n_out) // min(n_in, n_out)
    gram = W.T @ W if n_out >= n_in else W @ W.T
    torch.testing.assert_close(gram, k * torch.eye(min(n_in, n_out), dtype=DT))


# ----------------------------------------------------------------------------------------------
# Attention transfer (Section 4.2)

def test_attention_transfer_copies_and_freezes_qkv():
    torch.manual_seed(0)
    simple = tiny()
    soft = tiny(attention="softmax", variant="vanilla")
    st.transfer_attention(simple, soft)
    assert soft.config.freeze_qkv
    before = {n: p.clone() for n, p in soft.named_parameters()}
    for a, b in zip(simple.blocks, soft.blocks):
        assert torch.equal(a.attn.qkv.weight, b.attn.qkv.weight)
    trainable = [p for p in soft.parameters() if p.requires_grad]
    opt = torch.optim.SGD(trainable, lr=0.1)
    loss = soft(torch.randint(1, 20, (4, 8)), torch.tensor([0, 1, 2, 0]))[1]
    loss.backward()
    opt.step()
    for n, p in soft.named_parameters():
        assert torch.equal(p, before[n]) == ("attn.qkv" in n), n
    # a model built with freeze_qkv=True (as from a saved config) is frozen the same way
    assert not any(p.requires_grad for b in tiny(freeze_qkv=True).blocks for p in b.attn.qkv.parameters())


@pytest.mark.parametrize("orthogonal", [False, True])
def test_attention_transfer_copies_weight_and_bias_of_each_layer_and_nothing_else(orthogonal):
    source = small(seed=1, orthogonal=orthogonal, n_layer=3)
    target = small(seed=2, orthogonal=orthogonal, n_layer=3, attention="softmax", variant="vanilla")
    target_before = {n: p.clone() for n, p in target.named_parameters()}
    source_before = {n: p.clone() for n, p in source.named_parameters()}
    st.transfer_attention(source, target)
    src, dst = source.state_dict(), dict(target.named_parameters())
    for name, p in dst.items():
        if ".attn.qkv." in name:                            # layer l's weight and bias from layer l of the source
            assert torch.equal(p, src[name]) and not torch.equal(p, target_before[name]), name
            assert not p.requires_grad, name
        else:                                               # the rest as it was, and trainable
            assert torch.equal(p, target_before[name]) and p.requires_grad, name
    assert sum(".attn.qkv." in n for n in dst) == 3 * 2             # weight (or P) and bias, 3 layers
    for name, p in source.named_parameters():               # the source is untouched
        assert torch.equal(p, source_before[name]) and p.requires_grad, name
    assert not source.config.freeze_qkv


def test_config_rejects_bad_values():
    with pytest.raises(ValueError, match="variant"):
        st.Config(variant="resx")
    with pytest.raises(ValueError, match="multiple"):
        st.Config(n_embd=10, n_head=4)
    for name in ("head", "attention", "norm", "causal_scale"):
        with pytest.raises(ValueError, match=name):
            st.Config(**{name: "nope"})
    for chunk in (0, -3):
        with pytest.raises(ValueError, match="chunk must be >= 1"):
            st.Config(chunk=chunk)
    st.Config(chunk=1, causal_scale="none")                  # accepted
    st.Config(n_embd=12, n_head=4, head="match", attention="softmax", norm="rezero", variant="vanilla")   # accepted


def test_config_defaults():
    """What Model(Config()) builds (train.py's presets override them): a change here changes every user's model."""
    assert dataclasses.asdict(st.Config()) == dict(vocab_size=32, block_size=2000, n_layer=4,
        n_head=4, n_embd=128, dropout=0.1, bias=True, head="cls", n_classes=10, attention="simple",
        causal_scale="sqrt_t", chunk=64, variant="res", norm="post", orthogonal=False, residual_init=False,
        mlp_ratio=4, freeze_qkv=False,
        layer_norm_eps=1e-05, emb_norm=False, final_norm=True, learned_cls=True, mlp_hidden=0,
        checkpointing=False)


def test_residual_init_is_gpt2s_smaller_start_of_the_two_projections_into_the_residual_stream():
    """nanoGPT (GPT-2): every Linear and Embedding at N(0, 0.02), then attn.out and mlp.proj at N(0, 0.02 /
    sqrt(2 n_layer)), drawn after the others. Off, the draws are the same as before the option existed."""
    def build(**kw):
        torch.manual_seed(0)
        return st.Model(st.Config(head="lm", attention="softmax", norm="pre", bias=False, n_layer=8, n_embd=256,
                                  vocab_size=300, block_size=16, **kw))
    plain, scaled = build(), build(residual_init=True)
    for name, p in scaled.named_parameters():
        q = dict(plain.named_parameters())[name]
        if name.endswith(("attn.out.weight", "mlp.proj.weight")):
            assert abs(p.std().item() - 0.02 / math.sqrt(16)) < 0.0005, name          # 0.005
            assert abs(q.std().item() - 0.02) < 0.0005
        else:
            assert torch.equal(p, q), name                   # the same draws: the projections are drawn last
    assert {n for n, _ in scaled.named_parameters() if n.endswith(("attn.out.weight", "mlp.proj.weight"))} == \
        {f"blocks.{i}.{w}" for i in range(8) for w in ("attn.out.weight", "mlp.proj.weight")}
    with pytest.raises(ValueError, match="residual_init"):
        st.Config(residual_init=True, orthogonal=True)
