"""
The n-gram reference baselines of the language-model tasks (ptb, textfile: words or characters): unigram and
interpolated Kneser-Ney n-grams counted on the training stream and scored on exactly the targets train.py
evaluates. experiments.py's tables print them beside the models (lm_baselines: perplexity; char_baselines: bits
per character).
"""

import collections
import math

import numpy as np

def ngram_perplexities(train, split):
    """Unigram (add-one) and interpolated Kneser-Ney bigram (discount 0.75) perplexities on exactly the targets
    train.py evaluates: every full window of the split, each target predicted from the token before it (the
    model has that token too). Counts from the training stream. Continuation counts are add-one smoothed so that
    a word never seen after another still has a probability."""
    V = int(max(train.max(), split.stream.max())) + 1
    uni = np.bincount(train, minlength=V).astype(np.float64)
    p_uni = (uni + 1) / (uni.sum() + V)
    prev, nxt = train[:-1].astype(np.int64), train[1:].astype(np.int64)
    pairs = np.unique(prev * V + nxt)                        # distinct bigrams (v, w)
    pv, pw = pairs // V, pairs % V
    n_after = np.bincount(pv, minlength=V).astype(np.float64)   # N1+(v .): distinct words after v
    n_before = np.bincount(pw, minlength=V).astype(np.float64)  # N1+(. w): distinct words before w
    p_cont = (n_before + 1) / (n_before.sum() + V)
    c_v = np.bincount(prev, minlength=V).astype(np.float64)     # c(v) as a context
    counts = collections.Counter((prev * V + nxt).tolist())
    D, L, n = 0.75, split.block_size, len(split)
    x, y = (split.stream[i: n * L + i].astype(np.int64) for i in (0, 1))   # every full window's inputs, targets
    c_vw = np.array([counts.get(int(k), 0) for k in (x * V + y)], dtype=np.float64)
    cv = c_v[x]
    with np.errstate(divide="ignore", invalid="ignore"):
        p_kn = np.where(cv > 0, np.maximum(c_vw - D, 0) / cv + D * n_after[x] / cv * p_cont[y], p_cont[y])
    return {"unigram": math.exp(-np.log(p_uni[y]).mean()), "bigram": math.exp(-np.log(p_kn).mean())}


def lm_baselines(task, args):
    train = np.asarray(task.split("train").stream)
    val, test = (ngram_perplexities(train, task.split(s)) for s in ("val", "test"))

    def four_gram(split):                                    # the same targets: every full window's
        stream = np.asarray(split.stream[:len(split) * split.block_size + 1])
        return math.exp(-np.log(kneser_ney(train, stream, 4, task.vocab_size)).mean())
    return [("unigram, add-one", val["unigram"], test["unigram"]),
            ("bigram, interpolated Kneser-Ney (D = 0.75)", val["bigram"], test["bigram"]),
            ("4-gram, interpolated Kneser-Ney (D = 0.75): the 3 words before, also across window edges",
             *(four_gram(task.split(s)) for s in ("val", "test")))]


def grams(train, stream, n, V):
    """For k = 1..n the k-grams of train and of stream (ending at k - 1 on) as int64s: the rank of the first k - 1
    tokens among both arrays' (key // V) times V plus the last token: no overflow, whatever V is."""
    a, m, out = np.concatenate([train, stream]), len(train), {}   # (a k-gram across the two ends goes unused)
    history = np.zeros(len(a), dtype=np.int64)               # the rank of the (k - 1)-gram before each token
    for k in range(1, n + 1):
        key = history * V + a                                # the k-gram ending at each position
        out[k] = key[k - 1:m], key[m + k - 1:]
        history = np.concatenate([[0], np.unique(key, return_inverse=True)[1].reshape(-1)[:-1]])
    return out


def lookup(keys, values, queries):
    """For each query, values[i] where keys[i] == query (keys sorted and distinct), 0 where it is no key."""
    i = np.minimum(np.searchsorted(keys, queries), len(keys) - 1)
    return np.where(keys[i] == queries, values[i], 0)


def kn_tables(keys, n, V):
    """For each order k = 1..n: (k-grams hw, their counts, histories h, sum of counts after h, distinct tokens
    after h). Order n counts how often hw occurs; a lower order counts the distinct tokens seen before hw (its
    continuation count N1+(. h w)): a lower order is used where the longer history was not seen, so what it
    should know is how many contexts w follows, not how often."""
    tables = {}
    for k in range(1, n + 1):
        seen = keys[n] if k == n else keys[k][1:][np.unique(keys[k + 1], return_index=True)[1]]  # (drop the oldest)
        hw, c = np.unique(seen, return_counts=True)
        h, start = np.unique(hw // V, return_index=True)
        tables[k] = (hw, c, h, np.add.reduceat(c, start), np.diff(np.append(start, len(hw))))
    return tables


def kneser_ney(train, stream, n, V, D=0.75):
    """Interpolated Kneser-Ney: the probability of each target stream[1:] given the n - 1 tokens before it in
    the stream (all there are, for the first n - 2 targets), from the counts of `train`, ids < V.
        p_k(w | h) = max(c(h w) - D, 0) / c(h) + D N1+(h .) / c(h) p_{k-1}(w | h's last k - 2 tokens)
    where h was seen (else p_{k-1}), down to p_1(w) = max(c(w) - D, 0) / c + D N1+(.) / c / V."""
    g = grams(np.asarray(train, dtype=np.int64), stream := np.asarray(stream, dtype=np.int64), n, V)
    tables = kn_tables({k: t for k, (t, _) in g.items()}, n, V)
    hw, c, *_ = tables[1]
    p1 = np.full(V, D * len(hw) / c.sum() / V)
    p1[hw] += np.maximum(c - D, 0) / c.sum()
    p = p1[stream[1:]]
    for k in range(2, n + 1):                               # target i (position i + 1) has k - 1 tokens before it
        hw, c, h, c_h, n_h = tables[k]                      # from i = k - 2 on
        q = g[k][1]
        c_hw, c_h, n_h = (lookup(keys, v, x).astype(np.float64) for keys, v, x in
                          ((hw, c, q), (h, c_h, q // V), (h, n_h, q // V)))
        with np.errstate(divide="ignore", invalid="ignore"):
            p[k - 2:] = np.where(c_h > 0, np.maximum(c_hw - D, 0) / c_h + D * n_h / c_h * p[k - 2:], p[k - 2:])
    return p


def char_baselines(task, args):
    """Bits per character of three n-grams on exactly the targets train.py evaluates (every full window of the
    split), counted on the training stream; V is the model's vocabulary (padding id 0 included)."""
    train, V = np.asarray(task.split("train").stream), task.vocab_size

    def bits(split, probs):
        n = len(split) * split.block_size
        return float(-np.log2(probs(np.asarray(split.stream[:n + 1]))).mean())

    counts = np.bincount(train, minlength=V)
    add_one = (counts + 1) / (counts.sum() + V)
    models = [("unigram, add-one: no context", lambda s: add_one[s[1:]]),
              ("bigram, interpolated Kneser–Ney (D = 0.75): the previous character",
               lambda s: kneser_ney(train, s, 2, V)),
              ("5-gram, interpolated Kneser–Ney (D = 0.75): the 4 characters before, also across window edges",
               lambda s: kneser_ney(train, s, 5, V))]
    return [(name, *(bits(task.split(s), probs) if task.has(s) else None for s in ("val", "test")))
            for name, probs in models]
