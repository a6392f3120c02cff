"""dev/mutants.py: the one-line mutants it draws from a source, written out by hand for a small case."""

import os
import random
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "dev"))
import mutants  # noqa: E402

SOURCE = '''def f(a, b):
    """a + b < 1, in a docstring: never mutated"""
    c = a + b  # a comment: a - b
    return c < 1 and not b


def g(x):
    return x * 2.5


def h(s):
    return s == "1 + 1"
'''


def test_every_one_line_mutant_of_a_small_source():
    got = {(m["line"], m["new"].strip()) for m in mutants.mutants(SOURCE, kinds=("token",))}
    assert got == {
        (3, "c = a - b  # a comment: a - b"), (3, "pass"),
        (4, "return c <= 1 and not b"), (4, "return c < 0 and not b"), (4, "return c < 2 and not b"),
        (4, "return c < 1 or not b"), (4, "return c < 1 and b"),
        (8, "return x / 2.5"), (8, "return x * 5.0"),
        (12, 'return s != "1 + 1"'),
    }


def test_functions_filter_and_mutants_that_do_not_compile_are_left_out():
    assert {m["line"] for m in mutants.mutants(SOURCE, "^g$", ("token",))} == {8}
    source = "def f(a):\n    return a is None\n"                # is -> is not
    assert [m["new"].strip() for m in mutants.mutants(source, kinds=("token",))] == ["return a is not None"]
    source = "def f(a):\n    return not a\n"
    assert [m["new"].strip() for m in mutants.mutants(source, kinds=("token",))] == ["return a"]


def test_semantic_mutants_of_a_small_source():
    source = ("def f(x, w):\n"
              "    y = torch.relu(x @ w) + x  # skip\n"
              "    return 2 * torch.sqrt(y.sum(dim=-1) + 1)\n")
    got = {m["new"].strip() for m in mutants.mutants(source, kinds=("semantic",))}
    assert got == {
        "y = torch.relu(x @ w)  # skip", "y = x  # skip",                  # an operand of + left alone
        "y = (x @ w) + x  # skip",                                         # relu dropped
        "y = torch.relu(x) + x  # skip", "y = torch.relu(w) + x  # skip",  # an operand of @ left alone
        "y = torch.gelu(x @ w) + x  # skip",                               # the neighbouring function
        "return 2 * torch.sqrt(y.sum() + 1)",                              # keyword left out
        "return 2 * torch.sqrt(y.mean(dim=-1) + 1)", "return 2 * torch.exp(y.sum(dim=-1) + 1)",
        "return 2 * (y.sum(dim=-1) + 1)",                                  # sqrt dropped: its argument in brackets
        "return 2 * torch.sqrt(y.sum(dim=-1))", "return 2 * torch.sqrt(1)",
        "return 2", "return torch.sqrt(y.sum(dim=-1) + 1)",
    }
    assert {m["kind"] for m in mutants.mutants(source, kinds=("semantic",))} >= {"relu -> gelu", "call relu(...) dropped"}


def test_a_name_the_file_never_defines_is_not_drawn():
    source = "def f(x, i):\n    return x[i] + x0\n"                  # x0 is read, never defined: still a name
    got = {m["new"].strip() for m in mutants.mutants(source, kinds=("semantic",)) if "->" in m["kind"]}
    assert got == {"return x0[i] + x0", "return x[i] + x"}          # no j: the file has none


def test_bad_options_are_one_line():
    import pytest
    for argv, words in ((["simpletron.py", "--kinds", "tokens"], "--kinds 'tokens'"),
                        (["nothing.py"], "is not a Python file"), (["simpletron.py", "--n", "-1"], "--n must be"),
                        (["simpletron.py", "--part", "3/2"], "--part '3/2'")):
        with pytest.raises(SystemExit) as e:
            mutants.main(argv)
        assert words in str(e.value) and "\n" not in str(e.value)


def news(source, family):
    """The mutants of one harder family, as the set of their new texts (stripped lines, joined by |)."""
    return {"|".join(x.strip() for x in m["new"].splitlines()) for m in mutants.mutants(source, kinds=(family,))}


def test_wrong_axis_mutants_of_a_small_source():
    source = ("def f(x, m):\n"
              "    B, L = x.shape\n"
              "    y = x.transpose(-2, -1).sum(1, keepdim=True)\n"
              "    return torch.cat([y, m[:, None]], dim=-1)\n")
    assert news(source, "axis") == {
        "L, B = x.shape",                                                    # the shape's names swapped
        "y = x.transpose(-3, -1).sum(1, keepdim=True)", "y = x.transpose(-1, -1).sum(1, keepdim=True)",
        "y = x.transpose(-2, -2).sum(1, keepdim=True)",                      # each axis of transpose moved
        "y = x.sum(1, keepdim=True)",                                        # the transpose dropped
        "y = x.transpose(-2, -1).sum(2, keepdim=True)", "y = x.transpose(-2, -1).sum(0, keepdim=True)",
        "y = x.transpose(-2, -1).sum(1, keepdim=False)",
        "return torch.cat([y, m[:, None]], dim=-2)",
        "return torch.cat([y, m[None, :]], dim=-1)",                         # the new axis on the other side
    }


def test_off_by_one_under_padding_mutants_of_a_small_source():
    source = ("def f(x, lengths, L):\n"
              "    mask = torch.arange(L) < lengths[:, None]\n"
              "    x = x[:, :L - 1]\n"
              "    x[~mask] = 0\n"
              "    loss = F.cross_entropy(x, mask, ignore_index=-1)\n"
              "    return x[:, :-1], x[:, 1:], lengths - 1\n")
    assert news(source, "padding") == {
        "mask = torch.arange(L) <= lengths[:, None]",                        # the length mask inclusive
        "mask = torch.arange(1, L + 1) < lengths[:, None]",                  # positions shifted by one
        "x = x[:, :L]",                                                      # the slice end's - 1 left out
        "x[~mask] = 1",                                                      # padding id 1 for 0
        "loss = F.cross_entropy(x, mask, ignore_index=0)",
        "return x[:, :-2], x[:, 1:], lengths - 1", "return x[:, 1:], x[:, 1:], lengths - 1",
        "return x[:, :-1], x[:, :], lengths - 1", "return x[:, :-1], x[:, 2:], lengths - 1",
        "return x[:, :-1], x[:, :-1], lengths - 1",                          # inputs and targets shifted
        "return x[:, :-1], x[:, 1:], lengths",                               # lengths - 1 -> lengths
    }


def test_two_line_mutants_of_a_small_source():
    source = ("def f(x, pad, flag):\n"
              "    x = x + 1\n"
              "    x[pad] = 0\n"
              "    if flag:\n"
              "        y = x.transpose(1, 2)\n"
              "    else:\n"
              "        y = x\n"
              "    return y.transpose(1, 2)\n")
    got = {(m["line"], m["end"]): m["new"] for m in mutants.mutants(source, kinds=("two-line",))}
    assert got[2, 3] == "    x[pad] = 0\n    x = x + 1\n"                 # dependent statements swapped
    assert got[5, 7] == "        y = x\n    else:\n        y = x.transpose(1, 2)\n"   # the if and its else
    pairs = {m["new"].splitlines()[0].strip() + "|" + m["new"].splitlines()[-1].strip()
             for m in mutants.mutants(source, kinds=("two-line",)) if (m["line"], m["end"]) == (5, 8)}
    assert pairs == {                                                    # the same edit on both transposes
        "y = x|return y", "y = x.transpose(0, 2)|return y.transpose(0, 2)", "y = x.transpose(2, 2)|return "
        "y.transpose(2, 2)", "y = x.transpose(1, 3)|return y.transpose(1, 3)", "y = x.transpose(1, 1)|return "
        "y.transpose(1, 1)"}
    assert len(mutants.mutants(source, kinds=("two-line",))) == 7
    unbound = "def f(a):\n    b = a + 1\n    c = b * 2\n    return c\n"   # c = b * 2 first: a NameError, not drawn
    assert mutants.mutants(unbound, kinds=("two-line",)) == []
    flags = "def f(p):\n    p.add_argument('--a')\n    p.add_argument('--b')\n    args = p.parse_args()\n    return args\n"
    assert [(m["line"], m["end"]) for m in mutants.mutants(flags, kinds=("two-line",))] == [(3, 4)]   # not --help's order


def test_cache_key_mutants_of_a_small_source():
    source = ('def folder_name(depth, size, seed):\n'
              '    return f"listops-depth{depth}-n{size}"\n'
              '\n'
              'def stamp(st):\n'
              '    return [st.st_size, st.st_mtime_ns]\n'
              '\n'
              'def cache_problem(folder, size):\n'
              '    if size != 3:\n'
              '        return "too small"\n'
              '    return None\n'
              '\n'
              'def write(path, n):\n'
              '    print(f"writing {path}")\n'                              # a message: never a key
              '    save_json(path, {"size": n, "crc": 0})\n')
    assert news(source, "cache-key") == {
        "return f'listops-n{size}'", "return f'listops-depth{depth}'",      # a setting dropped, with its label
        "return f'listops-depth{depth}-n{size}-{seed}'",                    # one added
        "return [st.st_mtime_ns]", "return [st.st_size]",                   # a stamp's field dropped
        "if False:",                                                        # a check of the cache ignored
        "save_json(path, {'crc': 0})", "save_json(path, {'size': n})",      # a manifest's field left out
    }


def test_precedence_mutants_of_a_small_source():
    source = ("def settings(args, given, preset, defaults):\n"
              "    merged = {**defaults, **preset}\n"
              "    for k in defaults:\n"
              "        if k not in given:\n"
              "            setattr(args, k, preset.get(k, defaults[k]))\n"
              "    out = args.out_dir or 'out'\n"
              "    if args.a or args.b:\n"                                # a condition: its or is never flipped
              "        print(f'{out} ' if args.a else 'a')\n"              # a message: never swapped
              "    return dict(merged, **given) if args.resume else merged\n")
    assert news(source, "precedence") == {
        "merged = {**preset, **defaults}",                                  # the layers the other way round
        "if k in given:", "if True:",                                       # a flag given loses
        "setattr(args, k, defaults[k])",                                    # the default wins
        "out = 'out' or args.out_dir",                                      # the fallback first
        "return dict(given, **merged) if args.resume else merged",
        "return merged if args.resume else dict(merged, **given)",
    }


def test_the_draw_takes_each_family_in_turn_and_is_reproducible():
    pool = [{"family": f, "i": i} for f, n in (("axis", 5), ("padding", 1), ("cache-key", 3)) for i in range(n)]
    drawn = mutants.draw(pool, 6, seed=3)
    assert [m["family"] for m in drawn] == ["axis", "padding", "cache-key", "axis", "cache-key", "axis"]
    assert drawn == mutants.draw(pool, 6, seed=3) and len({(m["family"], m["i"]) for m in drawn}) == 6
    whole = mutants.draw(pool, 0, seed=3)
    assert [m["family"] for m in whole[6:]] == ["cache-key", "axis", "axis"] and sorted(
        whole, key=lambda m: (m["family"], m["i"])) == sorted(pool, key=lambda m: (m["family"], m["i"]))
    old = [{"family": "token", "i": i} for i in range(20)]              # token and semantic: the earlier draws
    shuffled = old[:]
    random.Random(5).shuffle(shuffled)
    assert mutants.draw(old, 7, seed=5) == shuffled[:7]


def test_a_mutant_of_several_lines_is_applied_whole():
    source = "def f(a):\n    b = a\n    b += 1\n    return b\n"
    lines = source.splitlines(keepends=True)
    m = {"line": 2, "end": 3, "new": "    b = a + 1\n"}
    assert mutants.apply(lines, m) == "def f(a):\n    b = a + 1\n    return b\n"
    assert mutants.expand_kinds(["token", "hard"]) == ["token", *mutants.HARD]
