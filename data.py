"""
The data API of train.py: each task name maps to a loader that returns a Task, whose splits hand out batches.
The loaders live in tasks/, one file per family, and register themselves here with @task: `import tasks`
registers them all (this file never imports tasks/).

    import data, tasks
    task = data.load_task("listops", cache_dir="data", data_dir=None, seed=0)
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
    ptb          lm     35      10,001: words (chars) + 1 -        HF ptb_text_only          | ptb.*.txt
    wikitext103  lm     512     BPE id (gpt2: 50,257)     -        HF Salesforce/wikitext    | wiki.*.tokens
    openwebtext  lm     1,024   BPE id (gpt2: 50,257)     -        HF Skylion007/openwebtext | nanoGPT's *.bin
    textfile     lm     256     chars + 1, or BPE id      -        (none)                    | a .txt file

They live in tasks/listops.py (LRA's TSV files: listops_format.py), pathfinder.py, image.py, text.py (text,
imdb, agnews), retrieval.py and lm.py (ptb, wikitext103, openwebtext, textfile); tasks/sources.py reads Hugging
Face and tiktoken, bert.py BERT's WordPiece. A task's files can be prepared alone, as nanoGPT's prepare.py: python -m tasks.listops --help.

Token 0 is padding everywhere, so tokens that can be 0 are shifted: pixels and bytes become value + 1 (vocabulary
257), BPE ids become id + 1 in classification. Language-model streams are never padded and keep the tokenizer's own
ids (nanoGPT's uint16 .bin files), except the word/char vocabularies, which count from 1. --tokenizer picks the BPE:
gpt2 (tiktoken, the default), any tiktoken encoding, byte (a tiktoken Encoding over the 256 byte values plus
<|endoftext|>, built here: no download), char (textfile and ptb), or, for imdb and agnews, a Hugging Face BERT
folder: BERT's WordPiece, [CLS] text [SEP] in BERT's own ids ([PAD] = 0, no + 1). Everything derived is cached under
--cache_dir (written atomically, checked against its manifest before every use, rebuilt when damaged or when any
source file changes) and every split is one fixed, deterministic draw (independent of --seed, as ListOps: every run
of a task is evaluated on the same examples). Where a release has no validation split (IMDb, AG News), val is held
out of train (tasks/text.py), never the test split. Bad or missing data fails at once with a DataError: one line
naming the file (and line) or the task, what is wrong and what to do (docs/tasks.md).
"""

import argparse
import contextlib
import csv
import difflib
import errno
import hashlib
import inspect
import json
import multiprocessing
import os
import pickle
import re
import shutil
import signal
import stat
import struct
import subprocess
import sys
import threading
import traceback
import zipfile
import zlib
from dataclasses import dataclass, field

import numpy as np

try:                                          # every program loads torch here first (it imports data before torch)
    import torch
except ValueError as e:                       # torch refuses a setting of its own: TORCH_LOGS=recompile, a typo
    print(f"error: torch will not start: {' '.join(str(e).split('Valid settings')[0].split())}; fix or unset that "
          "environment variable", file=sys.stderr)
    sys.exit(2)


class DataError(Exception):
    """A problem with the user's data or flags: train.py prints its message as one line."""


TASKS = {}
CLASHES = {}                    # name -> (module, module): a task name registered twice
UNFIT = {}                      # name -> why its loader cannot be called as train.py calls it


def task(name, help=None, generated_only=()):
    """@task(name) registers a loader, a function of keyword arguments (cache_dir, data_dir, block_size, the task's own
    options) that returns a Task; `help` explains an option for python -m tasks.X --help; `generated_only`: the options
    of generated examples, moot with --data_dir. (python -m tasks.X: the package's loader kept, not __main__'s.)"""
    def register(fn):
        fn.help, fn.generated_only = help or {}, tuple(generated_only)
        if fn.__module__ == "__main__":
            return fn
        if name in TASKS and TASKS[name].__module__ != fn.__module__:        # two modules, one name: the first kept
            CLASHES.setdefault(name, (TASKS[name].__module__, fn.__module__))    # (and tasks/__init__ says so)
        else:
            TASKS[name] = fn
        if not any(p.kind == p.VAR_KEYWORD for p in inspect.signature(fn).parameters.values()):
            UNFIT.setdefault(name, f"its loader {fn.__name__}() in {fn.__module__} takes no **_, and train.py "
                             "passes it every task's settings (seed, tokenizer, ...): end its parameters with **_")
        unknown = unknown_options(fn)
        if unknown:
            UNFIT.setdefault(name, unknown)
        return fn
    return register


def unknown_options(fn):
    """Why a loader's @task(help=..., generated_only=...) names an option its parameters lack, or None: a
    misspelt name would be dropped silently (a generated_only option never refused with --data_dir)."""
    own = [p.name for p in inspect.signature(fn).parameters.values() if p.kind != p.VAR_KEYWORD]
    for what, names in (("generated_only", fn.generated_only), ("help", fn.help)):
        for k in names:
            if k not in own:
                near = "".join(f" (did you mean {n!r}?)" for n in difflib.get_close_matches(k, own, 1))
                return (f"@task(..., {what}=...) names {k!r}, which its loader {fn.__name__}() in {fn.__module__} "
                        f"has no parameter of{near}; its options are {', '.join(own)}")
    return None


def load_task(name, cache_dir="data", **kw):
    """The Task `name`, its data found (and cached under cache_dir) but its splits not yet loaded: task.open()
    loads and checks them. What killed builds left in cache_dir is removed first."""
    if name not in TASKS:
        raise DataError(f"unknown task {name!r}; choose one of: {', '.join(TASKS)}")
    if os.path.exists(cache_dir) and not os.path.isdir(cache_dir):
        raise DataError(f"--cache_dir {cache_dir} is not a folder")
    remove_stale_temps(cache_dir)
    remove_stale_temps(os.path.join(cache_dir, name), recursive=True)
    loaded = loader_call(f"task {name!r}", TASKS[name], cache_dir=cache_dir, **kw)
    problem = declared_problem(loaded)
    if problem:                                              # (a fork's task: the model would be built from it)
        raise DataError(f"task {name!r} ({TASKS[name].__module__}): {problem}")
    return loaded


def loader_call(what, fn, *args, **kw):
    """fn(*args, **kw), a task's loader or a split's (a fork's, say). An ordinary exception it raises, of no bad file
    (DataError, OSError: said as they are) nor of running out of memory (run_main says so), is one DataError line."""
    try:
        return fn(*args, **kw)
    except (DataError, OSError, MemoryError):
        raise
    except Exception as e:                                   # a fork's loader that fails: where, and why
        if out_of_memory(e):
            raise
        raise DataError(loader_failure(what, fn, e)) from None


def loader_failure(what, fn, e, module=None):
    """`what` (a task, a split, a model's forward) failed with `e` in fn, an exception of no bad file: one line naming
    it, fn's file (or `module`'s), the line in that file where it failed (its innermost frame there), and the error."""
    where = module or fn.__module__
    origin = getattr(sys.modules.get(where), "__file__", None) or getattr(
        getattr(fn, "__code__", None), "co_filename", None)
    if origin:
        same = os.path.normcase(os.path.realpath(origin))
        lines = [f.lineno for f in traceback.extract_tb(e.__traceback__)
                 if os.path.normcase(os.path.realpath(f.filename)) == same]
        where = os.path.relpath(origin) + (f" line {lines[-1]}" if lines else "")
    return f"{what} ({where}) fails: {type(e).__name__}: {one_line(e, 200)}"


def declared_problem(t):
    """Why what a loader returned is no Task a model can be built for, or None: its kind, and its vocab_size,
    block_size and n_classes held to train.py's limits for those fields (a classifier needs two classes)."""
    def at_least(v, lo):
        return isinstance(v, (int, np.integer)) and not isinstance(v, bool) and v >= lo

    if not isinstance(t, Task):
        return f"its loader returned {type(t).__name__}, not a data.Task"
    if t.kind not in ("cls", "match", "lm"):
        return f"its Task's kind is {t.kind!r}: use \"cls\", \"match\" (a pair of texts) or \"lm\""
    if not at_least(t.vocab_size, 2):
        return f"its Task declares vocab_size {t.vocab_size!r}: give an integer >= 2 (its ids and the padding 0)"
    if not at_least(t.block_size, 1):
        return f"its Task declares block_size {t.block_size!r}: give an integer >= 1"
    if t.kind == "lm" and t.n_classes != 0:
        return f"its Task declares n_classes {t.n_classes!r} for a language model: give 0"
    if t.kind != "lm" and not at_least(t.n_classes, 2):
        return (f"its Task declares n_classes {t.n_classes!r}, and a classifier needs 2 classes or more (labels 0 "
                "to n_classes - 1; a yes/no task has 2, labels 0 and 1)")
    return None


class Parser(argparse.ArgumentParser):
    """argparse whose mistakes are one DataError line, not a usage dump."""

    def error(self, message):
        raise DataError(f"{message} (python -m {self.prog.split()[-1]} --help lists the flags)")


def prepare_args(module, argv, check_tokenizer=None):
    """python -m tasks.X's flags, every one checked before any work: (task name, the loader's keyword arguments).
    They are the keyword arguments of the loaders that module registers (a False one is a switch; a tuple is
    given as "A,B"), with --task to choose among several; check_tokenizer(name, task) checks --tokenizer."""
    names = [n for n, fn in TASKS.items() if fn.__module__ == module]
    if not names:
        raise DataError(f"{module} registers no task, so there is nothing to prepare; python -m tasks.NAME prepares "
                        f"the tasks of: {', '.join(sorted({fn.__module__ for fn in TASKS.values()}))}")
    defaults = {}                                            # flag -> {task: its default}, over the module's tasks
    for n in names:
        for arg in inspect.signature(TASKS[n]).parameters.values():
            if arg.kind is not arg.VAR_KEYWORD:
                defaults.setdefault(arg.name, {})[n] = arg.default
    parser = Parser(prog=f"python -m {module}", description=f"Generate, download or read a task's data once into "
                    f"--cache_dir, as train.py --task NAME does: {', '.join(names)}.")
    parser.add_argument("--task", choices=names, default=names[0] if len(names) == 1 else None,
                        help=f"the task (default: {names[0]})" if len(names) == 1 else "the task (required)")
    for flag, by_task in defaults.items():
        shown = {",".join(map(str, d)) if isinstance(d, tuple) else str(d) for d in by_task.values()}
        text = next((fn.help[flag] for fn in map(TASKS.get, by_task) if flag in fn.help), None) or "default: " + (
            shown.pop() if len(shown) == 1 else ", ".join(f"{v} ({n})" for n, v in by_task.items()))
        d = next(iter(by_task.values()))
        if d is False:
            parser.add_argument(f"--{flag}", action="store_true", default=None, help=text.replace("%", "%%"))
        else:
            parser.add_argument(f"--{flag}", type=int if isinstance(d, int) or flag == "block_size" else str,
                                help=text.replace("%", "%%"))    # (argparse formats help with %)
    args = parser.parse_args(argv)
    if args.task is None:
        raise DataError(f"{module} prepares several tasks: choose one with --task {{{','.join(names)}}}")
    own = inspect.signature(TASKS[args.task]).parameters
    given = {k: v for k, v in vars(args).items() if v is not None and k != "task"}
    other = next((k for k in given if k not in own), None)
    if other:
        raise DataError(f"--{other}: task {args.task} has no such option (python -m {module} --help)")
    if given.get("block_size", 1) < 1:
        raise DataError(f"--block_size {given['block_size']}: allowed is an integer >= 1")
    if given.get("data_dir") == "":
        raise DataError("--data_dir is empty: give the folder (or file) of the task's data")
    if "data_dir" in given and (moot := next((k for k in TASKS[args.task].generated_only if k in given), None)):
        raise DataError(f"--{moot} {given[moot]}: it sets the generated {args.task} examples, and --data_dir's files "
                        "are read instead; leave out one of them")
    cache_dir = given.get("cache_dir", "data")
    if cache_dir_problem(cache_dir):
        raise DataError(f"--cache_dir {cache_dir or repr(cache_dir)}: {cache_dir_problem(cache_dir)}")
    if "tokenizer" in given:
        check_tokenizer(given["tokenizer"], args.task)
    return args.task, given


def prepare_main(module, check_tokenizer=None, argv=None):
    """python -m tasks.X, each task module's entry: a task's files prepared under --cache_dir (nanoGPT's prepare.py)."""
    def prepare():
        name, kw = prepare_args(module, sys.argv[1:] if argv is None else argv, check_tokenizer)
        task = load_task(name, **kw)
        if not task.missing:                                 # (files of some splits alone: those there, below)
            task.open()
        sizes = []
        for s in task.loaders:                               # train, val, test: those the data has
            split = task.split(s)
            if isinstance(split, ShardedSplit):              # made when first needed: make every shard now
                split = split.full()
            sizes.append(f"{s} {len(split.stream) if isinstance(split, LMSplit) else len(split):,}")
        folders = sorted({os.path.dirname(p) for p in task.sources.values() if os.path.isdir(os.path.dirname(p))})
        print(f"{name}: {', '.join(sizes)} {'tokens' if isinstance(split, LMSplit) else 'examples'}, in "
              f"{', '.join(folders) or os.path.join(kw.get('cache_dir', 'data'), name)}")
    run_main(prepare)


# ----------------------------------------------------------------------------------------------
# Splits and tasks

def reopened(a):
    """A memory-mapped array mapped anew for one batch (any other array as it is), as nanoGPT's get_batch does:
    a map kept open keeps every page it has read in the process's memory, the whole file after enough random
    batches (+190 MB on LRA ListOps). The arrays mapped here are whole rows from the file's start (a[:n])."""
    return np.memmap(a.filename, a.dtype, "r", a.offset, a.shape) if isinstance(a, np.memmap) else a


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
        if not len(tokens) == len(self.labels) == len(self.doc_lengths):
            raise ValueError(f"{len(tokens)} rows of tokens, {len(self.labels)} labels and {len(self.doc_lengths)} "
                             "lengths: one of each an example")
        self.lengths = self.doc_lengths.reshape(len(self.labels), -1).max(-1)  # the longer of a pair

    def __len__(self):
        return len(self.labels)

    def subset(self, n):
        return ClassificationSplit(self.tokens[:n], self.labels[:n], self.doc_lengths[:n], self.offset)

    def truncate(self, length):
        """The same examples cut to their first `length` tokens (the stored rows stay whole: a batch is cut to
        its longest example, at most `length`)."""
        if length >= self.tokens.shape[-1]:
            return self
        return ClassificationSplit(self.tokens, self.labels, np.minimum(self.doc_lengths, length), self.offset)

    def _batch(self, idx):
        L = max(int(self.lengths[idx].max()), 1)             # pad only to the longest in the batch
        x = reopened(self.tokens)[idx][..., :L].astype(np.int64)
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
        stream = reopened(self.stream)
        w = np.stack([stream[s:s + self.block_size + 1] for s in starts]).astype(np.int64)
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


class AnswerSplit:
    """N fixed language-model examples whose targets count only at answer positions (tasks/recall.py): inputs
    x (N, L) and targets y (N, L), -1 where there is no answer (the models' loss ignores -1). train.py reports
    the accuracy per answer token and per example (all its answers right) of such a split."""
    answers = True

    def __init__(self, x, y):
        self.x, self.y = x, y

    def __len__(self):
        return len(self.x)

    def subset(self, n):
        return AnswerSplit(self.x[:n], self.y[:n])

    def _batch(self, idx):
        return (torch.from_numpy(reopened(self.x)[idx].astype(np.int64)),
                torch.from_numpy(reopened(self.y)[idx].astype(np.int64)))

    def sample(self, batch_size, rng):
        return self._batch(rng.integers(0, len(self), batch_size))

    def batches(self, batch_size):
        """Every example once, in order."""
        for i in range(0, len(self), batch_size):
            yield self._batch(np.arange(i, min(i + batch_size, len(self))))

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
    meta: dict = field(default_factory=dict, repr=False)     # a cache's meta.json: e.g. the characters of char ids
    _splits: dict = field(default_factory=dict, repr=False)
    MAP_CHUNK = 1 << 24      # values of a mapped file read at a time when its ids' range is sought (mapped_top)

    def __post_init__(self):                                 # numpy integers (ids.max() + 1) as int: JSON writes them
        self.vocab_size, self.block_size, self.n_classes = (int(v) if isinstance(v, np.integer) else v for v in (
            self.vocab_size, self.block_size, self.n_classes))

    def split(self, name):
        if name not in self._splits:
            if name in self.missing:
                raise DataError(self.missing[name])
            if name not in self.loaders:
                raise DataError(f"task {self.name} has no {name} split")
            source = self.sources.get(name, f"the {name} split of {self.name}")
            with reading(source, formats=False):
                split = loader_call(f"the {name} split of task {self.name!r}", self.loaders[name])
                self._splits[name] = self.check(name, split, source)
        return self._splits[name]

    def has(self, name):
        return name in self.loaders

    @property
    def vocabulary(self):
        """What id i stands for where the data defines it, vocabulary[i - 1] (a char run's characters, PTB's words),
        or None. A checkpoint records it: sample.py decodes with it; data that numbers its ids otherwise is refused."""
        return (self.meta or {}).get("chars") or (self.meta or {}).get("words")

    def check(self, name, split, source):
        """A loaded split, checked: a split (what train.py calls on one) of the task's kind, with examples (an
        AnswerSplit's, an answer); a classification split's labels below n_classes, its examples within block_size;
        the token ids it holds (in memory, or a mapped file's, read unless a task did: ids_checked) from 0 to below
        vocab_size; the first batch it gives by sample and by batches fitting the task (check_batch)."""
        api = ("sample", "batches", "tokens_in", "subset", "__len__")
        if not isinstance(split, ShardedSplit) and not all(callable(getattr(split, m, None)) for m in api):
            raise DataError(f"the {name} split of task {self.name!r} (its loader in "
                            f"{getattr(self.loaders[name], '__module__', '?')}) returned {one_line(repr(split), 60)}, "
                            "not a split: return a data.LMSplit, ClassificationSplit or AnswerSplit (or an object "
                            f"with {', '.join(api)})")
        ours = [t for t in (LMSplit, AnswerSplit, ClassificationSplit, ShardedSplit) if isinstance(split, t)][:1]
        if ours and (ours[0] in (LMSplit, AnswerSplit)) != (self.kind == "lm"):
            raise DataError(f"the {name} split of task {self.name!r} is a data.{ours[0].__name__}, and the task's kind "
                            f"is {self.kind!r}: its splits are " + ("LMSplits or AnswerSplits" if self.kind == "lm" else
                                                                    "ClassificationSplits"))
        if not len(split):
            raise DataError(f"{source} ({name} split) gives no examples")
        if isinstance(split, ClassificationSplit):
            check_labels(split.labels, self.n_classes, f"{source} ({name} split)")
            if split.lengths.max() > self.block_size:
                raise DataError(f"{source} ({name} split) holds examples of {split.lengths.max()} tokens, and task "
                                f"{self.name}'s block_size is {self.block_size}: cut them, split.truncate(block_size)")
        if isinstance(split, AnswerSplit) and not any(np.any(reopened(split.y)[i:i + 4096] != -1)
                                                      for i in range(0, len(split), 4096)):   # (the first rows, mostly)
            raise DataError(f"{source} ({name} split) has no answer, its targets y all -1: no accuracy to measure")
        ids = {ClassificationSplit: "tokens", AnswerSplit: "x", LMSplit: "stream"}.get(type(split))
        ids = None if ids is None or getattr(split, "ids_checked", False) else getattr(split, ids)
        mapped, cache = isinstance(ids, np.memmap), os.path.dirname(getattr(ids, "filename", None) or "")
        lo, top = (0, -1) if ids is None or not np.size(ids) else self.mapped_top(ids) if mapped else (
            int(np.min(ids)), int(np.max(ids)))
        lo, top = lo + getattr(split, "offset", 0), top + getattr(split, "offset", 0)
        if lo < 0 or top >= self.vocab_size:
            bad = lo if lo < 0 else top
            raise DataError(f"{ids.filename if mapped else source} ({name} split) holds token id {bad}, and task "
                            f"{self.name}'s vocab_size is {self.vocab_size} (ids 0 to {self.vocab_size - 1}, 0 the "
                            "padding): " + ("no id is negative" if bad < 0 else f"a damaged cache: delete {cache} to "
                                            "rebuild it" if mapped and os.path.isfile(os.path.join(cache, MANIFEST))
                                            else "count every id"))
        for how in () if isinstance(split, ShardedSplit) else ("sample", "batches"):   # (ours, made when needed)
            self.check_batch(name, split, how)
        return split

    @staticmethod
    def mapped_top(a):
        """A mapped array's (smallest, largest) value (unsigned: 0 smallest), MAP_CHUNK at a time, in a new map."""
        flat, n, signed = reopened(a).reshape(-1), Task.MAP_CHUNK, a.dtype.kind != "u"
        ends = [(int(c.min()) if signed else 0, int(c.max())) for c in (flat[i:i + n] for i in range(0, flat.size, n))]
        return min(lo for lo, _ in ends), max(hi for _, hi in ends)

    def check_batch(self, name, split, how):
        """The first batch of split.sample(2, its own generator) or split.batches(2), checked: (x, y) int64 tensors, x
        (B, L) or (B, 2, L), L <= block_size, ids below vocab_size; y as x (lm: ids or -1) or (B,), labels."""
        def first():
            return split.sample(2, np.random.default_rng(0)) if how == "sample" else next(iter(split.batches(2)))
        first.__module__ = type(split).__module__            # (the failure's file and line: the split's)
        what = f"the first batch of the {name} split of task {self.name!r} ({how})"
        batch, lm, pair = loader_call(what, first), self.kind == "lm", self.kind == "match"
        if not (isinstance(batch, (tuple, list)) and len(batch) == 2 and all(torch.is_tensor(t) for t in batch)):
            kinds = f" of {', '.join(type(t).__name__ for t in batch)}" if isinstance(batch, (tuple, list)) else ""
            raise DataError(f"{what} is a {type(batch).__name__}{kinds}, not (x, y), two torch tensors")
        (x, y), (lo, hi) = batch, (-1, self.vocab_size) if lm else (0, self.n_classes)
        if x.dtype != torch.int64 or y.dtype != torch.int64:
            problem = f"has x of {x.dtype} and y of {y.dtype}: both must be torch.int64"
        elif x.dim() != 2 + pair or not len(x) or how == "sample" and len(x) != 2 or pair and x.shape[1] != 2 or not (
                1 <= x.shape[-1] <= self.block_size):
            problem = (f"has x of shape {tuple(x.shape)}: it should be ({'B, 2, L' if pair else 'B, L'}) with B = "
                       f"{2 if how == 'sample' else 'the examples'} and L from 1 to block_size {self.block_size}")
        elif y.shape != (x.shape if lm else x.shape[:1]):
            problem = f"has y of shape {tuple(y.shape)} for x of shape {tuple(x.shape)}: " + (
                "a language model's targets are x's shape" if lm else "a classifier's labels are (B,)")
        elif x.min() < 0 or x.max() >= self.vocab_size:
            problem = (f"holds token id {(x.min() if x.min() < 0 else x.max()).item()}, and task {self.name}'s "
                       f"vocab_size is {self.vocab_size} (ids 0 to {self.vocab_size - 1})")
        elif y.min() < lo or y.max() >= hi:
            bad = (y.min() if y.min() < lo else y.max()).item()
            problem = (f"holds target {bad}: targets are ids 0 to {hi - 1}, or -1 (none)" if lm else
                       f"holds label {bad}, and task {self.name} has {hi} classes (labels 0 to {hi - 1})")
        else:
            return
        raise DataError(f"{what} {problem}")

    def open(self, training=True):
        """Load and check, before any work, every split a run uses (a bad file fails now, not after training):
        training, every split the task has (one the data lacks: an error); an evaluation (training=False), the val
        and test splits the data has (one missing: skipped, said so). Returns the names of those to evaluate."""
        names = [s for s in ("train", "val", "test") if self.has(s) or s in self.missing]
        if not training:
            names = [s for s in names if s != "train"]
            for s in [s for s in names if s in self.missing]:
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

class Terminated(BaseException):
    """SIGTERM (kill, a scheduler's stop) raised where the program is, as Ctrl-C is: its `with` blocks clean up."""


def terminate(signum, frame):
    raise Terminated


def worker_pool(processes):
    """A pool of `processes` spawned workers that ignore Ctrl-C (a terminal sends it to the whole process group: a
    worker caught while it imports would print a traceback); the program stops them. (Ignored as they start; one in
    the pool's first milliseconds is lost: blocking it would not do, starting workers clears a pending SIGINT.)"""
    if threading.current_thread() is not threading.main_thread():   # (signal handlers: the main thread's alone)
        return multiprocessing.get_context("spawn").Pool(processes)
    handler = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        return multiprocessing.get_context("spawn").Pool(processes)
    finally:
        signal.signal(signal.SIGINT, handler)


def run_main(main, *errors):
    """A program's main() (sample.py, analyze.py, bench.py, experiments.py, python -m tasks.X) under train.py's rule:
    bad input (a DataError or one of `errors`) or an OS error on a file or folder it reads or writes is one line on
    stderr, "error: ...", and exit status 2, never a traceback; so is running out of memory; Ctrl-C is one line and
    exit status 130, SIGTERM alike with 143. Returns what main() returns."""
    signal.signal(signal.SIGINT, signal.default_int_handler)   # (a program may ignore Ctrl-C while it imports)
    signal.signal(signal.SIGTERM, terminate)
    escape_unshowable()
    try:
        return main()
    except BrokenPipeError:                                  # the reader of stdout is gone (... | head): quietly
        stopped_by_pipe()
    except (DataError, OSError, *errors) as e:               # (an OS error found while working: a full disk)
        message = error_line(e)
    except (MemoryError, RuntimeError) as e:
        if not out_of_memory(e):
            raise
        message = f"out of memory ({one_line(e, 100) if str(e) else 'MemoryError'}): ask for less (fewer or shorter " \
                  "sequences, a smaller model) or use a device with more memory"
    except (KeyboardInterrupt, Terminated) as e:
        how = "interrupted (Ctrl-C)" if isinstance(e, KeyboardInterrupt) else "terminated (SIGTERM)"
        print(f"{how}: stopped at once; the files written before are as they were", file=sys.stderr)
        sys.exit(130 if isinstance(e, KeyboardInterrupt) else 143)
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def run_program(argv, cwd=None):
    """Run another of the project's programs (python FILE ...) to its end. Its failure, which it has said on stderr
    in one line, is a DataError naming it: the caller stops in one line too, not with a traceback. Ctrl-C or SIGTERM
    here is passed on to it (in a session of its own, it gets the signal once) and waited for: it stops as it would
    alone (its pool's workers, its temporary files), then the caller stops."""
    with subprocess.Popen([sys.executable, *argv], cwd=cwd, start_new_session=True) as process:
        try:
            code = process.wait()
        except (KeyboardInterrupt, Terminated) as e:
            process.send_signal(signal.SIGINT if isinstance(e, KeyboardInterrupt) else signal.SIGTERM)
            process.wait()
            raise
    if code:
        raise DataError(f"{os.path.basename(argv[0])} stopped (exit status {code}); the line above says why")


def stopped_by_pipe():
    """The reader of stdout went away (... | head -1): end quietly, by SIGPIPE as Unix tools do (else exit 1)."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())      # (what is left unflushed goes nowhere)
    if hasattr(signal, "SIGPIPE"):
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGPIPE)
    sys.exit(1)


def escape_unshowable():
    """Text that stdout or stderr cannot encode (é on an ASCII terminal) written escaped (\\xe9), not a traceback."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(AttributeError):            # (a stream replaced by one without it)
            stream.reconfigure(errors="backslashreplace")


def out_of_memory(e):
    """Whether `e` is running out of memory: Python's, a GPU's, torch's CPU allocator's, or "out of memory" (MPS)."""
    return isinstance(e, (MemoryError, torch.OutOfMemoryError)) or isinstance(e, RuntimeError) and any(
        words in str(e) for words in ("CPUAllocator: can't allocate memory", "out of memory"))


def error_line(e):
    """What a program that stops on the error `e` says: its message; for an OS error, the path and the reason (of
    two paths, the one the error is about, or both). One line: a line break (in a path, say) is written \\n."""
    if isinstance(e, OSError):
        where = e.filename or "a file"
        if e.filename2 is not None:                          # os.replace, rename, link: the target's errors name it
            target = e.errno in (errno.EISDIR, errno.EEXIST, errno.ENOTEMPTY)   # (a folder there, or a full one)
            where = f"{e.filename2} (the target of {where})" if target else f"{where} -> {e.filename2}"
        e = f"{where}: {e.strerror or one_line(e, 150)}; check that path (and the free space)"
    return str(e).replace("\r", "\\r").replace("\n", "\\n")


def cache_dir_problem(path):
    """Why --cache_dir cannot be used, or None: a readable folder (its whole caches read there), or one it can write."""
    return None if file_problem(path, folder=True) is None else writable_problem(path)


def writable_problem(path):
    """Why a folder cannot be made or written at `path`, or None: it, or else the nearest folder above it that
    exists, must be a folder this process can write in."""
    if not path.strip():
        return "an empty path; give a folder"
    top = os.path.abspath(path)
    while not os.path.lexists(top):
        top = os.path.dirname(top)
    if os.path.isdir(top) and os.access(top, os.W_OK | os.X_OK):
        return None
    own = top == os.path.abspath(path) and os.path.isfile(top)
    return f"{top} is {'a file, not a folder' if own else 'not a folder this command can write in'}"


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
    """The one way a task finds its files under --data_dir: (folder, {name: path}). The folder is data_dir itself or the
    first of `subdirs` under it (a release's top folder, or folders that hold it) that holds any of `names` or
    `optional`: each of `names` a file there (a folder if it ends in "/"), each optional one absent (path None) or so
    too. Otherwise a DataError: what is wrong, the layout that works."""
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
FORMAT_ERRORS = (EOFError, ValueError, SyntaxError, KeyError, IndexError, TypeError, OverflowError, RecursionError,
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
    """The text of a UTF-8 file (newlines as text mode reads them; a byte-order mark, as Notepad writes, left out)."""
    with reading(path), open(path, encoding="utf-8-sig") as f:
        return f.read()


def read_lines(path):
    """The lines of a UTF-8 text file, one at a time (a byte-order mark, as Excel and Notepad write, left out)."""
    with reading(path), open(path, encoding="utf-8-sig") as f:
        yield from f


def source_key(paths, what=""):
    """A short name for a set of local files, from the path, size and modification time of each: editing or
    replacing any of them gives a new name, so the cache derived from them is rebuilt. A path that is not a
    readable regular file is a DataError (`what` says where it was listed)."""
    h = hashlib.sha1()
    for p in sorted(paths):
        if file_problem(p):                                  # (not a readable regular file)
            raise DataError(f"{p} {file_problem(p)}{what}")
        st = os.stat(p)
        h.update(os.fsencode(os.path.realpath(p)) + f"|{st.st_size}|{st.st_mtime_ns}\n".encode())   # (any name's bytes)
    return "local-" + h.hexdigest()[:10]


def temp_path(path):
    """The name under which this process writes `path` before renaming it into place: path.tmp<pid>."""
    return f"{path}.tmp{os.getpid()}"


def finite(v):
    """A JSON number (not a bool) that is finite as a float: neither nan, inf nor an integer of 400 digits, which
    float() cannot hold (math.isfinite raises OverflowError on it)."""
    return type(v) in (int, float) and abs(v) <= sys.float_info.max


def pid_alive(pid):
    if os.name == "nt":                                      # never guess there: keep everything
        return True
    if not 0 < pid <= 2**22:                                 # (Linux's PID_MAX_LIMIT: no process has such an id)
        return False
    try:
        os.kill(pid, 0)
    except OSError as e:                                     # (EPERM: another user's live process)
        return not isinstance(e, ProcessLookupError)
    return True


def remove_stale_temps(folder, recursive=False, ours=()):
    """Remove what killed processes left in `folder` (and below it): files and folders NAME.tmp<pid> whose process is
    gone (a build or a checkpoint write cut short), and the names in `ours` (an older version's NAME.tmp). A live
    process's (a concurrent build on this machine) are kept; so is a user's notes.tmp."""
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return
    for e in entries:
        m = re.search(r"\.tmp(\d+)$", e.name)              # (a user's notes.tmp in --cache_dir is not ours)
        if e.name in ours or m and not pid_alive(int(m.group(1))):
            with contextlib.suppress(OSError):
                shutil.rmtree(e.path) if e.is_dir(follow_symlinks=False) else os.remove(e.path)
        elif recursive and e.is_dir(follow_symlinks=False):
            remove_stale_temps(e.path, recursive, ours)


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
    with reading(path, "is damaged", f"; delete {os.path.dirname(path)} to rebuild it"), open(
            path, encoding="utf-8-sig") as f:                # (a byte-order mark, as an editor may write: skipped)
        return json.load(f)


# Caches: every set of derived files is a folder, built whole (cached_dir) with a manifest.json written last that
# records each file's size, CRC-32 and stamp; the folder is checked against it before every use (cache_problem).

MANIFEST = "manifest.json"


def file_stamp(path):
    """What changes whenever a file's bytes may have: [size, modification time, status-change time, inode]."""
    st = os.stat(path)
    if not stat.S_ISREG(st.st_mode):                         # (a FIFO's checksum would wait for a writer)
        raise OSError(errno.EINVAL, "not a regular file", path)
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]


def crc32(path):
    c = 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 24):
            c = zlib.crc32(chunk, c)
    return c


def write_manifest(folder, name=None):
    """folder/manifest.json, written last: the size, CRC-32 and stamp of each file below, the name it is built as."""
    files = {}
    for d, _, names in os.walk(folder):
        for p in (os.path.join(d, n) for n in names):
            files[os.path.relpath(p, folder)] = {"size": os.path.getsize(p), "crc32": crc32(p), "stamp": file_stamp(p)}
    files.pop(MANIFEST, None)
    save_json(os.path.join(folder, MANIFEST), {"files": files, "folder": os.path.basename(name or folder)})


def cache_problem(folder, keyed=True):
    """Why a cached folder cannot be used as it is, or None: each manifest file's size (stat calls), its CRC-32 when
    its stamp is not the manifest's (then recorded: a copy's), and (keyed) its name, the key of the files and settings
    it is built from, the one it was built as (not a copy of another cache's files; older manifests have none)."""
    path = os.path.join(folder, MANIFEST)
    problem = file_problem(path)                             # (a FIFO would be waited on)
    if problem and problem != "does not exist":
        return f"has a {MANIFEST} that {problem}"
    try:
        with open(path) as f:
            manifest = json.load(f)
        files, built_as = manifest["files"], manifest.get("folder")
        entries = [(name, int(e["size"]), int(e["crc32"]), list(e["stamp"])) for name, e in files.items()]
    except FileNotFoundError:
        return f"has no {MANIFEST} (a build cut short, or an earlier version's)"
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError):
        return f"has a damaged {MANIFEST}"
    if keyed and built_as not in (None, os.path.basename(os.path.normpath(folder))):
        return f"holds a copy of the cache {built_as!r}, built from other files or settings"
    changed = False
    for name, size, crc, stamp in entries:
        try:
            now = file_stamp(os.path.join(folder, name))
            if now[0] != size:
                return f"has a {name} of {now[0]:,} bytes, not the {size:,} written"
            if now != stamp and crc32(os.path.join(folder, name)) != crc:
                return f"has a {name} whose bytes changed since it was written (another CRC-32)"
        except OSError as e:
            return f"has no readable {name} ({e.strerror or e})"
        changed |= now != stamp
        files[name]["stamp"] = now
    if changed:                                              # (a read-only cache is checked the same way every time)
        with contextlib.suppress(DataError):
            save_json(path, {**manifest, "files": files})
    return None


def cached_dir(folder, build, what=None):
    """`folder`, built once by build(tmp) into a temporary folder that gets its manifest, then renamed into place
    (atomic: a build cut short leaves no half-written cache; what a killed one leaves, the next load_task removes).
    Concurrent builders: the first rename wins. A folder that fails its check (cache_problem) is built again, said
    in one line, and replaced once the new one is whole; a build that cannot write (a read-only folder, a full disk)
    is a one-line DataError, never the damaged folder. Once built, `what` (if given) and where is printed."""
    remove_stale_temps(folder)                               # (a killed restamp's manifest.json.tmp<pid>)
    problem = cache_problem(folder) if os.path.isdir(folder) else None
    if os.path.isdir(folder) and problem is None:
        return folder
    if problem:
        print(f"{folder} {problem}: building it again", flush=True)
    tmp = temp_path(folder)
    try:
        os.makedirs(os.path.dirname(folder) or ".", exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
        build(tmp)
        write_manifest(tmp, folder)
        if os.path.isdir(folder) and cache_problem(folder):  # (not one another process has just built)
            aside = temp_path(folder + ".damaged")
            os.replace(folder, aside)
            shutil.rmtree(aside, ignore_errors=True)
        os.replace(tmp, folder)
    except OSError as e:                                     # fine if another process has just built it
        if not os.path.isdir(folder) or cache_problem(folder):
            raise DataError(f"cannot build the cache {folder} ({e.strerror or one_line(e, 100)}"
                            f"{f': {e.filename}' if e.filename else ''}); make --cache_dir writable, or use "
                            "another") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if what:
        print(f"{what}: cached in {folder}", flush=True)
    return folder


def id_dtype(n):
    """The smallest unsigned type for ids below n."""
    return np.uint8 if n <= 256 else np.uint16 if n <= 65536 else np.uint32


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
    """A classification Task over a cached folder; splits maps split name -> stored split name."""
    def load(stored):                                        # tokens memory-mapped, cut to block_size
        with reading(os.path.join(folder, f"{stored}.*.npy"), "is damaged", f"; delete {folder} to rebuild it"):
            tokens, labels, lengths = (np.load(os.path.join(folder, f"{stored}.{a}.npy"), mmap_mode=mode)
                                       for a, mode in (("tokens", "r"), ("labels", None), ("lengths", None)))
            return ClassificationSplit(tokens, labels, lengths, offset).truncate(block_size)

    return Task(name, kind, vocab_size, block_size, n_classes, {s: (lambda f=f: load(f)) for s, f in splits.items()},
                sources={s: os.path.join(folder, f"{f}.*.npy") for s, f in splits.items()})
