"""BERT for the text tasks: a Hugging Face BERT folder's WordPiece (imdb and agnews with --tokenizer DIR). Imports
data only, never tasks/ (tasks.text and tasks.sources import this file)."""

import hashlib
import os

import numpy as np

from data import DataError, cached_dir, cls_task, id_dtype, load_json, one_line, save_arrays, save_json


# BERT's WordPiece: imdb and agnews with --tokenizer DIR, a Hugging Face BERT folder (train.py --init_from_bert
# DIR sets it). Each text becomes [CLS] text [SEP] in BERT's own ids (no + 1: [PAD] is 0), truncated to the
# length with its [SEP] kept, 0-padded: the rows are cut when tokenised, so each length has its own cache.
# Lower-casing and accent stripping are the folder's own: tokenizer.json's normaliser, or else vocab.txt with
# tokenizer_config.json's do_lower_case / strip_accents (defaults True / as lower-casing, as BertTokenizer).
# Needs the tokenizers package (pip install safetensors tokenizers), imported only here.

WORDPIECE_TASKS = ("agnews", "imdb")


def wordpiece_tokenizer(folder, task_name):
    """The folder's WordPiece as a tokenizers.Tokenizer that adds [CLS] and [SEP], neither padding nor cutting."""
    try:
        import tokenizers
        from tokenizers import models, normalizers, pre_tokenizers, processors
    except ImportError:
        raise DataError(f"{task_name}: --tokenizer {folder} (BERT's WordPiece) needs the tokenizers package: "
                        "pip install safetensors tokenizers") from None
    json_path, vocab_path = os.path.join(folder, "tokenizer.json"), os.path.join(folder, "vocab.txt")
    if not (os.path.isfile(json_path) or os.path.isfile(vocab_path)):
        raise DataError(f"{task_name}: --tokenizer {folder} has neither tokenizer.json nor vocab.txt (a Hugging "
                        "Face BERT folder has one)")
    try:
        if os.path.isfile(json_path):
            tok = tokenizers.Tokenizer.from_file(json_path)
        else:
            cfg_path = os.path.join(folder, "tokenizer_config.json")
            cfg = load_json(cfg_path) if os.path.isfile(cfg_path) else {}
            tok = tokenizers.Tokenizer(models.WordPiece(models.WordPiece.read_file(vocab_path), unk_token="[UNK]"))
            tok.normalizer = normalizers.BertNormalizer(
                clean_text=True, handle_chinese_chars=cfg.get("tokenize_chinese_chars", True),
                strip_accents=cfg.get("strip_accents"), lowercase=cfg.get("do_lower_case", True))
            tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    except Exception as e:                                   # tokenizers raises its own Exception types
        raise DataError(f"{task_name}: cannot read BERT's tokenizer in {folder} ({one_line(e, 200)})") from None
    special = {t: tok.token_to_id(t) for t in ("[PAD]", "[CLS]", "[SEP]")}
    if special["[PAD]"] != 0 or None in special.values():
        raise DataError(f"{task_name}: the tokenizer in {folder} needs [PAD] = 0, [CLS] and [SEP] (found {special})")
    tok.post_processor = processors.BertProcessing(("[SEP]", special["[SEP]"]), ("[CLS]", special["[CLS]"]))
    tok.no_padding()
    tok.no_truncation()
    return tok


def wordpiece_rows(tok, texts, length, chunk=4096):
    """Texts -> (N, length) ids [CLS] ... [SEP] 0 ..., each cut to `length` tokens with [CLS] and [SEP] kept."""
    tok.enable_truncation(max_length=length)                 # room for [CLS] and [SEP] is kept by tokenizers
    out = np.zeros((len(texts), length), dtype=id_dtype(tok.get_vocab_size()))
    for start in range(0, len(texts), chunk):
        for i, e in enumerate(tok.encode_batch(list(texts[start:start + chunk])), start):
            out[i, :len(e.ids)] = e.ids
    return out


def wordpiece_cls_task(name, cache_dir, key, read, folder, block_size, n_classes, splits):
    tok = wordpiece_tokenizer(folder, name)
    if block_size < 3:
        raise DataError(f"{name}: BERT's rows need block_size >= 3 ([CLS] text [SEP]), not {block_size}")
    tag = "wordpiece-" + hashlib.sha1(tok.to_str().encode()).hexdigest()[:10]  # follows vocabulary and casing
    cache = os.path.join(cache_dir, name, f"{key}-{tag}-L{block_size}")
    if not os.path.isdir(cache):
        def build(out):
            texts_by_split = read()
            print(f"{name}: tokenising with BERT's WordPiece from {folder} ...", flush=True)
            for split, (texts, labels) in texts_by_split.items():
                tokens = wordpiece_rows(tok, texts, block_size)
                save_arrays(out, split, tokens=tokens, labels=np.asarray(labels, np.uint8),
                            lengths=(tokens != 0).sum(-1).astype(np.int32))
            save_json(os.path.join(out, "meta.json"), {"tokenizer": folder, "vocab_size": tok.get_vocab_size()})

        cached_dir(cache, build, f"{name}: tokenised with BERT's WordPiece")
    vocab_size = load_json(os.path.join(cache, "meta.json"))["vocab_size"]
    return cls_task(name, "cls", cache, vocab_size, block_size, n_classes, 0, splits)
