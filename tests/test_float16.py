"""--dtype: float16 autocast with a gradient scaler, for GPUs without bfloat16 (a T4, a V100), run here on the CPU
(CPU autocast and torch.amp.GradScaler("cpu")): it computes in float16, its loss falls, an infinite gradient skips
its step (weights and optimiser untouched, the scale halved) without stopping the run, and --resume is exact, the
scaler's state included."""

import json
import math
import warnings

import pytest
import torch

import runsetup
from test_faults import poison
from test_train import TINY, losses, run, write_listops

FP16 = ["--dtype", "float16", "--device", "cpu"]


@pytest.fixture(scope="module")
def lra(tmp_path_factory):
    return write_listops(tmp_path_factory.mktemp("lra"), 64, seed=1)


def ckpt(folder):
    return torch.load(folder / "ckpt.pt", map_location="cpu", weights_only=True)


def equal_states(a, b):
    """Two nested state dicts (weights, optimiser state) with the same keys and equal tensors and values."""
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(equal_states(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(map(equal_states, a, b))
    return torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b


def test_dtype_picks_the_autocast_and_the_scaler(monkeypatch):
    x = torch.ones(2, 2)
    for dtype, computed, scaled in (("auto", torch.float32, False), ("float32", torch.float32, False),
                                    ("float16", torch.float16, True), ("bfloat16", torch.bfloat16, False)):
        name, autocast, scaler = runsetup.precision(dtype, "cpu")
        with autocast:
            assert (x @ x).dtype == computed, dtype
        assert name == {"auto": "float32"}.get(dtype, dtype) and scaler.is_enabled() == scaled
    monkeypatch.setattr(torch.version, "hip", None)           # auto on CUDA: what the GPU has in hardware
    for capability, expected in (((7, 5), "float16"), ((7, 0), "float16"), ((8, 0), "bfloat16"), ((9, 0), "bfloat16")):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None, c=capability: c)
        with warnings.catch_warnings():                       # (no CUDA here: torch warns and disables them)
            warnings.simplefilter("ignore")
            assert runsetup.precision("auto", "cuda")[0] == expected, capability


def test_float16_computes_in_float16_and_its_loss_falls(lra, tmp_path):
    common = ["--data_dir", lra, *TINY, "--n_embd", "32", "--batch_size", "16", "--max_iters", "100", "--lr", "3e-3",
              "--eval_interval", "100"]
    m = run(*common, *FP16, "--out_dir", tmp_path / "fp16")
    run(*common, "--out_dir", tmp_path / "fp32")
    half, full = losses(tmp_path / "fp16"), losses(tmp_path / "fp32")
    assert half[1] != full[1] and half[1] == pytest.approx(full[1], rel=1e-3)   # the same step, rounded to float16
    first, last, last32 = (sum(run_[s] for s in steps) / 10 for run_, steps in (
        (half, range(1, 11)), (half, range(91, 101)), (full, range(91, 101))))
    assert last < first - 0.1 and abs(last - last32) < 0.02, (first, last, last32)   # it learns as float32 does
    assert ckpt(tmp_path / "fp16")["scaler"]["scale"] == 2.0 ** 16 and m["test_loss"] < 3   # no step skipped


def test_an_infinite_gradient_skips_its_step_and_the_run_goes_on(lra, tmp_path, monkeypatch):
    common = ["--data_dir", lra, *TINY, *FP16, "--lr_decay_iters", "8", "--eval_interval", "4"]
    run(*common, "--max_iters", "3", "--out_dir", tmp_path / "three")
    poison(monkeypatch, 4, "gradient")                        # step 4's gradient is infinite
    m = run(*common, "--max_iters", "4", "--out_dir", tmp_path / "four")
    assert sorted(losses(tmp_path / "four")) == [1, 2, 3, 4] and m["iters"] == 4     # no Diverged: it ended
    a, b = ckpt(tmp_path / "three"), ckpt(tmp_path / "four")
    assert equal_states(a["model"], b["model"])                # step 4 changed no weight ...
    assert equal_states(a["optimizer"]["state"], b["optimizer"]["state"])   # ... nor Adam's moments and step count
    assert b["scaler"]["scale"] == a["scaler"]["scale"] / 2 and b["scaler"]["_growth_tracker"] == 0
    with open(tmp_path / "four" / "log.jsonl") as f:                       # log.jsonl: each step's scale
        scale = {r["step"]: r["scale"] for r in map(json.loads, f) if "loss" in r}
    assert scale[4] == scale[3] / 2 == a["scaler"]["scale"] / 2


def test_a_float16_run_resumes_exactly_with_its_scaler(lra, tmp_path, monkeypatch):
    common = ["--data_dir", lra, *TINY, *FP16, "--dropout", "0.1", "--eval_interval", "3", "--lr_decay_iters", "8"]
    poison(monkeypatch, 2, "gradient")                        # the scale halves at step 2, before the checkpoint
    run(*common, "--max_iters", "8", "--out_dir", tmp_path / "whole")
    monkeypatch.undo()
    poison(monkeypatch, 2, "gradient")
    run(*common, "--max_iters", "5", "--out_dir", tmp_path / "part")                # stops at step 5 ...
    monkeypatch.undo()
    run("--resume", "--out_dir", tmp_path / "part", "--max_iters", "8")           # ... and continues to 8
    whole, part = ckpt(tmp_path / "whole"), ckpt(tmp_path / "part")
    assert losses(tmp_path / "part") == losses(tmp_path / "whole")               # bit for bit
    assert equal_states(part["model"], whole["model"]) and part["scaler"] == whole["scaler"]
    assert whole["scaler"]["scale"] == 2.0 ** 15 and whole["scaler"]["_growth_tracker"] == 6


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("model", ["simpletron", "softmax", "transject", "diffeqformer"])
def test_every_model_trains_under_each_16_bit_autocast(lra, tmp_path, model, dtype):
    """CPU autocast casts less than CUDA's: DiffEqFormer's LayerNorm weights made by a matmul under bfloat16 once
    met float32 activations there and stopped the run with a traceback."""
    tiny = TINY[:4] + TINY[6:] if model == "transject" else TINY          # TINY[4:6]: --n_head, none in TransJect
    m = run("--data_dir", lra, *tiny, "--model", model, "--dtype", dtype, "--device", "cpu", "--max_iters", "2",
            "--eval_interval", "2", "--out_dir", tmp_path / "o")
    assert m["iters"] == 2 and all(map(math.isfinite, losses(tmp_path / "o").values()))
