"""train.py --help shows the values the chosen model, task and preset will use, and what each Config field means;
config.py's preset tables give every model, task and preset the settings they had before they were written out."""
import dataclasses
import inspect
import re

import pytest

import config
import data


def help_text(capsys, *argv):
    with pytest.raises(SystemExit):
        config.parse_args(["--help", *argv])
    return re.sub(r"\s+", " ", capsys.readouterr().out).replace(" --", "  --")


def shown(text, flag):
    """The bracketed value at the end of --flag's help line."""
    chunks = [c for c in text[text.index("options:"):].split("  --") if c.startswith(f"{flag} {flag.upper()} ")]
    assert len(chunks) == 1, f"--{flag} not in help"
    return re.findall(r"\[([^\[\]]*)\]", chunks[0])[-1]


def test_help_shows_the_presets_values_for_model_and_task(capsys):
    t = help_text(capsys, "--model", "transject", "--task", "imdb")
    # the cpu preset of transject (2 layers, 64 wide, 1,000 steps), imdb's own length 512, mean pooling
    assert (shown(t, "n_layer"), shown(t, "n_embd"), shown(t, "max_iters"), shown(t, "block_size")) == \
        ("2", "64", "1000", "512")
    assert shown(t, "pool") == "mean" and shown(t, "vocab_size") == "from imdb"
    t = help_text(capsys, "--model", "transject", "--task", "imdb", "--preset", "paper")
    # appendix B.1 for IMDb: L=6, d=512, Adam 5e-4 (0.9, 0.98), 1e-9, batch 32, 23,440 steps
    assert (shown(t, "n_layer"), shown(t, "n_embd"), shown(t, "lr"), shown(t, "beta2"), shown(t, "eps"),
            shown(t, "batch_size"), shown(t, "max_iters")) == ("6", "512", "0.0005", "0.98", "1e-09", "32", "23440")
    t = help_text(capsys, "--model", "transject", "--task", "listops")
    assert shown(t, "pool") == "max" and shown(t, "block_size") == "2000"
    # the model's ("transject", "*") entry and the task's own ("transject", "listops") merged: both hold
    assert (shown(t, "n_embd"), shown(t, "n_experts"), shown(t, "max_iters")) == ("64", "4", "1000")
    presets = {("m", "*"): dict(a=1, b=2), ("m", "t"): dict(b=3, c=4)}
    assert config.preset_for(presets, "m", "t") == dict(a=1, b=3, c=4)
    assert config.preset_for(presets, "m", "u") == dict(a=1, b=2) and config.preset_for(presets, "x", "t") == {}


def test_help_of_the_main_command_which_steps_define(capsys):
    t = help_text(capsys, "--model", "simpletron", "--task", "listops")
    assert (shown(t, "max_iters"), shown(t, "lr"), shown(t, "short_steps"), shown(t, "time_limit"),
            shown(t, "out_dir")) == ("1500", "0.0005", "400", "none", "out/simpletron-listops")   # no preset's limit
    assert shown(t, "lr_decay_iters") == "max_iters = 1500"    # unset: the cosine decays over the whole run
    t = help_text(capsys, "--model", "softmax", "--task", "ptb")
    assert (shown(t, "n_layer"), shown(t, "norm"), shown(t, "variant"), shown(t, "time_limit")) == \
        ("4", "pre", "vanilla", "none")


def test_help_explains_each_config_field_with_its_allowed_values(capsys):
    t = help_text(capsys, "--model", "transject")
    assert "experts per layer" in t and '"exact"' in t and '"learned"' in t and '"random"' in t
    t = help_text(capsys, "--model", "simpletron")
    assert re.search(r"--variant VARIANT [^\[]*\"simple\" \| \"res\" \| \"resl\"", t)
    assert re.search(r"--n_layer N_LAYER blocks", t)
    t = help_text(capsys, "--model", "diffeqformer")
    assert re.search(r"--method METHOD [^\[]*\"rk4\"[^\[]*\[euler\]", t)
    assert "(default" not in t                              # one value per flag, in brackets


def comment_meanings(config_class):
    """The reference for FIELD_HELP: field -> the comment beside the field in the model file's Config (and the lines
    of comment that continue it), or the common line (train.py read --help's texts so until config.py's table)."""
    out, last = dict(config.COMMON_FIELDS), None
    for line in inspect.getsource(config_class).splitlines()[1:]:
        field = re.match(r"\s*(\w+)\s*:\s*[\w\[\], .|]+=\s*[^#]*?#\s*(.*)", line)
        more = re.match(r"\s*#\s*(.*)", line)
        if field:
            last, text = field.group(1), field.group(2).strip()
            common = config.COMMON_FIELDS.get(last)
            out[last] = f"{common} ({text})" if common and len(text) < 20 else text
        elif more and last and not re.match(r"\s*#\s*(nanoGPT|the task|this model)", line):
            out[last] += " " + more.group(1).strip()
        else:
            last = None
    return out


class DemoConfig:                                            # (source only: no dataclass needed)
    alpha: int = 1              # the first line
                                # and its continuation
    n_layer: int = 2            # L
    # nanoGPT's names
    beta: float = 0.5           # beta's own meaning, long enough to stand alone
    # the task sets these
    gamma: str = "x"


def test_the_reference_reads_the_comments_beside_each_field():
    got = comment_meanings(DemoConfig)
    assert got["alpha"] == "the first line and its continuation"
    assert got["beta"] == "beta's own meaning, long enough to stand alone"
    assert got["n_layer"] == f"{config.COMMON_FIELDS['n_layer']} (L)"       # a short comment: the common line too
    assert "gamma" not in got                                # no comment of its own


# what the comments' reading got wrong, and FIELD_HELP says instead: a section comment taken for a continuation,
# a short comment repeated after the common line
CLEANED = {("diffeqformer", "checkpointing"), ("transject", "n_layer"),
           *((m, "n_classes") for m in ("simpletron", "transject", "diffeqformer"))}


# what --help says in other words than the comment (the words it keeps)
REWRITTEN = {("simpletron", "freeze_qkv"): ("q/k/v are not trained", "attention transfer", "Section 4.2")}


@pytest.mark.parametrize("module", ["simpletron", "transject", "diffeqformer"])
def test_field_help_says_what_each_model_file_comments(module):
    Config = config.model_module(module).Config
    table = {**config.COMMON_FIELDS, **config.FIELD_HELP[module]}
    fields = [f.name for f in dataclasses.fields(Config)]
    assert set(config.FIELD_HELP[module]) <= set(fields)     # no meaning for a field the model does not have
    reference = comment_meanings(Config)
    for name in fields:
        assert table.get(name), f"{module}.Config.{name} has no meaning in FIELD_HELP"
        if (module, name) in REWRITTEN:                      # a sentence for users, with the comment's words
            assert all(w in table[name] for w in REWRITTEN[module, name]), name
        elif (module, name) in CLEANED:
            assert table[name] in reference[name] or reference[name].startswith(table[name]), name
        else:
            assert table[name] == reference[name], name


# The preset tables as train.py built them before config.py wrote them out: the independent reference.
OLD_PAPER_LRA = dict(batch_size=32, weight_decay=0.1, dropout=0.1, schedule="rsqrt", norm="post", variant="res")
OLD_PRESETS = {
    "cpu": {
        ("simpletron", "*"): dict(n_layer=2, n_head=4, n_embd=64, dropout=0.0, lr=1e-3, warmup=100,
                                  schedule="cosine", max_iters=1000, batch_size=16, eval_interval=250),
        ("softmax", "*"): dict(n_layer=2, n_head=4, n_embd=64, dropout=0.0, lr=1e-3, warmup=100,
                               schedule="cosine", max_iters=1000, batch_size=16, eval_interval=250),
        ("diffeqformer", "*"): dict(n_layer=2, n_head=4, n_embd=64, time_dim=8, dropout=0.0, lr=1e-3, beta2=0.95,
                                    warmup=10, schedule="cosine", min_lr=0.1, grad_clip=1.0, max_iters=1000,
                                    batch_size=16, eval_interval=250),
        **{(m, "ptb"): dict(n_layer=4, n_head=4, n_embd=128, block_size=64, dropout=0.0, lr=1e-3, beta2=0.95,
                            warmup=15, schedule="cosine", min_lr=0.1, grad_clip=1.0, max_iters=1500, batch_size=16,
                            eval_interval=500, **extra)
           for m, extra in (("diffeqformer", dict(time_dim=8)), ("softmax", dict(norm="pre", variant="vanilla")))},
        ("simpletron", "listops"): dict(n_layer=2, n_head=4, n_embd=64, dropout=0.0, lr=5e-4, warmup=100,
                                        schedule="cosine", max_iters=1500, batch_size=16, short_steps=400,
                                        short_len=64, eval_interval=500),   # time_limit=13.5: gone, runs are
        # defined by their steps (issue 24)
        ("transject", "*"): dict(n_layer=2, n_embd=64, n_experts=4, dropout=0.0, lr=1e-3, warmup=100,
                                 schedule="cosine", max_iters=1000, batch_size=16, eval_interval=250),
        **{("transject", t): dict(pool="max") for t in ("listops", "retrieval", "image", "pathfinder")},
    },
    "paper": {
        **{(m, t): dict(n_layer=12, n_head=12, n_embd=768, block_size=1024, lr=6e-4, weight_decay=0.1, beta2=0.95,
                        schedule="cosine", min_lr=0.1, grad_clip=1.0, eval_interval=iters // 20, max_iters=iters,
                        warmup=iters // 100, **batch, **extra)
           for t, iters, batch in (("ptb", 2000, dict(batch_size=16, dropout=0.1)),
                                   ("wikitext103", 50_000, dict(batch_size=32, grad_accum=16, dropout=0.0)),
                                   ("openwebtext", 100_000, dict(batch_size=32, grad_accum=16, dropout=0.0)))
           for m, extra in (("diffeqformer", dict(time_dim=20, time_freqs=128)),
                            ("softmax", dict(norm="pre", variant="vanilla")))
           if m == "diffeqformer" or t == "ptb"},
        ("simpletron", "listops"): dict(OLD_PAPER_LRA, n_layer=6, n_head=8, n_embd=512, lr=0.005, warmup=1000,
                                        max_iters=15_000),
        ("softmax", "listops"): dict(OLD_PAPER_LRA, n_layer=6, n_head=8, n_embd=512, lr=0.005, warmup=1000,
                                     max_iters=15_000, variant="vanilla"),
        **{(m, t): dict(OLD_PAPER_LRA, n_layer=4, n_head=4, n_embd=256, lr=0.05, warmup=8000, max_iters=20_000,
                        **({"variant": "vanilla"} if m == "softmax" else {}))
           for m in ("simpletron", "softmax") for t in ("text", "image", "pathfinder")},
        **{(m, "retrieval"): dict(OLD_PAPER_LRA, n_layer=4, n_head=4, n_embd=128, lr=0.05, warmup=8000,
                                  max_iters=15_000, **({"variant": "vanilla"} if m == "softmax" else {}))
           for m in ("simpletron", "softmax")},
        **{("transject", t): dict(n_layer=6, n_experts=4, n_embd=512, block_size=512, pool="mean", batch_size=32,
                                  lr=5e-4, beta2=0.98, eps=1e-9, weight_decay=0.0, schedule="cosine", warmup=0,
                                  min_lr=1.0, max_iters=iters)
           for t, iters in (("imdb", 23_440), ("agnews", 112_500))},
        **{("transject", t): dict(n_layer=2, n_experts=4, n_embd=512, batch_size=32, lr=1e-4, warmup=1000,
                                  schedule="cosine", min_lr=0.0, weight_decay=0.0, max_iters=50_000,
                                  pool="mean" if t == "text" else "max")
           for t in ("listops", "text", "retrieval", "image", "pathfinder")},
        ("transject", "ptb"): dict(n_layer=6, n_experts=4, n_embd=512, block_size=35, batch_size=32, lr=0.01,
                                   beta2=0.98, eps=1e-9, weight_decay=0.0, schedule="cosine", warmup=0,
                                   min_lr=1.0, max_iters=8_300),
    },
}


def resolved(*argv):
    args, given, names = config.parse_args(list(argv))
    overrides = config.resolve(args, given, names)
    return {**vars(args), **overrides}


def test_the_written_out_presets_are_the_old_tables(monkeypatch):
    """The models and tasks of OLD_PRESETS only: a model or task added later brings its own rows. A failure here
    means a preset of these models or tasks changed: if on purpose, change OLD_PRESETS above to match."""
    assert set(config.PRESETS) == set(OLD_PRESETS)
    models = {m for table in OLD_PRESETS.values() for m, _ in table}
    tasks = sorted({t for table in OLD_PRESETS.values() for _, t in table} - {"*"} | {"textfile"})
    combos = [(m, t, p) for m in sorted(models) for t in tasks for p in OLD_PRESETS]
    for m, t, p in combos:                                   # every model x task x preset: the same entry ...
        assert config.preset_for(config.PRESETS[p], m, t) == config.preset_for(OLD_PRESETS[p], m, t), (
            f"the {p} preset of {m} on {t} is not OLD_PRESETS': if you changed it on purpose, change tests/"
            "test_help.py's OLD_PRESETS too")
    new = {c: resolved("--model", c[0], "--task", c[1], "--preset", c[2]) for c in combos}
    monkeypatch.setattr(config, "PRESETS", OLD_PRESETS)
    for c in combos:                                         # ... and the same settings once resolved
        assert new[c] == resolved("--model", c[0], "--task", c[1], "--preset", c[2]), c


def test_a_preset_wins_over_a_models_own_flags_in_help_and_in_the_run(monkeypatch, capsys):
    """softmax's own flags (attention softmax, variant vanilla) come first, a preset's entry for it after them: a
    preset that sets the variant is what --help shows (the order of the layers)."""
    patched = {**config.PRESETS["cpu"], ("softmax", "ptb"): {**config.PRESETS["cpu"].get(("softmax", "ptb"), {}),
                                                            "variant": "res"}}
    monkeypatch.setitem(config.PRESETS, "cpu", patched)
    assert config.MODELS["softmax"][1]["variant"] == "vanilla"
    assert config.help_values("softmax", "ptb", "cpu")["variant"] == "res"
    assert shown(help_text(capsys, "--model", "softmax", "--task", "ptb"), "variant") == "res"
