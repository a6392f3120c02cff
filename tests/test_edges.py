"""Edges that the harder planted bugs of dev/mutants.py (--kinds hard: two-line bugs, wrong axes, off by one under
padding, cache keys, precedence of settings; docs/testing.md) found untested, each held against a hand-worked case:
where a length ends, which axis a sum runs over, what a cache's name and manifest follow, which setting wins."""

import hashlib
import json
import os

import numpy as np
import pytest
import torch

import config
import data
import runsetup
from tasks import listops_format


def test_one_line_keeps_a_message_of_exactly_the_limit_and_cuts_a_longer_one():
    assert data.one_line("abcdefghij", 10) == "abcdefghij"                  # 10 characters: whole
    assert data.one_line("abcdefghijk", 10) == "abcdefg..."                 # 11: 7 of them and "...", 10 in all
    assert data.one_line(" a\n  b\tc ", 5) == "a b c"                       # whitespace runs made one space first
    assert data.one_line(ValueError()) == "ValueError"                      # no message: the exception's name


def test_a_build_that_leaves_a_manifest_of_its_own_still_gets_a_true_one(tmp_path):
    def build(out):                                        # e.g. a copy of an older cache, its manifest.json with it
        with open(os.path.join(out, "a.bin"), "wb") as f:
            f.write(b"12345")
        with open(os.path.join(out, data.MANIFEST), "w") as f:
            f.write('{"files": {"old.bin": {"size": 1, "crc32": 0, "stamp": []}}}')
    folder = data.cached_dir(str(tmp_path / "c"), build)
    with open(os.path.join(folder, data.MANIFEST)) as f:
        files = json.load(f)["files"]
    assert sorted(files) == ["a.bin"] and files["a.bin"]["size"] == 5       # itself never listed
    assert data.cache_problem(folder) is None


def cls_folder(tmp_path, rows):
    """A cached classification folder: a train split and a val split stored as dev, rows[a] rows of each array a."""
    for stored in ("train", "dev"):
        data.save_arrays(str(tmp_path), stored, tokens=np.ones((rows["tokens"], 4), np.uint8),
                         labels=np.zeros(rows["labels"], np.int64), lengths=np.full(rows["lengths"], 4))
    return data.cls_task("t", "cls", str(tmp_path), 257, 4, 2, 1, {"train": "train", "val": "dev"})


def test_a_split_whose_arrays_disagree_in_rows_is_refused_and_a_subset_cuts_every_array(tmp_path):
    with pytest.raises(ValueError, match="3 rows of tokens, 2 labels and 2 lengths"):
        data.ClassificationSplit(np.ones((3, 4), np.uint8), [0, 1], [4, 4])
    split = data.ClassificationSplit(np.arange(12).reshape(4, 3), [0, 1, 0, 1])
    sub = split.subset(2)
    assert len(sub.tokens) == len(sub.labels) == len(sub.doc_lengths) == 2
    with pytest.raises(data.DataError, match=r"train\.\*\.npy: is damaged \(ValueError: 3 rows"):   # one line
        cls_folder(tmp_path, {"tokens": 3, "labels": 2, "lengths": 2}).split("train")


def test_a_cached_split_is_named_by_its_stored_files_in_messages(tmp_path):
    task = cls_folder(tmp_path, {"tokens": 2, "labels": 2, "lengths": 2})
    assert task.sources == {"train": str(tmp_path / "train.*.npy"), "val": str(tmp_path / "dev.*.npy")}
    np.save(tmp_path / "dev.labels.npy", np.array([0, 5]))                 # label 5 of 2 classes
    with pytest.raises(data.DataError, match=r"dev\.\*\.npy \(val split\): label 5 of example 1"):
        task.split("val")


def test_weights_that_do_not_fit_are_told_by_the_first_two_lines_of_torchs_message():
    class Model:
        def load_state_dict(self, state):
            raise RuntimeError("Error(s) in loading state_dict:\n\n\tMissing key(s): a.\n\tsize mismatch for b.")
    with pytest.raises(runsetup.UsageError) as e:
        runsetup.load_weights(Model(), {}, "x.pt")
    assert str(e.value) == ("x.pt: its weights do not fit the model (Error(s) in loading state_dict: Missing key(s): "
                            "a.)")


def test_the_binary_listops_cache_is_named_by_the_tsvs_path_and_version(tmp_path, monkeypatch):
    tsv = tmp_path / "basic_test.tsv"
    listops_format.write_listops_tsv(tsv, [("[MAX 2 9 ]", 9), ("[MIN 4 [SM 1 2 ] ]", 3)])
    monkeypatch.setattr(listops_format, "LISTOPS_NPY_MIN_BYTES", 0)
    listops_format.listops_split(str(tsv), str(tmp_path / "cache"))
    st = os.stat(tsv)
    path = hashlib.sha1(os.path.realpath(tsv).encode()).hexdigest()[:10]
    version = hashlib.sha1(f"{st.st_size}|{st.st_mtime_ns}|{st.st_ino}".encode()).hexdigest()[:10]
    assert os.listdir(tmp_path / "cache" / "listops-npy") == [f"{path}-{version}"]


def test_a_checkpoint_without_any_one_of_its_keys_is_refused_in_one_line(tmp_path):
    whole = {"model_name": "simpletron", "config": {}, "model": {}, "args": {"task": "listops"}, "optimizer": {}}
    path = str(tmp_path / "ckpt.pt")
    torch.save(whole, path)
    assert config.load_checkpoint(path, need=("optimizer",))["model_name"] == "simpletron"
    broken = [{k: v for k, v in whole.items() if k != gone} for gone in whole]
    broken += [{**whole, "model_name": "gpt5"}, {**whole, "config": []}, {**whole, "args": {"task": 3}}]
    for ckpt in broken:
        torch.save(ckpt, path)
        with pytest.raises(config.UsageError, match="is not a train.py checkpoint \\(it needs model_name, config, "
                                                    "model, args, optimizer, with a model of: "):
            config.load_checkpoint(path, need=("optimizer",))


def test_os_errors_are_told_by_the_file_that_failed_and_the_systems_reason(tmp_path):
    missing = str(tmp_path / "no" / "such.txt")
    with pytest.raises(data.DataError) as e:
        with data.reading("the file asked for"):                    # the error's own file, not the one asked for
            open(missing)
    assert str(e.value) == f"{missing}: cannot be read (No such file or directory)"
    with pytest.raises(data.DataError) as e:
        with data.reading("the file asked for"):
            raise OSError("no file named")                         # no file, no reason: the path and the message
    assert str(e.value) == "the file asked for: cannot be read (no file named)"
    with pytest.raises(data.DataError) as e:
        data.atomic_write(missing, lambda f: f.write("x"), mode="w")
    assert str(e.value) == f"cannot write {missing}: No such file or directory; {missing} is left as it was"
    assert data.error_line(FileNotFoundError(2, "No such file or directory", missing)) == (
        f"{missing}: No such file or directory; check that path (and the free space)")
    assert data.error_line(OSError("disk on fire")) == "a file: disk on fire; check that path (and the free space)"


def test_distractors_end_as_line_ink_on_an_empty_canvas():
    from tasks import pathfinder as pf
    B = 4
    near, ink = np.zeros((B, pf.PF_N, pf.PF_N), np.uint8), np.zeros((B, pf.PF_N, pf.PF_N), np.uint8)
    pf._pf_distractors(near, np.zeros_like(near), ink, np.arange(B) * pf.PF_N * pf.PF_N, np.random.default_rng(0))
    assert set(np.unique(ink).tolist()) == {0, 1}                # drawn as lines, nothing left "in progress"
    assert ((ink == 1).sum((1, 2)) >= 5).all()                   # at least one 5-pixel dash in every image


@pytest.mark.parametrize("name", ["text", "imdb"])
def test_cached_labels_are_stored_as_checked_bytes(name, tmp_path):
    from test_data import write_aclimdb
    kw = {"tokenizer": "byte"} if name == "imdb" else {}
    data.load_task(name, cache_dir=str(tmp_path / "c"), data_dir=str(write_aclimdb(tmp_path / "d")), **kw)
    stored = sorted((tmp_path / "c").rglob("*.labels.npy"))
    assert stored and all(np.load(p).dtype == np.uint8 for p in stored)
