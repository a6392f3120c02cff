"""A fork's task whose splits are not what train.py reads: a loader that returns no split, and splits whose batches
fail or do not fit the task (ids as floats, ids past the vocabulary, labels past the classes, shapes). Each is one
DataError line when the task is opened (train.py before its model and its first step; python -m tasks.X), never
a traceback at the first step."""

import importlib.util
import re
import signal
import sys

import pytest

import data
import train

FORK = '''"""A fork's tasks: --data_dir names how their splits are bent."""
import numpy as np
import torch

from data import ClassificationSplit, LMSplit, Task, task


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
'''


@pytest.fixture
def fork(monkeypatch, tmp_path):
    monkeypatch.setattr(data, "TASKS", {})
    monkeypatch.setattr(signal, "signal", lambda *a: None)  # (run_main's handlers: not in pytest's own process)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "forkt.py").write_text(FORK)
    spec = importlib.util.spec_from_file_location("forkt", str(tmp_path / "forkt.py"))
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "forkt", module)
    spec.loader.exec_module(module)
    for how in ("fine", "none", "int", "raises", "floats", "big", "short", "numpy", "negative", "long", "batches",
                "labels", "per_token"):
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
