"""analyze.py: the maths of each analysis against closed forms, and the command line."""

import dataclasses
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import analyze
import data
import simpletron

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def random_matrix(n, seed, cond=3.0):
    """A well-conditioned, non-orthogonal n x n matrix."""
    g = torch.Generator().manual_seed(seed)
    U, _ = torch.linalg.qr(torch.randn(n, n, generator=g, dtype=torch.float64))
    V, _ = torch.linalg.qr(torch.randn(n, n, generator=g, dtype=torch.float64))
    return U @ torch.diag(torch.linspace(1.0, cond, n, dtype=torch.float64)) @ V.T


def block_diag_with(eigs):
    """A real matrix whose eigenvalues are `eigs` (complex ones as conjugate pairs, given once)."""
    blocks = []
    for e in eigs:
        if isinstance(e, complex):
            blocks.append(torch.tensor([[e.real, -e.imag], [e.imag, e.real]], dtype=torch.float64))
        else:
            blocks.append(torch.tensor([[e]], dtype=torch.float64))
    return torch.block_diag(*blocks)


def sorted_complex(z):
    z = np.asarray(z).ravel()
    return z[np.lexsort((z.imag.round(8), z.real.round(8)))]


# ----------------------------------------------------------------------------------------------
# Lyapunov exponents

def test_householder_qr_is_a_qr_decomposition():
    A = torch.randn(5, 7, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    Q, R = analyze.householder_qr(A)
    assert torch.allclose(Q @ R, A, atol=1e-12)
    assert torch.allclose(Q.transpose(-1, -2) @ Q, torch.eye(4, dtype=torch.float64).expand(5, 4, 4), atol=1e-12)
    assert torch.equal(R, torch.triu(R))
    ref = torch.linalg.qr(A).R
    assert torch.allclose(R.diagonal(dim1=-2, dim2=-1).abs(), ref.diagonal(dim1=-2, dim2=-1).abs(), atol=1e-12)


def test_lyapunov_exponents_of_a_linear_system_are_the_real_parts_of_its_eigenvalues():
    # dx/dt = A x, A = S diag S^-1 non-normal, eigenvalues 0.5, -0.5 +- 2i, -2: exponents 0.5, -0.5, -0.5, -2
    S = random_matrix(4, seed=1)
    A = S @ block_diag_with([0.5, complex(-0.5, 2.0), -2.0]) @ torch.linalg.inv(S)
    dt, T = 0.01, 100.0
    steps = int(T / dt)
    lam = analyze.lyapunov_spectrum((A for _ in range(steps)), dt, qr_every=20).sort(descending=True).values
    # what the Euler steps converge to: log|eig(I + dt A)| / dt, up to the finite-time error
    discrete = torch.linalg.eigvals(torch.eye(4, dtype=torch.float64) + dt * A).abs().log().sort(descending=True).values / dt
    assert torch.allclose(lam, discrete, atol=0.02), (lam, discrete)
    # and that is the real parts of the eigenvalues, up to the Euler error O(dt |lambda|^2)
    assert torch.allclose(lam, torch.tensor([0.5, -0.5, -0.5, -2.0], dtype=torch.float64), atol=0.04), lam
    assert not torch.allclose(lam, torch.linalg.eigvals(A).abs().sort(descending=True).values, atol=0.5)
    # the sum of all exponents is the volume growth rate, the trace, whatever the horizon
    assert abs(lam.sum().item() - discrete.sum().item()) < 1e-9


def test_reorthonormalising_less_often_gives_the_same_exponents():
    A = random_matrix(5, seed=2) - 1.5 * torch.eye(5, dtype=torch.float64)
    Js = [A * (1 + 0.5 * math.sin(0.3 * s)) for s in range(100)]           # time-dependent J(t)
    every = analyze.lyapunov_spectrum(Js, 0.01)
    assert torch.allclose(analyze.lyapunov_spectrum(Js, 0.01, qr_every=7), every, atol=1e-10)
    assert torch.allclose(analyze.lyapunov_spectrum(Js, 0.01, k=2), every[:2], atol=1e-10)   # the largest ones


# ----------------------------------------------------------------------------------------------
# Spectra

HEAD_EIGS = {"qk": [[2.0, -1.0, 0.5], [complex(1.0, 1.5), 3.0]], "ov": [[-0.25, 0.75, 1.5], [complex(-2.0, 0.5), 0.1]]}


def hand_built_weights(D=6, H=2):
    """Per head, W_Q^h, W_K^h with QK_h = S diag(Lambda_h, 0) S^-1 (so its eigenvalues are Lambda_h and zeros),
    and W_V^h, W_O^h likewise for OV_h, in the row convention."""
    d = D // H
    Wq, Wk, Wv, Wo = (torch.zeros(D, D, dtype=torch.float64) for _ in range(4))
    for h in range(H):
        s = slice(h * d, (h + 1) * d)
        for key, (A, B) in (("qk", (Wq, Wk)), ("ov", (Wv, Wo))):
            S = random_matrix(D, seed=100 * h + len(key) + (key == "ov"))
            Sinv = torch.linalg.inv(S)
            Lam = block_diag_with(HEAD_EIGS[key][h])
            A[:, s] = S[:, :d] @ Lam                         # D x d
            if key == "qk":
                B[:, s] = Sinv[:d, :].T                      # W_K^h: QK_h = W_Q^h W_K^h^T = S[:, :d] Lam Sinv[:d]
            else:
                B[s, :] = Sinv[:d, :]                        # W_O^h: OV_h = W_V^h W_O^h
    return Wq, Wk, Wv, Wo


def expected(key, h):
    e = []
    for v in HEAD_EIGS[key][h]:
        e += [v, v.conjugate()] if isinstance(v, complex) else [v]
    return sorted_complex(np.array(e, dtype=complex))


def test_spectra_of_hand_built_weights():
    Wq, Wk, Wv, Wo = hand_built_weights()
    qk, ov = analyze.head_spectra(Wq, Wk, Wv, Wo, n_head=2)
    for h in range(2):
        assert np.allclose(sorted_complex(qk[h]), expected("qk", h), atol=1e-9), qk[h]
        assert np.allclose(sorted_complex(ov[h]), expected("ov", h), atol=1e-9), ov[h]
        # the same as the nonzero eigenvalues of the full D x D products
        s = slice(3 * h, 3 * h + 3)
        full = np.linalg.eigvals((Wq[:, s] @ Wk[:, s].T).numpy())
        assert np.allclose(sorted_complex(full[np.abs(full) > 1e-9]), expected("qk", h), atol=1e-9)
        full = np.linalg.eigvals((Wv[:, s] @ Wo[s, :]).numpy())
        assert np.allclose(sorted_complex(full[np.abs(full) > 1e-9]), expected("ov", h), atol=1e-9)
    # the weights as nested lists (anything torch.as_tensor takes): the same spectra
    qk2, ov2 = analyze.head_spectra(*(np.asarray(W).tolist() for W in (Wq, Wk, Wv, Wo)), n_head=2)
    assert np.allclose(qk2, qk) and np.allclose(ov2, ov)


def test_spectra_read_from_a_model_use_the_models_own_convention():
    Wq, Wk, Wv, Wo = hand_built_weights()
    cfg = simpletron.Config(vocab_size=10, block_size=8, n_layer=2, n_head=2, n_embd=6, dropout=0.0, head="lm",
                            attention="softmax", variant="vanilla")
    model = simpletron.Model(cfg).double()
    attn = model.blocks[1].attn
    with torch.no_grad():
        attn.qkv.weight.copy_(torch.cat([Wq, Wk, Wv], dim=1).T)   # nn.Linear holds W^T
        attn.out.weight.copy_(Wo.T)
    x = torch.randn(1, 5, 6, dtype=torch.float64)                 # the model really computes q = x W_Q, k = x W_K
    q, k, v = attn.qkv(x).split(6, dim=-1)
    assert torch.allclose(q - attn.qkv.bias[:6], x @ Wq) and torch.allclose(k - attn.qkv.bias[6:12], x @ Wk)
    assert torch.allclose(attn.out(x) - attn.out.bias, x @ Wo)
    layers = analyze.attention_weights(model)
    assert [l[0] for l in layers] == [1, 2]
    qk, ov = analyze.head_spectra(*layers[1][1:], n_head=2)
    for h in range(2):
        assert np.allclose(sorted_complex(qk[h]), expected("qk", h), atol=1e-9)
        assert np.allclose(sorted_complex(ov[h]), expected("ov", h), atol=1e-9)
    # SimpleTRON without an output map: OV_h is head h's own d x d block of W_V
    plain = simpletron.Model(dataclasses.replace(cfg, attention="simple", variant="res"))
    (_, q_, k_, v_, o_), _ = analyze.attention_weights(plain)
    assert o_ is None
    _, ov = analyze.head_spectra(q_, k_, v_, o_, n_head=2)
    assert np.allclose(sorted_complex(ov[1]), sorted_complex(np.linalg.eigvals(v_[3:, 3:].double().numpy())))
    # the Orthogonal Transformer's output map (not an nn.Linear) is read too: W_O = its orthogonal weight^T
    ortho = simpletron.Model(dataclasses.replace(cfg, orthogonal=True))
    (_, *_, o_), _ = analyze.attention_weights(ortho)
    assert o_ is not None and torch.allclose(o_, ortho.blocks[0].attn.out.weight.T)
    assert torch.allclose(o_.T @ o_, torch.eye(6), atol=1e-5)


# ----------------------------------------------------------------------------------------------
# Activation factor and entropy (TransJect eq. 5, 6)

def test_activation_factor_is_exactly_one_for_an_orthogonal_map():
    g = torch.Generator().manual_seed(0)
    X0 = torch.randn(3, 10, 8, generator=g, dtype=torch.float64)
    Q, _ = torch.linalg.qr(torch.randn(8, 8, generator=g, dtype=torch.float64))
    shift = torch.randn(8, generator=g, dtype=torch.float64)
    a = analyze.activation_factor(X0, X0 @ Q + shift)             # an isometry: every distance kept
    assert torch.allclose(a, torch.ones(3, dtype=torch.float64), atol=1e-12)
    assert torch.allclose(analyze.activation_factor(X0, 2.5 * X0), torch.full((3,), 2.5, dtype=torch.float64))
    stretch = analyze.activation_factor(X0, X0 @ torch.diag(torch.linspace(1, 3, 8, dtype=torch.float64)))
    assert ((stretch > 1.2) & (stretch < 3)).all()
    # padded tokens do not count, whatever they hold
    mask = torch.ones(3, 10, dtype=torch.bool)
    mask[:, 7:] = False
    Xl = X0 @ Q
    Xl[:, 7:] = 1e6
    assert torch.allclose(analyze.activation_factor(X0, Xl, mask), torch.ones(3, dtype=torch.float64), atol=1e-12)


def test_entropy_of_gaussian_samples_matches_the_closed_form():
    g = torch.Generator().manual_seed(0)
    sigma = torch.tensor([0.5, 1.0, 3.0], dtype=torch.float64)[:, None]
    x = torch.randn(3, 2000, generator=g, dtype=torch.float64) * sigma + 4.0
    H = analyze.differential_entropy(x)
    assert torch.equal(analyze.differential_entropy(x, chunk_elems=1), H)   # row by row: the same
    closed = 0.5 * torch.log(2 * math.pi * math.e * sigma[:, 0] ** 2)    # 0.5 log(2 pi e sigma^2)
    assert torch.allclose(H, closed, atol=0.04), (H, closed)
    # entropy shifts by log a under x -> a x, exactly (the bandwidth scales with the data)
    assert torch.allclose(analyze.differential_entropy(7.0 * x) - H, torch.full((3,), math.log(7.0), dtype=torch.float64))
    # equal coordinates: minus infinity (the paper's remark)
    assert analyze.differential_entropy(torch.ones(2, 16)).eq(-math.inf).all()


# ----------------------------------------------------------------------------------------------
# Clustering (DiffEqFormer C.8)

def test_cluster_number_counts_groups():
    g = torch.Generator().manual_seed(0)
    centres = torch.tensor([[1.0, 0, 0], [0, 1.0, 0], [0, 0, 1.0]], dtype=torch.float64)
    X = centres.repeat(10, 1) + 0.003 * torch.randn(30, 3, generator=g, dtype=torch.float64)
    assert analyze.cluster_number(X) == 3
    assert analyze.cluster_number(analyze.sphere(torch.randn(40, 3, generator=g, dtype=torch.float64)), eps=1e-6) == 40


@pytest.mark.parametrize("seed,steps", [(0, 200), (1, 200), (2, 200), (0, 1000)])
def test_cluster_number_separates_constant_from_quartic_growth(seed, steps):
    # weight sharing (g = 1) collapses the tokens; g = 1 + t^4 sharpens the attention until the tokens freeze
    # apart (the same with 5x smaller steps: not an artefact of the Euler steps)
    x0, (Wq, Wk, Wv) = analyze.cluster_start(seed)
    const = analyze.simulate_attention_ode(x0, Wq, Wk, Wv, analyze.growth(0), T=10.0, steps=steps)
    quartic = analyze.simulate_attention_ode(x0, Wq, Wk, Wv, analyze.growth(4), T=10.0, steps=steps)
    assert const.shape == (steps + 1, 40, 3)
    assert torch.allclose(const.norm(dim=-1), torch.ones(steps + 1, 40, dtype=torch.float64))
    n_const, n_quartic = analyze.cluster_number(const[-1]), analyze.cluster_number(quartic[-1])
    assert n_const <= 2 and n_quartic >= 8, (n_const, n_quartic)
    assert analyze.spread(const[-1]) < 0.05 and analyze.spread(quartic[-1]) > 0.9


# ----------------------------------------------------------------------------------------------
# References written out: QR by hand, Lyapunov exponents of known systems, loops over tokens, heads and pairs

F64 = torch.float64


def test_householder_qr_by_hand():
    # A = [[3, 1], [4, 2]]: x = (3, 4), |x| = 5, reflected onto -5 e_1 (the sign opposite x_0: no cancellation):
    # H_0 = I - 2 v v^T, v = (8, 4) / |.|, H_0 = [[-0.6, -0.8], [-0.8, 0.6]]; H_0 A = [[-5, -2.2], [0, 0.4]];
    # then (0.4) -> -0.4 by H_1 = -1: R = [[-5, -2.2], [0, -0.4]], Q = H_0 diag(1, -1) = [[-0.6, 0.8], [-0.8, -0.6]]
    Q, R = analyze.householder_qr(torch.tensor([[3.0, 1.0], [4.0, 2.0]], dtype=F64))
    torch.testing.assert_close(R, torch.tensor([[-5.0, -2.2], [0.0, -0.4]], dtype=F64), rtol=0, atol=1e-14)
    torch.testing.assert_close(Q, torch.tensor([[-0.6, 0.8], [-0.8, -0.6]], dtype=F64), rtol=0, atol=1e-14)
    # x_0 < 0 is reflected onto +|x| e_1; a tall A (3 x 1) gives a 3 x 1 Q
    Q, R = analyze.householder_qr(torch.tensor([[-3.0], [0.0], [4.0]], dtype=F64))
    torch.testing.assert_close(R, torch.tensor([[5.0]], dtype=F64), rtol=0, atol=1e-14)
    torch.testing.assert_close(Q, torch.tensor([[-0.6], [0.0], [0.8]], dtype=F64), rtol=0, atol=1e-14)
    # x_0 = 0 counts as positive: reflected onto -|x| e_1
    Q, R = analyze.householder_qr(torch.tensor([[0.0], [3.0], [4.0]], dtype=F64))
    torch.testing.assert_close(R, torch.tensor([[-5.0]], dtype=F64), rtol=0, atol=1e-14)
    torch.testing.assert_close(Q, torch.tensor([[0.0], [-0.6], [-0.8]], dtype=F64), rtol=0, atol=1e-14)
    # a column that is zero below the diagonal needs no reflection (no division by zero)
    Q, R = analyze.householder_qr(torch.tensor([[2.0, 1.0], [0.0, 0.0]], dtype=F64))
    torch.testing.assert_close(R, torch.tensor([[-2.0, -1.0], [0.0, 0.0]], dtype=F64), rtol=0, atol=1e-14)
    torch.testing.assert_close(Q, torch.tensor([[-1.0, 0.0], [0.0, 1.0]], dtype=F64), rtol=0, atol=1e-14)


def test_householder_qr_is_torchs_qr_up_to_signs():
    g = torch.Generator().manual_seed(3)
    A = torch.randn(3, 6, 4, generator=g, dtype=F64)
    Q, R = analyze.householder_qr(A)
    Qt, Rt = torch.linalg.qr(A)
    s = torch.sign(R.diagonal(dim1=-2, dim2=-1) / Rt.diagonal(dim1=-2, dim2=-1))      # (3, 4) of +-1
    torch.testing.assert_close(Q, Qt * s[:, None, :], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(R, Rt * s[:, :, None], rtol=1e-12, atol=1e-12)
    square = torch.randn(5, 5, generator=g, dtype=F64)
    Q, R = analyze.householder_qr(square)
    torch.testing.assert_close(Q @ R, square, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(Q.T @ Q, torch.eye(5, dtype=F64), rtol=1e-12, atol=1e-12)


def ref_lyapunov(Js, dt, k):
    """log |diag R| / T of the QR of the first k columns of the product (I + dt J_S) ... (I + dt J_1)."""
    n = Js[0].shape[-1]
    P = torch.eye(n, dtype=F64)
    for J in Js:
        P = (torch.eye(n, dtype=F64) + dt * J) @ P
    R = torch.linalg.qr(P[:, :k]).R
    return R.diagonal().abs().log() / (dt * len(Js))


def test_lyapunov_exponents_of_known_systems():
    dt = 0.1
    # diagonal J: each axis on its own, lambda_i = log|1 + dt a_i| / dt, in the order of the axes
    a = [0.3, -1.0, 0.7, -0.2]
    J = torch.diag(torch.tensor(a, dtype=F64))
    exact = torch.tensor([math.log(abs(1 + dt * ai)) / dt for ai in a], dtype=F64)
    for k, qr_every in ((None, 1), (2, 1), (4, 5), (3, 13), (None, 20)):
        lam = analyze.lyapunov_spectrum([J] * 13, dt, k=k, qr_every=qr_every)
        torch.testing.assert_close(lam, exact[:k or 4], rtol=1e-12, atol=1e-12)
    # a rotation with scaling a I + b R_90 in a plane, and a third axis c: I + dt J scales the plane by
    # s = sqrt((1 + dt a)^2 + (dt b)^2) and turns it; both plane exponents are log s / dt
    J = torch.tensor([[0.5, -2.0, 0.0], [2.0, 0.5, 0.0], [0.0, 0.0, -0.4]], dtype=F64)
    s = math.log(math.hypot(1 + dt * 0.5, dt * 2.0)) / dt
    lam = analyze.lyapunov_spectrum([J] * 9, dt)
    torch.testing.assert_close(lam, torch.tensor([s, s, math.log(1 - dt * 0.4) / dt], dtype=F64), rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError):
        analyze.lyapunov_spectrum([], dt)


def test_lyapunov_spectrum_against_the_product_of_steps():
    # a time-dependent, non-normal J_s; a batch of two systems; k < n; QR now and then
    g = torch.Generator().manual_seed(4)
    Js = [torch.randn(2, 5, 5, generator=g, dtype=F64) for _ in range(23)]
    for k, qr_every in ((5, 1), (3, 1), (3, 4), (1, 23), (2, 30)):
        lam = analyze.lyapunov_spectrum(Js, 0.05, k=k, qr_every=qr_every)
        assert lam.shape == (2, k)
        for b in range(2):
            torch.testing.assert_close(lam[b], ref_lyapunov([J[b] for J in Js], 0.05, k), rtol=1e-9, atol=1e-9)


def dense_blocks(f, X, t):
    """The Jacobian by torch.autograd.functional.jacobian, (N, D, N, D): [j, a, i, b] = d f_{j,a} / d x_{i,b}."""
    return torch.autograd.functional.jacobian(lambda Z: f(Z, t), X)


def mixing_field(N, D, seed):
    """A nonlinear field in which every output token depends on every input token, differently per pair and t."""
    g = torch.Generator().manual_seed(seed)
    M = torch.randn(N, N, D, D, generator=g, dtype=F64) / math.sqrt(N * D)
    A = torch.randn(D, D, generator=g, dtype=F64)

    def f(X, t):
        mixed = torch.einsum("ib,jiba->ja", X, M)                           # sum_i x_i M_ji
        attn = torch.softmax(X @ A @ X.T, dim=-1) @ X                         # softmax attention across tokens
        return torch.tanh((1 + t) * mixed) + 0.3 * attn * t
    return f


def test_token_jacobians_are_the_dense_jacobian():
    f = mixing_field(4, 3, seed=0)
    X = torch.randn(4, 3, dtype=F64, generator=torch.Generator().manual_seed(1))
    J = analyze.token_jacobians(f, X, 0.7)
    torch.testing.assert_close(J, dense_blocks(f, X, 0.7), rtol=1e-12, atol=1e-12)
    # with attention through scaled_dot_product_attention (what the models call)
    g = lambda X, t: torch.nn.functional.scaled_dot_product_attention(X[None], X[None], X[None] * t, is_causal=True)[0]  # noqa: E731
    torch.testing.assert_close(analyze.token_jacobians(g, X, 0.5), dense_blocks(g, X, 0.5), rtol=1e-12, atol=1e-12)


def test_token_lyapunov_against_a_loop_over_pairs():
    # a trajectory of different states, a field that depends on t: the block J_ji (output j, input i) changes
    # every step, so a transposed or swapped block gives other exponents
    N, D, steps, dt = 3, 2, 12, 0.08
    f = mixing_field(N, D, seed=2)
    g = torch.Generator().manual_seed(3)
    traj = [torch.randn(N, D, generator=g, dtype=F64) for _ in range(steps)]
    times = [0.1 * s for s in range(steps)]
    blocks = [dense_blocks(f, X, t) for X, t in zip(traj, times)]            # (N, D, N, D) each
    for k, outputs in ((None, None), (1, [2, 0])):
        lam = analyze.token_lyapunov(f, traj, times, dt, k=k, outputs=outputs)
        outs = list(range(N)) if outputs is None else outputs
        assert lam.shape == (len(outs), N, k or D)
        for a, j in enumerate(outs):
            for i in range(N):
                ref = ref_lyapunov([J[j, :, i, :] for J in blocks], dt, k or D).sort(descending=True).values
                torch.testing.assert_close(lam[a, i], ref, rtol=1e-9, atol=1e-9)
                if i != j:                                  # the pairs are not interchangeable, nor the blocks' sides
                    swapped = ref_lyapunov([J[i, :, j, :] for J in blocks], dt, k or D).sort(descending=True).values
                    transposed = ref_lyapunov([J[j, :, i, :].T for J in blocks], dt, k or D).sort(descending=True).values
                    assert (lam[a, i] - swapped).abs().max() > 1e-3 and (lam[a, i] - transposed).abs().max() > 1e-3


def test_head_spectra_against_a_loop_over_heads():
    # QK_h = W_Q^h (W_K^h)^T and OV_h = W_V^h W_O^h (D x D, rank d): their d nonzero eigenvalues
    g = torch.Generator().manual_seed(5)
    D, H = 6, 3
    d = D // H
    Wq, Wk, Wv, Wo = (torch.randn(D, D, generator=g, dtype=F64) for _ in range(4))
    qk, ov = analyze.head_spectra(Wq, Wk, Wv, Wo, n_head=H)
    assert qk.shape == ov.shape == (H, d) and qk.dtype == ov.dtype == np.complex128
    for h in range(H):
        s = slice(h * d, (h + 1) * d)
        for got, product in ((qk[h], Wq[:, s] @ Wk[:, s].T), (ov[h], Wv[:, s] @ Wo[s, :])):
            eig = np.linalg.eigvals(product.numpy())
            eig = eig[np.argsort(-np.abs(eig))[:d]]                             # the d that can be nonzero
            assert np.allclose(sorted_complex(got), sorted_complex(eig), atol=1e-9), (h, got, eig)
    _, ov = analyze.head_spectra(Wq, Wk, Wv, None, n_head=H)                   # no output map: W_O = I
    for h in range(H):
        s = slice(h * d, (h + 1) * d)
        assert np.allclose(sorted_complex(ov[h]), sorted_complex(np.linalg.eigvals(Wv[s, s].numpy())), atol=1e-9)


def test_activation_factor_against_a_double_loop():
    g = torch.Generator().manual_seed(6)
    X0 = torch.randn(2, 6, 3, generator=g, dtype=F64)
    Xl = torch.randn(2, 6, 3, generator=g, dtype=F64)
    X0[0, 4] = X0[0, 1]                                                         # equal inputs: the pair is left out
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 0, 1, 1, 0]], dtype=torch.bool)
    for m in (None, mask):
        got = analyze.activation_factor(X0, Xl, m)
        for b in range(2):
            ratios = [(Xl[b, i] - Xl[b, j]).norm() / (X0[b, i] - X0[b, j]).norm()
                      for i in range(6) for j in range(6)
                      if i != j and (m is None or (m[b, i] and m[b, j])) and not torch.equal(X0[b, i], X0[b, j])]
            assert got[b].item() == pytest.approx(sum(ratios).item() / len(ratios), rel=1e-12), (b, m)
    assert got.dtype == F64 and got.shape == (2,)
    lone = torch.tensor([[1, 0, 0, 0, 0, 0], [1, 1, 0, 0, 0, 0]], dtype=torch.bool)   # one real token: no pair,
    got = analyze.activation_factor(X0, Xl, lone)                                      # no factor (not 0)
    assert math.isnan(got[0].item()) and got[1].item() == pytest.approx(
        ((Xl[1, 0] - Xl[1, 1]).norm() / (X0[1, 0] - X0[1, 1]).norm()).item(), rel=1e-12)


def ref_kde_entropy(x):
    """Leave-one-out Gaussian KDE, Silverman's h = 0.9 min(std, IQR / 1.349) n^(-1/5) (std with n - 1; the IQR
    alone when it is 0), H = -mean_i log p_-i(x_i); -inf when h = 0."""
    x = np.asarray(x, dtype=np.float64)
    n = len(x)
    std = x.std(ddof=1)
    q25, q75 = np.percentile(x, [25, 75])
    iqr = (q75 - q25) / 1.349
    h = 0.9 * (min(std, iqr) if iqr > 0 else std) * n ** -0.2
    if h == 0:
        return -math.inf
    logp = []
    for i in range(n):
        p = sum(math.exp(-0.5 * ((x[i] - x[j]) / h) ** 2) for j in range(n) if j != i) / ((n - 1) * h * math.sqrt(2 * math.pi))
        logp.append(math.log(p))
    return -sum(logp) / n


def test_differential_entropy_against_a_loop():
    rng = np.random.default_rng(0)
    n = 24
    rows = [rng.normal(2.0, 0.7, n),                      # std ~ IQR / 1.349
            rng.uniform(-1, 3, n),                        # std < IQR / 1.349: the std sets h
            rng.laplace(0, 1, n) ** 3,                    # heavy tails: the IQR sets h
            np.r_[np.zeros(n - 5), [1.0, 2.0, 3.0, 4.0, 5.0]],   # IQR = 0: the std alone
            np.full(n, 1.5)]                              # all equal: -inf
    x = torch.tensor(np.stack(rows))
    H = analyze.differential_entropy(x)
    ref = torch.tensor([ref_kde_entropy(r) for r in rows], dtype=F64)
    assert torch.isneginf(H[-1]) and torch.isneginf(ref[-1])
    torch.testing.assert_close(H[:-1], ref[:-1], rtol=1e-10, atol=1e-10)
    for chunk in (1, 2 * n * n, 10 ** 9):                 # rows computed 1, 2 (4 chunks) or 5 at a time
        torch.testing.assert_close(analyze.differential_entropy(x, chunk_elems=chunk), H, rtol=0, atol=0)
    torch.testing.assert_close(analyze.differential_entropy(x[:4].reshape(2, 2, n)), H[:4].reshape(2, 2),
                               rtol=0, atol=0)


def test_simulate_attention_ode_against_a_loop():
    g = torch.Generator().manual_seed(7)
    N, D, T, steps = 5, 3, 1.4, 7
    x0 = 2 * torch.randn(N, D, generator=g, dtype=F64)                        # not on the sphere yet
    Wq, Wk, Wv = (torch.randn(D, D, generator=g, dtype=F64) for _ in range(3))
    growth = lambda t: 1 + t ** 2                                              # noqa: E731
    got = analyze.simulate_attention_ode(x0, Wq, Wk, Wv, growth, T=T, steps=steps)
    dt = T / steps
    X = [x / x.norm() for x in x0]
    ref = [torch.stack(X)]
    for s in range(steps):
        gt = growth(s * dt)                                                     # g at the left end of the step
        new = []
        for i in range(N):
            scores = torch.stack([(X[i] @ (gt * Wq)) @ (X[j] @ (gt * Wk)) for j in range(N)])
            p = torch.exp(scores - scores.max())
            p = p / p.sum()
            F = sum(p[j] * (X[j] @ (gt * Wv)) for j in range(N))
            F = F - (F @ X[i]) * X[i]                                           # tangent at x_i
            y = X[i] + dt * F
            new.append(y / y.norm())
        X = new
        ref.append(torch.stack(X))
    torch.testing.assert_close(got, torch.stack(ref), rtol=1e-12, atol=1e-12)
    single = analyze.simulate_attention_ode(x0.float(), Wq.float(), Wk.float(), Wv.float(), growth, T=T, steps=steps)
    assert single.dtype == F64                               # float32 inputs: computed in float64 all the same
    torch.testing.assert_close(single, got, rtol=1e-6, atol=1e-6)
    # the growth laws of C.8: g = 1 and g = 1 + t^k
    assert analyze.growth(0)(3.0) == 1.0 and analyze.growth(2)(3.0) == 10.0 and analyze.growth(4)(0.5) == 1.0625


def test_cluster_number_and_spread_by_hand():
    line = lambda *xs: torch.tensor([[x, 0.0] for x in xs], dtype=F64)      # noqa: E731
    # single linkage: 0, 0.125, 0.25 chain into one cluster (0 and 0.25 are 0.25 apart); eps is inclusive
    X = line(0.25, 3.0, 0.0, 2.875, 0.125, 5.0)
    assert analyze.cluster_number(X, eps=0.125) == 3
    assert analyze.cluster_number(X, eps=0.124) == 6
    assert analyze.cluster_number(X, eps=1.999) == 3 and analyze.cluster_number(X, eps=2.0) == 2   # 3 and 5 join
    assert analyze.cluster_number(X, eps=2.624) == 2 and analyze.cluster_number(X, eps=2.625) == 1
    assert analyze.cluster_number(line(1.0), eps=0.1) == 1
    # against connected components found by a breadth-first search
    g = torch.Generator().manual_seed(8)
    for trial in range(5):
        P = torch.rand(30, 2, generator=g, dtype=F64)
        for eps in (0.05, 0.1, 0.2):
            close = [[(P[i] - P[j]).norm().item() <= eps for j in range(30)] for i in range(30)]
            seen, comps = set(), 0
            for s in range(30):
                if s not in seen:
                    comps += 1
                    frontier = [s]
                    seen.add(s)
                    while frontier:
                        a = frontier.pop()
                        for b in range(30):
                            if close[a][b] and b not in seen:
                                seen.add(b)
                                frontier.append(b)
            assert analyze.cluster_number(P, eps) == comps, (trial, eps)
    # spread: the mean distance between two different points
    assert analyze.spread(line(0.0, 1.0, 3.0)) == pytest.approx((1 + 3 + 2) / 3, rel=1e-15)
    assert analyze.spread(torch.tensor([[0.0, 0.0], [3.0, 4.0]], dtype=F64)) == pytest.approx(5.0, rel=1e-15)
    torch.testing.assert_close(analyze.sphere(torch.tensor([[3.0, 4.0]], dtype=F64)),
                               torch.tensor([[0.6, 0.8]], dtype=F64))


# ----------------------------------------------------------------------------------------------
# Command line

def tiny_checkpoint(path, model_name="softmax", task="listops", data_dir=None, **cfg):
    module, overrides = {"softmax": ("simpletron", {"attention": "softmax", "variant": "vanilla"}),
                         "simpletron": ("simpletron", {})}[model_name]
    config = simpletron.Config(**{**dict(vocab_size=16, block_size=64, n_layer=2, n_head=2, n_embd=16, dropout=0.0,
                                         head="cls", n_classes=10), **overrides, **cfg})
    model = simpletron.Model(config)
    torch.save({"model_name": model_name, "config": dataclasses.asdict(config), "model": model.state_dict(),
                "args": {"task": task, "data_dir": data_dir, "cache_dir": "data", "seed": 0, "tokenizer": "gpt2"}},
               path)
    return str(path)


def cli(*argv):
    return subprocess.run([sys.executable, os.path.join(ROOT, "analyze.py"), *map(str, argv)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def test_bad_input_is_one_line_and_no_traceback(tmp_path):
    ckpt = tiny_checkpoint(tmp_path / "gpt.pt")
    for argv in [("spectra", "--out", tmp_path, "--ckpt", tmp_path / "missing.pt")]:   # the command line: one line
        r = cli(*argv)
        assert r.returncode == 2, (argv, r.stderr)
        assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, (argv, r.stderr)
        assert r.stderr.startswith("error: ")
    cases = [("nonsense",),
             ("lyapunov", "--ckpt", ckpt),                      # not a DiffEqFormer
             ("experts", "--ckpt", ckpt),                       # not a TransJect
             ("spectra",),                                      # no --ckpt
             ("cluster", "--degrees", "one,two"),
             ("cluster", "--weights", "ones"),
             ("spectra", "--ckpt", ckpt, "--bogus", "1")]
    for argv in cases:
        with pytest.raises(analyze.UsageError) as e:
            analyze.main([*map(str, argv), "--out", str(tmp_path)])
        assert "\n" not in str(e.value) and str(e.value), argv


def test_help_names_the_models_and_the_defaults(capsys):
    def help_of(*argv):
        with pytest.raises(SystemExit):
            analyze.main([*argv, "--help"])
        return " ".join(capsys.readouterr().out.split())      # one line, whatever the terminal's width
    top = help_of()
    for name, (what, models) in analyze.SUBCOMMANDS.items():
        assert f"{name} {what}. For: {models}" in top          # each subcommand: one line and what it applies to
        text = help_of(name)
        assert f"For: {models}." in text and "--out OUT folder for" in text and "[default: out/analysis]" in text
    assert "For: DiffEqFormer checkpoints of a language model." in help_of("lyapunov")
    assert "For: TransJect checkpoints." in help_of("experts")
    lyapunov = help_of("lyapunov")
    assert "exponents to compute per token pair [default: 8]" in lyapunov and "[default: -1]" in lyapunov
    assert "tangent equation" in lyapunov and "activation factor" not in lyapunov   # its own paragraph only
    cluster = help_of("cluster")
    assert "[default: 0,1,2,4]" in cluster and "Euler steps [default: 200]" in cluster and "--ckpt" not in cluster
    assert "--seed" not in help_of("spectra") and "[default: None]" not in help_of("activation")
    assert "--table NAME" in help_of("curves")


def test_spectra_title_names_the_product_the_model_has(tmp_path):
    out = tmp_path / "out"
    analyze.main(["spectra", "--ckpt", tiny_checkpoint(tmp_path / "gpt.pt"), "--out", str(out)])
    assert json.loads((out / "spectra.json").read_text())["ov"] == "OV = W_V^h W_O^h"
    analyze.main(["spectra", "--ckpt", tiny_checkpoint(tmp_path / "st.pt", "simpletron"), "--out", str(out)])
    assert json.loads((out / "spectra.json").read_text())["ov"] == "OV = W_V^h (no output map W_O)"


def test_spectra_and_activation_write_json_and_png(tmp_path):
    import test_train                                       # tiny ListOps files
    lra = test_train.write_listops(tmp_path / "lra", 8, seed=1)
    a = tiny_checkpoint(tmp_path / "a.pt", "softmax", data_dir=str(lra))
    b = tiny_checkpoint(tmp_path / "b.pt", "simpletron", data_dir=str(lra))
    out = tmp_path / "out"
    analyze.main(["spectra", "--ckpt", a, "--out", str(out)])
    spec = json.loads((out / "spectra.json").read_text())
    assert [r["depth"] for r in spec["rows"]] == [1, 2] and len(spec["rows"][0]["qk"]) == 2
    assert len(spec["rows"][0]["qk"][0]) == 8                # d = 16 / 2 eigenvalues per head
    analyze.main(["activation", "--ckpt", a, "--ckpt", b, "--out", str(out), "--n_seq", "4"])
    act = json.loads((out / "activation.json").read_text())
    assert len(act["models"]) == 2
    for m in act["models"]:
        assert len(m["activation_factor"]) == 3 and len(m["activation_factor"][0]) == 4
        assert np.allclose(m["activation_factor"][0], 1.0)   # layer 0 against itself
    for name in ("spectra", "activation"):
        assert (out / f"{name}.png").stat().st_size > 10_000


# ----------------------------------------------------------------------------------------------
# TransJect and DiffEqFormer through the same commands

def model_checkpoint(path, model_name, config, task="listops", data_dir=None, tokenizer="gpt2", cache_dir="data"):
    import config as cfg
    model = cfg.build_model(model_name, config)
    torch.save({"model_name": model_name, "config": dataclasses.asdict(model.config), "model": model.state_dict(),
                "args": {"task": task, "data_dir": data_dir, "cache_dir": cache_dir, "seed": 0, "tokenizer": tokenizer}},
               path)
    return str(path), model


def test_lyapunovs_text_is_read_with_the_runs_own_tokenizer(tmp_path):
    """--text as the language model read its training text: bytes are their own ids (0-255, 256 <|endoftext|>),
    characters are numbered from 1 in sorted order, as the run's cache numbered them."""
    deq = dict(vocab_size=300, block_size=16, n_layer=1, n_head=2, n_embd=8, head="lm")
    _, _ = model_checkpoint(tmp_path / "b.pt", "diffeqformer", deq, task="textfile", tokenizer="byte")
    ids, labels = analyze.encode_text("to é", torch.load(tmp_path / "b.pt", weights_only=True))
    assert ids.tolist() == [list("to é".encode())] and labels[:3] == ["t", "o", " "]
    (tmp_path / "t.txt").write_text("to be, or not to be\n" * 20)
    model_checkpoint(tmp_path / "c.pt", "diffeqformer", {**deq, "vocab_size": 12}, task="textfile", tokenizer="char",
                     data_dir=str(tmp_path / "t.txt"), cache_dir=str(tmp_path / "cache"))
    ids, labels = analyze.encode_text("be not", torch.load(tmp_path / "c.pt", weights_only=True))
    chars = sorted(set("to be, or not to be\n"))
    assert ids.tolist() == [[chars.index(c) + 1 for c in "be not"]] and labels == list("be not")
    with pytest.raises(data.DataError, match="--text, line 1: character 'z' is not in the training text"):
        analyze.encode_text("zebra", torch.load(tmp_path / "c.pt", weights_only=True))


def test_lyapunovs_text_of_a_gpt2_run_is_its_tiktoken_pieces(tmp_path, monkeypatch):
    """A run of the gpt2 tokenizer (or any tiktoken encoding): --text's ids are the encoding's, each labelled with the
    text of its own piece. The encoding is made here (bytes, and ' t', 'he' merged), not downloaded."""
    import tiktoken
    ranks = {bytes([i]): i for i in range(256)} | {b" t": 256, b"he": 257}
    enc = tiktoken.Encoding(name="merges", pat_str=analyze.tasks.sources.GPT2_PATTERN, mergeable_ranks=ranks,
                            special_tokens={})
    monkeypatch.setattr(analyze.tasks.sources, "get_tokenizer", lambda name, task: enc)
    deq = dict(vocab_size=300, block_size=16, n_layer=1, n_head=2, n_embd=8, head="lm")
    model_checkpoint(tmp_path / "g.pt", "diffeqformer", deq, task="textfile", tokenizer="gpt2")
    ids, labels = analyze.encode_text("a the", torch.load(tmp_path / "g.pt", weights_only=True))
    assert ids.tolist() == [[ord("a"), 256, 257]] and labels == ["a", " t", "he"]


def test_lyapunovs_words_without_an_unk_in_the_vocabulary_are_one_line(tmp_path):
    for split in ("train", "valid", "test"):
        (tmp_path / f"ptb.{split}.txt").write_text(" the cat sat \n a dog ran \n")   # no <unk> among the words
    deq = dict(vocab_size=8, block_size=16, n_layer=1, n_head=2, n_embd=8, head="lm")
    model_checkpoint(tmp_path / "p.pt", "diffeqformer", deq, task="ptb", data_dir=str(tmp_path))
    ckpt = torch.load(tmp_path / "p.pt", weights_only=True)
    ids, labels = analyze.encode_text("the dog sat", ckpt)
    assert ids.tolist() == [[7, 4, 6]] and labels == ["the", "dog", "sat"]    # <eos> a cat dog ran sat the, from 1
    with pytest.raises(analyze.UsageError, match="--text: word 'zebra' is not in the run's vocabulary, which has no "
                                                 "<unk> to stand in for it"):
        analyze.encode_text("the zebra", ckpt)


def test_lyapunov_of_a_diffeqformer(tmp_path):
    pytest.importorskip("diffeqformer")
    path, model = model_checkpoint(tmp_path / "deq.pt", "diffeqformer",
                                   dict(vocab_size=300, block_size=16, n_layer=3, n_head=2, n_embd=8, head="lm"),
                                   task="textfile", tokenizer="byte")
    # the trajectory is the Euler flow of the vector field at model.times(): what the tangent equation follows
    idx = torch.tensor([[5, 9, 2, 7]])
    traj, times, dt = model.trajectory(idx), model.times(), model.dt()
    assert len(traj) == len(times) + 1 and abs(dt * len(times) - 1) < 1e-12
    with torch.no_grad():
        for k, t in enumerate(times):
            assert torch.allclose(traj[k + 1], traj[k] + dt * model.vector_field(traj[k], t), atol=1e-6)
    out = tmp_path / "out"
    analyze.main(["lyapunov", "--ckpt", path, "--out", str(out), "--text", "abcde", "--k", "3"])
    res = json.loads((out / "lyapunov.json").read_text())
    assert res["tokens"] == list("abcde") and res["steps"] == 3 and len(res["largest"]) == 5
    assert all(v is None for v in res["largest"][0][1:])        # causal: no output sees a later input
    assert len(res["exponents_of_output"]) == 5 and len(res["exponents_of_output"][0]) == 3
    analyze.main(["spectra", "--ckpt", path, "--out", str(out), "--grid", "5"])
    spec = json.loads((out / "spectra.json").read_text())
    assert [r["depth"] for r in spec["rows"]] == [0.0, 0.25, 0.5, 0.75, 1.0]
    W = model.attention_weights(0.5)                          # the row at t = 0.5 is W(0.5)'s spectrum
    qk, _ = analyze.head_spectra(W["q"], W["k"], W["v"], W["o"], 2)
    assert np.allclose(np.array(spec["rows"][2]["qk"][1])[:, 0], qk[1].real)


def test_sample_batch_is_the_val_splits_draw_cut_to_max_len_tokens(tmp_path):
    import test_train
    lra = test_train.write_listops(tmp_path / "lra", 8, seed=1)
    path, _ = model_checkpoint(tmp_path / "s.pt", "simpletron", dict(vocab_size=16, block_size=64, n_layer=1, n_embd=8,
                                                                    n_head=2, head="cls", n_classes=10), data_dir=str(lra))
    ckpt = torch.load(path, weights_only=True)
    full, _ = analyze.task_of(ckpt).split("val").sample(3, np.random.default_rng(7))
    x = analyze.sample_batch(ckpt, 3, 5, seed=7)
    assert full.shape[1] > 5 and x.shape == (3, 5) and np.array_equal(np.asarray(x), np.asarray(full)[:, :5])


def test_experts_and_activation_of_a_transject(tmp_path):
    pytest.importorskip("transject")
    import test_train
    lra = test_train.write_listops(tmp_path / "lra", 8, seed=1)
    path, model = model_checkpoint(tmp_path / "tj.pt", "transject",
                                   dict(vocab_size=16, block_size=64, n_layer=3, n_embd=16, dropout=0.0, head="cls",
                                        n_classes=10, n_experts=4), data_dir=str(lra))
    out = tmp_path / "out"
    analyze.main(["experts", "--ckpt", path, "--out", str(out), "--n_seq", "5"])
    res = json.loads((out / "experts.json").read_text())["models"][0]
    assert res["n_layer"] == 3 and res["n_expert"] == 4
    for w in res["expert_weights"]:                           # one convex combination per sample
        w = np.array(w)
        assert w.shape == (5, 4) and np.allclose(w.sum(1), 1) and (w >= 0).all()
    assert all(0 < v < 1 / 3 for v in res["residual_weights"].values())
    analyze.main(["activation", "--ckpt", path, "--out", str(out), "--n_seq", "4"])
    act = json.loads((out / "activation.json").read_text())["models"][0]
    assert len(act["activation_factor"]) == 4 and np.allclose(act["activation_factor"][0], 1.0)


def test_run_names_and_words_with_dollars_are_drawn_as_written(tmp_path, monkeypatch):
    """Battery a13, a14: a run folder named $TASK_$SEED (an out_dir whose $ no shell expanded) was read by matplotlib
    as mathematics: a ParseSyntaxException out of analyze.py spectra, whose title names the run. Every subcommand that
    draws a run's folder, or the words of --text, draws them as written (the figure's texts read back)."""
    import test_curves
    import train
    figures = test_curves.drawn_texts(monkeypatch)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.txt").write_text("to be, or not to be: that is the question.\n" * 40)
    text = ["--task", "textfile", "--data_dir", "t.txt", "--tokenizer", "char", "--cache_dir", "cache"]
    a, b = test_curves.DOLLARS
    for name in (a, b):
        train.main(["--model", "simpletron", *text, "--out_dir", name, "--attn_std_interval", "1", "--n_layer", "1",
                    "--n_embd", "16", "--n_head", "2", "--block_size", "16", "--batch_size", "4", "--max_iters", "2",
                    "--eval_interval", "2", "--eval_iters", "1", "--warmup", "1", "--device", "cpu"])
    analyze.main(["spectra", "--ckpt", f"{a}/ckpt.pt", "--out", "o"])
    assert f"Spectra of the attention weights per head vs layer: simpletron ({a})" in figures[-1], figures[-1]
    analyze.main(["activation", "--ckpt", f"{a}/ckpt.pt", "--ckpt", f"{b}/ckpt.pt", "--n_seq", "2", "--out", "o"])
    assert {f"simpletron ({a})", f"simpletron ({b})"} <= set(figures[-1]), figures[-1]
    analyze.main(["attnstd", "--run", a, "--run", b, "--out", "o"])
    assert {f"{a}: std of the attention weights", f"{b}: std of the attention output"} <= set(figures[-1])
    model_checkpoint(f"{a}/tj.pt", "transject", dict(vocab_size=32, block_size=16, n_layer=1, n_embd=8, head="lm",
                                                     n_experts=2), task="textfile", data_dir="t.txt", tokenizer="char",
                     cache_dir="cache")
    analyze.main(["experts", "--ckpt", f"{a}/tj.pt", "--n_seq", "2", "--out", "o"])
    assert f"transject ({a}), textfile: expert weights (paper fig. 7)" in figures[-1], figures[-1]
    path, _ = model_checkpoint("deq.pt", "diffeqformer", dict(vocab_size=8, block_size=16, n_layer=1, n_head=2,
                                                              n_embd=8, head="lm"), task="ptb")
    torch.save({**torch.load(path, weights_only=True), "vocabulary": ["<unk>", "a", "b"]}, path)   # the run's words
    analyze.main(["lyapunov", "--ckpt", path, "--text", r"a $x^2_i\$ b$$", "--k", "2", "--out", "o"])
    assert {"a", r"$x^2_i\$", "b$$"} <= set(figures[-1]), figures[-1]     # the words as ticks, the last in a title
    assert any(t.startswith("sensitivity of output token j = 2 ('b$$', which") for t in figures[-1]), figures[-1]


def out_named_proj(model):                                   # a fork's attention whose output map is called proj
    for block in model.blocks:
        block.attn.proj = block.attn.out
        del block.attn.out
    return model


def fewer_kv_heads(model):                                   # keys and values of one head of 8 for both heads
    model.blocks[0].attn.qkv = torch.nn.Linear(16, 16 + 2 * 8)
    return model


def split_qkv(model):                                        # W_Q, W_K, W_V as maps of their own
    for block in model.blocks:
        block.attn.q, block.attn.k, block.attn.v = (torch.nn.Linear(16, 16) for _ in range(3))
        del block.attn.qkv
    return model


def narrow_out(model):                                       # the second block's W_O to another width
    model.blocks[1].attn.out = torch.nn.Linear(16, 8)
    return model


@pytest.mark.parametrize("name, change, lacks", [
    ("softmax", out_named_proj, "blocks[0].attn.out with a weight (n_embd, n_embd) or none"),
    ("softmax", fewer_kv_heads, "blocks[0].attn.qkv with a weight (3 n_embd, n_embd)"),
    ("softmax", split_qkv, "blocks[0].attn.qkv with a weight (3 n_embd, n_embd)"),
    ("softmax", narrow_out, "blocks[1].attn.out with a weight (n_embd, n_embd) or none"),
    ("transject", lambda m: m, "blocks[0].attn.qkv with a weight (3 n_embd, n_embd)"),
    ("diffeqformer", lambda m: setattr(m, "attention_weights", None) or m, "attention_weights()"),
    ("diffeqformer", lambda m: setattr(m, "times", None) or m, "times()")])
def test_spectra_of_a_model_whose_weights_it_cannot_read_is_one_line_before_any_work(name, change, lacks, tmp_path,
                                                                                     monkeypatch, capsys):
    """Battery f19: a fork whose blocks' attention has qkv but names its output map proj was an AttributeError
    ('Attention' object has no attribute 'out') out of attention_weights, past every check. spectra says in one line
    which attributes it reads and the first that the model lacks, before any work."""
    config = dict(vocab_size=16, block_size=16, n_layer=2, n_head=2, n_embd=16, head="lm")
    path, _ = model_checkpoint(tmp_path / "ckpt.pt", name, config)
    build = analyze.model_of_checkpoint
    monkeypatch.setattr(analyze, "model_of_checkpoint", lambda ckpt, path: change(build(ckpt, path)))
    with pytest.raises(SystemExit) as e:
        data.run_main(lambda: analyze.main(["spectra", "--ckpt", path, "--out", str(tmp_path / "out")]),
                      analyze.UsageError)
    assert e.value.code == 2 and capsys.readouterr().err == (
        "error: spectra reads each block's attn.qkv (W_Q, W_K, W_V) and attn.out (W_O; nn.Identity: none), or an ODE "
        f"model's attention_weights(t) and times(); {path} holds {name}, which has no {lacks} (TransJect: X U Sigma V, "
        "no W_Q W_K^T; a new model: name its maps so)\n")
    assert not (tmp_path / "out").exists()


def test_spectra_reads_every_model_of_the_project_with_query_key_and_value_weights():
    """What spectra_lacks asks of a model, each of the project's models that spectra draws has."""
    import config
    base = dict(vocab_size=16, block_size=16, n_layer=2, n_head=2, n_embd=16, head="lm")
    for name, extra in (("softmax", {}), ("simpletron", {}), ("softmax", {"orthogonal": True}), ("diffeqformer", {}),
                        ("diffeqformer", {"discrete": True})):   # W_O an nn.Linear, none, orthogonal; W(t), W_l
        assert analyze.spectra_lacks(config.build_model(name, {**base, **extra})) is None, (name, extra)


def test_activation_of_match_classifiers_reads_both_documents_of_each_pair(tmp_path):
    """A match classifier (retrieval: ids (B, 2, L)) encodes each document on its own: its layers hold 2B
    sequences. DiffEqFormer's hidden_states took only (B, L) (a ValueError); now every model gives 2B rows."""
    pytest.importorskip("diffeqformer")
    pytest.importorskip("transject")
    from test_data import write_aan
    write_aan(tmp_path / "aan", 4)
    out, rows = tmp_path / "out", {}
    for name, extra in (("simpletron", {}), ("transject", {"n_experts": 2}), ("diffeqformer", {})):
        path, _ = model_checkpoint(tmp_path / f"{name}.pt", name, dict(vocab_size=257, block_size=32, n_layer=2,
                                   n_head=2, n_embd=16, dropout=0.0, head="match", n_classes=2, **extra),
                                   task="retrieval", data_dir=str(tmp_path / "aan"), cache_dir=str(tmp_path / "c"))
        analyze.main(["activation", "--ckpt", path, "--out", str(out), "--n_seq", "3"])
        rows[name] = json.loads((out / "activation.json").read_text())["models"][0]
    for name, r in rows.items():
        assert r["n_seq"] == 6 and len(r["activation_factor"]) == 3 and len(r["entropy"]) == 3, name
        assert len(r["activation_factor"][0]) == 6 and np.allclose(r["activation_factor"][0], 1.0), name
        assert all(np.isfinite(v).all() for v in r["activation_factor"] + r["entropy"]), name
    assert rows["diffeqformer"]["tokens"] == rows["simpletron"]["tokens"]      # both prepend a CLS to each document


def test_the_cluster_command_runs_the_ode_it_is_given(tmp_path, capsys, monkeypatch):
    """analyze.py cluster: each degree's trajectory is the Euler ODE of its flags (T, steps, seed, weights), and the
    clusters and spread it reports are those of that trajectory's end; the clusters and spread panels share the
    bottom row in halves."""
    figures, save = [], analyze.save_fig
    monkeypatch.setattr(analyze, "save_fig", lambda fig, *a: (figures.append(fig), save(fig, *a))[1])
    analyze.main(["cluster", "--tokens", "6", "--steps", "12", "--T", "1.5", "--degrees", "0,2", "--eps", "0.3",
                  "--seed", "3", "--weights", "random", "--out", str(tmp_path)])
    out = json.loads((tmp_path / "cluster.json").read_text())
    assert (out["tokens"], out["steps"], out["T"], out["seed"], out["eps"]) == (6, 12, 1.5, 3, 0.3)
    x0, (Wq, Wk, Wv) = analyze.cluster_start(3, 6, weights="random")
    for run, deg in zip(out["runs"], (0, 2)):
        g = (lambda t: 1.0) if deg == 0 else (lambda t: 1.0 + t * t)
        X = x0.clone()
        for n in range(12):                                  # the Euler loop, step 1.5 / 12
            traj = analyze.simulate_attention_ode(X, g(n * 0.125) * Wq, g(n * 0.125) * Wk, g(n * 0.125) * Wv,
                                                  lambda t: 1.0, T=0.125, steps=1)
            X = traj[-1]
        assert run["degree"] == deg
        torch.testing.assert_close(torch.tensor(run["final"], dtype=F64), X, rtol=0, atol=1e-9)
        assert run["clusters"] == analyze.cluster_number(X, 0.3) and run["spread"] == pytest.approx(analyze.spread(X))
    assert (tmp_path / "cluster.png").exists() and "g(t) =   1 + t^2:  2 clusters" in capsys.readouterr().out
    clusters, spread = [ax.get_position() for ax in figures[0].axes if ax.name != "3d"]
    assert clusters.x0 < clusters.x1 < spread.x0 and clusters.width == pytest.approx(spread.width)


def test_the_task_of_a_checkpoint_is_rebuilt_with_its_generators_settings(tmp_path):
    """A generated run (MQAR at 16 tokens, 2 pairs, vocabulary 16; ListOps of a setting of its own) is analysed on
    its own examples, not the task's defaults (a block of 16 was refused against the default 64 tokens)."""
    base = {"cache_dir": str(tmp_path), "seed": 0, "tokenizer": None}
    mqar = analyze.task_of({"args": {**base, "task": "mqar", "recall_len": 16, "recall_pairs": 2, "recall_vocab": 16,
                                     "recall_sizes": "8,4,4"}, "config": {"block_size": 16}})
    assert mqar.vocab_size == 16 and mqar.block_size == 16 and len(mqar.split("val")) == 4
    listops = analyze.task_of({"args": {**base, "task": "listops", "listops_depth": 3, "listops_args": "2,3",
                                        "listops_len": "5,20", "listops_sizes": "6,3,3"}, "config": {}})
    assert len(listops.split("test")) == 3 and listops.block_size == 20


def test_words_are_read_as_typed_then_lower_cased_then_unk(tmp_path):
    for split in ("train", "valid", "test"):
        (tmp_path / f"ptb.{split}.txt").write_text(" Alpha beta gamma \n")      # capitals kept, no <unk>
    deq = dict(vocab_size=8, block_size=16, n_layer=1, n_head=2, n_embd=8, head="lm")
    model_checkpoint(tmp_path / "p.pt", "diffeqformer", deq, task="ptb", data_dir=str(tmp_path))
    ckpt = torch.load(tmp_path / "p.pt", weights_only=True)
    ids, labels = analyze.encode_text("Alpha beta Gamma", ckpt)       # <eos> Alpha beta gamma, from 1
    assert ids.tolist() == [[2, 3, 4]] and labels == ["Alpha", "beta", "Gamma"]
    with pytest.raises(analyze.UsageError, match="word 'alpha' is not in the run's vocabulary"):
        analyze.encode_text("alpha", ckpt)


def test_a_damaged_vocabulary_or_null_tokenizer_is_no_traceback(tmp_path, monkeypatch):
    (tmp_path / "t.txt").write_text("to be\n" * 20)
    deq = dict(vocab_size=8, block_size=16, n_layer=1, n_head=2, n_embd=8, head="lm")
    model_checkpoint(tmp_path / "c.pt", "diffeqformer", deq, task="textfile", tokenizer="char",
                     data_dir=str(tmp_path / "t.txt"), cache_dir=str(tmp_path / "cache"))
    ckpt = {**torch.load(tmp_path / "c.pt", weights_only=True), "vocabulary": ["\n", " ", "b", "e", "o", "t"]}
    with pytest.raises(analyze.UsageError, match="vocabulary is a list, not a char run's characters"):
        analyze.encode_text("to be", ckpt)
    seen = {}
    monkeypatch.setattr(analyze.data, "load_task", lambda name, **kw: seen.update(kw) or 1 / 0)
    with pytest.raises(ZeroDivisionError):
        analyze.task_of({"config": {}, "args": {"task": "textfile", "tokenizer": None, "data_dir": "t.txt"}})
    assert seen["tokenizer"] == "gpt2"                                  # null: the default, as train.py's


def test_cluster_refuses_a_degree_twice(tmp_path):
    with pytest.raises(analyze.UsageError, match=r"^--degrees 2,2 with --T 10: allowed are at most 8 different"):
        analyze.main(["cluster", "--degrees", "2,2", "--out", str(tmp_path)])


@pytest.mark.parametrize("command", list(analyze.SUBCOMMANDS))
@pytest.mark.parametrize("kind, other", [("json", "png"), ("png", "json")])
def test_an_output_file_that_cannot_be_written_is_refused_before_any_work(tmp_path, command, kind, other):
    """OUT/COMMAND.json and OUT/COMMAND.png, each a folder here: refused in one line before the analysis, the other
    file never written (not a figure left beside a missing JSON)."""
    ckpt = tiny_checkpoint(tmp_path / "gpt.pt")
    given = {"attnstd": ["--run", str(tmp_path / "r")], "curves": [str(tmp_path / "r")], "cluster": []}
    (tmp_path / "out" / f"{command}.{kind}").mkdir(parents=True)
    with pytest.raises(analyze.UsageError) as e:
        analyze.main([command, *given.get(command, ["--ckpt", ckpt]), "--out", str(tmp_path / "out")])
    assert str(e.value) == (f"--out {tmp_path / 'out'}: {tmp_path / 'out' / f'{command}.{kind}'} is there and is no "
                            "file this command can write over (a folder?); move it away or choose another --out")
    assert not (tmp_path / "out" / f"{command}.{other}").exists()


def test_activation_refuses_sequences_of_one_token(tmp_path):
    """The activation factor is a mean over pairs of tokens: --max_len 1 has none (it was reported as 0, and
    layer 0's, the input against itself, is 1): refused in one line before any work."""
    with pytest.raises(analyze.UsageError, match=r"^--max_len 1: the activation factor compares two tokens of a "
                       r"sequence; allowed is at least 2$"):
        analyze.main(["activation", "--ckpt", tiny_checkpoint(tmp_path / "a.pt"), "--max_len", "1",
                      "--out", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("command", ["activation", "experts"])
def test_a_checkpoint_given_twice_is_refused(tmp_path, monkeypatch, command):
    monkeypatch.chdir(tmp_path)
    path = tiny_checkpoint(tmp_path / "a.pt")
    with pytest.raises(analyze.UsageError, match=rf"^{command}: the checkpoint \./a\.pt is given twice \(--ckpt once "
                       r"is its column\)$"):
        analyze.main([command, "--ckpt", path, "--ckpt", "./a.pt", "--out", "out"])
    assert not (tmp_path / "out").exists()


def test_analyze_refuses_a_damaged_record_of_the_vocabulary_as_sample_py_does(tmp_path):
    """A checkpoint whose recorded characters hold one twice is damaged whichever program reads it: analyze.py's
    --text (which used the record as it was) refuses it in one line naming the file, before any output."""
    deq = dict(vocab_size=12, block_size=16, n_layer=1, n_head=2, n_embd=8, head="lm")
    path, _ = model_checkpoint(tmp_path / "c.pt", "diffeqformer", deq, task="textfile", tokenizer="char")
    ckpt = torch.load(path, weights_only=True)
    for chars, what in (("\n abb", "hold 'b' twice"), ("\n bae", "are out of order")):
        torch.save({**ckpt, "vocabulary": chars}, path)
        with pytest.raises(analyze.UsageError) as e:
            analyze.main(["lyapunov", "--ckpt", path, "--out", str(tmp_path / "out"), "--text", "ab", "--k", "2"])
        assert str(e.value) == (f"checkpoint {path} is damaged: its recorded characters {what} (a run records "
                                f"{'each once' if 'twice' in what else 'them sorted'}); use the run's other "
                                "checkpoint or train again")
        assert not (tmp_path / "out").exists()


def test_a_runs_relative_data_dir_is_read_from_where_the_run_was_started(tmp_path, monkeypatch):
    """A PTB run started in A with --data_dir p --out_dir r (relative, as typed), its checkpoint read from B, where
    another p/ is: analyze.py's --text numbers the words of A's training file, not B's."""
    a, b = tmp_path / "A", tmp_path / "B"
    for folder, words in ((a, " the cat sat \n a dog ran \n"), (b, " zebra \n")):
        (folder / "p").mkdir(parents=True)
        for split in ("train", "valid", "test"):
            (folder / "p" / f"ptb.{split}.txt").write_text(words)
    deq = dict(vocab_size=8, block_size=16, n_layer=1, n_head=2, n_embd=8, head="lm")
    (a / "r").mkdir()
    model_checkpoint(a / "r" / "ckpt.pt", "diffeqformer", deq, task="ptb", data_dir="p")
    ckpt = torch.load(a / "r" / "ckpt.pt", weights_only=True)
    torch.save({**ckpt, "args": {**ckpt["args"], "out_dir": "r"}}, a / "r" / "ckpt.pt")
    monkeypatch.chdir(b)
    loaded = analyze.load_checkpoint("../A/r/ckpt.pt")
    assert loaded["args"]["data_dir"] == str(a / "p")
    assert analyze.encode_text("the dog", loaded)[0].tolist() == [[7, 4]]    # <eos> a cat dog ran sat the, from 1
    monkeypatch.chdir(a)                                     # where it was started: as recorded
    assert analyze.load_checkpoint("r/ckpt.pt")["args"]["data_dir"] == "p"


def test_a_full_disk_while_a_figure_is_written_keeps_the_earlier_png_and_names_it(tmp_path, monkeypatch, capsys):
    """Battery: save_fig wrote OUT/NAME.png in place, so a full disk midway left half a PNG where the earlier one was,
    and the line said "a file". The PNG is written beside it first (data.atomic_write): the earlier one is kept
    whole, no temporary file is left, and the one line names the PNG."""
    import errno
    import matplotlib.figure
    argv = ["cluster", "--tokens", "6", "--steps", "4", "--degrees", "0", "--out", str(tmp_path)]
    analyze.main(argv)
    before, png = (tmp_path / "cluster.png").read_bytes(), tmp_path / "cluster.png"

    def full(fig, target, **kw):                             # part of the PNG written, then the disk is full
        if isinstance(target, (str, os.PathLike)):           # (in place: over the earlier PNG)
            with open(target, "wb") as f:
                f.write(before[:100])
        else:
            target.write(before[:100])
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", full)
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        data.run_main(lambda: analyze.main(argv), analyze.UsageError)
    err = capsys.readouterr().err
    assert e.value.code == 2 and len(err.splitlines()) == 1, err
    assert err.startswith(f"error: cannot write {png}: No space left on device"), err
    assert png.read_bytes() == before and sorted(os.listdir(tmp_path)) == ["cluster.json", "cluster.png"]
