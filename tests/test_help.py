"""train.py --help shows the values the chosen model, task and preset will use, and what each Config field means."""
import re

import pytest

import train


def help_text(capsys, *argv):
    with pytest.raises(SystemExit):
        train.parse_args(["--help", *argv])
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
    assert train.preset_for(presets, "m", "t") == dict(a=1, b=3, c=4)
    assert train.preset_for(presets, "m", "u") == dict(a=1, b=2) and train.preset_for(presets, "x", "t") == {}


def test_help_of_the_main_command_and_its_time_limit(capsys):
    t = help_text(capsys, "--model", "simpletron", "--task", "listops")
    assert (shown(t, "max_iters"), shown(t, "lr"), shown(t, "short_steps"), shown(t, "time_limit"),
            shown(t, "out_dir")) == ("1500", "0.0005", "400", "13.5", "out/simpletron-listops")
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


class DemoConfig:                                            # (source only: no dataclass needed)
    alpha: int = 1              # the first line
                                # and its continuation
    n_layer: int = 2            # L
    # nanoGPT's names
    beta: float = 0.5           # beta's own meaning, long enough to stand alone
    # the task sets these
    gamma: str = "x"


def test_field_meanings_read_the_comments_beside_each_field():
    got = train.field_meanings(DemoConfig)
    assert got["alpha"] == "the first line and its continuation"
    assert got["beta"] == "beta's own meaning, long enough to stand alone"
    assert got["n_layer"] == f"{train.COMMON_FIELDS['n_layer']} (L)"        # a short comment: the common line too
    assert "gamma" not in got                                # no comment of its own
