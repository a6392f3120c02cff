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
"""

import multiprocessing
import os
import random
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


def load_task(name, **kw):
    if name not in TASKS:
        raise DataError(f"unknown task {name!r}; choose one of: {', '.join(TASKS)}")
    return TASKS[name](**kw)


# ----------------------------------------------------------------------------------------------
# Splits and tasks

class ClassificationSplit:
    """N examples: tokens (N, L) or (N, 2, L) for pairs, padded with 0; lengths (N,); labels (N,)."""

    def __init__(self, tokens, labels):
        self.tokens, self.labels = tokens, np.asarray(labels, dtype=np.int64)
        self.lengths = (tokens != 0).reshape(len(tokens), -1, tokens.shape[-1]).sum(-1).max(-1)

    def __len__(self):
        return len(self.labels)

    def subset(self, n):
        return ClassificationSplit(self.tokens[:n], self.labels[:n])

    def _batch(self, idx):
        L = max(int(self.lengths[idx].max()), 1)             # pad only to the longest in the batch
        x = torch.from_numpy(self.tokens[idx][..., :L].astype(np.int64))
        return x, torch.from_numpy(self.labels[idx])

    def sample(self, batch_size, rng):
        return self._batch(rng.integers(0, len(self), batch_size))

    def batches(self, batch_size):
        """Every example once, in batches of similar lengths (less padding)."""
        order = np.argsort(self.lengths, kind="stable")
        for i in range(0, len(order), batch_size):
            yield self._batch(order[i:i + batch_size])

    def tokens_in(self, x):
        return int((x != 0).sum())


class LMSplit:
    """One long stream of token ids; an example is a window of block_size tokens and the next ones."""

    def __init__(self, stream, block_size):
        self.stream, self.block_size = stream, block_size
        if len(stream) <= block_size:
            raise DataError(f"a language-model split has {len(stream)} tokens, fewer than block_size + 1")

    def __len__(self):                                       # non-overlapping windows
        return (len(self.stream) - 1) // self.block_size

    def subset(self, n):
        return LMSplit(self.stream[:n], self.block_size)

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
    _splits: dict = field(default_factory=dict, repr=False)

    def split(self, name):
        if name not in self._splits:
            if name not in self.loaders:
                raise DataError(f"task {self.name} has no {name} split")
            self._splits[name] = self.loaders[name]()
        return self._splits[name]

    def has(self, name):
        return name in self.loaders


def atomic_write_text(path, text):
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def find_file(data_dir, names, what):
    """The first of `names` (paths relative to data_dir) that exists, or a DataError that says where to put it."""
    for name in names:
        path = os.path.join(data_dir, name)
        if os.path.isfile(path):
            return path
    raise DataError(f"{what}: no {names[0]} under --data_dir {data_dir} (looked for {', '.join(names)})")


# ----------------------------------------------------------------------------------------------
# ListOps (Nangia & Bowman 2018), generated exactly by the Long Range Arena recipe
# (google-research/long-range-arena, lra_benchmarks/data/listops.py):
#   a tree grows from depth 1; below depth 10 a node is a leaf (a digit 0-9) with probability 0.75, at depth
#   10 always; otherwise it is an operator MIN, MAX, MED (median, rounded down) or SM (sum mod 10) with
#   2-10 children. Length counts tokens without parentheses; 500 < length < 2000 is kept; the trees are
#   distinct; 96,000 / 2,000 / 2,000 for train / val / test. MAX(2, 9) is written ( ( ( [MAX 2 ) 9 ) ] ).

LISTOPS_OPS = ("[MIN", "[MAX", "[MED", "[SM")
LISTOPS_VOCAB = ("<pad>", "0", "1", "2", "3", "4", "5", "6", "7", "8", "9", *LISTOPS_OPS, "]")
LISTOPS_SIZES = {"train": 96_000, "val": 2_000, "test": 2_000}


class _TooLong(Exception):
    pass


def listops_operator(depth, rnd, budget):
    """Draw an operator node at `depth` and its subtree: (LRA string, value, length without parentheses).
    Raises _TooLong as soon as the tree reaches `budget` tokens (it would be rejected anyway)."""
    k = 2 + int(rnd() * 9)                                   # 2..10 children
    parts, values, length = [], [], 2                        # the operator token and "]"
    for _ in range(k):
        if depth + 1 < 10 and rnd() <= 0.25:                 # an operator child
            s, v, n = listops_operator(depth + 1, rnd, budget - length)
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


def listops_chunk(args):
    """`count` distinct ListOps examples drawn with their own seed, so chunks can run in parallel."""
    seed, count, min_len, max_len = args
    rnd = random.Random(f"listops-{seed[0]}-{seed[1]}").random
    out = {}
    while len(out) < count:
        if rnd() > 0.25:                                     # the root is a leaf: length 1, rejected
            rnd()
            continue
        try:
            s, value, n = listops_operator(1, rnd, max_len)
        except _TooLong:
            continue
        if min_len < n < max_len:
            out.setdefault(s, value)
    return list(out.items())


def generate_listops(n, seed=0, min_len=500, max_len=2000, chunk=1000):
    """n distinct (string, label) examples, the same for a seed whatever the number of processes."""
    jobs = [((seed, i), chunk, min_len, max_len) for i in range(n // chunk + 2)]  # a little spare for duplicates
    seen = {}
    with multiprocessing.get_context("spawn").Pool(min(os.cpu_count() or 1, 8)) as pool:
        for examples in pool.imap(listops_chunk, jobs):      # in order: deterministic
            for s, value in examples:
                seen.setdefault(s, value)
            if len(seen) >= n:
                pool.terminate()
                break
    return list(seen.items())[:n]


_LISTOPS_CHARS = {"[MIN": "\x01", "[MAX": "\x02", "[MED": "\x03", "[SM": "\x04"}  # one character each
_LISTOPS_LUT = np.full(256, 255, dtype=np.uint8)
for _i, _tok in enumerate(LISTOPS_VOCAB[1:], start=1):
    _LISTOPS_LUT[ord(_LISTOPS_CHARS.get(_tok, _tok))] = _i


def listops_tokens(text):
    """LRA ListOps string -> token ids (uint8). Drops "(" and ")" but keeps "]" as its own token. (LRA's
    official tokenizer dropped every bracket, "]" too, so the tree could not be read back: a known bug,
    LRA issues #6 and #14.) Raises ValueError on a symbol outside the 15 of ListOps."""
    short = text
    for op, ch in _LISTOPS_CHARS.items():
        short = short.replace(op, ch)
    toks = short.replace("(", " ").replace(")", " ").split()
    chars = "".join(toks)
    ids = _LISTOPS_LUT[np.frombuffer(chars.encode(), dtype=np.uint8)]
    if len(chars) != len(toks) or (ids == 255).any():       # a token longer than one symbol, or unknown
        bad = next(t for t in text.replace("(", " ").replace(")", " ").split() if t not in LISTOPS_VOCAB[1:])
        raise ValueError(f"unknown symbol {bad!r}")
    return ids


def read_listops_tsv(path, block_size):
    """LRA's basic_*.tsv: a header "Source<TAB>Target", then one tree and its value per line."""
    rows, labels = [], []
    with open(path) as f:
        for lineno, line in enumerate(f, 1):
            if lineno == 1 and line.startswith("Source"):
                continue
            if not line.strip():
                continue
            parts = line.rstrip("\n").split("\t")
            try:
                if len(parts) != 2:
                    raise ValueError(f"expected 2 tab-separated fields, found {len(parts)}")
                label = int(parts[1])
                if not 0 <= label <= 9:
                    raise ValueError(f"label {label} is not a digit 0-9")
                ids = listops_tokens(parts[0])
                if not len(ids):
                    raise ValueError("empty expression")
            except ValueError as e:
                raise DataError(f"{path}, line {lineno}: malformed ListOps row ({e})") from None
            rows.append(ids[:block_size])
            labels.append(label)
    if not rows:
        raise DataError(f"{path} holds no examples")
    tokens = np.zeros((len(rows), max(map(len, rows))), dtype=np.uint8)
    for i, ids in enumerate(rows):
        tokens[i, :len(ids)] = ids
    return ClassificationSplit(tokens, labels)


def write_listops_tsv(path, examples):
    atomic_write_text(path, "Source\tTarget\n" + "".join(f"{s}\t{v}\n" for s, v in examples))


@task("listops")
def listops(cache_dir="data", data_dir=None, block_size=2000, **_):
    names = {split: f"basic_{split}.tsv" for split in LISTOPS_SIZES}
    if data_dir is not None:                                 # LRA's release: lra_release/listops-1000/
        if not os.path.isdir(data_dir):
            raise DataError(f"listops: --data_dir {data_dir} is not a folder; it should hold LRA's basic_test.tsv "
                            "(and basic_train.tsv, basic_val.tsv to train)")
        sub = os.path.join(data_dir, "listops-1000")
        folder = sub if os.path.isdir(sub) else data_dir
        paths = {s: os.path.join(folder, n) for s, n in names.items() if os.path.isfile(os.path.join(folder, n))}
        if not paths:
            raise DataError(f"listops: no basic_train.tsv, basic_val.tsv or basic_test.tsv in --data_dir {data_dir}")
    else:                                                    # generate once, then reuse
        folder = os.path.join(cache_dir, "listops")
        paths = {s: os.path.join(folder, n) for s, n in names.items()}
        if not all(os.path.isfile(p) for p in paths.values()):
            os.makedirs(folder, exist_ok=True)
            # a benchmark, so one fixed draw (seed 0) whatever the run's --seed
            print(f"generating ListOps (LRA recipe) into {folder}, about a minute ...", flush=True)
            examples = generate_listops(sum(LISTOPS_SIZES.values()), seed=0)
            start = 0
            for split, size in LISTOPS_SIZES.items():
                write_listops_tsv(paths[split], examples[start:start + size])
                start += size
    loaders = {s: (lambda p=p: read_listops_tsv(p, block_size)) for s, p in paths.items()}
    return Task("listops", "cls", len(LISTOPS_VOCAB), block_size, 10, loaders)


# ----------------------------------------------------------------------------------------------
# Penn Treebank, word level (Mikolov's release: ptb.{train,valid,test}.txt, 10k words with <unk>)

def read_words(path):
    with open(path) as f:
        return [w for line in f for w in line.split() + ["<eos>"]]


@task("ptb")
def ptb(data_dir=None, block_size=35, **_):
    if data_dir is None:
        raise DataError("ptb: no Penn Treebank here; pass --data_dir DIR with ptb.train.txt, ptb.valid.txt, "
                        "ptb.test.txt (Mikolov's release)")
    files = {s: find_file(data_dir, [f"ptb.{f}.txt"], "ptb") for s, f in
             (("train", "train"), ("val", "valid"), ("test", "test"))}
    words = {s: read_words(p) for s, p in files.items()}
    vocab = {w: i for i, w in enumerate(sorted(set(words["train"])), start=1)}  # 0 is padding
    for s, ws in words.items():
        unknown = next((w for w in ws if w not in vocab), None)
        if unknown is not None:
            raise DataError(f"{files[s]}: word {unknown!r} is not in the training vocabulary")
    streams = {s: np.array([vocab[w] for w in ws], dtype=np.int32) for s, ws in words.items()}
    loaders = {s: (lambda a=a: LMSplit(a, block_size)) for s, a in streams.items()}
    return Task("ptb", "lm", len(vocab) + 1, block_size, 0, loaders)
