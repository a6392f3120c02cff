"""Every command the docs tell a user to type (README.md, docs/*.md, the recipes' and the tours' comments), held to
its program's own checks of its flags, stopping before any work: a check made stricter cannot silently refuse a
documented command (experiments.py's evaluations, given --seed with --eval_only, were). Nothing is trained, read
or downloaded; the folders and files a check looks at are made in tmp_path."""

import collections
import glob
import importlib
import os
import re
import shlex

import pytest
import torch

import analyze
import bench
import bert
import config
import data
import experiments
import sample

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = ["README.md", *sorted(glob.glob("docs/*.md", root_dir=ROOT)), *sorted(glob.glob("recipes/*.txt", root_dir=ROOT)),
        *sorted(glob.glob("tours/*.py", root_dir=ROOT))]
# python PROGRAM, python -m tasks.X, torchrun ... train.py; or tasks.X --flags (docs/tasks.md: `python -m` before)
PROGRAM = re.compile(r"\bpython3? (-m tasks\.\w+|(?:train|sample|analyze|bench|experiments)\.py)(?!\S)"
                     r"|\btorchrun\b.*? (train\.py)(?!\S)|^(tasks\.\w+)(?= --)")
# The docs' placeholders, each replaced by a value of its kind (a|b: each alternative; [--flag X]: with and without)
PLACEHOLDERS = [(r" \.\.\.(?= |$)", ""), (r" \[(?!--)[^\]]*\]", ""),        # "...", [flags]: the user's own flags
                (r"--model (MODEL|M)\b", "--model " + "|".join(config.MODELS)),
                (r"--task (TASK|NAME|T)\b", "--task listops"),
                (r"analyze\.py SUBCOMMAND --help", "analyze.py " + "|".join(analyze.SUBCOMMANDS) + " --help"),
                (r"SUBCOMMAND --out DIR \[--ckpt PATH\]", "spectra --out DIR --ckpt PATH"),   # (one that reads it)
                (r"experiments\.py NAME\b", "experiments.py depth"), (r"\btasks\.X\b", "tasks.listops"),
                (r"--models M,\.\.\.", "--models simpletron,softmax"), (r"--lengths L,\.\.\.", "--lengths 1024,4096"),
                (r",mymodel\b", "")]                                   # (the row of a model a fork adds)
if not torch.cuda.is_available():                            # (a GPU is the machine's, not the doc's)
    PLACEHOLDERS.append((r"--device cuda\b", "--device cpu"))
# Commands found that are no command of this project's to check
NOT_OURS = {"config/train_shakespeare_char.py": "nanoGPT's own train.py and config, run beside ours",
            "tasks.NEW": "the module a fork adds (docs/architecture.md, Add a task)",
            "tasks.recall --data_dir FILE --txt": "a bad input a battery found (docs/testing.md), not one to type"}
XFAIL = {}                                                   # id: why the program refuses a documented command


def variants(command):
    """A synopsis's commands: [--flag X] with and without it; a|b|c, each alternative."""
    if m := re.search(r" \[(--[^\]]*)\]", command):
        return variants(command[:m.start()] + " " + m[1] + command[m.end():]) + variants(command[:m.start()] +
                                                                                        command[m.end():])
    if m := re.search(r"[\w-]+(\|[\w-]+)+", command):
        return [v for alt in m[0].split("|") for v in variants(command[:m.start()] + alt + command[m.end():])]
    return [command]


def commands_in(text, where, shell):
    """(where, program, argv, command) for each command in one line of code, or one `code` span, of `where`."""
    out = []
    for piece in re.split(r"; | && ", text):
        for k, v in shell.items():                           # (a shell variable set in the same block: S="...")
            piece = piece.replace(k, v)
        for pattern, value in PLACEHOLDERS:
            piece = re.sub(pattern, value, piece)
        if m := PROGRAM.search(piece):
            program = next(g for g in m.groups() if g).removeprefix("-m ")
            for command in variants(m[0] + piece[m.end():]):
                words = shlex.split(command)
                out.append((where, program, words[words.index(program) + 1:], command))
    return out


def found():
    """Every command in a code block (fenced, or indented four spaces; backslash lines joined; a recipe's and a
    tour's comments read as markdown) or in an inline `code` span of prose (over line breaks)."""
    out = []
    for name in DOCS:
        with open(os.path.join(ROOT, name), encoding="utf-8") as f:
            lines = f.read().split("\n")
        if not name.endswith(".md"):
            lines = [re.sub(r"^# ?", "", line) if line.startswith("#") else "" for line in lines]
        prose, fenced, joined, start, shell = [], False, "", None, {}
        for i, line in enumerate(lines, 1):
            fence = line.lstrip().startswith("```")
            fenced ^= fence
            code = not fence and (fenced or line.startswith("    "))
            prose.append("" if code or fence else line)
            if not code:
                continue
            joined, start = joined + line, start or i
            if joined.endswith("\\"):                        # continued on the next line
                joined = joined[:-1]
                continue
            joined = re.sub(r"\s#.*", "", joined)            # a comment
            if m := re.fullmatch(r"\s*(\w+)=(\S.*)", joined):
                shell["$" + m[1]] = shlex.split(m[2])[0]
            out += commands_in(joined, f"{name}:{start}", shell)
            joined, start = "", None
        text = "\n".join(prose)
        for m in re.finditer(r"`([^`]+)`", text):
            out += commands_in(" ".join(m[1].split()), f"{name}:{text.count(chr(10), 0, m.start()) + 1}", {})
    seen = collections.Counter()                             # ids: file:line, #2 ... for a line's further commands
    for i, (where, *rest) in enumerate(out):
        seen[where] += 1
        out[i] = (where + (f"#{seen[where]}" if seen[where] > 1 else ""), *rest)
    return out


COMMANDS = found()


def test_the_commands_are_found():
    """So that the extraction cannot drop commands unnoticed: at least those counted when this test was written."""
    counted = collections.Counter(program.split(".")[0] for _, program, _, _ in COMMANDS)
    least = {"train": 63, "experiments": 50, "analyze": 19, "bench": 16, "tasks": 16, "sample": 1}
    assert {p: min(counted[p], n) for p, n in least.items()} == least, counted


def inputs(argv, tmp_path):
    """A folder or file the checks look at, named by a placeholder (DIR, FILE, BERT) or not here (input.txt): made
    in tmp_path (a name with a dot, or FILE: a file of text). A checkpoint (--init_from, --ckpt) is not read here."""
    for i, flag in enumerate(argv[:-1]):
        if flag in ("--data_dir", "--bert_dir", "--init_from_bert") and not os.path.exists(argv[i + 1]):
            path = tmp_path / str(i) / os.path.basename(argv[i + 1])
            if "." in path.name or path.name == "FILE":
                path.parent.mkdir()
                path.write_text("to be or not to be\n")
            else:
                path.mkdir(parents=True)
            argv[i + 1] = str(path)
    return argv


def check_train(argv, tmp_path, monkeypatch):
    """runsetup.settings up to its checks of the flags. A run's checkpoint (--resume's, --init_from's) or BERT's
    folder is not read: the model, task and shape are the flags', not theirs."""
    args, given, names = config.parse_args(argv)
    overrides = config.resolve(args, given, names, bert.BERT_FINETUNE if args.init_from_bert else None)
    if args.out_dir is None and args.init_from:              # (settings: beside the run it starts from)
        source_dir = os.path.dirname(os.path.abspath(args.init_from))
        args.out_dir = os.path.relpath(source_dir + ("-eval" if args.eval_only else "-finetune"))
    args.out_dir = os.path.join("out", f"{args.model}-{args.task}") if args.out_dir is None else args.out_dir
    config.check_args(args, set(given))
    config.check_moot(args, set(given), config.check_config(args.model, {**config.MODELS[args.model][1], **overrides}))


class Stop(Exception):
    """Where a check reaches the checkpoint, a trained run's: the flags' checks before it have passed."""


def stop(*args):
    raise Stop


def check_sample(argv, tmp_path, monkeypatch):
    """check up to the checkpoint it reads (after the flags, the device and --start)."""
    monkeypatch.setattr(sample, "load_checkpoint", stop)
    with pytest.raises(Stop):
        sample.check(sample.parse(argv))


def check_analyze(argv, tmp_path, monkeypatch):
    """parse and check; the run folders named are made with a log.jsonl of one step (attention std too), the
    checkpoints (--ckpt) not read: check_models needs trained ones of the right model."""
    args = analyze.parse(argv)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(analyze, "check_models", lambda args: None)
    table = [os.path.join("out", "exp", args.table, "row-s0")] if getattr(args, "table", None) else []
    for run in [*getattr(args, "runs", []), *(getattr(args, "run", None) or []), *table]:
        os.makedirs(run, exist_ok=True)
        with open(os.path.join(run, "log.jsonl"), "w") as f:
            f.write('{"step": 1, "loss": 1.0, "val_loss": 1.0, "score_std": [1.0], "attn_std": [1.0]}\n')
    analyze.check(args)


def check_bench(argv, tmp_path, monkeypatch):
    """parse and read_lists; not check_sizes, which times this machine's matmuls (work), nor --nanogpt's model.py,
    karpathy/nanoGPT's file outside the project."""
    monkeypatch.setattr(bench, "load_nanogpt", lambda path: None)
    args = bench.parse(argv)
    bench.read_lists(args, config.pick_device(args.device))


def check_experiments(argv, tmp_path, monkeypatch):
    """main up to its check of the flags (run_table's first line): the table's runs are not made."""
    monkeypatch.setattr(experiments, "run_table", experiments.check)
    experiments.main(argv)


def check_task(program, argv):
    module = importlib.import_module(program)
    data.prepare_args(program, argv, getattr(module, "check_tokenizer", None))


CHECKS = {"train.py": check_train, "sample.py": check_sample, "analyze.py": check_analyze, "bench.py": check_bench,
          "experiments.py": check_experiments}


@pytest.mark.parametrize("where, program, argv, command", [
    pytest.param(*c, id=c[0], marks=[pytest.mark.xfail(reason=XFAIL[c[0]], strict=True)] if c[0] in XFAIL else [])
    for c in COMMANDS])
def test_a_documented_command_passes_its_programs_checks(where, program, argv, command, tmp_path, monkeypatch, capsys):
    if reason := next((why for text, why in NOT_OURS.items() if text in command), None):
        pytest.skip(reason)
    monkeypatch.chdir(ROOT)                                  # (@recipes/... and the docs are read from there)
    argv = inputs(list(argv), tmp_path)
    try:
        if program.startswith("tasks."):
            check_task(program, argv)
        else:
            CHECKS[program](argv, tmp_path, monkeypatch)
    except SystemExit as e:                                  # --help: printed, and exit 0
        assert e.code == 0 and "--help" in argv and "usage:" in capsys.readouterr().out
