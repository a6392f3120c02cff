"""
Recall: three synthetic language-model tasks that ask what a sequence mixer can hold, generated here.

    mqar       multi-query associative recall (Arora et al. 2023, Zoology): P key-value pairs, then each key asked again
    copy       selective copying (Gu & Dao 2023, Mamba §4.1.1): a few data tokens among noise, repeated after a marker
    induction  induction heads (Olsson et al. 2022; Mamba §4.1.2): after a trigger's second occurrence, the token that
               followed its first

Every example is a row of token ids x (L,) and a row of targets y (L,) that is -1 except at the answer positions:
the loss (the models' cross-entropy ignores -1) and the accuracy count only the answers. Token 0 is padding and is
never used. Each split is one fixed draw from its own seed (train 0, val 1, test 2, as
ListOps: every run of a setting sees the same examples), cached under data/recall/; --data_dir reads examples
made elsewhere from a plain file (docs/tasks.md: one example a line, input ids, a tab, the targets with - where
there is no answer).
"""

import inspect
import os
import re

import numpy as np

from data import (AnswerSplit, DataError, Task, atomic_write_text, cached_dir, file_problem, id_dtype, prepare_main,
                  read_lines, reading, task)

MQAR_POWER_A = 0.01        # Zoology's power law for the query gaps: p(g) proportional to g^(a - 1), g = 1, 2, ...
NOISE, MARKER = 1, 2       # copy: the noise token and the marker that starts the answer
TRIGGER = 1                # induction: the trigger token
FIRST_ID = {"mqar": 1, "copy": 3, "induction": 2}   # the first id of each task's ordinary tokens


def _distinct(rng, n, k, low, high):
    """n rows of k distinct ids from low..high-1, each row a uniformly random ordered draw: (n, k) int64."""
    r = rng.random((n, high - low))
    pick = np.argpartition(r, k - 1, axis=1)[:, :k]                    # the k smallest draws, in no set order
    order = np.argsort(np.take_along_axis(r, pick, 1), axis=1)         # ... ordered by their draws
    return np.take_along_axis(pick, order, 1) + low


def power_law(space, a=MQAR_POWER_A):
    """The probability of each query slot g = 0 .. space-1 (gap g + 1 after the pairs): (g + 1)^(a - 1), normalised."""
    p = (np.arange(1, space + 1, dtype=np.float64)) ** (a - 1)
    return p / p.sum()


def mqar(n, length=64, pairs=4, vocab=128, seed=0, power_a=MQAR_POWER_A, chunk=2048):
    """Multi-query associative recall as Zoology defines it, n examples: (x, y), each (n, length) int64.

    The vocabulary (ids 1 .. vocab-1; 0 is padding) is cut in two: keys are ids 1 .. vocab/2 - 1, values
    vocab/2 .. vocab-1. An example first lists P = `pairs` pairs, key then value, with P distinct keys and P
    distinct values. The rest, length - 2P tokens, is cut into slots of two tokens; P distinct slots are drawn
    one after the other, slot g with probability proportional to (g + 1)^(a - 1) among those left (a = 0.01:
    nearly 1/(g + 1), so most queries come soon after the pairs, a few far), and the i-th drawn slot asks the
    i-th pair's key again at its first token. The target at that position is the key's value: the model reads
    the key and must say what followed it in the list. Every other token of the query part is random filler
    (any id 1 .. vocab-1), with no target.

    Worked example: vocab 16 (keys 1-7, values 8-15), length 16, 2 pairs (3, 12) and (6, 9); the 6 slots after
    the 4 pair tokens start at positions 4, 6, ..., 14; slots 3 and 0 drawn, so key 3 is asked at position 4 + 2*3
    = 10 and key 6 at position 4:

        position  0  1  2  3  4  5  6  7  8  9 10 11 12 13 14 15
        x         3 12  6  9  6 14  5  2 11  7  3 13  1  8 15  4      (5, 14, 2, ... filler)
        y         -  -  -  -  9  -  -  -  -  -  12 -  -  -  -  -
    """
    if 4 * pairs > length or pairs > vocab // 2 - 1:
        raise ValueError(f"mqar: {pairs} pairs need length >= {4 * pairs} and vocab >= {2 * pairs + 2}")
    rng = np.random.default_rng(seed)
    keys_end, space = vocab // 2, (length - 2 * pairs) // 2
    log_p = np.log(power_law(space, power_a))
    xs, ys = [], []
    for start in range(0, n, chunk):
        m = min(chunk, n - start)
        keys = _distinct(rng, m, pairs, 1, keys_end)                        # (m, P)
        values = _distinct(rng, m, pairs, keys_end, vocab)                  # (m, P)
        x = rng.integers(1, vocab, (m, length))                             # filler everywhere, then the rest
        y = np.full((m, length), -1, dtype=np.int64)
        x[:, 0:2 * pairs:2], x[:, 1:2 * pairs:2] = keys, values
        # P slots drawn without replacement, in order, with probabilities power_law: the P largest of
        # log p + Gumbel noise, largest first (the Gumbel top-k trick)
        score = log_p + rng.gumbel(size=(m, space))
        slots = np.argsort(-score, axis=1, kind="stable")[:, :pairs]     # (m, P) slot of pair i's query
        where = 2 * pairs + 2 * slots                                       # its position
        np.put_along_axis(x, where, keys, 1)
        np.put_along_axis(y, where, values, 1)
        xs.append(x)
        ys.append(y)
    return np.concatenate(xs), np.concatenate(ys)


def selective_copy(n, length=64, tokens=4, vocab=16, seed=0):
    """Selective copying (Mamba §4.1.1), n examples: (x, y), each (n, length) int64.

    Ids: 1 noise, 2 the marker, 3 .. vocab-1 data. The first R = length - tokens positions are noise with
    `tokens` data tokens (drawn at random, repeats allowed) at distinct random positions; then the marker; then
    the data tokens again but the last. Targets: at the marker the first data token, at each repeated data token
    the next one, so a model that reads its own answers back (teacher forcing) must name the data tokens in order.

    Worked example: length 10, 3 data tokens 7, 4, 7 at positions 1, 2, 5 of the R = 7 region:

        position  0  1  2  3  4  5  6  7  8  9
        x         1  7  4  1  1  7  1  2  7  4
        y         -  -  -  -  -  -  -  7  4  7
    """
    if tokens < 1 or length - tokens < tokens + 1 or vocab < 4:
        raise ValueError(f"copy: {tokens} data tokens need length >= {2 * tokens + 1} and vocab >= 4")
    rng = np.random.default_rng(seed)
    R = length - tokens
    d = rng.integers(FIRST_ID["copy"], vocab, (n, tokens))                  # (n, T) the data, in order
    where = np.sort(_distinct(rng, n, tokens, 0, R), axis=1)                # (n, T) their positions
    x = np.full((n, length), NOISE, dtype=np.int64)
    np.put_along_axis(x, where, d, 1)
    x[:, R] = MARKER
    x[:, R + 1:] = d[:, :-1]
    y = np.full((n, length), -1, dtype=np.int64)
    y[:, R:] = d
    return x, y


def induction(n, length=64, vocab=16, seed=0):
    """Induction heads (Mamba §4.1.2), n examples: (x, y), each (n, length) int64.

    Ids: 1 the trigger, 2 .. vocab-1 ordinary. A row of random ordinary tokens; the trigger at a random position
    p in 0 .. length-3 and again at the last position; the one target, at the last position, is x[p + 1], the token
    that followed the trigger's first occurrence.

    Worked example: length 8, trigger at p = 2 followed by 9:

        position  0  1  2  3  4  5  6  7
        x         5 12  1  9  3  3 14  1
        y         -  -  -  -  -  -  -  9
    """
    if length < 3 or vocab < 3:
        raise ValueError("induction: length >= 3 and vocab >= 3")
    rng = np.random.default_rng(seed)
    x = rng.integers(FIRST_ID["induction"], vocab, (n, length))
    p = rng.integers(0, length - 2, n)                                       # 0 .. length-3
    rows = np.arange(n)
    x[rows, p] = TRIGGER
    x[:, -1] = TRIGGER
    y = np.full((n, length), -1, dtype=np.int64)
    y[:, -1] = x[rows, p + 1]
    return x, y


# ----------------------------------------------------------------------------------------------
# The tasks: generated and cached, or read from plain files of examples

GENERATORS = {"mqar": mqar, "copy": selective_copy, "induction": induction}
# the defaults of each task (train.py --recall_*): Zoology's first MQAR setting at a CPU's vocabulary; Mamba's
# vocabulary of 16 for copying and induction
DEFAULTS = {"mqar": dict(length=64, pairs=4, vocab=128), "copy": dict(length=64, pairs=4, vocab=16),
            "induction": dict(length=64, pairs=None, vocab=16)}
RECALL_MOST_LEN, RECALL_MOST_BYTES = 16_384, 4 * 2**30   # a setting's bounds: the arrays made in memory (int64)
SIZES = (100_000, 1_000, 3_000)            # train, val, test examples; Zoology's MQAR: 100,000 and 3,000
SPLITS = ("train", "val", "test")          # drawn from the seeds 0, 1, 2
FORMAT = ("one example a line: the input ids separated by spaces, a tab, then as many targets, each an id or - "
          "where there is no answer (docs/tasks.md)")


def _ints(value, n, flag, example):
    parts = str(value).replace(" ", "").split(",") if value is not None else []
    try:
        out = tuple(int(p) for p in parts)
    except ValueError:
        out = ()
    if len(out) != n:
        raise DataError(f"--{flag} expects {example}, not {value!r}")
    return out


def setting(name, recall_len=None, recall_pairs=None, recall_vocab=None, recall_sizes=None, files=False):
    """The task's options checked (ints or strings; None: the task's default): (length, pairs, vocab, sizes), or a
    DataError of one line before anything is generated. files: --data_dir's examples, which are read, not generated:
    the length and the vocabulary alone (pairs and sizes None), without the generator's bounds (the files are
    checked for themselves, each id within the vocabulary)."""
    d = DEFAULTS[name]
    (length,) = _ints(d["length"] if recall_len is None else recall_len, 1, "recall_len", "one integer, e.g. 64")
    (vocab,) = _ints(d["vocab"] if recall_vocab is None else recall_vocab, 1, "recall_vocab", "one integer, e.g. 128")
    if files:
        if not 2 <= vocab <= 65535:
            raise DataError(f"--recall_vocab {vocab}: allowed is an integer from 2 to 65535 (the files' ids are 1 .. "
                            "V-1; 0 is padding)")
        return length, None, vocab, None
    pairs = None
    if name != "induction":
        (pairs,) = _ints(d["pairs"] if recall_pairs is None else recall_pairs, 1, "recall_pairs", "one integer, e.g. 4")
    sizes = _ints(",".join(map(str, SIZES)) if recall_sizes is None else recall_sizes, 3, "recall_sizes",
                  "TRAIN,VAL,TEST numbers of examples, e.g. 100000,1000,3000")
    if min(sizes) < 1:
        raise DataError(f"--recall_sizes {','.join(map(str, sizes))}: three numbers of examples >= 1")
    if pairs is not None and pairs < 1:
        raise DataError(f"--recall_pairs {pairs}: allowed is an integer >= 1")
    if vocab > 65535:
        raise DataError(f"--recall_vocab {vocab}: allowed is at most 65535")
    if length > RECALL_MOST_LEN or 16 * sum(sizes) * length > RECALL_MOST_BYTES:
        raise DataError(f"{name}: --recall_sizes {','.join(map(str, sizes))} of --recall_len {length} tokens: allowed "
                        f"are {RECALL_MOST_LEN:,} tokens and {RECALL_MOST_BYTES / 2**30:g} GiB of examples "
                        "(examples x tokens x 16 bytes) at most; the default 104,000 of 64 tokens take 0.1 GiB")
    min_len, min_vocab, what = {"mqar": (4 * (pairs or 0), 2 * (pairs or 0) + 2, f"{pairs} pairs"),
                                "copy": (2 * (pairs or 0) + 1, 4, f"{pairs} data tokens"),
                                "induction": (3, 3, "its trigger")}[name]
    if length < min_len or vocab < min_vocab:
        raise DataError(f"{name}: {what} need --recall_len >= {min_len} and --recall_vocab >= {min_vocab} "
                        f"(given {length} and {vocab})")
    return length, pairs, vocab, sizes


def generate(name, length, pairs, vocab, n, seed):
    if name == "induction":
        return induction(n, length, vocab, seed)
    return GENERATORS[name](n, length, pairs, vocab, seed)


def write_examples(path, x, y):
    """The plain format: input ids, a tab, targets (- where there is none), one example a line."""
    lines = (" ".join(map(str, xi)) + "\t" + " ".join("-" if t < 0 else str(t) for t in yi) for xi, yi in zip(x, y))
    atomic_write_text(path, "".join(line + "\n" for line in lines))


def read_examples(path, vocab, block_size=None):
    """The examples of a plain file: (x, y) as (N, L) arrays, every id checked; a DataError of one line naming the
    file and line otherwise. Lines that are empty or start with # are skipped."""
    problem = file_problem(path)
    if problem:
        raise DataError(f"recall: {path} {problem}; it should hold {FORMAT}")
    xs, ys = [], []
    for lineno, line in enumerate(read_lines(path), 1):
        if not line.strip() or line.startswith("#"):
            continue
        where = f"{path}, line {lineno}"
        fields = line.rstrip("\r\n").split("\t")
        if len(fields) != 2:
            raise DataError(f"{where}: {len(fields)} tab-separated fields, not 2; the format: {FORMAT}")
        x, y = fields[0].split(), fields[1].split()
        odd = next((t for t in x + [t for t in y if t != "-"] if not re.fullmatch(r"[0-9]+", t)), None)
        if odd is not None:                                  # int() would read "-1", "1_0" and "١"
            raise DataError(f"{where}: {odd!r} is not an id (digits 0-9, or - among the targets)")
        x, y = [int(t) for t in x], [-1 if t == "-" else int(t) for t in y]
        if len(x) != len(y) or not x:
            raise DataError(f"{where}: {len(x)} input ids but {len(y)} targets; every input id needs its target")
        if xs and len(x) != len(xs[0]):
            raise DataError(f"{where}: {len(x)} tokens, where the first example has {len(xs[0])}; every example of "
                            "a file has one length")
        bad = next((t for t in x + [t for t in y if t != -1] if not 1 <= t < vocab), None)
        if bad is not None:
            raise DataError(f"{where}: id {bad} is outside 1 .. {vocab - 1} (the vocabulary, --recall_vocab {vocab}; "
                            "0 is padding)")
        if all(t == -1 for t in y):
            raise DataError(f"{where}: no answer (every target is -); an example needs at least one")
        xs.append(x)
        ys.append(y)
    if not xs:
        raise DataError(f"recall: {path} holds no examples; it should hold {FORMAT}")
    if block_size is not None and len(xs[0]) > block_size:
        raise DataError(f"recall: the examples of {path} have {len(xs[0])} tokens, more than the model's "
                        f"block_size {block_size}")
    return np.array(xs, dtype=np.int64), np.array(ys, dtype=np.int64)


def file_task(name, data_dir, vocab, block_size, recall_len=None):
    """--data_dir: a folder with train.txt, val.txt and test.txt (those there), or one file, the test split; their
    examples' length is --recall_len's where that is set (given, or a checkpoint's)."""
    if os.path.isdir(data_dir):
        paths = {s: os.path.join(data_dir, f"{s}.txt") for s in SPLITS if os.path.lexists(os.path.join(data_dir, f"{s}.txt"))}
        if not paths:
            raise DataError(f"{name}: --data_dir {data_dir} holds no train.txt, val.txt or test.txt; each holds {FORMAT}")
    else:
        paths = {"test": data_dir}
    read = {s: read_examples(p, vocab, block_size) for s, p in paths.items()}
    length = max(x.shape[1] for x, _ in read.values())
    if any(x.shape[1] != length for x, _ in read.values()):
        raise DataError(f"{name}: the files of {data_dir} hold examples of different lengths "
                        f"({', '.join(f'{s} {x.shape[1]}' for s, (x, _) in read.items())})")
    if recall_len not in (None, length):
        raise DataError(f"{name}: the examples of --data_dir {data_dir} are {length} tokens long, not --recall_len "
                        f"{recall_len} (given, or the checkpoint's): give --recall_len {length}, or other files")
    where = (f"no {{}}.txt in {data_dir}" if os.path.isdir(data_dir) else
             f"--data_dir {data_dir} is one file, read as the test split (a folder holds train.txt, val.txt, test.txt)")
    missing = {s: f"{name}: {where.format(s)}" for s in SPLITS if s not in paths}
    return Task(name, "lm", vocab, block_size or length, 0,
                {s: (lambda s=s: AnswerSplit(*read[s])) for s in read}, missing, paths)


def recall_task(name, cache_dir, data_dir, block_size, recall_len, recall_pairs, recall_vocab, recall_sizes, txt):
    length, pairs, vocab, sizes = setting(name, recall_len, recall_pairs, recall_vocab, recall_sizes,
                                          files=data_dir is not None)
    if data_dir is not None and txt:
        raise DataError(f"{name}: --txt writes the generated examples as plain files; --data_dir's are plain files "
                        "already")
    if data_dir is not None:
        return file_task(name, data_dir, vocab, block_size, None if recall_len is None else length)
    if block_size is not None and block_size < length:
        raise DataError(f"{name}: --block_size {block_size} is shorter than the examples (--recall_len {length})")
    folder = os.path.join(cache_dir, "recall", f"{name}-len{length}" + (f"-pairs{pairs}" if pairs else "") +
                          f"-vocab{vocab}-n{'-'.join(map(str, sizes))}")

    def build(out):
        for seed, (split, n) in enumerate(zip(SPLITS, sizes)):
            x, y = generate(name, length, pairs, vocab, n, seed)
            np.save(os.path.join(out, f"{split}.x.npy"), x.astype(id_dtype(vocab)))
            np.save(os.path.join(out, f"{split}.y.npy"), y.astype(np.int32))

    cached_dir(folder, build, f"{name}: {'/'.join(map(str, sizes))} examples generated")
    if txt:
        for split in SPLITS:
            write_examples(os.path.join(folder, f"{split}.txt"), *load(folder, split, vocab))
        print(f"{name}: wrote train.txt, val.txt and test.txt into {folder}", flush=True)
    return Task(name, "lm", vocab, block_size or length, 0, {s: (lambda s=s: AnswerSplit(*load(folder, s, vocab)))
                                                               for s in SPLITS},
                sources={s: os.path.join(folder, f"{s}.*.npy") for s in SPLITS})


def load(folder, split, vocab):
    """A split's cached arrays, checked: ids within the vocabulary, targets -1 (none) or an id, the shapes alike."""
    with reading(os.path.join(folder, f"{split}.*.npy"), "is damaged", f"; delete {folder} to rebuild it"):
        x, y = (np.load(os.path.join(folder, f"{split}.{a}.npy"), mmap_mode="r") for a in ("x", "y"))
        fits = (x.ndim == 2 and x.shape == y.shape and x.dtype.kind in "iu" and y.dtype.kind == "i"
                and (x.size == 0 or 0 <= x.min() and x.max() < vocab and -1 <= y.min() and y.max() < vocab))
    if not fits:
        raise DataError(f"{folder}/{split}.*.npy: not this task's examples (ids outside 0 .. {vocab - 1}, or arrays "
                        f"of other kinds or shapes); delete {folder} to rebuild it")
    return x, y


HELP = {"recall_len": "tokens per example (default 64)",
        "recall_pairs": "mqar: key-value pairs (default 4); copy: data tokens to copy (default 4)",
        "recall_vocab": "the vocabulary, ids 1..V-1 (default: mqar 128, copy and induction 16)",
        "recall_sizes": "TRAIN,VAL,TEST numbers of examples (default 100000,1000,3000)",
        "txt": "also write the splits as train.txt, val.txt and test.txt (the plain format of docs/tasks.md) into "
               "the cache folder"}


def _loader(name):
    def load_recall(cache_dir="data", data_dir=None, block_size=None, recall_len=None, recall_pairs=None,
                    recall_vocab=None, recall_sizes=None, txt=False, **_):
        return recall_task(name, cache_dir, data_dir, block_size, recall_len, recall_pairs, recall_vocab,
                           recall_sizes, txt)
    load_recall.__doc__ = f"The {name} task (tasks/recall.py): generated, or --data_dir's plain files."
    own = inspect.signature(load_recall)
    if name == "induction":                                  # no pairs: --recall_pairs is no setting of it
        own = own.replace(parameters=[p for p in own.parameters.values() if p.name != "recall_pairs"])
        load_recall.__signature__ = own
    return task(name, help={k: v for k, v in HELP.items() if k in own.parameters},
                generated_only=tuple(k for k in ("recall_pairs", "recall_sizes") if k in own.parameters))(load_recall)


mqar_task, copy_task, induction_task = map(_loader, GENERATORS)


if __name__ == "__main__":                                   # python -m tasks.recall --task mqar: prepare its files alone
    prepare_main("tasks.recall")
