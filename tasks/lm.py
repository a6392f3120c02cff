"""
Language modelling with BPE, as nanoGPT: every split tokenised once into a .bin file of token ids
(uint16 for gpt2) that is memory-mapped, never loaded. wikitext103 and openwebtext are GPT-2's usual
data; textfile takes any text for a quick experiment (first 90% train, last 10% val, as nanoGPT).
Penn Treebank, word level (Mikolov's release: ptb.{train,valid,test}.txt, 10k words with <unk>), or with
--tokenizer char the character-level benchmark of the same files (every character, the line break too).
Without --data_dir the Hugging Face copy (ptb_text_only, the same sentences) is written out once as
those three files under cache_dir/ptb/ and read back the same way.
"""

import contextlib
import glob
import itertools
import json
import os
import shutil

import numpy as np

from data import (MANIFEST, DataError, LMSplit, Task, atomic_write_text, cache_problem, cached_dir, file_problem,
                  file_stamp, id_dtype, load_json, prepare_main, read_lines, read_text, reading, release,
                  remove_stale_temps, save_json, source_key, task)
from tasks.sources import check_tokenizer, encode_batch, get_tokenizer, hf_rows, hf_split, load_hf


PTB_LAYOUT = ("DIR with Mikolov's ptb.train.txt, ptb.valid.txt, ptb.test.txt (simple-examples.tgz; DIR may "
              "also hold simple-examples/data/ or ptb/)")
PTB_FILES = {"train": "ptb.train.txt", "val": "ptb.valid.txt", "test": "ptb.test.txt"}
CHECK_CHUNK = 1 << 26                                        # ids of a .bin checked at a time (128 MiB of uint16)


def ptb_files(data_dir):
    """{split: path} of Mikolov's three files under data_dir."""
    _, paths = release("ptb", data_dir, f"use {PTB_LAYOUT}", list(PTB_FILES.values()), ["simple-examples/data", "ptb"])
    return {s: paths[name] for s, name in PTB_FILES.items()}


def read_words(path):
    return [w for line in read_lines(path) for w in line.split() + ["<eos>"]]


def fetch_ptb(folder):
    def build(tmp):
        dd = load_hf("ptb", PTB_LAYOUT, "ptb-text-only/ptb_text_only", "penn_treebank", parquet_dir="penn_treebank")
        for split, name in PTB_FILES.items():
            ds = hf_split(dd, ["validation" if split == "val" else split], "ptb")
            lines = [f" {s} \n" for batch, in hf_rows(ds, ["sentence"]) for s in batch]
            atomic_write_text(os.path.join(tmp, name), "".join(lines))
    return cached_dir(folder, build, "ptb: writing Hugging Face's Penn Treebank as Mikolov's files")


def char_ids(text, chars, source):
    """A text -> the ids of its characters, id i + 1 for chars[i] (sorted; 0 is padding), in the smallest
    dtype. A character that is not in chars is a DataError that names the source and the line."""
    codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
    table = np.frombuffer(chars.encode("utf-32-le"), dtype=np.uint32)
    ids = np.minimum(np.searchsorted(table, codes), len(table) - 1)
    unknown = np.flatnonzero(table[ids] != codes)
    if len(unknown):
        at = int(unknown[0])
        raise DataError(f"{source}, line {text.count(chr(10), 0, at) + 1}: character {text[at]!r} is not in the "
                        "training text (--tokenizer char numbers the characters of the training text)")
    return (ids + 1).astype(id_dtype(len(chars) + 1))


def ptb_chars(files, cache_dir, block_size):
    """PTB as characters: ids from 1 for the distinct characters of ptb.train.txt (the line break one of them),
    val and test in those ids; cached as .bin streams under cache_dir/ptb-char/KEY (KEY follows the files)."""
    folder = os.path.join(cache_dir, "ptb-char", source_key(files.values()))

    def build(out):
        texts = {s: read_text(p) for s, p in files.items()}
        chars = "".join(sorted(set(texts["train"])))
        for s, text in texts.items():
            char_ids(text, chars, files[s]).tofile(os.path.join(out, f"{s}.bin"))
        save_json(os.path.join(out, "meta.json"), {"tokenizer": "char", "chars": chars, "vocab_size": len(chars) + 1,
                                                   "dtype": np.dtype(id_dtype(len(chars) + 1)).name})
    remove_stale_temps(os.path.dirname(folder))               # what a killed build left
    cached_dir(folder, build, "ptb: characters")
    return lm_bin_task("ptb", folder, block_size, list(files), sources=files)


@task("ptb")
def ptb(data_dir=None, cache_dir="data", block_size=35, tokenizer="gpt2", **_):
    if tokenizer not in ("gpt2", "char"):                    # (gpt2: the default, for PTB its words)
        raise DataError(f"ptb: --tokenizer {tokenizer}: Penn Treebank is read as its words (without --tokenizer) or "
                        "its characters (--tokenizer char)")
    files = ptb_files(fetch_ptb(os.path.join(cache_dir, "ptb")) if data_dir is None else data_dir)
    if tokenizer == "char":
        return ptb_chars(files, cache_dir, block_size)
    words = {s: read_words(p) for s, p in files.items()}
    vocab = {w: i for i, w in enumerate(sorted(set(words["train"])), start=1)}  # 0 is padding
    for s, ws in words.items():
        unknown = next((w for w in ws if w not in vocab), None)
        if unknown is not None:
            raise DataError(f"{files[s]}: word {unknown!r} is not in the training vocabulary (that of "
                            f"{files['train']}; Mikolov's files write rare words as <unk>)")
    streams = {s: np.array([vocab[w] for w in ws], dtype=np.int32) for s, ws in words.items()}
    loaders = {s: (lambda s=s: LMSplit(streams[s], block_size, files[s])) for s in streams}
    return Task("ptb", "lm", len(vocab) + 1, block_size, 0, loaders, sources=files, meta={"words": list(vocab)})


WIKITEXT_LAYOUT = ("DIR with WikiText-103 (wikitext-103-v1.zip or wikitext-103-raw-v1.zip unpacked): "
                   "DIR/wiki.train.tokens, wiki.valid.tokens, wiki.test.tokens (or wiki.*.raw; DIR may also hold "
                   "wikitext-103/ or wikitext-103-raw/)")
OWT_LAYOUT = ("DIR with nanoGPT's data/openwebtext/train.bin and val.bin (gpt2 ids, uint16; DIR may also hold "
              "openwebtext/)")


def safe_cut(before, line):
    """Whether tokenising the text that ends in `before` (its last two characters, a newline last) and the
    text that starts with `line` separately gives the same tokens as tokenising them at once (gpt2, r50k,
    p50k, cl100k and o200k patterns): when `line` starts with one space and then a non-space, or with a
    non-space after a newline that follows a non-space. (Before a non-space, a run of blanks such as " \n\n"
    splits differently in mid-text than at the end of a text.)"""
    if not before.endswith("\n") or not line or line[0] in "\r\n":
        return False
    if line[0] == " ":
        return len(line) > 1 and not line[1].isspace()
    return not line[0].isspace() and (len(before) < 2 or not before[-2].isspace())


def text_chunks(lines, size=1 << 20):
    """Join lines (each ending in a newline but the last) into pieces of about `size` characters, cut only
    where the tokens cannot change (safe_cut): tokenising the pieces one by one equals tokenising the whole."""
    buf, n, tail = [], 0, ""
    for line in lines:
        if n >= size and safe_cut(tail, line):
            yield "".join(buf)
            buf, n = [], 0
        buf.append(line)
        n += len(line)
        tail = (tail + line)[-2:]
    if buf:
        yield "".join(buf)


def write_bin(path, pieces, enc, eot=False, batch=64):
    """Tokenise text pieces (an iterable of str) with enc and write the ids to path (nanoGPT's .bin: raw
    ids, uint16 when they fit), a batch of pieces at a time; eot=True ends every piece with <|endoftext|>.
    (Called inside a cached_dir build: the folder, not the file, is what appears whole or not at all.)"""
    dtype, end, pieces, n = id_dtype(enc.n_vocab), [enc.eot_token] if eot else [], iter(pieces), 0
    with open(path, "wb") as f:
        while group := list(itertools.islice(pieces, batch)):
            ids = np.concatenate([np.asarray(row + end, dtype=dtype) for row in encode_batch(enc, group)])
            ids.tofile(f)
            n += len(ids)
    return n


def load_bin(path, dtype):
    """The ids of a .bin file, memory-mapped; a size that is no whole number of ids is a DataError."""
    size, dtype = os.path.getsize(path), np.dtype(dtype)
    if size % dtype.itemsize:
        raise DataError(f"{path} holds {size:,} bytes, no whole number of {dtype.name} ids (cut short?)")
    return np.memmap(path, dtype=dtype, mode="r") if size else np.zeros(0, dtype)


def lm_bin_task(name, folder, block_size, splits, sources=None, stamps=None):
    """A language-model Task over a folder of .bin streams described by its meta.json (vocab_size, dtype); with
    `stamps`, each stream's ids checked once per change of it (check_ids), not at every start (data.Task.check)."""
    meta = load_json(os.path.join(folder, "meta.json"))
    hint = f"; delete {folder} to rebuild it" if sources is None else ""
    try:
        dtype, vocab_size = np.dtype(meta["dtype"]), int(meta["vocab_size"])
        if dtype.kind != "u" or not 2 <= vocab_size <= np.iinfo(dtype).max + 1:   # ids the dtype can hold
            raise ValueError
        if "chars" in meta and not (isinstance(meta["chars"], str) and len(meta["chars"]) + 1 == vocab_size):
            raise ValueError                                 # (a char cache's: id i + 1 for chars[i])
    except (TypeError, KeyError, ValueError, OverflowError):  # (OverflowError: a vocab_size of 1e400, infinite)
        got = ", ".join(f"{json.dumps(k)}: {json.dumps(meta[k])}" for k in ("vocab_size", "dtype")
                        if isinstance(meta, dict) and k in meta)
        raise DataError(f"{os.path.join(folder, 'meta.json')}: {got + ': ' if got else ''}expected {{\"vocab_size\": "
                        f"N, \"dtype\": \"uint16\"}} (and \"chars\": N - 1 characters, if any){hint}") from None
    sources = sources or {s: os.path.join(folder, f"{s}.bin") for s in splits}

    def load(s):
        if stamps:
            check_ids(os.path.join(folder, f"{s}.bin"), dtype, vocab_size, f"the {vocab_size:,} ids of its meta.json: "
                      f"a damaged cache, delete {folder} to rebuild it", stamps)
        split = LMSplit(load_bin(os.path.join(folder, f"{s}.bin"), dtype), block_size, sources[s])
        split.ids_checked = bool(stamps)                     # (else data.Task.check reads them)
        return split
    return Task(name, "lm", vocab_size, block_size, 0, {s: (lambda s=s: load(s)) for s in splits}, sources=sources,
                meta=meta)


@task("wikitext103")
def wikitext103(cache_dir="data", data_dir=None, block_size=512, tokenizer="gpt2", **_):
    names = (("train", "train"), ("val", "valid"), ("test", "test"))
    sources = None
    if data_dir is not None:
        layout, sub = f"use {WIKITEXT_LAYOUT}", ["wikitext-103", "wikitext-103-raw"]
        folder, found = release("wikitext103", data_dir, layout, (), sub, ["wiki.train.tokens", "wiki.train.raw"])
        ext = "tokens" if found["wiki.train.tokens"] else "raw"
        _, files = release("wikitext103", folder, layout, [f"wiki.{f}.{ext}" for _, f in names])
        sources = {s: files[f"wiki.{f}.{ext}"] for s, f in names}
        key = source_key(sources.values())

        def lines(split):
            yield from read_lines(sources[split])
    else:
        key, dd = "hf", []

        def lines(split):
            if not dd:
                dd.append(load_hf("wikitext103", WIKITEXT_LAYOUT, "Salesforce/wikitext", "wikitext-103-raw-v1"))
            ds = hf_split(dd[0], ["validation" if split == "val" else split], "wikitext103")
            for batch, in hf_rows(ds, ["text"]):
                yield from batch
    folder = os.path.join(cache_dir, "wikitext103", f"{key}-{tokenizer}")

    def build(out):
        enc = get_tokenizer(tokenizer, "wikitext103") if data_dir is not None else None
        chunks = {split: text_chunks(lines(split)) for split, _ in names}
        first = next(chunks["train"], None)                  # the data first: offline, its error is the useful one
        enc = enc or get_tokenizer(tokenizer, "wikitext103")
        print(f"wikitext103: tokenising with {tokenizer} ...", flush=True)
        for split, _ in names:
            pieces = chunks[split]
            if split == "train" and first is not None:
                pieces = itertools.chain([first], pieces)
            write_bin(os.path.join(out, f"{split}.bin"), pieces, enc)
        save_json(os.path.join(out, "meta.json"), {"tokenizer": tokenizer, "vocab_size": enc.n_vocab,
                                                   "dtype": np.dtype(id_dtype(enc.n_vocab)).name})

    cached_dir(folder, build, f"wikitext103: tokenised with {tokenizer}")
    return lm_bin_task("wikitext103", folder, block_size, [s for s, _ in names], sources)


def check_ids(path, dtype, vocab, whose, stamps):
    """A DataError if the .bin file at path holds an id >= vocab (`whose` ids they are, said). A file checked once
    is remembered under `stamps`, in a file named after its path, size and modification time that holds its stamp
    (data.file_stamp) and vocab: a large train.bin is read once, and again after any change to it or to what was
    remembered."""
    stamp = os.path.join(stamps, f"{source_key([path])}-{vocab}")
    record = json.dumps({"file": os.path.realpath(path), "stamp": file_stamp(path), "vocab": vocab})
    if os.path.isfile(stamp):                                # (a FIFO there would wait for a writer)
        with contextlib.suppress(OSError, UnicodeDecodeError), open(stamp) as f:
            if f.read() == record:
                return
    ids = load_bin(path, dtype)
    for start in range(0, len(ids), CHECK_CHUNK):
        chunk = ids[start:start + CHECK_CHUNK]
        if chunk.max() >= vocab:
            i = int(np.argmax(chunk >= vocab))
            raise DataError(f"{path} holds id {chunk[i]} (at position {start + i:,}), outside {whose}")
    remember_check(stamps, stamp, record)


def remember_check(stamps, stamp, record):
    """Write the record of an id check at `stamp`, in the cache's folder `stamps`. The records are the cache's
    bookkeeping, written again whenever lost: what stands in their place (a file where the folder goes, a folder
    where a record goes) is removed first, and said; a cache that cannot be written is one DataError line."""
    try:
        for path, fits, kind in ((stamps, os.path.isdir, "folder"), (stamp, os.path.isfile, "file")):
            if os.path.lexists(path) and not fits(path):
                print(f"{path} is not a {kind} (a record of the ids checked): made again", flush=True)
                if os.path.isdir(path) and not os.path.islink(path):
                    shutil.rmtree(path)
                else:
                    os.remove(path)
        os.makedirs(stamps, exist_ok=True)
    except OSError as e:
        raise DataError(f"cannot write {stamps}, where the checked ids are recorded ({e.strerror or e}); make "
                        "--cache_dir writable, or use another") from None
    atomic_write_text(stamp, record)


@task("openwebtext")
def openwebtext(cache_dir="data", data_dir=None, block_size=1024, tokenizer="gpt2", **_):
    if data_dir is not None:                                 # nanoGPT's prepared files, used where they are
        folder, files = release("openwebtext", data_dir, f"use {OWT_LAYOUT}", ["train.bin", "val.bin"],
                                ["openwebtext", "data/openwebtext"], ["meta.json"])
        sources = {s: files[f"{s}.bin"] for s in ("train", "val")}
        problem = os.path.isfile(os.path.join(folder, MANIFEST)) and cache_problem(folder, keyed=False)
        if problem:                                          # a copy of a cache: its own files, no source to rebuild
            raise DataError(f"openwebtext: --data_dir {folder} {problem}; copy it again, or leave out --data_dir")
        meta = files["meta.json"] and lm_bin_task("openwebtext", folder, block_size, ("train", "val"), sources).meta
        if not meta and tokenizer not in ("gpt2", "r50k_base"):  # (the same ids: r50k_base is gpt2's encoding)
            raise DataError(f"openwebtext: --tokenizer {tokenizer}: nanoGPT's train.bin and val.bin hold gpt2 ids; use "
                            "--tokenizer gpt2, or put a meta.json (vocab_size, dtype) beside files of other ids")
        vocab = (int(meta["vocab_size"]) if meta else 50257 if tokenizer in ("gpt2", "r50k_base") else
                 get_tokenizer(tokenizer, "openwebtext").n_vocab)
        dtype = np.dtype(meta["dtype"] if meta else id_dtype(vocab))   # (a meta.json's checked by lm_bin_task)
        whose = (f"the {vocab:,} ids of {files['meta.json']}" if meta else f"--tokenizer {tokenizer}'s {vocab:,} ids; "
                 "nanoGPT's files hold gpt2 ids: use --tokenizer gpt2 (no download needed)")
        for path in sources.values():
            size = os.path.getsize(path)
            if size == 0 or size % dtype.itemsize:
                what = f"holds {size:,} bytes, no whole number of {dtype.name} ids" if size else "is empty"
                raise DataError(f"openwebtext: {path} {what}; use {OWT_LAYOUT}")

        def load(s):                                         # train.bin is checked when it is used
            with reading(sources[s]):
                check_ids(sources[s], dtype, vocab, whose, os.path.join(cache_dir, "openwebtext", "checked"))
                split = LMSplit(load_bin(sources[s], dtype), block_size, sources[s])
                split.ids_checked = True                     # (so data.Task.check does not read it again)
                return split
        load("val")                                          # small: a wrong --tokenizer fails at once
        return Task("openwebtext", "lm", vocab, block_size, 0, {s: (lambda s=s: load(s)) for s in sources},
                    sources=sources, meta=meta or {})
    folder = os.path.join(cache_dir, "openwebtext", f"hf-{tokenizer}")

    def build(out):
        dd = load_hf("openwebtext", OWT_LAYOUT, "Skylion007/openwebtext")
        enc = get_tokenizer(tokenizer, "openwebtext")
        print(f"openwebtext: tokenising with {tokenizer} (an hour or more, as nanoGPT's prepare.py) ...", flush=True)
        # nanoGPT's split: 0.05% of the documents for val, seed 2357
        split = hf_split(dd, ["train"], "openwebtext").train_test_split(test_size=0.0005, seed=2357, shuffle=True)
        for name, ds in (("train", split["train"]), ("val", split["test"])):
            docs = (doc for batch, in hf_rows(ds, ["text"]) for doc in batch)
            write_bin(os.path.join(out, f"{name}.bin"), docs, enc, eot=True, batch=1024)
        save_json(os.path.join(out, "meta.json"), {"tokenizer": tokenizer, "vocab_size": enc.n_vocab,
                                                   "dtype": np.dtype(id_dtype(enc.n_vocab)).name})

    cached_dir(folder, build, f"openwebtext: tokenised with {tokenizer}")
    stamps = os.path.join(cache_dir, "openwebtext", "checked")   # (~18 GB: read once, as --data_dir's files are;
    writable = os.access(os.path.dirname(folder), os.W_OK)       # a read-only cache is read at every start)
    return lm_bin_task("openwebtext", folder, block_size, ("train", "val"), stamps=stamps if writable else None)


@task("textfile")
def textfile(cache_dir="data", data_dir=None, block_size=256, tokenizer="gpt2", **_):
    """Any text: --data_dir FILE.txt, or a folder whose *.txt files are joined in name order. --tokenizer
    char numbers the distinct characters from 1 (nanoGPT's shakespeare_char); otherwise BPE ids."""
    usage = ("pass --data_dir FILE.txt (or a folder of .txt files) and --tokenizer char (characters), byte "
             "or gpt2 (the default) / another tiktoken encoding")
    if data_dir is None:
        raise DataError(f"textfile: no text given; {usage}")
    if os.path.isdir(data_dir):
        files = sorted(glob.glob(os.path.join(glob.escape(data_dir), "*.txt")))
        if not files:
            raise DataError(f"textfile: no .txt file in --data_dir {data_dir}; {usage}")
    elif file_problem(data_dir):
        raise DataError(f"textfile: --data_dir {data_dir} {file_problem(data_dir)}; {usage}")
    else:
        files = [data_dir]
    key = source_key(files)
    where = data_dir if len(files) == 1 else f"the {len(files)} .txt files of {data_dir}"
    sources = {"train": f"{where} (its first 90%, the train split)", "val": f"{where} (its last 10%, the val split)"}
    folder = os.path.join(cache_dir, "textfile", f"{key}-{tokenizer}")

    def build(out):
        enc = None if tokenizer == "char" else get_tokenizer(tokenizer, "textfile")
        text = "".join(read_text(p) for p in files)
        if not text:
            raise DataError(f"textfile: {where} holds no text")
        if enc is None:
            chars = "".join(sorted(set(text)))
            ids, vocab, meta = char_ids(text, chars, where), len(chars) + 1, {"tokenizer": "char", "chars": chars}
        else:
            vocab, meta = enc.n_vocab, {"tokenizer": tokenizer}
            write_bin(os.path.join(out, "all.bin"), text_chunks(text.splitlines(keepends=True)), enc)
            ids = np.fromfile(os.path.join(out, "all.bin"), dtype=id_dtype(vocab))
            os.remove(os.path.join(out, "all.bin"))
        cut = int(0.9 * len(ids))
        ids[:cut].tofile(os.path.join(out, "train.bin"))
        ids[cut:].tofile(os.path.join(out, "val.bin"))
        save_json(os.path.join(out, "meta.json"), {**meta, "vocab_size": vocab, "dtype": ids.dtype.name})

    cached_dir(folder, build, f"textfile: {len(files)} file(s) tokenised with {tokenizer}")
    return lm_bin_task("textfile", folder, block_size, ("train", "val"), sources)


if __name__ == "__main__":                                   # python -m tasks.lm --task ptb: prepare one task alone
    prepare_main("tasks.lm", check_tokenizer)
