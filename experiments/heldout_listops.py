"""
Held-out ListOps trees from a second, separately written generator, for checking that a model evaluates
trees rather than remembering the training split:

    python experiments/heldout_listops.py --listops_depth 3 --listops_args 2,5 --listops_len 10,40 --out heldout-d3
    python train.py --init_from out/RUN/ckpt.pt --eval_only --data_dir heldout-d3

It draws trees by the LRA recipe with the given depth limit, argument range and length window (the same
flags as train.py's listops task), from its own random source (numpy's PCG64, seeded by --seed), builds
each tree as nested Python objects, and prints and evaluates them with its own code. Trees present in the
task's generated splits (train, val and test, generated first if missing) are dropped, and DIR/basic_test.tsv
is written in LRA's format (header Source<TAB>Target). It then prints the distributions of the held-out
trees beside those of the task's test split (labels, lengths, depths, argument counts, operators) and the
reference rules' accuracies on both (fitted on the training split).
"""

import argparse
import collections
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import data  # noqa: E402  (only for the task's splits and the reference rules; the generator is below)
from tasks import listops, listops_format, listops_rules  # noqa: E402

OPERATORS = ("MIN", "MAX", "MED", "SM")
LEAF_P = 0.75                       # LRA: a draw r > 0.25 makes a leaf


class TooLong(Exception):
    pass


class Op:
    """An operator node: its name and its children (Op or int)."""
    __slots__ = ("name", "children")

    def __init__(self, name, children):
        self.name, self.children = name, children


class Grower:
    """Draws one tree top-down; gives up (TooLong) once it has more than `cap` tokens, which the length
    window would reject anyway."""

    def __init__(self, rng, max_depth, min_args, max_args, cap):
        self.rng, self.max_depth, self.min_args, self.max_args, self.cap = rng, max_depth, min_args, max_args, cap
        self.tokens = 0

    def node(self, depth):
        leaf = depth >= self.max_depth or self.rng.random() > 1 - LEAF_P
        if leaf:
            self.tokens += 1
            return int(self.rng.integers(0, 10))
        self.tokens += 2                                     # "[OP" and "]"
        if self.tokens >= self.cap:
            raise TooLong
        n = int(self.rng.integers(self.min_args, self.max_args + 1))
        children = []
        for _ in range(n):
            children.append(self.node(depth + 1))
            if self.tokens >= self.cap:
                raise TooLong
        return Op(OPERATORS[int(self.rng.integers(0, 4))], children)


def size(t):
    return 1 if isinstance(t, int) else 2 + sum(size(c) for c in t.children)


def value(t):
    if isinstance(t, int):
        return t
    vals = sorted(value(c) for c in t.children)
    if t.name == "MIN":
        return vals[0]
    if t.name == "MAX":
        return vals[-1]
    if t.name == "SM":
        return sum(vals) % 10
    half = len(vals) // 2                                    # MED: numpy.median, truncated
    return vals[half] if len(vals) % 2 else int((vals[half - 1] + vals[half]) / 2)


def lra_string(t):
    """LRA's printing: the node is the pair (((OP a1) a2) ... ak) then "]"; a pair (L, R) prints "( L R )"."""
    if isinstance(t, int):
        return str(t)
    left = "[" + t.name
    for c in t.children:
        left = f"( {left} {lra_string(c)} )"
    return f"( {left} ] )"


def depth_of(t):
    return 1 if isinstance(t, int) else 1 + max(depth_of(c) for c in t.children)


def draw(n, depth, args, lengths, seed, exclude):
    """n distinct trees with lengths[0] < size < lengths[1], none of them in `exclude`."""
    rng = np.random.Generator(np.random.PCG64(seed))
    out, dropped, draws = {}, 0, 0
    while len(out) < n:
        draws += 1
        g = Grower(rng, depth, args[0], args[1], lengths[1])
        try:
            t = g.node(1)
        except TooLong:
            continue
        if isinstance(t, int) or not lengths[0] < size(t) < lengths[1]:   # the root is an operator (as in LRA)
            continue
        s = lra_string(t)
        if s in exclude:
            dropped += 1
        elif s not in out:
            out[s] = t
        if draws > 200 * n + 1_000_000 and len(out) < n:
            raise data.DataError(f"only {len(out)} new trees in {draws} draws; this setting has too few trees: "
                                 "lower --n or widen the setting")
    return list(out.items()), dropped


def write_tsv(path, rows):
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        f.write("Source\tTarget\n")
        for s, v in rows:
            f.write(f"{s}\t{v}\n")
    os.replace(tmp, path)


def token_stats(texts, labels):
    """Label histogram, lengths (tokens without parentheses), depths (root 1, leaves counted), argument counts
    and operator shares, read from the LRA strings."""
    lengths, depths, nargs, ops = [], [], collections.Counter(), collections.Counter()
    for text in texts:
        toks = [t for t in text.split() if t not in "()"]
        lengths.append(len(toks))
        d = deepest = 0
        stack = []
        for tok in toks:
            if tok.startswith("["):
                d += 1
                deepest = max(deepest, d)
                ops[tok] += 1
                stack.append(0)
            elif tok == "]":
                nargs[stack.pop()] += 1
                d -= 1
                if stack:
                    stack[-1] += 1
            else:
                deepest = max(deepest, d + 1)
                if stack:
                    stack[-1] += 1
        depths.append(deepest)
    return dict(labels=np.bincount(labels, minlength=10) / len(labels), lengths=np.array(lengths),
                depths=np.bincount(depths, minlength=1) / len(depths), nargs=nargs, ops=ops)


class Parser(data.Parser):
    def error(self, message):                                # (one line, not a usage dump)
        raise data.DataError(f"{message} (python experiments/heldout_listops.py --help lists the flags)")


def check(a):
    """The flags that are not the task's setting, before any work (the task's splits are generated first where
    missing), one line each saying what is allowed."""
    if not 1 <= a.n <= listops.LISTOPS_MOST_TREES:
        raise data.DataError(f"--n {a.n}: allowed is a number of held-out trees from 1 to "
                             f"{listops.LISTOPS_MOST_TREES:,} (the bound of the ListOps task's own trees)")
    if a.seed < 0:
        raise data.DataError(f"--seed {a.seed}: allowed is an integer >= 0 (the seed of numpy's PCG64)")
    problem = data.writable_problem(a.out)
    if problem is None and os.path.isdir(os.path.join(a.out, "basic_test.tsv")):
        problem = "its basic_test.tsv is a folder, where the trees are written as a file"
    if problem:
        raise data.DataError(f"--out {a.out}: {problem}; give another folder")


def main(argv=None):
    p = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--listops_depth", type=int, default=10, help="depth limit, operators only above it (LRA: 10)")
    p.add_argument("--listops_args", default="2,10", help="MIN,MAX arguments per operator (LRA: 2,10)")
    p.add_argument("--listops_len", default="500,2000", help="keep MIN < length < MAX tokens (LRA: 500,2000)")
    p.add_argument("--listops_sizes", default="96000,2000,2000", help="the task's TRAIN,VAL,TEST (which splits to exclude)")
    p.add_argument("--n", type=int, default=2000, help="held-out trees to write")
    p.add_argument("--seed", type=int, default=1, help="seed of this generator")
    p.add_argument("--cache_dir", default="data", help="where the task's generated splits are (as train.py)")
    p.add_argument("--out", required=True, help="folder to write basic_test.tsv into")
    a = p.parse_args(argv)
    check(a)                                                 # (a bad setting: a DataError, exit status 2)
    setting = listops.listops_setting(a.listops_depth, a.listops_args, a.listops_len, a.listops_sizes)
    task = data.load_task("listops", cache_dir=a.cache_dir, listops_depth=a.listops_depth,
                          listops_args=a.listops_args, listops_len=a.listops_len, listops_sizes=a.listops_sizes)
    splits = {s: list(listops_format.listops_rows(task.split(s))) for s in ("train", "val", "test")}  # LRA strings
    exclude = {s for rows in splits.values() for s, _ in rows}
    trees, dropped = draw(a.n, setting.depth, setting.args, setting.lengths, a.seed, exclude)
    rows = [(s, value(t)) for s, t in trees]
    os.makedirs(a.out, exist_ok=True)
    write_tsv(os.path.join(a.out, "basic_test.tsv"), rows)
    print(f"wrote {len(rows)} held-out trees ({setting.describe()}; seed {a.seed}) to "
          f"{os.path.join(a.out, 'basic_test.tsv')}; {dropped} draws were already in the task's splits")
    assert all(setting.lengths[0] < size(t) < setting.lengths[1] for _, t in trees)

    held = token_stats([s for s, _ in rows], [v for _, v in rows])
    first = splits["train"][:20_000]
    cols = {"held-out": held, "task train": token_stats([s for s, _ in first], [int(v) for _, v in first]),
            "task test": token_stats([s for s, _ in splits["test"]], [int(v) for _, v in splits["test"]])}
    print(f"\n{'':24}" + "".join(f"{c:>12}" for c in cols) + f"   (task train: its first {len(first)} trees)")
    for k in range(10):
        print(f"label {k:<18}" + "".join(f"{c['labels'][k]:12.3f}" for c in cols.values()))
    rng = np.random.default_rng(0)                           # total variation two samples of these sizes show
    pooled = (held["labels"] * len(rows) + cols["task train"]["labels"] * len(first)) / (len(rows) + len(first))
    noise = np.mean([0.5 * np.abs(rng.multinomial(len(rows), pooled) / len(rows)
                                  - rng.multinomial(len(first), pooled) / len(first)).sum() for _ in range(500)])
    tv = 0.5 * np.abs(held["labels"] - cols["task train"]["labels"]).sum()
    print(f"label total variation, held-out vs task train: {tv:.3f} (two samples of the same distribution: "
          f"{noise:.3f} on average)")
    for name, f in (("length mean", np.mean), ("length median", np.median), ("length min", np.min),
                    ("length max", np.max)):
        print(f"{name:24}" + "".join(f"{f(c['lengths']):12.1f}" for c in cols.values()))
    for d in range(1, max(len(c["depths"]) for c in cols.values())):
        print(f"depth {d:<18}" + "".join(f"{c['depths'][d] if d < len(c['depths']) else 0.0:12.3f}"
                                         for c in cols.values()))
    for name in ("nargs", "ops"):
        for k in sorted(set().union(*(c[name] for c in cols.values()))):
            print(f"{('arguments ' if name == 'nargs' else 'operator ') + str(k):24}"
                  + "".join(f"{c[name][k] / sum(c[name].values()):12.3f}" for c in cols.values()))
    rules = listops_rules.listops_baselines(task.split("train"), heldout=[(s, v) for s, v in rows],
                                            test=task.split("test"))
    print(f"\nreference rules (fitted on the task's training split)\n{'':24}{'held-out':>12}{'task test':>12}")
    for rule in ("majority", "top_operator", "top_digits"):
        print(f"{rule:24}{100 * rules['heldout'][rule]:11.2f}%{100 * rules['test'][rule]:11.2f}%")


if __name__ == "__main__":
    data.run_main(main)
