"""
IMDb reviews (Maas et al. 2011): 25,000 train, 25,000 test, label 1 = positive. Two tasks read them:
  text: LRA's byte-level task, the first 4,000 bytes of UTF-8, bytes + 1 (vocabulary 257).
  imdb: short-text classification with BPE (--tokenizer, gpt2 by default), the first 512 tokens, id + 1.
AG News (Zhang et al. 2015): 120,000 train, 7,600 test news, 4 classes (World, Sports, Business,
Sci/Tech). The text is title + " " + description, as Hugging Face's ag_news; BPE, first 512 tokens.
A folder with test.csv only (e.g. the copy some mirrors ship) trains on its first 6,000 rows (or 80%,
if it has fewer than 7,500) and tests on the rest.
Neither release has a validation split: val is a fixed 5% of the training examples, held out of train
(hold_out_val: IMDb 1,250 of 25,000, AG News 6,000 of 120,000); test is the release's test split.
"""

import csv
import math
import os

import numpy as np

import bert
from data import (DataError, cached_dir, check_labels, cls_task, id_dtype, load_json, one_line, prepare_main,
                  reading, read_text, release, save_arrays, save_json, source_key, task)
from tasks.sources import check_tokenizer, encode_batch, get_tokenizer, hf_columns, hf_split, load_hf


# Releases without a validation split of their own (IMDb for text and imdb, AG News): val is held out of train
VAL_FRACTION, VAL_SEED = 0.05, 1729


def hold_out_val(splits, source):
    """{"train": (texts, labels), "test": ...} -> the same with "val": a fixed random 5% of the training examples
    (at least one; one draw, whatever --seed, so every run is validated on the same examples), taken out of
    train. Both keep the release's order; test stays the test split."""
    texts, labels = splits["train"]
    n = len(labels)
    if n < 2:
        raise DataError(f"{source}: {n} training example(s), too few to hold out a validation split")
    val = np.zeros(n, bool)
    val[np.random.default_rng(VAL_SEED).permutation(n)[:max(1, round(VAL_FRACTION * n))]] = True

    def pick(take):
        return [t for t, v in zip(texts, val) if v == take], [y for y, v in zip(labels, val) if v == take]
    return {**splits, "train": pick(False), "val": pick(True)}


def bpe_rows(enc, texts, length, chunk=4096):
    """Texts -> (N, length) BPE ids + 1 (0 = padding) in the smallest dtype, cut to their first `length`."""
    out = np.zeros((len(texts), length), dtype=id_dtype(enc.n_vocab + 1))
    for start in range(0, len(texts), chunk):                # a chunk at a time: Python's lists of ids are big
        for i, row in enumerate(encode_batch(enc, texts[start:start + chunk]), start):
            row = row[:length]
            out[i, :len(row)] = np.asarray(row, dtype=np.int64) + 1
    return out


def byte_rows(texts, length):
    """Texts (str or bytes) -> (N, length) uint8 bytes and their lengths: the first `length` bytes of UTF-8."""
    out = np.zeros((len(texts), length), dtype=np.uint8)
    lengths = np.zeros(len(texts), dtype=np.int32)
    for i, t in enumerate(texts):
        b = (t.encode("utf-8") if isinstance(t, str) else bytes(t))[:length]
        out[i, :len(b)] = np.frombuffer(b, dtype=np.uint8)
        lengths[i] = len(b)
    return out, lengths


IMDB_LAYOUT = ("DIR with the Large Movie Review Dataset (aclImdb_v1.tar.gz unpacked): DIR/aclImdb/{train,test}/"
               "{pos,neg}/<id>_<rating>.txt (DIR may also be aclImdb/ itself)")


def review_files(task_name, folder):
    """The reviews (*.txt) of one of aclImdb's {train,test}/{neg,pos} folders, in the order of their ids."""
    def key(name):
        head = name.split("_")[0]
        return (int(head) if head.isdigit() else math.inf, name)
    with reading(folder):
        names = sorted((e.name for e in os.scandir(folder) if e.name.endswith(".txt") and not e.name.startswith(".")),
                       key=key)
    if not names:
        raise DataError(f"{task_name}: no reviews (*.txt) in {folder}: both classes are needed; use {IMDB_LAYOUT}")
    return [os.path.join(folder, n) for n in names]


def read_aclimdb(files):
    """{split: (texts, labels)} of the reviews files[(split, label)]."""
    out = {}
    for (split, label), paths in files.items():
        texts, labels = out.setdefault(split, ([], []))
        for path in paths:
            texts.append(read_text(path))
            if not texts[-1].strip():
                raise DataError(f"{path} is empty: a review needs text")
            labels.append(label)
    return out


SPLITS = {"train": "train", "val": "val", "test": "test"}


def with_val(key, read, task_name):
    """A source (cache key, read() -> {"train": ..., "test": ...}) whose val is held out of train: its caches get
    the new name KEY-val5 (older ones, whose val was the test split, are not reused)."""
    return f"{key}-val5", lambda: hold_out_val(read(), f"{task_name}: the training split")


def imdb_source(task_name, data_dir):
    """(cache key, function returning {"train": (texts, labels), "val": ..., "test": ...})."""
    if data_dir is None:
        def read():
            dd = load_hf(task_name, IMDB_LAYOUT, "stanfordnlp/imdb")
            return {s: hf_columns(hf_split(dd, [s], task_name), ["text", "label"]) for s in ("train", "test")}
        return with_val("hf", read, task_name)
    parts = [(s, label, f"{s}/{c}/") for s in ("train", "test") for label, c in ((0, "neg"), (1, "pos"))]
    _, dirs = release(task_name, data_dir, f"use {IMDB_LAYOUT}", [d for *_, d in parts], ["aclImdb"])
    files = {(s, label): review_files(task_name, dirs[d]) for s, label, d in parts}
    return with_val(source_key([p for paths in files.values() for p in paths]), lambda: read_aclimdb(files), task_name)


@task("text")
def text(cache_dir="data", data_dir=None, block_size=4000, **_):
    key, read = imdb_source("text", data_dir)
    length = max(block_size, 4000)

    def build(out):
        for split, (texts, labels) in read().items():
            tokens, lengths = byte_rows(texts, length)
            save_arrays(out, split, tokens=tokens, labels=check_labels(labels, 2, f"text: the {split} reviews"),
                        lengths=lengths)

    folder = cached_dir(os.path.join(cache_dir, "text", f"{key}-L{length}"), build, "text: IMDb as bytes")
    return cls_task("text", "cls", folder, 257, block_size, 2, 1, SPLITS)


def bpe_cls_task(name, cache_dir, key, read, tokenizer, block_size, default_length, n_classes, splits):
    """A BPE classification task: read() -> {split: (texts, labels)}, tokenised once into the cache. Local
    data (key local-...) loads the tokenizer first, so that a tokenizer that cannot load fails before the
    data is read; Hugging Face data is read first (offline, its error is the useful one)."""
    if os.path.isdir(tokenizer):                             # a BERT folder: BERT's WordPiece (section below)
        return bert.wordpiece_cls_task(name, cache_dir, key, read, tokenizer, block_size, n_classes, splits)
    length = max(block_size, default_length)
    folder = os.path.join(cache_dir, name, f"{key}-{tokenizer}-L{length}")

    def build(out):
        enc = get_tokenizer(tokenizer, name) if key.startswith("local") else None
        splits = read()
        enc = enc or get_tokenizer(tokenizer, name)
        print(f"{name}: tokenising {sum(len(t) for t, _ in splits.values()):,} texts with {tokenizer} ...",
              flush=True)
        for split, (texts, labels) in splits.items():
            tokens = bpe_rows(enc, texts, length)
            labels = check_labels(labels, n_classes, f"{name}: the {split} split")
            save_arrays(out, split, tokens=tokens, labels=labels, lengths=(tokens != 0).sum(-1).astype(np.int32))
        save_json(os.path.join(out, "meta.json"), {"tokenizer": tokenizer, "vocab_size": enc.n_vocab + 1})

    cached_dir(folder, build, f"{name}: tokenised with {tokenizer}")
    vocab_size = load_json(os.path.join(folder, "meta.json"))["vocab_size"]
    return cls_task(name, "cls", folder, vocab_size, block_size, n_classes, 0, splits)


@task("imdb")
def imdb(cache_dir="data", data_dir=None, block_size=512, tokenizer="gpt2", **_):
    key, read = imdb_source("imdb", data_dir)
    return bpe_cls_task("imdb", cache_dir, key, read, tokenizer, block_size, 512, 2, SPLITS)


AGNEWS_LAYOUT = ('DIR with the AG News CSV release (ag_news_csv.tgz unpacked): DIR/train.csv and DIR/test.csv, '
                 'rows "class","title","description" with class 1-4 (DIR may also hold ag_news_csv/)')
AGNEWS_TEST_ONLY_TRAIN = 6_000


def read_agnews_csv(path):
    texts, labels = [], []
    with reading(path), open(path, newline="", encoding="utf-8-sig") as f:    # (-sig: a byte-order mark left out)
        reader = csv.reader(f, strict=True)                  # strict: a stray or unclosed quote is an error
        try:
            for row in reader:
                if row and (len(row) != 3 or row[0].strip() not in ("1", "2", "3", "4")):
                    raise csv.Error(f"found {one_line(row, 80)}")
                if row:
                    texts.append(row[1] + " " + row[2])
                    labels.append(int(row[0]) - 1)
        except csv.Error as e:
            raise DataError(f'{path}, line {reader.line_num}: expected "class","title","description" with class '
                            f"1-4 ({e})") from None
    if not texts:
        raise DataError(f"{path} holds no rows")
    return texts, labels


@task("agnews")
def agnews(cache_dir="data", data_dir=None, block_size=512, tokenizer="gpt2", **_):
    if data_dir is None:
        def read():
            dd = load_hf("agnews", AGNEWS_LAYOUT, "fancyzhx/ag_news")
            return {s: hf_columns(hf_split(dd, [s], "agnews"), ["text", "label"]) for s in ("train", "test")}
        key = "hf"
    else:
        folder, files = release("agnews", data_dir, f"use {AGNEWS_LAYOUT}", ["test.csv"], ["ag_news_csv"],
                                ["train.csv"])
        train_csv, test_csv = files["train.csv"], files["test.csv"]
        if train_csv:
            key = source_key([train_csv, test_csv])

            def read():
                return {"train": read_agnews_csv(train_csv), "test": read_agnews_csv(test_csv)}
        else:                                                # the documented fallback: test.csv split in two
            key = source_key([test_csv]) + "-testonly"

            def read():
                texts, labels = read_agnews_csv(test_csv)
                n = min(AGNEWS_TEST_ONLY_TRAIN, int(0.8 * len(texts)))
                if n == 0 or n == len(texts):
                    raise DataError(f"{test_csv}: {len(texts)} row(s), too few to split into train and test "
                                    f"(there is no train.csv beside it)")
                print(f"agnews: {folder} has no train.csv: training on the first {n:,} rows of test.csv (val: 5% "
                      f"of them), testing on the other {len(texts) - n:,}", flush=True)
                return {"train": (texts[:n], labels[:n]), "test": (texts[n:], labels[n:])}
    key, read = with_val(key, read, "agnews")
    return bpe_cls_task("agnews", cache_dir, key, read, tokenizer, block_size, 512, 4, SPLITS)


if __name__ == "__main__":                                   # python -m tasks.text --task imdb: prepare one task alone
    prepare_main("tasks.text", check_tokenizer)
