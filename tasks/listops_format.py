"""
ListOps as Long Range Arena writes it: its 16 tokens, a tree as LRA's string and as token ids (either one gives
the other back), and LRA's release files basic_{train,val,test}.tsv (a header "Source<TAB>Target", then one
tree and its value per line), which train.py --data_dir reads and python -m tasks.listops --tsv writes.
MAX(2, 9) is written ( ( ( [MAX 2 ) 9 ) ] ) and read as the tokens [MAX 2 9 ].
"""

import contextlib
import glob
import hashlib
import os
import shutil

import numpy as np

from data import ClassificationSplit, DataError, atomic_write, cache_problem, cached_dir, one_line, reading


LISTOPS_OPS = ("[MIN", "[MAX", "[MED", "[SM")
LISTOPS_VOCAB = ("<pad>", "0", "1", "2", "3", "4", "5", "6", "7", "8", "9", *LISTOPS_OPS, "]")
LISTOPS_FIRST_OP = LISTOPS_VOCAB.index(LISTOPS_OPS[0])   # token ids: digit v is v + 1, operators 11-14, "]" 15
LISTOPS_END = LISTOPS_VOCAB.index("]")

_LISTOPS_CHARS = {"[MIN": "\x01", "[MAX": "\x02", "[MED": "\x03", "[SM": "\x04"}  # one character each
_LISTOPS_BYTES = tuple((op.encode(), ch.encode()) for op, ch in _LISTOPS_CHARS.items())
_LISTOPS_LUT = np.full(256, 255, dtype=np.uint8)
for _i, _tok in enumerate(LISTOPS_VOCAB[1:], start=1):
    _LISTOPS_LUT[ord(_LISTOPS_CHARS.get(_tok, _tok))] = _i


def listops_tokens(text):
    """LRA ListOps string (str or bytes) -> token ids (uint8). Drops "(" and ")" but keeps "]" as its own
    token. (LRA's official tokenizer dropped every bracket, "]" too, so the tree could not be read back: a
    known bug, LRA issues #6 and #14.) Raises ValueError on a symbol outside the 15 of ListOps."""
    raw = text.encode() if isinstance(text, str) else bytes(text)
    short = raw
    for op, ch in _LISTOPS_BYTES:
        short = short.replace(op, ch)
    toks = short.replace(b"(", b" ").replace(b")", b" ").split()
    chars = b"".join(toks)
    ids = _LISTOPS_LUT[np.frombuffer(chars, dtype=np.uint8)]
    if len(chars) != len(toks) or (ids == 255).any():       # a token longer than one symbol, or unknown
        bad = next(t for t in raw.replace(b"(", b" ").replace(b")", b" ").split()
                   if t.decode(errors="replace") not in LISTOPS_VOCAB[1:])
        raise ValueError(f"unknown symbol {bad.decode(errors='replace')!r}")
    return ids


def listops_string(ids):
    """The token ids of one whole tree -> LRA's string, the inverse of listops_tokens: an operator with k
    arguments is written as k + 1 opening parentheses, the operator, its arguments with " ) " between them,
    and " ) ] )", so that ( ( ( [MAX 2 ) 9 ) ] ) comes back byte for byte."""
    stack = [[]]                                             # the open operators, each with its arguments so far
    for t in np.asarray(ids).tolist():
        if t < LISTOPS_FIRST_OP:
            stack[-1].append(LISTOPS_VOCAB[t])
        elif t < LISTOPS_END:
            stack.append([LISTOPS_VOCAB[t]])
        else:
            op, *args = stack.pop()
            stack[-1].append("( " * (len(args) + 1) + op + " " + " ) ".join(args) + " ) ] )")
    return stack[0][0]


def listops_check_tree(ids):
    """Raises ValueError unless the token ids are one whole tree: a digit, or an operator, its arguments
    (at least one) and its "]", every operator closed and nothing after the root's "]"."""
    ids = np.asarray(ids)
    if len(ids) == 1 and ids[0] < LISTOPS_FIRST_OP:
        return
    is_op = (ids >= LISTOPS_FIRST_OP) & (ids < LISTOPS_END)
    if not is_op[0]:
        raise ValueError("the tree does not start with an operator")
    depth = np.cumsum(is_op.astype(np.int32) - (ids == LISTOPS_END))
    if depth[-1] > 0:
        raise ValueError(f"the tree is cut short: {depth[-1]} operator(s) not closed by ']'")
    if (depth[:-1] <= 0).any():
        raise ValueError("tokens after the root's closing ']'")
    if (is_op[:-1] & (ids[1:] == LISTOPS_END)).any():
        raise ValueError("an operator without arguments")


def listops_row(line):
    """One row of a TSV (bytes, its line break included) -> (token ids, label); ValueError says what is wrong."""
    try:
        line.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"byte 0x{line[e.start]:02x} at column {e.start + 1} is not UTF-8 text") from None
    parts = line.rstrip(b"\r\n").split(b"\t")
    if len(parts) != 2:
        raise ValueError(f"expected 2 tab-separated fields, found {len(parts)}")
    try:
        label = int(parts[1])
    except ValueError:
        raise ValueError(f"the label {parts[1].decode()!r} is not a digit 0-9") from None
    if not 0 <= label <= 9:
        raise ValueError(f"label {label} is not a digit 0-9")
    ids = listops_tokens(parts[0])
    if not len(ids):
        raise ValueError("empty expression")
    listops_check_tree(ids)
    return ids, label


def read_listops_arrays(path, fix="fix or remove that line", progress=False):
    """LRA's basic_*.tsv -> tokens (N, longest) uint8 padded with 0, lengths (N,) int32, labels (N,) int64.
    Any problem with the file is a DataError that names the file (and the line) and ends with `fix`, what to
    do about it."""
    from tqdm import tqdm
    if os.path.isdir(path):
        raise DataError(f"{path} is a folder where the ListOps file should be; {fix}")
    rows, labels, lineno = [], [], 0
    try:
        with open(path, "rb") as f, tqdm(total=os.path.getsize(path), unit="B", unit_scale=True, leave=False,
                                         desc=f"reading {os.path.basename(path)}",
                                         disable=None if progress else True) as bar:
            for lineno, line in enumerate(f, 1):
                bar.update(len(line))
                line = line.removeprefix(b"\xef\xbb\xbf") if lineno == 1 else line   # a byte-order mark
                if lineno == 1 and line.startswith(b"Source") or not line.strip():
                    continue
                try:
                    ids, label = listops_row(line)
                except ValueError as e:
                    raise DataError(f"{path}, line {lineno}: malformed ListOps row ({e}); {fix}") from None
                rows.append(ids)
                labels.append(label)
    except OSError as e:
        raise DataError(f"cannot read {path} ({one_line(e)}); {fix}") from None
    if not rows:
        what = "is empty" if lineno == 0 else "has no examples (only a header or blank lines)"
        raise DataError(f"{path} {what}: a ListOps TSV holds a header 'Source<TAB>Target' and one "
                        f"'tree<TAB>label' row per line; {fix}")
    lengths = np.fromiter(map(len, rows), dtype=np.int32, count=len(rows))
    tokens = np.zeros((len(rows), int(lengths.max())), dtype=np.uint8)
    for i, ids in enumerate(rows):
        tokens[i, :len(ids)] = ids
    return tokens, lengths, np.asarray(labels, dtype=np.int64)


def read_listops_tsv(path, block_size=None, fix="fix or remove that line"):
    """The split in an LRA basic_*.tsv, each example cut to its first block_size tokens."""
    tokens, lengths, labels = read_listops_arrays(path, fix)
    return ClassificationSplit(tokens, labels, lengths).truncate(block_size or tokens.shape[1])


LISTOPS_NPY_MIN_BYTES = 4 << 20   # TSVs from this size on are cached as arrays (smaller ones parse in < 0.2 s)


def listops_split(path, cache_dir, block_size=None, fix="fix or remove that line"):
    """read_listops_tsv through a binary cache: the TSV is parsed once into cache_dir/listops-npy/KEY/
    {tokens,lengths,labels}.npy, which later runs memory-map in a fraction of a second (the LRA train TSV
    takes ~20-40 s to parse). KEY names the TSV (its real path) and its version (size, mtime, inode), so a
    TSV that changes is parsed again; the stale arrays of that file are then removed. Small TSVs are
    parsed every time."""
    st = os.stat(path)
    if st.st_size < LISTOPS_NPY_MIN_BYTES:
        return read_listops_tsv(path, block_size, fix)
    name = hashlib.sha1(os.path.realpath(path).encode()).hexdigest()[:10]
    version = hashlib.sha1(f"{st.st_size}|{st.st_mtime_ns}|{st.st_ino}".encode()).hexdigest()[:10]
    root = os.path.join(cache_dir, "listops-npy")
    folder = os.path.join(root, f"{name}-{version}")
    names = ("tokens", "lengths", "labels")
    if os.path.isdir(folder) and cache_problem(folder) is None:      # cached, and whole: memory-mapped
        with reading(folder, "is damaged", f"; delete {folder} to parse the TSV again"):
            tokens, lengths, labels = (np.load(os.path.join(folder, f"{a}.npy"), mmap_mode="r" if a == "tokens" else
                                               None) for a in names)
    else:
        tokens, lengths, labels = arrays = read_listops_arrays(path, fix, progress=True)

        def build(tmp):
            for a, value in zip(names, arrays):
                np.save(os.path.join(tmp, f"{a}.npy"), value)
        with contextlib.suppress(DataError):                 # no cache (read-only, a full disk): the arrays serve
            cached_dir(folder, build)
            for old in glob.glob(os.path.join(root, f"{name}-*")):   # arrays of an older version of this TSV
                if old != folder and ".tmp" not in old:
                    shutil.rmtree(old, ignore_errors=True)
    return ClassificationSplit(tokens, labels, lengths).truncate(block_size or tokens.shape[1])


def listops_rows(split):
    """(LRA string, label) of every example of a ClassificationSplit, in order, one at a time."""
    for i in range(len(split)):
        yield listops_string(split.tokens[i, :split.lengths[i]]), int(split.labels[i])


def write_listops_tsv(path, examples):
    """LRA's basic_*.tsv from (string, label) pairs (any iterable: they are written as they come)."""
    def write(f):
        f.write("Source\tTarget\n")
        f.writelines(f"{s}\t{v}\n" for s, v in examples)
    atomic_write(path, write, mode="w")
