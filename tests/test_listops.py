"""ListOps: the LRA generator and its options, values, lengths, the TSV format, the tokenizer, the binary
cache, the reading errors and the reference rules (baselines).

The references here are written separately from tasks/listops.py and tasks/listops_rules.py: a
recursive-descent parser of LRA's left-nested pairs, an evaluator over the parsed tree that uses numpy.median
(LRA's own MED), a stack machine over the bracket-free tokens, hand-worked trees from scripted random
draws, brute-force enumeration for the top-level-digits rule, and distribution facts of the recipe on fixed
seeds, with tolerances that a one-line change of the recipe breaks (checked by applying such changes one at
a time)."""

import collections
import hashlib
import itertools
import multiprocessing
import os
import random
import re
import subprocess
import sys

import numpy as np
import pytest

import data
from tasks import listops, listops_format, listops_rules

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OPS = {"[MIN": min, "[MAX": max, "[MED": lambda a: int(np.median(a)), "[SM": lambda a: sum(a) % 10}
sys.setrecursionlimit(max(sys.getrecursionlimit(), 20_000))


def evaluate_tokens(tokens):
    """A separately written evaluator: a stack machine over the bracket-free tokens (operator ... "]")."""
    stack = [[]]
    for tok in tokens:
        if tok in OPS:
            stack.append([tok])
        elif tok == "]":
            op, *args = stack.pop()
            stack[-1].append(OPS[op](args))
        else:
            stack[-1].append(int(tok))
    (value,) = stack[0]
    return value


def parse_lra(text):
    """LRA's string -> tree: an int (a digit) or (operator, [children]). Reads the exact format LRA's
    to_string writes: an operator node with arguments a1..ak is the pair (((..((OP a1) a2)..) ak) ]), each
    pair printed "( L R )". Fails on anything else."""
    toks = text.split(" ")
    pos = 0

    def item():
        nonlocal pos
        tok = toks[pos]
        pos += 1
        if tok != "(":
            return tok
        left, right = item(), item()
        assert toks[pos] == ")", (pos, toks[pos])
        pos += 1
        return (left, right)

    def node(x):
        if isinstance(x, str):
            assert x.isdigit() and len(x) == 1, x
            return int(x)
        body, end = x
        assert end == "]", end
        args = []
        while isinstance(body, tuple):
            body, arg = body
            args.append(node(arg))
        assert body in OPS, body
        return body, args[::-1]

    tree = node(item())
    assert pos == len(toks), "text after the tree"
    return tree


def value_of(tree):
    if isinstance(tree, int):
        return tree
    op, args = tree
    return OPS[op]([value_of(a) for a in args])


def walk(tree, depth=1):
    """(depth, node) for every node; the root is depth 1."""
    yield depth, tree
    if not isinstance(tree, int):
        for a in tree[1]:
            yield from walk(a, depth + 1)


def length_of(tree):
    return 1 if isinstance(tree, int) else 2 + sum(length_of(a) for a in tree[1])


def scripted(draws):
    """A random source that returns the given numbers in order; .left() is how many were not used."""
    it = iter(draws)

    def rnd():
        return next(it)
    rnd.left = lambda: sum(1 for _ in it)
    return rnd


@pytest.fixture(scope="module")
def examples():
    return listops.listops_chunk(((7, 0), 200, 500, 2000))


@pytest.fixture(scope="module")
def parsed(examples):
    return [parse_lra(text) for text, _ in examples]


@pytest.fixture(scope="module")
def unfiltered():
    """Trees drawn by the recipe with no length filter (no early stop), and their values."""
    rnd = random.Random(5).random
    return [(parse_lra(text), value) for text, value, _ in (listops.listops_operator(1, rnd, 10 ** 9) for _ in range(400))]


# ----- the generator, pinned exactly

def test_the_lra_draw_is_pinned():
    # sha256 of the first three rows of data/listops/basic_train.tsv as the LRA-setting generator has always
    # written them (seed 0): making the generator configurable must not change one byte of the LRA files
    rows = "".join(f"{s}\t{v}\n" for s, v in listops.listops_chunk(((0, 0), 3, 500, 2000)))
    assert hashlib.sha256(rows.encode()).hexdigest() == \
        "6746db9659d3035cef59d57d7816cab9c23bade42d4c0615b34703b371906b8f"


def test_hand_worked_trees_from_scripted_draws():
    # k: 2 + int(0.0 * 9) = 2; leaf (0.9 > 0.25) digit int(0.25 * 10) = 2; leaf 9; operator int(0.3 * 4) = MAX
    rnd = scripted([0.0, 0.9, 0.25, 0.9, 0.95, 0.3])
    assert listops.listops_operator(1, rnd, 2000) == ("( ( ( [MAX 2 ) 9 ) ] )", 9, 4)
    assert rnd.left() == 0
    # k = 2 + int(0.23 * 9) = 4. First child: r = 0.25 is an operator (LRA: r > 0.25 is a leaf) at depth 2:
    # k 2, leaf 7, leaf 1 (r = 0.26), SM -> 8. Then leaves 5, 0, 2; MED of 8, 5, 0, 2 = (2 + 5) // 2 = 3
    rnd = scripted([0.23, 0.25, 0.0, 0.5, 0.7, 0.26, 0.1, 0.99, 0.8, 0.5, 0.9, 0.0, 0.4, 0.2, 0.6])
    sub = "( ( ( [SM 7 ) 1 ) ] )"
    assert listops.listops_operator(1, rnd, 2000) == ("( ( ( ( ( [MED " + sub + " ) 5 ) 0 ) 2 ) ] )", 3, 9)
    assert rnd.left() == 0
    # SM wraps: 7 + 8 + 9 = 24 -> 4; MIN; odd-count MED
    for op_draw, value in ((0.75, 4), (0.0, 7), (0.5, 8)):
        rnd = scripted([0.12, 0.9, 0.7, 0.9, 0.8, 0.9, 0.9, op_draw])
        text, v, n = listops.listops_operator(1, rnd, 2000)
        assert (v, n) == (value, 5) and text.endswith("7 ) 8 ) 9 ) ] )") and rnd.left() == 0
    # at the depth limit a child is a leaf without a draw for r: depth 2 of 3, k = 2 + int(0.4 * 2)
    rnd = scripted([0.4, 0.35, 0.45, 0.1])
    assert listops.listops_operator(2, rnd, 2000, max_depth=3, args=(2, 3)) == ("( ( ( [MIN 3 ) 4 ) ] )", 3, 4)
    assert rnd.left() == 0
    # one level above the limit children may be operators: r = 0.2 at depth 1 of 3
    rnd = scripted([0.0, 0.2, 0.0, 0.35, 0.45, 0.1, 0.9, 0.6, 0.6])
    assert listops.listops_operator(1, rnd, 2000, max_depth=3, args=(2, 3)) == \
        ("( ( ( [MED ( ( ( [MIN 3 ) 4 ) ] ) ) 6 ) ] )", 4, 7)
    # the argument range: 3 + int(0.999 * 3) = 5 arguments
    rnd = scripted([0.999] + [0.9, 0.1] * 5 + [0.3])
    assert listops.listops_operator(1, rnd, 2000, args=(3, 5)) == ("( ( ( ( ( ( [MAX 1 ) 1 ) 1 ) 1 ) 1 ) ] )", 1, 7)
    # the budget: a tree stops as soon as it reaches it (a subtree of length 4 under a budget of 6)
    rnd = scripted([0.0, 0.1, 0.0, 0.9, 0.1, 0.9, 0.2, 0.4])
    with pytest.raises(listops._TooLong):
        listops.listops_operator(1, rnd, 6)


def test_values_and_format_agree_with_independent_readers(examples, parsed):
    for (text, value), tree in zip(examples, parsed):
        assert value_of(tree) == value
        tokens = [t for t in text.split() if t not in "()"]
        assert evaluate_tokens(tokens) == value
        assert len(tokens) == length_of(tree)


def test_the_lra_recipe_on_a_fixed_seed(examples, parsed):
    assert len(examples) == 200 and len({text for text, _ in examples}) == 200       # distinct
    assert all(500 < length_of(tree) < 2000 for tree in parsed)
    depths = [d for tree in parsed for d, _ in walk(tree)]
    op_depths = [d for tree in parsed for d, node in walk(tree) if not isinstance(node, int)]
    assert max(depths) == 10 and max(op_depths) == 9           # operators only above depth 10, and they get there
    counts = collections.Counter(len(node[1]) for tree in parsed for _, node in walk(tree) if not isinstance(node, int))
    assert min(counts) == 2 and max(counts) == 10 and len(counts) == 9       # 2..10 arguments, all of them occur
    labels = np.bincount([v for _, v in examples], minlength=10)
    assert labels[0] > labels[1:9].mean() and labels[9] > labels[1:9].mean()  # skewed towards 0 and 9


def test_the_recipe_frequencies_on_unfiltered_draws(unfiltered):
    assert all(value_of(tree) == value for tree, value in unfiltered)
    unfiltered = [tree for tree, _ in unfiltered]
    nodes = [(d, node) for tree in unfiltered for d, node in walk(tree)]
    # below the depth limit a child is an operator with probability 0.25 (0.2 or 0.3 fall outside)
    drawn = [not isinstance(node, int) for d, node in nodes if 1 < d < 10]
    assert abs(np.mean(drawn) - 0.25) < 0.015 and len(drawn) > 50_000
    assert all(isinstance(node, int) for d, node in nodes if d == 10)
    ops = collections.Counter(node[0] for _, node in nodes if not isinstance(node, int))
    n_ops = sum(ops.values())
    assert set(ops) == set(OPS) and all(abs(c / n_ops - 0.25) < 0.02 for c in ops.values())   # uniform operators
    k = np.bincount([len(node[1]) for _, node in nodes if not isinstance(node, int)], minlength=12)
    assert k[:2].sum() == 0 and k[11:].sum() == 0 and np.abs(k[2:11] / n_ops - 1 / 9).max() < 0.015  # uniform 2..10
    digits = np.bincount([node for _, node in nodes if isinstance(node, int)], minlength=10)
    assert len(digits) == 10 and np.abs(digits / digits.sum() - 0.1).max() < 0.01           # uniform digits
    # MED of an even count: the mean of the two middle values, truncated (numpy.median, then int)
    evens = [node for _, node in nodes if not isinstance(node, int) and node[0] == "[MED" and len(node[1]) % 2 == 0]
    halves = [a for a in evens if sum(sorted(map(value_of, a[1]))[len(a[1]) // 2 - 1:len(a[1]) // 2 + 1]) % 2]
    assert len(halves) > 50                      # the rounding is exercised, and value_of agrees with the draw:
    for tree in unfiltered[:100]:
        text = listops.listops_operator(1, scripted_replay(tree), 10 ** 9)[0]
        assert parse_lra(text) == tree


def scripted_replay(tree):
    """The draws that make listops.listops_operator grow `tree` (LRA recipe), read back from the tree."""
    draws = []

    def emit(node, depth):
        op, args = node
        draws.append((len(args) - 2 + 0.5) / 9)
        for a in args:
            if depth + 1 < 10:
                draws.append(0.1 if not isinstance(a, int) else 0.9)
            if isinstance(a, int):
                draws.append((a + 0.5) / 10)
            else:
                emit(a, depth + 1)
        draws.append((list(OPS).index(op) + 0.5) / 4)

    emit(tree, 1)
    return scripted(draws)


def test_the_length_window_is_exclusive_and_both_ends_are_reached():
    # depth 2 and 2-4 arguments: lengths 4, 5, 6; the window 4 < n < 6 keeps only length 5
    ex = listops.listops_chunk(((1, 2), 30, 4, 6, 2, (2, 4)))
    assert {len(listops.listops_tokens(s)) for s, _ in ex} == {5} and len(ex) <= 30
    ex = listops.listops_chunk(((1, 2), 60, 3, 7, 2, (2, 4)))
    assert {len(listops.listops_tokens(s)) for s, _ in ex} == {4, 5, 6}
    # a small setting: depth 3, 2-3 arguments; trees of 6 < n < 12 reach depth 3 and both argument counts
    ex = listops.listops_chunk(((1, 3), 300, 6, 12, 3, (2, 3)))
    trees = [parse_lra(s) for s, _ in ex]
    assert all(6 < length_of(t) < 12 and value_of(t) == v for t, (_, v) in zip(trees, ex))
    assert max(d for t in trees for d, _ in walk(t)) == 3
    assert {len(n[1]) for t in trees for _, n in walk(t) if not isinstance(n, int)} == {2, 3}


def test_generation_merges_chunks_in_order_whatever_the_processes(monkeypatch):
    kw = dict(seed=3, min_len=20, max_len=200, chunk=10, progress=False)
    serial = list(listops.generate_listops(35, processes=1, **kw))
    fork = multiprocessing.get_context("fork")               # the pool's workers forked, not spawned: the same
    pools = []                                               # work without ~10 s of imports

    class Context:
        def Pool(self, k):
            pools.append(k)
            return fork.Pool(k)
    monkeypatch.setattr(multiprocessing, "get_context", lambda method: (pools.append(method), Context())[1])
    assert list(listops.generate_listops(35, processes=2, **kw)) == serial
    assert pools == ["spawn", 2]                             # 2 workers (35 // 10 + 2 = 5 chunks a round)
    list(listops.generate_listops(10, processes=2, **kw))       # one chunk is enough: no pool
    assert pools == ["spawn", 2]
    list(listops.generate_listops(15, processes=8, **kw))       # no more workers than chunks a round (15 // 10 + 2)
    assert pools == ["spawn", 2, "spawn", 3]
    reference = {}
    for i in range(5):                                       # chunk i is drawn from seed (3, i)
        for s, v in listops.listops_chunk(((3, i), 10, 20, 200)):
            reference.setdefault(s, v)
    assert serial == list(reference.items())[:35] and len(serial) == 35
    assert list(listops.generate_listops(35, processes=1, **{**kw, "seed": 4})) != serial


def test_generation_shows_its_progress_over_chunks(monkeypatch):
    import tqdm
    bars = []

    class Bar:
        def __init__(self, total, disable, **kw):
            bars.append({"total": total, "disable": disable, "n": 0})

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def update(self, k):
            bars[-1]["n"] += k
    monkeypatch.setattr(tqdm, "tqdm", Bar)
    list(listops.generate_listops(35, seed=3, min_len=20, max_len=200, chunk=10, processes=1))
    list(listops.generate_listops(30, seed=3, min_len=20, max_len=200, chunk=10, processes=1, progress=False))
    assert bars == [{"total": 4, "disable": None, "n": 4}, {"total": 3, "disable": True, "n": 3}]   # ceil(n / chunk);
    # None: tqdm shows the bar on a terminal only (a log file gets no bar glued to the next line)


def test_a_chunk_gives_up_after_a_run_of_draws_without_a_new_tree(monkeypatch):
    monkeypatch.setattr(listops, "LISTOPS_STALE_DRAWS", 5_000)
    every = {f"( ( ( {op} {a} ) {b} ) ] )" for op in OPS for a in range(10) for b in range(10)}
    for count in (400, 401):                                 # [OP a b]: 400 trees; ~10,500 draws to see them all
        ex = listops.listops_chunk(((2, 0), count, 3, 5, 2, (2, 2)))
        assert {s for s, _ in ex} == every and len(ex) == 400


def test_a_setting_with_too_few_trees_fails_instead_of_looping():
    with pytest.raises(data.DataError, match=r"only (399|400) distinct trees found, fewer than the 500"):  # [OP a b]
        list(listops.generate_listops(500, min_len=3, max_len=5, chunk=50, depth=2, args=(2, 2), processes=1,
                                      progress=False))


# ----- the task: its options, splits and caches

def test_setting_options_and_cache_names():
    lra = listops.listops_setting()
    assert (lra.depth, lra.args, lra.lengths, lra.sizes) == (10, (2, 10), (500, 2000), (96_000, 2_000, 2_000))
    assert lra.folder_name() == "listops" and listops.listops_setting(10, "2,10", "500,2000", "96000,2000,2000") == lra
    small = listops.listops_setting(4, "2,5", (10, 100), "9000,500,500")
    assert small.folder_name() == "listops-depth4-args2-5-len10-100-n9000-500-500"
    names = {listops.listops_setting(*s).folder_name() for s in
             [(4, "2,5", "10,100"), (5, "2,5", "10,100"), (4, "3,5", "10,100"), (4, "2,6", "10,100"),
              (4, "2,5", "11,100"), (4, "2,5", "10,99"), (4, "2,5", "10,100", "1,2,3")]}
    assert len(names) == 7                                   # every parameter is in the name
    assert listops.ListOpsSetting(3, (2, 2)).longest() == 2 + 2 * (2 + 2 * 1)     # depth 3: 10 tokens at most
    assert lra.longest() > 10 ** 9


@pytest.mark.parametrize("kw, message", [
    (dict(listops_depth=1), "--listops_depth 1 must be 2 to 100"),
    (dict(listops_depth="ten"), "--listops_depth expects one integer"),
    (dict(listops_args="0,5"), "--listops_args 0,5 must be MIN,MAX"),
    (dict(listops_args="5,2"), "--listops_args 5,2 must be MIN,MAX"),
    (dict(listops_args="2"), "--listops_args expects MIN,MAX"),
    (dict(listops_len="100,100"), "--listops_len 100,100 must be MIN,MAX"),
    (dict(listops_len="-1,100"), "--listops_len -1,100 must be MIN,MAX"),
    (dict(listops_sizes="10,0,10"), "--listops_sizes 10,0,10 must be three positive"),
    (dict(listops_sizes="10,10"), "--listops_sizes expects TRAIN,VAL,TEST"),
    (dict(listops_depth=3, listops_args="2,2", listops_len="10,20"), "no tree has 10 < length < 20"),
    (dict(listops_depth=3, listops_args="3,4", listops_len="0,5"),           # [OP a b c] has 5 tokens; 2 + 4 (2 + 4) at most
     r"no tree has 0 < length < 5 with --listops_depth 3 and --listops_args 3,4 \(lengths 5 to 26 are possible\)"),
    (dict(listops_depth=2, listops_args="2,3", listops_len="3,5"), r"the setting \(depth 2, 2-3 arguments, 3 < "
                                                                   r"length < 5, 96000/2000/2000 trees\) has only about"),
    (dict(listops_args="2,2", listops_len="1000,1100"), "no tree of 1000 < length < 1100 in 20,000 draws"),
])
def test_bad_settings_fail_in_one_line_before_generating(tmp_path, kw, message):
    with pytest.raises(data.DataError, match=message):
        data.load_task("listops", cache_dir=str(tmp_path), **kw)
    assert os.listdir(tmp_path) == []


def test_the_probe_counts_kept_and_distinct_trees_and_estimates_the_rest(tmp_path, monkeypatch):
    setting = listops.listops_setting(2, "2,3", "3,5", "1,1,1")          # [OP a b]: 400 trees, 1/8 of the draws
    kept, distinct, estimate, drawn, _ = listops.listops_probe(setting, draws=4000, seed=1)
    rnd = random.Random("listops-probe-1").random                 # the same draws, counted here
    trees = []
    for _ in range(4000):
        if rnd() > 0.25:
            rnd()
            continue
        text, _, n = listops.listops_operator(1, rnd, 5, 2, (2, 3))
        if n == 4:
            trees.append(text)
    assert (kept, distinct, drawn) == (len(trees), len(set(trees)), 4000) and 250 < distinct < 400
    assert estimate == pytest.approx(kept ** 2 / (2 * (kept - distinct)))
    assert listops.listops_probe(listops.listops_setting(3, "2,5", "10,40", "1,1,1"), draws=500)[2] == float("inf")
    # the task refuses a setting when the estimate is below twice the trees asked for, and only then
    kept, distinct, estimate, _, _ = listops.listops_probe(setting)
    low, high = int(estimate / 2) - 1, int(estimate / 2) + 1          # numbers of trees: passes, fails the probe
    with pytest.raises(data.DataError, match=f"has only about {int(estimate)} distinct trees, too few for {high}"):
        data.load_task("listops", cache_dir=str(tmp_path), listops_depth=2, listops_args="2,3", listops_len="3,5",
                       listops_sizes=f"{high - 2},1,1")
    monkeypatch.setattr(listops, "LISTOPS_STALE_DRAWS", 20_000)   # a chunk gives up sooner once all 400 are drawn
    with pytest.raises(data.DataError, match=f"only 400 distinct trees found, fewer than the {low}"):   # generates
        data.load_task("listops", cache_dir=str(tmp_path), listops_depth=2, listops_args="2,3", listops_len="3,5",
                       listops_sizes=f"{low - 2},1,1")


def probe_by_hand(depth, args, max_len, draws, budget):
    """The probe's draws replayed: (roots drawn, tokens grown, lengths of the trees finished), stopping at the
    first root drawn once `budget` tokens are grown (a leaf root 1 token, a tree cut short max_len + args[1])."""
    rnd = random.Random("listops-probe-12345").random
    drawn, grown, lengths = 0, 0, []
    while drawn < draws and grown < budget:
        drawn += 1
        if rnd() > 0.25:
            rnd()
            grown += 1
            continue
        try:
            n = listops.listops_operator(1, rnd, max_len, depth, args)[2]
        except listops._TooLong:
            grown += max_len + args[1]
            continue
        grown += n
        lengths.append(n)
    return drawn, grown, lengths


def test_the_probe_stops_at_its_token_bound_and_refuses_trees_too_rare(tmp_path, monkeypatch):
    # depth 100, 1-10,000 arguments: a root grows ~1,250 operators a level, so nearly every tree runs to the
    # 100,000-token bound; 20,000 such roots would take minutes (battery 16 case 85)
    setting = listops.listops_setting(100, "1,10000", "0,100000", "10,1,1")
    drawn, grown, lengths = probe_by_hand(100, (1, 10000), 100_000, 20_000, 300_000)
    assert listops.listops_probe(setting, budget=300_000)[3:] == (drawn, grown) and drawn < 20_000
    assert 300_000 <= grown < 300_000 + 110_000 and not lengths
    monkeypatch.setattr(listops, "LISTOPS_PROBE_TOKENS", 300_000)
    with pytest.raises(data.DataError, match=rf"no tree of 0 < length < 100000 in {drawn} draws, which grew "
                                             rf"{grown:,} tokens \(the probe's bound\)"):
        data.load_task("listops", cache_dir=str(tmp_path), listops_depth=100, listops_args="1,10000",
                       listops_len="0,100000", listops_sizes="10,1,1")
    assert os.listdir(tmp_path) == []


def test_a_setting_whose_trees_would_take_too_long_to_grow_is_refused(tmp_path, monkeypatch):
    drawn, grown, lengths = probe_by_hand(3, (2, 5), 40, 20_000, 10**9)
    kept = sum(10 < n < 40 for n in lengths)
    per_tree = grown / kept                                  # tokens grown for each tree kept, ~34
    assert drawn == 20_000 and 25 < per_tree < 45
    monkeypatch.setattr(listops, "LISTOPS_MOST_GROWN", int(per_tree * 120) - 1)       # 120 trees: one token over
    kw = dict(listops_depth=3, listops_args="2,5", listops_len="10,40")
    with pytest.raises(data.DataError, match=rf"grew {grown:,} tokens of trees per {kept:,} kept in the probe: its "
                                             + re.escape(f"120 trees would take some {per_tree * 120:.2g} tokens")):
        data.load_task("listops", cache_dir=str(tmp_path), listops_sizes="100,10,10", **kw)
    assert os.listdir(tmp_path) == []
    monkeypatch.setattr(listops, "LISTOPS_MOST_GROWN", int(per_tree * 120) + 1)
    assert data.load_task("listops", cache_dir=str(tmp_path), listops_sizes="100,10,10", **kw).split("val")


def test_a_few_trees_are_drawn_from_one_chunk_of_that_many(monkeypatch):
    counts, chunk = [], listops.listops_chunk
    monkeypatch.setattr(listops, "listops_chunk", lambda a: (counts.append(a[1]), chunk(a))[1])
    few = list(listops.generate_listops(7, seed=2, min_len=5, max_len=30, depth=3, args=(2, 4), processes=1,
                                        progress=False))
    assert counts == [7]                                     # not the 1,000 of a whole chunk, then 993 thrown away
    assert few == chunk(((2, 0), 1000, 5, 30, 3, (2, 4)))[:7]  # the same trees as the whole chunk's first 7


def test_a_small_setting_is_generated_into_its_own_folder(tmp_path, capsys):
    kw = dict(listops_depth=3, listops_args="2,4", listops_len="5,30", listops_sizes="60,7,9")
    task = data.load_task("listops", cache_dir=str(tmp_path), **kw)
    folder = tmp_path / "listops-depth3-args2-4-len5-30-n60-7-9"
    assert sorted(os.listdir(folder)) == sorted(["manifest.json", *(f"{s}.{a}.npy" for s in ("train", "val", "test")
                                                for a in ("tokens", "lengths", "labels"))])  # arrays only: one copy
    assert "depth 3, 2-4 arguments, 5 < length < 30, 60/7/9 trees" in capsys.readouterr().out
    assert task.block_size == 30 and task.vocab_size == 16 and task.n_classes == 10
    rows = {s: list(listops_format.listops_rows(task.split(s))) for s in ("train", "val", "test")}
    assert [len(r) for r in rows.values()] == [60, 7, 9]
    texts = [text for r in rows.values() for text, _ in r]
    assert len(set(texts)) == 76                             # the splits are disjoint
    generated = list(listops.generate_listops(76, seed=0, min_len=5, max_len=30, depth=3, args=(2, 4), processes=1,
                                              progress=False))
    assert [(t, int(v)) for r in rows.values() for t, v in r] == generated
    start = 0
    for s, r in rows.items():
        split = task.split(s)
        assert split.labels.tolist() == [int(v) for _, v in r]
        assert all(value_of(parse_lra(t)) == int(v) and 5 < length_of(parse_lra(t)) < 30 for t, v in r)
        assert isinstance(split.tokens, np.memmap) and split.tokens.dtype == np.uint8
        for i, (text, _) in enumerate(generated[start:start + len(r)]):   # the tokens, padded with 0
            ids = listops.listops_tokens(text)
            assert split.lengths[i] == len(ids) and (split.tokens[i, :len(ids)] == ids).all()
            assert not split.tokens[i, len(ids):].any()
        start += len(r)
    # a second load reuses the files; the LRA default keeps data/listops
    again = data.load_task("listops", cache_dir=str(tmp_path), **kw)
    assert "generating" not in capsys.readouterr().out
    assert again.split("val").labels.tolist() == [int(v) for _, v in rows["val"]]
    # an older version's folder (no manifest.json: TSVs only, or left half-written): made again
    old = tmp_path / "listops-depth3-args2-4-len5-30-n60-7-8"
    old.mkdir()
    listops.write_listops_tsv(old / "basic_train.tsv", generated[:60])
    task = data.load_task("listops", cache_dir=str(tmp_path), **{**kw, "listops_sizes": "60,7,8"})
    assert "generating" in capsys.readouterr().out and "basic_train.tsv" not in os.listdir(old)
    assert task.split("test").labels.tolist() == [v for _, v in generated[67:75]]
    # a build killed part-way leaves only its temporary folder, which the next load removes
    os.rename(folder, tmp_path / "listops-depth3-args2-4-len5-30-n60-7-9.tmp999999999")
    data.load_task("listops", cache_dir=str(tmp_path), **kw)
    assert "generating" in capsys.readouterr().out and not any(".tmp" in f for f in os.listdir(tmp_path))


def test_tsv_writes_the_release_format_from_the_arrays(tmp_path):
    """--tsv: LRA's three TSV files in the cache folder, the same bytes as writing the generated strings; the arrays
    are still what is read. With --data_dir it is an error."""
    kw = dict(listops_depth=3, listops_args="2,4", listops_len="5,30", listops_sizes="60,7,9")
    task = data.load_task("listops", cache_dir=str(tmp_path), tsv=True, **kw)
    folder = tmp_path / "listops-depth3-args2-4-len5-30-n60-7-9"
    generated = list(listops.generate_listops(76, seed=0, min_len=5, max_len=30, depth=3, args=(2, 4), processes=1,
                                              progress=False))
    listops.write_listops_tsv(tmp_path / "reference.tsv", generated[60:67])
    assert (folder / "basic_val.tsv").read_bytes() == (tmp_path / "reference.tsv").read_bytes()
    assert [len(listops_format.read_listops_tsv(folder / f"basic_{s}.tsv")) for s in ("train", "val", "test")] == \
        [60, 7, 9]
    assert isinstance(task.split("train").tokens, np.memmap)  # the arrays, not the TSVs
    with pytest.raises(data.DataError, match="--tsv writes the generated trees"):
        data.load_task("listops", cache_dir=str(tmp_path), data_dir=str(folder), tsv=True)


def test_tokens_give_back_the_lra_string(examples):
    for text, _ in examples:
        assert listops_format.listops_string(listops.listops_tokens(text)) == text
    assert listops_format.listops_string([8]) == "7"
    assert listops_format.listops_string([14, 2, 11, 1, 8, 15, 15]) == "( ( ( [SM 1 ) ( ( ( [MIN 0 ) 7 ) ] ) ) ] )"


def test_generation_keeps_digests_not_strings():
    """generate_listops yields its trees one at a time (nothing is held for the caller) and remembers each by a
    16-byte digest: a generator frame whose `seen` holds bytes of 16."""
    gen = listops.generate_listops(30, seed=3, min_len=20, max_len=200, chunk=10, processes=1, progress=False)
    first = next(gen)
    seen = gen.gi_frame.f_locals["seen"]
    assert len(seen) == 1 and all(isinstance(d, bytes) and len(d) == 16 for d in seen)
    assert [first, *gen] == list(listops.generate_listops(30, seed=3, min_len=20, max_len=200, chunk=10, processes=1,
                                                          progress=False))


def test_python_m_tasks_listops_prepares_the_files_alone(tmp_path):
    """python -m tasks.listops, as nanoGPT's prepare.py: the same files as train.py's first run, said where; a
    bad option is one line and exit 2."""
    def run(*argv):
        return subprocess.run([sys.executable, "-m", "tasks.listops", "--cache_dir", str(tmp_path), *argv], cwd=ROOT,
                              capture_output=True, text=True, timeout=120)
    r = run("--listops_depth", "3", "--listops_args", "2,4", "--listops_len", "5,30", "--listops_sizes", "60,7,9")
    folder = tmp_path / "listops-depth3-args2-4-len5-30-n60-7-9"
    assert r.returncode == 0 and r.stderr.count("Warning") == 0
    assert r.stdout.splitlines()[-1] == f"listops: train 60, val 7, test 9 examples, in {folder}"
    task = data.load_task("listops", cache_dir=str(tmp_path), listops_depth=3, listops_args="2,4",
                          listops_len="5,30", listops_sizes="60,7,9")
    assert task.split("train").labels.tolist() == [v for _, v in list(listops.generate_listops(
        76, seed=0, min_len=5, max_len=30, depth=3, args=(2, 4), processes=1, progress=False))[:60]]
    r = run("--listops_depth", "3", "--listops_args", "2,4", "--listops_len", "5,30", "--listops_sizes", "60,7,9",
            "--tsv")
    assert r.returncode == 0 and f"wrote basic_train.tsv, basic_val.tsv, basic_test.tsv into {folder}" in r.stdout
    assert sorted(f for f in os.listdir(folder) if f.endswith(".tsv")) == ["basic_test.tsv", "basic_train.tsv",
                                                                           "basic_val.tsv"]
    r = run("--listops_depth", "1")
    assert r.returncode == 2 and r.stderr.startswith("error: listops: --listops_depth 1 must be")
    assert "Traceback" not in r.stderr and r.stderr.count("\n") == 1
    assert "--listops_args" in run("--help").stdout


def test_split_sizes_of_the_lra_setting():
    assert listops.LISTOPS_SIZES == {"train": 96_000, "val": 2_000, "test": 2_000}
    assert listops.LISTOPS_VOCAB == ("<pad>", *"0123456789", "[MIN", "[MAX", "[MED", "[SM", "]")


def test_the_binary_cache_is_used_and_follows_the_tsv(tmp_path, examples, monkeypatch):
    tsv = tmp_path / "basic_test.tsv"
    listops.write_listops_tsv(tsv, examples[:20])
    assert os.path.getsize(tsv) < listops_format.LISTOPS_NPY_MIN_BYTES
    listops.listops_split(str(tsv), str(tmp_path / "cache"))
    assert not (tmp_path / "cache").exists()                # a small file: parsed, not cached
    monkeypatch.setattr(listops_format, "LISTOPS_NPY_MIN_BYTES", os.path.getsize(tsv))
    listops.write_listops_tsv(tsv, examples[:20])
    cache = tmp_path / "cache"
    first = listops.listops_split(str(tsv), str(cache), block_size=700)
    (folder,) = os.listdir(cache / "listops-npy")
    assert sorted(os.listdir(cache / "listops-npy" / folder)) == ["labels.npy", "lengths.npy", "manifest.json",
                                                                  "tokens.npy"]
    reference = listops_format.read_listops_tsv(tsv, block_size=700)
    for split in (first, listops.listops_split(str(tsv), str(cache), block_size=700)):
        assert isinstance(split.tokens, np.ndarray) and split.tokens.shape == reference.tokens.shape
        assert (np.asarray(split.tokens) == reference.tokens).all() and (split.lengths == reference.lengths).all()
        assert (split.labels == reference.labels).all() and split.lengths.max() == 700
    second = listops.listops_split(str(tsv), str(cache), block_size=700)
    assert isinstance(second.tokens, np.memmap) or isinstance(second.tokens.base, np.memmap)   # read from the cache
    listops.write_listops_tsv(tsv, examples[20:60])             # the TSV changes: parsed again, old arrays dropped
    changed = listops.listops_split(str(tsv), str(cache), block_size=2000)
    assert changed.labels.tolist() == [v for _, v in examples[20:60]]
    assert len(os.listdir(cache / "listops-npy")) == 1 and os.listdir(cache / "listops-npy") != [folder]
    (cache / "listops-npy" / os.listdir(cache / "listops-npy")[0] / "labels.npy").write_bytes(b"junk")
    assert listops.listops_split(str(tsv), str(cache)).labels.tolist() == [v for _, v in examples[20:60]]
    repaired = listops.listops_split(str(tsv), str(cache))      # the damaged arrays were replaced
    assert isinstance(repaired.tokens, np.memmap) and repaired.labels.tolist() == [v for _, v in examples[20:60]]


def test_tsv_round_trip(tmp_path, examples):
    path = tmp_path / "basic_test.tsv"
    listops.write_listops_tsv(path, examples)
    assert path.read_text().startswith("Source\tTarget\n") and path.read_text().count("\n") == len(examples) + 1
    split = listops_format.read_listops_tsv(path, block_size=2000)
    assert len(split) == len(examples)
    for i, (text, value) in enumerate(examples):
        ids = listops.listops_tokens(text)
        assert split.labels[i] == value
        assert split.lengths[i] == len(ids)
        assert (split.tokens[i, :len(ids)] == ids).all() and (split.tokens[i, len(ids):] == 0).all()
    short = listops_format.read_listops_tsv(path, block_size=600)      # cut to block_size
    every = np.arange(len(examples))                       # a batch is cut at 600, the rows stored whole
    assert (short._batch(every)[0].numpy() == split._batch(every)[0].numpy()[:, :600]).all()
    assert short._batch(every)[0].shape[1] == 600 < split.lengths.max()
    assert (short.lengths == np.minimum(split.lengths, 600)).all()


def test_tokenizer_keeps_closing_brackets_and_drops_parentheses():
    ids = listops.listops_tokens("( ( [SM 1 ) ( ( [MIN 0 ) 7 ) ] ) ] )")
    assert [listops.LISTOPS_VOCAB[i] for i in ids] == ["[SM", "1", "[MIN", "0", "7", "]", "]"]
    assert listops.listops_tokens("( ( ( [MAX 2 ) 9 ) ] )").tolist() == [12, 3, 10, 15]
    assert listops.listops_tokens(b"( ( ( [MED 0 ) 9 ) ] )").tolist() == [13, 1, 10, 15]
    assert len(listops.LISTOPS_VOCAB) == 16 and listops.LISTOPS_VOCAB[0] == "<pad>"
    for bad in ("[MAXX 1 ]", "[MAX 10 ]", "[max 1 ]", "[MAX 1 ] x"):
        with pytest.raises(ValueError, match="unknown symbol"):
            listops.listops_tokens(bad)


VALID = "( ( ( [MIN 3 ) 4 ) ] )\t3"


@pytest.mark.parametrize("line, reason", [
    ("( [MAX 1 ) 2 ) ]\t12", "label 12"),
    ("( [MAX 1 ) 2 ) ]\t-1", "label -1"),
    ("( [MAX 1 ) 2 ) ]", "2 tab-separated"),
    ("( [MAX 1 ) 2 ) ]\t2\t2", "found 3"),
    ("( [MAXX 1 ) 2 ) ]\t2", r"'\[MAXX'"),
    ("( [MAX 1 ) 2 ) ]\tnine", "nine"),
    ("( ( ( [MAX 2 ) 9 )\t9", r"cut short: 1 operator\(s\) not closed"),        # a truncated line
    ("( ( ( ( [SM ( ( [MIN 2 ) 9 ) ] )\t9", r"cut short: 1 operator"),
    ("( ( ( [MAX 2 ) 9 ) ] ) 3\t9", "after the root's closing"),
    ("2 ( ( ( [MAX 2 ) 9 ) ] )\t9", "does not start with an operator"),
    ("( ( [MAX ] )\t0", "without arguments"),
    ("\t3", "empty expression"),
])
def test_a_malformed_line_names_file_and_line(tmp_path, line, reason):
    path = tmp_path / "basic_val.tsv"
    path.write_text(f"Source\tTarget\n{VALID}\n" + line + "\n")
    with pytest.raises(data.DataError, match=rf"basic_val.tsv, line 3: malformed ListOps row .*{reason}.*; fix"):
        listops_format.read_listops_tsv(path, block_size=2000)


def test_unreadable_files_name_the_file_and_what_to_do(tmp_path):
    path = tmp_path / "basic_train.tsv"
    path.write_bytes(f"Source\tTarget\n{VALID}\n{VALID}\n".encode() + b"( ( ( [MIN 3 ) 4 \xff ] )\t3\n")
    with pytest.raises(data.DataError, match=r"basic_train.tsv, line 4: .*byte 0xff at column 18 is not UTF-8"):
        listops_format.read_listops_tsv(path)
    for text, message in (("", "is empty"), ("Source\tTarget\n", "has no examples"), ("Source\tTarget\n\n \n", "has no")):
        path.write_text(text)
        with pytest.raises(data.DataError, match=f"basic_train.tsv {message}.*'Source<TAB>Target'"):
            listops_format.read_listops_tsv(path, fix="what to do")
    path.unlink()
    path.mkdir()
    with pytest.raises(data.DataError, match="basic_train.tsv is a folder where the ListOps file should be; do this"):
        listops_format.read_listops_tsv(path, fix="do this")
    path.rmdir()
    path.write_text(f"{VALID}\n\n( ( ( [SM 3 ) 9 ) ] )\t2\r\n7\t7\n")  # no header, a blank line, CRLF, a digit
    split = listops_format.read_listops_tsv(path)
    assert split.labels.tolist() == [3, 2, 7] and split.lengths.tolist() == [4, 4, 1]
    assert split.tokens.tolist() == [[11, 4, 5, 15], [14, 4, 10, 15], [8, 0, 0, 0]]


def test_data_dir_errors_say_what_to_do(tmp_path):
    (tmp_path / "basic_test.tsv").mkdir()                    # a folder where the file should be
    with pytest.raises(data.DataError, match="basic_test.tsv is a folder, not a file; it should hold LRA's basic_train.tsv"):
        data.load_task("listops", data_dir=str(tmp_path), cache_dir=str(tmp_path / "c"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(data.DataError, match="holds no basic_train.tsv or basic_val.tsv or basic_test.tsv"):
        data.load_task("listops", data_dir=str(tmp_path / "empty"))


def test_release_folder_layout(tmp_path, examples):
    folder = tmp_path / "lra_release" / "listops-1000"
    folder.mkdir(parents=True)
    listops.write_listops_tsv(folder / "basic_test.tsv", examples[:20])
    for given in (folder, folder.parent):                   # the folder itself or the one that holds it
        task = data.load_task("listops", data_dir=str(given), cache_dir=str(tmp_path / "c"))
        assert task.has("test") and not task.has("train") and task.block_size == 2000
        assert len(task.split("test")) == 20
    task = data.load_task("listops", data_dir=str(folder), block_size=99, cache_dir=str(tmp_path / "c"))
    test = task.split("test")
    assert test.lengths.max() == 99 and test._batch([int(test.lengths.argmax())])[0].shape[1] == 99
    assert not (tmp_path / "c").exists()
    with pytest.raises(data.DataError, match="not a folder"):
        data.load_task("listops", data_dir=os.path.join(str(tmp_path), "missing"))


# ----- the reference rules

def test_top_of_a_tree():
    tree = "( ( ( ( ( [SM 4 ) ( ( ( [MIN 3 ) 8 ) ] ) ) 1 ) ( ( ( [MAX 9 ) 9 ) ] ) ) ] )"
    assert listops_rules.listops_top(listops.listops_tokens(tree)) == (3, (1, 4), 2)
    assert listops_rules.listops_subtree_values(listops.listops_tokens(tree)) == [3, 9]
    nested = "( ( ( ( [MAX 2 ) ( ( ( ( [MIN 7 ) ( ( ( [SM 1 ) 2 ) ] ) ) 8 ) ] ) ) 0 ) ] )"   # MIN(7, SM(1, 2), 8)
    assert listops_rules.listops_subtree_values(listops.listops_tokens(nested)) == [3]
    assert listops_rules.listops_top(listops.listops_tokens("( ( ( [MED 7 ) 2 ) ] )")) == (2, (2, 7), 0)
    assert listops_rules.listops_top(np.array([8])) == (None, (7,), 0)
    assert listops_rules.listops_subtree_values([8]) == []


@pytest.mark.parametrize("op", [0, 1, 2, 3])
def test_top_digits_posterior_agrees_with_enumeration(op):
    fn = OPS[list(OPS)[op]]
    cases = (((), 1), ((4,), 1), ((1, 8), 2), ((), 3), ((0, 2, 9), 3), ((5,), 2), ((3, 3, 6, 6), 1))
    qs = (np.array([0.3, 0.05, 0.0, 0.1, 0.15, 0.02, 0.08, 0.1, 0.05, 0.15]),
          np.array([0.5, 0.0, 0.5] + [0.0] * 7))            # no draw above 2: P(draw >= v) = 0 for v >= 3
    for q, (digits, m) in itertools.product(qs, cases):
        want = np.zeros(10)
        for xs in itertools.product(range(10), repeat=m):    # every value of the hidden subtrees
            want[fn(list(digits) + list(xs))] += np.prod(q[list(xs)])
        with np.errstate(all="raise"):                      # no 0/0 where no draw can reach a value
            got = listops_rules.listops_top_digits_posterior(op, digits, m, q)
        np.testing.assert_allclose(got, want, atol=1e-12, err_msg=str((op, digits, m)))
    assert listops_rules.listops_top_digits_posterior(op, (2, 7), 0, q).tolist() == np.eye(10)[fn([2, 7])].tolist()


def test_baselines_on_a_hand_worked_split():
    mx, mn, med, sm = "[MAX", "[MIN", "[MED", "[SM"

    def t(op, *args):                                        # an LRA string
        return "( " * (len(args) + 1) + op + " " + " ) ".join(args) + " ) ] )"
    train = [(t(mx, "1", "2"), 2), (t(mx, "3", "5"), 5), (t(mx, "0", "5"), 5),
             (t(mn, "4", t(sm, "2", "2")), 4), (t(mn, "9", t(mx, "4", "1")), 4), (t(sm, "1", t(mx, "7", "0")), 8),
             (t(med, "1", "3"), 2), (t(sm, "5", "4"), 9)]
    # majority label: 2, 4 and 5 twice each -> the smallest, 2. By operator: MAX -> 5, MIN -> 4, SM -> 8 (8 and
    # 9 once each), MED -> 2. The root-level subtrees have values 4, 4, 7, so q = (4: 2/3, 7: 1/3)
    test = [(t(mx, "2", "7"), 7),                    # majority no, operator no (5), digits yes (no subtree)
            (t(mn, "6", t(sm, "3", "3")), 6),        # operator no (4); digits: min(6, X) = 4 with 2/3: no
            (t(sm, "3", t(mx, "4", "0")), 7),        # operator no (8); digits: 3 + X = 7 with 2/3: yes
            (t(med, "1", t(mn, "4", "5")), 2),       # majority yes, operator yes; digits: MED(1, X) = 2 w. 2/3: yes
            (t(mx, "0", "5"), 5),                    # operator yes, digits yes
            (t(sm, "1", "3"), 4),                    # digits yes
            (t(mn, "2", "3"), 2),                    # majority yes, operator no (4), digits yes
            ("7", 7)]                                # a lone digit: no operator seen in training -> majority (no)
    got = listops_rules.listops_baselines(train, test=test, train=train)
    assert got["test"] == pytest.approx({"majority": 2 / 8, "top_operator": 2 / 8, "top_digits": 7 / 8})
    # q from the first 3 training trees only: no subtrees there, so q is uniform. Then MIN(6, X) -> 6 (0.4):
    # yes; SM(3 + X) -> all 0.1, the smallest label 0: no; MED(1, X) -> 1, 2, 3, 4 with 0.2 each -> 1: no
    assert listops_rules.listops_baselines(train, fit=3, test=test)["test"]["top_digits"] == pytest.approx(6 / 8)
    # on its own training split: operator rule right on 5, 5 | 4, 4 | 8 | 2 = 6 of 8; digits: the 5 trees
    # without subtrees, MIN(4, X) -> 4, MIN(9, X) -> 4 (X = 4 with 2/3), SM(1 + X) -> 5 (wrong: 8) = 7 of 8
    assert got["train"] == pytest.approx({"majority": 2 / 8, "top_operator": 6 / 8, "top_digits": 7 / 8})
    split = data.ClassificationSplit(*_padded([listops.listops_tokens(s) for s, _ in test]), [y for _, y in test])
    assert listops_rules.listops_baselines(train, test=split)["test"] == got["test"]     # a split of token ids
    none, one = ({"majority": 0, "top_operator": 0, "top_digits": d} for d in (0, 1))
    assert listops_rules.listops_baselines(train, test=[])["test"] == none
    assert listops_rules.listops_baselines(train, test=test[:1])["test"] == one


def _padded(rows):
    out = np.zeros((len(rows), max(map(len, rows))), dtype=np.uint8)
    for i, r in enumerate(rows):
        out[i, :len(r)] = r
    return (out,)


# ----- train.py's flags and the held-out generator

SMALL = ["--listops_depth", "3", "--listops_args", "2,3", "--listops_len", "5,12", "--listops_sizes", "48,16,24"]


def test_train_py_passes_the_setting_and_init_from_keeps_it(tmp_path):
    import config
    import train
    tiny = ["--n_layer", "1", "--n_embd", "16", "--n_head", "2", "--batch_size", "8", "--eval_iters", "1",
            "--log_interval", "1", "--warmup", "1", "--max_iters", "1", "--cache_dir", tmp_path]
    out = train.main([str(a) for a in [*tiny, *SMALL, "--out_dir", tmp_path / "run"]])
    assert (out["n_val"], out["n_test"]) == (16, 24)
    assert os.path.isdir(tmp_path / "listops-depth3-args2-3-len5-12-n48-16-24")
    ckpt = train.load_checkpoint(str(tmp_path / "run" / "ckpt.pt"))
    assert ckpt["config"]["block_size"] == 12                # the length bound
    assert [ckpt["args"][k] for k in config.LISTOPS_FLAGS] == [3, "2,3", "5,12", "48,16,24"]
    again = train.main([str(a) for a in ["--init_from", tmp_path / "run" / "ckpt.pt", "--eval_only"]])
    assert (again["n_val"], again["n_test"], again["test_acc"]) == (16, 24, out["test_acc"])  # the same setting


def test_the_heldout_generator_agrees_and_excludes_the_task_splits(tmp_path, capsys):
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "experiments"))
    import heldout_listops
    heldout_listops.main(["--listops_depth", "3", "--listops_args", "2,3", "--listops_len", "5,12", "--listops_sizes",
                          "300,10,10", "--n", "400", "--seed", "3", "--cache_dir", str(tmp_path), "--out",
                          str(tmp_path / "held")])
    assert "reference rules" in capsys.readouterr().out
    rows = [line.split("\t") for line in (tmp_path / "held" / "basic_test.tsv").read_text().splitlines()]
    assert rows[0] == ["Source", "Target"] and len(rows) == 401
    generated = data.load_task("listops", cache_dir=str(tmp_path), listops_depth=3, listops_args="2,3",
                               listops_len="5,12", listops_sizes="300,10,10")
    task_trees = {text for s in ("train", "val", "test") for text, _ in listops_format.listops_rows(generated.split(s))}
    assert len(task_trees) == 320
    trees = [parse_lra(text) for text, _ in rows[1:]]
    assert not task_trees & {text for text, _ in rows[1:]} and len({text for text, _ in rows[1:]}) == 400
    assert all(value_of(t) == int(v) and 5 < length_of(t) < 12 for t, (_, v) in zip(trees, rows[1:]))
    assert max(d for t in trees for d, _ in walk(t)) == 3
    assert {len(n[1]) for t in trees for _, n in walk(t) if not isinstance(n, int)} == {2, 3}
    # the two generators draw the same distribution: lengths (6..11) and labels within sampling noise
    ours = list(listops.generate_listops(2000, seed=9, min_len=5, max_len=12, depth=3, args=(2, 3), processes=1,
                                         progress=False))
    theirs = [(text, int(v)) for text, v in rows[1:]]
    for pick in (lambda s, v: length_of(parse_lra(s)), lambda s, v: v):
        a = np.bincount([pick(*e) for e in ours], minlength=12) / len(ours)
        b = np.bincount([pick(*e) for e in theirs], minlength=12) / len(theirs)
        assert 0.5 * np.abs(a - b).sum() < 0.08
    task = data.load_task("listops", data_dir=str(tmp_path / "held"))
    assert task.split("test").labels.tolist() == [int(v) for _, v in rows[1:]]
