"""Bad input, for every task and flag: one line that names the file (or the flag), before any work is done.
Broken release files are built here in tmp dirs and loaded in-process (data.load_task(...).open(), as train.py
does before its first step); one subprocess run checks train.py's own output. Also: cache keys that follow
every source file, and the temporary files of killed processes removed on the next run."""

import os
import pickle
import subprocess
import sys

import numpy as np
import pytest
import torch

import config
import data
import train
from test_data import PTB, WIKI, write_aan, write_aclimdb, write_agnews, write_cifar, write_pathfinder_release
from test_train import write_listops

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LATIN1 = "caf\xe9 r\xe9sum\xe9\n".encode("latin-1")          # not UTF-8


def one_line(excinfo, *parts):
    msg = str(excinfo.value)
    assert "\n" not in msg and "Traceback" not in msg, msg
    for part in parts:
        assert part in msg, (part, msg)
    return msg


# ----------------------------------------------------------------------------------------------
# Each task's release, written small (the same layouts as tests/test_data.py)

def ptb_release(root):
    folder = root / "simple-examples" / "data"
    folder.mkdir(parents=True)
    for name, lines in PTB.items():
        (folder / f"ptb.{name}.txt").write_text("".join(f" {s} \n" for s in lines * 3))
    return root, folder


def wiki_release(root):
    folder = root / "wikitext-103"
    folder.mkdir(parents=True)
    for name, lines in WIKI.items():
        (folder / f"wiki.{name}.tokens").write_text("".join(lines), encoding="utf-8")
    return root, folder


def owt_release(root):
    folder = root / "openwebtext"
    folder.mkdir(parents=True)
    for i, s in enumerate(("train", "val")):
        np.random.default_rng(i).integers(0, 50257, 500).astype(np.uint16).tofile(folder / f"{s}.bin")
    return root, folder


def cifar_release(root):
    write_cifar(root / "cifar-10-batches-py")
    return root, root / "cifar-10-batches-py"


def textfile_release(root):
    root.mkdir(parents=True)
    (root / "a.txt").write_text("to be or not to be, that is the question\n" * 20, encoding="utf-8")
    return root, root


RELEASES = {   # task -> (write(root) -> (data_dir, folder of the files), load_task keywords)
    "listops": (lambda r: (write_listops(r, 8, seed=1),) * 2, {}),
    "pathfinder": (lambda r: (r, write_pathfinder_release(r, n=20)), {}),
    "image": (cifar_release, {}),
    "text": (lambda r: (write_aclimdb(r), r / "aclImdb"), {"block_size": 64}),
    "imdb": (lambda r: (write_aclimdb(r), r / "aclImdb"), {"tokenizer": "byte"}),
    "agnews": (lambda r: (write_agnews(r, [(1 + i % 4, f"t{i}", "d") for i in range(8)], [(2, "a", "b"), (3, "c", "d")]),) * 2,
               {"tokenizer": "byte"}),
    "retrieval": (lambda r: (write_aan(r, 4) and r,) * 2, {"block_size": 64}),
    "ptb": (ptb_release, {"block_size": 4}),
    "wikitext103": (wiki_release, {"tokenizer": "byte", "block_size": 8}),
    "openwebtext": (owt_release, {"tokenizer": "gpt2", "block_size": 8}),
    "textfile": (textfile_release, {"tokenizer": "byte", "block_size": 8}),
}


def load(task, data_dir, cache, **kw):
    """What train.py does before its first step: find the data, then load and check every split."""
    t = data.load_task(task, cache_dir=str(cache), data_dir=str(data_dir), **{**RELEASES[task][1], **kw})
    t.open()
    return t


def broken(tmp_path, task, mutate):
    """The task's release with mutate(folder) applied: the DataError of loading it."""
    data_dir, folder = RELEASES[task][0](tmp_path / "d")
    mutate(folder)
    with pytest.raises(data.DataError) as e:
        load(task, data_dir, tmp_path / "c")
    return e


def rm(path):
    os.remove(path)


def folderize(path):
    os.remove(path)
    os.mkdir(path)


def dangle(path):
    os.remove(path)
    os.symlink(str(path) + ".gone", path)


def fifo(path):
    os.remove(path)
    os.mkfifo(path)                                          # opening it would block: it must never be opened


def empty(path):
    open(path, "wb").close()


def write(text):
    return lambda path: open(path, "wb").write(text if isinstance(text, bytes) else text.encode())


def truncate(path):
    raw = open(path, "rb").read()
    open(path, "wb").write(raw[:len(raw) // 2])


def test_every_release_loads(tmp_path):                     # the fixtures themselves are valid
    for task, (write_release, _) in RELEASES.items():
        data_dir, _ = write_release(tmp_path / task)
        t = load(task, data_dir, tmp_path / "cache")
        assert all(len(t.split(s)) > 0 for s in ("train", "val", "test") if t.has(s)), task


# The same faults for every task, on one file it needs (text, imdb: a review; a missing one is no fault, a
# missing folder of reviews is): (fault, mutate, words of the message)
FILE_FAULTS = [("missing", rm, "no "), ("a folder", folderize, "is a folder, not a file"),
               ("a broken symlink", dangle, "is a broken symbolic link"),
               ("a FIFO", fifo, "is not a regular file")]
NEEDED = {"listops": "basic_test.tsv", "pathfinder": "imgs/1/sample_12.png", "image": "test_batch",
          "text": "train/pos/0_7.txt", "imdb": "test/pos/0_7.txt", "agnews": "test.csv",
          "retrieval": "new_aan_pairs.eval.tsv", "ptb": "ptb.valid.txt", "wikitext103": "wiki.test.tokens",
          "openwebtext": "train.bin", "textfile": "a.txt"}
MISSING = {"pathfinder": ("imgs/1/sample_12.png", "sample_12.png does not exist"),
           "text": ("train/pos", "no train/pos in"), "imdb": ("test/neg", "no test/neg in"),
           "textfile": ("a.txt", "no .txt file in --data_dir")}


@pytest.mark.parametrize("fault,mutate,words", FILE_FAULTS, ids=[f[0] for f in FILE_FAULTS])
@pytest.mark.parametrize("task", list(RELEASES))
def test_file_faults_of_every_task(task, fault, mutate, words, tmp_path):
    name = NEEDED[task]
    if fault == "missing" and task in MISSING:
        name, words = MISSING[task]
        mutate = lambda p: __import__("shutil").rmtree(p) if p.is_dir() else os.remove(p)   # noqa: E731
    one_line(broken(tmp_path, task, lambda folder: mutate(folder / name)), words, os.path.basename(NEEDED[task])
             if fault != "missing" or task not in MISSING else "")


# Faults of content: (task, mutate(folder), words the message must hold)
CONTENT_FAULTS = [
    ("listops", lambda f: empty(f / "basic_test.tsv"), "basic_test.tsv"),
    ("listops", lambda f: write(b"Source\tTarget\n" + LATIN1)(f / "basic_val.tsv"), "basic_val.tsv"),
    ("pathfinder", lambda f: truncate(f / "imgs/0/sample_3.png"), "sample_3.png: is not a readable PNG"),
    ("pathfinder", lambda f: write("plain text")(f / "imgs/0/sample_3.png"), "sample_3.png: is not a readable PNG"),
    ("pathfinder", lambda f: __import__("shutil").rmtree(f / "imgs/1"), "imgs/1/sample_10.png does not exist"),
    ("pathfinder", lambda f: np.save(f / "metadata/1.npy", np.array([["imgs/1", {}]], dtype=object), allow_pickle=True),
     "1.npy: is not a Pathfinder metadata file"),
    ("pathfinder", lambda f: truncate(f / "metadata/1.npy"), "1.npy: is not a Pathfinder metadata file"),
    ("pathfinder", lambda f: write(LATIN1)(f / "metadata/0.npy"), "0.npy, line 1: not UTF-8"),
    ("pathfinder", lambda f: write("imgs/0 sample_0.png 0 2\n")(f / "metadata/0.npy"), "0.npy, row 1"),
    ("image", lambda f: truncate(f / "data_batch_2"), "data_batch_2: is not a CIFAR-10 python batch"),
    ("image", lambda f: write(pickle.dumps({b"data": np.zeros((2, 3072), np.uint8), b"labels": [3]}))(f / "test_batch"),
     "test_batch: 1 labels for 2 images"),
    ("image", lambda f: write(pickle.dumps({b"data": np.zeros((2, 3072), np.uint8), b"labels": [3, 10]}))(f / "test_batch"),
     "test_batch: label 10"),
    ("image", lambda f: write(pickle.dumps(os.system))(f / "data_batch_1"), "posix.system, which is not loaded"),
    ("text", lambda f: [rm(p) for p in (f / "train" / "pos").iterdir()], "no reviews (*.txt) in"),
    ("text", lambda f: write(LATIN1)(f / "train/neg/0_2.txt"), "0_2.txt, line 1: not UTF-8"),
    ("imdb", lambda f: empty(f / "test/pos/0_7.txt"), "0_7.txt is empty"),
    ("agnews", lambda f: write('"1","a","b"\n"5","c","d"\n')(f / "train.csv"), "train.csv, line 2"),
    ("agnews", lambda f: write(b'"1","' + LATIN1 + b'","d"\n')(f / "test.csv"), "test.csv, line 1: not UTF-8"),
    ("agnews", lambda f: empty(f / "test.csv"), "test.csv holds no rows"),
    ("retrieval", lambda f: empty(f / "new_aan_pairs.test.tsv"), "new_aan_pairs.test.tsv holds no pairs"),
    ("retrieval", lambda f: write("2\ta\tb\tx\ty\n")(f / "new_aan_pairs.train.tsv"), "train.tsv, line 1"),
    ("ptb", lambda f: empty(f / "ptb.test.txt"), "ptb.test.txt gives 0 tokens, too few for one window"),
    ("ptb", lambda f: write(b" the cat \n" + LATIN1)(f / "ptb.train.txt"), "ptb.train.txt, line 2: not UTF-8"),
    ("ptb", lambda f: write(" the zebra \n" * 5)(f / "ptb.test.txt"), "word 'zebra' is not in the training"),
    ("wikitext103", lambda f: empty(f / "wiki.valid.tokens"), "wiki.valid.tokens gives 0 tokens"),
    ("wikitext103", lambda f: write(LATIN1)(f / "wiki.test.tokens"), "wiki.test.tokens, line 1: not UTF-8"),
    ("openwebtext", lambda f: np.full(600, 50257, np.uint16).tofile(f / "train.bin"), "train.bin holds id 50257"),
    ("openwebtext", lambda f: write(b"\x01\x02\x03")(f / "val.bin"), "val.bin holds 3 bytes, no whole number of uint16"),
    ("openwebtext", lambda f: np.zeros(5, np.uint16).tofile(f / "val.bin"), "val.bin gives 5 tokens"),
    ("textfile", lambda f: write(b"x\n" * 50 + LATIN1)(f / "a.txt"), "a.txt, line 51: not UTF-8"),
    ("textfile", lambda f: write("short\n")(f / "a.txt"), "the train split) gives 5 tokens, too few for one window"),
]


@pytest.mark.parametrize("task,mutate,words", CONTENT_FAULTS,
                         ids=[f"{t}-{i}" for i, (t, *_) in enumerate(CONTENT_FAULTS)])
def test_content_faults_name_the_file(task, mutate, words, tmp_path):
    one_line(broken(tmp_path, task, mutate), words)


def test_a_missing_split_is_an_error_but_an_evaluation_uses_what_is_there(tmp_path, capsys):
    folder = write_listops(tmp_path / "lra", 8, seed=1)
    os.remove(folder / "basic_val.tsv")
    task = data.load_task("listops", cache_dir=str(tmp_path / "c"), data_dir=str(folder))
    with pytest.raises(data.DataError) as e:                 # training needs every split
        task.open()
    one_line(e, "listops: no basic_val.tsv in")
    assert task.open(training=False) == ["test"]             # --eval_only: test alone, said so
    assert "no basic_val.tsv" in capsys.readouterr().out
    # AG News: only test.csv is the documented fallback (printed); train.csv as a folder is an error
    root = write_agnews(tmp_path / "ag", None, [(1 + i % 4, f"t{i}", "d") for i in range(10)])
    data.load_task("agnews", cache_dir=str(tmp_path / "c"), data_dir=str(root), tokenizer="byte").open()
    assert "has no train.csv: training on the first 8 rows" in capsys.readouterr().out
    (root / "train.csv").mkdir()
    with pytest.raises(data.DataError) as e:
        data.load_task("agnews", cache_dir=str(tmp_path / "c"), data_dir=str(root), tokenizer="byte")
    one_line(e, "train.csv is a folder")


# ----------------------------------------------------------------------------------------------
# Flags and checkpoints: one line naming the flag, the value and what is allowed, before any data is read

@pytest.mark.parametrize("argv,words", [
    (["--batch_size", "-1"], "--batch_size -1: allowed is an integer >= 1"),
    (["--lr", "nan"], "--lr nan"), (["--lr", "-1"], "--lr -1.0: allowed is a number >= 0"),
    (["--n_head", "0"], "--n_head 0"), (["--dropout", "1.5"], "--dropout 1.5: allowed is a probability"),
    (["--block_size", "0"], "--block_size 0"), (["--eval_interval", "0"], "--eval_interval 0"),
    (["--log_interval", "0"], "--log_interval 0"), (["--schedule", "linear"], "--schedule linear: allowed is rsqrt or cosine"),
    (["--schedule", "rsqrt", "--warmup", "0"], "--warmup 0"), (["--seed", "-1"], "--seed -1"),
    (["--beta2", "1"], "--beta2 1.0"), (["--min_lr", "2"], "--min_lr 2.0"), (["--max_iters", "0"], "--max_iters 0"),
    (["--device", "tpu"], "--device tpu: allowed is auto, cpu"), (["--task", "imdb", "--tokenizer", "bpe"], "--tokenizer 'bpe'"),
    (["--eval_only"], "--eval_only needs --init_from"), (["--model", "transject", "--n_experts", "0"], "--n_experts 0"),
    (["--variant", "resx"], "variant must be one of"),
    (["--model", "diffeqformer", "--steps", "2"], "--steps N [--lora_rank r] needs --init_from CKPT"),
    (["--model", "diffeqformer", "--lora_rank", "2"], "--steps N [--lora_rank r] needs --init_from CKPT"),
])
def test_flags_are_checked_before_any_data_is_read(argv, words, monkeypatch, tmp_path):
    monkeypatch.setattr(data, "load_task", lambda *a, **k: pytest.fail("data was read"))
    with pytest.raises((train.UsageError, data.DataError)) as e:
        train.main([*argv, "--out_dir", str(tmp_path / "out"), "--cache_dir", str(tmp_path / "c")])
    one_line(e, words)


def test_devices_that_are_not_here_and_folders_that_cannot_be_written(monkeypatch, tmp_path):
    monkeypatch.setattr(data, "load_task", lambda *a, **k: pytest.fail("data was read"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    (tmp_path / "file").write_text("x")
    for argv, words in ((["--device", "cuda"], "--device cuda: no such CUDA device"),
                        (["--device", "mps"], "--device mps: Apple's MPS is not available"),
                        (["--out_dir", str(tmp_path / "file" / "run")], "is not a folder this command can write in")):
        with pytest.raises(train.UsageError) as e:
            train.main([*argv, "--cache_dir", str(tmp_path / "c")])
        one_line(e, words)
    (tmp_path / "exe").write_text("x")
    (tmp_path / "exe").chmod(0o777)                         # a file anyone may write and run is still no folder
    (tmp_path / "ro").mkdir()                               # a folder this user may not write in (root may: faked)
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: real_access(p, mode) and os.path.abspath(p) != str(tmp_path / "ro"))
    for flag in ("--out_dir", "--cache_dir"):
        for parent in ("exe", "ro"):
            with pytest.raises(train.UsageError) as e:
                train.main([flag, str(tmp_path / parent / "run"), *(["--cache_dir", str(tmp_path / "c")]
                                                                      if flag == "--out_dir" else [])])
            one_line(e, f"{flag} {tmp_path / parent / 'run'}: {tmp_path / parent} is not a folder this command can write in")
    os.symlink(tmp_path / "loop_b", tmp_path / "loop_a")
    os.symlink(tmp_path / "loop_a", tmp_path / "loop_b")              # a loop of links: exists() is False for it
    os.symlink(tmp_path / "nowhere", tmp_path / "dangling")
    for flag in ("--out_dir", "--cache_dir"):
        for link in ("loop_a", "dangling"):
            with pytest.raises(train.UsageError) as e:
                train.main([flag, str(tmp_path / link), *(["--cache_dir", str(tmp_path / "c")] if flag == "--out_dir"
                                                         else [])])
            one_line(e, f"{flag} {tmp_path / link}: {tmp_path / link} is not a folder this command can write in")


class Foreign:                                               # a pickled object: never loaded from a checkpoint
    pass


def test_corrupt_checkpoints_give_one_line_and_no_unsafe_advice(tmp_path):
    good = tmp_path / "good.pt"
    model = config.build_model("simpletron", dict(vocab_size=16, block_size=8, n_layer=1, n_embd=16, n_head=2))
    state = {"model_name": "simpletron", "config": {}, "model": model.state_dict(), "args": {"task": "listops"}}
    torch.save(state, good)
    raw = good.read_bytes()
    cases = {"truncated": raw[:len(raw) // 2], "empty": b"", "text": b"hello", "object": None, "tensor": None,
             "no config": None}
    for name, content in cases.items():
        path = tmp_path / f"{name}.pt"
        if name == "object":
            torch.save({"x": Foreign()}, path)
        elif name == "tensor":
            torch.save(torch.zeros(2), path)
        elif name == "no config":
            torch.save({k: v for k, v in state.items() if k != "config"}, path)
        else:
            path.write_bytes(content)
        with pytest.raises(train.UsageError) as e:
            train.load_checkpoint(str(path))
        msg = one_line(e, str(path))
        assert "weights_only" not in msg and "can still be loaded" not in msg, msg
    with pytest.raises(train.UsageError) as e:                   # a folder, not a file
        train.load_checkpoint(str(tmp_path))
    one_line(e, "is a folder")
    other = config.build_model("simpletron", dict(vocab_size=16, block_size=8, n_layer=1, n_embd=32, n_head=2))
    with pytest.raises(train.UsageError) as e:
        train.load_weights(other, train.load_checkpoint(str(good))["model"], "good.pt")
    one_line(e, "good.pt: its weights do not fit the model")


# ----------------------------------------------------------------------------------------------
# Caches follow every input file; killed processes leave nothing behind

@pytest.mark.parametrize("task,edit", [
    ("text", "train/neg/11_2.txt"), ("imdb", "test/pos/0_7.txt"), ("pathfinder", "imgs/1/sample_12.png"),
    ("image", "data_batch_3"), ("agnews", "test.csv"), ("retrieval", "new_aan_pairs.test.tsv"),
    ("wikitext103", "wiki.valid.tokens"), ("textfile", "a.txt")])
def test_editing_any_input_file_rebuilds_the_cache(task, edit, tmp_path):
    data_dir, folder = RELEASES[task][0](tmp_path / "d")
    load(task, data_dir, tmp_path / "c")
    path = folder / edit
    st = os.stat(path)
    raw = bytearray(path.read_bytes())
    if task == "pathfinder":                                 # another valid image
        from PIL import Image
        Image.fromarray(np.full((32, 32), 7, np.uint8)).save(path)
    elif task == "image":
        with open(path, "rb") as f:
            d = pickle.load(f)
        d[b"data"] = 255 - d[b"data"]
        path.write_bytes(pickle.dumps(d))
    else:                                                    # one letter's case changed: the same size
        i = next(i for i, b in enumerate(raw) if b < 128 and chr(b).isalpha())
        raw[i:i + 1] = chr(raw[i]).swapcase().encode()
        path.write_bytes(bytes(raw))
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))   # and a later modification time
    load(task, data_dir, tmp_path / "c")
    assert len(os.listdir(tmp_path / "c" / task)) == 2, os.listdir(tmp_path / "c" / task)


def dead_pid():
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_temporary_files_of_dead_processes_are_removed_and_live_ones_kept(tmp_path):
    cache = tmp_path / "c"
    dead, live = dead_pid(), os.getpid()
    stale = [cache / "text" / f"local-1234-L4000.tmp{dead}", cache / f"ptb.tmp{dead}",
             cache / "pathfinder" / "generated" / f"train_000.npz.tmp{dead}", cache / f"x.tmp{10**20}"]  # (no pid)
    kept = [cache / "text" / f"local-5678-L4000.tmp{live}", cache / "text" / "local-9999-L4000",
            cache / "notes.tmp", cache / "text" / "draft.tmp"]     # (a user's, with no process id: not ours)
    for p in stale + kept:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.mkdir() if "npz" not in p.name else p.write_bytes(b"half a shard")
    (stale[0] / "train.tokens.npy").write_bytes(b"half")
    for task in ("text", "pathfinder", "ptb"):
        with pytest.raises(data.DataError):
            data.load_task(task, cache_dir=str(cache), data_dir=str(tmp_path / "nowhere"))
    assert not any(p.exists() for p in stale) and all(p.exists() for p in kept)


def test_train_py_one_line_before_the_first_step_and_no_stale_checkpoint(tmp_path):
    """In a process of its own, as a user runs it: a test split that fails only when it is read (empty), and
    the temporary checkpoint a killed run left in out_dir."""
    folder = write_listops(tmp_path / "lra", 8, seed=1)
    empty(folder / "basic_test.tsv")
    out = tmp_path / "out"
    out.mkdir()
    (out / f"ckpt.pt.tmp{dead_pid()}").write_bytes(b"half a checkpoint")
    (out / "ckpt.pt.tmp").write_bytes(b"older train.py's name")
    r = subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), "--data_dir", str(folder), "--out_dir", str(out),
                        "--n_layer", "1", "--n_embd", "16", "--n_head", "2", "--max_iters", "2", "--log_interval", "1"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=120)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: ") and "basic_test.tsv" in lines[0], r.stderr
    assert "step 1" not in r.stdout and os.listdir(out) == []


@pytest.mark.parametrize("argv,words", [
    (["cluster", "--T", "nan"], "--T nan"), (["cluster", "--tokens", "1"], "--tokens 1: allowed is an integer >= 2"),
    (["spectra", "--grid", "-1"], "--grid -1")])
def test_analyze_flags_are_checked_first(argv, words, tmp_path):
    import analyze
    with pytest.raises(analyze.UsageError) as e:
        analyze.main([*argv, "--out", str(tmp_path / "out")])
    one_line(e, words)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("argv,words", [
    (["--batch", "0"], "--batch 0"), (["--lengths", "64,-2"], "--lengths 64,-2"),
    (["--clock", "sundial"], "--clock sundial")])
def test_bench_flags_are_checked_first(argv, words, tmp_path):
    import bench
    with pytest.raises(bench.UsageError) as e:
        bench.main([*argv, "--out", str(tmp_path / "out")])
    one_line(e, words)
    assert not (tmp_path / "out").exists()


ACCEPT = {"warmup": [0, 5], "max_iters": [1], "batch_size": [1], "vocab_size": [2], "n_classes": [0, 2, 10],
          "seed": [0, 2**32 - 1], "lr": [0.0, 1e-3], "eps": [1e-30], "lora_alpha": [1e-3], "time_limit": [0.01],
          "min_lr": [0.0, 1.0], "beta1": [0.0, 0.999], "beta2": [0.0, 0.999], "dropout": [0.0, 0.999],
          "weight_decay": [0.0], "grad_clip": [0.0], "gate_lr_scale": [0.0], "schedule": ["rsqrt", "cosine"],
          "device": ["auto", "cpu", "mps", "cuda", "cuda:3"], "out_dir": ["x"], "n_embd": [1], "init_from": [None],
          "mlp_hidden": [0, 8], "layer_norm_eps": [1e-12], "lora_scale": [1e-3]}
REJECT = {"warmup": [-1, 1.5], "max_iters": [0, "3"], "batch_size": [0], "vocab_size": [1], "n_classes": [1, -2],
          "seed": [-1, 2**32], "lr": [-1e-9, float("nan"), float("inf")], "eps": [0.0], "lora_alpha": [0.0],
          "time_limit": [0.0], "min_lr": [-0.1, 1.0001], "beta1": [1.0, -0.1], "beta2": [1.0], "dropout": [1.0, -0.1],
          "weight_decay": [-1.0], "grad_clip": [-0.5], "gate_lr_scale": [-1.0], "schedule": ["linear"],
          "device": ["gpu", "cuda:", "cuda:x"], "out_dir": [" "], "n_embd": [0], "mlp_hidden": [-8],
          "layer_norm_eps": [0.0, -1.0], "lora_scale": [0.0]}


@pytest.mark.parametrize("name", sorted(ACCEPT))
def test_each_flags_limits_at_their_edges(name):
    for value in ACCEPT[name]:
        config.check_value(name, value)                       # no error
    for value in REJECT.get(name, []):
        with pytest.raises(train.UsageError) as e:
            config.check_value(name, value)
        assert str(e.value).startswith(f"--{name} ") and "allowed is" in str(e.value)


def test_rsqrt_with_one_warmup_step_is_allowed(monkeypatch, tmp_path):
    class Reached(Exception):
        pass
    def load_task(*a, **k):
        raise Reached
    monkeypatch.setattr(data, "load_task", load_task)
    with pytest.raises(Reached):                             # the flags passed: the smallest warm-up rsqrt divides by
        train.main(["--schedule", "rsqrt", "--warmup", "1", "--out_dir", str(tmp_path / "o"),
                    "--cache_dir", str(tmp_path / "c")])
