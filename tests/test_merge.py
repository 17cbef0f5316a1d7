"""Tests for merge.py: known answers on hand-made deltas, method properties, peft round trips on a tiny Llama.

Run:  python -m pytest -q tests/test_merge.py          (a few seconds on 2 CPU cores)
The adapter-vs-delta comparison in results/merge.md:  python tests/test_merge.py --compare
"""
import json
import math
import re
import shutil
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import merge  # noqa: E402

T = torch.tensor


# ---------------------------------------------------------------------------------------------------
# Known answers on hand-made deltas

D1 = T([[3.0, -1.0], [0.5, 2.0]])
D2 = T([[-2.0, -4.0], [1.0, -0.5]])
D3 = T([[1.0, 0.2], [-3.0, 0.1]])


def test_soup_known_answer():
    assert torch.allclose(merge.soup([D1, D2, D3]), T([[2 / 3, -4.8 / 3], [-1.5 / 3, 1.6 / 3]]))
    # weights are relative: [2, 1, 1] == [0.5, 0.25, 0.25]; lam scales the result
    want = 0.5 * D1 + 0.25 * D2 + 0.25 * D3
    assert torch.allclose(merge.soup([D1, D2, D3], [2, 1, 1]), want)
    assert torch.allclose(merge.soup([D1, D2, D3], [2, 1, 1], lam=3.0), 3 * want)


def test_trim_magnitude_known_answer():
    assert torch.equal(merge.trim_magnitude(D1, 0.5), T([[3.0, 0.0], [0.0, 2.0]]))
    assert torch.equal(merge.trim_magnitude(D2, 0.5), T([[-2.0, -4.0], [0.0, 0.0]]))
    assert torch.equal(merge.trim_magnitude(D3, 0.25), T([[0.0, 0.0], [-3.0, 0.0]]))
    assert torch.equal(merge.trim_magnitude(D1, 1.0), D1)
    # round, not int(): 0.29 * 100 = 28.999... keeps 29 entries
    assert int((merge.trim_magnitude(torch.arange(1.0, 101.0), 0.29) != 0).sum()) == 29


def test_ties_known_answer_sign_election_and_disjoint_mean():
    # trimmed (density 0.5): D1 -> [[3,0],[0,2]], D2 -> [[-2,-4],[0,0]], D3 -> [[1,0],[-3,0]]
    # summed mass [[2,-4],[-3,2]] -> elected signs [[+,-],[-,+]]
    # (0,0): agreeing 3 and 1 -> mean 2 (the -2 is dropped); (0,1): -4; (1,0): -3; (1,1): 2
    assert torch.allclose(merge.ties([D1, D2, D3], density=0.5), T([[2.0, -4.0], [-3.0, 2.0]]))
    assert torch.allclose(merge.ties([D1, D2, D3], density=0.5, lam=0.5), T([[1.0, -2.0], [-1.5, 1.0]]))
    # weighted: w = [2,1,1] -> (0,0): (2*3 + 1*1) / (2 + 1) = 7/3; single agreeing entries keep their value
    assert torch.allclose(merge.ties([D1, D2, D3], [2, 1, 1], density=0.5), T([[7 / 3, -4.0], [-3.0, 2.0]]))


def test_ties_elects_by_mass_not_by_count():
    # one large + against two small -: the summed mass is +3, so the + entry wins alone
    got = merge.ties([T([5.0]), T([-1.0]), T([-1.0])], density=1.0)
    assert torch.allclose(got, T([5.0]))
    # a weight can flip the election: w = [1, 4, 4] -> mass 5 - 4 - 4 < 0 -> mean of the two -1's
    assert torch.allclose(merge.ties([T([5.0]), T([-1.0]), T([-1.0])], [1, 4, 4], density=1.0), T([-1.0]))
    # zeros never vote: nothing agrees -> 0
    assert torch.allclose(merge.ties([T([0.0]), T([0.0])], density=1.0), T([0.0]))


def test_ties_density1_no_conflicts_equals_soup():
    g = torch.Generator().manual_seed(1)
    xs = [torch.rand(6, 5, generator=g) + 0.1 for _ in range(3)]        # all positive: no sign conflict
    assert torch.allclose(merge.ties(xs, density=1.0), merge.soup(xs), atol=1e-6)
    neg = [-x for x in xs]
    assert torch.allclose(merge.ties(neg, [1, 2, 3], density=1.0), merge.soup(neg, [1, 2, 3]), atol=1e-6)


def test_random_keep_mask_and_rescale_by_hand():
    x = torch.arange(1.0, 13.0).view(3, 4)
    seed = merge.draw_seed(7, "m/delta", 0)
    u = torch.rand(x.shape, generator=torch.Generator().manual_seed(seed))
    got = merge.random_keep(x, 0.5, seed)
    assert torch.equal(got, torch.where(u < 0.5, x * 2, torch.zeros_like(x)))


def test_dare_ties_known_properties():
    g = torch.Generator().manual_seed(0)
    xs = [torch.randn(40, 50, generator=g) for _ in range(3)]
    # density 1: nothing dropped -> the mean form is ties at density 1
    assert torch.allclose(merge.dare_ties(xs, density=1.0, dare_norm="mean"), merge.ties(xs, density=1.0))
    # single adapter: each entry is 0 or x / density, about density of them kept; same seed -> same result
    one = merge.dare_ties(xs[:1], density=0.25, seed=3, tag="t")
    kept = one != 0
    assert torch.allclose(one[kept], xs[0][kept] / 0.25)
    assert abs(kept.float().mean().item() - 0.25) < 0.05
    assert torch.equal(one, merge.dare_ties(xs[:1], density=0.25, seed=3, tag="t"))
    assert not torch.equal(one, merge.dare_ties(xs[:1], density=0.25, seed=4, tag="t"))


def test_dare_ties_density1_is_ties_sum_and_mean_forms_by_hand():
    # density 1 keeps everything: the TIES election on D1..D3 untrimmed, weights [2, 1, 1] -> w = [.5, .25, .25]
    # weighted mass: (0,0) 1.5-.5+.25 = 1.25 +; (0,1) -.5-1+.05 = -1.45 -; (1,0) .25+.25-.75 = -.25 -;
    # (1,1) 1-.125+.025 = .9 +.  Agreeing: (0,0) D1 3, D3 1; (0,1) D1 -1, D2 -4; (1,0) D3 -3; (1,1) D1 2, D3 .1
    w = [2, 1, 1]
    want_sum = T([[0.5 * 3 + 0.25 * 1, 0.5 * -1 + 0.25 * -4], [0.25 * -3, 0.5 * 2 + 0.25 * 0.1]])
    want_mean = T([[1.75 / 0.75, -1.5 / 0.75], [-3.0, 1.025 / 0.75]])
    assert torch.allclose(merge.dare_ties([D1, D2, D3], w, density=1.0, dare_norm="sum"), want_sum)
    assert torch.allclose(merge.dare_ties([D1, D2, D3], w, density=1.0, dare_norm="mean"), want_mean)
    assert torch.allclose(merge.ties([D1, D2, D3], w, density=1.0), want_mean)        # ties is the mean form
    assert torch.allclose(merge.dare_ties([D1, D2, D3], w, density=1.0), want_sum)    # the default is sum
    assert merge.DEFAULT_DARE_NORM == "sum"
    # lam scales both forms
    assert torch.allclose(merge.dare_ties([D1, D2, D3], w, density=1.0, lam=2.0), 2 * want_sum)


def test_dare_ties_two_experts_by_hand():
    # 2 experts, density 0.5: reproduce both masks from the documented draw, then merge by hand
    x1, x2 = T([[1.0, -2.0, 3.0], [0.5, 4.0, -1.0]]), T([[2.0, 1.0, 1.0], [-3.0, 2.0, -0.5]])
    seed, tag = 11, "m/delta"
    u1 = torch.rand(x1.shape, generator=torch.Generator().manual_seed(merge.draw_seed(seed, tag, 0)))
    u2 = torch.rand(x2.shape, generator=torch.Generator().manual_seed(merge.draw_seed(seed, tag, 1)))
    k1, k2 = (u1 < 0.5).float(), (u2 < 0.5).float()
    assert 0 < k1.sum() < 6 and 0 < k2.sum() < 6                     # the draw drops some and keeps some
    y1, y2 = 2 * x1 * k1, 2 * x2 * k2                                 # kept entries doubled
    rows = []
    for a, b in zip(y1.flatten().tolist(), y2.flatten().tolist()):    # weights 3:1 -> 0.75, 0.25
        mass = 0.75 * a + 0.25 * b
        sign = 1.0 if mass >= 0 else -1.0
        agree = [(wi, v) for wi, v in ((0.75, a), (0.25, b)) if v != 0 and math.copysign(1.0, v) == sign]
        s = sum(wi * v for wi, v in agree)
        rows.append((s, s / sum(wi for wi, _ in agree) if agree else 0.0))
    want_sum, want_mean = T([r[0] for r in rows]).view(2, 3), T([r[1] for r in rows]).view(2, 3)
    got_sum = merge.dare_ties([x1, x2], [3, 1], density=0.5, seed=seed, tag=tag, dare_norm="sum")
    got_mean = merge.dare_ties([x1, x2], [3, 1], density=0.5, seed=seed, tag=tag, dare_norm="mean")
    assert torch.allclose(got_sum, want_sum) and torch.allclose(got_mean, want_mean)
    assert not torch.allclose(got_sum, got_mean)


def test_dare_ties_forms_on_one_lineage():
    # three experts that agree (the same tensor + 1 % noise): the sum form stays at the soup's size, the mean
    # form comes out ~1/density times it (entries where no expert kept anything are 0 in both)
    g = torch.Generator().manual_seed(4)
    x0 = torch.randn(200, 100, generator=g)
    xs = [x0 + 0.01 * torch.randn(200, 100, generator=g) for _ in range(3)]
    size = merge.soup(xs).norm()
    for density in (0.25, 0.5):
        s = merge.dare_ties(xs, density=density, seed=1, tag="t", dare_norm="sum").norm() / size
        m = merge.dare_ties(xs, density=density, seed=1, tag="t", dare_norm="mean").norm() / size
        # sum: E||.||^2 / ||soup||^2 = 1 + (1 - d) / (3 d); mean: (1 - (1 - d)^3) / d^2
        assert s.item() == pytest.approx(math.sqrt(1 + (1 - density) / (3 * density)), rel=0.03)
        assert m.item() == pytest.approx(math.sqrt(1 - (1 - density) ** 3) / density, rel=0.03)


def test_random_keep_power():
    x = torch.arange(1.0, 13.0).view(3, 4)
    seed = merge.draw_seed(7, "m/A", 0)
    u = torch.rand(x.shape, generator=torch.Generator().manual_seed(seed))
    got = merge.random_keep(x, 0.25, seed, power=0.5)                # kept entries times 1/sqrt(0.25) = 2
    assert torch.allclose(got, torch.where(u < 0.25, x * 2, torch.zeros_like(x)))
    assert merge.factor_rescale_power("dare_ties", "sum") == 1.0
    assert merge.factor_rescale_power("dare_ties", "mean") == merge.factor_rescale_power("della", "sum") == 0.5


def test_della_keep_prob_known_answer():
    # row [0.1, -3, 2]: magnitude ranks 0, 2, 1 -> normalised 0, 1, 0.5 -> keep 0.3, 0.7, 0.5
    got = merge.della_keep_prob(T([[0.1, -3.0, 2.0]]), density=0.5, epsilon=0.2)
    assert torch.allclose(got, T([[0.3, 0.7, 0.5]]))
    # ranks are per row
    got = merge.della_keep_prob(T([[1.0, 2.0], [4.0, 3.0]]), density=0.6, epsilon=0.1)
    assert torch.allclose(got, T([[0.5, 0.7], [0.7, 0.5]]))


def test_della_single_adapter_by_hand_and_unbiased():
    x = T([[0.1, -3.0, 2.0], [1.0, 0.5, -0.2]])
    seed = merge.draw_seed(0, "m", 0)
    u = torch.rand(x.shape, generator=torch.Generator().manual_seed(seed))
    p = merge.della_keep_prob(x, 0.5, 0.2)
    assert torch.allclose(merge.della([x], density=0.5, epsilon=0.2, seed=0, tag="m"),
                          torch.where(u < p, x / p, torch.zeros_like(x)))
    # E[magprune(x)] = x: average over many seeds
    mean = torch.stack([merge.della([x], density=0.5, epsilon=0.2, seed=s, tag="m") for s in range(4000)]).mean(0)
    assert torch.allclose(mean, x, atol=0.15)


def test_della_epsilon0_equals_dare_same_seed():
    g = torch.Generator().manual_seed(2)
    xs = [torch.randn(16, 24, generator=g) for _ in range(3)]
    for density in (0.3, 0.7):
        assert torch.equal(merge.della(xs, [1, 2, 3], density=density, epsilon=0.0, seed=5, tag="q"),
                           merge.dare_ties(xs, [1, 2, 3], density=density, seed=5, tag="q", dare_norm="mean"))


def test_svd_helpers():
    g = torch.Generator().manual_seed(3)
    B, A = torch.randn(10, 3, generator=g), torch.randn(3, 7, generator=g)
    b, a, err = merge.svd_lowrank_product(B, A, 3)
    assert err < 1e-6 and torch.allclose(b @ a, B @ A, atol=1e-5)
    b, a, err = merge.svd_lowrank_product(B, A, 12)                 # padded with zeros up to rank 12
    assert b.shape == (10, 12) and a.shape == (12, 7) and torch.allclose(b @ a, B @ A, atol=1e-5)
    d = torch.diag(T([4.0, 3.0, 0.0]))
    b, a, err = merge.svd_dense(d, 1)
    assert math.isclose(err, 3 / 5, rel_tol=1e-6) and torch.allclose(b @ a, torch.diag(T([4.0, 0.0, 0.0])), atol=1e-6)


def test_svd_dense_randomized_matches_the_exact_truncation():
    """A matrix large against the rank takes the randomized SVD: on a rank-6 matrix plus small noise its
    rank-6 product and error equal the exact truncation's (Eckart-Young), on pure noise its error is
    within 2 % of the optimum; the error it reports is the measured one, and it is deterministic."""
    g = torch.Generator().manual_seed(4)
    low = torch.randn(120, 6, generator=g) @ torch.randn(6, 200, generator=g)
    for d, tol in ((low + 1e-3 * torch.randn(120, 200, generator=g), 1e-4), (torch.randn(120, 200, generator=g), 0.02)):
        assert 2 * (6 + merge.SVD_OVERSAMPLE) <= 120                   # the randomized branch runs
        U, S, Vh = torch.linalg.svd(d, full_matrices=False)
        exact = (S[6:].square().sum() / S.square().sum()).sqrt().item()
        b, a, err = merge.svd_dense(d, 6)
        assert b.shape == (120, 6) and a.shape == (6, 200)
        assert math.isclose(err, ((d - b @ a).norm() / d.norm()).item(), rel_tol=1e-5)
        assert exact <= err * (1 + 1e-5) and err <= exact * (1 + tol)
        assert torch.equal(merge.svd_dense(d, 6)[0], b)
    b, a, _ = merge.svd_dense(low, 6)
    assert torch.allclose(b @ a, low, atol=1e-3)


# ---------------------------------------------------------------------------------------------------
# The fast routes against the straightforward ones they replaced (results/merge_speed.md)

def old_trim(x, density):
    """The whole-tensor kthvalue trim merge.py used before kth_largest."""
    k = int(round(density * x.numel()))
    threshold = torch.kthvalue(x.abs().reshape(-1).float(), x.numel() - k + 1).values
    return torch.where(x.abs() >= threshold, x, torch.zeros_like(x))


def old_elect(stacked, w, norm):
    """The sign election with peft's helper, as merge.py computed it before."""
    from peft.utils.merge_utils import calculate_majority_sign_mask
    wv = w.view((-1,) + (1,) * (stacked.dim() - 1))
    weighted = stacked * wv
    agree = calculate_majority_sign_mask(weighted, method="total")
    num = (weighted * agree).sum(0)
    if norm == "sum":
        return num
    den = (wv * agree).sum(0)
    return torch.where(den > 0, num / den, torch.zeros_like(num))


def old_svd_dense(delta, rank):
    """The randomized SVD with Householder QRs and a dense SVD of Q^T delta (merge.py before _orth)."""
    q = rank + merge.SVD_OVERSAMPLE
    omega = torch.randn(delta.shape[1], q, generator=torch.Generator().manual_seed(0))
    Q = torch.linalg.qr(delta @ omega).Q
    for _ in range(merge.SVD_POWER_ITERS):
        Q = torch.linalg.qr(delta.T @ Q).Q
        Q = torch.linalg.qr(delta @ Q).Q
    Uc, S, Vh = torch.linalg.svd(Q.T @ delta, full_matrices=False)
    B, A, _ = merge.truncate(Q @ Uc, S, Vh, rank)
    return B, A, ((delta - B @ A).norm() / delta.norm()).item()


def ties_like(m, n, r=16, seed=0):
    """A TIES merge of three random rank-r task vectors: dense, full rank, as the delta-space SVD sees it."""
    g = torch.Generator().manual_seed(seed)
    deltas = [torch.randn(m, r, generator=g) @ torch.randn(r, n, generator=g) for _ in range(3)]
    return merge.ties(deltas, density=0.5)


def test_kth_largest_equals_kthvalue():
    g = torch.Generator().manual_seed(7)
    cases = [torch.randn(300_000, generator=g).abs(),                              # the bracket holds
             torch.cat([torch.zeros(200_000), torch.rand(100_000, generator=g)]),  # many ties at zero
             (torch.arange(300_000) % 65536 == 0).float() * 5 + (torch.arange(300_000) % 7).float(),  # periodic
             torch.full((300_000,), 2.5),                                         # all equal
             torch.rand(1000, generator=g)]                                       # small: direct kthvalue
    for a in cases:
        n = a.numel()
        for k in (1, 2, n // 3, n // 2, n - 1, n):
            assert merge.kth_largest(a, k).item() == torch.kthvalue(a, n - k + 1).values.item(), (n, k)


def test_fast_trim_and_election_equal_the_old_ones():
    g = torch.Generator().manual_seed(8)
    for shape in ((512, 700), (7, 5)):
        xs = [torch.randn(shape, generator=g) * (torch.rand(shape, generator=g) > 0.3) for _ in range(3)]
        for density in (0.2, 0.5, 0.9):
            for x in xs:
                assert torch.equal(merge.trim_magnitude(x, density), old_trim(x, density))
        stacked = torch.stack(xs)
        for w in (torch.full((3,), 1 / 3), torch.tensor([0.5, 0.2, 0.3])):
            for norm in ("mean", "sum"):
                assert torch.allclose(merge.elect_sign_merge(stacked, w, norm), old_elect(stacked, w, norm),
                                      rtol=1e-6, atol=1e-7)
                assert torch.allclose(merge.elect_sign_merge(xs, w, norm), old_elect(stacked, w, norm),
                                      rtol=1e-6, atol=1e-7)


def test_threaded_draws_equal_the_serial_ones():
    g = torch.Generator().manual_seed(9)
    xs = [torch.randn(60, 80, generator=g) for _ in range(3)]
    for norm in ("sum", "mean"):
        kept = torch.stack([merge.random_keep(x, 0.4, merge.draw_seed(3, "t", i)) for i, x in enumerate(xs)])
        assert torch.allclose(merge.dare_ties(xs, density=0.4, seed=3, tag="t", dare_norm=norm),
                              old_elect(kept, torch.full((3,), 1 / 3), norm), rtol=1e-6, atol=1e-7)
    kept = torch.stack([merge.random_keep(x, merge.della_keep_prob(x, 0.5, 0.1), merge.draw_seed(3, "t", i))
                        for i, x in enumerate(xs)])
    assert torch.allclose(merge.della(xs, density=0.5, epsilon=0.1, seed=3, tag="t"),
                          old_elect(kept, torch.full((3,), 1 / 3), "mean"), rtol=1e-6, atol=1e-7)


def test_orth_spans_the_range():
    g = torch.Generator().manual_seed(10)
    Y = torch.randn(400, 12, generator=g)
    Q = merge._orth(Y)
    assert Q.shape == (400, 12) and torch.allclose(Q.T @ Q, torch.eye(12), atol=1e-6)
    Qh = torch.linalg.qr(Y).Q
    assert torch.allclose(Q @ Q.T, Qh @ Qh.T, atol=1e-5)                  # the same projector as Householder's
    low = torch.randn(400, 3, generator=g) @ torch.randn(3, 12, generator=g)   # rank 3 of 12 columns
    Q = merge._orth(low)
    assert Q.shape == (400, 3) and torch.allclose(Q @ (Q.T @ low), low, atol=1e-4)
    assert merge._orth(torch.zeros(50, 4)).shape == (50, 0)


def test_fast_svd_dense_equals_the_old_route():
    """Same randomized SVD, new orthonormalisation and small SVD: the products agree to float rounding, the
    reported errors agree, and a matrix of rank <= the output rank comes back exactly with error ~0."""
    for m, n, rank, seed in ((300, 700, 16, 0), (700, 300, 48, 1), (256, 1024, 48, 2)):
        d = ties_like(m, n, seed=seed)
        b, a, err = merge.svd_dense(d, rank)
        bo, ao, erro = old_svd_dense(d, rank)
        scale = d.abs().max()
        assert (b @ a - bo @ ao).abs().max() < 1e-4 * scale
        assert math.isclose(err, erro, rel_tol=1e-5)
        assert math.isclose(err, ((d - b @ a).norm() / d.norm()).item(), rel_tol=1e-5)
        assert torch.allclose(b.T @ b, a @ a.T, rtol=1e-3, atol=1e-4 * scale)   # balanced: both sqrt(S)^2
    g = torch.Generator().manual_seed(11)
    low = torch.randn(300, 20, generator=g) @ torch.randn(20, 500, generator=g)     # rank 20 < 48
    b, a, err = merge.svd_dense(low, 48)
    assert err < 1e-5 and torch.allclose(b @ a, low, atol=1e-4)
    b, a, err = merge.svd_dense(torch.zeros(300, 500), 48)
    assert err == 0.0 and not b.any() and not a.any() and b.shape == (300, 48)


def test_svd_lowrank_product_is_the_optimal_truncation():
    """The product route's error equals the Eckart-Young optimum computed from a dense SVD of B A, and its
    product equals that truncation; B = 0 (an untrained LoRA) gives zeros and error 0."""
    g = torch.Generator().manual_seed(12)
    for m, n, r, rank in ((200, 300, 48, 20), (300, 150, 48, 48), (120, 90, 30, 64)):
        B, A = torch.randn(m, r, generator=g), torch.randn(r, n, generator=g)
        U, S, Vh = torch.linalg.svd((B @ A).double(), full_matrices=False)
        k = min(rank, r)
        best = (U[:, :k] * S[:k]) @ Vh[:k]
        optimal = (S[k:].square().sum() / S.square().sum()).sqrt().item()
        b, a, err = merge.svd_lowrank_product(B, A, rank)
        assert b.shape == (m, rank) and a.shape == (rank, n)
        assert abs(err - optimal) < 1e-6
        assert (b @ a - best.float()).abs().max() < 1e-4 * best.abs().max()
    b, a, err = merge.svd_lowrank_product(torch.zeros(40, 6), torch.randn(6, 30, generator=g), 8)
    assert err == 0.0 and not b.any() and not a.any() and b.shape == (40, 8) and a.shape == (8, 30)


# ---------------------------------------------------------------------------------------------------
# Tiny Llama and adapter folders

def tiny_config():
    from transformers import LlamaConfig
    return LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, vocab_size=64, tie_word_embeddings=True, max_position_embeddings=64)


def make_adapter(base_dir, out_dir, seed, r=4, alpha=8, start=None, drift=1.0):
    """A LoRA with random A and B (B nonzero) on all linear layers; `start` (an adapter folder) + drift."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM
    from safetensors.torch import load_file
    model = AutoModelForCausalLM.from_pretrained(str(base_dir))
    peft_model = get_peft_model(model, LoraConfig(r=r, lora_alpha=alpha, target_modules="all-linear"))
    g = torch.Generator().manual_seed(seed)
    ref = load_file(str(Path(start) / merge.ADAPTER_FILE)) if start else None
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_" in name:
                noise = torch.randn(p.shape, generator=g) * 0.2
                key = name.replace(".default", "")
                p.copy_(ref[key] + drift * noise if ref is not None else noise)
    peft_model.save_pretrained(str(out_dir))
    return out_dir


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    """A saved tiny base and five adapters: a0..a2 (r 4, alpha 8), a3 (r 8, alpha 4), a4 (rslora r 4)."""
    from transformers import AutoModelForCausalLM
    root = tmp_path_factory.mktemp("zoo")
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(tiny_config()).save_pretrained(str(root / "base"))
    z = {"root": root, "base": root / "base"}
    for i in range(3):
        z[f"a{i}"] = make_adapter(z["base"], root / f"a{i}", seed=10 + i)
    z["a3"] = make_adapter(z["base"], root / "a3", seed=13, r=8, alpha=4)
    return z


def deltas_of(adapter_dir):
    """{module name: s * B @ A} straight from the folder (independent of merge.py's loader)."""
    from safetensors.torch import load_file
    cfg = json.loads((Path(adapter_dir) / merge.CONFIG_FILE).read_text())
    s = cfg["lora_alpha"] / (math.sqrt(cfg["r"]) if cfg.get("use_rslora") else cfg["r"])
    sd = load_file(str(Path(adapter_dir) / merge.ADAPTER_FILE))
    out = {}
    for k, A in sd.items():
        if k.endswith(".lora_A.weight"):
            stem = k[: -len(".lora_A.weight")]
            out[merge.module_name(stem)] = s * sd[stem + ".lora_B.weight"].float() @ A.float()
    return out


def max_rel(got, want):
    return max(((got[k] - want[k]).norm() / want[k].norm()).item() for k in want)


def logits_with(base_dir, deltas=None, adapter=None):
    """Logits of the base on fixed tokens, with dense deltas added to its weights or a peft adapter loaded."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(str(base_dir))
    if deltas:
        with torch.no_grad():
            for name, d in deltas.items():
                model.get_submodule(name).weight += d
    if adapter:
        model = PeftModel.from_pretrained(model, str(adapter))
    ids = torch.arange(1, 17).view(2, 8) % 64
    with torch.no_grad():
        return model(input_ids=ids).logits


# ---------------------------------------------------------------------------------------------------
# Folder-level merges

def test_soup_of_identical_adapters_is_that_adapter(zoo, tmp_path):
    want = deltas_of(zoo["a0"])
    for space in ("adapter", "delta"):
        out = tmp_path / space
        merge.merge_adapters([zoo["a0"]] * 3, out, "soup", space=space)
        assert max_rel(deltas_of(out), want) < 1e-5, space
    # the same holds for ties at density 1 in adapter space (every entry agrees with itself)
    merge.merge_adapters([zoo["a0"]] * 2, tmp_path / "t", "ties", density=1.0)
    assert max_rel(deltas_of(tmp_path / "t"), want) < 1e-5


def test_merged_adapter_loads_with_peft_and_changes_model_as_computed(zoo, tmp_path):
    ads = [zoo["a0"], zoo["a1"], zoo["a3"]]
    ds = [deltas_of(a) for a in ads]
    w = [0.5, 0.3, 0.2]
    want = {k: sum(wi * d[k] for wi, d in zip(w, ds)) for k in ds[0]}   # delta-space soup by hand
    rep = merge.merge_adapters(ads, tmp_path / "soup", "soup", space="delta", weights=[5, 3, 2],
                               full=True, base=zoo["base"])
    assert rep["output"]["r"] == 16 and rep["summary"]["svd_rel_error_max"] == 0.0
    expected = logits_with(zoo["base"], deltas=want)
    assert not torch.allclose(expected, logits_with(zoo["base"]), atol=1e-3)     # the merge does something
    assert torch.allclose(logits_with(zoo["base"], adapter=tmp_path / "soup"), expected, atol=1e-4)
    full = logits_with(tmp_path / "soup" / "full")
    assert torch.allclose(full, expected, atol=1e-4)
    # a delta-space TIES at a rank that holds the whole delta (min dim 32) == base + ties(deltas)
    want = {k: merge.ties([d[k] for d in ds], w, density=0.5) for k in ds[0]}
    rep = merge.merge_adapters(ads, tmp_path / "ties", "ties", space="delta", weights=w, density=0.5, rank=64)
    assert rep["summary"]["svd_rel_error_max"] < 1e-5
    assert torch.allclose(logits_with(zoo["base"], adapter=tmp_path / "ties"),
                          logits_with(zoo["base"], deltas=want), atol=1e-4)


def test_report_and_determinism(zoo, tmp_path):
    ads = [zoo["a0"], zoo["a1"], zoo["a2"]]
    for method in ("dare_ties", "della"):
        r1 = merge.merge_adapters(ads, tmp_path / "x1", method, space="delta", rank=8, seed=1)
        r2 = merge.merge_adapters(ads, tmp_path / "x2", method, space="delta", rank=8, seed=1)
        d1, d2 = deltas_of(tmp_path / "x1"), deltas_of(tmp_path / "x2")
        assert all(torch.equal(d1[k], d2[k]) for k in d1)
        assert r1["modules"] == r2["modules"]
        merge.merge_adapters(ads, tmp_path / "x3", method, space="delta", rank=8, seed=2)
        assert max_rel(deltas_of(tmp_path / "x3"), d1) > 0.01
    rep = json.loads((tmp_path / "x1" / merge.REPORT_FILE).read_text())
    assert rep["method"] == "della" and rep["space"] == "delta" and rep["params"]["seed"] == 1
    assert rep["params"]["drop_rate"] == 0.5 and len(rep["modules"]) == 14
    m = rep["modules"]["model.layers.0.self_attn.q_proj"]
    assert m["rank"] == 8 and 0 < m["svd_rel_error"] < 1 and set(rep["timings_s"]) >= {"merge", "total"}


def test_adapter_space_compare_delta(zoo, tmp_path):
    rep = merge.merge_adapters([zoo["a0"], zoo["a1"]], tmp_path / "o", "soup", compare_delta=True)
    assert rep["summary"]["rel_error_vs_delta_mean"] > 0.3            # independent adapters: cross terms dominate
    rep = merge.merge_adapters([zoo["a0"], zoo["a0"]], tmp_path / "o2", "soup", compare_delta=True)
    assert rep["summary"]["rel_error_vs_delta_max"] < 1e-5


def test_dare_norm_chooses_the_form(zoo, tmp_path):
    # delta space at a rank that holds the whole delta (min dim 32): the adapter is base + dare_ties(deltas)
    # in the chosen form, with the documented draws (tag = stem + "/delta", seed 0); the report names the form
    ads = [zoo["a0"], zoo["a1"], zoo["a2"]]
    ds = [deltas_of(a) for a in ads]
    got = {}
    for norm in ("sum", "mean"):
        rep = merge.merge_adapters(ads, tmp_path / norm, "dare_ties", space="delta", rank=64, dare_norm=norm)
        assert rep["params"]["dare_norm"] == norm
        want = {k: merge.dare_ties([d[k] for d in ds], density=0.5, seed=0, tag=f"base_model.model.{k}/delta",
                                   dare_norm=norm) for k in ds[0]}
        got[norm] = deltas_of(tmp_path / norm)
        assert max_rel(got[norm], want) < 1e-4, norm
    assert max_rel(got["sum"], got["mean"]) > 0.1
    # the default is the sum form; the other methods record none (della: always the mean form)
    rep = merge.merge_adapters(ads, tmp_path / "default", "dare_ties", space="delta", rank=64)
    assert rep["params"]["dare_norm"] == "sum" and max_rel(deltas_of(tmp_path / "default"), got["sum"]) < 1e-6
    assert merge.merge_adapters(ads, tmp_path / "t", "ties")["params"]["dare_norm"] is None
    assert merge.merge_adapters(ads, tmp_path / "d", "della")["params"]["dare_norm"] == "mean"
    # the CLI flag
    merge.main(["--method", "dare_ties", "--dare-norm", "mean", "--space", "delta", "--rank", "64",
                "--adapters", *map(str, ads), "--out", str(tmp_path / "cli")])
    assert json.loads((tmp_path / "cli" / merge.REPORT_FILE).read_text())["params"]["dare_norm"] == "mean"
    assert max_rel(deltas_of(tmp_path / "cli"), got["mean"]) < 1e-6
    with pytest.raises(SystemExit):
        merge.main(["--method", "dare_ties", "--dare-norm", "max", "--adapters", str(zoo["a0"]), "--out",
                    str(tmp_path / "bad")])
    assert not (tmp_path / "bad").exists()


def test_adapter_space_rescales_the_product_once(zoo, tmp_path):
    # related experts (one lineage): a shared start adapter + 5 % drift each. Per module, with p = 0.5 and 3
    # experts, q = 1 - (1 - p)^3 the chance that some expert keeps an entry. Expected norm of the adapter-space
    # product over the delta-space merge (random factors; the per-term second moments):
    #   sum form, 1/p on each factor:   sqrt(1 + (1 - p) / (3 p)) = 1.155 (two factors' drop noise vs one)
    #   mean forms, 1/sqrt(p) each:     sqrt(q) = 0.935
    # and before (mean form, 1/p on each factor) sqrt(q) / p = 1.87, i.e. ~1/density times the delta merge.
    start = make_adapter(zoo["base"], tmp_path / "start", seed=99)
    ads = [make_adapter(zoo["base"], tmp_path / f"e{i}", seed=50 + i, start=start, drift=0.05) for i in range(3)]
    q = 1 - 0.5 ** 3
    expect = {("dare_ties", "sum"): math.sqrt(1 + 0.5 / 1.5), ("dare_ties", "mean"): math.sqrt(q),
              ("della", "mean"): math.sqrt(q)}
    for (method, norm), want in expect.items():
        rep = merge.merge_adapters(ads, tmp_path / "o", method, density=0.5, epsilon=0.15, dare_norm=norm,
                                   compare_delta=True)
        s = rep["summary"]
        assert s["norm_ratio_vs_delta_mean"] == pytest.approx(want, abs=0.08), (method, norm)
        assert 0.75 < s["norm_ratio_vs_delta_min"] and s["norm_ratio_vs_delta_max"] < 1.35, (method, norm)
        assert rep["params"]["factor_rescale_power"] == (1.0 if norm == "sum" and method == "dare_ties" else 0.5)
    # the old adapter-space mean form (1/p on both factors), on the same experts' factors, for comparison
    f = [merge.load_factors(merge.read_adapter(a), "base_model.model.model.layers.0.mlp.up_proj", "cpu") for a in ads]
    old = [merge.dare_ties([x[j] for x in f], density=0.5, tag=str(j), dare_norm="mean") for j in (0, 1)]
    new = [merge.dare_ties([x[j] for x in f], density=0.5, tag=str(j), dare_norm="mean", rescale_power=0.5)
           for j in (0, 1)]
    ref = merge.dare_ties([b @ a for a, b in f], density=0.5, tag="d", dare_norm="mean").norm()
    assert (old[1] @ old[0]).norm() / ref > 1.6 and (old[1] @ old[0]).norm() / (new[1] @ new[0]).norm() == \
        pytest.approx(2.0)                                            # exactly sqrt(1/p) on each factor


def test_adapter_space_sum_form_is_unbiased():
    # E[B' A'] over the random drops == (soup of the B's)(soup of the A's): each factor is unbiased and the
    # A and B masks are independent (no sign conflicts here: all entries positive)
    g = torch.Generator().manual_seed(5)
    As = [torch.rand(3, 6, generator=g) + 0.1 for _ in range(3)]
    Bs = [torch.rand(8, 3, generator=g) + 0.1 for _ in range(3)]
    mean = sum(merge.dare_ties(Bs, density=0.5, seed=s, tag="B") @ merge.dare_ties(As, density=0.5, seed=s, tag="A")
               for s in range(3000)) / 3000
    want = merge.soup(Bs) @ merge.soup(As)
    assert ((mean - want).norm() / want.norm()).item() < 0.02


def test_cli(zoo, tmp_path, capsys):
    out = tmp_path / "cli"
    merge.main(["--method", "ties", "--adapters", str(zoo["a0"]), str(zoo["a1"]), str(zoo["a2"]),
                "--out", str(out), "--density", "0.5", "--lambda", "1.5"])
    rep = json.loads((out / merge.REPORT_FILE).read_text())
    assert rep["params"]["lam"] == 1.5 and rep["output"]["r"] == 4
    cfg = json.loads((out / merge.CONFIG_FILE).read_text())
    assert cfg["r"] == 4 and cfg["lora_alpha"] == 4 and cfg["use_rslora"] is False


@pytest.mark.parametrize("kwargs, message", [
    (dict(adapters=["missing"]), "adapter folder not found"),
    (dict(method="slerp"), "unknown method"),
    (dict(density=0.0), "density must be in (0, 1]"),
    (dict(density=1.5), "density must be in (0, 1]"),
    (dict(method="della", density=0.1, epsilon=0.2), "della needs"),
    (dict(method="dare_ties", dare_norm="max"), "unknown dare_norm"),
    (dict(weights=[1.0]), "1 weights for 2 adapters"),
    (dict(weights=[1.0, -1.0]), "weights must be positive"),
    (dict(rank=0), "rank must be a positive integer"),
    (dict(full=True), "--full needs --base"),
    (dict(adapters=["a0", "a3"]), "adapter space needs equal ranks"),
    (dict(adapters=["a0", "other_base"]), "different base models"),
    (dict(adapters=["a0", "fewer_modules"]), "different target modules"),
    (dict(adapters=["a0", "dora"]), "use_dora=True is not supported"),
    (dict(out="a0"), "is one of the input adapters"),
])
def test_errors_are_one_line_and_write_nothing(zoo, tmp_path, kwargs, message):
    import shutil
    from safetensors.torch import load_file, save_file
    # broken variants of a0
    for name in ("other_base", "fewer_modules", "dora"):
        shutil.copytree(zoo["a0"], tmp_path / name)
    cfg = json.loads((zoo["a0"] / merge.CONFIG_FILE).read_text())
    (tmp_path / "other_base" / merge.CONFIG_FILE).write_text(json.dumps({**cfg, "base_model_name_or_path": "x"}))
    (tmp_path / "dora" / merge.CONFIG_FILE).write_text(json.dumps({**cfg, "use_dora": True}))
    sd = load_file(str(zoo["a0"] / merge.ADAPTER_FILE))
    save_file({k: v for k, v in sd.items() if "layers.1.mlp" not in k},
              str(tmp_path / "fewer_modules" / merge.ADAPTER_FILE))
    where = {**{n: zoo[n] for n in ("a0", "a1", "a3")}, **{n: tmp_path / n for n in ("other_base", "fewer_modules",
                                                                                        "dora")},
             "missing": tmp_path / "missing"}
    args = dict(adapters=["a0", "a1"], out=tmp_path / "out", method="soup")
    args.update(kwargs)
    args["adapters"] = [where[a] for a in args["adapters"]]
    args["out"] = where.get(args["out"], args["out"])
    before = sorted(p.name for p in zoo["a0"].iterdir())
    with pytest.raises(merge.MergeError, match=re.escape(message)) as e:
        merge.merge_adapters(args.pop("adapters"), args.pop("out"), args.pop("method"), **args)
    assert "\n" not in str(e.value)
    assert not (tmp_path / "out").exists() and sorted(p.name for p in zoo["a0"].iterdir()) == before


# ---------------------------------------------------------------------------------------------------
# peft's add_weighted_adapter as the reference

def peft_merge(zoo, names, combination_type, weights, tmp_path, **kw):
    """Load the named adapters into one PeftModel, run add_weighted_adapter, save, return its deltas."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(str(zoo["base"])), str(zoo[names[0]]),
                                      adapter_name="n0")
    for i, n in enumerate(names[1:], 1):
        model.load_adapter(str(zoo[n]), adapter_name=f"n{i}")
    model.add_weighted_adapter([f"n{i}" for i in range(len(names))], weights, "merged",
                               combination_type=combination_type, **kw)
    model.save_pretrained(str(tmp_path / "peft"), selected_adapters=["merged"])
    return deltas_of(tmp_path / "peft" / "merged")


def test_vs_peft_linear(zoo, tmp_path):
    # ours (adapter space, uniform) == peft linear with weights 1/n^2 (it folds sqrt(w s) into A and B)
    merge.merge_adapters([zoo["a0"], zoo["a1"], zoo["a2"]], tmp_path / "ours", "soup")
    theirs = peft_merge(zoo, ["a0", "a1", "a2"], "linear", [1 / 9] * 3, tmp_path)
    assert max_rel(deltas_of(tmp_path / "ours"), theirs) < 1e-5
    # peft linear with weights 1/n on n copies of one adapter gives n x that adapter; our soup gives it back
    twice = peft_merge(zoo, ["a0", "a0"], "linear", [0.5, 0.5], tmp_path / "p2")
    want = deltas_of(zoo["a0"])
    assert max_rel(twice, {k: 2 * v for k, v in want.items()}) < 1e-5


def test_vs_peft_cat_and_svd(zoo, tmp_path):
    ads = [zoo["a0"], zoo["a1"], zoo["a3"]]
    merge.merge_adapters(ads, tmp_path / "exact", "soup", space="delta", weights=[2, 1, 1])
    theirs = peft_merge(zoo, ["a0", "a1", "a3"], "cat", [0.5, 0.25, 0.25], tmp_path)
    assert max_rel(deltas_of(tmp_path / "exact"), theirs) < 1e-5
    merge.merge_adapters(ads, tmp_path / "svd", "soup", space="delta", weights=[2, 1, 1], rank=6)
    theirs = peft_merge(zoo, ["a0", "a1", "a3"], "svd", [0.5, 0.25, 0.25], tmp_path / "p2", svd_rank=6)
    assert max_rel(deltas_of(tmp_path / "svd"), theirs) < 1e-4


def test_vs_peft_ties(zoo, tmp_path):
    # uniform weights, equal scalings: our TIES == peft's with weights 1 (count mean), in both spaces
    ads = [zoo["a0"], zoo["a1"], zoo["a2"]]
    merge.merge_adapters(ads, tmp_path / "a", "ties", density=0.5)
    theirs = peft_merge(zoo, ["a0", "a1", "a2"], "ties", [1, 1, 1], tmp_path, density=0.5)
    assert max_rel(deltas_of(tmp_path / "a"), theirs) < 1e-5
    merge.merge_adapters(ads, tmp_path / "d", "ties", space="delta", density=0.5, rank=7)
    theirs = peft_merge(zoo, ["a0", "a1", "a2"], "ties_svd", [1, 1, 1], tmp_path / "p2", density=0.5, svd_rank=7)
    assert max_rel(deltas_of(tmp_path / "d"), theirs) < 1e-4


# ---------------------------------------------------------------------------------------------------
# The adapter-vs-delta comparison printed into results/merge.md (not a test)

REGIMES = {"independent": {}, "shared start, drift 0.3": dict(drift=0.3), "shared start, drift 0.05": dict(drift=0.05)}
# (label, method, dare_norm): both DARE-TIES forms
VARIANTS = [("soup", "soup", None), ("ties", "ties", None), ("dare_ties sum", "dare_ties", "sum"),
            ("dare_ties mean", "dare_ties", "mean"), ("della", "della", None)]


def _norm_kw(dare_norm):
    return {"dare_norm": dare_norm} if dare_norm else {}


def compare(workdir):
    """Synthetic experts (3, r 4, random factors of std 0.2) on the tiny Llama (hidden 32, 14 modules):
    how far each method's adapter-space merge is from its delta-space definition, the seed-to-seed distance
    of the random methods in delta space (their noise floor), and the SVD error of delta-space merges vs rank."""
    from transformers import AutoModelForCausalLM
    workdir = Path(workdir)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(tiny_config()).save_pretrained(str(workdir / "base"))
    start = make_adapter(workdir / "base", workdir / "start", seed=99)
    rows = []
    for j, (regime, kw) in enumerate(REGIMES.items()):
        ads = [make_adapter(workdir / "base", workdir / f"r{j}_{i}", seed=100 + i, start=start if kw else None, **kw)
               for i in range(3)]
        for label, method, norm in VARIANTS:
            rep = merge.merge_adapters(ads, workdir / "out", method, space="adapter", density=0.5, epsilon=0.15,
                                       compare_delta=True, **_norm_kw(norm))
            s = rep["summary"]
            rows.append(("adapter-vs-delta", regime, label, s["rel_error_vs_delta_mean"], s["rel_error_vs_delta_max"],
                         s["norm_ratio_vs_delta_mean"]))
        for label, method, norm in VARIANTS[2:]:
            merge.merge_adapters(ads, workdir / "s0", method, space="delta", rank=32, seed=0, **_norm_kw(norm))
            merge.merge_adapters(ads, workdir / "s1", method, space="delta", rank=32, seed=1, **_norm_kw(norm))
            d0, d1 = deltas_of(workdir / "s0"), deltas_of(workdir / "s1")
            rels = [((d0[k] - d1[k]).norm() / d1[k].norm()).item() for k in d0]
            rows.append(("seed-to-seed", regime, label, sum(rels) / len(rels), max(rels)))
        for label, method, norm in VARIANTS:
            for rank in (4, 8, 12, 16, 24, 32):
                rep = merge.merge_adapters(ads, workdir / "out", method, space="delta", density=0.5, epsilon=0.15,
                                           rank=rank, **_norm_kw(norm))
                rows.append(("delta-svd", regime, label, rank, rep["summary"]["svd_rel_error_mean"]))
    return rows


def compare_smollm_shapes():
    """SVD error vs rank of delta-space merges for SmolLM2-135M module shapes (576x576 q_proj, 1536x576 up_proj),
    3 random r-16 experts per module (independent, or a shared start with drift 0.3), density 0.5."""
    rows = []
    for shape in ((576, 576), (1536, 576)):
        for regime, drift in (("independent", None), ("shared start, drift 0.3", 0.3)):
            g = torch.Generator().manual_seed(0)
            B0, A0 = torch.randn(shape[0], 16, generator=g), torch.randn(16, shape[1], generator=g)
            deltas = []
            for i in range(3):
                B, A = torch.randn(shape[0], 16, generator=g), torch.randn(16, shape[1], generator=g)
                if drift is not None:
                    B, A = B0 + drift * B, A0 + drift * A
                deltas.append(B @ A)
            S_by_method = {label: torch.linalg.svdvals(merge.METHODS[m](deltas, density=0.5, seed=0, tag="x",
                                                                         **_norm_kw(norm)))
                           for label, m, norm in VARIANTS}
            for m, S in S_by_method.items():
                errs = [(S[k:].square().sum() / S.square().sum()).sqrt().item() for k in (16, 48, 64, 128, 256, 384)]
                rows.append((f"{shape[0]}x{shape[1]}", regime, m, errs))
    return rows


def write_synthetic_adapter(out_dir, seed, n_layers=30, hidden=576, kv=192, inter=1536, r=16, alpha=32):
    """A SmolLM2-135M-shaped LoRA folder (all 7 projections of every layer, bf16) written without a model."""
    from safetensors.torch import save_file
    shapes = {"self_attn.q_proj": (hidden, hidden), "self_attn.k_proj": (kv, hidden), "self_attn.v_proj": (kv, hidden),
              "self_attn.o_proj": (hidden, hidden), "mlp.gate_proj": (inter, hidden), "mlp.up_proj": (inter, hidden),
              "mlp.down_proj": (hidden, inter)}
    g = torch.Generator().manual_seed(seed)
    sd = {}
    for layer in range(n_layers):
        for name, (n_out, n_in) in shapes.items():
            stem = f"base_model.model.model.layers.{layer}.{name}"
            sd[stem + ".lora_A.weight"] = (torch.randn(r, n_in, generator=g) * 0.02).bfloat16()
            sd[stem + ".lora_B.weight"] = (torch.randn(n_out, r, generator=g) * 0.02).bfloat16()
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    save_file(sd, str(Path(out_dir) / merge.ADAPTER_FILE))
    cfg = {"peft_type": "LORA", "r": r, "lora_alpha": alpha, "target_modules": sorted(shapes), "bias": "none",
           "base_model_name_or_path": "SmolLM2-135M-Instruct", "task_type": "CAUSAL_LM", "lora_dropout": 0.05}
    (Path(out_dir) / merge.CONFIG_FILE).write_text(json.dumps(cfg))
    return out_dir


def time_smollm_shapes(workdir, n_layers=3):
    """Wall time of merge_adapters on 3 SmolLM2-135M-shaped r-16 adapters, `n_layers` of its 30 layers (7 modules
    each), on this CPU; a whole-model merge takes about 30 / n_layers times as long."""
    ads = [write_synthetic_adapter(Path(workdir) / f"s{i}", seed=i, n_layers=n_layers) for i in range(3)]
    rows = []
    for space, rank in (("adapter", None), ("delta", None), ("delta", 128)):
        for label, method, norm in VARIANTS:
            rep = merge.merge_adapters(ads, Path(workdir) / "o", method, space=space, rank=rank, density=0.5,
                                       **_norm_kw(norm))
            rows.append((space, rank, label, rep["output"]["r"], rep["timings_s"]["total"],
                         rep["summary"]["svd_rel_error_mean"]))
    return rows


if __name__ == "__main__" and "--compare" in sys.argv:
    import contextlib
    import io
    import tempfile
    import time
    t0 = time.time()
    with tempfile.TemporaryDirectory() as d, contextlib.redirect_stdout(io.StringIO()):
        rows = compare(d)
        big = compare_smollm_shapes()
        timing = time_smollm_shapes(d)
    print("Adapter space: relative Frobenius distance ||B A - method(deltas)|| / ||method(deltas)|| per module "
          "(mean / max over 14 modules) and the norm ratio ||B A|| / ||method(deltas)|| (mean); seed-to-seed: the "
          "distance between two delta-space draws (seeds 0, 1)\n")
    print("| regime | method | adapter vs delta | norm ratio | delta seed-to-seed |")
    print("| --- | --- | --- | --- | --- |")
    for r in rows:
        if r[0] == "adapter-vs-delta":
            seed = [x for x in rows if x[0] == "seed-to-seed" and x[1:3] == r[1:3]]
            floor = f"{seed[0][3]:.3f} / {seed[0][4]:.3f}" if seed else "0 (deterministic)"
            print(f"| {r[1]} | {r[2]} | {r[3]:.3f} / {r[4]:.3f} | {r[5]:.3f} | {floor} |")
    ranks = sorted({r[3] for r in rows if r[0] == "delta-svd"})
    print("\nDelta space, tiny Llama: mean relative SVD error over 14 modules vs output rank (min dim 16 or 32)\n")
    print("| regime | method | " + " | ".join(f"rank {k}" for k in ranks) + " |")
    print("| --- | --- | " + " | ".join("---" for _ in ranks) + " |")
    for regime in REGIMES:
        for method, _, _ in VARIANTS:
            vals = [r for r in rows if r[0] == "delta-svd" and r[1] == regime and r[2] == method]
            print(f"| {regime} | {method} | " + " | ".join(f"{r[4]:.3f}" for r in vals) + " |")
    print("\nDelta space, SmolLM2-135M module shapes, 3 random r-16 experts: relative SVD error vs output rank\n")
    print("| shape | regime | method | rank 16 | 48 | 64 | 128 | 256 | 384 |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for shape, regime, m, errs in big:
        print(f"| {shape} | {regime} | {m} | " + " | ".join(f"{e:.3f}" for e in errs) + " |")
    print("\nWall time, 3 SmolLM2-135M-shaped r-16 adapters (bf16), 3 of 30 layers = 21 modules, CPU; "
          "x10 estimates the whole model\n")
    print("| space | --rank | method | output r | time, 21 modules (s) | x10 (s) | mean SVD error |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for space, rank, m, r_out, secs, err in timing:
        print(f"| {space} | {rank or '-'} | {m} | {r_out} | {secs:.2f} | {10 * secs:.0f} | {err:.3f} |")
    print(f"\n({time.time() - t0:.0f} s)")


def test_merge_nll_scores_adapters_on_reference_answers(tmp_path):
    """bench/merge_nll.py: an adapter with B = 0 scores exactly the base's NLL, a changed one does not;
    the JSON lists every model; a malformed --adapters is one line."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    import common
    import merge_nll
    model, tok = common.tiny_model(0)
    zero = common.add_lora(model, r=4, alpha=8, dropout=0.0)
    common.save_adapter(zero, tmp_path / "zero")
    with torch.no_grad():
        for n, p in zero.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.5, generator=torch.Generator().manual_seed(1))
    common.save_adapter(zero, tmp_path / "moved")
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"count to {i}"},
                                                     {"role": "assistant", "content": " ".join(map(str, range(i)))}]}) + "\n"
                            for i in (3, 5)))
    out = merge_nll.main(["--model", "tiny", "--rows", str(rows), "--adapters", f"zero={tmp_path / 'zero'}",
                          f"moved={tmp_path / 'moved'}", "--out", str(tmp_path / "nll.json")])
    r = out["results"]
    assert set(r) == {"base", "zero", "moved"} and r["base"]["tokens"] > 0
    assert abs(r["zero"]["nll"] - r["base"]["nll"]) < 1e-5
    assert abs(r["moved"]["nll"] - r["base"]["nll"]) > 1e-3
    assert json.loads((tmp_path / "nll.json").read_text())["results"]["moved"]["nll"] == r["moved"]["nll"]
    with pytest.raises(SystemExit, match="NAME=DIR"):
        merge_nll.main(["--model", "tiny", "--rows", str(rows), "--adapters", str(tmp_path / "zero")])
    with pytest.raises(SystemExit, match="reserved or repeated"):
        merge_nll.main(["--rows", str(rows), "--adapters", f"base={tmp_path / 'zero'}"])
    # task-vector size and direction against a reference adapter (no model): a B = 0 adapter has none
    norms = merge_nll.main(["--no-nll", "--norms-vs", "moved", "--adapters", f"moved={tmp_path / 'moved'}",
                            f"zero={tmp_path / 'zero'}"])["norms"]
    assert norms["moved"]["norm_ratio"]["mean"] == pytest.approx(1.0) and norms["moved"]["cosine"]["min"] == pytest.approx(1.0)
    assert norms["zero"]["norm_ratio"]["max"] == 0.0


@pytest.mark.parametrize("method,space", [("ties", "delta"), ("dare_ties", "adapter"), ("della", "delta"),
                                          ("soup", "delta")])    # soup: the exact concatenation, as the stage runs it
def test_rescale_equals_merging_at_that_lambda(zoo, tmp_path, method, space):
    """The merge stage's lambda candidates: a merge at lambda 1 rescaled to 0.5 / 1.5 (B x lambda) has the same
    deltas as merging at 0.5 / 1.5 (same seed, same draws), and its report says the lambda it stands for."""
    ads = [zoo["a0"], zoo["a1"], zoo["a2"]]
    merge.merge_adapters(ads, tmp_path / "l1", method, space=space, seed=3)
    for lam in (0.5, 1.5):
        merge.main(["--rescale", str(tmp_path / "l1"), "--lam", str(lam), "--out", str(tmp_path / f"r{lam}")])
        merge.merge_adapters(ads, tmp_path / f"m{lam}", method, space=space, seed=3, lam=lam)
        got, want = deltas_of(tmp_path / f"r{lam}"), deltas_of(tmp_path / f"m{lam}")
        assert set(got) == set(want) and max_rel(got, want) < 1e-5
        rep = json.loads((tmp_path / f"r{lam}" / merge.REPORT_FILE).read_text())
        assert rep["params"]["lam"] == lam and rep["rescaled_from"] == str(tmp_path / "l1") and rep["method"] == method
        assert (tmp_path / f"r{lam}" / "done.json").is_file()
        # its outcome keeps the source's rank and SVD errors (a scale of B scales the residual alike) for the report
        got, src = (json.loads((tmp_path / d / "result.json").read_text())["outcome"] for d in (f"r{lam}", "l1"))
        assert got["r"] == src["r"] and got["lam"] == lam and all(got[k] == v for k, v in src.items() if k != "lam")
    # from a candidate that is itself at 1.5: the factor is lam / 1.5
    merge.main(["--rescale", str(tmp_path / "r1.5"), "--lam", "0.5", "--out", str(tmp_path / "back")])
    assert max_rel(deltas_of(tmp_path / "back"), deltas_of(tmp_path / "m0.5")) < 1e-5


def test_rescale_of_a_folder_that_is_not_a_merge_is_a_clear_error(zoo, tmp_path, capsys):
    with pytest.raises(SystemExit, match="not a merge.py output"):
        merge.main(["--rescale", str(zoo["a0"]), "--lam", "0.5", "--out", str(tmp_path / "x")])
    with pytest.raises(SystemExit):
        merge.main(["--out", str(tmp_path / "y")])          # neither --rescale nor --method/--adapters
    assert "--method and --adapters are required" in capsys.readouterr().err


def test_rescale_refuses_what_it_would_ignore_or_clobber(zoo, tmp_path, capsys):
    merge.merge_adapters([zoo["a0"], zoo["a1"]], tmp_path / "m", "ties", space="delta")
    for argv, msg in ((["--lam", "0.5", "--method", "ties"], "not --method"), ([], "--lam (required)")):
        with pytest.raises(SystemExit):
            merge.main(["--rescale", str(tmp_path / "m"), "--out", str(tmp_path / "x"), *argv])
        assert msg in capsys.readouterr().err
    with pytest.raises(SystemExit, match="is the merge being rescaled"):
        merge.main(["--rescale", str(tmp_path / "m"), "--lam", "0.5", "--out", str(tmp_path / "m")])
    with pytest.raises(SystemExit, match="not a number"):
        merge.main(["--rescale", str(tmp_path / "m"), "--lam", "nan", "--out", str(tmp_path / "x")])


def test_a_non_finite_expert_is_a_clear_error_not_a_zeroed_module(zoo, tmp_path):
    """The Gram-matrix SVD would turn a NaN into an empty basis (a zero module, error 0): refuse it by name."""
    from safetensors.torch import load_file, save_file
    bad = tmp_path / "bad"
    shutil.copytree(zoo["a1"], bad)
    sd = load_file(str(bad / merge.ADAPTER_FILE))
    key = sorted(k for k in sd if k.endswith("lora_B.weight"))[0]
    sd[key][0, 0] = float("nan")
    save_file(sd, str(bad / merge.ADAPTER_FILE))
    with pytest.raises(merge.MergeError, match="non-finite LoRA weights"):
        merge.merge_adapters([zoo["a0"], bad], tmp_path / "out", "ties", space="delta")
    for shape in ((300, 500), (30, 50)):            # the randomized route and the small full-SVD one
        with pytest.raises(merge.MergeError, match="not finite"):
            merge.svd_dense(torch.full(shape, float("nan")), 8)
    B, A = torch.randn(40, 4), torch.randn(4, 30)
    B[1, 1] = float("inf")
    with pytest.raises(merge.MergeError, match="not finite"):
        merge.svd_lowrank_product(B, A, 2)
