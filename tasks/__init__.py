"""The tasks, one module per family: importing this package registers every one in data.TASKS.

    import data, tasks
    task = data.load_task("listops", cache_dir="data")

`python -m tasks.X` prepares a task of module X alone (data.prepare_main), for every module: this package, which
Python imports before it runs X, does it and stops, so a new task module needs no entry of its own.
"""

import importlib
import importlib.util
import re
import signal
import sys

if sys.argv[0] == "-m":                                      # python -m tasks.X: Ctrl-C while torch loads stops at
    signal.signal(signal.SIGINT, signal.SIG_DFL)             # once, quietly (data.run_main reports it once running)

import data  # noqa: E402
from tasks import image, listops, listops_rules, lm, pathfinder, retrieval, text  # noqa: E402,F401  (register)
from tasks.sources import check_tokenizer  # noqa: E402

# the order in which train.py --help lists them: LRA's five, then the short texts, then language modelling; a task
# not named here (a new one) comes after them
ORDER = ("listops", "text", "retrieval", "image", "pathfinder", "imdb", "agnews", "ptb", "wikitext103", "openwebtext",
         "textfile")


def in_order(names):
    return sorted(names, key=lambda n: ORDER.index(n) if n in ORDER else len(ORDER))


data.TASKS.update({name: data.TASKS.pop(name) for name in in_order(list(data.TASKS))})


def check(task, kw):
    if "tokenizer" in kw:
        check_tokenizer(kw["tokenizer"], task)


def prepare(module, argv=None):
    """python -m MODULE: prepare one of the tasks that MODULE registers (data.prepare_main)."""
    if module not in sys.modules:                            # a new module: the import line above lacks it
        importlib.import_module(module)
        print(f"note: tasks/__init__.py does not import {module}, so train.py does not know its tasks: add it to "
              "the import line", file=sys.stderr)
    data.prepare_main(module, argv, check)


def module_run():
    """The module of `python -m tasks.X` (or `python -m tasks`) while Python looks for it, else None."""
    if sys.argv[0] != "-m":                                  # (only then is it "-m")
        return None
    found = [m.group(1) or after for a, after in zip(sys.orig_argv, sys.orig_argv[1:] + [""])
             for m in [re.fullmatch(r"-[A-Za-z]*m(\S*)", a)] if m]
    module = found[0] if found else ""
    return module if module.split(".")[0] == "tasks" and importlib.util.find_spec(module) else None


if module_run():
    prepare(module_run())
    sys.exit(0)
