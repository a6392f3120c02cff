"""
ListOps (Nangia & Bowman 2018), generated exactly by the Long Range Arena recipe
(google-research/long-range-arena, lra_benchmarks/data/listops.py):
  a tree grows from depth 1; below depth 10 a node is a leaf (a digit 0-9) with probability 0.75, at depth
  10 always; otherwise it is an operator MIN, MAX, MED (median, rounded down) or SM (sum mod 10) with
  2-10 children. Length counts tokens without parentheses; 500 < length < 2000 is kept; the trees are
  distinct; 96,000 / 2,000 / 2,000 for train / val / test. MAX(2, 9) is written ( ( ( [MAX 2 ) 9 ) ] ).
The depth, the argument range, the length window and the split sizes are options of the task
(train.py --listops_depth, --listops_args, --listops_len, --listops_sizes); the LRA values are the default.
The trees go straight into token arrays (tasks/listops_format.py reads and writes LRA's TSV files, which
python -m tasks.listops --tsv also writes), memory-mapped when read.
"""

import contextlib
import hashlib
import math
import os
import random
from dataclasses import dataclass

import numpy as np

from data import DataError, Task, cached_dir, cls_task, prepare_main, release, save_arrays, task, worker_pool
from tasks.listops_format import (LISTOPS_OPS, LISTOPS_VOCAB, listops_rows, listops_split, listops_tokens,
                                  write_listops_tsv)


LISTOPS_SIZES = {"train": 96_000, "val": 2_000, "test": 2_000}
LISTOPS_DEPTH = 10              # nodes at this depth are leaves: operators sit at depths 1 .. 9
LISTOPS_ARGS = (2, 10)          # arguments of an operator, both ends included
LISTOPS_LEN = (500, 2000)       # a tree is kept when MIN < length < MAX (tokens without parentheses)
LISTOPS_MOST_TREES, LISTOPS_MOST_BYTES = 10_000_000, 16 * 2**30    # a setting's bounds: some 2 hours, and the disk
LISTOPS_OP_P = 0.25             # below the depth limit a node is an operator with this probability


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
    if sum(sizes) > LISTOPS_MOST_TREES or sum(sizes) * hi > LISTOPS_MOST_BYTES:   # LRA's: 100,000 trees, 0.2 GB
        raise DataError(f"listops: --listops_sizes {','.join(map(str, sizes))} with trees up to {hi:,} tokens: allowed "
                        f"are {LISTOPS_MOST_TREES:,} trees and {LISTOPS_MOST_BYTES / 2**30:g} GiB of token arrays "
                        "(trees x the longest tree) at most; LRA's 100,000 take about a minute and 0.2 GB")
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
LISTOPS_CHUNK = 1_000           # trees a chunk draws (a round draws two more chunks than it needs, as spare)


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


def generate_listops(n, seed=0, min_len=500, max_len=2000, chunk=None, depth=LISTOPS_DEPTH, args=LISTOPS_ARGS,
                     processes=None, progress=True):
    """n distinct (string, label) examples, yielded one at a time, the same for a seed whatever the number of
    processes: chunk i is drawn from its own seed (seed, i), chunks are merged in order and a tree is kept the
    first time it comes. Only a 16-byte digest of each tree is remembered, never the trees: the LRA set's
    strings alone would take 0.6 GB. Progress is shown over chunks."""
    from tqdm import tqdm
    processes = min(os.cpu_count() or 1, 8) if processes is None else processes
    chunk = min(chunk or LISTOPS_CHUNK, n)                   # (a few trees: the first chunk's first n, drawn alone)
    per_round = n // chunk + 2                               # a little spare for duplicates
    seen, start = set(), 0
    with contextlib.ExitStack() as stack:
        if processes > 1 and n > chunk:                      # one chunk holds n distinct trees: no pool needed
            pool = stack.enter_context(worker_pool(min(processes, per_round)))
            imap = pool.imap                                 # in order: deterministic
        else:
            imap = map
        bar = stack.enter_context(tqdm(total=-(-n // chunk), unit="chunk", desc="ListOps", leave=False,
                                       disable=None if progress else True))     # None: on a terminal only
        while len(seen) < n:
            before = len(seen)
            jobs = [((seed, i), chunk, min_len, max_len, depth, tuple(args)) for i in range(start, start + per_round)]
            for examples in imap(listops_chunk, jobs):
                for s, value in examples:
                    digest = hashlib.blake2b(s.encode(), digest_size=16).digest()
                    if len(seen) < n and digest not in seen:
                        seen.add(digest)
                        yield s, value
                bar.update(1)
                if len(seen) >= n:
                    break
            if len(seen) == before:                          # a whole round found nothing new: the space is used up
                raise DataError(f"listops: only {len(seen)} distinct trees found, fewer than the {n} asked; widen "
                                "--listops_len or --listops_args, raise --listops_depth, or lower --listops_sizes")
            start += per_round


LISTOPS_PROBE_DRAWS = 20_000            # roots the probe draws at most, and the tokens they may grow: about 2
LISTOPS_PROBE_TOKENS = 5_000_000        # seconds (LRA's 20,000 roots grow 2.5 million tokens, 1,500 a tree kept)
LISTOPS_MOST_GROWN = 15 * 10**9         # tokens a setting's generation may grow: 10 million LRA trees' (2 hours)


def listops_probe(setting, draws=None, seed=12345, budget=None):
    """Draw `draws` roots with `setting` (LISTOPS_PROBE_DRAWS), or fewer once they have grown `budget` tokens
    (LISTOPS_PROBE_TOKENS): (kept, distinct kept, about how many distinct trees the setting has, roots drawn,
    tokens grown). A quick check, before generating, that the length window is reached at a bearable cost and
    that there are enough distinct trees. The estimate is the birthday estimate kept^2 / (2 * repeats), infinite
    without repeats."""
    rnd = random.Random(f"listops-probe-{seed}").random
    draws = draws or LISTOPS_PROBE_DRAWS
    budget = budget or LISTOPS_PROBE_TOKENS
    kept, distinct, drawn, grown = 0, set(), 0, 0
    while drawn < draws and grown < budget:
        drawn += 1
        if rnd() > LISTOPS_OP_P:
            rnd()
            grown += 1
            continue
        try:
            s, _, n = listops_operator(1, rnd, setting.lengths[1], setting.depth, setting.args)
        except _TooLong:                                     # at most the budget and one node's leaves past it
            grown += setting.lengths[1] + setting.args[1]
            continue
        grown += n
        if setting.lengths[0] < n < setting.lengths[1]:
            kept += 1
            distinct.add(s)
    repeats = kept - len(distinct)
    return kept, len(distinct), kept * kept / (2 * repeats) if repeats else math.inf, drawn, grown


def write_listops_arrays(setting, out):
    """Generate the setting's trees (seed 0) straight into out/{train,val,test}.{tokens,lengths,labels}.npy in
    the order drawn: tokens uint8 (N, the longest tree possible) padded with 0, written a row at a time, so that
    memory holds one chunk of trees, never the whole set nor its strings."""
    examples = generate_listops(sum(setting.sizes), seed=0, min_len=setting.lengths[0], max_len=setting.lengths[1],
                                depth=setting.depth, args=setting.args)
    width = min(setting.lengths[1] - 1, setting.longest())
    for split, size in zip(LISTOPS_SIZES, setting.sizes):
        lengths, labels = np.zeros(size, np.int32), np.zeros(size, np.uint8)
        with open(os.path.join(out, f"{split}.tokens.npy"), "wb") as f:
            np.lib.format.write_array_header_1_0(f, {"descr": "|u1", "fortran_order": False, "shape": (size, width)})
            for i, (s, value) in zip(range(size), examples):  # range first: no tree is drawn past the split
                ids = listops_tokens(s)
                lengths[i], labels[i] = len(ids), value
                f.write(ids.tobytes() + bytes(width - len(ids)))
        save_arrays(out, split, lengths=lengths, labels=labels)


def check_reachable(setting):
    """An unusual setting: a DataError if its length window is not reached, if its trees would take more than
    LISTOPS_MOST_GROWN tokens grown to generate (the probe's rate), or if it has too few distinct trees (drawing
    more than half of them would crawl)."""
    kept, _, estimate, drawn, grown = listops_probe(setting)
    window, n = f"{setting.lengths[0]} < length < {setting.lengths[1]}", sum(setting.sizes)
    if not kept and drawn == LISTOPS_PROBE_DRAWS:
        raise DataError(f"listops: no tree of {window} in {drawn:,} draws; widen --listops_len or raise "
                        "--listops_depth / --listops_args")
    if not kept:                                             # the probe's bound reached first
        raise DataError(f"listops: no tree of {window} in {drawn:,} draws, which grew {grown:,} tokens (the probe's "
                        f"bound): with depth {setting.depth} and {setting.args[0]}-{setting.args[1]} arguments such "
                        "trees are too rare to generate in bearable time; lower --listops_args or --listops_depth, "
                        "or change --listops_len")
    cost = grown / kept * (n if n <= LISTOPS_CHUNK else n + 2 * LISTOPS_CHUNK)    # (generate_listops's spare chunks)
    if cost > LISTOPS_MOST_GROWN:
        raise DataError(f"listops: the setting ({setting.describe()}) grew {grown:,} tokens of trees per {kept:,} kept "
                        f"in the probe: its {n:,} trees would take some {cost:.2g} tokens, more than the "
                        f"{LISTOPS_MOST_GROWN:.2g} (some 2 hours) allowed; lower --listops_sizes, --listops_args or "
                        "--listops_depth, or change --listops_len")
    if estimate < 2 * n:
        raise DataError(f"listops: the setting ({setting.describe()}) has only about {int(estimate)} distinct trees, "
                        f"too few for {n}; widen --listops_len or --listops_args, raise "
                        "--listops_depth or lower --listops_sizes")


def tsv_task(folder, paths, block_size, cache_dir, fix):
    """The task over LRA's TSV files paths {split: path} (those there: the others are missing)."""
    loaders = {s: (lambda p=p: listops_split(p, cache_dir, block_size, fix)) for s, p in paths.items()}
    missing = {s: f"listops: no basic_{s}.tsv in {folder}" for s in LISTOPS_SIZES if s not in paths}
    return Task("listops", "cls", len(LISTOPS_VOCAB), block_size, 10, loaders, missing, paths)


@task("listops", help={"tsv": "also write the splits into the cache folder as LRA's basic_train.tsv, basic_val.tsv "
                                  "and basic_test.tsv (its release format, for LRA's own code)"},
      generated_only=("listops_depth", "listops_args", "listops_sizes"))
def listops(cache_dir="data", data_dir=None, block_size=None, listops_depth=LISTOPS_DEPTH, listops_args=LISTOPS_ARGS,
            listops_len=LISTOPS_LEN, listops_sizes=tuple(LISTOPS_SIZES.values()), tsv=False, **_):
    """LRA ListOps from --data_dir's basic_*.tsv, or generated once as arrays into cache_dir/listops (the LRA
    setting) or cache_dir/listops-depthD-argsA-B-lenL-M-nT-V-T (any other setting of the listops_* options);
    tsv=True also writes them there as LRA's TSV files. block_size defaults to the setting's length bound."""
    setting = listops_setting(listops_depth, listops_args, listops_len, listops_sizes)
    block_size = block_size or setting.lengths[1]
    if data_dir is not None:                                 # LRA's release: lra_release/listops-1000/
        if tsv:
            raise DataError("listops: --tsv writes the generated trees as TSV files; --data_dir's are TSV files "
                            "already")
        names = [f"basic_{s}.tsv" for s in LISTOPS_SIZES]
        folder, found = release("listops", data_dir, "it should hold LRA's basic_train.tsv, basic_val.tsv and "
                                "basic_test.tsv (or listops-1000/ with them)", (), ["listops-1000"], names)
        return tsv_task(folder, {s: found[f"basic_{s}.tsv"] for s in LISTOPS_SIZES if found[f"basic_{s}.tsv"]},
                        block_size, cache_dir, "the file should hold LRA's ListOps rows ('Source<TAB>Target', then one "
                        "'tree<TAB>label' per line)")
    folder = os.path.join(cache_dir, setting.folder_name())
    tsvs = {s: os.path.join(folder, f"basic_{s}.tsv") for s in LISTOPS_SIZES}

    def build(out):
        if not setting.is_lra():                             # an unusual setting: is it reachable at all?
            check_reachable(setting)
        # a benchmark, so one fixed draw (seed 0) whatever the run's --seed
        what = "LRA recipe" if setting.is_lra() else setting.describe()
        print(f"generating ListOps ({what}) into {folder}{', about a minute' * setting.is_lra()} ...", flush=True)
        write_listops_arrays(setting, out)

    cached_dir(folder, build)
    if tsv:                                                  # for LRA's own code: its release format
        full = cls_task("listops", "cls", folder, len(LISTOPS_VOCAB), setting.lengths[1], 10, 0, {s: s for s in tsvs})
        for s, path in tsvs.items():
            write_listops_tsv(path, listops_rows(full.split(s)))
        print(f"listops: wrote {', '.join(map(os.path.basename, tsvs.values()))} into {folder}", flush=True)
    return cls_task("listops", "cls", folder, len(LISTOPS_VOCAB), block_size, 10, 0, {s: s for s in tsvs})


if __name__ == "__main__":                                   # python -m tasks.listops: prepare its files alone
    prepare_main("tasks.listops")
