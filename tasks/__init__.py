"""The tasks, one module per family: importing this package registers every one in data.TASKS.

    import data, tasks
    task = data.load_task("listops", cache_dir="data")
"""

import warnings

import data
from tasks import image, listops, listops_rules, lm, pathfinder, retrieval, text  # noqa: F401  (each registers its tasks)

# the order in which train.py --help lists them: LRA's five, then the short texts, then language modelling
ORDER = ("listops", "text", "retrieval", "image", "pathfinder", "imdb", "agnews", "ptb", "wikitext103", "openwebtext",
         "textfile")
data.TASKS.update({name: data.TASKS.pop(name) for name in ORDER})

# python -m tasks.X (prepare one task's files) imports this package, and so tasks.X, before it runs tasks.X as
# __main__: runpy warns about that, needlessly here (data.task keeps the loaders the package registered)
warnings.filterwarnings("ignore", r"'tasks\.\w+' found in sys\.modules", RuntimeWarning)
