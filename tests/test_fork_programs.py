"""A fork's broken model under sample.py, analyze.py and bench.py (battery H07, H08 and the like): a forward, generate,
hidden_states, prefill or decode that raises, or returns what the program cannot read, is one line on stderr and exit
status 2 (config.model_call, or a check of what came back), never a traceback. Each case patches simpletron.Model as
a fork's copy of simpletron.py may have it and runs the program's main as its __main__ does (data.run_main)."""

import functools
import types

import pytest
import torch

import analyze
import bench
import config
import data
import sample
import simpletron
import train

TINY = ["--n_layer", "1", "--n_embd", "16", "--n_head", "2", "--batch_size", "4", "--eval_iters", "1",
        "--log_interval", "1", "--warmup", "1", "--max_iters", "2", "--eval_interval", "2", "--block_size", "16"]
TEXT = "to be, or not to be: that is the question.\n" * 40
BENCH = ["--lengths", "16", "--repeats", "1", "--n_layer", "1", "--n_head", "2", "--n_embd", "16", "--vocab", "32",
         "--threads", "1", "--device", "cpu"]


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    """A tiny character model of a text (simpletron, textfile --tokenizer char): its ckpt.pt."""
    root = tmp_path_factory.mktemp("fork")
    (root / "t.txt").write_text(TEXT)
    train.main(["--task", "textfile", "--data_dir", str(root / "t.txt"), "--tokenizer", "char", "--cache_dir",
                str(root / "cache"), "--out_dir", str(root / "lm"), *TINY])
    return str(root / "lm" / "ckpt.pt")


@pytest.fixture(autouse=True)
def small_products(monkeypatch):
    """bench.py's matmul rate from 128 x 128 products (as tests/test_bench.py has it)."""
    monkeypatch.setattr(bench, "matmul_size", lambda device, dtype=torch.float32: 128)


def one_line(main, argv, capsys):
    """main(argv) as its __main__ runs it: exit status 2 and one line on stderr, which is returned."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        data.run_main(functools.partial(main, argv), config.UsageError)
    err = capsys.readouterr().err
    assert e.value.code == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err.removeprefix("error: ").rstrip("\n")


def raises(*a, **kw):
    raise RuntimeError("boom")


def source_line(text):
    """The number of the first line of simpletron.py that holds text."""
    with open(simpletron.__file__, encoding="utf-8") as f:
        return next(i for i, line in enumerate(f, 1) if text in line)


def nanogpt_generate(self, idx, max_new_tokens, temperature=1.0, top_k=None):
    """nanoGPT's generate, which calls the model's forward on every step."""
    for _ in range(max_new_tokens):
        logits, _ = self(idx[:, -self.config.block_size:])
        idx = torch.cat([idx, logits[:, -1:].argmax(-1)], dim=1)
    return idx


# ----------------------------------------------------------------------------------------------
# sample.py

@pytest.mark.parametrize("patch", ["generate", "read_tokens", "forward"])
def test_sample_py_a_forks_generate_or_forward_that_raises_is_one_line(patch, lm, monkeypatch, capsys):
    """Battery H07: generate raising was a traceback at sample.py's model.generate; so was a forward raising under
    a generate that calls it (nanoGPT's). One line naming the model, its file (and line there) and the error."""
    if patch == "read_tokens":                               # under simpletron's own generate, in prefill
        monkeypatch.setattr(simpletron, "read_tokens", raises)
    elif patch == "forward":
        monkeypatch.setattr(simpletron.Model, "generate", nanogpt_generate)
        monkeypatch.setattr(simpletron.Model, "forward", raises)
    else:
        monkeypatch.setattr(simpletron.Model, "generate", raises)
    line = one_line(sample.main, ["--ckpt", lm, "--start", "to be", "--num_samples", "2", "--max_new_tokens", "3",
                                  "--device", "cpu"], capsys)
    where = f"simpletron.py line {source_line('return read_tokens(self, idx, state), state')}" \
        if patch == "read_tokens" else "simpletron.py"
    assert line == f"model 'simpletron': generate ({where}) fails: RuntimeError: boom"


def returning(y):
    return lambda self, idx, max_new_tokens, temperature=1.0, top_k=None: y(idx)


@pytest.mark.parametrize("y, said", [
    (lambda idx: torch.cat([idx, torch.full((len(idx), 1), 10 ** 6)], 1), "id 1000000 outside the vocabulary (ids 0 "
     "to "),
    (lambda idx: torch.cat([idx, torch.full((len(idx), 1), -1)], 1), "id -1 outside the vocabulary"),
    (lambda idx: torch.cat([idx.float(), torch.zeros(len(idx), 1)], 1), "a torch.float32 tensor of shape (2, 6), not "
     "the integer ids of the samples (2, tokens)"),
    (lambda idx: idx[:1], "a torch.int64 tensor of shape (1, 5)"),
    (lambda idx: None, "NoneType, not the integer ids"),
    (lambda idx: idx.tolist(), "list, not the integer ids")])
def test_sample_py_a_forks_generate_that_returns_ids_it_cannot_decode_is_one_line(y, said, lm, monkeypatch, capsys):
    """Battery H08: a generate returning an id past the vocabulary was an IndexError in Chars.decode (a negative one
    printed the last character). Its ids are checked: one line naming the model and the first id outside."""
    monkeypatch.setattr(simpletron.Model, "generate", returning(y))
    line = one_line(sample.main, ["--ckpt", lm, "--start", "to be", "--num_samples", "2", "--max_new_tokens", "1",
                                  "--device", "cpu"], capsys)
    assert line.startswith(f"model 'simpletron': its generate returned {said}"), line


# ----------------------------------------------------------------------------------------------
# analyze.py

def test_analyze_py_a_forks_hidden_states_or_forward_that_raises_is_one_line(lm, tmp_path, monkeypatch, capsys):
    """Battery: a model's hidden_states raising (or, without it, its forward under the hooks on its blocks) was a
    traceback at analyze.py's layer_states. One line naming the model, its file and the error."""
    argv = ["activation", "--ckpt", lm, "--n_seq", "2", "--out", str(tmp_path)]
    monkeypatch.setattr(simpletron.Model, "forward", raises)
    assert one_line(analyze.main, argv, capsys) == "model 'simpletron': forward (simpletron.py) fails: RuntimeError: boom"
    monkeypatch.setattr(simpletron.Model, "hidden_states", raises, raising=False)
    assert one_line(analyze.main, argv, capsys) == ("model 'simpletron': hidden_states (simpletron.py) fails: "
                                                    "RuntimeError: boom")
    assert not list(tmp_path.iterdir())


X, M = torch.zeros(2, 8, 16), torch.ones(2, 8, dtype=torch.bool)


@pytest.mark.parametrize("out, said", [
    (None, "states None and mask None"),
    (X, "states (2, 8, 16) and mask None"),
    ((X, X), "states (2, 8, 16) and mask (2, 8, 16)"),              # two states alone, read as (states, mask)
    (([], None), "states [] and mask None"),
    (([X, X[:, :4]], M), "states [(2, 8, 16), (2, 4, 16)] and mask (2, 8)"),
    (([X, X[0]], None), "states [(2, 8, 16), (8, 16)] and mask None"),
    (([X.long()], None), "states [(2, 8, 16)] and mask None"),      # integers
    (([X, "X1"], None), "states [(2, 8, 16), 'str'] and mask None"),
    (([X], M[:, :3]), "states [(2, 8, 16)] and mask (2, 3)"),
    (([X], [1, 1]), "states [(2, 8, 16)] and mask list")])
def test_analyze_py_a_forks_hidden_states_that_returns_something_else_is_one_line(out, said, lm, tmp_path,
                                                                                  monkeypatch, capsys):
    """Battery: a hidden_states returning other than ([X^0, ..., X^L] of one shape (B, N, D), mask (B, N) or None)
    was a traceback further on (unpacking it, activation_factor). One line saying what it returned."""
    monkeypatch.setattr(simpletron.Model, "hidden_states", lambda self, idx: out, raising=False)
    line = one_line(analyze.main, ["activation", "--ckpt", lm, "--n_seq", "2", "--out", str(tmp_path)], capsys)
    assert line == (f"model 'simpletron': its hidden_states(idx) returned {said}; analyze.py reads [X^0, ..., X^L], "
                    "float tensors of one shape (B, N, D), and a mask (B, N) or None")


def test_analyze_py_reads_a_models_own_hidden_states(lm, tmp_path, monkeypatch):
    """A model's hidden_states as the docstring has it (a tuple of states, a mask of ones and zeros) is read."""
    import json
    monkeypatch.setattr(simpletron.Model, "hidden_states",
                        lambda self, idx: ((torch.randn(*idx.shape, 16),) * 3, torch.ones(idx.shape, dtype=torch.long)),
                        raising=False)
    analyze.main(["activation", "--ckpt", lm, "--n_seq", "2", "--out", str(tmp_path)])
    assert len(json.loads((tmp_path / "activation.json").read_text())["models"][0]["entropy"]) == 3


# ----------------------------------------------------------------------------------------------
# bench.py

@pytest.mark.parametrize("model", ["simpletron", "softmax", "softmax_naive"])
def test_bench_py_a_forks_forward_that_raises_is_one_line_before_any_timing(model, tmp_path, monkeypatch, capsys):
    """Battery: a forward raising was a traceback at make_steps' model(x, y), reached from check_sizes' step_cost.
    One line naming the model (an entry of bench.py's own: its model file's name) and the error."""
    monkeypatch.setattr(simpletron.Model, "forward", raises)
    monkeypatch.setattr(bench, "time_configs", lambda *a: pytest.fail("timed"))
    line = one_line(bench.main, ["--models", model, *BENCH, "--out", str(tmp_path / "o")], capsys)
    name = "simpletron" if model == "softmax_naive" else model
    assert line == f"model '{name}': forward (simpletron.py) fails: RuntimeError: boom"


@pytest.mark.parametrize("loss, said", [(lambda loss: None, "None"), (lambda loss: loss.detach(), "a tensor with "
                                                                      "no gradient"),
                                        (lambda loss: loss.item(), "a float, not a tensor")])
def test_bench_py_a_forks_forward_whose_loss_is_not_one_number_is_one_line(loss, said, tmp_path, monkeypatch, capsys):
    """Battery: a forward returning loss None was an AttributeError traceback at make_steps' loss.backward(). Its
    (logits, loss) is held to train.py's interface: one line."""
    forward = simpletron.Model.forward
    monkeypatch.setattr(simpletron.Model, "forward", lambda self, idx, targets=None: (
        forward(self, idx, targets)[0], None if targets is None else loss(forward(self, idx, targets)[1])))
    line = one_line(bench.main, ["--models", "simpletron", *BENCH, "--out", str(tmp_path / "o")], capsys)
    assert line.startswith(f"model simpletron's forward returned (logits, loss) with loss {said}"), line


@pytest.mark.parametrize("method", ["prefill", "decode"])
def test_bench_py_a_forks_prefill_or_decode_that_raises_is_one_line(method, tmp_path, monkeypatch, capsys):
    """Battery: --generate with a prefill (or decode) that raises was a traceback at generation_steps'. One line."""
    monkeypatch.setattr(simpletron.Model, method, raises)
    line = one_line(bench.main, ["--generate", "--lengths", "", "--contexts", "8", "--new_tokens", "2", "--models",
                                 "simpletron", *BENCH[2:], "--out", str(tmp_path / "o")], capsys)
    assert line == f"model 'simpletron': {method} (simpletron.py) fails: RuntimeError: boom"
    assert not (tmp_path / "o" / "speed.json").exists()


def test_bench_py_a_forks_state_whose_nbytes_raises_is_one_line(tmp_path, monkeypatch, capsys):
    prefill = simpletron.Model.prefill
    monkeypatch.setattr(simpletron.Model, "prefill", lambda self, idx, capacity=None: (
        prefill(self, idx, capacity)[0], types.SimpleNamespace(nbytes=raises)))
    monkeypatch.setattr(simpletron.Model, "decode", lambda self, idx, state: None)
    line = one_line(bench.main, ["--generate", "--lengths", "", "--contexts", "8", "--new_tokens", "2", "--models",
                                 "simpletron", *BENCH[2:], "--out", str(tmp_path / "o")], capsys)
    assert line == "model 'simpletron': its state's nbytes (simpletron.py) fails: RuntimeError: boom"
