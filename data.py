"""
Tasks for train.py: each task name maps to a loader that returns a Task, whose splits hand out batches.

    task = load_task("listops", cache_dir="data", data_dir=None, seed=0)
    x, y = task.split("train").sample(batch_size=32, rng=np.random.default_rng(0))
    for x, y in task.split("test").batches(batch_size=64): ...

Three kinds of task, matching the three model heads:
    cls   : one sequence -> class.    x (B, L) int64, 0 = padding;  y (B,)
    match : a pair -> class.          x (B, 2, L);                  y (B,)
    lm    : next token prediction.    x (B, L);                     y (B, L), the next tokens
Classification batches are padded only to their longest member, so short examples cost less.

The tasks of the three papers (python train.py --task NAME):

    task         kind   length  vocabulary (with pad 0)   classes  without --data_dir        | --data_dir holds
    listops      cls    2,000   16                        10       generated (LRA recipe)    | LRA basic_*.tsv
    pathfinder   cls    1,024   257: pixel + 1            2        generated (LRA, Linsley)  | LRA pathfinder32/
    image        cls    1,024   257: pixel + 1            10       HF uoft-cs/cifar10        | cifar-10-batches-py/
    text         cls    4,000   257: byte + 1             2        HF stanfordnlp/imdb       | aclImdb/
    retrieval    match  4,000   257: byte + 1             2        (none: LRA release only)  | new_aan_pairs.*.tsv
    imdb         cls    512     BPE id + 1 (gpt2: 50,258) 2        HF stanfordnlp/imdb       | aclImdb/
    agnews       cls    512     BPE id + 1 (gpt2: 50,258) 4        HF fancyzhx/ag_news       | train.csv, test.csv
    ptb          lm     35      10,001: words + 1         -        HF ptb_text_only          | ptb.*.txt
    wikitext103  lm     512     BPE id (gpt2: 50,257)     -        HF Salesforce/wikitext    | wiki.*.tokens
    openwebtext  lm     1,024   BPE id (gpt2: 50,257)     -        HF Skylion007/openwebtext | nanoGPT's *.bin
    textfile     lm     256     chars + 1, or BPE id      -        (none)                    | a .txt file

Token 0 is padding everywhere, so tokens that can be 0 are shifted: pixels and bytes become value + 1
(vocabulary 257), BPE ids become id + 1 in classification. Language-model streams are never padded and
keep the tokenizer's own ids (nanoGPT's uint16 .bin files), except the word/char vocabularies, which
count from 1. --tokenizer picks the BPE: gpt2 (tiktoken, the default), any tiktoken encoding, byte (a
tiktoken Encoding over the 256 byte values plus <|endoftext|>, built here: no download), char
(textfile only), or, for imdb and agnews, a Hugging Face BERT folder: BERT's WordPiece, [CLS] text [SEP]
in BERT's own ids ([PAD] = 0, no + 1). Everything derived is cached under --cache_dir (written atomically, reused, rebuilt when
any source file changes) and every split is one fixed, deterministic draw (independent of --seed, as
ListOps: every run of a task is evaluated on the same examples). Bad or missing data fails at once with a
DataError: one line naming the file (and line) or the task, what is wrong and what to do (docs/tasks.md).
"""

import contextlib
import csv
import glob
import hashlib
import itertools
import json
import math
import multiprocessing
import os
import pickle
import random
import re
import shutil
import stat
import struct
import threading
import urllib.error
import urllib.parse
import urllib.request
import zipfile
import zlib
from dataclasses import dataclass, field

import numpy as np
import torch


class DataError(Exception):
    """A problem with the user's data or flags: train.py prints its message as one line."""


TASKS = {}


def task(name):
    def register(fn):
        TASKS[name] = fn
        return fn
    return register


def load_task(name, cache_dir="data", **kw):
    """The Task `name`, its data found (and cached under cache_dir) but its splits not yet loaded: task.open()
    loads and checks them. What killed builds left in cache_dir is removed first."""
    if name not in TASKS:
        raise DataError(f"unknown task {name!r}; choose one of: {', '.join(TASKS)}")
    if os.path.exists(cache_dir) and not os.path.isdir(cache_dir):
        raise DataError(f"--cache_dir {cache_dir} is not a folder")
    remove_stale_temps(cache_dir)
    remove_stale_temps(os.path.join(cache_dir, name), recursive=True)
    return TASKS[name](cache_dir=cache_dir, **kw)


# ----------------------------------------------------------------------------------------------
# Splits and tasks

class ClassificationSplit:
    """N examples: tokens (N, L) or (N, 2, L) for pairs, padded with 0; lengths (N,); labels (N,).

    Large splits keep their tokens compact (uint8 bytes or pixels, often a read-only np.memmap) and
    shift them only when a batch is made: with offset=1 a stored value v becomes token v + 1 and every
    position past the example's length (doc_lengths, (N,) or (N, 2)) becomes padding 0."""

    def __init__(self, tokens, labels, lengths=None, offset=0):
        self.tokens, self.labels, self.offset = tokens, np.asarray(labels, dtype=np.int64), offset
        if lengths is None:
            if offset:
                raise ValueError("a shifted split needs the lengths of its examples")
            lengths = (tokens != 0).sum(-1)
        self.doc_lengths = np.asarray(lengths)
        self.lengths = self.doc_lengths.reshape(len(self.labels), -1).max(-1)  # the longer of a pair

    def __len__(self):
        return len(self.labels)

    def subset(self, n):
        return ClassificationSplit(self.tokens[:n], self.labels[:n], self.doc_lengths[:n], self.offset)

    def truncate(self, length):
        """The same examples cut to their first `length` tokens."""
        if length >= self.tokens.shape[-1]:
            return self
        return ClassificationSplit(self.tokens[..., :length], self.labels, np.minimum(self.doc_lengths, length),
                                   self.offset)

    def _batch(self, idx):
        L = max(int(self.lengths[idx].max()), 1)             # pad only to the longest in the batch
        x = self.tokens[idx][..., :L].astype(np.int64)
        if self.offset:                                      # stored values -> token ids, 0 past the end
            x += self.offset
            x[np.arange(L) >= self.doc_lengths[idx][..., None]] = 0
        return torch.from_numpy(x), torch.from_numpy(self.labels[idx])

    def sample(self, batch_size, rng):
        return self._batch(rng.integers(0, len(self), batch_size))

    def batches(self, batch_size):
        """Every example once, in batches of similar lengths (less padding)."""
        order = np.argsort(self.lengths, kind="stable")
        for i in range(0, len(order), batch_size):
            yield self._batch(order[i:i + batch_size])

    def tokens_in(self, x):
        return int((x != 0).sum())


class ShardedSplit:
    """A classification split stored as equal shards that are made (generated, then cached) only when first
    needed: subset(n) makes just the shards that hold the first n examples, so a short run (train.py
    --n_train) does not wait for all of them; anything else makes every shard."""

    def __init__(self, n_shards, shard_size, make, offset=0):
        self.n_shards, self.shard_size, self.make, self.offset = n_shards, shard_size, make, offset
        self._all = None

    def __len__(self):
        return self.n_shards * self.shard_size

    def _split(self, k):                                     # the first k shards
        tokens, labels = self.make(k)
        return ClassificationSplit(tokens, labels, np.full(len(labels), tokens.shape[-1]), self.offset)

    def subset(self, n):
        return self._split(min(self.n_shards, -(-n // self.shard_size))).subset(n)

    def full(self):
        if self._all is None:
            self._all = self._split(self.n_shards)
        return self._all

    def __getattr__(self, name):                             # sample, batches, tokens_in, labels, ...
        if name.startswith("_") or name in ("n_shards", "shard_size", "make", "offset"):
            raise AttributeError(name)
        return getattr(self.full(), name)


class LMSplit:
    """One long stream of token ids; an example is a window of block_size tokens and the next ones.
    The stream may be a read-only np.memmap of a .bin file (nanoGPT's format): nothing is loaded.
    `source` names where the stream comes from, for the error when it is too short for one window."""

    def __init__(self, stream, block_size, source="a language-model split"):
        self.stream, self.block_size, self.source = stream, block_size, source
        if len(stream) <= block_size:
            raise DataError(f"{source} gives {len(stream):,} tokens, too few for one window of block_size + 1 = "
                            f"{block_size + 1:,}: use a smaller --block_size or more text")

    def __len__(self):                                       # non-overlapping windows
        return (len(self.stream) - 1) // self.block_size

    def subset(self, n):
        if n <= self.block_size:
            raise DataError(f"--n_train {n} is too few tokens for one window of block_size + 1 = {self.block_size + 1}")
        return LMSplit(self.stream[:n], self.block_size, self.source)

    def _windows(self, starts):
        w = np.stack([self.stream[s:s + self.block_size + 1] for s in starts]).astype(np.int64)
        w = torch.from_numpy(w)
        return w[:, :-1], w[:, 1:]

    def sample(self, batch_size, rng):
        return self._windows(rng.integers(0, len(self.stream) - self.block_size, batch_size))

    def batches(self, batch_size):
        """Every token of the split predicted once, in consecutive windows."""
        starts = np.arange(len(self)) * self.block_size
        for i in range(0, len(starts), batch_size):
            yield self._windows(starts[i:i + batch_size])

    def tokens_in(self, x):
        return x.numel()


@dataclass
class Task:
    name: str
    kind: str                # "cls" | "match" | "lm"
    vocab_size: int          # including the padding id 0
    block_size: int          # the longest input sequence the model sees
    n_classes: int = 0       # 0 for lm
    loaders: dict = field(default_factory=dict, repr=False)  # split name -> function that loads it
    missing: dict = field(default_factory=dict, repr=False)  # split name -> why the data has no such split
    sources: dict = field(default_factory=dict, repr=False)  # split name -> the file it is read from (messages)
    _splits: dict = field(default_factory=dict, repr=False)

    def split(self, name):
        if name not in self._splits:
            if name in self.missing:
                raise DataError(self.missing[name])
            if name not in self.loaders:
                raise DataError(f"task {self.name} has no {name} split")
            source = self.sources.get(name, f"the {name} split of {self.name}")
            with reading(source, formats=False):
                self._splits[name] = self.check(name, self.loaders[name](), source)
        return self._splits[name]

    def has(self, name):
        return name in self.loaders

    def check(self, name, split, source):
        """A loaded classification split, checked: it has examples, and labels below n_classes. (Token ids are
        in range by construction; language-model splits check their windows; generated splits need nothing.)"""
        if isinstance(split, ClassificationSplit):
            if not len(split):
                raise DataError(f"{source} gives no examples for the {name} split of {self.name}")
            check_labels(split.labels, self.n_classes, f"{source} ({name} split)")
        return split

    def open(self, training=True):
        """Load and check, before any work, every split a run uses, so that a missing or bad file fails now
        rather than after training. Training uses every split the task has (one the data lacks is an error);
        an evaluation (training=False) uses the val and test splits the data has: a missing one is skipped, and
        said so. Returns the names of the splits to evaluate."""
        names = [s for s in ("train", "val", "test") if self.has(s) or s in self.missing]
        if not training:
            names = [s for s in names if s != "train"]
            for s in names:
                if s in self.missing:
                    print(f"{self.missing[s]}: evaluating without a {s} split", flush=True)
            names = [s for s in names if self.has(s)]
            if not names:
                raise DataError(f"{self.name}: no val or test split to evaluate ({'; '.join(self.missing.values())})")
        for s in names:
            self.split(s)
        return [s for s in names if s != "train"]


# ----------------------------------------------------------------------------------------------
# Files: finding a release's files, reading them (every failure one line naming the file), caching what is
# derived from them under a name that changes with them, and cleaning up after killed processes.

def one_line(e, limit=300):
    """An exception as one short line."""
    text = " ".join(str(e).split()) or type(e).__name__
    return text if len(text) <= limit else text[:limit - 3] + "..."


def file_problem(path, folder=False):
    """Why `path` is not a readable regular file (folder=True: a readable folder), or None if it is."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return "is a broken symbolic link" if os.path.islink(path) else "does not exist"
    except OSError as e:
        return f"cannot be read ({e.strerror or e})"
    if folder:
        if not stat.S_ISDIR(st.st_mode):
            return "is not a folder"
        return None if os.access(path, os.R_OK | os.X_OK) else "cannot be read (permission denied)"
    if stat.S_ISDIR(st.st_mode):
        return "is a folder, not a file"
    if not stat.S_ISREG(st.st_mode):
        return "is not a regular file (a pipe, socket or device)"
    return None if os.access(path, os.R_OK) else "cannot be read (permission denied)"


def release(task_name, data_dir, layout, names, subdirs=(), optional=()):
    """The one way a task finds its files under --data_dir: (folder, {name: path}). The folder is data_dir
    itself or the first of `subdirs` under it (a release's top folder, or folders that hold it) that holds
    any of `names` or `optional`. Each of `names` must be there, a file (a folder when the name ends in "/");
    an optional one may be absent (path None) but, when there, must be of its kind too. Otherwise a DataError
    that says what is wrong and shows the layout that works."""
    problem = file_problem(data_dir, folder=True)
    if problem:
        why = "" if problem == "is not a folder" else f" (it {problem})"
        raise DataError(f"{task_name}: --data_dir {data_dir} is not a folder{why}; {layout}")
    wanted = [*names, *optional]
    places = [os.path.normpath(os.path.join(data_dir, sub)) for sub in ("", *subdirs)]
    folder = next((p for p in places if any(os.path.lexists(os.path.join(p, n.rstrip("/"))) for n in wanted)), None)
    if folder is None:
        looked = ", ".join(os.path.join(sub, "") for sub in subdirs)
        raise DataError(f"{task_name}: --data_dir {data_dir} holds no {' or '.join(n.rstrip('/') for n in wanted)}"
                        f"{f' (also looked in {looked})' if subdirs else ''}; {layout}")
    paths = {}
    for n in wanted:
        path = os.path.join(folder, n.rstrip("/"))
        problem = file_problem(path, folder=n.endswith("/"))
        if problem == "does not exist":
            if n in optional:
                path = None
            else:
                raise DataError(f"{task_name}: no {n.rstrip('/')} in {folder}; {layout}")
        elif problem:
            raise DataError(f"{task_name}: {path} {problem}; {layout}")
        paths[n] = path
    return folder, paths


# what a reader of a file in a foreign, truncated or damaged format may raise (PIL, numpy, pickle, csv, zip)
FORMAT_ERRORS = (EOFError, ValueError, SyntaxError, KeyError, IndexError, TypeError, OverflowError,
                 pickle.UnpicklingError, csv.Error, struct.error, zlib.error, zipfile.BadZipFile)


@contextlib.contextmanager
def reading(path, what="cannot be read", hint="", formats=True):
    """Turn what reading `path` raises (an OS error, text that is not UTF-8 and, with formats=True, a file
    that is truncated or of another format) into one DataError line that names it."""
    try:
        yield
    except DataError:
        raise
    except UnicodeDecodeError:                               # which line: the first that does not decode
        lineno = "?"
        with contextlib.suppress(OSError), open(path, "rb") as f:        # "ignore" drops what does not decode
            lineno = next((i for i, b in enumerate(f, 1) if len(b.decode("utf-8", "ignore").encode()) < len(b)), "?")
        raise DataError(f"{path}, line {lineno}: not UTF-8 text; convert the file to UTF-8 (e.g. iconv -f latin1 -t "
                        "utf-8)") from None
    except OSError as e:
        raise DataError(f"{e.filename or path}: {what} ({e.strerror or one_line(e, 120)}){hint}") from None
    except FORMAT_ERRORS as e:
        if not formats:
            raise
        raise DataError(f"{path}: {what} ({type(e).__name__}: {one_line(e, 150)}){hint}") from None


def read_text(path):
    """The text of a UTF-8 file (newlines read as Python's text mode does)."""
    with reading(path), open(path, encoding="utf-8") as f:
        return f.read()


def read_lines(path):
    """The lines of a UTF-8 text file, one at a time."""
    with reading(path), open(path, encoding="utf-8") as f:
        yield from f


def source_key(paths, what=""):
    """A short name for a set of local files, from the path, size and modification time of each: editing or
    replacing any of them gives a new name, so the cache derived from them is rebuilt. A path that is not a
    readable regular file is a DataError (`what` says where it was listed)."""
    h = hashlib.sha1()
    for p in sorted(paths):
        try:
            st = os.stat(p)
        except OSError:
            st = None
        if st is None or not stat.S_ISREG(st.st_mode):
            raise DataError(f"{p} {file_problem(p)}{what}")
        h.update(f"{os.path.realpath(p)}|{st.st_size}|{st.st_mtime_ns}\n".encode())
    return "local-" + h.hexdigest()[:10]


def temp_path(path):
    """The name under which this process writes `path` before renaming it into place: path.tmp<pid>."""
    return f"{path}.tmp{os.getpid()}"


def pid_alive(pid):
    if os.name == "nt":                                      # never guess there: keep everything
        return True
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:                                          # EPERM: another user's live process
        return True
    return True


def remove_stale_temps(folder, recursive=False):
    """Remove what killed processes left in `folder` (and below it): files and folders NAME.tmp<pid> whose
    process is gone (a build or a checkpoint write cut short). Those of a live process, a concurrent build on
    this machine, are kept."""
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return
    for e in entries:
        m = re.search(r"\.tmp(\d*)$", e.name)
        if m and not pid_alive(int(m.group(1) or 0)):
            with contextlib.suppress(OSError):
                shutil.rmtree(e.path) if e.is_dir(follow_symlinks=False) else os.remove(e.path)
        elif recursive and e.is_dir(follow_symlinks=False):
            remove_stale_temps(e.path, recursive)


def atomic_write(path, write, mode="wb"):
    """Write `path` whole or not at all: write(f) fills path.tmp<pid>, which then replaces `path`. On any
    error (a full disk: ENOSPC) the earlier file stays as it was, the temporary file is removed, and a
    DataError names the path and the error."""
    tmp = temp_path(path)
    try:
        with open(tmp, mode) as f:
            write(f)
        os.replace(tmp, path)
    except OSError as e:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise DataError(f"cannot write {path}: {e.strerror or e}; {path} is left as it was") from None


def atomic_write_text(path, text):
    atomic_write(path, lambda f: f.write(text), mode="w")


def save_json(path, obj):
    atomic_write_text(path, json.dumps(obj, indent=1) + "\n")


def load_json(path):
    with reading(path, "is damaged", f"; delete {os.path.dirname(path)} to rebuild it"), open(path) as f:
        return json.load(f)


def cached_dir(folder, build, what):
    """`folder`, built once by build(tmp) into a temporary folder that is then renamed into place (atomic:
    an interrupted build leaves no half-written cache, and what a killed one leaves is removed by the next
    load_task). Concurrent builders: the first rename wins. Nothing is printed before the build has its data,
    so that a missing source is reported by its one-line error."""
    if os.path.isdir(folder):
        return folder
    os.makedirs(os.path.dirname(folder) or ".", exist_ok=True)
    tmp = temp_path(folder)
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    try:
        build(tmp)
        os.replace(tmp, folder)
    except OSError:
        if not os.path.isdir(folder):
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"{what}: cached in {folder}", flush=True)
    return folder


# ----------------------------------------------------------------------------------------------
# Where data comes from besides --data_dir: Hugging Face and tiktoken, through their public settings only

_REACHABLE = {}


def reachable(url, timeout=3.0):
    """Whether `url` answers at all within `timeout` seconds (any HTTP status counts). Asked once per host,
    in a thread, so that neither DNS nor a silent firewall can hang the caller."""
    host = urllib.parse.urlsplit(url).netloc
    if host not in _REACHABLE:
        answer = []

        def probe():
            try:
                urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=timeout).close()
                answer.append(True)
            except urllib.error.HTTPError:                   # the server answered
                answer.append(True)
            except Exception:
                answer.append(False)

        t = threading.Thread(target=probe, daemon=True)
        t.start()
        t.join(timeout + 1)
        _REACHABLE[host] = bool(answer and answer[0])
    return _REACHABLE[host]


def _truthy(name):
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def hf_dataset(path, config=None, parquet_dir=None):
    """datasets.load_dataset(path, config): a DatasetDict. Without network (no answer from the Hub within
    seconds, or HF_HUB_OFFLINE=1) only the local Hugging Face cache is read, so this fails fast: the libraries'
    own offline switches, HF_HUB_OFFLINE and HF_DATASETS_OFFLINE, are set before `datasets` is imported (they
    are read then; a process that imported it earlier keeps its setting). Datasets that still carry a loading
    script (unsupported since datasets 4) are read from the Hub's parquet conversion (revision
    refs/convert/parquet, folder parquet_dir). The tests replace this function."""
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    online = not (_truthy("HF_HUB_OFFLINE") or _truthy("HF_DATASETS_OFFLINE")) and reachable(endpoint)
    if not online:
        os.environ["HF_HUB_OFFLINE"] = os.environ["HF_DATASETS_OFFLINE"] = "1"
    try:
        import datasets
    except ImportError:
        raise DataError("the datasets package is not installed (pip install datasets)") from None
    try:
        return datasets.load_dataset(path, config)
    except Exception as e:
        if not (online and parquet_dir and "script" in str(e).lower()):
            raise DataError(one_line(e, 200) if online else "no network and not in the Hugging Face cache") from None
    try:
        return datasets.load_dataset(path, revision="refs/convert/parquet", data_dir=parquet_dir)
    except Exception as e:
        raise DataError(one_line(e, 200)) from None


def load_hf(task_name, layout, path, config=None, parquet_dir=None):
    """hf_dataset(...) with failures turned into the task's one-line DataError."""
    name = path + (f" ({config})" if config else "")
    try:
        return hf_dataset(path, config, parquet_dir)
    except DataError as e:
        raise DataError(f"{task_name}: tried Hugging Face dataset {name}: {e}; instead pass --data_dir {layout}") from None


def hf_rows(ds, columns, batch_size=1000):
    """The columns of a Hugging Face dataset split, batch after batch, as lists."""
    missing = [c for c in columns if c not in ds.column_names]
    if missing:
        raise DataError(f"the Hugging Face dataset has no column {missing[0]!r} (it has {', '.join(ds.column_names)})")
    for batch in ds.select_columns(columns).iter(batch_size=batch_size):
        yield [batch[c] for c in columns]


def hf_columns(ds, columns):
    out = [[] for _ in columns]
    for batch in hf_rows(ds, columns):
        for o, b in zip(out, batch):
            o += b
    return out


def hf_split(dd, names, task_name):
    for name in names:
        if name in dd:
            return dd[name]
    raise DataError(f"{task_name}: the Hugging Face dataset has no {names[0]} split (it has {', '.join(dd)})")


# Tokenizers. gpt2's pre-tokenisation regex (tiktoken's), so that "byte" splits text as gpt2 does.
GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
TIKTOKEN_URL = "https://openaipublic.blob.core.windows.net"


def byte_encoding():
    """A byte-level tiktoken Encoding, built here (no download): ids 0-255 are the bytes, 256 <|endoftext|>."""
    import tiktoken
    return tiktoken.Encoding(name="byte", pat_str=GPT2_PATTERN,
                             mergeable_ranks={bytes([i]): i for i in range(256)},
                             special_tokens={"<|endoftext|>": 256})


def check_tokenizer(name, task_name):
    """A DataError unless --tokenizer NAME exists for the task (nothing is loaded): byte, char (textfile only)
    or a tiktoken encoding."""
    if name == "char" and task_name == "textfile" or name == "byte":
        return
    if os.path.isdir(name):                                  # a BERT folder: checked when its WordPiece loads
        if task_name not in WORDPIECE_TASKS:
            raise DataError(f"{task_name}: --tokenizer {name} is a folder (a BERT WordPiece); only "
                            f"{', '.join(WORDPIECE_TASKS)} take one")
        return
    try:
        import tiktoken
    except ImportError:
        raise DataError(f"{task_name}: --tokenizer {name} needs tiktoken (pip install tiktoken)") from None
    names = tiktoken.list_encoding_names()
    if name not in names:
        raise DataError(f"{task_name}: unknown --tokenizer {name!r}; choose byte, char (--task textfile only) or a "
                        f"tiktoken encoding ({', '.join(names)})")


def get_tokenizer(name, task_name):
    """--tokenizer NAME as a tiktoken Encoding: byte, or a tiktoken encoding (gpt2, cl100k_base, ...), whose
    files tiktoken reads from its cache (TIKTOKEN_CACHE_DIR) or downloads once. tiktoken's download has no
    time limit, so it runs in a thread that is given up when the network does not answer."""
    check_tokenizer(name, task_name)
    if name == "byte":
        return byte_encoding()
    import tiktoken
    got = []

    def load():
        try:
            got.append(tiktoken.get_encoding(name))
        except Exception as e:
            got.append(e)
    t = threading.Thread(target=load, daemon=True)
    t.start()
    t.join(10)                                               # a cached encoding loads in about a second
    if t.is_alive() and reachable(TIKTOKEN_URL):             # a slow download: wait for it
        t.join()
    if got and not isinstance(got[0], Exception):
        return got[0]
    why = (f"it is not cached here and there is no network" if not reachable(TIKTOKEN_URL)
           else one_line(got[0], 200) if got else "the download does not finish")
    raise DataError(f"{task_name}: cannot load the {name} tokenizer ({why}; tiktoken downloads it once from "
                    f"{TIKTOKEN_URL} into TIKTOKEN_CACHE_DIR); use --tokenizer byte to work offline")


def id_dtype(n):
    """The smallest unsigned type for ids below n."""
    return np.uint8 if n <= 256 else np.uint16 if n <= 65536 else np.uint32


def encode_batch(enc, texts):
    return enc.encode_ordinary_batch(list(texts), num_threads=max(1, min(8, os.cpu_count() or 1)))


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


def check_labels(labels, n_classes, source):
    """Labels as uint8, or a DataError naming the source if one is not an integer in 0..n_classes-1."""
    y = np.asarray(labels)
    bad = np.flatnonzero((y < 0) | (y >= n_classes) | (y != np.round(y))) if y.dtype.kind in "iuf" else [0]
    if len(y) and len(bad):
        raise DataError(f"{source}: label {y[bad[0]].tolist()!r} of example {bad[0]} is not an integer "
                        f"0-{n_classes - 1}")
    return y.astype(np.uint8)


def save_arrays(folder, split, **arrays):
    for name, a in arrays.items():
        np.save(os.path.join(folder, f"{split}.{name}.npy"), a)


def cls_task(name, kind, folder, vocab_size, block_size, n_classes, offset, splits):
    """A classification Task over a cached folder; splits maps split name -> stored split name. Splits stored
    once are loaded once: where val is the test split, task.split("val") is task.split("test")."""
    loaded = {}

    def load(stored):                                        # tokens memory-mapped, cut to block_size
        if stored not in loaded:
            with reading(os.path.join(folder, f"{stored}.*.npy"), "is damaged", f"; delete {folder} to rebuild it"):
                tokens, labels, lengths = (np.load(os.path.join(folder, f"{stored}.{a}.npy"), mmap_mode=mode)
                                           for a, mode in (("tokens", "r"), ("labels", None), ("lengths", None)))
            loaded[stored] = ClassificationSplit(tokens, labels, lengths, offset).truncate(block_size)
        return loaded[stored]

    return Task(name, kind, vocab_size, block_size, n_classes, {s: (lambda f=f: load(f)) for s, f in splits.items()},
                sources={s: os.path.join(folder, f"{f}.*.npy") for s, f in splits.items()})



# ----------------------------------------------------------------------------------------------
# ListOps (Nangia & Bowman 2018), generated exactly by the Long Range Arena recipe
# (google-research/long-range-arena, lra_benchmarks/data/listops.py):
#   a tree grows from depth 1; below depth 10 a node is a leaf (a digit 0-9) with probability 0.75, at depth
#   10 always; otherwise it is an operator MIN, MAX, MED (median, rounded down) or SM (sum mod 10) with
#   2-10 children. Length counts tokens without parentheses; 500 < length < 2000 is kept; the trees are
#   distinct; 96,000 / 2,000 / 2,000 for train / val / test. MAX(2, 9) is written ( ( ( [MAX 2 ) 9 ) ] ).
# The depth, the argument range, the length window and the split sizes are options of the task
# (train.py --listops_depth, --listops_args, --listops_len, --listops_sizes); the LRA values are the default.

LISTOPS_OPS = ("[MIN", "[MAX", "[MED", "[SM")
LISTOPS_VOCAB = ("<pad>", "0", "1", "2", "3", "4", "5", "6", "7", "8", "9", *LISTOPS_OPS, "]")
LISTOPS_SIZES = {"train": 96_000, "val": 2_000, "test": 2_000}
LISTOPS_DEPTH = 10              # nodes at this depth are leaves: operators sit at depths 1 .. 9
LISTOPS_ARGS = (2, 10)          # arguments of an operator, both ends included
LISTOPS_LEN = (500, 2000)       # a tree is kept when MIN < length < MAX (tokens without parentheses)
LISTOPS_OP_P = 0.25             # below the depth limit a node is an operator with this probability
LISTOPS_FIRST_OP = LISTOPS_VOCAB.index(LISTOPS_OPS[0])   # token ids: digit v is v + 1, operators 11-14, "]" 15
LISTOPS_END = LISTOPS_VOCAB.index("]")


@dataclass(frozen=True)
class ListOpsSetting:
    """The generator's parameters. The default is the LRA setting (cached as cache_dir/listops)."""
    depth: int = LISTOPS_DEPTH
    args: tuple = LISTOPS_ARGS
    lengths: tuple = LISTOPS_LEN
    sizes: tuple = tuple(LISTOPS_SIZES.values())

    def is_lra(self):
        return self == ListOpsSetting()

    def folder_name(self):
        """The cache folder: "listops" for LRA, otherwise a name that spells out every parameter."""
        if self.is_lra():
            return "listops"
        return (f"listops-depth{self.depth}-args{self.args[0]}-{self.args[1]}-len{self.lengths[0]}-{self.lengths[1]}"
                f"-n{self.sizes[0]}-{self.sizes[1]}-{self.sizes[2]}")

    def describe(self):
        return (f"depth {self.depth}, {self.args[0]}-{self.args[1]} arguments, {self.lengths[0]} < length < "
                f"{self.lengths[1]}, {'/'.join(map(str, self.sizes))} trees")

    def longest(self):
        """The longest tree this depth and argument range can grow (an operator root)."""
        n = 1                                                # a node at the depth limit is a leaf
        for _ in range(self.depth - 1):
            n = 2 + self.args[1] * n
        return n


def _int_list(value, n, flag, example):
    if isinstance(value, str):
        parts = value.replace(" ", "").split(",")
    else:
        parts = list(value) if isinstance(value, (tuple, list)) else [value]
    try:
        out = tuple(int(p) for p in parts)
    except (TypeError, ValueError):
        out = ()
    if len(out) != n:
        raise DataError(f"listops: --{flag} expects {example}, not {value!r}")
    return out


def listops_setting(listops_depth=LISTOPS_DEPTH, listops_args=LISTOPS_ARGS, listops_len=LISTOPS_LEN,
                    listops_sizes=tuple(LISTOPS_SIZES.values())):
    """Checks and normalises the task's options (ints, "MIN,MAX" strings or tuples) into a ListOpsSetting.
    Impossible settings fail here, in one line, before anything is generated."""
    (depth,) = _int_list(listops_depth, 1, "listops_depth", "one integer, e.g. 10")
    args = _int_list(listops_args, 2, "listops_args", "MIN,MAX arguments per operator, e.g. 2,10")
    lengths = _int_list(listops_len, 2, "listops_len", "MIN,MAX tree lengths, e.g. 500,2000")
    sizes = _int_list(listops_sizes, 3, "listops_sizes", "TRAIN,VAL,TEST numbers of trees, e.g. 96000,2000,2000")
    if not 2 <= depth <= 100:
        raise DataError(f"listops: --listops_depth {depth} must be 2 to 100 (the root is depth 1; operators sit "
                        "above the depth limit, so depth 2 gives one operator over digits)")
    if not 1 <= args[0] <= args[1]:
        raise DataError(f"listops: --listops_args {args[0]},{args[1]} must be MIN,MAX with 1 <= MIN <= MAX (LRA: 2,10)")
    if not 0 <= lengths[0] < lengths[1]:
        raise DataError(f"listops: --listops_len {lengths[0]},{lengths[1]} must be MIN,MAX with 0 <= MIN < MAX; trees "
                        "with MIN < length < MAX are kept (LRA: 500,2000)")
    if min(sizes) < 1:
        raise DataError(f"listops: --listops_sizes {','.join(map(str, sizes))} must be three positive numbers "
                        "TRAIN,VAL,TEST")
    setting = ListOpsSetting(depth, args, lengths, sizes)
    lo, hi = max(lengths[0] + 1, 2 + args[0]), min(lengths[1] - 1, setting.longest())
    if lo > hi:
        raise DataError(f"listops: no tree has {lengths[0]} < length < {lengths[1]} with --listops_depth {depth} and "
                        f"--listops_args {args[0]},{args[1]} (lengths {2 + args[0]} to {setting.longest()} are "
                        "possible): change --listops_len")
    return setting


class _TooLong(Exception):
    pass


def listops_operator(depth, rnd, budget, max_depth=LISTOPS_DEPTH, args=LISTOPS_ARGS):
    """Draw an operator node at `depth` and its subtree: (LRA string, value, length without parentheses).
    Raises _TooLong as soon as the tree reaches `budget` tokens (it would be rejected anyway)."""
    k = args[0] + int(rnd() * (args[1] - args[0] + 1))      # args[0] .. args[1] children (LRA: 2..10)
    parts, values, length = [], [], 2                        # the operator token and "]"
    for _ in range(k):
        if depth + 1 < max_depth and rnd() <= LISTOPS_OP_P:  # an operator child (at the limit: always a leaf)
            s, v, n = listops_operator(depth + 1, rnd, budget - length, max_depth, args)
            length += n
            if length >= budget:
                raise _TooLong
        else:                                                # a leaf child
            v = int(rnd() * 10)
            s, length = str(v), length + 1
        parts.append(s)
        values.append(v)
    op = int(rnd() * 4)
    if op == 0:
        value = min(values)
    elif op == 1:
        value = max(values)
    elif op == 2:                                            # numpy.median, truncated to int
        values.sort()
        value = (values[(k - 1) // 2] + values[k // 2]) // 2
    else:
        value = sum(values) % 10
    # left-nested pairs: ( ( ( [OP a ) b ) ] )
    return "( " * (k + 1) + LISTOPS_OPS[op] + " " + " ) ".join(parts) + " ) ] )", value, length


LISTOPS_STALE_DRAWS = 200_000   # a chunk stops after this many draws in a row without a new tree


def listops_chunk(args):
    """`count` distinct ListOps examples drawn with their own seed, so chunks can run in parallel (fewer
    when LISTOPS_STALE_DRAWS draws in a row bring no new tree: the setting has too few).
    args = (seed, count, min_len, max_len[, max_depth, (min_args, max_args)])."""
    seed, count, min_len, max_len, *rest = args
    max_depth, n_args = rest if rest else (LISTOPS_DEPTH, LISTOPS_ARGS)
    rnd = random.Random(f"listops-{seed[0]}-{seed[1]}").random
    out, stale = {}, 0
    while len(out) < count and stale < LISTOPS_STALE_DRAWS:  # a setting with fewer trees than count: give up
        stale += 1
        if rnd() > LISTOPS_OP_P:                             # the root is a leaf: length 1, rejected
            rnd()
            continue
        try:
            s, value, n = listops_operator(1, rnd, max_len, max_depth, n_args)
        except _TooLong:
            continue
        if min_len < n < max_len and s not in out:
            out[s] = value
            stale = 0
    return list(out.items())


def generate_listops(n, seed=0, min_len=500, max_len=2000, chunk=1000, depth=LISTOPS_DEPTH, args=LISTOPS_ARGS,
                     processes=None, progress=True):
    """n distinct (string, label) examples, the same for a seed whatever the number of processes: chunk i is
    drawn from its own seed (seed, i), and chunks are merged in order. Progress is shown over chunks."""
    from tqdm import tqdm
    processes = min(os.cpu_count() or 1, 8) if processes is None else processes
    per_round = n // chunk + 2                               # a little spare for duplicates
    seen, start = {}, 0
    with contextlib.ExitStack() as stack:
        if processes > 1 and n > chunk:                      # one chunk holds n distinct trees: no pool needed
            pool = stack.enter_context(multiprocessing.get_context("spawn").Pool(min(processes, per_round)))
            imap = pool.imap                                 # in order: deterministic
        else:
            imap = map
        bar = stack.enter_context(tqdm(total=-(-n // chunk), unit="chunk", desc="ListOps", disable=not progress,
                                       leave=False))
        while len(seen) < n:
            before = len(seen)
            jobs = [((seed, i), chunk, min_len, max_len, depth, tuple(args)) for i in range(start, start + per_round)]
            for examples in imap(listops_chunk, jobs):
                for s, value in examples:
                    seen.setdefault(s, value)
                bar.update(1)
                if len(seen) >= n:
                    break
            if len(seen) == before:                          # a whole round found nothing new: the space is used up
                raise DataError(f"listops: only {len(seen)} distinct trees found, fewer than the {n} asked; widen "
                                "--listops_len or --listops_args, raise --listops_depth, or lower --listops_sizes")
            start += per_round
    return list(seen.items())[:n]


def listops_probe(setting, draws=20_000, seed=12345):
    """Draw `draws` roots with `setting`: (kept, distinct kept, about how many distinct trees the setting
    has). A quick check, before generating, that the length window is reached and that there are enough
    distinct trees. The last is the birthday estimate kept^2 / (2 * repeats), infinite without repeats."""
    rnd = random.Random(f"listops-probe-{seed}").random
    kept, distinct = 0, set()
    for _ in range(draws):
        if rnd() > LISTOPS_OP_P:
            rnd()
            continue
        try:
            s, _, n = listops_operator(1, rnd, setting.lengths[1], setting.depth, setting.args)
        except _TooLong:
            continue
        if setting.lengths[0] < n < setting.lengths[1]:
            kept += 1
            distinct.add(s)
    repeats = kept - len(distinct)
    return kept, len(distinct), kept * kept / (2 * repeats) if repeats else math.inf


_LISTOPS_CHARS = {"[MIN": "\x01", "[MAX": "\x02", "[MED": "\x03", "[SM": "\x04"}  # one character each
_LISTOPS_BYTES = tuple((op.encode(), ch.encode()) for op, ch in _LISTOPS_CHARS.items())
_LISTOPS_LUT = np.full(256, 255, dtype=np.uint8)
for _i, _tok in enumerate(LISTOPS_VOCAB[1:], start=1):
    _LISTOPS_LUT[ord(_LISTOPS_CHARS.get(_tok, _tok))] = _i


def listops_tokens(text):
    """LRA ListOps string (str or bytes) -> token ids (uint8). Drops "(" and ")" but keeps "]" as its own
    token. (LRA's official tokenizer dropped every bracket, "]" too, so the tree could not be read back: a
    known bug, LRA issues #6 and #14.) Raises ValueError on a symbol outside the 15 of ListOps."""
    raw = text.encode() if isinstance(text, str) else bytes(text)
    short = raw
    for op, ch in _LISTOPS_BYTES:
        short = short.replace(op, ch)
    toks = short.replace(b"(", b" ").replace(b")", b" ").split()
    chars = b"".join(toks)
    ids = _LISTOPS_LUT[np.frombuffer(chars, dtype=np.uint8)]
    if len(chars) != len(toks) or (ids == 255).any():       # a token longer than one symbol, or unknown
        bad = next(t for t in raw.replace(b"(", b" ").replace(b")", b" ").split()
                   if t.decode(errors="replace") not in LISTOPS_VOCAB[1:])
        raise ValueError(f"unknown symbol {bad.decode(errors='replace')!r}")
    return ids


def listops_check_tree(ids):
    """Raises ValueError unless the token ids are one whole tree: a digit, or an operator, its arguments
    (at least one) and its "]", every operator closed and nothing after the root's "]"."""
    ids = np.asarray(ids)
    if len(ids) == 1 and ids[0] < LISTOPS_FIRST_OP:
        return
    is_op = (ids >= LISTOPS_FIRST_OP) & (ids < LISTOPS_END)
    if not is_op[0]:
        raise ValueError("the tree does not start with an operator")
    depth = np.cumsum(is_op.astype(np.int32) - (ids == LISTOPS_END))
    if depth[-1] > 0:
        raise ValueError(f"the tree is cut short: {depth[-1]} operator(s) not closed by ']'")
    if (depth[:-1] <= 0).any():
        raise ValueError("tokens after the root's closing ']'")
    if (is_op[:-1] & (ids[1:] == LISTOPS_END)).any():
        raise ValueError("an operator without arguments")


def read_listops_arrays(path, fix="fix or remove that line", progress=False):
    """LRA's basic_*.tsv: a header "Source<TAB>Target", then one tree and its value per line. Returns
    tokens (N, longest) uint8 padded with 0, lengths (N,) int32, labels (N,) int64. Any problem with the
    file is a DataError that names the file (and the line) and ends with `fix`, what to do about it."""
    from tqdm import tqdm
    if os.path.isdir(path):
        raise DataError(f"{path} is a folder where the ListOps file should be; {fix}")
    rows, labels = [], []
    try:
        with open(path, "rb") as f, tqdm(total=os.path.getsize(path), unit="B", unit_scale=True, leave=False,
                                         desc=f"reading {os.path.basename(path)}", disable=not progress) as bar:
            lineno = 0
            for lineno, line in enumerate(f, 1):
                bar.update(len(line))
                if lineno == 1 and line.startswith(b"Source"):
                    continue
                if not line.strip():
                    continue
                try:
                    try:
                        line.decode("utf-8")
                    except UnicodeDecodeError as e:
                        raise ValueError(f"byte 0x{line[e.start]:02x} at column {e.start + 1} is not UTF-8 text") from None
                    parts = line.rstrip(b"\r\n").split(b"\t")
                    if len(parts) != 2:
                        raise ValueError(f"expected 2 tab-separated fields, found {len(parts)}")
                    try:
                        label = int(parts[1])
                    except ValueError:
                        raise ValueError(f"the label {parts[1].decode()!r} is not a digit 0-9") from None
                    if not 0 <= label <= 9:
                        raise ValueError(f"label {label} is not a digit 0-9")
                    ids = listops_tokens(parts[0])
                    if not len(ids):
                        raise ValueError("empty expression")
                    listops_check_tree(ids)
                except ValueError as e:
                    raise DataError(f"{path}, line {lineno}: malformed ListOps row ({e}); {fix}") from None
                rows.append(ids)
                labels.append(label)
    except OSError as e:
        raise DataError(f"cannot read {path} ({one_line(e)}); {fix}") from None
    if not rows:
        what = "is empty" if lineno == 0 else "has no examples (only a header or blank lines)"
        raise DataError(f"{path} {what}: a ListOps TSV holds a header 'Source<TAB>Target' and one "
                        f"'tree<TAB>label' row per line; {fix}")
    lengths = np.fromiter(map(len, rows), dtype=np.int32, count=len(rows))
    tokens = np.zeros((len(rows), int(lengths.max())), dtype=np.uint8)
    for i, ids in enumerate(rows):
        tokens[i, :len(ids)] = ids
    return tokens, lengths, np.asarray(labels, dtype=np.int64)


def read_listops_tsv(path, block_size=None, fix="fix or remove that line"):
    """The split in an LRA basic_*.tsv, each example cut to its first block_size tokens."""
    tokens, lengths, labels = read_listops_arrays(path, fix)
    return ClassificationSplit(tokens, labels, lengths).truncate(block_size or tokens.shape[1])


LISTOPS_NPY_MIN_BYTES = 4 << 20   # TSVs from this size on are cached as arrays (smaller ones parse in < 0.2 s)


def listops_split(path, cache_dir, block_size=None, fix="fix or remove that line"):
    """read_listops_tsv through a binary cache: the TSV is parsed once into cache_dir/listops-npy/KEY/
    {tokens,lengths,labels}.npy, which later runs memory-map in a fraction of a second (the LRA train TSV
    takes ~20-40 s to parse). KEY names the TSV (its real path) and its version (size, mtime, inode), so a
    TSV that changes is parsed again; the stale arrays of that file are then removed. Small TSVs are
    parsed every time."""
    st = os.stat(path)
    if st.st_size < LISTOPS_NPY_MIN_BYTES:
        return read_listops_tsv(path, block_size, fix)
    name = hashlib.sha1(os.path.realpath(path).encode()).hexdigest()[:10]
    version = hashlib.sha1(f"{st.st_size}|{st.st_mtime_ns}|{st.st_ino}".encode()).hexdigest()[:10]
    root = os.path.join(cache_dir, "listops-npy")
    folder = os.path.join(root, f"{name}-{version}")
    arrays = ("tokens", "lengths", "labels")
    try:
        if os.path.isdir(folder):
            tokens, lengths, labels = (np.load(os.path.join(folder, f"{a}.npy"), mmap_mode="r" if a == "tokens" else None)
                                       for a in arrays)
            if len(tokens) == len(lengths) == len(labels):
                return ClassificationSplit(tokens, labels, lengths).truncate(block_size or tokens.shape[1])
    except (OSError, ValueError, EOFError):                  # a damaged cache: parse the TSV again
        pass
    tokens, lengths, labels = read_listops_arrays(path, fix, progress=True)
    try:
        os.makedirs(root, exist_ok=True)
        tmp = f"{folder}.tmp{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
        for a, value in zip(arrays, (tokens, lengths, labels)):
            np.save(os.path.join(tmp, f"{a}.npy"), value)
        shutil.rmtree(folder, ignore_errors=True)            # a damaged one
        os.replace(tmp, folder)
        for old in glob.glob(os.path.join(root, f"{name}-*")):   # arrays of an older version of this TSV
            if old != folder and ".tmp" not in old:
                shutil.rmtree(old, ignore_errors=True)
    except OSError:                                          # no cache (read-only, or another run won): fine
        shutil.rmtree(tmp, ignore_errors=True)
    return ClassificationSplit(tokens, labels, lengths).truncate(block_size or tokens.shape[1])


def write_listops_tsv(path, examples):
    atomic_write_text(path, "Source\tTarget\n" + "".join(f"{s}\t{v}\n" for s, v in examples))


@task("listops")
def listops(cache_dir="data", data_dir=None, block_size=None, listops_depth=LISTOPS_DEPTH, listops_args=LISTOPS_ARGS,
            listops_len=LISTOPS_LEN, listops_sizes=tuple(LISTOPS_SIZES.values()), **_):
    """LRA ListOps from --data_dir's basic_*.tsv, or generated once into cache_dir/listops (the LRA setting)
    or cache_dir/listops-depthD-argsA-B-lenL-M-nT-V-T (any other setting of the listops_* options).
    block_size defaults to the setting's length bound (2000 for LRA)."""
    setting = listops_setting(listops_depth, listops_args, listops_len, listops_sizes)
    block_size = block_size or setting.lengths[1]
    names = {split: f"basic_{split}.tsv" for split in LISTOPS_SIZES}
    if data_dir is not None:                                 # LRA's release: lra_release/listops-1000/
        folder, found = release("listops", data_dir, "it should hold LRA's basic_train.tsv, basic_val.tsv and "
                                "basic_test.tsv (or listops-1000/ with them)", (), ["listops-1000"], names.values())
        paths = {s: found[n] for s, n in names.items() if found[n]}
        fix = "the file should hold LRA's ListOps rows ('Source<TAB>Target', then one 'tree<TAB>label' per line)"
    else:                                                    # generate once, then reuse
        folder = os.path.join(cache_dir, setting.folder_name())
        paths = {s: os.path.join(folder, n) for s, n in names.items()}
        fix = f"delete {folder} and the next run generates it again"
        if not all(os.path.isfile(p) for p in paths.values()):
            for p in paths.values():
                if os.path.exists(p) and not os.path.isfile(p):
                    raise DataError(f"{p} is a folder where the ListOps file should be; {fix}")
            total = sum(setting.sizes)
            if not setting.is_lra():                         # an unusual setting: is it reachable at all?
                kept, _, estimate = listops_probe(setting)
                if not kept:
                    raise DataError(f"listops: no tree of {setting.lengths[0]} < length < {setting.lengths[1]} in 20,000 "
                                    "draws; widen --listops_len or raise --listops_depth / --listops_args")
                if estimate < 2 * total:                     # drawing more than half of them would crawl
                    raise DataError(f"listops: the setting ({setting.describe()}) has only about "
                                    f"{int(estimate)} distinct trees, too few for {total}; "
                                    "widen --listops_len or --listops_args, raise --listops_depth or lower --listops_sizes")
            os.makedirs(folder, exist_ok=True)
            # a benchmark, so one fixed draw (seed 0) whatever the run's --seed
            what = "LRA recipe" if setting.is_lra() else setting.describe()
            print(f"generating ListOps ({what}) into {folder}{', about a minute' * setting.is_lra()} ...", flush=True)
            examples = generate_listops(total, seed=0, min_len=setting.lengths[0], max_len=setting.lengths[1],
                                        depth=setting.depth, args=setting.args)
            start = 0
            for split, size in zip(LISTOPS_SIZES, setting.sizes):
                write_listops_tsv(paths[split], examples[start:start + size])
                start += size
    loaders = {s: (lambda p=p: listops_split(p, cache_dir, block_size, fix)) for s, p in paths.items()}
    missing = {s: f"listops: no {n} in {folder}" for s, n in names.items() if s not in paths}
    return Task("listops", "cls", len(LISTOPS_VOCAB), block_size, 10, loaders, missing, paths)


# Reference rules: what a model scores by reading only the top of the tree. listops_baselines fits them on
# a training split and scores them on others (train.py's tables print them beside the models).

_LISTOPS_FNS = (min, max, lambda v: (sorted(v)[(len(v) - 1) // 2] + sorted(v)[len(v) // 2]) // 2,
                lambda v: sum(v) % 10)                       # MIN, MAX, MED (truncated), SM: by operator index


def listops_examples(source):
    """(token ids, label) pairs from a ClassificationSplit or from (tree, label) pairs, a tree being an LRA
    string or token ids."""
    if isinstance(source, ClassificationSplit):
        tokens = np.asarray(source.tokens)
        return [(tokens[i, :source.lengths[i]], int(source.labels[i])) for i in range(len(source))]
    return [(listops_tokens(t) if isinstance(t, (str, bytes)) else np.asarray(t), int(y)) for t, y in source]


def listops_top(ids):
    """What the top of a tree shows: (operator index 0-3 or None for a lone digit, the sorted digits that are
    the root's own arguments, m = how many of its arguments are subtrees)."""
    ids = np.asarray(ids)
    if ids[0] < LISTOPS_FIRST_OP:
        return None, (int(ids[0]) - 1,), 0
    is_op = (ids >= LISTOPS_FIRST_OP) & (ids < LISTOPS_END)
    depth = np.cumsum(is_op.astype(np.int32) - (ids == LISTOPS_END))
    top = np.zeros(len(ids), dtype=bool)
    top[1:] = depth[:-1] == 1                                # tokens read directly under the root
    digits = tuple(sorted((ids[top & (ids < LISTOPS_FIRST_OP)] - 1).tolist()))
    return int(ids[0]) - LISTOPS_FIRST_OP, digits, int((top & is_op).sum())


def listops_subtree_values(ids):
    """The values of the root's arguments that are subtrees (evaluated here by a stack machine)."""
    stack, out = [], []
    for t in np.asarray(ids).tolist():
        if t < LISTOPS_FIRST_OP:
            if stack:
                stack[-1].append(t - 1)
        elif t < LISTOPS_END:
            stack.append([t - LISTOPS_FIRST_OP])
        else:
            op, *values = stack.pop()
            if stack:
                value = _LISTOPS_FNS[op](values)
                stack[-1].append(value)
                if len(stack) == 1:
                    out.append(value)
    return out


def listops_top_digits_posterior(op, digits, m, q):
    """P(label | op, the root's digits, m subtrees) when the m subtree values are independent draws from q
    (10 probabilities): exact, by the order statistics of m draws (MIN, MAX), convolution (SM) or a walk over
    the values 0-9 that counts how many draws fall at or below each (MED)."""
    q = np.asarray(q, dtype=np.float64)
    p = np.zeros(10)
    if op is None or m == 0:
        p[digits[0] if op is None else _LISTOPS_FNS[op](list(digits))] = 1.0
        return p
    at_least = np.concatenate([np.cumsum(q[::-1])[::-1], [0.0]])   # P(draw >= v), v = 0..10
    if op in (0, 1):                                         # MIN (MAX: the same on 9 - v)
        d = list(digits) if op == 0 else [9 - v for v in digits]
        s = at_least if op == 0 else np.concatenate([np.cumsum(q)[::-1], [0.0]])
        low = min(d) if d else 10
        for v in range(low):                                 # the draws' minimum is v < every digit
            p[v] = s[v] ** m - s[v + 1] ** m
        if low < 10:
            p[low] = s[low] ** m                             # every draw >= the smallest digit
        return p if op == 0 else p[::-1].copy()
    if op == 3:                                              # SM: sum mod 10
        p[sum(digits) % 10] = 1.0
        for _ in range(m):
            p = np.array([sum(p[(v - u) % 10] * q[u] for u in range(10)) for v in range(10)])
        return p
    k = len(digits) + m                                      # MED of k values: ranks r1 <= r2 (0-based)
    r1, r2 = (k - 1) // 2, k // 2
    below = np.cumsum(np.bincount(np.asarray(digits, dtype=np.int64), minlength=10))  # digits <= v
    states = {(0, -1): 1.0}                                  # (draws placed so far, value at rank r1 or -1) -> prob
    for v in range(10):
        pv = 1.0 if v == 9 else (q[v] / at_least[v] if at_least[v] > 0 else 0.0)  # a remaining draw equals v
        new = {}
        for (t, a), pr in states.items():
            rest = m - t
            for c in range(rest + 1):                        # c of the remaining draws equal v
                w = pr * math.comb(rest, c) * pv ** c * (1 - pv) ** (rest - c)
                if w == 0.0:
                    continue
                n = below[v] + t + c                         # values <= v
                a2 = v if a < 0 and n > r1 else a
                if n > r2:
                    p[(a2 + v) // 2] += w
                else:
                    new[(t + c, a2)] = new.get((t + c, a2), 0.0) + w
        states = new
    return p


def listops_baselines(train, /, fit=10_000, **splits):
    """Accuracy of three reference rules, fitted on `train` and scored on each named split:
        listops_baselines(task.split("train"), test=task.split("test"), val=task.split("val"))
        -> {"test": {"majority": 0.17, "top_operator": 0.37, "top_digits": 0.52}, "val": {...}}
    Splits are ClassificationSplits or lists of (tree, label) (LRA strings or token ids).
      majority     : the most frequent training label, for every tree.
      top_operator : sees only the root's operator; answers the most frequent training label among training
                     trees with that root operator.
      top_digits   : sees the root's operator, its digit arguments and how many (m) of its arguments are
                     subtrees, not what is inside them. Answers argmax_y P(y | operator, digits, m), where the
                     m subtree values are taken as independent draws from q, the distribution of the values of
                     root-level subtrees in the first `fit` training trees, and P is computed exactly.
    Ties go to the smallest label."""
    train = listops_examples(train)
    labels = np.array([y for _, y in train])
    tops = [listops_top(ids) for ids, _ in train]
    majority = int(np.argmax(np.bincount(labels, minlength=10)))
    by_op = {}
    for (op, _, _), y in zip(tops, labels):
        by_op.setdefault(op, []).append(y)
    op_rule = {op: int(np.argmax(np.bincount(ys, minlength=10))) for op, ys in by_op.items()}
    values = [v for ids, _ in train[:fit] for v in listops_subtree_values(ids)]
    q = np.bincount(values, minlength=10) / len(values) if values else np.full(10, 0.1)
    posterior = {}
    out = {}
    for name, split in splits.items():
        hits = {"majority": 0, "top_operator": 0, "top_digits": 0}
        examples = listops_examples(split)
        for ids, y in examples:
            op, digits, m = listops_top(ids)
            if (op, digits, m) not in posterior:
                posterior[op, digits, m] = int(np.argmax(listops_top_digits_posterior(op, digits, m, q)))
            hits["majority"] += y == majority
            hits["top_operator"] += y == op_rule.get(op, majority)
            hits["top_digits"] += y == posterior[op, digits, m]
        out[name] = {rule: n / max(len(examples), 1) for rule, n in hits.items()}
    return out


# ----------------------------------------------------------------------------------------------
# Penn Treebank, word level (Mikolov's release: ptb.{train,valid,test}.txt, 10k words with <unk>).
# Without --data_dir the Hugging Face copy (ptb_text_only, the same sentences) is written out once as
# those three files under cache_dir/ptb/ and read back the same way.

PTB_LAYOUT = ("DIR with Mikolov's ptb.train.txt, ptb.valid.txt, ptb.test.txt (simple-examples.tgz; DIR may "
              "also hold simple-examples/data/ or ptb/)")
PTB_FILES = {"train": "ptb.train.txt", "val": "ptb.valid.txt", "test": "ptb.test.txt"}


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


@task("ptb")
def ptb(data_dir=None, cache_dir="data", block_size=35, **_):
    files = ptb_files(fetch_ptb(os.path.join(cache_dir, "ptb")) if data_dir is None else data_dir)
    words = {s: read_words(p) for s, p in files.items()}
    vocab = {w: i for i, w in enumerate(sorted(set(words["train"])), start=1)}  # 0 is padding
    for s, ws in words.items():
        unknown = next((w for w in ws if w not in vocab), None)
        if unknown is not None:
            raise DataError(f"{files[s]}: word {unknown!r} is not in the training vocabulary (that of "
                            f"{files['train']}; Mikolov's files write rare words as <unk>)")
    streams = {s: np.array([vocab[w] for w in ws], dtype=np.int32) for s, ws in words.items()}
    loaders = {s: (lambda s=s: LMSplit(streams[s], block_size, files[s])) for s in streams}
    return Task("ptb", "lm", len(vocab) + 1, block_size, 0, loaders, sources=files)



# ----------------------------------------------------------------------------------------------
# Pathfinder (Linsley et al. 2018; LRA's 32x32 setting, lra_benchmarks/data/pathfinder.py, contour length
# 14 = "hard"), drawn here with numpy alone. An image is drawn on a 64x64 canvas (2x, for anti-aliasing)
# and averaged down 2x2 to 32x32. On the canvas (lengths in canvas pixels, half that in image pixels):
#   - two target paths of 14 dashes. A dash is 4 long (2 image pixels) and 1 thick (0.5), and the next one
#     starts 3 further on (a gap of ~1 image pixel), turned by an angle drawn with weight
#     cos^2(turn) (continuity 1) among the turns whose dash is free: inside the canvas, away from every
#     other path and from its own older dashes. Among free turns, those with room for a further dash are
#     preferred (a one-step lookahead, so fewer paths get stuck). Both paths start near the centre, 14
#     apart (LRA's seed distance, 7), and grow alternately, a dash each.
#   - 5 distractor paths of 4 dashes (14 // 3), seeded where there is room; one that gets stuck is dropped.
#   - two markers, discs of radius 3 (1.5): one where a target path starts, the other where that same path
#     ends (label 1, connected) or where the other one ends (label 0). Labels are exactly 50/50 per shard.
# Different paths (markers included) never come within 3 canvas pixels of each other (Chebyshev distance),
# while consecutive dashes of a path are at most 3 apart: so "connected" is exactly "joined once gaps of up
# to 3 canvas pixels are bridged", which the tests check by flood fill on the clean (canvas) drawing.
# Lines count at contrast 1.5 (LRA: paddle contrast 0.75 x snake contrast 2), clipped to 1, markers at 1.
# An image whose target paths get stuck is drawn again (about half are).
# Tokens are the 1,024 pixels (0-255) in row order, + 1 (token 0 is padding), vocabulary 257.

PF_W = 64                                  # the canvas
PF_PAD = 8                                 # margin of the work maps, so that stamps never leave them
PF_N = PF_W + 2 * PF_PAD
PF_BORDER = 2                              # paths keep this far from the canvas edge
PF_STEP = 7.0                              # one dash and its gap
PF_DASH = np.arange(1.5, 5.51, 1.0, dtype=np.float32)    # the dash: 5 points 1 apart (8-connected pixels)
PF_PROBE = np.array([3.5, 5.5], np.float32)              # lookahead: two points of a possible next dash
PF_SEP = 3                                 # other paths stay more than this far (Chebyshev)
PF_DIRS = 48                               # directions are multiples of 7.5 degrees
PF_TURNS = np.arange(-11, 12, 2)           # -82.5 ... 82.5 degrees, 12 turns
PF_TURN_W = (np.cos(np.deg2rad(PF_TURNS * 7.5)) ** 2).astype(np.float32)  # continuity 1
PF_AHEAD = np.array([-8, -4, 0, 4, 8])     # lookahead turns: -60 ... 60 degrees
PF_SEED_DISTANCE = 14.0
PF_MARKER = 3.0
PF_CONTOUR, PF_DISTRACTOR_LEN, PF_DISTRACTORS = 14, 14 // 3, 5

_pf_u = np.stack([np.sin(np.arange(PF_DIRS) * 2 * np.pi / PF_DIRS),
                  np.cos(np.arange(PF_DIRS) * 2 * np.pi / PF_DIRS)], -1).astype(np.float32)
_PF_DASH_OFF = PF_DASH[None, :, None] * _pf_u[:, None, :]        # (direction, point, yx)
_PF_PROBE_OFF = PF_PROBE[None, :, None] * _pf_u[:, None, :]
_PF_STEP_OFF = PF_STEP * _pf_u


def _pf_offsets(r, disc=None):
    o = np.array([(dy, dx) for dy in range(-r, r + 1) for dx in range(-r, r + 1)
                  if disc is None or dy * dy + dx * dx <= disc * disc])
    return o


_PF_BOX = _pf_offsets(PF_SEP)                                    # "within PF_SEP"
_PF_DISC = _pf_offsets(int(PF_MARKER), PF_MARKER)
_PF_DISC_BOX = np.unique((_PF_DISC[:, None] + _PF_BOX[None]).reshape(-1, 2), axis=0)
_pf_flat = lambda o: o[:, 0] * PF_N + o[:, 1]                    # noqa: E731
PF_BOX_FLAT, PF_DISC_FLAT, PF_DISC_BOX_FLAT = _pf_flat(_PF_BOX), _pf_flat(_PF_DISC), _pf_flat(_PF_DISC_BOX)
PF_NEAR_FLAT = _pf_flat(_pf_offsets(1))     # a path keeps 2 pixels from its own older dashes


def _pf_pixels(knot, off):
    """Points knot + off -> canvas pixels: knot (..., 2), off (..., P, 2) -> (..., P, 2) int."""
    return np.floor(knot[..., None, :] + off).astype(np.int64)


def _pf_index(base, pix):
    """Flat indices of canvas pixels pix (B, ..., 2) into the padded (B, PF_N, PF_N) maps; base (B,). Pixels
    off the canvas (never free) are moved to just outside it, so that index + any offset of a stamp (at
    most PF_PAD - 2) stays in the image's own map."""
    p = np.clip(pix, -1, PF_W) + PF_PAD
    return base.reshape(len(base), *([1] * (pix.ndim - 2))) + p[..., 0] * PF_N + p[..., 1]


def _pf_free(near, own, base, pix, bit):
    """Whether dashes (pix (B, ..., P, 2)) are inside and clear of other paths (near) and of the path's
    own older dashes (own)."""
    inside = ((pix >= PF_BORDER) & (pix <= PF_W - 1 - PF_BORDER)).all(-1)
    idx = _pf_index(base, pix)
    busy = (near.ravel()[idx] & ~bit) | (own.ravel()[idx] & bit)
    return (inside & (busy == 0)).all(-1)


def _pf_stamp(a, idx, offsets, bits):
    """a.flat[idx + offset] |= bits, for idx (B, P) and every offset."""
    if len(idx) == 0:
        return
    a.ravel()[(idx[:, :, None] + offsets).reshape(len(idx), -1)] |= bits if np.isscalar(bits) else bits[:, None]


def _pf_choose(weights, rng):
    cum = np.cumsum(weights, 1)
    r = rng.random(len(weights), dtype=np.float32) * cum[:, -1]
    return np.minimum((cum <= r[:, None]).sum(1), weights.shape[1] - 1), cum[:, -1] > 0


def _pf_extend(near, own, base, knot, direction, bit, rng, lookahead, check=None):
    """One more dash for every image: (whether one was free, its direction, its pixels)."""
    cand = (direction[:, None] + PF_TURNS) % PF_DIRS                      # (B, K)
    pix = _pf_pixels(knot[:, None], _PF_DASH_OFF[cand])                   # (B, K, 5, 2)
    good = _pf_free(near, own, base, pix, bit)
    if check is not None:
        good &= check(pix)
    w = np.where(good, PF_TURN_W, np.float32(0))
    if lookahead:                                                         # prefer turns with room after
        nxt = knot[:, None] + _PF_STEP_OFF[cand]
        probe = _pf_pixels(nxt[:, :, None], _PF_PROBE_OFF[(cand[..., None] + PF_AHEAD) % PF_DIRS])
        room = _pf_free(near, own, base, probe, bit).any(-1)
        w2 = w * room
        w = np.where((w2 > 0).any(1, keepdims=True), w2, w)
    k, ok = _pf_choose(w, rng)
    r = np.arange(len(k))
    return ok, cand[r, k], pix[r, k]


def pathfinder_draw(labels, rng):
    """Try to draw one image per label. Returns (kept, lines, markers): the indices of the labels whose image
    could be drawn, and for them the clean canvas drawings (n, 64, 64) bool of the paths and the markers."""
    B = len(labels)
    kept = np.arange(B)
    near = np.zeros((B, PF_N, PF_N), np.uint8)     # bit of path s: within PF_SEP of path s
    own = np.zeros_like(near)                      # bit of path s: near its dashes but the newest
    ink = np.zeros_like(near)                      # 1 line, 2 marker, 4 distractor in progress
    base = np.arange(B) * PF_N * PF_N
    start = (PF_W / 2 + rng.uniform(-6, 6, (B, 2))).astype(np.float32)
    knot = np.stack([start, start + PF_SEED_DISTANCE * _pf_u[rng.integers(0, PF_DIRS, B)]], 1)  # (B, 2, 2)
    direction = rng.integers(0, PF_DIRS, (B, 2))
    first = rng.integers(0, 2, B)                  # the path whose start is marked
    last = np.where(np.asarray(labels) == 1, first, 1 - first)   # the path whose end is marked
    bits = np.array([1, 2], np.uint8)
    r = np.arange(B)
    tip = _pf_index(base, np.floor(knot[r, first] + _PF_DASH_OFF[direction[r, first], 0]).astype(np.int64)[:, None])
    _pf_stamp(near, tip, PF_DISC_BOX_FLAT, bits[first])
    ink.ravel()[tip + PF_DISC_FLAT] |= 2
    prev = [None, None]
    alive = np.ones(B, bool)
    for step in range(PF_CONTOUR):
        for s in (0, 1):
            bit = bits[s]
            if step == 0:
                pix = _pf_pixels(knot[:, s], _PF_DASH_OFF[direction[:, s]])
                ok, d = _pf_free(near, own, base, pix, bit), direction[:, s]
            else:
                check = None
                if step == PF_CONTOUR - 1:                      # the end marker must fit too
                    def check(pix, s=s, bit=bit):
                        end = _pf_index(base, pix[:, :, -1])
                        clear = ((near.ravel()[end[..., None] + PF_DISC_FLAT] & ~bit) == 0).all(-1)
                        return clear | (last != s)[:, None]
                ok, d, pix = _pf_extend(near, own, base, knot[:, s], direction[:, s], bit, rng, True, check)
            alive &= ok
            idx = _pf_index(base, pix)
            _pf_stamp(near, idx, PF_BOX_FLAT, bit)
            if prev[s] is not None:
                _pf_stamp(own, prev[s], PF_NEAR_FLAT, bit)
            prev[s] = idx
            ink.ravel()[idx] |= 1
            if step == PF_CONTOUR - 1:                          # the end marker, before the other path ends
                end = idx[last == s, -1:]
                _pf_stamp(near, end, PF_DISC_BOX_FLAT, bit)
                ink.ravel()[end + PF_DISC_FLAT] |= 2
            knot[:, s] += _PF_STEP_OFF[d]
            direction[:, s] = d
        if step % 3 == 2 or step == PF_CONTOUR - 1:             # drop the stuck ones now and then
            near, own, ink, kept, knot, direction, last = (a[alive] for a in (near, own, ink, kept, knot, direction, last))
            new_base = np.arange(alive.sum()) * PF_N * PF_N
            prev = [p[alive] - base[alive, None] + new_base[:, None] for p in prev]
            base, alive = new_base, np.ones(len(kept), bool)
    B = len(kept)
    for j in range(PF_DISTRACTORS):
        bit = np.uint8(4 << j)
        seeds = rng.uniform(PF_BORDER, PF_W - 1 - PF_BORDER, (B, 16, 2)).astype(np.float32)
        dirs = rng.integers(0, PF_DIRS, (B, 16))
        pix = _pf_pixels(seeds, _PF_DASH_OFF[dirs])
        ok = _pf_free(near, own, base, pix, bit)
        k, good = ok.argmax(1), ok.any(1)                      # the first free one of 16 tries
        r = np.arange(B)
        kn, d, pix = seeds[r, k], dirs[r, k], pix[r, k]
        prev_d = None
        for step in range(PF_DISTRACTOR_LEN):
            if step:
                ok, d, pix = _pf_extend(near, own, base, kn, d, bit, rng, False)
                good &= ok
            idx = _pf_index(base, pix)
            _pf_stamp(near, idx, PF_BOX_FLAT, bit)
            if prev_d is not None:
                _pf_stamp(own, prev_d, PF_NEAR_FLAT, bit)
            prev_d = idx
            ink.ravel()[idx] |= 4
            kn = kn + _PF_STEP_OFF[d]
        near[~good] &= ~bit                                     # a stuck distractor is erased
        own[~good] &= ~bit
        ink[~good] &= ~np.uint8(4)
        ink |= (ink & 4) >> 2
        ink &= ~np.uint8(4)
    ink = ink[:, PF_PAD:PF_PAD + PF_W, PF_PAD:PF_PAD + PF_W]
    return kept, (ink & 1).astype(bool), (ink & 2).astype(bool)


def pathfinder_render(lines, markers):
    """Clean canvas drawings -> anti-aliased 32x32 uint8 images: each pixel averages its 2x2 canvas block."""
    pool = lambda m: m.reshape(len(m), PF_W // 2, 2, PF_W // 2, 2).mean((2, 4))  # noqa: E731
    image = np.maximum(np.clip(1.5 * pool(lines), 0, 1), pool(markers))
    return np.round(image * 255).astype(np.uint8)


def generate_pathfinder(n, seed, clean=False):
    """n images (n, 32, 32) uint8 and their labels, exactly half 1; with clean=True also the clean canvas
    drawings (n, 64, 64) bool (paths and markers). The same for a seed (an int or a sequence of ints)."""
    rng = np.random.default_rng(seed)
    labels = rng.permutation(np.arange(n) % 2).astype(np.uint8)
    images = np.zeros((n, PF_W // 2, PF_W // 2), np.uint8)
    drawings = np.zeros((n, PF_W, PF_W), bool) if clean else None
    todo = np.arange(n)
    while len(todo):
        chunk = todo[:1024]
        tries = np.tile(labels[chunk], 3)[:int(2.3 * len(chunk)) + 16]   # about half the tries succeed
        kept, lines, markers = pathfinder_draw(tries, rng)
        filled = []
        for label in (0, 1):
            slots = chunk[labels[chunk] == label]
            got = np.nonzero(tries[kept] == label)[0][:len(slots)]
            slots = slots[:len(got)]
            images[slots] = pathfinder_render(lines[got], markers[got])
            if clean:
                drawings[slots] = lines[got] | markers[got]
            filled.append(slots)
        todo = np.setdiff1d(todo, np.concatenate(filled))
    return (images, labels, drawings) if clean else (images, labels)


# Generated: LRA's 160,000 training images; val and test 2,000 each, as ListOps', so that evaluating on a CPU
# takes seconds (LRA's release folder gives its own 80/10/10 split of 200,000). Shards of 4,000 (sizes are
# multiples of it), each its own seed, made when first needed and in parallel: --n_train 16000 makes 4.
PATHFINDER_SIZES = {"train": 160_000, "val": 2_000, "test": 2_000}
PATHFINDER_SHARD = 4_000
MAX_WORKERS = 8                            # processes that generate shards at once (at most one per core)
PATHFINDER_LAYOUT = ("DIR with LRA's Pathfinder release (lra_release.gz): DIR/pathfinder32/curv_contour_length_14/"
                     "metadata/*.npy and imgs/<k>/sample_<n>.png (DIR may also be pathfinder32/ or "
                     "curv_contour_length_14/ itself, or hold lra_release/)")


def pathfinder_shard(job):
    """One shard of a generated split (a worker of the pool): seed = (0, split number, shard number)."""
    split, k, size = job
    images, labels = generate_pathfinder(size, seed=[0, ("train", "val", "test").index(split), k])
    return images.reshape(size, -1), labels


def pathfinder_generated(folder, split, count):
    """The first `count` shards of a generated split, generated (in parallel) and cached if missing."""
    paths = [os.path.join(folder, f"{split}_{k:03d}.npz") for k in range(count)]
    size = min(PATHFINDER_SHARD, PATHFINDER_SIZES[split])
    jobs = [(split, k, size) for k in range(count) if not os.path.isfile(paths[k])]
    if jobs:
        os.makedirs(folder, exist_ok=True)
        n = len(jobs) * size
        workers = min(os.cpu_count() or 1, MAX_WORKERS, len(jobs))
        print(f"generating Pathfinder ({split}: {n:,} images, Linsley/LRA settings) into {folder}, about "
              f"{max(1, round(n / 1000 / workers))} s ...", flush=True)
        with contextlib.ExitStack() as stack:
            if workers > 1:
                pool = stack.enter_context(multiprocessing.get_context("spawn").Pool(workers))
                results = pool.imap(pathfinder_shard, jobs)
            else:
                results = map(pathfinder_shard, jobs)
            for (_, k, _), (images, labels) in zip(jobs, results):
                tmp = temp_path(paths[k])
                with open(tmp, "wb") as f:
                    np.savez(f, images=images, labels=labels)
                os.replace(tmp, paths[k])
    images, labels = [], []
    for p in paths:
        with reading(p, "is damaged", "; delete it to generate it again"), np.load(p) as shard:
            images.append(shard["images"])
            labels.append(shard["labels"])
    return np.concatenate(images), np.concatenate(labels)


def read_pathfinder_metadata(path):
    """The rows of one metadata file of the release: text lines "imgs/<k> sample_<n>.png <n> <label> ..."
    (saved as .npy by some versions of the generator: then a 2-D array of strings)."""
    with reading(path, "is not a Pathfinder metadata file"), open(path, "rb") as f:
        raw = f.read()
        if raw.startswith(b"\x93NUMPY"):
            f.seek(0)
            rows = np.load(f, allow_pickle=False)
            if rows.size and rows.ndim != 2:
                raise ValueError(f"a {rows.ndim}-D array, not rows of fields")
            return [[str(v) for v in row] for row in rows]
        return [line.split() for line in raw.decode("utf-8").splitlines() if line.strip()]


def pathfinder_images(folder):
    """The release's metadata files and the (PNG path, label) of every image they list, in LRA's order."""
    metas = sorted(glob.glob(os.path.join(glob.escape(folder), "metadata", "*.npy")),
                   key=lambda p: (len(os.path.basename(p)), os.path.basename(p)))
    if not metas:
        raise DataError(f"pathfinder: no metadata/*.npy in {folder}; use {PATHFINDER_LAYOUT}")
    images = []
    for meta in metas:
        if file_problem(meta):
            raise DataError(f"pathfinder: {meta} {file_problem(meta)}")
        for i, fields in enumerate(read_pathfinder_metadata(meta), 1):
            try:
                label = float(fields[3])
                if label not in (0, 1):
                    raise ValueError
                images.append((os.path.join(folder, fields[0], fields[1]), int(label)))
            except (IndexError, ValueError):
                raise DataError(f"{meta}, row {i}: expected 'imgs/<k> sample_<n>.png <n> <label 0 or 1> ...', "
                                f"found {one_line(' '.join(fields), 80)!r}") from None
    if not images:
        raise DataError(f"pathfinder: the metadata files in {os.path.join(folder, 'metadata')} list no images")
    return metas, images


def read_pathfinder_release(images, out):
    """The release's images -> cached splits 80/10/10 (a fixed shuffle, as S4 does). Empty files are skipped
    (S4 skips curv_baseline/imgs/0/sample_172.png: empty); anything else unreadable is an error."""
    from PIL import Image
    pixels = np.zeros((len(images), 1024), np.uint8)
    labels = np.zeros(len(images), np.uint8)
    n = 0
    for path, label in images:
        if os.path.getsize(path) == 0:
            continue
        with reading(path, "is not a readable PNG image"), Image.open(path) as im:
            if im.size != (32, 32):
                raise DataError(f"{path}: a {im.size[0]}x{im.size[1]} image; Pathfinder32's are 32x32")
            pixels[n], labels[n] = np.asarray(im.convert("L")).reshape(-1), label
        n += 1
    if n < len(images):
        print(f"pathfinder: skipped {len(images) - n} empty image files", flush=True)
    if n < 10:
        raise DataError(f"pathfinder: {n} readable images listed, too few for train, val and test (80/10/10)")
    order = np.random.default_rng(0).permutation(n)
    cut = [0, int(0.8 * n), int(0.9 * n), n]
    for split, lo, hi in zip(("train", "val", "test"), cut, cut[1:]):
        idx = np.sort(order[lo:hi])
        save_arrays(out, split, tokens=pixels[idx], labels=labels[idx], lengths=np.full(len(idx), 1024, np.int32))


@task("pathfinder")
def pathfinder(cache_dir="data", data_dir=None, block_size=1024, **_):
    if data_dir is not None:
        hard = "curv_contour_length_14"
        folder, _ = release("pathfinder", data_dir, f"use {PATHFINDER_LAYOUT}", ["metadata/"],
                            [hard, f"pathfinder32/{hard}", f"lra_release/pathfinder32/{hard}",
                             f"lra_release/lra_release/pathfinder32/{hard}"])
        metas, images = pathfinder_images(folder)
        key = source_key([*metas, *(p for p, _ in images)], " (listed in the release's metadata)")
        out = cached_dir(os.path.join(cache_dir, "pathfinder", key), lambda tmp: read_pathfinder_release(images, tmp),
                         f"pathfinder: reading LRA's release in {folder}")
        return cls_task("pathfinder", "cls", out, 257, block_size, 2, 1, {s: s for s in ("train", "val", "test")})
    folder = os.path.join(cache_dir, "pathfinder", "generated")

    def shards(split):
        def make(k):
            images, labels = pathfinder_generated(folder, split, k)
            return images[:, :block_size], labels
        return ShardedSplit(-(-PATHFINDER_SIZES[split] // PATHFINDER_SHARD), min(PATHFINDER_SHARD, PATHFINDER_SIZES[split]),
                            make, offset=1)

    loaders = {"train": lambda: shards("train"), "val": lambda: shards("val").full(),
               "test": lambda: shards("test").full()}
    return Task("pathfinder", "cls", 257, block_size, 2, loaders)

# ----------------------------------------------------------------------------------------------
# Image: CIFAR-10 in grayscale (LRA): 1,024 pixel tokens (+ 1, vocabulary 257), 10 classes; train = the
# first 90% of CIFAR's training set (45,000), val = the last 10% (5,000), test = its test set (10,000).

CIFAR_LAYOUT = ("DIR with CIFAR-10's python release (cifar-10-python.tar.gz unpacked): DIR/cifar-10-batches-py/"
                "data_batch_1 ... data_batch_5 and test_batch (DIR may also be cifar-10-batches-py/ itself)")
CIFAR_FILES = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]


def rgb_to_gray(rgb):
    """(..., 3) uint8 -> (...) uint8 exactly as LRA's tf.image.rgb_to_grayscale on uint8 images: the weights
    0.2989, 0.5870, 0.1140 on [0, 1] floats, then back to uint8 by tf's convert_image_dtype (x 255.5, truncated)."""
    gray = (np.asarray(rgb, np.float32) / 255) @ np.array([0.2989, 0.5870, 0.1140], np.float32)
    return np.clip(gray * 255.5, 0, 255).astype(np.uint8)


class ArraysOnly(pickle.Unpickler):
    """Unpickles plain values and numpy arrays, nothing else: a CIFAR batch is a pickle, and unpickling
    anything more could run code."""
    ALLOWED = {(m, n) for m in ("numpy.core.multiarray", "numpy._core.multiarray") for n in ("_reconstruct", "scalar")}
    ALLOWED |= {("numpy", "ndarray"), ("numpy", "dtype"), ("numpy.core.numeric", "_frombuffer"),
                ("numpy._core.numeric", "_frombuffer"), ("_codecs", "encode")}

    def find_class(self, module, name):
        if (module, name) not in self.ALLOWED:
            raise pickle.UnpicklingError(f"it holds a {module}.{name}, which is not loaded")
        return super().find_class(module, name)


def read_cifar_batch(path):
    """One batch file: (rgb (N, 32, 32, 3) uint8, labels (N,) int64)."""
    with reading(path, "is not a CIFAR-10 python batch"), open(path, "rb") as f:
        d = ArraysOnly(f, encoding="bytes").load()
        if not isinstance(d, dict) or b"data" not in d or b"labels" not in d:
            raise ValueError("expected a dict with b'data' and b'labels'")
        x, y = np.asarray(d[b"data"]), np.asarray(d[b"labels"])
    if x.ndim != 2 or x.shape[1] != 3072 or x.dtype.kind not in "iu" or not len(x) or x.min() < 0 or x.max() > 255:
        raise DataError(f"{path}: b'data' is {x.dtype} {x.shape}; a CIFAR-10 batch holds (N, 3072) bytes, N > 0")
    if y.shape != (len(x),):
        raise DataError(f"{path}: {y.size} labels for {len(x)} images")
    y = check_labels(y, 10, path)
    return x.astype(np.uint8).reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1), y.astype(np.int64)


def save_images(out, rgb_by_split):
    """{"train": (rgb, labels), "test": ...} -> cached gray splits train (90%) / val (10%) / test."""
    rgb, labels = rgb_by_split["train"]
    gray = rgb_to_gray(rgb).reshape(len(rgb), -1)
    cut = int(0.9 * len(gray))
    trgb, tlabels = rgb_by_split["test"]
    for split, x, y in (("train", gray[:cut], labels[:cut]), ("val", gray[cut:], labels[cut:]),
                        ("test", rgb_to_gray(trgb).reshape(len(trgb), -1), tlabels)):
        save_arrays(out, split, tokens=x, labels=np.asarray(y, np.uint8), lengths=np.full(len(x), x.shape[1], np.int32))


@task("image")
def image(cache_dir="data", data_dir=None, block_size=1024, **_):
    if data_dir is not None:
        folder, files = release("image", data_dir, f"use {CIFAR_LAYOUT}", CIFAR_FILES, ["cifar-10-batches-py"])
        files = list(files.values())

        def build(out):
            parts = [read_cifar_batch(f) for f in files[:5]]
            save_images(out, {"train": (np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])),
                              "test": read_cifar_batch(files[5])})
        key, what = source_key(files), f"image: reading CIFAR-10 from {folder}"
    else:
        def build(out):
            dd = load_hf("image", CIFAR_LAYOUT, "uoft-cs/cifar10")
            splits = {}
            for split in ("train", "test"):
                imgs, labels = [], []
                for batch_imgs, batch_labels in hf_rows(hf_split(dd, [split], "image"), ["img", "label"]):
                    imgs += [np.asarray(im.convert("RGB") if hasattr(im, "convert") else im, np.uint8) for im in batch_imgs]
                    labels += batch_labels
                splits[split] = (np.stack(imgs), check_labels(labels, 10, f"image: uoft-cs/cifar10 {split}"))
            save_images(out, splits)
        key, what = "hf", "image: CIFAR-10 (Hugging Face) in grayscale"
    folder = cached_dir(os.path.join(cache_dir, "image", key), build, what)
    return cls_task("image", "cls", folder, 257, block_size, 10, 1, {s: s for s in ("train", "val", "test")})


# ----------------------------------------------------------------------------------------------
# IMDb reviews (Maas et al. 2011): 25,000 train, 25,000 test, label 1 = positive. Two tasks read them:
#   text: LRA's byte-level task, the first 4,000 bytes of UTF-8, bytes + 1 (vocabulary 257).
#   imdb: short-text classification with BPE (--tokenizer, gpt2 by default), the first 512 tokens, id + 1.
# Neither release has a validation split: val is the test split, as in LRA (train.py only reports it).

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


def imdb_source(task_name, data_dir):
    """(cache key, function returning {"train": (texts, labels), "test": (texts, labels)})."""
    if data_dir is None:
        def read():
            dd = load_hf(task_name, IMDB_LAYOUT, "stanfordnlp/imdb")
            return {s: hf_columns(hf_split(dd, [s], task_name), ["text", "label"]) for s in ("train", "test")}
        return "hf", read
    parts = [(s, label, f"{s}/{c}/") for s in ("train", "test") for label, c in ((0, "neg"), (1, "pos"))]
    _, dirs = release(task_name, data_dir, f"use {IMDB_LAYOUT}", [d for *_, d in parts], ["aclImdb"])
    files = {(s, label): review_files(task_name, dirs[d]) for s, label, d in parts}
    return source_key([p for paths in files.values() for p in paths]), lambda: read_aclimdb(files)


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
    return cls_task("text", "cls", folder, 257, block_size, 2, 1, {"train": "train", "val": "test", "test": "test"})


def bpe_cls_task(name, cache_dir, key, read, tokenizer, block_size, default_length, n_classes, splits):
    """A BPE classification task: read() -> {split: (texts, labels)}, tokenised once into the cache. Local
    data (key local-...) loads the tokenizer first, so that a tokenizer that cannot load fails before the
    data is read; Hugging Face data is read first (offline, its error is the useful one)."""
    if os.path.isdir(tokenizer):                             # a BERT folder: BERT's WordPiece (section below)
        return wordpiece_cls_task(name, cache_dir, key, read, tokenizer, block_size, n_classes, splits)
    length = max(block_size, default_length)
    folder = os.path.join(cache_dir, name, f"{key}-{tokenizer}-L{length}")
    if not os.path.isdir(folder):
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


# ----------------------------------------------------------------------------------------------
# BERT's WordPiece: imdb and agnews with --tokenizer DIR, a Hugging Face BERT folder (train.py --init_from_bert
# DIR sets it). Each text becomes [CLS] text [SEP] in BERT's own ids (no + 1: [PAD] is 0), truncated to the
# length with its [SEP] kept, 0-padded: the rows are cut when tokenised, so each length has its own cache.
# Lower-casing and accent stripping are the folder's own: tokenizer.json's normaliser, or else vocab.txt with
# tokenizer_config.json's do_lower_case / strip_accents (defaults True / as lower-casing, as BertTokenizer).
# Needs the tokenizers package (pip install safetensors tokenizers), imported only here.

WORDPIECE_TASKS = ("agnews", "imdb")

def wordpiece_tokenizer(folder, task_name):
    """The folder's WordPiece as a tokenizers.Tokenizer that adds [CLS] and [SEP], neither padding nor cutting."""
    try:
        import tokenizers
        from tokenizers import models, normalizers, pre_tokenizers, processors
    except ImportError:
        raise DataError(f"{task_name}: --tokenizer {folder} (BERT's WordPiece) needs the tokenizers package: "
                        "pip install safetensors tokenizers") from None
    json_path, vocab_path = os.path.join(folder, "tokenizer.json"), os.path.join(folder, "vocab.txt")
    if not (os.path.isfile(json_path) or os.path.isfile(vocab_path)):
        raise DataError(f"{task_name}: --tokenizer {folder} has neither tokenizer.json nor vocab.txt (a Hugging "
                        "Face BERT folder has one)")
    try:
        if os.path.isfile(json_path):
            tok = tokenizers.Tokenizer.from_file(json_path)
        else:
            cfg_path = os.path.join(folder, "tokenizer_config.json")
            cfg = load_json(cfg_path) if os.path.isfile(cfg_path) else {}
            tok = tokenizers.Tokenizer(models.WordPiece(models.WordPiece.read_file(vocab_path), unk_token="[UNK]"))
            tok.normalizer = normalizers.BertNormalizer(
                clean_text=True, handle_chinese_chars=cfg.get("tokenize_chinese_chars", True),
                strip_accents=cfg.get("strip_accents"), lowercase=cfg.get("do_lower_case", True))
            tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    except Exception as e:                                   # tokenizers raises its own Exception types
        raise DataError(f"{task_name}: cannot read BERT's tokenizer in {folder} ({one_line(e, 200)})") from None
    special = {t: tok.token_to_id(t) for t in ("[PAD]", "[CLS]", "[SEP]")}
    if special["[PAD]"] != 0 or None in special.values():
        raise DataError(f"{task_name}: the tokenizer in {folder} needs [PAD] = 0, [CLS] and [SEP] (found {special})")
    tok.post_processor = processors.BertProcessing(("[SEP]", special["[SEP]"]), ("[CLS]", special["[CLS]"]))
    tok.no_padding()
    tok.no_truncation()
    return tok


def wordpiece_rows(tok, texts, length, chunk=4096):
    """Texts -> (N, length) ids [CLS] ... [SEP] 0 ..., each cut to `length` tokens with [CLS] and [SEP] kept."""
    tok.enable_truncation(max_length=length)                 # room for [CLS] and [SEP] is kept by tokenizers
    out = np.zeros((len(texts), length), dtype=id_dtype(tok.get_vocab_size()))
    for start in range(0, len(texts), chunk):
        for i, e in enumerate(tok.encode_batch(list(texts[start:start + chunk])), start):
            out[i, :len(e.ids)] = e.ids
    return out


def wordpiece_cls_task(name, cache_dir, key, read, folder, block_size, n_classes, splits):
    tok = wordpiece_tokenizer(folder, name)
    if block_size < 3:
        raise DataError(f"{name}: BERT's rows need block_size >= 3 ([CLS] text [SEP]), not {block_size}")
    tag = "wordpiece-" + hashlib.sha1(tok.to_str().encode()).hexdigest()[:10]  # follows vocabulary and casing
    cache = os.path.join(cache_dir, name, f"{key}-{tag}-L{block_size}")
    if not os.path.isdir(cache):
        def build(out):
            texts_by_split = read()
            print(f"{name}: tokenising with BERT's WordPiece from {folder} ...", flush=True)
            for split, (texts, labels) in texts_by_split.items():
                tokens = wordpiece_rows(tok, texts, block_size)
                save_arrays(out, split, tokens=tokens, labels=np.asarray(labels, np.uint8),
                            lengths=(tokens != 0).sum(-1).astype(np.int32))
            save_json(os.path.join(out, "meta.json"), {"tokenizer": folder, "vocab_size": tok.get_vocab_size()})

        cached_dir(cache, build, f"{name}: tokenised with BERT's WordPiece")
    vocab_size = load_json(os.path.join(cache, "meta.json"))["vocab_size"]
    return cls_task(name, "cls", cache, vocab_size, block_size, n_classes, 0, splits)


@task("imdb")
def imdb(cache_dir="data", data_dir=None, block_size=512, tokenizer="gpt2", **_):
    key, read = imdb_source("imdb", data_dir)
    return bpe_cls_task("imdb", cache_dir, key, read, tokenizer, block_size, 512, 2,
                        {"train": "train", "val": "test", "test": "test"})


# ----------------------------------------------------------------------------------------------
# AG News (Zhang et al. 2015): 120,000 train, 7,600 test news, 4 classes (World, Sports, Business,
# Sci/Tech). The text is title + " " + description, as Hugging Face's ag_news; BPE, first 512 tokens.
# A folder with test.csv only (e.g. the copy some mirrors ship) trains on its first 6,000 rows (or 80%,
# if it has fewer than 7,500) and tests on the rest; val is the test split.

AGNEWS_LAYOUT = ('DIR with the AG News CSV release (ag_news_csv.tgz unpacked): DIR/train.csv and DIR/test.csv, '
                 'rows "class","title","description" with class 1-4 (DIR may also hold ag_news_csv/)')
AGNEWS_TEST_ONLY_TRAIN = 6_000


def read_agnews_csv(path):
    texts, labels = [], []
    with reading(path), open(path, newline="", encoding="utf-8") as f:
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
                print(f"agnews: {folder} has no train.csv: training on the first {n:,} rows of test.csv, "
                      f"testing on the other {len(texts) - n:,}", flush=True)
                return {"train": (texts[:n], labels[:n]), "test": (texts[n:], labels[n:])}
    return bpe_cls_task("agnews", cache_dir, key, read, tokenizer, block_size, 512, 4,
                        {"train": "train", "val": "test", "test": "test"})


# ----------------------------------------------------------------------------------------------
# Retrieval: LRA's AAN task (Radev et al. 2013): do two papers cite one another? Pairs of documents,
# byte-level (the first 4,000 bytes of each, + 1), one shared encoder on both (the "match" head).
# LRA's files new_aan_pairs.{train,eval,test}.tsv: no header, tab-separated label, id1, id2, text1, text2.
# 147,086 / 18,090 / 17,437 pairs: stored as uint8 memmaps (1.2 GB for train), never loaded whole. The
# documents are bytes: any byte is a token, as in LRA.

AAN_LAYOUT = ("DIR with LRA's AAN pairs (lra_release.gz): DIR/new_aan_pairs.train.tsv, new_aan_pairs.eval.tsv, "
              "new_aan_pairs.test.tsv, tab-separated label, id1, id2, text1, text2 (DIR may also hold tsv_data/ "
              "or lra_release/)")
AAN_FILES = {"train": "new_aan_pairs.train.tsv", "val": "new_aan_pairs.eval.tsv", "test": "new_aan_pairs.test.tsv"}


def read_aan(path, out, split, length):
    with reading(path):
        with open(path, "rb") as f:
            n = sum(1 for line in f if line.strip())
        if n == 0:
            raise DataError(f"{path} holds no pairs")
        tokens = np.lib.format.open_memmap(os.path.join(out, f"{split}.tokens.npy"), mode="w+", dtype=np.uint8,
                                           shape=(n, 2, length))
        lengths = np.zeros((n, 2), np.int32)
        labels = np.zeros(n, np.uint8)
        i = 0
        with open(path, "rb") as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                fields = line.rstrip(b"\r\n").split(b"\t")
                try:
                    if len(fields) != 5:
                        raise ValueError(f"expected 5 tab-separated fields, found {len(fields)}")
                    label = float(fields[0])
                    if label not in (0.0, 1.0):
                        raise ValueError(f"label {fields[0].decode(errors='replace')} is not 0 or 1")
                except ValueError as e:
                    raise DataError(f"{path}, line {lineno}: malformed AAN row ({e})") from None
                labels[i] = int(label)
                for j, doc in enumerate(fields[3:]):
                    doc = doc[:length]
                    tokens[i, j, :len(doc)] = np.frombuffer(doc, dtype=np.uint8)
                    lengths[i, j] = len(doc)
                i += 1
        tokens.flush()
        del tokens
    np.save(os.path.join(out, f"{split}.labels.npy"), labels)
    np.save(os.path.join(out, f"{split}.lengths.npy"), lengths)


@task("retrieval")
def retrieval(cache_dir="data", data_dir=None, block_size=4000, **_):
    if data_dir is None:
        raise DataError("retrieval: the AAN pairs come only with LRA's release (https://storage.googleapis.com/"
                        f"long-range-arena/lra_release.gz, 7.7 GB, unpack it); pass --data_dir {AAN_LAYOUT}")
    sub = ["tsv_data", "lra_release/tsv_data", "lra_release/lra_release/tsv_data"]
    folder, found = release("retrieval", data_dir, f"use {AAN_LAYOUT}", (), sub, AAN_FILES.values())
    files = {s: found[name] for s, name in AAN_FILES.items() if found[name]}
    length = max(block_size, 4000)

    def build(out):
        for split, path in files.items():
            read_aan(path, out, split, length)

    out = cached_dir(os.path.join(cache_dir, "retrieval", f"{source_key(files.values())}-L{length}"), build,
                     f"retrieval: reading the AAN pairs in {folder}")
    task = cls_task("retrieval", "match", out, 257, block_size, 2, 1, {s: s for s in files})
    task.missing = {s: f"retrieval: no {name} in {folder}" for s, name in AAN_FILES.items() if s not in files}
    return task

# ----------------------------------------------------------------------------------------------
# Language modelling with BPE, as nanoGPT: every split tokenised once into a .bin file of token ids
# (uint16 for gpt2) that is memory-mapped, never loaded. wikitext103 and openwebtext are GPT-2's usual
# data; textfile takes any text for a quick experiment (first 90% train, last 10% val, as nanoGPT).

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
    ids, uint16 when they fit), a batch of pieces at a time; eot=True ends every piece with <|endoftext|>."""
    dtype = id_dtype(enc.n_vocab)
    n = 0
    with open(path, "wb") as f:
        group = []
        for piece in pieces:
            group.append(piece)
            if len(group) == batch:
                n += _write_ids(f, encode_batch(enc, group), dtype, enc.eot_token if eot else None)
                group = []
        if group:
            n += _write_ids(f, encode_batch(enc, group), dtype, enc.eot_token if eot else None)
    return n


def _write_ids(f, rows, dtype, eot):
    ids = np.concatenate([np.asarray(r + ([eot] if eot is not None else []), dtype=dtype) for r in rows])
    ids.tofile(f)
    return len(ids)


def load_bin(path, dtype):
    return np.memmap(path, dtype=dtype, mode="r") if os.path.getsize(path) else np.zeros(0, dtype)


def lm_bin_task(name, folder, block_size, splits, sources=None):
    """A language-model Task over a folder of .bin streams described by its meta.json (vocab_size, dtype)."""
    meta = load_json(os.path.join(folder, "meta.json"))
    hint = f"; delete {folder} to rebuild it" if sources is None else ""
    try:
        dtype, vocab_size = np.dtype(meta["dtype"]), int(meta["vocab_size"])
        if dtype.kind != "u" or vocab_size < 2:
            raise ValueError
    except (TypeError, KeyError, ValueError):
        raise DataError(f"{os.path.join(folder, 'meta.json')}: expected {{\"vocab_size\": N, \"dtype\": \"uint16\"}}"
                        f"{hint}") from None
    sources = sources or {s: os.path.join(folder, f"{s}.bin") for s in splits}
    loaders = {s: (lambda s=s: LMSplit(load_bin(os.path.join(folder, f"{s}.bin"), dtype), block_size, sources[s]))
               for s in splits}
    return Task(name, "lm", vocab_size, block_size, 0, loaders, sources=sources)


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
            for batch, in hf_rows(hf_split(dd[0], ["validation" if split == "val" else split], "wikitext103"), ["text"]):
                yield from batch
    folder = os.path.join(cache_dir, "wikitext103", f"{key}-{tokenizer}")
    if not os.path.isdir(folder):
        def build(out):
            enc = get_tokenizer(tokenizer, "wikitext103") if data_dir is not None else None
            chunks = {split: text_chunks(lines(split)) for split, _ in names}
            first = next(chunks["train"], None)              # the data first: offline, its error is the useful one
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


def check_ids(path, dtype, vocab, tokenizer, stamps):
    """A DataError if the .bin file at path holds an id >= vocab. A file checked once is remembered under
    `stamps` (by path, size and modification time), so that a large train.bin is read only once."""
    stamp = os.path.join(stamps, f"{source_key([path])}-{vocab}")
    if os.path.isfile(stamp):
        return
    ids = load_bin(path, dtype)
    for start in range(0, len(ids), 1 << 26):
        chunk = ids[start:start + (1 << 26)]
        if chunk.max() >= vocab:
            i = int(np.argmax(chunk >= vocab))
            raise DataError(f"{path} holds id {chunk[i]} (at position {start + i:,}), outside --tokenizer "
                            f"{tokenizer}'s {vocab:,} ids; nanoGPT's files hold gpt2 ids: use --tokenizer gpt2 (no "
                            "download needed)")
    os.makedirs(stamps, exist_ok=True)
    atomic_write_text(stamp, "")


@task("openwebtext")
def openwebtext(cache_dir="data", data_dir=None, block_size=1024, tokenizer="gpt2", **_):
    if data_dir is not None:                                 # nanoGPT's prepared files, used where they are
        folder, files = release("openwebtext", data_dir, f"use {OWT_LAYOUT}", ["train.bin", "val.bin"],
                                ["openwebtext", "data/openwebtext"], ["meta.json"])
        sources = {s: files[f"{s}.bin"] for s in ("train", "val")}
        if files["meta.json"]:
            return lm_bin_task("openwebtext", folder, block_size, ("train", "val"), sources)
        vocab = 50257 if tokenizer in ("gpt2", "r50k_base") else get_tokenizer(tokenizer, "openwebtext").n_vocab
        dtype = np.dtype(id_dtype(vocab))
        for path in sources.values():
            size = os.path.getsize(path)
            if size == 0 or size % dtype.itemsize:
                raise DataError(f"openwebtext: {path} is empty or not a file of {dtype.name} ids; use {OWT_LAYOUT}")

        def load(s):                                         # train.bin is checked when it is used
            with reading(sources[s]):
                check_ids(sources[s], dtype, vocab, tokenizer, os.path.join(cache_dir, "openwebtext", "checked"))
                return LMSplit(load_bin(sources[s], dtype), block_size, sources[s])
        load("val")                                          # small: a wrong --tokenizer fails at once
        return Task("openwebtext", "lm", vocab, block_size, 0, {s: (lambda s=s: load(s)) for s in sources},
                    sources=sources)
    folder = os.path.join(cache_dir, "openwebtext", f"hf-{tokenizer}")
    if not os.path.isdir(folder):
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
    return lm_bin_task("openwebtext", folder, block_size, ("train", "val"))


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
    if not os.path.isdir(folder):
        def build(out):
            enc = None if tokenizer == "char" else get_tokenizer(tokenizer, "textfile")
            text = "".join(read_text(p) for p in files)
            if not text:
                raise DataError(f"textfile: {where} holds no text")
            if enc is None:
                codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
                chars, ids = np.unique(codes, return_inverse=True)
                ids, vocab = ids + 1, len(chars) + 1
                meta = {"tokenizer": "char", "chars": "".join(map(chr, chars))}
                ids = ids.astype(id_dtype(vocab))
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


# the order in which train.py --help lists them: LRA's five, then the short texts, then language modelling
TASKS = {name: TASKS[name] for name in ("listops", "text", "retrieval", "image", "pathfinder", "imdb", "agnews",
                                        "ptb", "wikitext103", "openwebtext", "textfile")}
