"""curves.py: the log reader, the moving average and the seeds' band against small hand-worked cases, the PNGs of
every kind of log (no val yet, attention std only, a resumption, a language model), and analyze.py curves."""

import json
import math
import os

import numpy as np
import pytest
from matplotlib.figure import Figure

import analyze
import curves

PNG = b"\x89PNG\r\n\x1a\n"


def write_log(folder, records, tail=""):
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "log.jsonl")
    with open(path, "w") as f:
        f.write("".join(json.dumps(r) + "\n" for r in records) + tail)
    return path


def classifier_log(val, n_steps=30, acc=True):
    """Train steps 1..n_steps (loss 3 - step / 10) and the evaluations val {step: (val_loss, val_acc)}."""
    records = []
    for s in range(1, n_steps + 1):
        records.append({"step": s, "loss": 3 - s / 10, "lr": 1e-3, "time": 0.1 * s, **({"acc": 0.5} if acc else {})})
        if s in val:
            records.append({"step": s, "val_loss": val[s][0], "val_n": 100, "val_acc": val[s][1], "time": 0.1 * s})
    return records


def is_png(path):
    with open(path, "rb") as f:
        return f.read(8) == PNG


def drawn_texts(monkeypatch):
    """From now on, the texts of every figure saved, as drawn: one list a figure, read from the figure's SVG with its
    texts kept as text (where a text that matplotlib reads as mathematics fails, as it does in the PNG)."""
    import io
    import xml.etree.ElementTree as ET
    import matplotlib
    save, figures = Figure.savefig, []

    def savefig(fig, *args, **kwargs):
        svg = io.BytesIO()
        with matplotlib.rc_context({"svg.fonttype": "none"}):
            save(fig, svg, format="svg")
        texts = ET.fromstring(svg.getvalue()).iter("{http://www.w3.org/2000/svg}text")
        figures.append(["".join(t.itertext()) for t in texts])
        return save(fig, *args, **kwargs)
    monkeypatch.setattr(Figure, "savefig", savefig)
    return figures


# folder names that matplotlib reads as mathematics (two $), with _ ^ \ and an escaped \$ of their own besides
DOLLARS = ["$TASK_$SEED", r"a_b^c \$d$ \x$"]


# ----------------------------------------------------------------------------------------------
# The numbers

def test_moving_average_by_hand():
    assert np.allclose(curves.moving_average([1.0, 2.0, 3.0, 4.0], 2), [1.0, 1.5, 2.5, 3.5])
    assert np.allclose(curves.moving_average([4.0, 2.0, 6.0], 3), [4.0, 3.0, 4.0])    # fewer at the start
    assert np.allclose(curves.moving_average([5.0, 7.0], 1), [5.0, 7.0])
    y = np.random.default_rng(0).normal(size=200)
    loop = [y[max(0, i - 9):i + 1].mean() for i in range(200)]
    assert np.allclose(curves.moving_average(y, 10), loop)


def test_seed_band_by_hand():
    # seed 0 has steps 10, 20, 30; seed 1 has 20, 30, 40; seed 2 has 10, 20, 30: the band is at 20 and 30
    series = [(np.array([10., 20., 30.]), np.array([3.0, 2.0, 1.0])),
              (np.array([20., 30., 40.]), np.array([2.6, 1.6, 0.9])),
              (np.array([10., 20., 30.]), np.array([3.1, 2.3, 1.3]))]
    steps, mean, lo, hi = curves.seed_band(series)
    assert steps.tolist() == [20, 30]
    assert np.allclose(mean, [(2.0 + 2.6 + 2.3) / 3, (1.0 + 1.6 + 1.3) / 3])
    assert np.allclose(lo, [2.0, 1.0]) and np.allclose(hi, [2.6, 1.6])


def test_read_log_sorts_the_records_and_leaves_out_the_rest(tmp_path):
    records = [{"step": 0, "score_std": [1.0], "attn_std": [2.0], "time": 0},
               {"step": 1, "loss": 2.0, "lr": 1e-3, "time": 1}, {"step": 2, "loss": 1.5, "lr": 1e-3, "time": 2},
               {"step": 2, "val_loss": 1.7, "val_n": 9, "val_ppl": 5.47, "time": 2},
               {"step": 2, "resumed": True, "time": 3}, {"step": 3, "loss": 1.2, "lr": 1e-3, "time": 4}]
    log = curves.read_log(write_log(tmp_path, records, tail='{"step": 4, "lo'))   # the last line half written
    assert [r["step"] for r in log["train"]] == [1, 2, 3] and log["resumed"] == [2]
    assert [r["val_ppl"] for r in log["val"]] == [5.47]
    steps, loss = curves.column(log["train"], "loss")
    assert steps.tolist() == [1, 2, 3] and loss.tolist() == [2.0, 1.5, 1.2]
    assert curves.metric_of([log])[0] == "val_ppl"


def test_log_ticks_label_values_between_the_decades():
    ax = Figure().subplots()
    ax.set_yscale("log")
    curves.log_ticks(ax, "y", [29.5, 55])                    # activation.png's values: 10 and 100 alone said nothing
    assert [t.get_text() for t in ax.get_yticklabels()] == ["30", "40", "50", "60"]
    curves.log_ticks(ax, "y", [1.2, 900])                    # three decades: 1-2-5
    assert [t.get_text() for t in ax.get_yticklabels()] == ["2", "5", "10", "20", "50", "100", "200", "500", "1000"]
    curves.log_ticks(ax, "y", [0.0, float("inf"), 61.0])     # what a log axis cannot show is left out
    assert [t.get_text() for t in ax.get_yticklabels()] == ["60", "70"]
    curves.log_ticks(ax, "y", [1.7e308, 5e-324, 61.0])      # so is a value 1.15 times of which is no float
    assert [t.get_text() for t in ax.get_yticklabels()] == ["60", "70"]
    curves.log_ticks(ax, "y", [9e299, 61.0])                 # (just inside: ticks up to 1e300)
    assert ax.get_yticks()[-1] >= 9e299


# ----------------------------------------------------------------------------------------------
# The pictures

def test_plot_run_draws_every_kind_of_log(tmp_path):
    cases = {
        "classifier": classifier_log({10: (2.5, 0.3), 20: (2.0, 0.5), 30: (1.5, 0.6)}),
        "no-val-yet": classifier_log({}),
        "attention-std-only": [{"step": 0, "score_std": [1.0, 2.0], "attn_std": [0.5, 0.4], "time": 0}],
        "empty": [],
        "resumed": classifier_log({10: (2.5, 0.3), 30: (1.5, 0.6)})[:20] + [{"step": 15, "resumed": True, "time": 9}] +
                   classifier_log({10: (2.5, 0.3), 30: (1.5, 0.6)})[20:],
        "lm": [{"step": s, "loss": 5 - s / 10, "lr": 1e-3, "time": s} for s in range(1, 21)] +
              [{"step": 20, "val_loss": 3.4, "val_n": 64, "val_ppl": float(np.exp(3.4)), "time": 20},
               {"step": 20, "score_std": [1.0], "attn_std": [1.0], "time": 20}],
    }
    for name, records in cases.items():
        png = tmp_path / f"{name}.png"
        curves.plot_run(write_log(tmp_path / name, records), str(png), short_steps=5, title=name)
        assert is_png(png) and png.stat().st_size > 10_000, name
        assert not list(tmp_path.glob(f"{name}.png.tmp*"))   # written whole, no temporary file left


def test_plot_run_is_fast_on_a_long_log(tmp_path):
    """train.py draws at every evaluation: 10,000 steps and their evaluations read and drawn in a moment (the bound
    is loose: the CPU may be shared)."""
    import time
    path = write_log(tmp_path / "long", classifier_log({s: (3 - s / 5000, s / 10_000) for s in range(500, 10_001, 500)},
                                                         n_steps=10_000))
    t = time.perf_counter()
    curves.plot_run(path, str(tmp_path / "long.png"), short_steps=400)
    assert time.perf_counter() - t < 10 and is_png(tmp_path / "long.png")


def test_plot_runs_summary_is_the_mean_and_band_of_the_seeds(tmp_path):
    # row "a": seeds 0 and 1 (seed 1 one evaluation further); row "b": one run; row "lm": a language model
    a0 = write_log(tmp_path / "a-s0", classifier_log({10: (2.0, 0.50), 20: (1.0, 0.60)}))
    a1 = write_log(tmp_path / "a-s1", classifier_log({10: (3.0, 0.70), 20: (1.5, 0.80), 30: (1.2, 0.9)}))
    b = write_log(tmp_path / "b", classifier_log({10: (2.2, 0.4)}))
    lm = write_log(tmp_path / "lm-s3", [{"step": 5, "loss": 4.0, "lr": 1e-3, "time": 1},
                                        {"step": 5, "val_loss": 4.2, "val_n": 8, "val_ppl": 66.7, "time": 1}])
    runs = [os.path.dirname(p) for p in (a0, a1, b, lm)]
    png = tmp_path / "out" / "curves.png"
    png.parent.mkdir()
    rows = curves.plot_runs(runs, str(png))
    assert is_png(png)
    assert [(r["label"], r["runs"]) for r in rows] == [("a", 2), ("b", 1), ("lm", 1)]
    a = rows[0]
    assert a["val_loss"]["step"] == 20 and a["val_acc"]["step"] == 20      # the last step both seeds have
    assert a["val_loss"]["mean"] == pytest.approx(1.25) and (a["val_loss"]["min"], a["val_loss"]["max"]) == (1.0, 1.5)
    assert a["val_acc"]["mean"] == pytest.approx(0.7) and (a["val_acc"]["min"], a["val_acc"]["max"]) == (0.6, 0.8)
    assert rows[1]["val_acc"] == {"step": 10, "mean": 0.4, "min": 0.4, "max": 0.4}
    assert rows[2]["val_ppl"]["mean"] == 66.7 and "val_acc" not in rows[2]   # its own metric, among classifiers
    # labels group runs as given
    rows = curves.plot_runs(runs[:3], str(png), labels=["x", "x", "x"])
    assert [(r["label"], r["runs"]) for r in rows] == [("x", 3)]
    assert rows[0]["val_loss"] == {"step": 10, "mean": pytest.approx(2.4), "min": 2.0, "max": 3.0}


def test_one_run_alone_has_no_legend_of_rows(tmp_path, monkeypatch):
    """A row's legend (and the inches it takes) only when there is more than one run to tell apart: one run alone,
    one row of 2 seeds, two rows of one run each, counted by hand (a legend line holds 3 rows)."""
    made = []
    monkeypatch.setattr(curves, "Figure", lambda **kw: made.append(Figure(**kw)) or made[-1])
    log = lambda name: os.path.dirname(write_log(tmp_path / name, classifier_log({10: (2.0, 0.5)})))
    for runs, legends, inches in (([log("one")], 0, 4.6), ([log("r-s0"), log("r-s1")], 1, 4.8),
                                  ([log("p"), log("q"), log("x"), log("y")], 1, 5.0)):
        made.clear()
        curves.plot_runs(runs, str(tmp_path / "c.png"))
        assert (len(made[0].legends), made[0].get_figheight()) == (legends, pytest.approx(inches)), runs


def test_row_of_strips_the_seed():
    assert curves.row_of("out/exp/ptb/gpt-softmax-pre-ln-s2") == "gpt-softmax-pre-ln"
    assert curves.row_of("out/exp/ptb/gpt-softmax-pre-ln-s12/") == "gpt-softmax-pre-ln"
    assert curves.row_of("out/my-run") == "my-run" and curves.row_of("out/x-seed") == "x-seed"


# ----------------------------------------------------------------------------------------------
# python analyze.py curves

def test_analyze_curves_of_runs_and_of_a_table(tmp_path, monkeypatch, capsys):
    table = tmp_path / "out" / "exp" / "mini"
    for seed, (l1, l2) in enumerate(((2.0, 1.0), (3.0, 1.5))):
        write_log(table / f"simpletron-s{seed}", classifier_log({10: (l1, 0.5), 20: (l2, 0.6 + 0.2 * seed)}))
    write_log(table / "softmax-s0", classifier_log({20: (1.8, 0.55)}))
    (table / "simpletron-heldout-s0").mkdir()                 # an evaluation of a checkpoint: no log.jsonl
    monkeypatch.chdir(tmp_path)
    analyze.main(["curves", "--table", "mini", "--out", "an"])
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == ("simpletron (2 seeds): step 20: val loss 1.2500 (seeds 1.0000 to 1.5000), val acc 70.00% "
                          "(seeds 60.00% to 80.00%)")
    assert printed[1] == "softmax: step 20: val loss 1.8000, val acc 55.00%"
    saved = json.loads((tmp_path / "an" / "curves.json").read_text())
    assert [r["label"] for r in saved["rows"]] == ["simpletron", "softmax"] and len(saved["runs"]) == 3
    assert is_png(tmp_path / "an" / "curves.png")
    analyze.main(["curves", str(table / "softmax-s0"), "--out", "one"])
    assert capsys.readouterr().out.startswith("softmax: step 20: val loss 1.8000")


def test_run_names_with_dollars_are_drawn_as_written(tmp_path, monkeypatch):
    """Battery a13: a run folder named $TASK_$SEED (an out_dir whose $ no shell expanded) was read by matplotlib as
    mathematics: a ParseSyntaxException out of analyze.py curves. The names are drawn as written: one run's in the
    title of its curves (as plot_run draws it without a title), the rows' in the legend (a row of seeds too)."""
    figures = drawn_texts(monkeypatch)
    monkeypatch.chdir(tmp_path)
    for name in [*DOLLARS, "$x$-s0", "$x$-s1"]:
        write_log(name, classifier_log({10: (2.0, 0.5)}))
    curves.plot_run(os.path.join(DOLLARS[0], "log.jsonl"), "one.png")
    assert DOLLARS[0] in figures[-1]
    analyze.main(["curves", *DOLLARS, "$x$-s0", "$x$-s1", "--out", "an"])
    assert {*DOLLARS, "$x$ (2 seeds)"} <= set(figures[-1]), figures[-1]
    assert [r["label"] for r in json.loads(open("an/curves.json").read())["rows"]] == [*DOLLARS, "$x$"]   # as named


def test_analyze_curves_bad_input(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "nolog").mkdir()
    (tmp_path / "out" / "exp" / "empty" / "x-s0").mkdir(parents=True)
    for argv, message in ((["curves"], "curves needs run folders"),
                          (["curves", "nolog"], "nolog/log.jsonl does not exist"),
                          (["curves", "--table", "nothing"], "--table nothing: out/exp/nothing does not exist"),
                          (["curves", "--table", "empty"], "no run in out/exp/empty has a log.jsonl"),
                          (["curves", "--ckpt", "x.pt"], "unrecognized arguments: --ckpt")):
        with pytest.raises(analyze.UsageError, match=message) as e:
            analyze.main([*argv, "--out", str(tmp_path / "an")])
        assert "\n" not in str(e.value)


def test_record_is_a_json_object_with_a_step():
    assert curves.record('{"step": 3, "loss": 1.0}\n') == {"step": 3, "loss": 1.0}
    for line in ('{"step": 3, "lo', "[1, 2]\n", "7\n", '{"loss": 1.0}\n', '{"step": "3"}\n', "\n"):
        assert curves.record(line) is None, line


def test_rows_are_the_seeds_of_one_folder_and_a_run_counts_once(tmp_path, monkeypatch):
    """Only the seeds of one folder are a row: same-named runs of two folders are two rows, named with their
    folders (hand-made labels); a run given twice is one run (plot_runs) or refused (analyze.py curves)."""
    monkeypatch.chdir(tmp_path)
    log = lambda name, loss: os.path.dirname(write_log(tmp_path / name, classifier_log({10: (loss, 0.5)})))
    runs = [log("exp1/out/softmax-textfile", 2.0), log("exp2/out/softmax-textfile", 3.0)]
    rows = curves.plot_runs(runs, str(tmp_path / "c.png"))
    assert [(r["label"], r["runs"], r["val_loss"]["mean"]) for r in rows] == [
        ("exp1/out/softmax-textfile", 1, 2.0), ("exp2/out/softmax-textfile", 1, 3.0)]
    runs = ["a/gpt-s0", "b/gpt-s0", "a/gpt-s1"]
    for run, loss in zip(runs, (1.0, 2.0, 3.0)):
        log(run, loss)
    rows = curves.plot_runs(runs, str(tmp_path / "c.png"))
    assert [(r["label"], r["runs"], r["val_loss"]["mean"]) for r in rows] == [("a/gpt", 2, 2.0), ("b/gpt", 1, 2.0)]
    rows = curves.plot_runs(["a/gpt-s0", "a/gpt-s0/", "a/../a/gpt-s0"], str(tmp_path / "c.png"))
    assert [(r["label"], r["runs"]) for r in rows] == [("gpt", 1)]
    with pytest.raises(analyze.UsageError, match=r"^curves: the run a/gpt-s0/ is given twice"):
        analyze.main(["curves", "a/gpt-s0", "a/gpt-s0/", "--out", "an"])


DAMAGE = "a loss that is no number >= 0, a perplexity below 1 or an accuracy not 0 to 1"


def lm_log(n_steps=20, val=(10, 20)):
    """A language model's log: train steps 1..n_steps (loss 3 - step / 10), evaluations val_loss 2, val_ppl e^2."""
    records = []
    for s in range(1, n_steps + 1):
        records.append({"step": s, "loss": 3 - s / 10, "lr": 1e-3, "time": 0.1 * s})
        if s in val:
            records.append({"step": s, "val_loss": 2.0, "val_n": 100, "val_ppl": math.exp(2.0), "time": 0.1 * s})
    return records


@pytest.mark.parametrize("key, value, line", [("loss", -5.0, 3), ("loss", -1e-9, 1), ("val_loss", -0.5, 11),
                                              ("val_ppl", -3.0, 22), ("val_ppl", 0.999, 11), ("val_ppl", "7", 11),
                                              ("val_ppl", math.nan, 22)])
def test_a_negative_loss_or_a_perplexity_below_1_is_a_damaged_record(tmp_path, monkeypatch, key, value, line):
    """A cross-entropy is >= 0 and its perplexity e^loss >= 1: a log saying otherwise (it was drawn, "val ppl
    -3.00", on a log axis that cannot show it) is refused in one line naming the file, the line and the step, as
    experiments.py's metrics_problem refuses such a metrics.json. A perplexity of inf (a loss past 709.78): allowed."""
    monkeypatch.chdir(tmp_path)
    good = lm_log()
    good[-1]["val_ppl"] = math.inf                           # train.py's: exp overflows
    assert curves.read_log(write_log(tmp_path / "good", good))["damaged"] == []
    assert curves.log_problem(os.path.join("good", "log.jsonl")) is None
    records = [dict(r) for r in good]
    records[line - 1][key] = value                           # (records 11 and 22: the evaluations at 10 and 20)
    write_log(tmp_path / "bad", records)
    assert curves.read_log(os.path.join("bad", "log.jsonl"))["damaged"] == [(line, records[line - 1]["step"])]
    with pytest.raises(analyze.UsageError) as e:
        analyze.main(["curves", "bad", "--out", "an"])
    assert str(e.value) == (f"bad: {os.path.join('bad', 'log.jsonl')} has a damaged record (step "
                            f"{records[line - 1]['step']}) at line {line}: {DAMAGE} (a folder of python train.py "
                            "...)")
    assert not (tmp_path / "an").exists()


def test_an_accuracy_outside_0_to_1_is_a_damaged_record_named_by_its_line(tmp_path, monkeypatch):
    """train.py writes accuracies as fractions: a val_acc of 1.5 (150% drawn) or an acc below 0 is a damaged log,
    refused by analyze.py curves in one line naming the file and the line (counted from 1, blank lines too)."""
    monkeypatch.chdir(tmp_path)
    good = classifier_log({10: (2.0, 0.5), 20: (1.5, 1.0)}, n_steps=20)     # 1.0: every answer right, allowed
    assert curves.read_log(write_log(tmp_path / "good", good))["damaged"] == []
    for name, key, value, line in (("val", "val_acc", 1.5, 22), ("acc", "acc", -0.25, 3),
                                   ("example", "val_acc_example", 1.01, 11), ("text", "val_acc", "0.5", 11)):
        records = [dict(r) for r in good]
        records[line - 1][key] = value                       # (records 11 and 22: the evaluations at 10 and 20)
        path = write_log(tmp_path / name, records)
        assert curves.read_log(path)["damaged"] == [(line, records[line - 1]["step"])]
        with pytest.raises(analyze.UsageError) as e:
            analyze.main(["curves", name, "--out", "an"])
        assert str(e.value) == (f"{name}: {os.path.join(name, 'log.jsonl')} has a damaged record (step "
                                f"{records[line - 1]['step']}) at line {line}: {DAMAGE} (a folder of python "
                                "train.py ...)")
    assert not (tmp_path / "an").exists()
    path = write_log(tmp_path / "blank", [], tail="\n" + json.dumps({"step": 1, "loss": "x"}) + "\n")
    assert curves.read_log(path)["damaged"] == [(2, 1)]


CUT = "(not the last, which may be one still being written)"


@pytest.mark.parametrize("line, why", [('{"step": "one", "loss": 2.0}', f'{CUT}: its step "one" is no integer >= 0'),
                                       ('{"step": 3, "lo', f"{CUT}: it is not JSON"), ("", f"{CUT}: it is empty"),
                                       ("[1, 2]", f"{CUT}: it is no JSON object"),
                                       ('{"loss": 1.0}', f"{CUT}: it has no step"),
                                       ('{"step": NaN, "loss": 1.0}', f"{CUT}: its step NaN is no integer >= 0"),
                                       ('{"step": -1, "loss": 1.0}', ": its step -1 is no integer >= 0"),
                                       ('{"step": 2.5, "loss": 1.0}', ": its step 2.5 is no integer >= 0")])
def test_a_line_before_the_last_that_is_no_whole_record_is_damage(tmp_path, monkeypatch, line, why):
    """Only the last line of a log can be one still being written (a run in progress, or killed mid-write; --resume
    drops it): any earlier line that is no record train.py writes, or a step no integer >= 0 (train.py counts its
    steps from 0), is a damaged log, refused in one line naming the file and the line, not left out silently."""
    monkeypatch.chdir(tmp_path)
    good = classifier_log({4: (2.0, 0.5)}, n_steps=4)
    path = write_log(tmp_path / "bad", good[:2], tail=line + "\n" + "".join(json.dumps(r) + "\n" for r in good[2:]))
    assert curves.log_problem(path) == f"has a damaged line 3 {why}".replace(" :", ":")
    with pytest.raises(analyze.UsageError) as e:
        analyze.main(["curves", "bad", "--out", "an"])
    assert str(e.value) == (f"bad: {os.path.join('bad', 'log.jsonl')} has a damaged line 3 {why} (a folder of python "
                            "train.py ...)".replace(" :", ":"))
    assert not (tmp_path / "an").exists()
    if why.startswith(CUT):                                  # the last line: left out, as ever
        last = write_log(tmp_path / "last", good, tail=line)
        assert curves.log_problem(last) is None and [r["step"] for r in curves.read_log(last)["train"]] == [1, 2, 3, 4]
        assert curves.log_problem(write_log(tmp_path / "last-whole", good, tail=line + "\n")) is None


def test_a_step_back_with_no_resumption_between_is_damage(tmp_path, monkeypatch):
    """train.py's steps never go back but at a resumption (--resume writes its record, at the step resumed): a record
    of an earlier step appended after the run's end (drawn in place of the real step 1) is a damaged log, one line
    naming it; a step written again after a resumption record is a resumed run, drawn."""
    monkeypatch.chdir(tmp_path)
    good = classifier_log({2: (2.0, 0.5), 4: (1.5, 0.6)}, n_steps=4)          # lines 1-6: steps 1, 2, 2 (val), 3, 4, 4
    write_log(tmp_path / "bad", good + [{"step": 1, "loss": 0.5, "lr": 1e-3, "time": 9}])
    assert curves.log_problem(os.path.join("bad", "log.jsonl")) == (
        "has a damaged line 7: step 1 after step 4 with no resumption record between")
    with pytest.raises(analyze.UsageError, match=r"^bad: bad/log.jsonl has a damaged line 7: step 1 after step 4 "):
        analyze.main(["curves", "bad", "--out", "an"])
    write_log(tmp_path / "val", good + [{"step": 3, "val_loss": 1.0, "val_n": 9, "val_acc": 0.5, "time": 9}])
    assert curves.log_problem(os.path.join("val", "log.jsonl")).startswith("has a damaged line 7: step 3 after step 4")
    resumed = good + [{"step": 2, "resumed": True, "time": 9}] + classifier_log({}, n_steps=5)[2:]   # steps 3, 4, 5
    write_log(tmp_path / "resumed", resumed)
    assert curves.log_problem(os.path.join("resumed", "log.jsonl")) is None
    write_log(tmp_path / "behind", resumed + [{"step": 1, "loss": 0.5, "lr": 1e-3, "time": 9}])   # ...but not again
    assert curves.log_problem(os.path.join("behind", "log.jsonl")) == (
        "has a damaged line 11: step 1 after step 5 with no resumption record between")
    write_log(tmp_path / "again", good + [{"step": 4, "loss": 1.0, "lr": 1e-3, "time": 9}])       # (not back: drawn)
    assert curves.log_problem(os.path.join("again", "log.jsonl")) is None
