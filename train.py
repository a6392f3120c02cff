"""
Train or evaluate any model of this project on any task, on one GPU or a CPU.

    python train.py --model simpletron --task listops              # the CPU preset: minutes on a laptop
    python train.py @recipes/quickstart.txt --max_iters 2000       # a recipe: the flags in a file, then these
    python train.py --model simpletron --task listops --preset paper --device cuda
    python train.py --model softmax --task ptb --data_dir DIR --n_layer 2   # DIR: ptb.{train,valid,test}.txt
    python train.py --help --model transject --task imdb [--preset paper]   # [the values this run would use]
    python train.py --resume --out_dir out/simpletron-listops     # continue a run exactly
    python train.py --init_from out/x/ckpt.pt --eval_only --task listops --data_dir lra/listops-1000
    torchrun --standalone --nproc_per_node=8 train.py --model softmax --task ptb --preset paper --batch_size 2

Settings are layered: the model's Config defaults < what the task fixes (vocabulary, length, head) <
the preset (--preset cpu|paper) < the flags you give. Every field of the model's Config is a flag.
A run writes its folder, one train.py at a time (rundir.py: ckpt.pt and best.pt at every evaluation, log.jsonl,
loss.png, metrics.json at the end). Exit status: 2 bad input or a failed write, 3 a loss that is not finite, 130
Ctrl-C, 143 SIGTERM (both keep ckpt.pt of the last whole step). Under torchrun (DistributedDataParallel, one device
per process) --batch_size is per process: N processes with batch b train as one process with batch N * b
(docs/multigpu.md).
"""

import collections
import contextlib
import dataclasses
import math
import os
import re
import signal
import socket
import sys
import threading
import time

if __name__ == "__main__":                                   # Ctrl-C while torch loads: stop at once, quietly
    signal.signal(signal.SIGINT, signal.SIG_DFL)             # (the handlers at the end report it once running)

import numpy as np  # noqa: E402


def env_number(name):
    """torchrun's RANK, LOCAL_RANK or WORLD_SIZE (0 when unset); one that is no number is 0 here, refused by main()."""
    value = os.environ.get(name, "0")
    return int(value) if re.fullmatch(r"[0-9]+", value) else 0


if env_number("RANK"):                                      # torchrun: progress bars on rank 0 only
    os.environ.setdefault("TQDM_DISABLE", "1")
# oneDNN keeps a compiled kernel per tensor shape met; batches of hundreds of lengths kept 3 GB through them
os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "0")
from tqdm import tqdm  # noqa: E402

import data  # noqa: E402  (data first: it loads torch, and a TORCH_* setting torch refuses is one line there)
import torch  # noqa: E402
import rundir  # noqa: E402
import simpletron  # noqa: E402
from config import TASK_FLAGS, UsageError, load_checkpoint, machine, model_call, unused_fields  # noqa: E402
from ddp import Distributed, build_every_split, step_seed, training_model  # noqa: E402
from measure import keep_freed_memory  # noqa: E402
from runsetup import (build_run_model, check_best_record, check_prefixes, fit_to_task, load_weights,  # noqa: E402
                      precision, rescale_batch, restore_optimizer, settings)

keep_freed_memory()             # a step's tensors reuse the last step's memory, not pages faulted in afresh


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
                             fused=device == "cpu" or device.startswith("cuda"))  # one kernel for all parameters


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


def answer_counts(logits, y):
    """Answer positions (targets other than -1) of a batch: (answers right, answers, examples with every answer
    right, examples). logits (B, L, V), y (B, L)."""
    answer = y != -1
    right = (logits.argmax(-1) == y) & answer
    return right.sum().item(), answer.sum().item(), (right == answer).all(-1).sum().item(), y.shape[0]


@torch.no_grad()
def evaluate(model, split, batch_size, device, autocast, max_batches=None, seed=1234, dist=None, progress=None,
             stop=None, name=None):
    """Loss and accuracy (cls, match) or perplexity (lm) over a split, or over max_batches fixed batches.
    dist (torchrun): each process evaluates its share of every batch of batch_size and the sums are added over
    the processes, so the metrics are one process's with that batch. progress: title of a progress bar.
    stop: a CtrlC; None (on every process) if it was asked to stop between two batches. name: the model's, in
    config.MODELS (its forward's failure: one line naming its file)."""
    model.eval()
    if max_batches is None or max_batches * batch_size >= len(split):   # (a sample as large as the split: all of it)
        batches, n_batches = split.batches(batch_size), -(-len(split) // batch_size)
    else:
        rng = np.random.default_rng(seed)
        batches, n_batches = (split.sample(batch_size, rng) for _ in range(max_batches)), max_batches
    if progress:                                             # on a terminal only
        batches = tqdm(batches, desc=progress, total=n_batches, unit="batch", leave=False, disable=None)
    total_loss, correct, count, stopped = 0.0, 0, 0, False
    answers, right_examples, examples = getattr(split, "answers", False), 0, 0
    for x, y in batches:
        if stop is not None and stop.asked:
            stopped = True
            break
        if dist is not None:
            x, y = dist.share(x), dist.share(y)
            if not len(y):                                   # a last batch with fewer examples than processes
                continue
        x, y = x.to(device), y.to(device)
        with autocast:                                       # (name None: a model config.MODELS lacks, a test's)
            out = model_call(name, "forward", model, x, y) if name else model(x, y)
            logits, loss = forward_output(out, name or type(model).__module__, y, grad=False)
        n = y.numel()
        if answers:                                          # the loss is the mean over the answers
            right, n, right_ex, n_ex = answer_counts(logits, y)
            correct, right_examples, examples = correct + right, right_examples + right_ex, examples + n_ex
        elif logits.dim() == 2:
            correct += (logits.argmax(-1) == y).sum().item()
        total_loss += loss.item() * n
        count += n
    if dist is not None:
        total_loss, correct, count, stopped, right_examples, examples = dist.sum(
            total_loss, correct, count, stopped, right_examples, examples)
        correct, count, right_examples, examples = int(correct), int(count), int(right_examples), int(examples)
    model.train()
    if stopped:
        return None
    out = {"loss": total_loss / count, "n": examples if answers else count}
    if isinstance(split, data.LMSplit):
        out["ppl"] = math.exp(out["loss"]) if out["loss"] < 709.78 else math.inf     # (past it, exp overflows)
    else:                                                    # answers: per answer token, and per example
        out["acc"] = correct / count
    if answers:
        out["acc_example"] = right_examples / examples
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
# Training

class Interrupted(Exception):
    """Ctrl-C or SIGTERM: the run stopped between two steps or evaluation batches; the message says how to go on
    (exit status 130, SIGTERM's 143)."""

    def __init__(self, message, status=130):
        super().__init__(message)
        self.status = status


class CtrlC:
    """While training and evaluating: the first Ctrl-C (SIGINT) or SIGTERM (kill, a job scheduler's limit) asks the
    run to stop, which it does between two steps or evaluation batches; a second one stops it at once
    (KeyboardInterrupt or data.Terminated, nothing written)."""

    SIGNALS = {signal.SIGINT: ("Ctrl-C", "interrupted", 130), signal.SIGTERM: ("SIGTERM", "terminated (SIGTERM)", 143)}

    def __init__(self, master):
        self.asked, self.master, self.previous = False, master, {}
        self.said = "interrupted"                            # what stopped the run, in words ...
        self.status = 130                                    # ... and its exit status

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():        # signals reach the main thread only
            self.previous = {s: signal.signal(s, self.handle) for s in self.SIGNALS}
        return self

    def handle(self, signum, frame):
        if self.asked:
            raise KeyboardInterrupt if signum == signal.SIGINT else data.Terminated
        name, self.said, self.status = self.SIGNALS[signum]
        self.asked = True
        if self.master:                                      # os.write to stderr: no print() in a signal handler
            with contextlib.suppress(OSError):
                os.write(2, f"\n{name}: stopping after this step ({name} again: at once)\n".encode())

    def __exit__(self, *exc):
        for s, handler in self.previous.items():
            signal.signal(s, handler)


class Run:
    """What the steps of one run share: its settings, processes, model and optimiser, its folder (rank 0 writes its
    files) and its clock, which counts the run's seconds over all its sessions (--resume)."""

    def __init__(self, args, dist, autocast, scaler, model, optimizer, folder, t_start, ckpt):
        self.args, self.dist, self.autocast, self.model, self.optimizer = args, dist, autocast, model, optimizer
        self.scaler = scaler                                 # float16's GradScaler (disabled otherwise)
        self.folder, self.t_start, self.time_before, self.saved_now = folder, t_start, 0.0, None
        self.gate_start = {name: p.item() for name, p in model.named_parameters() if p.dim() == 0}
        if ckpt is not None:
            self.gate_start, self.time_before = ckpt.get("gate_start", self.gate_start), ckpt.get("time", 0.0)
            folder.resumed(ckpt)

    def seconds(self):
        return self.time_before + time.time() - self.t_start

    def save(self, it):
        """ckpt.pt after step `it` (once a step)."""
        if self.saved_now != it:
            self.folder.checkpoint(it, self.args, self.model, optimizer=self.optimizer.state_dict(),
                                   scaler=self.scaler.state_dict(), gate_start=self.gate_start,
                                   world_size=self.dist.world, time=self.seconds())
            self.saved_now = it


class Pace:
    """The seconds per step of this session's last `window` steps, those on --short_steps prefixes apart (faster)."""

    def __init__(self, window=50):
        self.prefix, self.full = collections.deque(maxlen=window), collections.deque(maxlen=window)

    def add(self, seconds, on_prefix):
        (self.prefix if on_prefix else self.full).append(seconds)

    def eta(self, it, args, prefix_steps, seconds_left_in_limit=None):
        """The time left, in words: at the prefix steps' pace while on prefixes, else the full-length pace, capped by
        what is left of --time_limit."""
        if it < prefix_steps:
            t = seconds_left(min(prefix_steps, args.max_iters) - it, sum(self.prefix), len(self.prefix))
            then = " for the prefix steps, then longer" if prefix_steps < args.max_iters else ""
            return f"eta {t / 60:.1f} min{then}"
        if not self.full:
            return "eta after the first full-length steps"
        t = seconds_left(args.max_iters - it, sum(self.full), len(self.full))
        if seconds_left_in_limit is not None and seconds_left_in_limit < t:
            return f"eta {max(0.0, seconds_left_in_limit) / 60:.1f} min (--time_limit)"
        return f"eta {t / 60:.1f} min"


def loss_problem(loss, grad=True):
    """What keeps a forward's loss from being one floating-point number (with its gradient when training); None:
    nothing."""
    if not isinstance(loss, torch.Tensor):
        return "None" if loss is None else f"a {type(loss).__name__}, not a tensor"
    if loss.numel() != 1:
        return f"a tensor of shape {tuple(loss.shape)}, not one number"
    if not loss.is_floating_point():
        return f"a tensor of {loss.dtype}"
    return None if loss.requires_grad or not grad else "a tensor with no gradient (detached, or computed under " \
        "torch.no_grad)"


def forward_output(out, name, targets=None, grad=True):
    """A forward's (logits, loss), held to the interface docs/architecture.md gives a model (a fork's model may break
    it): a pair, its logits floating-point scores of the targets' shape and one more dimension (classes or tokens;
    given no targets, unchecked), its loss a tensor of one floating-point number, with its gradient when training
    (grad). Attribute reads only (no device sync): checked at every micro-batch before the backward, so before the
    first step is counted, and at every batch of an evaluation."""
    if not (isinstance(out, tuple) and len(out) == 2):   # (a fork's model: the interface is nanoGPT's)
        raise UsageError(f"model {name}'s forward returned {type(out).__name__}, not (logits, loss): "
                         "return both, as docs/architecture.md says")
    logits, loss = out
    problem = loss_problem(loss, grad)
    if problem:
        raise UsageError(f"model {name}'s forward returned (logits, loss) with loss {problem}: with targets given, "
                         "the loss must be a tensor holding one floating-point number with its gradient (the batch's "
                         "mean, as F.cross_entropy returns it), as docs/architecture.md says")
    if targets is not None and not (isinstance(logits, torch.Tensor) and logits.is_floating_point()
                                    and logits.shape[:-1] == targets.shape):
        shown = (f"a tensor of {logits.dtype} of shape {tuple(logits.shape)}" if isinstance(logits, torch.Tensor)
                 else "None" if logits is None else f"a {type(logits).__name__}, not a tensor")
        raise UsageError(f"model {name}'s forward returned (logits, loss) with logits {shown}: for targets of shape "
                         f"{tuple(targets.shape)} the logits must be a floating-point tensor of shape "
                         f"({', '.join(map(str, [*targets.shape, 'V']))}): V scores (classes or tokens) a target, as "
                         "docs/architecture.md says")
    return out


def checked_forward(model, x, y, name):
    """model(x, y) in training: a failure of the model's code, or an output that breaks the interface, one line."""
    return forward_output(model_call(name, "forward", model, x, y), name, y)


def train_step(run, train_model, train, kind, it):
    """Step it + 1: grad_accum micro-batches of the global batch (this process's share of each), then the
    optimiser, unless the loss or the gradient is not finite (Diverged; under float16's scaler a gradient that is
    not finite skips the step instead). Returns (lr, loss, correct, count, tokens): the loss and accuracy over every
    process's examples, the tokens of this process."""
    args, dist = run.args, run.dist
    lr = learning_rate(args, it + 1)
    for group in run.optimizer.param_groups:
        group["lr"] = lr * group["lr_scale"]
    # the data and the dropout of step `it` depend on (seed, it) alone: resuming replays them exactly.
    # torchrun: every process draws the same global batch and takes its share; its own dropout masks.
    # A CPU's generator is seeded alone: torch.manual_seed also queues CUDA's seed, with a traceback (0.4 ms a step)
    rng = np.random.default_rng([args.seed, it])
    seed = step_seed(args.seed, it, dist.rank)
    (torch.random.default_generator.manual_seed if dist.device == "cpu" else torch.manual_seed)(seed)
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
                logits, loss = checked_forward(train_model, x, y, args.model)
            model_call(args.model, "its backward pass",      # (float16: the loss times the scale)
                       run.scaler.scale(loss / args.grad_accum).backward)
        loss_sum += loss.item() / args.grad_accum
        if logits.dim() == 2:
            correct += (logits.argmax(-1) == y).sum().item()
            count += y.numel()
        elif getattr(train, "answers", False):              # per answer token
            right, answers, _, _ = answer_counts(logits.detach(), y)
            correct, count = correct + right, count + answers
    run.scaler.unscale_(run.optimizer)                       # float16: the gradients divided by the scale
    # the gradient's norm, clipped to grad_clip (0: not clipped, the norm only: a factor of 1 changes no number)
    grad_norm = torch.nn.utils.clip_grad_norm_(run.model.parameters(), args.grad_clip or math.inf).item()
    if dist.on:                                              # averages over all the processes' examples
        loss_sum, correct, count = dist.sum(loss_sum, correct, count)
        loss_sum /= dist.world
    watched = {"the loss": loss_sum, "the gradient's norm": grad_norm}
    if run.scaler.is_enabled():                              # float16: a gradient that is not finite skips the step
        del watched["the gradient's norm"]
    for what, value in watched.items():
        if not math.isfinite(value):                         # the same on every process (summed, all-reduced)
            raise run.folder.diverged(it + 1, f"{what} is {value}", args.grad_clip)
    run.scaler.step(run.optimizer)                           # float16: skipped if a gradient is inf or nan ...
    run.scaler.update()                                      # ... and the scale halved
    run.optimizer.zero_grad(set_to_none=True)
    return lr, loss_sum, correct, count, tokens


def prefix_steps(run, task):
    """The steps on --short_len prefixes (none for a language model, or if a prefix holds the model's whole block)."""
    return run.args.short_steps if task.kind != "lm" and run.args.short_len < run.model.config.block_size else 0


def stop_reason(run, ctrl_c):
    """Why the run stops before its next step (Ctrl-C, --time_limit), the same on every process; None: it goes on."""
    late = past_time_limit(run.args.time_limit, time.time() - run.t_start)
    asked, late = (v > 0 for v in run.dist.sum(float(ctrl_c.asked), float(late)))
    return "interrupted" if asked else f"time_limit ({run.args.time_limit} min)" if late else None


def evaluate_during_training(run, task, it, ctrl_c):
    """val on --eval_iters fixed batches, its log record, best.pt if it is the best so far, ckpt.pt and the loss
    curves. False if Ctrl-C stopped it."""
    args, dist, split = run.args, run.dist, task.split("val")
    m = evaluate(run.model, split, args.batch_size * dist.world, dist.device, run.autocast, args.eval_iters,
                 dist=dist, stop=ctrl_c, name=args.model)
    if m is None:
        return False
    lm = isinstance(split, data.LMSplit)
    unit, total = ("tokens", len(split) * split.block_size) if lm else ("examples", len(split))
    part = (f"all {total:,} {unit}" if m["n"] == total else
            f"{m['n']:,} of {total:,} {unit}, --eval_iters {args.eval_iters}")
    print(f"step {it} val ({part}): {fmt({k: v for k, v in m.items() if k != 'n'})}", flush=True)
    run.folder.write({"step": it, **{f"val_{k}": v for k, v in m.items()}, "time": round(run.seconds(), 3)})
    run.folder.flush()
    run.folder.keep_if_best(it, m, args, run.model)
    run.save(it)
    run.folder.plot(prefix_steps(run, task), f"{args.model} on {args.task}")
    return True


def train_loop(run, train_model, task, train, start, ctrl_c):
    """Steps from `start` to --max_iters, the time limit or Ctrl-C: a log.jsonl record a step, the progress line
    every log_interval steps, val and the checkpoints every eval_interval. Returns (the last step, why it stopped,
    the tokens trained on, the seconds of training)."""
    args, dist = run.args, run.dist
    if args.attn_std_interval:                               # one fixed val batch, drawn without the training rng
        std_batch = (task.split("val") if task.has("val") else train).sample(
            min(args.batch_size, 64), np.random.default_rng(4321))[0].to(dist.device)

    def log_attention_std(it):
        if args.attn_std_interval and (it % args.attn_std_interval == 0 or it == args.max_iters) and dist.master:
            std = simpletron.attention_std(run.model, std_batch)
            run.folder.write({"step": it, **std, "time": round(run.seconds(), 3)})

    if start == 0:
        log_attention_std(0)
    it, tokens, t_train, pace = start, 0, 0.0, Pace()
    prefix = prefix_steps(run, task)
    window = {"loss": 0.0, "correct": 0, "count": 0, "steps": 0}             # one log interval
    while it < args.max_iters:
        stopped = stop_reason(run, ctrl_c)
        if stopped:
            return it, stopped, tokens, t_train
        t0 = time.time()
        lr, loss, correct, count, n_tokens = train_step(run, train_model, train, task.kind, it)
        it, tokens = it + 1, tokens + n_tokens
        t_train += time.time() - t0
        pace.add(time.time() - t0, it <= prefix)
        record = {"step": it, "loss": loss, "lr": lr, "time": round(run.seconds(), 3),
                  **({"scale": run.scaler.get_scale()} if run.scaler.is_enabled() else {})}   # float16's scale
        run.folder.write({**record, "acc": correct / count} if count else record)
        log_attention_std(it)
        for k, v in (("loss", loss), ("correct", correct), ("count", count), ("steps", 1)):
            window[k] += v
        if it % args.log_interval == 0 or it == args.max_iters:
            limit_left = None if args.time_limit is None else 60 * args.time_limit - (time.time() - run.t_start)
            acc = f" | acc {window['correct'] / window['count']:.3f}" if window["count"] else ""
            print(f"step {it}/{args.max_iters} | loss {window['loss'] / window['steps']:.4f}{acc} | lr {lr:.2e}"
                  f" | {per_second(tokens, t_train) / 1e3:.1f}k tok/s | {pace.eta(it, args, prefix, limit_left)}",
                  flush=True)
            window = dict.fromkeys(window, 0)
        if (it % args.eval_interval == 0 or it == args.max_iters) and task.has("val"):
            if not evaluate_during_training(run, task, it, ctrl_c):
                return it, "interrupted", tokens, t_train
    return it, "max_iters", tokens, t_train


def whole_splits(model, task, args, dist, autocast, ctrl_c, label=""):
    """Every example of val and test, printed; Interrupted by Ctrl-C."""
    out = {}
    for split in ("val", "test"):
        if task.has(split):
            m = evaluate(model, task.split(split), args.batch_size * dist.world, dist.device, autocast, dist=dist,
                         progress=f"evaluating {label}{split}" if dist.master else None, stop=ctrl_c, name=args.model)
            if m is None:
                raise Interrupted(f"{ctrl_c.said} while evaluating {split} (no metrics.json)", ctrl_c.status)
            print(f"{label}{split}: {fmt(m)}")
            out.update({f"{split}_{k}" if k != "n" else f"n_{split}": v for k, v in m.items()})
    return out


def final_metrics(model, task, args, dist, autocast, folder, ctrl_c, extra, best=None):
    """The model's val and test metrics and, when the run kept a best.pt, best.pt's (copied when it is the final
    step's), printed and written to out_dir/metrics.json with `extra` and the settings."""
    out = {"model": args.model, "task": args.task, **whole_splits(model, task, args, dist, autocast, ctrl_c)}
    out.update(extra, world_size=dist.world, machine=machine(dist.device), config=dataclasses.asdict(model.config),
               args=rundir.run_args(args))
    if best is not None:                                     # best.pt's weights (the model's at the final step)
        final = best["step"] == out["iters"]
        if not final:                                        # (rank 0 reads the file, the others get its weights)
            load_weights(model, dist.from_rank0(lambda: load_checkpoint(folder.file("best.pt"))["model"]), "best.pt")
        m = out if final else whole_splits(model, task, args, dist, autocast, ctrl_c, f"best.pt (step {best['step']}) ")
        out["best"] = {"step": best["step"], **{k: v for k, v in m.items() if k.startswith(("val_", "test_"))}}
    folder.write_metrics(out)
    return out


# ----------------------------------------------------------------------------------------------
# main, in its steps

def open_task(args, config_dict, dist):
    """The task, every split the run uses loaded and checked (under torchrun: built and cached in full)."""
    task = data.load_task(args.task, cache_dir=args.cache_dir, data_dir=args.data_dir, seed=args.seed,
                          tokenizer=args.tokenizer, **{k: getattr(args, k) for k in TASK_FLAGS},
                          **({"block_size": config_dict["block_size"]} if "block_size" in config_dict else {}))
    task.open(training=not args.eval_only)
    if dist.on:
        build_every_split(task, args.eval_only, args.n_train)
    return task


def model_line(args, dist, model):
    """One screen line: the model, task, device, size and shape (the full config is in ckpt.pt and metrics.json)."""
    shown = [k for k in ("n_layer", "n_head", "n_embd", "block_size", "vocab_size")
             if k not in unused_fields(args.model)]                    # (TransJect has no heads)
    shape = " ".join(f"{k} {getattr(model.config, k)}" for k in shown)
    where = f"{args.device}{f' x {dist.world} processes' if dist.on else ''}"
    size = sum(p.numel() for p in model.parameters()) / 1e6
    return f"{args.model} on {args.task} ({where}): {size:.2f}M params, {shape}"


def train_session(args, dist, folder, train, task, model, ckpt, autocast, scaler, t_start):
    """Training from step 0 or from the checkpoint's step with its optimiser's state, then the final evaluation;
    Ctrl-C or SIGTERM stops it between two steps (Interrupted)."""
    train_model = training_model(model, train, args, dist, autocast,
                                 lambda m, x, y: checked_forward(m, x, y, args.model))
    optimizer = make_optimizer(model, args, args.device)
    start = restore_optimizer(optimizer, scaler, ckpt, args.out_dir)
    run = Run(args, dist, autocast, scaler, model, optimizer, folder, t_start, ckpt)
    folder.open_log(start if ckpt is not None else None, run.seconds())
    if start < args.max_iters:                               # an older metrics.json would not describe ckpt.pt
        folder.discard("metrics.json")
    again = f"continue with: {rundir.resume_command(args.out_dir, dist.world)}"
    with CtrlC(dist.master) as ctrl_c:
        it, stopped, tokens, t_train = train_loop(run, train_model, task, train, start, ctrl_c)
        run.save(it)
        folder.flush()
        if stopped == "interrupted":
            raise Interrupted(f"{ctrl_c.said} at step {it:,} of {args.max_iters:,}; {again}", ctrl_c.status)
        if stopped != "max_iters":
            print(f"stopped at step {it:,} of {args.max_iters:,} (--time_limit {args.time_limit:g} min); {again}")
        gates = gate_report(model, run.gate_start, args, it)
        for name, g in gates.items():
            print(f"gate {name}: {g['start']:+.3f} -> {g['value']:+.3f}, {100 * g['used']:.0f}% of the "
                  f"{g['budget']:.2f} its learning rate allowed")
        extra = {"iters": it, "stopped": stopped, "seconds": time.time() - t_start, "train_seconds": t_train,
                 "tokens_per_s": per_second(tokens, t_train), "n_params": sum(p.numel() for p in model.parameters()),
                 "gates": gates}
        try:
            return final_metrics(model, task, args, dist, autocast, folder, ctrl_c, extra, folder.best)
        except Interrupted as e:
            raise Interrupted(f"{e}; {again}", e.status) from None


def check_torchrun_env():
    """torchrun's variables, before any work: RANK and WORLD_SIZE (both or neither, process numbers), and with them
    MASTER_ADDR, a machine's name that resolves, and MASTER_PORT, a port number."""
    bad = next((k for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE")
                if k in os.environ and not re.fullmatch(r"[0-9]+", os.environ[k])), None)
    if bad:
        raise UsageError(f"the environment variable {bad}={os.environ[bad]!r} is no process number (torchrun sets it): "
                         f"unset {bad}, or start the run with torchrun")
    rank, world = (int(os.environ.get(k, -1)) for k in ("RANK", "WORLD_SIZE"))
    if ("RANK" in os.environ) != ("WORLD_SIZE" in os.environ) or "RANK" in os.environ and not 0 <= rank < world:
        rank, world = (os.environ.get(k, "(unset)") for k in ("RANK", "WORLD_SIZE"))
        raise UsageError(f"RANK={rank} with WORLD_SIZE={world}: a process's rank is 0 .. WORLD_SIZE - 1 (torchrun sets "
                         "both); unset them, or start the run with torchrun")
    addr, port = (os.environ.get(k, "") for k in ("MASTER_ADDR", "MASTER_PORT"))
    if "RANK" in os.environ and not (addr and re.fullmatch(r"[0-9]{1,5}", port) and 1 <= int(port) <= 65535):
        raise UsageError(f"RANK is set but MASTER_ADDR or MASTER_PORT (a port number 1 .. 65535) is not (MASTER_ADDR="
                         f"{data.one_line(repr(addr), 60)}, MASTER_PORT={data.one_line(repr(port), 20)}): torchrun "
                         "sets all three; unset RANK and WORLD_SIZE, or start the run with torchrun")
    if "RANK" in os.environ and (problem := address_problem(addr)):
        raise UsageError(f"MASTER_ADDR={data.one_line(repr(addr), 60)} is no address of a machine ({problem}): "
                         "torchrun sets it (--master_addr, --rdzv_endpoint; one machine: --standalone)")


def address_problem(host, seconds=10):
    """Why host resolves to no address (socket.getaddrinfo, which has no timeout: waited for `seconds`), or None."""
    found = []

    def look():
        try:
            found.append(None if socket.getaddrinfo(host, None) else "no address")
        except (OSError, UnicodeError, ValueError) as e:
            found.append(data.one_line(e, 80))
    thread = threading.Thread(target=look, daemon=True)
    thread.start()
    thread.join(seconds)
    return found[0] if found else f"not resolved within {seconds} s"


def main(argv=None):
    t_start = time.time()
    check_torchrun_env()
    args, typed, source, ckpt, pretrained, config_dict = settings(
        sys.argv[1:] if argv is None else argv, __doc__ or "Train or evaluate any model of this project on any task.")
    dist = Distributed(args.device)                          # torchrun's processes, or this one alone
    if ckpt is not None and ckpt.get("world_size", 1) != dist.world and "batch_size" not in typed:
        rescale_batch(ckpt, dist, args)                      # resumed on another number of processes
    folder = dist.rank0_first(lambda: rundir.RunDir(args, dist.master))  # one train.py a folder, before any data
    try:
        dtype, autocast, scaler = precision(args.dtype, dist.device)
        torch.manual_seed(args.seed)
        task = dist.rank0_first(lambda: open_task(args, config_dict, dist))  # rank 0 first, the others read its cache
        config_dict = fit_to_task(config_dict, task, args.task, ckpt or source, pretrained)
        folder.vocabulary = task.vocabulary                  # (recorded in every checkpoint: what the ids stand for)
        check_prefixes(args, typed, task, config_dict["block_size"])
        model = build_run_model(args, config_dict, source, ckpt, pretrained).to(args.device)
        train = None if args.eval_only else task.split("train")
        if args.n_train is not None and train is not None:
            train = train.subset(args.n_train)               # (--n_train checked: too few tokens for a window)
        if ckpt is not None and train is not None:
            check_best_record(ckpt, train, args.out_dir)
        folder.discard(*folder.replaced)                     # --overwrite: the old run goes once every check passed
        print(model_line(args, dist, model) + f", {dtype} autocast" * (dtype != "float32"), flush=True)
        if args.time_limit is not None:
            print(f"training stops after {args.time_limit:g} min of wall time (--time_limit)")
        if not args.eval_only:
            return train_session(args, dist, folder, train, task, model, ckpt, autocast, scaler, t_start)
        with CtrlC(dist.master) as ctrl_c:
            return final_metrics(model, task, args, dist, autocast, folder, ctrl_c,
                                 {"iters": 0, "seconds": time.time() - t_start})
    finally:
        folder.release()


if __name__ == "__main__":
    rank = env_number("RANK")                                # torchrun: rank 0 prints, the others are quiet ...
    signal.signal(signal.SIGINT, signal.default_int_handler)   # (a script's background job starts ignoring it)
    signal.signal(signal.SIGTERM, data.terminate)            # kill: as Ctrl-C (between two steps: CtrlC)
    data.escape_unshowable()
    try:
        with contextlib.redirect_stdout(sys.stdout if rank == 0 else open(os.devnull, "w")):
            main()
    except BrokenPipeError:                                  # the reader of stdout is gone (... | head): quietly
        data.stopped_by_pipe()
    except (UsageError, data.DataError, rundir.Diverged, OSError) as e:   # (OSError: a folder that failed mid-run)
        if env_number("LOCAL_RANK") == 0 or "RANK" not in os.environ:   # ... an error: once a machine (no RANK:
            print(f"error: {data.error_line(e)}", file=sys.stderr)           # not torchrun, whatever LOCAL_RANK says)
        sys.exit(3 if isinstance(e, rundir.Diverged) else 2)
    except Interrupted as e:                                 # Ctrl-C or SIGTERM: how to continue
        print(e, flush=True) if rank == 0 else None
        sys.exit(e.status)
    except (KeyboardInterrupt, data.Terminated) as e:        # a second one, or one before training: at once
        how = "interrupted" if isinstance(e, KeyboardInterrupt) else "terminated (SIGTERM)"
        if rank == 0:
            print(f"\n{how}: stopped at once; the files written before are as they were", file=sys.stderr)
        sys.exit(130 if isinstance(e, KeyboardInterrupt) else 143)
    except (MemoryError, RuntimeError) as e:                  # (torch's CPU allocator: a RuntimeError)
        if not data.out_of_memory(e):
            raise
        print(f"error: out of memory ({data.one_line(e, 100)}): use a smaller --batch_size, --block_size or model",
              file=sys.stderr)
        sys.exit(2)
    finally:                                                 # on every exit, or the process aborts at exit
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
