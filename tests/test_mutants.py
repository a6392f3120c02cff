"""experiments/mutants.py: the one-line mutants it draws from a source, written out by hand for a small case."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "experiments"))
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
    got = {(m["line"], m["new"].strip()) for m in mutants.mutants(SOURCE)}
    assert got == {
        (3, "c = a - b  # a comment: a - b"), (3, "pass"),
        (4, "return c <= 1 and not b"), (4, "return c < 0 and not b"), (4, "return c < 2 and not b"),
        (4, "return c < 1 or not b"), (4, "return c < 1 and b"),
        (8, "return x / 2.5"), (8, "return x * 5.0"),
        (12, 'return s != "1 + 1"'),
    }


def test_functions_filter_and_mutants_that_do_not_compile_are_left_out():
    assert {m["line"] for m in mutants.mutants(SOURCE, "^g$")} == {8}
    source = "def f(a):\n    return a is None\n"                # is -> is not
    assert [m["new"].strip() for m in mutants.mutants(source)] == ["return a is not None"]
    source = "def f(a):\n    return not a\n"
    assert [m["new"].strip() for m in mutants.mutants(source)] == ["return a"]
