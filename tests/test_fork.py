"""A fork, as docs/architecture.md tells it: in a copy of the project, a throwaway model and a throwaway task added by
the steps that page's "Add a model" and "Add a task" name, and nothing else. The model's Config first has a field
named like a train.py flag (eps), which must be refused in one line; renamed, both train a few steps, and the tests
that read the registries pass. When a new model or task needs a step the page does not name, this test fails."""

import os
import re
import shutil
import subprocess
import sys

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
