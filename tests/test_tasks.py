"""tasks/: Penn Treebank as characters (--task ptb --tokenizer char): its ids, splits, cache and errors, the Hugging
Face copy, the tokenizer check, and sample.py on a ptb-char checkpoint. Every file is written by the test."""

import io
import os

import numpy as np
import pytest

import data
import sample
import tasks  # noqa: F401  (registers every task)
import train
from tasks import lm, sources

PTB = {"train": [" the cat sat on the mat ", " a <unk> ran N miles ", " the dog sat "] * 12,
       "valid": [" the cat ran ", " a dog sat on N mat "] * 6, "test": [" on the mat sat a cat "] * 8}


def write_ptb(folder, texts=PTB):
    folder.mkdir(parents=True, exist_ok=True)
    for name, lines in texts.items():
        (folder / f"ptb.{name}.txt").write_text("".join(f"{s}\n" for s in lines))
    return folder


def decode(chars, ids):
    return "".join(chars[i - 1] for i in ids)


def test_ptb_characters_are_the_files_own(tmp_path, monkeypatch):
    folder = write_ptb(tmp_path / "ptb")
    task = data.load_task("ptb", cache_dir=tmp_path / "c", data_dir=str(folder), tokenizer="char")
    train_text = (folder / "ptb.train.txt").read_text()
    chars = sorted(set(train_text))                          # ids from 1, line breaks one of them
    assert "\n" in chars and " " in chars and task.meta["chars"] == "".join(chars)
    assert (task.kind, task.vocab_size, task.block_size) == ("lm", len(chars) + 1, 35)   # ptb's block_size
    for split, name in (("train", "train"), ("val", "valid"), ("test", "test")):
        stream = task.split(split).stream
        assert isinstance(stream, np.memmap) and stream.dtype == np.uint8 and stream.min() >= 1
        assert decode(chars, stream) == (folder / f"ptb.{name}.txt").read_text()
    assert task.sources["val"].endswith("ptb.valid.txt")
    (cached,) = os.listdir(tmp_path / "c" / "ptb-char")
    assert sorted(os.listdir(tmp_path / "c" / "ptb-char" / cached)) == ["manifest.json", "meta.json", "test.bin",
                                                                        "train.bin", "val.bin"]
    monkeypatch.setattr(lm, "read_text", lambda p: pytest.fail("the cache was not used"))
    again = data.load_task("ptb", cache_dir=tmp_path / "c", data_dir=str(folder), tokenizer="char", block_size=100)
    assert again.block_size == 100 and (again.split("test").stream == task.split("test").stream).all()
    monkeypatch.undo()
    words = data.load_task("ptb", cache_dir=tmp_path / "c", data_dir=str(folder))     # words without char
    assert words.vocab_size == len({w for line in PTB["train"] for w in line.split()}) + 2      # + <eos>, pad


def test_ptb_character_not_in_train_is_one_line(tmp_path):
    folder = write_ptb(tmp_path / "ptb", {**PTB, "test": [" the cat ", " a zebra sat "]})
    with pytest.raises(data.DataError) as e:
        data.load_task("ptb", cache_dir=tmp_path / "c", data_dir=str(folder), tokenizer="char")
    msg = str(e.value)
    assert "\n" not in msg and "ptb.test.txt, line 2: character 'z' is not in the training text" in msg
    assert os.listdir(tmp_path / "c" / "ptb-char") == []     # nothing half-built is left
    (tmp_path / "c" / "ptb-char" / "x.tmp999999999").mkdir()  # what a killed build leaves is removed
    write_ptb(folder)
    data.load_task("ptb", cache_dir=tmp_path / "c", data_dir=str(folder), tokenizer="char")
    assert not any(".tmp" in f for f in os.listdir(tmp_path / "c" / "ptb-char"))
    (built,) = os.listdir(tmp_path / "c" / "ptb-char")
    (tmp_path / "c" / "ptb-char" / built / "manifest.json.tmp999999999").write_text("{}")   # a killed restamp's
    data.load_task("ptb", cache_dir=tmp_path / "c", data_dir=str(folder), tokenizer="char")
    assert not any(".tmp" in f for f in os.listdir(tmp_path / "c" / "ptb-char" / built))


def test_ptb_characters_from_hugging_face_are_the_same(tmp_path, monkeypatch):
    import datasets
    folder = write_ptb(tmp_path / "ptb", {s: [f" {line.strip()} " for line in lines] for s, lines in PTB.items()})
    dd = datasets.DatasetDict({s: datasets.Dataset.from_dict({"sentence": [line.strip() for line in PTB[f]]})
                               for s, f in (("train", "train"), ("validation", "valid"), ("test", "test"))})
    monkeypatch.setattr(sources, "hf_dataset", lambda *a, **k: dd)
    remote = data.load_task("ptb", cache_dir=tmp_path / "c", data_dir=None, tokenizer="char")
    local = data.load_task("ptb", cache_dir=tmp_path / "c2", data_dir=str(folder), tokenizer="char")
    assert remote.meta["chars"] == local.meta["chars"]
    for s in ("train", "val", "test"):
        assert (remote.split(s).stream == local.split(s).stream).all()


def test_char_is_a_tokenizer_of_textfile_and_ptb_only():
    for task in ("textfile", "ptb"):
        sources.check_tokenizer("char", task)
    with pytest.raises(data.DataError, match="char \\(--task textfile or ptb\\)"):
        sources.check_tokenizer("char", "wikitext103")


def test_sample_py_on_a_ptb_char_checkpoint(tmp_path):
    folder = write_ptb(tmp_path / "ptb")
    train.main(["--model", "simpletron", "--task", "ptb", "--tokenizer", "char", "--data_dir", str(folder),
                "--cache_dir", str(tmp_path / "cache"), "--out_dir", str(tmp_path / "run"), "--n_layer", "1",
                "--n_embd", "16", "--n_head", "2", "--batch_size", "4", "--eval_iters", "1", "--max_iters", "2",
                "--warmup", "1", "--block_size", "16"])
    out = io.StringIO()
    y = sample.main(["--ckpt", str(tmp_path / "run" / "ckpt.pt"), "--start", "the cat\na", "--num_samples", "2",
                     "--max_new_tokens", "5", "--device", "cpu"], out=out)
    chars = sorted(set((folder / "ptb.train.txt").read_text()))
    assert y[:, :9].tolist() == [[chars.index(c) + 1 for c in "the cat\na"]] * 2
    assert out.getvalue() == "".join(f"{decode(chars, row)}\n---------------\n" for row in y.tolist())
    with pytest.raises(sample.UsageError, match="character 'z' of --start"):
        sample.main(["--ckpt", str(tmp_path / "run" / "ckpt.pt"), "--start", "zebra", "--device", "cpu"])
