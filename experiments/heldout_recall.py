"""
Held-out recall examples from a second, separately written generator, for checking that a model has learned the
task's definition and not some accident of tasks/recall.py's draws:

    python experiments/heldout_recall.py mqar --recall_len 64 --recall_pairs 4 --recall_vocab 128 --n 2000 --out DIR
    python train.py --init_from out/RUN/ckpt.pt --eval_only --data_dir DIR/test.txt

It reads the definitions (docs/recall.md), not tasks/recall.py: Python's own random module (Mersenne Twister, seeded
by --seed and the task's name), one example at a time in plain loops, the query slots of MQAR drawn one after the
other by walking the cumulative weights of the slots still free, and its own writer of the plain format
(docs/tasks.md). It writes DIR/test.txt and prints how many answers there are and where.
"""

import argparse
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import data  # noqa: E402  (only for the one-line errors; the generator is below)
from tasks.recall import RECALL_MOST_BYTES, RECALL_MOST_LEN  # noqa: E402  (train.py's bounds, which read the file)


def mqar_example(rnd, length, pairs, vocab, power_a=0.01):
    half = vocab // 2
    keys = rnd.sample(range(1, half), pairs)                 # distinct keys from the lower half
    values = rnd.sample(range(half, vocab), pairs)           # distinct values from the upper half
    x = [rnd.randrange(1, vocab) for _ in range(length)]     # filler: any id but padding
    y = [None] * length
    for i in range(pairs):
        x[2 * i], x[2 * i + 1] = keys[i], values[i]
    free = list(range((length - 2 * pairs) // 2))            # query slots of two tokens after the pairs
    for i in range(pairs):                                   # pair i asks its key at the i-th slot drawn
        weights = [(g + 1) ** (power_a - 1) for g in free]
        r, acc = rnd.random() * sum(weights), 0.0
        for j, w in enumerate(weights):
            acc += w
            if r < acc or j == len(free) - 1:
                break
        slot = free.pop(j)
        x[2 * pairs + 2 * slot], y[2 * pairs + 2 * slot] = keys[i], values[i]
    return x, y


def copy_example(rnd, length, tokens, vocab, noise=1, marker=2):
    region = length - tokens
    data = [rnd.randrange(3, vocab) for _ in range(tokens)]
    spots = sorted(rnd.sample(range(region), tokens))
    x = [noise] * region + [marker] + data[:-1]
    for spot, token in zip(spots, data):
        x[spot] = token
    y = [None] * region + data
    return x, y


def induction_example(rnd, length, vocab, trigger=1):
    x = [rnd.randrange(2, vocab) for _ in range(length)]
    first = rnd.randrange(0, length - 2)
    x[first] = x[-1] = trigger
    y = [None] * length
    y[-1] = x[first + 1]
    return x, y


class Parser(data.Parser):
    def error(self, message):                                # (one line, not a usage dump)
        raise data.DataError(f"{message} (python experiments/heldout_recall.py --help lists the flags)")


def check(a):
    """Every setting before any work, one line each saying what is allowed."""
    if a.n < 1:
        raise data.DataError(f"--n {a.n}: allowed is a number of examples of at least 1")
    if a.task == "induction" and a.recall_pairs is not None:
        raise data.DataError("--recall_pairs: induction has no pairs or data tokens (its one answer follows the "
                             "trigger); leave it out")
    pairs = 4 if a.recall_pairs is None else a.recall_pairs
    vocab = (128 if a.task == "mqar" else 16) if a.recall_vocab is None else a.recall_vocab
    if pairs < 1:
        raise data.DataError(f"--recall_pairs {pairs}: allowed is an integer >= 1")
    if vocab > 65535:
        raise data.DataError(f"--recall_vocab {vocab}: allowed is at most 65535 (as train.py's recall tasks)")
    if a.recall_len > RECALL_MOST_LEN:
        raise data.DataError(f"--recall_len {a.recall_len}: allowed is at most {RECALL_MOST_LEN:,} tokens (as "
                             "train.py's recall tasks, which read these examples)")
    if 16 * a.n * a.recall_len > RECALL_MOST_BYTES:          # (train.py holds them as int64 inputs and targets)
        raise data.DataError(f"--n {a.n} examples of {a.recall_len} tokens: allowed are {RECALL_MOST_BYTES / 2**30:g} "
                             "GiB of examples (examples x tokens x 16 bytes: train.py's bound on its recall tasks' "
                             "arrays) at most; 3,000 of 64 tokens take 3 MiB")
    min_len, min_vocab, what = {"mqar": (4 * pairs, 2 * pairs + 2, f"{pairs} pairs"),
                                "copy": (2 * pairs + 1, 4, f"{pairs} data tokens"),
                                "induction": (3, 3, "its trigger")}[a.task]
    if a.recall_len < min_len or vocab < min_vocab:
        raise data.DataError(f"{a.task}: {what} need --recall_len >= {min_len} and --recall_vocab >= {min_vocab} "
                             f"(given {a.recall_len} and {vocab})")
    return pairs, vocab


def main(argv=None):
    p = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("task", choices=("mqar", "copy", "induction"))
    p.add_argument("--recall_len", type=int, default=64)
    p.add_argument("--recall_pairs", type=int, default=None, help="mqar: pairs; copy: data tokens (default 4)")
    p.add_argument("--recall_vocab", type=int, default=None, help="default: mqar 128, copy and induction 16")
    p.add_argument("--n", type=int, default=2000)
    p.add_argument("--seed", type=int, default=2026)
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    pairs, vocab = check(a)
    rnd = random.Random(f"{a.task}-{a.seed}")
    make = {"mqar": lambda: mqar_example(rnd, a.recall_len, pairs, vocab),
            "copy": lambda: copy_example(rnd, a.recall_len, pairs, vocab),
            "induction": lambda: induction_example(rnd, a.recall_len, vocab)}[a.task]
    os.makedirs(a.out, exist_ok=True)
    path = os.path.join(a.out, "test.txt")
    answers = 0
    try:
        with open(path + ".tmp", "w") as f:
            for _ in range(a.n):
                x, y = make()
                answers += sum(t is not None for t in y)
                f.write(" ".join(map(str, x)) + "\t" + " ".join("-" if t is None else str(t) for t in y) + "\n")
        os.replace(path + ".tmp", path)
    finally:
        if os.path.exists(path + ".tmp"):                    # (stopped: no half-written file left)
            os.remove(path + ".tmp")
    print(f"{a.task}: {a.n} examples of {a.recall_len} tokens, {answers} answers, vocabulary {vocab}: {path}")


if __name__ == "__main__":
    data.run_main(main)
