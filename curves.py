"""
Loss curves of train.py runs, read from their log.jsonl (one JSON record a line):

    a training step   {"step", "loss", "lr", "time", "acc" (classifiers)}
    an evaluation     {"step", "val_loss", "val_n", "val_acc" (classifiers) or "val_ppl" (language models), "time"}
    a resumption      {"step", "resumed": true, "time"}       (train.py --resume, at that step)
    attention std     {"step", "score_std", "attn_std", "time"}  (not drawn here: python analyze.py attnstd)
"""

import functools
import json
import math
import os
import re

import numpy as np

os.environ["MPLBACKEND"] = "Agg"             # files only, never a window (an unknown one would stop the import)
import matplotlib  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402  (no pyplot: no global figures, the Agg canvas writes the PNG)
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.ticker import NullLocator  # noqa: E402

import data  # noqa: E402


def record(line):
    """A log line's record (a JSON object with a step), or None (e.g. a line still being written)."""
    try:
        r = json.loads(line)
    except (ValueError, RecursionError):
        return None
    return r if isinstance(r, dict) and data.finite(r.get("step")) else None


def numbered_records(path):
    """[(line number from 1, record)] of a log.jsonl's lines that are records."""
    return [(n, r) for n, r in enumerate(map(record, data.read_lines(path)), 1) if r]


def read_log(path):
    """{"train": step records, "val": evaluations, "resumed": steps, "damaged": (line number, step) of each record whose
    values train.py cannot have written, "broken": (line number, why) of each line that train.py cannot have written
    (see faults)}; other records (attention std) left out."""
    texts = list(data.read_lines(path))
    records = list(map(record, texts))
    lines = [(n, r) for n, r in enumerate(records, 1) if r]
    rs = [r for _, r in lines]
    number = data.finite
    return {"train": [r for r in rs if number(r.get("loss"))], "val": [r for r in rs if number(r.get("val_loss"))],
            "damaged": [(n, r["step"]) for n, r in lines if damaged(r)], "broken": faults(texts, records),
            "resumed": [r["step"] for r in rs if r.get("resumed")]}


def faults(texts, records):
    """[(line number, why)] of the lines of a log (texts, and their records or None) that train.py cannot have
    written: before the last (the one line that may be still being written, left out), a line that is no record; a
    step that is no integer >= 0; a step before one already written with no resumption record between (--resume
    writes one at the step it resumes, and drops the records after it)."""
    found, top = [], None
    for n, (text, r) in enumerate(zip(texts, records), 1):
        if r is None:
            if n < len(texts):
                found.append((n, f"{CUT_SHORT}: {no_record(text)}"))
            continue
        step = r["step"]
        if not (step >= 0 and float(step).is_integer()):
            found.append((n, f": its step {shown(step)} is no integer >= 0"))
        elif r.get("resumed"):
            top = step
        elif top is not None and step < top:
            found.append((n, f": step {step:g} after step {top:g} with no resumption record between"))
        else:
            top = step
    return found


CUT_SHORT = " (not the last, which may be one still being written)"


def no_record(text):
    """Why a log line is no record (curves.record: None)."""
    if not text.strip():
        return "it is empty"
    try:
        r = json.loads(text)
    except ValueError:
        return "it is not JSON"
    except RecursionError:
        return "it is JSON nested too deep to read"
    if not isinstance(r, dict):
        return "it is no JSON object"
    return f"its step {shown(r['step'])} is no integer >= 0" if "step" in r else "it has no step"


def shown(v):
    """A JSON value in a message: a string, number, true, false or null as written (40 characters at most), a list or
    an object by its kind."""
    if v is None or isinstance(v, (str, int, float)):
        return json.dumps(v)[:40]
    return "a list" if isinstance(v, list) else "an object"


def damaged(r):
    """True for a record whose loss or val_loss is no number >= 0 (a cross-entropy), whose val_ppl is no number >= 1
    (e^loss; inf allowed, train.py's past 709.78), or whose accuracy is none from 0 to 1 (a fraction)."""
    return (any(k in r and not (data.finite(r[k]) and r[k] >= 0) for k in ("loss", "val_loss")) or
            "val_ppl" in r and not (type(r["val_ppl"]) in (int, float) and r["val_ppl"] >= 1) or   # (nan: not >= 1)
            any(k in r and not (data.finite(r[k]) and 0 <= r[k] <= 1) for k in ("acc", "val_acc", "val_acc_example")))


def log_problem(path):
    """What keeps a run's log.jsonl from being drawn (no readable file, no step, a damaged record), or None."""
    problem = data.file_problem(path)
    if problem:
        return problem
    log = read_log(path)
    if not (log["train"] or log["val"]):
        return "holds no record of a step"
    problems = [(line, f"has a damaged record (step {step:g}) at line {line}: a loss that is no number >= 0, a "
                       "perplexity below 1 or an accuracy not 0 to 1") for line, step in log["damaged"]]
    problems += [(line, f"has a damaged line {line}{why}") for line, why in log["broken"]]
    return min(problems)[1] if problems else None


def std_records(path):
    """The attention-std records of a log.jsonl (train.py --attn_std_interval N): score_std and attn_std, one standard
    deviation (a number >= 0) a block, as many blocks in each record; a DataError names the first line that is not."""
    records = [(n, r) for n, r in numbered_records(path) if "score_std" in r]
    blocks = len(records[0][1]["score_std"]) if records and isinstance(records[0][1]["score_std"], list) else 0
    for n, r in records:
        if not all(isinstance(r.get(k), list) and len(r[k]) == blocks > 0 and
                   all(data.finite(v) and v >= 0 for v in r[k]) for k in ("score_std", "attn_std")):
            raise data.DataError(f"{path}, line {n}: the attention std of step {r['step']:g} is damaged (score_std "
                                 f"and attn_std hold one number >= 0 a block, {blocks or 'some'} blocks as in the "
                                 "first record)")
    return [r for _, r in records]


def column(records, key):
    """(steps, values) of the records that have `key`, sorted by step; a step written twice keeps its last."""
    by_step = {r["step"]: r[key] for r in records if data.finite(r.get(key))}
    return np.array(sorted(by_step), dtype=float), np.array([by_step[s] for s in sorted(by_step)], dtype=float)


def moving_average(y, window):
    """At each point the mean of the last `window` values (fewer at the start): it never looks ahead."""
    total, end = np.concatenate([[0.0], np.cumsum(y)]), np.arange(1, len(y) + 1)
    start = np.maximum(end - window, 0)
    return (total[end] - total[start]) / (end - start)


def seed_band(series):
    """The seeds of one row, [(steps, values)] -> rows steps, mean, min, max at the steps that every seed has."""
    steps = functools.reduce(np.intersect1d, [s for s, _ in series])
    values = np.stack([v[np.searchsorted(s, steps)] for s, v in series])
    return np.stack([steps, values.mean(0), values.min(0), values.max(0)])


def log_ticks(ax, axis, values):
    """Readable log-axis ticks (not 10 and 100 alone: 29.5 unreadable): >= 2 values of 1-2-5 (or 1-1.5-2-3-...-8)
    times a power of ten inside the data's range, widened to the nearest such values for a narrower range."""
    values = [v for v in values if 1e-300 < v < 1e300]       # (past those, 1.15 times a value is not a float)
    if not values:
        return
    lo, hi = min(values) / 1.15, max(values) * 1.15
    decades = range(math.floor(math.log10(lo)) - 1, math.ceil(math.log10(hi)) + 1)
    for mantissas in ((1, 2, 5), (1, 1.5, 2, 3, 4, 5, 6, 7, 8)):
        cands = sorted(m * 10.0 ** e for e in decades for m in mantissas)
        ticks = [v for v in cands if lo <= v <= hi]
        if len(ticks) >= 3 or mantissas[-1] == 8:
            break
    if len(ticks) < 2:                                       # a narrow range: the candidates just outside
        lo, hi = max(v for v in cands if v <= lo), min(v for v in cands if v >= hi)
        ticks = [v for v in cands if lo <= v <= hi]
    getattr(ax, f"set_{axis}lim")(lo, hi)
    getattr(ax, f"set_{axis}ticks")(ticks, [f"{v:g}" for v in ticks])
    getattr(ax, f"{axis}axis").set_minor_locator(NullLocator())


def metric_of(logs):
    """Panel 2's (key, label, scale): val accuracy (classifiers), perplexity (language models), None (no val yet)."""
    keys = {k for log in logs for r in log["val"] for k in ("val_acc", "val_ppl") if k in r}
    return next((m for m in (("val_acc", "val accuracy (%)", 100), ("val_ppl", "val perplexity", 1)) if m[0] in keys),
                None)


def literal(text):
    """text drawn as written, not as mathematics: matplotlib reads a text with two $ as mathematics (a run named
    $TASK_$SEED: an error) and draws an escaped \\$ as $. For the names of runs, paths and the user's text."""
    return str(text).replace("$", r"\$")


def look(i):
    """Row i's colour and marker: 10 colours and 9 markers, so that rows 1 to 90 differ in one or both."""
    return dict(color=matplotlib.colormaps["tab10"](i % 10), marker="osD^vP*Xh"[i % 9], ms=4)


def draw_row(axes, i, logs, metric):
    """Row i, its seeds as their mean and a band from min to max: panel 1 the train loss (moving average; one run:
    each step too, light) and the val loss, panel 2 the metric. Returns {key: {"step", "mean", "min", "max"}}, the
    last values that all its seeds have."""
    train = [column(log["train"], "loss") for log in logs]
    if all(len(s) for s, _ in train):
        w = max(1, min(100, min(len(s) for s, _ in train) // 20))   # 1 for a few steps, 100 from 2,000 on
        if len(logs) == 1:
            axes[0].plot(*train[0], color=look(i)["color"], lw=0.5, alpha=0.3)
        draw(axes[0], seed_band([(s, moving_average(v, w)) for s, v in train]), 1, dict(look(i), marker=None))
    last, own = {}, metric_of(logs)
    answers = own is not None and own[0] == "val_acc" and any("val_acc_example" in r for g in logs for r in g["val"])
    for key, ax, scale in ([("val_loss", axes[0], 1)] + ([(own[0], axes[1], own[2])] if own else []) +
                           [("val_acc_example", axes[1], 100)] * answers):   # recall: per example too, dashed
        series = [column(log["val"], key) for log in logs]
        band = seed_band(series) if all(len(s) for s, _ in series) else np.empty((4, 0))
        if not band.shape[1]:
            continue
        if ax is axes[0] or own == metric:                   # panel 2 holds one metric (acc, among classifiers)
            draw(ax, band, scale, dict(look(i), ls=":" if ax is axes[0] else "--" if key.endswith("example") else "-"))
        last[key] = {"step": int(band[0, -1]), **dict(zip(("mean", "min", "max"), band[1:, -1].tolist()))}
    return last


def draw(ax, band, scale, look):
    steps, mean, lo, hi = band
    ax.plot(steps, scale * mean, lw=1.5, **look)
    if (lo < hi).any():
        ax.fill_between(steps, scale * lo, scale * hi, color=look["color"], alpha=0.2, lw=0)


def draw_rows(rows, title, png_path, short_steps=0, resumed=()):
    """rows {label: [log, ...]} drawn by draw_row into two panels; steps 1..short_steps shaded (not for language
    models, which train on full windows), resumptions dashed. Returns [{"label", "runs", and draw_row's}]."""
    metric = metric_of([log for logs in rows.values() for log in logs])
    named = len(rows) > 1 or any(len(logs) > 1 for logs in rows.values())    # not one run alone: its title names it
    legend_lines = -(-len(rows) // 3) if named else 0         # the rows' legend under the panels, 3 a line
    height = 4.6 + 0.2 * legend_lines                         # inches; margins fixed (a layout engine costs 0.5 s)
    fig = Figure(figsize=(12, height))
    fig.subplots_adjust(left=0.06, right=0.985, top=1 - 0.45 / height, bottom=(0.6 + 0.2 * legend_lines) / height)
    axes = fig.subplots(1, 2)
    summary = [{"label": label, "runs": len(logs), **draw_row(axes, i, logs, metric)}
               for i, (label, logs) in enumerate(rows.items())]
    lm = metric is not None and metric[0] == "val_ppl"
    if lm:                                                    # ticks around every value drawn, bands included
        axes[1].set_yscale("log")
        log_ticks(axes[1], "y", axes[1].dataLim.intervaly)
    val_label = metric[1] if metric else "no evaluation yet"
    if any("val_acc_example" in r for logs in rows.values() for log in logs for r in log["val"]):
        val_label = "val accuracy (%): per answer, per example (dashed)"
    for ax, ylabel in zip(axes, ("loss (cross-entropy, nats)", val_label)):
        if short_steps > 0 and not lm:
            ax.axvspan(0, short_steps, color="0.5", alpha=0.15, lw=0, label=f"steps 1-{short_steps}: prefixes")
        for n, step in enumerate(resumed):
            ax.axvline(step, color="0.3", ls="--", lw=1, label=None if n else "resumed (--resume)")
        ax.set(xlabel="training step", ylabel=ylabel)
        ax.grid(True, alpha=0.3)
    kinds = [Line2D([], [], color="0.3", label="train loss"), Line2D([], [], color="0.3", ls=":", marker="o",
                                                                     label="val loss")]
    axes[0].legend(handles=kinds + axes[0].get_legend_handles_labels()[0], fontsize=8)
    names = [literal(f"{r['label']} ({r['runs']} seeds)" if r["runs"] > 1 else r["label"]) for r in summary]
    if legend_lines:
        fig.legend(handles=[Line2D([], [], **look(i), label=n) for i, n in enumerate(names)], loc="lower center",
                   ncol=3, fontsize=8, frameon=False)
    fig.suptitle(literal(title))
    data.atomic_write(png_path, lambda f: fig.savefig(f, format="png", dpi=100))   # whole or not at all
    return summary


def plot_run(log_path, png_path, short_steps=0, title=""):
    """One run (train.py draws it at every evaluation); short_steps: its sequence-length warm-up."""
    log = read_log(log_path)
    name = os.path.basename(os.path.dirname(os.path.abspath(log_path)))
    draw_rows({name: [log]}, title or name, png_path, short_steps, log["resumed"])


def row_of(run):
    """A run folder's row: its name without the -sSEED of experiments.py's out/exp/TABLE/ROW-sSEED."""
    return re.sub(r"-s\d+$", "", os.path.basename(os.path.normpath(run)))


def plot_runs(runs, png_path, labels=None):
    """Runs over each other, those of one label as one line and a band. The default label: row_of, so that the seeds
    of one row in one folder (experiments.py's out/exp/TABLE/ROW-sSEED) are one row; a row whose name another
    folder's row shares is named with its folder too. A run given twice counts once.
    Returns per row {"label", "runs", "val_loss": {"step", "mean", "min", "max"}, "val_acc" or "val_ppl": alike}:
    the last values that all its seeds have."""
    if labels is None:
        runs = [r for i, r in enumerate(runs) if os.path.realpath(r) not in map(os.path.realpath, runs[:i])]
    keys = [(os.path.dirname(os.path.abspath(r)), row_of(r)) for r in runs]
    shared = {row for _, row in keys if len({k for k in keys if k[1] == row}) > 1}
    rows = {}
    for run, label in zip(runs, labels or [os.path.join(os.path.relpath(d), row) if row in shared else row
                                           for d, row in keys]):
        rows.setdefault(label, []).append(read_log(os.path.join(run, "log.jsonl")))
    return draw_rows(rows, "training curves: the mean over seeds, the band from the lowest to the highest", png_path)


def last_values(row):
    """One row's summary line: its last val loss and accuracy or perplexity, with the seeds' range."""
    parts = []
    for key, what, scale, form in (("val_loss", "val loss", 1, "{:.4f}"), ("val_acc", "val acc", 100, "{:.2f}%"),
                                   ("val_ppl", "val ppl", 1, "{:.2f}")):
        if key in row:
            mean, lo, hi = (form.format(scale * row[key][k]) for k in ("mean", "min", "max"))
            parts.append(f"{what} {mean}" + (f" (seeds {lo} to {hi})" if row["runs"] > 1 else ""))
    step = f"step {row['val_loss']['step']}: " if "val_loss" in row else ""
    seeds = f" ({row['runs']} seeds)" if row["runs"] > 1 else ""
    return f"{row['label']}{seeds}: {step}" + (", ".join(parts) or "no evaluation yet")
