"""train.py: exact resume, evaluation of a checkpoint on other data, metrics, presets, schedules, bad input."""

import contextlib
import json
import math
import os
import signal
import time
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import config
import data
import ddp
import train
from tasks import listops

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = ["--n_layer", "1", "--n_embd", "16", "--n_head", "2", "--batch_size", "4", "--eval_iters", "2",
        "--log_interval", "1", "--warmup", "2"]


def write_listops(folder, n, seed, splits=("train", "val", "test")):
    folder.mkdir(parents=True, exist_ok=True)
    examples = listops.listops_chunk(((seed, 0), n * len(splits), 5, 60))    # short trees: fast tests
    for i, split in enumerate(splits):
        listops.write_listops_tsv(folder / f"basic_{split}.tsv", examples[i * n:(i + 1) * n])
    return folder


@pytest.fixture(scope="module")
def lra(tmp_path_factory):
    return write_listops(tmp_path_factory.mktemp("lra"), 64, seed=1)


def run(*argv):
    return train.main([str(a) for a in argv])


def losses(out_dir):
    with open(os.path.join(out_dir, "log.jsonl")) as f:
        return {r["step"]: r["loss"] for r in map(json.loads, f) if "loss" in r}


def test_resume_replays_an_uninterrupted_run(lra, tmp_path):
    common = ["--data_dir", lra, *TINY, "--dropout", "0.1", "--eval_interval", "3", "--lr_decay_iters", "8"]
    run(*common, "--max_iters", "8", "--out_dir", tmp_path / "whole")
    run(*common, "--max_iters", "5", "--out_dir", tmp_path / "part")          # stops at step 5 ...
    run("--resume", "--out_dir", tmp_path / "part", "--max_iters", "8")       # ... and continues to 8
    whole, part = losses(tmp_path / "whole"), losses(tmp_path / "part")
    assert sorted(part) == list(range(1, 9))
    assert all(part[s] == whole[s] for s in range(1, 9)), (part, whole)       # bit for bit
    a = torch.load(tmp_path / "whole" / "ckpt.pt", map_location="cpu", weights_only=True)["model"]
    b = torch.load(tmp_path / "part" / "ckpt.pt", map_location="cpu", weights_only=True)["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_log_times_are_the_runs_seconds_across_resume(lra, tmp_path):
    """Every log record carries the run's wall time in seconds, earlier sessions included: it never goes back,
    starts near 0 and stays below the time this test took; the resumed part starts at the checkpoint's time."""
    import time
    t0 = time.time()
    common = ["--data_dir", lra, *TINY, "--eval_interval", "3"]
    out = tmp_path / "run"
    run(*common, "--max_iters", "3", "--out_dir", out)
    saved = torch.load(out / "ckpt.pt", map_location="cpu", weights_only=True)["time"]
    run("--resume", "--out_dir", out, "--max_iters", "6")
    wall = time.time() - t0
    with open(out / "log.jsonl") as f:
        times = [(r["step"], r["time"]) for r in map(json.loads, f) if "loss" in r]
    assert [s for s, _ in times] == [1, 2, 3, 4, 5, 6]
    assert 0 <= times[0][1] < wall and all(b[1] >= a[1] for a, b in zip(times, times[1:])), times
    assert 0 < saved <= times[3][1] < wall and times[-1][1] < wall, (saved, times, wall)
    assert all(t == round(t, 3) for _, t in times)             # rounded to milliseconds


def test_resume_after_a_crash_past_the_checkpoint_logs_each_step_once(lra, tmp_path):
    common = ["--data_dir", lra, *TINY, "--eval_interval", "3"]
    out = tmp_path / "run"
    run(*common, "--max_iters", "3", "--out_dir", out)
    saved = (out / "ckpt.pt").read_bytes()                                     # the checkpoint of step 3
    run("--resume", "--out_dir", out, "--max_iters", "5")                      # the log reaches step 5 ...
    (out / "ckpt.pt").write_bytes(saved)                                       # ... and a crash loses 4, 5
    with open(out / "log.jsonl", "a") as f:
        f.write('{"step": 6, "lo')                                             # in the middle of a line
    run("--resume", "--out_dir", out, "--max_iters", "6")
    with open(out / "log.jsonl") as f:
        steps = [r["step"] for r in map(json.loads, f) if "loss" in r]
    assert steps == [1, 2, 3, 4, 5, 6]


def test_metrics_checkpoint_and_eval_on_other_data(lra, tmp_path):
    out = tmp_path / "run"
    t0 = time.time()
    m = run("--data_dir", lra, *TINY, "--max_iters", "4", "--out_dir", out)
    wall = time.time() - t0
    saved = json.loads((out / "metrics.json").read_text())
    assert 0 < saved["train_seconds"] <= saved["seconds"] <= wall   # this run's seconds, training's among them
    for key in ("test_acc", "test_loss", "val_acc", "val_loss", "n_test", "n_val", "iters", "seconds",
                "tokens_per_s", "config"):
        assert key in saved, key
    assert saved["n_test"] == 64 and saved["iters"] == 4 and saved["config"]["n_layer"] == 1
    device = "cuda" if torch.cuda.is_available() else "cpu"           # --device auto
    assert saved["machine"] == config.machine(device) and saved["machine"].endswith(f"torch {torch.__version__}")
    assert (out / "metrics.json").read_text().endswith("}\n")    # a text file: its last line ends
    assert list(saved)[:2] == ["model", "task"] and list(saved["best"])[0] == "step"    # read from the top
    records = [list(json.loads(line)) for line in open(out / "log.jsonl")]
    assert all(r[0] == "step" for r in records) and [r[-1] for r in records if "val_loss" in r] == ["time"]
    assert saved == json.loads(json.dumps(m))
    assert sorted(os.listdir(out)) == ["best.pt", "ckpt.pt", "log.jsonl", "loss.png", "metrics.json"]   # no lock,
    # no temporary file left
    ckpt = torch.load(out / "ckpt.pt", map_location="cpu", weights_only=True)
    assert ckpt["iter"] == 4 and ckpt["model_name"] == "simpletron"

    # the checkpoint evaluated on a test split it never saw, in a folder with nothing else
    other = write_listops(tmp_path / "other", 37, seed=2, splits=("test",))
    m2 = run("--init_from", out / "ckpt.pt", "--eval_only", "--data_dir", other, "--out_dir", tmp_path / "ev")
    assert m2["n_test"] == 37 and "val_acc" not in m2
    assert 0 < m2["seconds"] < time.time() - t0 and m2["iters"] == 0
    # the same weights on the original test split give the original numbers
    m3 = run("--init_from", out / "ckpt.pt", "--eval_only", "--data_dir", lra, "--out_dir", tmp_path / "ev2")
    assert m3["test_acc"] == m["test_acc"] and m3["test_loss"] == pytest.approx(m["test_loss"], rel=1e-6)
    # without --out_dir: written beside the run, never over it (the run's own metrics.json is untouched)
    run("--init_from", out / "ckpt.pt", "--eval_only", "--data_dir", other)
    assert json.loads((tmp_path / "run-eval" / "metrics.json").read_text())["n_test"] == 37
    assert json.loads((out / "metrics.json").read_text()) == saved
    # without --task and --data_dir: the checkpoint's task, read from where its run read it
    m5 = run("--init_from", out / "ckpt.pt", "--eval_only", "--out_dir", tmp_path / "ev3")
    assert m5["test_acc"] == m["test_acc"] and m5["n_test"] == 64


def test_attention_transfer_through_train(lra, tmp_path):
    run("--data_dir", lra, *TINY, "--max_iters", "3", "--out_dir", tmp_path / "simple")
    run("--model", "softmax", "--transfer_from", tmp_path / "simple" / "ckpt.pt", "--data_dir", lra, *TINY,
        "--max_iters", "3", "--out_dir", tmp_path / "soft")
    src = torch.load(tmp_path / "simple" / "ckpt.pt", map_location="cpu", weights_only=True)
    dst = torch.load(tmp_path / "soft" / "ckpt.pt", map_location="cpu", weights_only=True)
    assert dst["config"]["attention"] == "softmax" and dst["config"]["freeze_qkv"]
    assert torch.equal(src["model"]["blocks.0.attn.qkv.weight"], dst["model"]["blocks.0.attn.qkv.weight"])
    assert not torch.equal(src["model"]["blocks.0.mlp.fc.weight"], dst["model"]["blocks.0.mlp.fc.weight"])


def test_layering_flags_over_preset_over_defaults():
    args, given, names = config.parse_args(["--preset", "paper", "--n_layer", "3", "--warmup", "7"])
    overrides = config.resolve(args, given, names)
    assert overrides["n_layer"] == 3 and overrides["n_embd"] == 512            # flag, then the preset
    assert args.warmup == 7 and args.lr == 0.005 and args.max_iters == 15_000
    assert args.grad_accum == 1 and args.seed == 0                              # defaults


def test_schedules():
    class A:
        lr, warmup, max_iters, min_lr, lr_decay_iters = 0.005, 1000, 15_000, 0.1, None
    a = A()
    a.schedule = "rsqrt"                                    # base_lr * min(1, s/w) / sqrt(max(s, w))
    assert train.learning_rate(a, 500) == pytest.approx(0.005 * 0.5 / math.sqrt(1000))
    assert train.learning_rate(a, 4000) == pytest.approx(0.005 / math.sqrt(4000))
    a.schedule = "cosine"
    assert train.learning_rate(a, 500) == pytest.approx(0.0025)
    assert train.learning_rate(a, 1000) == pytest.approx(0.005)
    assert train.learning_rate(a, 8000) == pytest.approx(0.005 * (0.1 + 0.9 * 0.5))
    assert train.learning_rate(a, 15_000) == pytest.approx(0.0005)


# ----------------------------------------------------------------------------------------------
# The schedule, the optimiser's groups, the gate report and evaluate, against numbers worked by hand

def schedule_args(**kw):
    a = dict(lr=0.005, warmup=1000, max_iters=15_000, min_lr=0.1, lr_decay_iters=None, schedule="cosine",
             gate_lr_scale=30.0)
    return SimpleNamespace(**{**a, **kw})


def test_learning_rate_with_numbers():
    lr = train.learning_rate
    a = schedule_args(schedule="rsqrt")                    # lr min(1, s / w) / sqrt(max(s, w))
    assert lr(a, 1) == pytest.approx(0.005 * 0.001 / math.sqrt(1000), rel=1e-12)
    assert lr(a, 1000) == pytest.approx(0.005 / math.sqrt(1000), rel=1e-12)          # the peak, 1.5811e-4
    assert lr(a, 1000) == pytest.approx(1.5811388300841897e-4, rel=1e-12)
    assert lr(a, 9000) == pytest.approx(0.005 / 3 / math.sqrt(1000), rel=1e-12)      # 1 / sqrt(9000)
    a = schedule_args()                                    # linear warm-up, cosine from lr to min_lr * lr
    assert lr(a, 1) == pytest.approx(5e-6, rel=1e-12)
    assert lr(a, 999) == pytest.approx(0.004995, rel=1e-12)
    assert lr(a, 1000) == pytest.approx(0.005, rel=1e-12)
    assert lr(a, 4500) == pytest.approx(0.00434099025766973, rel=1e-12)              # progress 1/4: cos(pi/4)
    assert lr(a, 11_500) == pytest.approx(0.0011590097423302702, rel=1e-12)          # progress 3/4
    assert lr(a, 15_000) == pytest.approx(0.0005, rel=1e-12)
    assert lr(a, 20_000) == pytest.approx(0.0005, rel=1e-12)                         # past the end: min_lr * lr
    a = schedule_args(lr_decay_iters=5000)                 # decay over 1000..5000, then flat
    assert lr(a, 3000) == pytest.approx(0.00275, rel=1e-12)
    assert lr(a, 5000) == pytest.approx(0.0005, rel=1e-12) and lr(a, 9000) == pytest.approx(0.0005, rel=1e-12)
    a = schedule_args(warmup=15_000)                       # warm-up as long as the run: no division by zero
    assert lr(a, 15_000) == pytest.approx(0.005, rel=1e-12) and lr(a, 15_001) == pytest.approx(0.0005, rel=1e-12)
    a = schedule_args(warmup=0, max_iters=4)               # no warm-up: progress s / max_iters from step 1
    assert lr(a, 1) == pytest.approx(0.005 * (0.1 + 0.45 * (1 + math.cos(math.pi / 4))), rel=1e-12)
    assert lr(a, 2) == pytest.approx(0.00275, rel=1e-12)
    a = schedule_args(min_lr=1.0, warmup=10)               # min_lr 1: a constant lr after the warm-up
    assert [lr(a, s) for s in (10, 11, 5000, 15_000)] == pytest.approx([0.005] * 4, rel=1e-12)


def model_zoo():
    """(name, model, names of the scalar gates) for every model of the project and its variants."""
    import diffeqformer
    import simpletron
    import transject
    small = dict(vocab_size=11, block_size=8, n_layer=2, n_embd=8, head="cls", n_classes=3)
    s = lambda **kw: simpletron.Model(simpletron.Config(**small, n_head=2, **kw))   # noqa: E731
    ode = diffeqformer.Model(diffeqformer.Config(**small, n_head=2, time_dim=3, time_freqs=4))
    return [("simpletron", s(), set()),
            ("softmax-rezero", s(attention="softmax", variant="vanilla", norm="rezero"), {"blocks.0.alpha", "blocks.1.alpha"}),
            ("orthogonal", s(attention="softmax", variant="vanilla", orthogonal=True), set()),
            ("frozen-qkv", s(attention="softmax", variant="vanilla", freeze_qkv=True), set()),
            ("transject", transject.Model(transject.Config(**small)), {"blocks.0.a", "blocks.1.a"}),
            ("diffeqformer", ode, set()),
            ("diffeqformer-lora", ode.discretize(3).with_lora(2, 2.0), set())]


@pytest.mark.parametrize("name,model,gates", model_zoo(), ids=[z[0] for z in model_zoo()])
def test_optimizer_groups(name, model, gates):
    args = SimpleNamespace(lr=0.003, weight_decay=0.07, beta1=0.8, beta2=0.95, eps=1e-7, gate_lr_scale=12.5)
    opt = train.make_optimizer(model, args, "cpu")
    names = {id(p): n for n, p in model.named_parameters()}
    groups = [{names[id(p)] for p in g["params"]} for g in opt.param_groups]
    trainable = {n: p for n, p in model.named_parameters() if p.requires_grad}
    # matrices and embeddings decay; vectors (biases, norms) and scalar gates do not; gates get lr * scale
    assert groups[0] == {n for n, p in trainable.items() if p.dim() >= 2}
    assert groups[1] == {n for n, p in trainable.items() if p.dim() == 1}
    assert groups[2] == {n for n, p in trainable.items() if p.dim() == 0} == gates
    assert sum(len(g) for g in groups) == len(trainable) and len(opt.param_groups) == 3
    assert [g["weight_decay"] for g in opt.param_groups] == [0.07, 0.0, 0.0]
    assert [g["lr_scale"] for g in opt.param_groups] == [1.0, 1.0, 12.5]
    assert all(g["lr"] == 0.003 and g["betas"] == (0.8, 0.95) and g["eps"] == 1e-7 for g in opt.param_groups)
    assert isinstance(opt, torch.optim.AdamW)
    if name == "simpletron":                                # what the groups mean, by name
        assert {"wte.weight", "blocks.0.attn.qkv.weight"} <= groups[0] and "blocks.0.attn.qkv.bias" in groups[1]
    if name in ("frozen-qkv", "diffeqformer-lora"):         # frozen parameters are in no group
        assert len(trainable) < len(list(model.parameters()))


def test_gate_report_budget_is_the_scale_times_the_sum_of_lr():
    class Gates(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Parameter(torch.tensor(0.8, dtype=torch.float64))
            self.b = torch.nn.Parameter(torch.tensor(-1.3, dtype=torch.float64))
            self.c = torch.nn.Parameter(torch.tensor(2.0, dtype=torch.float64))     # not a gate at the start
            self.w = torch.nn.Parameter(torch.ones(3, dtype=torch.float64))         # a vector, never a gate
    args = schedule_args(lr=1e-3, warmup=2, max_iters=3, gate_lr_scale=30.0)
    # lr at steps 1, 2, 3: 0.5e-3 (warm-up), 1e-3, then 0.1e-3 (the end of the cosine); budget 30 * 1.6e-3
    report = train.gate_report(Gates(), {"a": 0.5, "b": -1.0}, args, 3)
    assert set(report) == {"a", "b"}
    assert report["a"] == pytest.approx({"start": 0.5, "value": 0.8, "budget": 0.048, "used": 0.3 / 0.048}, rel=1e-12)
    assert report["b"] == pytest.approx({"start": -1.0, "value": -1.3, "budget": 0.048, "used": 0.3 / 0.048}, rel=1e-12)
    assert train.gate_report(Gates(), {"a": 0.5}, args, 1)["a"]["budget"] == pytest.approx(0.015, rel=1e-12)
    assert train.gate_report(Gates(), {"a": 0.5}, args, 0)["a"] == {"start": 0.5, "value": pytest.approx(0.8),
                                                                    "budget": 0, "used": 0.0}
    # no warm-up: lr at steps 1, 2 = cosine at progress 1/2 (0.55e-3) and 1 (0.1e-3); step 0 is never taken
    args = schedule_args(lr=1e-3, warmup=0, max_iters=2, gate_lr_scale=30.0)
    assert train.gate_report(Gates(), {"a": 0.5}, args, 2)["a"]["budget"] == pytest.approx(30 * 0.65e-3, rel=1e-12)


class Lookup(torch.nn.Module):
    """A stand-in model with logits fixed per input (a table looked up by the token sum); records its mode."""

    def __init__(self, n_out, lm=False):
        super().__init__()
        self.table = torch.randn(97, n_out, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
        self.lm, self.modes = lm, []

    def forward(self, x, y):
        self.modes.append(self.training)
        if self.lm:
            logits = self.table[(x * 7 + torch.arange(x.shape[1])) % 97]                # (B, L, V)
            return logits, torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten())
        logits = self.table[x.sum(-1) % 97]                                             # (B, C)
        return logits, torch.nn.functional.cross_entropy(logits, y)


def test_evaluate_averages_over_examples_not_batches():
    # 5 examples in batches of 2, 2, 1: the loss and the accuracy are means over the examples (tokens for lm)
    g = np.random.default_rng(0)
    tokens = g.integers(1, 9, (5, 6))
    tokens[[0, 2], 4:] = 0                                   # two shorter examples
    labels = g.integers(0, 4, 5)
    split = data.ClassificationSplit(tokens, labels)
    model = Lookup(4).train()
    out = train.evaluate(model, split, 2, "cpu", contextlib.nullcontext())
    x, y = torch.from_numpy(tokens), torch.from_numpy(labels)
    logits = model.table[x.sum(-1) % 97]
    losses = [torch.logsumexp(logits[i], 0) - logits[i, y[i]] for i in range(5)]
    correct = [int(logits[i].argmax() == y[i]) for i in range(5)]
    assert out["loss"] == pytest.approx(sum(losses).item() / 5, rel=1e-12)
    assert out["acc"] == pytest.approx(sum(correct) / 5, rel=1e-12) and out["n"] == 5 and "ppl" not in out
    assert model.modes == [False] * 3 and model.training       # evaluated in eval mode, left in train mode
    # a language model: per token, perplexity exp(loss)
    stream = g.integers(0, 10, 5 * 4 + 1)
    split = data.LMSplit(stream, 4)                          # 5 windows of 4 tokens: batches 2, 2, 1
    model = Lookup(10, lm=True)
    out = train.evaluate(model, split, 2, "cpu", contextlib.nullcontext())
    terms = []
    for w in range(5):
        xs, ys = torch.from_numpy(stream[4 * w:4 * w + 4]), torch.from_numpy(stream[4 * w + 1:4 * w + 5])
        lg = model.table[(xs * 7 + torch.arange(4)) % 97]
        terms += [torch.logsumexp(lg[p], 0) - lg[p, ys[p]] for p in range(4)]
    assert out["loss"] == pytest.approx(sum(terms).item() / 20, rel=1e-12) and out["n"] == 20
    assert out["ppl"] == pytest.approx(math.exp(out["loss"]), rel=1e-12) and "acc" not in out
    # a loss past exp's range (finite weights, scaled up): perplexity inf, not an OverflowError; below it, exp
    ones = data.LMSplit(np.ones(21, dtype=np.int64), 4)
    for c, low, high in ((709.7 - math.log(9), 709.69, 709.71), (709.9 - math.log(9), 709.89, 709.91)):
        flat = Lookup(10, lm=True)
        flat.table = torch.full((97, 10), c, dtype=torch.float64)
        flat.table[:, 1] = 0.0                               # every target is 1: a loss of log(1 + 9 e^c)
        out = train.evaluate(flat, ones, 2, "cpu", contextlib.nullcontext())
        assert low < out["loss"] < high, out
        assert out["ppl"] == (math.inf if out["loss"] > 709.78 else pytest.approx(math.exp(out["loss"]), rel=1e-9))
    # max_batches: that many fixed batches (the same every call: comparable across evaluations)
    a = train.evaluate(model, split, 2, "cpu", contextlib.nullcontext(), max_batches=2)
    assert a == train.evaluate(model, split, 2, "cpu", contextlib.nullcontext(), max_batches=2) and a["n"] == 16
    # ... unless they would hold as many windows as the split has (2 x 3 >= 5): then the split itself, once
    assert (train.evaluate(model, split, 3, "cpu", contextlib.nullcontext(), max_batches=2) ==
            train.evaluate(model, split, 3, "cpu", contextlib.nullcontext()))


def test_evaluate_shows_a_progress_bar_over_every_batch(monkeypatch):
    bars = []
    def fake_tqdm(iterable, **kw):
        bars.append(kw)
        return iterable
    monkeypatch.setattr(train, "tqdm", fake_tqdm)
    split = data.ClassificationSplit(np.ones((5, 3), dtype=np.int64), np.zeros(5, dtype=np.int64))
    train.evaluate(Lookup(2), split, 2, "cpu", contextlib.nullcontext(), progress="test")
    assert [(b["desc"], b["total"]) for b in bars] == [("test", 3)]          # batches of 2, 2, 1
    train.evaluate(Lookup(2), split, 2, "cpu", contextlib.nullcontext())
    assert len(bars) == 1                                                    # no title: no bar


# ----------------------------------------------------------------------------------------------
# The training loop: accumulation, clipping, the lr of each group

# Adam with a large eps updates by about lr g / eps: linear in the gradient, so that its scale shows
LINEAR = ["--n_layer", "1", "--n_embd", "16", "--n_head", "2", "--eval_iters", "1", "--log_interval", "1",
          "--dropout", "0", "--weight_decay", "0", "--eps", "100", "--lr", "10", "--warmup", "0", "--min_lr", "1",
          "--eval_interval", "100"]


def weights(out_dir):
    return torch.load(os.path.join(out_dir, "ckpt.pt"), map_location="cpu", weights_only=True)["model"]


def flat(state):
    return torch.cat([v.flatten().double() for k, v in sorted(state.items())])


def test_grad_accum_is_a_bigger_batch(lra, tmp_path):
    # batch 4 x 2 micro-batches == batch 8: the same examples (the data of a step depends on (seed, step)),
    # the same mean loss, the same gradient, so the same weights after two steps
    cpu = ("--device", "cpu")                                # float32 (bf16 autocast on a GPU rounds each part)
    run("--data_dir", lra, *LINEAR, *cpu, "--grad_clip", "0", "--batch_size", "8", "--max_iters", "2",
        "--out_dir", tmp_path / "b8")
    run("--data_dir", lra, *LINEAR, *cpu, "--grad_clip", "0", "--batch_size", "4", "--grad_accum", "2", "--max_iters", "2",
        "--out_dir", tmp_path / "b4x2")
    a, b = losses(tmp_path / "b8"), losses(tmp_path / "b4x2")
    assert a[1] == pytest.approx(b[1], rel=1e-5) and a[2] == pytest.approx(b[2], rel=1e-5)
    wa, wb = flat(weights(tmp_path / "b8")), flat(weights(tmp_path / "b4x2"))
    torch.testing.assert_close(wa, wb, rtol=1e-4, atol=1e-6)
    assert a[1] != a[2]                                      # each step draws other examples


def test_each_step_and_seed_draws_its_own_examples(lra, tmp_path):
    # lr ~ 1e-12 (a warm-up of 1e9 steps): the weights stay put, so the loss of a step tells its examples apart
    frozen = ["--data_dir", lra, *LINEAR, "--batch_size", "8", "--max_iters", "3", "--warmup", "1000000000"]
    run(*frozen, "--out_dir", tmp_path / "s0")
    run(*frozen, "--seed", "1", "--out_dir", tmp_path / "s1")
    a, b = losses(tmp_path / "s0"), losses(tmp_path / "s1")
    assert len({a[1], a[2], a[3]}) == 3 and a[1] != b[1]


def test_gradient_clipping_scales_the_update_to_the_clip_norm(lra, tmp_path):
    # one step from the same initialisation: with clip c the gradient has norm c, so the update has norm
    # lr c / eps (Adam with eps >> |g|); without clipping it points the same way and is longer
    flags = ["--data_dir", lra, *LINEAR, "--batch_size", "8", "--max_iters", "1"]
    run(*flags, "--grad_clip", "0", "--warmup", "1000000000", "--out_dir", tmp_path / "w0")   # lr 1e-8: no move
    run(*flags, "--grad_clip", "0.001", "--out_dir", tmp_path / "clip")
    run(*flags, "--grad_clip", "0", "--out_dir", tmp_path / "free")
    w0 = flat(weights(tmp_path / "w0"))
    clipped, free = flat(weights(tmp_path / "clip")) - w0, flat(weights(tmp_path / "free")) - w0
    assert clipped.norm().item() == pytest.approx(10 * 0.001 / 100, rel=2e-3)
    assert free.norm().item() > 5 * clipped.norm().item()
    assert torch.nn.functional.cosine_similarity(clipped, free, dim=0) > 0.999


def test_gates_step_by_lr_times_their_scale(lra, tmp_path):
    # Adam's first step moves every parameter by lr (|g| >> eps): a gate by lr * gate_lr_scale. The log's lr is
    # the schedule's, and the report's budget is scale * sum of the lr of the steps taken
    common = ["--model", "softmax", "--norm", "rezero", "--data_dir", lra, *TINY, "--lr", "1e-3", "--warmup", "2",
              "--weight_decay", "0.1", "--grad_clip", "0", "--eval_interval", "100", "--gate_lr_scale", "30",
              "--eps", "1e-12"]
    m = run(*common, "--max_iters", "1", "--out_dir", tmp_path / "one")
    assert set(m["gates"]) == {"blocks.0.alpha"}
    g = m["gates"]["blocks.0.alpha"]
    assert g["start"] == 0.0 and abs(g["value"]) == pytest.approx(0.5e-3 * 30, rel=1e-3)   # lr(1) = lr / 2
    assert g["budget"] == pytest.approx(0.015, rel=1e-9) and g["used"] == pytest.approx(1.0, rel=1e-3)
    m = run(*common, "--max_iters", "3", "--out_dir", tmp_path / "three")
    with open(tmp_path / "three" / "log.jsonl") as f:
        lrs = [r["lr"] for r in map(json.loads, f) if "lr" in r]
    assert lrs == pytest.approx([0.5e-3, 1e-3, 1e-4], rel=1e-12)
    assert m["gates"]["blocks.0.alpha"]["budget"] == pytest.approx(30 * 1.6e-3, rel=1e-9)
    # resumed after step 1: the report still starts from the gate's value before step 1, not at the resume
    run(*common, "--max_iters", "1", "--out_dir", tmp_path / "resumed")
    r = run("--resume", "--out_dir", tmp_path / "resumed", "--max_iters", "3")["gates"]["blocks.0.alpha"]
    assert r == m["gates"]["blocks.0.alpha"] and r["start"] == 0.0
    # a vector (the classifier's output bias, from 0) moves by lr(1) on the first step, not by lr * scale
    assert weights(tmp_path / "one")["classifier.2.bias"].abs().max().item() == pytest.approx(0.5e-3, rel=1e-3)


def test_layering_with_a_preset_of_its_own(monkeypatch):
    # flags > the preset of (model, task) > the preset of (model, *) > train.py's defaults; Config fields a
    # preset does not set are left to the model's Config
    monkeypatch.setitem(config.PRESETS, "test", {
        ("softmax", "*"): dict(n_layer=5, n_embd=24, lr=0.5, warmup=11, batch_size=2),
        ("softmax", "listops"): dict(n_layer=7, batch_size=3),
        ("simpletron", "listops"): dict(n_head=8, lr=9.0)})
    args, given, names = config.parse_args(["--preset", "test", "--model", "softmax", "--n_embd", "32",
                                            "--warmup", "4"])
    overrides = config.resolve(args, given, names)
    assert overrides == {"n_layer": 7, "n_embd": 32}
    assert (args.lr, args.warmup, args.batch_size) == (0.5, 4, 3)
    defaults = config.DEFAULTS
    for name in ("max_iters", "schedule", "min_lr", "grad_accum", "weight_decay", "gate_lr_scale", "seed"):
        assert getattr(args, name) == defaults[name], name
    assert args.model == "softmax" and args.task == "listops"
    args, given, names = config.parse_args(["--preset", "test", "--task", "ptb"])    # simpletron: no preset for ptb
    assert config.resolve(args, given, names) == {} and args.lr == defaults["lr"]


def cli(*argv, cwd):
    return subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), *map(str, argv)], cwd=cwd,
                          capture_output=True, text=True, timeout=120)


def test_bad_input_gives_one_clear_line(lra, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run("--data_dir", lra, *TINY, "--max_iters", "1", "--out_dir", tmp_path / "run")
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "basic_train.tsv").write_text("Source\tTarget\n( [MAX 1 ) 2 ) ]\t2\n( [MAX 1 ) 2 ]\n")
    cases = {
        ("--model", "gpt5"): "unknown model 'gpt5'",
        ("--task", "chess"): "unknown task 'chess'",
        ("--lr", "fast"): "invalid float value: 'fast'",
        ("--learning_rate", "0.1"): "unrecognized arguments: --learning_rate",
        ("--data_dir", bad, "--max_iters", "1"): "basic_train.tsv, line 3: malformed ListOps row",
        ("--data_dir", tmp_path / "nowhere"): "is not a folder",
        ("--variant", "resx"): "variant must be one of",
        ("--init_from", tmp_path / "none.pt", "--eval_only"): "no checkpoint at",
        ("--init_from", tmp_path / "run" / "ckpt.pt", "--out_dir", tmp_path / "run"): "would overwrite",
    }
    for argv, message in cases.items():                     # in this process: the exception and its one line
        with pytest.raises((train.UsageError, data.DataError)) as e:
            run(*argv)
        assert message in str(e.value) and "\n" not in str(e.value), (argv, str(e.value))
    odd = ("--init_from", tmp_path / "no\nsuch\r\nfile.pt")          # a path with line breaks: written \n, \r
    cases[odd] = "no checkpoint at " + str(tmp_path / "no\\nsuch\\r\\nfile.pt")
    for argv in (("--lr", "fast"), ("--data_dir", bad, "--max_iters", "1"), odd):   # the command line prints that line
        p = cli(*argv, cwd=tmp_path)
        lines = p.stderr.strip().splitlines()
        assert p.returncode == 2 and len(lines) == 1, (argv, p.stderr)
        assert lines[0].startswith("error: ") and cases[argv] in lines[0], (argv, p.stderr)


def test_training_accuracy_is_logged_for_classification_only(lra, tmp_path):
    """A classifier's log records carry the step's training accuracy over all its examples (batch 4 x 2
    micro-batches: a multiple of 1/8); a language model's carry none."""
    run("--data_dir", lra, *TINY, "--grad_accum", "2", "--max_iters", "4", "--eval_interval", "4",
        "--out_dir", tmp_path / "cls")
    with open(tmp_path / "cls" / "log.jsonl") as f:
        accs = [r["acc"] for r in map(json.loads, f) if "loss" in r]
    assert len(accs) == 4 and all(0 <= a <= 1 and (a * 8) == round(a * 8) for a in accs), accs
    (tmp_path / "txt").mkdir()
    (tmp_path / "txt" / "a.txt").write_text("to be or not to be, that is the question\n" * 20, encoding="utf-8")
    run("--task", "textfile", "--data_dir", tmp_path / "txt", "--tokenizer", "byte", "--block_size", "8", *TINY,
        "--max_iters", "2", "--eval_interval", "2", "--out_dir", tmp_path / "lm")
    with open(tmp_path / "lm" / "log.jsonl") as f:
        records = [r for r in map(json.loads, f) if "loss" in r]
    assert len(records) == 2 and not any("acc" in r for r in records), records
    m = json.load(open(tmp_path / "lm" / "metrics.json"))     # tokens/s: 2 steps x 4 windows x 8 tokens
    assert m["tokens_per_s"] * m["train_seconds"] == pytest.approx(2 * 4 * 8, rel=1e-9)


def test_time_limit_is_minutes_of_wall_time():
    assert not train.past_time_limit(None, 1e9)              # no limit
    assert not train.past_time_limit(0.5, 30.0) and train.past_time_limit(0.5, 30.001)
    assert not train.past_time_limit(13.5, 809.9) and train.past_time_limit(13.5, 810.1)


def test_a_run_stops_at_its_time_limit_and_says_so(lra, tmp_path, capsys):
    m = run("--data_dir", lra, *TINY, "--max_iters", "50", "--time_limit", "0.0001", "--out_dir", tmp_path / "o")
    assert m["stopped"] == "time_limit (0.0001 min)" and m["iters"] == 0     # 6 ms: gone before step 1
    assert torch.load(tmp_path / "o" / "ckpt.pt", map_location="cpu", weights_only=True)["iter"] == 0
    out = capsys.readouterr().out
    assert "training stops after 0.0001 min of wall time (--time_limit)\n" in out
    assert (f"stopped at step 0 of 50 (--time_limit 0.0001 min); continue with: python train.py --resume --out_dir "
            f"{tmp_path / 'o'}\n") in out
    m = run("--data_dir", lra, *TINY, "--max_iters", "3", "--time_limit", "60", "--out_dir", tmp_path / "p")
    assert m["stopped"] == "max_iters" and m["iters"] == 3 and "stopped at" not in capsys.readouterr().out
    run("--data_dir", lra, *TINY, "--max_iters", "1", "--out_dir", tmp_path / "q")
    assert "training stops" not in capsys.readouterr().out    # no limit given: none said (no preset sets one)


def test_progress_lines_every_log_interval_and_at_the_end(lra, tmp_path, capsys):
    run("--data_dir", lra, *TINY, "--log_interval", "2", "--max_iters", "5", "--eval_interval", "5",
        "--out_dir", tmp_path / "o")
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("step ") and "|" in
             line and "val" not in line.split("|")[0]]
    assert [line.split()[1] for line in lines] == ["2/5", "4/5", "5/5"], lines
    # each line's loss is the mean over the steps since the line before (1-2, 3-4, 5)
    logged = losses(tmp_path / "o")
    shown = [float(line.split("| loss ")[1].split()[0]) for line in lines]
    means = [(logged[1] + logged[2]) / 2, (logged[3] + logged[4]) / 2, logged[5]]
    assert shown == pytest.approx(means, abs=6e-5), (shown, means)
    # the last line's speed is the run's: tokens per second of training, in thousands (k tok/s)
    metrics = json.loads((tmp_path / "o" / "metrics.json").read_text())
    rate = float(lines[-1].split(" | ")[-2].removesuffix("k tok/s"))
    assert rate == pytest.approx(metrics["tokens_per_s"] / 1e3, abs=0.051)


def test_an_out_dir_with_a_checkpoint_decides_the_model_only_with_resume(lra, tmp_path):
    run("--data_dir", lra, *TINY, "--model", "softmax", "--max_iters", "1", "--out_dir", tmp_path / "o")
    args, given, names = config.parse_args(["--model", "transject", "--n_experts", "2",
                                            "--out_dir", str(tmp_path / "o")])
    assert args.model == "transject" and "n_experts" in names        # a new run: --model decides
    args, given, names = config.parse_args(["--resume", "--out_dir", str(tmp_path / "o")])
    assert "n_experts" not in names and "attention" in names         # --resume: the checkpoint's model


def test_metrics_are_printed_with_four_decimals_or_three_digits():
    assert train.fmt({"loss": 0.0, "acc": 0.5, "lr": 1e-5, "n": 3, "ppl": 1234.56789}) == \
        "loss 0.0000 | acc 0.5000 | lr 1e-05 | n 3 | ppl 1234.5679"


def test_resume_says_where_it_resumes(lra, tmp_path, capsys):
    run("--data_dir", lra, *TINY, "--max_iters", "2", "--eval_interval", "2", "--out_dir", tmp_path / "o")
    run("--resume", "--out_dir", tmp_path / "o", "--max_iters", "3")
    assert f"resuming {tmp_path / 'o'} at step 2" in capsys.readouterr().out
    # a checkpoint that does not say how many processes wrote it: one, so its batch is kept as it is
    ckpt = torch.load(tmp_path / "o" / "ckpt.pt", map_location="cpu", weights_only=True)
    del ckpt["world_size"]
    torch.save(ckpt, tmp_path / "o" / "ckpt.pt")
    run("--resume", "--out_dir", tmp_path / "o", "--max_iters", "4")
    assert "processes of --batch_size" not in capsys.readouterr().out
    assert torch.load(tmp_path / "o" / "ckpt.pt", map_location="cpu", weights_only=True)["args"]["batch_size"] == 4


def test_eta_at_the_pace_of_the_last_steps():
    assert train.per_second(300, 1.5) == 200.0 and train.per_second(300, 0.0) == 0.0
    assert train.seconds_left(90, 20.0, 10) == 180.0         # 10 steps in 20 s: 90 more take 180 s
    assert train.seconds_left(0, 5.0, 4) == 0.0
    args = SimpleNamespace(max_iters=1000)
    pace = train.Pace(window=3)
    for seconds in (9.0, 0.6, 0.6, 0.6):                     # prefix steps; the first (9 s: warming up) drops out
        pace.add(seconds, on_prefix=True)
    assert pace.eta(4, args, 400) == "eta 4.0 min for the prefix steps, then longer"     # 396 x 0.6 s
    assert pace.eta(400, args, 400) == "eta after the first full-length steps"
    pace.add(3.0, on_prefix=False)                           # full length: its own pace, 600 x 3 s
    assert pace.eta(400, args, 400) == "eta 30.0 min" and pace.eta(400, args, 400, 120.0) == "eta 2.0 min (--time_limit)"
    assert pace.eta(400, args, 0) == "eta 30.0 min"          # no prefix steps (or a language model)
    assert pace.eta(4, SimpleNamespace(max_iters=10), 400) == "eta 0.1 min"        # a run on prefixes alone


def test_the_model_line_fits_a_screen_line_and_val_says_it_is_a_sample(lra, tmp_path, capsys):
    run("--data_dir", lra, *TINY, "--device", "cpu", "--max_iters", "2", "--eval_interval", "2", "--out_dir", tmp_path / "o")
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "simpletron on listops (cpu): 0.04M params, n_layer 1 n_head 2 n_embd 16 block_size 2000 " \
                     "vocab_size 16" and len(out[0]) <= 105         # about 100 characters: one line of a screen
    assert "step 2 val (8 of 64 examples, --eval_iters 2): loss " in "\n".join(out)


def test_a_sample_as_large_as_val_is_all_of_val_each_example_once(lra, tmp_path, capsys):
    # 16 batches of 4 >= the 64 val examples: not 64 draws with repeats but the split itself, as at the end
    m = run("--data_dir", lra, *TINY, "--device", "cpu", "--eval_iters", "16", "--max_iters", "2", "--eval_interval",
            "2", "--out_dir", tmp_path / "o")
    assert "step 2 val (all 64 examples): loss " in capsys.readouterr().out
    last = [json.loads(line) for line in open(tmp_path / "o" / "log.jsonl") if "val_loss" in line][-1]
    assert last["val_n"] == 64 and last["val_loss"] == m["val_loss"] and last["val_acc"] == m["val_acc"]


def test_ctrl_c_finishes_the_step_saves_it_and_says_how_to_continue(lra, tmp_path, monkeypatch, capsys):
    schedule = train.learning_rate

    def ctrl_c_during_step_3(args, step):
        if step == 3:
            os.kill(os.getpid(), signal.SIGINT)              # Ctrl-C during the third step
        return schedule(args, step)
    monkeypatch.setattr(train, "learning_rate", ctrl_c_during_step_3)
    before = signal.getsignal(signal.SIGINT)                 # Python's, or SIG_IGN in a background job
    with pytest.raises(train.Interrupted) as e:
        run("--data_dir", lra, *TINY, "--max_iters", "6", "--eval_interval", "6", "--out_dir", tmp_path / "o")
    assert torch.load(tmp_path / "o" / "ckpt.pt", map_location="cpu", weights_only=True)["iter"] == 3   # its step
    assert not (tmp_path / "o" / "metrics.json").exists()   # no final evaluation: nothing passes for finished
    assert str(e.value) == f"interrupted at step 3 of 6; continue with: python train.py --resume --out_dir {tmp_path / 'o'}"
    assert signal.getsignal(signal.SIGINT) == before           # Ctrl-C is handled as it was again


class Killed(Exception):
    """What this test's SIGTERM handler raises (Python's default would end pytest)."""


def test_sigterm_finishes_the_step_saves_it_and_says_how_to_continue(lra, tmp_path, monkeypatch):
    """SIGTERM (kill, a job scheduler's limit) stops a run as Ctrl-C does, with exit status 143 (docs/train.md)."""
    schedule = train.learning_rate

    def sigterm_during_step_3(args, step):
        if step == 3:
            os.kill(os.getpid(), signal.SIGTERM)
        return schedule(args, step)
    monkeypatch.setattr(train, "learning_rate", sigterm_during_step_3)

    def killed(signum, frame):
        raise Killed
    before = signal.signal(signal.SIGTERM, killed)
    try:
        with pytest.raises(train.Interrupted) as e:
            run("--data_dir", lra, *TINY, "--max_iters", "6", "--eval_interval", "6", "--out_dir", tmp_path / "o")
        assert signal.getsignal(signal.SIGTERM) is killed         # handled as it was again
    finally:
        signal.signal(signal.SIGTERM, before)
    assert torch.load(tmp_path / "o" / "ckpt.pt", map_location="cpu", weights_only=True)["iter"] == 3
    assert not (tmp_path / "o" / "metrics.json").exists()
    assert str(e.value) == (f"terminated (SIGTERM) at step 3 of 6; continue with: python train.py --resume --out_dir "
                            f"{tmp_path / 'o'}") and e.value.status == 143


def char_run(folder, *flags):
    """A 2-step character language model on a text of 17 distinct characters, in folder/r."""
    (folder / "t.txt").write_text("the cat sat on a mat and dog ran\n" * 30)
    return run("--task", "textfile", "--tokenizer", "char", "--data_dir", folder / "t.txt", "--cache_dir",
               folder / "c", *TINY, "--block_size", "16", "--max_iters", "2", "--eval_interval", "2", "--out_dir",
               folder / "r", *flags)


def test_overwrite_keeps_the_old_run_until_every_check_has_passed(tmp_path):
    """--n_train too small for one window is refused after the data is read: the old run's files are still there."""
    char_run(tmp_path)
    kept = {name: (tmp_path / "r" / name).read_bytes() for name in ("ckpt.pt", "best.pt")}
    with pytest.raises(data.DataError, match="--n_train 10 is too few tokens for one window"):
        char_run(tmp_path, "--n_train", "10", "--overwrite")
    assert {name: (tmp_path / "r" / name).read_bytes() for name in kept} == kept


def test_a_language_models_best_record_of_an_accuracy_is_refused_before_any_step(tmp_path):
    """A language model keeps its best by val_loss: a record {step, val_acc} is damaged (it was a KeyError
    traceback at the first evaluation, after the steps)."""
    char_run(tmp_path)
    ckpt = torch.load(tmp_path / "r" / "ckpt.pt", weights_only=True)
    torch.save({**ckpt, "best": {"step": 2, "val_acc": 0.5}}, tmp_path / "r" / "ckpt.pt")
    log = (tmp_path / "r" / "log.jsonl").read_text()
    with pytest.raises(config.UsageError) as e:
        run("--resume", "--out_dir", tmp_path / "r", "--max_iters", "4")
    assert str(e.value).startswith(f"{tmp_path / 'r'}/ckpt.pt: its record 'best' is damaged") and "val_loss" in str(
        e.value)
    assert (tmp_path / "r" / "log.jsonl").read_text() == log


def test_every_step_and_process_has_its_own_dropout_seed():
    seeds = [ddp.step_seed(seed, it, rank) for seed in range(4) for it in range(3000) for rank in range(4)]
    assert len(set(seeds)) == len(seeds)                     # no two (seed, step, process) share their masks
    assert ddp.step_seed(0, 0, 0) == 0 and ddp.step_seed(2, 5, 1) == 2 * 1_000_003 + 5 + 2 ** 40


def resolved(*argv):
    args, given, names = config.parse_args(list(argv))
    overrides = config.resolve(args, given, names)
    return {**vars(args), **overrides}


@pytest.mark.parametrize("model, task, want", [
    # SimpleTRON Table 3: ListOps 6 blocks, 8 heads, 512, lr 0.005, warm-up 1000, 15k steps; classification 4 blocks,
    # 4 heads, 256, lr 0.05, warm-up 8000, 20k steps; retrieval 128 wide, 15k steps; batch 32, rsqrt schedule
    ("simpletron", "listops", dict(n_layer=6, n_head=8, n_embd=512, lr=0.005, warmup=1000, max_iters=15_000,
                                   batch_size=32, weight_decay=0.1, dropout=0.1, schedule="rsqrt", variant="res")),
    ("softmax", "text", dict(n_layer=4, n_head=4, n_embd=256, lr=0.05, warmup=8000, max_iters=20_000,
                             variant="vanilla", schedule="rsqrt")),
    ("simpletron", "retrieval", dict(n_layer=4, n_head=4, n_embd=128, lr=0.05, warmup=8000, max_iters=15_000)),
    # TransJect B.1: IMDb / AG News L 6, E 4, d 512, length 512, batch 32, Adam 5e-4 (0.9, 0.98, 1e-9); LRA L 2,
    # d 512, 50k steps, lr 1e-4, warm-up 1000; PTB L 6, 35 tokens, lr 0.01
    ("transject", "agnews", dict(n_layer=6, n_experts=4, n_embd=512, block_size=512, batch_size=32, lr=5e-4,
                                 beta2=0.98, eps=1e-9, weight_decay=0.0, pool="mean", max_iters=112_500)),
    ("transject", "listops", dict(n_layer=2, n_embd=512, lr=1e-4, warmup=1000, max_iters=50_000, pool="max")),
    ("transject", "ptb", dict(n_layer=6, n_embd=512, block_size=35, lr=0.01, batch_size=32)),
    # DiffEqFormer Table 3 / C.4-C.5: GPT-small 12 x 768 x 12 heads, d_t 20, S 128, beta2 0.95, weight decay 0.1,
    # 1% warm-up, cosine to 0.1 lr, clip 1.0
    ("diffeqformer", "openwebtext", dict(n_layer=12, n_head=12, n_embd=768, block_size=1024, time_dim=20,
                                         time_freqs=128, beta2=0.95, weight_decay=0.1, min_lr=0.1, grad_clip=1.0,
                                         max_iters=100_000, warmup=1000, schedule="cosine")),
])
def test_the_paper_preset_is_the_papers_numbers(model, task, want):
    got = resolved("--model", model, "--task", task, "--preset", "paper")
    assert {k: got[k] for k in want} == want


def test_torchrun_builds_every_split_the_run_reads_in_full():
    built = []

    class Split:
        def __init__(self, name):
            self.name = name

        def subset(self, n):
            return Split(f"{self.name}[:{n}]")

        def full(self):
            built.append(self.name)

    class Task:
        def __init__(self, *names):
            self.names = names

        def has(self, name):
            return name in self.names

        def split(self, name):
            return Split(name) if name != "val" else object()       # a split that is not sharded: nothing to build

    for task, eval_only, n_train, want in ((Task("train", "val", "test"), False, None, ["train", "test"]),
                                           (Task("train", "val", "test"), False, 50, ["train[:50]", "test"]),
                                           (Task("train", "val", "test"), True, 50, ["test"]),
                                           (Task("train"), False, None, ["train"]), (Task("test"), False, 7, ["test"])):
        built.clear()
        ddp.build_every_split(task, eval_only, n_train)
        assert built == want, (task.names, eval_only, n_train)


def test_the_first_short_steps_train_on_prefixes(lra, tmp_path, monkeypatch):
    import simpletron
    lengths, forward = [], simpletron.Model.forward

    def recording(self, idx, targets=None):
        if self.training:
            lengths.append(idx.shape[-1])
        return forward(self, idx, targets)
    monkeypatch.setattr(simpletron.Model, "forward", recording)
    run("--data_dir", lra, *TINY, "--max_iters", "4", "--short_steps", "2", "--short_len", "5", "--eval_interval", "4",
        "--out_dir", tmp_path / "o")
    assert lengths[:2] == [5, 5] and len(lengths) == 4      # steps 1 and 2 on 5-token prefixes,
    assert min(lengths[2:]) > 5                              # then whole trees (a batch as long as its longest)


def test_a_warm_up_typed_that_would_shorten_no_step_is_refused_before_any_step(lra, tmp_path):
    (tmp_path / "txt").mkdir()
    (tmp_path / "txt" / "a.txt").write_text("to be or not to be, that is the question\n" * 20, encoding="utf-8")
    lm = ["--task", "textfile", "--data_dir", tmp_path / "txt", "--tokenizer", "byte", "--block_size", "8", *TINY,
          "--max_iters", "2", "--out_dir", tmp_path / "lm"]
    with pytest.raises(config.UsageError, match=r"^--short_steps 3: task textfile is a language model, each of"):
        run(*lm, "--short_steps", "3")                           # a language model's steps take the whole block
    cls = ["--data_dir", lra, *TINY, "--max_iters", "2", "--short_steps", "1", "--out_dir", tmp_path / "cls"]
    block = train.settings([str(a) for a in cls])[-1].get("block_size") or data.load_task(
        "listops", data_dir=str(lra)).block_size
    with pytest.raises(config.UsageError, match=rf"^--short_len {block}: the model's block is {block} tokens, so no "):
        run(*cls, "--short_len", block)                          # a prefix as long as the block: the block
    for out in ("lm", "cls"):
        assert not (tmp_path / out / "log.jsonl").exists()   # refused before any step
    run(*cls, "--short_len", block - 1, "--eval_interval", "2")  # one token shorter: trains
    assert (tmp_path / "cls" / "log.jsonl").exists()
    assert config.preset_for(config.PRESETS["cpu"], "simpletron", "listops")["short_len"] == 64
    run("--data_dir", lra, *TINY, "--max_iters", "2", "--eval_interval", "2", "--block_size", "64", "--out_dir",
        tmp_path / "preset")
    assert (tmp_path / "preset" / "log.jsonl").exists()      # the preset's own warm-up on a short block: left alone


def test_evaluating_batches_of_many_lengths_does_not_keep_memory_per_length():
    """oneDNN keeps a compiled kernel for every tensor shape it meets (GELU's here) and, through them, pins the
    freed memory around it; batches padded to their longest example come in hundreds of lengths, which took
    the README's main command past 3 GB. train.py turns that cache off: 60 lengths of the main command's model
    must not grow the process by more than 200 MB (they grew it by ~700 MB with the cache)."""
    code = ("import torch, train, simpletron as st\n"
            "def rss():\n"
            "    return int(open('/proc/self/status').read().split('VmRSS:')[1].split()[0]) // 1024\n"
            "model = st.Model(st.Config(vocab_size=16, block_size=2000, n_layer=2, n_head=4, n_embd=64,\n"
            "                           head='cls', n_classes=10)).eval()\n"
            "with torch.no_grad():\n"
            "    model(torch.randint(1, 16, (16, 1500)))\n"
            "    before = rss()\n"
            "    for L in range(1500, 1560):\n"
            "        model(torch.randint(1, 16, (16, L)))\n"
            "print(rss() - before)\n")
    env = {k: v for k, v in os.environ.items() if k != "ONEDNN_PRIMITIVE_CACHE_CAPACITY"}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    assert int(out.stdout.split()[-1]) < 200, out.stdout


def test_transjects_model_line_shows_no_heads():
    """TransJect's Config keeps n_head (unused: its experts take the heads' place); its line leaves it out."""
    model = config.build_model("transject", dict(vocab_size=16, block_size=8, n_layer=1, n_embd=16))
    args = SimpleNamespace(model="transject", task="listops", device="cpu")
    line = train.model_line(args, SimpleNamespace(on=False, world=1), model)
    size = sum(p.numel() for p in model.parameters()) / 1e6
    assert line == f"transject on listops (cpu): {size:.2f}M params, n_layer 1 n_embd 16 block_size 8 vocab_size 16"


def test_overwrite_replaces_a_log_that_is_a_link_and_leaves_the_file_it_leads_to(tmp_path):
    """Battery 21 u09: log.jsonl a symbolic link to the user's notes.txt: --overwrite wrote the new log into
    notes.txt. The link goes; the new log is a file of its own, the notes unchanged."""
    char_run(tmp_path)
    (tmp_path / "notes.txt").write_text("my notes\n")
    (tmp_path / "r" / "log.jsonl").unlink()
    (tmp_path / "r" / "log.jsonl").symlink_to(tmp_path / "notes.txt")
    char_run(tmp_path, "--overwrite")
    assert (tmp_path / "notes.txt").read_text() == "my notes\n"
    log = tmp_path / "r" / "log.jsonl"
    assert not log.is_symlink() and json.loads(log.read_text().splitlines()[-1])["step"] == 2
