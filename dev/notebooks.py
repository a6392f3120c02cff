"""
Build each tour's notebook: tours/NAME.py (jupytext's percent format) -> tours/NAME.ipynb, run top to bottom with
its outputs, as GitHub shows it and Colab opens it. The tour is the source; the notebook is never edited by hand
(tests/test_tours.py fails when a notebook's cells differ from its tour's).

    pip install -r requirements-dev.txt        # jupytext, nbclient, ipykernel: for building, not for the project
    python dev/notebooks.py                    # every tour in tours/
    python dev/notebooks.py tours/simpletron.py

Each notebook runs in tours/, as Jupyter runs a notebook opened there, in a kernel of this Python. A cell that
fails stops the build with its error, and the notebook of that tour is not written.
"""

import glob
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KERNEL = {"name": "python3", "display_name": "Python 3", "language": "python"}


def build(tour):
    """tours/NAME.py -> tours/NAME.ipynb with its outputs; returns the seconds it took to run."""
    import jupytext
    import nbclient
    import nbformat

    notebook = jupytext.read(tour, fmt="py:percent")
    notebook.metadata = {"kernelspec": KERNEL, "language_info": {"name": "python"}}   # no jupytext pairing
    t0 = time.time()
    nbclient.NotebookClient(notebook, timeout=600, kernel_name=KERNEL["name"], record_timing=False,
                            resources={"metadata": {"path": os.path.dirname(os.path.abspath(tour))}}).execute()
    seconds = time.time() - t0
    for cell in notebook.cells:                              # a cell's printed lines as one output, not one each
        outputs = []
        for out in cell.get("outputs", []):
            if outputs and out.output_type == outputs[-1].output_type == "stream" and out.name == outputs[-1].name:
                outputs[-1].text += out.text
            else:
                outputs.append(out)
        cell["outputs"] = outputs
    out = tour[:-3] + ".ipynb"
    with open(out + ".tmp", "w", encoding="utf-8") as f:     # whole or not at all
        nbformat.write(notebook, f)
    os.replace(out + ".tmp", out)
    return seconds


def main(argv):
    tours = argv or sorted(glob.glob(os.path.join(ROOT, "tours", "*.py")))
    try:
        import jupytext  # noqa: F401
        import nbclient  # noqa: F401
    except ImportError as e:
        sys.exit(f"error: {e.name} is missing: pip install -r requirements-dev.txt")
    for tour in tours:
        if not (tour.endswith(".py") and os.path.isfile(tour)):
            sys.exit(f"error: {tour} is not a tour (tours/NAME.py)")
    for tour in tours:
        print(f"{tour}: running ...", flush=True)
        print(f"wrote {tour[:-3]}.ipynb ({build(tour):.0f} s)", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
