"""
Settings: the models, the flags, the presets, and every check of them, shared by train.py, sample.py,
analyze.py and bench.py (one parser class, one error type, one limits table, one device choice).
"""

import argparse
import importlib
import math
import re

import torch


# model name -> (module, Config overrides that make it that model)
MODELS = {
    "simpletron": ("simpletron", {}),
    "softmax": ("simpletron", {"attention": "softmax", "variant": "vanilla"}),  # Transformer / GPT baseline
    "transject": ("transject", {}),
    "diffeqformer": ("diffeqformer", {}),
}

class UsageError(Exception):
    """Bad input: printed as one line, exit status 2."""


class Parser(argparse.ArgumentParser):
    """argparse that raises one UsageError line instead of printing a usage dump and exiting."""

    def error(self, message):
        raise UsageError(f"{message} (python {self.prog.split()[0]} --help lists the flags)")


def to_bool(s):
    if s.lower() in ("1", "true", "yes", "on"):
        return True
    if s.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, not {s!r}")


def model_module(name):
    if name not in MODELS:
        raise UsageError(f"unknown model {name!r}; choose one of: {', '.join(MODELS)}")
    try:
        return importlib.import_module(MODELS[name][0])
    except ModuleNotFoundError as e:
        raise UsageError(f"model {name!r} is not available here ({e})") from None


# What every flag and Config field allows, checked before any data is read: name -> (test, what is allowed).
# Floats must also be finite. Fields that a model's Config checks itself (choices, n_embd % n_head) are left to it.
AT_LEAST = {n: (lambda v, lo=lo: isinstance(v, int) and v >= lo, f"an integer >= {lo}") for lo, names in (
    (0, ("warmup", "short_steps", "lora_rank", "lora_r", "attn_std_interval")),
    (1, ("max_iters", "batch_size", "grad_accum", "eval_interval", "eval_iters", "log_interval", "short_len", "steps",
         "lr_decay_iters", "n_train", "block_size", "n_layer", "n_head", "n_embd", "mlp_ratio", "n_experts",
         "time_dim", "time_freqs")),
    (2, ("vocab_size",))) for n in names}
LIMITS = {
    **AT_LEAST,
    "n_classes": (lambda v: isinstance(v, int) and (v == 0 or v >= 2), "an integer >= 2 (0: a language model)"),
    "seed": (lambda v: 0 <= v < 2**32, "an integer from 0 to 2**32 - 1"),
    "lr": (lambda v: v >= 0, "a number >= 0"),
    **{n: (lambda v: v > 0, "a number > 0") for n in ("eps", "lora_alpha", "T", "temperature")},
    "time_limit": (lambda v: v > 0, "a number of minutes > 0"),
    "min_lr": (lambda v: 0 <= v <= 1, "a fraction of lr from 0 to 1"),
    "beta1": (lambda v: 0 <= v < 1, "a number from 0 to 1 (1 excluded)"),
    "beta2": (lambda v: 0 <= v < 1, "a number from 0 to 1 (1 excluded)"),
    "dropout": (lambda v: 0 <= v < 1, "a probability from 0 to 1 (1 excluded)"),
    **{n: (lambda v: v >= 0, "a number >= 0") for n in ("weight_decay", "grad_clip", "gate_lr_scale",
                                                          "sigma_loss_weight")},
    "schedule": (lambda v: v in ("rsqrt", "cosine"), "rsqrt or cosine"),
    "device": (lambda v: re.fullmatch(r"auto|cpu|mps|cuda(:\d+)?", v), "auto, cpu, cuda, cuda:N or mps"),
    **{n: (lambda v: v.strip() != "", "a path") for n in ("out_dir", "data_dir", "cache_dir", "init_from",
                                                            "transfer_from")},
    # sample.py, analyze.py and bench.py
    **{n: (lambda v: isinstance(v, int) and v >= 0, "an integer >= 0") for n in ("grid", "threads", "max_new_tokens")},
    **{n: (lambda v: isinstance(v, int) and v >= 1, "an integer >= 1") for n in (
        "k", "n_seq", "max_len", "batch", "repeats", "inner", "new_tokens", "num_samples")},
    **{n: (lambda v: isinstance(v, int) and v >= 2, "an integer >= 2") for n in ("tokens", "vocab")},
    "top_k": (lambda v: isinstance(v, int) and v >= 0, "an integer >= 0 (0: all tokens, 1: greedy)"),
    "clock": (lambda v: v in ("wall", "cpu"), "wall or cpu"),
    "degrees": (lambda v: all(d.strip().isdigit() for d in v.split(",")), "integers >= 0 separated by commas"),
    "lengths": (lambda v: all(d.strip().isdigit() and int(d) > 0 for d in v.split(",") if d.strip()),
                "integers >= 1 separated by commas"),
}


def check_value(name, value):
    """A UsageError naming the flag (or Config field), its value and what is allowed, if the value is bad."""
    test, allowed = LIMITS.get(name, (lambda v: True, "a finite number"))
    try:
        ok = value is None or (not isinstance(value, float) or math.isfinite(value)) and bool(test(value))
    except TypeError:                                        # e.g. a string where a checkpoint should have a number
        ok = False
    if not ok:
        raise UsageError(f"--{name} {value if value != '' else repr(value)}: allowed is {allowed}")




def pick_device(name):
    """--device auto: cuda, then mps, then cpu; any other name as it is."""
    if name != "auto":
        return name
    return "cuda" if torch.cuda.is_available() else "mps" if torch.backends.mps.is_available() else "cpu"
