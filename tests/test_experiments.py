"""experiments.py --list: the tables first, one line each (name, what it measures, runs); --list NAME: one table's
train.py commands; the character table's recipe and its markdown in bits per character."""

import dataclasses
import json
import math
import os
import shlex

import pytest

import config
import data
import experiments
import tasks.ngram


def listed(capsys, *argv):
    experiments.main(["--list", *argv])
    return capsys.readouterr().out.splitlines()


def test_list_shows_one_line_a_table(capsys):
    lines = listed(capsys)
    assert lines[0].startswith("the tables (seeds 0,1,2;")
    assert [line.split()[0] for line in lines[1:]] == list(experiments.TABLES)
    by_name = {line.split()[0]: line for line in lines[1:]}
    assert by_name["ptb"].endswith("Penn Treebank, word level [15 runs + 9 evaluations]")    # 5 rows, 3 seeds
    assert by_name["depth"].endswith("[36 runs]") and "SimpleTRON §5.2" in by_name["depth"]
    assert by_name["deq-grid"].endswith("[computed here, no training]")
    assert "python train.py" not in "\n".join(lines)
    assert listed(capsys, "--seeds", "4")[2].endswith("[5 runs + 3 evaluations]")


def test_list_of_one_table_gives_its_commands(capsys):
    lines = listed(capsys, "transfer", "--seeds", "0,1")
    assert lines[0].startswith("transfer: Attention transfer (SimpleTRON §4.2)")
    commands = [line.strip() for line in lines if line.strip().startswith("python train.py")]
    assert len(commands) == 6 and commands[0].endswith("--seed 0 --out_dir out/exp/transfer/simpletron-s0")
    assert lines[-1].endswith("python analyze.py curves --table transfer")
    experiments.main(["depth", "--list"])                                  # the table named before --list
    assert capsys.readouterr().out.startswith("depth: Depth (SimpleTRON §5.2)")
    with pytest.raises(experiments.UsageError, match="unknown table 'nothing': choose one of deq-grid, ptb"):
        experiments.main(["--list", "nothing"])


def test_ptb_char_is_nanogpts_recipe_for_six_rows(capsys):
    by_name = {line.split()[0]: line for line in listed(capsys)[1:]}
    assert by_name["ptb-char"].endswith("Penn Treebank, characters [21 runs]")
    commands = [line.strip() for line in listed(capsys, "ptb-char", "--data_dir", "DIR") if "train.py" in line]
    assert len(commands) == 21 and all("--task ptb --tokenizer char" in c and "--data_dir DIR" in c for c in commands)
    recipe = ("--n_layer 4 --n_embd 128 --block_size 64 --batch_size 12 --max_iters 2000 --lr 1e-3 --schedule cosine "
              "--min_lr 0.1 --beta2 0.99 --weight_decay 0.1 --dropout 0.0 --warmup 100 --grad_clip 1.0 "
              "--eval_interval 250 --eval_iters 20")
    assert all(recipe in c for c in commands)
    gpt, simpletron, transject, deq, rezero, orthogonal = commands[:6]
    assert "--model softmax --n_head 4 --norm pre --bias false" in gpt and "--bias" not in simpletron + rezero
    assert "--model transject" in transject and "--n_head" not in transject         # TransJect has no heads
    assert "--norm rezero" in rezero and "--orthogonal true" in orthogonal and "--model diffeqformer" in deq


def test_a_bpc_table_reports_bits_per_character(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    table, seeds = experiments.TABLES["ptb-char"], [0, 1, 2]
    for i, row in enumerate(table.rows):
        for s in seeds:
            d = tmp_path / experiments.run_dir("ptb-char", row, s)
            d.mkdir(parents=True)
            bits = 2 + i / 10 + (s - 1) / 100                  # mean 2.i00, std 0.010
            (d / "metrics.json").write_text(json.dumps({
                "model": "softmax", "val_loss": bits * math.log(2), "test_loss": (bits + 0.05) * math.log(2),
                "val_ppl": 2 ** bits, "test_ppl": 2 ** (bits + 0.05), "n_params": 802304, "config": {"n_layer": 4},
                "n_val": 399744, "n_test": 449920, "seconds": 600}))
    text = experiments.render("ptb-char", table, seeds, "DIR", [("unigram, add-one: no context", 4.5, 4.25)])
    assert "| model | flags | parameters | val bits per character | test bits per character |" in text
    assert "| GPT (softmax, pre-LN, no bias: nanoGPT) | `--model softmax --n_head 4 --norm pre --bias false` | " \
           "802k | 2.000 ± 0.010 | 2.050 ± 0.010 |" in text
    assert "| 2.500 ± 0.010 | 2.550 ± 0.010 |" in text                            # the sixth row
    assert "| *baseline: unigram, add-one: no context* | | | 4.500 | 4.250 |" in text
    assert experiments.PTB_CHAR_NOTE in text and "python experiments.py ptb-char --data_dir DIR" in text
    assert "n_val = 399,744, n_test = 449,920." in text and "The runs took 3.5 h together" in text


def test_a_text_file_table_has_no_test_split_and_says_so(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    table = experiments.TABLES["text-char"]
    assert "--task textfile --tokenizer char" in table.common
    assert table.common.replace("--task textfile", "--task ptb") == experiments.TABLES["ptb-char"].common
    assert [(r.name, r.flags) for r in table.rows] == [(r.name, r.flags) for r in experiments.TABLES["ptb-char"].rows]
    for row in table.rows:
        d = tmp_path / experiments.run_dir("text-char", row, 0)
        d.mkdir(parents=True)
        (d / "metrics.json").write_text(json.dumps({
            "model": "softmax", "val_loss": 1.5 * math.log(2), "val_ppl": 2 ** 1.5, "n_params": 802304,
            "config": {"n_layer": 4}, "n_val": 111488, "seconds": 600}))
    text = experiments.render("text-char", table, [0], "FILE", [("unigram, add-one: no context", 4.5, None)])
    assert "802k | 1.500 ± 0.000 | – |" in text and "| *baseline: unigram, add-one: no context* | | | 4.500 | – |" in text
    assert "n_val = 111,488. Machine" in text and "n_test" not in text


def test_first_below_reads_each_seeds_log_against_each_kneser_ney_baseline(tmp_path):
    runs = []
    for seed, ppls in enumerate(([300, 190, 160, 150], [310, 250, 200, 180])):     # 200: level is not below
        d = tmp_path / f"r{seed}"
        d.mkdir()
        records = [{"step": 1, "loss": 5.0}] + [{"step": 250 * (i + 1), "val_loss": 0.0, "val_ppl": p}
                                                 for i, p in enumerate(ppls)]
        (d / "log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
        runs.append(str(d))
    baselines = [("unigram, add-one", 600.0, 500.0), ("bigram, interpolated Kneser-Ney (D = 0.75)", 200.0, 190.0),
                 ("4-gram, interpolated Kneser-Ney (D = 0.75): the 3 words before", 155.0, 150.0)]
    assert experiments.first_below(runs, baselines) == "bigram: 500 / 1,000; 4-gram: 1,000 / never"


def test_the_sweep_table_puts_each_setting_on_a_line_beside_its_rules(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(experiments, "SWEEP", [(3, 3), (5, 4)])
    table = experiments.TABLES["listops-sweep"]
    rows = [r for r in table.rows if r.flags.startswith((experiments.sweep_setting(3, 3) + " ",
                                                         experiments.sweep_setting(5, 4) + " "))]
    assert len(table.rows) == 36 and len(rows) == 8
    for i, row in enumerate(rows):                           # accuracy 0.30 + 0.05 i (+ 0.01 per seed)
        for s in (0, 1, 2):
            d = tmp_path / experiments.run_dir("listops-sweep", row, s)
            d.mkdir(parents=True)
            (d / "metrics.json").write_text(json.dumps({"test_acc": 0.30 + 0.05 * i + 0.01 * s, "n_test": 2000,
                                                        "machine": "M"}))
    rules = iter([0.20, 0.38, 0.25, 0.55])                    # (top operator, top digits) of each setting
    monkeypatch.setattr(experiments, "task_of", lambda run: (FakeSplits(), {}))
    import tasks.listops_rules
    monkeypatch.setattr(tasks.listops_rules, "listops_baselines",
                        lambda train, test: {"test": {"top_operator": next(rules), "top_digits": next(rules)}})
    text = experiments.sweep_report("listops-sweep", dataclasses.replace(table, rows=rows), [0, 1, 2])
    lines = text.splitlines()
    head = lines.index(next(l for l in lines if l.startswith("| depth |")))
    assert lines[head] == ("| depth | arguments | SimpleTRON | softmax Transformer | TransJect | DiffEqFormer | "
                           "top-level operator rule | top-level digits rule |")
    assert lines[head + 2] == ("| 3 | 2–3 | 31.00 ± 1.00 | 36.00 ± 1.00 | **41.00 ± 1.00** | **46.00 ± 1.00** | "
                               "20.00 | 38.00 |")
    assert lines[head + 3] == ("| 5 | 2–4 | 51.00 ± 1.00 | **56.00 ± 1.00** | **61.00 ± 1.00** | **66.00 ± 1.00** | "
                               "25.00 | 55.00 |")
    assert lines[-1].startswith("Above the top-level digits rule: SimpleTRON in 0 of 2 settings, softmax "
                                "Transformer in 1 of 2 settings, TransJect in 2 of 2 settings, DiffEqFormer in 2 of 2")
    assert "n_test = 2,000 trees a setting. Machine: M." in lines[-1]


class FakeSplits:
    def split(self, name):
        return name


def test_a_table_names_the_machines_its_runs_were_trained_on(tmp_path, monkeypatch):
    import config
    for name, machine in (("a", "CPU X, 2 cores, no GPU, torch 2"), ("b", "CPU Y, 16 cores, GPU Z, torch 2"),
                          ("c", "CPU X, 2 cores, no GPU, torch 2"), ("d", None)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "metrics.json").write_text(json.dumps({"machine": machine} if machine else {}))
    runs = [str(tmp_path / n) for n in "abc"]
    assert experiments.run_machine(runs) == "CPU X, 2 cores, no GPU, torch 2; CPU Y, 16 cores, GPU Z, torch 2"
    assert experiments.run_machine([str(tmp_path / "d")]) == config.machine()       # an older run: this machine
    assert config.machine().endswith(", no GPU, torch " + __import__("torch").__version__)


def test_task_of_rebuilds_the_runs_own_task_from_its_metrics(tmp_path):
    """The baselines read the splits the run trained on: its task, cache, data and ListOps settings, and its block
    size (given, or the model's when the flag was left to the task)."""
    args = {"task": "listops", "cache_dir": str(tmp_path / "cache"), "data_dir": None, "tokenizer": None,
            "listops_depth": 3, "listops_args": "2,3", "listops_len": "5,20", "listops_sizes": "40,6,8"}
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.json").write_text(json.dumps({"args": {**args, "block_size": None}, "config": {"block_size": 24}}))
    task, a = experiments.task_of(str(run))
    assert a == {**args, "block_size": None} and task.block_size == 24
    assert [len(task.split(s)) for s in ("train", "val", "test")] == [40, 6, 8]
    assert os.listdir(tmp_path / "cache") == ["listops-depth3-args2-3-len5-20-n40-6-8"]


def test_write_block_replaces_its_own_block_alone_and_appends_a_new_one(tmp_path):
    path = tmp_path / "docs" / "results.md"
    experiments.write_block("a", "one", str(path))                        # no file yet: a title, then the block
    assert path.read_text() == "# Results\n\n<!-- results:a -->\none\n<!-- /results:a -->\n"
    path.write_text("intro\n<!-- results:a -->\nold\nrows\n<!-- /results:a -->\nafter\n")
    experiments.write_block("a", "new", str(path))
    assert path.read_text() == "intro\n<!-- results:a -->\nnew\n<!-- /results:a -->\nafter\n"
    experiments.write_block("b", "two", str(path))
    assert path.read_text() == ("intro\n<!-- results:a -->\nnew\n<!-- /results:a -->\nafter\n\n<!-- results:b -->\ntwo"
                                "\n<!-- /results:b -->\n")
    assert os.listdir(path.parent) == ["results.md"]                      # no temporary file left


@pytest.mark.parametrize("doc", ["<!-- /results:{n} -->\nmine\n<!-- results:{n} -->\n", "<!-- results:{n} -->\nmine\n",
                                 "mine\n<!-- /results:{n} -->\n", "<!-- results:{n} -->x<!-- /results:{n} -->\n" * 2])
def test_markers_out_of_order_or_unpaired_are_refused_before_any_run_and_the_doc_kept(doc, tmp_path, monkeypatch):
    path = tmp_path / "results.md"
    path.write_text(doc.format(n="transfer") + doc.format(n="a"))
    monkeypatch.setattr(experiments, "RESULTS_MD", str(path))
    monkeypatch.setattr(experiments, "commands", lambda *a: pytest.fail("the runs were planned"))
    with pytest.raises(config.UsageError) as e:
        experiments.main(["transfer", "--seeds", "0"])
    assert str(e.value) == (f"{path} cannot be written: its markers <!-- results:transfer --> and <!-- "
                            "/results:transfer --> are not one pair in that order: mend them, or remove both")
    with pytest.raises(config.UsageError, match="are not one pair in that order"):
        experiments.write_block("a", "new", str(path))
    assert path.read_text() == doc.format(n="transfer") + doc.format(n="a")


def test_load_metrics_reads_a_file_an_editor_saved_with_a_byte_order_mark(tmp_path):
    (tmp_path / "metrics.json").write_bytes(b"\xef\xbb\xbf" + json.dumps({"val_loss": 1.5, "n_params": 3}).encode())
    assert experiments.load_metrics(str(tmp_path))["val_loss"] == 1.5


@pytest.mark.parametrize("m,why", [
    ({"args": {"task": "listops", "cache_dir": None}}, "its setting cache_dir is null, which train.py always fills"),
    ({"args": {"task": 5}}, "its setting task is no string"),
    ({"args": {"task": "listops", "data_dir": ["a"]}}, "its setting data_dir is no string"),
    ({"model": "simpletron", "config": {"vocab_size": 1}}, "its config: vocab_size 1: allowed is an integer >= 2"),
    ({"model": "softmax", "config": {"n_embd": 10, "n_head": 3}}, "its config: bad model settings: n_embd (10) must "),
    ({"model": "transject", "config": {"attention": "softmax"}}, "its config: bad model settings: "),
    ({"model": "simpletron", "config": {"n_layer": 0}}, "its config: n_layer 0: allowed is an integer >= 1"),
    ({"config": {"n_layer": 0}}, "its config's n_layer is no whole number above 0"),     # (no model to check by)
    ({"val_loss": -0.5}, "its val_loss is below 0, which no cross-entropy gives"),        # (a bpc of -0.72)
    ({"best": {"test_ppl": 0.5}}, "its test_ppl is below 1, which no cross-entropy gives"),
])
def test_metrics_of_settings_no_run_could_have_are_refused_naming_the_setting(m, why, tmp_path):
    assert experiments.metrics_problem(m).startswith(why), experiments.metrics_problem(m)
    (tmp_path / "metrics.json").write_text(json.dumps({"val_loss": 1.5, "n_params": 3, **m}))
    with pytest.raises(config.UsageError, match="is not the metrics.json of a train.py run"):
        experiments.load_metrics(str(tmp_path))
    ok = {"model": "softmax", "config": {"vocab_size": 2, "n_embd": 12, "n_head": 3}, "args": {
        "task": "listops", "cache_dir": "c", "data_dir": None, "tokenizer": None, "lr_decay_iters": None}}
    assert experiments.metrics_problem(ok) is None


def test_the_gates_cell_is_the_sigmoid_over_the_layers_for_transject_and_alpha_for_rezero():
    gates = {"blocks.0.a": {"value": 0.0, "used": 0.2}, "blocks.1.a": {"value": math.log(3), "used": 0.5}}
    ms = [{"model": "transject", "config": {"n_layer": 2}, "gates": gates}, {"gates": {"x": {"value": 0, "used": 0}}}]
    assert experiments.gate_cell(ms) == "α_l/L 0.250–0.375, 50% of step budget"    # sigmoid 0.5, 0.75 over L 2
    ms = [{"model": "simpletron", "config": {"n_layer": 2}, "gates": {"a": {"value": -0.25, "used": 0.07}}}]
    assert experiments.gate_cell(ms) == "α -0.250–-0.250, 7% of step budget"
    assert experiments.gate_cell([{"model": "softmax", "gates": {}}]) == ""


def test_recall_prepare_makes_the_held_out_examples_each_row_evaluates_on(monkeypatch):
    made = []
    monkeypatch.setattr(experiments, "recall_heldout", lambda *a: made.append(a))
    rows = [experiments.recall_row("gpt", "--model softmax", "mqar", 64, 4, 32),
            experiments.recall_row("gpt", "--model softmax", "copy", 128, None, 32)]
    experiments.recall_prepare(rows)
    assert made == [("mqar", "64", "4"), ("copy", "128", None)]
    for row, args in zip(rows, made):        # where each row's evaluation reads them
        assert row.evals[0][1].endswith(f"--data_dir {os.path.join(experiments.heldout_dir(*args), 'test.txt')}")


def test_listops_small_makes_its_held_out_trees_once_with_the_settings_of_its_task(tmp_path, monkeypatch, capsys):
    """The separately written generator, run as python FILE FLAGS in ROOT: the task's setting, 2,000 trees, seed 2026,
    written to out/exp/listops-small/heldout; not again once its test file is there."""
    calls = []
    monkeypatch.setattr(experiments, "ROOT", str(tmp_path))
    monkeypatch.setattr(data, "run_program", lambda argv, cwd=None: calls.append((argv, cwd)))
    experiments.listops_small_heldout()
    script = os.path.join(experiments.CODE, "experiments", "heldout_listops.py")
    argv = [script, "--listops_depth", "3", "--listops_args", "2,3", "--listops_len", "5,20", "--listops_sizes",
            "96000,2000,2000", "--n", "2000", "--seed", "2026", "--out", os.path.join("out", "exp", "listops-small",
                                                                                     "heldout")]
    assert calls == [(argv, str(tmp_path))]
    assert capsys.readouterr().out == "held-out trees: " + " ".join(argv) + "\n"
    (tmp_path / experiments.HELDOUT).mkdir(parents=True)
    (tmp_path / experiments.HELDOUT / "basic_test.tsv").write_text("")
    experiments.listops_small_heldout()
    assert len(calls) == 1


def test_run_from_another_folder_it_reads_the_runs_where_they_were_made(tmp_path, monkeypatch):
    """The runs start in ROOT (out/exp, data/ there), whatever the folder experiments.py is called from."""
    root, elsewhere = tmp_path / "root", tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.setattr(experiments, "ROOT", str(root))
    monkeypatch.setattr(experiments, "RESULTS_MD", str(root / "docs" / "results.md"))
    m = {"val_loss": 1.0, "test_loss": 1.1, "val_acc": 0.5, "test_acc": 0.4, "n_params": 10, "n_val": 2, "n_test": 2,
         "model": "simpletron", "config": {"n_layer": 2}}                  # (the table's --n_layer)
    for row in experiments.TABLES["transfer"].rows:
        d = root / experiments.run_dir("transfer", row, 0)
        d.mkdir(parents=True)
        (d / "metrics.json").write_text(json.dumps(m))
    monkeypatch.chdir(elsewhere)
    experiments.main(["transfer", "--report_only", "--seeds", "0"])
    assert "<!-- results:transfer -->" in (root / "docs" / "results.md").read_text()
    assert os.getcwd() == str(elsewhere) and os.listdir(elsewhere) == []


def test_deq_grid_table_by_hand(monkeypatch):
    """deq-grid's table from a stand-in solver whose errors are known: RK4 (4,096 steps, once per seed) lands at
    X0 + 1, n Euler steps at X0 + 1 + k/n for the k-th seed, so each entry is k/n: mean and spread over seeds 1, 2."""
    import diffeqformer
    calls = []

    def odeint(f, x0, n, method):
        calls.append((n, method))
        k = sum(m == "rk4" for _, m in calls)
        assert (method, n) in (("rk4", 4096), ("euler", n)) and k >= 1
        return x0 + 1 if method == "rk4" else x0 + 1 + k / n

    monkeypatch.setattr(diffeqformer, "odeint", odeint)
    text = experiments.deq_grid((7, 8))
    steps = (4, 8, 16, 64, 256, 1024)
    cells = [f"{1.5 / n:.3f} ± {(1 / n) / math.sqrt(2):.3f}" for n in steps]
    assert "| Euler steps | 4 | 8 | 16 | 64 | 256 | 1,024 |" in text and "seeds 7, 8" in text
    assert "| relative distance to the flow at t = 1 | " + " | ".join(cells) + " |" in text
    assert [m for _, m in calls] == (["rk4"] + ["euler"] * 6) * 2


def test_list_of_a_computed_table_says_it_runs_here(capsys):
    lines = listed(capsys, "deq-grid")
    assert lines[0].startswith("deq-grid: DiffEqFormer's Euler grid")
    assert lines[-1] == "  (computed in this process: python experiments.py deq-grid)" and "rows" not in lines[1]


def test_the_baselines_by_hand(monkeypatch):
    """The majority class (the most frequent training label, scored on val and test) and the ListOps rules' rows,
    each number in its row and column: a stand-in task whose labels are counted by hand."""
    import types
    labels = {"train": [2, 1, 2, 0, 2], "val": [2, 1, 2, 2], "test": [0, 1, 1, 1, 2]}
    task = types.SimpleNamespace(split=lambda s: types.SimpleNamespace(labels=labels[s], name=s), block_size=8)
    assert experiments.majority_baseline(task, None) == [("majority class", 0.75, 0.2)]
    got = {}

    def baselines(train, val, test, heldout):
        got.update(train=train.name, val=val.name, test=test.name, heldout=heldout)
        return {s: {k: i + 0.1 * j for j, k in enumerate(("majority", "top_operator", "top_digits"))}
                for i, s in enumerate(("val", "test", "heldout"))}
    monkeypatch.setattr(experiments.tasks.listops_rules, "listops_baselines", baselines)
    monkeypatch.setattr(experiments.tasks.listops, "listops_split", lambda path, _, L: (os.path.basename(path), L))
    rows = experiments.listops_rules(task, None)
    assert got == {"train": "train", "val": "val", "test": "test", "heldout": ("basic_test.tsv", 8)}
    assert rows == [("majority class", 0.0, 1.0), ("top-level operator rule", 0.1, 1.1),
                    ("top-level digits rule (subtrees unknown)", 0.2, 1.2),
                    ("majority class, on the held-out trees", None, 2.0),
                    ("top-level operator rule, on the held-out trees", None, 2.1),
                    ("top-level digits rule (subtrees unknown), on the held-out trees", None, 2.2)]


def test_a_rows_folder_name_by_hand():
    """A row's folder (slug): lower case, each run of other characters one dash, none at the ends, at most 40
    characters (the folders of runs already made keep their names)."""
    assert experiments.slug("  GPT (softmax), pre-LN: 2 layers!") == "gpt-softmax-pre-ln-2-layers"
    assert experiments.slug("x" * 39 + "yz") == "x" * 39 + "y"
    assert max(len(experiments.slug(r.name)) for t in experiments.TABLES.values() for r in t.rows) == 40


def test_every_table_command_passes_train_pys_checks_of_its_flags():
    """Each command a table runs, its evaluations of a checkpoint too, is held to train.py's own checks of flags: an
    evaluation given a setting of training (a --seed with --eval_only) failed every held-out row after its runs."""
    n_eval = 0
    for name, table in experiments.TABLES.items():
        for _, a in experiments.commands(name, table, [0, 1], None, bert_dir="BERT_DIR"):
            if "BERT_DIR" in a:                              # (BERT's folder is read at the check: tests/test_bert.py)
                continue
            args, given, names = config.parse_args(shlex.split(a))
            overrides = config.resolve(args, given, names)
            args.transfer_from = None                        # (its checkpoint is read at the check: test_train.py)
            config.check_args(args, set(given))
            config.check_moot(args, set(given), config.check_config(args.model, {**config.MODELS[args.model][1],
                                                                                 **overrides}))
            n_eval += args.eval_only
    assert n_eval >= 2 * (len(experiments.RECALL_ROWS) + len(experiments.DISCRETE))


def test_a_second_generator_that_cannot_write_stops_the_table_in_one_line(tmp_path, monkeypatch, capfd):
    """The held-out examples' folder taken by a file: experiments/heldout_recall.py says so in one line and the
    table stops with one line naming it (was: two tracebacks); exit status 2, as data.run_main ends. Where it can
    write, the examples are made."""
    monkeypatch.setattr(experiments, "ROOT", str(tmp_path))
    taken = tmp_path / experiments.heldout_dir("mqar", 64, 4)
    taken.parent.mkdir(parents=True)
    taken.write_text("mine")
    with pytest.raises(data.DataError, match=r"^heldout_recall\.py stopped \(exit status 2\); the line above says"):
        experiments.recall_heldout("mqar", 64, 4)
    err = capfd.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {experiments.heldout_dir('mqar', 64, 4)}: File exists")
    assert taken.read_text() == "mine"
    experiments.recall_heldout("copy", 64, 8)
    assert len((tmp_path / experiments.heldout_dir("copy", 64, 8) / "test.txt").read_text().splitlines()) == 3000


@pytest.mark.parametrize("n, V", [(5, 7001), (4, 50000)])   # V**n >= 2**62: once a ValueError
def test_kneser_ney_takes_a_vocabulary_whose_n_grams_overflow_int64(n, V):
    import numpy as np
    train = np.random.default_rng(n).integers(1, 6, 3000)   # ids 1..5 seen; every other id alike
    for history in ([1, 2, 3, 4], [5, 5, 5, 5], [0, 9, 0, 9]):
        p = [tasks.ngram.kneser_ney(train, history + [w], n, V)[-1] for w in range(7)]
        assert sum(p[1:6]) + (V - 5) * p[0] == pytest.approx(1.0, abs=1e-9) and p[0] == p[6]


@pytest.mark.parametrize("argv, flag", [(["ptb", "--bert_dir", "."], "--bert_dir"),
                                        (["deq-grid", "--data_dir", "."], "--data_dir"),
                                        (["listops-small", "--data_dir", "."], "--listops_depth")])
def test_list_of_a_table_refuses_what_the_table_refuses(argv, flag, capsys):
    with pytest.raises((config.UsageError, data.DataError), match=flag):
        experiments.main(["--list", *argv])
    assert capsys.readouterr().out == ""


def test_a_transfer_row_without_its_checkpoint_or_its_row_is_refused_before_any_run(tmp_path, monkeypatch):
    monkeypatch.setattr(experiments, "ROOT", str(tmp_path))
    monkeypatch.setattr(experiments, "run_all", lambda *a: pytest.fail("a run started"))
    with pytest.raises(config.UsageError, match="--transfer_from .*simpletron-s0/ckpt.pt: no such checkpoint"):
        experiments.main(["transfer", "--rows", "softmax-with-*", "--seeds", "0"])
    assert not (tmp_path / "out").exists()


def test_task_of_refuses_a_null_tokenizer_of_a_text_task_in_one_line(tmp_path):
    args = {"task": "textfile", "cache_dir": str(tmp_path / "cache"), "data_dir": str(tmp_path), "tokenizer": None}
    (tmp_path / "metrics.json").write_text(json.dumps({"args": args, "config": {"block_size": 24}}))
    with pytest.raises(config.UsageError, match="tokenizer is null"):
        experiments.task_of(str(tmp_path))


def report_runs(tmp_path, monkeypatch, recorded):
    """ptb-char's runs at seeds 0 and 1 in tmp_path, each metrics.json's args `recorded(seed)`; experiments.main
    stopped after its checks (run_table: check alone), docs/results.md there."""
    monkeypatch.setattr(experiments, "ROOT", str(tmp_path))
    monkeypatch.setattr(experiments, "RESULTS_MD", str(tmp_path / "results.md"))
    monkeypatch.setattr(experiments, "run_table", experiments.check)
    for s in (0, 1):
        for row in experiments.TABLES["ptb-char"].rows:
            d = tmp_path / experiments.run_dir("ptb-char", row, s)
            d.mkdir(parents=True, exist_ok=True)
            (d / "metrics.json").write_text(json.dumps({
                "model": "softmax", "val_loss": 1.0, "test_loss": 1.1, "n_params": 10, "n_val": 2, "n_test": 2,
                "config": {"n_layer": 4, "block_size": 64}, "args": {"task": "ptb", "tokenizer": "char",
                                                                     "cache_dir": "data", **recorded(s)}}))


def test_report_only_refuses_runs_made_with_another_data_dir(tmp_path, monkeypatch):
    """The runs trained on D1 (their metrics.json say so): --data_dir D2 refused in one line, not a table of D1's runs
    written as D2's; D1 itself, or named through a link, is the runs' own."""
    d1, d2 = tmp_path / "D1", tmp_path / "D2"
    d1.mkdir()
    d2.mkdir()
    os.symlink(d1, tmp_path / "link")
    report_runs(tmp_path, monkeypatch, lambda s: {"data_dir": str(d1), "seed": s})
    first = experiments.run_dir("ptb-char", experiments.TABLES["ptb-char"].rows[0], 0)
    with pytest.raises(config.UsageError) as e:
        experiments.main(["ptb-char", "--report_only", "--seeds", "0", "--data_dir", str(d2)])
    assert str(e.value).startswith(f"{first}/metrics.json records --data_dir {d1}, and this table's command gives "
                                   f"--data_dir {d2}: the run was made otherwise; ")
    for given in (d1, tmp_path / "link"):
        assert experiments.main(["ptb-char", "--report_only", "--seeds", "0,1", "--data_dir", str(given)])[0] == [0, 1]
    assert not (tmp_path / "results.md").exists()


def test_report_only_refuses_a_run_whose_recorded_seed_is_another(tmp_path, monkeypatch):
    """Seed 1's folders a copy of seed 0's (their args record seed 0): refused, not two seeds with a spread of 0."""
    d = tmp_path / "D"
    d.mkdir()
    report_runs(tmp_path, monkeypatch, lambda s: {"data_dir": str(d), "seed": 0})
    assert experiments.main(["ptb-char", "--report_only", "--seeds", "0", "--data_dir", str(d)])[0] == [0]
    with pytest.raises(config.UsageError, match=r"-s1/metrics.json records --seed 0, and this table's command gives "
                                                r"--seed 1: "):
        experiments.main(["ptb-char", "--report_only", "--seeds", "0,1", "--data_dir", str(d)])
