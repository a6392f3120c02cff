"""
The run folder, --out_dir: one train.py at a time (its lock), the run it holds (continued by --resume, replaced
by --overwrite), and every file train.py writes there, each whole or not at all:

    lock          the process id and start time of the train.py using the folder (rank 0's under torchrun); removed
                  at its exit
    ckpt.pt       the last checkpoint: all that --resume needs (weights, optimiser, step, flags, clock, best step)
    best.pt       the weights of the best in-training evaluation, for --init_from and sample.py (no optimiser)
    log.jsonl     one record per step, evaluation and resumption (appended)
    loss.png      the loss curves, redrawn at every evaluation (curves.py)
    metrics.json  val and test over the whole splits, of ckpt.pt's weights and of best.pt's: written by a run that
                  reached its last step or its --time_limit, never by one stopped by Ctrl-C or a divergence
"""

import contextlib
import dataclasses
import json
import errno
import os
import re
import shlex
import time

import torch

import data
from config import FLAGS, UsageError

LOCK_GRACE = 10          # seconds: a lock file still without its process id is one being taken right now
# the programs that run train.main in their own process (transject.py, diffeqformer.py: the tours of tours/)
TRAINERS = ("train.py", "experiments.py", "bench.py", "transject.py", "diffeqformer.py")
FILES = ("lock", "ckpt.pt", "best.pt", "log.jsonl", "loss.png", "metrics.json")      # what train.py writes here


class Diverged(Exception):
    """A loss, gradient or weight that is not finite: the run stops at that step, its files as they were (exit 3)."""


def run_args(args):
    return {name: getattr(args, name) for name, *_ in FLAGS}


def resume_command(out_dir, world):
    """The command that continues the run in out_dir on as many processes."""
    launch = f"torchrun --nproc_per_node={world}" if world > 1 else "python"
    return f"{launch} train.py --resume --out_dir {shlex.quote(out_dir)}"


def checkpoint_step(path):
    """The step of the checkpoint at path, or None if it cannot be read."""
    try:
        return int(torch.load(path, map_location="cpu", weights_only=True, mmap=True)["iter"])
    except Exception:                                        # damaged, or not a train.py checkpoint
        return None


def start_time(pid):
    """When the process started, in clock ticks after boot (field 22 of /proc/PID/stat): with its id it names one
    process, where an id alone is taken again by later programs. None where it cannot be read (no /proc: Windows,
    macOS)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode("ascii", "replace")
        return int(stat[stat.rindex(")") + 2:].split()[19])    # the fields after "(name)", itself any text: 3 on
    except (OSError, ValueError, IndexError):
        return None


def runs_train_py(pid):
    """False for a live process that runs no train.py (nor a program that calls train.main): a lock's id taken
    again after a reboot by another program, Python or not. True where it cannot be told (no /proc)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
    except OSError:
        return True
    return any(os.path.basename(a).decode("utf-8", "replace") in TRAINERS for a in argv)


def lock_holder(lock):
    """The process id in the lock file if that process is alive and the one that wrote it (0: a lock being taken
    now), else None. The lock's start time, where it has one, tells the very process; an older train.py's lock (an
    id alone) and a lock read without /proc go by what the process runs."""
    try:
        with open(lock, "rb") as f:                          # (bytes: a lock damaged, or a link to a binary file)
            text = f.read(64).decode("ascii", "replace").strip()
        age = time.time() - os.stat(lock).st_mtime
    except OSError:
        return None
    m = re.fullmatch("([0-9]+)(?: ([0-9]+))?", text)
    if not m:
        return 0 if age < LOCK_GRACE else None
    pid = int(m[1])
    if not data.pid_alive(pid):
        return None
    started = start_time(pid)
    if m[2] is not None and started is not None:             # (a tour or experiments.py: train.main in its process)
        return pid if started == int(m[2]) else None
    return pid if runs_train_py(pid) else None


class RunDir:
    """out_dir of one run. Rank 0 takes its lock (before any data work) and writes its files; under torchrun the
    other processes write nowhere."""

    def __init__(self, args, master):
        self.path, self.master, self.lock, self.made = args.out_dir, master, None, False
        self.saved, self.best = None, None                   # the step ckpt.pt holds; best.pt's step and val metric
        self.replaced = ()                                   # --overwrite: the old run's files, removed by train.py
        self.vocabulary = None                               # what the task's ids stand for (Task.vocabulary)
        self.log = open(os.devnull, "w")                     # until open_log (rank 0)
        if not master:
            return
        self.made = not os.path.isdir(self.path)
        try:
            os.makedirs(self.path, exist_ok=True)
        except OSError as e:                                 # "File exists": a link to nowhere, a loop of links
            why = data.writable_problem(self.path) if e.errno == errno.EEXIST else e.strerror
            raise data.DataError(f"cannot make --out_dir {self.path}: {why or e}") from None
        for name in FILES:                                   # each absent or a file (a folder there: one line now)
            problem = data.file_problem(self.file(name))
            if problem not in (None, "does not exist"):
                raise UsageError(f"{self.file(name)} {problem}, where train.py keeps its {name}: remove it, or "
                                 "choose another --out_dir")
        self.take_lock()
        try:
            if not args.resume:
                self.check_new_run(args.overwrite)
            data.remove_stale_temps(self.path, ours=[f"{n}.tmp" for n in FILES])   # what a killed write left
        except BaseException:
            self.release()
            raise

    def file(self, name):
        return os.path.join(self.path, name)

    def take_lock(self):
        """out_dir/lock, made with O_EXCL (of two processes one alone makes it) and holding this process id. A lock
        whose process is gone (killed: kill -9) is removed and taken."""
        lock = self.file("lock")
        for _ in range(3):
            try:
                fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                pid = lock_holder(lock)
                if pid is not None:
                    who = f"process {pid}" if pid else "a process starting now"
                    raise UsageError(f"{self.path} is in use by another train.py ({who}): wait for it to end or "
                                     "stop it, or choose another --out_dir") from None
                with contextlib.suppress(FileNotFoundError):
                    os.remove(lock)                          # a dead process's lock
                continue
            except OSError as e:
                raise data.DataError(f"cannot write {lock}: {e.strerror or e}") from None
            self.lock = lock
            try:
                with os.fdopen(fd, "w") as f:                    # (no /proc: the id alone)
                    started = start_time(os.getpid())
                    f.write(f"{os.getpid()}\n" if started is None else f"{os.getpid()} {started}\n")
            except OSError as e:
                self.release()
                raise data.DataError(f"cannot write {lock}: {e.strerror or e}") from None
            return
        raise UsageError(f"{self.path}: another train.py took its lock at the same time; choose another --out_dir")

    def check_new_run(self, overwrite):
        """A new run or evaluation never writes over another's checkpoint or results unless told to (--overwrite:
        its files go)."""
        held = [n for n in ("ckpt.pt", "best.pt", "metrics.json") if os.path.lexists(self.file(n))] + [
            "log.jsonl"] * bool(os.path.isfile(self.file("log.jsonl")) and os.path.getsize(self.file("log.jsonl")))
        if not held:
            return
        if not overwrite and held[0] == "ckpt.pt":
            step = checkpoint_step(self.file("ckpt.pt"))
            raise UsageError(f"{self.path} holds a run (ckpt.pt{'' if step is None else f' at step {step}'}): "
                             "--resume to continue it, --overwrite to replace it, or another --out_dir")
        if not overwrite:
            raise UsageError(f"{self.path} holds the results of a run or an evaluation ({', '.join(held)}): "
                             "--overwrite to replace them, or another --out_dir")
        self.replaced = ("ckpt.pt", "best.pt", "loss.png")   # once the new run's data and model are ready (train.py;
        # metrics.json: replaced whole, or by train_session; log.jsonl: a new one)

    def discard(self, *names):
        if self.master:
            for name in names:
                with contextlib.suppress(FileNotFoundError):
                    os.remove(self.file(name))

    def save(self, name, state):
        """out_dir/name (ckpt.pt, best.pt), whole or not at all."""
        if self.master:
            data.atomic_write(self.file(name), lambda f: torch.save(state, f))

    def resumed(self, ckpt):
        self.saved, self.best = ckpt["iter"], ckpt.get("best")

    def diverged(self, it, what, grad_clip):
        """The one line of a run stopped at step `it` because `what` is not finite: what its files keep."""
        kept = f"{self.file('ckpt.pt')} keeps step {self.saved}" if self.saved is not None else "nothing written yet"
        best = f" (best.pt: step {self.best['step']})" if self.best else ""
        advice = "lower --lr or set --grad_clip" if grad_clip == 0 else "lower --lr or --grad_clip"
        return Diverged(f"step {it}: {what}; stopped before writing it: {kept}{best}; {advice}")

    def weights(self, it, args, model):
        """What --init_from and sample.py read (best.pt, and ckpt.pt with more), never weights that are not finite."""
        if not all(p.isfinite().all() for p in model.parameters()):
            raise self.diverged(it, "a weight is not finite", args.grad_clip)
        return {"model_name": args.model, "config": dataclasses.asdict(model.config), "model": model.state_dict(),
                "args": run_args(args), "iter": it, "vocabulary": self.vocabulary,
                "cwd": os.getcwd()}                          # (what its relative --data_dir is relative to)

    def checkpoint(self, it, args, model, **more):
        """ckpt.pt after step `it`: the weights and `more` (all that an exact --resume needs)."""
        self.save("ckpt.pt", {**self.weights(it, args, model), **more, "best": self.best})
        self.saved = it

    def keep_if_best(self, it, m, args, model):
        """best.pt when the evaluation m is the best so far: a classifier's by its val accuracy (highest), a language
        model's by its val loss (lowest). Written before ckpt.pt, which records it."""
        key = "val_loss" if "ppl" in m else "val_acc"
        value = m[key[4:]]
        if self.best is None or (value < self.best[key] if key == "val_loss" else value > self.best[key]):
            self.save("best.pt", self.weights(it, args, model))
            self.best = {"step": it, key: value}

    def write_metrics(self, metrics):
        if self.master:
            data.atomic_write_text(self.file("metrics.json"), json.dumps(metrics, indent=2) + "\n")
            print(f"wrote {self.file('metrics.json')}")

    def plot(self, short_steps, title):
        if self.master:
            import curves                                    # (matplotlib: loaded here, not at train.py's start)
            curves.plot_run(self.file("log.jsonl"), self.file("loss.png"), short_steps=short_steps, title=title)

    def open_log(self, resumed_at=None, seconds=0.0):
        """log.jsonl: a new one, or a resumed run's without the steps after its checkpoint (they run again), then a
        record of the resumption."""
        if not self.master:
            return
        path = self.file("log.jsonl")
        if resumed_at is not None and os.path.isfile(path):
            import curves                                    # its reader of log lines (a line cut short: None)
            with open(path, encoding="utf-8", errors="replace") as f:    # (bytes that are not text: a line dropped)
                kept = [line for line in f if (curves.record(line) or {}).get("step", resumed_at + 1) <= resumed_at]
            data.atomic_write_text(path, "".join(kept))
        self.log.close()                                     # (the placeholder)
        if resumed_at is None:                               # a new log: a link there (to a user's file, say) goes,
            self.guarded(lambda: self.discard("log.jsonl"))  # not what it leads to
        self.log = self.guarded(lambda: open(path, "a" if resumed_at is not None else "w"))
        if resumed_at is not None:
            self.write({"step": resumed_at, "resumed": True, "time": round(seconds, 3)})

    def guarded(self, fn):
        """fn() on the log, an OSError (a full disk) as one line."""
        try:
            return fn()
        except OSError as e:
            raise data.DataError(f"cannot write {self.file('log.jsonl')}: {e.strerror or e}") from None

    def write(self, record):
        self.guarded(lambda: self.log.write(json.dumps(record) + "\n"))

    def flush(self):
        self.guarded(self.log.flush)

    def release(self):
        """At exit: the log closed, the lock removed, and out_dir too if this run made it and left it empty."""
        with contextlib.suppress(OSError):
            self.log.close()
        if self.lock:
            with contextlib.suppress(OSError):
                os.remove(self.lock)
            self.lock = None
            if self.made:
                with contextlib.suppress(OSError):
                    os.rmdir(self.path)                      # only if empty
