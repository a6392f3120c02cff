"""
The processes of one torchrun launch (DistributedDataParallel, one device each), and what train.py decides for
them: every split built in full by rank 0 first, the model the steps call (compiled, wrapped in DDP, which must
be told of the parameters a step leaves unused), and each step's dropout seed per process. Without torchrun: one
process, and every method does nothing.
"""

import datetime
import os
import socket
import time

import numpy as np
import torch

import data
from config import UsageError

# how long the processes of a launch wait for one another at MASTER_ADDR:MASTER_PORT (torch's own wait: 30 min);
# under torchrun's agent (TORCHELASTIC_USE_AGENT_STORE=True) they met in its rendezvous, which it bounds itself
MEETING_SECONDS = 300


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
        backend = "nccl" if device == "cuda" else "gloo"
        if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":       # (as torch's env:// tells them apart)
            torch.distributed.init_process_group(backend)
        else:
            store = meeting_store(self.rank, self.world, MEETING_SECONDS)
            torch.distributed.init_process_group(backend, store=store, rank=self.rank, world_size=self.world)
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

    def from_rank0(self, fn):
        """fn() on rank 0, sent to every process (pickled): what rank 0 alone can read, e.g. a file it wrote."""
        if not self.on:
            return fn()
        box = [fn() if self.master else None]
        torch.distributed.broadcast_object_list(box, src=0)
        return box[0]

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


def meeting_store(rank, world, seconds):
    """The store where the WORLD_SIZE processes meet, as torch's env:// makes it (rank 0 serves it at MASTER_ADDR:
    MASTER_PORT), once every one has come; one line after `seconds` if one has not. Then torch's default timeout
    again: the process group's operations keep theirs."""
    addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    deadline, where = time.monotonic() + seconds, f"MASTER_ADDR={addr} MASTER_PORT={port}"
    start = f"start them all (torchrun --nproc_per_node {world} train.py ..., or each by hand with its RANK)"
    while rank and not reachable(addr, port):                # (TCPStore's own wait ends in a C++ stack trace)
        if time.monotonic() > deadline:
            raise UsageError(f"waited {seconds:g} s for rank 0 at {where}, of the WORLD_SIZE={world} processes: "
                             + start)
        time.sleep(0.2)
    try:
        store = torch.distributed.TCPStore(addr, port, world, rank == 0, wait_for_workers=False, multi_tenant=True,
                                           timeout=datetime.timedelta(seconds=max(1, deadline - time.monotonic())))
        came, said = store.add("train.py/came", 1), time.monotonic() + min(5, seconds / 2)
        while came < world and time.monotonic() < deadline:
            time.sleep(0.1)
            came = store.add("train.py/came", 0)
            if rank == 0 and said and time.monotonic() > said:   # (said once, so that a wait is no silent hang)
                print(f"waiting for {world - came} of the WORLD_SIZE={world} processes at {where} (up to "
                      f"{seconds:g} s)", flush=True)
                said = None
    except torch.distributed.DistError as e:
        raise UsageError(f"{where}: {data.one_line(e, 150)}") from None
    if came < world:
        raise UsageError(f"waited {seconds:g} s for the other {world - came} of the WORLD_SIZE={world} processes "
                         f"({came} came): {start}")
    store.set_timeout(torch.distributed.constants.default_pg_timeout)
    return store


def reachable(addr, port):
    """Whether a server listens at addr:port."""
    try:
        socket.create_connection((addr, port), timeout=2).close()
        return True
    except OSError:
        return False


def build_every_split(task, eval_only, n_train):
    """Every split the run reads, built in full (a sharded split: all its shards, cached), so that under torchrun
    rank 0 makes them before the other processes read its cache: test and val, and train (its first n_train
    examples) unless the run only evaluates."""
    for name in ("train", "val", "test"):
        if task.has(name) and not (name == "train" and eval_only):
            split = task.split(name)
            split = split.subset(n_train) if name == "train" and n_train is not None else split
            getattr(split, "full", lambda: None)()


def unused_parameters(model, x, y, autocast, forward=None):
    """The trainable parameters that a training step leaves without a gradient (DDP must be told of them).
    forward(model, x, y): the steps' own call of the model (train.py's, checked); None: model(x, y)."""
    with autocast:
        _, loss = forward(model, x, y) if forward else model(x, y)
    loss.backward()
    unused = [name for name, p in model.named_parameters() if p.requires_grad and p.grad is None]
    model.zero_grad(set_to_none=True)
    return unused


def training_model(model, train, args, dist, autocast, forward=None):
    """What the steps call: the model, compiled by --compile, in DistributedDataParallel under torchrun (forward: as
    unused_parameters')."""
    train_model = torch.compile(model) if args.compile else model
    if dist.on:     # DDP averages the gradients over the processes; told of parameters a step leaves unused
        x, y = (dist.share(t).to(dist.device)
                for t in train.sample(args.batch_size * dist.world, np.random.default_rng(0)))
        unused = dist.sum(len(unused_parameters(model, x, y, autocast, forward)))[0]
        train_model = torch.nn.parallel.DistributedDataParallel(
            train_model, device_ids=[torch.cuda.current_device()] if dist.device == "cuda" else None,
            find_unused_parameters=unused > 0)
    return train_model


def step_seed(seed, it, rank):
    """torch's seed for the dropout of step `it` on process `rank`: a function of (seed, it, rank) alone, so that a
    resumed run replays it, and distinct for every (seed, it, rank) of a run (it < 1_000_003, rank < 2 ** 20)."""
    return seed * 1_000_003 + it + rank * 2 ** 40
