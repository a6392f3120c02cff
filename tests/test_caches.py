"""Token ids a model cannot embed, in memory-mapped files: a fork's .bin streams, and caches whose files were changed
with their manifest rewritten to match (which the manifest's check cannot see). Each is one DataError line naming
the file when the task is opened, not an IndexError at the embedding; a meta.json whose vocab_size is no number a
float can hold names meta.json and the value, not the line of the loader that read it."""

import json
import shutil

import numpy as np
import pytest

import data
import train
from test_data import hf  # noqa: F401  (a fixture: the Hugging Face download replaced)
from test_fork import fork_module

MAPPED = '''"""A fork's task over nanoGPT-style .bin files of uint16 ids, memory-mapped."""
import numpy as np

from data import LMSplit, Task, task


@task("mapped")
def mapped(cache_dir="data", data_dir=None, block_size=8, **_):
    data_dir = data_dir or "."
    def load(s):
        return LMSplit(np.memmap(f"{data_dir}/{s}.bin", dtype=np.uint16, mode="r"), block_size, f"{s}.bin")
    return Task("mapped", "lm", 16, block_size, loaders={s: (lambda s=s: load(s)) for s in ("train", "val")})
'''


@pytest.fixture
def fork(monkeypatch, tmp_path):
    fork_module(monkeypatch, tmp_path, "mapped", MAPPED)
    return tmp_path


@pytest.mark.parametrize("position", [0, 99, 100, 999])
def test_a_memory_mapped_stream_with_an_id_past_the_vocabulary_is_one_line_naming_the_file(fork, position, capsys,
                                                                                          monkeypatch):
    monkeypatch.setattr(data.Task, "MAP_CHUNK", 100)             # read in chunks of 100 ids: each chunk's ends too
    ids = np.arange(1000, dtype=np.uint16) % 15 + 1
    ids.tofile(fork / "val.bin")
    ids[position] = 20
    ids.tofile(fork / "train.bin")
    said = (f"{fork / 'train.bin'} (train split) holds token id 20, and task mapped's vocab_size is 16 (ids 0 to 15, "
            "0 the padding): count every id")
    with pytest.raises(data.DataError) as e:
        data.load_task("mapped", cache_dir="cache").open()
    assert str(e.value) == said
    with pytest.raises(SystemExit) as e:                    # python -m tasks.X's entry: exit status 2, not 0
        data.prepare_main("mapped", argv=["--cache_dir", "cache"])
    assert e.value.code == 2 and capsys.readouterr().err == f"error: {said}\n"
    with pytest.raises(data.DataError) as e:                # train.py: before the model, before any step
        train.main(["--model", "simpletron", "--task", "mapped", "--cache_dir", "cache", "--max_iters", "1",
                    "--device", "cpu", "--out_dir", "out"])
    assert str(e.value) == said and not (fork / "out" / "ckpt.pt").exists()


def test_nanogpts_bins_that_openwebtext_checked_are_not_read_again(tmp_path, monkeypatch):
    """openwebtext --data_dir checks its files once (remembered under --cache_dir): the split's check trusts that."""
    read, scan = [], data.Task.mapped_top
    monkeypatch.setattr(data.Task, "mapped_top", staticmethod(lambda a: (read.append(a.filename), scan(a))[1]))
    (tmp_path / "owt").mkdir()
    for s in ("train", "val"):
        np.arange(1000, dtype=np.uint16).tofile(tmp_path / "owt" / f"{s}.bin")
    for _ in range(2):
        data.load_task("openwebtext", cache_dir=tmp_path / "c", data_dir=str(tmp_path / "owt"), block_size=8).open()
    assert read == []


def test_a_forged_listops_cache_is_one_line_saying_to_delete_it(tmp_path):
    kw = dict(listops_depth=3, listops_args="2,4", listops_len="5,30", listops_sizes="20,5,5")
    data.load_task("listops", cache_dir=str(tmp_path), **kw).open()
    folder = tmp_path / "listops-depth3-args2-4-len5-30-n20-5-5"
    tokens = np.load(folder / "train.tokens.npy")
    tokens[3, 0] = 200
    np.save(folder / "train.tokens.npy", tokens)
    data.write_manifest(str(folder))                        # the manifest rewritten to match
    with pytest.raises(data.DataError) as e:
        data.load_task("listops", cache_dir=str(tmp_path), **kw).open()
    assert str(e.value) == (f"{folder / 'train.tokens.npy'} (train split) holds token id 200, and task listops's "
                            f"vocab_size is 16 (ids 0 to 15, 0 the padding): a damaged cache: delete {folder} to "
                            "rebuild it")


def test_a_forged_char_cache_of_a_text_file_is_one_line_saying_to_delete_it(tmp_path):
    (tmp_path / "tiny.txt").write_text("to be or not to be, that is the question\n" * 30)
    task = data.load_task("textfile", cache_dir=tmp_path / "c", data_dir=str(tmp_path / "tiny.txt"), tokenizer="char",
                          block_size=8)
    task.open()
    folder = (tmp_path / "c" / "textfile").glob("*-char").__next__()
    stream = np.fromfile(folder / "val.bin", dtype=np.uint8)
    stream[-1] = 250
    stream.tofile(folder / "val.bin")
    data.write_manifest(str(folder))
    with pytest.raises(data.DataError) as e:
        data.load_task("textfile", cache_dir=tmp_path / "c", data_dir=str(tmp_path / "tiny.txt"), tokenizer="char",
                       block_size=8).open(training=False)
    assert str(e.value) == (f"{folder / 'val.bin'} (val split) holds token id 250, and task textfile's vocab_size is "
                            f"{task.vocab_size} (ids 0 to {task.vocab_size - 1}, 0 the padding): a damaged cache: "
                            f"delete {folder} to rebuild it")


@pytest.mark.parametrize("value, shown", [("1e400", "Infinity"), ("-1e400", "-Infinity"),
                                          ("1" + "0" * 400, "1" + "0" * 400), ('"many"', '"many"')])
def test_a_meta_json_vocab_size_no_float_can_hold_names_meta_json_and_the_value(tmp_path, value, shown):
    folder = tmp_path / "owt"
    folder.mkdir()
    for s in ("train", "val"):
        np.ones(100, np.uint16).tofile(folder / f"{s}.bin")
    (folder / "meta.json").write_text(f'{{"vocab_size": {value}, "dtype": "uint16"}}')
    with pytest.raises(data.DataError) as e:
        data.load_task("openwebtext", cache_dir=tmp_path / "c", data_dir=str(folder), block_size=8)
    assert str(e.value).startswith(f"{folder / 'meta.json'}: \"vocab_size\": {shown}, \"dtype\": \"uint16\": "
                                   "expected"), str(e.value)


def test_openwebtexts_cache_has_its_ids_checked_once_per_change_not_at_every_start(tmp_path, monkeypatch, hf):
    """openwebtext's cache (~18 GB built from Hugging Face) is not read whole at every start, as data.Task.check
    reads a mapped stream: its ids are checked once per change of a file (a record in openwebtext/checked/, as
    --data_dir's files are), and a file forged with its manifest rewritten is read again and refused in one line."""
    from tasks import lm
    from test_cache import hf_openwebtext
    hf_openwebtext(hf)
    kw = dict(cache_dir=str(tmp_path / "c"), tokenizer="byte", block_size=8)
    data.load_task("openwebtext", **kw).open()
    assert len(list((tmp_path / "c" / "openwebtext" / "checked").iterdir())) == 2     # train.bin and val.bin
    with monkeypatch.context() as m:                         # the next start reads neither file's ids
        m.setattr(data.Task, "mapped_top", lambda *a: pytest.fail("read again by Task.check"))
        m.setattr(lm, "remember_check", lambda *a: pytest.fail("checked again"))
        assert data.load_task("openwebtext", **kw).open() == ["val"]
    folder = tmp_path / "c" / "openwebtext" / "hf-byte"
    ids = np.fromfile(folder / "val.bin", dtype=np.uint16)
    ids[3] = 300                                             # past the byte tokenizer's ids
    ids.tofile(folder / "val.bin")
    data.write_manifest(str(folder))                         # (forged: the manifest's check cannot see it)
    with pytest.raises(data.DataError) as e:
        data.load_task("openwebtext", **kw).open()
    assert str(e.value) == (f"{folder / 'val.bin'} holds id 300 (at position 3), outside the 257 ids of its "
                            f"meta.json: a damaged cache, delete {folder} to rebuild it")


def test_a_cache_replaced_by_a_copy_of_another_sources_cache_is_built_again(tmp_path, capsys):
    """Battery 21 c06: text B's cache folder replaced by a copy of text A's (its manifest too, whole and sound) was
    used: B's run trained on A's characters. The manifest records the name (the key) a folder was built as; a folder
    of another name is built again from its own source, said in one line."""
    texts = {"a": "to be or not to be, that is the question\n" * 30}
    texts["b"] = texts["a"].upper()
    folders = {}
    for name, text in texts.items():
        (tmp_path / f"{name}.txt").write_text(text)
        task = data.load_task("textfile", cache_dir=tmp_path / "c", data_dir=str(tmp_path / f"{name}.txt"),
                              tokenizer="char", block_size=8)
        folders[name] = next(p for p in (tmp_path / "c" / "textfile").iterdir() if p not in folders.values())
        assert json.loads((folders[name] / "manifest.json").read_text())["folder"] == folders[name].name
    shutil.rmtree(folders["b"])
    shutil.copytree(folders["a"], folders["b"])
    capsys.readouterr()
    task = data.load_task("textfile", cache_dir=tmp_path / "c", data_dir=str(tmp_path / "b.txt"), tokenizer="char",
                          block_size=8)
    assert capsys.readouterr().out.splitlines()[0] == (f"{folders['b']} holds a copy of the cache "
                                                       f"{folders['a'].name!r}, built from other files or settings: "
                                                       "building it again")
    assert task.vocabulary == "".join(sorted(set(texts["b"])))
    manifest = json.loads((folders["b"] / "manifest.json").read_text())
    del manifest["folder"]                                   # (an earlier version's manifest: no name, used as it is)
    (folders["b"] / "manifest.json").write_text(json.dumps(manifest))
    assert data.cache_problem(str(folders["b"])) is None and data.cache_problem(str(folders["b"]) + "/") is None
