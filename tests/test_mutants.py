"""dev/mutants.py: the one-line mutants it draws from a source, written out by hand for a small case."""

import os
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
                        (["nothing.py"], "is not a Python file"), (["simpletron.py", "--n", "-1"], "--n must be")):
        with pytest.raises(SystemExit) as e:
            mutants.main(argv)
        assert words in str(e.value) and "\n" not in str(e.value)
