"""A fork's task whose splits are not what train.py reads: a loader that returns no split, and splits whose batches
fail or do not fit the task (ids as floats, ids past the vocabulary, labels past the classes, shapes). Each is one
DataError line when the task is opened (train.py before its model and its first step; python -m tasks.X), never
a traceback at the first step."""

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

import data
import train
from test_fork import fork_module

FORK = '''"""A fork's tasks: --data_dir names how their splits are bent."""
import numpy as np
import torch

from data import AnswerSplit, ClassificationSplit, LMSplit, Task, task


class Stream(LMSplit):
    def __init__(self, how, block_size):
        super().__init__(np.arange(1, 100) % 15 + 1, block_size)
        self.how = how

    def sample(self, batch_size, rng):
        x, y = super().sample(batch_size, rng)
        if self.how == "raises":
            raise ValueError("no batch today")
        bent = {"floats": (x.float(), y.float()), "big": (x * 0 + 31, y), "short": (x, y[:, :-1]),
                "numpy": (x.numpy(), y), "negative": (x, y - 5), "long": (torch.ones(batch_size, 99).long(),) * 2}
        return bent.get(self.how, (x, y))

    def batches(self, batch_size):
        if self.how == "batches":
            raise KeyError("eval")
        yield from super().batches(batch_size)


class Examples(ClassificationSplit):
    def __init__(self, how):
        super().__init__(np.ones((5, 4), np.int64), np.zeros(5, np.int64))
        self.how = how

    def sample(self, batch_size, rng):
        x, y = super().sample(batch_size, rng)
        return {"labels": (x, y + 3), "per_token": (x, x)}.get(self.how, (x, y))


def load(how, block_size):
    return {"none": None, "int": 42}.get(how) if how in ("none", "int") else Stream(how, block_size)


@task("forkt")
def forkt(cache_dir="data", data_dir="fine", block_size=8, **_):
    loaders = {s: lambda: load(data_dir, block_size) for s in ("train", "val")}
    return Task("forkt", "lm", 16, block_size, loaders=loaders)


@task("forkc")
def forkc(cache_dir="data", data_dir="fine", block_size=8, **_):
    return Task("forkc", "cls", 16, block_size, 3, loaders={s: lambda: Examples(data_dir) for s in ("train", "val")})


@task("forkm")
def forkm(cache_dir="data", data_dir="fine", block_size=8, note="%d items", **_):
    """Splits that do not match what the Task declares; its sizes numpy integers (ids.max() + 1), as a fork's may be."""
    stream, x = np.arange(1, 200) % 15 + 1, np.ones((4, 8), np.int64)
    y = np.where(np.arange(8) == 7, 2, -1) + 0 * x                      # one answer an example: its last target
    np.where(np.arange(199) == 150, -1, stream).astype(np.int32).tofile("negative.bin")
    train, val = {
        "lm_as_cls": (lambda: LMSplit(stream, 8),) * 2,
        "cls_as_lm": (lambda: ClassificationSplit(x, np.zeros(4)),) * 2,
        "long": (lambda: ClassificationSplit(np.ones((5, 20), np.int64), np.zeros(5)),) * 2,
        "wide": (lambda: LMSplit(stream, 16),) * 2,
        "no_val_example": (lambda: AnswerSplit(x, y), lambda: AnswerSplit(x[:0], y[:0])),
        "no_val_answer": (lambda: AnswerSplit(x, y), lambda: AnswerSplit(x, y * 0 - 1)),
        "negative_id": (lambda: LMSplit(np.where(np.arange(199) == 150, -1, stream), 8),) * 2,
        "negative_mapped": (lambda: LMSplit(np.memmap("negative.bin", np.int32, "r"), 8),) * 2,
    }.get(data_dir, (lambda: LMSplit(stream, 8),) * 2)
    kind = "cls" if data_dir in ("lm_as_cls", "long") else "lm"
    return Task("forkm", kind, stream.max() + 1, np.int64(block_size), np.int64(2 * (kind == "cls")),
                loaders={"train": train, "val": val})
'''


MISMATCHES = {   # the held-back battery's f13-f17, f20: a fork's splits that do not fit the Task it declares
    "lm_as_cls": "the train split of task 'forkm' is a data.LMSplit, and the task's kind is 'cls': its splits are "
                 "ClassificationSplits",
    "cls_as_lm": "the train split of task 'forkm' is a data.ClassificationSplit, and the task's kind is 'lm': its "
                 "splits are LMSplits or AnswerSplits",
    "long": "the train split of forkm (train split) holds examples of 20 tokens, and task forkm's block_size is 8: cut "
            "them, split.truncate(block_size)",
    "wide": "the first batch of the train split of task 'forkm' (sample) has x of shape (2, 16): it should be (B, L) "
            "with B = 2 and L from 1 to block_size 8",
    "no_val_example": "the val split of forkm (val split) gives no examples",
    "no_val_answer": "the val split of forkm (val split) has no answer, its targets y all -1: no accuracy to measure",
    "negative_id": "the train split of forkm (train split) holds token id -1, and task forkm's vocab_size is 16 (ids 0 "
                   "to 15, 0 the padding): no id is negative",
    "negative_mapped": "{tmp}/negative.bin (train split) holds token id -1, and task forkm's vocab_size is 16 (ids 0 "
                       "to 15, 0 the padding): no id is negative"}


@pytest.fixture
def fork(monkeypatch, tmp_path):
    fork_module(monkeypatch, tmp_path, "forkt", FORK)
    for how in ("fine", "none", "int", "raises", "floats", "big", "short", "numpy", "negative", "long", "batches",
                "labels", "per_token", *MISMATCHES):
        (tmp_path / how).write_text("")                       # (--data_dir names a path that is there)
    return tmp_path


def line_of(text, tmp_path):
    return next(i for i, line in enumerate((tmp_path / "forkt.py").read_text().splitlines(), 1) if text in line)


def refused(name, how, training=True):
    with pytest.raises(data.DataError) as e:
        data.load_task(name, cache_dir="cache", data_dir=how).open(training)
    assert "\n" not in str(e.value)
    return str(e.value)


def test_a_forks_split_loader_that_returns_no_split_is_one_line_naming_the_split_and_what_it_returned(fork, capsys):
    """A loader returning None: a traceback at train.py's first train.sample, and in python -m tasks.X at len()."""
    for how, what in (("none", "None"), ("int", "42")):
        said = (f"the train split of task 'forkt' (its loader in forkt) returned {what}, not a split: return a "
                "data.LMSplit, ClassificationSplit or AnswerSplit (or an object with sample, batches, tokens_in, "
                "subset, __len__)")
        assert refused("forkt", how) == said
        assert refused("forkt", how, training=False) == said.replace("train split", "val split")
        with pytest.raises(SystemExit) as e:                # python -m tasks.X's entry
            data.prepare_main("forkt", argv=["--task", "forkt", "--data_dir", how, "--cache_dir", "cache"])
        assert e.value.code == 2 and capsys.readouterr().err == f"error: {said}\n"
    with pytest.raises(data.DataError) as e:                # train.py: before the model, before any step
        train.main(["--model", "simpletron", "--task", "forkt", "--data_dir", "none", "--cache_dir", "cache",
                    "--max_iters", "1", "--device", "cpu", "--out_dir", "out"])
    assert str(e.value).startswith("the train split of task 'forkt' (its loader in forkt) returned None, not a split")
    assert not (fork / "out" / "ckpt.pt").exists()


def test_a_forks_split_whose_sample_raises_is_one_line_naming_the_split_file_and_line(fork):
    line = line_of('raise ValueError("no batch today")', fork)
    assert refused("forkt", "raises") == (f"the first batch of the train split of task 'forkt' (sample) (forkt.py "
                                          f"line {line}) fails: ValueError: no batch today")
    line = line_of('raise KeyError("eval")', fork)          # an evaluation's batches() too
    assert refused("forkt", "batches", training=False) == (f"the first batch of the val split of task 'forkt' "
                                                           f"(batches) (forkt.py line {line}) fails: KeyError: 'eval'")


@pytest.mark.parametrize("name, how, said", [
    ("forkt", "floats", "x of torch.float32 and y of torch.float32: both must be torch.int64"),
    ("forkt", "numpy", "is a tuple of ndarray, Tensor, not (x, y), two torch tensors"),
    ("forkt", "big", "token id 31, and task forkt's vocab_size is 16 (ids 0 to 15)"),
    ("forkt", "short", "y of shape (2, 7) for x of shape (2, 8): a language model's targets are x's shape"),
    ("forkt", "negative", "target -4: targets are ids 0 to 15, or -1 (none)"),
    ("forkt", "long", "x of shape (2, 99): it should be (B, L) with B = 2 and L from 1 to block_size 8"),
    ("forkc", "labels", "label 3, and task forkc has 3 classes (labels 0 to 2)"),
    ("forkc", "per_token", "y of shape (2, 4) for x of shape (2, 4): a classifier's labels are (B,)"),
])
def test_a_forks_split_whose_first_batch_does_not_fit_the_task_is_one_line(fork, name, how, said):
    """Float ids, ids past vocab_size, targets of another shape: a traceback (or a silent error) at the first step."""
    got = refused(name, how)
    assert re.match(rf"the first batch of the train split of task '{name}' \(sample\) ", got), got
    assert said in got, (said, got)
    with pytest.raises(data.DataError) as e:                # train.py: before the model, before any step
        train.main(["--model", "simpletron", "--task", name, "--data_dir", how, "--cache_dir", "cache",
                    "--max_iters", "1", "--device", "cpu", "--out_dir", "out"])
    assert str(e.value) == got and not (fork / "out" / "ckpt.pt").exists()


def test_a_forks_fitting_splits_open(fork):
    for name in ("forkt", "forkc"):
        assert data.load_task(name, cache_dir="cache", data_dir="fine").open() == ["val"]


def train_argv(how, *more):
    return ["--model", "simpletron", "--task", "forkm", "--data_dir", how, "--cache_dir", "cache", "--max_iters", "1",
            "--device", "cpu", "--out_dir", "out", *more]


@pytest.mark.parametrize("how", MISMATCHES)
def test_a_forks_splits_that_do_not_fit_its_declared_task_are_one_line_before_any_step(fork, how, capsys):
    """An lm task handing out ClassificationSplits (a classifier LM windows), examples or windows past block_size, a
    val AnswerSplit without an example or an answer (ZeroDivisionError after training), an id -1 (IndexError)."""
    said = MISMATCHES[how].format(tmp=fork)
    assert refused("forkm", how) == said
    with pytest.raises(data.DataError) as e:                # train.py: before the model, before any step
        train.main(train_argv(how))
    assert str(e.value) == said and "step" not in capsys.readouterr().out and not (fork / "out").exists()


def test_a_forks_task_sizes_given_as_numpy_integers_are_ints(fork):
    """vocab_size = ids.max() + 1, an np.int64: metrics.json's json.dumps raised after training."""
    task = data.load_task("forkm", cache_dir="cache", data_dir="fine")
    assert [type(v) for v in (task.vocab_size, task.block_size, task.n_classes)] == [int] * 3
    train.main(train_argv("fine", "--n_layer", "1", "--n_head", "1", "--n_embd", "8", "--batch_size", "2",
                          "--eval_iters", "1"))
    assert json.loads((fork / "out" / "metrics.json").read_text())["task"] == "forkm"


def test_a_forks_loader_default_with_a_percent_sign_shows_in_help(fork, capsys):
    """python -m tasks.X --help formats each flag's help with %: a default "%d items" raised a TypeError."""
    with pytest.raises(SystemExit) as e:
        data.prepare_main("forkt", argv=["--help"])
    assert e.value.code == 0 and "default: %d items" in capsys.readouterr().out


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BROKEN = """import numpy as np
from data import LMSplit, Task, prepare_main, task

STEPS = undefined_name + 1


@task("mytask")
def mytask(cache_dir="data", block_size=4, **_):
    return Task("mytask", "lm", 8, block_size, loaders={s: lambda: LMSplit(np.arange(100) % 7, 4) for s in ("train",)})


if __name__ == "__main__":
    prepare_main("tasks.mytask")
"""


def test_a_forks_task_module_failing_on_import_is_one_line_however_tasks_init_imports_it(tmp_path):
    """tasks/mytask.py with a NameError at module level, imported by a line appended to tasks/__init__.py (below its
    guarded import): a traceback. Every program says one line naming the file and line, appended line or none."""
    repo = tmp_path / "repo"
    shutil.copytree(ROOT, repo, ignore=shutil.ignore_patterns(".*", "out", "data", "__pycache__", "img", "tests"))
    (repo / "tasks" / "mytask.py").write_text(BROKEN)
    said = "error: tasks/mytask.py line 4 fails on import: NameError: name 'undefined_name' is not defined\n"
    for appended in ("", "from tasks import mytask  # noqa: E402, F401\n"):
        with open(repo / "tasks" / "__init__.py", "a") as f:
            f.write(appended)
        for argv in (["train.py", "--help"], ["train.py", "--task", "mytask"], ["-m", "tasks.mytask"]):
            p = subprocess.run([sys.executable, *argv], cwd=repo, capture_output=True, text=True, timeout=120)
            assert (p.returncode, p.stderr, p.stdout) == (2, said, ""), (argv, p.stderr)
    (repo / "tasks" / "mytask.py").write_text(BROKEN.replace("undefined_name", "1"))  # fixed: the appended line moot
    p = subprocess.run([sys.executable, "-m", "tasks.mytask", "--help"], cwd=repo, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0 and "--block_size" in p.stdout, p.stderr
