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

import contextlib
import dataclasses
import json
import math
import os
import sys
import time

import numpy as np
import torch

if int(os.environ.get("RANK", 0)):                          # torchrun: progress bars on rank 0 only
    os.environ.setdefault("TQDM_DISABLE", "1")
from tqdm import tqdm  # noqa: E402

import bert  # noqa: E402
import data  # noqa: E402
import simpletron  # noqa: E402
from config import (FLAGS, LISTOPS_FLAGS, MODELS, UsageError, build_model, check_args, check_config,  # noqa: E402
                    load_checkpoint, parse_args, pick_device, resolve)
from ddp import Distributed, build_every_split, step_seed, unused_parameters  # noqa: E402


# ----------------------------------------------------------------------------------------------
# The optimiser, evaluation and measurements

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


def fmt(metrics):
    return " | ".join((f"{k} {v:.4f}" if v == 0 or abs(v) >= 1e-3 else f"{k} {v:.3g}") if isinstance(v, float)
                      else f"{k} {v}" for k, v in metrics.items())


def per_second(count, seconds):
    """A rate; 0 before any time has passed (a resumed run that has no step left)."""
    return count / seconds if seconds > 0 else 0.0


def seconds_left(steps_left, seconds, steps):
    """The time the remaining steps take at the pace of the last `steps` steps, which took `seconds`."""
    return steps_left * seconds / steps


def past_time_limit(minutes, seconds):
    """Whether a run `seconds` old has passed its --time_limit of `minutes` (None: no limit)."""
    return minutes is not None and seconds > 60 * minutes


# ----------------------------------------------------------------------------------------------
# main's steps, in its order

def inherit_from(args, given):
    """--init_from CKPT: the checkpoint, whose model the run takes, and its task unless --task is given (then its
    data from the same place: --data_dir, --cache_dir, --tokenizer and the ListOps flags, unless given)."""
    if not args.init_from:
        return None
    source = load_checkpoint(args.init_from)
    args.model = source["model_name"]
    if args.task is None:
        args.task = source["args"]["task"]
        for k in ("data_dir", "cache_dir", "tokenizer", *LISTOPS_FLAGS):
            if k not in given and k in source["args"]:
                setattr(args, k, source["args"][k])
                given.add(k)
    given |= {"model", "task"}
    return source


def resume_state(args, given):
    """--resume: the run's checkpoint, whose flags fill those not given."""
    if not args.resume:
        return None
    if args.out_dir is None:
        raise UsageError("--resume needs --out_dir, the folder of the run to continue")
    ckpt = load_checkpoint(os.path.join(args.out_dir, "ckpt.pt"), need=("optimizer", "iter"))
    for k, v in ckpt["args"].items():
        if k not in given:
            setattr(args, k, v)
    given |= set(ckpt["args"])
    return ckpt


def rescale_batch(ckpt, dist, args):
    """A run resumed on another number of processes keeps its global batch."""
    global_batch = args.batch_size * ckpt.get("world_size", 1)
    if global_batch % dist.world:
        raise UsageError(f"{args.out_dir} was trained with a global batch of {global_batch}, which "
                         f"{dist.world} processes cannot share equally: give --batch_size")
    args.batch_size = global_batch // dist.world
    print(f"{dist.world} processes of --batch_size {args.batch_size} keep the run's batch of {global_batch}")


def open_task(args, config_dict, dist):
    """The task, every split the run uses loaded and checked (under torchrun: built and cached in full)."""
    task = data.load_task(args.task, cache_dir=args.cache_dir, data_dir=args.data_dir, seed=args.seed,
                          tokenizer=args.tokenizer, **{k: getattr(args, k) for k in LISTOPS_FLAGS},
                          **({"block_size": config_dict["block_size"]} if "block_size" in config_dict else {}))
    task.open(training=not args.eval_only)
    if dist.on:
        build_every_split(task, args.eval_only, args.n_train)
    return task


def fit_to_task(config_dict, task, task_name, from_checkpoint, pretrained):
    """The Config fields the task decides (vocabulary, length, head, classes) where the settings leave them open.
    A checkpoint's model must fit the task as it is; BERT's gets a new classifier."""
    fields = dict(vocab_size=task.vocab_size, block_size=task.block_size, head=task.kind, n_classes=task.n_classes)
    for k in ("vocab_size", "head", "n_classes"):
        if from_checkpoint and config_dict[k] != fields[k]:
            raise UsageError(f"the checkpoint's model has {k}={config_dict[k]} but task {task_name} needs {fields[k]}")
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
        model = bert.bert_model(pretrained, {**MODELS[args.model][1], **config_dict})
        print(f"from BERT {args.init_from_bert}: {model.config.n_layer} of {pretrained[0]['num_hidden_layers']} "
              f"layers, {model.config.attention} attention; a new classifier on the [CLS] state (BERT's pooler is "
              "not used)")
    else:
        model = build_model(args.model, config_dict)
    if source is not None:
        load_weights(model, source["model"], args.init_from)
    if (args.steps is not None or args.lora_rank) and ckpt is None:
        model = discretised(model, args, source)
    if args.transfer_from:                                   # SimpleTRON's Section 4.2
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


def load_weights(model, state, path):
    try:
        model.load_state_dict(state)
    except (RuntimeError, TypeError, ValueError) as e:
        first = [line.strip() for line in str(e).splitlines() if line.strip()][:2]   # torch: a title, then the first
        raise UsageError(f"{path}: its weights do not fit the model ({data.one_line(' '.join(first), 200)})") from None


# ----------------------------------------------------------------------------------------------
# Training

class Run:
    """What the steps of one run share: its settings, processes, model and optimiser, its log.jsonl (rank 0;
    the others write nowhere) and its clock, which counts the run's seconds over all its sessions (--resume)."""

    def __init__(self, args, dist, autocast, model, optimizer, gate_start, log, t_start, time_before):
        self.args, self.dist, self.autocast, self.model, self.optimizer = args, dist, autocast, model, optimizer
        self.gate_start, self.log, self.t_start, self.time_before = gate_start, log, t_start, time_before

    def seconds(self):
        return self.time_before + time.time() - self.t_start

    def write(self, record):
        self.log.write(json.dumps(record) + "\n")

    def save(self, it):
        """out_dir/ckpt.pt after step `it`: all an exact --resume needs, written whole or not at all."""
        if self.dist.master:
            state = {"model_name": self.args.model, "config": dataclasses.asdict(self.model.config),
                     "model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(), "iter": it,
                     "args": run_args(self.args), "gate_start": self.gate_start, "world_size": self.dist.world,
                     "time": self.seconds()}
            data.atomic_write(os.path.join(self.args.out_dir, "ckpt.pt"), lambda f: torch.save(state, f))


def run_args(args):
    return {name: getattr(args, name) for name, *_ in FLAGS}


def open_log(out_dir, ckpt, start, master):
    """out_dir/log.jsonl: a new one, or a resumed run's without the steps after its checkpoint (they run again)."""
    path = os.path.join(out_dir, "log.jsonl")
    if ckpt is not None and os.path.isfile(path) and master:
        with open(path) as f:
            kept = [line for line in f if line.strip() and json.loads(line)["step"] <= start]
        data.atomic_write_text(path, "".join(kept))
    return open(path, "a" if ckpt is not None else "w") if master else open(os.devnull, "w")


def training_model(model, train, args, dist, autocast):
    """What the steps call: the model, compiled by --compile, in DistributedDataParallel under torchrun."""
    train_model = torch.compile(model) if args.compile else model
    if dist.on:     # DDP averages the gradients over the processes; told of parameters a step leaves unused
        x, y = (dist.share(t).to(dist.device)
                for t in train.sample(args.batch_size * dist.world, np.random.default_rng(0)))
        unused = dist.sum(len(unused_parameters(model, x, y, autocast)))[0]
        train_model = torch.nn.parallel.DistributedDataParallel(
            train_model, device_ids=[torch.cuda.current_device()] if dist.device == "cuda" else None,
            find_unused_parameters=unused > 0)
    return train_model


def train_step(run, train_model, train, kind, it):
    """Step it + 1: grad_accum micro-batches of the global batch (this process's share of each), then the
    optimiser. Returns (lr, loss, correct, count, tokens) of this process."""
    args, dist = run.args, run.dist
    lr = learning_rate(args, it + 1)
    for group in run.optimizer.param_groups:
        group["lr"] = lr * group["lr_scale"]
    # the data and the dropout of step `it` depend on (seed, it) alone: resuming replays them exactly.
    # torchrun: every process draws the same global batch and takes its share; its own dropout masks
    rng = np.random.default_rng([args.seed, it])
    torch.manual_seed(step_seed(args.seed, it, dist.rank))
    loss_sum, correct, count, tokens = 0.0, 0, 0, 0
    for micro in range(args.grad_accum):
        x, y = train.sample(args.batch_size * dist.world, rng)
        if it < args.short_steps and kind != "lm":
            x = x[..., :args.short_len]
        tokens += train.tokens_in(x)
        x, y = dist.share(x).to(dist.device), dist.share(y).to(dist.device)
        last = micro == args.grad_accum - 1                  # DDP: gradients averaged after the last micro-batch
        with contextlib.nullcontext() if last or not dist.on else train_model.no_sync():
            with run.autocast:
                logits, loss = train_model(x, y)
            (loss / args.grad_accum).backward()
        loss_sum += loss.item() / args.grad_accum
        if logits.dim() == 2:
            correct += (logits.argmax(-1) == y).sum().item()
            count += y.numel()
    if args.grad_clip > 0:
        torch.nn.utils.clip_grad_norm_(run.model.parameters(), args.grad_clip)
    run.optimizer.step()
    run.optimizer.zero_grad(set_to_none=True)
    return lr, loss_sum, correct, count, tokens


def train_loop(run, train_model, task, train, start):
    """Steps from `start` to --max_iters, the time limit or Ctrl-C: a log.jsonl record a step, the progress line
    every log_interval steps, val and the checkpoint every eval_interval. Returns (the last step, why it stopped,
    the tokens trained on, the seconds of training)."""
    args, dist = run.args, run.dist
    if args.attn_std_interval:                               # one fixed val batch, drawn without the training rng
        std_batch = (task.split("val") if task.has("val") else train).sample(
            min(args.batch_size, 64), np.random.default_rng(4321))[0].to(dist.device)

    def log_attention_std(it):
        if args.attn_std_interval and (it % args.attn_std_interval == 0 or it == args.max_iters) and dist.master:
            run.write({"step": it, **simpletron.attention_std(run.model, std_batch), "time": round(run.seconds(), 3)})

    if start == 0:
        log_attention_std(0)
    it, tokens, t_train, stopped = start, 0, 0.0, "max_iters"
    window = {"loss": 0.0, "correct": 0, "count": 0, "steps": 0, "seconds": 0.0}  # one log interval
    try:
        while it < args.max_iters:
            if args.time_limit is not None and dist.any(past_time_limit(args.time_limit, time.time() - run.t_start)):
                stopped = f"time_limit ({args.time_limit} min)"
                break
            t0 = time.time()
            lr, loss_sum, correct, count, n_tokens = train_step(run, train_model, train, task.kind, it)
            it, tokens = it + 1, tokens + n_tokens
            if dist.on:                                      # averages over all the processes' examples
                loss_sum, correct, count = dist.sum(loss_sum, correct, count)
                loss_sum /= dist.world
            t_train += time.time() - t0
            record = {"step": it, "loss": loss_sum, "lr": lr, "time": round(run.seconds(), 3)}
            run.write({**record, "acc": correct / count} if count else record)
            log_attention_std(it)
            for k, v in (("loss", loss_sum), ("correct", correct), ("count", count), ("steps", 1),
                         ("seconds", time.time() - t0)):
                window[k] += v
            if it % args.log_interval == 0 or it == args.max_iters:
                eta = seconds_left(args.max_iters - it, window["seconds"], window["steps"])
                acc = f" | acc {window['correct'] / window['count']:.3f}" if window["count"] else ""
                print(f"step {it}/{args.max_iters} | loss {window['loss'] / window['steps']:.4f}{acc} | lr {lr:.2e}"
                      f" | {per_second(tokens, t_train) / 1e3:.1f}k tok/s | eta {eta / 60:.1f} min", flush=True)
                window = dict.fromkeys(window, 0)
            if (it % args.eval_interval == 0 or it == args.max_iters) and task.has("val"):
                m = evaluate(run.model, task.split("val"), args.batch_size * dist.world, dist.device, run.autocast,
                             args.eval_iters, dist=dist)
                print(f"step {it} val: {fmt(m)}", flush=True)
                run.write({"step": it, **{f"val_{k}": v for k, v in m.items()}, "time": round(run.seconds(), 3)})
                run.log.flush()
                run.save(it)
    except KeyboardInterrupt:
        stopped = "interrupted"
        launch = f"torchrun --nproc_per_node={dist.world}" if dist.on else "python"
        print(f"\ninterrupted at step {it}; continue with: {launch} train.py --resume --out_dir {args.out_dir}")
    return it, stopped, tokens, t_train


def final_metrics(model, task, args, dist, autocast, extra):
    """Every example of val and test, printed and written to out_dir/metrics.json with `extra` and the settings."""
    out = {"model": args.model, "task": args.task}
    for split in ("val", "test"):
        if task.has(split):
            m = evaluate(model, task.split(split), args.batch_size * dist.world, dist.device, autocast, dist=dist,
                         progress=f"evaluating {split}" if dist.master else None)
            print(f"{split}: {fmt(m)}")
            out.update({f"{split}_{k}" if k != "n" else f"n_{split}": v for k, v in m.items()})
    out.update(extra, world_size=dist.world, config=dataclasses.asdict(model.config), args=run_args(args))
    if dist.master:
        data.atomic_write_text(os.path.join(args.out_dir, "metrics.json"), json.dumps(out, indent=2) + "\n")
        print(f"wrote {os.path.join(args.out_dir, 'metrics.json')}")
    return out


def main(argv=None):
    t_start = time.time()
    args, given, config_names = parse_args(sys.argv[1:] if argv is None else argv, __doc__)

    # the settings: the flags given > a resumed run's > the --init_from checkpoint's > the preset > the defaults
    source = inherit_from(args, given)                       # --init_from: its model, its task unless given
    batch_given = "batch_size" in given
    ckpt = resume_state(args, given)                         # --resume: the run's own flags
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
    args.out_dir = args.out_dir or os.path.join("out", f"{args.model}-{args.task}")
    check_args(args)                                         # every flag, before any data is read
    args.device = pick_device(args.device)
    dist = Distributed(args.device)                          # torchrun's processes, or this one alone
    if ckpt is not None and ckpt.get("world_size", 1) != dist.world and not batch_given:
        rescale_batch(ckpt, dist, args)                      # resumed on another number of processes
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if args.device == "cuda" else contextlib.nullcontext()
    torch.manual_seed(args.seed)

    # the model's settings: a resumed run's, the --init_from checkpoint's with the fields given, or new
    if ckpt is not None:
        config_dict = ckpt["config"]
    elif source is not None:
        config_dict = {**source["config"], **{k: v for k, v in overrides.items() if k in given}}
    else:
        config_dict = dict(MODELS[args.model][1], **overrides)
    check_config(args.model, config_dict)                    # bad settings fail before any data is loaded
    data.remove_stale_temps(args.out_dir)                    # what a killed checkpoint write left
    task = dist.rank0_first(lambda: open_task(args, config_dict, dist))  # rank 0 first, the others read its cache
    config_dict = fit_to_task(config_dict, task, args.task, source is not None or ckpt is not None, pretrained)
    model = build_run_model(args, config_dict, source, ckpt, pretrained).to(args.device)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"{args.model} on {args.task} ({args.device}{f' x {dist.world} processes' if dist.on else ''}): "
          f"{n_params / 1e6:.2f}M parameters | {fmt(dataclasses.asdict(model.config))}")
    if args.time_limit is not None:                          # a preset's limit is never silent
        print(f"training stops after {args.time_limit:g} min of wall time"
              f"{'' if 'time_limit' in given else f' (the {args.preset} preset; --time_limit to change)'}")
    if dist.master:
        os.makedirs(args.out_dir, exist_ok=True)
    if args.eval_only:
        if source is None:
            raise UsageError("--eval_only needs --init_from CKPT")
        return final_metrics(model, task, args, dist, autocast, {"iters": 0, "seconds": time.time() - t_start})

    # training, from step 0 or from the checkpoint's step with its optimiser's state
    train = task.split("train") if args.n_train is None else task.split("train").subset(args.n_train)
    train_model = training_model(model, train, args, dist, autocast)
    optimizer = make_optimizer(model, args, args.device)
    start, gate_start = 0, {name: p.item() for name, p in model.named_parameters() if p.dim() == 0}
    if ckpt is not None:
        if len(ckpt["optimizer"]["param_groups"]) != len(optimizer.param_groups):
            raise UsageError(f"{args.out_dir}/ckpt.pt was written by an older train.py (other optimiser groups); "
                             "start a new run instead of --resume")
        optimizer.load_state_dict(ckpt["optimizer"])
        start, gate_start = ckpt["iter"], ckpt.get("gate_start", gate_start)
        print(f"resuming {args.out_dir} at step {start}")
    run = Run(args, dist, autocast, model, optimizer, gate_start, open_log(args.out_dir, ckpt, start, dist.master),
              t_start, ckpt.get("time", 0.0) if ckpt is not None else 0.0)
    it, stopped, tokens, t_train = train_loop(run, train_model, task, train, start)
    run.save(it)
    run.log.close()
    if stopped == "interrupted" and dist.on:                 # the other processes may be anywhere: no evaluation
        return None
    if stopped != "max_iters":
        print(f"stopped at step {it}: {stopped}")
    gates = gate_report(model, gate_start, args, it)
    for name, g in gates.items():
        print(f"gate {name}: {g['start']:+.3f} -> {g['value']:+.3f}, {100 * g['used']:.0f}% of the "
              f"{g['budget']:.2f} its learning rate allowed")
    return final_metrics(model, task, args, dist, autocast,
                         {"iters": it, "stopped": stopped, "seconds": time.time() - t_start, "train_seconds": t_train,
                          "tokens_per_s": per_second(tokens, t_train), "n_params": n_params, "gates": gates})


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
