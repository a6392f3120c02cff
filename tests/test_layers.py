"""The layers of the product files (README, "Files"): each file imports project modules only from the layers below
its own (tasks/ and bert.py also from each other), the model files from none, and the project's imports have no
cycle. Read from the sources with ast, imports inside functions included; nothing is imported or run.

Product files: *.py at the top level, tasks/*.py and experiments/*.py; not tests/ nor dev/ (developer tools,
which no product file may import). Imports made from a computed name (config.model_module's importlib on the
MODELS table, bench.py's nanoGPT file) are not seen here."""

import ast
import os
import re
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The layer of every project module, by its first name (tasks/*.py are "tasks", experiments/*.py "experiments").
# A module imports only from lower layers, and from its own layer where SAME_LAYER says so.
LAYERS = {
    "simpletron": 0, "transject": 0, "diffeqformer": 0,      # the models: stdlib, torch, numpy only
    "data": 1,                                                # the data API: Task, splits, registry, file checks
    "tasks": 2, "bert": 2,                                    # one file per task family; BERT's folders
    "config": 3, "curves": 3, "measure": 3,                   # models, flags, presets, checks; loss curves; timing
    "ddp": 4, "rundir": 4, "runsetup": 4,                     # torchrun's processes; the run folder; its setup
    "train": 5,                                               # the training program
    "sample": 6, "analyze": 6, "bench": 6, "experiments": 6,  # the programs on top
}
SAME_LAYER = {2}                                              # tasks/* and bert.py import each other (no cycle)
MODEL_LIBRARIES = {"torch", "numpy"}                          # besides the standard library
DEVELOPER_FOLDERS = ("tests", "dev")                          # never imported by a product file


def py_files(folder):
    path = os.path.join(ROOT, folder)
    return sorted(f for f in os.listdir(path) if f.endswith(".py")) if os.path.isdir(path) else []


def module_name(path):
    """tasks/listops.py -> tasks.listops, tasks/__init__.py -> tasks, data.py -> data."""
    name = path[:-3].replace("/", ".")
    return name[:-len(".__init__")] if name.endswith(".__init__") else name


PRODUCT = {module_name(p): p for p in py_files("") + [f"{d}/{f}" for d in ("tasks", "experiments")
                                                      for f in py_files(d)]}
# what a product file could reach by a sys.path line: the developer folders, and the modules in them
DEVELOPER = set(DEVELOPER_FOLDERS) | {f[:-3] for d in DEVELOPER_FOLDERS for f in py_files(d)}
PROJECT = set(PRODUCT) | {name.split(".")[0] for name in PRODUCT} | DEVELOPER


def resolve(name, modules):
    """The most specific of modules that `import name` loads: tasks.listops.x -> tasks.listops (or tasks)."""
    while name not in modules and "." in name:
        name = name.rsplit(".", 1)[0]
    return name


def imports(source, module, modules=PROJECT):
    """(line, imported module) of every import in source, at any depth, resolved to the project's modules
    (`from tasks import listops` -> tasks.listops, `from data import X` -> data); other libraries by first name."""
    package = module if module in {m.split(".")[0] for m in modules if "." in m} else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, resolve(a.name, modules)) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:                                    # relative: from its own package up
                parts = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(p for p in parts + [base] if p)
            found += [(node.lineno, resolve(f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base, modules))
                      for a in node.names]
    return found


def read(module):
    with open(os.path.join(ROOT, PRODUCT[module]), encoding="utf-8") as f:
        return f.read()


GRAPH = {m: sorted({(line, dst) for line, dst in imports(read(m), m) if dst.split(".")[0] in PROJECT and dst != m})
         for m in PRODUCT}


def layer(module):
    return LAYERS[module.split(".")[0]]


def test_the_architecture_page_draws_this_table():
    """docs/architecture.md's picture: each "layer N" line names the files of layer N (tasks/*.py: tasks)."""
    with open(os.path.join(ROOT, "docs", "architecture.md"), encoding="utf-8") as f:
        drawn = {name: int(n) for n, files in re.findall(r"^ *layer (\d+) +(.*)$", f.read(), re.M)
                 for name in re.findall(r"(\w+)(?:/\*)?\.py", files)}
    assert drawn == LAYERS, ("docs/architecture.md's picture and LAYERS differ: "
                             f"{sorted(set(drawn.items()) ^ set(LAYERS.items()))}; make the two agree")


def test_the_reader_sees_every_kind_of_import():
    source = ("import os, torch.nn\nfrom data import Task\nfrom tasks import listops, sources as s\n"
              "def f():\n    import simpletron\n    from . import text\n    from .lm import x\n")
    modules = {"data", "tasks", "tasks.listops", "tasks.sources", "tasks.text", "tasks.lm", "simpletron"}
    assert imports(source, "tasks.image", modules) == [
        (1, "os"), (1, "torch"), (2, "data"), (3, "tasks.listops"), (3, "tasks.sources"), (5, "simpletron"),
        (6, "tasks.text"), (7, "tasks.lm")]


def test_every_product_module_has_a_layer():
    missing = sorted({m.split(".")[0] for m in PRODUCT} - set(LAYERS))
    assert not missing, (f"{', '.join(missing)}: not in LAYERS; add each to the table in tests/test_layers.py "
                         "with the layer it belongs to (and import only from the layers below it)")


@pytest.mark.parametrize("module", sorted(PRODUCT))
def test_imports_go_only_downwards(module):
    if module.split(".")[0] not in LAYERS:
        pytest.skip("not in LAYERS (test_every_product_module_has_a_layer fails)")
    bad = []
    for line, dst in GRAPH[module]:
        top = dst.split(".")[0]
        if top in DEVELOPER:
            bad.append(f"line {line}: imports {dst}, a developer tool or test (tests/, dev/)")
        elif top not in LAYERS:
            bad.append(f"line {line}: imports {dst}, which is not in LAYERS: add it to tests/test_layers.py")
        elif not (layer(dst) < layer(module) or layer(dst) == layer(module) in SAME_LAYER):
            bad.append(f"line {line}: imports {dst} (layer {layer(dst)}), not below {module} (layer {layer(module)})")
    assert not bad, f"{PRODUCT[module]}: " + "; ".join(bad)


@pytest.mark.parametrize("module", sorted(m for m in PRODUCT if LAYERS.get(m) == 0))
def test_model_files_import_only_the_standard_library_torch_and_numpy(module):
    others = sorted({(line, name) for line, name in imports(read(module), module)
                     if name.split(".")[0] not in sys.stdlib_module_names | MODEL_LIBRARIES})
    assert not others, f"{PRODUCT[module]} stands alone, yet imports: {others}"


def test_the_import_graph_has_no_cycle():
    state, path = {}, []                                      # state: 1 on the current path, 2 done

    def visit(m):
        state[m] = 1
        path.append(m)
        for _, dst in GRAPH.get(m, []):
            if state.get(dst) == 1:
                cycle = path[path.index(dst):] + [dst]
                pytest.fail("an import cycle: " + " -> ".join(cycle))
            if dst in GRAPH and dst not in state:
                visit(dst)
        path.pop()
        state[m] = 2

    for m in sorted(GRAPH):
        if m not in state:
            visit(m)
