"""What a run records and reads back (battery 15): the vocabulary a checkpoint records, of the kind its run's ids
have; recorded settings of the kind train.py writes; files saved with a byte-order mark; the padding id never
sampled; `python -m tasks` without a module, or with one that does not exist."""

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import config
import data
import sample
import tasks.lm
import train
from test_generate import TINY, run_sample, write_ptb

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TEXT = "to be, or not to be: that is the question.\n" * 40


@pytest.fixture(scope="module")
def char_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("records")
    (root / "t.txt").write_text(TEXT)
    common = ["--task", "textfile", "--data_dir", root / "t.txt", "--tokenizer", "char", "--cache_dir", root / "c",
              *TINY]
    train.main([str(a) for a in [*common, "--out_dir", root / "run"]])
    return root, [str(a) for a in common]


def test_nanogpts_openwebtext_files_without_meta_json_have_no_vocabulary(tmp_path):
    folder = tmp_path / "owt"
    folder.mkdir()
    for i, s in enumerate(("train", "val")):
        np.random.default_rng(i).integers(0, 50257, 1000).astype(np.uint16).tofile(folder / f"{s}.bin")
    task = data.load_task("openwebtext", cache_dir=tmp_path / "c", data_dir=str(folder), tokenizer="gpt2",
                          block_size=8)
    assert task.vocabulary is None and task.vocab_size == 50257
    assert data.Task("t", "lm", 5, 4, meta=None).vocabulary is None                 # (a fork's task)
    (folder / "meta.json").write_text('{"vocab_size": 50257, "dtype": "uint16", "chars": 5}')
    with pytest.raises(data.DataError, match=r"meta.json: (\"vocab_size\": 50257, \"dtype\": \"uint16\": )?expected .*\"chars\": N - 1 characters"):
        data.load_task("openwebtext", cache_dir=tmp_path / "c", data_dir=str(folder), tokenizer="gpt2", block_size=8)
    (folder / "meta.json").write_text('{"vocab_size": 4, "dtype": "uint16", "chars": "abcd"}')   # one too many
    with pytest.raises(data.DataError, match=r"meta.json: (.*: )?expected"):
        tasks.lm.lm_bin_task("openwebtext", str(folder), 8, ("train", "val"))
    (folder / "meta.json").write_text('{"vocab_size": 4, "dtype": "uint16", "chars": "abc"}')    # 3 + padding
    assert tasks.lm.lm_bin_task("openwebtext", str(folder), 8, ("train", "val")).vocabulary == "abc"


def test_a_recorded_vocabulary_of_the_wrong_kind_is_damaged(char_run, tmp_path):
    root, _ = char_run
    ckpt = torch.load(root / "run" / "ckpt.pt", weights_only=True)
    assert ckpt["vocabulary"] == "".join(sorted(set(TEXT)))
    for bad, said in ((list(ckpt["vocabulary"]), "not the characters of its --tokenizer char"),
                      (7, "not the characters of its --tokenizer char")):
        torch.save({**ckpt, "vocabulary": bad}, tmp_path / "bad.pt")
        with pytest.raises(config.UsageError, match=f"bad.pt is damaged: its record of what its ids stand for is {said}"):
            config.load_checkpoint(str(tmp_path / "bad.pt"))
    words = {**ckpt, "args": {**ckpt["args"], "task": "ptb", "tokenizer": "gpt2"}}
    for bad in ("abc", ["a", 1]):                            # a word run's record is a list of words
        torch.save({**words, "vocabulary": bad}, tmp_path / "bad.pt")
        with pytest.raises(config.UsageError, match="is not the list of words of its PTB run"):
            config.load_checkpoint(str(tmp_path / "bad.pt"))
    torch.save({**words, "vocabulary": ["<eos>", "a"]}, tmp_path / "good.pt")
    assert config.load_checkpoint(str(tmp_path / "good.pt"))["vocabulary"] == ["<eos>", "a"]


@pytest.mark.parametrize("key, value, said", [("max_iters", "10", "setting max_iters is '10', not the int"),
                                              ("log_interval", True, "setting log_interval is True, not the int"),
                                              ("lr", "1e-3", "setting lr is '1e-3', not the float"),
                                              ("resume", 1, "setting resume is 1, not the bool")])
def test_a_recorded_setting_of_another_kind_is_damaged(char_run, tmp_path, key, value, said):
    root, common = char_run
    ckpt = torch.load(root / "run" / "ckpt.pt", weights_only=True)
    (tmp_path / "r").mkdir()
    torch.save({**ckpt, "args": {**ckpt["args"], key: value}}, tmp_path / "r" / "ckpt.pt")
    with pytest.raises(config.UsageError) as e:
        train.main(["--resume", "--out_dir", str(tmp_path / "r"), "--max_iters", "4"])
    assert str(e.value) == f"{tmp_path / 'r' / 'ckpt.pt'} is damaged: its {said} train.py writes"
    ckpt["args"]["lr"] = 1                                   # an int where a float is written: the same number
    assert config.args_problem(ckpt["args"]) is None


def test_another_texts_best_pt_of_the_same_shape_is_not_this_runs(char_run, tmp_path):
    root, common = char_run
    other = TEXT.replace("q", "z")                           # as many characters, one of them another
    (tmp_path / "u.txt").write_text(other)
    train.main([*common[:2], "--data_dir", str(tmp_path / "u.txt"), *common[4:], "--out_dir", str(tmp_path / "u")])
    mine = tmp_path / "mine"
    mine.mkdir()
    for f in ("ckpt.pt", "log.jsonl"):
        (mine / f).write_bytes((root / "run" / f).read_bytes())
    (mine / "best.pt").write_bytes((tmp_path / "u" / "best.pt").read_bytes())
    with pytest.raises(config.UsageError, match="best.pt holds another run's weights"):
        train.main(["--resume", "--out_dir", str(mine), "--max_iters", "4"])
    (mine / "best.pt").write_bytes((root / "run" / "best.pt").read_bytes())
    assert train.main(["--resume", "--out_dir", str(mine), "--max_iters", "4"])["iters"] == 4


def test_files_saved_with_a_byte_order_mark_read_as_without(char_run, tmp_path):
    root, common = char_run
    (tmp_path / "t.txt").write_bytes(b"\xef\xbb\xbf" + TEXT.encode())   # Notepad's UTF-8
    task = data.load_task("textfile", cache_dir=tmp_path / "c", data_dir=str(tmp_path / "t.txt"), tokenizer="char")
    assert task.vocabulary == "".join(sorted(set(TEXT)))      # the mark is no character of the text
    (tmp_path / "r.txt").write_bytes(b"\xef\xbb\xbf--max_iters 7 --lr 0.002\n--seed 3\n")
    args = config.parse_args([f"@{tmp_path / 'r.txt'}"])[0]
    assert (args.max_iters, args.lr, args.seed) == (7, 0.002, 3)
    (tmp_path / "p.txt").write_bytes(b"\xef\xbb\xbfto be")
    y, _ = run_sample("--ckpt", root / "run" / "ckpt.pt", "--start", f"FILE:{tmp_path / 'p.txt'}",
                      "--max_new_tokens", 2, "--device", "cpu")
    chars = sorted(set(TEXT))
    assert y[0, :5].tolist() == [chars.index(c) + 1 for c in "to be"]


def test_the_padding_id_is_never_sampled(tmp_path):
    """A model of a text of one character: sampled hot, every new token is that character (id 1), never the padding
    id 0 (which printed nothing, so samples came out short), nor an id past the vocabulary."""
    (tmp_path / "a.txt").write_text("a" * 400)
    train.main(["--task", "textfile", "--data_dir", str(tmp_path / "a.txt"), "--tokenizer", "char", "--cache_dir",
                str(tmp_path / "c"), *TINY, "--vocab_size", "4", "--out_dir", str(tmp_path / "run")])
    y, out = run_sample("--ckpt", tmp_path / "run" / "ckpt.pt", "--start", "a", "--num_samples", 4,
                        "--max_new_tokens", 40, "--temperature", "50", "--top_k", "0", "--device", "cpu")
    assert y.tolist() == [[1] * 41] * 4 and out == ("a" * 41 + "\n---------------\n") * 4
    folder = write_ptb(tmp_path / "ptb")                     # words: <pad> is never printed
    train.main(["--task", "ptb", "--data_dir", str(folder), *TINY, "--out_dir", str(tmp_path / "w")])
    y, out = run_sample("--ckpt", tmp_path / "w" / "ckpt.pt", "--start", "the", "--num_samples", 8,
                        "--max_new_tokens", 30, "--temperature", "50", "--top_k", "0", "--device", "cpu")
    assert (y > 0).all() and "<pad>" not in out
    assert not sample.Tiktoken.padding                        # (gpt2's id 0 is '!', byte 0 a byte: both drawn)


@pytest.mark.parametrize("flags, said", [
    (["--top_k", "1", "--temperature", "0.5"], "--temperature 0.5: --top_k 1 draws the most likely token, whatever the "
                                               "temperature or seed; leave out --temperature"),
    (["--top_k", "1", "--seed", "7"], "--seed 7: --top_k 1 draws the most likely token"),
    (["--max_new_tokens", "0", "--top_k", "5"], "--top_k 5: --max_new_tokens 0 draws nothing; leave out --top_k"),
    (["--max_new_tokens", "0", "--seed", "5"], "--seed 5: --max_new_tokens 0 draws nothing")])
def test_a_sampling_flag_the_sampling_leaves_moot_is_refused(char_run, flags, said):
    root, _ = char_run
    with pytest.raises(config.UsageError) as e:
        run_sample("--ckpt", root / "run" / "ckpt.pt", *flags)
    assert str(e.value).startswith(said)
    y, _ = run_sample("--ckpt", root / "run" / "ckpt.pt", "--start", "to", "--top_k", "1", "--num_samples", 2,
                      "--max_new_tokens", 3, "--device", "cpu")       # greedy: the default temperature and seed
    assert y.shape == (2, 5) and y[0].tolist() == y[1].tolist()


@pytest.mark.parametrize("module", ["tasks", "tasks.lmm", "tasks.lm.x"])
def test_python_m_tasks_without_a_module_of_tasks_is_one_line(module):
    p = subprocess.run([sys.executable, "-m", module, "--help"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and p.stdout == "" and "Traceback" not in p.stderr, p.stderr
    assert p.stderr.startswith(f"error: python -m {module}: no such module of tasks; python -m tasks.NAME prepares "
                               "the tasks of: tasks.image, tasks.listops,") and len(p.stderr.splitlines()) == 1


def test_a_lock_whose_process_id_another_program_took_is_stale(char_run, tmp_path):
    """A run's lock naming a live process that is no train.py (its id reused after a reboot: a program, or another
    Python's) is taken and the run resumed; one naming this process with its start time (train.main here) is in
    use."""
    root, _ = char_run
    run = tmp_path / "run"
    run.mkdir()
    for f in ("ckpt.pt", "best.pt", "log.jsonl"):
        (run / f).write_bytes((root / "run" / f).read_bytes())
    for program, steps in ((["sleep", "60"], 3), ([sys.executable, "-c", "import time; time.sleep(60)"], 4)):
        with subprocess.Popen(program) as other:
            try:
                (run / "lock").write_text(f"{other.pid}\n")
                assert train.main(["--resume", "--out_dir", str(run), "--max_iters", str(steps)])["iters"] == steps
            finally:
                other.kill()
    if not os.path.exists("/proc/self/stat"):
        return
    with open("/proc/self/stat") as f:                       # field 22, the start time: after the name's ')'
        started = f.read().rpartition(")")[2].split()[19]
    (run / "lock").write_text(f"{os.getpid()} {started}\n")
    with pytest.raises(config.UsageError, match=f"is in use by another train.py \\(process {os.getpid()}\\)"):
        train.main(["--resume", "--out_dir", str(run), "--max_iters", "5"])


@pytest.mark.parametrize("key, value, allowed", [("lr", -1.0, "a number >= 0"),
                                                 ("beta2", 1.0, "a number from 0 to 1 (1 excluded)"),
                                                 ("eval_interval", 0, "an integer >= 1")])
def test_a_recorded_setting_out_of_its_range_is_the_checkpoints_not_a_flag(char_run, tmp_path, key, value, allowed):
    """--resume typed no --lr: a checkpoint whose lr is -1.0 is damaged (or of another version), and the line says
    so, naming ckpt.pt, not '--lr -1.0' as if the user gave it; nothing is written."""
    root, _ = char_run
    ckpt = torch.load(root / "run" / "ckpt.pt", weights_only=True)
    (tmp_path / "r").mkdir()
    torch.save({**ckpt, "args": {**ckpt["args"], key: value}}, tmp_path / "r" / "ckpt.pt")
    before = (tmp_path / "r" / "ckpt.pt").read_bytes()
    with pytest.raises(config.UsageError) as e:
        train.main(["--resume", "--out_dir", str(tmp_path / "r"), "--max_iters", "4"])
    assert str(e.value) == (f"{tmp_path / 'r' / 'ckpt.pt'} is damaged: its setting {key} is {value!r}, where "
                            f"train.py allows {allowed}: changed since, or written by another version")
    assert sorted(os.listdir(tmp_path / "r")) == ["ckpt.pt"] and (tmp_path / "r" / "ckpt.pt").read_bytes() == before


def test_lora_rank_with_eval_only_is_refused(char_run):
    root, _ = char_run
    with pytest.raises(config.UsageError, match="--lora_rank 2: a setting of training, and --eval_only trains "):
        train.main(["--init_from", str(root / "run" / "ckpt.pt"), "--eval_only", "--lora_rank", "2"])
