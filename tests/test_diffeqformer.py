"""DiffEqFormer: the solvers' orders and formulas, time-dependent weights, the vector field, discretisation and
LoRA, gradients, and step-count fine-tuning through train.py."""

import dataclasses
import math
import os

import pytest
import torch

import diffeqformer as dq
import simpletron
import train

F64 = torch.float64


def tiny(**kw):
    cfg = dict(vocab_size=23, block_size=12, n_layer=3, n_head=2, n_embd=8, time_dim=4, time_freqs=6, head="lm")
    return dq.Config(**{**cfg, **kw})


def model_of(seed=0, dtype=F64, perturb=True, **kw):
    """A tiny model in eval mode. perturb: move the zero-initialised rows (W_0, LayerNorm) off zero, so that
    every part of the parametrisation is exercised."""
    torch.manual_seed(seed)
    m = dq.Model(tiny(**kw)).to(dtype).eval()
    if perturb:
        with torch.no_grad():
            for name, p in m.named_parameters():
                if name.startswith("temporal."):
                    p.add_(0.05 * torch.randn_like(p))
    return m


def tokens(B=2, L=9, seed=1, vocab=23):
    return torch.randint(1, vocab, (B, L), generator=torch.Generator().manual_seed(seed))


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


@pytest.mark.parametrize("method", ["euler", "rk4"])
def test_gradcheck_through_solver_and_hypernetworks(method):
    m = model_of(n_layer=2, n_embd=4, time_dim=2, time_freqs=2, method=method, checkpointing=True).train()
    X0 = torch.randn(1, 3, 4, dtype=F64, requires_grad=True)

    class Flow(torch.nn.Module):                                             # the ODE part, X(0) -> X(1)
        def __init__(self):
            super().__init__()
            self.m = m

        def forward(self, X):
            return self.m.flow(X, None)

    def fn(X0, rows, lin1):                                                  # as functions of X(0), the rows
        params = {"m.temporal.qkv.W": rows, "m.temporal.qkv.e.0.weight": lin1}   # W_0..W_dt of W_QKV and
        return torch.func.functional_call(Flow(), params, (X0,))                 # Lin1 of its time MLP
    inputs = [p.detach().clone().requires_grad_() for p in (m.temporal.qkv.W, m.temporal.qkv.e[0].weight)]
    assert torch.autograd.gradcheck(fn, (X0, *inputs), fast_mode=True)


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
    for bad in (dict(style="bert"), dict(weights="tied"), dict(method="rk45"), dict(n_embd=10, n_head=4),
                dict(lora_r=2), dict(discrete=True, method="rk4"), dict(time_dim=0)):
        with pytest.raises(ValueError):
            tiny(**bad)


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
    ckpt = torch.load(ft / "ckpt.pt", weights_only=True)
    assert ckpt["config"]["discrete"] and ckpt["config"]["n_layer"] == 3
    assert ckpt["config"]["lora_r"] == 2 and ckpt["config"]["lora_scale"] == 2.0
    src = torch.load(base / "ckpt.pt", weights_only=True)["model"]
    assert not any(k.startswith("temporal.") for k in ckpt["model"])
    # LoRA: the frozen block weights are those discretize made from the base model
    base_model = train.build_model("diffeqformer", torch.load(base / "ckpt.pt", weights_only=True)["config"])
    base_model.load_state_dict(src)
    expected = base_model.discretize(3).blocks[2].fc.weight
    assert torch.equal(ckpt["model"]["blocks.2.fc.weight"], expected)
    assert not torch.equal(ckpt["model"]["wte.weight"], src["wte.weight"])  # embeddings trained
    again = train.main(["--init_from", str(ft / "ckpt.pt"), "--eval_only", *common[:4], "--out_dir", str(tmp_path / "ev")])
    assert again["val_loss"] == pytest.approx(m["val_loss"], rel=1e-6)
    # --steps on a model that is not a DiffEqFormer ODE is a usage error
    with pytest.raises(train.UsageError):
        train.main(["--init_from", str(ft / "ckpt.pt"), *common, "--steps", "2", "--out_dir", str(tmp_path / "x")])
    assert os.path.exists(ft / "metrics.json")
