"""
Train or evaluate any model of this project on any task, on one GPU or a CPU.

    python train.py --model simpletron --task listops              # the CPU preset: minutes on a laptop
    python train.py --model simpletron --task listops --preset paper --device cuda
    python train.py --model softmax --task ptb --data_dir DIR --n_layer 2   # DIR: ptb.{train,valid,test}.txt
    python train.py --help --model transject --task imdb [--preset paper]   # [the values this run would use]
    python train.py --resume --out_dir out/simpletron-listops     # continue a run exactly
    python train.py --init_from out/x/ckpt.pt --eval_only --task listops --data_dir lra/listops-1000
    torchrun --standalone --nproc_per_node=8 train.py --model softmax --task ptb --preset paper --batch_size 2

Settings are layered: the model's Config defaults < what the task fixes (vocabulary, length, head) <
the preset (--preset cpu|paper) < the flags you give. Every field of the model's Config is a flag.
The run writes out_dir/ckpt.pt (atomically, at every evaluation), out_dir/log.jsonl and
out_dir/metrics.json. Under torchrun (DistributedDataParallel, one device per process) --batch_size is per
process: N processes with batch b train as one process with batch N * b (docs/multigpu.md).
"""

import argparse
import contextlib
import dataclasses
import datetime
import importlib
import json
import math
import os
import pickle
import re
import sys
import time
import warnings

import numpy as np
import torch

if int(os.environ.get("RANK", 0)):                          # torchrun: progress bars on rank 0 only
    os.environ.setdefault("TQDM_DISABLE", "1")
from tqdm import tqdm  # noqa: E402

import data  # noqa: E402
from config import (MODELS, LIMITS, Parser, UsageError, check_value, model_module, pick_device,  # noqa: E402,F401
                    to_bool)

# Presets: (model, task) -> settings, "*" for every task. Keys are flags of train.py or Config fields.
PAPER_LRA = dict(batch_size=32, weight_decay=0.1, dropout=0.1, schedule="rsqrt", norm="post", variant="res")
PRESETS = {
    "cpu": {   # small and fast: each trains in minutes on a 2-core CPU
        ("simpletron", "*"): dict(n_layer=2, n_head=4, n_embd=64, dropout=0.0, lr=1e-3, warmup=100,
                                  schedule="cosine", max_iters=1000, batch_size=16, eval_interval=250),
        ("softmax", "*"): dict(n_layer=2, n_head=4, n_embd=64, dropout=0.0, lr=1e-3, warmup=100,
                               schedule="cosine", max_iters=1000, batch_size=16, eval_interval=250),
        # DiffEqFormer's optimiser (appendix C.4, C.5): AdamW beta2 0.95, 1% warm-up, cosine to 0.1 lr, clip 1.0
        ("diffeqformer", "*"): dict(n_layer=2, n_head=4, n_embd=64, time_dim=8, dropout=0.0, lr=1e-3, beta2=0.95,
                                    warmup=10, schedule="cosine", min_lr=0.1, grad_clip=1.0, max_iters=1000,
                                    batch_size=16, eval_interval=250),
        # PTB: DiffEqFormer vs GPT (pre-LN softmax) at equal shape, steps and optimiser; ~5 min each on 2 cores
        **{(m, "ptb"): dict(n_layer=4, n_head=4, n_embd=128, block_size=64, dropout=0.0, lr=1e-3, beta2=0.95,
                            warmup=15, schedule="cosine", min_lr=0.1, grad_clip=1.0, max_iters=1500, batch_size=16,
                            eval_interval=500, **extra)
           for m, extra in (("diffeqformer", dict(time_dim=8)), ("softmax", dict(norm="pre", variant="vanilla")))},
        # the README's main command: about 8 minutes here, ~35% test accuracy. 400 steps on 64-token prefixes
        # first: at full length the first ~4,000 steps sit at the label prior (17%) before anything is learned
        ("simpletron", "listops"): dict(n_layer=2, n_head=4, n_embd=64, dropout=0.0, lr=5e-4, warmup=100,
                                        schedule="cosine", max_iters=1500, batch_size=16, short_steps=400,
                                        short_len=64, eval_interval=500, time_limit=13.5),
        ("transject", "*"): dict(n_layer=2, n_embd=64, n_experts=4, dropout=0.0, lr=1e-3, warmup=100,
                                 schedule="cosine", max_iters=1000, batch_size=16, eval_interval=250),
        # TransJect pools by max on LRA, by mean on (byte-level) text (appendix B.1)
        **{("transject", t): dict(pool="max") for t in ("listops", "retrieval", "image", "pathfinder")},
    },
    "paper": {  # the papers' settings, for a GPU
        # DiffEqFormer: GPT-small of Table 3 (12 layers, 768, 12 heads; d_t 20, S 128) and the optimiser of C.4/C.5
        # (AdamW beta2 0.95, weight decay 0.1, 1% warm-up, cosine to 0.1 lr, clip 1.0). The text lost lr, batch,
        # dropout and steps: nanoGPT's GPT-2 small values (6e-4, 0.5M tokens a step) for WikiText-103 and
        # OpenWebText, a small batch for PTB (1M tokens). The GPT baseline of the paper: softmax, same shape.
        **{(m, t): dict(n_layer=12, n_head=12, n_embd=768, block_size=1024, lr=6e-4, weight_decay=0.1, beta2=0.95,
                        schedule="cosine", min_lr=0.1, grad_clip=1.0, eval_interval=iters // 20, max_iters=iters,
                        warmup=iters // 100, **batch, **extra)
           for t, iters, batch in (("ptb", 2000, dict(batch_size=16, dropout=0.1)),
                                   ("wikitext103", 50_000, dict(batch_size=32, grad_accum=16, dropout=0.0)),
                                   ("openwebtext", 100_000, dict(batch_size=32, grad_accum=16, dropout=0.0)))
           for m, extra in (("diffeqformer", dict(time_dim=20, time_freqs=128)),
                            ("softmax", dict(norm="pre", variant="vanilla")))
           if m == "diffeqformer" or t == "ptb"},
        # SimpleTRON Table 3 (LRA): ListOps 6 blocks, 8 heads, 512, MLP 2048, lr 0.005, warmup 1000, 15k steps
        ("simpletron", "listops"): dict(PAPER_LRA, n_layer=6, n_head=8, n_embd=512, lr=0.005, warmup=1000,
                                        max_iters=15_000),
        ("softmax", "listops"): dict(PAPER_LRA, n_layer=6, n_head=8, n_embd=512, lr=0.005, warmup=1000,
                                     max_iters=15_000, variant="vanilla"),
        # Classification (text, image, pathfinder): 4 blocks, 4 heads, 256, MLP 1024, lr 0.05, warmup 8000, 20k
        **{(m, t): dict(PAPER_LRA, n_layer=4, n_head=4, n_embd=256, lr=0.05, warmup=8000, max_iters=20_000,
                        **({"variant": "vanilla"} if m == "softmax" else {}))
           for m in ("simpletron", "softmax") for t in ("text", "image", "pathfinder")},
        # Matching (retrieval): 4 blocks, 4 heads, 128, MLP 512, lr 0.05, warmup 8000, 15k steps
        **{(m, "retrieval"): dict(PAPER_LRA, n_layer=4, n_head=4, n_embd=128, lr=0.05, warmup=8000,
                                  max_iters=15_000, **({"variant": "vanilla"} if m == "softmax" else {}))
           for m in ("simpletron", "softmax")},
        # TransJect, appendix B.1. Adam = AdamW without weight decay; a constant lr = cosine with min_lr 1.
        # IMDb, AG News: L=6, E=4, d=512, length 512, mean pooling, batch 32, Adam lr 5e-4 (0.9, 0.98, 1e-9),
        # 30 epochs (25k / 120k training examples)
        **{("transject", t): dict(n_layer=6, n_experts=4, n_embd=512, block_size=512, pool="mean", batch_size=32,
                                  lr=5e-4, beta2=0.98, eps=1e-9, weight_decay=0.0, schedule="cosine", warmup=0,
                                  min_lr=1.0, max_iters=iters)
           for t, iters in (("imdb", 23_440), ("agnews", 112_500))},
        # LRA: L=2, E=4, d=512, 50k steps, otherwise Chen et al. (2021, Skyformer)'s settings: batch 32, lr 1e-4,
        # warm-up 1000, no weight decay (their linear decay: cosine to 0 here); max pooling except on text
        **{("transject", t): dict(n_layer=2, n_experts=4, n_embd=512, batch_size=32, lr=1e-4, warmup=1000,
                                  schedule="cosine", min_lr=0.0, weight_decay=0.0, max_iters=50_000,
                                  pool="mean" if t == "text" else "max")
           for t in ("listops", "text", "retrieval", "image", "pathfinder")},
        # PTB: L=6, d=512, 35 tokens in and out, Adam lr 0.01 (B.1 gives 5e-4, (0.9, 0.98), 1e-9 for IMDb and
        # AG News only; we keep those betas), 10 epochs of 929k tokens in batches of 32
        ("transject", "ptb"): dict(n_layer=6, n_experts=4, n_embd=512, block_size=35, batch_size=32, lr=0.01,
                                   beta2=0.98, eps=1e-9, weight_decay=0.0, schedule="cosine", warmup=0,
                                   min_lr=1.0, max_iters=8_300),
    },
}

# --init_from_bert DIR: the shape is BERT's; the training defaults are BERT's fine-tuning (Devlin et al. 2019,
# A.3: AdamW lr 5e-5, batch 16, weight decay 0.01, 10% warm-up then decay; cosine to 0 here), 128 tokens
BERT_FINETUNE = dict(lr=5e-5, batch_size=16, weight_decay=0.01, warmup=100, schedule="cosine", min_lr=0.0,
                     max_iters=1000, eval_interval=250, block_size=128)
BERT_FOLDER = ("a Hugging Face BERT folder: config.json, model.safetensors or pytorch_model.bin, vocab.txt or "
               "tokenizer.json")
BERT_PIP = "--init_from_bert needs the safetensors and tokenizers packages: pip install safetensors tokenizers"

# Flags of train.py itself (the model's Config fields are added as flags too). None = not given.
FLAGS = [
    ("model", str, "simpletron", "model: " + ", ".join(MODELS)),
    ("task", str, "listops", "task: " + ", ".join(data.TASKS)),
    ("preset", str, "cpu", "settings to start from: cpu (minutes on a CPU) or paper (the papers' own)"),
    ("device", str, "auto", "auto (cuda, then mps, then cpu), cuda, mps or cpu"),
    ("max_iters", int, 1000, "optimiser steps"),
    ("batch_size", int, 16, "examples per micro-batch"),
    ("grad_accum", int, 1, "micro-batches per step (effective batch = batch_size * grad_accum)"),
    ("lr", float, 1e-3, "base learning rate"),
    ("schedule", str, "cosine", "rsqrt (SimpleTRON: lr * min(1, s/warmup) / sqrt(max(s, warmup))) or cosine"),
    ("warmup", int, 100, "warm-up steps"),
    ("min_lr", float, 0.1, "cosine: final learning rate as a fraction of lr"),
    ("lr_decay_iters", int, None, "cosine: steps over which lr decays"),
    ("weight_decay", float, 0.1, "AdamW weight decay (matrices and embeddings only)"),
    ("beta1", float, 0.9, "AdamW beta1"),
    ("beta2", float, 0.999, "AdamW beta2"),
    ("eps", float, 1e-8, "AdamW epsilon"),
    ("grad_clip", float, 1.0, "clip the gradient norm to this (0: off)"),
    ("gate_lr_scale", float, 30.0, "scalar gates (TransJect's a_l, ReZero's alpha): learning rate = lr * this"),
    ("eval_interval", int, 250, "evaluate on val and write the checkpoint every this many steps"),
    ("eval_iters", int, 20, "batches of val to evaluate during training (the end uses all of val and test)"),
    ("log_interval", int, 10, "print a log line every this many steps"),
    ("attn_std_interval", int, 0, "SimpleTRON / softmax: log each block's attention std on a fixed val batch "
                                  "every this many steps (0: off; SimpleTRON Fig. 5, analyze.py attnstd)"),
    ("short_steps", int, 0, "sequence-length warm-up: the first short_steps steps train on prefixes ..."),
    ("short_len", int, 64, "... of short_len tokens (classification tasks; escapes the long early plateau)"),
    ("time_limit", float, None, "stop training after this many minutes of wall time (data preparation included)"),
    ("out_dir", str, None, "where to write ckpt.pt, log.jsonl, metrics.json"),
    ("data_dir", str, None, "read the task from these files instead of downloading or generating it"),
    ("cache_dir", str, "data", "where generated and downloaded data are kept"),
    ("tokenizer", str, "gpt2", "BPE tasks: gpt2 (tiktoken), another tiktoken encoding, or byte"),
    ("n_train", int, None, "train on the first n training examples (language models: tokens)"),
    ("seed", int, 0, "seed of data order, dropout and initialisation"),
    ("resume", bool, False, "continue the run in out_dir from its ckpt.pt"),
    ("init_from", str, None, "start from this checkpoint's weights (a new run; see --eval_only)"),
    ("eval_only", bool, False, "with --init_from: evaluate on the task's val and test splits and stop"),
    ("init_from_bert", str, None, "fine-tune a pretrained BERT (Hugging Face folder) with a new classifier on its "
                                  "[CLS] state: --model softmax (BERT) or simpletron; --task agnews or imdb"),
    ("transfer_from", str, None, "--model softmax: copy this SimpleTRON checkpoint's q/k/v and freeze them"),
    ("steps", int, None, "with --init_from a DiffEqFormer: fine-tune its discretisation with N Euler steps"),
    ("lora_rank", int, 0, "with --steps: LoRA of this rank on every linear map, embeddings trainable (0: all)"),
    ("lora_alpha", float, None, "with --lora_rank: LoRA's alpha, scale alpha / rank (none: alpha = rank)"),
    ("compile", bool, False, "torch.compile the model"),
    ("listops_depth", int, 10, "ListOps generator: depth limit, operators only above it (LRA: 10)"),
    ("listops_args", str, "2,10", "ListOps generator: MIN,MAX arguments per operator (LRA: 2,10)"),
    ("listops_len", str, "500,2000", "ListOps generator: keep trees with MIN < length < MAX tokens, brackets not "
                                     "counted (LRA: 500,2000); also the default block_size"),
    ("listops_sizes", str, "96000,2000,2000", "ListOps generator: TRAIN,VAL,TEST numbers of trees"),
]
LISTOPS_FLAGS = ("listops_depth", "listops_args", "listops_len", "listops_sizes")


def parse_args(argv):
    """Two passes: the first finds the model, whose Config fields then become flags too."""
    first = Parser(prog="train.py", add_help=False)
    first.add_argument("--model", default="simpletron")
    first.add_argument("--resume", type=to_bool, nargs="?", const=True, default=False)
    first.add_argument("--out_dir")
    first.add_argument("--init_from")
    first.add_argument("--task")
    first.add_argument("--preset")
    first.add_argument("--listops_len")
    known, _ = first.parse_known_args(argv)
    model_name = known.model
    if known.resume and known.out_dir and os.path.isfile(os.path.join(known.out_dir, "ckpt.pt")):
        model_name = load_checkpoint(os.path.join(known.out_dir, "ckpt.pt"))["model_name"]
    elif known.init_from and os.path.isfile(known.init_from):
        model_name = load_checkpoint(known.init_from)["model_name"]
    module = model_module(model_name)
    config_fields = dataclasses.fields(module.Config)
    shown = help_values(model_name, known.task, known.preset, known.listops_len)

    p = Parser(prog="train.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for name, typ, default, help in FLAGS:
        if typ is bool:
            p.add_argument(f"--{name}", type=to_bool, nargs="?", const=True, default=None,
                           help=f"{help} [{shown.get(name, default)}]")
        else:
            p.add_argument(f"--{name}", type=typ, default=None, help=f"{help} [{shown.get(name, default)}]")
    meaning = field_meanings(module.Config)
    group = p.add_argument_group(
        f"model ({model_name}) Config fields; [the value for task {shown['task']}, preset {shown['preset']}]")
    for f in config_fields:
        typ = to_bool if f.type in (bool, "bool") else {"int": int, "float": float, "str": str}.get(f.type, f.type)
        group.add_argument(f"--{f.name}", type=typ, default=None,
                           help=f"{meaning.get(f.name, '')} [{shown.get(f.name, f.default)}]".strip())
    args = p.parse_args(argv)
    given = {k for k, v in vars(args).items() if v is not None}
    if args.model is not None and args.model not in MODELS:
        raise UsageError(f"unknown model {args.model!r}; choose one of: {', '.join(MODELS)}")
    if args.task is not None and args.task not in data.TASKS:
        raise UsageError(f"unknown task {args.task!r}; choose one of: {', '.join(data.TASKS)}")
    if args.preset is not None and args.preset not in PRESETS:
        raise UsageError(f"unknown preset {args.preset!r}; choose one of: {', '.join(PRESETS)}")
    return args, given, [f.name for f in config_fields]


# What nanoGPT's common Config fields mean (each model file comments its own fields; --help reads those comments)
COMMON_FIELDS = {
    "vocab_size": "token ids 0..vocab_size-1, id 0 is padding (set by the task)",
    "block_size": "the longest input sequence (the task's length unless given)",
    "n_layer": "blocks, L",
    "n_head": "attention heads; n_embd must be a multiple",
    "n_embd": "the model's width d",
    "dropout": "dropout probability on the residual branches",
    "bias": "true or false: biases in the linear maps and norms",
    "head": "cls (one sequence -> class), match (a pair -> class), lm (next token): set by the task",
    "n_classes": "classes of a cls/match head (set by the task)",
}


def field_meanings(config_class):
    """field -> one line of meaning: the comment beside the field in the model file's Config (and the lines of
    comment that continue it), or COMMON_FIELDS's line."""
    import inspect
    out, last = dict(COMMON_FIELDS), None
    for line in inspect.getsource(config_class).splitlines()[1:]:
        field = re.match(r"\s*(\w+)\s*:\s*[\w\[\], .|]+=\s*[^#]*?#\s*(.*)", line)
        more = re.match(r"\s*#\s*(.*)", line)
        if field:
            last, text = field.group(1), field.group(2).strip()
            out[last] = f"{COMMON_FIELDS[last]} ({text})" if last in COMMON_FIELDS and len(text) < 20 else text
        elif more and last and not re.match(r"\s*#\s*(nanoGPT|the task|this model)", line):
            out[last] += " " + more.group(1).strip()
        else:
            last = None
    return out


def preset_for(presets, model, task):
    """A preset's settings for this model and task: the model's (model, "*") entry, updated by (model, task)'s."""
    return {**presets.get((model, "*"), {}), **presets.get((model, task), {})}


def help_values(model, task, preset_name, listops_len=None):
    """The value each flag and Config field takes for this model, task and preset before the task's data is read
    (vocab_size, head and n_classes come from the data)."""
    import inspect
    defaults = {name: default for name, _, default, _ in FLAGS}
    model = model if model in MODELS else defaults["model"]
    task = task if task in data.TASKS else defaults["task"]
    preset_name = preset_name if preset_name in PRESETS else defaults["preset"]
    presets = PRESETS[preset_name]
    preset = preset_for(presets, model, task)
    values = {f.name: f.default for f in dataclasses.fields(model_module(model).Config)}
    length = inspect.signature(data.TASKS[task]).parameters.get("block_size")
    if length is not None and length.default is not inspect.Parameter.empty:
        values["block_size"] = length.default
    for k in ("vocab_size", "head", "n_classes"):
        values[k] = f"from {task}"
    values.update({**defaults, **MODELS[model][1], **preset, "model": model, "task": task, "preset": preset_name})
    if length is not None and length.default is None:       # a length the task derives from its other options
        values["block_size"] = (int(str(listops_len or values["listops_len"]).split(",")[-1]) if task == "listops"
                                and "block_size" not in preset else values["block_size"])
    if values.get("lr_decay_iters") is None:
        values["lr_decay_iters"] = f"max_iters = {values['max_iters']}"
    if values.get("out_dir") is None:
        values["out_dir"] = f"out/{model}-{task}"
    return {k: "none" if v is None else v for k, v in values.items()}


def resolve(args, given, config_names, preset=None):
    """Fill every None of args: given flags > preset (the task's, or the one given) > defaults. Returns the Config
    overrides too."""
    defaults = {name: default for name, _, default, _ in FLAGS}
    model = args.model or defaults["model"]
    task = args.task or defaults["task"]
    presets = PRESETS[args.preset or defaults["preset"]]
    if preset is None:
        preset = preset_for(presets, model, task)
    unknown = (set(preset) - set(defaults) - set(config_names)) | (set(preset) & {"model", "task", "preset"})
    assert not unknown, f"preset for {model}/{task} sets unknown fields {unknown}"
    for name in defaults:                                    # (model and task too: given, or the defaults)
        if name not in given:
            setattr(args, name, preset.get(name, defaults[name]))
    overrides = {k: v for k, v in preset.items() if k in config_names}
    overrides.update({k: getattr(args, k) for k in config_names if k in given})
    return overrides


def check_args(args):
    """Every flag of train.py, checked before any data is read: one line naming the flag, its value and what
    is allowed. Also: the device exists, the folders can be made, and flags that need another are given."""
    for name, *_ in FLAGS:
        check_value(name, getattr(args, name))
    if args.schedule == "rsqrt" and args.warmup < 1:
        raise UsageError(f"--warmup {args.warmup}: the rsqrt schedule divides by it, allowed is an integer >= 1")
    if args.device.startswith("cuda"):
        index = int(args.device.partition(":")[2] or 0)
        if not torch.cuda.is_available() or index >= torch.cuda.device_count():
            raise UsageError(f"--device {args.device}: no such CUDA device here ({torch.cuda.device_count()} GPUs); "
                             "use --device cpu (or auto)")
    if args.device == "mps" and not torch.backends.mps.is_available():
        raise UsageError("--device mps: Apple's MPS is not available here; use --device cpu (or auto)")
    data.check_tokenizer(args.tokenizer, args.task)
    for flag in ("out_dir", "cache_dir"):                    # folders this run writes
        path = os.path.abspath(getattr(args, flag))
        while not os.path.exists(path):
            path = os.path.dirname(path)
        if not os.path.isdir(path) or not os.access(path, os.W_OK | os.X_OK):
            raise UsageError(f"--{flag} {getattr(args, flag)}: {path} is not a folder this run can write in")
    if args.eval_only and not args.init_from:
        raise UsageError("--eval_only needs --init_from CKPT, the checkpoint to evaluate")
    if (args.steps is not None or args.lora_rank) and not (args.init_from or args.resume):
        raise UsageError("--steps N [--lora_rank r] needs --init_from CKPT, a checkpoint of the DiffEqFormer ODE")
    if args.transfer_from and args.model != "softmax":
        raise UsageError(f"--transfer_from copies a SimpleTRON's attention into --model softmax, not {args.model}")
    if args.attn_std_interval and args.model not in ("simpletron", "softmax"):
        raise UsageError(f"--attn_std_interval: the attention of simpletron.py's models (simpletron, softmax), "
                         f"not --model {args.model}")
    if args.transfer_from and data.file_problem(args.transfer_from):
        raise UsageError(f"--transfer_from {args.transfer_from} {data.file_problem(args.transfer_from)}")


def check_config(config_dict):
    """The model's settings (flags, preset or a checkpoint's), checked before any data is read."""
    for name, value in config_dict.items():
        check_value(name, value)


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
    except Exception as e:                                   # torch's message is not passed on: it names an unsafe way
        why = ("it holds Python objects other than tensors and plain values, which are not loaded"
               if isinstance(e, pickle.UnpicklingError) and "Unsupported global" in str(e)
               else "truncated, damaged, or not written by torch.save")
        raise UsageError(f"{path} is not a readable train.py checkpoint ({why})") from None
    keys = ("model_name", "config", "model", "args", *need)
    if not (isinstance(ckpt, dict) and all(k in ckpt for k in keys) and ckpt["model_name"] in MODELS
            and all(isinstance(ckpt[k], dict) for k in ("config", "model", "args"))
            and isinstance(ckpt["args"].get("task"), str)):
        raise UsageError(f"{path} is not a train.py checkpoint (it needs {', '.join(keys)}, with a model of: "
                         f"{', '.join(MODELS)})")
    return ckpt


def load_weights(model, state, path):
    try:
        model.load_state_dict(state)
    except (RuntimeError, TypeError, ValueError) as e:
        first = [line.strip() for line in str(e).splitlines() if line.strip()][:2]   # torch: a title, then the first
        raise UsageError(f"{path}: its weights do not fit the model ({data.one_line(' '.join(first), 200)})") from None


def read_bert(args, given):
    """--init_from_bert DIR: (config.json as a dict, the state dict). The task is then tokenised by DIR's WordPiece
    (--tokenizer DIR). Every problem is one UsageError, before any work."""
    folder, model, task = args.init_from_bert, args.model or "simpletron", args.task or "listops"
    if model not in ("simpletron", "softmax"):
        raise UsageError(f"--init_from_bert loads BERT into --model simpletron or softmax, not {model}")
    if task not in data.WORDPIECE_TASKS:
        raise UsageError(f"--init_from_bert fine-tunes on the text tasks {', '.join(data.WORDPIECE_TASKS)}, "
                         f"not {task}")
    for flag in ("init_from", "transfer_from", "steps", "eval_only"):
        if flag in given and getattr(args, flag):
            raise UsageError(f"--init_from_bert starts a new run from BERT's weights: drop --{flag}")
    if "tokenizer" in given and os.path.abspath(args.tokenizer) != os.path.abspath(folder):
        raise UsageError(f"--init_from_bert tokenises with {folder}'s own WordPiece: drop --tokenizer")
    if not os.path.isdir(folder):
        raise UsageError(f"--init_from_bert {folder} is not a folder; give {BERT_FOLDER}")
    try:
        with open(os.path.join(folder, "config.json")) as f:
            config = json.load(f)
        need = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                "max_position_embeddings")
        missing = [k for k in need if k not in config]
    except (OSError, ValueError, TypeError) as e:
        raise UsageError(f"--init_from_bert {folder}: cannot read config.json ({e}); give {BERT_FOLDER}") from None
    if missing:
        raise UsageError(f"--init_from_bert {folder}: config.json has no {', '.join(missing)}: not a BERT config")
    if not any(os.path.isfile(os.path.join(folder, f)) for f in ("vocab.txt", "tokenizer.json")):
        raise UsageError(f"--init_from_bert {folder} has neither vocab.txt nor tokenizer.json; give {BERT_FOLDER}")
    try:
        import tokenizers  # noqa: F401  (the task's WordPiece, in data.py)
    except ImportError:
        raise UsageError(BERT_PIP) from None
    path = os.path.join(folder, "model.safetensors")
    try:
        if os.path.isfile(path):
            try:
                import safetensors.torch
            except ImportError:
                raise UsageError(BERT_PIP) from None
            state_dict = safetensors.torch.load_file(path)
        elif os.path.isfile(path := os.path.join(folder, "pytorch_model.bin")):
            state_dict = torch.load(path, map_location="cpu", weights_only=True)
        else:
            raise UsageError(f"--init_from_bert {folder} has neither model.safetensors nor pytorch_model.bin; "
                             f"give {BERT_FOLDER}")
    except UsageError:
        raise
    except Exception as e:
        raise UsageError(f"--init_from_bert: cannot read {path} ({type(e).__name__}: {data.one_line(e, 200)})") \
            from None
    if not isinstance(state_dict, dict) or not all(isinstance(v, torch.Tensor) for v in state_dict.values()):
        raise UsageError(f"--init_from_bert: {path} is not a state dict of tensors")
    args.tokenizer = folder
    given.add("tokenizer")
    return config, state_dict


def bert_model(bert, model_name, overrides, device="cpu"):
    """The model of --init_from_bert: BERT's weights, Config overrides on top (on the meta device: a check alone)."""
    import simpletron
    try:
        with torch.device(device):
            return simpletron.from_bert(bert[1], bert[0], **{**MODELS[model_name][1], **overrides})
    except (TypeError, ValueError) as e:
        raise UsageError(f"--init_from_bert: {e}") from None


def make_config(model_name, config_dict):
    try:
        return model_module(model_name).Config(**config_dict)
    except (TypeError, ValueError) as e:
        raise UsageError(f"bad model settings: {e}") from None


def build_model(model_name, config_dict):
    return model_module(model_name).Model(make_config(model_name, config_dict))


def save_checkpoint(path, state):
    data.atomic_write(path, lambda f: torch.save(state, f))  # a crash or a full disk never leaves half a file


def learning_rate(args, step):                              # step counts from 1
    if args.schedule == "rsqrt":                             # SimpleTRON (Table 3)
        return args.lr * min(1.0, step / args.warmup) / math.sqrt(max(step, args.warmup))
    if step < args.warmup:                                   # cosine: linear warm-up ...
        return args.lr * step / args.warmup
    horizon = args.lr_decay_iters or args.max_iters          # ... then cosine down to min_lr * lr
    progress = min(1.0, (step - args.warmup) / max(1, horizon - args.warmup))
    return args.lr * (args.min_lr + (1 - args.min_lr) * 0.5 * (1 + math.cos(math.pi * progress)))


def make_optimizer(model, args, device):
    """AdamW with three groups: matrices and embeddings (weight decay), vectors (biases, norms: none), and
    scalar gates (0-dim: TransJect's a_l, ReZero's alpha; no decay, lr * gate_lr_scale). Adam moves every
    parameter by about its lr per step whatever the gradient's size, so at the base lr a scalar gate could move
    only sum_s lr_s (about 0.8 over 1,500 steps at lr 1e-3): too little for alpha_l = sigmoid(a_l) to leave its
    start. Its own lr lets it reach its useful range; train.py reports each gate against that ceiling."""
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]              # matrices and embeddings
    no_decay = [p for p in params if p.dim() == 1]           # biases, norms
    gates = [p for p in params if p.dim() == 0]              # scalar gates
    groups = [{"params": decay, "weight_decay": args.weight_decay, "lr_scale": 1.0},
              {"params": no_decay, "weight_decay": 0.0, "lr_scale": 1.0},
              {"params": gates, "weight_decay": 0.0, "lr_scale": args.gate_lr_scale}]
    return torch.optim.AdamW(groups, lr=args.lr, betas=(args.beta1, args.beta2), eps=args.eps,
                             fused=device in ("cuda", "cpu"))              # one kernel for all parameters


def gate_report(model, start, args, steps):
    """Each scalar gate: its start, its value now and the farthest Adam could have moved it, sum_s lr_s * scale
    (a step of Adam is at most about lr). A gate that used most of that budget is held back by its step size."""
    budget = args.gate_lr_scale * sum(learning_rate(args, s) for s in range(1, steps + 1))
    out = {}
    for name, p in model.named_parameters():
        if p.dim() == 0 and name in start:
            moved = p.item() - start[name]
            out[name] = {"start": start[name], "value": p.item(), "budget": budget,
                         "used": abs(moved) / budget if budget else 0.0}
    return out


@torch.no_grad()
def evaluate(model, split, batch_size, device, autocast, max_batches=None, seed=1234, dist=None, progress=None):
    """Loss and accuracy (cls, match) or perplexity (lm) over a split, or over max_batches fixed batches.
    dist (torchrun): each process evaluates its share of every batch of batch_size and the sums are added over
    the processes, so the metrics are one process's with that batch. progress: title of a progress bar."""
    model.eval()
    if max_batches is None:
        batches, n_batches = split.batches(batch_size), -(-len(split) // batch_size)
    else:
        rng = np.random.default_rng(seed)
        batches, n_batches = (split.sample(batch_size, rng) for _ in range(max_batches)), max_batches
    if progress:                                             # on a terminal only
        batches = tqdm(batches, desc=progress, total=n_batches, unit="batch", leave=False, disable=None)
    total_loss, correct, count = 0.0, 0, 0
    for x, y in batches:
        if dist is not None:
            x, y = dist.share(x), dist.share(y)
            if not len(y):                                   # a last batch with fewer examples than processes
                continue
        x, y = x.to(device), y.to(device)
        with autocast:
            logits, loss = model(x, y)
        n = y.numel()
        total_loss += loss.item() * n
        if logits.dim() == 2:
            correct += (logits.argmax(-1) == y).sum().item()
        count += n
    if dist is not None:
        total_loss, correct, count = dist.sum(total_loss, correct, count)
        correct, count = int(correct), int(count)
    model.train()
    out = {"loss": total_loss / count, "n": count}
    if isinstance(split, data.LMSplit):
        out["ppl"] = math.exp(out["loss"])
    else:
        out["acc"] = correct / count
    return out


@torch.no_grad()
def attention_std(model, x):
    """SimpleTRON's Fig. 5, per block, on the ids x (B, L): the standard deviation of the attention weights as the
    paper defines them, Q K^T / sqrt(n) for SimpleTRON (n real tokens) and Q K^T / sqrt(d) for softmax (the
    softmax left out), over every real (query, key) pair (s <= t when causal); and the standard deviation of
    the attention sublayer's output (B, L, D) over the real tokens. Written out dense: a measurement, not the
    model's path. Returns {"score_std": [one per block], "attn_std": [...]}."""
    was_training, seen = model.training, []
    model.eval()
    hooks = [block.attn.register_forward_hook(lambda module, inputs, output: seen.append((module, *inputs, output)))
             for block in model.blocks]
    try:
        model(x)
    finally:
        for h in hooks:
            h.remove()
        model.train(was_training)
    score_std, attn_std = [], []
    for attn, h, mask, y in seen:                            # h (B, L, D) the block's input to attention
        B, L, D = h.shape
        H = attn.n_head
        q, k, _ = (z.view(B, L, H, D // H).transpose(1, 2).double() for z in attn.qkv(h).split(D, dim=2))
        real = torch.ones(B, L, dtype=torch.bool, device=h.device) if mask is None else mask
        pairs = real[:, None, :, None] & real[:, None, None, :]              # (B, 1, L, L)
        if attn.causal:
            pairs = pairs & torch.ones(L, L, dtype=torch.bool, device=h.device).tril()
        if attn.kind == "simple":                            # n: real tokens (causal: the prefix length t)
            n = (torch.arange(1, L + 1, device=h.device).double()[None, None, :, None] if attn.causal
                 else real.sum(1).double()[:, None, None, None])
        else:
            n = torch.tensor(float(D // H))
        scores = q @ k.transpose(-2, -1) / n.sqrt()          # (B, H, L, L)
        score_std.append(scores[pairs.expand(B, H, L, L)].std().item())
        attn_std.append(y[real].double().std().item())       # over the real tokens' (D) outputs
    return {"score_std": score_std, "attn_std": attn_std}


class Distributed:
    """The processes of one torchrun launch (DistributedDataParallel, one device each: cuda:LOCAL_RANK with
    nccl, or the CPU with gloo). Without torchrun: one process, rank 0 of 1, and every method does nothing."""

    def __init__(self, device):
        self.on = "RANK" in os.environ and "WORLD_SIZE" in os.environ     # set by torchrun
        self.rank, self.world = (int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])) if self.on else (0, 1)
        self.master, self.device = self.rank == 0, device
        self.local_rank = int(os.environ.get("LOCAL_RANK", 0))          # the process's number on its machine
        if not self.on:
            return
        if device not in ("cuda", "cpu"):
            raise UsageError(f"torchrun runs train.py on --device cuda (nccl) or cpu (gloo), not {device}")
        if device == "cuda":
            if self.local_rank >= torch.cuda.device_count():
                raise UsageError(f"--nproc_per_node is more than the {torch.cuda.device_count()} GPUs of this machine")
            torch.cuda.set_device(self.local_rank)           # "cuda" is now this process's own GPU
        torch.distributed.init_process_group("nccl" if device == "cuda" else "gloo")
        # where the others wait while rank 0 prepares the data: as long as that takes (a download: hours)
        self.waiting_room = torch.distributed.new_group(backend="gloo", timeout=datetime.timedelta(days=1))

    def share(self, x):
        """This process's part of a global batch (dim 0); the parts in rank order make up the batch."""
        return x.tensor_split(self.world)[self.rank] if self.on else x

    def sum(self, *values):
        """Each value summed over the processes."""
        if not self.on:
            return values
        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        torch.distributed.all_reduce(t)
        return t.tolist()

    def any(self, flag):
        """True on every process if flag is True on one (so that all stop at the same step)."""
        return self.sum(float(flag))[0] > 0 if self.on else flag

    def rank0_first(self, fn):
        """fn() on rank 0, then on the first process of each other machine, then on the rest: data is generated,
        downloaded and cached by one process at a time (once if the machines share --cache_dir, else once per
        machine), and read from that cache by the others. If fn fails, all stop (the one that failed says why)."""
        if not self.on:
            return fn()
        out, turn = None, 0 if self.master else 1 if self.local_rank == 0 else 2
        for t in range(3):
            if t == turn:
                try:
                    out = fn()
                except BaseException:
                    self._failed(True)
                    raise
            if self._failed(False):
                raise SystemExit(2)
        return out

    def _failed(self, failed):
        flag = torch.tensor([float(failed)])
        torch.distributed.all_reduce(flag, group=self.waiting_room)
        return flag.item() > 0


def per_second(count, seconds):
    """A rate; 0 before any time has passed (a resumed run that has no step left)."""
    return count / seconds if seconds > 0 else 0.0


def build_every_split(task, eval_only, n_train):
    """Every split the run reads, built in full (a sharded split: all its shards, cached), so that under torchrun
    rank 0 makes them before the other processes read its cache: test and val, and train (its first n_train
    examples) unless the run only evaluates."""
    for name in ("train", "val", "test"):
        if task.has(name) and not (name == "train" and eval_only):
            split = task.split(name)
            split = split.subset(n_train) if name == "train" and n_train is not None else split
            getattr(split, "full", lambda: None)()


def seconds_left(steps_left, seconds, steps):
    """The time the remaining steps take at the pace of the last `steps` steps, which took `seconds`."""
    return steps_left * seconds / steps


def step_seed(seed, it, rank):
    """torch's seed for the dropout of step `it` on process `rank`: a function of (seed, it, rank) alone, so that a
    resumed run replays it, and distinct for every (seed, it, rank) of a run (it < 1_000_003, rank < 2 ** 20)."""
    return seed * 1_000_003 + it + rank * 2 ** 40


def past_time_limit(minutes, seconds):
    """Whether a run `seconds` old has passed its --time_limit of `minutes` (None: no limit)."""
    return minutes is not None and seconds > 60 * minutes


def unused_parameters(model, x, y, autocast):
    """The trainable parameters that a training step leaves without a gradient (DDP must be told of them)."""
    with autocast:
        _, loss = model(x, y)
    loss.backward()
    unused = [name for name, p in model.named_parameters() if p.requires_grad and p.grad is None]
    model.zero_grad(set_to_none=True)
    return unused


def fmt(metrics):
    return " | ".join((f"{k} {v:.4f}" if v == 0 or abs(v) >= 1e-3 else f"{k} {v:.3g}") if isinstance(v, float)
                      else f"{k} {v}" for k, v in metrics.items())


def main(argv=None):
    t_start = time.time()
    args, given, config_names = parse_args(sys.argv[1:] if argv is None else argv)

    ckpt = source = None
    if args.init_from:                                       # its model, and its task unless --task is given
        source = load_checkpoint(args.init_from)
        args.model = source["model_name"]
        if args.task is None:                                # the same task: its data from the same place
            args.task = source["args"]["task"]
            for k in ("data_dir", "cache_dir", "tokenizer", *LISTOPS_FLAGS):
                if k not in given and k in source["args"]:
                    setattr(args, k, source["args"][k])
                    given.add(k)
        given |= {"model", "task"}
    batch_given = "batch_size" in given
    if args.resume:                                          # the run's own flags, updated by the given ones
        if args.out_dir is None:
            raise UsageError("--resume needs --out_dir, the folder of the run to continue")
        ckpt = load_checkpoint(os.path.join(args.out_dir, "ckpt.pt"), need=("optimizer", "iter"))
        for k, v in ckpt["args"].items():
            if k not in given:
                setattr(args, k, v)
        given |= set(ckpt["args"])
    bert = None
    if args.init_from_bert and ckpt is None:                 # SimpleTRON's Section 5.3: a pretrained BERT
        bert = read_bert(args, given)
    overrides = resolve(args, given, config_names, BERT_FINETUNE if bert else None)
    if bert is not None:                                     # BERT's shape with the flags given: checked now
        overrides = dataclasses.asdict(bert_model(bert, args.model, overrides, "meta").config)
    if args.init_from:                                       # never write over the run we start from
        source_dir = os.path.dirname(os.path.abspath(args.init_from))
        args.out_dir = args.out_dir or os.path.relpath(source_dir + ("-eval" if args.eval_only else "-finetune"))
        if os.path.abspath(args.out_dir) == source_dir and not args.resume:
            raise UsageError(f"--out_dir {args.out_dir} holds the checkpoint of --init_from, whose metrics.json "
                             "and ckpt.pt this run would overwrite: choose another --out_dir")
    args.out_dir = args.out_dir or os.path.join("out", f"{args.model}-{args.task}")

    check_args(args)                                         # every flag, before any data is read
    args.device = pick_device(args.device)
    device = args.device
    dist = Distributed(device)                               # torchrun's processes, or this one alone
    if ckpt is not None and ckpt.get("world_size", 1) != dist.world and not batch_given:
        global_batch = args.batch_size * ckpt.get("world_size", 1)    # resumed on another number of processes
        if global_batch % dist.world:
            raise UsageError(f"{args.out_dir} was trained with a global batch of {global_batch}, which "
                             f"{dist.world} processes cannot share equally: give --batch_size")
        args.batch_size = global_batch // dist.world
        print(f"{dist.world} processes of --batch_size {args.batch_size} keep the run's batch of {global_batch}")
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if device == "cuda" else contextlib.nullcontext()
    torch.manual_seed(args.seed)

    # the model: from a checkpoint, or new from the task, the preset and the flags
    if ckpt is not None:
        config_dict = ckpt["config"]
    elif source is not None:
        config_dict = {**source["config"], **{k: v for k, v in overrides.items() if k in given}}
    else:
        config_dict = dict(MODELS[args.model][1], **overrides)
    check_config(config_dict)
    make_config(args.model, config_dict)                     # bad settings fail before any data is loaded
    data.remove_stale_temps(args.out_dir)                    # what a killed checkpoint write left

    def load_data():
        task = data.load_task(args.task, cache_dir=args.cache_dir, data_dir=args.data_dir, seed=args.seed,
                              tokenizer=args.tokenizer, **{k: getattr(args, k) for k in LISTOPS_FLAGS},
                              **({"block_size": config_dict["block_size"]} if "block_size" in config_dict else {}))
        task.open(training=not args.eval_only)               # every split the run uses, loaded and checked now
        if dist.on:                                          # torchrun: every split made and cached now
            build_every_split(task, args.eval_only, args.n_train)
        return task
    task = dist.rank0_first(load_data)                       # rank 0 first, then the others read its cache
    head = {"cls": "cls", "match": "match", "lm": "lm"}[task.kind]
    task_fields = dict(vocab_size=task.vocab_size, block_size=task.block_size, head=head, n_classes=task.n_classes)
    if source is not None or ckpt is not None:
        for k, v in task_fields.items():
            if k in ("vocab_size", "head", "n_classes") and config_dict[k] != v:
                raise UsageError(f"the checkpoint's model has {k}={config_dict[k]} but task {args.task} needs {v}")
    if bert is not None:                                     # BERT's vocabulary, and a new classifier
        if task.vocab_size > config_dict["vocab_size"]:
            raise UsageError(f"--init_from_bert: the tokenizer has {task.vocab_size} ids, BERT's embedding "
                             f"{config_dict['vocab_size']}")
        config_dict["n_classes"] = task.n_classes
    config_dict = {**config_dict, **{k: v for k, v in task_fields.items() if k not in config_dict or k == "head"}}
    if bert is not None:
        model = bert_model(bert, args.model, config_dict)
        print(f"from BERT {args.init_from_bert}: {model.config.n_layer} of {bert[0]['num_hidden_layers']} layers, "
              f"{model.config.attention} attention; a new classifier on the [CLS] state (BERT's pooler is not used)")
    else:
        model = build_model(args.model, config_dict)
    if source is not None:
        load_weights(model, source["model"], args.init_from)
    if (args.steps is not None or args.lora_rank) and ckpt is None:   # DiffEqFormer's adaptive fine-tuning (6.2)
        if source is None or args.steps is None or not hasattr(model, "discretize") or model.config.discrete:
            raise UsageError("--steps N [--lora_rank r --lora_alpha a] needs --init_from CKPT, a checkpoint of the "
                             "DiffEqFormer ODE (--model diffeqformer, not discretised already)")
        if args.steps < 1 or args.lora_rank < 0:
            raise UsageError("--steps must be at least 1 and --lora_rank at least 0")
        model = model.discretize(args.steps)                 # an ordinary N-block model, W(t_k) materialised
        if args.lora_rank:                                   # LoRA on every linear map; freezes the rest
            model = model.with_lora(args.lora_rank, args.lora_alpha or args.lora_rank)
        trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
        print(f"{'evaluating' if args.eval_only else 'fine-tuning'} the discretisation on {args.steps} Euler steps"
              f"{f' with LoRA rank {args.lora_rank}' * bool(args.lora_rank)}: {trainable / 1e6:.2f}M trainable parameters")
    if args.transfer_from:                                   # SimpleTRON's Section 4.2
        import simpletron
        simple = load_checkpoint(args.transfer_from)
        trained = build_model(simple["model_name"], simple["config"])
        load_weights(trained, simple["model"], args.transfer_from)
        try:
            simpletron.transfer_attention(trained, model)
        except (RuntimeError, ValueError, AttributeError) as e:
            raise UsageError(f"--transfer_from {args.transfer_from}: its attention does not fit this model "
                             f"({data.one_line(str(e).splitlines()[0], 150)})") from None
    if ckpt is not None:
        load_weights(model, ckpt["model"], os.path.join(args.out_dir, "ckpt.pt"))
    model.to(device)
    config_dict = dataclasses.asdict(model.config)
    run_args = {name: getattr(args, name) for name, *_ in FLAGS}
    n_params = sum(p.numel() for p in model.parameters())
    print(f"{args.model} on {args.task} ({device}{f' x {dist.world} processes' if dist.on else ''}): "
          f"{n_params / 1e6:.2f}M parameters | {fmt(config_dict)}")
    if args.time_limit is not None:                          # a preset's limit is never silent
        print(f"training stops after {args.time_limit:g} min of wall time"
              f"{'' if 'time_limit' in given else f' (the {args.preset} preset; --time_limit to change)'}")
    if dist.master:
        os.makedirs(args.out_dir, exist_ok=True)

    def final_metrics(extra):
        out = {"model": args.model, "task": args.task}
        for split in ("val", "test"):
            if task.has(split):
                m = evaluate(model, task.split(split), args.batch_size * dist.world, device, autocast, dist=dist,
                             progress=f"evaluating {split}" if dist.master else None)
                print(f"{split}: {fmt(m)}")
                out.update({f"{split}_{k}" if k != "n" else f"n_{split}": v for k, v in m.items()})
        out.update(extra, world_size=dist.world, config=config_dict, args=run_args)
        if dist.master:
            data.atomic_write_text(os.path.join(args.out_dir, "metrics.json"), json.dumps(out, indent=2) + "\n")
            print(f"wrote {os.path.join(args.out_dir, 'metrics.json')}")
        return out

    if args.eval_only:
        if source is None:
            raise UsageError("--eval_only needs --init_from CKPT")
        return final_metrics({"iters": 0, "seconds": time.time() - t_start})

    train = task.split("train")
    if args.n_train is not None:
        train = train.subset(args.n_train)
    train_model = torch.compile(model) if args.compile else model
    if dist.on:     # DDP averages the gradients over the processes; told of parameters a step leaves unused
        x, y = (dist.share(t).to(device) for t in train.sample(args.batch_size * dist.world, np.random.default_rng(0)))
        unused = dist.sum(len(unused_parameters(model, x, y, autocast)))[0]
        train_model = torch.nn.parallel.DistributedDataParallel(
            train_model, device_ids=[torch.cuda.current_device()] if device == "cuda" else None,
            find_unused_parameters=unused > 0)
    optimizer = make_optimizer(model, args, device)
    start = 0
    gate_start = {name: p.item() for name, p in model.named_parameters() if p.dim() == 0}
    if ckpt is not None:
        if len(ckpt["optimizer"]["param_groups"]) != len(optimizer.param_groups):
            raise UsageError(f"{args.out_dir}/ckpt.pt was written by an older train.py (other optimiser groups); "
                             "start a new run instead of --resume")
        optimizer.load_state_dict(ckpt["optimizer"])
        start = ckpt["iter"]
        gate_start = ckpt.get("gate_start", gate_start)
        print(f"resuming {args.out_dir} at step {start}")

    def run_time():                                          # seconds of the run, earlier sessions included
        return (ckpt.get("time", 0.0) if ckpt is not None else 0.0) + time.time() - t_start

    log_path = os.path.join(args.out_dir, "log.jsonl")
    if ckpt is not None and os.path.isfile(log_path) and dist.master:   # steps after the checkpoint run again
        with open(log_path) as f:
            kept = [line for line in f if line.strip() and json.loads(line)["step"] <= start]
        data.atomic_write_text(log_path, "".join(kept))
    log = open(log_path, "a" if ckpt is not None else "w") if dist.master else open(os.devnull, "w")

    def checkpoint(it):
        if dist.master:
            save_checkpoint(os.path.join(args.out_dir, "ckpt.pt"), {
                "model_name": args.model, "config": config_dict, "model": model.state_dict(),
                "optimizer": optimizer.state_dict(), "iter": it, "args": run_args, "gate_start": gate_start,
                "world_size": dist.world, "time": run_time()})

    if args.attn_std_interval:                               # one fixed val batch, drawn without the training rng
        std_batch = (task.split("val") if task.has("val") else train).sample(
            min(args.batch_size, 64), np.random.default_rng(4321))[0].to(device)

    def log_attention_std(it):
        if args.attn_std_interval and (it % args.attn_std_interval == 0 or it == args.max_iters) and dist.master:
            log.write(json.dumps({"step": it, **attention_std(model, std_batch), "time": round(run_time(), 3)}) + "\n")

    if start == 0:
        log_attention_std(0)
    it, tokens, t_train = start, 0, 0.0
    window = {"loss": 0.0, "correct": 0, "count": 0, "steps": 0, "seconds": 0.0}  # one log interval
    stopped = "max_iters"
    try:
        while it < args.max_iters:
            if args.time_limit is not None and dist.any(past_time_limit(args.time_limit, time.time() - t_start)):
                stopped = f"time_limit ({args.time_limit} min)"
                break
            t0 = time.time()
            lr = learning_rate(args, it + 1)
            for group in optimizer.param_groups:
                group["lr"] = lr * group["lr_scale"]
            # the data and the dropout of step `it` depend on (seed, it) alone: resuming replays them exactly.
            # torchrun: every process draws the same global batch and takes its share; its own dropout masks
            rng = np.random.default_rng([args.seed, it])
            torch.manual_seed(step_seed(args.seed, it, dist.rank))
            loss_sum, correct, count = 0.0, 0, 0
            for micro in range(args.grad_accum):
                x, y = train.sample(args.batch_size * dist.world, rng)
                if it < args.short_steps and task.kind != "lm":
                    x = x[..., :args.short_len]
                tokens += train.tokens_in(x)
                x, y = dist.share(x).to(device), dist.share(y).to(device)
                last = micro == args.grad_accum - 1          # DDP: gradients averaged after the last micro-batch
                with contextlib.nullcontext() if last or not dist.on else train_model.no_sync():
                    with autocast:
                        logits, loss = train_model(x, y)
                    (loss / args.grad_accum).backward()
                loss_sum += loss.item() / args.grad_accum
                if logits.dim() == 2:
                    correct += (logits.argmax(-1) == y).sum().item()
                    count += y.numel()
            if args.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            it += 1
            if dist.on:                                      # averages over all the processes' examples
                loss_sum, correct, count = dist.sum(loss_sum, correct, count)
                loss_sum /= dist.world
            t_train += time.time() - t0
            record = {"step": it, "loss": loss_sum, "lr": lr, "time": round(run_time(), 3)}
            if count:
                record["acc"] = correct / count
            log.write(json.dumps(record) + "\n")
            log_attention_std(it)
            for k, v in (("loss", loss_sum), ("correct", correct), ("count", count), ("steps", 1),
                         ("seconds", time.time() - t0)):
                window[k] += v
            if it % args.log_interval == 0 or it == args.max_iters:
                rate = per_second(tokens, t_train)
                eta = seconds_left(args.max_iters - it, window["seconds"], window["steps"])
                acc = f" | acc {window['correct'] / window['count']:.3f}" if window["count"] else ""
                print(f"step {it}/{args.max_iters} | loss {window['loss'] / window['steps']:.4f}{acc}"
                      f" | lr {lr:.2e} | {rate / 1e3:.1f}k tok/s | eta {eta / 60:.1f} min", flush=True)
                window = dict.fromkeys(window, 0)
            if (it % args.eval_interval == 0 or it == args.max_iters) and task.has("val"):
                m = evaluate(model, task.split("val"), args.batch_size * dist.world, device, autocast, args.eval_iters,
                             dist=dist)
                print(f"step {it} val: {fmt(m)}", flush=True)
                log.write(json.dumps({"step": it, **{f"val_{k}": v for k, v in m.items()},
                                      "time": round(run_time(), 3)}) + "\n")
                log.flush()
                checkpoint(it)
    except KeyboardInterrupt:
        stopped = "interrupted"
        launch = f"torchrun --nproc_per_node={dist.world}" if dist.on else "python"
        print(f"\ninterrupted at step {it}; continue with: {launch} train.py --resume --out_dir {args.out_dir}")
    checkpoint(it)
    log.close()
    if stopped == "interrupted" and dist.on:                 # the other processes may be anywhere: no evaluation
        return None
    if stopped != "max_iters":
        print(f"stopped at step {it}: {stopped}")
    gates = gate_report(model, gate_start, args, it)
    for name, g in gates.items():
        print(f"gate {name}: {g['start']:+.3f} -> {g['value']:+.3f}, {100 * g['used']:.0f}% of the "
              f"{g['budget']:.2f} its learning rate allowed")
    return final_metrics({"iters": it, "stopped": stopped, "seconds": time.time() - t_start,
                          "train_seconds": t_train, "tokens_per_s": per_second(tokens, t_train),
                          "n_params": n_params, "gates": gates})


if __name__ == "__main__":
    rank = int(os.environ.get("RANK", 0))                    # torchrun: rank 0 prints, the others are quiet ...
    try:
        with contextlib.redirect_stdout(sys.stdout if rank == 0 else open(os.devnull, "w")):
            main()
    except (UsageError, data.DataError) as e:
        if int(os.environ.get("LOCAL_RANK", 0)) == 0:       # ... but for an error: once on each machine
            print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except (MemoryError, torch.OutOfMemoryError) as e:
        print(f"error: out of memory ({data.one_line(e, 100)}): use a smaller --batch_size, --block_size or model",
              file=sys.stderr)
        sys.exit(2)
    finally:                                                 # on every exit, or the process aborts at exit
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
