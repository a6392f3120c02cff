"""
ListOps (Nangia & Bowman 2018), generated exactly by the Long Range Arena recipe
(google-research/long-range-arena, lra_benchmarks/data/listops.py):
  a tree grows from depth 1; below depth 10 a node is a leaf (a digit 0-9) with probability 0.75, at depth
  10 always; otherwise it is an operator MIN, MAX, MED (median, rounded down) or SM (sum mod 10) with
  2-10 children. Length counts tokens without parentheses; 500 < length < 2000 is kept; the trees are
  distinct; 96,000 / 2,000 / 2,000 for train / val / test. MAX(2, 9) is written ( ( ( [MAX 2 ) 9 ) ] ).
The depth, the argument range, the length window and the split sizes are options of the task
(train.py --listops_depth, --listops_args, --listops_len, --listops_sizes); the LRA values are the default.
"""

import contextlib
import glob
import hashlib
import math
import multiprocessing
import os
import random
import shutil
from dataclasses import dataclass

import numpy as np

from data import (ClassificationSplit, DataError, Task, atomic_write_text, cached_dir, one_line, prepare_main, release,
                  task)


LISTOPS_OPS = ("[MIN", "[MAX", "[MED", "[SM")
LISTOPS_VOCAB = ("<pad>", "0", "1", "2", "3", "4", "5", "6", "7", "8", "9", *LISTOPS_OPS, "]")
LISTOPS_SIZES = {"train": 96_000, "val": 2_000, "test": 2_000}
LISTOPS_DEPTH = 10              # nodes at this depth are leaves: operators sit at depths 1 .. 9
LISTOPS_ARGS = (2, 10)          # arguments of an operator, both ends included
LISTOPS_LEN = (500, 2000)       # a tree is kept when MIN < length < MAX (tokens without parentheses)
LISTOPS_OP_P = 0.25             # below the depth limit a node is an operator with this probability
LISTOPS_FIRST_OP = LISTOPS_VOCAB.index(LISTOPS_OPS[0])   # token ids: digit v is v + 1, operators 11-14, "]" 15
LISTOPS_END = LISTOPS_VOCAB.index("]")


def _median(values):                                         # numpy.median, truncated to int
    v = sorted(values)
    return (v[(len(v) - 1) // 2] + v[len(v) // 2]) // 2


LISTOPS_FNS = (min, max, _median, lambda v: sum(v) % 10)     # MIN, MAX, MED, SM: by operator index


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
    value = LISTOPS_FNS[op](values)
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
                        raise ValueError(f"byte 0x{line[e.start]:02x} at column {e.start + 1} is not UTF-8 "
                                         "text") from None
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
        tokens, lengths, labels = (np.load(os.path.join(folder, f"{a}.npy"), mmap_mode="r" if a == "tokens" else None)
                                   for a in arrays)
        cached = len(tokens) == len(lengths) == len(labels)
    except (OSError, ValueError, EOFError):                  # not cached yet, or damaged: parse the TSV
        cached = False
    if not cached:
        tokens, lengths, labels = read_listops_arrays(path, fix, progress=True)

        def build(tmp):
            for a, value in zip(arrays, (tokens, lengths, labels)):
                np.save(os.path.join(tmp, f"{a}.npy"), value)
        shutil.rmtree(folder, ignore_errors=True)            # a damaged one
        with contextlib.suppress(OSError):                   # no cache (read-only, or another run won): fine
            cached_dir(folder, build)
            for old in glob.glob(os.path.join(root, f"{name}-*")):   # arrays of an older version of this TSV
                if old != folder and ".tmp" not in old:
                    shutil.rmtree(old, ignore_errors=True)
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
                    raise DataError(f"listops: no tree of {setting.lengths[0]} < length < {setting.lengths[1]} in "
                                    "20,000 draws; widen --listops_len or raise --listops_depth / --listops_args")
                if estimate < 2 * total:                     # drawing more than half of them would crawl
                    raise DataError(f"listops: the setting ({setting.describe()}) has only about "
                                    f"{int(estimate)} distinct trees, too few for {total}; widen --listops_len or "
                                    "--listops_args, raise --listops_depth or lower --listops_sizes")
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


if __name__ == "__main__":                                   # python -m tasks.listops: prepare its files alone
    prepare_main("listops")
