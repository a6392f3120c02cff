"""Several processes (torchrun, DistributedDataParallel on gloo) train as one process with their summed batch;
activation checkpointing changes no number; single-process runs keep the losses they had before either."""

import contextlib
import json
import os
import re
import subprocess
import sys
import time

import pytest
import torch

import data
import ddp
import diffeqformer
from tasks import listops
import simpletron
import train
import transject

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = ["--n_layer", "2", "--n_embd", "16", "--n_head", "2", "--eval_iters", "2", "--log_interval", "3",
        "--warmup", "2", "--eval_interval", "3"]


def write_listops(folder, sizes, seed):
    folder.mkdir(parents=True, exist_ok=True)
    examples = listops.listops_chunk(((seed, 0), sum(sizes), 5, 80))          # short trees: fast tests
    start = 0
    for split, n in zip(("train", "val", "test"), sizes):
        listops.write_listops_tsv(folder / f"basic_{split}.tsv", examples[start:start + n])
        start += n
    return folder


def log_of(out_dir):
    with open(os.path.join(out_dir, "log.jsonl")) as f:
        return [json.loads(line) for line in f]


def losses(out_dir):
    return {r["step"]: r["loss"] for r in log_of(out_dir) if "loss" in r}


# values logged by train.py before torchrun support and checkpointing existed (the same commands, this data)
BEFORE = {
    "simpletron": [2.303182601928711, 2.298762559890747, 2.295102119445801, 2.30035138130188, 2.3073251247406006,
                   2.303036689758301, 2.300715684890747],
    "softmax": [2.300496220588684, 2.294146776199341, 2.3056615591049194, 2.283579707145691, 2.2925527095794678,
                2.3079605102539062, 2.28678560256958],
}


def test_single_process_runs_log_the_losses_they_logged_before(tmp_path):
    lra = write_listops(tmp_path / "lra", (48, 48, 48), seed=5)
    common = [*TINY, "--data_dir", lra, "--batch_size", "4", "--max_iters", "7", "--dropout", "0.1",
              "--device", "cpu"]                                         # the losses were recorded on a CPU
    for name, extra in (("simpletron", []), ("softmax", ["--grad_accum", "2"])):
        out = tmp_path / name
        m = train.main([str(a) for a in ["--model", name, *common, *extra, "--out_dir", out]])
        got = losses(out)
        assert [got[s] for s in range(1, 8)] == pytest.approx(BEFORE[name], rel=1e-5, abs=0), name
        assert m["world_size"] == 1 and m["n_val"] == 48
        records = log_of(out)                                # every record has the run's time, in order
        times = [r["time"] for r in records]
        assert all(isinstance(t, float) for t in times) and times == sorted(times)
        assert any("val_loss" in r for r in records)


def torchrun(nproc, *argv):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           os.path.join(ROOT, "train.py"), *map(str, argv)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-4000:]
    return p


def test_two_processes_train_as_one_process_with_the_doubled_batch_and_resume_on_one(tmp_path):
    # 13 val and 11 test examples: the last evaluation batch of 4 leaves one process a part with one example
    # or none; grad_accum 2: the first micro-batch's gradients stay local (no_sync)
    lra = write_listops(tmp_path / "lra", (40, 13, 11), seed=7)
    common = [*TINY, "--data_dir", lra, "--grad_accum", "2", "--dropout", "0", "--lr_decay_iters", "6",
              "--device", "cpu"]                             # gloo: two processes, also on a machine with one GPU
    one = tmp_path / "one"
    m1 = train.main([str(a) for a in [*common, "--batch_size", "4", "--max_iters", "6", "--out_dir", one]])
    two = tmp_path / "two"
    p = torchrun(2, *common, "--batch_size", "2", "--max_iters", "3", "--out_dir", two)
    assert "x 2 processes" in p.stdout and p.stdout.count("wrote ") == 1  # rank 0 alone prints
    assert sorted(os.listdir(two)) == ["best.pt", "ckpt.pt", "log.jsonl", "loss.png", "metrics.json"]   # no lock
    m2 = json.loads((two / "metrics.json").read_text())
    assert m2["world_size"] == 2 and m2["args"]["batch_size"] == 2
    # the 2-process checkpoint continues in one process with batch 4, the same global batch
    m3 = train.main(["--resume", "--out_dir", str(two), "--max_iters", "6"])
    assert m3["args"]["batch_size"] == 4 and m3["world_size"] == 1
    a, b = losses(one), losses(two)
    assert sorted(b) == list(range(1, 7))
    times = [r["time"] for r in log_of(two)]                 # the run's clock goes on across the resume
    assert times == sorted(times) and times[0] > 0
    assert [b[s] for s in range(1, 7)] == pytest.approx([a[s] for s in range(1, 7)], rel=1e-5)
    for k in ("val_loss", "val_acc", "test_loss", "test_acc", "n_val", "n_test"):
        assert m3[k] == pytest.approx(m1[k], rel=1e-5), k
    # evaluation split over the processes (during training and at the end): every example counted once
    val1 = [r for r in log_of(one) if "val_loss" in r and r["step"] == 3]
    val2 = [r for r in log_of(two) if "val_loss" in r and r["step"] == 3]
    assert val2[0]["val_n"] == val1[0]["val_n"] == 8                     # eval_iters 2 x batch 4
    assert val2[0]["val_loss"] == pytest.approx(val1[0]["val_loss"], rel=1e-5)
    one3 = train.main([str(a) for a in [*common, "--batch_size", "4", "--max_iters", "3", "--out_dir",
                                        tmp_path / "one3"]])
    assert (m2["n_val"], m2["n_test"]) == (one3["n_val"], one3["n_test"]) == (13, 11)
    assert {type(m[k]) for m in (m2, one3) for k in ("n_val", "n_test")} == {int}   # counts, not sums of floats
    for k in ("val_loss", "val_acc", "test_loss", "test_acc"):
        assert m2[k] == pytest.approx(one3[k], rel=1e-5), k


def test_unused_parameters_are_found():
    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.used, self.unused = torch.nn.Linear(3, 2), torch.nn.Linear(3, 2)
            self.frozen = torch.nn.Linear(3, 3).requires_grad_(False)

        def forward(self, x, y):
            logits = self.used(self.frozen(x))
            return logits, torch.nn.functional.cross_entropy(logits, y)
    model = Model()
    unused = ddp.unused_parameters(model, torch.randn(4, 3), torch.tensor([0, 1, 1, 0]), contextlib.nullcontext())
    assert unused == ["unused.weight", "unused.bias"]
    assert all(p.grad is None for p in model.parameters())


# ----------------------------------------------------------------------------------------------
# activation checkpointing

MODELS = {
    "simpletron": (simpletron, {}),
    "softmax": (simpletron, dict(attention="softmax", variant="vanilla", norm="pre")),
    "rezero": (simpletron, dict(attention="softmax", variant="vanilla", norm="rezero")),
    "orthogonal": (simpletron, dict(orthogonal=True)),
    "transject": (transject, {}),
    "diffeqformer": (diffeqformer, dict(time_dim=4)),
}


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("head", ["cls", "lm"])
def test_checkpointing_gives_the_same_loss_and_gradients_and_recomputes_each_block(name, head):
    module, extra = MODELS[name]
    kw = dict(vocab_size=11, block_size=12, n_layer=2, n_head=2, n_embd=8, dropout=0.2, head=head, n_classes=3)
    torch.manual_seed(0)
    plain = module.Model(module.Config(**kw, **extra)).double()
    recomputing = module.Model(module.Config(**kw, **extra, checkpointing=True)).double()
    recomputing.load_state_dict(plain.state_dict())
    g = torch.Generator().manual_seed(1)
    x = torch.randint(1, 11, (3, 12), generator=g)
    x[0, 9:] = 0                                                 # padding
    y = torch.randint(0, 11, (3, 12), generator=g) if head == "lm" else torch.tensor([0, 2, 1])
    calls = {"n": 0}

    def count(*_):
        calls["n"] += 1
    blocks = recomputing.blocks if name != "diffeqformer" else None
    results = []
    for model in (plain, recomputing):
        if model is plain and blocks:                            # without the flag: each block once, no recompute
            handles = [b.register_forward_pre_hook(count) for b in plain.blocks]
            torch.manual_seed(5)
            model(x, y)[1].backward()
            model.zero_grad(set_to_none=True)
            assert calls["n"] == len(blocks)
            calls["n"] = 0
            for h in handles:
                h.remove()
        handles = [b.register_forward_pre_hook(count) for b in blocks] if model is recomputing and blocks else []
        torch.manual_seed(5)                                     # the same dropout masks
        logits, loss = model(x, y)
        loss.backward()
        for h in handles:
            h.remove()
        results.append((logits.detach(), loss.detach(), {n: p.grad for n, p in model.named_parameters()}))
    (l0, a0, g0), (l1, a1, g1) = results
    assert torch.equal(l0, l1) and torch.equal(a0, a1)          # the forward is the same computation
    assert g0.keys() == g1.keys()
    for n in g0:
        assert (g0[n] is None) == (g1[n] is None), n
        if g0[n] is not None:
            torch.testing.assert_close(g1[n], g0[n], rtol=1e-12, atol=1e-15, msg=n)
    if blocks:
        assert calls["n"] == 2 * len(blocks)                     # each block once more in the backward pass
        calls["n"] = 0
        recomputing.eval()                                       # evaluation: nothing to recompute
        handles = [b.register_forward_pre_hook(count) for b in blocks]
        with torch.no_grad():
            assert torch.equal(recomputing(x)[0], plain.eval()(x)[0])
        assert calls["n"] == len(blocks)
        for h in handles:
            h.remove()


def test_checkpointing_through_train_py_logs_the_same_losses(tmp_path):
    lra = write_listops(tmp_path / "lra", (32, 8, 8), seed=3)
    tiny = [a for i, a in enumerate(TINY) if "--n_head" not in TINY[max(0, i - 1):i + 1]]    # TransJect: no heads
    common = [*tiny, "--model", "transject", "--data_dir", lra, "--batch_size", "4", "--max_iters", "3",
              "--dropout", "0.1"]
    train.main([str(a) for a in [*common, "--out_dir", tmp_path / "a"]])
    train.main([str(a) for a in [*common, "--checkpointing", "true", "--out_dir", tmp_path / "b"]])
    assert losses(tmp_path / "a") == losses(tmp_path / "b")


def test_rank0_first_tells_the_others_when_it_fails_and_they_stop():
    """rank0_first's protocol without processes: three turns (rank 0, the first process of each other machine,
    the rest), after each a vote on whether one failed. The one that fails votes True and raises its error; the
    others stop with exit code 2 at that vote, and do not run fn after a failure."""
    def make(rank, local_rank, votes_of_others):
        d = ddp.Distributed.__new__(ddp.Distributed)
        d.on, d.rank, d.world, d.master, d.local_rank = True, rank, 4, rank == 0, local_rank
        d.votes = []
        others = iter(votes_of_others)
        d._failed = lambda failed: d.votes.append(failed) or failed or next(others)
        return d
    def fail():
        raise data.DataError("broken file")
    d = make(0, 0, [False, False])                           # rank 0 fails in the first turn
    with pytest.raises(data.DataError):
        d.rank0_first(fail)
    assert d.votes == [True]
    ran = []
    d = make(1, 1, [True])                                   # a process of the last turn: rank 0 failed
    with pytest.raises(SystemExit) as e:
        d.rank0_first(lambda: ran.append(1))
    assert e.value.code == 2 and d.votes == [False] and ran == []
    d = make(2, 0, [False, False, False])                    # the first process of another machine, all well:
    assert d.rank0_first(lambda: d.votes.append("ran") or "out") == "out"          # it runs in the second turn
    assert d.votes == [False, "ran", False, False]
    d = make(3, 1, [False, False, False])                    # the others in the third
    assert d.rank0_first(lambda: d.votes.append("ran") or "out") == "out"
    assert d.votes == [False, False, "ran", False]
    d = make(0, 0, [False, False, False])                    # rank 0 in the first
    assert d.rank0_first(lambda: d.votes.append("ran") or "out") == "out"
    assert d.votes == ["ran", False, False, False]


def test_a_broken_file_under_torchrun_is_one_line_and_a_clean_exit(tmp_path):
    lra = write_listops(tmp_path / "lra", (8, 4, 4), seed=1)
    with open(lra / "basic_train.tsv", "a") as f:
        f.write("[MAX 1 2 ]\tx\n")                           # a bad label on the last line
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           os.path.join(ROOT, "train.py"), "--data_dir", str(lra), "--out_dir", str(tmp_path / "out"), *TINY,
           "--device", "cpu"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    errors = [line for line in p.stderr.splitlines() if line.startswith("error: ")]
    assert p.returncode != 0 and len(errors) == 1 and "basic_train.tsv, line 10" in errors[0], p.stderr[-3000:]
    assert "exitcode: 2" in p.stderr and "terminate called" not in p.stderr     # exit(2), not an abort
    assert not (tmp_path / "out" / "ckpt.pt").exists()


def test_any_is_true_everywhere_when_one_process_says_so():
    d = ddp.Distributed.__new__(ddp.Distributed)
    d.on = True
    for flags, want in (([0.0, 0.0, 0.0], False), ([0.0, 1.0, 0.0], True), ([1.0, 1.0, 1.0], True)):
        d.sum = lambda flag: [sum(flags)]                    # the all-reduce of the processes' flags
        assert d.any(False) is want
    d.on = False
    assert d.any(True) is True and d.any(False) is False


def test_the_process_group_calls_on_one_gloo_process(monkeypatch):
    """Distributed's sums and votes through a real gloo group of one process (torchrun's variables set here)."""
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for k, v in dict(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)).items():
        monkeypatch.setenv(k, v)
    d = ddp.Distributed("cpu")
    try:
        assert d.on and d.master and d.world == 1
        assert d.sum(100_000_001, 0.1, 3) == [100_000_001, 0.1, 3]   # summed in float64: no digit lost
        assert d.any(True) and not d.any(False)
        assert d._failed(True) and not d._failed(False)              # one process failed: all know
        x = torch.arange(6).view(3, 2)
        assert torch.equal(d.share(x), x)
        assert torch.equal(d.from_rank0(lambda: {"w": x})["w"], x)      # rank 0's object, sent to every process
    finally:
        torch.distributed.destroy_process_group()


def test_torchruns_local_rank_picks_the_gpu_and_one_past_the_last_is_refused(monkeypatch):
    """LOCAL_RANK (not RANK: on a second machine the ranks go on, the local ones start again at 0) names the GPU."""
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    for k, v in {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "2"}.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(train.UsageError, match="--nproc_per_node is more than the 2 GPUs of this machine"):
        ddp.Distributed("cuda")
    monkeypatch.setenv("LOCAL_RANK", "1")
    chosen = []
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    monkeypatch.setattr(torch.distributed, "init_process_group", lambda *a, **k: None)
    monkeypatch.setattr(torch.distributed, "new_group", lambda *a, **k: None)
    monkeypatch.setattr(ddp, "meeting_store", lambda *a: None)
    d = ddp.Distributed("cuda")
    assert (chosen, d.rank, d.world, d.local_rank, d.master) == ([1], 5, 8, 1, False)


@pytest.mark.parametrize("rank, world", [("1", "1"), ("0", "0"), ("3", "2"), ("1", "(unset)"), ("(unset)", "2")])
def test_a_rank_outside_the_world_is_one_line_before_any_work(rank, world, monkeypatch):
    for k, v in (("RANK", rank), ("WORLD_SIZE", world)):     # (one set alone: a launch by hand, half done)
        monkeypatch.setenv(k, v) if v != "(unset)" else monkeypatch.delenv(k, raising=False)
    monkeypatch.setattr(data, "load_task", lambda *a, **k: pytest.fail("data was read"))
    with pytest.raises(train.UsageError, match=rf"^RANK={re.escape(rank)} with WORLD_SIZE={re.escape(world)}: a "
                                               r"process's rank is 0 \.\. "):
        train.main(["--max_iters", "1"])


@pytest.mark.parametrize("addr, port", [(None, None), ("127.0.0.1", None), ("127.0.0.1", "abc"), ("", "29500")])
def test_a_rank_without_torchruns_address_is_one_line_before_any_work(addr, port, monkeypatch):
    for k, v in {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": addr, "MASTER_PORT": port}.items():
        monkeypatch.delenv(k, raising=False) if v is None else monkeypatch.setenv(k, v)
    monkeypatch.setattr(data, "load_task", lambda *a, **k: pytest.fail("data was read"))
    with pytest.raises(train.UsageError, match="^RANK is set but MASTER_ADDR or MASTER_PORT"):
        train.main(["--max_iters", "1"])


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def test_a_master_addr_that_names_no_machine_is_one_line_before_any_work(monkeypatch):
    """Battery t30: MASTER_ADDR=no.such.host.invalid was a traceback from init_process_group (or a long hang)."""
    for k, v in dict(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="no.such.host.invalid",
                     MASTER_PORT=free_port()).items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(data, "load_task", lambda *a, **k: pytest.fail("data was read"))
    monkeypatch.setattr(torch.distributed, "init_process_group", lambda *a, **k: pytest.fail("no check"))
    with pytest.raises(train.UsageError, match=r"^MASTER_ADDR='no\.such\.host\.invalid' is no address of a machine "
                                               r"\(.+\): torchrun sets it \(--master_addr"):
        train.main(["--max_iters", "1"])
    monkeypatch.setattr(train.socket, "getaddrinfo", lambda *a: time.sleep(5))     # a resolver that hangs: bounded
    t0 = time.time()
    assert train.address_problem("x", seconds=0.3) == "not resolved within 0.3 s" and time.time() - t0 < 2
    monkeypatch.undo()
    assert train.address_problem("localhost") is None and train.address_problem("127.0.0.1") is None


@pytest.mark.parametrize("rank, words", [("0", "the other 1 of the WORLD_SIZE=2 processes (1 came): start them all "
                                                "(torchrun --nproc_per_node 2 train.py ..."),
                                         ("1", "rank 0 at MASTER_ADDR=127.0.0.1 MASTER_PORT=")])
def test_a_process_whose_others_never_come_waits_a_bounded_time_then_says_so(rank, words, monkeypatch, capsys):
    """Battery t57: RANK=0 WORLD_SIZE=2 with only this process waited torch's 30 min for rank 1; now MEETING_SECONDS
    (here 1), then one line, before any data (rank 1 without rank 0: the same)."""
    for k, v in dict(RANK=rank, WORLD_SIZE="2", LOCAL_RANK=rank, MASTER_ADDR="127.0.0.1",
                     MASTER_PORT=free_port()).items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(ddp, "MEETING_SECONDS", 1)
    monkeypatch.setattr(data, "load_task", lambda *a, **k: pytest.fail("data was read"))
    t0 = time.time()
    with pytest.raises(train.UsageError, match=f"^waited 1 s for {re.escape(words)}"):
        train.main(["--max_iters", "1", "--device", "cpu"])
    assert time.time() - t0 < 10 and not torch.distributed.is_initialized()
    said = capsys.readouterr().out.count("waiting for 1 of the WORLD_SIZE=2 processes at MASTER_ADDR=127.0.0.1 ")
    assert said == (rank == "0")                             # (rank 0, once, half-way: a wait is no silent hang)


def test_the_processes_meet_in_a_store_of_torchs_default_timeout_or_torchruns_agents(monkeypatch):
    """The bounded wait is the meeting's alone: the store the process group gets has torch's default timeout (the
    group's operations keep theirs); under torchrun's agent, init_process_group meets in the agent's store."""
    for k, v in dict(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=free_port()).items():
        monkeypatch.setenv(k, v)
    store = ddp.meeting_store(0, 1, 5)
    assert store.timeout == torch.distributed.constants.default_pg_timeout and store.add("train.py/came", 0) == 1
    calls = []
    monkeypatch.setattr(torch.distributed, "init_process_group", lambda *a, **k: calls.append((a, k)))
    monkeypatch.setattr(torch.distributed, "new_group", lambda *a, **k: None)
    monkeypatch.setattr(ddp, "meeting_store", lambda *a: pytest.fail("met twice"))
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    ddp.Distributed("cpu")
    assert calls == [(("gloo",), {})]
