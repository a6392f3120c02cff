"""The n-gram baselines of experiments.py's word and character tables (tasks/ngram.py): interpolated Kneser-Ney
against hand-worked numbers, its probabilities summing to one, and lm_baselines and char_baselines scoring exactly
the targets train.py evaluates."""

import math

import numpy as np
import pytest

import data
import experiments
import tasks  # noqa: F401  (registers every task)
from tasks.ngram import kneser_ney

TRAIN = [1, 2, 1, 2, 1, 3]                                   # ids 1..3, V = 4 (0 is padding, never seen)
D = 0.75


def test_kneser_ney_bigram_by_hand():
    # Order 1 counts the distinct tokens before w: the bigrams (1 2), (2 1), (1 3) give N1+(. w) = 1 for
    # w = 1, 2, 3, three in all, so p1(w) = (1 - D) / 3 + D * 3 / 3 / V = 0.083333 + 0.1875 and p1(0) = 0.1875.
    p1 = (1 - D) / 3 + D / 4
    # Order 2 counts bigrams: c(1 2) = 2, c(1 3) = 1 (c(1) = 3, two distinct followers), c(2 1) = 2 (one follower).
    p_2_after_1 = (2 - D) / 3 + D * 2 / 3 * p1               # 0.552083
    p_3_after_2 = 0 + D * 1 / 2 * p1                         # (2 3) never seen: 0.101563
    assert kneser_ney(TRAIN, [1, 2, 3], 2, 4) == pytest.approx([p_2_after_1, p_3_after_2], abs=1e-12)
    assert (p_2_after_1, p_3_after_2) == pytest.approx((0.5520833333, 0.1015625))


def test_kneser_ney_trigram_by_hand_with_a_short_history_at_the_start():
    p1 = (1 - D) / 3 + D / 4                                 # as above: 0.270833
    # Order 2 now counts the distinct tokens before each bigram, from the distinct trigrams (1 2 1), (2 1 2),
    # (2 1 3): N1+(. 2 1) = N1+(. 1 2) = N1+(. 1 3) = 1. After 1: two followers, sum 2; after 2: one, sum 1.
    p2 = {(1, 2): (1 - D) / 2 + D * 2 / 2 * p1, (2, 1): (1 - D) / 1 + D * 1 / 1 * p1,
          (1, 3): (1 - D) / 2 + D * 2 / 2 * p1}
    # Order 3 counts trigrams: c(1 2 1) = 2 (after "1 2": sum 2, one follower), c(2 1 2) = c(2 1 3) = 1 (after
    # "2 1": sum 2, two followers).
    expected = [p2[1, 2],                                    # the first target has one token before it: order 2
                (2 - D) / 2 + D * 1 / 2 * p2[2, 1],          # 1 after "1 2"
                (1 - D) / 2 + D * 2 / 2 * p2[1, 3]]          # 3 after "2 1"
    assert expected == pytest.approx([0.328125, 0.794921875, 0.37109375])
    assert kneser_ney(TRAIN, [1, 2, 1, 3], 3, 4) == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_kneser_ney_is_a_distribution_after_any_history(n):
    rng = np.random.default_rng(n)
    train, V = rng.integers(1, 6, 3000), 7                   # ids 1..5; 0 and 6 never seen
    for history in ([1, 2, 3, 4], [5, 5, 5, 5], [0, 6, 0, 6], [2]):
        total = sum(kneser_ney(train, history + [w], n, V)[-1] for w in range(V))
        assert total == pytest.approx(1.0, abs=1e-12)
    big = kneser_ney(train, [1, 2, 3, 4, 5], 5, 10001)      # PTB's words: 10001**5 > 2**62, no overflow
    assert len(big) == 4 and all(0 < p < 1 for p in big)   # (each token after the first)


def test_char_baselines_score_the_targets_train_py_evaluates(tmp_path):
    folder = tmp_path / "ptb"
    folder.mkdir()
    lines = " the cat sat on the mat \n a dog ran \n"
    for name, text in (("train", lines * 30), ("valid", lines[24:] + lines * 3 + lines[:24]),
                       ("test", " a cat ran on the mat \n" * 5)):
        (folder / f"ptb.{name}.txt").write_text(text)
    task = data.load_task("ptb", cache_dir=tmp_path / "c", data_dir=str(folder), tokenizer="char", block_size=16)
    (uni, bi, five) = experiments.char_baselines(task, {})
    assert "no context" in uni[0] and "previous character" in bi[0] and "4 characters before" in five[0]
    train, val = np.asarray(task.split("train").stream), task.split("val")
    targets = np.asarray(val.stream[1:len(val) * 16 + 1])      # every full window's targets, once
    assert len(targets) == 9 * 16 < len(val.stream) - 1          # 148 characters: 3 are no target
    counts = np.bincount(train, minlength=task.vocab_size)
    assert uni[1] == pytest.approx(-np.mean(np.log2((counts[targets] + 1) / (len(train) + task.vocab_size))))
    assert five[1] < 0.2 < bi[1] < uni[1]                      # lines of train: nearly certain from 4 characters
    assert five[2] > bi[2]          # a sentence train never had: the 5-gram trusts its few, always-alike contexts
    assert all(math.isfinite(x) for _, v, t in (uni, bi, five) for x in (v, t))


def test_lm_baselines_score_the_4_gram_on_the_targets_of_the_bigram(tmp_path):
    folder = tmp_path / "ptb"
    folder.mkdir()
    words = "the cat sat on the mat \n a dog ran on the mat \n"
    for name, text in (("train", words * 20), ("valid", words * 3 + "the dog ran"),
                       ("test", "a cat sat on the mat \n" * 4)):
        (folder / f"ptb.{name}.txt").write_text(text)
    task = data.load_task("ptb", cache_dir=tmp_path / "c", data_dir=str(folder), block_size=4)
    uni, bi, four = experiments.lm_baselines(task, {})
    assert bi[0].startswith("bigram, interpolated Kneser-Ney") and four[0].startswith("4-gram, interpolated Kneser")
    train, val = np.asarray(task.split("train").stream), task.split("val")
    stream = np.asarray(val.stream[:len(val) * 4 + 1])         # every full window's targets; "ran" is left out
    assert len(stream) - 1 == len(val) * 4 < len(val.stream) - 1
    p = kneser_ney(train, stream, 4, task.vocab_size)
    assert four[1] == pytest.approx(math.exp(-np.log(p).mean()), rel=1e-12)
    assert four[1] < bi[1] < uni[1]                          # whole lines of train: the longer history knows more
    assert four[2] > bi[2]               # "a cat sat", never in train: the 4-gram trusts its few, always-alike contexts


# ----------------------------------------------------------------------------------------------
# Every smoothed distribution sums to one over the vocabulary after every context of a small hand-made stream

STREAM = np.array([1, 2, 1, 3, 1, 2, 2, 4, 1, 3, 3, 1])      # ids 1..4 (the last the largest), V = 5 with padding 0


def hand_task(window, V):
    """A language-model Task that trains on STREAM and whose val and test splits are one window [v, w]: one target."""
    def split(stream):
        return lambda: data.LMSplit(np.asarray(stream), 1)
    return data.Task("hand", "lm", V, 1, 0, {"train": split(STREAM), "val": split(window), "test": split(window)})


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_kneser_ney_sums_to_one_after_every_context_of_a_hand_made_stream(n):
    V = 5
    for history in np.ndindex(*(V,) * max(n - 1, 1)):        # every context, seen or not (0 too: never seen)
        total = sum(kneser_ney(STREAM, [*history, w], n, V)[-1] for w in range(V))
        assert total == pytest.approx(1.0, abs=1e-12), history


def test_the_word_tables_bigram_and_unigram_sum_to_one_after_every_token():
    """lm_baselines: p(w | v) = 1 / perplexity of the one window [v, w] (one target), for every v and w."""
    V = int(STREAM.max()) + 1                                # ngram_perplexities' vocabulary: the ids it saw
    for v in range(V):
        totals = np.zeros(3)
        for w in range(V):
            totals += [1 / ppl for _, ppl, _ in experiments.lm_baselines(hand_task([v, w], V), {})]
        assert totals == pytest.approx([1, 1, 1], abs=1e-12), v


def test_the_character_tables_n_grams_sum_to_one_after_every_character():
    """char_baselines: p(w | v) = 2 ** -(bits of the one window [v, w]), for every v and w."""
    V = 6                                                    # the model's vocabulary: id 5 never in train
    for v in range(V):
        totals = np.zeros(3)
        for w in range(V):
            totals += [2.0 ** -bits for _, bits, _ in experiments.char_baselines(hand_task([v, w], V), {})]
        assert totals == pytest.approx([1, 1, 1], abs=1e-12), v
