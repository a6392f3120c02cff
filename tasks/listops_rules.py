"""
ListOps' reference rules: what a model scores by reading only the top of the tree. listops_baselines fits
them on a training split and scores them on others (experiments.py's tables print them beside the models).
"""

import math

import numpy as np

from data import ClassificationSplit
from tasks.listops import LISTOPS_FNS
from tasks.listops_format import LISTOPS_END, LISTOPS_FIRST_OP, listops_tokens


def listops_examples(source):
    """(token ids, label) pairs from a ClassificationSplit or from (tree, label) pairs, a tree being an LRA
    string or token ids."""
    if isinstance(source, ClassificationSplit):
        tokens = np.asarray(source.tokens)
        return [(tokens[i, :source.lengths[i]], int(source.labels[i])) for i in range(len(source))]
    return [(listops_tokens(t) if isinstance(t, (str, bytes)) else np.asarray(t), int(y)) for t, y in source]


def listops_top(ids):
    """What the top of a tree shows: (operator index 0-3 or None for a lone digit, the sorted digits that are
    the root's own arguments, m = how many of its arguments are subtrees)."""
    ids = np.asarray(ids)
    if ids[0] < LISTOPS_FIRST_OP:
        return None, (int(ids[0]) - 1,), 0
    is_op = (ids >= LISTOPS_FIRST_OP) & (ids < LISTOPS_END)
    depth = np.cumsum(is_op.astype(np.int32) - (ids == LISTOPS_END))
    top = np.zeros(len(ids), dtype=bool)
    top[1:] = depth[:-1] == 1                                # tokens read directly under the root
    digits = tuple(sorted((ids[top & (ids < LISTOPS_FIRST_OP)] - 1).tolist()))
    return int(ids[0]) - LISTOPS_FIRST_OP, digits, int((top & is_op).sum())


def listops_subtree_values(ids):
    """The values of the root's arguments that are subtrees (evaluated here by a stack machine)."""
    stack, out = [], []
    for t in np.asarray(ids).tolist():
        if t < LISTOPS_FIRST_OP:
            if stack:
                stack[-1].append(t - 1)
        elif t < LISTOPS_END:
            stack.append([t - LISTOPS_FIRST_OP])
        else:
            op, *values = stack.pop()
            if stack:
                value = LISTOPS_FNS[op](values)
                stack[-1].append(value)
                if len(stack) == 1:
                    out.append(value)
    return out


def listops_top_digits_posterior(op, digits, m, q):
    """P(label | op, the root's digits, m subtrees) when the m subtree values are independent draws from q
    (10 probabilities): exact, by the order statistics of m draws (MIN, MAX), convolution (SM) or a walk over
    the values 0-9 that counts how many draws fall at or below each (MED)."""
    q = np.asarray(q, dtype=np.float64)
    p = np.zeros(10)
    if op is None or m == 0:
        p[digits[0] if op is None else LISTOPS_FNS[op](list(digits))] = 1.0
        return p
    at_least = np.concatenate([np.cumsum(q[::-1])[::-1], [0.0]])   # P(draw >= v), v = 0..10
    if op in (0, 1):                                         # MIN (MAX: the same on 9 - v)
        d = list(digits) if op == 0 else [9 - v for v in digits]
        s = at_least if op == 0 else np.concatenate([np.cumsum(q)[::-1], [0.0]])
        low = min(d) if d else 10
        for v in range(low):                                 # the draws' minimum is v < every digit
            p[v] = s[v] ** m - s[v + 1] ** m
        if low < 10:
            p[low] = s[low] ** m                             # every draw >= the smallest digit
        return p if op == 0 else p[::-1].copy()
    if op == 3:                                              # SM: sum mod 10
        p[sum(digits) % 10] = 1.0
        for _ in range(m):
            p = np.array([sum(p[(v - u) % 10] * q[u] for u in range(10)) for v in range(10)])
        return p
    k = len(digits) + m                                      # MED of k values: ranks r1 <= r2 (0-based)
    r1, r2 = (k - 1) // 2, k // 2
    below = np.cumsum(np.bincount(np.asarray(digits, dtype=np.int64), minlength=10))  # digits <= v
    states = {(0, -1): 1.0}                                  # (draws placed so far, value at rank r1 or -1) -> prob
    for v in range(10):
        pv = 1.0 if v == 9 else (q[v] / at_least[v] if at_least[v] > 0 else 0.0)  # a remaining draw equals v
        new = {}
        for (t, a), pr in states.items():
            rest = m - t
            for c in range(rest + 1):                        # c of the remaining draws equal v
                w = pr * math.comb(rest, c) * pv ** c * (1 - pv) ** (rest - c)
                if w == 0.0:
                    continue
                n = below[v] + t + c                         # values <= v
                a2 = v if a < 0 and n > r1 else a
                if n > r2:
                    p[(a2 + v) // 2] += w
                else:
                    new[(t + c, a2)] = new.get((t + c, a2), 0.0) + w
        states = new
    return p


def listops_baselines(train, /, fit=10_000, **splits):
    """Accuracy of three reference rules, fitted on `train` and scored on each named split:
        listops_baselines(task.split("train"), test=task.split("test"), val=task.split("val"))
        -> {"test": {"majority": 0.17, "top_operator": 0.37, "top_digits": 0.52}, "val": {...}}
    Splits are ClassificationSplits or lists of (tree, label) (LRA strings or token ids).
      majority     : the most frequent training label, for every tree.
      top_operator : sees only the root's operator; answers the most frequent training label among training
                     trees with that root operator.
      top_digits   : sees the root's operator, its digit arguments and how many (m) of its arguments are
                     subtrees, not what is inside them. Answers argmax_y P(y | operator, digits, m), where the
                     m subtree values are taken as independent draws from q, the distribution of the values of
                     root-level subtrees in the first `fit` training trees, and P is computed exactly.
    Ties go to the smallest label."""
    train = listops_examples(train)
    labels = np.array([y for _, y in train])
    tops = [listops_top(ids) for ids, _ in train]
    majority = int(np.argmax(np.bincount(labels, minlength=10)))
    by_op = {}
    for (op, _, _), y in zip(tops, labels):
        by_op.setdefault(op, []).append(y)
    op_rule = {op: int(np.argmax(np.bincount(ys, minlength=10))) for op, ys in by_op.items()}
    values = [v for ids, _ in train[:fit] for v in listops_subtree_values(ids)]
    q = np.bincount(values, minlength=10) / len(values) if values else np.full(10, 0.1)
    posterior = {}
    out = {}
    for name, split in splits.items():
        hits = {"majority": 0, "top_operator": 0, "top_digits": 0}
        examples = listops_examples(split)
        for ids, y in examples:
            op, digits, m = listops_top(ids)
            if (op, digits, m) not in posterior:
                posterior[op, digits, m] = int(np.argmax(listops_top_digits_posterior(op, digits, m, q)))
            hits["majority"] += y == majority
            hits["top_operator"] += y == op_rule.get(op, majority)
            hits["top_digits"] += y == posterior[op, digits, m]
        out[name] = {rule: n / max(len(examples), 1) for rule, n in hits.items()}
    return out
