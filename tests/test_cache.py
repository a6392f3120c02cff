"""Caches checked before use (data.cached_dir, data.cache_problem): every kind of cached file set the tasks make,
cut in half, with bytes flipped or with one of its files removed, is built again with one line saying so and gives
the examples it gave before; files that are the user's own (openwebtext's --data_dir) are refused in one line.
And every cache's name follows every setting that changes what it holds."""

import errno
import hashlib
import importlib.util
import inspect
import json
import os
import re
import shutil

import numpy as np
import pytest

import data
import tasks  # noqa: F401  (registers every task)
import train
from tasks import listops, lm, recall, sources
from test_data import PTB, WIKI, hf, small_pathfinder, write_aan, write_aclimdb, write_agnews, write_cifar  # noqa: F401
from test_data import write_pathfinder_release

LISTOPS_SMALL = dict(listops_depth=3, listops_args="2,4", listops_len="5,30", listops_sizes="60,7,9")


def write_ptb(root, words=PTB):
    root.mkdir(parents=True, exist_ok=True)
    for name, lines in words.items():
        (root / f"ptb.{name}.txt").write_text("".join(f" {s} \n" for s in lines))
    return root


def write_wiki(root, lines=WIKI):
    root.mkdir(parents=True, exist_ok=True)
    for name, text in lines.items():
        (root / f"wiki.{name}.tokens").write_text("".join(text), encoding="utf-8")
    return root


def hf_ptb(hf):
    import datasets
    hf.datasets["ptb-text-only/ptb_text_only"] = datasets.DatasetDict({
        s: datasets.Dataset.from_dict({"sentence": PTB[f]}) for s, f in (("train", "train"), ("validation", "valid"),
                                                                         ("test", "test"))})


def hf_openwebtext(hf):
    import datasets
    docs = [f"document {i} text" for i in range(300)]
    hf.datasets["Skylion007/openwebtext"] = datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": docs})})


def write_tsvs(root, rows=40):
    examples = list(listops.generate_listops(rows, min_len=5, max_len=30, depth=3, args=(2, 4), processes=1,
                                             progress=False))
    root.mkdir(parents=True, exist_ok=True)
    for s in ("train", "val", "test"):
        listops.write_listops_tsv(root / f"basic_{s}.tsv", examples)
    return root


def bert_tokenizer(tmp_path):
    pytest.importorskip("tokenizers")
    from test_bert import bert_folder
    return str(bert_folder(tmp_path / "bert")[0])


def write_text(path, text="to be or not to be, that is the question\n" * 30):
    path.write_text(text, encoding="utf-8")
    return path


def agnews_rows(t):
    return str(write_agnews(t / "ag", [(1, "the cat", "sat"), (2, "team", "won")] * 5, [(3, "new", "chip")]))


# Every kind of cache: (task, function of tmp_path and the hf fixture -> load_task's keyword arguments)
KINDS = {
    "listops arrays": ("listops", lambda t, hf: LISTOPS_SMALL),
    "listops TSV arrays": ("listops", lambda t, hf: dict(data_dir=str(write_tsvs(t / "lra")))),
    "pathfinder shards": ("pathfinder", lambda t, hf: {}),
    "pathfinder release": ("pathfinder", lambda t, hf: dict(data_dir=str(write_pathfinder_release(t / "pf")))),
    "image": ("image", lambda t, hf: write_cifar(t / "cifar-10-batches-py") or dict(data_dir=str(t))),
    "text": ("text", lambda t, hf: dict(data_dir=str(write_aclimdb(t / "imdb")))),
    "imdb": ("imdb", lambda t, hf: dict(data_dir=str(write_aclimdb(t / "imdb")), tokenizer="byte")),
    "agnews": ("agnews", lambda t, hf: dict(data_dir=agnews_rows(t), tokenizer="byte")),
    "agnews BERT WordPiece": ("agnews", lambda t, hf: dict(data_dir=agnews_rows(t), tokenizer=bert_tokenizer(t),
                                                           block_size=16)),
    "retrieval": ("retrieval", lambda t, hf: write_aan(t / "aan", 6) and dict(data_dir=str(t / "aan"))),
    "ptb from Hugging Face": ("ptb", lambda t, hf: hf_ptb(hf) or dict(block_size=2)),
    "ptb characters": ("ptb", lambda t, hf: dict(data_dir=str(write_ptb(t / "ptb")), tokenizer="char", block_size=4)),
    "wikitext103": ("wikitext103", lambda t, hf: dict(data_dir=str(write_wiki(t / "wiki")), tokenizer="byte",
                                                      block_size=16)),
    "openwebtext": ("openwebtext", lambda t, hf: hf_openwebtext(hf) or dict(tokenizer="byte", block_size=8)),
    "textfile": ("textfile", lambda t, hf: dict(data_dir=str(write_text(t / "tiny.txt")), tokenizer="char",
                                                block_size=8)),
}


def load(name, kw, cache):
    task = data.load_task(name, cache_dir=str(cache), **kw)
    task.open()
    return task


def content(task):
    """Every example of every split, as bytes (copied: the files may change afterwards)."""
    out = {}
    for s in task.loaders:
        split = task.split(s)
        split = split.full() if isinstance(split, data.ShardedSplit) else split
        if isinstance(split, data.LMSplit):
            out[s] = np.asarray(split.stream).tobytes()
        else:
            out[s] = (np.asarray(split.tokens).tobytes(), split.labels.tobytes(), split.doc_lengths.tobytes())
    return out


def cached_folders(cache):
    return sorted(d for d, _, files in os.walk(cache) if data.MANIFEST in files)


def listed(folder):
    with open(os.path.join(folder, data.MANIFEST)) as f:
        return sorted(json.load(f)["files"], key=lambda n: (os.path.getsize(os.path.join(folder, n)), n))


def cut(path):
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)


def flip(path):
    """Bytes in the middle of the file inverted in place (the size kept), its modification time set apart from the
    one the manifest holds, as any later write gets (two writes within one tick of the clock may share it)."""
    st = os.stat(path)
    with open(path, "r+b") as f:
        f.seek(st.st_size // 2)
        chunk = f.read(8)
        f.seek(st.st_size // 2)
        f.write(bytes(b ^ 0xFF for b in chunk))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns - 10**9))


DAMAGE = {"cut": cut, "flip": flip, "remove": os.remove}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_damaged_cache_is_built_again_in_one_line_and_never_used(kind, damage, tmp_path, hf, small_pathfinder,
                                                                   monkeypatch, capsys):
    name, setup = KINDS[kind]
    monkeypatch.setattr(tasks.listops_format, "LISTOPS_NPY_MIN_BYTES", 0)       # every TSV through its cache
    kw = setup(tmp_path, hf)
    before = content(load(name, kw, tmp_path / "c"))
    folder = max(cached_folders(tmp_path / "c"), key=lambda d: os.path.getsize(os.path.join(d, listed(d)[-1])))
    files = listed(folder)
    target = os.path.join(folder, files[0] if damage == "remove" and len(files) > 1 else files[-1])
    DAMAGE[damage](target)
    capsys.readouterr()
    after = content(load(name, kw, tmp_path / "c"))
    said = [line for line in capsys.readouterr().out.splitlines() if "building it again" in line]
    assert len(said) == 1 and said[0].startswith(f"{folder} has ") and os.path.basename(target) in said[0], said
    assert after == before and data.cache_problem(folder) is None
    content(load(name, kw, tmp_path / "c"))
    assert "building it again" not in capsys.readouterr().out
    assert not [f for _, dirs, fs in os.walk(tmp_path / "c") for f in dirs + fs if ".tmp" in f]


H = "[0-9a-f]{10}"          # a hash of the local sources (their paths, sizes and times)
NAMES = {"agnews": f"agnews/local-{H}-val5-byte-L512", "image": f"image/local-{H}", "ptb from Hugging Face": "ptb",
         "agnews BERT WordPiece": f"agnews/local-{H}-val5-wordpiece-{H}-L16", "imdb": f"imdb/local-{H}-val5-byte-L512",
         "listops TSV arrays": f"listops-npy/{H}-{H}", "listops arrays": "listops-depth3-args2-4-len5-30-n60-7-9",
         "openwebtext": "openwebtext/hf-byte", "pathfinder release": f"pathfinder/local-{H}",
         "pathfinder shards": "pathfinder/generated/(val|test)_000", "ptb characters": f"ptb-char/local-{H}",
         "retrieval": f"retrieval/local-{H}-L4000", "text": f"text/local-{H}-val5-L4000",
         "textfile": f"textfile/local-{H}-char", "wikitext103": f"wikitext103/local-{H}-byte"}


@pytest.mark.parametrize("kind", sorted(NAMES))
def test_each_cache_is_named_as_docs_tasks_md_says(kind, tmp_path, hf, small_pathfinder, monkeypatch):
    """A cache's name is its key: a new name loses every cache users have built (an hour of OpenWebText)."""
    name, setup = KINDS[kind]
    monkeypatch.setattr(tasks.listops_format, "LISTOPS_NPY_MIN_BYTES", 0)
    load(name, setup(tmp_path, hf), tmp_path / "c")
    folders = [os.path.relpath(d, tmp_path / "c") for d in cached_folders(tmp_path / "c")]
    assert folders and all(re.fullmatch(NAMES[kind], d) for d in folders), folders


def test_every_file_of_a_set_and_its_manifest_are_needed(tmp_path, capsys):
    kw = KINDS["textfile"][1](tmp_path, None)
    before = content(load("textfile", kw, tmp_path / "c"))
    (folder,) = cached_folders(tmp_path / "c")
    for name in [*listed(folder), data.MANIFEST]:
        os.remove(os.path.join(folder, name))
        assert content(load("textfile", kw, tmp_path / "c")) == before
        assert capsys.readouterr().out.count("building it again") == 1, name
    cut(os.path.join(folder, data.MANIFEST))                  # a damaged manifest
    assert content(load("textfile", kw, tmp_path / "c")) == before
    assert f"{folder} has a damaged manifest.json: building it again" in capsys.readouterr().out


def test_a_cached_array_with_a_row_too_few_is_built_again(tmp_path, capsys):
    before = content(load("listops", LISTOPS_SMALL, tmp_path / "c"))
    (folder,) = cached_folders(tmp_path / "c")
    labels = os.path.join(folder, "val.labels.npy")
    np.save(labels, np.load(labels)[:-1])                    # a valid array of 6 labels for 7 examples
    assert content(load("listops", LISTOPS_SMALL, tmp_path / "c")) == before
    assert "val.labels.npy of 134 bytes, not the 135 written: building it again" in capsys.readouterr().out


def write_a(out):
    with open(os.path.join(out, "a.bin"), "wb") as f:
        f.write(b"x" * 1000)


def test_sizes_are_checked_every_time_and_checksums_once_after_a_change(tmp_path, monkeypatch):
    folder = tmp_path / "f"
    data.cached_dir(str(folder), write_a)
    read = []
    monkeypatch.setattr(data, "crc32", lambda p, real=data.crc32: read.append(p) or real(p))
    assert data.cache_problem(folder) is None and read == []           # stamps as written: no file is read
    st = os.stat(folder / "a.bin")
    os.utime(folder / "a.bin", ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))     # touched: the same bytes
    assert data.cache_problem(folder) is None and len(read) == 1        # read once, the new stamp kept
    assert data.cache_problem(folder) is None and len(read) == 1
    shutil.copytree(folder, tmp_path / "copy" / "f")          # a copy (--cache_dir elsewhere): every stamp new
    assert data.cache_problem(tmp_path / "copy" / "f") is None and len(read) == 2
    (folder / "a.bin").write_bytes(b"y" * 1000)
    os.utime(folder / "a.bin", ns=(st.st_atime_ns, st.st_mtime_ns - 10**9))
    assert "a.bin whose bytes changed" in data.cache_problem(folder)


def test_a_damaged_cache_that_cannot_be_built_again_is_refused_not_used(tmp_path):
    folder = tmp_path / "f"
    data.cached_dir(str(folder), write_a)
    cut(folder / "a.bin")

    def read_only(out):                                      # e.g. a cache folder of another user
        raise OSError(errno.EROFS, "Read-only file system", os.path.join(out, "a.bin"))
    with pytest.raises(data.DataError) as e:
        data.cached_dir(str(folder), read_only)
    assert str(e.value).startswith(f"cannot build the cache {folder} (Read-only file system: ") and "\n" not in str(
        e.value)
    assert data.cache_problem(folder).startswith("has a a.bin of 500 bytes")          # left as it was


def test_a_manifest_that_is_a_fifo_or_a_folder_is_built_again_not_waited_on(tmp_path, capsys):
    kw = KINDS["textfile"][1](tmp_path, None)
    before = content(load("textfile", kw, tmp_path / "c"))
    (folder,) = cached_folders(tmp_path / "c")
    for make in (os.mkfifo, os.mkdir):
        os.remove(os.path.join(folder, data.MANIFEST))
        make(os.path.join(folder, data.MANIFEST))
        assert data.cache_problem(folder).startswith("has a manifest.json that is ")
        assert content(load("textfile", kw, tmp_path / "c")) == before
        assert capsys.readouterr().out.count("building it again") == 1


def test_a_fifo_named_by_a_forged_manifest_is_built_again_not_waited_on(tmp_path, capsys):
    kw = KINDS["textfile"][1](tmp_path, None)
    before = content(load("textfile", kw, tmp_path / "c"))
    (folder,) = cached_folders(tmp_path / "c")
    os.mkfifo(os.path.join(folder, "p"))
    manifest = json.loads(open(os.path.join(folder, data.MANIFEST)).read())
    manifest["files"]["p"] = {"size": 0, "crc32": 0, "stamp": [0, 0, 0, 0]}       # a stamp of its own: read it
    data.save_json(os.path.join(folder, data.MANIFEST), manifest)
    assert data.cache_problem(folder) == "has no readable p (not a regular file)"
    assert content(load("textfile", kw, tmp_path / "c")) == before
    assert capsys.readouterr().out.count("building it again") == 1


@pytest.mark.parametrize("forge", ["id 16", "id -1", "target 16", "target -2", "float", "rows", "one axis"])
def test_a_recall_cache_of_other_examples_under_a_consistent_manifest_is_refused(forge, tmp_path):
    """A forger who rewrites an array and its manifest passes the checksums: the ids and shapes are checked too."""
    kw = {"recall_len": 16, "recall_pairs": 2, "recall_vocab": 16, "recall_sizes": "6,3,3", "cache_dir": tmp_path}
    recall.mqar_task(**kw)
    (folder,) = cached_folders(tmp_path)
    x, y = (np.load(os.path.join(folder, f"train.{a}.npy")).astype(np.int32) for a in "xy")
    x, y = {"id 16": lambda: (x + 16 * (x == x.max()), y), "id -1": lambda: (np.where(x == x.min(), -1, x), y),
            "target 16": lambda: (x, np.where(y >= 0, 16, -1)), "target -2": lambda: (x, y - 1),
            "float": lambda: (x.astype(np.float32), y), "rows": lambda: (x, y[:-1]),
            "one axis": lambda: (x.ravel(), y.ravel())}[forge]()
    np.save(os.path.join(folder, "train.x.npy"), x)
    np.save(os.path.join(folder, "train.y.npy"), y)
    os.remove(os.path.join(folder, data.MANIFEST))
    data.write_manifest(folder)
    assert data.cache_problem(folder) is None
    with pytest.raises(data.DataError) as e:
        recall.mqar_task(**kw).split("train")
    assert str(e.value) == (f"{folder}/train.*.npy: not this task's examples (ids outside 0 .. 15, or arrays of other "
                            f"kinds or shapes); delete {folder} to rebuild it")


def test_train_py_trains_on_the_rebuilt_cache_not_the_cut_one(tmp_path, capsys):
    kw = KINDS["textfile"][1](tmp_path, None)
    load("textfile", kw, tmp_path / "c")
    train_bin = os.path.join(cached_folders(tmp_path / "c")[0], "train.bin")
    size = os.path.getsize(train_bin)
    cut(train_bin)
    m = train.main(["--task", "textfile", "--data_dir", kw["data_dir"], "--tokenizer", "char", "--cache_dir",
                    str(tmp_path / "c"), "--n_layer", "1", "--n_embd", "16", "--n_head", "2", "--block_size", "8",
                    "--max_iters", "1", "--eval_iters", "1", "--out_dir", str(tmp_path / "out")])
    assert "train.bin of " in capsys.readouterr().out and os.path.getsize(train_bin) == size and m["iters"] == 1


# ----------------------------------------------------------------------------------------------
# openwebtext's --data_dir: nanoGPT's files used where they are, and its remembered id check

def test_a_damaged_copy_of_a_cache_given_as_data_dir_is_refused(tmp_path, hf):
    before = content(load("openwebtext", KINDS["openwebtext"][1](tmp_path, hf), tmp_path / "c"))
    (folder,) = cached_folders(tmp_path / "c")
    shutil.copytree(folder, tmp_path / "owt")
    kw = dict(data_dir=str(tmp_path / "owt"), tokenizer="byte", block_size=8)
    assert content(load("openwebtext", kw, tmp_path / "c2")) == before     # the copy as it is: used
    for damage in (cut, flip):
        shutil.rmtree(tmp_path / "owt")
        shutil.copytree(folder, tmp_path / "owt")
        damage(tmp_path / "owt" / "train.bin")
        with pytest.raises(data.DataError) as e:
            load("openwebtext", kw, tmp_path / "c2")
        assert "\n" not in str(e.value) and "train.bin" in str(e.value) and "copy it again" in str(e.value)
    os.remove(tmp_path / "owt" / data.MANIFEST)                # nanoGPT's own files, no manifest: a size that is
    with open(tmp_path / "owt" / "train.bin", "r+b") as f:     # no whole number of ids is refused
        f.truncate(1001)
    with pytest.raises(data.DataError, match=r"train.bin holds 1,001 bytes, no whole number of uint16 ids"):
        load("openwebtext", kw, tmp_path / "c2")


def test_the_remembered_id_check_is_redone_after_any_change(tmp_path, monkeypatch):
    folder = write_nanogpt_bins(tmp_path / "owt")
    mapped = []
    monkeypatch.setattr(lm, "load_bin", lambda p, d, real=lm.load_bin: mapped.append(p) or real(p, d))

    def maps():                                              # how often a .bin file is mapped to open the task
        mapped.clear()
        load("openwebtext", dict(data_dir=str(folder), tokenizer="gpt2", block_size=8), tmp_path / "c")
        return len(mapped)
    first, steady = maps(), maps()
    assert first == steady + 2                               # train and val each checked once, then only mapped
    (record,) = [p for p in (tmp_path / "c" / "openwebtext" / "checked").iterdir() if "train.bin" in p.read_text()]
    for damage in (cut, lambda p: p.write_text(p.read_text().replace("50257", "50258")), os.remove):
        damage(record)                                       # a damaged record: checked again
        assert maps() == steady + 1 and maps() == steady
    st = os.stat(folder / "train.bin")
    ids = np.fromfile(folder / "train.bin", np.uint16)
    ids[500] = 60000                                         # a bad id, the size and the modification time kept
    ids.tofile(folder / "train.bin")
    os.utime(folder / "train.bin", ns=(st.st_atime_ns, st.st_mtime_ns))
    with pytest.raises(data.DataError, match="train.bin holds id 60000"):
        maps()


def test_a_stray_file_or_folder_in_place_of_the_id_records_is_replaced(tmp_path, capsys):
    """The records of the ids checked are the cache's bookkeeping: a file named like their folder (battery 16 case
    19: "c/openwebtext/checked: cannot be read (File exists)") or a folder named like a record is replaced, said in
    one line, and the ids are checked again."""
    folder = write_nanogpt_bins(tmp_path / "owt")
    kw = dict(data_dir=str(folder), tokenizer="gpt2", block_size=8)
    checked = tmp_path / "c" / "openwebtext" / "checked"
    checked.parent.mkdir(parents=True)
    checked.write_text("stray\n")
    task = load("openwebtext", kw, tmp_path / "c")
    assert task.split("val").stream.tolist() == np.fromfile(folder / "val.bin", np.uint16).tolist()
    assert f"{checked} is not a folder (a record of the ids checked): made again" in capsys.readouterr().out
    records = sorted(checked.iterdir())
    assert len(records) == 2 and all(json.loads(p.read_text())["vocab"] == 50257 for p in records)
    os.remove(records[0])
    records[0].mkdir()                                       # a folder where a record goes
    (records[0] / "x").write_text("not ours\n")
    load("openwebtext", kw, tmp_path / "c")
    assert f"{records[0]} is not a file (a record of the ids checked): made again" in capsys.readouterr().out
    assert records[0].is_file() and json.loads(records[0].read_text())["vocab"] == 50257


# ----------------------------------------------------------------------------------------------
# Cache names: two settings that give different contents never share a cache folder

def folder_contents(cache):
    """{cached folder, relative to cache: a digest of its files' names and bytes (its manifest left out)}."""
    out = {}
    for d in cached_folders(cache):
        h = hashlib.sha1()
        for name in sorted(set(listed(d))):
            with open(os.path.join(d, name), "rb") as f:
                h.update(name.encode() + b"\0" + f.read())
        out[os.path.relpath(d, cache)] = h.hexdigest()
    return out


def write_recall(folder, name, n=5):
    """Plain files of a recall task (docs/tasks.md): 16 tokens, 2 pairs (or data tokens), vocabulary 16."""
    folder.mkdir()
    for seed, s in enumerate(("train", "val", "test")):
        recall.write_examples(str(folder / f"{s}.txt"), *recall.generate(name, 16, 2, 16, n, seed))
    return folder


def reversed_bytes():
    """A byte-level tiktoken Encoding whose id of byte b is 255 - b (<|endoftext|> 256)."""
    import tiktoken
    return tiktoken.Encoding(name="rbyte", pat_str=sources.GPT2_PATTERN,
                             mergeable_ranks={bytes([i]): 255 - i for i in range(256)},
                             special_tokens={"<|endoftext|>": 256})


def write_nanogpt_bins(folder):
    folder.mkdir()
    for i, s in enumerate(("train", "val")):
        np.random.default_rng(i).integers(0, 50257, 1000).astype(np.uint16).tofile(folder / f"{s}.bin")
    return folder


def copy_file(source, path):
    path.write_bytes(source.read_bytes())


def rewrite(path, text):
    path.write_text(text, encoding="utf-8")
    return path


# task -> (its data, written under tmp_path (or Hugging Face's); its first settings; variants, each changing one
# setting of its loader)
VARIANTS = {
    "listops": (lambda t, hf: write_tsvs(t / "d"), LISTOPS_SMALL,
                [dict(listops_depth=4), dict(listops_args="2,3"), dict(listops_len="5,31"),
                 dict(listops_sizes="60,7,10"), dict(block_size=20), dict(tsv=True), dict(data_dir="d")]),
    "pathfinder": (lambda t, hf: write_pathfinder_release(t / "pf"), {}, [dict(block_size=64), dict(data_dir="pf")]),
    "image": (lambda t, hf: write_cifar(t / "d" / "cifar-10-batches-py"), {"data_dir": "d"}, [dict(block_size=100)]),
    "text": (lambda t, hf: write_aclimdb(t / "d"), {"data_dir": "d"}, [dict(block_size=4100), dict(block_size=100)]),
    "retrieval": (lambda t, hf: write_aan(t / "d", 6), {"data_dir": "d"},
                  [dict(block_size=4200), dict(block_size=100)]),
    "imdb": (lambda t, hf: write_aclimdb(t / "d"), {"data_dir": "d", "tokenizer": "byte"},
             [dict(block_size=600), dict(block_size=100), dict(tokenizer="rbyte"), dict(tokenizer="bert"),
              dict(tokenizer="bert", block_size=20)]),
    "agnews": (lambda t, hf: write_agnews(t / "d", [(1, "the cat", "sat")] * 9, [(3, "team", "won")]),
               {"data_dir": "d", "tokenizer": "byte"},
               [dict(block_size=600), dict(block_size=100), dict(tokenizer="rbyte"), dict(tokenizer="bert"),
                dict(tokenizer="bert", block_size=20)]),
    "ptb": (lambda t, hf: write_ptb(t / "d"), {"data_dir": "d", "tokenizer": "char", "block_size": 4},
            [dict(block_size=3)]),
    "wikitext103": (lambda t, hf: write_wiki(t / "d"), {"data_dir": "d", "tokenizer": "byte", "block_size": 16},
                    [dict(block_size=3), dict(tokenizer="rbyte")]),
    "openwebtext": (lambda t, hf: hf_openwebtext(hf) or write_nanogpt_bins(t / "owt"), {"tokenizer": "byte",
                                                                                         "block_size": 8},
                    [dict(block_size=3), dict(tokenizer="rbyte"), dict(data_dir="owt", tokenizer="gpt2")]),
    "textfile": (lambda t, hf: write_text(t / "d.txt"), {"data_dir": "d.txt", "tokenizer": "char", "block_size": 8},
                 [dict(tokenizer="byte"), dict(tokenizer="rbyte"), dict(block_size=3)]),
    **{name: (lambda t, hf, name=name: write_recall(t / "d", name),
              {"recall_len": 16, "recall_pairs": 2, "recall_vocab": 16, "recall_sizes": "20,5,5"},
              [dict(recall_len=20), dict(recall_pairs=3), dict(recall_vocab=20), dict(recall_sizes="21,5,5"),
               dict(block_size=24), dict(txt=True), dict(data_dir="d")]) for name in ("mqar", "copy", "induction")},
}
PF_IMAGES = os.path.join("pf", "pathfinder32", "curv_contour_length_14", "imgs", "0")
# task -> a change to its data files that changes what its cache holds (None: no local data), and the settings
# it is read with then
DATA_CHANGES = {
    "listops": (lambda t: write_tsvs(t / "d", rows=41), {"data_dir": "d"}),
    "image": (lambda t: (t / "d" / "cifar-10-batches-py" / "test_batch").write_bytes(
        (t / "d" / "cifar-10-batches-py" / "data_batch_1").read_bytes()), {}),
    "text": (lambda t: rewrite(t / "d" / "aclImdb" / "test" / "neg" / "0_2.txt", "Boring!"), {}),
    "retrieval": (lambda t: rewrite(t / "d" / "new_aan_pairs.test.tsv", "1\ta\tb\tone\ttwo\n"), {}),
    "imdb": (lambda t: rewrite(t / "d" / "aclImdb" / "test" / "neg" / "0_2.txt", "Boring!"), {}),
    "agnews": (lambda t: rewrite(t / "d" / "test.csv", '"2","other","row"\n'), {}),
    "ptb": (lambda t: rewrite(t / "d" / "ptb.test.txt", " sat sat \n"), {}),
    "wikitext103": (lambda t: rewrite(t / "d" / "wiki.test.tokens", " Other test text , more words . \n"), {}),
    "textfile": (lambda t: rewrite(t / "d.txt", "another text\n" * 20), {}),
    "pathfinder": (lambda t: copy_file(t / PF_IMAGES / "sample_1.png", t / PF_IMAGES / "sample_0.png"),
                   {"data_dir": "pf"}),
    "openwebtext": None,                                     # nanoGPT's files are used where they are: no cache
    **dict.fromkeys(("mqar", "copy", "induction")),          # plain files are read where they are: no cache
}


def test_every_task_and_every_setting_of_its_loader_is_covered():
    for name, loader in data.TASKS.items():
        assert name in VARIANTS and name in DATA_CHANGES, (
            f"task {name}: add its data and settings to VARIANTS and DATA_CHANGES in tests/test_cache.py, so that "
            "its cache names are checked against every setting that changes what they hold")
        _, base, variants = VARIANTS[name]
        settings = {p.name for p in inspect.signature(loader).parameters.values() if p.kind != p.VAR_KEYWORD}
        # (where the data come from: DATA_CHANGES)
        missing = settings - {"cache_dir", "data_dir"} - set(base) - {k for v in variants for k in v}
        assert not missing, f"task {name}: vary {', '.join(sorted(missing))} in tests/test_cache.py's VARIANTS"


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_a_cache_name_follows_every_setting_that_changes_its_content(name, tmp_path, hf, small_pathfinder,
                                                                    monkeypatch):
    """Each setting builds its caches in a cache folder of its own; wherever two of them use the same name, the
    contents must be the same: the name missed no setting, nor any change of the data, that changed them. And two
    settings that differ in block_size alone and give the same contents (a token stream, cut into windows later)
    use the same name, in whichever cache folder and however --data_dir names the files: none of these is in it,
    so that no cache is built twice."""
    monkeypatch.setattr(tasks.listops_format, "LISTOPS_NPY_MIN_BYTES", 0)       # every TSV through its cache
    for module in (tasks.text, lm):                          # "rbyte": a second BPE that needs no download
        monkeypatch.setattr(module, "get_tokenizer", lambda name, task, real=module.get_tokenizer:
                            reversed_bytes() if name == "rbyte" else real(name, task))
    setup, base, variants = VARIANTS[name]
    setup(tmp_path, hf)
    bert = [] if importlib.util.find_spec("tokenizers") is None else [bert_tokenizer(tmp_path)]
    seen, names = {}, {}

    def build(kw, cache, relative=False):
        if kw.get("tokenizer") == "bert" and not bert:
            return
        kw = {k: (v if relative else str(tmp_path / v)) if k == "data_dir" else bert[0] if v == "bert" else v
              for k, v in kw.items()}
        load(name, kw, cache)
        same = {k: os.path.abspath(v) if k == "data_dir" else v for k, v in kw.items() if k != "block_size"}
        for folder, digest in folder_contents(cache).items():
            first = seen.setdefault(folder, (kw, digest))
            assert first[1] == digest, f"{name}: {folder} holds other data with {kw} than with {first[0]}"
            for other, where, built in names.setdefault(digest, []):
                assert built == cache or other != same or where == folder, (
                    f"{name}: {folder} with {kw} holds what {where} holds with {other}")
            names[digest].append((same, folder, cache))
    for i, v in enumerate([{}, *variants]):
        build({**base, **v}, tmp_path / f"c{i}")
    if "data_dir" in base:                                   # the same files named from another folder
        monkeypatch.chdir(tmp_path)
        build(base, tmp_path / "relative", relative=True)
    if DATA_CHANGES[name]:
        change, kw = DATA_CHANGES[name]
        change(tmp_path)
        build({**base, **kw}, tmp_path / "changed")
    assert seen


def test_a_local_sources_key_follows_the_path_size_and_time_of_each_file(tmp_path):
    """Two copies that keep size and time (cp -p) in two folders are two sources: each gets its own cache."""
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("one two")
    b.write_text("two one")                                  # same size
    os.utime(b, ns=(os.stat(a).st_atime_ns, os.stat(a).st_mtime_ns))  # same time
    keys = {data.source_key([str(p)]) for p in (a, b)}
    assert len(keys) == 2 and all(k.startswith("local-") and len(k) == 16 for k in keys)
    assert data.source_key([str(a)]) == data.source_key([f"{tmp_path}/./a.txt"])   # one file, one key
    key = data.source_key([str(a)])
    a.write_text("one six")                                  # edited, same size: a new time
    os.utime(a, ns=(0, os.stat(b).st_mtime_ns + 1))
    assert data.source_key([str(a)]) != key
    a.write_text("one two three")                            # another size at the old time
    os.utime(a, ns=(0, os.stat(b).st_mtime_ns))
    assert data.source_key([str(a)]) != key


def test_a_text_whose_name_is_no_utf8_is_keyed_by_its_bytes_and_prepared(tmp_path):
    """A file named in Latin-1 bytes (cafe.txt with e-acute from an old archive), given alone or in a folder: the
    key hashes the name's bytes, as it hashes a UTF-8 name's: path|size|mtime_ns, one line a file."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for raw in (b"caf\xe9.txt", "naïve.txt".encode()):
        p = corpus / os.fsdecode(raw)
        p.write_text("to be, or not to be: that is the question.\n" * 20)
        st = os.stat(p)
        line = os.fsencode(os.path.realpath(p)) + f"|{st.st_size}|{st.st_mtime_ns}\n".encode()
        assert data.source_key([str(p)]) == "local-" + hashlib.sha1(line).hexdigest()[:10]
        data.load_task("textfile", cache_dir=tmp_path / "c", data_dir=str(p), tokenizer="char", block_size=8)
    task = data.load_task("textfile", cache_dir=tmp_path / "c", data_dir=str(corpus), tokenizer="char", block_size=8)
    assert len(task.split("train")) + len(task.split("val")) > 0


def test_load_json_skips_a_byte_order_mark_and_refuses_deep_nesting_in_one_line(tmp_path):
    path = tmp_path / "c" / "meta.json"
    path.parent.mkdir()
    path.write_bytes(b"\xef\xbb\xbf" + b'{"vocab": 3}')
    assert data.load_json(str(path)) == {"vocab": 3}
    path.write_bytes(b"[" * 100_000 + b"]" * 100_000)           # Python's json: RecursionError
    with pytest.raises(data.DataError) as e:
        data.load_json(str(path))
    assert str(e.value).startswith(f"{path}: is damaged (RecursionError: ") and "\n" not in str(e.value)
    assert str(e.value).endswith(f"; delete {path.parent} to rebuild it")
    (tmp_path / "c" / "x.npy").write_bytes(b"x")
    (tmp_path / "c" / "manifest.json").write_bytes(b"[" * 100_000 + b"]" * 100_000)
    assert data.cache_problem(str(tmp_path / "c")) == "has a damaged manifest.json"
