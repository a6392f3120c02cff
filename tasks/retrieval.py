"""
Retrieval: LRA's AAN task (Radev et al. 2013): do two papers cite one another? Pairs of documents,
byte-level (the first 4,000 bytes of each, + 1), one shared encoder on both (the "match" head).
LRA's files new_aan_pairs.{train,eval,test}.tsv: no header, tab-separated label, id1, id2, text1, text2.
147,086 / 18,090 / 17,437 pairs: stored as uint8 memmaps (1.2 GB for train), never loaded whole. The
documents are bytes: any byte is a token, as in LRA.
"""

import os

import numpy as np

from data import DataError, cached_dir, cls_task, prepare_main, reading, release, source_key, task


AAN_LAYOUT = ("DIR with LRA's AAN pairs (lra_release.gz): DIR/new_aan_pairs.train.tsv, new_aan_pairs.eval.tsv, "
              "new_aan_pairs.test.tsv, tab-separated label, id1, id2, text1, text2 (DIR may also hold tsv_data/ "
              "or lra_release/)")
AAN_FILES = {"train": "new_aan_pairs.train.tsv", "val": "new_aan_pairs.eval.tsv", "test": "new_aan_pairs.test.tsv"}


def read_aan(path, out, split, length):
    with reading(path):
        with open(path, "rb") as f:
            n = sum(1 for line in f if line.strip())
        if n == 0:
            raise DataError(f"{path} holds no pairs")
        tokens = np.lib.format.open_memmap(os.path.join(out, f"{split}.tokens.npy"), mode="w+", dtype=np.uint8,
                                           shape=(n, 2, length))
        lengths = np.zeros((n, 2), np.int32)
        labels = np.zeros(n, np.uint8)
        i = 0
        with open(path, "rb") as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                fields = line.rstrip(b"\r\n").split(b"\t")
                try:
                    if len(fields) != 5:
                        raise ValueError(f"expected 5 tab-separated fields, found {len(fields)}")
                    label = float(fields[0])
                    if label not in (0.0, 1.0):
                        raise ValueError(f"label {fields[0].decode(errors='replace')} is not 0 or 1")
                    if (j := next((j for j in (0, 1) if not fields[3 + j]), None)) is not None:   # (nothing to pool)
                        name = fields[1 + j].decode(errors="replace")[:40]
                        raise ValueError(f"text{j + 1} (id{j + 1} {name}) is empty; each document needs at least "
                                         "one byte")
                except ValueError as e:
                    raise DataError(f"{path}, line {lineno}: malformed AAN row ({e})") from None
                labels[i] = int(label)
                for j, doc in enumerate(fields[3:]):
                    doc = doc[:length]
                    tokens[i, j, :len(doc)] = np.frombuffer(doc, dtype=np.uint8)
                    lengths[i, j] = len(doc)
                i += 1
        tokens.flush()
        del tokens
    np.save(os.path.join(out, f"{split}.labels.npy"), labels)
    np.save(os.path.join(out, f"{split}.lengths.npy"), lengths)


@task("retrieval")
def retrieval(cache_dir="data", data_dir=None, block_size=4000, **_):
    if data_dir is None:
        raise DataError("retrieval: the AAN pairs come only with LRA's release (https://storage.googleapis.com/"
                        f"long-range-arena/lra_release.gz, 7.7 GB, unpack it); pass --data_dir {AAN_LAYOUT}")
    sub = ["tsv_data", "lra_release/tsv_data", "lra_release/lra_release/tsv_data"]
    folder, found = release("retrieval", data_dir, f"use {AAN_LAYOUT}", (), sub, AAN_FILES.values())
    files = {s: found[name] for s, name in AAN_FILES.items() if found[name]}
    length = max(block_size, 4000)

    def build(out):
        for split, path in files.items():
            read_aan(path, out, split, length)

    out = cached_dir(os.path.join(cache_dir, "retrieval", f"{source_key(files.values())}-L{length}"), build,
                     f"retrieval: reading the AAN pairs in {folder}")
    task = cls_task("retrieval", "match", out, 257, block_size, 2, 1, {s: s for s in files})
    task.missing = {s: f"retrieval: no {name} in {folder}" for s, name in AAN_FILES.items() if s not in files}
    return task


if __name__ == "__main__":                                   # python -m tasks.retrieval: prepare its files alone
    prepare_main("tasks.retrieval")
