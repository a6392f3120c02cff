"""Edges that the harder planted bugs of dev/mutants.py (--kinds hard: two-line bugs, wrong axes, off by one under
padding, cache keys, precedence of settings; docs/testing.md) found untested, each held against a hand-worked case:
where a length ends, which axis a sum runs over, what a cache's name and manifest follow, which setting wins."""

import json
import os

import data


def test_one_line_keeps_a_message_of_exactly_the_limit_and_cuts_a_longer_one():
    assert data.one_line("abcdefghij", 10) == "abcdefghij"                  # 10 characters: whole
    assert data.one_line("abcdefghijk", 10) == "abcdefg..."                 # 11: 7 of them and "...", 10 in all
    assert data.one_line(" a\n  b\tc ", 5) == "a b c"                       # whitespace runs made one space first
    assert data.one_line(ValueError()) == "ValueError"                      # no message: the exception's name


def test_a_build_that_leaves_a_manifest_of_its_own_still_gets_a_true_one(tmp_path):
    def build(out):                                        # e.g. a copy of an older cache, its manifest.json with it
        with open(os.path.join(out, "a.bin"), "wb") as f:
            f.write(b"12345")
        with open(os.path.join(out, data.MANIFEST), "w") as f:
            f.write('{"files": {"old.bin": {"size": 1, "crc32": 0, "stamp": []}}}')
    folder = data.cached_dir(str(tmp_path / "c"), build)
    with open(os.path.join(folder, data.MANIFEST)) as f:
        files = json.load(f)["files"]
    assert sorted(files) == ["a.bin"] and files["a.bin"]["size"] == 5       # itself never listed
    assert data.cache_problem(folder) is None
