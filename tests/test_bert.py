"""BERT's weights in SimpleTRON (Section 5.3): from_bert against a BERT forward written here, BERT's WordPiece
on a hand-worked case, and train.py --init_from_bert end to end on a tiny BERT folder written here."""

import json
import math
import re
import sys
import types

import pytest
import torch

import bert
import data
import simpletron as st
import runsetup
import train

V, D, H, N_LAYERS, FFN, P = 30, 16, 4, 2, 40, 24     # FFN 40 = 2.5 D: not a multiple of the width
CONFIG = dict(architectures=["BertModel"], model_type="bert", vocab_size=V, hidden_size=D, num_hidden_layers=N_LAYERS,
              num_attention_heads=H, intermediate_size=FFN, hidden_act="gelu", max_position_embeddings=P,
              type_vocab_size=2, layer_norm_eps=1e-12, hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1,
              pad_token_id=0, position_embedding_type="absolute")
# BERT's ids: [PAD] 0, [UNK] 1, [CLS] 2, [SEP] 3; the rest words
CLS, SEP = 2, 3
IDS = torch.tensor([[CLS, 7, 12, 5, 29, 8, 11, SEP],
                    [CLS, 9, SEP, 0, 0, 0, 0, 0],         # padded: keys 3.. must be masked out
                    [CLS, 4, 4, 21, SEP, 0, 0, 0]])


def bert_state_dict(seed=0, prefix="", dtype=torch.float32):
    """A random BertModel state dict, every weight far from its initial value (LayerNorm gains too), with the
    buffers, pooler and MLM head of a real checkpoint."""
    g = torch.Generator().manual_seed(seed)

    def r(*shape, scale=0.3):
        return torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype) * scale

    sd = {"embeddings.word_embeddings.weight": r(V, D, scale=1.0),
          "embeddings.position_embeddings.weight": r(P, D),
          "embeddings.token_type_embeddings.weight": r(2, D),
          "embeddings.LayerNorm.weight": 1 + r(D), "embeddings.LayerNorm.bias": r(D),
          "embeddings.position_ids": torch.arange(P)[None],
          "embeddings.token_type_ids": torch.zeros(1, P, dtype=torch.long)}
    for i in range(N_LAYERS):
        p = f"encoder.layer.{i}."
        for name, (n_out, n_in) in {"attention.self.query": (D, D), "attention.self.key": (D, D),
                                    "attention.self.value": (D, D), "attention.output.dense": (D, D),
                                    "intermediate.dense": (FFN, D), "output.dense": (D, FFN)}.items():
            sd[p + name + ".weight"], sd[p + name + ".bias"] = r(n_out, n_in, scale=1 / math.sqrt(n_in)), r(n_out)
        for name in ("attention.output.LayerNorm", "output.LayerNorm"):
            sd[p + name + ".weight"], sd[p + name + ".bias"] = 1 + r(D), r(D)
    sd.update({"pooler.dense.weight": r(D, D), "pooler.dense.bias": r(D)})
    sd = {prefix + k: v for k, v in sd.items()}
    if prefix:                                               # BertForPreTraining's heads, outside bert.*
        sd.update({"cls.predictions.bias": r(V), "cls.seq_relationship.weight": r(2, D)})
    return sd


def bert_reference(sd, ids, n_layers=N_LAYERS, attention="softmax", extra_skip=False):
    """BERT's encoder written out in float64, one head and one example at a time (Devlin et al. 2019; Hugging
    Face's BertModel in eval mode). attention="simple": SimpleTRON's Q (K^T V) / sqrt(n) over the n real tokens."""
    w = {k.removeprefix("bert."): v.double() for k, v in sd.items()}
    eps, d = CONFIG["layer_norm_eps"], D // H

    def layer_norm(x, name):
        mean = x.mean(-1, keepdim=True)
        var = ((x - mean) ** 2).mean(-1, keepdim=True)
        return (x - mean) / torch.sqrt(var + eps) * w[name + ".weight"] + w[name + ".bias"]

    def linear(x, name):
        return x @ w[name + ".weight"].T + w[name + ".bias"]

    def gelu(x):                                             # erf GELU
        return 0.5 * x * (1 + torch.erf(x / math.sqrt(2)))

    out = []
    for row in ids:
        n = int((row != 0).sum())                            # the real tokens; padding comes last
        L = len(row)
        x = (w["embeddings.word_embeddings.weight"][row] + w["embeddings.position_embeddings.weight"][:L]
             + w["embeddings.token_type_embeddings.weight"][0])
        x = layer_norm(x, "embeddings.LayerNorm")
        for i in range(n_layers):
            p = f"encoder.layer.{i}."
            q, k, v = (linear(x, p + f"attention.self.{m}") for m in ("query", "key", "value"))
            heads = []
            for h in range(H):
                qh, kh, vh = (z[:, h * d:(h + 1) * d] for z in (q, k, v))
                if attention == "softmax":
                    scores = qh @ kh[:n].T / math.sqrt(d)    # (L, n): padded keys left out
                    heads.append(torch.exp(scores - scores.max(1, keepdim=True).values)
                                 / torch.exp(scores - scores.max(1, keepdim=True).values).sum(1, keepdim=True) @ vh[:n])
                else:
                    heads.append(qh @ (kh[:n].T @ vh[:n]) / math.sqrt(n))
            a = linear(torch.cat(heads, 1), p + "attention.output.dense")
            h1 = layer_norm(x + a, p + "attention.output.LayerNorm")
            h2 = layer_norm(h1 + linear(gelu(linear(h1, p + "intermediate.dense")), p + "output.dense"),
                            p + "output.LayerNorm")
            x = h2 + x if extra_skip else h2
        out.append(x)
    return torch.stack(out)                                  # (B, L, D), no final LayerNorm


def real(h):
    return h[IDS != 0]                                       # (tokens, D) at the real tokens


def from_bert64(sd, **overrides):
    """from_bert in float64 throughout (a float64 state dict, float64 parameters): the tests' tight checks."""
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        return st.from_bert({k: v.double() if v.is_floating_point() else v for k, v in sd.items()}, CONFIG,
                            **overrides).eval()
    finally:
        torch.set_default_dtype(default)


@pytest.mark.parametrize("prefix", ["", "bert."])
def test_from_bert_softmax_is_bert(prefix):
    sd = bert_state_dict(prefix=prefix)
    ref = bert_reference(sd, IDS)
    model = st.from_bert(sd, CONFIG, attention="softmax").eval()
    assert model.config.dropout == 0.1 and model.config.layer_norm_eps == 1e-12
    model64 = from_bert64(sd, attention="softmax")
    with torch.no_grad():
        h32, mask = model.encode(IDS)
        h64, _ = model64.encode(IDS)
        logits, _ = model64(IDS)
    assert torch.equal(mask, IDS != 0)                       # BERT's own [CLS]: no token prepended
    assert (real(h32).double() - real(ref)).abs().max() < 1e-4  # float32, the must-show tolerance
    torch.testing.assert_close(real(h64), real(ref), rtol=1e-10, atol=1e-10)
    # the cls head reads BERT's [CLS] state, position 0
    torch.testing.assert_close(logits, model64.classifier(ref[:, 0]), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("variant, extra_skip", [("vanilla", False), ("resl", True)])
def test_from_bert_simple_attention_is_simpletron_on_berts_weights(variant, extra_skip):
    sd = bert_state_dict(seed=1)
    model = from_bert64(sd, variant=variant)                 # attention="simple" by default
    assert model.config.attention == "simple"
    with torch.no_grad():
        h, _ = model.encode(IDS)
    ref = bert_reference(sd, IDS, attention="simple", extra_skip=extra_skip)
    torch.testing.assert_close(real(h), real(ref), rtol=1e-10, atol=1e-10)


def test_from_bert_keeps_the_first_layers_and_positions():
    sd = bert_state_dict(seed=2, prefix="bert.")
    model = from_bert64(sd, attention="softmax", n_layer=1, block_size=IDS.shape[1])
    assert len(model.blocks) == 1 and model.wpe.weight.shape == (IDS.shape[1], D)
    with torch.no_grad():
        h, _ = model.encode(IDS)
    torch.testing.assert_close(real(h), real(bert_reference(sd, IDS, n_layers=1)), rtol=1e-10, atol=1e-10)


def test_from_bert_refuses_what_it_cannot_load():
    sd = bert_state_dict()
    with pytest.raises(ValueError, match="n_embd is BERT's own"):
        st.from_bert(sd, CONFIG, n_embd=32)
    with pytest.raises(ValueError, match="hidden_act"):
        st.from_bert(sd, {**CONFIG, "hidden_act": "relu"})
    with pytest.raises(ValueError, match="no encoder.layer.1.output.dense.bias"):
        st.from_bert({k: v for k, v in sd.items() if k != "encoder.layer.1.output.dense.bias"}, CONFIG)
    with pytest.raises(ValueError, match="word_embeddings"):
        st.from_bert(sd, {**CONFIG, "vocab_size": V + 1})
    for bad in (dict(head="lm"), dict(norm="pre"), dict(orthogonal=True)):   # each alone is refused
        with pytest.raises(ValueError, match="post-LN encoder"):
            st.from_bert(sd, CONFIG, **bad)
    P_max = CONFIG["max_position_embeddings"]
    for bad in (0, P_max + 1, 9999):                          # 1 to max_position_embeddings positions
        with pytest.raises(ValueError, match=f"block_size {bad}: this BERT has {P_max} positions"):
            st.from_bert(sd, CONFIG, block_size=bad)
    for n in (1, P_max):                                     # both ends kept: the [CLS] alone, every position
        assert st.from_bert(sd, CONFIG, block_size=n).config.block_size == n
    for n in (0, 3):
        with pytest.raises(ValueError, match=f"n_layer {n}: this BERT has 2 layers"):
            st.from_bert(sd, CONFIG, n_layer=n)
    assert st.from_bert(sd, CONFIG, n_layer=1).config.n_layer == 1


# ----------------------------------------------------------------------------------------------
# A tiny BERT folder, as Hugging Face writes it

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "sat", "on", "mat", "un", "##aff", "##able",
         "hello", "world", "##s", ",", ".", "!", "cafe", "stocks", "fell", "team", "won", "new", "chip", "game",
         "##ing", "market", "sun"]
assert len(VOCAB) == V


def bert_folder(path, safetensors=False, lower_case=None, seed=0, prefix=""):
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(CONFIG))
    (path / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    if lower_case is not None:
        (path / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": lower_case}))
    sd = bert_state_dict(seed=seed, prefix=prefix)
    if safetensors:
        from safetensors.torch import save_file
        save_file({k: v.contiguous() for k, v in sd.items()}, str(path / "model.safetensors"))
    else:
        torch.save(sd, path / "pytorch_model.bin")
    return path, sd


def test_wordpiece_as_bert_does(tmp_path):
    pytest.importorskip("tokenizers")
    folder, _ = bert_folder(tmp_path / "bert")
    tok = bert.wordpiece_tokenizer(str(folder), "test")
    texts = ["The CAT sat, unaffable!", "Héllo worlds zebra", "the the the the the the"]
    # lower-cased, accents stripped; "unaffable" -> un ##aff ##able; "worlds" -> world ##s; unknown -> [UNK] 1
    rows = bert.wordpiece_rows(tok, texts, 8)
    assert rows.tolist() == [[2, 5, 6, 7, 16, 10, 11, 3],     # cut to 8, [SEP] kept: ##able ! dropped
                             [2, 13, 14, 15, 1, 3, 0, 0],
                             [2, 5, 5, 5, 5, 5, 5, 3]]
    # the folder's own casing: do_lower_case false keeps "The", "CAT", which this vocabulary does not hold
    cased, _ = bert_folder(tmp_path / "cased", lower_case=False)
    assert bert.wordpiece_rows(bert.wordpiece_tokenizer(str(cased), "test"), texts[:1], 8).tolist() == \
        [[2, 1, 1, 7, 16, 10, 11, 3]]
    # a tokenizer.json (preferred to vocab.txt) gives the same ids
    tok.save(str(tmp_path / "bert" / "tokenizer.json"))
    (tmp_path / "bert" / "vocab.txt").unlink()
    assert (bert.wordpiece_rows(bert.wordpiece_tokenizer(str(folder), "test"), texts, 8) == rows).all()


def write_agnews(folder, n=40):
    folder.mkdir(parents=True, exist_ok=True)
    words = ["the cat sat on the mat", "stocks fell, market", "team won the game", "new chip sun"]
    rows = [f'"{i % 4 + 1}","{words[i % 4].split()[0]} {i}","{words[i % 4]} {" hello" * (i % 7)}"' for i in range(n)]
    (folder / "test.csv").write_text("\n".join(rows) + "\n")  # test.csv only: trains on 80%, tests on the rest
    return folder


@pytest.mark.parametrize("fmt", ["bin", "safetensors"])
def test_train_init_from_bert_end_to_end(tmp_path, fmt):
    pytest.importorskip("tokenizers")
    if fmt == "safetensors":
        pytest.importorskip("safetensors")
    folder, sd = bert_folder(tmp_path / "bert", safetensors=fmt == "safetensors", prefix="bert." * (fmt == "bin"))
    news = write_agnews(tmp_path / "news")
    common = ["--task", "agnews", "--data_dir", news, "--cache_dir", tmp_path / "cache", "--init_from_bert", folder,
              "--batch_size", "4", "--eval_iters", "1", "--log_interval", "1", "--warmup", "1", "--block_size", "16"]
    # lr 0: the weights stay BERT's, so the saved model is from_bert's, with the task's ids BERT's WordPiece
    out = train.main([str(a) for a in [*common, "--model", "softmax", "--max_iters", "2", "--lr", "0",
                                       "--out_dir", tmp_path / "softmax"]])
    ckpt = torch.load(tmp_path / "softmax" / "ckpt.pt", map_location="cpu", weights_only=True)
    assert ckpt["config"]["attention"] == "softmax" and ckpt["config"]["n_classes"] == 4
    model = st.Model(st.Config(**ckpt["config"])).double().eval()
    model.load_state_dict(ckpt["model"])
    task = data.load_task("agnews", cache_dir=str(tmp_path / "cache"), data_dir=str(news), block_size=16,
                          tokenizer=str(folder))
    x, _ = next(task.split("test").batches(8))
    assert (x[:, 0] == CLS).all() and (x.gather(1, (x != 0).sum(1, keepdim=True) - 1) == SEP).all()
    with torch.no_grad():
        h, _ = model.encode(x)
    ref = bert_reference(sd, x)
    torch.testing.assert_close(h[x != 0], ref[x != 0], rtol=1e-5, atol=1e-5)
    assert out["n_test"] == 8 and "test_acc" in out
    # SimpleTRON on BERT's first layer, trained; its checkpoint resumes as any other
    train.main([str(a) for a in [*common, "--model", "simpletron", "--n_layer", "1", "--max_iters", "2",
                                 "--lr", "1e-3", "--out_dir", tmp_path / "simple"]])
    train.main(["--resume", "--out_dir", str(tmp_path / "simple"), "--max_iters", "3"])
    ckpt = torch.load(tmp_path / "simple" / "ckpt.pt", map_location="cpu", weights_only=True)
    assert ckpt["config"]["attention"] == "simple" and ckpt["config"]["n_layer"] == 1 and ckpt["iter"] == 3
    assert not torch.equal(ckpt["model"]["blocks.0.attn.qkv.weight"][:D],
                           sd[f"{'bert.' * (fmt == 'bin')}encoder.layer.0.attention.self.query.weight"])


def test_train_init_from_bert_bad_input_is_one_line(tmp_path, monkeypatch):
    pytest.importorskip("tokenizers")
    news = write_agnews(tmp_path / "news")
    folder, _ = bert_folder(tmp_path / "bert")

    def run(*extra, task="agnews"):
        argv = ["--task", task, "--data_dir", news, "--cache_dir", tmp_path / "cache", *extra]
        with pytest.raises((train.UsageError, data.DataError)) as e:   # bert.py's problems: DataError
            train.main([str(a) for a in argv])
        assert "\n" not in str(e.value)
        return str(e.value)

    assert "is not a folder" in run("--init_from_bert", tmp_path / "nope")
    assert "config.json" in run("--init_from_bert", news)
    assert "listops" in run("--init_from_bert", folder, task="listops")
    assert "n_embd is BERT's own" in run("--init_from_bert", folder, "--n_embd", "32")
    assert "n_layer 5" in run("--init_from_bert", folder, "--n_layer", "5")
    for flag, value, own in (("--emb_norm", "false", True), ("--final_norm", "true", False),
                             ("--learned_cls", "true", False), ("--layer_norm_eps", "1e-5", 1e-12)):
        assert f"{flag[2:]} is BERT's own ({own})" in run("--init_from_bert", folder, "--block_size", "16", flag, value)
    for flag, value in (("--chunk", "8"), ("--causal_scale", "t")):           # a classifier: moot, not dropped
        assert run("--init_from_bert", folder, "--block_size", "16", flag, value) == (
            f"{flag} {value}: it acts only with a language model's causal attention, and this model is a "
            "classifier (head cls); leave it out")
    weights = torch.load(folder / "pytorch_model.bin", map_location="cpu", weights_only=True)
    raw = (folder / "pytorch_model.bin").read_bytes()
    (folder / "pytorch_model.bin").write_bytes(raw[:len(raw) // 2])          # a download cut in half
    msg = run("--init_from_bert", folder)
    assert re.fullmatch(rf"--init_from_bert: cannot read {re.escape(str(folder / 'pytorch_model.bin'))} "
                        r"\((OSError|RuntimeError): .+\)", msg)   # torch's own reason, in one line
    (folder / "pytorch_model.bin").write_bytes(raw)
    torch.save({**weights, "note": 3}, folder / "pytorch_model.bin")          # a value that is not a tensor
    assert "is not a state dict of tensors" in run("--init_from_bert", folder)
    torch.save([weights], folder / "pytorch_model.bin")                      # not a dict
    assert "is not a state dict of tensors" in run("--init_from_bert", folder)
    torch.save({k: v.clone().fill_(float("nan")) if k.endswith("query.weight") else v for k, v in weights.items()},
               folder / "pytorch_model.bin")                                  # a weight damaged: no step taken
    assert "holds a weight that is not finite" in run("--init_from_bert", folder)
    torch.save(weights, folder / "pytorch_model.bin")
    (folder / "model.safetensors").mkdir()                                    # preferred, and no file: not skipped
    assert run("--init_from_bert", folder) == f"--init_from_bert: {folder / 'model.safetensors'} is a folder, not a file"
    (folder / "model.safetensors").rmdir()
    for field, value in (("hidden_size", "16"), ("num_attention_heads", 0), ("num_hidden_layers", True),
                         ("num_hidden_layers", 1.5), ("vocab_size", None), ("layer_norm_eps", "x"),
                         ("layer_norm_eps", 0), ("hidden_dropout_prob", 1.0), ("hidden_act", 3)):
        (folder / "config.json").write_text(json.dumps({**CONFIG, field: value}))
        assert run("--init_from_bert", folder).startswith(f"--init_from_bert {folder}: config.json's {field} "
                                                          f"{value!r} (allowed: "), (field, value)
    (folder / "config.json").write_text(json.dumps(CONFIG))
    (folder / "pytorch_model.bin").unlink()
    assert "neither model.safetensors nor pytorch_model.bin" in run("--init_from_bert", folder)
    monkeypatch.setitem(sys.modules, "tokenizers", None)     # as if not installed
    assert "pip install safetensors tokenizers" in run("--init_from_bert", folder)
    assert not (tmp_path / "cache").exists()                 # nothing was done before the error
    with pytest.raises(data.DataError, match="pip install safetensors tokenizers"):
        bert.wordpiece_tokenizer(str(folder), "agnews")


def test_bert_fields_default_to_the_models_own_block():
    c = st.Config()
    assert (c.layer_norm_eps, c.emb_norm, c.final_norm, c.learned_cls, c.mlp_hidden) == (1e-5, False, True, True, 0)
    m = st.Model(st.Config(vocab_size=11, block_size=6, n_layer=1, n_embd=8, n_head=2, mlp_ratio=3))
    assert m.cls is not None and m.wpe.weight.shape == (7, 8) and m.blocks[0].mlp.fc.weight.shape == (24, 8)
    assert isinstance(m.ln_e, torch.nn.Identity) and m.ln_f.eps == m.blocks[0].ln2.eps == 1e-5


def test_a_flag_given_wins_over_the_models_own_under_init_from_bert(tmp_path, monkeypatch):
    """BERT's shape < the model's own settings (softmax: attention softmax, variant vanilla) < the flags given."""
    monkeypatch.setitem(sys.modules, "tokenizers", types.ModuleType("tokenizers"))   # only its presence is asked
    folder, _ = bert_folder(tmp_path / "bert")
    common = ["--task", "agnews", "--data_dir", str(write_agnews(tmp_path / "news")), "--init_from_bert", str(folder),
              "--model", "softmax", "--block_size", "16", "--out_dir", str(tmp_path / "o")]
    config = runsetup.settings(common)[-1]
    assert (config["attention"], config["variant"], config["n_layer"]) == ("softmax", "vanilla", N_LAYERS)
    args, _, source, ckpt, pretrained, config = runsetup.settings([*common, "--variant", "resl", "--attention", "simple"])
    assert (config["attention"], config["variant"], config["n_layer"]) == ("simple", "resl", N_LAYERS)
    built = runsetup.build_run_model(args, config, source, ckpt, pretrained).config     # and the model built
    assert (built.attention, built.variant, built.n_layer) == ("simple", "resl", N_LAYERS)
