"""
Where data comes from besides --data_dir: Hugging Face datasets and tiktoken, through their public settings
only, and the tokenizers (--tokenizer): byte (built here), a tiktoken encoding, or, for imdb and agnews, a BERT
folder (bert.py). Without network (probed once per host, `reachable`) only the local caches are read.
"""

import os
import threading
import urllib.error
import urllib.parse
import urllib.request

from bert import WORDPIECE_TASKS
from data import DataError, one_line


def in_thread(fn, seconds):
    """fn() in a daemon thread, waited for `seconds` at most: (the thread, [what fn returned or raised], empty
    while it runs). So that neither DNS, nor a silent firewall, nor a download without a time limit can hang
    the caller."""
    got = []

    def run():
        try:
            got.append(fn())
        except Exception as e:
            got.append(e)
    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    return t, got


def answers(url, timeout):
    """True if `url` answers at all (any HTTP status counts); raises if it does not."""
    try:
        urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=timeout).close()
    except urllib.error.HTTPError:                           # the server answered
        pass
    return True


_REACHABLE = {}


def reachable(url, timeout=3.0):
    """Whether `url` answers within `timeout` seconds. Asked once per host."""
    host = urllib.parse.urlsplit(url).netloc
    if host not in _REACHABLE:
        _, got = in_thread(lambda: answers(url, timeout), timeout + 1)
        _REACHABLE[host] = got == [True]
    return _REACHABLE[host]


def _truthy(name):
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def hf_dataset(path, config=None, parquet_dir=None):
    """datasets.load_dataset(path, config): a DatasetDict. Without network (no answer from the Hub within
    seconds, or HF_HUB_OFFLINE=1) only the local Hugging Face cache is read, so this fails fast: the libraries'
    own offline switches, HF_HUB_OFFLINE and HF_DATASETS_OFFLINE, are set before `datasets` is imported (they
    are read then; a process that imported it earlier keeps its setting). Datasets that still carry a loading
    script (unsupported since datasets 4) are read from the Hub's parquet conversion (revision
    refs/convert/parquet, folder parquet_dir). The tests replace this function."""
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    online = not (_truthy("HF_HUB_OFFLINE") or _truthy("HF_DATASETS_OFFLINE")) and reachable(endpoint)
    if not online:
        os.environ["HF_HUB_OFFLINE"] = os.environ["HF_DATASETS_OFFLINE"] = "1"
    try:
        import datasets
    except ImportError:
        raise DataError("the datasets package is not installed (pip install datasets)") from None
    try:
        return datasets.load_dataset(path, config)
    except Exception as e:
        if not (online and parquet_dir and "script" in str(e).lower()):
            raise DataError(one_line(e, 200) if online else "no network and not in the Hugging Face cache") from None
    try:
        return datasets.load_dataset(path, revision="refs/convert/parquet", data_dir=parquet_dir)
    except Exception as e:
        raise DataError(one_line(e, 200)) from None


def load_hf(task_name, layout, path, config=None, parquet_dir=None):
    """hf_dataset(...) with failures turned into the task's one-line DataError."""
    name = path + (f" ({config})" if config else "")
    try:
        return hf_dataset(path, config, parquet_dir)
    except DataError as e:
        raise DataError(f"{task_name}: tried Hugging Face dataset {name}: {e}; instead pass --data_dir "
                        f"{layout}") from None


def hf_rows(ds, columns, batch_size=1000):
    """The columns of a Hugging Face dataset split, batch after batch, as lists."""
    missing = [c for c in columns if c not in ds.column_names]
    if missing:
        raise DataError(f"the Hugging Face dataset has no column {missing[0]!r} (it has {', '.join(ds.column_names)})")
    for batch in ds.select_columns(columns).iter(batch_size=batch_size):
        yield [batch[c] for c in columns]


def hf_columns(ds, columns):
    out = [[] for _ in columns]
    for batch in hf_rows(ds, columns):
        for o, b in zip(out, batch):
            o += b
    return out


def hf_split(dd, names, task_name):
    for name in names:
        if name in dd:
            return dd[name]
    raise DataError(f"{task_name}: the Hugging Face dataset has no {names[0]} split (it has {', '.join(dd)})")


# Tokenizers. gpt2's pre-tokenisation regex (tiktoken's), so that "byte" splits text as gpt2 does.
GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
TIKTOKEN_URL = "https://openaipublic.blob.core.windows.net"


def byte_encoding():
    """A byte-level tiktoken Encoding, built here (no download): ids 0-255 are the bytes, 256 <|endoftext|>."""
    import tiktoken
    return tiktoken.Encoding(name="byte", pat_str=GPT2_PATTERN,
                             mergeable_ranks={bytes([i]): i for i in range(256)},
                             special_tokens={"<|endoftext|>": 256})


def check_tokenizer(name, task_name):
    """A DataError unless --tokenizer NAME exists for the task (nothing is loaded): byte, char (textfile, ptb)
    or a tiktoken encoding."""
    if name == "char" and task_name in ("textfile", "ptb") or name == "byte":
        return
    if os.path.isdir(name):                                  # a BERT folder: checked when its WordPiece loads
        if task_name not in WORDPIECE_TASKS:
            raise DataError(f"{task_name}: --tokenizer {name} is a folder (a BERT WordPiece); only "
                            f"{', '.join(WORDPIECE_TASKS)} take one")
        return
    try:
        import tiktoken
    except ImportError:
        raise DataError(f"{task_name}: --tokenizer {name} needs tiktoken (pip install tiktoken)") from None
    names = tiktoken.list_encoding_names()
    if name not in names:
        raise DataError(f"{task_name}: unknown --tokenizer {name!r}; choose byte, char (--task textfile or ptb) or a "
                        f"tiktoken encoding ({', '.join(names)})")


def get_tokenizer(name, task_name):
    """--tokenizer NAME as a tiktoken Encoding: byte, or a tiktoken encoding (gpt2, cl100k_base, ...), whose
    files tiktoken reads from its cache (TIKTOKEN_CACHE_DIR) or downloads once. tiktoken's download has no
    time limit, so it runs in a thread, given up when the network does not answer."""
    check_tokenizer(name, task_name)
    if name == "byte":
        return byte_encoding()
    import tiktoken
    t, got = in_thread(lambda: tiktoken.get_encoding(name), 10)     # a cached encoding loads in about a second
    if t.is_alive() and reachable(TIKTOKEN_URL):             # a slow download: wait for it
        t.join()
    if got and not isinstance(got[0], Exception):
        return got[0]
    why = ("it is not cached here and there is no network" if not reachable(TIKTOKEN_URL)
           else one_line(got[0], 200) if got else "the download does not finish")
    # (sample.py and analyze.py call this too, with the run's tokenizer: they have no --tokenizer to give)
    raise DataError(f"{task_name}: cannot load the {name} tokenizer ({why}; tiktoken downloads it once from "
                    f"{TIKTOKEN_URL} into TIKTOKEN_CACHE_DIR): connect once, or set TIKTOKEN_CACHE_DIR to a folder "
                    "that holds it; a new run started with train.py --tokenizer byte needs no download")


def encode_batch(enc, texts):
    return enc.encode_ordinary_batch(list(texts), num_threads=max(1, min(8, os.cpu_count() or 1)))
