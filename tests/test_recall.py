"""
The recall tasks (tasks/recall.py): each generator held to its definition, written out again here as a checker of
plain loops and tried first on hand-worked examples; the query gaps against the power law; the answer-position
accuracy against a hand computation; the plain-file reader; the state each model keeps while generating against its
formula; and the held-out generator of experiments/ against the same checker.
"""

import math
import os
import sys

import numpy as np
import pytest
import torch

import data
import tasks  # noqa: F401  (registers the tasks)
import train
from tasks import recall

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ----------------------------------------------------------------------------------------------
# The definitions, as checkers: each returns the first way the example breaks its definition, or None

def mqar_problem(x, y, pairs, vocab):
    x, y = list(map(int, x)), list(map(int, y))
    half = vocab // 2
    keys, values = x[0:2 * pairs:2], x[1:2 * pairs:2]
    if not all(1 <= k < half for k in keys) or len(set(keys)) != pairs:
        return "keys"
    if not all(half <= v < vocab for v in values) or len(set(values)) != pairs:
        return "values"
    if not all(1 <= t < vocab for t in x):
        return "ids"
    asked = [t for t in range(len(x)) if y[t] != -1]
    if len(asked) != pairs or any(t < 2 * pairs or (t - 2 * pairs) % 2 for t in asked):
        return "answer positions"
    if sorted(x[t] for t in asked) != sorted(keys):          # every key asked once
        return "queries"
    for t in asked:
        if y[t] != values[keys.index(x[t])]:                  # the answer is the asked key's value
            return "answer"
    return None


def copy_problem(x, y, tokens, noise=1, marker=2):
    x, y = list(map(int, x)), list(map(int, y))
    R = len(x) - tokens
    data_tokens = [t for t in x[:R] if t != noise]
    if len(data_tokens) != tokens or any(t < 3 for t in data_tokens) or x[R] != marker:
        return "region"
    if x[R + 1:] != data_tokens[:-1]:
        return "teacher forcing"
    if y[:R] != [-1] * R or y[R:] != data_tokens:
        return "answers"
    return None


def induction_problem(x, y, trigger=1):
    x, y = list(map(int, x)), list(map(int, y))
    at = [t for t, v in enumerate(x) if v == trigger]
    if len(at) != 2 or at[1] != len(x) - 1 or at[0] > len(x) - 3:
        return "triggers"
    if y[:-1] != [-1] * (len(x) - 1) or y[-1] != x[at[0] + 1]:
        return "answer"
    return None


def dash(s):
    return [-1 if t == "-" else int(t) for t in s.split()]


def test_the_checkers_on_hand_worked_examples():
    # mqar, vocab 16 (keys 1-7, values 8-15), 2 pairs (3, 12), (6, 9): key 6 asked at 4, key 3 at 10 (the docstring's)
    x = [3, 12, 6, 9, 6, 14, 5, 2, 11, 7, 3, 13, 1, 8, 15, 4]
    y = dash("- - - - 9 - - - - - 12 - - - - -")
    assert mqar_problem(x, y, 2, 16) is None
    assert mqar_problem(x, dash("- - - - 12 - - - - - 9 - - - - -"), 2, 16) == "answer"      # the values swapped
    assert mqar_problem(x, dash("- - - - - 9 - - - - 12 - - - - -"), 2, 16) == "answer positions"
    assert mqar_problem([9, 12, *x[2:]], y, 2, 16) == "keys"                                  # a value as a key
    assert mqar_problem([3, 12, 6, 12, *x[4:]], y, 2, 16) == "values"                         # a value twice
    # copy: 3 data tokens 7, 4, 7 in a region of 7, then the marker and 7, 4
    x, y = [1, 7, 4, 1, 1, 7, 1, 2, 7, 4], dash("- - - - - - - 7 4 7")
    assert copy_problem(x, y, 3) is None
    assert copy_problem(x, dash("- - - - - - - 7 7 4"), 3) == "answers"
    assert copy_problem([1, 7, 4, 1, 1, 7, 1, 2, 4, 7], y, 3) == "teacher forcing"
    # induction: the trigger 1 at 2 and 7, 9 after the first
    x, y = [5, 12, 1, 9, 3, 3, 14, 1], dash("- - - - - - - 9")
    assert induction_problem(x, y) is None
    assert induction_problem(x, dash("- - - - - - - 3")) == "answer"
    assert induction_problem([1, 12, 1, 9, 3, 3, 14, 1], y) == "triggers"


@pytest.mark.parametrize("length, pairs, vocab", [(16, 2, 16), (64, 4, 128), (64, 16, 40), (30, 3, 8)])
def test_mqar_examples_keep_the_definition(length, pairs, vocab):
    x, y = recall.mqar(300, length, pairs, vocab, seed=5, chunk=128)     # chunks of 128: three, the last short
    assert x.shape == y.shape == (300, length)
    for xi, yi in zip(x, y):
        assert mqar_problem(xi, yi, pairs, vocab) is None
    fill = x[:, 2 * pairs:][y[:, 2 * pairs:] == -1]
    assert fill.min() == 1 and fill.max() == vocab - 1      # filler: any id but padding


def test_copy_and_induction_examples_keep_the_definition():
    x, y = recall.selective_copy(300, 24, 5, 8, seed=3)
    assert all(copy_problem(xi, yi, 5) is None for xi, yi in zip(x, y))
    assert set(np.unique(x[:, :19])) == set(range(1, 8)) - {2}           # noise and data 3..7, never the marker
    x, y = recall.induction(300, 12, 6, seed=3)
    assert all(induction_problem(xi, yi) is None for xi, yi in zip(x, y))
    first = (x[:, :-1] == 1).argmax(1)
    assert set(first) == set(range(10))                                   # the first trigger at 0 .. length-3


def test_each_generator_at_its_smallest_setting_and_one_below():
    """The bounds of each definition: mqar 4P tokens and a vocabulary of 2P + 2, copy 2T + 1 tokens and 4 ids,
    induction 3 tokens and 3 ids, where the one example is worked by hand: [1, 2, 1] -> 2."""
    x, y = recall.induction(5, 3, 3, seed=0)
    assert x.tolist() == [[1, 2, 1]] * 5 and y.tolist() == [[-1, -1, 2]] * 5
    x, y = recall.mqar(20, 8, 2, 6, seed=0)
    assert all(mqar_problem(xi, yi, 2, 6) is None for xi, yi in zip(x, y))
    x, y = recall.selective_copy(20, 7, 3, 4, seed=0)
    assert all(copy_problem(xi, yi, 3) is None for xi, yi in zip(x, y))
    for make in (lambda: recall.induction(5, 2, 3), lambda: recall.induction(5, 3, 2),
                 lambda: recall.mqar(5, 7, 2, 6), lambda: recall.mqar(5, 8, 2, 5),
                 lambda: recall.selective_copy(5, 6, 3, 4), lambda: recall.selective_copy(5, 7, 3, 3)):
        with pytest.raises(ValueError):
            make()


def test_the_same_seed_gives_the_same_data():
    for make in (lambda s: recall.mqar(50, 32, 3, 20, seed=s), lambda s: recall.selective_copy(50, 20, 4, 10, s),
                 lambda s: recall.induction(50, 20, 10, s)):
        a, b, c = make(7), make(7), make(8)
        assert all(np.array_equal(u, v) for u, v in zip(a, b))
        assert not np.array_equal(a[0], c[0])


def slot_distributions(space, a=0.01):
    """The exact distribution of the first and the second slot drawn without replacement, p_g = (g+1)^(a-1) / Z."""
    p = np.array([(g + 1) ** (a - 1) for g in range(space)])
    p /= p.sum()
    second = np.array([sum(p[h] * p[g] / (1 - p[h]) for h in range(space) if h != g) for g in range(space)])
    return p, second


def test_query_slots_follow_the_power_law():
    length, pairs, n = 40, 4, 40_000
    x, y = recall.mqar(n, length, pairs, 64, seed=11)
    space = (length - 2 * pairs) // 2
    keys = x[:, 0:2 * pairs:2]
    rows, cols = np.nonzero(y != -1)
    slot = np.full((n, pairs), -1)
    asked = x[rows, cols]
    which = (keys[rows] == asked[:, None]).argmax(1)          # the pair whose key is asked there
    slot[rows, which] = (cols - 2 * pairs) // 2
    p1, p2 = slot_distributions(space)
    for k, p in ((0, p1), (1, p2)):                           # pair 1's slot: p; pair 2's: the second draw
        counts = np.bincount(slot[:, k], minlength=space)
        chi2 = ((counts - n * p) ** 2 / (n * p)).sum()
        dof = space - 1
        assert chi2 < dof + 5 * math.sqrt(2 * dof), (k, chi2)  # about 6 standard deviations of chi2 above its mean
    assert abs(p1[0] / p1[1] - 2 ** 0.99) < 1e-12               # slot 0 about twice as likely as slot 1


# ----------------------------------------------------------------------------------------------
# The accuracy at answer positions

def test_answer_counts_by_hand():
    y = torch.tensor([[-1, 5, -1, 7], [3, -1, -1, -1], [-1, 2, 2, -1]])
    guess = torch.tensor([[5, 5, 0, 1], [3, 3, 3, 3], [2, 2, 0, 9]])   # right: (5), (3), (2, not the second 2)
    logits = torch.nn.functional.one_hot(guess, 10).float()
    # answers 2 + 1 + 2 = 5, right 1 + 1 + 1 = 3; every answer right: example 1 only
    assert train.answer_counts(logits, y) == (3, 5, 1, 3)


class Guess(torch.nn.Module):
    """A model that answers each position with the token fixed in `guess` (B, L); its loss is the mean over answers."""

    def __init__(self, guess):
        super().__init__()
        self.guess = guess

    def forward(self, x, y):
        logits = 5 * torch.nn.functional.one_hot(self.guess[x[:, 0]], 10).float()
        return logits, torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten(), ignore_index=-1)


def test_evaluate_reports_both_accuracies_and_the_loss_over_answers():
    x = torch.tensor([[0, 1], [1, 1], [2, 1]])                # row i looked up by its first token
    y = torch.tensor([[-1, 4], [4, 6], [-1, 3]])
    guess = torch.tensor([[0, 4], [4, 0], [0, 0]])            # row 0 right, row 1 half right, row 2 wrong
    split = data.AnswerSplit(x.numpy(), y.numpy())
    m = train.evaluate(Guess(guess), split, 2, "cpu", torch.autocast("cpu", enabled=False))
    p_right = math.exp(5) / (math.exp(5) + 9)                 # the softmax of 5 beside nine zeros
    loss = (-2 * math.log(p_right) - 2 * math.log((1 - p_right) / 9)) / 4
    assert m["acc"] == 2 / 4 and m["acc_example"] == 1 / 3 and m["n"] == 3
    assert m["loss"] == pytest.approx(loss, rel=1e-6)
    assert len(list(split.batches(2))) == 2 and split.subset(2).x.tolist() == x[:2].tolist()


# ----------------------------------------------------------------------------------------------
# The plain format, the task and its errors

def test_plain_files_round_trip_and_become_a_task(tmp_path):
    x, y = recall.mqar(20, 16, 2, 16, seed=1)
    recall.write_examples(str(tmp_path / "test.txt"), x, y)
    first = (tmp_path / "test.txt").read_text().splitlines()[0]
    assert first == " ".join(map(str, x[0])) + "\t" + " ".join("-" if t < 0 else str(t) for t in y[0])
    rx, ry = recall.read_examples(str(tmp_path / "test.txt"), 16)
    assert np.array_equal(rx, x) and np.array_equal(ry, y)
    task = data.load_task("mqar", cache_dir=str(tmp_path / "c"), data_dir=str(tmp_path), recall_vocab=16)
    assert task.open(training=False) == ["test"] and task.vocab_size == 16 and task.block_size == 16
    same = data.load_task("mqar", cache_dir=str(tmp_path / "c"), data_dir=str(tmp_path), recall_vocab=16,
                          recall_len=16)                     # --recall_len, given or a checkpoint's: the files'
    assert same.block_size == 16
    with pytest.raises(data.DataError) as e:
        data.load_task("mqar", cache_dir=str(tmp_path / "c"), data_dir=str(tmp_path), recall_vocab=16, recall_len=32)
    assert str(e.value) == (f"mqar: the examples of --data_dir {tmp_path} are 16 tokens long, not --recall_len 32 "
                            "(given, or the checkpoint's): give --recall_len 16, or other files")


def test_the_prepare_command_reads_the_splits_plain_files_hold(tmp_path, capsys):
    """python -m tasks.recall --data_dir: the files there checked, the test split alone too (for --eval_only)."""
    recall.write_examples(str(tmp_path / "test.txt"), *recall.mqar(6, 16, 2, 16, seed=1))
    for where in (tmp_path, tmp_path / "test.txt"):
        data.prepare_main("tasks.recall", argv=["--task", "mqar", "--data_dir", str(where), "--recall_vocab", "16",
                                                "--cache_dir", str(tmp_path / "c")])
        assert capsys.readouterr().out.startswith("mqar: test 6 examples")
    with pytest.raises(SystemExit) as e:                      # --txt writes generated examples: moot with files
        data.prepare_main("tasks.recall", argv=["--task", "mqar", "--data_dir", str(tmp_path), "--recall_vocab", "16",
                                                "--cache_dir", str(tmp_path / "c"), "--txt"])
    out = capsys.readouterr()
    assert e.value.code == 2 and out.out == "" and out.err == (
        "error: mqar: --txt writes the generated examples as plain files; --data_dir's are plain files already\n")
    assert os.listdir(tmp_path) == ["test.txt"]                # (nothing written: no cache either)


def test_files_below_the_generators_bounds_are_read(tmp_path, capsys):
    """--data_dir's files are checked for themselves: the generator's bounds at the default --recall_pairs (4 pairs
    need --recall_len >= 16 and --recall_vocab >= 10) do not apply to them, so experiments/heldout_recall.py's own
    files of 2 pairs in a vocabulary of 8 (or 8 tokens) are read, by train.py's loader and the prepare command.
    (They were refused: 4 pairs need --recall_vocab >= 10, and --recall_pairs is moot with files.)"""
    for length, folder in ((16, tmp_path / "v8"), (8, tmp_path / "l8")):
        folder.mkdir()
        recall.write_examples(str(folder / "test.txt"), *recall.mqar(5, length, 2, 8, seed=1))
        task = data.load_task("mqar", cache_dir=str(tmp_path / "c"), data_dir=str(folder), recall_vocab=8,
                              recall_len=length)
        task.open(training=False)
        assert (task.vocab_size, task.block_size, len(task.split("test"))) == (8, length, 5)
    capsys.readouterr()
    data.prepare_main("tasks.recall", argv=["--task", "mqar", "--data_dir", str(tmp_path / "l8"), "--recall_vocab",
                                            "8", "--cache_dir", str(tmp_path / "c")])
    assert capsys.readouterr().out.startswith("mqar: test 5 examples")
    with pytest.raises(data.DataError, match="id 7 is outside 1 .. 6"):    # the files' ids still checked
        data.load_task("mqar", cache_dir=str(tmp_path / "c"), data_dir=str(tmp_path / "v8"), recall_vocab=7)
    with pytest.raises(data.DataError, match="--recall_vocab 1: "):        # no id fits: refused as a setting
        data.load_task("mqar", cache_dir=str(tmp_path / "c"), data_dir=str(tmp_path / "v8"), recall_vocab=1)


def test_files_of_different_lengths_are_refused_with_each_length(tmp_path):
    recall.write_examples(str(tmp_path / "train.txt"), *recall.mqar(20, 16, 2, 16, seed=1))    # 20 rows of 16
    recall.write_examples(str(tmp_path / "val.txt"), *recall.mqar(3, 32, 2, 16, seed=2))       # 3 rows of 32
    with pytest.raises(data.DataError) as e:
        data.load_task("mqar", cache_dir=str(tmp_path / "c"), data_dir=str(tmp_path), recall_vocab=16)
    assert str(e.value) == f"mqar: the files of {tmp_path} hold examples of different lengths (train 16, val 32)"


@pytest.mark.parametrize("text, parts", [
    ("1 2 3\t- 4\n", ["line 1", "3 input ids but 2 targets"]),
    ("1 2 3 - 4\n", ["line 1", "1 tab-separated fields, not 2"]),
    ("1 2 x\t- - 4\n", ["line 1", "'x' is not an id"]),
    ("1 2 3\t- - -1\n", ["line 1", "'-1' is not an id"]),             # not "-": an answer that is no id
    ("1 2 1_0\t- - 4\n", ["line 1", "'1_0' is not an id"]),           # int() would read 10
    ("1 2 +3\t- - 4\n", ["line 1", "'+3' is not an id"]),
    ("1 2 3\t- - 4\n1 2\t- 4\n", ["line 2", "2 tokens, where the first example has 3"]),
    ("1 2 16\t- - 4\n", ["line 1", "id 16 is outside 1 .. 15", "--recall_vocab 16"]),
    ("1 0 3\t- - 4\n", ["id 0 is outside"]),
    ("1 2 3\t- - -\n", ["line 1", "no answer"]),
    ("# only a comment\n\n", ["holds no examples"]),
    ("1 2 3\t- - 4\n" * 2 + "\xff", ["line 3"]),
])
def test_plain_file_errors_are_one_line(tmp_path, text, parts):
    path = tmp_path / "bad.txt"
    path.write_bytes(text.encode("latin1"))
    with pytest.raises(data.DataError) as e:
        recall.read_examples(str(path), 16)
    assert "\n" not in str(e.value)
    for part in parts:
        assert part in str(e.value), str(e.value)


def test_task_flags_are_checked_in_one_line(tmp_path):
    for kw, part in ((dict(recall_len=7, recall_pairs=2), "--recall_len >= 8"),
                     (dict(recall_pairs=4, recall_vocab=9), "--recall_vocab >= 10"),
                     (dict(recall_sizes="10,10"), "TRAIN,VAL,TEST"), (dict(recall_pairs=0), ">= 1")):
        with pytest.raises(data.DataError, match=part):
            data.load_task("mqar", cache_dir=str(tmp_path), **kw)
    with pytest.raises(data.DataError, match="holds no train.txt"):
        data.load_task("copy", cache_dir=str(tmp_path), data_dir=str(tmp_path))
    task = data.load_task("induction", cache_dir=str(tmp_path), recall_len=10, recall_sizes="30,5,6")
    task.open()
    assert [len(task.split(s)) for s in ("train", "val", "test")] == [30, 5, 6]
    x, y = task.split("test").sample(6, np.random.default_rng(0))
    assert x.dtype == torch.int64 and all(induction_problem(a, b) is None for a, b in zip(x, y))
    assert not np.array_equal(task.split("val").x[:5], task.split("test").x[:5])   # splits drawn apart


# ----------------------------------------------------------------------------------------------
# The held-out generator of experiments/

def test_the_heldout_generator_keeps_the_same_definitions(tmp_path):
    sys.path.insert(0, os.path.join(ROOT, "experiments"))
    import heldout_recall
    for task, flags, check in (("mqar", ["--recall_len", "40", "--recall_pairs", "4", "--recall_vocab", "30"],
                                lambda x, y: mqar_problem(x, y, 4, 30)),
                               ("copy", ["--recall_len", "20", "--recall_pairs", "3"], lambda x, y: copy_problem(x, y, 3)),
                               ("induction", ["--recall_len", "12"], induction_problem)):
        heldout_recall.main([task, *flags, "--n", "200", "--out", str(tmp_path / task)])
        x, y = recall.read_examples(str(tmp_path / task / "test.txt"), 30 if task == "mqar" else 16)
        assert all(check(a, b) is None for a, b in zip(x, y))
    x, y = recall.read_examples(str(tmp_path / "mqar" / "test.txt"), 30)
    first_slot = (np.argmax(y[:, 8:] != -1, 1)) // 2            # the earliest query: slot 0 most often
    assert np.bincount(first_slot).argmax() == 0


# ----------------------------------------------------------------------------------------------
# The state each model keeps while generating, against its formula (docs/recall.md)

@pytest.mark.parametrize("model, extra, formula", [
    ("softmax", dict(norm="pre"), lambda n, H, D, L: 2 * n * L * D),                 # the KV cache
    ("diffeqformer", dict(time_dim=4), lambda n, H, D, L: 2 * n * L * D),            # a KV cache per Euler step
    ("simpletron", {}, lambda n, H, D, L: n * H * (D // H) ** 2),                    # S per head
    ("transject", {}, lambda n, H, D, L: 1 + D + n * D),                             # the count, Σ's sum, the means
])
def test_the_state_kept_while_generating_is_its_formula(model, extra, formula):
    import config
    import experiments
    for n, H, D, L in ((2, 1, 16, 12), (3, 2, 8, 20)):
        c = {**config.MODELS[model][1], **extra, "vocab_size": 20, "block_size": 24, "n_layer": n, "n_head": H,
             "n_embd": D, "head": "lm"}
        assert experiments.state_floats(model, c, L) == formula(n, H, D, L), (model, n, H, D, L)


# ----------------------------------------------------------------------------------------------
# The tables: --rows, and the recall report from finished runs

def test_rows_picks_a_subset_by_folder_name_or_pattern(capsys):
    import experiments
    table = experiments.TABLES["recall-grid"]
    rows = experiments.chosen_rows("recall-grid", "gpt-d64-mqar-l64-p4, *-d128-mqar-l256-p32")
    assert [experiments.slug(r.name) for r in rows] == [
        "gpt-d64-mqar-l64-p4", "gpt-d128-mqar-l256-p32", "simpletron-d128-mqar-l256-p32",
        "transject-d128-mqar-l256-p32", "diffeqformer-d128-mqar-l256-p32"]
    assert all("--batch_size 64 " in r.flags for r in table.rows)       # 64 examples a step at every length
    with pytest.raises(experiments.UsageError, match="no row of recall-grid is called so"):
        experiments.chosen_rows("recall-grid", "gpt-d999")
    assert [experiments.slug(r.name) for r in experiments.TABLES["recall"].rows] == [
        f"{m}-d{w}-mqar-l{L}-p{P}" for L, P, widths in ((64, 4, (32, 64, 128)), (128, 8, (32, 64))) for w in widths
        for m in ("gpt", "simpletron", "transject", "diffeqformer")]
    check = experiments.TABLES["recall-check"]
    assert [r.name for r in check.rows] == list(__import__("config").MODELS)      # a new model gets its row
    assert all("--recall_len 64 --recall_pairs 4 --n_embd 64" in r.flags for r in check.rows)
    assert "--model softmax --norm pre --n_head 1 --lr 5e-4" in check.rows[1].flags


def test_the_recall_report_reads_every_run_and_draws_the_figure(tmp_path, monkeypatch):
    import dataclasses
    import json
    import experiments
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(experiments, "RECALL_IMG", str(tmp_path / "fig.png"))
    table = experiments.TABLES["recall"]
    rows = experiments.chosen_rows("recall", "gpt-d32-mqar-l64-p4,simpletron-d64-mqar-l64-p4")
    for i, row in enumerate(rows):
        for s in (0, 1, 2):
            width = 32 if i == 0 else 64
            c = {"vocab_size": 128, "block_size": 64, "n_layer": 2, "n_head": 1, "n_embd": width, "head": "lm",
                 **({"attention": "softmax", "variant": "vanilla", "norm": "pre"} if i == 0 else {})}
            m = {"model": ["softmax", "simpletron"][i], "config": c, "args": {"task": "mqar", "recall_pairs": 4},
                 "test_acc": 0.5 + 0.1 * s + 0.3 * i, "test_acc_example": 0.1 * s, "seconds": 360, "machine": "M"}
            for d, value in ((experiments.run_dir("recall", row, s), m),
                             (experiments.run_dir("recall", row, s, row.evals[0][0]), {**m, "test_acc": 0.25})):
                os.makedirs(d)
                with open(os.path.join(d, "metrics.json"), "w") as f:
                    json.dump(value, f)
            with open(os.path.join(experiments.run_dir("recall", row, s), "log.jsonl"), "w") as f:
                for step in range(1, 101):                   # 25% until step 10 * (s + 1), then 100% (row 0 only)
                    acc = 1.0 if i == 0 and step > 10 * (s + 1) else 0.25
                    f.write(json.dumps({"step": step, "loss": 1.0, "acc": acc}) + "\n")
    assert "The figure" not in experiments.recall_report("recall", dataclasses.replace(table, rows=rows), [0, 1, 2])
    assert not os.path.exists(tmp_path / "fig.png")          # --rows: the docs and the figure as they are
    monkeypatch.setitem(experiments.TABLES, "recall", dataclasses.replace(table, rows=rows))
    text = experiments.recall_report("recall", experiments.TABLES["recall"], [0, 1, 2])
    lines = text.splitlines()
    # seed s: 25% for n = 10(s + 1) steps, then 100%. The mean of the first t <= 50 steps, (0.25 n + t - n) / t,
    # reaches 50% at t = 1.5 n (15, 30, 45); 99% needs a whole window of 100%: step n + 50 (60, 70, 80)
    assert ("| mqar | 64 | 4 | 32 | GPT | 8,192 | 60.00 ± 10.00 | 10.00 ± 10.00 | 25.00 ± 0.00 | 15 / 30 / 45 | "
            "60 / 70 / 80 |") in lines
    assert "| mqar | 64 | 4 | 64 | SimpleTRON | 8,192 | 90.00 ± 10.00 | 10.00 ± 10.00 | 25.00 ± 0.00 | – / – / – | – / – / – |" in lines
    assert "Machine: M. The runs took 0.6 h together" in text and os.path.getsize(tmp_path / "fig.png") > 10_000


def test_evaluations_wait_for_their_run_without_holding_a_slot(tmp_path, monkeypatch):
    import experiments
    launched, running = [], []

    class Run:                                               # a run that is still going at its first poll
        def __init__(self, argv, **kw):
            self.out = argv[argv.index("--out_dir") + 1]
            self.polls, self.returncode = 0, None
            launched.append((os.path.basename(self.out), [os.path.basename(r.out) for r in running]))
            running.append(self)

        def poll(self):
            self.polls += 1
            if self.polls < 2:
                return None
            running.remove(self)
            open(os.path.join(self.out, "metrics.json"), "w").write("{}")
            self.returncode = 0
            return 0
    monkeypatch.setattr(experiments.subprocess, "Popen", Run)
    monkeypatch.setattr(experiments.time, "sleep", lambda s: None)
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    cmds = [(a, f"--out_dir {a}"), (a + "-e", f"--init_from {a}/ckpt.pt --out_dir {a}-e"),
            (b, f"--out_dir {b}"), (b + "-e", f"--init_from {b}/ckpt.pt --out_dir {b}-e")]
    experiments.run_all(cmds, 2)
    # b starts beside a (a's evaluation does not block the second slot); each evaluation after its run is done
    assert launched == [("a", []), ("b", ["a"]), ("a-e", []), ("b-e", ["a-e"])]


def test_report_only_reads_an_evaluation_that_has_a_test_split_only(tmp_path, monkeypatch):
    import dataclasses
    import json
    import experiments
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(experiments, "ROOT", str(tmp_path))     # (its runs and out/exp: ROOT's)
    monkeypatch.setattr(experiments, "RECALL_IMG", str(tmp_path / "fig.png"))
    row = experiments.TABLES["recall"].rows[0]                  # the GPT, 32 wide
    monkeypatch.setitem(experiments.TABLES, "recall", dataclasses.replace(
        experiments.TABLES["recall"], rows=[row], doc=str(tmp_path / "recall.md")))
    c = {"vocab_size": 128, "block_size": 64, "n_layer": 2, "n_head": 1, "n_embd": 32, "head": "lm",
         "attention": "softmax", "variant": "vanilla", "norm": "pre"}
    m = {"model": "softmax", "config": c, "args": {"task": "mqar", "recall_pairs": 4}, "test_acc": 0.5,
         "test_acc_example": 0.25, "test_loss": 1.0, "seconds": 60, "machine": "M"}
    run, held = experiments.run_dir("recall", row, 0), experiments.run_dir("recall", row, 0, row.evals[0][0])
    for d, value in ((run, {**m, "val_loss": 1.0, "n_params": 10}), (held, m)):   # an evaluation: test only
        os.makedirs(d)
        with open(os.path.join(d, "metrics.json"), "w") as f:
            json.dump(value, f)
    with open(os.path.join(run, "log.jsonl"), "w") as f:
        f.write(json.dumps({"step": 1, "loss": 1.0, "acc": 0.25}) + "\n")
    experiments.main(["recall", "--report_only", "--seeds", "0"])
    assert "| mqar | 64 | 4 | 32 | GPT | 8,192 | 50.00 ± 0.00 |" in (tmp_path / "recall.md").read_text()
    (tmp_path / "recall.md").write_text("as it was\n")
    experiments.main(["recall", "--report_only", "--seeds", "0", "--rows", experiments.slug(row.name)])
    assert (tmp_path / "recall.md").read_text() == "as it was\n"         # --rows: printed, the docs as they are
    with open(os.path.join(held, "metrics.json"), "w") as f:
        json.dump({k: v for k, v in m.items() if k != "test_loss"}, f)
    with pytest.raises(experiments.UsageError, match="has no 'test_loss'"):
        experiments.main(["recall", "--report_only", "--seeds", "0"])
