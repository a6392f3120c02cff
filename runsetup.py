"""
What a run starts from: its settings (the flags, and the checkpoint it resumes or starts from, or a pretrained
BERT), every one checked before any data is read, and its model with its first weights once the task is known.
"""

import contextlib
import dataclasses
import inspect
import os

import torch

import bert
import data
import simpletron
from config import (MOOT_WITH_FILES, TASK_FLAGS, MODELS, UsageError, build_model, check_args, check_config,
                    check_moot, check_size, check_vocabulary, load_checkpoint, load_weights, parse_args, pick_device,
                    resolve)


def settings(argv, description=None):
    """The run's flags and its model's settings, every one checked before any data is read: the flags given > a
    resumed run's > the --init_from checkpoint's > the preset > the defaults. Returns (args, the flags typed, the
    --init_from checkpoint, the --resume checkpoint, BERT's weights, the model's settings)."""
    args, given, config_names = parse_args(argv, description)
    typed = set(given)                                       # on the command line (a checkpoint's fill the rest)
    ckpt = resume_state(args, given)                         # --resume: the run's own flags
    source = None if ckpt else inherit_from(args, given)     # --init_from: its model, its task unless given
    pretrained = None
    if args.init_from_bert and ckpt is None:                 # SimpleTRON's Section 5.3: a pretrained BERT
        pretrained = bert.read_bert(args, given)
    overrides = resolve(args, given, config_names, bert.BERT_FINETUNE if pretrained else None)
    if pretrained is not None:                               # BERT's shape with the flags given: checked now
        shape = bert.bert_model(pretrained, {**MODELS[args.model][1], **overrides}, "meta").config
        overrides = dataclasses.asdict(shape)
    if args.out_dir is None and args.init_from:              # beside the run it starts from, never over it
        source_dir = os.path.dirname(os.path.abspath(args.init_from))
        args.out_dir = os.path.relpath(source_dir + ("-eval" if args.eval_only else "-finetune"))
    args.out_dir = os.path.join("out", f"{args.model}-{args.task}") if args.out_dir is None else args.out_dir
    source_file = args.transfer_from                         # a resumed run's weights are all in ckpt.pt: the
    args.transfer_from = None if ckpt else source_file       # file it was started from is not read (nor needed)
    check_args(args, typed)                                  # every flag, before any data is read
    args.transfer_from = source_file
    # the model's settings: a resumed run's, the --init_from checkpoint's with the fields given, or new
    if ckpt is not None:                                     # (resume_state refused any field it cannot change)
        config_dict = {**ckpt["config"], **{k: v for k, v in overrides.items() if k in given}}
    elif source is not None:
        config_dict = {**source["config"], **{k: v for k, v in overrides.items() if k in given}}
    else:
        config_dict = dict(MODELS[args.model][1], **overrides)
    check_moot_with_files(args, typed, config_dict, resumed=ckpt is not None)
    args.device = pick_device(args.device)
    check_moot(args, typed, check_config(args.model, config_dict))   # bad settings fail before any data is loaded
    head = config_dict.get("head") if any(x is not None for x in (ckpt, source, pretrained)) else None
    if head:
        check_head_fields(typed, config_dict, head, "this model is " + ("a language model" if head == "lm" else
                                                                       f"a classifier (head {head})"))
    check_size(args, args.model, config_dict)                # and those that cannot fit in memory
    return args, typed, source, ckpt, pretrained, config_dict


# tasks that read --data_dir's files as they are, caching nothing derived from them (tasks/recall.py's file_task;
# and ptb's words, tasks/lm.py, which only --tokenizer char caches)
UNCACHED_FILES = ("mqar", "copy", "induction")


def check_moot_with_files(args, typed, config_dict, resumed):
    """A flag typed that --data_dir's files make moot, refused in one line: one that sets the generated examples
    (MOOT_WITH_FILES), --cache_dir where the files are read as they are, --listops_len where the block size is set
    otherwise (with files it sets only the default block; a resumed run's own value is its record, kept)."""
    if not args.data_dir:
        return
    moot = next((k for k in MOOT_WITH_FILES.get(args.task, ()) if k in typed), None)
    if moot:
        raise UsageError(f"--{moot} {getattr(args, moot)}: it sets the generated {args.task} examples, and "
                         "--data_dir's files are read instead; leave out one of them")
    if "cache_dir" in typed and (args.task in UNCACHED_FILES or args.task == "ptb" and args.tokenizer != "char"):
        raise UsageError(f"--cache_dir {args.cache_dir}: task {args.task} reads --data_dir's files as they are and "
                         "caches nothing; leave out --cache_dir")
    if args.task == "listops" and "listops_len" in typed and "block_size" in config_dict and not resumed:
        raise UsageError(f"--listops_len {args.listops_len}: with --data_dir's files it sets only the default block "
                         f"size, and the block size is set to {config_dict['block_size']} (--block_size, a preset's or "
                         "the checkpoint's); leave out one of them")


def check_run_record(ckpt, out_dir):
    """What ckpt.pt records beside the weights, and the best.pt it names, checked before any data is read: a value of
    the wrong kind is refused in one line; a best.pt that is gone is forgotten (the next evaluation writes one), one
    of another model is refused (it is not this run's, and would be overwritten)."""
    try:
        check_config(ckpt["model_name"], ckpt["config"])
    except UsageError as e:
        raise UsageError(f"{out_dir}/ckpt.pt: {e}") from None
    number = lambda v: data.finite(v) and v >= 0
    best = ckpt.get("best")
    fine = {"iter": lambda v: type(v) is int and (not isinstance(ckpt["args"].get("max_iters"), int)
                                                  or v <= ckpt["args"]["max_iters"]),
            "time": number, "world_size": lambda v: isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= 2**16,
            "gate_start": lambda v: isinstance(v, dict) and all(map(data.finite, v.values())),
            "best": lambda v: v is None or isinstance(v, dict) and isinstance(v.get("step"), int)
            and 0 <= v["step"] <= ckpt["iter"] and len(v) == 2 and number(v.get("val_loss", v.get("val_acc"))),
            "scaler": scaler_fine}
    bad = next((k for k, test in fine.items() if k in ckpt and not test(ckpt[k])), None)
    if bad:
        raise UsageError(f"{out_dir}/ckpt.pt: its record {bad!r} is damaged ({data.one_line(repr(ckpt[bad]), 60)}); "
                         "start a new run, or --init_from it in another --out_dir")
    opt = ckpt["optimizer"]
    if not (isinstance(opt, dict) and isinstance(opt.get("state"), dict) and isinstance(opt.get("param_groups"), list)):
        raise UsageError(f"{out_dir}/ckpt.pt: its optimizer state is damaged (no 'state' or 'param_groups'); start "
                         "a new run, or --init_from it in another --out_dir")
    problem = adam_problem([s for s in opt["state"].values() if isinstance(s, dict)], ckpt["iter"])
    if problem:
        raise UsageError(f"{out_dir}/ckpt.pt: its optimizer state {problem} (damaged); start a new run, or --init_from "
                         "it in another --out_dir")
    path = os.path.join(out_dir, "best.pt")
    # a best.pt there is checked, whether or not ckpt.pt records a best: the next evaluation writes over it
    if data.file_problem(path) == "does not exist":
        if best is not None:
            print(f"{path} is gone: the run's best so far (step {best['step']}) is forgotten; the next evaluation "
                  "writes a new one")
        ckpt["best"] = None
        return
    other = load_checkpoint(path)
    fixed = lambda c: {k: v for k, v in c.items() if k not in CHANGEABLE_FIELDS}     # (--dropout may change)
    ours = None in (other.get("vocabulary"), ckpt.get("vocabulary")) or other["vocabulary"] == ckpt["vocabulary"]
    if other["model_name"] != ckpt["model_name"] or fixed(other["config"]) != fixed(ckpt["config"]) or not ours:
        raise UsageError(f"{path} holds another run's weights (a {other['model_name']} model), not this "
                         f"{ckpt['model_name']} run's: move it out of {out_dir}, then --resume again")


def adam_problem(states, steps):
    """What is wrong with AdamW's state of each weight (a dict) after `steps` steps, or None: a value that is not finite
    (a nan would reach every weight), a second moment below 0 (its square root: nan), a step count that is no whole
    number 1 .. steps (a weight's steps: float16's skipped ones and those without a gradient are not counted)."""
    for s in states:
        if not all(torch.isfinite(t).all() for t in s.values() if torch.is_tensor(t) and t.is_floating_point()):
            return "holds a value that is not finite"
        sq = s.get("exp_avg_sq")
        if torch.is_tensor(sq) and (sq < 0).any():
            return f"holds a second moment (exp_avg_sq) below 0 ({sq.min().item():g})"
        step = s.get("step")
        step = step.item() if torch.is_tensor(step) and step.numel() == 1 else step
        if not (data.finite(step) and step == int(step) and 1 <= step <= steps):
            return f"holds a weight's step count {data.one_line(repr(step), 30)}, not a whole number 1 .. {steps}"
    return None


def scaler_fine(record):
    """float16's gradient scaler record: {} (a run of another --dtype), or GradScaler's own: a scale that is a finite
    number above 0 (a nan one skips every step), its factors finite numbers above 0, its counts whole numbers."""
    if not isinstance(record, dict) or not record:
        return record == {}
    above_0 = lambda v: data.finite(v) and v > 0
    count = lambda v: type(v) is int and v >= 0
    return (set(record) == {"scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker"}
            and all(above_0(record[k]) for k in ("scale", "growth_factor", "backoff_factor"))
            and count(record["growth_interval"]) and record["growth_interval"] > 0 and count(record["_growth_tracker"]))


def check_best_record(ckpt, train, out_dir):
    """A resumed run's best record, once its data says what its evaluations keep: a language model's val loss (its
    splits of windows), every other run's val accuracy (recall tasks count their answers)."""
    best = ckpt.get("best")
    key = "val_loss" if isinstance(train, data.LMSplit) else "val_acc"
    if best is not None and key not in best:
        raise UsageError(f"{out_dir}/ckpt.pt: its record 'best' is damaged ({data.one_line(repr(best), 60)}: this "
                         f"run keeps its best by {key}); start a new run, or --init_from it in another --out_dir")


def inherit_from(args, given):
    """--init_from CKPT: the checkpoint, whose model the run takes (a --model given must be the same), and its task
    unless --task is given (then its data from the same place: --data_dir, --cache_dir, --tokenizer and the
    ListOps flags, unless given). Config flags given are laid over the checkpoint's (settings)."""
    if not args.init_from:
        return None
    source = load_checkpoint(args.init_from)
    if "model" in given and args.model != source["model_name"]:
        raise UsageError(f"--model {args.model}: --init_from {args.init_from} holds a {source['model_name']} model, "
                         f"whose weights the run would train instead; leave out --model, or train a {args.model} "
                         "without --init_from")
    args.model = source["model_name"]
    if args.task is None:
        args.task = source["args"]["task"]
        for k in ("data_dir", "cache_dir", "tokenizer", *TASK_FLAGS):
            if k not in given and k in source["args"]:
                setattr(args, k, source["args"][k])
                given.add(k)
        if not data_there(args.data_dir):
            raise UsageError(f"--init_from {args.init_from}: its run read --data_dir {args.data_dir}, which is not "
                             "there (moved or deleted): give --task and --data_dir, the data to use")
    given |= {"model", "task"}
    return source


# Under --resume, the settings that make the run what it is: given otherwise than the run's, they are refused. The
# task's (every setting of a task loader but --cache_dir), the model's and where its first weights came from.
TASK_SETTINGS = {p for loader in data.TASKS.values() for p in inspect.signature(loader).parameters} - {"cache_dir"}
KEPT_ON_RESUME = {"model", "task", "preset", "eval_only", "init_from", "init_from_bert", "transfer_from", "steps",
                  "lora_rank", "lora_alpha"} | TASK_SETTINGS
# Config fields a resumed run may change: neither the weights nor what the trained model computes depend on them
CHANGEABLE_FIELDS = {"dropout", "checkpointing", "chunk"}


def data_there(data_dir):
    """Whether --data_dir (None: the task's own source) names something."""
    return not isinstance(data_dir, str) or os.path.lexists(data_dir)


def same(a, b):
    """The same value, or the same path however written (relative or absolute, through links)."""
    return a == b or isinstance(a, str) and isinstance(b, str) and (os.path.normpath(a) == os.path.normpath(b) or (
        os.path.exists(a) and os.path.exists(b) and os.path.samefile(a, b)))


def resume_state(args, given):
    """--resume: the checkpoint of the run in out_dir, whose flags fill those not given. A flag given otherwise than
    the run's is applied, and said, where a run may change it on its way (--max_iters, --lr, --dropout ...);
    where it would change the model, its shape or weights, or the task, it is refused in one line."""
    if not args.resume:
        return None
    if args.out_dir is None:
        raise UsageError("--resume needs --out_dir, the folder of the run to continue")
    if args.overwrite:
        raise UsageError(f"--overwrite with --resume: --resume continues the run in {args.out_dir}, --overwrite "
                         "would start a new one over it; give one of them")
    ckpt = load_checkpoint(os.path.join(args.out_dir, "ckpt.pt"), need=("optimizer", "iter", "best"))
    if not data_there(ckpt["args"].get("data_dir")):
        raise UsageError(f"{args.out_dir}/ckpt.pt: its run read --data_dir {ckpt['args']['data_dir']}, which is not "
                         f"there (moved or deleted): put the data back there, or --init_from {args.out_dir}/ckpt.pt "
                         "with --task and --data_dir in another --out_dir")
    changed = []
    for k in sorted(given - {"resume", "out_dir", "overwrite"}):
        run = ckpt["args"] if k in ckpt["args"] else ckpt["config"]
        if k not in run or same(getattr(args, k), run[k]):
            continue
        if k in KEPT_ON_RESUME or run is ckpt["config"] and k not in CHANGEABLE_FIELDS:
            detail = "" if k in ("model", "task") else f" with {k} {run[k]}"
            raise UsageError(f"--{k} {getattr(args, k)}: {args.out_dir} holds a {ckpt['model_name']} run on "
                             f"{ckpt['args']['task']}{detail}, which --resume continues as it is; leave out --{k}, "
                             "or start a new run in another --out_dir")
        changed.append(f"--{k} {getattr(args, k)} (the run had {run[k]})")
    check_run_record(ckpt, args.out_dir)
    if changed:
        print(f"resuming {args.out_dir} with {', '.join(changed)}")
    for k, v in ckpt["args"].items():
        if k not in given:
            setattr(args, k, v)
    if isinstance(args.max_iters, int) and args.max_iters < ckpt["iter"]:
        raise UsageError(f"--max_iters {args.max_iters}: {args.out_dir} is at step {ckpt['iter']} already; give more "
                         f"steps to train on, or --init_from {args.out_dir}/ckpt.pt --eval_only to evaluate it")
    given |= set(ckpt["args"])
    return ckpt


# the Config fields of one kind of head alone: (the heads, what the field acts with)
HEAD_FIELDS = {"chunk": (("lm",), "a language model's causal attention"), "causal_scale": (("lm",), "a language "
               "model's causal attention"), "learned_cls": (("cls", "match"), "a classifier's CLS token"),
               "pool": (("cls", "match"), "a classifier's pooling of its tokens")}


def check_head_fields(names, config_dict, head, what):
    """One line for the first of `names` that is a field of another kind of head than `head` (`what` says whose)."""
    if k := next((k for k in names if k in HEAD_FIELDS and head not in HEAD_FIELDS[k][0]), None):
        raise UsageError(f"--{k} {config_dict[k]}: it acts only with {HEAD_FIELDS[k][1]}, and {what}; leave it out")


def check_prefixes(args, typed, task, block_size):
    """The sequence-length warm-up typed (--short_steps, --short_len), once the task is known: one that would shorten
    no step is refused (a language model's steps take its whole block; a prefix as long as the block is the block)."""
    if args.short_steps == 0 or not typed & {"short_steps", "short_len"}:
        return                                               # (a preset's warm-up on a short block: nothing to do)
    if task.kind == "lm":
        raise UsageError(f"--short_steps {args.short_steps}: task {args.task} is a language model, each of whose "
                         "steps takes its whole block; the warm-up on prefixes is for classifiers: leave it out")
    if args.short_len >= block_size:
        raise UsageError(f"--short_len {args.short_len}: the model's block is {block_size} tokens, so no step of "
                         f"--short_steps {args.short_steps} would be shortened: give a --short_len under "
                         f"{block_size}, or leave out --short_steps")


def fit_to_task(config_dict, task, task_name, checkpoint, pretrained):
    """The Config fields the task decides (vocabulary, length, head, classes) where the settings leave them open.
    A checkpoint's model must fit the task as it is, its ids standing for what they stood for in training (the
    characters or words the checkpoint records); BERT's gets a new classifier."""
    fields = dict(vocab_size=task.vocab_size, block_size=task.block_size, head=task.kind, n_classes=task.n_classes)
    from_checkpoint = checkpoint is not None
    if not from_checkpoint and pretrained is None:           # (given, or a preset of this task's: none such)
        check_head_fields(config_dict, config_dict, task.kind, f"task {task_name} is " + (
            "a language model" if task.kind == "lm" else "a classifier"))
    check_vocabulary((checkpoint or {}).get("vocabulary"), task.vocabulary, task_name)
    for k in ("vocab_size", "head", "n_classes"):
        if from_checkpoint and k not in config_dict:
            raise UsageError(f"the checkpoint's model settings lack {k} (damaged: train.py writes every one)")
        if from_checkpoint and config_dict[k] != fields[k] and not (k == "vocab_size" and config_dict[k] > fields[k]):
            raise UsageError(f"the checkpoint's model has {k}={config_dict[k]} but task {task_name} needs {fields[k]}")
        if not from_checkpoint and pretrained is None and config_dict.get(k, fields[k]) != fields[k] and not (
                k == "vocab_size" and config_dict[k] > fields[k]):           # (more ids than the task's: unused)
            raise UsageError(f"--{k} {config_dict[k]}: task {task_name} sets it to {fields[k]}; leave it out"
                             + " (or give more ids)" * (k == "vocab_size"))
    if pretrained is not None:
        if task.vocab_size > config_dict["vocab_size"]:
            raise UsageError(f"--init_from_bert: the tokenizer has {task.vocab_size} ids, BERT's embedding "
                             f"{config_dict['vocab_size']}")
        config_dict["n_classes"] = task.n_classes
    return {**config_dict, **{k: v for k, v in fields.items() if k not in config_dict or k == "head"}}


def build_run_model(args, config_dict, source, ckpt, pretrained):
    """The model and its first weights: BERT's, or the --init_from checkpoint's (then discretised by --steps),
    with SimpleTRON's attention (--transfer_from); a resumed run's own last."""
    if pretrained is not None:                               # SimpleTRON's Section 5.3
        model = bert.bert_model(pretrained, config_dict)     # the model's own settings, then the flags given
        print(f"from BERT {args.init_from_bert}: {model.config.n_layer} of {pretrained[0]['num_hidden_layers']} "
              f"layers, {model.config.attention} attention; a new classifier on the [CLS] state (BERT's pooler is "
              "not used)")
    else:
        model = build_model(args.model, config_dict)
    if source is not None:
        was = source["config"]
        changed = [k for k, v in config_dict.items() if was.get(k, v) != v and k not in CHANGEABLE_FIELDS]
        try:
            load_weights(model, source["model"], args.init_from)
        except UsageError as e:
            if not changed or "do not fit" not in str(e):
                raise
            flags, had = (", ".join(f"{pre}{k} {c[k]}" for k in changed) for pre, c in (("--", config_dict), ("", was)))
            raise UsageError(f"{flags}: the weights of --init_from {args.init_from} ({had}) do not fit that model; "
                             f"leave {'it' if len(changed) == 1 else 'them'} out to fine-tune the checkpoint's "
                             "model, or train a new one without --init_from") from None
    if (args.steps is not None or args.lora_rank) and ckpt is None:
        model = discretised(model, args, source)
    if args.transfer_from and ckpt is None:                  # SimpleTRON's Section 4.2 (resumed: in ckpt.pt)
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
    return model


def discretised(model, args, source):
    """DiffEqFormer's adaptive fine-tuning (6.2): the ODE of --init_from as --steps N ordinary blocks, W(t_k)
    materialised, with LoRA of rank --lora_rank on every linear map (freezing the rest) if given."""
    if source is None or args.steps is None or not hasattr(model, "discretize") or model.config.discrete:
        raise UsageError("--steps N [--lora_rank r --lora_alpha a] needs --init_from CKPT, a checkpoint of the "
                         "DiffEqFormer ODE (--model diffeqformer, not discretised already)")
    if args.steps < 1 or args.lora_rank < 0:
        raise UsageError("--steps must be at least 1 and --lora_rank at least 0")
    model = model.discretize(args.steps)
    if args.lora_rank:
        model = model.with_lora(args.lora_rank, args.lora_alpha or args.lora_rank)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    print(f"{'evaluating' if args.eval_only else 'fine-tuning'} the discretisation on {args.steps} Euler steps"
          f"{f' with LoRA rank {args.lora_rank}' * bool(args.lora_rank)}: {trainable / 1e6:.2f}M trainable parameters")
    return model


def rescale_batch(ckpt, dist, args):
    """A run resumed on another number of processes keeps its global batch."""
    global_batch = args.batch_size * ckpt.get("world_size", 1)
    if global_batch % dist.world:
        raise UsageError(f"{args.out_dir} was trained with a global batch of {global_batch}, which "
                         f"{dist.world} processes cannot share equally: give --batch_size")
    args.batch_size = global_batch // dist.world
    print(f"{dist.world} processes of --batch_size {args.batch_size} keep the run's batch of {global_batch}")


def precision(dtype, device):
    """--dtype on this device: (the dtype, the autocast context, the gradient scaler). auto is bfloat16 on a GPU that
    has it in hardware (compute capability 8.0 and up, or ROCm), float16 on one that does not (a T4, a V100:
    torch.cuda.is_bf16_supported() also says yes where bfloat16 is only emulated, slowly), float32 (no autocast)
    elsewhere. float16 trains with a GradScaler: the loss is multiplied by a scale before the backward pass so that
    small gradients do not underflow in float16, the gradients are divided by it before clipping, and a step whose
    gradient holds an inf or a nan is skipped and the scale halved (it doubles after 2,000 good steps)."""
    kind = torch.device(device).type
    if dtype == "auto" and kind == "cuda":                   # nanoGPT's rule, without emulated bfloat16
        dtype = "bfloat16" if torch.version.hip or torch.cuda.get_device_capability(device)[0] >= 8 else "float16"
    dtype = "float32" if dtype == "auto" else dtype
    autocast = contextlib.nullcontext() if dtype == "float32" else torch.autocast(kind, dtype=getattr(torch, dtype))
    return dtype, autocast, torch.amp.GradScaler(kind, enabled=dtype == "float16")


def restore_optimizer(optimizer, scaler, ckpt, out_dir):
    """A resumed run's optimiser state, and its gradient scaler's (float16); returns the step to start from (0: a
    new run)."""
    if ckpt is None:
        return 0
    if ckpt.get("scaler"):                                   # (a disabled scaler ignores it)
        scaler.load_state_dict(ckpt["scaler"])
    if len(ckpt["optimizer"]["param_groups"]) != len(optimizer.param_groups):
        raise UsageError(f"{out_dir}/ckpt.pt was written by an older train.py (other optimiser groups); "
                         "start a new run instead of --resume")
    # the settings of each group (--weight_decay, --beta2 ...) are this run's flags, which may change on resume: the
    # saved state's would come back with it
    settings_now = [{k: v for k, v in group.items() if k != "params"} for group in optimizer.param_groups]
    try:                                                     # (torch checks the groups' sizes; the states' shapes,
        optimizer.load_state_dict(ckpt["optimizer"])         # which it would only meet at the first step, here)
        fits = all(v.shape == p.shape for p, s in optimizer.state.items() for v in s.values()
                   if torch.is_tensor(v) and v.dim() > 0)
    except (ValueError, KeyError, TypeError, RuntimeError):
        fits = False
    if not fits:
        raise UsageError(f"{out_dir}/ckpt.pt: its optimiser state does not fit the model's weights (damaged, or "
                         "another run's); start a new run, or --init_from it in another --out_dir")
    for group, now in zip(optimizer.param_groups, settings_now):
        group.update(now)
    print(f"resuming {out_dir} at step {ckpt['iter']}")
    return ckpt["iter"]
