"""experiments/heldout_recall.py and heldout_listops.py: a bad setting, checked before any work, is one line on
stderr and exit status 2, never a usage dump or a traceback; Ctrl-C is one line and exit status 130."""

import os
import signal
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(script, *argv):
    return subprocess.run([sys.executable, os.path.join(ROOT, "experiments", script), *argv], capture_output=True,
                          text=True, timeout=120)


def refused(r, *words):
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in r.stderr
    assert all(w in lines[0] for w in words), lines[0]


@pytest.mark.parametrize("argv, words", [
    (["mqar", "--recall_vocab", "4"], ["--recall_vocab >= 10"]),
    (["copy", "--recall_len", "5", "--recall_pairs", "4"], ["--recall_len >= 9"]),
    (["mqar", "--bogus"], ["--bogus"]),
    (["mqar", "--n", "-3"], ["--n -3"]),
    (["induction", "--recall_pairs", "2"], ["--recall_pairs"]),
    (["mqar", "--recall_vocab", "0"], ["--recall_vocab >= 10 (given 64 and 0)"]),   # (was: the default, 128)
    (["mqar", "--n", "10000000000"], ["--n 10000000000 examples of 64 tokens: allowed are 4 GiB"]),
    (["induction", "--recall_len", "16385"], ["--recall_len 16385: allowed is at most 16,384"]),   # train.py's
])
def test_heldout_recall_refuses_a_bad_setting_in_one_line(tmp_path, argv, words):
    refused(run("heldout_recall.py", *argv, "--out", str(tmp_path / "out")), *words)
    assert not (tmp_path / "out").exists()                   # before any work


def test_heldout_recall_writes_its_smallest_settings(tmp_path):
    for argv in (["mqar", "--recall_len", "8", "--recall_vocab", "6", "--recall_pairs", "2"],
                 ["copy", "--recall_len", "9"], ["induction", "--recall_len", "3"]):
        r = run("heldout_recall.py", *argv, "--n", "3", "--out", str(tmp_path))
        assert r.returncode == 0, r.stderr
        assert len((tmp_path / "test.txt").read_text().splitlines()) == 3


def test_heldout_recall_writes_examples_of_train_pys_longest_length(tmp_path):
    r = run("heldout_recall.py", "induction", "--recall_len", "16384", "--n", "2", "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr
    lines = (tmp_path / "test.txt").read_text().splitlines()
    assert [len(line.split("\t")[0].split()) for line in lines] == [16384] * 2


def test_heldout_recall_ctrl_c_is_one_line_and_exit_130(tmp_path):
    p = subprocess.Popen([sys.executable, os.path.join(ROOT, "experiments", "heldout_recall.py"), "mqar", "--n",
                          "3000000", "--out", str(tmp_path)], stderr=subprocess.PIPE, text=True)
    for _ in range(600):                                     # until it writes
        if (tmp_path / "test.txt.tmp").exists():
            break
        time.sleep(0.1)
    p.send_signal(signal.SIGINT)
    err = p.communicate(timeout=60)[1]
    assert p.returncode == 130 and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not (tmp_path / "test.txt.tmp").exists()


@pytest.mark.parametrize("argv, words", [(["--bogus"], ["--bogus"]), (["--n", "0"], ["--n 0"])])
def test_heldout_listops_refuses_a_bad_setting_in_one_line(tmp_path, argv, words):
    refused(run("heldout_listops.py", *argv, "--out", str(tmp_path / "out"), "--cache_dir", str(tmp_path / "c")),
            *words)


TINY = ["--listops_depth", "3", "--listops_args", "2,3", "--listops_len", "5,20", "--listops_sizes", "30,5,5"]


@pytest.mark.parametrize("argv, words", [
    (["--listops_args", "5,2"], ["--listops_args 5,2 must be MIN,MAX with 1 <= MIN <= MAX"]),   # (was: exit 1)
    ([*TINY, "--seed", "-1"], ["--seed -1: allowed is an integer >= 0"]),                       # (was: a traceback)
    ([*TINY, "--n", "10000001"], ["--n 10000001: allowed is a number of held-out trees from 1 to 10,000,000"]),
    ([*TINY, "--out", "{tmp}/file"], ["--out {tmp}/file: {tmp}/file is a file, not a folder"]),
    ([*TINY, "--out", "{tmp}/taken"], ["--out {tmp}/taken: its basic_test.tsv is a folder"]),
])
def test_heldout_listops_refuses_a_bad_setting_before_the_task_is_generated(tmp_path, argv, words):
    """Each flag checked before any work: the task's splits not generated first (no cache folder), exit status 2."""
    (tmp_path / "file").write_text("x")
    (tmp_path / "taken" / "basic_test.tsv").mkdir(parents=True)
    argv = [a.format(tmp=tmp_path) for a in argv]
    out = [] if "--out" in argv else ["--out", str(tmp_path / "out")]
    refused(run("heldout_listops.py", *argv, *out, "--cache_dir", str(tmp_path / "c")),
            *(w.format(tmp=tmp_path) for w in words))
    assert not (tmp_path / "c").exists() and not (tmp_path / "out").exists()


def test_heldout_listops_a_cache_dir_that_is_a_file_is_exit_status_2(tmp_path):
    (tmp_path / "c").write_text("x")
    refused(run("heldout_listops.py", *TINY, "--out", str(tmp_path / "out"), "--cache_dir", str(tmp_path / "c")),
            "--cache_dir", "is not a folder")
