"""A fork, as docs/architecture.md tells it: in a copy of the project, a throwaway model and a throwaway task added by
the steps that page's "Add a model" and "Add a task" name, and nothing else. The model's Config first has a field
named like a train.py flag (eps), which must be refused in one line; renamed, both train a few steps, and the tests
that read the registries pass. When a new model or task needs a step the page does not name, this test fails."""

import math
import os
import re
import shutil
import subprocess
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

MODEL = '''"""A throwaway model: each position predicts the next token from the mean of the embeddings up to it."""
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class Config:
    vocab_size: int = 16        # token ids
    block_size: int = 32        # the longest input
    n_layer: int = 1            # blocks
    n_head: int = 1             # heads
    n_embd: int = 16            # width
    dropout: float = 0.0        # dropout
    bias: bool = True           # biases
    head: str = "lm"            # lm only
    n_classes: int = 0          # classes
    eps: float = 1e-5           # the LayerNorm's epsilon

    def __post_init__(self):
        if self.head != "lm":
            raise ValueError("mymodel is a language model: head must be lm")


class State:
    def __init__(self, total, t):
        self.total, self.t = total, t                    # (B, D), tokens read

    def nbytes(self):
        return self.total.numel() * self.total.element_size()


class Model(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.norm = nn.LayerNorm(config.n_embd, eps=config.eps)
        self.out = nn.Linear(config.n_embd, config.vocab_size, bias=config.bias)

    def forward(self, idx, targets=None):
        total = self.wte(idx).cumsum(1)                  # (B, L, D)
        logits = self.out(self.norm(total / torch.arange(1, idx.shape[1] + 1, device=idx.device)[:, None]))
        loss = None if targets is None else F.cross_entropy(logits.flatten(0, 1), targets.flatten())
        return logits, loss

    @torch.no_grad()
    def prefill(self, idx, capacity=None):
        state = State(self.wte(idx).sum(1), idx.shape[1])
        return self.out(self.norm(state.total / state.t)), state

    @torch.no_grad()
    def decode(self, idx_next, state):
        state.total += self.wte(idx_next[:, 0])
        state.t += 1
        return self.out(self.norm(state.total / state.t))

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None):
        logits, state = self.prefill(idx)
        for _ in range(max_new_tokens):
            nxt = torch.multinomial(F.softmax(logits / temperature, -1), 1)
            idx = torch.cat([idx, nxt], 1)
            logits = self.decode(nxt, state)
        return idx
'''

TASK = '''"""A throwaway task: a stream that repeats 1..7, generated once into cache_dir/mytask."""
import os

import numpy as np

from data import DataError, LMSplit, Task, cached_dir, task


@task("mytask")
def mytask(cache_dir="data", data_dir=None, block_size=8, **_):
    if data_dir is not None:
        raise DataError("mytask is generated: leave out --data_dir")
    folder = os.path.join(cache_dir, "mytask")

    def build(out):
        ids = (np.arange(3000) % 7 + 1).astype(np.uint8)
        ids[:2700].tofile(os.path.join(out, "train.bin"))
        ids[2700:].tofile(os.path.join(out, "val.bin"))
    cached_dir(folder, build)

    def load(split):
        return LMSplit(np.fromfile(os.path.join(folder, f"{split}.bin"), np.uint8), block_size, f"mytask {split}")
    return Task("mytask", "lm", 8, block_size, 0, {s: (lambda s=s: load(s)) for s in ("train", "val")})
'''


def recipe(page, name):
    """The text of the "Add NAME" item of the page's "Where to change what"."""
    m = re.search(rf"^- \*\*Add {name}\*\*:(.*?)(?=^- \*\*|^\n)", page, re.M | re.S)
    assert m, f"docs/architecture.md has no '- **Add {name}**:' item"
    return " ".join(m.group(1).split())


def edit(path, after, line):
    """Insert `line` after the first match of the regular expression `after` in the file at path."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    m = re.search(after, text, re.M)
    assert m, f"{path}: no {after!r} to add {line.strip()!r} after (the project changed: update tests/test_fork.py)"
    with open(path, "w", encoding="utf-8") as f:
        f.write(text[:m.end()] + line + text[m.end():])


def run(copy, *argv):
    return subprocess.run([sys.executable, *argv], cwd=copy, capture_output=True, text=True, timeout=600)


def test_a_model_and_a_task_added_by_the_documented_steps_train(tmp_path):
    copy = tmp_path / "fork"
    shutil.copytree(ROOT, copy, ignore=shutil.ignore_patterns(".git", "data", "out", ".pytest_cache", "__pycache__",
                                                              ".venv", "*.tmp*"))
    page = (copy / "docs" / "architecture.md").read_text(encoding="utf-8")
    model, task = recipe(page, "a model"), recipe(page, "a task")
    # Add a model: every step taken below is one the page names
    for step in ("a new file `mymodel.py`", "`Config`", "`Model(config)`", "`generate`", "model.prefill(idx, capacity)",
                 "model.decode(idx_next, state)", "state.nbytes()", "reserved name", "`config.MODELS`",
                 "`config.PRESETS`", "`config.FIELD_HELP`", "`tests/test_layers.py`'s table", "layer picture"):
        assert step in model, f"docs/architecture.md's 'Add a model' no longer names: {step}"
    (copy / "mymodel.py").write_text(MODEL)
    edit(copy / "config.py", r"^MODELS = \{\n", '    "mymodel": ("mymodel", {}),\n')
    edit(copy / "config.py", r"^PRESETS = \{\n\s*\"cpu\": \{[^\n]*\n", '        ("mymodel", "*"): dict(lr=1e-2),\n')
    edit(copy / "config.py", r"^FIELD_HELP = \{\n", '    "mymodel": {"eps": "the LayerNorm\'s epsilon"},\n')
    edit(copy / "tests" / "test_layers.py", r"^LAYERS = \{\n", '    "mymodel": 0,\n')
    edit(copy / "docs" / "architecture.md", r"^ *layer 0 +simpletron\.py", "   mymodel.py")
    # Add a task
    for step in ("a new file in `tasks/`", '`@data.task("name")`', "`data.Task`", "`tasks/__init__.py`",
                 "`data.DataError`", "`data.cached_dir(folder, build)`", "`tests/test_cache.py`'s `VARIANTS`",
                 "`DATA_CHANGES`"):
        assert step in task, f"docs/architecture.md's 'Add a task' no longer names: {step}"
    (copy / "tasks" / "mytask.py").write_text(TASK)
    with open(copy / "tasks" / "__init__.py", "a") as f:
        f.write("from tasks import mytask  # noqa: E402, F401\n")
    edit(copy / "tests" / "test_cache.py", r"^VARIANTS = \{\n",
         '    "mytask": (lambda t, hf: None, {}, [dict(block_size=5)]),\n')
    edit(copy / "tests" / "test_cache.py", r"^DATA_CHANGES = \{\n", '    "mytask": None,\n')
    argv = ["train.py", "--model", "mymodel", "--task", "mytask", "--max_iters", "3", "--batch_size", "4",
            "--eval_iters", "1", "--out_dir", "out/fork"]
    # a Config field named like a flag: refused in one line that names both
    r = run(copy, *argv)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr
    assert "Config field eps" in r.stderr and "--eps" in r.stderr and "eps" in page[page.index("Reserved names"):]
    for path in (copy / "mymodel.py", copy / "config.py"):   # renamed: trained
        path.write_text(path.read_text().replace("eps: float = 1e-5", "norm_eps: float = 1e-5").replace(
            "eps=config.eps", "eps=config.norm_eps").replace('{"eps": "the', '{"norm_eps": "the'))
    r = run(copy, *argv)
    assert r.returncode == 0 and (copy / "out" / "fork" / "metrics.json").exists(), r.stdout[-2000:] + r.stderr
    assert "mymodel on mytask" in r.stdout
    # the tests that read the registries (models, tasks, layers, presets, caches) pass on the fork
    r = run(copy, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "tests/test_layers.py", "tests/test_help.py",
            "tests/test_data.py::test_all_tasks_are_known_to_train_py",
            "tests/test_generate.py::test_speed_generate_records",
            "tests/test_cache.py::test_every_task_and_every_setting_of_its_loader_is_covered",
            "tests/test_cache.py::test_a_cache_name_follows_every_setting_that_changes_its_content[mytask]")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]


def test_the_page_lists_the_reserved_names():
    import config
    with open(os.path.join(ROOT, "docs", "architecture.md"), encoding="utf-8") as f:
        page = f.read()
    paragraph = page[page.index("Reserved names"):].split("\n\n")[0]
    listed = re.findall(r"`(\w+)`", paragraph.partition(":")[2])
    assert listed == [*config.DEFAULTS, "help"], ("docs/architecture.md's reserved names are not config.FLAGS' (and "
                                                  "help): list the flags there as config.FLAGS has them")


def fork_module(monkeypatch, tmp_path, name, source, tasks=True):
    """A fork's file `name`.py of `source` in tmp_path, made the working folder, imported (its @task or Model
    registered); with tasks, the registry emptied first and run_main's signal handlers left out (pytest's process)."""
    import importlib.util
    import signal

    import data
    if tasks:
        monkeypatch.setattr(data, "TASKS", {})
        monkeypatch.setattr(signal, "signal", lambda *a: None)
    monkeypatch.chdir(tmp_path)
    (tmp_path / f"{name}.py").write_text(source)
    spec = importlib.util.spec_from_file_location(name, str(tmp_path / f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, module)
    spec.loader.exec_module(module)
    return module


def fork_loader(module, returns=None):
    """A fork's loader, as if defined in `module`: (cache_dir, data_dir, block_size, gen_size, **_) -> returns()."""
    def gen(cache_dir="data", data_dir=None, block_size=8, gen_size=300, **_):
        return returns()
    gen.__module__ = module
    return gen


def test_a_task_naming_an_option_its_loader_lacks_is_refused_at_registration(monkeypatch):
    """A misspelt generated_only name (battery 16 case 92: gen_sise for gen_size) was never refused with --data_dir;
    a misspelt help name was never shown. tasks/__init__.py says the first such problem in one line."""
    import data
    monkeypatch.setattr(data, "TASKS", {})
    monkeypatch.setattr(data, "UNFIT", {})
    data.task("gen", generated_only=("gen_sise",))(fork_loader("tasks.gen"))
    data.task("gen2", help={"gen_size": "examples", "blocksize": "tokens"})(fork_loader("tasks.gen2"))
    data.task("gen3", help={"gen_size": "examples"}, generated_only=("gen_size",))(fork_loader("tasks.gen3"))
    assert data.UNFIT == {
        "gen": "@task(..., generated_only=...) names 'gen_sise', which its loader gen() in tasks.gen has no parameter "
               "of (did you mean 'gen_size'?); its options are cache_dir, data_dir, block_size, gen_size",
        "gen2": "@task(..., help=...) names 'blocksize', which its loader gen() in tasks.gen2 has no parameter of "
                "(did you mean 'block_size'?); its options are cache_dir, data_dir, block_size, gen_size"}
    assert list(data.TASKS) == ["gen", "gen2", "gen3"]       # (registered: tasks/__init__ refuses them all at once)


def test_a_task_that_declares_what_no_model_can_be_built_for_is_refused_when_loaded(monkeypatch, tmp_path):
    """Battery 16 case 89: a fork's classifier of one class (n_classes 1) trained with a loss of 0 and accuracy 1.
    What the loader returns is held to train.py's limits for the fields it sets, in one line naming the task."""
    import data
    monkeypatch.setattr(data, "TASKS", {})
    cases = [(data.Task("t", "cls", 10, 8, 1), "its Task declares n_classes 1, and a classifier needs 2 classes"),
             (data.Task("t", "match", 10, 8, 0), "its Task declares n_classes 0, and a classifier needs 2"),
             (data.Task("t", "lm", 10, 8, 3), "its Task declares n_classes 3 for a language model: give 0"),
             (data.Task("t", "regression", 10, 8, 0), "its Task's kind is 'regression'"),
             (data.Task("t", "lm", 1, 8, 0), "its Task declares vocab_size 1: give an integer >= 2"),
             (data.Task("t", "cls", 10, 0, 2), "its Task declares block_size 0: give an integer >= 1"),
             (data.Task("t", "cls", 10, 8.0, 2), "its Task declares block_size 8.0: give an integer >= 1"),
             (data.Task("t", "cls", 10, 8, True), "its Task declares n_classes True"),
             (None, "its loader returned NoneType, not a data.Task")]
    for returned, why in cases:
        data.TASKS["onecls"] = fork_loader("tasks.onecls", lambda: returned)
        try:
            data.load_task("onecls", cache_dir=str(tmp_path))
        except data.DataError as e:
            assert str(e).startswith(f"task 'onecls' (tasks.onecls): {why}") and "\n" not in str(e), str(e)
        else:
            raise AssertionError(f"accepted: {returned}")
    for fine in (data.Task("t", "cls", 10, 8, 2), data.Task("t", "lm", 2, 1, 0), data.Task("t", "cls", 10, 8, 10)):
        data.TASKS["onecls"] = fork_loader("tasks.onecls", lambda: fine)
        assert data.load_task("onecls", cache_dir=str(tmp_path)) is fine


def forward_loss(monkeypatch, change):
    """simpletron.Model's forward as a fork's copy may have it: its loss replaced by change(logits, targets, loss)."""
    import simpletron
    forward = simpletron.Model.forward

    def forked(self, idx, targets=None):
        logits, loss = forward(self, idx, targets)
        return logits, change(logits, targets, loss)
    monkeypatch.setattr(simpletron.Model, "forward", forked)


LOSS_MISTAKES = {   # battery: a fork's forward with targets given, and the loss it returns instead of one number
    "None": lambda logits, y, loss: None,                                     # `loss = None` left in
    "per token": lambda logits, y, loss: torch.nn.functional.cross_entropy(   # reduction='none'
        logits.float(), y, reduction="none"),
    "a float": lambda logits, y, loss: loss.item(),
    "no gradient": lambda logits, y, loss: loss.detach(),
    "integer": lambda logits, y, loss: (logits.argmax(-1) != y).sum(),
}


@pytest.mark.parametrize("mistake", LOSS_MISTAKES)
def test_a_forks_forward_whose_loss_is_not_one_number_is_one_line_before_the_first_step(mistake, tmp_path,
                                                                                        monkeypatch, capsys):
    """Battery: a fork's forward returning loss None with targets given was a TypeError traceback at train_step's
    `loss / args.grad_accum`; one with reduction='none' a RuntimeError (grad for scalar outputs only). Either is one
    line naming the model and what its forward must return, before a step is counted or a checkpoint written."""
    import train
    from test_train import TINY, run, write_listops
    lo = write_listops(tmp_path / "lo", 8, seed=1)
    forward_loss(monkeypatch, LOSS_MISTAKES[mistake])
    with pytest.raises(train.UsageError) as e:
        run("--data_dir", lo, *TINY, "--max_iters", "2", "--eval_iters", "1", "--out_dir", tmp_path / "o")
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("model simpletron's forward returned (logits, loss) with loss "), msg
    assert "with targets given, the loss must be a tensor holding one floating-point number with its gradient" in msg
    assert "docs/architecture.md" in msg
    assert "step 1" not in capsys.readouterr().out and not (tmp_path / "o" / "ckpt.pt").exists()


def test_a_forks_loss_of_one_number_in_a_tensor_of_shape_1_trains(tmp_path, monkeypatch):
    """A loss of shape (1,) holds one number: backward and .item() take it, and so does the check."""
    from test_train import TINY, losses, run, write_listops
    lo = write_listops(tmp_path / "lo", 8, seed=1)
    forward_loss(monkeypatch, lambda logits, y, loss: None if loss is None else loss.view(1))
    run("--data_dir", lo, *TINY, "--max_iters", "2", "--eval_iters", "1", "--out_dir", tmp_path / "o")
    assert sorted(losses(tmp_path / "o")) == [1, 2]


@pytest.mark.parametrize("mistake", ["None", "per token", "a float"])
def test_a_forks_forward_whose_loss_is_not_one_number_is_one_line_in_an_evaluation_alone(mistake, tmp_path,
                                                                                       monkeypatch, capsys):
    """--eval_only of a fork's model whose forward returns no loss (or not one number): one line naming the model's
    file, not a traceback at evaluate's loss.item()."""
    import train
    from test_train import TINY, run, write_listops
    lo = write_listops(tmp_path / "lo", 8, seed=1)
    run("--data_dir", lo, *TINY, "--max_iters", "1", "--eval_iters", "1", "--out_dir", tmp_path / "o")
    forward_loss(monkeypatch, LOSS_MISTAKES[mistake])
    with pytest.raises(train.UsageError) as e:
        run("--init_from", tmp_path / "o" / "ckpt.pt", "--eval_only", "--data_dir", lo, "--out_dir", tmp_path / "e")
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("model simpletron's forward returned (logits, loss) with loss "), msg
    assert not (tmp_path / "e" / "metrics.json").exists()


BAD_LOADER = '''"""A fork's task whose loader fails on a file it reads with an ordinary exception, not a DataError."""
from data import task


@task("badread")
def badread(cache_dir="data", data_dir=None, block_size=8, **_):
    n = int(open(data_dir).read())
    return n
'''


def test_a_forks_loader_that_fails_with_an_ordinary_exception_is_one_line_naming_its_file_and_line(
        monkeypatch, tmp_path, capsys):
    """A fork's loader raising ValueError on a bad file (int() of "abc") was a 22-line traceback from train.py and
    from python -m tasks.X: it is one DataError line naming the task, the loader's file, the line there, the error."""
    import data
    fork_module(monkeypatch, tmp_path, "badread", BAD_LOADER)
    (tmp_path / "n.txt").write_text("abc\n")
    said = ("task 'badread' (badread.py line 7) fails: ValueError: invalid literal for int() with base 10: "
            "'abc\\n'")
    with pytest.raises(data.DataError) as e:
        data.load_task("badread", cache_dir="cache", data_dir="n.txt")
    assert str(e.value) == said
    with pytest.raises(SystemExit) as e:                    # python -m tasks.X's entry
        data.prepare_main("badread", argv=["--data_dir", "n.txt", "--cache_dir", "cache"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err == f"error: {said}\n", err
    for kept in (data.DataError("bad file"), FileNotFoundError(2, "No such file", "n.txt"), MemoryError(),
                 RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"), KeyboardInterrupt()):
        def raises(cache_dir="data", kept=kept, **_):
            raise kept
        data.TASKS["badread"] = raises
        with pytest.raises(type(kept)) as e:                # as they were: run_main and train.py say them
            data.load_task("badread", cache_dir="cache")
        assert e.value is kept

    def elsewhere(cache_dir="data", **_):                  # as if badread.py's, its error raised outside that file
        return {}["key"]
    elsewhere.__module__ = "badread"
    data.TASKS["badread"] = elsewhere
    with pytest.raises(data.DataError, match=r"^task 'badread' \(badread\.py\) fails: KeyError: 'key'$"):
        data.load_task("badread", cache_dir="cache")


BAD_SPLIT = '''"""A fork's task whose split loaders fail with an ordinary exception when task.open() loads them."""
import numpy as np

from data import LMSplit, Task, task


@task("badsplit")
def badsplit(cache_dir="data", data_dir=None, block_size=8, **_):
    def load():
        return LMSplit(np.array([int(t) for t in open(data_dir).read().split()]), block_size)
    return Task("badsplit", "lm", 16, block_size, loaders={"train": load, "val": load})
'''


def test_a_forks_split_loader_that_fails_with_an_ordinary_exception_is_one_line_before_any_step(
        monkeypatch, tmp_path):
    """The loader itself was wrapped, not the splits' loaders it returns: one raising ValueError inside task.open()
    (train.py before its first step; analyze.py and sample.py reading a split) was a traceback. Now one DataError
    line naming the split, the task, the loader's file and line, as the loader's own failure is."""
    import data
    import train
    fork_module(monkeypatch, tmp_path, "badsplit", BAD_SPLIT)
    (tmp_path / "ids.txt").write_text("1 2 3 x 5\n")
    said = ("the train split of task 'badsplit' (badsplit.py line 10) fails: ValueError: invalid literal for int() "
            "with base 10: 'x'")
    task = data.load_task("badsplit", cache_dir="cache", data_dir="ids.txt")      # the loader itself: fine
    with pytest.raises(data.DataError) as e:
        task.open()
    assert str(e.value) == said
    with pytest.raises(data.DataError) as e:                # an evaluation reads the val split alone
        data.load_task("badsplit", cache_dir="cache", data_dir="ids.txt").open(training=False)
    assert str(e.value) == said.replace("train split", "val split")
    with pytest.raises(data.DataError) as e:                # train.py: before the model, before any step
        train.main(["--model", "simpletron", "--task", "badsplit", "--data_dir", "ids.txt", "--cache_dir", "cache",
                    "--max_iters", "1", "--device", "cpu", "--out_dir", "out"])
    assert str(e.value) == said and not (tmp_path / "out" / "ckpt.pt").exists()
    (tmp_path / "ids.txt").write_text(" ".join(["3"] * 40))   # the same loaders on good ids: the splits load
    assert data.load_task("badsplit", cache_dir="cache", data_dir="ids.txt").open() == ["val"]
    for kept in (data.DataError("bad file"), FileNotFoundError(2, "No such file", "ids.txt"), MemoryError(),
                 RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")):
        def raises(kept=kept):
            raise kept
        t = data.Task("kept", "lm", 16, 8, loaders={"train": raises})
        with pytest.raises((type(kept), data.DataError)) as e:     # a bad file: said by reading(), naming it
            t.open()
        assert e.value is kept or isinstance(kept, OSError) and "ids.txt" in str(e.value)


def source_line(module, text):
    """The number of the first line of module's file that holds text."""
    with open(module.__file__, encoding="utf-8") as f:
        return next(i for i, line in enumerate(f, 1) if text in line)


def test_a_forks_forward_that_raises_is_one_line_naming_its_line_in_training_and_in_an_evaluation_alone(
        tmp_path, monkeypatch, capsys):
    """Battery: a fork's forward raising KeyError was a traceback at train_step's train_model(x, y), and at evaluate's
    model(x, y) under --eval_only (and under torchrun at ddp.unused_parameters' model(x, y)). Each is one Refusal line
    naming the model, its file and line, the error."""
    import socket
    import types

    import simpletron
    import train
    from test_train import TINY, run, write_listops
    lo = write_listops(tmp_path / "lo", 8, seed=1)
    run("--data_dir", lo, *TINY, "--max_iters", "1", "--eval_iters", "1", "--out_dir", tmp_path / "o")

    def raises(*a, **kw):
        raise KeyError("labels")
    monkeypatch.setattr(simpletron, "F", types.SimpleNamespace(**{**vars(simpletron.F), "cross_entropy": raises}))
    said = (f"model 'simpletron': forward (simpletron.py line "
            f"{source_line(simpletron, 'else F.cross_entropy(logits.float(), targets)')}) fails: KeyError: 'labels'")
    for argv, out in ((["--data_dir", lo, *TINY, "--max_iters", "2"], "t"),
                      (["--init_from", tmp_path / "o" / "ckpt.pt", "--eval_only", "--data_dir", lo], "e")):
        capsys.readouterr()
        with pytest.raises(train.UsageError) as e:
            run(*argv, "--out_dir", tmp_path / out)
        assert str(e.value) == said
        assert "step 1" not in capsys.readouterr().out
        assert not any((tmp_path / out / name).exists() for name in ("ckpt.pt", "metrics.json"))
    with socket.socket() as s:                              # torchrun's one process (gloo): DDP's first forward
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for k, v in dict(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)).items():
        monkeypatch.setenv(k, v)
    try:
        with pytest.raises(train.UsageError) as e:
            run("--data_dir", lo, *TINY, "--max_iters", "2", "--out_dir", tmp_path / "d")
        assert str(e.value) == said
    finally:
        torch.distributed.destroy_process_group()


def forward_logits(monkeypatch, change):
    """simpletron.Model's forward as a fork's copy may have it: its logits replaced by change(logits)."""
    import simpletron
    forward = simpletron.Model.forward

    def forked(self, idx, targets=None):
        logits, loss = forward(self, idx, targets)
        return change(logits), loss
    monkeypatch.setattr(simpletron.Model, "forward", forked)


@pytest.mark.parametrize("task,change,shown", [
    ("listops", lambda logits: None, "None"),
    ("textfile", lambda logits: logits[:, -1], "a tensor of torch.float32 of shape (4, 257)"),   # (B, V): last token's
    ("textfile", lambda logits: logits.argmax(-1)[..., None], "a tensor of torch.int64 of shape (4, 8, 1)"),
])
def test_a_forks_logits_that_are_not_scores_for_every_target_are_one_line_in_training_and_in_an_evaluation_alone(
        task, change, shown, tmp_path, monkeypatch, capsys):
    """Battery H03, H15: a fork's forward returning logits None (its loss fine) was a traceback, and logits of shape
    (B, V) for a language model's targets (B, L) trained on, its accuracy miscounted, or failed in evaluate. Either
    is one line saying what was returned and what is expected, before the first step."""
    import train
    from test_train import TINY, run, write_listops
    if task == "listops":
        data_flags = ["--data_dir", write_listops(tmp_path / "lo", 8, seed=1)]
        targets, expected = "(4,)", "(4, V)"
    else:
        (tmp_path / "txt").mkdir()
        (tmp_path / "txt" / "a.txt").write_text("to be or not to be, that is the question\n" * 20, encoding="utf-8")
        data_flags = ["--task", "textfile", "--data_dir", tmp_path / "txt", "--tokenizer", "byte", "--block_size", "8",
                      "--cache_dir", tmp_path / "c"]
        targets, expected = "(4, 8)", "(4, 8, V)"
    run(*data_flags, *TINY, "--max_iters", "1", "--eval_iters", "1", "--out_dir", tmp_path / "o")
    forward_logits(monkeypatch, change)
    said = (f"model simpletron's forward returned (logits, loss) with logits {shown}: for targets of shape {targets} "
            f"the logits must be a floating-point tensor of shape {expected}")
    evaluation = ["--init_from", tmp_path / "o" / "ckpt.pt", "--eval_only", "--batch_size", "4"]
    for argv, out in (([*TINY, "--max_iters", "2"], "t"), (evaluation, "e")):
        capsys.readouterr()
        with pytest.raises(train.UsageError) as e:
            run(*data_flags, *argv, "--out_dir", tmp_path / out)
        assert "\n" not in str(e.value) and str(e.value).startswith(said), str(e.value)
        assert "step 1" not in capsys.readouterr().out
        assert not any((tmp_path / out / name).exists() for name in ("ckpt.pt", "metrics.json"))


@pytest.mark.parametrize("error", [KeyError("n_embd"), NotImplementedError("a fork's stub")])
def test_a_forks_model_whose_constructor_raises_is_one_line_for_train_py_and_for_a_checkpoint(
        error, tmp_path, monkeypatch):
    """A fork's Model(config) raising KeyError or NotImplementedError (built on meta by count_weights, then for the
    run; or by config.model_of_checkpoint, analyze.py's path): one line naming the model's file and line, no
    traceback, before any data is read."""
    import config
    import data
    import simpletron
    import train
    from test_train import TINY, run, write_listops
    lo = write_listops(tmp_path / "lo", 8, seed=1)
    run("--data_dir", lo, *TINY, "--max_iters", "1", "--eval_iters", "1", "--out_dir", tmp_path / "o")
    ckpt = config.load_checkpoint(tmp_path / "o" / "ckpt.pt")

    def raises(*a, **kw):
        raise error
    monkeypatch.setattr(simpletron.nn, "Embedding", raises)
    said = (f"model 'simpletron': Model(config) (simpletron.py line {source_line(simpletron, 'self.wte = ')}) fails: "
            f"{type(error).__name__}: {error}")
    with pytest.raises(config.UsageError) as e:
        config.model_of_checkpoint(ckpt, tmp_path / "o" / "ckpt.pt")
    assert str(e.value) == said
    if isinstance(error, KeyError):                       # (NotImplementedError: also torch's on meta, so built again)
        monkeypatch.setattr(data, "load_task", lambda *a, **k: pytest.fail("data was read"))
    with pytest.raises(train.UsageError) as e:
        run("--data_dir", lo, *TINY, "--max_iters", "1", "--out_dir", tmp_path / "t")
    assert str(e.value) == said and not os.path.exists(tmp_path / "t" / "ckpt.pt")


FORK = MODEL.replace("eps: float = 1e-5", "norm_eps: float = 1e-5").replace("eps=config.eps", "eps=config.norm_eps")


def fork_model(monkeypatch, tmp_path, source=FORK, help=None):
    """mymodel.py of `source` in tmp_path, the working folder, registered as docs/architecture.md says (config.MODELS,
    config.FIELD_HELP); gone again after the test."""
    import config
    module = fork_module(monkeypatch, tmp_path, "mymodel", source, tasks=False)
    monkeypatch.setitem(config.MODELS, "mymodel", ("mymodel", {}))
    monkeypatch.setitem(config.FIELD_HELP, "mymodel", help or {"norm_eps": "the LayerNorm's epsilon"})
    return module


def fork_text(tmp_path):
    """train.py's flags of a tiny run of mymodel on a text file, as bytes."""
    (tmp_path / "txt").mkdir(exist_ok=True)
    (tmp_path / "txt" / "a.txt").write_text("to be or not to be, that is the question\n" * 20, encoding="utf-8")
    return ["--model", "mymodel", "--task", "textfile", "--data_dir", tmp_path / "txt", "--tokenizer", "byte",
            "--block_size", "8", "--cache_dir", tmp_path / "c", "--n_embd", "16", "--batch_size", "4", "--eval_iters",
            "1", "--device", "cpu"]


VALID_FORKS = {   # battery f07, f08: a valid model whose state_dict holds more than finite weights
    "a causal mask of -inf": ("        self.out = ", '        self.register_buffer("mask", torch.full('
                              '(config.block_size,) * 2, float("-inf")).triu(1))\n        self.out = '),
    "an extra state": ("    def forward(self", "    def get_extra_state(self):\n        return {\"version\": 2, "
                       "\"name\": \"mine\"}\n\n    def set_extra_state(self, state):\n        self.version = "
                       "state[\"version\"]\n\n    def forward(self"),
}


@pytest.mark.parametrize("change", VALID_FORKS)
def test_a_forks_valid_state_beyond_finite_weights_trains_resumes_and_samples(change, tmp_path, monkeypatch):
    """Battery f07: a persistent mask of -inf was refused as "a weight is not finite" on --resume and by sample.py;
    f08: get_extra_state's dict in the state_dict was an AttributeError traceback (.is_floating_point() of a dict).
    Parameters must be finite and a buffer may hold ±inf but no nan; only tensors are checked."""
    import io

    import config
    import sample
    from test_train import run
    old, new = VALID_FORKS[change]
    fork_model(monkeypatch, tmp_path, FORK.replace(old, new))
    run(*fork_text(tmp_path), "--max_iters", "2", "--out_dir", "o")
    run(*fork_text(tmp_path), "--max_iters", "3", "--out_dir", "o", "--resume")
    ckpt = config.load_checkpoint("o/ckpt.pt")
    assert ckpt["iter"] == 3 and ("mask" in ckpt["model"] or ckpt["model"]["_extra_state"]["version"] == 2)
    y = sample.main(["--ckpt", "o/ckpt.pt", "--num_samples", "1", "--max_new_tokens", "3", "--device", "cpu"],
                    out=io.StringIO())
    assert y.shape == (1, 4)
    model = config.model_of_checkpoint(ckpt, "o/ckpt.pt")
    for name, value in (("out.weight", math.inf), *((("mask", math.nan),) if "mask" in new else ())):
        state = {**ckpt["model"], name: ckpt["model"][name].clone().fill_(value)}
        with pytest.raises(config.UsageError, match=r"^x\.pt: a weight is not finite \(nan or inf\); use another"):
            config.load_weights(model, state, "x.pt")


def test_a_forks_config_that_is_no_dataclass_or_has_a_default_not_of_its_type_is_one_line(tmp_path, monkeypatch):
    """Battery f09: a plain class Config was a TypeError traceback (dataclasses.fields); f10: `window: int = 0.5`
    trained, and its own checkpoint was refused later. Either is one line at model_module, before any step; types
    written as strings (`from __future__ import annotations`) are read alike, true is no int, 1 is a float."""
    import config
    from test_train import run
    fields = "    n_classes: int = 0          # classes\n"
    cases = [(FORK.replace("@dataclass\n", ""), "model 'mymodel': mymodel.py's Config must be a @dataclass"),
             (FORK.replace(fields, fields + "    window: int = 0.5\n"),
              "model 'mymodel': its Config field window is an int defaulting to 0.5; give it a default of its type"),
             (FORK.replace(fields, fields + "    window: int = True\n"),
              "model 'mymodel': its Config field window is an int defaulting to True"),
             (FORK.replace(fields, fields + "    window: bool = 1\n"),
              "model 'mymodel': its Config field window is a bool defaulting to 1"),
             (FORK.replace(fields, fields + "    window: str = None\n"),
              "model 'mymodel': its Config field window is a str defaulting to None")]
    cases += [("from __future__ import annotations\n" + source, said) for source, said in cases[1:2]]
    for source, said in cases:
        fork_model(monkeypatch, tmp_path, source, help={"norm_eps": "eps", "window": "tokens"})
        with pytest.raises(config.UsageError) as e:
            run(*fork_text(tmp_path), "--max_iters", "1", "--out_dir", "o")
        assert str(e.value).startswith(said) and "\n" not in str(e.value), str(e.value)
        assert not os.path.exists("o/ckpt.pt")
    for future in ("", "from __future__ import annotations\n"):    # valid: trained
        fork_model(monkeypatch, tmp_path, future + FORK.replace(fields, fields + "    scale: float = 1\n"),
                   help={"norm_eps": "eps", "scale": "a number"})
        run(*fork_text(tmp_path), "--max_iters", "1", "--out_dir", f"ok{len(future)}")
        assert config.load_checkpoint(f"ok{len(future)}/ckpt.pt")["config"]["scale"] == 1


def test_a_forks_help_with_a_percent_sign_is_shown(tmp_path, monkeypatch, capsys):
    """Battery f11: FIELD_HELP text (or a str default) with % was argparse's formatting traceback under --help."""
    import config
    fields = "    n_classes: int = 0          # classes\n"
    fork_model(monkeypatch, tmp_path, FORK.replace(fields, fields + '    fmt: str = "%d tokens"\n'),
               help={"norm_eps": "eps", "fmt": "50% of the %(prog)s width"})
    with pytest.raises(SystemExit) as e:
        config.parse_args(["--model", "mymodel", "--help"])
    out = capsys.readouterr().out
    assert e.value.code == 0 and "50% of the %(prog)s width [%d tokens]" in " ".join(out.split()), out


@pytest.mark.parametrize("change, said", [
    (("self.config = config", "self.cfg = config"), "model 'mymodel': mymodel.py's Model keeps no .config, the Config "
                                                    "it was given"),
    (("config.n_embd)\n", "config.n_embed)\n"), "model 'mymodel': Model(config) (mymodel.py line {line}) fails: "
                                                 "AttributeError: 'Config' object has no attribute 'n_embed'"),
])
def test_a_forks_model_that_keeps_no_config_or_reads_a_field_it_lacks_is_one_line(change, said, tmp_path,
                                                                                 monkeypatch):
    """Battery f12: a Model keeping its Config as self.cfg trained to train.py's model_line (getattr(model.config,
    k)): a traceback; train.py saves model.config beside the weights. f22: a Model reading config.n_embed (a typo):
    an AttributeError, on meta too. Each is one line naming mymodel.py, before any data is read."""
    import config
    import data
    from test_train import run
    fork_model(monkeypatch, tmp_path, FORK.replace(*change))
    line = next(i for i, text in enumerate(FORK.replace(*change).splitlines(), 1) if change[1].strip() in text)
    monkeypatch.setattr(data, "load_task", lambda *a, **k: pytest.fail("data was read"))
    with pytest.raises(config.UsageError) as e:
        run(*fork_text(tmp_path), "--max_iters", "1", "--out_dir", "o")
    msg = str(e.value)
    assert msg.startswith(said.format(line=line)) and "\n" not in msg and "Traceback" not in msg, msg


def test_a_forks_forward_whose_backward_pass_fails_is_one_line_before_any_step(tmp_path, monkeypatch, capsys):
    """Battery 21 f12: a forward changing in place a tensor autograd keeps (sigmoid's output) fails only in the
    backward pass, inside torch: that was a traceback; it is one line naming the model, its file and the error."""
    import config
    from test_train import run
    old = "        logits = self.out("
    fork_model(monkeypatch, tmp_path, FORK.replace(old, "        total = torch.sigmoid(total)\n"
                                                         "        total.mul_(2.0)\n" + old))
    with pytest.raises(config.UsageError) as e:
        run(*fork_text(tmp_path), "--max_iters", "2", "--out_dir", "o")
    assert str(e.value).startswith("model 'mymodel': its backward pass (mymodel.py) fails: RuntimeError: one of the "
                                   "variables needed for gradient computation has been modified by an inplace "), e.value
    assert "step 1" not in capsys.readouterr().out and not (tmp_path / "o" / "ckpt.pt").exists()
