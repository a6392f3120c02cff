"""
Mutation testing, the small way: change one token or delete one line of a source file, run the tests, and
count how many of these one-line bugs the suite notices.

    python dev/mutants.py simpletron.py --tests tests/test_simpletron.py --n 60
    python dev/mutants.py data.py --functions 'listops|tree' --tests tests/test_listops.py
    python dev/mutants.py train.py --n 100 --jobs 2        # every test file (the default)
    python dev/mutants.py train.py --tests tests/test_train.py --then tests   # survivors: the whole suite

Mutants are drawn at random (--seed) from every statement inside the functions of FILE whose names match
--functions (a regular expression; default: all), never from strings, comments or docstrings. Semantic ones
(--kinds semantic): an operand of + - * / @ kept alone, a call dropped around its argument, a function or
attribute for its neighbour, a call's two arguments swapped, a keyword left out (see semantic_mutants). Token
ones (--kinds token): an operator swapped (+ -, * /, // /, < <=, > >=, == !=, += -=, % //, ** *), a name swapped (and or, True
False, is / is not, min max, any all), `not` dropped, an integer changed (n -> n + 1; 1 -> 0 and 2), a float
doubled, or a one-line assignment or call replaced by `pass`. A mutant that does not compile, or that leaves
the line as it was (0.0 doubled), is never drawn. Each runs `pytest -x` on a copy of the repository in a
temporary folder (the working tree is never touched); a mutant is killed when the tests fail or take longer
than --timeout seconds. Prints each result, the survivors with their lines, and the kill rate, and writes
them as JSON lines to --out. A survivor is a missing test, or an equivalent change: read it and decide.
"""

import argparse
import ast
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


def mutants(source, functions="", kinds=("token", "semantic")):
    """Every one-token or one-line mutant of the source inside the matching functions: dicts with line (1-based),
    kind, old and new (the whole line before and after). kinds: "token" (an operator, a name, a constant, a
    deleted line) and "semantic" (see semantic_mutants)."""
    lines = source.splitlines(keepends=True)
    tree = ast.parse(source)
    inside = body_lines(tree, functions)
    out = semantic_mutants(tree, lines, inside) if "semantic" in kinds else []
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
            out.append({"line": row, "kind": f"{text} -> {r or '(dropped)'}", "old": line,
                        "new": line[:col] + r + rest})
    for node in ast.walk(tree) if "token" in kinds else []:  # one-line statements deleted
        if (isinstance(node, (ast.Assign, ast.AugAssign, ast.Expr)) and node.lineno == node.end_lineno
                and node.lineno in inside and not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant))):
            line = lines[node.lineno - 1]
            if ";" not in line:
                indent = line[:len(line) - len(line.lstrip())]
                out.append({"line": node.lineno, "kind": "line deleted", "old": line, "new": indent + "pass\n"})
    valid = []
    for m in out:
        if m["new"] == m["old"]:
            continue
        changed = lines[:]
        changed[m["line"] - 1] = m["new"]
        try:
            compile("".join(changed), "<mutant>", "exec")
        except SyntaxError:
            continue
        valid.append(m)
    return valid


def copy_repository(dest):
    shutil.copytree(ROOT, dest, ignore=shutil.ignore_patterns(".git", ".venv", "out", "data", "__pycache__",
                                                              ".pytest_cache"))


def run_one(m, folder, path, original, tests, timeout):
    lines = original.splitlines(keepends=True)
    lines[m["line"] - 1] = m["new"]
    target = os.path.join(folder, path)
    with open(target, "w") as f:
        f.write("".join(lines))
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
                        "neighbouring functions, swapped arguments, keywords left out) or both (the default)")
    p.add_argument("--jobs", type=int, default=1, help="mutants tested at a time (default 1)")
    p.add_argument("--timeout", type=int, default=600, help="seconds before a mutant counts as killed")
    p.add_argument("--out", default=None, help="JSON lines of the results (default out/mutants/FILE-SEED.jsonl)")
    a = p.parse_args(argv)
    path = os.path.relpath(os.path.join(ROOT, a.file), ROOT)
    if not os.path.isfile(os.path.join(ROOT, path)) or not path.endswith(".py"):
        sys.exit(f"error: {a.file} is not a Python file of the repository")
    kinds = a.kinds.split(",")
    if not kinds or not set(kinds) <= {"token", "semantic"}:
        sys.exit(f"error: --kinds {a.kinds!r}: use token, semantic or token,semantic")
    if a.n < 0 or a.jobs < 1 or a.timeout < 1:
        sys.exit("error: --n must be >= 0, --jobs and --timeout >= 1")
    try:
        re.compile(a.functions)
    except re.error as e:
        sys.exit(f"error: --functions {a.functions!r} is not a regular expression ({e})")
    original = open(os.path.join(ROOT, path)).read()
    pool = mutants(original, a.functions, kinds)
    random.Random(a.seed).shuffle(pool)
    drawn = pool[:a.n] if a.n else pool
    if not drawn:
        sys.exit(f"error: no mutants in {path} (check --functions)")
    out = a.out or os.path.join(ROOT, "out", "mutants", f"{os.path.basename(path)[:-3]}-{a.seed}.jsonl")
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    print(f"{path}: {len(drawn)} of {len(pool)} mutants, tests: {' '.join(a.tests)}"
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
                print(f"[{i + 1}/{len(drawn)}] line {r['line']}: {r['kind']}: "
                      f"{'killed' if r['killed'] else 'SURVIVED'} ({r['seconds']} s)", flush=True)
    survivors = [r for r in results if not r["killed"]]
    for r in survivors:
        print(f"survivor, line {r['line']}:\n  - {r['old'].strip()}\n  + {r['new'].strip()}")
    killed = len(results) - len(survivors)
    print(f"{path}: {killed} of {len(results)} mutants killed ({100 * killed / len(results):.1f}%); results in {out}")


if __name__ == "__main__":
    main()
