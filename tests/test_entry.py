"""Every program beside train.py under train.py's rule (issue 32): sample.py, analyze.py (each subcommand),
experiments.py and every `python -m tasks.X` meet a user's mistakes (missing, empty, binary, huge or damaged files,
folders where files belong and back, read-only places, absurd numbers, unknown names, a checkpoint of the wrong
kind) with one line on stderr, "error: ...", exit status 2, no traceback, before any work. Each case runs the
program's main as its `__main__` does (data.run_main), in this process; a few run it as a command. Ctrl-C is one
line and exit 130, running out of memory one line and 2; the run folder's own faults are refused before a run."""

import functools
import io
import json
import os
import runpy
import shutil
import signal
import subprocess
import sys
import time
import types
import warnings

import pytest
import torch

import analyze
import bench
import config
import data
import diffeqformer
import experiments
import sample
import simpletron
import tasks
import train
import transject
from test_train import write_listops

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = ["--n_layer", "1", "--n_embd", "16", "--n_head", "2", "--batch_size", "4", "--eval_iters", "1",
        "--log_interval", "1", "--warmup", "1", "--max_iters", "2", "--eval_interval", "2", "--block_size", "16"]
TEXT = "to be, or not to be: that is the question.\n" * 40
BINARY = bytes(range(256)) * 8 + b"\xff\xfe\x00\xc3("          # not UTF-8, not JSON, not a pickle


@pytest.fixture(scope="module")
def w(tmp_path_factory):
    """What the cases break: tiny checkpoints (a character model, a classifier, a byte-level DiffEqFormer), their
    run folders, and files of every wrong kind."""
    root = tmp_path_factory.mktemp("entry")
    (root / "t.txt").write_text(TEXT)
    lra = write_listops(root / "lra", 8, seed=1)
    common = ["--cache_dir", str(root / "cache"), *TINY]
    train.main(["--task", "textfile", "--data_dir", str(root / "t.txt"), "--tokenizer", "char", "--out_dir",
                str(root / "lm"), *common])
    train.main(["--task", "textfile", "--data_dir", str(root / "t.txt"), "--tokenizer", "byte", "--model",
                "diffeqformer", "--out_dir", str(root / "deq"), *common])
    train.main(["--task", "listops", "--data_dir", str(lra), "--out_dir", str(root / "cls"), *common])
    (root / "bin").write_bytes(BINARY)
    (root / "empty").write_bytes(b"")
    (root / "dir").mkdir()
    raw = (root / "lm" / "ckpt.pt").read_bytes()
    (root / "trunc.pt").write_bytes(raw[:len(raw) // 2])
    os.mkfifo(root / "fifo")                                 # opening it would block: never opened
    return types.SimpleNamespace(root=root, lm=root / "lm" / "ckpt.pt", deq=root / "deq" / "ckpt.pt",
                                 cls=root / "cls" / "ckpt.pt", txt=root / "t.txt", bin=root / "bin",
                                 empty=root / "empty", dir=root / "dir", trunc=root / "trunc.pt", fifo=root / "fifo",
                                 lra=lra, under=root / "t.txt" / "x")


def edited(w, t, **change):
    """A copy of the character model's checkpoint with `change` applied (None removes a key)."""
    ckpt = torch.load(w.lm, map_location="cpu", weights_only=True)
    for k, v in change.items():
        ckpt.pop(k) if v is None else ckpt.__setitem__(k, v(ckpt) if callable(v) else v)
    torch.save(ckpt, t / "edited.pt")
    return t / "edited.pt"


def flipped(w, t):
    """A copy of the character model's checkpoint with 64 bytes of its weights changed (torch.load reads it)."""
    raw = bytearray(w.lm.read_bytes())
    raw[len(raw) // 3:len(raw) // 3 + 64] = bytes(b ^ 0xFF for b in raw[len(raw) // 3:len(raw) // 3 + 64])
    (t / "flipped.pt").write_bytes(raw)
    return t / "flipped.pt"


def checkpoint(t, name, model):
    torch.save({"model_name": name, "config": vars(model.config), "model": model.state_dict(),
                "args": {"task": "listops"}}, t / f"{name}.pt")
    return t / f"{name}.pt"


def transject_ckpt(t):
    return checkpoint(t, "transject", transject.Model(transject.Config(vocab_size=16, block_size=8, n_layer=1,
                                                                       n_embd=8)))


def vocab_cut(path, t, n, record=True):
    """A copy of a checkpoint, whole in itself, with a vocabulary of n ids (config and every table of them cut);
    record=False: without the characters or words it records (a run of before train.py recorded them)."""
    ckpt = torch.load(path, map_location="cpu", weights_only=True)
    if not record:
        ckpt.pop("vocabulary", None)
    v = ckpt["config"]["vocab_size"]
    ckpt["model"] = {k: x[:n].clone() if x.dim() and x.shape[0] == v else x for k, x in ckpt["model"].items()}
    ckpt["config"]["vocab_size"] = n
    torch.save(ckpt, t / "cut.pt")
    return t / "cut.pt"


def classifier(t):
    """A DiffEqFormer classifier."""
    return checkpoint(t, "diffeqformer", diffeqformer.Model(diffeqformer.Config(
        vocab_size=16, block_size=8, n_layer=1, n_embd=8, n_head=2, head="cls", n_classes=2)))


def log_file(t, content, name="log.jsonl"):
    """A run folder t/run whose log.jsonl holds `content` (bytes; None: a folder)."""
    (t / "run").mkdir(exist_ok=True)
    (t / "run" / name).mkdir() if content is None else (t / "run" / name).write_bytes(content)
    return t / "run"


def huge(t):
    """A 3 GB file that takes no room (sparse)."""
    with open(t / "huge.txt", "wb") as f:
        f.truncate(3 * 2**30)
    return t / "huge.txt"


def results(t, table, seeds, metrics):
    """out/exp/TABLE/ROW-sSEED/metrics.json of every row and seed, each holding `metrics` (bytes; None: a folder)."""
    for row in experiments.TABLES[table].rows:
        for s in seeds:
            d = t / experiments.run_dir(table, row, s)
            d.mkdir(parents=True, exist_ok=True)
            (d / "metrics.json").mkdir() if metrics is None else (d / "metrics.json").write_bytes(metrics)
    return table


# ----------------------------------------------------------------------------------------------
# The cases: (program, name, argv(w, t) with t a fresh folder, words the line says). "+work": the fault shows only
# once the work has begun (a file read while it is built): still one line, and no output.

S, A, E = "sample.py", "analyze.py", "experiments.py"
CASES = [
    # sample.py: the checkpoint
    (S, "no flags", lambda w, t: [], "--ckpt"),
    (S, "--ckpt without a value", lambda w, t: ["--ckpt"], "expected one argument"),
    (S, "an unknown flag", lambda w, t: ["--ckpt", w.lm, "--temprature", "1"], "unrecognized"),
    (S, "no checkpoint there", lambda w, t: ["--ckpt", t / "none.pt"], "no checkpoint at"),
    (S, "a checkpoint path with line breaks", lambda w, t: ["--ckpt", t / "a\nb\r\nc.pt"], "a\\nb\\r\\nc.pt"),
    (S, "a folder as the checkpoint", lambda w, t: ["--ckpt", w.dir], "is a folder"),
    (S, "the run folder as the checkpoint", lambda w, t: ["--ckpt", w.lm.parent], "is a folder"),
    (S, "an empty checkpoint", lambda w, t: ["--ckpt", w.empty], "not a readable train.py checkpoint"),
    (S, "a binary checkpoint", lambda w, t: ["--ckpt", w.bin], "not a readable train.py checkpoint"),
    (S, "a truncated checkpoint", lambda w, t: ["--ckpt", w.trunc], "not a readable train.py checkpoint"),
    (S, "a text file as the checkpoint", lambda w, t: ["--ckpt", w.txt], "not a readable train.py checkpoint"),
    (S, "a pipe as the checkpoint", lambda w, t: ["--ckpt", w.fifo], "not a regular file"),
    (S, "a log as the checkpoint", lambda w, t: ["--ckpt", w.lm.parent / "log.jsonl"], "not a readable"),
    (S, "a classifier", lambda w, t: ["--ckpt", w.cls], "classifier"),
    (S, "a tensor, not a checkpoint", lambda w, t: [torch.save(torch.zeros(3), t / "z.pt"), "--ckpt", t / "z.pt"][1:],
     "not a train.py checkpoint"),
    (S, "an unknown model", lambda w, t: ["--ckpt", edited(w, t, model_name="gpt9")], "not a train.py checkpoint"),
    (S, "no weights", lambda w, t: ["--ckpt", edited(w, t, model=None)], "not a train.py checkpoint"),
    (S, "weights of another shape", lambda w, t: ["--ckpt", edited(w, t, model=lambda c: {
        k: torch.zeros(3) for k in c["model"]})], "do not fit"),
    (S, "a config of the wrong type", lambda w, t: ["--ckpt", edited(w, t, config=lambda c: {
        **c["config"], "n_embd": "wide"})], "its model settings are damaged (n_embd 'wide': allowed is an integer)"),
    (S, "a config whose bias is the text 'false'", lambda w, t: ["--ckpt", edited(w, t, config=lambda c: {
        **c["config"], "bias": "false"})], "its model settings are damaged (bias 'false': allowed is true or false)"),
    (S, "a config whose vocab_size has 401 digits", lambda w, t: ["--ckpt", edited(w, t, config=lambda c: {
        **c["config"], "vocab_size": 10**400})], "its model settings make a model unlike its weights"),
    (S, "a config whose n_layer is True", lambda w, t: ["--ckpt", edited(w, t, config=lambda c: {
        **c["config"], "n_layer": True})], "its model settings are damaged (n_layer True: allowed is an integer)"),
    (S, "a config with a field the model lacks", lambda w, t: ["--ckpt", edited(w, t, config=lambda c: {
        **c["config"], "colour": 3})], "bad model settings"),
    (S, "a block_size of 2**62 in its config (an overflow when built)", lambda w, t: ["--ckpt", edited(
        w, t, config=lambda c: {**c["config"], "block_size": 2**62})], "its model settings make a model unlike its "
     "weights"),
    (S, "a block_size of 2**20 in its config (gigabytes of positions)", lambda w, t: ["--ckpt", edited(
        w, t, config=lambda c: {**c["config"], "block_size": 2**20})], "make a model unlike its weights"),
    (S, "--data_dir for a run whose tokenizer needs no data", lambda w, t: ["--ckpt", edited(
        w, t, vocabulary=None, args=lambda c: {**c["args"], "tokenizer": "byte"}), "--data_dir", w.dir], "byte tokenizer needs no data to rebuild"),
    (S, "a negative width in its config", lambda w, t: ["--ckpt", edited(w, t, config=lambda c: {
        **c["config"], "n_embd": -16})], "its model settings are damaged (n_embd -16: allowed is"),
    (S, "a checkpoint with bytes changed", lambda w, t: ["--ckpt", flipped(w, t)], "not a readable train.py checkpoint"),
    (S, "a config without vocab_size", lambda w, t: ["--ckpt", edited(w, t, config=lambda c: {
        k: v for k, v in c["config"].items() if k != "vocab_size"})], "do not fit"),
    (S, "weights that are not finite", lambda w, t: ["--ckpt", edited(w, t, model=lambda c: {
        k: v * float("nan") if v.is_floating_point() else v for k, v in c["model"].items()})], "not finite"),
    (S, "a task with no tokenizer", lambda w, t: ["--ckpt", edited(w, t, vocabulary=None, args=lambda c: {
        **c["args"], "task": "chess"})], "no tokenizer"),
    (S, "its data gone", lambda w, t: ["--ckpt", edited(w, t, vocabulary=None, args=lambda c: {
        **c["args"], "data_dir": str(t / "gone.txt"), "cache_dir": str(t / "c")})], "gone.txt"),
    # sample.py: the prompt
    (S, "a prompt file that is not there", lambda w, t: ["--ckpt", w.lm, "--start", f"FILE:{t / 'p.txt'}"],
     "does not exist"),
    (S, "a binary prompt file", lambda w, t: ["--ckpt", w.lm, "--start", f"FILE:{w.bin}"], "not UTF-8"),
    (S, "a folder as the prompt file", lambda w, t: ["--ckpt", w.lm, "--start", f"FILE:{w.dir}"], "is a folder"),
    (S, "a pipe as the prompt file", lambda w, t: ["--ckpt", w.lm, "--start", f"FILE:{w.fifo}"],
     "not a regular file"),
    (S, "an empty prompt file", lambda w, t: ["--ckpt", w.lm, "--start", f"FILE:{w.empty}"], "empty"),
    (S, "FILE: with no path", lambda w, t: ["--ckpt", w.lm, "--start", "FILE:"], "FILE:"),
    (S, "a 3 GB prompt file", lambda w, t: ["--ckpt", w.lm, "--start", f"FILE:{huge(t)}"], "MB"),
    (S, "an empty prompt", lambda w, t: ["--ckpt", w.lm, "--start", ""], "empty"),
    (S, "characters the model never saw", lambda w, t: ["--ckpt", w.lm, "--start", "zebra"], "'z'"),
    # (a checkpoint from before train.py recorded its characters: rebuilt from --data_dir)
    (S, "--data_dir not there", lambda w, t: ["--ckpt", edited(w, t, vocabulary=None), "--data_dir", t / "none"], "none"),
    (S, "--data_dir a binary file", lambda w, t: ["--ckpt", edited(w, t, vocabulary=None), "--data_dir", w.bin], "UTF-8",
     "+work"),
    (S, "--data_dir for a run that records its characters", lambda w, t: ["--ckpt", w.lm, "--data_dir", w.dir],
     "--data_dir: the checkpoint records its vocabulary"),
    (S, "--data_dir empty", lambda w, t: ["--ckpt", w.lm, "--data_dir", ""], "--data_dir"),
    # sample.py: numbers and the device
    *[(S, f"--temperature {v}", lambda w, t, v=v: ["--ckpt", w.lm, "--temperature", v], "--temperature")
      for v in ("0", "-1", "nan", "inf", "-inf", "1e-300", "1e-9", "1e400")],
    (S, "--temperature a word", lambda w, t: ["--ckpt", w.lm, "--temperature", "hot"], "invalid float"),
    *[(S, f"--top_k {v}", lambda w, t, v=v: ["--ckpt", w.lm, "--top_k", v], "--top_k") for v in ("-1", "1.5", "x")],
    *[(S, f"--num_samples {v}", lambda w, t, v=v: ["--ckpt", w.lm, "--num_samples", v], "--num_samples")
      for v in ("0", "-3", "2.5", str(10**9), str(10**30))],
    *[(S, f"--max_new_tokens {v}", lambda w, t, v=v: ["--ckpt", w.lm, "--max_new_tokens", v], "--max_new_tokens")
      for v in ("-1", str(10**12), str(10**7), "1e3", "")],
    (S, "many samples of many tokens", lambda w, t: ["--ckpt", w.lm, "--num_samples", "200000", "--max_new_tokens",
                                                     "90000"], "memory"),
    *[(S, f"--seed {v}", lambda w, t, v=v: ["--ckpt", w.lm, "--seed", v], "--seed") for v in ("-1", str(2**40), "x")],
    *[(S, f"--device {v}", lambda w, t, v=v: ["--ckpt", w.lm, "--device", v], "--device")
      for v in ("cuda", "cuda:3", "mps", "tpu", "", "CPU")],

    # analyze.py: the command line and --out
    (A, "no subcommand", lambda w, t: [], "give a subcommand"),
    (A, "an unknown subcommand", lambda w, t: ["spectrum"], "invalid choice"),
    (A, "an unknown flag", lambda w, t: ["cluster", "--stepz", "3"], "unrecognized"),
    (A, "--out a file", lambda w, t: ["cluster", "--out", w.txt], "--out"),
    (A, "--out under a file", lambda w, t: ["cluster", "--out", w.under], "--out"),
    (A, "--out empty", lambda w, t: ["cluster", "--out", ""], "--out"),
    (A, "--out read-only", lambda w, t: ["cluster", "--out", t / "ro" / "a"], "--out"),
    (A, "--out without a value", lambda w, t: ["cluster", "--out"], "expected one argument"),
    # spectra, lyapunov, activation, experts: the checkpoints
    *[(A, f"{cmd} without --ckpt", lambda w, t, cmd=cmd: [cmd, "--out", t / "a"], "--ckpt")
      for cmd in ("spectra", "lyapunov", "activation", "experts")],
    *[(A, f"{cmd} with {what}", lambda w, t, cmd=cmd, f=f: [cmd, "--ckpt", f(w, t), "--out", t / "a"], words)
      for cmd in ("spectra", "lyapunov", "activation", "experts")
      for what, f, words in (("no checkpoint there", lambda w, t: t / "none.pt", "no checkpoint at"),
                             ("a binary checkpoint", lambda w, t: w.bin, "not a readable"),
                             ("an empty checkpoint", lambda w, t: w.empty, "not a readable"),
                             ("a folder", lambda w, t: w.dir, "is a folder"))],
    (A, "spectra of weights that are not finite", lambda w, t: ["spectra", "--ckpt", edited(w, t, model=lambda c: {
        k: v * float("inf") if v.is_floating_point() else v for k, v in c["model"].items()}), "--out", t / "a"],
     "not finite"),
    (A, "activation of a config out of its limits", lambda w, t: ["activation", "--ckpt", edited(w, t, config=lambda c: {
        **c["config"], "n_layer": 0}), "--out", t / "a"], "its model settings are damaged (n_layer 0"),
    (A, "spectra of TransJect", lambda w, t: ["spectra", "--ckpt", transject_ckpt(t), "--out", t / "a"], "TransJect"),
    (A, "spectra of two checkpoints", lambda w, t: ["spectra", "--ckpt", w.lm, "--ckpt", w.cls, "--out", t / "a"],
     "one --ckpt"),
    (A, "spectra --grid of a discrete model", lambda w, t: ["spectra", "--ckpt", w.lm, "--grid", "5", "--out",
                                                            t / "a"], "--grid"),
    *[(A, f"spectra --grid {v}", lambda w, t, v=v: ["spectra", "--ckpt", w.deq, "--grid", v, "--out", t / "a"],
       "--grid") for v in ("-1", str(10**9), "x")],
    (A, "lyapunov of a SimpleTRON", lambda w, t: ["lyapunov", "--ckpt", w.lm, "--out", t / "a"], "DiffEqFormer"),
    (A, "lyapunov of a DiffEqFormer classifier", lambda w, t: ["lyapunov", "--ckpt", classifier(t), "--out", t / "a"],
     "language model"),
    (A, "lyapunov --text empty", lambda w, t: ["lyapunov", "--ckpt", w.deq, "--text", "", "--out", t / "a"], "--text"),
    (A, "lyapunov --text one token past the block", lambda w, t: ["lyapunov", "--ckpt", w.deq, "--text", "x" * (
        torch.load(w.deq, weights_only=True)["config"]["block_size"] + 1), "--out", t / "a"],
     "tokens, and the model reads at most its block_size"),
    *[(A, f"lyapunov --position {v}", lambda w, t, v=v: ["lyapunov", "--ckpt", w.deq, "--text", "to be", "--position",
                                                          v, "--out", t / "a"],
      f"--position {v}: --text gives 5 tokens, so allowed is -5 to 4" if v in ("5", "-6") else "--position")
      for v in ("5", "-6", "99999", "x")],
    (A, "activation of a checkpoint with fewer ids than its task", lambda w, t: [
        "activation", "--ckpt", vocab_cut(w.lm, t, 10, record=False), "--out", t / "a"],
     "has 18 ids but the checkpoint's model reads 10: its data changed since training, or the checkpoint is another"),
    (A, "activation of a checkpoint with fewer ids than the characters it records", lambda w, t: [
        "activation", "--ckpt", vocab_cut(w.lm, t, 10), "--out", t / "a"],
     "is damaged: it records 17 characters (ids 1 to 17) but its model has 10 ids; use the run's other checkpoint"),
    (A, "activation of a checkpoint with one id fewer than its characters need", lambda w, t: [
        "activation", "--ckpt", vocab_cut(w.lm, t, 17), "--out", t / "a"],
     "is damaged: it records 17 characters (ids 1 to 17) but its model has 17 ids"),     # (id 0 is padding)
    (A, "lyapunov --text with a byte past the model's ids", lambda w, t: [
        "lyapunov", "--ckpt", vocab_cut(w.deq, t, 100), "--text", "to be", "--out", t / "a"],
     "--text: 't' is id 116, past the model's 100 ids: the run's data changed since training"),
    *[(A, f"lyapunov --k {v}", lambda w, t, v=v: ["lyapunov", "--ckpt", w.deq, "--k", v, "--out", t / "a"], "--k")
      for v in ("0", "-2", "x")],
    (A, "lyapunov --k above the width", lambda w, t: ["lyapunov", "--ckpt", w.deq, "--text", "to be", "--k",
                                                       str(torch.load(w.deq, weights_only=True)["config"]["n_embd"] + 1),
                                                       "--out", t / "a"], "allowed is at most the width"),
    (A, "cluster --degrees at the growth limit", lambda w, t: ["cluster", "--degrees", "20", "--T", "10", "--out",
                                                               t / "a"], "below 1e20"),       # 1 + 10^20: not below
    (A, "curves of a log whose losses are text", lambda w, t: ["curves", log_file(
        t, b'{"step": 1, "loss": "low"}\n{"step": 2, "val_loss": "high"}\n'), "--out", t / "a"], "no record of a step"),
    (A, "curves of a log with one loss of text among numbers", lambda w, t: ["curves", log_file(
        t, b'{"step": 1, "loss": 2.0}\n{"step": 2, "loss": "low"}\n{"step": 2, "val_loss": 1.0}\n'), "--out",
        t / "a"], "has a damaged record (step 2)"),
    (A, "experts of a SimpleTRON", lambda w, t: ["experts", "--ckpt", w.lm, "--out", t / "a"], "TransJect"),
    *[(A, f"{cmd} --{flag} {v}", lambda w, t, cmd=cmd, flag=flag, v=v: [cmd, "--ckpt", w.lm, f"--{flag}", v, "--out",
                                                                         t / "a"], f"--{flag}")
      for cmd in ("activation", "experts")
      for flag, v in (("n_seq", "0"), ("n_seq", "-1"), ("n_seq", str(10**12)), ("max_len", "0"), ("max_len", "-1"))],
    (A, "spectra of a checkpoint with bytes changed", lambda w, t: ["spectra", "--ckpt", flipped(w, t), "--out",
                                                                      t / "a"], "not a readable train.py checkpoint"),
    (A, "activation, the run's cache_dir a number", lambda w, t: ["activation", "--ckpt", edited(w, t, args=lambda c: {
        **c["args"], "cache_dir": 5}), "--out", t / "a"], "is damaged: its setting cache_dir is no string"),
    (A, "activation, the run's cache_dir null", lambda w, t: ["activation", "--ckpt", edited(w, t, args=lambda c: {
        **c["args"], "cache_dir": None}), "--out", t / "a"], "is damaged: its setting cache_dir is null"),
    (A, "activation, the run's data gone", lambda w, t: ["activation", "--ckpt", edited(w, t, args=lambda c: {
        **c["args"], "data_dir": str(t / "gone.txt"), "cache_dir": str(t / "c")}), "--out", t / "a"], "gone.txt"),
    # cluster: numbers
    *[(A, f"cluster --{flag} {v}", lambda w, t, flag=flag, v=v: ["cluster", f"--{flag}", v, "--out", t / "a"],
       f"--{flag}")
      for flag, values in (("tokens", ("0", "1", "-5", str(10**9), "many")), ("steps", ("0", "-1", str(10**12), "1.5")),
                           ("T", ("0", "-1", "nan", "inf", "1e308")), ("eps", ("0", "-0.1", "nan", "inf")),
                           ("degrees", ("", "a,b", "1,,2", "-1", "99999", "1.5", "²", "1" + "0" * 400)), ("seed", ("-1", str(2**40))),
                           ("weights", ("orthogonal",)))
      for v in values],
    (A, "cluster of many tokens for many steps", lambda w, t: ["cluster", "--tokens", "1000", "--steps", "100000",
                                                               "--out", t / "a"], "--steps"),
    # attnstd and curves: the run folders
    (A, "attnstd without --run", lambda w, t: ["attnstd", "--out", t / "a"], "--run"),
    (A, "attnstd of a folder that is not there", lambda w, t: ["attnstd", "--run", t / "none", "--out", t / "a"],
     "none"),
    (A, "attnstd of a file", lambda w, t: ["attnstd", "--run", w.txt, "--out", t / "a"], "log.jsonl"),
    (A, "attnstd of a run without attention std", lambda w, t: ["attnstd", "--run", w.lm.parent, "--out", t / "a"],
     "--attn_std_interval"),
    (A, "attnstd of a binary log", lambda w, t: ["attnstd", "--run", log_file(t, BINARY), "--out", t / "a"],
     "log.jsonl"),
    (A, "attnstd of a log that is a folder", lambda w, t: ["attnstd", "--run", log_file(t, None), "--out", t / "a"],
     "folder"),
    (A, "attnstd of a record holding Infinity", lambda w, t: ["attnstd", "--run", log_file(
        t, b'{"step": 1, "score_std": [1], "attn_std": [1]}\n{"step": 2, "score_std": [Infinity], "attn_std": [1]}\n'),
        "--out", t / "a"], "the attention std of step 2 is damaged"),
    (A, "attnstd with a damaged metrics.json", lambda w, t: [
        "attnstd", "--run", [log_file(t, b'{"step": 1, "score_std": [1], "attn_std": [1]}\n'),
                             log_file(t, b"{", "metrics.json")][0], "--out", t / "a"], "metrics.json"),
    *[(A, f"attnstd with metrics.json {what}", lambda w, t, m=m: [
        "attnstd", "--run", [log_file(t, b'{"step": 1, "score_std": [1], "attn_std": [1]}\n'),
                             log_file(t, m, "metrics.json")][0], "--out", t / "a"], "metrics.json")
      for what, m in (("a list", b"[1, 2]"), ("null", b"null"))],
    *[(A, f"attnstd of a log whose {what}", lambda w, t, log=log: ["attnstd", "--run", log_file(t, log), "--out",
                                                                   t / "a"], "attention std of step")
      for what, log in (("record has no attn_std", b'{"step": 1, "score_std": [1]}\n'),
                        ("score_std is a number", b'{"step": 1, "score_std": 5, "attn_std": [1]}\n'),
                        ("records differ in blocks", b'{"step": 1, "score_std": [1, 2], "attn_std": [1, 2]}\n'
                                                     b'{"step": 2, "score_std": [1], "attn_std": [1]}\n'))],
    (A, "curves of a log of records, then bytes not UTF-8 past its first 8 kB", lambda w, t: [
        "curves", log_file(t, b'{"step": 1, "loss": 2.0}\n' * 500 + BINARY), "--out", t / "a"], "not UTF-8"),
    *[(A, f"curves of a log whose step is {v.decode()}", lambda w, t, v=v: [
        "curves", log_file(t, b'{"step": %s, "loss": 1.0, "val_loss": 1.0}\n' % v), "--out", t / "a"], "no record")
      for v in (b"NaN", b"1e999", b"1" * 401, b"true")],
    (A, "curves of a log whose loss is an integer of 401 digits", lambda w, t: ["curves", log_file(
        t, b'{"step": 1, "loss": 2.0}\n{"step": 2, "loss": %s}\n' % (b"9" * 401)), "--out", t / "a"],
     "has a damaged record (step 2)"),
    (A, "curves --table whose run's log.jsonl is a loop of links", lambda w, t: [
        (t / "out" / "exp" / "tb" / "r-s0").mkdir(parents=True), os.symlink("log.jsonl", t / "out/exp/tb/r-s0/log.jsonl"),
        "curves", "--table", "tb", "--out", t / "a"][2:], "log.jsonl"),
    (A, "curves of nothing", lambda w, t: ["curves", "--out", t / "a"], "run folders"),
    (A, "curves of an empty folder name", lambda w, t: ["curves", "", "--out", t / "a"], "an empty string"),
    (A, "curves of a folder that is not there", lambda w, t: ["curves", t / "none", "--out", t / "a"], "none"),
    (A, "curves of a file", lambda w, t: ["curves", w.txt, "--out", t / "a"], "log.jsonl"),
    (A, "curves of a binary log", lambda w, t: ["curves", log_file(t, BINARY), "--out", t / "a"], "log.jsonl"),
    (A, "curves of an empty log", lambda w, t: ["curves", log_file(t, b""), "--out", t / "a"], "log.jsonl"),
    (A, "curves of a log nested 100,000 deep", lambda w, t: ["curves", log_file(t, b"[" * 10**5 + b"]" * 10**5), "--out",
                                                           t / "a"], "log.jsonl"),
    (A, "curves of a log of a resumption alone", lambda w, t: ["curves", log_file(
        t, b'{"step": 2, "resumed": true, "time": 0.5}\n'), "--out", t / "a"], "holds no record of a step"),
    (A, "curves of a log of other JSON", lambda w, t: ["curves", log_file(t, b'[1, 2]\n"x"\n'), "--out", t / "a"],
     "log.jsonl"),
    (A, "curves of a log that is a folder", lambda w, t: ["curves", log_file(t, None), "--out", t / "a"], "folder"),
    (A, "curves of a run and a broken one", lambda w, t: ["curves", w.lm.parent, log_file(t, BINARY), "--out",
                                                          t / "a"], "log.jsonl"),
    (A, "curves --table unknown", lambda w, t: ["curves", "--table", "nothing", "--out", t / "a"], "nothing"),

    # experiments.py (run in t: out/exp/... there, docs/results.md replaced by t/results.md)
    (E, "no table", lambda w, t: [], "table"),
    (E, "an unknown table", lambda w, t: ["chess"], "chess"),
    (E, "--list of an unknown table", lambda w, t: ["--list", "chess"], "chess"),
    (E, "an unknown flag", lambda w, t: ["transfer", "--colour", "red"], "unrecognized"),
    (E, "--seeds without a value", lambda w, t: ["transfer", "--seeds"], "expected one argument"),
    *[(E, f"--seeds {v!r}", lambda w, t, v=v: ["transfer", "--seeds", v], "--seeds")
      for v in ("", "a", "-1", "0,0", "1,,2", "0,00", "1,01", "1.5", str(2**40), "0;1")],
    *[(E, f"--jobs {v}", lambda w, t, v=v: ["transfer", "--jobs", v], "--jobs") for v in ("0", "-2", "x", str(10**6))],
    (E, "--jobs past the cores", lambda w, t: ["transfer", "--jobs", str((os.cpu_count() or 1) + 1)],
     f"allowed is 1 to {os.cpu_count() or 1}, the cores of this machine"),
    (E, "--data_dir not there", lambda w, t: ["transfer", "--data_dir", t / "none"], "--data_dir"),
    (E, "text-char without --data_dir", lambda w, t: ["text-char", "--seeds", "0"], "textfile: no text given"),
    (E, "text-char --data_dir a binary file", lambda w, t: ["text-char", "--data_dir", w.bin], "not UTF-8 text",
     "+work"),
    (E, "transfer (generated) with --data_dir", lambda w, t: ["transfer", "--data_dir", w.txt],
     "it sets the generated listops examples, and --data_dir's files are read instead"),
    (E, "listops-lra --data_dir a file", lambda w, t: ["listops-lra", "--data_dir", w.txt], "is not a folder"),
    (E, "--bert_dir missing", lambda w, t: ["agnews"], "--bert_dir"),
    (E, "--bert_dir a file", lambda w, t: ["agnews", "--bert_dir", w.txt], "--bert_dir"),
    (E, "--bert_dir a folder without config.json", lambda w, t: ["agnews", "--bert_dir", w.dir, "--seeds", "0"],
     "config.json"),                                         # (its first runs need no BERT: every run checked)
    (E, "--bert_dir for a table without BERT", lambda w, t: ["transfer", "--bert_dir", w.dir],
     "--bert_dir: no row of transfer reads a BERT folder"),
    (E, "--report_only with an unknown row", lambda w, t: ["transfer", "--report_only", "--rows", "nothing"],
     "--rows nothing: no row of transfer"),
    (E, "--rows with no name", lambda w, t: ["transfer", "--report_only", "--rows", " , "],
     "--rows needs NAME,... (python experiments.py --list TABLE names the rows)"),
    (E, "--list with --jobs", lambda w, t: ["--list", "--jobs", "2"], "--jobs: --list prints, runs nothing"),
    (E, "--list TABLE with --rows", lambda w, t: ["--list", "transfer", "--rows", "x"], "--rows: --list prints"),
    (E, "--list of one table and another", lambda w, t: ["--list", "transfer", "ptb"], "give one table"),
    (E, "--list of no table with --data_dir", lambda w, t: ["--list", "--data_dir", w.dir],
     "--data_dir: --list without a table prints no command"),            # (was dropped)
    (E, "a table that makes held-out trees, with --data_dir", lambda w, t: ["listops-small", "--data_dir", w.dir],
     "it sets the generated listops examples"),                          # (refused after the trees were made)
    (E, "a computed table with --data_dir", lambda w, t: ["deq-grid", "--data_dir", w.dir],
     "--data_dir: table deq-grid is computed here, with no runs"),
    (E, "--report_only with --jobs", lambda w, t: ["transfer", "--report_only", "--jobs", "2"],
     "--jobs: --report_only runs nothing"),
    (E, "--report_only, a run's metrics.json without a test metric it has a val metric of", lambda w, t: [
        "transfer", "--report_only", "--seeds", "0", results(t, "transfer", [0], json.dumps(
            {"val_loss": 1.0, "val_acc": 0.5, "test_loss": 1.0, "n_params": 10}).encode())][:4], "has no 'test_acc'"),
    (E, "--report_only without runs", lambda w, t: ["transfer", "--report_only", "--seeds", "0"],
     "python experiments.py"),
    (E, "--report_only with a run missing", lambda w, t: [
        "transfer", "--report_only", "--seeds", "0,1", results(t, "transfer", [0], json.dumps(
            {"val_acc": 0.5, "test_acc": 0.5, "n_params": 10, "n_val": 2, "n_test": 2, "model": "simpletron"}).encode())
    ][:4], "s1"),
    *[(E, f"--report_only, metrics.json {what}", lambda w, t, m=m: [
        "transfer", "--report_only", "--seeds", "0", results(t, "transfer", [0], m)][:4], "metrics.json")
      for what, m in (("corrupt", b'{"val_acc": 0.'), ("empty", b""), ("binary", BINARY), ("a folder", None),
                      ("a list", b"[1, 2]"), ("without numbers", b"{}"), ("of text", b'{"val_acc": "high"}'),
                      ("with seconds of text", b'{"val_loss": 1.0, "n_params": 10, "seconds": "long"}'),
                      ("with a best of text", b'{"val_loss": 1.0, "n_params": 10, "best": {"test_acc": "x"}}'),
                      ("100,000 lists deep", b"[" * 100_000 + b"]" * 100_000),     # json: a RecursionError
                      ("without the table's accuracy", b'{"val_loss": 1.0, "n_params": 10, "test_loss": 1.0}'),
                      *[(f"with {k} {v}", json.dumps({"val_acc": 0.5, "test_acc": 0.5, "n_params": 10, "n_val": 2,
                                                      "n_test": 2, k: v}).encode())
                        for k, v in (("test_acc", float("nan")), ("n_params", float("inf")), ("gates", "none"),
                                     ("n_val", 10**400), ("test_acc", 1.5), ("test_acc", -0.01),
                                     ("gates", {"a": {"used": 0.5}}), ("gates", {"a": {"value": -1e308, "used": 1}}),
                                     ("machine", 5), ("config", [1]), ("config", {"n_layer": 0}), ("args", "x"))])],
    (E, "--report_only --jobs 1 (its default, typed)", lambda w, t: ["transfer", "--report_only", "--jobs", "1"],
     "--jobs: --report_only runs nothing"),
    (E, "results.md a FIFO", lambda w, t: [os.mkfifo(t / "results.md"), "transfer", "--seeds", "0"][1:],
     "results.md cannot be written: is not a regular file"),
    (E, "results.md a loop of links", lambda w, t: [os.symlink(t / "results.md", t / "results.md"), "transfer",
                                                    "--seeds", "0"][1:], "results.md cannot be written"),
    (E, "results.md a folder", lambda w, t: [(t / "results.md").mkdir(), "transfer", "--report_only", "--seeds",
                                             "0"][1:], "results.md"),
]

MODULES = ["tasks.listops", "tasks.pathfinder", "tasks.image", "tasks.retrieval", "tasks.lm", "tasks.text", "tasks.recall"]
PREPARE = [
    *[(m, f"--block_size {v}", lambda w, t, v=v, m=m: [*(["--task", "textfile"] if m == "tasks.lm" else
                                                          ["--task", "imdb"] if m == "tasks.text" else
                                                          ["--task", "mqar"] if m == "tasks.recall" else []),
                                                        "--block_size", v, "--cache_dir", t / "c"], "--block_size")
      for m in MODULES for v in ("-5", "0", "x")],
    *[(m, f"--cache_dir {what}", lambda w, t, f=f, m=m: [*(["--task", "textfile", "--data_dir", w.txt]
                                                          if m == "tasks.lm" else ["--task", "imdb"]
                                                          if m == "tasks.text" else
                                                          ["--task", "mqar"] if m == "tasks.recall" else []), "--cache_dir", f(w, t)],
       "--cache_dir")
      for m in MODULES for what, f in (("a file", lambda w, t: w.txt), ("under a file", lambda w, t: w.under),
                                       ("read-only", lambda w, t: t / "ro" / "c"), ("empty", lambda w, t: ""))],
    *[(m, "an unknown flag", lambda w, t: ["--cache_dir", t / "c", "--colour", "red"], "unrecognized")
      for m in MODULES],
    *[(m, "a flag without its value", lambda w, t: ["--cache_dir"], "expected one argument") for m in MODULES],
    *[(m, "--data_dir not there", lambda w, t, m=m: [*(["--task", "ptb"] if m == "tasks.lm" else ["--task", "agnews"]
                                                      if m == "tasks.text" else
                                                          ["--task", "mqar"] if m == "tasks.recall" else []), "--data_dir", t / "none",
                                                    "--cache_dir", t / "c"], "none")
      for m in MODULES],
    *[(m, "--data_dir an empty folder", lambda w, t, m=m: [*(["--task", "wikitext103"] if m == "tasks.lm" else
                                                            ["--task", "text"] if m == "tasks.text" else
                                                          ["--task", "mqar"] if m == "tasks.recall" else []),
                                                          "--data_dir", w.dir, "--cache_dir", t / "c"], "dir")
      for m in MODULES],
    ("tasks.listops", "--data_dir a file", lambda w, t: ["--data_dir", w.bin, "--cache_dir", t / "c"], "bin"),
    ("tasks.listops", "binary TSV files", lambda w, t: [
        [(t / "d").mkdir()] + [(t / "d" / f"basic_{s}.tsv").write_bytes(BINARY) for s in ("train", "val", "test")],
        "--data_dir", t / "d", "--cache_dir", t / "c"][1:], "basic_train.tsv"),
    *[("tasks.listops", f"--{flag} {v}", lambda w, t, flag=flag, v=v: [f"--{flag}", v, "--cache_dir", t / "c"],
       f"--{flag}")
      for flag, values in (("listops_depth", ("x", "1", "1000")), ("listops_args", ("5,2", "a,b", "3")),
                           ("listops_len", ("20,5", "x")), ("listops_sizes", ("0,0,0", "1,2", "a,b,c")))
      for v in values],
    ("tasks.listops", "a billion trees", lambda w, t: ["--listops_sizes", "1000000000,2,2", "--cache_dir", t / "c"],
     "--listops_sizes"),
    ("tasks.listops", "trees of a billion tokens", lambda w, t: ["--listops_len", "5,1000000000", "--listops_depth", "30",
                                                                 "--cache_dir", t / "c"], "GiB"),
    ("tasks.listops", "--tsv with a value", lambda w, t: ["--tsv=1", "--cache_dir", t / "c"], "--tsv"),
    ("tasks.listops", "--task of another module", lambda w, t: ["--task", "ptb", "--cache_dir", t / "c"], "ptb"),
    ("tasks.listops", "a flag of another task", lambda w, t: ["--tokenizer", "byte", "--cache_dir", t / "c"],
     "--tokenizer"),
    *[("tasks.recall", f"--{flag} {v}", lambda w, t, flag=flag, v=v: [
        "--task", "copy", f"--{flag}", v, "--cache_dir", t / "c"], f"--{flag}")
      for flag, values in (("recall_len", ("x", "0", "5")), ("recall_pairs", ("0", "x")), ("recall_vocab", ("3", "70000")),
                           ("recall_sizes", ("0,0,0", "1,2", "1000000000,2,2")))
      for v in values],
    ("tasks.recall", "no --task", lambda w, t: ["--cache_dir", t / "c"], "--task"),
    ("tasks.recall", "a plain file of bad lines", lambda w, t: ["--task", "mqar", "--data_dir", w.txt, "--cache_dir",
                                                             t / "c"], "t.txt"),
    *[("tasks.recall", f"--data_dir with --{flag}", lambda w, t, flag=flag: [
        "--task", "mqar", "--data_dir", w.txt, f"--{flag}", "4" if flag == "recall_pairs" else "8,4,4", "--cache_dir",
        t / "c"], f"--{flag} ") for flag in ("recall_pairs", "recall_sizes")],          # (files are read instead)
    ("tasks.listops", "--data_dir with --listops_depth 10 (the default, typed)", lambda w, t: [
        "--data_dir", w.lra, "--listops_depth", "10", "--cache_dir", t / "c"], "--listops_depth 10: it sets the"),
    ("tasks.lm", "ptb --tokenizer byte", lambda w, t: ["--task", "ptb", "--tokenizer", "byte", "--cache_dir", t / "c"],
     "ptb: --tokenizer byte: Penn Treebank is read as its words"),
    ("tasks.retrieval", "no --data_dir", lambda w, t: ["--cache_dir", t / "c"], "--data_dir"),
    ("tasks.lm", "no --task", lambda w, t: ["--cache_dir", t / "c"], "--task"),
    ("tasks.lm", "an unknown --task", lambda w, t: ["--task", "chess", "--cache_dir", t / "c"], "chess"),
    ("tasks.lm", "textfile without --data_dir", lambda w, t: ["--task", "textfile", "--cache_dir", t / "c"],
     "--data_dir"),
    ("tasks.lm", "an unknown tokenizer", lambda w, t: ["--task", "textfile", "--data_dir", w.txt, "--tokenizer", "nope",
                                                       "--cache_dir", t / "c"], "--tokenizer"),
    ("tasks.lm", "a binary text file", lambda w, t: ["--task", "textfile", "--data_dir", w.bin, "--tokenizer", "char",
                                                     "--cache_dir", t / "c"], "UTF-8", "+work"),
    ("tasks.lm", "an empty text file", lambda w, t: ["--task", "textfile", "--data_dir", w.empty, "--tokenizer",
                                                     "char", "--cache_dir", t / "c"], "no text", "+work"),
    ("tasks.lm", "a text shorter than a window", lambda w, t: [
        (t / "short.txt").write_text("abc" * 4), "--task", "textfile", "--data_dir", t / "short.txt", "--tokenizer",
        "char", "--block_size", "64", "--cache_dir", t / "c"][1:], "--block_size", "+work"),
    ("tasks.lm", "a pipe as the text file", lambda w, t: ["--task", "textfile", "--data_dir", w.fifo, "--cache_dir",
                                                          t / "c"], "not a regular file"),
    ("tasks.lm", "openwebtext of a binary file", lambda w, t: [
        (t / "owt").mkdir(), (t / "owt" / "train.bin").write_bytes(b"\x01"), (t / "owt" / "val.bin").write_bytes(b""),
        "--task", "openwebtext", "--data_dir", t / "owt", "--cache_dir", t / "c"][3:], "bin"),
    ("tasks.lm", "openwebtext with a meta.json below its ids", lambda w, t: [
        (t / "owt").mkdir(), (t / "owt" / "train.bin").write_bytes(b"\xff\x00" * 50),
        (t / "owt" / "val.bin").write_bytes(b"\xff\x00" * 50), (t / "owt" / "meta.json").write_text(
            '{"vocab_size": 3, "dtype": "uint16"}'), "--task", "openwebtext", "--data_dir", t / "owt", "--block_size",
        "8", "--cache_dir", t / "c"][4:], "outside the 3 ids of"),
    *[("tasks.lm", f"openwebtext with a meta.json of {v} ids in uint16", lambda w, t, v=v: [
        (t / "owt").mkdir(), (t / "owt" / "train.bin").write_bytes(b"\x01\x00" * 50),
        (t / "owt" / "val.bin").write_bytes(b"\x01\x00" * 50), (t / "owt" / "meta.json").write_text(
            f'{{"vocab_size": {v}, "dtype": "uint16"}}'), "--task", "openwebtext", "--data_dir", t / "owt",
        "--block_size", "8", "--cache_dir", t / "c"][4:], "meta.json") for v in ("1e30", "65537")],
    ("tasks.text", "no --task", lambda w, t: ["--cache_dir", t / "c"], "--task"),
    ("tasks.text", "a tokenizer for the byte-level task", lambda w, t: ["--task", "text", "--tokenizer", "byte",
                                                                        "--cache_dir", t / "c"], "--tokenizer"),
    ("tasks.text", "agnews of a binary CSV", lambda w, t: [
        (t / "ag").mkdir(), (t / "ag" / "test.csv").write_bytes(BINARY), "--task", "agnews", "--tokenizer", "byte",
        "--data_dir", t / "ag", "--cache_dir", t / "c"][2:], "UTF-8", "+work"),
]


class Worked(AssertionError):
    """The program began its work (sampling, an analysis, a training run, a cache) before it found the fault."""


@pytest.fixture
def guarded(monkeypatch, tmp_path):
    """Work raises Worked; a folder named ro is read-only (faked: root writes anywhere); experiments.py runs in
    tmp_path and writes tmp_path/results.md."""
    def worked(*a, **k):
        raise Worked("work began before the fault was found")
    for model in (simpletron.Model, transject.Model, diffeqformer.Model):
        monkeypatch.setattr(model, "generate", worked)
    monkeypatch.setattr(analyze, "COMMANDS", {name: worked for name in analyze.COMMANDS})
    monkeypatch.setattr(subprocess, "Popen", worked)
    monkeypatch.setattr(experiments, "write_block", worked)
    for module in vars(tasks).values():                      # a cache that is there is read; one built is work
        if isinstance(module, types.ModuleType) and module is not data and hasattr(module, "cached_dir"):
            monkeypatch.setattr(module, "cached_dir", lambda folder, build, *a: data.cached_dir(folder, worked, *a))
    access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: access(p, mode) and not (
        mode & os.W_OK and f"{os.sep}ro" in os.path.abspath(p)))
    (tmp_path / "ro").mkdir()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(experiments, "RESULTS_MD", str(tmp_path / "results.md"))
    monkeypatch.setattr(experiments, "ROOT", str(tmp_path))  # (where its runs start and their data is cached)
    return monkeypatch


def entry(program, argv, monkeypatch):
    """Run a program as its __main__ does, in this process (a task module: as python -m runs it, its entry at its
    end): its exit status (its output: capsys)."""
    main = {S: sample.main, A: analyze.main, E: experiments.main}.get(program)
    try:
        if main is None:
            monkeypatch.setattr(sys, "argv", [program, *argv])
            with warnings.catch_warnings():                  # (runpy's, as tasks/__init__.py's filter says)
                warnings.simplefilter("ignore", RuntimeWarning)
                runpy.run_module(program, run_name="__main__")
        else:
            data.run_main(functools.partial(main, argv), config.UsageError)
    except SystemExit as e:
        return e.code
    return 0


def check_one_line(status, err, words, expected=2):
    lines = err.strip().splitlines()
    assert status == expected, (status, err)
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    assert words in lines[0], (words, lines[0])


ALL = [(*c, "")[:5] for c in CASES + PREPARE]


@pytest.mark.parametrize("program,name,argv,words,work", ALL, ids=[f"{c[0]}: {c[1]}" for c in ALL])
def test_a_mistake_is_one_line_and_exit_2_before_any_work(program, name, argv, words, work, w, tmp_path, guarded,
                                                          capsys):
    if work:                                                 # found only while working: let it begin
        guarded.undo()
        guarded.chdir(tmp_path)
        guarded.setattr(experiments, "RESULTS_MD", str(tmp_path / "results.md"))
        guarded.setattr(experiments, "ROOT", str(tmp_path))
    status = entry(program, [str(a) for a in argv(w, tmp_path)], guarded)
    out, err = capsys.readouterr()
    check_one_line(status, err, words)
    assert "---------------" not in out                      # no sample printed
    assert not (tmp_path / "a").exists() and not (tmp_path / "results.md").is_file()     # no analysis, no table
    if not work and (tmp_path / "c").exists():                # no task's cache
        assert not [f for f in (tmp_path / "c").rglob("*") if f.is_file()]


# ----------------------------------------------------------------------------------------------
# As commands: one line on stderr, exit 2; Ctrl-C one line and 130; out of memory one line and 2

def command(*argv, **kw):
    return subprocess.run([sys.executable, *map(str, argv)], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          **kw)


@pytest.mark.parametrize("argv,words", [
    (lambda w: ["sample.py", "--ckpt", w.lm, "--start", f"FILE:{w.bin}"], "not UTF-8"),
    (lambda w: ["analyze.py", "curves", w.bin.parent / "lra", "--out", w.root / "a"], "log.jsonl"),
    (lambda w: ["experiments.py", "transfer", "--jobs", "0"], "--jobs"),
    (lambda w: ["-m", "tasks.listops", "--block_size", "-5"], "--block_size"),
    (lambda w: ["-m", "tasks.lm", "--task", "textfile", "--cache_dir", w.under], "--cache_dir"),
    *[(lambda w, m=m: ["-m", m], "no task") for m in ("tasks.sources", "tasks.listops_rules", "tasks.listops_format")],
])
def test_as_a_command(argv, words, w):
    p = command(*argv(w))
    check_one_line(p.returncode, p.stderr, words)
    assert p.stdout == ""


def test_a_module_of_tasks_lists_them_in_help_and_a_new_task_comes_last():
    p = command("-m", "tasks.lm", "--help")
    assert p.returncode == 0 and "--task {ptb,wikitext103,openwebtext,textfile}" in p.stdout
    assert "35 (ptb), 512 (wikitext103), 1024 (openwebtext), 256 (textfile)" in " ".join(p.stdout.split())
    assert list(data.TASKS) == list(tasks.ORDER)
    assert tasks.in_order(["zebra", *reversed(tasks.ORDER), "aardvark"]) == [*tasks.ORDER, "zebra", "aardvark"]


ZEBRA = """
import numpy as np
from data import LMSplit, Task, prepare_main, task


@task("zebra")
def zebra(cache_dir="data", block_size=4, **_):
    stream = np.arange(100) % 7
    return Task("zebra", "lm", 8, block_size, loaders={s: lambda: LMSplit(stream, block_size) for s in ("train", "val")})
"""


def copy_of_the_project(tmp_path):
    repo = tmp_path / "repo"                                 # what runs there writes into out/ and data/ there
    shutil.copytree(ROOT, repo, ignore=shutil.ignore_patterns(".*", "out", "data", "__pycache__", "img", "tests"))
    return repo


def test_a_new_task_module_without_its_entry_says_what_to_add(tmp_path):
    repo = copy_of_the_project(tmp_path)
    (repo / "tasks" / "zebra.py").write_text(ZEBRA)
    p = subprocess.run([sys.executable, "-m", "tasks.zebra"], cwd=repo, capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "Traceback" not in p.stderr and p.stdout == ""
    assert p.stderr.strip() == ('error: tasks.zebra registers zebra but has no entry: end it with `if __name__ == "__main__": '
                     'prepare_main("tasks.zebra")`, as tasks/listops.py does')
    # an entry copied from another module, still naming it: it would prepare that module's tasks
    (repo / "tasks" / "zebra.py").write_text(ZEBRA + '\n\nif __name__ == "__main__":\n    prepare_main("tasks.listops")\n')
    p = subprocess.run([sys.executable, "-m", "tasks.zebra"], cwd=repo, capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and p.stdout == "" and p.stderr.strip() == (
        "error: tasks.zebra's entry prepares tasks.listops's tasks: end it with prepare_main(\"tasks.zebra\")")
    (repo / "tasks" / "zebra.py").write_text(ZEBRA + '\n\nif __name__ == "__main__":\n    prepare_main("tasks.zebra")\n')
    p = subprocess.run([sys.executable, "-m", "tasks.zebra", "--block_size", "5"], cwd=repo, capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0 and p.stdout.startswith("zebra: train 100, val 100 tokens"), (p.stdout, p.stderr)


def test_a_task_name_two_modules_register_is_one_line_before_any_work(tmp_path):
    repo = copy_of_the_project(tmp_path)                     # a fork's new module that copied @task("listops")
    (repo / "tasks" / "zebra.py").write_text(ZEBRA.replace('@task("zebra")', '@task("listops")'))
    init = (repo / "tasks" / "__init__.py").read_text()
    (repo / "tasks" / "__init__.py").write_text(init.replace("text  # noqa: E402", "text, zebra  # noqa: E402"))
    for argv in (["train.py", "--task", "listops", "--out_dir", "o"], ["train.py", "--task", "zebra"],
                 ["sample.py", "--ckpt", "x.pt"]):
        p = subprocess.run([sys.executable, *argv], cwd=repo, capture_output=True, text=True, timeout=60)
        assert p.returncode == 2 and p.stdout == "" and p.stderr.strip() == (
            "error: task 'listops' is registered by tasks.listops and by tasks.zebra: give one of them another name")
    assert not os.path.exists(repo / "o") and not os.path.exists(repo / "data")


@pytest.mark.parametrize("change,said", [
    (("\n@task", "\n@task(\n"), "error: tasks/zebra.py line 6 fails on import: SyntaxError: '(' was "
     "never closed\n"),
    (("block_size=4, **_)", "block_size=4)"), "error: task 'zebra': its loader zebra() in tasks.zebra takes no **_, "
     "and train.py passes it every task's settings (seed, tokenizer, ...): end its parameters with **_"),
    (('"lm", 8,', '"lm", 6,'), "error: the train split of zebra (train split) holds token id 6, and task zebra's "
     "vocab_size is 6 (ids 0 to 5, 0 the padding): count every id")])
def test_a_forks_task_module_that_breaks_the_interface_is_one_line_before_any_step(change, said, tmp_path):
    """A syntax error in the new module, a loader without **_ (train.py passes every task flag), ids past the
    vocab_size the task declares (the padding id forgotten): one line naming the module, not a traceback."""
    repo = copy_of_the_project(tmp_path)
    (repo / "tasks" / "zebra.py").write_text(ZEBRA.replace(*change))
    init = (repo / "tasks" / "__init__.py").read_text()
    (repo / "tasks" / "__init__.py").write_text(init.replace("text  # noqa: E402", "text, zebra  # noqa: E402"))
    p = subprocess.run([sys.executable, "train.py", "--task", "zebra", "--block_size", "4", "--n_layer", "1",
                        "--n_embd", "8", "--n_head", "1", "--max_iters", "1", "--out_dir", "o"], cwd=repo,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "Traceback" not in p.stderr and p.stderr.startswith(said), p.stderr
    assert len(p.stderr.strip().splitlines()) == 1 and "step 1" not in p.stdout


def test_data_task_keeps_the_first_of_two_modules_and_records_the_clash(monkeypatch):
    monkeypatch.setattr(data, "TASKS", {})
    monkeypatch.setattr(data, "CLASHES", {})
    loaders = [(lambda i: lambda **_: i)(i) for i in range(4)]          # four loaders, each its own function
    for fn, module in zip(loaders, ("tasks.a", "tasks.b", "tasks.a", "__main__")):
        fn.__module__ = module
        data.task("x")(fn)
    # tasks.a registers, tasks.b clashes, tasks.a again (reloaded) replaces its own, __main__ (python -m) is skipped
    assert data.TASKS == {"x": loaders[2]} and data.CLASHES == {"x": ("tasks.a", "tasks.b")}


def interrupted(argv, ready, after=0, cwd=ROOT, sig=signal.SIGINT, group=False):
    """Start the command, send it SIGINT (or `sig`) `after` seconds after its stdout shows `ready` (group: to its
    whole process group, as a terminal's Ctrl-C does): (exit status, stdout, stderr)."""
    p = subprocess.Popen([sys.executable, *map(str, argv)], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, start_new_session=group)
    seen = ""
    while ready not in seen:
        line = p.stdout.readline()
        assert line, (seen, p.stderr.read())
        seen += line
    time.sleep(after)
    os.killpg(p.pid, sig) if group else p.send_signal(sig)
    out, err = p.communicate(timeout=60)
    return p.returncode, seen + out, err


@pytest.mark.parametrize("sig,status,said,group", [(signal.SIGINT, 130, "interrupted (Ctrl-C)", False),
                                                   (signal.SIGTERM, 143, "terminated (SIGTERM)", False),
                                                   (signal.SIGINT, 130, "interrupted (Ctrl-C)", True)])
def test_ctrl_c_or_kill_while_a_task_is_prepared_is_one_line_and_leaves_nothing(sig, status, said, group, tmp_path,
                                                                               monkeypatch):
    """The LRA recipe (a minute of work), stopped while its process pool draws the trees: one line, no worker of
    the pool left running (each has the command's working folder), no file half-written kept. A terminal's Ctrl-C
    (group) reaches the workers too: they ignore it (they printed tracebacks), the program stops them."""
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    (tmp_path / "w").mkdir()
    got, out, err = interrupted(["-m", "tasks.listops", "--cache_dir", tmp_path / "c"], "generating ListOps", 2,
                                cwd=tmp_path / "w", sig=sig, group=group)
    assert got == status and err.startswith(said) and err.strip().splitlines() == [err.strip()], err
    for _ in range(100):
        left = [pid for pid in filter(str.isdigit, os.listdir("/proc")) if cwd_of(pid) == str(tmp_path / "w")]
        if not left:
            break
        time.sleep(0.1)
    assert left == [] and not [p for p in (tmp_path / "c").rglob("*") if p.is_file()]


def cwd_of(pid):
    try:
        return os.readlink(f"/proc/{pid}/cwd")
    except OSError:                                          # gone, or not ours to read
        return None


@pytest.mark.parametrize("sig,status,said", [(signal.SIGINT, 130, "interrupted"),
                                             (signal.SIGTERM, 143, "terminated (SIGTERM)")])
def test_ctrl_c_or_kill_while_experiments_runs_stops_its_runs_too(tmp_path, sig, status, said):
    """Ctrl-C or kill (timeout) to experiments.py alone (its runs have sessions of their own): every run it started
    stops too, none left training alone."""
    repo = copy_of_the_project(tmp_path)
    got, out, err = interrupted([repo / "experiments.py", "transfer", "--seeds", "0"], "[1/", cwd=repo, sig=sig)
    assert got == status and "Traceback" not in err and err.strip().splitlines() == [err.strip()], err
    assert err.startswith(said), err
    for _ in range(100):                                     # (its data's worker processes end a moment later)
        left = [pid for pid in filter(str.isdigit, os.listdir("/proc")) if cwd_of(pid) == str(repo.resolve())]
        if not left:
            break
        time.sleep(0.1)
    assert left == [] and not (repo / "out" / "exp" / "transfer" / "simpletron-s0" / "metrics.json").exists()


@pytest.mark.parametrize("fault,status,words", [
    (KeyboardInterrupt(), 130, "interrupted"),
    (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB"), 2, "out of memory"),
    (MemoryError(), 2, "out of memory"),
    (RuntimeError("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: you tried "
                  "to allocate 1024000000000000 bytes. Error code 12 (Cannot allocate memory)"), 2, "out of memory"),
    (RuntimeError("MPS backend out of memory (MPS allocated: 17.00 GB, other allocations: 1.00 GB)"), 2,
     "out of memory"),
    (PermissionError(13, "Permission denied", "/x/y.png"), 2, "/x/y.png"),
    (OSError(28, "No space left on device"), 2, "No space left"),
])
def test_what_work_meets_is_one_line_too(fault, status, words, w, tmp_path, monkeypatch, capsys):
    def meets(*a, **k):
        raise fault
    monkeypatch.setattr(simpletron.Model, "generate", meets)
    got = entry(S, ["--ckpt", str(w.lm), "--max_new_tokens", "5"], monkeypatch)
    err = capsys.readouterr().err
    assert got == status and len(err.strip().splitlines()) == 1 and words in err and "Traceback" not in err, err


# ----------------------------------------------------------------------------------------------
# The run folder: whatever makes it unusable is one line before the run (train.py, through rundir.py)

@pytest.mark.parametrize("fault,words", [
    (lambda out: (out / "lock").mkdir(), "lock"),
    (lambda out: os.mkfifo(out / "lock"), "lock"),
    (lambda out: (out / "ckpt.pt").mkdir(), "ckpt.pt"),
    (lambda out: (out / "best.pt").mkdir(), "best.pt"),
    (lambda out: (out / "log.jsonl").mkdir(), "log.jsonl"),
    (lambda out: (out / "metrics.json").mkdir(), "metrics.json"),
    (lambda out: (out / "loss.png").mkdir(), "loss.png"),
    (lambda out: os.mkfifo(out / "log.jsonl"), "log.jsonl"),
])
def test_a_run_folder_that_cannot_be_used_is_one_line_before_the_run(fault, words, w, tmp_path, monkeypatch):
    out = tmp_path / "out"
    out.mkdir()
    fault(out)
    before = sorted(os.listdir(out))
    monkeypatch.setattr(data, "load_task", lambda *a, **k: pytest.fail("data was read"))
    with pytest.raises((config.UsageError, data.DataError)) as e:
        train.main(["--data_dir", str(w.lra), "--out_dir", str(out), "--cache_dir", str(tmp_path / "c"), *TINY])
    assert "\n" not in str(e.value) and words in str(e.value), str(e.value)
    assert sorted(os.listdir(out)) == before


def test_a_cache_folder_that_cannot_be_made_is_one_line_from_train_py(tmp_path):
    """An OS error found while working (here a file where the cache's folder goes) is one line too, exit 2."""
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "listops-depth3-args2-3-len5-20-n4-4-4").write_text("a file where the cache's folder goes")
    p = command("train.py", "--out_dir", tmp_path / "o", "--cache_dir", tmp_path / "c", *TINY, "--listops_sizes",
                "4,4,4", "--listops_len", "5,20", "--listops_depth", "3", "--listops_args", "2,3")
    check_one_line(p.returncode, p.stderr, "listops-depth3-args2-3-len5-20-n4-4-4")
    assert not (tmp_path / "o" / "ckpt.pt").exists()


def test_lyapunov_text_may_hold_bytes_that_are_not_utf8(w):
    """A byte-level model's --text with a byte that is not UTF-8 (the shell passes it on as it is): that byte, its
    own id (as tiktoken's byte encoding numbers them: ids 0-255)."""
    ids, labels = analyze.encode_text("a\udcff", torch.load(w.deq, map_location="cpu", weights_only=True))
    assert ids.tolist() == [[ord("a"), 0xff]] and labels == ["a", "\\xff"]


# ----------------------------------------------------------------------------------------------
# The third battery's kinds (docs/testing.md): each a fault that once ended in a traceback or went unnoticed

@pytest.mark.parametrize("name", ["RANK", "LOCAL_RANK", "WORLD_SIZE"])
def test_a_torchrun_variable_that_is_no_number_is_one_line(name, w, tmp_path, monkeypatch):
    monkeypatch.setenv(name, "abc")
    with pytest.raises(config.UsageError, match=f"{name}='abc'"):
        train.main(["--data_dir", str(w.lra), "--out_dir", str(tmp_path / "o"), "--cache_dir", str(tmp_path / "c"),
                    *TINY])
    assert not (tmp_path / "o").exists()


def test_a_local_rank_left_in_the_environment_alone_does_not_silence_the_error(tmp_path):
    """Without RANK (not torchrun) the process is the only one: its error is said, whatever LOCAL_RANK holds."""
    p = command("train.py", "--n_layer", "0", "--out_dir", tmp_path / "o", env={**os.environ, "LOCAL_RANK": "1"})
    check_one_line(p.returncode, p.stderr, "--n_layer 0: allowed is an integer >= 1")


@pytest.mark.parametrize("content,words", [(BINARY, "utf-8"), (b'--lr "0.1\n', "No closing quotation"),
                                           (None, "names itself")])
def test_a_file_of_flags_that_cannot_be_read_is_one_line(content, words, tmp_path):
    recipe = tmp_path / "recipe.txt"
    recipe.write_bytes(f"@{recipe}".encode() if content is None else content)
    with pytest.raises(config.UsageError) as e:
        train.main([f"@{recipe}", "--out_dir", str(tmp_path / "o")])
    assert "\n" not in str(e.value) and words in str(e.value) and str(recipe) in str(e.value)


@pytest.mark.parametrize("change", [dict(iter="x"), dict(iter=-5), dict(optimizer="x"), dict(args=lambda c: {
    **c["args"], "data_dir": 5}), "flipped"])
def test_a_damaged_checkpoint_is_refused_by_resume_in_one_line(change, w, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(w.lm.parent, run)
    (run / "ckpt.pt").write_bytes((flipped(w, tmp_path) if change == "flipped" else edited(w, tmp_path, **change))
                                  .read_bytes())
    with pytest.raises(config.UsageError, match="is not a (readable )?train.py checkpoint|is damaged: its setting"):
        train.main(["--resume", "--out_dir", str(run), "--max_iters", "4"])


@pytest.mark.parametrize("argv,words", [(["--lengths", "²"], "--lengths"), (["--lengths", "16,٣"], "--lengths"),
                                        (["--threads", str(10**6)], "--threads")])
def test_bench_refuses_digits_int_cannot_read_and_more_threads_than_cores(argv, words, tmp_path):
    with pytest.raises(config.UsageError, match=words):
        bench.parse([*argv, "--out", str(tmp_path / "a")])


@pytest.mark.parametrize("name,code,words", [
    ("model.py", "raise SystemExit(0)\n", "SystemExit"),
    ("model.py", "class GPTConfig:\n    def __init__(self, **kw):\n        pass\n\n\nclass GPT:\n    def __init__(self, c)"
                 ":\n        pass\n\n    def __call__(self, idx, targets=None):\n        return idx.float()\n",
     r"does not return \(logits, loss\) \(ValueError: not enough values to unpack"),
    ("model.py", "class GPTConfig:\n    def __init__(self, **kw):\n        pass\n\n\nclass GPT:\n    def __init__(self, c)"
                 ":\n        pass\n\n    def __call__(self, idx, targets=None):\n        return idx.float(), None\n",
     r"does not return \(logits, loss\) \(ValueError: its loss is NoneType, not one number\)"),
    ("model.py", "class GPTConfig:\n    pass\n\n\nclass GPT:\n    pass\n", "GPTConfig.. takes no arguments"),
    ("model", BINARY, "not nanoGPT's model.py"),
])
def test_bench_nanogpt_that_is_no_nanogpt_is_one_line(name, code, words, tmp_path):
    path = tmp_path / name
    path.write_bytes(code if isinstance(code, bytes) else code.encode())
    with pytest.raises(config.UsageError, match=words):
        bench.load_nanogpt(str(path))


@pytest.mark.parametrize("argv,words", [
    (["--task", "listops", "--recall_len", "32"], "--recall_len 32: task listops has no such setting"),
    (["--task", "mqar", "--listops_depth", "4"], "--listops_depth 4: task mqar has no such setting"),
    (["--task", "induction", "--recall_pairs", "3"], "--recall_pairs 3: task induction has no such setting"),
    (["--task", "listops", "--tokenizer", "byte"], "--tokenizer byte: task listops has no such setting"),
    (["--task", "copy", "--tokenizer", "char"], "--tokenizer char: task copy has no such setting"),
    (["--task", "listops", "--tokenizer", "gpt2"], "--tokenizer gpt2: task listops has no such setting"),  # the default
    (["--task", "mqar", "--listops_depth", "10"], "--listops_depth 10: task mqar has no such setting"),     # typed
])
def test_a_generated_tasks_flag_given_to_a_task_without_it_is_one_line(argv, words, w, tmp_path):
    with pytest.raises((config.UsageError, data.DataError), match=words):
        train.main(["--data_dir" if "listops" in argv else "--recall_sizes", str(w.lra) if "listops" in argv else
                    "8,8,8", "--out_dir", str(tmp_path / "o"), "--cache_dir", str(tmp_path / "c"), *TINY, *argv])
    assert not (tmp_path / "o" / "ckpt.pt").exists() and not (tmp_path / "c" / "recall").exists()


def test_text_a_terminal_cannot_show_is_escaped_not_a_traceback(monkeypatch):
    """sample.py's text on an ASCII terminal (PYTHONIOENCODING=ascii, an old locale): é written as \\xe9."""
    out, err = (io.TextIOWrapper(io.BytesIO(), encoding="ascii") for _ in range(2))
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(sys, "stderr", err)

    def main():
        print("café")
        raise data.DataError("no file naïve.txt")
    with pytest.raises(SystemExit) as e:
        data.run_main(main)
    out.flush(), err.flush()
    assert e.value.code == 2
    assert out.buffer.getvalue() == b"caf\\xe9\n" and err.buffer.getvalue() == b"error: no file na\\xefve.txt\n"


def test_an_unknown_matplotlib_backend_in_the_environment_stops_no_program(tmp_path):
    """MPLBACKEND=nonexistent stopped `import matplotlib` (after training, at loss.png): the programs write files
    only, on the Agg backend, whatever the environment says."""
    out = command("-c", "import curves, analyze, bench; print(__import__('matplotlib').get_backend())",
                  env={**os.environ, "MPLBACKEND": "nonexistent"})
    assert out.returncode == 0 and out.stdout.strip().lower() == "agg", out.stderr


@pytest.mark.parametrize("argv", [["train.py"], ["sample.py"], ["analyze.py"], ["bench.py"], ["experiments.py"],
                                  ["-m", "tasks.listops"], ["experiments/heldout_recall.py"]])
def test_a_torch_setting_torch_refuses_is_one_line_from_every_program(argv):
    """TORCH_LOGS=recompile (a typo of recompiles) stopped `import torch` with a traceback and the list of every log
    name; each program imports data first, whose import of torch says it in one line, exit 2."""
    out = command(*argv, "--help", env={**os.environ, "TORCH_LOGS": "recompile"})
    assert out.returncode == 2 and "Traceback" not in out.stderr and out.stdout == "", out.stderr
    assert out.stderr.startswith("error: torch will not start: Invalid log settings: recompile,")
    assert out.stderr.endswith('try TORCH_LOGS="help"; fix or unset that environment variable\n')


@pytest.mark.parametrize("program", ["experiments.py", "train.py"])
def test_a_reader_of_stdout_gone_ends_the_program_as_sigpipe_would_quietly(program, tmp_path):
    """(`... | head -1`: exit 1, or for train.py 2 with "error: a file: Broken pipe"; now as Unix tools end.)"""
    argv = [program, "--list"] if program == "experiments.py" else [
        program, "--data_dir", write_listops(tmp_path / "lra", 8, seed=1), "--n_layer", "1", "--n_embd", "16",
        "--batch_size", "2", "--max_iters", "1", "--out_dir", tmp_path / "o"]
    r, w = os.pipe()
    os.close(r)                                              # the reader gone before the first line
    p = subprocess.run([sys.executable, *argv], cwd=ROOT, stdout=w, stderr=subprocess.PIPE, text=True, timeout=120)
    os.close(w)
    assert p.returncode == -signal.SIGPIPE and p.stderr == "", (p.returncode, p.stderr)
    assert not (tmp_path / "o" / "lock").exists()           # (train.py: its folder released first)


@pytest.mark.parametrize("argv", [
    lambda w, t: ["train.py", "--task", "textfile", "--data_dir", w.txt, "--tokenizer", "char", *TINY, "--out_dir",
                  t / "o", "--cache_dir", w.root / "cache"],
    lambda w, t: ["sample.py", "--ckpt", w.lm, "--start", "to be", "--max_new_tokens", "4", "--device", "cpu"],
    lambda w, t: ["analyze.py", "cluster", "--tokens", "6", "--steps", "4", "--degrees", "0", "--out", t / "a"],
    lambda w, t: ["analyze.py", "spectra", "--ckpt", w.lm, "--out", t / "a"],
    lambda w, t: ["bench.py", "--models", "simpletron", "--lengths", "16", "--repeats", "1", "--inner", "1",
                  "--n_layer", "1", "--n_head", "2", "--n_embd", "16", "--vocab", "32", "--device", "cpu",
                  "--out", t / "b"],
    lambda w, t: ["experiments.py", "--list", "ptb"]], ids=["train", "sample", "cluster", "spectra", "bench", "exp"])
def test_every_program_runs_with_docstrings_stripped(argv, w, tmp_path):
    """Battery a08: python -OO (PYTHONOPTIMIZE=2: no docstrings, no asserts) ran analyze.py's re.search on a __doc__
    of None, a traceback; each program's --help (a subcommand's too) and a short real command, under -OO."""
    argv = [str(a) for a in argv(w, tmp_path)]
    program = argv[:2] if argv[0] == "analyze.py" else argv[:1]
    for cmd in ([*program, "--help"], argv):
        out = command("-OO", *cmd, env={**os.environ, "OMP_NUM_THREADS": "1"})
        assert out.returncode == 0 and "Traceback" not in out.stderr, (cmd, out.stderr[-2000:])
        assert out.stdout.strip(), cmd


# Ctrl-C while torch loads, made certain: a sitecustomize (run at the start of every Python process) that sends the
# process SIGINT as `import torch` begins.
CTRL_C_AT_TORCH = ("import os, signal, sys\n\n\nclass CtrlCAtTorch:\n    def find_spec(self, name, *_):\n"
                   "        if name == 'torch':\n            sys.meta_path.remove(self)\n"
                   "            os.kill(os.getpid(), signal.SIGINT)\n\n\nsys.meta_path.insert(0, CtrlCAtTorch())\n")


@pytest.mark.parametrize("argv", [["train.py"], ["sample.py"], ["analyze.py", "curves"], ["bench.py"],
                                  ["experiments.py", "--list"], ["-m", "tasks.listops"]])
def test_ctrl_c_while_torch_loads_stops_every_program_at_once_without_a_traceback(argv, tmp_path):
    """Killed by the signal, as a shell's Ctrl-C kills a program (status 130 there), and nothing printed."""
    (tmp_path / "sitecustomize.py").write_text(CTRL_C_AT_TORCH)
    p = command(*argv, "--help", env={**os.environ, "PYTHONPATH": str(tmp_path)})
    assert (p.returncode, p.stdout, p.stderr) == (-signal.SIGINT, "", "")
