"""Generation: model.generate of every model against repeated full forwards (greedy, logits, sampling), the
recurrent states against the parallel forms, sample.py end to end, bench.py --generate."""

import io
import json
import math
import os
import subprocess
import sys

import pytest
import torch

import bench
import config
import diffeqformer as de
import sample
import simpletron as st
import train
import transject as tj

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
V, BLOCK = 23, 12                                           # vocabulary, block_size of the tiny models


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def shaken(model, scale=0.3, seed=0):
    """A float64 model in eval mode with its parameters moved off their initial values (ReZero's alpha and
    LoRA's B start at 0, TransJect's a_l at -2: every branch must count) by a seeded random amount."""
    g = torch.Generator().manual_seed(seed)
    model = model.double().eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g, dtype=p.dtype) * scale)
    return model


def simpletron(**kw):
    return shaken(st.Model(st.Config(vocab_size=V, block_size=BLOCK, n_layer=2, n_head=2, n_embd=16, head="lm",
                                     dropout=0.0, **kw)))


def transject(**kw):
    return shaken(tj.Model(tj.Config(vocab_size=V, block_size=BLOCK, n_layer=2, n_embd=16, n_experts=3, head="lm",
                                     dropout=0.0, **kw)))


def diffeq(**kw):
    return shaken(de.Model(de.Config(vocab_size=V, block_size=BLOCK, n_layer=3, n_head=2, n_embd=16, time_dim=4,
                                     time_freqs=8, head="lm", **kw)))


def discretised():
    model = diffeq().discretize(5).with_lora(2, 4.0)
    return shaken(model, seed=1)                             # LoRA's B off zero too


MODELS = {
    "simpletron-res-post": lambda: simpletron(),
    "simpletron-simple-pre": lambda: simpletron(variant="simple", norm="pre"),
    "simpletron-resl-rezero-orthogonal": lambda: simpletron(variant="resl", norm="rezero", orthogonal=True),
    "simpletron-scale-t-chunk5": lambda: simpletron(causal_scale="t", chunk=5),     # Config.causal_scale, ours
    "simpletron-scale-sqrt_block": lambda: simpletron(causal_scale="sqrt_block", norm="pre"),
    "simpletron-scale-none": lambda: simpletron(causal_scale="none", variant="resl", chunk=1),
    "gpt": lambda: simpletron(attention="softmax", variant="vanilla", norm="pre"),
    "transformer-post": lambda: simpletron(attention="softmax", variant="vanilla", norm="post"),
    "transject-exact": lambda: transject(sigma="exact"),
    "transject-learned": lambda: transject(sigma="learned"),
    "transject-random": lambda: transject(sigma="random"),
    "diffeqformer-euler": lambda: diffeq(),
    "diffeqformer-midpoint-llama": lambda: diffeq(method="midpoint", style="llama"),
    "diffeqformer-rk4": lambda: diffeq(method="rk4"),
    "diffeqformer-shared": lambda: diffeq(weights="shared"),
    "diffeqformer-discretised-lora": discretised,
}


def tokens(shape, seed=0, low=1):
    return torch.randint(low, V, shape, generator=torch.Generator().manual_seed(seed))


# ----------------------------------------------------------------------------------------------
# generate against repeated full forwards

@pytest.mark.parametrize("name", MODELS)
def test_greedy_equals_argmax_of_repeated_full_forwards(name):
    model = MODELS[name]()
    idx = tokens((3, 5))
    new = 15                                                 # 5 + 15 > block_size 12: the window slides too
    out = model.generate(idx, new, top_k=1)
    ref = idx
    for _ in range(new):                                     # nanoGPT's loop: the last block_size tokens
        logits, _ = model(ref[:, -BLOCK:])
        ref = torch.cat([ref, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert out.shape == (3, 5 + new)
    assert torch.equal(out, ref)


@pytest.mark.parametrize("name", MODELS)
def test_logits_at_every_position_equal_the_full_forward(name):
    model = MODELS[name]()
    x = tokens((2, BLOCK), seed=1, low=0)                    # 0 (padding) inside: TransJect masks it out
    x[0, 4] = x[1, 7] = 0
    full, _ = model(x)                                       # (2, BLOCK, V)
    logits, state = model.prefill(x[:, :3])                  # the prompt in the parallel form ...
    torch.testing.assert_close(logits, full[:, 2], rtol=0, atol=1e-12)
    for t in range(3, BLOCK):                                # ... then the recurrence / the KV cache
        logits = model.decode(x[:, t:t + 1], state)
        torch.testing.assert_close(logits, full[:, t], rtol=0, atol=1e-12, msg=f"position {t}")
    assert state.t == BLOCK
    with pytest.raises(ValueError, match="exceed"):          # no position beyond block_size
        model.decode(x[:, :1], state)


def reference_sample(logits, temperature, top_k):
    """nanoGPT's rule written out: logits / T, all but the k largest set to -inf, softmax, one draw."""
    logits = logits / temperature
    if top_k is not None:
        kth = logits.sort(-1, descending=True).values[:, min(top_k, logits.shape[-1]) - 1:][:, :1]   # (B, 1)
        logits = torch.where(logits >= kth, logits, torch.full_like(logits, -math.inf))
    p = (logits - logits.amax(-1, keepdim=True)).exp()
    return torch.multinomial(p / p.sum(-1, keepdim=True), 1)


@pytest.mark.parametrize("name", ["simpletron-res-post", "gpt", "transject-learned", "diffeqformer-rk4"])
@pytest.mark.parametrize("temperature, top_k", [(0.7, 3), (1.8, None), (1.0, 50)])
def test_sampling_is_nanogpts_with_temperature_and_top_k(name, temperature, top_k):
    model = MODELS[name]()
    idx = tokens((4, 3), seed=2)
    torch.manual_seed(7)
    out = model.generate(idx, 10, temperature=temperature, top_k=top_k)
    torch.manual_seed(7)                                     # the same draws from the full forwards
    ref = idx
    for _ in range(10):
        logits, _ = model(ref[:, -BLOCK:])
        ref = torch.cat([ref, reference_sample(logits[:, -1], temperature, top_k)], dim=1)
    assert out.shape == (4, 13)
    assert torch.equal(out, ref)
    assert len(set(out[:, 3:].flatten().tolist())) > 1       # sampled, not a constant


def test_top_k_keeps_exactly_the_k_most_likely_tokens():
    model = MODELS["simpletron-res-post"]()
    idx = tokens((1, 4), seed=3).repeat(400, 1)
    logits, _ = model(idx[:1])
    top4 = set(logits[0, -1].sort(descending=True).indices[:4].tolist())
    torch.manual_seed(0)
    out = model.generate(idx, 1, temperature=100.0, top_k=4)   # nearly uniform over the 4 kept tokens
    assert set(out[:, -1].tolist()) == top4                  # none else, and each of the 4 (400 draws)
    assert torch.equal(model.generate(idx[:2], 0), idx[:2])  # no new token: the prompt itself


@pytest.mark.parametrize("make", [lambda c: st.Model(st.Config(vocab_size=V, block_size=8, head=c)),
                                  lambda c: tj.Model(tj.Config(vocab_size=V, block_size=8, head=c)),
                                  lambda c: de.Model(de.Config(vocab_size=V, block_size=8, head=c))])
def test_bad_arguments_fail_in_one_line(make):
    idx = tokens((2, 3))
    for n_new in (2, 0):                                     # no new token asked: still the wrong model
        with pytest.raises(ValueError, match="head lm"):
            make("cls").generate(idx, n_new)
    with pytest.raises(ValueError, match="head lm"):         # the recurrent API checks too
        make("cls").prefill(idx)
    with pytest.raises(ValueError, match=r"\(B, L\) token ids"):
        make("lm").prefill(idx[0])
    lm = make("lm").eval()
    logits, _ = lm.prefill(idx[:, :1])                       # a one-token prompt is a prompt
    with pytest.raises(ValueError, match="L >= 1"):           # an empty one is not
        lm.prefill(idx[:, :0])
    torch.testing.assert_close(logits, lm(idx[:, :1])[0][:, -1])
    _, state = lm.prefill(idx)
    for bad in (idx[:, :2], idx[:, 0], idx[:1, :1, None]):    # two tokens a row; no token axis; a third axis
        with pytest.raises(ValueError, match=r"one token per row, \(B, 1\)"):
            make("lm").decode(bad, state)
    model = make("lm").train()
    for kw in (dict(temperature=0.0), dict(top_k=0)):
        with pytest.raises(ValueError):
            model.generate(idx, 2, **kw)
    with pytest.raises(ValueError, match="L >= 1"):
        model.generate(idx[:, :0], 2)
    with pytest.raises(ValueError, match=r"\(B, L\) token ids"):   # one sequence without its batch dimension
        model.generate(idx[0], 2)
    model.generate(idx, 2)
    assert model.training                                    # generate leaves the model in its own mode


@pytest.mark.parametrize("make", [
    lambda: shaken(st.Model(st.Config(vocab_size=V, block_size=BLOCK, n_layer=2, n_head=2, n_embd=16, head="lm",
                                      dropout=0.5))),
    lambda: shaken(tj.Model(tj.Config(vocab_size=V, block_size=BLOCK, n_layer=2, n_embd=16, head="lm", dropout=0.5))),
    lambda: shaken(de.Model(de.Config(vocab_size=V, block_size=BLOCK, n_layer=2, n_head=2, n_embd=16, time_dim=4,
                                      time_freqs=8, head="lm", dropout=0.5)))])
def test_generation_uses_no_dropout_whatever_the_mode(make):
    model = make().train()                                   # dropout 0.5, in training mode
    idx = tokens((3, 4))
    torch.manual_seed(0)
    out = model.generate(idx, 6, top_k=1)
    assert model.training                                    # the mode given back
    model.eval()
    ref = idx
    for _ in range(6):
        ref = torch.cat([ref, model(ref)[0][:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(out, ref)


# ----------------------------------------------------------------------------------------------
# recurrent states against the parallel forms, in float64

# Config.causal_scale: y_t = Q_t S_t * scale(t); all but the default sqrt_t are our extension
SCALE = {"sqrt_t": lambda t: 1 / math.sqrt(t), "t": lambda t: 1 / t, "sqrt_block": lambda t: 1 / math.sqrt(BLOCK),
         "none": lambda t: 1.0}


@pytest.mark.parametrize("causal_scale", SCALE)
@pytest.mark.parametrize("L", [1, 63, 64, 65, 130])
def test_simpletron_recurrence_equals_the_chunked_parallel_form(L, causal_scale):
    g = torch.Generator().manual_seed(L)
    q, k, v = (torch.randn(2, 3, L, 5, generator=g, dtype=torch.float64) for _ in range(3))
    parallel = st.causal_simple_attention(q, k, v, 64, causal_scale, BLOCK)  # chunks of 64: 0, 1 or 2 boundaries
    S = torch.zeros(2, 3, 5, 5, dtype=torch.float64)
    for t in range(1, L + 1):
        y, S = st.causal_simple_attention_step(q[:, :, t - 1:t], k[:, :, t - 1:t], v[:, :, t - 1:t], S, t,
                                               causal_scale, BLOCK)
        # the state is sum_{s<=t} k_s^T v_s: K_{1..t}^T V_{1..t}, a dense product of the first t rows
        S_ref = k[:, :, :t].transpose(-2, -1) @ v[:, :, :t]
        torch.testing.assert_close(S, S_ref, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(y[:, :, 0], parallel[:, :, t - 1], rtol=1e-11, atol=1e-11, msg=f"t = {t}")
        y_ref = torch.einsum("bhi,bhij->bhj", q[:, :, t - 1], S_ref) * SCALE[causal_scale](t)   # Q_t S_t scale(t)
        torch.testing.assert_close(y[:, :, 0], y_ref, rtol=1e-11, atol=1e-11)


@pytest.mark.parametrize("L", [70, 130])
def test_simpletron_state_after_a_long_prompt(L):
    """prefill in the chunked parallel form leaves S = sum of K^T V over the prompt, across chunk boundaries."""
    model = shaken(st.Model(st.Config(vocab_size=V, block_size=L + 1, n_layer=1, n_head=2, n_embd=8, head="lm",
                                      dropout=0.0)))
    x = tokens((2, L + 1), seed=4)
    _, state = model.prefill(x[:, :L])
    h = model.wte(x[:, :L]) + model.wpe.weight[:L]           # the layer's input (one layer)
    q, k, v = model.blocks[0].attn.qkv(h).split(8, dim=2)
    k, v = k.view(2, L, 2, 4), v.view(2, L, 2, 4)
    torch.testing.assert_close(state.layers[0]["S"], torch.einsum("bthi,bthj->bhij", k, v), rtol=1e-11, atol=1e-11)
    torch.testing.assert_close(model.decode(x[:, L:], state), model(x)[0][:, -1], rtol=0, atol=1e-12)


@pytest.mark.parametrize("sigma", ["exact", "learned", "random"])
def test_transject_running_sums_equal_the_prefix_form(sigma):
    L = 70
    model = shaken(tj.Model(tj.Config(vocab_size=V, block_size=L, n_layer=2, n_embd=16, n_experts=3, head="lm",
                                      dropout=0.0, sigma=sigma)))
    x = tokens((2, L), seed=5, low=0)
    x[0, :3] = 0                                             # padding first (n_t = 0) and inside
    x[1, 40:45] = 0
    mask = x != 0
    X0 = model.embed(x)
    Sigma, _ = model.spectrum(X0, mask)                      # (2, L or 1, d): prefix sums over 1..t
    lam = model.expert_weights(x)                            # [(2, L, E)] per layer
    _, state = model.prefill(x[:, :1])
    steps = [(state.Sigma[:, -1], [l[:, -1] for l in state.lam])]
    for t in range(1, L):
        model.decode(x[:, t:t + 1], state)
        steps.append((state.Sigma[:, -1], [l[:, -1] for l in state.lam]))
    for t, (S_t, lam_t) in enumerate(steps):
        torch.testing.assert_close(S_t.expand(2, -1), Sigma[:, min(t, Sigma.shape[1] - 1)].expand(2, -1),
                                   rtol=1e-10, atol=1e-10, msg=f"Σ_t at t = {t}")
        for layer, (a, b) in enumerate(zip(lam_t, lam)):
            torch.testing.assert_close(a, b[:, t], rtol=1e-10, atol=1e-10, msg=f"λ_t of layer {layer} at t = {t}")
    # the running sums themselves, from the written-out sums over the real tokens
    X = X0 * mask[..., None]
    if sigma == "exact":
        G = sum(torch.einsum("bi,bj->bij", X[:, s], X[:, s]) for s in range(L))      # sum_s x_s^T x_s
        torch.testing.assert_close(state.z, G, rtol=1e-11, atol=1e-11)
    elif sigma == "learned":
        U_s = tj.cayley(tj.skew(model.P_s))
        torch.testing.assert_close(state.z, ((X @ U_s) ** 2).sum(1), rtol=1e-11, atol=1e-11)
    else:
        assert state.z is None
    torch.testing.assert_close(state.n, mask.sum(1, keepdim=True).double())
    torch.testing.assert_close(state.s[0], X.sum(1), rtol=1e-11, atol=1e-11)   # layer 1 reads X0


@pytest.mark.parametrize("name", ["simpletron-res-post", "gpt", "diffeqformer-rk4"])
def test_a_states_capacity_is_capped_at_block_size(name):
    model = MODELS[name]()
    for capacity, want in ((None, BLOCK), (5, 5), (BLOCK, BLOCK), (10 * BLOCK, BLOCK)):
        _, state = model.prefill(tokens((1, 3)), capacity=capacity)
        assert state.capacity == want, capacity


def test_state_sizes_do_not_grow_for_the_recurrent_models():
    sizes = {}
    for name in ("simpletron-res-post", "transject-exact", "gpt", "diffeqformer-rk4"):
        model = MODELS[name]()
        _, a = model.prefill(tokens((1, 2)), capacity=BLOCK)
        _, b = model.prefill(tokens((1, 10)), capacity=BLOCK)
        for _ in range(2):
            model.decode(tokens((1, 1)), b)
        sizes[name] = (a.nbytes(), b.nbytes())
    D, d = 16, 8
    assert sizes["simpletron-res-post"] == (2 * 2 * d * d * 8,) * 2          # layers x heads x d x d float64
    assert sizes["transject-exact"] == ((1 + 16 * 16 + 2 * 16) * 8,) * 2    # n, G_t, s per layer
    assert sizes["gpt"] == (2 * 2 * BLOCK * D * 8,) * 2                       # K, V: capacity rows per layer
    assert sizes["diffeqformer-rk4"] == (12 * 2 * BLOCK * D * 8,) * 2        # 3 steps x 4 stages


# ----------------------------------------------------------------------------------------------
# sample.py end to end

PTB_WORDS = "the a company said it N <unk> stock market year shares new of in to and".split()


def write_ptb(folder, seed=0):
    g = torch.Generator().manual_seed(seed)
    folder.mkdir(parents=True, exist_ok=True)
    for name, n in (("train", 300), ("valid", 40), ("test", 40)):
        lines = []
        for _ in range(n):
            ws = torch.randint(0, len(PTB_WORDS), (int(torch.randint(3, 9, (1,), generator=g)),), generator=g)
            lines.append(" " + " ".join(PTB_WORDS[i] for i in ws) + " \n")
        (folder / f"ptb.{name}.txt").write_text("".join(lines))
    return folder


TINY = ["--n_layer", "1", "--n_embd", "16", "--n_head", "2", "--batch_size", "4", "--eval_iters", "1",
        "--log_interval", "1", "--warmup", "1", "--max_iters", "3", "--eval_interval", "3", "--block_size", "16"]


@pytest.fixture(scope="module")
def ptb_ckpt(tmp_path_factory):
    root = tmp_path_factory.mktemp("ptb")
    folder = write_ptb(root / "ptb")
    train.main(["--model", "simpletron", "--task", "ptb", "--data_dir", str(folder), "--out_dir", str(root / "run"),
                *TINY])
    return root / "run" / "ckpt.pt", folder


def run_sample(*argv):
    out = io.StringIO()
    y = sample.main([str(a) for a in argv], out=out)
    return y, out.getvalue()


@pytest.mark.parametrize("generate", [None, lambda self, idx, max_new_tokens, temperature=1.0: idx])
def test_sample_py_refuses_a_model_without_generate_in_one_line(ptb_ckpt, monkeypatch, generate):
    if generate is None:
        monkeypatch.delattr(st.Model, "generate")            # a fork's model that left it out
    else:
        monkeypatch.setattr(st.Model, "generate", generate)  # or whose generate takes no top_k
    with pytest.raises(config.UsageError) as e:
        run_sample("--ckpt", ptb_ckpt[0], "--start", "the", "--device", "cpu")
    assert str(e.value) == ("model 'simpletron' has no generate(idx, max_new_tokens, temperature, top_k), which "
                            "sample.py calls (docs/architecture.md, Add a model)")


def test_sample_py_decodes_words_with_the_training_vocabulary(ptb_ckpt, tmp_path):
    ckpt, folder = ptb_ckpt
    y, text = run_sample("--ckpt", ckpt, "--start", "the company said\nit", "--num_samples", 3,
                         "--max_new_tokens", 7, "--seed", 1, "--device", "cpu")
    # the vocabulary as the test builds it: sorted words of the training file (+ <eos>), numbered from 1
    words = sorted({w for line in (folder / "ptb.train.txt").read_text().splitlines() for w in line.split()} | {"<eos>"})
    itos = dict(enumerate(words, start=1))
    assert y.shape == (3, 5 + 7)                              # the, company, said, <eos>, it + 7
    assert [itos[i] for i in y[0, :5].tolist()] == ["the", "company", "said", "<eos>", "it"]
    samples = text.split("---------------\n")
    assert len(samples) == 4 and samples[-1] == ""
    for row, s in zip(y.tolist(), samples):
        lines = [[]]                                          # <eos> ends a line, words between spaces
        for w in (itos.get(i, "<pad>") for i in row):
            lines.append([]) if w == "<eos>" else lines[-1].append(w)
        assert s == "\n".join(" ".join(line) for line in lines) + "\n"
        assert s.startswith("the company said\nit")
    # the same with the prompt in a file, and the same seed: the same samples
    (tmp_path / "prompt.txt").write_text("the company said\nit")
    y2, text2 = run_sample("--ckpt", ckpt, "--start", f"FILE:{tmp_path / 'prompt.txt'}", "--num_samples", 3,
                           "--max_new_tokens", 7, "--seed", 1, "--device", "cpu")
    assert torch.equal(y, y2) and text == text2


def test_sample_py_bad_input_is_one_line(ptb_ckpt, tmp_path):
    ckpt, folder = ptb_ckpt
    cls = st.Model(st.Config(vocab_size=V, block_size=8, head="cls"))
    torch.save({"model_name": "simpletron", "config": vars(cls.config), "model": cls.state_dict(),
                "args": {"task": "listops"}}, tmp_path / "cls.pt")
    cases = [(["--ckpt", tmp_path / "none.pt"], "no checkpoint"),
             (["--ckpt", tmp_path / "cls.pt"], "classifier"),
             (["--ckpt", ckpt, "--start", "the zebra"], "zebra"),
             (["--ckpt", ckpt, "--start", "FILE:" + str(tmp_path / "none.txt")], "cannot read"),
             (["--ckpt", ckpt, "--start", " "], "empty"),
             (["--ckpt", ckpt, "--temperature", "0"], "temperature"),
             (["--ckpt", ckpt, "--data_dir", tmp_path], "vocabulary")]
    for argv, what in cases:
        with pytest.raises((sample.UsageError, train.UsageError), match=what) as e:
            run_sample(*argv)
        assert "\n" not in str(e.value)
    # and from the command line: one line on stderr, no traceback, status 2
    p = subprocess.run([sys.executable, "sample.py", "--ckpt", str(ckpt), "--start", "the zebra"], cwd=ROOT,
                       capture_output=True, text=True)
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.count("\n") == 1 and p.stderr.startswith("error: word 'zebra'"), p.stderr


@pytest.mark.parametrize("tokenizer", ["char", "byte"])
def test_sample_py_textfile(tokenizer, tmp_path):
    text = "to be, or not to be: that is the question.\n" * 40
    (tmp_path / "t.txt").write_text(text)
    train.main(["--model", "transject", "--task", "textfile", "--data_dir", str(tmp_path / "t.txt"), "--tokenizer",
                tokenizer, "--cache_dir", str(tmp_path / "cache"), "--out_dir", str(tmp_path / "run"),
                *TINY[:4], *TINY[6:]])                       # TINY without --n_head: TransJect has no heads
    y, out = run_sample("--ckpt", tmp_path / "run" / "ckpt.pt", "--start", "to be", "--num_samples", 2,
                        "--max_new_tokens", 6, "--device", "cpu")
    chars = sorted(set(text))
    if tokenizer == "char":                                  # ids are the sorted characters from 1
        assert y[:, :5].tolist() == [[chars.index(c) + 1 for c in "to be"]] * 2
        decoded = ["".join(chars[i - 1] for i in row if i) for row in y.tolist()]
    else:                                                    # ids are the bytes (256: <|endoftext|>)
        assert y[:, :5].tolist() == [list(b"to be")] * 2
        decoded = [bytes(i for i in row if i < 256).decode("utf-8", "replace") for row in y.tolist()]
    assert out == "".join(f"{s}\n---------------\n" for s in decoded)


class OutputNamedOut(torch.nn.Module):
    """A fork's language model whose output layer is not named lm_head, with nanoGPT's generate (self(idx) a step)."""
    def __init__(self, model):
        super().__init__()
        self.inner, self.config = model, model.config

    def forward(self, idx, targets=None):
        return self.inner(idx, targets)

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None):
        for _ in range(max_new_tokens):
            logits, _ = self(idx[:, -self.config.block_size:])
            idx = torch.cat([idx, torch.multinomial(torch.softmax(logits[:, -1] / temperature, -1), 1)], 1)
        return idx


def test_a_run_with_more_ids_than_its_text_samples_and_fine_tunes_its_texts_ids_alone(tmp_path, monkeypatch):
    """--vocab_size above the task's (nanoGPT's 50304): the ids no text has are never drawn, and the checkpoint
    fine-tunes on its task; a vocabulary larger than the model's is refused."""
    (tmp_path / "t.txt").write_text("to be, or not to be: that is the question.\n" * 40)
    common = ["--task", "textfile", "--data_dir", tmp_path / "t.txt", "--tokenizer", "char", "--cache_dir",
              tmp_path / "cache", *TINY]
    train.main([str(a) for a in [*common, "--vocab_size", "200", "--out_dir", tmp_path / "run"]])
    y, out = run_sample("--ckpt", tmp_path / "run" / "ckpt.pt", "--start", "to", "--num_samples", 8,
                        "--max_new_tokens", 60, "--temperature", "5", "--top_k", "0", "--device", "cpu")
    n = len(set("to be, or not to be: that is the question.\n")) + 1    # the characters and the padding id 0
    assert 0 < y.max() < n and len(out) > 8 * 60
    with monkeypatch.context() as m:                         # a fork's model without lm_head: its forward's logits
        m.setattr(sample, "model_of_checkpoint", lambda *a: OutputNamedOut(config.model_of_checkpoint(*a)))
        y, _ = run_sample("--ckpt", tmp_path / "run" / "ckpt.pt", "--start", "to", "--num_samples", 8,
                          "--max_new_tokens", 60, "--temperature", "5", "--top_k", "0", "--device", "cpu")
        assert 0 < y.max() < n and y.shape == (8, 2 + 60)
    ft = train.main([str(a) for a in [*common, "--init_from", tmp_path / "run" / "ckpt.pt", "--out_dir", tmp_path / "ft"]])
    assert ft["config"]["vocab_size"] == 200
    (tmp_path / "u.txt").write_text("to be, or not to be: that is the question?!\n" * 40)   # one more character
    ckpt = torch.load(tmp_path / "run" / "ckpt.pt", weights_only=True)
    ckpt.pop("vocabulary")                                   # a checkpoint before train.py recorded its characters
    assert sample.tokenizer_of({**ckpt, "config": {"vocab_size": n + 1}}, str(tmp_path / "u.txt"))[1] == n + 1
    with pytest.raises(sample.UsageError, match=f"rebuilt here has {n + 1} ids but the checkpoint's model has {n}:"):
        sample.tokenizer_of({**ckpt, "config": {"vocab_size": n}}, str(tmp_path / "u.txt"))


def test_a_text_that_changed_since_training_is_refused_or_decoded_as_trained(tmp_path):
    """A character the text lost shifts every id after it: --resume and --init_from refuse it in one line naming the
    first id that moved; sample.py and analyze.py --text read the characters the checkpoint records, as trained."""
    import analyze
    text = "to be, or not to be: that is the question?\n" * 40
    (tmp_path / "t.txt").write_text(text)
    common = ["--task", "textfile", "--data_dir", tmp_path / "t.txt", "--tokenizer", "char", "--cache_dir",
              tmp_path / "cache", *TINY]
    train.main([str(a) for a in [*common, "--out_dir", tmp_path / "run"]])
    ckpt = torch.load(tmp_path / "run" / "ckpt.pt", weights_only=True)
    chars = sorted(set(text))                                # id i: the i-th sorted character, from 1
    assert ckpt["vocabulary"] == "".join(chars)
    (tmp_path / "t.txt").write_text(text.replace(",", ""))   # ',' was id 3 (after '\n' and ' '); '.' is not there
    assert chars[:3] == ["\n", " ", ","] and chars[3] == ":"
    line = "the checkpoint's model was trained on {} characters, the text read now has {} (id 3 stood for ',', now for ':')"
    for more in (["--resume", "--out_dir", tmp_path / "run", "--max_iters", "6"],
                 ["--init_from", tmp_path / "run" / "ckpt.pt", "--out_dir", tmp_path / "ft"]):
        with pytest.raises(config.UsageError) as e:
            train.main([str(a) for a in [*common, *more]])
        assert line.format(len(chars), len(chars) - 1) in str(e.value) and "\n" not in str(e.value)
    assert torch.load(tmp_path / "run" / "ckpt.pt", weights_only=True)["iter"] == 3 and not (tmp_path / "ft").exists()
    y, out = run_sample("--ckpt", tmp_path / "run" / "ckpt.pt", "--start", "to be,", "--num_samples", 2,
                        "--max_new_tokens", 5, "--device", "cpu")
    assert y[:, :6].tolist() == [[chars.index(c) + 1 for c in "to be,"]] * 2
    assert out == "".join("".join(chars[i - 1] for i in row) + "\n---------------\n" for row in y.tolist())
    with pytest.raises(config.UsageError, match="--data_dir: the checkpoint records its vocabulary"):
        run_sample("--ckpt", tmp_path / "run" / "ckpt.pt", "--data_dir", tmp_path / "t.txt")
    ids, labels = analyze.encode_text("be,", ckpt)
    assert ids.tolist() == [[chars.index(c) + 1 for c in "be,"]] and labels == list("be,")
    with pytest.raises(config.UsageError, match=line.format(len(chars), len(chars) - 1).replace("(", r"\(")
                       .replace(")", r"\)").replace("?", r"\?")):
        analyze.sample_batch(ckpt, 2, 8)
    torch.save({**ckpt, "vocabulary": 7}, tmp_path / "bad.pt")   # a damaged record: one line when loaded
    with pytest.raises(config.UsageError, match="bad.pt is damaged: its record of what its ids stand for"):
        config.load_checkpoint(str(tmp_path / "bad.pt"))


def test_a_ptb_run_records_its_words_and_refuses_a_training_file_that_lost_one(ptb_ckpt, tmp_path):
    ckpt, folder = ptb_ckpt
    recorded = torch.load(ckpt, weights_only=True)["vocabulary"]
    words = sorted({w for line in (folder / "ptb.train.txt").read_text().splitlines() for w in line.split()} | {"<eos>"})
    assert recorded == words
    changed = write_ptb(tmp_path / "ptb")
    train_text = (changed / "ptb.train.txt").read_text()
    gone = words[1]                                          # (words[0] is '<eos>': the second word is dropped)
    (changed / "ptb.train.txt").write_text(" ".join(w for w in train_text.split(" ") if w != gone))
    for split in ("valid", "test"):                          # (kept within the smaller vocabulary)
        kept = (changed / f"ptb.{split}.txt").read_text().replace(f" {gone} ", " ")
        (changed / f"ptb.{split}.txt").write_text(kept.replace(f" {gone} ", " "))
    with pytest.raises(config.UsageError) as e:
        train.main(["--init_from", str(ckpt), "--data_dir", str(changed), "--out_dir", str(tmp_path / "ft"),
                    *TINY[8:]])
    assert (f"task ptb: the checkpoint's model was trained on {len(words)} words, the training file read now has "
            f"{len(words) - 1} (id 2 stood for {gone!r}, now for {words[2]!r}): its ids would mean other words") \
        in str(e.value)


def char_checkpoint(path, vocabulary, vocab_size=6):
    """A tiny char language model's checkpoint that records `vocabulary` (train.py: the text's characters, sorted)."""
    model = st.Model(st.Config(vocab_size=vocab_size, block_size=8, n_layer=1, n_head=2, n_embd=8, head="lm"))
    torch.save({"model_name": "simpletron", "config": vars(model.config), "model": model.state_dict(),
                "args": {"task": "textfile", "tokenizer": "char", "data_dir": "t.txt", "cache_dir": "data"},
                "vocabulary": vocabulary}, path)
    return str(path)


def test_sample_py_refuses_a_damaged_record_of_the_vocabulary_naming_the_checkpoint(ptb_ckpt, tmp_path):
    """train.py records each character (each word) once, sorted, ids 1 to n within the model's: a record that
    breaks this is a damaged checkpoint, said in one line naming it, and nothing is sampled (not advice to pass
    --data_dir, which a recorded vocabulary refuses)."""
    assert run_sample("--ckpt", char_checkpoint(tmp_path / "ok.pt", "\n abe"), "--start", "ab", "--num_samples", 1,
                      "--max_new_tokens", 3, "--device", "cpu")[0].shape == (1, 5)   # 5 characters, ids 1-5 of 6
    cases = {"twice.pt": ("\n abb", "its recorded characters hold 'b' twice"),
             "order.pt": ("\n bae", "its recorded characters are out of order"),
             "more.pt": ("\n abcdefg", "it records 9 characters (ids 1 to 9) but its model has 6 ids")}
    for name, (chars, what) in cases.items():
        with pytest.raises(config.UsageError) as e:
            run_sample("--ckpt", char_checkpoint(tmp_path / name, chars), "--start", "ab", "--device", "cpu")
        assert str(e.value).startswith(f"checkpoint {tmp_path / name} is damaged: {what}") and "\n" not in str(e.value)
    words = torch.load(ptb_ckpt[0], weights_only=True)
    torch.save({**words, "vocabulary": [*words["vocabulary"], words["vocabulary"][-1]]}, tmp_path / "w.pt")
    with pytest.raises(config.UsageError, match=f"is damaged: its recorded words hold {words['vocabulary'][-1]!r} "
                       "twice"):
        run_sample("--ckpt", tmp_path / "w.pt", "--start", "the", "--device", "cpu")


def test_sample_py_bounds_the_whole_work_before_it_starts(ptb_ckpt, monkeypatch):
    """--num_samples x --max_new_tokens x the model's operations a token: per sample and token its weights, its
    attention (2 x layers x held tokens x n_embd), the ids so far (half the new ones on average) and STEP_OPS;
    above MAX_WORK (a GPU: 100 times it) refused in one line before any sampling."""
    class Standin(torch.nn.Module):                          # 1,000 weights, 1 layer of width 2, block_size 4
        config = type("C", (), dict(n_layer=1, n_embd=2, block_size=4))

        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1000))
    args = type("A", (), dict(num_samples=10, max_new_tokens=100))
    work = 10 * 100 * (1000 + 2 * 1 * 4 * 2 + 3 + 50 + 50_000)            # prompt 3, 103 tokens: 4 held
    assert work == 51_069_000
    for limit, device, refused in ((work, "cpu", False), (work - 1, "cpu", True), (work / 100, "cuda", False),
                                   (work / 100 - 1, "cuda:0", True)):
        monkeypatch.setattr(sample, "MAX_WORK", limit)
        if not refused:
            sample.check_work(args, Standin(), 3, device)
            continue
        with pytest.raises(config.UsageError, match=r"^--num_samples 10 x --max_new_tokens 100 from a model of 1,000 "
                           r"weights are about 5\.1e\+07 operations; .* lower --num_samples or --max_new_tokens$"):
            sample.check_work(args, Standin(), 3, device)
    monkeypatch.undo()
    monkeypatch.setattr(st.Model, "generate", lambda *a, **k: pytest.fail("sampling started"))
    with pytest.raises(config.UsageError, match="^--num_samples 1,000 x --max_new_tokens 100,000 from a model of"):
        run_sample("--ckpt", ptb_ckpt[0], "--start", "the", "--num_samples", 1000, "--max_new_tokens", 100_000,
                   "--device", "cpu")


# ----------------------------------------------------------------------------------------------
# bench.py --generate (records, not times: no test is timed)

def test_bench_generate_refuses_a_model_without_prefill_and_decode_before_any_timing(tmp_path, monkeypatch):
    """A fork's model with generate alone (nanoGPT's): --generate times model.prefill and model.decode."""
    monkeypatch.delattr(st.Model, "decode")
    with pytest.raises(bench.UsageError) as e:
        bench.main(["--out", str(tmp_path / "o"), "--lengths", "", "--generate", "--models", "softmax,transject"])
    assert str(e.value) == "--generate times model.prefill and model.decode, which softmax has not: leave it out"
    assert not (tmp_path / "o").exists()


def test_speed_generate_records(tmp_path):
    out = tmp_path / "speed"
    bench.main(["--out", str(out), "--lengths", "", "--generate", "--contexts", "8,24", "--new_tokens", "2",
                "--repeats", "1", "--n_layer", "1", "--n_embd", "16", "--n_head", "2", "--vocab", "32", "--time_dim", "2"])
    records = json.loads((out / "speed.json").read_text())
    assert {(r["model"], r["length"]) for r in records} == {(m, L) for m in config.MODELS for L in (8, 24)}
    assert all(r["mode"] == "generate" and r["ms"] > 0 and r["new_tokens"] == 2 for r in records)
    state = {(r["model"], r["length"]): r["state_mb"] for r in records}
    for m in ("simpletron", "transject"):                    # a state of fixed size
        assert state[m, 8] == state[m, 24] > 0
    for m in ("softmax", "diffeqformer"):                    # the KV cache: capacity context + new tokens
        assert state[m, 24] / state[m, 8] == pytest.approx((24 + 2) / (8 + 2))
    summary = json.loads((out / "speed_summary.json").read_text())
    assert any("ms per new token at a 24-token context / at 8" in q["what"] for q in summary["ratios"])
    assert (out / "speed_generate.png").exists() and "ms per new token" in (out / "speed.md").read_text()
    assert not (out / "speed.png").exists()                  # generation alone: no training benchmark
    md = (out / "speed.md").read_text().splitlines()
    caption = next(i for i, line in enumerate(md) if line.startswith("Generation: milliseconds per new token"))
    header = next(i for i, line in enumerate(md) if "| batch x context | ms per new token |" in line)
    assert md[caption + 1] == "" and header == caption + 2 and md[header + 1].startswith("|-")   # its caption first
    assert len([line for line in md[header + 2:] if line.startswith("| ")]) == len(records)      # a row a record


@pytest.mark.parametrize("values", [[31.0, 44.0], [0.9, 1.05], [3.0, 4000.0], [0.0123]])
def test_log_axes_get_at_least_two_ticks_around_the_data(values):
    fig, ax = bench.plt.subplots()
    ax.set_yscale("log")
    bench.log_ticks(ax, "y", values)
    ticks = ax.get_yticks()
    lo, hi = ax.get_ylim()
    assert len(ticks) >= 2 and lo <= min(values) and max(values) <= hi
    assert all(lo <= t <= hi for t in ticks)
    bench.plt.close(fig)


@pytest.mark.parametrize("module", [st, tj, de])
def test_sampling_from_half_precision_logits_is_sampling_from_their_float32_values(module):
    """bf16 logits (autocast on CUDA) are sampled in float32: the same draws as from the same values in float32
    (softmax in bf16 would round the probabilities and change some of 2,000 draws)."""
    torch.manual_seed(0)
    logits = (torch.randn(2000, 50) * 3).bfloat16()
    torch.manual_seed(1)
    a = module.sample_next(logits)
    torch.manual_seed(1)
    b = module.sample_next(logits.float())
    assert torch.equal(a, b)
    torch.manual_seed(1)                                     # top_k: the same k largest kept
    a = module.sample_next(logits, temperature=0.7, top_k=5)
    torch.manual_seed(1)
    assert torch.equal(a, module.sample_next(logits.float(), temperature=0.7, top_k=5))
