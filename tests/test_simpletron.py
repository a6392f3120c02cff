"""SimpleTRON and its softmax baseline: the attention maths, the variants of Table 1, heads, transfer."""

import math

import pytest
import torch

import simpletron as st


def qkv(B=2, H=3, L=37, d=5, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, L, d, generator=g, dtype=dtype) for _ in range(3)]


def test_simple_attention_equals_quadratic_form_with_padding():
    q, k, v = qkv()
    mask = torch.ones(2, 37, dtype=torch.bool)
    mask[0, 30:] = False                                    # sample 0 has 30 real tokens, sample 1 has 37
    y = st.simple_attention(q, k, v, mask)
    for b, n in ((0, 30), (1, 37)):
        # the quadratic form on the real tokens only: (Q K^T) V / sqrt(n)
        ref = (q[b, :, :n] @ k[b, :, :n].transpose(-2, -1)) @ v[b, :, :n] / math.sqrt(n)
        torch.testing.assert_close(y[b, :, :n], ref, rtol=1e-12, atol=1e-12)


def test_simple_attention_without_mask_uses_full_length():
    q, k, v = qkv(L=11)
    ref = (q @ k.transpose(-2, -1)) @ v / math.sqrt(11)
    torch.testing.assert_close(st.simple_attention(q, k, v, None), ref, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("L", [1, 63, 64, 150])
def test_causal_simple_attention_equals_masked_quadratic_form(L):
    q, k, v = qkv(L=L)
    scores = (q @ k.transpose(-2, -1)).masked_fill(~torch.ones(L, L, dtype=torch.bool).tril(), 0)
    t = torch.arange(1, L + 1, dtype=torch.float64)
    ref = scores @ v / t.sqrt()[:, None]                    # y_t = Q_t (sum_{s<=t} K_s^T V_s) / sqrt(t)
    torch.testing.assert_close(st.causal_simple_attention(q, k, v, chunk=64), ref, rtol=1e-11, atol=1e-11)


def test_simple_attention_is_linear_in_length():
    # 300,000 tokens: an L x L matrix would need 360 GB (and this test would die); K^T V needs 8 x 8.
    q, k, v = (torch.randn(1, 1, 300_000, 8) for _ in range(3))
    assert st.simple_attention(q, k, v, None).shape == (1, 1, 300_000, 8)
    assert st.causal_simple_attention(q, k, v).shape == (1, 1, 300_000, 8)


@pytest.mark.parametrize("causal", [False, True])
def test_softmax_fused_path_equals_reference(causal):
    q, k, v = qkv(L=20)
    mask = None if causal else torch.arange(20)[None, :] < torch.tensor([[14], [20]])
    y = st.softmax_attention(q, k, v, mask, causal)
    ref = st.softmax_attention_reference(q, k, v, mask, causal)
    torch.testing.assert_close(y, ref, rtol=1e-10, atol=1e-10)


def test_simple_attention_gradients():
    q, k, v = (x.requires_grad_() for x in qkv(L=9, d=3, H=2))
    mask = torch.tensor([[True] * 9, [True] * 6 + [False] * 3])
    assert torch.autograd.gradcheck(lambda q, k, v: st.simple_attention(q, k, v, mask), (q, k, v))
    assert torch.autograd.gradcheck(lambda q, k, v: st.causal_simple_attention(q, k, v, chunk=4), (q, k, v))


def block_pair(variant_a, variant_b, D=16):
    """Two blocks with identical shared weights."""
    torch.manual_seed(0)
    a = st.Block(st.Config(n_embd=D, n_head=4, dropout=0.0, variant=variant_a)).double().eval()
    b = st.Block(st.Config(n_embd=D, n_head=4, dropout=0.0, variant=variant_b)).double().eval()
    b.load_state_dict(a.state_dict())
    return a, b


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_variants_differ_exactly_as_table_1(norm):
    x = torch.randn(2, 10, 16, dtype=torch.float64)
    mask = torch.ones(2, 10, dtype=torch.bool)
    # Simple vs Simple-Res: the same block, plus the block input added again at the output (Fig. 4)
    simple, res = block_pair("simple", "res")
    simple.pre = res.pre = norm == "pre"
    torch.testing.assert_close(res(x, mask) - simple(x, mask), x)
    # Simple-Res vs Simple-ResL: the output linear W after the heads is the only new parameter
    res_params = {n for n, _ in res.named_parameters()}
    torch.manual_seed(0)
    resl = st.Block(st.Config(n_embd=16, n_head=4, variant="resl"))
    assert {n for n, _ in resl.named_parameters()} - res_params == {"attn.out.weight", "attn.out.bias"}
    assert isinstance(res.attn.out, torch.nn.Identity) and isinstance(simple.attn.out, torch.nn.Identity)
    # Simple-ResL vs the vanilla block: again exactly the extra skip
    vanilla, resl = block_pair("vanilla", "resl")
    vanilla.pre = resl.pre = norm == "pre"
    torch.testing.assert_close(resl(x, mask) - vanilla(x, mask), x)


def tiny(**kw):
    base = dict(vocab_size=20, block_size=32, n_layer=2, n_head=2, n_embd=16, dropout=0.0, n_classes=3)
    return st.Model(st.Config(**{**base, **kw})).double().eval()


@pytest.mark.parametrize("attention", ["simple", "softmax"])
def test_padding_does_not_change_a_cls_output(attention):
    torch.manual_seed(0)
    model = tiny(attention=attention)
    idx = torch.randint(1, 20, (3, 12))
    padded = torch.cat([idx, torch.zeros(3, 9, dtype=torch.long)], dim=1)
    torch.testing.assert_close(model(padded)[0], model(idx)[0], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("attention", ["simple", "softmax"])
def test_lm_head_is_causal(attention):
    torch.manual_seed(0)
    model = tiny(attention=attention, head="lm", norm="pre", block_size=100)
    idx = torch.randint(1, 20, (2, 100))
    later = idx.clone()
    later[:, 70:] = torch.randint(1, 20, (2, 30))
    a, b = model(idx)[0], model(later)[0]
    torch.testing.assert_close(a[:, :70], b[:, :70], rtol=1e-12, atol=1e-12)
    assert not torch.allclose(a[:, 70:], b[:, 70:])
    assert model.lm_head.weight is model.wte.weight         # tied embeddings


def test_match_head_is_symmetric_in_its_encoder():
    torch.manual_seed(0)
    model = tiny(head="match")
    pair = torch.randint(1, 20, (2, 2, 10))
    logits, loss = model(pair, torch.tensor([0, 1]))
    assert logits.shape == (2, 3) and loss.ndim == 0
    # the same shared encoder sees both documents: u from document 0 equals encode(document 0) alone
    u = model.encode(pair[:, 0])[0][:, 0]
    feats = torch.cat([u, u, u * u, u - u], -1)
    same = torch.stack([pair[:, 0], pair[:, 0]], 1)
    torch.testing.assert_close(model(same)[0], model.classifier(feats))


@pytest.mark.parametrize("head", ["cls", "lm"])
def test_a_tiny_model_learns(head):
    """Loss falls in a few dozen steps: cls learns to count small tokens (a global summary, what K^T V
    holds), lm learns to continue a cycle."""
    torch.manual_seed(0)
    model = tiny(head=head, norm="pre" if head == "lm" else "post").float().train()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(80):
        x = torch.randint(1, 20, (16, 12))
        if head == "cls":
            y = ((x < 7).sum(1) // 2).clamp(max=2)
        else:
            x = (torch.arange(13)[None, :] + torch.randint(0, 19, (16, 1))) % 19 + 1
            x, y = x[:, :-1], x[:, 1:]
        _, loss = model(x, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert sum(losses[-5:]) / 5 < 0.5 * sum(losses[:5]) / 5


def test_attention_transfer_copies_and_freezes_qkv():
    torch.manual_seed(0)
    simple = tiny()
    soft = tiny(attention="softmax", variant="vanilla")
    st.transfer_attention(simple, soft)
    assert soft.config.freeze_qkv
    before = {n: p.clone() for n, p in soft.named_parameters()}
    for a, b in zip(simple.blocks, soft.blocks):
        assert torch.equal(a.attn.qkv.weight, b.attn.qkv.weight)
    trainable = [p for p in soft.parameters() if p.requires_grad]
    opt = torch.optim.SGD(trainable, lr=0.1)
    loss = soft(torch.randint(1, 20, (4, 8)), torch.tensor([0, 1, 2, 0]))[1]
    loss.backward()
    opt.step()
    for n, p in soft.named_parameters():
        assert torch.equal(p, before[n]) == ("attn.qkv" in n), n
    # a model built with freeze_qkv=True (as from a saved config) is frozen the same way
    assert not any(p.requires_grad for b in tiny(freeze_qkv=True).blocks for p in b.attn.qkv.parameters())


def test_config_rejects_bad_values():
    with pytest.raises(ValueError, match="variant"):
        st.Config(variant="resx")
    with pytest.raises(ValueError, match="multiple"):
        st.Config(n_embd=10, n_head=4)
