"""
Settings: the models, train.py's flags and presets, what --help shows, and every check of them; the parser, the
error type, the limits, the device choice and the checkpoint reader that sample.py, analyze.py and bench.py share.
A run's settings are layered: the model's Config defaults < what the task fixes (vocabulary, length, head) < the
preset (--preset cpu|paper: PRESETS, per model and task) < the flags given.
"""

import argparse
import collections
import dataclasses
import importlib
import importlib.util
import inspect
import math
import os
import pathlib
import pickle
import platform
import re
import shlex
import traceback
import warnings
import zipfile

import torch

import data
import tasks  # noqa: F401  (registers every task in data.TASKS)
from tasks.sources import check_tokenizer


# model name -> (module, Config overrides that make it that model)
MODELS = {
    "simpletron": ("simpletron", {}),
    "softmax": ("simpletron", {"attention": "softmax", "variant": "vanilla"}),  # Transformer / GPT baseline
    "transject": ("transject", {}),
    "diffeqformer": ("diffeqformer", {}),
}


class UsageError(Exception):
    """Bad input: printed as one line, exit status 2."""


class Refusal(UsageError):
    """A model's own refusal of its settings: a ValueError or AssertionError its Model(config) raised (build_model)."""


class Parser(argparse.ArgumentParser):
    """argparse that raises one UsageError line instead of printing a usage dump and exiting; train.py's @FILE: the
    flags in FILE (a recipe), read as a shell reads them, # comments left out (shell_text)."""

    def error(self, message):
        raise UsageError(f"{message} (python {self.prog.split()[0]} --help lists the flags)")

    def parse_typed(self, argv):
        """The flags, and in args.typed the names of those typed (argv parsed again without defaults; a list, for
        JSON): a flag a run leaves moot can then be refused, never dropped."""
        args = self.parse_args(argv)
        self.set_defaults(**dict.fromkeys(vars(args)))
        args.typed = sorted(k for k, v in vars(self.parse_args(argv)).items() if v is not None)
        return args

    def _read_args_from_files(self, arg_strings, depth=0):
        """argparse's @FILE reader, whole files read as a shell reads words: a file that is not UTF-8 text, has an
        unclosed quote or reads itself: one line. (A FIFO or a device would be waited on, not read.)"""
        out = []
        for a in arg_strings:
            if a[:1] != "@":
                out.append(a)
                continue
            if a == "@":
                self.error("@ without a file: @FILE reads the flags in FILE, e.g. @recipes/quickstart.txt")
            why = data.file_problem(a[1:])
            why = why and f"{a[1:]} {why}" or depth > 20 and "cannot read its flags (it names itself, @FILE in FILE)"
            try:
                words = None if why else shlex.split(shell_text(pathlib.Path(a[1:]).read_text("utf-8")), comments=False)
            except (OSError, ValueError) as e:                   # (UnicodeDecodeError and shlex's: ValueErrors)
                why = f"cannot read its flags ({data.one_line(e, 120)})"
            if why:
                self.error(f"{a}: {why}; a file of flags is UTF-8 text, read as a shell reads it")
            out += self._read_args_from_files(words, depth + 1)
        return out


def shell_text(text):
    """A file of flags as a POSIX shell sees it before splitting words (shlex then splits them): a # starting a word
    (outside quotes) comments out the rest of its line, a backslash ending a line joins the next (outside single
    quotes), a byte-order mark (as Notepad writes) and CRLF line ends are dropped."""
    text, out, quote, i = text.removeprefix("\ufeff").replace("\r\n", "\n"), [], None, 0
    while i < len(text):
        c = text[i]
        if c == "\\" and quote != "'":                       # (an escaped character: kept, with its backslash)
            out += [] if text[i + 1:i + 2] == "\n" else [text[i:i + 2]]
            i += 2
            continue
        if c == "#" and quote is None and (not out or out[-1].isspace()):
            i = text.find("\n", i) % (len(text) + 1)          # (-1, no line end: the end of the text)
            continue
        if c in "'\"" and quote in (None, c):
            quote = None if quote else c
        out.append(c)
        i += 1
    return "".join(out)


def to_bool(s):
    if s.lower() in ("1", "true", "yes", "on", "0", "false", "no", "off"):
        return s.lower() in ("1", "true", "yes", "on")
    raise argparse.ArgumentTypeError(f"expected true or false, not {s!r}")


def model_module(name):
    """The module of MODELS[name], checked as a fork's would be: it imports, its Config has the common fields, each
    a bool, int, float or str, none with a train.py flag's name (its fields are flags too), and help in FIELD_HELP."""
    if name not in MODELS:
        raise UsageError(f"unknown model {name!r}; choose one of: {', '.join(MODELS)}")
    try:
        module = importlib.import_module(MODELS[name][0])
    except ModuleNotFoundError as e:
        raise UsageError(f"model {name!r} is not available here ({e})") from None
    except Exception as e:                                   # a fork's file that fails on import: where, and why
        origin = getattr(importlib.util.find_spec(MODELS[name][0]), "origin", None)
        ours = [(f.filename, f.lineno) for f in traceback.extract_tb(e.__traceback__) if f.filename == origin]
        file, line = (e.filename, e.lineno) if isinstance(e, SyntaxError) else (ours or [(origin or "?", "?")])[-1]
        raise UsageError(f"model {name!r}: {os.path.basename(file)} line {line} fails on import: {type(e).__name__}: "
                         f"{data.one_line(str(e), 200)}") from None
    lacks = [f"{MODELS[name][0]}.py has no class {k} (a model file holds Config, a dataclass, and Model(config): "
             "docs/architecture.md)" for k in ("Config", "Model") if not isinstance(getattr(module, k, None), type)]
    if not isinstance(getattr(module, "Config", None), type):
        raise UsageError(f"model {name!r}: {lacks[0]}")
    if not dataclasses.is_dataclass(module.Config):         # (a plain class: its fields cannot be read)
        raise UsageError(f"model {name!r}: {MODELS[name][0]}.py's Config must be a @dataclass (its fields are "
                         "train.py's flags: docs/architecture.md)")
    fields = dataclasses.fields(module.Config)
    problems = [f"its Config field {f.name} has the name of train.py's flag --{f.name}; rename the field (docs/"
                "architecture.md lists the names that are taken)" for f in fields if f.name in (*DEFAULTS, "help")]
    problems += [f"its Config field {f.name} is of type {f.type}; a field is a flag too: bool, int, float or str"
                 for f in fields if field_kind(f) not in FIELD_KINDS]
    problems += [f"its Config field {f.name} is {'an' if field_kind(f) == 'int' else 'a'} {field_kind(f)} "
                 f"defaulting to {f.default!r}; give it a default of its type" for f in fields
                 if f.default is not dataclasses.MISSING and not fits_field(f, f.default)]
    problems += [f"its Config has no field {k} (every model's has {', '.join(COMMON_FIELDS)})"
                 for k in COMMON_FIELDS if k not in {f.name for f in fields}]
    problems += [f"config.MODELS sets {k}, which its Config has no field of" for k in MODELS[name][1]
                 if k not in {f.name for f in fields}]
    if MODELS[name][0] not in FIELD_HELP:
        problems.append(f"config.FIELD_HELP has no entry {MODELS[name][0]!r}, its fields' help for --help")
    problems += lacks                                        # (no class Model: nanoGPT's GPT kept, say)
    if problems:
        raise UsageError(f"model {name!r}: {problems[0]}")
    return module


# A Config field's types (its annotation, or its name as a string under `from __future__ import annotations`):
# name -> (the values of a flag of it, what is allowed); true is no int, an int is a float
FIELD_KINDS = {"bool": ((bool,), "true or false"), "int": ((int,), "an integer"), "float": ((int, float), "a number"),
               "str": ((str,), "a string")}


def field_kind(f):
    return getattr(f.type, "__name__", f.type)


def fits_field(f, value):
    kind = FIELD_KINDS.get(field_kind(f), ((object,), ""))[0]
    return isinstance(value, kind) and not (isinstance(value, bool) and bool not in kind)


# What every flag and Config field allows, checked before any data is read: name -> (test, what is allowed).
# Floats must also be finite. Fields that a model's Config checks itself (choices, n_embd % n_head) are left to it.
AT_LEAST = {n: (lambda v, lo=lo: isinstance(v, int) and v >= lo, f"an integer >= {lo}") for lo, names in (
    (0, ("warmup", "short_steps", "lora_rank", "lora_r", "attn_std_interval", "mlp_hidden")),
    (1, ("max_iters", "batch_size", "grad_accum", "eval_interval", "eval_iters", "log_interval", "short_len", "steps",
         "lr_decay_iters", "n_train", "block_size", "n_layer", "n_head", "n_embd", "mlp_ratio", "n_experts",
         "time_dim", "time_freqs")),
    (2, ("vocab_size",))) for n in names}
LIMITS = {
    **AT_LEAST,
    "n_classes": (lambda v: isinstance(v, int) and (v == 0 or v >= 2), "an integer >= 2 (0: a language model)"),
    "seed": (lambda v: 0 <= v < 2**32, "an integer from 0 to 2**32 - 1"),
    "lr": (lambda v: v >= 0, "a number >= 0"),
    **{n: (lambda v: v > 0, "a number > 0") for n in ("eps", "lora_alpha", "T", "temperature", "peak_tflops",
                                                       "max_minutes", "layer_norm_eps", "lora_scale")},
    "time_limit": (lambda v: v > 0, "a number of minutes > 0"),
    "min_lr": (lambda v: 0 <= v <= 1, "a fraction of lr from 0 to 1"),
    "beta1": (lambda v: 0 <= v < 1, "a number from 0 to 1 (1 excluded)"),
    "beta2": (lambda v: 0 <= v < 1, "a number from 0 to 1 (1 excluded)"),
    "dropout": (lambda v: 0 <= v < 1, "a probability from 0 to 1 (1 excluded)"),
    **{n: (lambda v: v >= 0, "a number >= 0") for n in ("weight_decay", "grad_clip", "gate_lr_scale",
                                                          "sigma_loss_weight")},
    "schedule": (lambda v: v in ("rsqrt", "cosine"), "rsqrt or cosine"),
    "dtype": (lambda v: v in ("auto", "bfloat16", "float16", "float32"), "auto, bfloat16, float16 or float32"),
    "device": (lambda v: re.fullmatch(r"auto|cpu|mps|cuda(:\d+)?", v), "auto, cpu, cuda, cuda:N or mps"),
    **{n: (lambda v: all(p.strip() for p in ([v] if isinstance(v, str) else v)), "a path") for n in (
        "out_dir", "data_dir", "cache_dir", "init_from", "init_from_bert", "transfer_from", "ckpt", "out", "run",
        "nanogpt")},                                         # (analyze.py's --ckpt and --run: lists of paths)
    # sample.py, analyze.py and bench.py
    **{n: (lambda v: isinstance(v, int) and v >= 0, "an integer >= 0") for n in ("grid", "max_new_tokens")},
    "threads": (lambda v: isinstance(v, int) and 0 <= v <= (os.cpu_count() or 1),
                f"an integer from 0 (torch's own choice) to {os.cpu_count() or 1}, the cores of this machine"),
    **{n: (lambda v: isinstance(v, int) and v >= 1, "an integer >= 1") for n in (
        "k", "n_seq", "max_len", "batch", "repeats", "new_tokens", "num_samples")},
    "inner": (lambda v: isinstance(v, int) and 1 <= v <= 1000, "an integer from 1 to 1,000 (nanoGPT's bench: 10)"),
    **{n: (lambda v: isinstance(v, int) and v >= 2, "an integer >= 2") for n in ("tokens", "vocab")},
    "top_k": (lambda v: isinstance(v, int) and v >= 0, "an integer >= 0 (0: all tokens, 1: greedy)"),
    "clock": (lambda v: v in ("wall", "cpu"), "wall or cpu"),
    "degrees": (lambda v: all(re.fullmatch("[0-9]+", d.strip()) for d in v.split(",")),
                "integers >= 0 separated by commas"),
    "lengths": (lambda v: all(re.fullmatch("[0-9]+", d.strip()) and int(d) > 0 for d in v.split(",") if d.strip()),
                "integers >= 1 separated by commas"),
}


def check_value(name, value):
    """A UsageError naming the flag (or Config field), its value and what is allowed, if the value is bad."""
    test, allowed = LIMITS.get(name, (lambda v: True, "a finite number"))
    try:
        ok = value is None or (not isinstance(value, float) or math.isfinite(value)) and bool(test(value))
    except (TypeError, AttributeError):                      # e.g. a string where a checkpoint should have a number
        ok = False
    if not ok:
        shown = ", ".join(map(repr, value)) if isinstance(value, list) else repr(value) if value == "" or (
            isinstance(value, str) and not value.strip()) else value
        raise UsageError(f"--{name} {shown}: allowed is {allowed}")


def int_list(flag, text):
    """A flag's integers separated by commas (empty items left out), or one UsageError line."""
    try:
        return [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise UsageError(f"--{flag} takes integers separated by commas, not {text!r}") from None


def check_device(name):
    """A UsageError if --device names a CUDA device or MPS that this machine lacks."""
    if name.startswith("cuda"):
        index = int(name.partition(":")[2] or 0)
        if not torch.cuda.is_available() or index >= torch.cuda.device_count():
            raise UsageError(f"--device {name}: no such CUDA device here ({torch.cuda.device_count()} GPUs); "
                             "use --device cpu (or auto)")
    if name == "mps" and not torch.backends.mps.is_available():
        raise UsageError("--device mps: Apple's MPS is not available here; use --device cpu (or auto)")


def pick_device(name):
    """--device auto: cuda, then mps, then cpu; any other name as it is."""
    if name != "auto":
        return name
    return "cuda" if torch.cuda.is_available() else "mps" if torch.backends.mps.is_available() else "cpu"


def machine(device="cpu"):
    """What a number was measured on: the CPU, its cores, the GPU when `device` is CUDA, torch's version."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    gpu = torch.cuda.get_device_name() if str(device).startswith("cuda") else "no GPU"
    return f"{cpu}, {os.cpu_count()} cores, {gpu}, torch {torch.__version__}"


# ----------------------------------------------------------------------------------------------
# train.py's flags: (name, type, default, help); the model's Config fields are flags too. A flag not given is None
# until resolve() fills it from the preset or this default.

FLAGS = [
    ("model", str, "simpletron", "The model to train: " + ", ".join(MODELS) + "."),
    ("task", str, "listops", "The task to train on: " + ", ".join(data.TASKS) + "."),
    ("preset", str, "cpu", "The settings to start from: cpu (minutes on a CPU) or paper (the papers' own)."),
    ("device", str, "auto", "Where to run: auto (cuda, then mps, then cpu), cuda, cuda:N, mps or cpu."),
    ("max_iters", int, 1000, "How many optimiser steps to train for."),
    ("batch_size", int, 16, "Examples per micro-batch (under torchrun: per process)."),
    ("grad_accum", int, 1, "Micro-batches per step (the effective batch is batch_size * grad_accum)."),
    ("lr", float, 1e-3, "The base learning rate."),
    ("schedule", str, "cosine", "The learning-rate schedule: rsqrt (SimpleTRON: lr * min(1, s/warmup) / "
                                "sqrt(max(s, warmup))) or cosine."),
    ("warmup", int, 100, "Warm-up steps."),
    ("min_lr", float, 0.1, "Cosine: the final learning rate, as a fraction of lr."),
    ("lr_decay_iters", int, None, "Cosine: the steps over which the learning rate decays."),
    ("weight_decay", float, 0.1, "AdamW's weight decay (matrices and embeddings only)."),
    ("beta1", float, 0.9, "AdamW's beta1."),
    ("beta2", float, 0.999, "AdamW's beta2."),
    ("eps", float, 1e-8, "AdamW's epsilon."),
    ("grad_clip", float, 1.0, "Clip the gradient's norm to at most this (0: no clipping)."),
    ("gate_lr_scale", float, 30.0, "Scalar gates (TransJect's a_l, ReZero's alpha) learn at lr times this."),
    ("eval_interval", int, 250, "Every this many steps: evaluate on val, write ckpt.pt, and best.pt when val is the "
                                "best so far (classifiers: highest accuracy; language models: lowest loss)."),
    ("eval_iters", int, 20, "Batches of val to evaluate on during training (the end uses all of val and test)."),
    ("log_interval", int, 10, "Print a progress line every this many steps."),
    ("attn_std_interval", int, 0, "SimpleTRON and softmax: log each block's attention std on a fixed val batch "
                                  "every this many steps (0: never; SimpleTRON's Fig. 5, analyze.py attnstd)."),
    ("short_steps", int, 0, "Sequence-length warm-up (classification tasks): train the first this many steps on "
                            "prefixes of short_len tokens, which escapes the long early plateau."),
    ("short_len", int, 64, "The length of those prefixes, in tokens."),
    ("time_limit", float, None, "Stop training after this many minutes (data preparation included), then evaluate."),
    ("out_dir", str, None, "The run's folder: ckpt.pt, best.pt, log.jsonl, loss.png and metrics.json."),
    ("data_dir", str, None, "Read the task from the files in this folder instead of downloading or generating it."),
    ("cache_dir", str, "data", "Where generated and downloaded data are kept."),
    ("tokenizer", str, "gpt2", "BPE tasks: gpt2 (tiktoken), another tiktoken encoding, or byte; char: textfile "
                               "and ptb as characters."),
    ("n_train", int, None, "Train on the first n training examples only (language models: tokens)."),
    ("seed", int, 0, "The seed of the data order, the dropout and the initialisation."),
    ("resume", bool, False, "Continue the run in --out_dir from its ckpt.pt, exactly as if it had not stopped."),
    ("overwrite", bool, False, "Start a new run in an --out_dir that holds another run, replacing its files."),
    ("init_from", str, None, "Start a new run from this checkpoint's weights (a ckpt.pt or best.pt; see --eval_only)."),
    ("eval_only", bool, False, "With --init_from: evaluate on the task's val and test splits, then stop."),
    ("init_from_bert", str, None, "Fine-tune a pretrained BERT (a Hugging Face folder) with a new classifier on "
                                  "its [CLS] state: --model softmax (BERT) or simpletron; --task agnews or imdb."),
    ("transfer_from", str, None, "With --model softmax: copy this SimpleTRON checkpoint's q/k/v, frozen."),
    ("steps", int, None, "With --init_from a DiffEqFormer checkpoint: fine-tune it as this many Euler steps."),
    ("lora_rank", int, 0, "With --steps: train LoRA adapters of this rank, not the linear maps' weights (0: none)."),
    ("lora_alpha", float, None, "With --lora_rank: LoRA's alpha; adapters scaled by alpha / rank (none: = rank)."),
    ("compile", bool, False, "Compile the model with torch.compile (faster steps after a slow first one)."),
    ("dtype", str, "auto", "Autocast: auto (CUDA: bfloat16, float16 on GPUs without it), bfloat16, float16, float32."),
    ("listops_depth", int, 10, "ListOps generator: the depth limit, operators only above it (LRA: 10)."),
    ("listops_args", str, "2,10", "ListOps generator: MIN,MAX arguments per operator (LRA: 2,10)."),
    ("listops_len", str, "500,2000", "ListOps generator: keep trees with MIN < length < MAX tokens, brackets not "
                                     "counted (LRA: 500,2000); also the default block_size."),
    ("listops_sizes", str, "96000,2000,2000", "ListOps generator: TRAIN,VAL,TEST numbers of trees."),
    ("recall_len", int, None, "mqar, copy, induction: tokens per example, also the default block_size (none: 64)."),
    ("recall_pairs", int, None, "mqar: key-value pairs per example; copy: data tokens to copy (none: 4)."),
    ("recall_vocab", int, None, "mqar, copy, induction: the vocabulary, ids 1..V-1 (none: mqar 128, copy and "
                                "induction 16)."),
    ("recall_sizes", str, None, "mqar, copy, induction: TRAIN,VAL,TEST numbers of examples (none: 100000,1000,3000)."),
]
DEFAULTS = {name: default for name, _, default, _ in FLAGS}
LISTOPS_FLAGS = ("listops_depth", "listops_args", "listops_len", "listops_sizes")
RECALL_FLAGS = ("recall_len", "recall_pairs", "recall_vocab", "recall_sizes")
TASK_FLAGS = LISTOPS_FLAGS + RECALL_FLAGS          # the generated tasks' own flags, passed to every task's loader
# those a task's --data_dir files make moot (the examples' number, shape and draw)
MOOT_WITH_FILES = {name: fn.generated_only for name, fn in data.TASKS.items() if fn.generated_only}
# Config fields a model keeps for the common interface but does not use: no flags of that model
UNUSED_FIELDS = {"transject": {"n_head": "TransJect has no attention heads (its --n_experts take their place)"}}


def unused_fields(name):
    """The common fields that a model's file leaves unused (TransJect's n_head), by its file: a second name for a
    model in MODELS (a fork's) too."""
    return UNUSED_FIELDS.get(MODELS[name][0] if name in MODELS else name, {})


# What each Config field means (--help): nanoGPT's common fields, then each model file's own, as commented there
COMMON_FIELDS = {
    "vocab_size": "token ids 0..vocab_size-1, id 0 is padding",
    "block_size": "the longest input sequence, idx.shape[-1]",
    "n_layer": "blocks, L",
    "n_head": "attention heads; n_embd must be a multiple",
    "n_embd": "the model's width d",
    "dropout": "dropout probability on the residual branches",
    "bias": "true or false: biases in the linear maps and norms",
    "head": '"cls": one sequence -> class, "match": a pair -> class, "lm": next token',
    "n_classes": "classes of a cls/match head (set by the task)",
}
FIELD_HELP = {
    "simpletron": {
        "attention": '"simple" (SimpleTRON), "softmax" (vanilla Transformer / GPT) or "softmax_naive" (the same '
                     "with its L x L scores written out: the naive baseline of speed tables)",
        "causal_scale": 'head lm, simple attention: y_t = Q_t (sum_{s<=t} K_s^T V_s) times 1/sqrt(t) ("sqrt_t"), '
                        '1/t ("t"), 1/sqrt(block_size) ("sqrt_block") or 1 ("none"); all but sqrt_t: our extension',
        "chunk": "head lm, simple attention: tokens per chunk of the causal form (speed and memory only)",
        "variant": '"simple" | "res" | "resl" (Table 1) | "vanilla" (ordinary block)',
        "norm": '"post": LayerNorm after each residual sum (Transformer/BERT, the paper\'s Fig. 4); "pre": '
                'LayerNorm before each sublayer (GPT-2, nanoGPT); "rezero": x + α f(x), α from 0, no LayerNorm '
                "(ReZero)",
        "orthogonal": "every weight matrix of the blocks orthogonal (Orthogonal Transformer)",
        "residual_init": "GPT-2: the projections into the residual stream at std 0.02/sqrt(2 n_layer)",
        "mlp_ratio": "MLP width = mlp_ratio * n_embd (Table 3: 256 -> 1024)",
        "freeze_qkv": "true: q/k/v are not trained (attention transfer, Section 4.2; --transfer_from sets it)",
        "layer_norm_eps": "every LayerNorm's eps (BERT: 1e-12)",
        "emb_norm": "a LayerNorm on the embeddings, word + position (BERT)",
        "final_norm": "a LayerNorm after the last block (BERT has none)",
        "learned_cls": "cls/match heads: prepend a learned CLS token; False: the ids carry their own CLS at "
                       "position 0 (BERT's [CLS]) and the head reads it there",
        "mlp_hidden": "MLP width; 0: mlp_ratio * n_embd (BERT's intermediate_size)",
        "checkpointing": "recompute each block in the backward pass instead of storing its activations",
    },
    "transject": {
        "n_head": "the interface's name; TransJect has no heads, its n_experts take their place",
        "n_embd": "d; token embedding and position encoding are d/2 each",
        "dropout": "on each residual branch",
        "bias": "b1, b2 of the orthogonal residual FFN (§3.4), and the output layers' biases",
        "n_experts": "E, experts per layer (eq. 3)",
        "sigma": 'Σ: "exact" (eigenvalues), "learned" (the paper\'s approximation), "random"',
        "sigma_loss_weight": 'weight of the reconstruction loss added to the task loss (sigma="learned")',
        "pool": 'cls/match: "mean" (IMDb, AG News) or "max" (LRA) over the real tokens (B.1)',
        "checkpointing": "recompute each layer in the backward pass instead of storing its activations",
    },
    "diffeqformer": {
        "n_layer": "solver steps on [0, 1] (the paper's layers); discrete: blocks",
        "style": '"gpt": LayerNorm, GELU, learned positions; "llama": RMSNorm, SwiGLU, RoPE',
        "weights": '"temporal": W(t) by hypernetworks (eq. 6); "shared": one W for all t',
        "time_dim": "d_t, the size of e(t) and of the hypernetworks' hidden layer",
        "time_freqs": "S: phi(t) has 2S + 1 features",
        "method": 'fixed-step solver: "euler" (the paper\'s), "midpoint", "rk4"',
        "checkpointing": "recompute each step in the backward pass instead of storing it",
        "discrete": "True: n_layer ordinary blocks with stored weights, block k = X + dt f_k(X)",
        "lora_r": "LoRA rank on every linear map of the blocks (0: none, all weights trainable)",
        "lora_scale": "LoRA's alpha / r",
    },
}


# ----------------------------------------------------------------------------------------------
# Presets: (model, task) -> settings; a model's (model, "*") entry holds for every task, and its (model, task)
# entry, where there is one, is laid over it. Keys are flags of train.py or fields of the model's Config.

# SimpleTRON's Table 3 on every LRA task: post-LN res blocks, batch 32, weight decay 0.1, dropout 0.1, rsqrt
# schedule; its softmax baseline is the same with vanilla blocks
SIMPLETRON_LRA = dict(batch_size=32, weight_decay=0.1, dropout=0.1, schedule="rsqrt", norm="post", variant="res")
# TransJect on LRA (appendix B.1): L=2, E=4, d=512, 50k steps, otherwise Chen et al. (2021, Skyformer)'s settings:
# batch 32, lr 1e-4, warm-up 1000, no weight decay (their linear decay: cosine to 0 here); max pooling but on text
TRANSJECT_LRA = dict(n_layer=2, n_experts=4, n_embd=512, batch_size=32, lr=1e-4, warmup=1000, schedule="cosine",
                     min_lr=0.0, weight_decay=0.0, max_iters=50_000)
# DiffEqFormer's GPT-small (Table 3: 12 layers, 768 wide, 12 heads, 1024 tokens) and its optimiser (C.4, C.5:
# AdamW beta2 0.95, weight decay 0.1, 1% warm-up, cosine to 0.1 lr, clip 1.0)
GPT_SMALL = dict(n_layer=12, n_head=12, n_embd=768, block_size=1024, lr=6e-4, weight_decay=0.1, beta2=0.95,
                 schedule="cosine", min_lr=0.1, grad_clip=1.0)

PRESETS = {
    "cpu": {   # small and fast: each trains in minutes on a 2-core CPU
        ("simpletron", "*"): dict(n_layer=2, n_head=4, n_embd=64, dropout=0.0, lr=1e-3, warmup=100,
                                  schedule="cosine", max_iters=1000, batch_size=16, eval_interval=250),
        # the main command (6 min, 36%): 64-token prefixes first, as full length sits at the prior for ~4,000 steps
        ("simpletron", "listops"): dict(n_layer=2, n_head=4, n_embd=64, dropout=0.0, lr=5e-4, warmup=100,
                                        schedule="cosine", max_iters=1500, batch_size=16, short_steps=400,
                                        short_len=64, eval_interval=500),
        ("softmax", "*"): dict(n_layer=2, n_head=4, n_embd=64, dropout=0.0, lr=1e-3, warmup=100,
                               schedule="cosine", max_iters=1000, batch_size=16, eval_interval=250),
        # PTB: DiffEqFormer vs GPT (pre-LN softmax) at equal shape, steps and optimiser; ~5 min each on 2 cores
        ("softmax", "ptb"): dict(n_layer=4, n_head=4, n_embd=128, block_size=64, dropout=0.0, lr=1e-3, beta2=0.95,
                                 warmup=15, schedule="cosine", min_lr=0.1, grad_clip=1.0, max_iters=1500,
                                 batch_size=16, eval_interval=500, norm="pre", variant="vanilla"),
        # DiffEqFormer's optimiser (appendix C.4, C.5): AdamW beta2 0.95, 1% warm-up, cosine to 0.1 lr, clip 1.0
        ("diffeqformer", "*"): dict(n_layer=2, n_head=4, n_embd=64, time_dim=8, dropout=0.0, lr=1e-3, beta2=0.95,
                                    warmup=10, schedule="cosine", min_lr=0.1, grad_clip=1.0, max_iters=1000,
                                    batch_size=16, eval_interval=250),
        ("diffeqformer", "ptb"): dict(n_layer=4, n_head=4, n_embd=128, time_dim=8, block_size=64, dropout=0.0,
                                      lr=1e-3, beta2=0.95, warmup=15, schedule="cosine", min_lr=0.1, grad_clip=1.0,
                                      max_iters=1500, batch_size=16, eval_interval=500),
        ("transject", "*"): dict(n_layer=2, n_embd=64, n_experts=4, dropout=0.0, lr=1e-3, warmup=100,
                                 schedule="cosine", max_iters=1000, batch_size=16, eval_interval=250),
        # TransJect pools by max on LRA, by mean on (byte-level) text (appendix B.1)
        **{("transject", t): dict(pool="max") for t in ("listops", "retrieval", "image", "pathfinder")},
    },
    "paper": {  # the papers' settings, for a GPU (SIMPLETRON_LRA, TRANSJECT_LRA, GPT_SMALL: above)
        # SimpleTRON, Table 3 (LRA). ListOps: 6 blocks, 8 heads, 512 wide (MLP 2048), lr 0.005, warm-up 1000, 15k
        ("simpletron", "listops"): dict(SIMPLETRON_LRA, n_layer=6, n_head=8, n_embd=512, lr=0.005, warmup=1000,
                                        max_iters=15_000),
        # classification (text, image, pathfinder): 4 blocks, 4 heads, 256 (MLP 1024), lr 0.05, warm-up 8000, 20k
        ("simpletron", "text"): dict(SIMPLETRON_LRA, n_layer=4, n_head=4, n_embd=256, lr=0.05, warmup=8000,
                                     max_iters=20_000),
        ("simpletron", "image"): dict(SIMPLETRON_LRA, n_layer=4, n_head=4, n_embd=256, lr=0.05, warmup=8000,
                                      max_iters=20_000),
        ("simpletron", "pathfinder"): dict(SIMPLETRON_LRA, n_layer=4, n_head=4, n_embd=256, lr=0.05, warmup=8000,
                                           max_iters=20_000),
        # matching (retrieval): 4 blocks, 4 heads, 128 (MLP 512), lr 0.05, warm-up 8000, 15k steps
        ("simpletron", "retrieval"): dict(SIMPLETRON_LRA, n_layer=4, n_head=4, n_embd=128, lr=0.05, warmup=8000,
                                          max_iters=15_000),
        ("softmax", "listops"): dict(SIMPLETRON_LRA, n_layer=6, n_head=8, n_embd=512, lr=0.005, warmup=1000,
                                     max_iters=15_000, variant="vanilla"),
        ("softmax", "text"): dict(SIMPLETRON_LRA, n_layer=4, n_head=4, n_embd=256, lr=0.05, warmup=8000,
                                  max_iters=20_000, variant="vanilla"),
        ("softmax", "image"): dict(SIMPLETRON_LRA, n_layer=4, n_head=4, n_embd=256, lr=0.05, warmup=8000,
                                   max_iters=20_000, variant="vanilla"),
        ("softmax", "pathfinder"): dict(SIMPLETRON_LRA, n_layer=4, n_head=4, n_embd=256, lr=0.05, warmup=8000,
                                        max_iters=20_000, variant="vanilla"),
        ("softmax", "retrieval"): dict(SIMPLETRON_LRA, n_layer=4, n_head=4, n_embd=128, lr=0.05, warmup=8000,
                                       max_iters=15_000, variant="vanilla"),
        # DiffEqFormer (GPT_SMALL above; d_t 20, S 128). The text lost lr, batch, dropout and steps: nanoGPT's
        # GPT-2 small values (6e-4, 0.5M tokens a step) for WikiText-103 and OpenWebText, a small batch for PTB
        # (1M tokens); an evaluation every 5% of the steps. The paper's GPT baseline (PTB): pre-LN softmax.
        ("diffeqformer", "ptb"): dict(GPT_SMALL, time_dim=20, time_freqs=128, dropout=0.1, warmup=20,
                                      max_iters=2000, batch_size=16, eval_interval=100),
        ("softmax", "ptb"): dict(GPT_SMALL, norm="pre", variant="vanilla", dropout=0.1, warmup=20, max_iters=2000,
                                 batch_size=16, eval_interval=100),
        ("diffeqformer", "wikitext103"): dict(GPT_SMALL, time_dim=20, time_freqs=128, dropout=0.0, warmup=500,
                                              max_iters=50_000, batch_size=32, grad_accum=16, eval_interval=2500),
        ("diffeqformer", "openwebtext"): dict(GPT_SMALL, time_dim=20, time_freqs=128, dropout=0.0, warmup=1000,
                                              max_iters=100_000, batch_size=32, grad_accum=16, eval_interval=5000),
        # TransJect, appendix B.1. Adam = AdamW without weight decay; a constant lr = cosine with min_lr 1.
        # IMDb, AG News: L=6, E=4, d=512, length 512, mean pooling, batch 32, Adam lr 5e-4 (0.9, 0.98, 1e-9),
        # 30 epochs (25k / 120k training examples)
        ("transject", "imdb"): dict(n_layer=6, n_experts=4, n_embd=512, block_size=512, pool="mean", batch_size=32,
                                    lr=5e-4, beta2=0.98, eps=1e-9, weight_decay=0.0, schedule="cosine", warmup=0,
                                    min_lr=1.0, max_iters=23_440),
        ("transject", "agnews"): dict(n_layer=6, n_experts=4, n_embd=512, block_size=512, pool="mean",
                                      batch_size=32, lr=5e-4, beta2=0.98, eps=1e-9, weight_decay=0.0,
                                      schedule="cosine", warmup=0, min_lr=1.0, max_iters=112_500),
        # PTB: L=6, d=512, 35 tokens in and out, Adam lr 0.01 (B.1 gives 5e-4, (0.9, 0.98), 1e-9 for IMDb and
        # AG News only; we keep those betas), 10 epochs of 929k tokens in batches of 32
        ("transject", "ptb"): dict(n_layer=6, n_experts=4, n_embd=512, block_size=35, batch_size=32, lr=0.01,
                                   beta2=0.98, eps=1e-9, weight_decay=0.0, schedule="cosine", warmup=0,
                                   min_lr=1.0, max_iters=8_300),
        ("transject", "listops"): dict(TRANSJECT_LRA, pool="max"),
        ("transject", "text"): dict(TRANSJECT_LRA, pool="mean"),
        ("transject", "retrieval"): dict(TRANSJECT_LRA, pool="max"),
        ("transject", "image"): dict(TRANSJECT_LRA, pool="max"),
        ("transject", "pathfinder"): dict(TRANSJECT_LRA, pool="max"),
    },
}


# ----------------------------------------------------------------------------------------------

def parse_args(argv, description=None):
    """train.py's flags in two passes: the first finds the model (or the --resume or --init_from checkpoint's),
    whose Config fields then become flags too. Returns (args, the names given, the Config fields' names)."""
    first = Parser(prog="train.py", add_help=False, fromfile_prefix_chars="@")
    for name in ("model", "out_dir", "init_from", "task", "preset", "listops_len"):
        first.add_argument(f"--{name}")
    first.add_argument("--resume", type=to_bool, nargs="?", const=True, default=False)
    known, _ = first.parse_known_args(argv)
    model_name = known.model or DEFAULTS["model"]
    if known.resume and known.out_dir and os.path.isfile(os.path.join(known.out_dir, "ckpt.pt")):
        model_name = load_checkpoint(os.path.join(known.out_dir, "ckpt.pt"))["model_name"]
    elif known.init_from and os.path.isfile(known.init_from):
        model_name = load_checkpoint(known.init_from)["model_name"]
    config_fields = dataclasses.fields(model_module(model_name).Config)
    shown = help_values(model_name, known.task, known.preset, known.listops_len)

    p = Parser(prog="train.py", description=description, formatter_class=argparse.RawDescriptionHelpFormatter,
               fromfile_prefix_chars="@")
    for name, typ, default, help in FLAGS:
        p.add_argument(f"--{name}", default=None, help=f"{help} [{shown.get(name, default)}]".replace("%", "%%"),
                       **(dict(type=to_bool, nargs="?", const=True) if typ is bool else dict(type=typ)))
    meaning, unused = {**COMMON_FIELDS, **FIELD_HELP[MODELS[model_name][0]]}, unused_fields(model_name)
    group = p.add_argument_group(
        f"model ({model_name}) Config fields; [the value for task {shown['task']}, preset {shown['preset']}]")
    for f in config_fields:
        typ = to_bool if f.type in (bool, "bool") else {"int": int, "float": float, "str": str}.get(f.type, f.type)
        group.add_argument(f"--{f.name}", type=typ, default=None, help=argparse.SUPPRESS if f.name in unused else
                           f"{meaning.get(f.name, '')} [{shown.get(f.name, f.default)}]".strip().replace("%", "%%"))
    args = p.parse_args(argv)
    given = {k for k, v in vars(args).items() if v is not None}
    for name in sorted(given & set(unused)):                  # a field the model has but does not use: the first
        raise UsageError(f"--{name}: {unused[name]}; it is no setting of --model {model_name}")
    for name, known_names in (("model", MODELS), ("task", data.TASKS), ("preset", PRESETS)):
        if getattr(args, name) is not None and getattr(args, name) not in known_names:
            raise UsageError(f"unknown {name} {getattr(args, name)!r}; choose one of: {', '.join(known_names)}")
    return args, given, [f.name for f in config_fields]


def preset_for(presets, model, task):
    """A preset's settings for this model and task: the model's (model, "*") entry, updated by (model, task)'s."""
    return {**presets.get((model, "*"), {}), **presets.get((model, task), {})}


def help_values(model, task, preset_name, listops_len=None):
    """The value each flag and Config field takes for this model, task and preset before the task's data is read
    (vocab_size, head and n_classes come from the data)."""
    model = model if model in MODELS else DEFAULTS["model"]
    task = task if task in data.TASKS else DEFAULTS["task"]
    preset_name = preset_name if preset_name in PRESETS else DEFAULTS["preset"]
    preset = preset_for(PRESETS[preset_name], model, task)
    values = {f.name: f.default for f in dataclasses.fields(model_module(model).Config)}
    length = inspect.signature(data.TASKS[task]).parameters.get("block_size")     # the task's own length
    if length is not None and length.default is not inspect.Parameter.empty:
        values["block_size"] = length.default
    values.update({k: f"from {task}" for k in ("vocab_size", "head", "n_classes")})
    values.update({**DEFAULTS, **MODELS[model][1], **preset, "model": model, "task": task, "preset": preset_name})
    if length is not None and length.default is None:       # a length the task derives from its other options
        longest = str(listops_len or values["listops_len"]).split(",")[-1].strip()     # checked later, not here
        values["block_size"] = (int(longest) if longest.isdigit() else "from --listops_len") if (
            task == "listops" and "block_size" not in preset) else values["block_size"]
    values["lr_decay_iters"] = values.get("lr_decay_iters") or f"max_iters = {values['max_iters']}"
    values["out_dir"] = values.get("out_dir") or f"out/{model}-{task}"
    return {k: "none" if v is None else v for k, v in values.items()}


def resolve(args, given, config_names, preset=None):
    """Fill every None of args: given flags > preset (the model and task's, or the one given) > DEFAULTS.
    Returns the Config overrides too."""
    model, task = args.model or DEFAULTS["model"], args.task or DEFAULTS["task"]
    if preset is None:
        preset = preset_for(PRESETS[args.preset or DEFAULTS["preset"]], model, task)
    unknown = (set(preset) - set(DEFAULTS) - set(config_names)) | (set(preset) & {"model", "task", "preset"})
    if unknown:                                              # (a fork's preset row with a typo)
        raise UsageError(f"config.PRESETS[{args.preset or DEFAULTS['preset']!r}] for {model} on {task} sets "
                         f"{sorted(unknown)[0]}: a row sets train.py's flags (but model, task, preset) and {model}'s "
                         "Config fields")
    for name in DEFAULTS:                                    # (model and task too: given, or the defaults)
        if name not in given:
            setattr(args, name, preset.get(name, DEFAULTS[name]))
    overrides = {k: v for k, v in preset.items() if k in config_names}
    overrides.update({k: getattr(args, k) for k in config_names if k in given})
    return overrides


# ----------------------------------------------------------------------------------------------
# Every check of the settings, before any data is read: one line naming the flag, its value and what is allowed

def check_args(args, typed=()):
    """Every flag of train.py once resolved: its value, the device exists, the folders can be made, a flag that
    needs another has it, and a run never writes over the run it starts from."""
    if args.init_from and not args.resume:
        source_dirs = {os.path.realpath(os.path.dirname(os.path.abspath(args.init_from))),   # (through links too)
                       os.path.dirname(os.path.realpath(args.init_from))}
        if os.path.realpath(args.out_dir) in source_dirs:
            raise UsageError(f"--out_dir {args.out_dir} holds the checkpoint of --init_from, whose metrics.json "
                             "and ckpt.pt this run would overwrite: choose another --out_dir")
    for name, *_ in FLAGS:
        check_value(name, getattr(args, name))
    if args.schedule == "rsqrt" and args.warmup < 1:
        raise UsageError(f"--warmup {args.warmup}: the rsqrt schedule divides by it, allowed is an integer >= 1")
    check_device(args.device)
    own = inspect.signature(data.TASKS[args.task]).parameters if args.task in data.TASKS else {}
    other = next((k for k in (*TASK_FLAGS, "tokenizer") if k not in own and (k in typed or getattr(args, k) !=
                                                                             DEFAULTS[k])), None)   # (a default typed)
    if other:                                                # (a generated task's flag given to another task)
        raise UsageError(f"--{other} {getattr(args, other)}: task {args.task} has no such setting; leave it out")
    if "tokenizer" in own:                                   # (a ./gpt2 folder is no matter to listops)
        check_tokenizer(args.tokenizer, args.task)
    for flag in ("out_dir", "cache_dir"):                    # folders this run writes (a read-only cache: read)
        if flag == "cache_dir" and not data.cache_dir_problem(args.cache_dir):
            continue
        if problem := data.writable_problem(getattr(args, flag)):   # (a link to nowhere, a loop of links too)
            raise UsageError(f"--{flag} {getattr(args, flag)}: {problem}")
    if args.eval_only and not args.init_from:
        raise UsageError("--eval_only needs --init_from CKPT, the checkpoint to evaluate")
    if args.lora_alpha is not None and not args.lora_rank:
        raise UsageError(f"--lora_alpha {args.lora_alpha:g} scales LoRA adapters, and there are none without "
                         "--lora_rank r: give both, or neither")
    if (args.steps is not None or args.lora_rank) and not (args.init_from or args.resume):
        raise UsageError("--steps N [--lora_rank r] needs --init_from CKPT, a checkpoint of the DiffEqFormer ODE")
    if args.transfer_from and args.model != "softmax":
        raise UsageError(f"--transfer_from copies a SimpleTRON's attention into --model softmax, not {args.model}")
    if args.attn_std_interval and args.model not in ("simpletron", "softmax"):
        raise UsageError(f"--attn_std_interval: the attention of simpletron.py's models (simpletron, softmax), "
                         f"not --model {args.model}")
    if args.transfer_from and data.file_problem(args.transfer_from):
        raise UsageError(f"--transfer_from {args.transfer_from} {data.file_problem(args.transfer_from)}")
    source = args.transfer_from and load_checkpoint(args.transfer_from)["model_name"]
    if source and source != "simpletron":
        raise UsageError(f"--transfer_from {args.transfer_from} holds a {source} model: the transfer copies a "
                         "SimpleTRON's q/k/v (SimpleTRON's Section 4.2); give a simpletron checkpoint")


def check_moot(args, typed, config):
    """A flag typed that would change nothing in this run is refused in one line naming what it acts with: a flag
    is honoured or refused, never dropped."""
    c = dataclasses.asdict(config)
    simple = (c.get("attention") == "simple", "simple attention (--model simpletron)")
    acts = {"gate_lr_scale": (args.model == "transject" or c.get("norm") == "rezero",
                              "scalar gates, which --model transject and --norm rezero have"),
            "lr_decay_iters": (args.schedule == "cosine", "--schedule cosine"),
            "min_lr": (args.schedule == "cosine", "--schedule cosine"),
            "short_len": (args.short_steps > 0, "--short_steps N"),
            "causal_scale": simple, "chunk": simple,
            "sigma_loss_weight": (c.get("sigma") == "learned", "--sigma learned"),
            "mlp_ratio": (not c.get("mlp_hidden"), "--mlp_hidden 0 (a width of its own replaces the ratio)"),
            "time_dim": (hyper := (c.get("weights") == "temporal" and not c.get("discrete")),
                         "W(t) by hypernetworks (--weights temporal, not --discrete true)"),
            "time_freqs": (hyper, "W(t) by hypernetworks (--weights temporal, not --discrete true)"),
            "lora_scale": (c.get("lora_r", 0) > 0, "--lora_r r (with --lora_rank, --lora_alpha sets the scale)"),
            "final_norm": (c.get("norm") != "rezero", "--norm post or pre (ReZero has no LayerNorm)"),
            "layer_norm_eps": (c.get("norm") != "rezero" or c.get("emb_norm"), "a LayerNorm (--norm post or pre, "
                                                                                 "or --emb_norm true)")}
    trains = next((k for k in ("max_iters", "lr", "schedule", "warmup", "min_lr", "lr_decay_iters", "weight_decay",
                               "beta1", "beta2", "eps", "grad_clip", "gate_lr_scale", "grad_accum", "eval_interval",
                               "log_interval", "attn_std_interval", "short_steps", "short_len", "time_limit",
                               "n_train", "dropout", "lora_rank", "lora_alpha", "eval_iters", "checkpointing", "seed",
                               "compile")
                  if k in typed), None) if args.eval_only else None
    if trains:
        raise UsageError(f"--{trains} {getattr(args, trains, c.get(trains))}: a setting of training, and --eval_only "
                         "trains nothing; leave it out")
    flag = next((k for k, (used, _) in acts.items() if k in typed and not used), None)
    if flag:
        raise UsageError(f"--{flag} {getattr(args, flag, c.get(flag))}: it acts only with {acts[flag][1]}, which this "
                         "run has not; leave it out")


def check_config(model_name, config_dict, values=True):
    """The model's settings (flags, preset or a checkpoint's): each value, then the model's Config itself."""
    for f in dataclasses.fields(model_module(model_name).Config) if values else ():
        if f.name in config_dict and not fits_field(f, config_dict[f.name]):   # ("false" from a file: not False)
            raise UsageError(f"--{f.name} {config_dict[f.name]!r}: allowed is {FIELD_KINDS[field_kind(f)][1]}")
    for name, value in config_dict.items() if values else ():
        check_value(name, value)
    try:
        return model_module(model_name).Config(**config_dict)
    except (TypeError, ValueError) as e:
        raise UsageError(f"bad model settings: {e}") from None


class SkipInit(torch.overrides.TorchFunctionMode):
    """torch.nn.init's functions skipped: a model built on the meta device has its shapes alone, and an init that
    reads a value (DiffEqFormer's) or draws on meta (torch loads its compiler for that: seconds) is not run."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__module__", None) == "torch.nn.init":
            return args[0] if args else kwargs["tensor"]
        return func(*args, **(kwargs or {}))


def count_weights(model_name, config_dict):
    """The model's number of weights, counted on the meta device (no memory); math.inf for a size past what torch
    can hold, 0 where it cannot be built there (a constructor that reads a tensor's values: .numpy(), .item())."""
    try:
        with torch.device("meta"), SkipInit():
            return sum(p.numel() for p in build_model(model_name, config_dict).parameters())
    except (ValueError, OverflowError, MemoryError):
        return math.inf
    except (RuntimeError, TypeError) as e:                   # a size that overflows (n_embd 2**62; torch's TypeError
        return math.inf if TOO_LARGE.search(str(e)) else 0  # past int64), or what meta cannot build
    except Refusal:                                          # the model's own check of its settings: its line
        raise
    except UsageError:
        return 0


def check_size(args, model_name, config):
    """Before any data is read: a run that cannot fit in this machine's memory, or asks for an absurd step, refused
    in one line. The memory is a lower bound: the weights (with their gradients and Adam's two moments when
    training all of them), counted on the meta device at one and two layers and extrapolated (every width counts:
    --mlp_ratio, --n_experts, --time_dim ...), and one float per position, width and layer (evaluating: per position
    and width) of the batch."""
    config = dataclasses.asdict(check_config(model_name, config, values=False))
    if args.steps is not None and "discrete" in config:      # --steps N: the ODE made N blocks of their own
        config = {**config, "n_layer": args.steps, "discrete": True}
    T, L, d = config["block_size"], config["n_layer"], config["n_embd"]
    tokens = args.batch_size * args.grad_accum * T
    if args.lora_rank > d:
        raise UsageError(f"--lora_rank {args.lora_rank}: above the width n_embd {d} an adapter is no longer of low "
                         "rank (nor smaller than the weight it adapts); use a rank up to it")
    if tokens > 2**30:                                       # (GPT-3 took 3.2M tokens a step)
        raise UsageError(f"--batch_size {args.batch_size} x --grad_accum {args.grad_accum} x --block_size {T} is "
                         f"{tokens:.3g} tokens a step, more than 2**30: lower --batch_size or --grad_accum")
    kind = torch.device(args.device).type
    have = (torch.cuda.get_device_properties(args.device).total_memory if kind == "cuda"
            else os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    try:
        p1, p2 = (count_weights(model_name, {**config, "n_layer": n}) for n in (1, 2))
    except Refusal:                                          # of 1 or 2 layers, maybe not of these: counted whole
        p1 = p2 = count_weights(model_name, config)          # (refused again if it is these settings it refuses)
    weights = p1 + (L - 1) * (p2 - p1) if max(p1, p2) < math.inf else math.inf
    floats = weights * (1 if args.eval_only or args.lora_rank else 4) + args.batch_size * T * d * (
        1 if args.eval_only else L)
    if 4 * floats > have:
        defaults = {f.name: f.default for f in dataclasses.fields(model_module(model_name).Config)}
        widths = "".join(f" --{k} {config[k]}" for k in ("mlp_ratio", "mlp_hidden", "n_experts", "time_dim")
                         if k in config and config[k] > defaults.get(k, 0))   # (its other widths, if above theirs)
        sizes = f"--batch_size {args.batch_size} --block_size {T} --n_layer {L} --n_embd {d}{widths}"
        if floats == math.inf:
            raise UsageError(f"{sizes}: the model has more weights than torch can count; lower them")
        raise UsageError(f"{sizes}: the {'evaluation' if args.eval_only else 'training'} needs at least "
                         f"{4 * floats / 2**30:.3g} GiB, more than the {have / 2**30:.3g} GiB of this {kind}; lower "
                         "them (--grad_accum makes a large batch of small ones)")


# a ValueError that says a size is past what torch or numpy can hold (count_weights' infinity), not a model's check
TOO_LARGE = re.compile(r"overflow|too big|maximum (possible|allowed) size", re.IGNORECASE)


def build_model(model_name, config_dict):
    """The model of these settings; a ValueError or AssertionError of its own Model(config) (a fork's check of its
    settings, say) one Refusal line with its message, as check_config makes a Config's one UsageError line; another
    error of its code (a fork's KeyError, say) one line naming its file and line. Sizes past what torch can hold, and
    on the meta device what meta cannot build, are raised as they are (count_weights judges them)."""
    model_config = check_config(model_name, config_dict, values=False)
    try:
        model = model_module(model_name).Model(model_config)
    except Exception as e:
        on_meta = torch.get_default_device().type == "meta"
        if (isinstance(e, (OverflowError, MemoryError)) or data.out_of_memory(e) or isinstance(e, UsageError)
                or isinstance(e, (ValueError, RuntimeError, TypeError)) and TOO_LARGE.search(str(e))
                or on_meta and isinstance(e, (RuntimeError, TypeError))):
            raise
        if not isinstance(e, (ValueError, AssertionError)):
            raise Refusal(data.loader_failure(f"model {model_name!r}: Model(config)", model_module(model_name).Model,
                                              e)) from None
        why = str(e) or f"assert {(traceback.extract_tb(e.__traceback__)[-1].line or '').removeprefix('assert ')}"
        raise Refusal(f"model {model_name!r} refuses these settings: {data.one_line(why, 200)}") from None
    if not isinstance(getattr(model, "config", None), type(model_config)):   # (train.py saves it beside the weights)
        raise Refusal(f"model {model_name!r}: {MODELS[model_name][0]}.py's Model keeps no .config, the Config it was "
                      "given (self.config = config: train.py reads and saves it; docs/architecture.md)")
    return model


def model_call(model_name, what, fn, *args, **kw):
    """fn(*args, **kw), a call into a model's code (its forward, generate, a fork's): an ordinary exception it raises
    (not running out of memory, not a line of ours) one Refusal line naming the model's file and line there."""
    try:
        return fn(*args, **kw)
    except (UsageError, data.DataError, MemoryError):
        raise
    except Exception as e:
        if data.out_of_memory(e):
            raise
        raise Refusal(data.loader_failure(f"model {model_name!r}: {what}", fn, e,
                                          model_module(model_name).__name__)) from None


def check_vocabulary(trained, now, task_name):
    """A checkpoint's characters or words (Task.vocabulary when it was trained) against the task's now: any change
    (a character the text lost shifts every id after it) is refused in one line naming the first id that moved."""
    if not trained or not now or list(trained) == list(now):
        return
    what, read = ("characters", "text") if isinstance(trained, str) else ("words", "training file")
    old, new = [*trained, None], [*now, None]
    i = next(i for i, (a, b) in enumerate(zip(old, new)) if a != b)
    raise UsageError(f"task {task_name}: the checkpoint's model was trained on {len(old) - 1:,} {what}, the {read} "
                     f"read now has {len(new) - 1:,} (id {i + 1} stood for {old[i]!r}, now for {new[i]!r}): its ids "
                     f"would mean other {what}; use the run's own data (--data_dir), or start a new run")


def load_checkpoint(path, need=()):
    """A train.py checkpoint, read with weights_only=True (tensors and plain values only), or a one-line
    UsageError that says what is wrong with the file. `need`: keys a --resume needs beyond the weights."""
    problem = data.file_problem(path)
    if problem:
        raise UsageError(f"no checkpoint at {path}" if problem == "does not exist" else f"checkpoint {path} {problem}")
    try:
        with warnings.catch_warnings():                     # torch warns about the pickle protocol of foreign files
            warnings.simplefilter("ignore")
            ckpt = torch.load(path, map_location="cpu", weights_only=True)
        if zipfile.is_zipfile(path):                         # torch.save's zip: bytes changed since, another CRC-32
            with zipfile.ZipFile(path) as z:                 # (the legacy format, torch < 1.6, has no checksum)
                if z.testzip() is not None:
                    raise zipfile.BadZipFile
    except Exception as e:                                   # torch's message is not passed on: it names an unsafe way
        why = ("it holds Python objects other than tensors and plain values, which are not loaded"
               if isinstance(e, pickle.UnpicklingError) and "Unsupported global" in str(e)
               else "truncated, damaged, or not written by torch.save")
        raise UsageError(f"{path} is not a readable train.py checkpoint ({why})") from None
    keys = ("model_name", "config", "model", "args", *need)
    kinds = {"model_name": str, "config": dict, "model": dict, "args": dict, "optimizer": dict, "iter": int}
    if not (isinstance(ckpt, dict) and all(k in ckpt and isinstance(ckpt[k], kinds.get(k, object)) for k in keys)
            and ckpt["model_name"] in MODELS and ("iter" not in need or ckpt["iter"] >= 0)
            and isinstance(ckpt["args"].get("task"), str)):
        raise UsageError(f"{path} is not a train.py checkpoint (it needs {', '.join(keys)}, with a model of: "
                         f"{', '.join(MODELS)})")
    if problem := args_problem(ckpt["args"]):
        raise UsageError(f"{path} is damaged: its {problem}")
    v, char = ckpt.get("vocabulary"), ckpt["args"].get("tokenizer") == "char"   # what its ids stand for, or None
    fits = isinstance(v, str) if char else isinstance(v, list) and all(isinstance(w, str) for w in v)
    if v is not None and not fits:
        raise UsageError(f"{path} is damaged: its record of what its ids stand for is not the " + (
            "characters of its --tokenizer char" if char else "list of words of its PTB run"))
    if v and (problem := recorded_problem(v, ckpt["config"].get("vocab_size"))):
        raise UsageError(f"checkpoint {path} is damaged: {problem}; use the run's other checkpoint or train again")
    cwd = ckpt.get("cwd")                                    # the folder the train.py that wrote it worked in
    if cwd is not None and not (isinstance(cwd, str) and os.path.isabs(cwd)):
        raise UsageError(f"{path} is damaged: its record 'cwd' is {data.one_line(repr(cwd), 40)}, not the absolute "
                         "folder train.py records")
    start = own_paths(ckpt["args"], os.path.dirname(path) or ".", cwd)   # its relative --data_dir, from there
    d = ckpt["args"].get("data_dir")
    if "optimizer" in need and start is None and isinstance(d, str) and not os.path.isabs(d):   # (a --resume)
        raise UsageError(f"{path}: its run read --data_dir {d} relative to the folder it was started in, which "
                         f"neither the checkpoint records (an older train.py's) nor its --out_dir "
                         f"{ckpt['args'].get('out_dir')} tells: --resume could read another {d}; continue it with "
                         f"--init_from {path} with --task and --data_dir in another --out_dir")
    return ckpt


def recorded_problem(recorded, vocab_size):
    """What is wrong with the characters or words a checkpoint records, or None. train.py records each character of
    the text (each word of the training file) once, sorted, id i for the i-th: ids 1 to len, within the model's."""
    what = "characters" if isinstance(recorded, str) else "words"
    twice = next((v for v, count in collections.Counter(recorded).items() if count > 1), None)
    if twice is not None:
        return f"its recorded {what} hold {twice!r} twice (a run records each once)"
    if list(recorded) != sorted(recorded):
        return f"its recorded {what} are out of order (a run records them sorted)"
    if isinstance(vocab_size, int) and len(recorded) + 1 > vocab_size:
        return (f"it records {len(recorded):,} {what} (ids 1 to {len(recorded):,}) but its model has "
                f"{vocab_size:,} ids")
    return None


def started_in(out_dir, folder):
    """The working folder a run was started in, from its --out_dir as recorded and the folder that run is in now;
    None where that cannot be told (an absolute --out_dir, one with '..', or a folder renamed since)."""
    if not isinstance(out_dir, str) or not out_dir or os.path.isabs(out_dir):
        return None
    parts = [p for p in os.path.normpath(out_dir).split(os.sep) if p != "."]
    if ".." in parts:
        return None
    start = os.path.abspath(folder)
    for part in reversed(parts):                             # out/x in /home/u/proj/out/x: /home/u/proj
        if os.path.basename(start) != part:
            return None
        start = os.path.dirname(start)
    return start


def own_paths(run_args, folder, cwd=None):
    """A checkpoint's recorded --data_dir and --cache_dir, which a run records as typed, relative to the folder it
    was started in: made absolute from that folder (found from its --out_dir and `folder`, where the run is now, or
    else `cwd`, the folder the checkpoint records it was written from), so that a --resume or --init_from started
    elsewhere reads the run's own data, not a file of the same name there. Returns that folder, or None where
    neither tells it (an older checkpoint, without `cwd`, of an absolute --out_dir): the paths are left as typed."""
    start = started_in(run_args.get("out_dir"), folder) or cwd
    for k in ("data_dir", "cache_dir"):
        path = run_args.get(k)
        if start is not None and isinstance(path, str) and path and not os.path.isabs(path):
            if os.path.normpath(os.path.join(start, path)) != os.path.abspath(path):   # (started here: as it is)
                run_args[k] = os.path.normpath(os.path.join(start, path))
    return start


def args_problem(a):
    """What is wrong with the flags a run recorded (its checkpoint's or metrics.json's args), or None."""
    paths = ("task", "data_dir", "cache_dir", "tokenizer")
    if k := next((k for k in paths if a.get(k) is not None and not isinstance(a[k], str)), None):
        return f"setting {k} is no string"
    if k := next((k for k, v in a.items() if v is None and DEFAULTS.get(k) is not None and k != "tokenizer"), None):
        return f"setting {k} is null, which train.py always fills"           # (the tokenizer may be none)
    kinds = {name: kind for name, kind, _, _ in FLAGS}       # a number as text, true for a number ...
    fits = {int: lambda v: type(v) is int, float: lambda v: type(v) in (int, float), bool: lambda v: type(v) is bool}
    if k := next((k for k, v in a.items() if v is not None and not fits.get(kinds.get(k), lambda v: True)(v)), None):
        return f"setting {k} is {data.one_line(repr(a[k]), 40)}, not the {kinds[k].__name__} train.py writes"
    for k, v in a.items():                                   # each within its range, as train.py checked it
        if k not in kinds:
            continue
        try:
            check_value(k, v)
        except UsageError:
            return (f"setting {k} is {data.one_line(repr(v), 40)}, where train.py allows "
                    f"{LIMITS.get(k, (None, 'a finite number'))[1]}: changed since, or written by another version")
    return None


def config_problem(model_name, config_dict):
    """check_config's line for a run's recorded model settings (without its --), or None."""
    try:
        check_config(model_name, config_dict)
    except UsageError as e:
        return str(e).removeprefix("--")
    return None


def model_of_checkpoint(ckpt, path):
    """The model of a checkpoint read by load_checkpoint: its config within the limits, its weights fitting the
    model and finite; otherwise one UsageError naming PATH."""
    try:
        check_config(ckpt["model_name"], ckpt["config"])   # every value within its limits
    except UsageError as e:                                  # (no flag of the user's: the file's setting)
        raise UsageError(f"{path}: its model settings are damaged ({str(e).removeprefix('--')})") from None
    weights = sum(w.numel() for w in ckpt["model"].values() if torch.is_tensor(w))
    try:                                                     # the settings' model counted first: it must hold them
        with torch.device("meta"):
            fits = sum(w.numel() for w in build_model(ckpt["model_name"], ckpt["config"]).state_dict().values()
                       if torch.is_tensor(w))               # (not a get_extra_state's dict)
    except (ValueError, OverflowError, MemoryError, TypeError):   # (TypeError: torch's, a size past int64)
        fits = math.inf
    except RuntimeError as e:                                # a size that overflows (block_size 2**62), or an init
        fits = math.inf if "overflow" in str(e) else 0      # that reads a value, not on meta (DiffEqFormer's)
    if fits > 2 * weights + 2**20:
        raise UsageError(f"{path}: its model settings make a model unlike its weights (damaged settings)")
    model = build_model(ckpt["model_name"], ckpt["config"])
    load_weights(model, ckpt["model"], path)
    return model


def load_weights(model, state, path):
    """The weights `state` into the model, fitting it and finite; otherwise one UsageError naming PATH."""
    try:
        model.load_state_dict(state)
    except (RuntimeError, TypeError, ValueError) as e:
        first = [line.strip() for line in str(e).splitlines() if line.strip()][:2]   # torch: a title, then the first
        raise UsageError(f"{path}: its weights do not fit the model ({data.one_line(' '.join(first), 200)})") from None
    now, weights = model.state_dict(), {k for k, _ in model.named_parameters(remove_duplicate=False)}
    if not all(not w.isnan().any() and (k not in weights or w.isfinite().all()) for k, w in now.items()
               if torch.is_tensor(w) and w.is_floating_point()):   # (a buffer may hold -inf: a causal mask)
        raise UsageError(f"{path}: a weight is not finite (nan or inf); use another checkpoint")
    tied = [k for k, w in state.items()                     # two names of one tensor (tied embeddings), two values
            if torch.is_tensor(w) and not torch.equal(now[k].cpu(), w.cpu().to(now[k].dtype))]
    if tied:
        raise UsageError(f"{path}: {tied[0]} disagrees with the weight it is tied to; the checkpoint was edited or "
                         "damaged, use another")
