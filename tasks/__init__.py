"""The tasks, one module per family: importing this package registers every one in data.TASKS.

    import data, tasks
    task = data.load_task("listops", cache_dir="data")

`python -m tasks.X` prepares a task of module X alone: its last lines hand the command line to data.prepare_main.
This package, which Python imports before it runs X, says so in one line if X has no such lines. It imports every
module in tasks/ (a new one needs no line here), and one that fails on import is one line naming its file and line.
"""

import importlib
import importlib.util
import os
import pkgutil
import re
import signal
import sys
import traceback
import warnings

if sys.argv[0] == "-m":                                      # python -m tasks.X: Ctrl-C while torch loads stops at
    signal.signal(signal.SIGINT, signal.SIG_DFL)             # once, quietly (data.run_main reports it once running)

import data  # noqa: E402

try:                                                         # every module here, a fork's too, registers its tasks
    for _m in sorted(m.name for m in pkgutil.iter_modules(__path__) if m.name != "__main__"):   # (a line below: moot)
        importlib.import_module(f"tasks.{_m}")
except Exception as e:                                       # a fork's module that fails on import: where, and why
    frame = [f for f in traceback.extract_tb(e.__traceback__) if os.path.dirname(f.filename) == __path__[0]][-1]
    file, line, why = (e.filename, e.lineno, e.msg) if isinstance(e, SyntaxError) else (frame.filename, frame.lineno, e)
    print(f"error: {os.path.relpath(file)} line {line} fails on import: {type(e).__name__}: {data.one_line(why, 200)}",
          file=sys.stderr)
    sys.exit(2)

# the order in which train.py --help lists them: LRA's five, then the short texts, then language modelling, then
# the recall tasks; a task not named here (a new one) comes after them
ORDER = ("listops", "text", "retrieval", "image", "pathfinder", "imdb", "agnews", "ptb", "wikitext103", "openwebtext",
         "textfile", "mqar", "copy", "induction")


def in_order(names):
    return sorted(names, key=lambda n: ORDER.index(n) if n in ORDER else len(ORDER))


problems = [f"task {name!r} is registered by {first} and by {second}: give one of them another name"
            for name, (first, second) in data.CLASHES.items()]
problems += [f"task {name!r}: {why}" for name, why in data.UNFIT.items()]
if problems:                                                 # a fork's mistake: one line, before any work
    print(f"error: {problems[0]}", file=sys.stderr)
    sys.exit(2)
data.TASKS.update({name: data.TASKS.pop(name) for name in in_order(list(data.TASKS))})

# python -m tasks.X (prepare one task's files) imports this package, and so tasks.X, before it runs tasks.X as
# __main__: runpy warns about that, needlessly here (data.task keeps the loaders the package registered)
warnings.filterwarnings("ignore", r"'tasks\.\w+' found in sys\.modules", RuntimeWarning)


def without_entry(module):
    """Why `python -m MODULE` would do nothing, or None: a module of tasks ends with its entry, `if __name__ ==
    "__main__": prepare_main("tasks.X")`."""
    with open(importlib.util.find_spec(module).origin, encoding="utf-8") as f:
        source = f.read()
    if re.search(r"^if __name__ == .__main__.:", source, re.M):
        named = re.findall(r"prepare_main\(\s*[\"'](tasks\.\w+)[\"']", source)[-1:]   # (an entry copied, naming its source)
        return None if named in ([], [module]) else (
            f"{module}'s entry prepares {named[0]}'s tasks: end it with prepare_main(\"{module}\")")
    names = [n for n, fn in data.TASKS.items() if fn.__module__ == module]
    if not names:
        return (f"{module} registers no task, so there is nothing to prepare; python -m tasks.NAME prepares the tasks "
                f"of: {', '.join(sorted({fn.__module__ for fn in data.TASKS.values()}))}")
    return (f"{module} registers {', '.join(names)} but has no entry: end it with `if __name__ == \"__main__\": "
            f"prepare_main(\"{module}\")`, as tasks/listops.py does")


def module_run():
    """The module of `python -m tasks.X` while Python looks for it (then, and only then, sys.argv[0] is "-m")."""
    found = [m.group(1) or after for a, after in zip(sys.orig_argv, sys.orig_argv[1:] + [""])
             for m in [re.fullmatch(r"-[A-Za-z]*m(\S*)", a)] if m]
    module = found[0] if found and sys.argv[0] == "-m" else ""
    return module if module == "tasks" or module.startswith("tasks.") else None


def check_entry(module):
    """python -m MODULE, before Python runs it (this package has imported it): no such module, or one without an
    entry, is one line, exit 2."""
    if module == "tasks" or "." in module[len("tasks."):] or importlib.util.find_spec(module) is None:
        print(f"error: python -m {module}: no such module of tasks; python -m tasks.NAME prepares the tasks of: "
              f"{', '.join(sorted({fn.__module__ for fn in data.TASKS.values()}))}", file=sys.stderr)
        sys.exit(2)
    if without_entry(module):
        print(f"error: {without_entry(module)}", file=sys.stderr)
        sys.exit(2)


if module_run():
    check_entry(module_run())
