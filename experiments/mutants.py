"""
Mutation testing, the small way: change one token or delete one line of a source file, run the tests, and
count how many of these one-line bugs the suite notices.

    python experiments/mutants.py simpletron.py --tests tests/test_simpletron.py --n 60
    python experiments/mutants.py data.py --functions 'listops|tree' --tests tests/test_listops.py
    python experiments/mutants.py train.py --n 100 --jobs 2        # every test file (the default)

Mutants are drawn at random (--seed) from every statement inside the functions of FILE whose names match
--functions (a regular expression; default: all), never from strings, comments or docstrings:
an operator swapped (+ -, * /, // /, < <=, > >=, == !=, += -=, % //, ** *), a name swapped (and or, True
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


def mutants(source, functions=""):
    """Every one-token or one-line mutant of the source inside the matching functions: dicts with line (1-based),
    kind, old and new (the whole line before and after)."""
    lines = source.splitlines(keepends=True)
    tree = ast.parse(source)
    inside = body_lines(tree, functions)
    out = []
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
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
    for node in ast.walk(tree):                              # one-line statements deleted
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
    p.add_argument("--functions", default="", help="regular expression on function names (default: all)")
    p.add_argument("--n", type=int, default=50, help="mutants drawn (default 50; 0: all)")
    p.add_argument("--seed", type=int, default=0, help="which mutants are drawn (default 0)")
    p.add_argument("--jobs", type=int, default=1, help="mutants tested at a time (default 1)")
    p.add_argument("--timeout", type=int, default=600, help="seconds before a mutant counts as killed")
    p.add_argument("--out", default=None, help="JSON lines of the results (default out/mutants/FILE-SEED.jsonl)")
    a = p.parse_args(argv)
    path = os.path.relpath(os.path.join(ROOT, a.file), ROOT)
    if not os.path.isfile(os.path.join(ROOT, path)) or not path.endswith(".py"):
        sys.exit(f"error: {a.file} is not a Python file of the repository")
    if a.n < 0 or a.jobs < 1 or a.timeout < 1:
        sys.exit("error: --n must be >= 0, --jobs and --timeout >= 1")
    try:
        re.compile(a.functions)
    except re.error as e:
        sys.exit(f"error: --functions {a.functions!r} is not a regular expression ({e})")
    original = open(os.path.join(ROOT, path)).read()
    pool = mutants(original, a.functions)
    random.Random(a.seed).shuffle(pool)
    drawn = pool[:a.n] if a.n else pool
    if not drawn:
        sys.exit(f"error: no mutants in {path} (check --functions)")
    out = a.out or os.path.join(ROOT, "out", "mutants", f"{os.path.basename(path)[:-3]}-{a.seed}.jsonl")
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    print(f"{path}: {len(drawn)} of {len(pool)} mutants, tests: {' '.join(a.tests)}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        folders = []
        for j in range(a.jobs):                             # one copy of the repository per job
            folders.append(os.path.join(tmp, f"repo{j}"))
            copy_repository(folders[-1])
        free = list(folders)

        def job(m):
            folder = free.pop()
            try:
                return run_one(m, folder, path, original, a.tests, a.timeout)
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
