"""train.py: exact resume, evaluation of a checkpoint on other data, metrics, presets, schedules, bad input."""

import json
import math
import os
import subprocess
import sys

import pytest
import torch

import data
import train

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = ["--n_layer", "1", "--n_embd", "16", "--n_head", "2", "--batch_size", "4", "--eval_iters", "2",
        "--log_interval", "1", "--warmup", "2"]


def write_listops(folder, n, seed, splits=("train", "val", "test")):
    folder.mkdir(parents=True, exist_ok=True)
    examples = data.listops_chunk(((seed, 0), n * len(splits), 5, 60))    # short trees: fast tests
    for i, split in enumerate(splits):
        data.write_listops_tsv(folder / f"basic_{split}.tsv", examples[i * n:(i + 1) * n])
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
    a = torch.load(tmp_path / "whole" / "ckpt.pt", weights_only=True)["model"]
    b = torch.load(tmp_path / "part" / "ckpt.pt", weights_only=True)["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_resume_after_a_crash_past_the_checkpoint_logs_each_step_once(lra, tmp_path):
    common = ["--data_dir", lra, *TINY, "--eval_interval", "3"]
    out = tmp_path / "run"
    run(*common, "--max_iters", "3", "--out_dir", out)
    saved = (out / "ckpt.pt").read_bytes()                                     # the checkpoint of step 3
    run("--resume", "--out_dir", out, "--max_iters", "5")                      # the log reaches step 5 ...
    (out / "ckpt.pt").write_bytes(saved)                                       # ... and a crash loses 4, 5
    run("--resume", "--out_dir", out, "--max_iters", "6")
    with open(out / "log.jsonl") as f:
        steps = [r["step"] for r in map(json.loads, f) if "loss" in r]
    assert steps == [1, 2, 3, 4, 5, 6]


def test_metrics_checkpoint_and_eval_on_other_data(lra, tmp_path):
    out = tmp_path / "run"
    m = run("--data_dir", lra, *TINY, "--max_iters", "4", "--out_dir", out)
    saved = json.loads((out / "metrics.json").read_text())
    for key in ("test_acc", "test_loss", "val_acc", "val_loss", "n_test", "n_val", "iters", "seconds",
                "tokens_per_s", "config"):
        assert key in saved, key
    assert saved["n_test"] == 64 and saved["iters"] == 4 and saved["config"]["n_layer"] == 1
    assert saved == json.loads(json.dumps(m))
    assert sorted(os.listdir(out)) == ["ckpt.pt", "log.jsonl", "metrics.json"]   # no temporary file left
    ckpt = torch.load(out / "ckpt.pt", weights_only=True)
    assert ckpt["iter"] == 4 and ckpt["model_name"] == "simpletron"

    # the checkpoint evaluated on a test split it never saw, in a folder with nothing else
    other = write_listops(tmp_path / "other", 37, seed=2, splits=("test",))
    m2 = run("--init_from", out / "ckpt.pt", "--eval_only", "--data_dir", other, "--out_dir", tmp_path / "ev")
    assert m2["n_test"] == 37 and "val_acc" not in m2
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
    src = torch.load(tmp_path / "simple" / "ckpt.pt", weights_only=True)
    dst = torch.load(tmp_path / "soft" / "ckpt.pt", weights_only=True)
    assert dst["config"]["attention"] == "softmax" and dst["config"]["freeze_qkv"]
    assert torch.equal(src["model"]["blocks.0.attn.qkv.weight"], dst["model"]["blocks.0.attn.qkv.weight"])
    assert not torch.equal(src["model"]["blocks.0.mlp.fc.weight"], dst["model"]["blocks.0.mlp.fc.weight"])


def test_layering_flags_over_preset_over_defaults():
    args, given, names = train.parse_args(["--preset", "paper", "--n_layer", "3", "--warmup", "7"])
    overrides = train.resolve(args, given, names)
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


def cli(*argv, cwd):
    return subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), *map(str, argv)], cwd=cwd,
                          capture_output=True, text=True, timeout=120)


def test_bad_input_gives_one_clear_line(lra, tmp_path):
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
    for argv, message in cases.items():
        p = cli(*argv, cwd=tmp_path)
        assert p.returncode != 0, argv
        lines = p.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], (argv, p.stderr)
