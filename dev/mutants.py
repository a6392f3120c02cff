"""
Mutation testing, the small way: change one token or delete one line of a source file, run the tests, and
count how many of these one-line bugs the suite notices.

    python dev/mutants.py simpletron.py --tests tests/test_simpletron.py --n 60
    python dev/mutants.py data.py --functions 'listops|tree' --tests tests/test_listops.py
    python dev/mutants.py train.py --n 100 --jobs 2        # every test file (the default)
    python dev/mutants.py train.py --tests tests/test_train.py --then tests   # survivors: the whole suite
    python dev/mutants.py data.py --kinds hard --n 40 --seed 23 --tests tests/test_data.py --then tests

Mutants are drawn at random (--seed) from every statement inside the functions of FILE whose names match
--functions (a regular expression; default: all), never from strings, comments or docstrings. Semantic ones
(--kinds semantic): an operand of + - * / @ kept alone, a call dropped around its argument, a function or
attribute for its neighbour, a call's two arguments swapped, a keyword left out (see semantic_mutants). Token
ones (--kinds token): an operator swapped (+ -, * /, // /, < <=, > >=, == !=, += -=, % //, ** *), a name swapped (and or, True
False, is / is not, min max, any all), `not` dropped, an integer changed (n -> n + 1; 1 -> 0 and 2), a float
doubled, or a one-line assignment or call replaced by `pass`. Harder ones (--kinds hard), the bugs a reviewer
who knows the code plants, in five families drawn in turn: two-line (two coordinated edits), axis (a wrong axis),
padding (off by one under padding), cache-key (a setting dropped from or added to a cache's key, a manifest field
ignored) and precedence (the order of layered settings). A mutant that does not compile, or that leaves
the line as it was (0.0 doubled), is never drawn. Each runs `pytest -x` on a copy of the repository in a
temporary folder (the working tree is never touched); a mutant is killed when the tests fail or take longer
than --timeout seconds. Prints each result, the survivors with their lines, and the kill rate, and writes
them as JSON lines to --out. A survivor is a missing test, or an equivalent change: read it and decide.
"""

import argparse
import ast
import builtins
import io
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
import tokenize
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OPERATORS = {"+": ["-"], "-": ["+"], "*": ["/"], "/": ["*"], "//": ["/"], "<": ["<="], "<=": ["<"], ">": [">="],
             ">=": [">"], "==": ["!="], "!=": ["=="], "+=": ["-="], "-=": ["+="], "%": ["//"], "**": ["*"]}
NAMES = {"and": ["or"], "or": ["and"], "True": ["False"], "False": ["True"], "is": ["is not"], "min": ["max"],
         "max": ["min"], "any": ["all"], "all": ["any"]}

DROPPABLE = (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.MatMult)
WRAPPERS = (r"^(gelu|relu|silu|tanh|sigmoid|softmax|log_softmax|dropout|drop|attn_drop|resid_drop|ln\w*|norm\w*|"
            r"layer_norm|rms_norm|sqrt|rsqrt|exp|log|abs|act|activation|cumsum|float|round|contiguous|detach|clone|"
            r"sum|mean|neg)$")
COMMUTATIVE = {"max", "min", "maximum", "minimum", "add", "mul", "eq", "ne", "transpose", "swapaxes", "isclose",
               "allclose", "setdefault", "get", "getattr", "hasattr", "isinstance", "print", "range", "zip",
               "join", "update", "pop", "replace", "register_buffer", "setattr", "assert_close", "Linear",
               "split", "get_source_segment"}
KEYWORDS = {"dim", "keepdim", "diagonal", "bias", "unbiased", "correction", "dtype", "eps", "is_causal", "mask",
            "attn_mask", "ignore_index", "reduction", "upper", "left", "descending", "stable", "weights_only",
            "non_blocking", "p", "training", "scale", "alpha", "beta", "min", "max", "exist_ok"}
NEIGHBOURS = {"gelu": ["relu"], "relu": ["gelu"], "silu": ["gelu"], "tanh": ["sigmoid"], "sigmoid": ["tanh"],
              "GELU": ["ReLU"], "ReLU": ["GELU"], "SiLU": ["GELU"], "Tanh": ["Sigmoid"],
              "softmax": ["log_softmax"], "log_softmax": ["softmax"], "sum": ["mean"], "mean": ["sum"],
              "triu": ["tril"], "tril": ["triu"], "argmax": ["argmin"], "argmin": ["argmax"], "floor": ["ceil"],
              "ceil": ["floor"], "cos": ["sin"], "sin": ["cos"], "zeros": ["ones"], "ones": ["zeros"],
              "zeros_like": ["ones_like"], "ones_like": ["zeros_like"], "weight": ["bias"], "bias": ["weight"],
              "cumsum": ["cumprod"], "std": ["var"], "var": ["std"], "exp": ["log"], "log": ["exp"],
              "sqrt": ["exp"], "mT": ["T"], "logsumexp": ["amax"], "amax": ["amin"], "amin": ["amax"],
              "t": ["clone"], "keys": ["values"], "values": ["keys"], "first": ["last"], "last": ["first"],
              "start": ["stop"], "stop": ["start"], "lo": ["hi"], "hi": ["lo"], "rank": ["world_size"],
              "world_size": ["rank"], "train": ["eval"], "eval": ["train"], "x": ["x0"], "x0": ["x"],
              "X": ["X0"], "X0": ["X"], "i": ["j"], "j": ["i"], "val": ["test"], "test": ["val"]}


def body_lines(tree, functions):
    """Line numbers of the statements inside the matching functions (docstrings left out)."""
    lines = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and re.search(functions, node.name):
            for stmt in node.body:
                if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
                    continue
                lines.update(range(stmt.lineno, stmt.end_lineno + 1))
    return lines


def semantic_mutants(tree, lines, inside):
    """The bugs a person writes: an operand of + - * / @ dropped (a skip, a scale, a bias forgotten), a function
    call dropped around its argument (a norm, an activation, a softmax, a square root), one function or attribute
    for its neighbour (GELU for ReLU, sum for mean, triu for tril, weight for bias), the two arguments of a call
    swapped, a keyword argument left out (keepdim, diagonal, dim)."""
    out = []

    def replace(node, text, kind):
        line = lines[node.lineno - 1]
        raw = line.encode()                                  # ast's columns count UTF-8 bytes
        new = (raw[:node.col_offset] + text.encode() + raw[node.end_col_offset:]).decode()
        out.append({"line": node.lineno, "kind": kind, "old": line, "new": new})

    def segment(node):
        return lines[node.lineno - 1].encode()[node.col_offset:node.end_col_offset].decode()

    for node in ast.walk(tree):
        if not (hasattr(node, "lineno") and node.lineno == getattr(node, "end_lineno", None)
                and node.lineno in inside):
            continue
        if isinstance(node, ast.BinOp) and isinstance(node.op, DROPPABLE):
            for side in ("left", "right"):
                operand = getattr(node, side)
                if operand.lineno == operand.end_lineno:
                    text = segment(operand)
                    replace(node, f"({text})" if isinstance(operand, (ast.BinOp, ast.UnaryOp)) else text,
                            f"{side} operand of {type(node.op).__name__} kept alone")
        elif isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if (len(node.args) == 1 and not isinstance(node.args[0], ast.Starred) and re.search(WRAPPERS, name)
                    and node.args[0].lineno == node.args[0].end_lineno):
                arg = segment(node.args[0])
                bare = isinstance(node.args[0], (ast.BinOp, ast.BoolOp, ast.Compare, ast.IfExp, ast.UnaryOp))
                replace(node, f"({arg})" if bare else arg, f"call {name}(...) dropped")
            if (len(node.args) == 2 and name not in COMMUTATIVE and not node.keywords
                    and all(a.lineno == a.end_lineno and not isinstance(a, ast.Starred) for a in node.args)):
                a, b = (segment(x) for x in node.args)
                head = lines[node.lineno - 1].encode()[node.col_offset:node.args[0].col_offset].decode()
                replace(node, f"{head}{b}, {a})", f"arguments of {name} swapped")
            for k in node.keywords:
                if k.arg is not None and k.arg in KEYWORDS and node.end_lineno == node.lineno:
                    rest = [segment(a) for a in node.args] + [f"{j.arg}={segment(j.value)}" for j in node.keywords
                                                              if j is not k and j.arg is not None]
                    if len(rest) == len(node.args) + len(node.keywords) - 1:
                        head = lines[node.lineno - 1].encode()[node.col_offset:node.func.end_col_offset].decode()
                        replace(node, f"{head}({', '.join(rest)})", f"keyword {k.arg} left out")
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} | {
        n.arg for n in ast.walk(tree) if isinstance(n, ast.arg)}
    for tok_node in ast.walk(tree):                            # a function or attribute for its neighbour
        if isinstance(tok_node, (ast.Attribute, ast.Name)) and tok_node.lineno in inside:
            name = tok_node.attr if isinstance(tok_node, ast.Attribute) else tok_node.id
            for new in NEIGHBOURS.get(name, []):
                if isinstance(tok_node, ast.Name) and new not in names:
                    continue                                 # a name the file never defines: a NameError, no bug
                line = lines[tok_node.lineno - 1].encode()
                end = tok_node.end_col_offset
                start = end - len(name.encode())
                if line[start:end].decode() == name and tok_node.lineno == tok_node.end_lineno:
                    text = (line[:start] + new.encode() + line[end:]).decode()
                    out.append({"line": tok_node.lineno, "kind": f"{name} -> {new}",
                                "old": lines[tok_node.lineno - 1], "new": text})
    return out


# ----------------------------------------------------------------------------------------------
# Harder kinds (--kinds hard): the bugs a reviewer who knows the code plants, in five families. Each family is a
# function of a Source that returns mutants; the draw takes one of each family in turn (draw).

HARD = ("two-line", "axis", "padding", "cache-key", "precedence")
DIM_METHODS = {"sum", "mean", "softmax", "log_softmax", "argmax", "argmin", "max", "min", "amax", "amin", "cumsum",
               "cumprod", "flatten", "unsqueeze", "squeeze", "size", "unbind", "logsumexp", "var", "std", "prod",
               "all", "any", "argsort", "sort", "median", "count_nonzero", "cat", "stack", "concatenate"}
DIM_KEYWORDS = {"dim", "axis", "start_dim", "end_dim", "dim0", "dim1"}
MODULES = {"torch", "np", "numpy", "F", "functional"}        # torch.cat(xs, 1): the axis is the second argument
LENGTHISH = re.compile(r"^(L|T|N|n|t|len|lengths?|length_\w+|\w+_lens?|\w+_lengths?|max_len|min_len|pos\w*|"
                       r"block_size|capacity|limit|end|stop|start|first|last|numel|arange|size|count|n_\w+)$")
TOKENISH = re.compile(r"^(\w+\.)*(idx|ids|tokens?|x|y|targets?|mask|input_ids|seq|stream|row|doc\w*|pad\w*)$")
PAD_KEYWORDS = {"padding_idx", "ignore_index", "value", "fill_value", "constant_values", "pad_value", "pad_id"}
CACHE_NAMES = re.compile(r"(key|folder|stamp|version|manifest|cache|hash|digest|root|tag)", re.I)
KEY_FUNCTIONS = re.compile(r"(key|stamp|version|folder_name|hash|digest)", re.I)   # functions that return a key
MESSAGES = {"reading", "print", "DataError", "UsageError", "ValueError", "warn"}
CACHE_CHECKS = re.compile(r"(cache|manifest|stamp|crc|record|check_ids)", re.I)   # a cache's checks: functions, tests
MUTATORS = {"update", "append", "extend", "add", "pop", "insert", "remove", "clear", "setdefault", "write",
            "discard", "sort", "reverse", "add_argument"}


def int_value(node):
    """The value of an integer literal (-1 included), or None."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        v = int_value(node.operand)
        return None if v is None else -v
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    return None


def call_name(node):
    return node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")


def ref(node):
    """A dotted name for a name, attribute or subscripted container (x[i] -> x), or None."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = ref(node.value)
        return base and f"{base}.{node.attr}"
    if isinstance(node, ast.Subscript):
        return ref(node.value)
    return None


def mentions_length(node):
    """Whether an expression names a length, a position or a count (L, lengths, len(...), arange, n_...)."""
    for n in ast.walk(node):
        name = n.id if isinstance(n, ast.Name) else n.attr if isinstance(n, ast.Attribute) else None
        if name and LENGTHISH.match(name):
            return True
    return False


class Source:
    """A source's text, lines and tree, the lines of its matching functions, and how edits become a mutant."""

    def __init__(self, source, functions=""):
        self.text, self.lines = source, source.splitlines(keepends=True)
        self.tree = ast.parse(source)
        self.inside = body_lines(self.tree, functions)
        self.parent = {c: p for p in ast.walk(self.tree) for c in ast.iter_child_nodes(p)}

    def seg(self, node):
        return ast.get_source_segment(self.text, node)

    def ok(self, node):
        """The node lies in the matching functions."""
        return hasattr(node, "end_lineno") and all(i in self.inside for i in range(node.lineno, node.end_lineno + 1))

    def text_span(self, span):
        """The text from (line, col) to (end_line, end_col)."""
        (l0, c0, l1, c1), raw = span, "".join(self.lines[span[0] - 1:span[2]]).encode()
        end = sum(len(x.encode()) for x in self.lines[l0 - 1:l1 - 1]) + c1
        return raw[c0:end].decode()

    def text_between(self, a, b):
        return self.text_span((a.end_lineno, a.end_col_offset, b.lineno, b.col_offset))

    def nodes(self, *types):
        return [n for n in ast.walk(self.tree) if isinstance(n, types) and self.ok(n)]

    def function_at(self, line):
        """The innermost function around a line."""
        around = [f for f in ast.walk(self.tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                  and f.lineno <= line <= f.end_lineno]
        return max(around, key=lambda f: f.lineno, default=None)

    def function(self, node):
        """The innermost function around a node."""
        while node is not None and not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            node = self.parent.get(node)
        return node

    def mutant(self, family, kind, *edits):
        """The mutant that makes every edit (a node or (line, col, end_line, end_col), its new text), as one block
        of lines from the first line edited to the last (columns count UTF-8 bytes, as ast's do)."""
        spans = [(e.lineno, e.col_offset, e.end_lineno, e.end_col_offset) if isinstance(e, ast.AST) else e
                 for e, _ in edits]
        first, last = min(s[0] for s in spans), max(s[2] for s in spans)
        starts = [0]
        for line in self.lines[first - 1:last]:
            starts.append(starts[-1] + len(line.encode()))
        block = "".join(self.lines[first - 1:last]).encode()
        for (l0, c0, l1, c1), text in sorted(zip(spans, [t for _, t in edits]), reverse=True):
            block = block[:starts[l0 - first] + c0] + text.encode() + block[starts[l1 - first] + c1:]
        return {"line": first, "end": last, "family": family, "kind": kind,
                "old": "".join(self.lines[first - 1:last]), "new": block.decode()}


def axis_edits(src):
    """Wrong axis, as (node, new text, kind): an axis argument (dim=, axis=, .sum(-1), torch.cat(xs, 1), .size(1),
    .shape[1], transpose's two) moved to a neighbouring axis; two neighbouring axes of permute, view or reshape
    swapped; keepdim toggled; an index moved to the next axis (x[..., :L] -> x[:L, ...]); the names a shape unpacks
    into swapped; a transpose dropped (.T, .mT, .t(), .transpose(a, b))."""
    out = []

    def moved(node, what):
        v = int_value(node)
        if v is not None:
            for new in ([v - 1] + [v + 1] * (v + 1 < 0)) if v < 0 else ([v + 1] + [v - 1] * (v > 0)):
                out.append((node, str(new), f"{what} {v} -> {new}"))

    def swaps(items, what):
        for a, b in zip(items, items[1:]):
            if a.lineno == b.end_lineno and not isinstance(a, ast.Starred) and not isinstance(b, ast.Starred):
                out.append(((a.lineno, a.col_offset, b.end_lineno, b.end_col_offset),
                            f"{src.seg(b)}{src.text_between(a, b)}{src.seg(a)}", f"{what}: {src.seg(a)} <-> {src.seg(b)}"))

    for node in src.nodes(ast.Call):
        name, method = call_name(node), isinstance(node.func, ast.Attribute)
        on_module = method and (ref(node.func.value) or "").split(".")[-1] in MODULES
        for k in node.keywords:
            if k.arg in DIM_KEYWORDS:
                moved(k.value, f"{name}({k.arg}=)")
            if k.arg in ("keepdim", "keepdims") and isinstance(k.value, ast.Constant) and isinstance(k.value.value, bool):
                out.append((k.value, str(not k.value.value), f"{name}({k.arg}={k.value.value} -> {not k.value.value})"))
        if name in DIM_METHODS and method and len(node.args) > on_module:
            moved(node.args[int(on_module)], f"{name}(axis)")
        if name == "transpose" and len(node.args) > 2:      # numpy's transpose(0, 2, 3, 1): a permutation
            name = "permute"
        if name in ("transpose", "swapaxes", "movedim") and method:
            for a in node.args[int(on_module):]:
                moved(a, f"{name}(axis)")
            if not on_module and len(node.args) == 2 and all(int_value(a) is not None for a in node.args):
                out.append((node, src.seg(node.func.value), f"{name}{tuple(map(int_value, node.args))} dropped"))
        if name == "t" and method and not node.args:
            out.append((node, src.seg(node.func.value), ".t() dropped"))
        if name in ("permute", "view", "reshape") and method and not on_module and len(node.args) > 1:
            swaps(node.args, f"{name} axes swapped")
    for node in src.nodes(ast.Attribute):
        if node.attr in ("T", "mT") and isinstance(node.ctx, ast.Load):
            out.append((node, src.seg(node.value), f".{node.attr} dropped"))
    for node in src.nodes(ast.Subscript):
        if isinstance(node.value, ast.Attribute) and node.value.attr == "shape":
            moved(node.slice, ".shape[axis]")
        if isinstance(node.slice, ast.Tuple):                 # x[:, i] -> x[i, :]: the index on the next axis
            trivial = [isinstance(e, ast.Constant) and e.value is Ellipsis or
                       isinstance(e, ast.Slice) and not (e.lower or e.upper or e.step) for e in node.slice.elts]
            for i in range(len(trivial) - 1):
                if trivial[i] != trivial[i + 1]:
                    swaps(node.slice.elts[i:i + 2], "index on another axis")
    for node in src.nodes(ast.Assign):                       # B, L, D = x.shape -> B, D, L = x.shape
        value = node.value
        if (len(node.targets) == 1 and isinstance(node.targets[0], ast.Tuple) and
                (isinstance(value, ast.Attribute) and value.attr == "shape" or isinstance(value, ast.Call)
                 and call_name(value) == "size" or isinstance(value, ast.Subscript) and
                 isinstance(value.value, ast.Attribute) and value.value.attr == "shape")):
            swaps(node.targets[0].elts, "shape unpacked into swapped names")
    return out


def padding_edits(src):
    """Off by one under padding, as (node, new text, kind): a comparison of lengths or positions made inclusive or
    strict (a length mask < for <=); a slice bound one more or one less (x[:L] -> x[:L - 1], [:-1] -> [:-2]); the
    - 1 or + 1 of a length left out (lengths - 1 -> lengths); a padding id 0 (or ignore_index -1) one higher; the
    two sides of a pad swapped (F.pad(m, (1, 0)) -> (0, 1)); targets or positions shifted by one ([:-1] <-> [1:],
    arange(L) -> arange(1, L + 1))."""
    out = []
    flips = {ast.Lt: "<=", ast.LtE: "<", ast.Gt: ">=", ast.GtE: ">"}
    symbols = {ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">="}
    for node in src.nodes(ast.Compare):
        if len(node.ops) == 1 and type(node.ops[0]) in flips and mentions_length(node) and node.lineno == node.end_lineno:
            left, right = node.left, node.comparators[0]
            between = src.text_between(left, right)
            out.append(((left.end_lineno, left.end_col_offset, right.lineno, right.col_offset),
                        between.replace(symbols[type(node.ops[0])], flips[type(node.ops[0])], 1),
                        f"{symbols[type(node.ops[0])]} -> {flips[type(node.ops[0])]} on a length"))
        if len(node.ops) == 1 and isinstance(node.ops[0], (ast.Eq, ast.NotEq, ast.Gt, ast.Lt, ast.GtE, ast.LtE)):
            other = node.left if int_value(node.comparators[0]) == 0 else node.comparators[0]
            zero = node.comparators[0] if other is node.left else node.left
            if int_value(zero) == 0 and TOKENISH.match(ref(other) or "-"):   # tokens != 0: a padding id
                out.append((zero, "1", "padding id 0 -> 1 in a comparison"))
    for node in src.nodes(ast.Slice):
        for side in ("lower", "upper"):
            bound = getattr(node, side)
            if bound is None:
                continue
            v = int_value(bound)
            if v is not None:
                news = [x for x in (v - 1, v + 1) if not (x == 0 and side == "upper")]
                news = ["" if x == 0 or (v < 0 and x >= 0) else str(x) for x in news]
            elif isinstance(bound, ast.BinOp) and isinstance(bound.op, (ast.Add, ast.Sub)) and int_value(bound.right) == 1:
                news = [src.seg(bound.left)]
            else:
                text = src.seg(bound)
                text = f"({text})" if isinstance(bound, (ast.IfExp, ast.BoolOp, ast.Compare, ast.Lambda)) else text
                news = [f"{text} + 1", f"{text} - 1"]
            for new in dict.fromkeys(news):
                out.append((bound, new, f"slice {side} {src.seg(bound)} -> {new or '(none)'}"))
        lo, hi = int_value(node.lower) if node.lower else None, int_value(node.upper) if node.upper else None
        if node.lower is None and hi == -1 and node.step is None:    # inputs x[:-1], targets x[1:]
            out.append((node, "1:", "shift: [:-1] -> [1:]"))
        if lo == 1 and node.upper is None and node.step is None:
            out.append((node, ":-1", "shift: [1:] -> [:-1]"))
    slices = {id(b) for s in ast.walk(src.tree) if isinstance(s, ast.Slice) for b in (s.lower, s.upper) if b}
    for node in src.nodes(ast.BinOp):
        if (isinstance(node.op, (ast.Add, ast.Sub)) and int_value(node.right) == 1 and id(node) not in slices
                and mentions_length(node.left)):
            out.append((node, src.seg(node.left), f"{'+' if isinstance(node.op, ast.Add) else '-'} 1 left out"))
    for node in src.nodes(ast.Call):
        name = call_name(node)
        for k in node.keywords:
            v = int_value(k.value)
            if k.arg in PAD_KEYWORDS and v in (0, -1):
                out.append((k.value, str(v + 1), f"padding id {k.arg}={v} -> {v + 1}"))
        if name in ("masked_fill", "full", "full_like", "fill_", "pad") and any(int_value(a) == 0 for a in node.args[1:]):
            zero = next(a for a in node.args[1:] if int_value(a) == 0)
            out.append((zero, "1", f"padding id 0 -> 1 in {name}"))
        if name == "pad" and len(node.args) > 1 and isinstance(node.args[1], ast.Tuple) and len(node.args[1].elts) >= 2:
            e = node.args[1].elts
            flipped = [src.seg(x) for pair in zip(e[1::2], e[0::2]) for x in pair]
            if flipped != [src.seg(x) for x in e]:
                out.append((node.args[1], f"({', '.join(flipped)})", "pad on the other side"))
        if name == "arange" and len(node.args) == 1 and not isinstance(node.args[0], ast.Starred):
            text = src.seg(node.args[0])
            out.append((node.args[0], f"1, {text} + 1", f"positions shifted: arange({text}) -> arange(1, {text} + 1)"))
    for node in src.nodes(ast.Subscript):                    # x[lengths] -> x[lengths - 1]
        for e in node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]:
            if isinstance(e, ast.Name) and LENGTHISH.match(e.id) and isinstance(node.ctx, ast.Load):
                out.append((e, f"{e.id} - 1", f"index {e.id} -> {e.id} - 1"))
    for node in src.nodes(ast.Assign):                       # x[pad] = 0 -> 1
        if any(isinstance(t, ast.Subscript) for t in node.targets) and int_value(node.value) == 0:
            out.append((node.value, "1", "padding id 0 -> 1 in an assignment"))
    return out


def single(src, family, edits):
    return [src.mutant(family, f"{family}: {kind}", (node, text)) for node, text, kind in edits]


def axis_mutants(src):
    """Wrong axis (axis_edits), one edit each."""
    return single(src, "axis", axis_edits(src))


def padding_mutants(src):
    """Off by one under padding (padding_edits), one edit each."""
    return single(src, "padding", padding_edits(src))


def reads_writes(stmt):
    """The dotted names a simple statement reads and writes: a subscript, attribute or augmented target, a mutating
    method (x.update(...), x.add_(...)) or setattr(x, ...) writes x and reads it."""
    bases = {id(n.value) for n in ast.walk(stmt) if isinstance(n, ast.Attribute)}   # self in self.x: not read whole
    reads = {ref(n) for n in ast.walk(stmt) if isinstance(n, (ast.Name, ast.Attribute, ast.Subscript))
             and isinstance(n.ctx, ast.Load) and id(n) not in bases} - {None}
    writes, binds = set(), set()
    targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target] if isinstance(
        stmt, (ast.AugAssign, ast.AnnAssign)) else []
    for t in targets:
        for n in ast.walk(t):
            if isinstance(n, (ast.Name, ast.Attribute, ast.Subscript)) and isinstance(n.ctx, ast.Store) and ref(n):
                writes.add(ref(n))
                if isinstance(n, (ast.Name, ast.Attribute)) and not isinstance(stmt, ast.AugAssign):
                    binds.add(ref(n))                        # x = ..., self.x = ...: x bound here
                else:
                    reads.add(ref(n))
                if isinstance(n, ast.Attribute) and isinstance(n.value, (ast.Attribute, ast.Subscript)):
                    reads.add(ref(n.value))                  # self.head.weight = ...: self.head read
    for n in ast.walk(stmt):
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and ref(n.func.value) and (
                n.func.attr in MUTATORS or n.func.attr.endswith("_") and not n.func.attr.startswith("_")):
            writes.add(ref(n.func.value))
        if isinstance(n, ast.Call) and call_name(n) == "setattr" and n.args and ref(n.args[0]):
            writes.add(ref(n.args[0]))
    return reads, writes, binds


def overlap(a, b):
    return any(x == y or x.startswith(y + ".") or y.startswith(x + ".") for x in a for y in b)


def bound_before(src, stmt):
    """The names (and attributes, self.x) bound before a statement runs: the module's, and the arguments and earlier
    assignments of each function around it."""
    names = set(dir(builtins)) | {n.id for top in src.tree.body if not isinstance(top, (
        ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) for n in ast.walk(top) if isinstance(n, ast.Name)
        and isinstance(n.ctx, ast.Store)}
    names |= {t.name for t in src.tree.body if isinstance(t, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))}
    names |= {(a.asname or a.name).split(".")[0] for t in src.tree.body if isinstance(t, (ast.Import, ast.ImportFrom))
              for a in t.names}
    f = src.function(stmt)
    while f is not None:
        names |= {a.arg for a in ast.walk(f.args) if isinstance(a, ast.arg)}
        names |= {ref(n) for n in ast.walk(f) if isinstance(n, (ast.Name, ast.Attribute)) and ref(n)
                  and isinstance(n.ctx, ast.Store) and n.lineno < stmt.lineno}
        f = src.function(src.parent.get(f))
    return names


SIMPLE = (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Expr)


def help_order_only(a, b):
    """Two add_argument calls: swapped, only --help's order changes (an equivalent mutant, never drawn)."""
    return all(isinstance(s, ast.Expr) and isinstance(s.value, ast.Call) and isinstance(s.value.func, ast.Attribute)
               and s.value.func.attr == "add_argument" for s in (a, b))


def swapped_statements(src, family, depends):
    """Two neighbouring simple statements of one block swapped, where depends(a, b) says the order matters (never
    where the swap reads a name before it is first bound: that is a NameError, not a bug)."""
    out = []
    for node in ast.walk(src.tree):
        for block in (getattr(node, f, None) for f in ("body", "orelse", "finalbody")):
            if not isinstance(block, list):
                continue
            for a, b in zip(block, block[1:]):
                if not (isinstance(a, SIMPLE) and isinstance(b, SIMPLE) and src.ok(a) and src.ok(b)
                        and b.lineno > a.end_lineno and not any(isinstance(s, ast.Expr) and isinstance(
                            s.value, ast.Constant) for s in (a, b))):
                    continue
                (ra, wa, ba), (rb, wb, _) = reads_writes(a), reads_writes(b)
                unbound = {x for x in ba if any(r == x or r.startswith(x + ".") for r in rb)} - bound_before(src, a)
                if depends(ra, wa, rb, wb) and not unbound and src.seg(a) != src.seg(b) and not help_order_only(a, b):
                    out.append(src.mutant(family, f"{family}: statements on lines {a.lineno} and {b.lineno} swapped",
                                          (a, src.seg(b)), (b, src.seg(a))))
    return out


def two_line_mutants(src):
    """Two-line bugs, two coordinated edits: two neighbouring dependent statements swapped (x += 1 then x[pad] = 0,
    the other way round); the bodies of an if and its else swapped (the condition and its else both changed); the
    same wrong-axis or off-by-one edit made on two lines of one function (a shape change in one line and the
    matching reshape in the next: both transposes dropped, both dim=-1 -> -2)."""
    out = swapped_statements(src, "two-line", lambda ra, wa, rb, wb: overlap(wa, rb) or overlap(ra, wb)
                             or overlap(wa, wb))
    for node in src.nodes(ast.If):
        body, other = node.body, node.orelse
        if (not other or src.lines[other[0].lineno - 1].lstrip().startswith("elif") or body[0].lineno <= node.test.end_lineno
                or other[0].lineno <= body[-1].end_lineno or body[0].col_offset != other[0].col_offset
                or max(s[-1].end_lineno - s[0].lineno for s in (body, other)) > 2):    # small branches only
            continue
        text = ["".join(src.lines[s[0].lineno - 1:s[-1].end_lineno]) for s in (body, other)]
        middle = "".join(src.lines[body[-1].end_lineno:other[0].lineno - 1])
        end = len(src.lines[other[-1].end_lineno - 1].encode())
        if text[0] != text[1]:
            out.append(src.mutant("two-line", f"two-line: the if and else of line {node.lineno} swapped",
                                  ((body[0].lineno, 0, other[-1].end_lineno, end), text[1] + middle + text[0])))
    groups = {}
    for node, text, kind in axis_edits(src) + padding_edits(src):
        start = node if isinstance(node, tuple) else (node.lineno, node.col_offset, node.end_lineno, node.end_col_offset)
        key = (id(src.function_at(start[0])), kind)
        groups.setdefault(key, {}).setdefault(start[0], (start, text, kind))
    for edits in groups.values():
        lines = sorted(edits)
        for i, j in zip(lines, lines[1:]):
            (s1, t1, kind), (s2, t2, _) = edits[i], edits[j]
            out.append(src.mutant("two-line", f"two-line: lines {i} and {j}: {kind}", (s1, t1), (s2, t2)))
    return out


def key_context(src, node):
    """Whether a string, list or dict is (part of) a cache's name or key: an argument of os.path.join, a hash,
    .update, source_key or cached_dir, the receiver of .encode(), a value assigned to or returned by a name like
    key, folder, stamp or version (CACHE_NAMES), never a message."""
    p = src.parent.get(node)
    if isinstance(p, ast.Attribute) and p.attr == "encode":
        return True
    if isinstance(p, ast.Call) and node in p.args and call_name(p) in {"sha1", "sha256", "md5", "blake2b", "update"}:
        return True
    if isinstance(p, ast.Call) and p.args and node is p.args[0] and call_name(p) in {"source_key", "cached_dir"}:
        return True
    if (isinstance(p, ast.Call) and node in p.args and call_name(p) == "join" and any(   # a path under a cache
            CACHE_NAMES.search(src.seg(a)) for a in p.args) and not (isinstance(src.parent.get(p), ast.Call)
                                                                    and call_name(src.parent.get(p)) in MESSAGES)):
        return True
    if isinstance(p, (ast.Assign, ast.AugAssign)):
        targets = p.targets if isinstance(p, ast.Assign) else [p.target]
        return any(CACHE_NAMES.search(ast.unparse(t)) for t in targets)
    if isinstance(p, ast.Return):
        f = src.function(p)
        return bool(f and KEY_FUNCTIONS.search(f.name))
    return False


def cache_key_mutants(src):
    """Cache keys: a setting dropped from a cache folder's name or key (a {field} of its f-string with its label,
    an element of a key's list), a setting added to it (an argument of the function that the name does not yet
    hold), a field left out of a manifest written (a dict entry) or ignored when read (a check of a cache
    function, CACHE_CHECKS, that returns or raises made never true; one of its and/or conditions left out)."""
    out = []
    for node in src.nodes(ast.JoinedStr):
        if not key_context(src, node):
            continue
        values = node.values
        for i, v in enumerate(values):
            if not isinstance(v, ast.FormattedValue):
                continue
            kept = list(values[:i]) + list(values[i + 1:])
            if i and isinstance(values[i - 1], ast.Constant):     # its label too: "-len{n}" goes whole
                label = re.sub(r"[A-Za-z_]*$", "", values[i - 1].value)
                label = label[:-1] if label and label[-1] in "-_/|.:" else label
                kept[i - 1] = ast.Constant(label)
            new = ast.unparse(ast.JoinedStr([k for k in kept if not (isinstance(k, ast.Constant) and k.value == "")]))
            out.append(src.mutant("cache-key", f"cache-key: {{{ast.unparse(v.value)}}} dropped from a key", (node, new)))
        f = src.function(node)
        held = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
        tail = values[-1].value if values and isinstance(values[-1], ast.Constant) else ""
        for a in (f.args.args + f.args.kwonlyargs) if f and not re.search(r"\.\w+$", tail) else []:   # not a file
            if a.arg not in held | {"self", "cls"}:
                new = ast.unparse(ast.JoinedStr([*values, ast.Constant("-"), ast.FormattedValue(
                    ast.Name(a.arg, ast.Load()), -1, None)]))
                out.append(src.mutant("cache-key", f"cache-key: {{{a.arg}}} added to a key", (node, new)))
    for node in src.nodes(ast.List, ast.Tuple):
        f = src.function(node)
        p = src.parent.get(node)
        unpacked = isinstance(p, ast.Assign) and isinstance(p.targets[0], (ast.Tuple, ast.List))   # key, what = ...
        if (len(node.elts) >= 2 and isinstance(node.ctx, ast.Load) and node.lineno == node.end_lineno and not unpacked
                and (key_context(src, node) or isinstance(src.parent.get(node), ast.Return) and f and CACHE_NAMES.search(f.name))):
            for i, e in enumerate(node.elts):
                rest = [src.seg(x) for j, x in enumerate(node.elts) if j != i]
                text = "[" + ", ".join(rest) + "]" if isinstance(node, ast.List) else "(" + ", ".join(rest) + ",)"
                out.append(src.mutant("cache-key", f"cache-key: {src.seg(e)} dropped from a key", (node, text)))
    for node in src.nodes(ast.Dict):
        f = src.function(node)
        p = src.parent.get(node)
        written = isinstance(p, ast.Call) and call_name(p) in {"save_json", "dump", "dumps", "atomic_write_text"}
        if (len(node.keys) >= 2 and all(isinstance(k, ast.Constant) and isinstance(k.value, str) for k in node.keys)
                and (written or f and CACHE_CHECKS.search(f.name))):
            for i, k in enumerate(node.keys):
                if k is None:
                    continue
                rest = ast.Dict([x for j, x in enumerate(node.keys) if j != i], [x for j, x in enumerate(node.values) if j != i])
                out.append(src.mutant("cache-key", f"cache-key: manifest field {k.value!r} left out", (node, ast.unparse(rest))))
    for node in src.nodes(ast.If):
        f = src.function(node)
        if not ((f and CACHE_CHECKS.search(f.name) or CACHE_CHECKS.search(src.seg(node.test))) and any(
                isinstance(s, (ast.Return, ast.Raise, ast.Continue)) for s in node.body)):
            continue
        out.append(src.mutant("cache-key", f"cache-key: the check on line {node.lineno} ignored", (node.test, "False")))
        if isinstance(node.test, ast.BoolOp) and node.test.lineno == node.test.end_lineno:
            for i, v in enumerate(node.test.values):
                rest = [src.seg(x) for j, x in enumerate(node.test.values) if j != i]
                op = " and " if isinstance(node.test.op, ast.And) else " or "
                out.append(src.mutant("cache-key", f"cache-key: {src.seg(v)} left out of a check",
                                      (node.test, op.join(f"({r})" for r in rest))))
    return out


def precedence_mutants(src):
    """Precedence of settings: the order of a dict merge flipped ({**a, **b} -> {**b, **a}, dict(a, **b) -> dict(b,
    **a)); `a or b` -> `b or a`; a default winning (d.get(k, default) -> default); the two values of `x if c else
    y` swapped; `in` <-> `not in` (a flag given counted as not given); a guard `if k not in given:` dropped (the
    checkpoint's or the preset's value over a flag's); two neighbouring statements that write the same settings
    swapped (the layers laid in the other order)."""
    out = []
    for node in src.nodes(ast.Dict):
        items = [((v.lineno, v.col_offset - 2, v.end_lineno, v.end_col_offset) if k is None else
                  (k.lineno, k.col_offset, v.end_lineno, v.end_col_offset), k is None) for k, v in zip(node.keys, node.values)]
        for (a, a_star), (b, b_star) in zip(items, items[1:]):
            if (a_star or b_star) and a[2] == b[0] and src.text_span(a).startswith("**" if a_star else ""):
                out.append(src.mutant("precedence", "precedence: the order of a dict merge flipped",
                                      ((a[0], a[1], b[2], b[3]), src.text_span(b) + src.text_span((a[2], a[3], b[0], b[1]))
                                       + src.text_span(a))))
    for node in src.nodes(ast.Call):
        name = call_name(node)
        star = [k for k in node.keywords if k.arg is None]
        if name == "dict" and len(node.args) == 1 and len(star) == 1 and node.lineno == node.end_lineno:
            out.append(src.mutant("precedence", "precedence: dict(a, **b) -> dict(b, **a)",
                                  (node.args[0], src.seg(star[0].value)), (star[0].value, src.seg(node.args[0]))))
        if name == "get" and isinstance(node.func, ast.Attribute) and len(node.args) == 2:
            out.append(src.mutant("precedence", "precedence: .get(k, default) -> default", (node, src.seg(node.args[1]))))
        if name == "getattr" and len(node.args) == 3:
            out.append(src.mutant("precedence", "precedence: getattr(o, k, default) -> default",
                                  (node, src.seg(node.args[2]))))
    for node in src.nodes(ast.BoolOp):                       # a value with its fallback, never a condition
        p = src.parent.get(node)
        condition = (isinstance(p, (ast.If, ast.While, ast.Assert, ast.BoolOp, ast.UnaryOp, ast.comprehension))
                     or isinstance(p, ast.IfExp) and p.test is node or any(
                         isinstance(v, (ast.Compare, ast.UnaryOp, ast.BoolOp)) for v in node.values))
        if isinstance(node.op, ast.Or) and not condition:
            for a, b in zip(node.values, node.values[1:]):
                if a.end_lineno == b.lineno:
                    out.append(src.mutant("precedence", f"precedence: {src.seg(a)} or {src.seg(b)} flipped",
                                          (a, src.seg(b)), (b, src.seg(a))))
    for node in src.nodes(ast.IfExp):                        # a setting, or its fallback: never two messages
        t, texts = node.test, (ast.JoinedStr, ast.Constant)
        setting = (isinstance(t, (ast.Name, ast.Attribute, ast.Subscript)) or isinstance(t, ast.Compare) and isinstance(
            t.ops[0], (ast.In, ast.NotIn, ast.Is, ast.IsNot)))
        if setting and not (isinstance(node.body, texts) and isinstance(node.orelse, texts)):
            out.append(src.mutant("precedence", "precedence: the two values of x if c else y swapped",
                                  (node.body, src.seg(node.orelse)), (node.orelse, src.seg(node.body))))
    for node in src.nodes(ast.Compare):
        if len(node.ops) == 1 and isinstance(node.ops[0], (ast.In, ast.NotIn)) and node.lineno == node.end_lineno:
            new = "not in" if isinstance(node.ops[0], ast.In) else "in"
            between = (node.left.end_lineno, node.left.end_col_offset, node.comparators[0].lineno,
                       node.comparators[0].col_offset)
            old = src.text_span(between)
            out.append(src.mutant("precedence", f"precedence: {old.strip()} -> {new}",
                                  (between, old.replace("not in" if new == "in" else "in", new, 1))))
    for node in src.nodes(ast.If):
        t = node.test
        guarded = not node.orelse and len(node.body) <= 3 and not any(     # a guarded setting, never a check
            isinstance(n, (ast.Raise, ast.Return, ast.Continue, ast.Break)) for s in node.body for n in ast.walk(s))
        if guarded and (isinstance(t, ast.Compare) and isinstance(t.ops[0], (ast.In, ast.NotIn, ast.Is, ast.IsNot))
                        or isinstance(t, ast.UnaryOp) and isinstance(t.op, ast.Not)):
            out.append(src.mutant("precedence", f"precedence: the guard on line {node.lineno} dropped", (t, "True")))
    out += swapped_statements(src, "precedence", lambda ra, wa, rb, wb: overlap(wa, wb))
    return out


FAMILIES = {"two-line": two_line_mutants, "axis": axis_mutants, "padding": padding_mutants,
            "cache-key": cache_key_mutants, "precedence": precedence_mutants}


def mutants(source, functions="", kinds=("token", "semantic")):
    """Every mutant of the source inside the matching functions: dicts with line and end (the first and last line
    replaced, 1-based), family, kind, old and new (those lines before and after). kinds: "token" (an operator, a
    name, a constant, a deleted line), "semantic" (see semantic_mutants), and the harder families of HARD ("hard":
    all five; see FAMILIES). A mutant that does not compile, or is drawn twice, is left out."""
    kinds = expand_kinds(kinds)
    lines = source.splitlines(keepends=True)
    tree = ast.parse(source)
    inside = body_lines(tree, functions)
    out = [{**m, "family": "semantic"} for m in semantic_mutants(tree, lines, inside)] if "semantic" in kinds else []
    tokens = tokenize.generate_tokens(io.StringIO(source).readline) if "token" in kinds else []
    for tok in tokens:
        (row, col), (row_end, col_end) = tok.start, tok.end
        if row not in inside or row != row_end:
            continue
        line, text = lines[row - 1], tok.string
        if tok.type == tokenize.OP and text in OPERATORS:
            reps = OPERATORS[text]
        elif tok.type == tokenize.NAME and text in NAMES:
            reps = NAMES[text]
        elif tok.type == tokenize.NAME and text == "not":
            reps = [""]
        elif tok.type == tokenize.NUMBER:
            try:
                value = ast.literal_eval(text)
            except (ValueError, SyntaxError):
                continue
            if not isinstance(value, (int, float)):
                continue
            reps = ([str(value + 1)] if value != 1 else ["0", "2"]) if isinstance(value, int) else [repr(value * 2)]
        else:
            continue
        for r in reps:
            rest = line[col_end:].lstrip() if r == "" else line[col_end:]
            out.append({"line": row, "family": "token", "kind": f"{text} -> {r or '(dropped)'}", "old": line,
                        "new": line[:col] + r + rest})
    for node in ast.walk(tree) if "token" in kinds else []:  # one-line statements deleted
        if (isinstance(node, (ast.Assign, ast.AugAssign, ast.Expr)) and node.lineno == node.end_lineno
                and node.lineno in inside and not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant))):
            line = lines[node.lineno - 1]
            if ";" not in line:
                indent = line[:len(line) - len(line.lstrip())]
                out.append({"line": node.lineno, "family": "token", "kind": "line deleted", "old": line,
                            "new": indent + "pass\n"})
    hard = Source(source, functions) if set(kinds) & set(HARD) else None
    out += [m for family in HARD if family in kinds for m in FAMILIES[family](hard)]
    valid, seen = [], set()
    for m in out:
        m["end"] = m.get("end", m["line"])
        if m["new"] == m["old"] or (m["line"], m["end"], m["new"]) in seen:
            continue
        seen.add((m["line"], m["end"], m["new"]))
        try:
            compile(apply(lines, m), "<mutant>", "exec")
        except (SyntaxError, ValueError):
            continue
        valid.append(m)
    return valid


def apply(lines, m):
    """The source with mutant m: its lines line..end replaced by its new text."""
    return "".join(lines[:m["line"] - 1] + [m["new"]] + lines[m.get("end", m["line"]):])


def expand_kinds(kinds):
    """--kinds as a list of families: "hard" stands for the five of HARD."""
    return [f for k in kinds for f in (HARD if k == "hard" else (k,))]


def draw(pool, n, seed):
    """n mutants of the pool (0: all), reproducibly by seed. Token and semantic mutants alone: the pool shuffled, as
    the earlier rounds drew them. With a harder family: each family shuffled, then one of each family in turn, so
    that every family is drawn about as often however many mutants each file offers."""
    rng = random.Random(seed)
    families = list(dict.fromkeys(m["family"] for m in pool))
    if not set(families) & set(HARD):
        pool = pool[:]
        rng.shuffle(pool)
        return pool[:n] if n else pool
    groups = [[m for m in pool if m["family"] == f] for f in families]
    for g in groups:
        rng.shuffle(g)
    turns = [g[i] for i in range(max(map(len, groups))) for g in groups if i < len(g)]
    return turns[:n] if n else turns


def copy_repository(dest):
    shutil.copytree(ROOT, dest, ignore=shutil.ignore_patterns(".git", ".venv", "out", "data", "__pycache__",
                                                              ".pytest_cache"))


def run_one(m, folder, path, original, tests, timeout):
    target = os.path.join(folder, path)
    with open(target, "w") as f:
        f.write(apply(original.splitlines(keepends=True), m))
    t0 = time.time()
    try:
        p = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests],
                           cwd=folder, capture_output=True, text=True, timeout=timeout,
                           env=dict(os.environ, OMP_NUM_THREADS="1"))
        killed, last = p.returncode != 0, (p.stdout.strip().splitlines() or [""])[-1]
    except subprocess.TimeoutExpired:
        killed, last = True, f"timeout after {timeout} s"
    finally:
        with open(target, "w") as f:
            f.write(original)
    return {**m, "killed": killed, "tests": last, "seconds": round(time.time() - t0, 1)}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("file", help="a source file of the repository, e.g. simpletron.py")
    p.add_argument("--tests", nargs="+", default=["tests"], help="what pytest runs (default: tests)")
    p.add_argument("--then", nargs="+", default=None,
                   help="tests the survivors of --tests run against next (e.g. tests: the whole suite), so that a "
                        "quick first pass over the module's own tests is enough for most mutants")
    p.add_argument("--functions", default="", help="regular expression on function names (default: all)")
    p.add_argument("--n", type=int, default=50, help="mutants drawn (default 50; 0: all)")
    p.add_argument("--seed", type=int, default=0, help="which mutants are drawn (default 0)")
    p.add_argument("--kinds", default="token,semantic",
                   help="token (operators, names, constants, deleted lines), semantic (operands and calls dropped, "
                        "neighbouring functions, swapped arguments, keywords left out), hard (two-line, axis, "
                        "padding, cache-key and precedence: the harder families) or any of these separated by commas "
                        "(default: token,semantic)")
    p.add_argument("--part", default="1/1", help="K/N: test only the K-th of N equal parts of the draw (the draw "
                                                 "is the same), to split a long run into shorter commands")
    p.add_argument("--jobs", type=int, default=1, help="mutants tested at a time (default 1)")
    p.add_argument("--timeout", type=int, default=600, help="seconds before a mutant counts as killed")
    p.add_argument("--out", default=None, help="JSON lines of the results (default out/mutants/FILE-SEED.jsonl)")
    a = p.parse_args(argv)
    path = os.path.relpath(os.path.join(ROOT, a.file), ROOT)
    if not os.path.isfile(os.path.join(ROOT, path)) or not path.endswith(".py"):
        sys.exit(f"error: {a.file} is not a Python file of the repository")
    kinds = a.kinds.split(",")
    if not kinds or not set(kinds) <= {"token", "semantic", "hard", *HARD}:
        sys.exit(f"error: --kinds {a.kinds!r}: use token, semantic, hard or {', '.join(HARD)}, separated by commas")
    if a.n < 0 or a.jobs < 1 or a.timeout < 1:
        sys.exit("error: --n must be >= 0, --jobs and --timeout >= 1")
    part = re.fullmatch(r"(\d+)/(\d+)", a.part)
    if not part or not 1 <= int(part[1]) <= int(part[2]):
        sys.exit(f"error: --part {a.part!r}: use K/N with 1 <= K <= N, e.g. 2/3")
    try:
        re.compile(a.functions)
    except re.error as e:
        sys.exit(f"error: --functions {a.functions!r} is not a regular expression ({e})")
    original = open(os.path.join(ROOT, path)).read()
    pool = mutants(original, a.functions, kinds)
    drawn = draw(pool, a.n, a.seed)
    if not drawn:
        sys.exit(f"error: no mutants in {path} (check --functions)")
    k, parts = int(part[1]), int(part[2])
    first = len(drawn) * (k - 1) // parts
    drawn = drawn[first:len(drawn) * k // parts]
    name = f"{os.path.basename(path)[:-3]}-{a.seed}" + (f"-{k}of{parts}" if parts > 1 else "")
    out = a.out or os.path.join(ROOT, "out", "mutants", f"{name}.jsonl")
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    print(f"{path}: {len(drawn)} of {len(pool)} mutants" + (f" (part {k} of {parts}: from #{first + 1})" if parts > 1
                                                            else "") + f", tests: {' '.join(a.tests)}"
          + (f", then {' '.join(a.then)}" if a.then else ""), flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        folders = []
        for j in range(a.jobs):                             # one copy of the repository per job
            folders.append(os.path.join(tmp, f"repo{j}"))
            copy_repository(folders[-1])
        free = list(folders)

        def job(m):
            folder = free.pop()
            try:
                r = run_one(m, folder, path, original, a.tests, a.timeout)
                if not r["killed"] and a.then:
                    again = run_one(m, folder, path, original, a.then, a.timeout)
                    r = {**again, "seconds": round(r["seconds"] + again["seconds"], 1)}
                return r
            finally:
                free.append(folder)
        results = []
        with ThreadPoolExecutor(a.jobs) as ex, open(out, "w") as f:
            for i, r in enumerate(ex.map(job, drawn)):
                results.append(r)
                f.write(json.dumps(r) + "\n")
                f.flush()
                print(f"[{first + i + 1}] line {r['line']}: {r['kind']}: "
                      f"{'killed' if r['killed'] else 'SURVIVED'} ({r['seconds']} s)", flush=True)
    survivors = [r for r in results if not r["killed"]]
    for r in survivors:
        lines = f"lines {r['line']}-{r['end']}" if r.get("end", r["line"]) != r["line"] else f"line {r['line']}"
        print(f"survivor, {lines} ({r['kind']}):\n" + "".join(f"  - {x.strip()}\n" for x in r["old"].splitlines())
              + "".join(f"  + {x.strip()}\n" for x in r["new"].splitlines()), end="")
    killed = len(results) - len(survivors)
    print(f"{path}: {killed} of {len(results)} mutants killed ({100 * killed / len(results):.1f}%); results in {out}")


if __name__ == "__main__":
    main()
