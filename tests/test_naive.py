"""The written-out softmax Transformer (attention="softmax_naive", TransJect's Table 4 baseline) is the SDPA one."""
import json
import math

import pytest
import torch

import bench
import simpletron


@pytest.mark.parametrize("head", ["cls", "lm"])
def test_naive_softmax_model_equals_the_sdpa_model(head):
    torch.manual_seed(0)
    kw = dict(vocab_size=11, block_size=9, n_layer=2, n_head=2, n_embd=8, dropout=0.0, head=head, n_classes=3,
              variant="vanilla")
    fast = simpletron.Model(simpletron.Config(attention="softmax", **kw)).double()
    naive = simpletron.Model(simpletron.Config(attention="softmax_naive", **kw)).double()
    naive.load_state_dict(fast.state_dict())                 # the same parameters, names and shapes
    idx = torch.randint(1, 11, (3, 9))
    idx[1, 6:] = 0                                           # padding
    a, b = fast(idx)[0], naive(idx)[0]
    torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
    # and the scores are the written-out formula: one head, one query, by hand
    q, k, v = torch.randn(3, 1, 1, 4, 2, dtype=torch.float64).unbind(0)
    s = [(q[0, 0, 3] @ k[0, 0, j]).item() / math.sqrt(2) for j in range(4)]
    w = torch.tensor(s, dtype=torch.float64).softmax(0)
    torch.testing.assert_close(simpletron.softmax_attention_reference(q, k, v, None, True)[0, 0, 3],
                               w @ v[0, 0], rtol=0, atol=1e-12)


def test_speed_infer_only_times_the_three_models_of_table_4(tmp_path):
    bench.main(["--models", "transject,softmax,softmax_naive", "--head", "cls", "--n_embd", "16",
                "--n_layer", "1", "--n_head", "2", "--repeats", "1", "--infer_only", "--lengths", "16,32",
                "--out", str(tmp_path)])
    rows = json.load(open(tmp_path / "speed.json"))
    assert sorted((r["model"], r["mode"]) for r in rows if r["length"] == 16) == [
        ("softmax", "infer"), ("softmax_naive", "infer"), ("transject", "infer")]
    flops = {r["model"]: r["flops"] for r in rows if r["length"] == 16}
    assert flops["softmax"] == flops["softmax_naive"] > 0   # the same arithmetic, counted the same way
