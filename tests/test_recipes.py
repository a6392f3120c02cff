"""Recipes: `python train.py @FILE` stands for the flags written in FILE (recipes/*.txt), read as a shell reads
them with # comments left out; flags given after it override its own. The README's recipes are the long commands
they replaced, flag for flag."""

import os
import shlex
import shutil
import subprocess
import re

import pytest

import config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# the README's commands before they became recipes
QUICKSTART = ("--model simpletron --task listops --listops_depth 3 --listops_args 2,3 --listops_len 5,20 "
              "--listops_sizes 20000,1000,1000 --max_iters 1000 --batch_size 32 --eval_interval 500 "
              "--out_dir out/quickstart")
SHAKESPEARE = ("--model diffeqformer --task textfile --tokenizer char --data_dir input.txt --n_layer 4 --n_head 4 "
               "--n_embd 128 --block_size 64 --batch_size 12 --max_iters 2000 --lr 1e-3 --schedule cosine "
               "--min_lr 0.1 --beta2 0.99 --weight_decay 0.1 --dropout 0.0 --warmup 100 --grad_clip 1.0 "
               "--eval_interval 250 --eval_iters 20 --out_dir out/shakespeare-char")


def parsed(argv):
    args, given, _ = config.parse_args(argv)
    return vars(args), given


@pytest.mark.parametrize("name, command", [("quickstart", QUICKSTART), ("shakespeare_char", SHAKESPEARE)])
def test_a_recipe_is_the_command_it_replaced(name, command):
    assert parsed([f"@{ROOT}/recipes/{name}.txt"]) == parsed(command.split())


def test_flags_after_a_recipe_override_it_and_comments_are_left_out(tmp_path):
    recipe = tmp_path / "r.txt"
    recipe.write_text("# --model softmax\n--model transject   # its Config fields are flags too:\n"
                      "--n_experts 2 --n_layer 3 --out_dir 'out/a b'\n\n")
    args, given = parsed([f"@{recipe}", "--n_layer", "5"])
    assert (args["model"], args["n_experts"], args["n_layer"], args["out_dir"]) == ("transject", 2, 5, "out/a b")
    assert given == {"model", "n_experts", "n_layer", "out_dir"}
    assert parsed([f"@{ROOT}/recipes/quickstart.txt", "--model", "softmax"])[0]["model"] == "softmax"


def test_a_missing_recipe_is_one_line(tmp_path):
    with pytest.raises(config.UsageError) as e:
        config.parse_args([f"@{tmp_path}/none.txt"])
    assert "none.txt" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(config.UsageError, match=r"^@ without a file: @FILE reads the flags in FILE, e.g. @recipes/"):
        config.parse_args(["@"])                                 # (was the system's "No such file or directory: ''")


def test_every_recipe_the_readme_names_exists():
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        named = set(re.findall(r"@(recipes/[\w.-]+)", f.read()))
    assert named == {"recipes/quickstart.txt", "recipes/shakespeare_char.txt"}
    assert all(os.path.isfile(os.path.join(ROOT, name)) for name in named)


# A file of flags as a shell reads it, each case against bash itself: the text as the words of an array literal,
# where newlines are blanks, # starts a comment only at a word's start, and a backslash ending a line joins the next.
SHELL_TEXTS = ["--out_dir run#2   # the second try\n", "--model transject \\\n  --n_layer 3 \\\n--out_dir 'a b'\n",
               '--out_dir "x #y" --data_dir x\\ #y\n', "--out_dir 'x'#y # it's a comment: 'an unclosed quote\n",
               "--out_dir a\\\n#b\n", "--out_dir a \\\n#b --n_layer 2\n--model softmax", "#\n\n  # two\n-x#\n#",
               '--out_dir "a\\\nb" --data_dir \'c\\\nd\' "e\\"f" \'g\\h\' "i\\j"\n', "\\#a b\\\\#c \\\\\n#d\n"]


@pytest.mark.skipif(not shutil.which("bash"), reason="bash is the reference")
@pytest.mark.parametrize("text", SHELL_TEXTS)
def test_a_file_of_flags_is_split_into_the_words_bash_makes_of_it(text):
    script = f"a=(\n{text}\n)\nprintf '%s\\0' \"${{a[@]}}\""
    words = subprocess.run(["bash", "-c", script], capture_output=True, check=True).stdout.decode().split("\0")[:-1]
    assert shlex.split(config.shell_text(text), comments=False) == words


def test_a_recipe_keeps_a_hash_inside_a_word_and_joins_lines_ending_in_a_backslash(tmp_path):
    """A command copied from a shell into a file: its lines' ends written \\ (CRLF too), a # inside a word kept."""
    recipe = tmp_path / "r.txt"
    recipe.write_bytes(b"\xef\xbb\xbf--model transject \\\r\n  --n_layer 3 \\\r\n  --out_dir run#2   # the second try\r\n")
    args, given = parsed([f"@{recipe}"])
    assert (args["model"], args["n_layer"], args["out_dir"], given) == ("transject", 3, "run#2",
                                                                         {"model", "n_layer", "out_dir"})
