"""ListOps: the LRA generator, its values, lengths, the TSV format and the tokenizer."""

import os

import numpy as np
import pytest

import data

OPS = {"[MIN": min, "[MAX": max, "[MED": lambda a: int(np.median(a)), "[SM": lambda a: sum(a) % 10}


def evaluate_tokens(tokens):
    """A separately written evaluator: a stack machine over the bracket-free tokens (operator ... "]")."""
    stack = [[]]
    for tok in tokens:
        if tok in OPS:
            stack.append([tok])
        elif tok == "]":
            op, *args = stack.pop()
            stack[-1].append(OPS[op](args))
        else:
            stack[-1].append(int(tok))
    (value,) = stack[0]
    return value


def tree_shape(text):
    """Depth and the argument counts of every operator, read from the parenthesised LRA string."""
    depth = max_depth = 0
    counts, stack = [], []
    for tok in text.split():
        if tok in OPS:
            depth += 1
            max_depth = max(max_depth, depth)
            stack.append(0)
        elif tok == "]":
            counts.append(stack.pop())
            depth -= 1
            if stack:
                stack[-1] += 1
        elif tok not in "()":
            if stack:
                stack[-1] += 1
    return max_depth, counts


@pytest.fixture(scope="module")
def examples():
    return data.listops_chunk(((7, 0), 150, 500, 2000))


def test_values_agree_with_an_independent_evaluator(examples):
    for text, value in examples:
        tokens = [t for t in text.split() if t not in "()"]
        assert evaluate_tokens(tokens) == value


def test_the_lra_recipe_bounds(examples):
    assert len({text for text, _ in examples}) == len(examples)        # distinct
    for text, _ in examples:
        n = len([t for t in text.split() if t not in "()"])
        assert 500 < n < 2000
        depth, counts = tree_shape(text)
        assert depth <= 10
        assert min(counts) >= 2 and max(counts) <= 10


def test_the_string_is_lra_left_nested_pairs():
    # MAX(2, 9) -> ( ( ( [MAX 2 ) 9 ) ] ): the nesting LRA's to_string produces
    [(text, value)] = data.listops_chunk(((1, 1), 1, 0, 2000))
    assert text.startswith("( ") and text.endswith(" ] )")
    assert text.count("(") == text.count(")")
    assert data.listops_tokens("( ( ( [MAX 2 ) 9 ) ] )").tolist() == [12, 3, 10, 15]


def test_labels_are_skewed_towards_0_and_9(examples):
    counts = np.bincount([v for _, v in examples], minlength=10)
    assert counts[0] > counts[1:9].mean() and counts[9] > counts[1:9].mean()


def test_generation_is_deterministic_and_spreads_over_processes():
    a = data.generate_listops(30, seed=3, min_len=20, max_len=200, chunk=10)
    b = data.generate_listops(30, seed=3, min_len=20, max_len=200, chunk=10)
    c = data.generate_listops(30, seed=4, min_len=20, max_len=200, chunk=10)
    assert a == b and a != c and len(a) == 30


def test_tsv_round_trip(tmp_path, examples):
    path = tmp_path / "basic_test.tsv"
    data.write_listops_tsv(path, examples)
    assert path.read_text().startswith("Source\tTarget\n")
    split = data.read_listops_tsv(path, block_size=2000)
    assert len(split) == len(examples)
    for i, (text, value) in enumerate(examples):
        ids = data.listops_tokens(text)
        assert split.labels[i] == value
        assert split.lengths[i] == len(ids)
        assert (split.tokens[i, :len(ids)] == ids).all() and (split.tokens[i, len(ids):] == 0).all()


def test_tokenizer_keeps_closing_brackets_and_drops_parentheses():
    ids = data.listops_tokens("( ( [SM 1 ) ( ( [MIN 0 ) 7 ) ] ) ] )")
    assert [data.LISTOPS_VOCAB[i] for i in ids] == ["[SM", "1", "[MIN", "0", "7", "]", "]"]
    assert len(data.LISTOPS_VOCAB) == 16 and data.LISTOPS_VOCAB[0] == "<pad>"


@pytest.mark.parametrize("line, reason", [
    ("( [MAX 1 ) 2 ) ]\t12", "label 12"),
    ("( [MAX 1 ) 2 ) ]", "2 tab-separated"),
    ("( [MAXX 1 ) 2 ) ]\t2", r"'\[MAXX'"),
    ("( [MAX 1 ) 2 ) ]\tnine", "nine"),
])
def test_a_malformed_line_names_file_and_line(tmp_path, line, reason):
    path = tmp_path / "basic_val.tsv"
    path.write_text("Source\tTarget\n( [MIN 3 ) 4 ) ]\t3\n" + line + "\n")
    with pytest.raises(data.DataError, match=rf"basic_val.tsv, line 3: .*{reason}"):
        data.read_listops_tsv(path, block_size=2000)


def test_release_folder_layout(tmp_path, examples):
    folder = tmp_path / "lra_release" / "listops-1000"
    folder.mkdir(parents=True)
    data.write_listops_tsv(folder / "basic_test.tsv", examples[:20])
    for given in (folder, folder.parent):                   # the folder itself or the one that holds it
        task = data.load_task("listops", data_dir=str(given))
        assert task.has("test") and not task.has("train")
        assert len(task.split("test")) == 20
    with pytest.raises(data.DataError, match="not a folder"):
        data.load_task("listops", data_dir=os.path.join(str(tmp_path), "missing"))
