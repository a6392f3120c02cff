"""SimpleTRON's Fig. 5: simpletron.attention_std against a loop over pairs, its log records, analyze.py attnstd."""

import json
import math
import os

import numpy as np
import pytest
import torch

import analyze
import config
import data
import simpletron
import train
from test_train import TINY, run, write_listops


def reference_std(model, idx):
    """Block by block, with a loop over sequences, heads and (query, key) pairs: the attention weights
    q_i . k_j / sqrt(n_i) (SimpleTRON; n the real tokens, or causal q_i . k_j * scale(i + 1) of Config.causal_scale)
    or / sqrt(d) (softmax), and the attention sublayer's output at the real tokens."""
    c = model.config
    B, L = idx.shape
    x = model.wte(idx)
    mask = idx != 0
    if model.cls is not None:
        x = torch.cat([model.cls.expand(B, 1, -1), x], 1)
        mask = torch.cat([torch.ones(B, 1, dtype=torch.bool), mask], 1)
    x = model.ln_e(x + model.wpe.weight[: x.shape[1]])
    causal = c.head == "lm"
    block_mask = None if causal else mask
    D, H = c.n_embd, c.n_head
    d = D // H
    scores, outputs = [], []
    for block in model.blocks:
        h = block.ln1(x) if c.norm == "pre" else x           # what the attention reads
        W, b = block.attn.qkv.weight, block.attn.qkv.bias
        q, k = h @ W[:D].T + b[:D], h @ W[D:2 * D].T + b[D:2 * D]
        values = []
        for s in range(B):
            real = [i for i in range(x.shape[1]) if causal or mask[s, i]]
            for head in range(H):
                sl = slice(head * d, (head + 1) * d)
                for i in real:
                    for j in real:
                        if causal and j > i:
                            continue
                        if c.attention == "simple" and causal:   # scale(t), t = i + 1; all but sqrt_t: ours
                            t = i + 1
                            w = {"sqrt_t": 1 / math.sqrt(t), "t": 1 / t, "sqrt_block": 1 / math.sqrt(c.block_size),
                                 "none": 1.0}[c.causal_scale]
                        else:
                            w = 1 / math.sqrt(len(real) if c.attention == "simple" else d)
                        values.append(float(q[s, i, sl] @ k[s, j, sl]) * w)
        scores.append(torch.tensor(values, dtype=torch.float64).std().item())
        y = block.attn(h, block_mask)
        outputs.append(torch.cat([y[s, [i for i in range(x.shape[1]) if causal or mask[s, i]]]
                                  for s in range(B)]).double().std().item())
        x = block(x, block_mask)
    return scores, outputs


@pytest.mark.parametrize("kw", [dict(attention="simple", head="cls"), dict(attention="simple", head="lm"),
                                dict(attention="simple", head="lm", causal_scale="t"),   # Config.causal_scale
                                dict(attention="simple", head="lm", causal_scale="sqrt_block"),
                                dict(attention="simple", head="lm", causal_scale="none"),
                                dict(attention="simple", head="cls", causal_scale="none"),   # lm only: 1/sqrt(n)
                                dict(attention="softmax", head="cls"), dict(attention="softmax", head="lm", norm="pre"),
                                dict(attention="simple", head="cls", variant="resl", learned_cls=False)])
def test_attention_std_equals_the_loop_over_pairs(kw):
    torch.manual_seed(0)
    config = simpletron.Config(vocab_size=11, block_size=7, n_layer=3, n_head=2, n_embd=8, n_classes=3, **kw)
    model = simpletron.Model(config).eval()
    for p in model.parameters():                             # weights far from their init, every path alive
        torch.nn.init.normal_(p, std=0.5)
    idx = torch.tensor([[3, 5, 1, 7, 2, 0, 0], [4, 4, 9, 1, 6, 8, 2]])   # one row padded (cls)
    if kw["head"] == "lm":
        idx = idx.clamp(min=1)
    got = simpletron.attention_std(model, idx)
    with torch.no_grad():
        scores, outputs = reference_std(model, idx)
    assert got["score_std"] == pytest.approx(scores, rel=1e-5)
    assert got["attn_std"] == pytest.approx(outputs, rel=1e-5)
    assert len(set(got["score_std"])) == 3                   # the blocks differ: each is measured on its own input
    model.config.dropout = 0.5                               # a model in training, with dropout: measured in
    for m in model.modules():                                # eval mode, and left in training mode
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.5
    model.train()
    assert simpletron.attention_std(model, idx) == got and model.training
    assert not any(block.attn._forward_hooks for block in model.blocks)        # its hooks are gone


def test_attention_std_leaves_the_mode_and_training_alone(tmp_path):
    lra = write_listops(tmp_path / "lra", 48, seed=3)
    common = ["--data_dir", lra, *TINY, "--n_layer", "2", "--dropout", "0.2", "--max_iters", "6", "--eval_interval",
              "3"]
    run(*common, "--out_dir", tmp_path / "plain")
    run(*common, "--out_dir", tmp_path / "std", "--attn_std_interval", "2")
    read = lambda name: [json.loads(l) for l in open(tmp_path / name / "log.jsonl")]
    plain, std = read("plain"), read("std")
    assert [(r["step"], r.get("loss")) for r in plain if "loss" in r] == \
           [(r["step"], r.get("loss")) for r in std if "loss" in r]              # the same training, bit for bit
    recs = [r for r in std if "score_std" in r]
    assert [r["step"] for r in recs] == [0, 2, 4, 6]
    # the last record: the trained model on the fixed val batch (min(batch_size, 64) rows, drawn with seed 4321)
    metrics = json.load(open(tmp_path / "std" / "metrics.json"))
    ckpt = torch.load(tmp_path / "std" / "ckpt.pt", map_location="cpu", weights_only=True)
    model = config.build_model(ckpt["model_name"], ckpt["config"])
    model.load_state_dict(ckpt["model"])
    task = data.load_task("listops", cache_dir=metrics["args"]["cache_dir"], data_dir=str(lra),
                          block_size=ckpt["config"]["block_size"])
    task.open()
    x = task.split("val").sample(4, np.random.default_rng(4321))[0]
    got = simpletron.attention_std(model, x)                 # here on the CPU; the run's on its device
    assert got.keys() == {"score_std", "attn_std"}
    assert all(got[k] == pytest.approx(recs[-1][k], rel=1e-5) for k in got)
    assert all(len(r["score_std"]) == len(r["attn_std"]) == 2 and min(r["score_std"]) > 0 for r in recs)
    out = tmp_path / "analysis"
    analyze.main(["attnstd", "--run", str(tmp_path / "std"), "--out", str(out)])
    saved = json.load(open(out / "attnstd.json"))["runs"][0]
    assert saved["steps"] == [0, 2, 4, 6]
    assert saved["score_std"][1] == [r["score_std"][1] for r in recs]
    assert os.path.getsize(out / "attnstd.png") > 0


def test_attention_std_bad_input(tmp_path):
    with pytest.raises(train.UsageError, match="--attn_std_interval"):
        train.main(["--model", "transject", "--task", "listops", "--attn_std_interval", "5",
                    "--out_dir", str(tmp_path / "x")])
    with pytest.raises(train.UsageError, match="--attn_std_interval -1"):
        train.main(["--model", "simpletron", "--task", "listops", "--attn_std_interval", "-1",
                    "--out_dir", str(tmp_path / "x")])
    with pytest.raises(analyze.UsageError, match="attnstd needs --run"):
        analyze.main(["attnstd", "--out", str(tmp_path / "a")])
    with pytest.raises(analyze.UsageError, match="log.jsonl"):
        analyze.main(["attnstd", "--run", str(tmp_path / "nothing"), "--out", str(tmp_path / "a")])
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "log.jsonl").write_text('{"step": 1, "loss": 2.0}\n')
    with pytest.raises(analyze.UsageError, match="--attn_std_interval N"):
        analyze.main(["attnstd", "--run", str(tmp_path / "plain"), "--out", str(tmp_path / "a")])


def test_attnstd_refuses_an_accuracy_outside_0_to_1(tmp_path):
    run = tmp_path / "r"
    run.mkdir()
    (run / "log.jsonl").write_text('{"step": 1, "score_std": [1.0], "attn_std": [2.0], "time": 1}\n')
    (run / "metrics.json").write_text('{"test_acc": 2.5}')
    with pytest.raises(analyze.UsageError, match=r"metrics.json is damaged: its test_acc 2.5 is not an accuracy"):
        analyze.main(["attnstd", "--run", str(run), "--out", str(tmp_path / "a")])
    (run / "metrics.json").write_text('{"test_acc": 0.25}')
    assert analyze.read_attention_std(str(run))[1] == "r (test acc 25.0%)"


def test_attnstd_refuses_a_negative_std_naming_the_line_and_a_run_given_twice(tmp_path, monkeypatch):
    """A standard deviation is >= 0: a record with a negative one (drawn on a log axis, written to attnstd.json) is
    a damaged log, one line naming the file and its line; a run named twice is refused, not drawn twice."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "r").mkdir()
    records = [{"step": 0, "score_std": [1.0, 0.0], "attn_std": [2.0, 0.5]}, {"step": 1, "loss": 2.0},
               {"step": 2, "score_std": [1.0, -0.1], "attn_std": [2.0, 0.5]}]
    (tmp_path / "r" / "log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    with pytest.raises(data.DataError) as e:
        analyze.main(["attnstd", "--run", "r", "--out", "out"])
    assert str(e.value).startswith(f"{os.path.join('r', 'log.jsonl')}, line 3: the attention std of step 2 is damaged "
                                   "(score_std and attn_std hold one number >= 0 a block")
    assert not (tmp_path / "out").exists()
    records[2]["score_std"][1] = 0.1
    (tmp_path / "r" / "log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    with pytest.raises(analyze.UsageError, match=r"^attnstd: the run \./r/ is given twice \(once is its row of "
                       r"panels\)$"):
        analyze.main(["attnstd", "--run", "r", "--run", "./r/", "--out", "out"])
    assert not (tmp_path / "out").exists()
    analyze.main(["attnstd", "--run", "r", "--out", "out"])   # one std of 0 (a block whose weights are equal): drawn
    assert json.loads((tmp_path / "out" / "attnstd.json").read_text())["runs"][0]["score_std"] == [[1.0, 1.0],
                                                                                                  [0.0, 0.1]]


@pytest.mark.parametrize("kw", [dict(head="lm"), dict(head="lm", attention="softmax"), dict(head="cls")])
def test_the_std_of_a_single_score_is_0_not_nan(kw, recwarn):
    """Battery: one head, one (query, key) pair, one row (--block_size 1 --batch_size 1 --n_head 1, or a class
    example of one real token) took the unbiased std of one number: NaN (torch warns), written to log.jsonl, which
    analyze.py attnstd then refused as damaged. Fewer than two numbers have no spread: 0; two or more as before."""
    torch.manual_seed(0)
    config = simpletron.Config(vocab_size=11, block_size=1 if kw["head"] == "lm" else 4, n_layer=2, n_head=1,
                               n_embd=8, n_classes=3, learned_cls=False, **kw)
    model = simpletron.Model(config).eval()
    idx = torch.tensor([[3]] if kw["head"] == "lm" else [[3, 0, 0, 0]])       # one real token
    got = simpletron.attention_std(model, idx)
    assert got["score_std"] == [0.0, 0.0] and all(math.isfinite(v) for v in got["attn_std"]), got
    assert not [w for w in recwarn if "degrees of freedom" in str(w.message)]
    with torch.no_grad():                                    # two rows: two scores, their unbiased std as before
        two = torch.cat([idx, idx % 10 + 1])
        assert simpletron.attention_std(model, two)["score_std"] == pytest.approx(reference_std(model, two)[0],
                                                                                  rel=1e-5)


def test_a_run_of_one_token_blocks_logs_an_attention_std_that_analyze_draws(tmp_path, recwarn):
    """Battery: train.py --block_size 1 --batch_size 1 --n_head 1 --attn_std_interval 1 wrote "score_std": [NaN] and
    analyze.py attnstd refused train.py's own log as damaged."""
    (tmp_path / "text.txt").write_text("the quick brown fox jumps over the lazy dog\n" * 40)
    run("--task", "textfile", "--data_dir", tmp_path / "text.txt", "--tokenizer", "char", "--n_layer", "1",
        "--n_embd", "16", "--n_head", "1", "--block_size", "1", "--max_iters", "2", "--eval_iters", "1",
        "--batch_size", "1", "--attn_std_interval", "1", "--cache_dir", tmp_path / "c", "--out_dir", tmp_path / "s1")
    recs = [json.loads(line) for line in open(tmp_path / "s1" / "log.jsonl") if "score_std" in line]
    assert [(r["step"], r["score_std"]) for r in recs] == [(0, [0.0]), (1, [0.0]), (2, [0.0])], recs
    assert not [w for w in recwarn if "degrees of freedom" in str(w.message)]
    analyze.main(["attnstd", "--run", str(tmp_path / "s1"), "--out", str(tmp_path / "an")])
    assert json.loads((tmp_path / "an" / "attnstd.json").read_text())["runs"][0]["score_std"] == [[0.0, 0.0, 0.0]]
    assert not [w for w in recwarn if "log-scaled" in str(w.message)]      # (a std of 0 on a linear axis)
