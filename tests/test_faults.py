"""Faults lose nothing (issue 26): a loss, gradient or weight that is not finite stops the run at that step with one
line (exit 3) and writes none of it; best.pt beside ckpt.pt; a full disk at any write leaves the earlier file as it
was, with one line (exit 2); one train.py per folder, and a new run never replaces another's unless told; bad input
stops before any work; Ctrl-C stops between two steps (exit 130) and the run resumes bit for bit."""

import errno
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

import bench
import config
import data
import rundir
import runsetup
import simpletron
import train
from test_train import TINY, losses, run, write_listops

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def lra(tmp_path_factory):
    return write_listops(tmp_path_factory.mktemp("lra"), 16, seed=1)          # 16 trees a split: fast evaluations


def one_line(excinfo, *parts):
    msg = str(excinfo.value)
    assert "\n" not in msg and "Traceback" not in msg, msg
    for part in parts:
        assert part in msg, (part, msg)
    return msg


def leftovers(folder):
    """What a run must not leave behind: temporary files and its lock."""
    return [n for n in os.listdir(folder) if ".tmp" in n or n == "lock"]


def records(out_dir):
    with open(os.path.join(out_dir, "log.jsonl")) as f:
        return [json.loads(line) for line in f]


def train_py(*argv, cwd, **kw):
    return subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), *map(str, argv)], cwd=cwd,
                          capture_output=True, text=True, timeout=300, **kw)


# ----------------------------------------------------------------------------------------------
# A loss, gradient or weight that is not finite

class InfiniteGradient(torch.autograd.Function):
    """0 in the forward pass (the loss stays finite), an infinite gradient in the backward pass."""

    @staticmethod
    def forward(ctx, x):
        ctx.shape, ctx.device = x.shape, x.device
        return x.new_zeros(())

    @staticmethod
    def backward(ctx, g):
        return torch.full(ctx.shape, float("inf"), device=ctx.device)


def poison(monkeypatch, at_step, what):
    """The training step `at_step` (counted from 1 in this process) gets a nan loss or an infinite gradient."""
    forward, steps = simpletron.Model.forward, [0]

    def poisoned(self, idx, targets=None):
        logits, loss = forward(self, idx, targets)
        if self.training:
            steps[0] += 1
            if steps[0] == at_step:
                loss = loss * float("nan") if what == "loss" else loss + InfiniteGradient.apply(self.wte.weight)
        return logits, loss
    monkeypatch.setattr(simpletron.Model, "forward", poisoned)


def checkpoint_writes(monkeypatch):
    """The bytes of out_dir/ckpt.pt after each of its writes."""
    written, atomic_write = [], data.atomic_write

    def recording(path, write, mode="wb"):
        atomic_write(path, write, mode)
        if os.path.basename(path) == "ckpt.pt":
            with open(path, "rb") as f:
                written.append(f.read())
    monkeypatch.setattr(data, "atomic_write", recording)
    return written


def test_a_nan_loss_stops_the_run_at_that_step_and_writes_none_of_it(lra, tmp_path, monkeypatch):
    out = tmp_path / "o"
    common = ["--data_dir", lra, *TINY, "--dropout", "0.1", "--eval_interval", "2"]
    written = checkpoint_writes(monkeypatch)
    poison(monkeypatch, 5, "loss")
    with pytest.raises(rundir.Diverged) as e:
        run(*common, "--max_iters", "8", "--out_dir", out)
    best = torch.load(out / "best.pt", map_location="cpu", weights_only=True)["iter"]
    assert one_line(e) == (f"step 5: the loss is nan; stopped before writing it: {out / 'ckpt.pt'} keeps step 4 "
                           f"(best.pt: step {best}); lower --lr or --grad_clip")
    assert (out / "ckpt.pt").read_bytes() == written[-1]                    # the checkpoint of step 4, as it was
    assert torch.load(out / "ckpt.pt", map_location="cpu", weights_only=True)["iter"] == 4 and best in (2, 4)
    assert not (out / "metrics.json").exists() and leftovers(out) == []    # no final evaluation, lock released
    assert max(r["step"] for r in records(out)) == 4                        # step 5 is not in the log
    for path in (out / "ckpt.pt", out / "best.pt"):                          # both load, every weight finite
        state = config.load_checkpoint(str(path))["model"]
        assert all(v.isfinite().all() for v in state.values() if v.is_floating_point())
    monkeypatch.undo()                                                       # (the poison gone)
    m = run("--resume", "--out_dir", out)                                    # resumed at step 4, replayed to 8
    whole = run(*common, "--max_iters", "8", "--out_dir", tmp_path / "whole")
    assert losses(out) == losses(tmp_path / "whole") and m["test_loss"] == whole["test_loss"]
    e = run("--init_from", out / "best.pt", "--eval_only", "--out_dir", tmp_path / "ev")
    assert e["n_test"] == 16


def test_an_infinite_gradient_stops_the_run_before_the_optimiser_steps(lra, tmp_path, monkeypatch):
    out = tmp_path / "o"
    poison(monkeypatch, 3, "gradient")
    with pytest.raises(rundir.Diverged) as e:
        run("--data_dir", lra, *TINY, "--grad_clip", "0", "--max_iters", "6", "--eval_interval", "4", "--out_dir", out)
    one_line(e, "step 3: the gradient's norm is ", "stopped before writing it: nothing written yet; "
                "lower --lr or set --grad_clip")
    assert not (out / "ckpt.pt").exists() and not (out / "best.pt").exists() and leftovers(out) == []


def test_weights_that_are_not_finite_are_never_written(lra, tmp_path):
    model = config.build_model("simpletron", dict(vocab_size=16, block_size=8, n_layer=1, n_embd=16, n_head=2))
    args = config.parse_args(["--out_dir", str(tmp_path / "o"), "--grad_clip", "0"])[0]
    folder = rundir.RunDir(args, master=True)
    try:
        with torch.no_grad():
            model.wte.weight[3, 1] = float("inf")
        with pytest.raises(rundir.Diverged) as e:
            folder.checkpoint(7, args, model)
        one_line(e, "step 7: a weight is not finite; stopped before writing it")
        assert not (tmp_path / "o" / "ckpt.pt").exists()
    finally:
        folder.release()
    assert not (tmp_path / "o").exists()                     # made by the run, left empty: removed with the lock


def test_a_diverging_run_in_a_process_of_its_own_exits_3_with_one_line(lra, tmp_path):
    r = train_py("--data_dir", lra, *TINY, "--lr", "1e38", "--grad_clip", "0", "--warmup", "0", "--max_iters", "30",
                 "--eval_interval", "1", "--out_dir", tmp_path / "o", cwd=tmp_path)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 3 and len(lines) == 1 and lines[0].startswith("error: step "), r.stderr[-2000:]
    assert "is nan" in lines[0] or "is inf" in lines[0] or "not finite" in lines[0], lines
    assert not (tmp_path / "o" / "metrics.json").exists() and leftovers(tmp_path / "o") == []


# ----------------------------------------------------------------------------------------------
# best.pt

def fake_val(monkeypatch, values, key):
    """The in-training evaluations return `values` of `key` in turn (acc: classifiers, loss: language models)."""
    evaluate, calls = train.evaluate, [0]

    def faked(*a, **kw):
        m = evaluate(*a, **kw)
        if kw.get("progress") is None and m is not None and len(a) > 5 and a[5] is not None:     # max_batches given
            m[key], calls[0] = values[calls[0]], calls[0] + 1
        return m
    monkeypatch.setattr(train, "evaluate", faked)


def test_best_pt_is_the_highest_val_accuracy_and_metrics_json_evaluates_it(lra, tmp_path, monkeypatch):
    out = tmp_path / "o"
    fake_val(monkeypatch, [0.1, 0.5, 0.3, 0.5], "acc")      # steps 2, 4, 6, 8: the best is step 4 (a tie is no gain)
    m = run("--data_dir", lra, *TINY, "--max_iters", "8", "--eval_interval", "2", "--out_dir", out)
    best = torch.load(out / "best.pt", map_location="cpu", weights_only=True)
    assert best["iter"] == 4 and set(best) == {"model_name", "config", "model", "args", "iter", "vocabulary", "cwd"}
    assert best["vocabulary"] is None                        # optimiser; ListOps numbers its own ids: no vocabulary
    assert best["cwd"] == os.getcwd()                        # (what a relative --data_dir is relative to)
    assert torch.load(out / "ckpt.pt", map_location="cpu", weights_only=True)["best"] == {"step": 4, "val_acc": 0.5}
    assert m["iters"] == 8 and m["best"]["step"] == 4
    assert set(m["best"]) == {"step", "val_loss", "val_acc", "test_loss", "test_acc"}
    monkeypatch.undo()
    e = run("--init_from", out / "best.pt", "--eval_only", "--out_dir", tmp_path / "ev")   # best.pt's own numbers
    assert {k: m["best"][k] for k in ("val_acc", "test_acc")} == {k: e[k] for k in ("val_acc", "test_acc")}
    assert m["best"]["test_loss"] == pytest.approx(e["test_loss"], rel=1e-6)
    assert json.loads((out / "metrics.json").read_text())["best"] == m["best"]


def test_best_pt_of_a_language_model_is_the_lowest_val_loss_and_the_final_one_is_copied(tmp_path, monkeypatch):
    (tmp_path / "txt").mkdir()
    (tmp_path / "txt" / "a.txt").write_text("to be or not to be, that is the question\n" * 40, encoding="utf-8")
    fake_val(monkeypatch, [3.0, 2.0, 2.5, 1.5], "loss")
    m = run("--task", "textfile", "--data_dir", tmp_path / "txt", "--tokenizer", "byte", "--block_size", "8", *TINY,
            "--max_iters", "8", "--eval_interval", "2", "--out_dir", tmp_path / "lm", "--cache_dir", tmp_path / "c")
    assert torch.load(tmp_path / "lm" / "best.pt", map_location="cpu", weights_only=True)["iter"] == 8
    assert m["best"] == {"step": 8, "val_loss": m["val_loss"], "val_ppl": m["val_ppl"]}     # (textfile: no test)


def test_best_survives_a_resume(lra, tmp_path, monkeypatch):
    fake_val(monkeypatch, [0.4, 0.2, 0.3], "acc")
    common = ["--data_dir", lra, *TINY, "--eval_interval", "2"]
    run(*common, "--max_iters", "4", "--out_dir", tmp_path / "o")          # best: step 2
    m = run("--resume", "--out_dir", tmp_path / "o", "--max_iters", "6")    # 0.3 at step 6 is no gain over 0.4
    best = torch.load(tmp_path / "o" / "best.pt", map_location="cpu", weights_only=True)
    assert m["best"]["step"] == 2 and best["iter"] == 2


# ----------------------------------------------------------------------------------------------
# A full disk at each write

class FullDisk:
    """A file whose every write fails as on a full disk (ENOSPC)."""

    def __init__(self, f):
        self.f = f

    def write(self, *_):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def __getattr__(self, name):
        return getattr(self.f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.f.close()


def full_disk(monkeypatch, module, name, nth=1):
    """The nth file that `module` opens for writing whose name starts with `name` fails at its first write. Returns
    {"before": the bytes of out_dir/name when that happens (None: no such file)}."""
    real_open, seen, state = open, [0], {}

    def opening(path, mode="r", *a, **kw):
        f = real_open(path, mode, *a, **kw)
        if any(c in mode for c in "wa") and os.path.basename(str(path)).startswith(name):
            seen[0] += 1
            if seen[0] == nth:
                target = os.path.join(os.path.dirname(str(path)), name)
                state["before"] = open(target, "rb").read() if os.path.exists(target) else None
                return FullDisk(f)
        return f
    monkeypatch.setattr(module, "open", opening, raising=False)
    return state


@pytest.mark.parametrize("name,nth", [("ckpt.pt", 2), ("best.pt", 2), ("loss.png", 2)])
def test_a_full_disk_while_writing_a_checkpoint_or_the_curves_keeps_the_earlier_file(lra, tmp_path, monkeypatch,
                                                                                    name, nth):
    out = tmp_path / "o"
    fake_val(monkeypatch, [0.1, 0.2, 0.3], "acc")            # every evaluation a new best: best.pt written each time
    state = full_disk(monkeypatch, data, name, nth)
    with pytest.raises(data.DataError) as e:
        run("--data_dir", lra, *TINY, "--max_iters", "6", "--eval_interval", "2", "--out_dir", out)
    one_line(e, f"cannot write {out / name}: No space left on device; {out / name} is left as it was")
    assert state["before"] and (out / name).read_bytes() == state["before"] and leftovers(out) == []


def test_a_full_disk_while_writing_metrics_json_keeps_the_earlier_file(lra, tmp_path, monkeypatch):
    out = tmp_path / "o"
    run("--data_dir", lra, *TINY, "--max_iters", "2", "--out_dir", out)
    run("--init_from", out / "ckpt.pt", "--eval_only", "--out_dir", tmp_path / "ev")
    state = full_disk(monkeypatch, data, "metrics.json")
    with pytest.raises(data.DataError) as e:                 # (--overwrite: the earlier evaluation is replaced)
        run("--init_from", out / "ckpt.pt", "--eval_only", "--out_dir", tmp_path / "ev", "--overwrite")
    one_line(e, f"cannot write {tmp_path / 'ev' / 'metrics.json'}: No space left on device")
    assert (tmp_path / "ev" / "metrics.json").read_bytes() == state["before"] and leftovers(tmp_path / "ev") == []


@pytest.mark.parametrize("module,name", [("data", "log.jsonl"), ("rundir", "log.jsonl")],
                         ids=["the log rewritten at --resume", "the log appended to"])
def test_a_full_disk_while_writing_the_log_keeps_it(lra, tmp_path, monkeypatch, module, name):
    out = tmp_path / "o"
    run("--data_dir", lra, *TINY, "--max_iters", "3", "--eval_interval", "2", "--out_dir", out)   # ckpt.pt: step 3
    before = (out / "log.jsonl").read_bytes()
    full_disk(monkeypatch, {"data": data, "rundir": rundir}[module], name)
    with pytest.raises(data.DataError) as e:
        run("--resume", "--out_dir", out, "--max_iters", "5")
    one_line(e, f"cannot write {out / 'log.jsonl'}: No space left on device")
    assert (out / "log.jsonl").read_bytes() == before and leftovers(out) == []


def test_a_full_disk_in_a_process_of_its_own_is_one_line_and_exit_2(lra, tmp_path):
    patch = ("import errno, os, runpy, sys; sys.path.insert(0, sys.argv[1]); import data\n"
             "real = open\n"
             "class Full:\n"
             "    def __init__(self, f): self.f = f\n"
             "    def write(self, *_): raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))\n"
             "    def __getattr__(self, k): return getattr(self.f, k)\n"
             "    def __enter__(self): return self\n"
             "    def __exit__(self, *e): self.f.close()\n"
             "data.open = lambda p, m='r', *a, **k: Full(real(p, m, *a, **k)) if 'ckpt.pt' in str(p) else real(p, m, *a, **k)\n"
             "sys.argv = sys.argv[2:]\n"
             "runpy.run_path(sys.argv[0], run_name='__main__')\n")
    r = subprocess.run([sys.executable, "-c", patch, ROOT, os.path.join(ROOT, "train.py"), "--data_dir", str(lra),
                        *TINY, "--max_iters", "2", "--out_dir", str(tmp_path / "o")],
                       cwd=tmp_path, capture_output=True, text=True, timeout=300)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, r.stderr[-2000:]
    assert lines[0] == (f"error: cannot write {tmp_path / 'o' / 'ckpt.pt'}: No space left on device; "
                        f"{tmp_path / 'o' / 'ckpt.pt'} is left as it was")
    assert leftovers(tmp_path / "o") == []


# ----------------------------------------------------------------------------------------------
# One run per folder

def test_a_second_train_py_on_the_same_folder_stops_at_once_and_a_dead_ones_lock_is_taken(lra, tmp_path):
    out = tmp_path / "o"
    first = subprocess.Popen([sys.executable, os.path.join(ROOT, "train.py"), "--data_dir", str(lra), *TINY,
                              "--max_iters", "100000", "--eval_interval", "2", "--out_dir", str(out)],
                             cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 120
        while not (out / "ckpt.pt").exists() and first.poll() is None and time.time() < deadline:
            time.sleep(0.2)
        assert (out / "lock").read_text().split() == [str(first.pid), str(proc_start(first.pid))]
        t0 = time.time()
        second = train_py("--data_dir", lra, *TINY, "--max_iters", "2", "--out_dir", out, cwd=tmp_path)
        seconds = time.time() - t0
        lines = second.stderr.strip().splitlines()
        assert second.returncode == 2 and len(lines) == 1, second.stderr
        assert lines[0] == (f"error: {out} is in use by another train.py (process {first.pid}): wait for it to end "
                            "or stop it, or choose another --out_dir")
        assert seconds < 30, seconds                         # before any data work (python and torch start: ~5 s)
    finally:
        first.kill()                                         # kill -9: its lock stays, naming a dead process
        first.wait()
    assert (out / "lock").exists()
    step = torch.load(out / "ckpt.pt", map_location="cpu", weights_only=True)["iter"]
    m = run("--resume", "--out_dir", out, "--max_iters", step + 2)       # the dead process's lock: taken
    assert m["iters"] == step + 2 and leftovers(out) == []


def proc_start(pid):
    """Field 22 of /proc/PID/stat (the start time, in clock ticks after boot), read by hand: the fields after the
    last ')', which closes the program's name."""
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rpartition(")")[2].split()[19])


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="needs Linux's /proc")
def test_a_lock_names_its_process_by_id_and_start_time_and_an_old_lock_by_what_runs(tmp_path, monkeypatch):
    """A process id alone is taken again by other programs (after a reboot): a lock written with the start time is
    its writer's alone (a tour's train.main, in a Python that runs no train.py, too); another start time is stale.
    An older train.py's lock (an id alone) is held while the process runs train.py, and stale if it runs another
    Python program. Without /proc (Windows, macOS) a live process holds the lock, as before."""
    lock = tmp_path / "lock"
    me = os.getpid()
    (tmp_path / "train.py").write_text("import time\ntime.sleep(120)\n")
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    trainer = subprocess.Popen([sys.executable, str(tmp_path / "train.py")])
    try:
        for text, holder in ((f"{me} {proc_start(me)}\n", me), (f"{me} {proc_start(me) + 1}\n", None),
                             (f"{other.pid}\n", None), (f"{other.pid} {proc_start(other.pid)}\n", other.pid),
                             (f"{trainer.pid}\n", trainer.pid), (f"{trainer.pid} 1\n", None), (f"{me}\n", None)):
            lock.write_text(text)
            assert rundir.lock_holder(lock) == holder, text
    finally:
        for p in (other, trainer):
            p.kill()
            p.wait()

    def no_proc(path, *a, **k):
        if str(path).startswith("/proc/"):
            raise FileNotFoundError(path)
        return open(path, *a, **k)

    monkeypatch.setattr(rundir, "open", no_proc, raising=False)          # (rundir's open alone)
    for text in (f"{me}\n", f"{me} 12345\n"):             # no /proc: a live process is counted
        lock.write_text(text)
        assert rundir.lock_holder(lock) == me
    (tmp_path / "o").mkdir()
    folder = rundir.RunDir(type("Args", (), dict(out_dir=str(tmp_path / "o"), resume=False, overwrite=False)), True)
    assert (tmp_path / "o" / "lock").read_text() == f"{me}\n"            # the id alone where there is no /proc
    folder.release()


def test_a_lock_being_taken_right_now_is_respected(tmp_path, monkeypatch):
    monkeypatch.setattr(data, "load_task", lambda *a, **k: pytest.fail("data was read"))
    (tmp_path / "o").mkdir()
    (tmp_path / "o" / "lock").write_text("")                 # made with O_EXCL, its process id not yet written
    with pytest.raises(train.UsageError) as e:
        run("--out_dir", tmp_path / "o", "--cache_dir", tmp_path / "c")
    one_line(e, "is in use by another train.py (a process starting now)")


def test_a_lock_of_bytes_that_are_no_process_id_is_respected_while_fresh_and_taken_when_old(tmp_path, monkeypatch):
    (tmp_path / "o").mkdir()
    (tmp_path / "o" / "lock").write_bytes(b"\x80\x02\xff\xfe torch \x00" * 8)    # (a link to a checkpoint, say)
    assert rundir.lock_holder(tmp_path / "o" / "lock") == 0                       # written just now: being taken
    (tmp_path / "o" / "lock").write_text("\u00b2\n")                              # a digit to str.isdigit, not int()
    assert rundir.lock_holder(tmp_path / "o" / "lock") == 0
    os.utime(tmp_path / "o" / "lock", (time.time() - 3600,) * 2)
    assert rundir.lock_holder(tmp_path / "o" / "lock") is None                    # an hour old: nobody's
    (tmp_path / "o" / "lock").write_text(f"{2**22 + 1}\n")                          # past Linux's largest process id
    assert rundir.lock_holder(tmp_path / "o" / "lock") is None


def test_init_from_into_its_own_folder_is_refused_however_the_folder_is_named(lra, tmp_path, monkeypatch):
    run("--data_dir", lra, *TINY, "--max_iters", "1", "--out_dir", tmp_path / "o")
    os.symlink(tmp_path / "o", tmp_path / "link")
    os.symlink(tmp_path / "o" / "ckpt.pt", tmp_path / "ck.pt")
    saved = (tmp_path / "o" / "ckpt.pt").read_bytes()
    monkeypatch.setattr(data, "load_task", lambda *a, **k: pytest.fail("data was read"))
    for source, out in ((tmp_path / "o" / "ckpt.pt", tmp_path / "o"), (tmp_path / "o" / "ckpt.pt", tmp_path / "link"),
                        (tmp_path / "ck.pt", tmp_path / "o"), (tmp_path / "link" / "ckpt.pt", tmp_path / "o")):
        with pytest.raises(train.UsageError) as e:
            run("--init_from", source, "--out_dir", out, "--overwrite")
        one_line(e, f"--out_dir {out} holds the checkpoint of --init_from, whose metrics.json and ckpt.pt this run "
                    "would overwrite: choose another --out_dir")
    assert (tmp_path / "o" / "ckpt.pt").read_bytes() == saved


def test_a_new_run_never_replaces_another_unless_told(lra, tmp_path, monkeypatch):
    out = tmp_path / "o"
    run("--data_dir", lra, *TINY, "--max_iters", "3", "--eval_interval", "3", "--out_dir", out)
    saved = {n: (out / n).read_bytes() for n in ("ckpt.pt", "best.pt", "metrics.json", "log.jsonl")}
    with monkeypatch.context() as mp:
        mp.setattr(data, "load_task", lambda *a, **k: pytest.fail("data was read"))
        with pytest.raises(train.UsageError) as e:
            run("--data_dir", lra, *TINY, "--max_iters", "5", "--out_dir", out)
    assert one_line(e) == (f"{out} holds a run (ckpt.pt at step 3): --resume to continue it, --overwrite to replace "
                           "it, or another --out_dir")
    assert {n: (out / n).read_bytes() for n in saved} == saved and leftovers(out) == []
    with pytest.raises(data.DataError):                      # --overwrite, and the new run's data missing: the old kept
        run("--data_dir", tmp_path / "none", *TINY, "--max_iters", "2", "--out_dir", out, "--overwrite")
    assert {n: (out / n).read_bytes() for n in saved} == saved
    m = run("--data_dir", lra, *TINY, "--max_iters", "2", "--eval_interval", "5", "--out_dir", out, "--overwrite")
    assert m["iters"] == 2 and torch.load(out / "best.pt", map_location="cpu", weights_only=True)["iter"] == 2
    assert max(r["step"] for r in records(out)) == 2         # a new log
    ev = out.parent / "ev"
    run("--init_from", out / "ckpt.pt", "--eval_only", "--out_dir", ev)
    before = (ev / "metrics.json").read_bytes()
    for argv in (["--data_dir", lra, *TINY, "--max_iters", "1"], ["--eval_only", "--init_from", out / "best.pt"]):
        with pytest.raises(train.UsageError) as e:           # a new run, an evaluation: the same
            run(*argv, "--out_dir", ev)
        said = "the results of a run or an evaluation (metrics.json): --overwrite to replace them"
        assert one_line(e) == f"{ev} holds {said}, or another --out_dir"
        assert (ev / "metrics.json").read_bytes() == before
    __import__("shutil").copytree(out, out.parent / "o2")
    with pytest.raises(train.UsageError) as e:               # an evaluation into another run's folder
        run("--init_from", out / "best.pt", "--eval_only", "--out_dir", out.parent / "o2")
    one_line(e, f"{out.parent / 'o2'} holds a run (ckpt.pt at step 2)")
    run("--init_from", out / "ckpt.pt", "--eval_only", "--out_dir", ev, "--overwrite")            # told: replaced
    (out.parent / "lg").mkdir()                              # a run's log alone (killed before its first checkpoint)
    (out.parent / "lg" / "log.jsonl").write_bytes(log := (out / "log.jsonl").read_bytes())
    with pytest.raises(train.UsageError) as e:
        run("--data_dir", lra, *TINY, "--max_iters", "1", "--out_dir", out.parent / "lg")
    assert one_line(e) == (f"{out.parent / 'lg'} holds the results of a run or an evaluation (log.jsonl): --overwrite "
                           "to replace them, or another --out_dir") and (out.parent / "lg" / "log.jsonl").read_bytes() == log


# ----------------------------------------------------------------------------------------------
# Bad input: one line, before any work

def test_resume_with_another_model_or_task_is_one_line(lra, tmp_path, monkeypatch):
    run("--data_dir", lra, *TINY, "--max_iters", "1", "--out_dir", tmp_path / "o")
    monkeypatch.setattr(data, "load_task", lambda *a, **k: pytest.fail("data was read"))
    for flags, words in ((["--model", "transject", "--task", "listops"], "--model transject: "),
                         (["--task", "ptb"], "--task ptb: ")):
        with pytest.raises(train.UsageError) as e:
            run("--resume", "--out_dir", tmp_path / "o", *flags)
        one_line(e, words, f"{tmp_path / 'o'} holds a simpletron run on listops, which --resume continues as it is")


def test_a_resume_needs_not_the_checkpoint_it_started_from(lra, tmp_path, monkeypatch):
    """Battery t21: --transfer_from S, S's folder deleted, then --resume: ckpt.pt holds every weight, so the source
    that is gone is not read (nor one that is there); the same for --init_from. Another source typed: refused."""
    common = ["--data_dir", lra, *TINY, "--max_iters", "2"]
    run(*common, "--out_dir", tmp_path / "s")
    run(*common, "--model", "softmax", "--transfer_from", tmp_path / "s" / "ckpt.pt", "--out_dir", tmp_path / "t")
    run(*common, "--init_from", tmp_path / "s" / "ckpt.pt", "--out_dir", tmp_path / "i")
    frozen = torch.load(tmp_path / "t" / "ckpt.pt", map_location="cpu", weights_only=True)["model"]
    os.replace(tmp_path / "s", tmp_path / "gone")
    with pytest.raises(train.UsageError) as e:
        run("--resume", "--out_dir", tmp_path / "t", "--transfer_from", tmp_path / "gone" / "ckpt.pt")
    one_line(e, f"--transfer_from {tmp_path / 'gone' / 'ckpt.pt'}: {tmp_path / 't'} holds a softmax run on listops")
    for out in ("t", "i"):
        assert run("--resume", "--out_dir", tmp_path / out, "--max_iters", "4")["iters"] == 4
    run("--resume", "--out_dir", tmp_path / "t", "--max_iters", "5", "--transfer_from", tmp_path / "s" / "ckpt.pt")
    now = torch.load(tmp_path / "t" / "ckpt.pt", map_location="cpu", weights_only=True)["model"]
    assert torch.equal(now["blocks.0.attn.qkv.weight"], frozen["blocks.0.attn.qkv.weight"])     # still frozen
    os.replace(tmp_path / "gone", tmp_path / "s")                              # there: not read either
    read, load = [], config.load_checkpoint
    for module in (config, runsetup):
        monkeypatch.setattr(module, "load_checkpoint", lambda p, **k: read.append(str(p)) or load(p, **k))
    assert run("--resume", "--out_dir", tmp_path / "t", "--max_iters", "6")["iters"] == 6
    assert str(tmp_path / "s" / "ckpt.pt") not in read and str(tmp_path / "t" / "ckpt.pt") in read


def edit_ckpt(path, **change):
    ckpt = torch.load(path, map_location="cpu", weights_only=True)
    ckpt.update({k: v(ckpt) if callable(v) else v for k, v in change.items()})
    torch.save(ckpt, path)


def adam_state(ckpt, **change):
    """ckpt's optimiser state with the first weight's values changed: name=fn(value)."""
    opt = ckpt["optimizer"]
    first = {k: change[k](v) if k in change else v for k, v in opt["state"][0].items()}
    return {**opt, "state": {**opt["state"], 0: first}}


@pytest.mark.parametrize("change,words", [
    (dict(best="garbage"), "its record 'best' is damaged ('garbage')"),
    (dict(best=lambda c: {**c["best"], "step": 3}), "its record 'best' is damaged"),      # past the checkpoint
    (dict(best=lambda c: {"step": 2, "val_acc": float("nan")}), "its record 'best' is damaged"),
    (dict(best=lambda c: {"step": 2, "val_acc": 0.5, "x": 1}), "its record 'best' is damaged"),
    (dict(world_size=0), "its record 'world_size' is damaged (0)"),
    (dict(world_size=True), "its record 'world_size' is damaged (True)"),
    (dict(world_size=2**70), "its record 'world_size' is damaged (1180591620717411303424)"),     # was a traceback
    (dict(time="x"), "its record 'time' is damaged ('x')"),
    (dict(time=-1.0), "its record 'time' is damaged (-1.0)"),
    (dict(gate_start={"a": "x"}), "its record 'gate_start' is damaged"),
    (dict(config=lambda c: {**c["config"], "n_head": 3}), "ckpt.pt: bad model settings: n_embd (16) must be a "),
    (dict(iter=10**12), "its record 'iter' is damaged (1000000000000)"),          # past the run's --max_iters 2
    (dict(iter=3), "its record 'iter' is damaged (3)"),
    (dict(iter=True), "its record 'iter' is damaged (True)"),                      # (a bool is an int to Python)
    (dict(optimizer=lambda c: {**c["optimizer"], "state": {**c["optimizer"]["state"], 0: {
        k: v.clone().fill_(float("nan")) if k == "exp_avg_sq" else v for k, v in c["optimizer"]["state"][0].items()}}}),
     "its optimizer state holds a value that is not finite (damaged)"),
    (dict(optimizer=lambda c: adam_state(c, exp_avg_sq=lambda v: v.clone().fill_(-1))),   # battery: a step, then nan
     "its optimizer state holds a second moment (exp_avg_sq) below 0 (-1) (damaged)"),
    (dict(optimizer=lambda c: adam_state(c, step=lambda v: v.clone().fill_(-1))),
     "its optimizer state holds a weight's step count -1.0, not a whole number 1 .. 2 (damaged)"),
    (dict(optimizer=lambda c: adam_state(c, step=lambda v: v.clone().fill_(0))), "step count 0.0, not a whole"),
    (dict(optimizer=lambda c: adam_state(c, step=lambda v: v.clone().fill_(1.5))), "step count 1.5, not a whole"),
    (dict(optimizer=lambda c: adam_state(c, step=lambda v: v.clone().fill_(3))), "step count 3.0, not a whole"),
    (dict(optimizer=lambda c: adam_state(c, step=lambda v: None)), "step count None, not a whole"),
    (dict(model=lambda c: {k: v.clone().fill_(float("nan")) if k.endswith("qkv.weight") else v
                           for k, v in c["model"].items()}), "ckpt.pt: a weight is not finite (nan or inf)"),
    (dict(optimizer={}), "its optimizer state is damaged (no 'state' or 'param_groups')"),
    (dict(optimizer=lambda c: {"state": c["optimizer"]["state"]}), "its optimizer state is damaged"),
    (dict(optimizer=lambda c: {**c["optimizer"], "state": []}), "its optimizer state is damaged"),
])
def test_a_damaged_record_in_ckpt_pt_is_refused_before_any_data(lra, tmp_path, monkeypatch, change, words):
    run("--data_dir", lra, *TINY, "--max_iters", "2", "--eval_interval", "2", "--out_dir", tmp_path / "o")
    edit_ckpt(tmp_path / "o" / "ckpt.pt", **change)
    if "not finite" not in words:                               # (the weights: checked when the model is built)
        monkeypatch.setattr(data, "load_task", lambda *a, **k: pytest.fail("data was read"))
    monkeypatch.setattr(train, "train_session", lambda *a: pytest.fail("a step was taken"))
    with pytest.raises(train.UsageError) as e:
        run("--resume", "--out_dir", tmp_path / "o", "--max_iters", "4")
    one_line(e, f"{tmp_path / 'o' / 'ckpt.pt'}: ", words)
    assert (tmp_path / "o" / "metrics.json").exists()          # the finished run's, kept


@pytest.mark.parametrize("key,value,words", [
    ("max_iters", None, "its setting max_iters is null, which train.py always fills"),
    ("cache_dir", None, "its setting cache_dir is null"),
    ("task", None, "is not a train.py checkpoint"),
    ("cache_dir", 5, "its setting cache_dir is no string"),
    ("tokenizer", 5, "its setting tokenizer is no string"),
])
def test_a_null_or_odd_setting_in_a_checkpoints_args_is_refused_by_resume_and_init_from(lra, tmp_path, monkeypatch,
                                                                                         key, value, words):
    run("--data_dir", lra, *TINY, "--max_iters", "2", "--eval_interval", "2", "--out_dir", tmp_path / "o")
    edit_ckpt(tmp_path / "o" / "ckpt.pt", args=lambda c: {**c["args"], key: value})
    monkeypatch.setattr(data, "load_task", lambda *a, **k: pytest.fail("data was read"))
    for argv in (["--resume", "--out_dir", tmp_path / "o", "--max_iters", "4"],
                 ["--init_from", tmp_path / "o" / "ckpt.pt", "--eval_only", "--out_dir", tmp_path / "e"]):
        with pytest.raises(train.UsageError) as e:
            run(*argv)
        one_line(e, str(tmp_path / "o" / "ckpt.pt"), words)


@pytest.mark.parametrize("key", ["head", "n_classes", "vocab_size"])
def test_a_checkpoint_whose_config_lacks_a_field_the_task_sets_is_refused_in_one_line(lra, tmp_path, monkeypatch, key):
    run("--data_dir", lra, *TINY, "--max_iters", "2", "--eval_interval", "2", "--out_dir", tmp_path / "o")
    for name in ("ckpt.pt", "best.pt"):
        edit_ckpt(tmp_path / "o" / name, config=lambda c: {k: v for k, v in c["config"].items() if k != key})
    monkeypatch.setattr(train, "train_session", lambda *a: pytest.fail("a step was taken"))
    for argv in (["--resume", "--out_dir", tmp_path / "o", "--max_iters", "4"],
                 ["--init_from", tmp_path / "o" / "ckpt.pt", "--eval_only", "--out_dir", tmp_path / "e"]):
        with pytest.raises(train.UsageError) as e:
            run(*argv)
        one_line(e, f"the checkpoint's model settings lack {key} (damaged: train.py writes every one)")


def test_another_runs_best_pt_beside_a_run_without_a_best_record_is_refused(lra, tmp_path, monkeypatch):
    """The next evaluation would write over it: checked whether or not ckpt.pt records a best."""
    run("--data_dir", lra, *TINY, "--max_iters", "2", "--eval_interval", "2", "--out_dir", tmp_path / "o")
    edit_ckpt(tmp_path / "o" / "ckpt.pt", best=None)
    edit_ckpt(tmp_path / "o" / "best.pt", model_name="softmax", config=lambda c: {**c["config"], "attention": "softmax"})
    monkeypatch.setattr(train, "train_session", lambda *a: pytest.fail("a step was taken"))
    with pytest.raises(train.UsageError) as e:
        run("--resume", "--out_dir", tmp_path / "o", "--max_iters", "4")
    one_line(e, f"{tmp_path / 'o' / 'best.pt'} holds another run's weights (a softmax model), not this simpletron run's")


def test_a_run_resumed_with_another_dropout_resumes_again_beside_its_earlier_best_pt(lra, tmp_path, monkeypatch):
    run("--data_dir", lra, *TINY, "--eval_interval", "2", "--max_iters", "2", "--out_dir", tmp_path / "o")
    fake_val(monkeypatch, [0.0] * 4, "acc")                    # steps 4, 6 no better: best.pt stays step 2's (TINY: dropout 0)
    run("--resume", "--out_dir", tmp_path / "o", "--max_iters", "4", "--dropout", "0.3")
    best = torch.load(tmp_path / "o" / "best.pt", map_location="cpu", weights_only=True)
    ckpt = torch.load(tmp_path / "o" / "ckpt.pt", map_location="cpu", weights_only=True)
    assert (best["iter"], best["config"]["dropout"], ckpt["config"]["dropout"]) == (2, 0.0, 0.3)
    assert run("--resume", "--out_dir", tmp_path / "o", "--max_iters", "6")["best"]["step"] == 2


def test_a_lost_best_pt_is_forgotten_and_another_runs_refused(lra, tmp_path, monkeypatch, capsys):
    common = ["--data_dir", lra, *TINY, "--eval_interval", "2"]
    run(*common, "--max_iters", "2", "--out_dir", tmp_path / "o")              # best.pt: step 2
    run(*common, "--max_iters", "2", "--out_dir", tmp_path / "other", "--n_embd", "8")
    edit_ckpt(tmp_path / "o" / "best.pt", model_name="softmax")                # the same settings, another model
    os.replace(tmp_path / "other" / "best.pt", tmp_path / "other.pt")         # the same model, other settings
    for other, name in ((tmp_path / "o" / "best.pt", "softmax"), (tmp_path / "other.pt", "simpletron")):
        os.replace(other, tmp_path / "o" / "best.pt")
        with monkeypatch.context() as m:
            m.setattr(data, "load_task", lambda *a, **k: pytest.fail("data was read"))
            with pytest.raises(train.UsageError) as e:
                run("--resume", "--out_dir", tmp_path / "o", "--max_iters", "4")
        one_line(e, f"{tmp_path / 'o' / 'best.pt'} holds another run's weights (a {name} model), not this "
                    f"simpletron run's: move it out of {tmp_path / 'o'}, then --resume again")
    os.remove(tmp_path / "o" / "best.pt")
    fake_val(monkeypatch, [0.1], "acc")                        # worse than step 2's, which is forgotten
    m = run("--resume", "--out_dir", tmp_path / "o", "--max_iters", "4")
    assert "best.pt is gone: the run's best so far (step 2) is forgotten" in capsys.readouterr().out
    best = torch.load(tmp_path / "o" / "best.pt", map_location="cpu", weights_only=True)
    assert m["best"]["step"] == 4 and best["iter"] == 4


def test_an_optimiser_state_of_other_shapes_is_refused_before_a_step(lra, tmp_path):
    run("--data_dir", lra, *TINY, "--max_iters", "2", "--out_dir", tmp_path / "other", "--n_embd", "8")
    run("--data_dir", lra, *TINY, "--max_iters", "2", "--out_dir", tmp_path / "o")
    other = torch.load(tmp_path / "other" / "ckpt.pt", map_location="cpu", weights_only=True)["optimizer"]
    edit_ckpt(tmp_path / "o" / "ckpt.pt", optimizer=other)      # the same groups, each state of other shapes
    before = records(tmp_path / "o")
    with pytest.raises(train.UsageError) as e:
        run("--resume", "--out_dir", tmp_path / "o", "--max_iters", "4")
    one_line(e, f"{tmp_path / 'o' / 'ckpt.pt'}: its optimiser state does not fit the model's weights")
    assert records(tmp_path / "o") == before


def test_bytes_that_are_not_text_in_the_log_are_dropped_on_resume(lra, tmp_path):
    run("--data_dir", lra, *TINY, "--max_iters", "2", "--out_dir", tmp_path / "o")
    with open(tmp_path / "o" / "log.jsonl", "ab") as f:
        f.write(b"\x80\xff junk\n")
    run("--resume", "--out_dir", tmp_path / "o", "--max_iters", "3")
    steps = [r["step"] for r in records(tmp_path / "o")]       # (each line JSON: the junk line is gone)
    assert steps == [1, 2, 2, 2, 3, 3], steps                   # 2: a step and its evaluation, then the resumption


@pytest.mark.parametrize("argv,words", [
    (["--model", "transject", "--n_head", "4"], "--n_head: TransJect has no attention heads (its --n_experts take "
                                                "their place); it is no setting of --model transject"),
    (["--model", "simpletron", "--n_experts", "4"], "unrecognized arguments: --n_experts"),
    (["--model", "transject", "--attn_std_interval", "5"], "--attn_std_interval"),
])
def test_a_flag_the_model_does_not_have_is_one_line(argv, words, tmp_path, monkeypatch):
    monkeypatch.setattr(data, "load_task", lambda *a, **k: pytest.fail("data was read"))
    with pytest.raises(train.UsageError) as e:
        run(*argv, "--out_dir", tmp_path / "o", "--cache_dir", tmp_path / "c")
    one_line(e, words)
    assert not (tmp_path / "o").exists()


def test_a_cache_dir_that_is_a_file_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr(data, "load_task", lambda *a, **k: pytest.fail("data was read"))
    (tmp_path / "afile").write_text("x")
    with pytest.raises(train.UsageError) as e:
        run("--cache_dir", tmp_path / "afile", "--out_dir", tmp_path / "o")
    one_line(e, f"--cache_dir {tmp_path / 'afile'}: {tmp_path / 'afile'} is a file, not a folder")


@pytest.mark.parametrize("model, widths", [("softmax", dict(mlp_ratio=1000)), ("simpletron", dict(mlp_hidden=16000)),
                                           ("transject", dict(n_experts=400)), ("diffeqformer", dict(time_dim=60))])
def test_the_memory_bound_counts_every_width_of_the_model(monkeypatch, model, widths):
    """An MLP, experts or W(t)'s rows many times wider than n_embd: the weights, counted on a real model of 3 layers
    (the slow, obvious count), make the bound 4 x (4 x weights + B x T x d x L) bytes, however small n_embd is."""
    shape = dict(config.MODELS[model][1], n_layer=3, n_embd=16, n_head=2, block_size=60, vocab_size=40, head="lm",
                 **widths)
    weights = sum(p.numel() for p in config.build_model(model, shape).parameters())
    B, T, d, L = 5, 60, 16, 3
    need = 4 * (4 * weights + B * T * d * L)
    args = type("Args", (), dict(batch_size=B, grad_accum=7, eval_only=False, device="cpu", steps=None, lora_rank=0))
    for have, refused in ((need, False), (need - 1, True)):
        monkeypatch.setattr(os, "sysconf", lambda name, have=have: 1 if name == "SC_PAGE_SIZE" else have)
        if refused:
            with pytest.raises(config.UsageError) as e:
                config.check_size(args, model, shape)
            (flag, value), = widths.items()
            one_line(e, f"--n_embd 16 --{flag} {value}: the training needs at least")
        else:
            config.check_size(args, model, shape)


def test_an_mlp_a_terabyte_wide_is_refused_before_any_data(tmp_path, monkeypatch):
    monkeypatch.setattr(data, "load_task", lambda *a, **k: pytest.fail("data was read"))
    with pytest.raises(train.UsageError) as e:
        run("--model", "softmax", *TINY, "--mlp_ratio", str(10**9), "--out_dir", tmp_path / "o", "--cache_dir",
            tmp_path / "c")
    one_line(e, "--n_embd 16 --mlp_ratio 1000000000: the training needs at least ", "GiB of this cpu")
    assert not (tmp_path / "o").exists() and not (tmp_path / "c").exists()
    with pytest.raises(train.UsageError) as e:                # past what a tensor's size can hold
        run("--model", "softmax", *TINY, "--mlp_ratio", str(2**62), "--out_dir", tmp_path / "o")
    one_line(e, f"--mlp_ratio {2**62}: the model has more weights than torch can count; lower them")


# ----------------------------------------------------------------------------------------------
# Ctrl-C

def test_ctrl_c_stops_within_seconds_and_the_resumed_run_ends_as_an_uninterrupted_one(lra, tmp_path):
    common = ["--data_dir", lra, *TINY, "--dropout", "0.1", "--max_iters", "40", "--eval_interval", "15"]
    out = tmp_path / "o"
    p = subprocess.Popen([sys.executable, os.path.join(ROOT, "train.py"), *map(str, common), "--out_dir", str(out)],
                         cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines = []
    for line in p.stdout:                                    # the progress lines, one a step
        lines.append(line)
        if line.startswith("step 5/"):
            break
    t0 = time.time()
    p.send_signal(signal.SIGINT)
    rest, err = p.communicate(timeout=60)
    seconds = time.time() - t0
    # the step it came in, the checkpoint, the exit: about a second on an idle machine (asked: 5 s); 10 s allowed
    # for a CPU shared with other work
    assert p.returncode == 130 and seconds < 10, (p.returncode, seconds, err[-2000:])
    step = torch.load(out / "ckpt.pt", map_location="cpu", weights_only=True)["iter"]
    assert 5 <= step < 40 and not (out / "metrics.json").exists() and leftovers(out) == []
    assert f"interrupted at step {step} of 40; continue with: python train.py --resume --out_dir {out}\n" in rest
    resumed = run("--resume", "--out_dir", out)
    whole = run(*common, "--out_dir", tmp_path / "whole")
    assert losses(out) == losses(tmp_path / "whole")                         # bit for bit, dropout included
    for k in ("val_loss", "val_acc", "test_loss", "test_acc", "best"):
        assert resumed[k] == whole[k], k
    assert [r["step"] for r in records(out) if r.get("resumed")] == [step]         # the resumption, in the log


def test_ctrl_c_stops_train_py_started_with_it_ignored_while_its_data_is_prepared(tmp_path):
    """A shell script's background job starts with SIGINT ignored: train.py takes Ctrl-C back (as every program
    beside it does): one line and exit 130, here while the LRA recipe's trees are drawn."""
    p = subprocess.Popen([sys.executable, os.path.join(ROOT, "train.py"), "--cache_dir", str(tmp_path / "c"),
                          "--out_dir", str(tmp_path / "o")], cwd=tmp_path, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    for line in p.stdout:
        if line.startswith("generating ListOps"):
            break
    time.sleep(1)                                            # (the pool started: its workers ignore it anyway)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 130 and err.split() == "interrupted: stopped at once; the files written before are as they " \
        "were".split(), err


def test_a_folder_that_cannot_be_made_or_locked_is_named_with_the_os_reason_alone(tmp_path, monkeypatch):
    (tmp_path / "file").write_text("")                      # --out_dir under a file: makedirs fails
    args = config.parse_args(["--out_dir", str(tmp_path / "file" / "o")])[0]
    with pytest.raises(data.DataError) as e:
        rundir.RunDir(args, master=True)
    assert str(e.value) == f"cannot make --out_dir {tmp_path / 'file' / 'o'}: Not a directory"   # no [Errno 20] '…'
    os.symlink(tmp_path / "nowhere" / "x", tmp_path / "dangling")      # makedirs: "File exists", which misleads
    args = config.parse_args(["--out_dir", str(tmp_path / "dangling")])[0]
    with pytest.raises(data.DataError) as e:
        rundir.RunDir(args, master=True)
    assert str(e.value) == (f"cannot make --out_dir {tmp_path / 'dangling'}: {tmp_path / 'dangling'} is not a folder "
                            "this command can write in")
    real_open, lock = os.open, str(tmp_path / "o" / "lock")

    def refuse_lock(path, *a, **k):
        if path == lock:
            raise PermissionError(errno.EACCES, "Permission denied", path)
        return real_open(path, *a, **k)
    monkeypatch.setattr(os, "open", refuse_lock)
    args = config.parse_args(["--out_dir", str(tmp_path / "o")])[0]
    with pytest.raises(data.DataError) as e:
        rundir.RunDir(args, master=True)
    assert str(e.value) == f"cannot write {lock}: Permission denied"


def test_an_empty_out_dir_is_refused_not_replaced_by_the_default(monkeypatch):
    monkeypatch.setattr(data, "load_task", lambda *a, **k: pytest.fail("data was read"))
    with pytest.raises(config.UsageError, match=r"^--out_dir '': allowed is a path"):
        train.main(["--out_dir", "", "--max_iters", "1"])


def test_a_path_an_ascii_terminal_cannot_show_is_escaped_in_train_pys_lines(lra, tmp_path):
    out = train_py("--data_dir", lra, *TINY, "--max_iters", "1", "--out_dir", tmp_path / "sortie-é", cwd=tmp_path,
                   env={**os.environ, "PYTHONIOENCODING": "ascii"})
    assert out.returncode == 0, out.stderr
    assert f"wrote {tmp_path}/sortie-\\xe9/metrics.json" in out.stdout


def test_a_run_leaves_no_file_open_behind_it(lra, tmp_path):
    """(The log's placeholder, os.devnull, was replaced without being closed: a ResourceWarning under
    PYTHONWARNINGS=error, printed with a traceback.)"""
    out = train_py("--data_dir", lra, *TINY, "--max_iters", "1", "--out_dir", tmp_path / "o", cwd=tmp_path,
                   env={**os.environ, "PYTHONWARNINGS": "error::ResourceWarning"})
    assert out.returncode == 0 and "ResourceWarning" not in out.stderr and "Traceback" not in out.stderr, out.stderr


def test_a_whole_cache_in_a_folder_this_run_cannot_write_is_read(lra, tmp_path, monkeypatch):
    """(A shared, read-only cache: refused up front as a folder the run writes, though nothing needed writing.)"""
    run("--task", "mqar", "--recall_sizes", "16,8,8", *TINY, "--max_iters", "1", "--cache_dir", tmp_path / "c",
        "--out_dir", tmp_path / "o1")
    access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: access(p, mode) and not (
        mode & os.W_OK and str(tmp_path / "c") in os.path.abspath(p)))
    m = run("--task", "mqar", "--recall_sizes", "16,8,8", *TINY, "--max_iters", "1", "--cache_dir", tmp_path / "c",
            "--out_dir", tmp_path / "o2")
    assert m["n_test"] == 8
    with pytest.raises(train.UsageError, match="is not a folder this command can write in"):
        run("--task", "mqar", "--recall_sizes", "16,8,8", *TINY, "--cache_dir", tmp_path / "c" / "new",
            "--out_dir", tmp_path / "o3")


@pytest.mark.parametrize("name", ["simpletron", "diffeqformer"])
def test_tied_embeddings_whose_two_copies_disagree_are_refused(name):
    model = config.build_model(name, dict(vocab_size=11, n_embd=8, n_head=2, n_layer=1, block_size=8, head="lm"))
    state = {k: v.clone() for k, v in model.state_dict().items()}
    config.load_weights(model, state, "ok.pt")                                  # equal copies: loaded
    state["lm_head.weight"] = state["lm_head.weight"] + 1                       # wte.weight keeps the old values
    with pytest.raises(config.UsageError) as e:
        config.load_weights(model, state, "x.pt")
    one_line(e, "x.pt: ", "disagrees with the weight it is tied to")


@pytest.mark.parametrize("program,argv,shown", [
    ("train", ["--init_from_bert", ""], "--init_from_bert ''"),           # was taken for no flag: BERT-less training
    ("train", ["--out_dir", " "], "--out_dir ' '"),
    ("sample", ["--ckpt", ""], "--ckpt ''"),
    ("analyze", ["attnstd", "--run", "out/a", "--run", ""], "--run 'out/a', ''"),
    ("analyze", ["spectra", "--ckpt", ""], "--ckpt ''"),
    ("analyze", ["curves", "out/a", "--out", ""], "--out ''"),
    ("bench", ["--out", ""], "--out ''"),
    ("bench", ["--nanogpt", ""], "--nanogpt ''"),
])
def test_an_empty_path_is_refused_in_every_program(monkeypatch, program, argv, shown):
    import analyze
    import bench
    import sample
    monkeypatch.setattr(data, "load_task", lambda *a, **k: pytest.fail("data was read"))
    main = {"train": train.main, "sample": sample.main, "analyze": analyze.main, "bench": bench.main}[program]
    with pytest.raises(config.UsageError) as e:
        main(argv)
    assert str(e.value) == f"{shown}: allowed is a path"


def test_a_finished_run_evaluated_again_keeps_its_metrics_json_until_the_new_one_is_written(lra, tmp_path,
                                                                                            monkeypatch):
    """--resume of a finished run (no step left) evaluates it again: metrics.json still describes ckpt.pt, so a
    failure in that evaluation leaves it as it was (a run with steps left discards it first: it would be stale)."""
    out = tmp_path / "o"
    run("--data_dir", lra, *TINY, "--max_iters", "2", "--eval_interval", "2", "--out_dir", out)
    before = (out / "metrics.json").read_bytes()

    def fails(*a, **k):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(train, "evaluate", fails)
    with pytest.raises(OSError):
        run("--resume", "--out_dir", out)
    assert (out / "metrics.json").read_bytes() == before
    with pytest.raises(OSError):
        run("--resume", "--out_dir", out, "--max_iters", "3")
    assert not (out / "metrics.json").exists()


def test_a_checkpoint_in_torchs_legacy_format_loads_and_one_edited_after_saving_is_refused(lra, tmp_path):
    run("--data_dir", lra, *TINY, "--max_iters", "1", "--out_dir", tmp_path / "o")
    ckpt = torch.load(tmp_path / "o" / "ckpt.pt", map_location="cpu", weights_only=True)
    torch.save(ckpt, tmp_path / "legacy.pt", _use_new_zipfile_serialization=False)      # torch < 1.6's format
    assert config.load_checkpoint(str(tmp_path / "legacy.pt"))["iter"] == 1
    raw = bytearray((tmp_path / "o" / "ckpt.pt").read_bytes())
    raw[len(raw) // 2] ^= 0xFF                                                           # one byte of a tensor
    (tmp_path / "edited.pt").write_bytes(raw)
    with pytest.raises(config.UsageError) as e:
        config.load_checkpoint(str(tmp_path / "edited.pt"))
    one_line(e, "is not a readable train.py checkpoint (truncated, damaged, or not written by torch.save)")


def test_a_ckpt_pt_without_its_best_record_is_refused_not_its_best_pt_forgotten(lra, tmp_path):
    run("--data_dir", lra, *TINY, "--max_iters", "2", "--eval_interval", "2", "--out_dir", tmp_path / "o")
    ckpt = torch.load(tmp_path / "o" / "ckpt.pt", map_location="cpu", weights_only=True)
    del ckpt["best"]
    torch.save(ckpt, tmp_path / "o" / "ckpt.pt")
    with pytest.raises(train.UsageError) as e:
        run("--resume", "--out_dir", tmp_path / "o", "--max_iters", "4")
    one_line(e, "ckpt.pt is not a train.py checkpoint (it needs model_name, config, model, args, optimizer, iter, best")


def test_a_forks_second_name_for_transject_has_no_heads_either(tmp_path, monkeypatch):
    """A field a model's file leaves unused is found by the file, not the name: config.MODELS's 'tj2' (TransJect with
    2 experts) refuses --n_head as 'transject' does, in train.py and bench.py."""
    monkeypatch.setitem(config.MODELS, "tj2", ("transject", {"n_experts": 2}))
    monkeypatch.setitem(bench.SPEED_MODELS, "tj2", ("transject", {"n_experts": 2}))
    monkeypatch.setattr(data, "load_task", lambda *a, **k: pytest.fail("data was read"))
    with pytest.raises(train.UsageError) as e:
        run("--model", "tj2", "--n_head", "4", "--out_dir", tmp_path / "o", "--cache_dir", tmp_path / "c")
    one_line(e, "--n_head: TransJect has no attention heads (its --n_experts take their place); it is no setting of "
                "--model tj2")
    with pytest.raises(bench.UsageError) as e:
        bench.main(["--models", "tj2", "--n_head", "4", "--out", str(tmp_path / "b"), "--device", "cpu"])
    assert str(e.value) == ("--n_head 4: it acts only with heads (TransJect has none), which --models tj2 has not; "
                            "leave it out")


def test_a_forks_forward_that_returns_the_logits_alone_is_one_line_at_the_first_step(lra, tmp_path, monkeypatch,
                                                                                       capsys):
    forward = simpletron.Model.forward
    monkeypatch.setattr(simpletron.Model, "forward", lambda self, idx, targets=None: forward(self, idx, targets)[0])
    with pytest.raises(train.UsageError) as e:
        run("--data_dir", lra, *TINY, "--max_iters", "2", "--out_dir", tmp_path / "o")
    one_line(e, "model simpletron's forward returned Tensor, not (logits, loss): return both, as "
                "docs/architecture.md says")
    assert "step 1" not in capsys.readouterr().out
