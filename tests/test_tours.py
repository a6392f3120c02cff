"""The tours (tours/NAME.py, jupytext's percent format) and their notebooks (tours/NAME.ipynb, built by
dev/notebooks.py): every tour has its notebook, whose cells are the tour's, each code cell run without an error and
every figure drawn. Read with the json module and the small percent-format reader below: no jupytext needed.
Behind the mark `slow` (python -m pytest -m slow tests; .ci/run runs it): each tour runs whole as
`python tours/NAME.py` from another folder, and each notebook runs whole under nbclient (requirements-dev.txt)."""

import ast
import glob
import json
import os
import select
import signal
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOURS = sorted(os.path.basename(p)[:-3] for p in glob.glob(os.path.join(ROOT, "tours", "*.py")))


def percent_cells(text):
    """The cells of a percent-format script, [(kind, source)]: a cell starts at a line `# %%` (code) or
    `# %% [markdown]` (markdown: its lines uncommented, "# text" -> "text", "#" -> ""); the blank lines around a
    cell's text are not part of it."""
    cells = []
    for number, line in enumerate(text.splitlines(), 1):
        if line.startswith("# %%"):
            cells.append(("markdown" if line.split("%%", 1)[1].strip() == "[markdown]" else "code", []))
        elif not cells:
            assert not line.strip(), f"line {number}: text before the first `# %%`"
        elif cells[-1][0] == "markdown" and line.strip():
            assert line == "#" or line.startswith("# "), f"line {number}: a markdown line must start with '# '"
            cells[-1][1].append(line[2:])
        else:
            cells[-1][1].append(line)
    return [(kind, "\n".join(lines).strip("\n")) for kind, lines in cells]


def notebook(name):
    path = os.path.join(ROOT, "tours", f"{name}.ipynb")
    if not os.path.isfile(path):
        pytest.fail(f"tours/{name}.ipynb is missing: build it with python dev/notebooks.py tours/{name}.py")
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def source(cell):
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


def test_the_reader_reads_the_percent_format():
    text = ("# %% [markdown]\n# # Title\n#\n# $$y = x$$\n\n# %%\nimport os\n\n\nx = 1  # %% not a cell\n\n"
            "# %% [markdown]\n# text\n# %%\n# a comment\ny = 2\n")
    assert percent_cells(text) == [("markdown", "# Title\n\n$$y = x$$"), ("code", "import os\n\n\nx = 1  # %% not a cell"),
                                   ("markdown", "text"), ("code", "# a comment\ny = 2")]


def test_there_are_tours():
    assert {"simpletron", "transject", "diffeqformer"} <= set(TOURS)


def test_every_tour_opens_with_the_same_setup_cell():
    """The first code cell installs the project on Colab only (elsewhere it finds the project's folder): one cell,
    word for word the same in every tour, so that a fix reaches them all."""
    firsts = {}
    for name in TOURS:
        with open(os.path.join(ROOT, "tours", f"{name}.py"), encoding="utf-8") as f:
            firsts[name] = next(text for kind, text in percent_cells(f.read()) if kind == "code")
    assert len(set(firsts.values())) == 1, f"the tours' first code cells differ: {sorted(firsts)}"
    first = firsts[TOURS[0]]
    assert all(part in first for part in ('if "google.colab" in sys.modules:', '"git", "clone"', "requirements.txt"))


@pytest.mark.parametrize("name", TOURS)
def test_a_notebook_holds_its_tours_cells(name):
    with open(os.path.join(ROOT, "tours", f"{name}.py"), encoding="utf-8") as f:
        tour = percent_cells(f.read())
    cells = [(cell["cell_type"], source(cell)) for cell in notebook(name)["cells"]]
    for i, (ours, theirs) in enumerate(zip(tour, cells)):
        assert ours == theirs, (f"cell {i + 1} of tours/{name}.ipynb differs from tours/{name}.py: rebuild it with "
                                f"python dev/notebooks.py tours/{name}.py")
    assert len(cells) == len(tour), f"tours/{name}.ipynb has {len(cells)} cells, its tour {len(tour)}: rebuild it"


@pytest.mark.parametrize("name", TOURS)
def test_a_notebook_was_run_whole_and_draws_every_figure(name):
    nb = notebook(name)
    code = [cell for cell in nb["cells"] if cell["cell_type"] == "code"]
    assert [cell["execution_count"] for cell in code] == list(range(1, len(code) + 1)), "not run top to bottom"
    for cell in code:
        kinds = [out["output_type"] for out in cell["outputs"]]
        assert "error" not in kinds, source(cell)[:200]
        if "plt.show()" in source(cell):                     # a figure, as a PNG
            assert any("image/png" in out.get("data", {}) for out in cell["outputs"]), source(cell)[:200]
    assert nb["metadata"]["kernelspec"]["name"] == "python3"


@pytest.mark.slow
@pytest.mark.parametrize("name", TOURS)
def test_a_tour_runs_whole_as_a_script_from_another_folder(name, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "MPLBACKEND"}
    r = subprocess.run([sys.executable, os.path.join(ROOT, "tours", f"{name}.py")], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]


@pytest.mark.slow
@pytest.mark.parametrize("name", TOURS)
def test_a_notebook_runs_whole_under_nbclient(name):
    nbclient = pytest.importorskip("nbclient", reason="pip install -r requirements-dev.txt")
    nbformat = pytest.importorskip("nbformat", reason="pip install -r requirements-dev.txt")
    nb = nbformat.reads(json.dumps(notebook(name)), as_version=4)
    nbclient.NotebookClient(nb, timeout=900, kernel_name="python3",
                            resources={"metadata": {"path": os.path.join(ROOT, "tours")}}).execute()


@pytest.mark.parametrize("name", TOURS)
def test_a_tour_run_with_a_flag_or_a_backend_matplotlib_lacks_is_one_line_before_any_work(name, tmp_path):
    """python tours/NAME.py reads no flags (--help would be ignored: the whole tour would run), and MPLBACKEND, which
    a script honours, must name a backend: each one line from the set-up cell."""
    for argv, env, said in ((["--help"], {}, "error: a tour reads no flags (--help): run python "),
                            ([], {"MPLBACKEND": "tk"}, "error: MPLBACKEND=tk names no backend of matplotlib's")):
        p = subprocess.run([sys.executable, os.path.join(ROOT, "tours", f"{name}.py"), *argv], cwd=tmp_path,
                           env={**os.environ, **env}, capture_output=True, text=True, timeout=60)
        assert p.returncode == 1 and p.stderr.startswith(said) and len(p.stderr.splitlines()) == 1, p.stderr
        assert p.stdout == "" and not (tmp_path / "out").exists()



def started_tour(name, folder):
    """python tours/NAME.py from `folder`, its stdout and stderr pipes."""
    env = {k: v for k, v in os.environ.items() if k != "MPLBACKEND"}
    return subprocess.Popen([sys.executable, os.path.join(ROOT, "tours", f"{name}.py")], cwd=folder, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def first_line(p, seconds=60):
    """The first line the tour prints (after its set-up cell and imports), or "" if none comes in `seconds`."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and p.poll() is None:
        if select.select([p.stdout], [], [], 0.5)[0]:
            return p.stdout.readline()
    return ""


@pytest.mark.parametrize("name", TOURS)
def test_a_tour_stopped_by_ctrl_c_says_one_line_and_exits_130(name, tmp_path):
    """Ctrl-C (SIGINT) to python tours/NAME.py, a few seconds in: one line on stderr, exit status 130, as the
    project's programs; no traceback. (Under Jupyter the interrupt stays the kernel's KeyboardInterrupt.)"""
    p = started_tour(name, tmp_path)
    try:
        first_line(p)
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=60)
    finally:
        p.kill()
    assert p.returncode == 130 and "Traceback" not in err and len(err.splitlines()) <= 3, err[-3000:]


@pytest.mark.parametrize("name", TOURS)
def test_a_tour_whose_reader_goes_away_ends_quietly(name, tmp_path):
    """python tours/NAME.py | head -1: the reader gone after one line, the tour ends as the programs do (SIGPIPE;
    exit status 1 where there is none), no BrokenPipeError traceback."""
    p = started_tour(name, tmp_path)
    try:
        line = first_line(p)
        p.stdout.close()
        err = p.stderr.read()
        p.wait(timeout=120)
    finally:
        p.kill()
    assert line, "no line printed within 60 s: stdout to a pipe must be written line by line"
    assert p.returncode in (-getattr(signal, "SIGPIPE", 0), 1) and "Traceback" not in err, err[-3000:]


def tour_text(name):
    with open(os.path.join(ROOT, "tours", f"{name}.py"), encoding="utf-8") as f:
        return f.read()


def functions_of(name, *functions):
    """The source of a tour's top-level functions `functions`, in the tour's order."""
    text = tour_text(name)
    nodes = [n for n in ast.parse(text).body if isinstance(n, ast.FunctionDef) and n.name in functions]
    assert sorted(n.name for n in nodes) == sorted(functions), f"tours/{name}.py lacks one of {functions}"
    return "\n\n".join(ast.get_source_segment(text, n) for n in nodes)


def test_the_simpletron_tours_training_stops_in_one_line_when_train_py_refuses(tmp_path, monkeypatch, capsys):
    """The tour's train_py (its function alone, with the set-up cell's run_python): train.py's own line, then one
    line saying the tour stopped, and no traceback; nothing trained."""
    namespace = {"subprocess": subprocess, "sys": sys}
    exec(compile(functions_of("simpletron", "run_python", "train_py"), "tours/simpletron.py", "exec"), namespace)
    monkeypatch.chdir(ROOT)                                  # (the tour's setup cell's folder)
    with pytest.raises(SystemExit) as e:
        namespace["train_py"]("--max_iters", "-5", "--out_dir", str(tmp_path / "o"))
    assert str(e.value) == "error: train.py stopped (exit status 2); its line above says why"
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"$ python train.py --max_iters -5 --out_dir {tmp_path / 'o'}" and len(lines) == 2, lines
    assert lines[1].startswith("error: --max_iters -5") and not (tmp_path / "o").exists()


def test_a_tour_starts_its_processes_with_the_set_up_cells_run_python_alone():
    """A process a tour starts (train.py, python -m tasks.listops) must stop when the tour stops: run_python, in the
    set-up cell, sees to it. Past the set-up cell no tour calls subprocess itself."""
    for name in TOURS:
        cells = [text for kind, text in percent_cells(tour_text(name)) if kind == "code"]
        calls = [f"subprocess.{n.attr}" for cell in cells[1:] for n in ast.walk(ast.parse(cell))
                 if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "subprocess"]
        assert not calls, f"tours/{name}.py starts a process with {calls[0]}: use the set-up cell's run_python"


def alive(pid):
    """Whether process `pid` still runs (a zombie, ended but not yet reaped, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
    except OSError:                                          # no /proc: ask the process
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="reads /proc")
@pytest.mark.parametrize("sig, status, said", [(signal.SIGTERM, 143, "terminated: the tour stopped"),
                                               (signal.SIGINT, 130, "interrupted: the tour stopped")],
                         ids=["SIGTERM", "Ctrl-C"])
def test_a_tour_stopped_while_its_train_py_runs_stops_it_too(sig, status, said, tmp_path):
    """SIGTERM (kill, a scheduler's stop) or Ctrl-C to a tour run as a script while the train.py it started runs:
    the tour says one line, exits 143 (130), and its train.py is stopped with it, not left working alone. The
    set-up cell and simpletron's train_py, run from a folder whose train.py prints its process id and sleeps."""
    (tmp_path / "train.py").write_text("import os, time\nprint('pid', os.getpid(), flush=True)\ntime.sleep(120)\n")
    first = next(text for kind, text in percent_cells(tour_text("simpletron")) if kind == "code")
    code = f"{first}\n\n{functions_of('simpletron', 'train_py')}\n\ntrain_py('--max_iters', '5')\n"
    env = {k: v for k, v in os.environ.items() if k != "MPLBACKEND"}
    p = subprocess.Popen([sys.executable, "-c", code], cwd=tmp_path, env={**env, "PYTHONPATH": ROOT},
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    child = None
    try:
        deadline = time.monotonic() + 60
        while child is None and time.monotonic() < deadline and p.poll() is None:
            if select.select([p.stdout], [], [], 0.5)[0]:
                line = p.stdout.readline()
                child = int(line.split()[1]) if line.startswith("pid ") else None
        assert child, "the tour's train.py did not start within 60 s"
        p.send_signal(sig)
        _, err = p.communicate(timeout=30)
        deadline = time.monotonic() + 2
        while alive(child) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not alive(child), "the tour ended and left its train.py running"
        assert p.returncode == status and err.startswith(said) and len(err.splitlines()) == 1, (p.returncode, err)
    finally:
        p.kill()
        if child and alive(child):
            os.kill(child, signal.SIGKILL)
