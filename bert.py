"""BERT for the text tasks: a Hugging Face BERT folder's WordPiece (imdb and agnews with --tokenizer DIR), and its
config.json and weights for train.py --init_from_bert DIR (the model file maps them: simpletron.from_bert). Imports
data only, never tasks/ (tasks.text and tasks.sources import this file); every problem is a DataError."""

import hashlib
import json
import os

import numpy as np
import torch

from data import DataError, cached_dir, cls_task, file_problem, id_dtype, load_json, one_line, save_arrays, save_json


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


# ----------------------------------------------------------------------------------------------
# train.py --init_from_bert DIR (SimpleTRON's Section 5.3): a Hugging Face BERT folder's config.json and weights,
# read and checked here; simpletron.from_bert maps the weights onto the model.

# the shape is BERT's; the training defaults are BERT's fine-tuning (Devlin et al. 2019, A.3: AdamW lr 5e-5,
# batch 16, weight decay 0.01, 10% warm-up then decay; cosine to 0 here), 128 tokens
BERT_FINETUNE = dict(lr=5e-5, batch_size=16, weight_decay=0.01, warmup=100, schedule="cosine", min_lr=0.0,
                     max_iters=1000, eval_interval=250, block_size=128)
BERT_FOLDER = ("a Hugging Face BERT folder: config.json, model.safetensors or pytorch_model.bin, vocab.txt or "
               "tokenizer.json")
BERT_PIP = "--init_from_bert needs the safetensors and tokenizers packages: pip install safetensors tokenizers"


def read_bert(args, given):
    """--init_from_bert DIR: (config.json as a dict, the state dict). The task is then tokenised by DIR's WordPiece
    (--tokenizer DIR). Every problem is one DataError, before any work."""
    folder, model, task = args.init_from_bert, args.model or "simpletron", args.task or "listops"
    if model not in ("simpletron", "softmax"):
        raise DataError(f"--init_from_bert loads BERT into --model simpletron or softmax, not {model}")
    if task not in WORDPIECE_TASKS:
        raise DataError(f"--init_from_bert fine-tunes on the text tasks {', '.join(WORDPIECE_TASKS)}, not {task}")
    for flag in ("init_from", "transfer_from", "steps", "eval_only"):
        if flag in given and getattr(args, flag):
            raise DataError(f"--init_from_bert starts a new run from BERT's weights: drop --{flag}")
    if "tokenizer" in given and os.path.abspath(args.tokenizer) != os.path.abspath(folder):
        raise DataError(f"--init_from_bert tokenises with {folder}'s own WordPiece: drop --tokenizer")
    config = read_bert_config(folder)
    if not any(os.path.isfile(os.path.join(folder, f)) for f in ("vocab.txt", "tokenizer.json")):
        raise DataError(f"--init_from_bert {folder} has neither vocab.txt nor tokenizer.json; give {BERT_FOLDER}")
    try:
        import tokenizers  # noqa: F401  (the task's WordPiece, above)
    except ImportError:
        raise DataError(BERT_PIP) from None
    state_dict = read_bert_weights(folder)
    args.tokenizer = folder
    given.add("tokenizer")
    return config, state_dict


def read_bert_config(folder):
    """DIR/config.json, with the fields of BERT's shape."""
    if not os.path.isdir(folder):
        raise DataError(f"--init_from_bert {folder} is not a folder; give {BERT_FOLDER}")
    try:
        with open(os.path.join(folder, "config.json"), encoding="utf-8-sig") as f:
            config = json.load(f)
        need = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                "max_position_embeddings")
        missing = [k for k in need if k not in config]
    except (OSError, ValueError, TypeError, RecursionError) as e:
        raise DataError(f"--init_from_bert {folder}: cannot read config.json ({e}); give {BERT_FOLDER}") from None
    if missing:
        raise DataError(f"--init_from_bert {folder}: config.json has no {', '.join(missing)}: not a BERT config")
    bad = next((f"{k} {config[k]!r} (allowed: {allowed})" for k, test, allowed in (
        *[(k, lambda v: type(v) is int and v >= 1, "an integer >= 1") for k in need],
        ("layer_norm_eps", lambda v: type(v) in (int, float) and 0 < v < 1, "a number from 0 to 1"),
        ("hidden_dropout_prob", lambda v: type(v) in (int, float) and 0 <= v < 1, "a probability below 1"),
        *[(k, lambda v: isinstance(v, str), "a name") for k in ("hidden_act", "model_type")])
        if k in config and not test(config[k])), None)
    if bad:
        raise DataError(f"--init_from_bert {folder}: config.json's {bad}: not a BERT config")
    return config


def read_bert_weights(folder):
    """DIR/model.safetensors or, else, DIR/pytorch_model.bin: a state dict of tensors."""
    path = os.path.join(folder, "model.safetensors")
    for there in (os.path.join(folder, name) for name in ("model.safetensors", "pytorch_model.bin")):
        if os.path.lexists(there) and file_problem(there):   # a folder, a pipe, a broken link: not skipped
            raise DataError(f"--init_from_bert: {there} {file_problem(there)}")
    try:
        if os.path.isfile(path):
            try:
                import safetensors.torch
            except ImportError:
                raise DataError(BERT_PIP) from None
            state_dict = safetensors.torch.load_file(path)
        elif os.path.isfile(path := os.path.join(folder, "pytorch_model.bin")):
            state_dict = torch.load(path, map_location="cpu", weights_only=True)
        else:
            raise DataError(f"--init_from_bert {folder} has neither model.safetensors nor pytorch_model.bin; "
                            f"give {BERT_FOLDER}")
    except DataError:
        raise
    except Exception as e:
        raise DataError(f"--init_from_bert: cannot read {path} ({type(e).__name__}: {one_line(e, 200)})") from None
    if not isinstance(state_dict, dict) or not all(isinstance(v, torch.Tensor) for v in state_dict.values()):
        raise DataError(f"--init_from_bert: {path} is not a state dict of tensors")
    if not all(v.isfinite().all() for v in state_dict.values() if v.is_floating_point()):
        raise DataError(f"--init_from_bert: {path} holds a weight that is not finite (nan or inf); download it again")
    return state_dict


def bert_model(bert, overrides, device="cpu"):
    """The model of --init_from_bert: BERT's weights (bert: read_bert's pair), Config overrides on top (the
    model's own, e.g. attention="softmax", then the run's); on the meta device: a check alone."""
    import simpletron
    try:
        with torch.device(device):
            return simpletron.from_bert(bert[1], bert[0], **overrides)
    except (TypeError, ValueError) as e:
        raise DataError(f"--init_from_bert: {e}") from None
