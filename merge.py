"""Merge LoRA experts that share one base model, without training; the result is again a peft LoRA adapter.

    python merge.py --method soup --adapters runs/rl0 runs/rl1 runs/rl2 --out runs/merge_soup
    python merge.py --method ties --adapters A B C --out DIR --density 0.5
    python merge.py --method della --space delta --rank 256 --adapters A B C --out DIR
    python merge.py --method dare_ties --space delta --full --base MODEL_DIR --adapters A B C --out DIR
    python merge.py --method dare_ties --dare-norm mean --lam 0.5 --adapters A B C --out DIR

Methods (docs/method.md §5; each is defined on task vectors delta_i and is one plain function below,
applied per module to a list of tensors; METHODS maps the name to it):
  soup       weighted average: sum_i w_i delta_i (weights are relative: normalised to sum 1), times lam.
  ties       trim each delta to its top `density` fraction by magnitude (whole tensor), elect the sign of
             every entry by the weighted sum of the trimmed deltas, average the entries that agree with it
             (weighted disjoint mean), times lam.
  dare_ties  drop each entry with probability 1 - density, rescale the kept ones by 1/density, elect the
             sign of every entry by the weighted sum of the rescaled deltas (as TIES), then, by --dare-norm:
               sum  (default)  sum_i w_i m_i x_i: the weighted sum of the agreeing kept entries, not divided;
               mean            sum_i w_i m_i x_i / sum_i w_i m_i: TIES' disjoint mean over them;
             times lam (x_i the rescaled deltas, m_i marks the kept entries that agree with the elected sign).
             With density 1 they are TIES without trimming, in its sum and mean forms.
  della      MagPrune: within each row, keep probabilities rise linearly with the magnitude rank from
             density - epsilon (smallest) to density + epsilon (largest), i.e. drop probabilities fall
             inside a window of +-epsilon around 1 - density; kept entries are rescaled by 1/keep_prob;
             then the TIES sign election and disjoint mean (always the mean form), times lam.

DARE-TIES, the two normalisations. The 1/density rescale keeps each delta's expected value; the sum form
keeps it through the merge, so on experts that agree (one lineage: staged SFT checkpoints, then RL, as in
CHORUS) it stays near the soup (measured 1.16-1.21 x the soup's norm on synthetic related experts: the
drop noise). The mean form divides by the weight of the entries that survived the drop, which undoes the
drop a second time: where the experts agree it is about 1/density x the soup (measured 1.9x at density 0.5
on the small run's experts, enough to lose the answer format; results/small_run.md); it fits task vectors
whose kept entries rarely overlap, and lam ~ density compensates otherwise. Where the experts disagree in
sign, the sum form keeps only the agreeing experts' weighted share, the mean form their mean. Who computes which:
  sum   mergekit's `dare_ties` with its default `normalize: false` (our weights are normalised to sum 1:
        ours == mergekit's with weights w_i; mergekit's unnormalised weights correspond to our lam).
  mean  peft's `dare_ties` (add_weighted_adapter; it divides by the count of agreeing entries, == ours with
        uniform weights), the DARE authors' code (DARE masks, then their TIES merge: a disjoint mean), and
        mergekit's `dare_ties` with `normalize: true`; before --dare-norm, merge.py's only form.
The default is sum: it is mergekit's default, it keeps the experts' scale where they agree in sign, which
is most entries for the experts this kit merges (they share a lineage by construction), and so it needs no
lam tuning to keep the model's answer format. DELLA stays in the mean form, which
is mergekit's `della` default (`normalize: true`); on one lineage it is ~1/density x the soup as well.
mergekit's current DARE rescale is the ratio of the delta's L1 norms before and after the drop (older
versions: 1/density exactly, as here and in peft): about 1/density on large tensors.

Two spaces (docs/stack.md §3):
  --space adapter (default)  apply the method to the factors: all A_i together, all B_i together, per
      module, each adapter's scaling s_i folded in as sqrt(s_i) on both factors; lam goes on B only.
      Output: same rank r, scaling 1. Cheap, needs equal ranks. The product of averaged factors is NOT the
      average of the products: (sum_i w_i B_i)(sum_j w_j A_j) = sum_i w_i^2 B_i A_i + cross terms
      w_i w_j B_i A_j. The cross terms vanish only when the adapters are identical (a soup of identical
      adapters returns that adapter) and are small when they share a start and drift little; for
      independently trained adapters the adapter-space merge is not an average of the deltas at all.
      TIES/DARE/DELLA trim, drop and elect signs on A and B entries separately, so their product is not
      the method's delta-space result either (`--compare-delta` reports the distance and norm ratio per
      module). DARE/DELLA drop A and B entries independently, so a term B_ik A_kj of the product survives
      with probability p_B p_A; the rescale is chosen so that the product carries the method's rescale once:
        sum form (dare_ties --dare-norm sum): 1/p on each factor. Each merged factor is then unbiased, and
        E[B A] = E[B] E[A] is the product of the factor soups (the 1/(p_B p_A) on a term is its inverse
        survival probability). 1/sqrt(p) here would shrink the product to density x (measured 0.58 of the
        delta-space merge's norm).
        mean forms (dare_ties --dare-norm mean, della): 1/sqrt(p) on each factor. The disjoint mean already
        puts each factor back at its own scale where the experts agree, so a 1/p on each factor reached the
        product twice: 3.5x the soup's norm at density 0.5, ~1/density x the delta-space merge (peft's
        add_weighted_adapter dare_ties does that). sqrt on both rather than 1/p on one factor: A and B are
        treated alike (no arbitrary side; lam alone goes on B) and DELLA's per-entry p splits the same way.
      Measured on related experts (3, shared start + 5-30 % drift, density 0.5; the tiny Llama of
      tests/test_merge.py and random r-16 factors of SmolLM2-135M module shapes): the product's norm is
      0.93-0.97 of the delta-space merge's for the mean forms (mean over modules), 1.12-1.17 for the sum
      form (the drop noise of two factors instead of one), against 1.64-1.90 with 1/p on both factors.
  --space delta  merge the real task vectors delta_i = s_i B_i A_i (out x in, per module) exactly as the
      methods are defined. Output: a LoRA from the truncated SVD of the merged delta at `--rank` (default
      sum_i r_i), with the relative Frobenius error per module in the report; a sparsified delta is full
      rank, so a low rank loses most of a TIES/DARE/DELLA merge. The soup has an exact form without SVD:
      concatenate the scaled factors (rank sum_i r_i), used when --rank is not given. `--full --base DIR`
      also writes the merged full weights W0 + delta (exact, no SVD) as an HF model folder in OUT/full.

Relation to peft's `add_weighted_adapter` (checked in tests/test_merge.py):
  - adapter-space soup == peft "linear" with weights w_i^2 (peft folds sqrt(w_i s_i) into both factors, so
    its "linear" with weights 1/n returns n x an adapter that is averaged with itself); we average instead.
  - delta-space exact soup == peft "cat" with weights w_i; delta soup with --rank == peft "svd".
  - ties (both spaces) == peft "ties" / "ties_svd" with weights 1 when the weights are uniform and the
    scalings equal. They differ otherwise: peft elects signs on the unweighted tensors and divides the
    weighted sum by the COUNT of agreeing entries (so weights 1/n give 1/n of the mean); we elect by the
    weighted sum and divide by the sum of the agreeing weights (a weighted mean, invariant to the weights'
    scale, as in TIES with non-uniform weights and mergekit's normalised form).
  - we trim to round(density * numel) entries; peft's magnitude_based_pruning truncates with int(), which
    turns 0.29 * 100 into 28. The sign election equals peft's sign-mask helper (checked in the tests).
  - dare_ties --dare-norm mean == peft "dare_ties" with weights 1 up to the random masks (uniform weights,
    equal scalings; delta space == "dare_ties_svd"); peft has no sum form. In adapter space peft rescales
    both factors by 1/density (see "Two spaces").
  - dare_ties/della draw their masks from a seeded generator per (seed, module, factor, adapter) on the
    CPU, so a merge is deterministic and the same on CPU and GPU; peft's random pruning uses the global RNG.
  - della is not in peft; we rescale kept entries by 1/keep_prob per entry (the DELLA paper), not by the
    tensor's L1 norm (mergekit).

Output folder: adapter_config.json + adapter_model.safetensors (a standard peft folder, loadable with
PeftModel.from_pretrained on the base), merge_report.json (method, space, params, per-module SVD error,
timings) and, with --full, full/ (an HF model folder). Inputs are validated before anything is written;
the output folder may not be one of the inputs. The work goes module by module (memory: one module's
tensors, plus the base model with --full).
"""
import argparse
import json
import math
import os
import shutil
import sys
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

import common
import rundir

ADAPTER_FILE = "adapter_model.safetensors"
CONFIG_FILE = "adapter_config.json"
REPORT_FILE = "merge_report.json"
DEFAULT_DENSITY = 0.5      # fraction of each delta kept by ties/dare_ties/della (the paper gives none)
DEFAULT_EPSILON = 0.15     # DELLA window half-width (mergekit's default; the paper gives none)
DARE_NORMS = ("sum", "mean")
DEFAULT_DARE_NORM = "sum"  # dare_ties' normalisation (--dare-norm; why 'sum' is the default: module docstring)
# files copied from the base folder into OUT/full so that it loads as a complete model with its tokenizer
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                   "vocab.json", "merges.txt", "tokenizer.model", "added_tokens.json")


class MergeError(ValueError):
    """Bad input: one clear line, raised before anything is written."""


# ----------------------------------------------------------------------------------------------------
# Building blocks on task tensors

def _weights(weights, n, device):
    """Relative weights -> a float tensor summing to 1 (all methods are weighted averages)."""
    w = torch.ones(n) if weights is None else torch.as_tensor(weights, dtype=torch.float32)
    return (w / w.sum()).to(device)


def _view(w, like):
    """Weights of shape (n,) broadcast against stacked tensors of shape (n, ...)."""
    return w.view((-1,) + (1,) * (like.dim() - 1))


def kth_largest(a, k):
    """The k-th largest entry of the 1-D tensor a, exactly (the value torch.kthvalue(a, numel - k + 1) gives).

    A whole-tensor kthvalue is slow on large tensors (a 25M-entry module: 0.6 s on a 2-core CPU; on CUDA it
    runs in a single thread block), so the value is first bracketed: a strided sample of SELECT_SAMPLE entries,
    sorted, gives [lo, hi] around the target's quantile; if the counts show the k-th largest lies inside
    (n_above = #{a > hi} < k <= #{a >= lo}), it is the (k - n_above)-th largest of the few entries in [lo, hi].
    Otherwise (a sample that missed, e.g. on strongly periodic data) the whole-tensor selection runs."""
    n = a.numel()
    if n <= 4 * SELECT_SAMPLE:
        return _kth_smallest(a, n - k + 1)
    sample = a[:: n // SELECT_SAMPLE].sort().values
    m = sample.numel()
    centre, margin = (n - k) / n * (m - 1), 8 * math.sqrt(m)
    lo = sample[max(0, math.floor(centre - margin))]
    hi = sample[min(m - 1, math.ceil(centre + margin))]
    n_above = int((a > hi).sum())
    cand = a[(a >= lo) & (a <= hi)]
    if n_above < k <= n_above + cand.numel():
        return _kth_smallest(cand, cand.numel() - (k - n_above) + 1)
    return _kth_smallest(a, n - k + 1)


SELECT_SAMPLE = 1 << 16     # sample size of kth_largest's bracket


def _kth_smallest(a, j):
    """torch.kthvalue(a, j) (1-based); on CUDA by a sort, whose kernels use the whole GPU."""
    if a.device.type == "cuda":
        return a.sort().values[j - 1]
    return torch.kthvalue(a, j).values


def trim_magnitude(x, density):
    """Keep the round(density * numel) entries of x with the largest magnitude (whole tensor), zero the rest.

    The threshold is the k-th largest |x| (kth_largest: exact, linear time); entries tied with it are all
    kept, which only matters for exactly repeated magnitudes."""
    if density >= 1:
        return x
    k = int(round(density * x.numel()))
    if k == 0:
        return torch.zeros_like(x)
    mag = x.abs().reshape(-1).float()
    threshold = kth_largest(mag, k)
    return torch.where(mag.view(x.shape) >= threshold, x, torch.zeros_like(x))


def per_tensor(fn, tensors):
    """[fn(i, x) for i, x in enumerate(tensors)], one thread per tensor: the random draws come from a serial
    CPU generator per tensor (random_keep), so the adapters' draws run side by side; torch releases the GIL.
    Each draw has its own seeded generator, so the result does not depend on the threads."""
    if len(tensors) == 1 or (os.cpu_count() or 1) == 1:
        return [fn(i, x) for i, x in enumerate(tensors)]
    with ThreadPoolExecutor(max_workers=min(len(tensors), os.cpu_count())) as pool:
        return list(pool.map(fn, range(len(tensors)), tensors))


def draw_seed(seed, tag, i):
    """The generator seed for adapter i's random draws on tensor `tag`: stable across runs, devices and module order."""
    return zlib.crc32(f"{seed}/{tag}/{i}".encode())


def random_keep(x, keep_prob, seed, power=1.0):
    """Keep each entry with probability keep_prob (scalar or per entry) and rescale it by 1/keep_prob**power
    (power 1: unbiased, DARE's rescale; adapter space uses 0.5 for the mean forms, see merge_module).

    The uniform draws u come from a CPU generator seeded with `seed` (one u per entry, row-major), so the
    same seed gives the same mask on any device; entry kept iff u < keep_prob."""
    gen = torch.Generator().manual_seed(seed)
    u = torch.rand(x.shape, generator=gen, dtype=torch.float32).to(x.device)
    keep_prob = torch.as_tensor(keep_prob, dtype=x.dtype, device=x.device)
    return torch.where(u < keep_prob, x / keep_prob ** power, torch.zeros_like(x))


def della_keep_prob(x, density, epsilon):
    """DELLA's MagPrune keep probabilities, per row (last dim): rank entries by |x|, smallest rank 0, largest
    n-1; keep_prob = density - epsilon + 2 epsilon * rank / (n - 1) (a lone entry gets density)."""
    n = x.shape[-1]
    order = torch.argsort(x.abs(), dim=-1, stable=True)
    positions = torch.arange(n, dtype=x.dtype, device=x.device).expand_as(x)
    rank = torch.empty_like(x).scatter_(-1, order, positions)        # rank[j] = position of entry j in order
    rank_norm = rank / (n - 1) if n > 1 else torch.full_like(x, 0.5)
    return density - epsilon + 2 * epsilon * rank_norm


def elect_sign_merge(stacked, w, norm="mean"):
    """TIES sign election + disjoint merge over stacked (n, ...) task tensors with weights w (n,, summing to 1).

    The elected sign of each entry is the sign of the weighted sum (ties go to +, peft's convention); m_i
    marks the entries that agree with it (zeros never agree). norm "mean": sum_i w_i m_i x_i / sum_i w_i m_i,
    0 where none agrees (the disjoint mean); norm "sum": sum_i w_i m_i x_i (no division).
    (== peft's calculate_majority_sign_mask(w * stacked, "total") and the masked sums, one tensor at a time:
    w_i > 0, so sign(w_i x_i) = sign(x_i); tests/test_merge.py checks it against peft's helper.)"""
    weighted = [w[i] * x for i, x in enumerate(stacked)]
    total = weighted[0].clone()
    for y in weighted[1:]:
        total += y
    positive = total >= 0
    num, den = torch.zeros_like(total), torch.zeros_like(total)
    for i, y in enumerate(weighted):
        agree = torch.where(positive, y > 0, y < 0)
        num += torch.where(agree, y, 0.0)
        if norm != "sum":
            den += agree * w[i]
    if norm == "sum":
        return num
    return torch.where(den > 0, num / den, torch.zeros_like(num))


# ----------------------------------------------------------------------------------------------------
# The methods: one function each, same signature, over the list of one module's tensors (task vectors in
# delta space, or stacked A's / B's in adapter space). `tag` names the tensor for the random draws;
# dare_norm is dare_ties' normalisation; rescale_power the exponent of the random methods' 1/keep_prob
# rescale (1 on task vectors; merge_module picks it per factor in adapter space). A method ignores what it
# does not use.

def soup(tensors, weights=None, *, density=1.0, epsilon=0.0, lam=1.0, seed=0, tag="", dare_norm=DEFAULT_DARE_NORM,
         rescale_power=1.0):
    """Model soup: lam * sum_i w_i x_i with w normalised to sum 1 (uniform by default)."""
    stacked = torch.stack(tensors)
    w = _weights(weights, len(tensors), stacked.device)
    return lam * (stacked * _view(w, stacked)).sum(0)


def ties(tensors, weights=None, *, density=DEFAULT_DENSITY, epsilon=0.0, lam=1.0, seed=0, tag="",
         dare_norm=DEFAULT_DARE_NORM, rescale_power=1.0):
    """TIES: magnitude trim to `density`, sign election by weighted mass, weighted disjoint mean, times lam."""
    trimmed = [trim_magnitude(x, density) for x in tensors]
    return lam * elect_sign_merge(trimmed, _weights(weights, len(tensors), trimmed[0].device), "mean")


def dare_ties(tensors, weights=None, *, density=DEFAULT_DENSITY, epsilon=0.0, lam=1.0, seed=0, tag="",
              dare_norm=DEFAULT_DARE_NORM, rescale_power=1.0):
    """DARE-TIES: random drop with rate 1 - density, rescale by 1/density, TIES sign election, then the
    weighted sum of the agreeing entries (dare_norm "sum") or their weighted mean ("mean"), times lam."""
    kept = per_tensor(lambda i, x: random_keep(x, density, draw_seed(seed, tag, i), rescale_power), tensors)
    return lam * elect_sign_merge(kept, _weights(weights, len(tensors), kept[0].device), dare_norm)


def della(tensors, weights=None, *, density=DEFAULT_DENSITY, epsilon=DEFAULT_EPSILON, lam=1.0, seed=0, tag="",
          dare_norm=DEFAULT_DARE_NORM, rescale_power=1.0):
    """DELLA: per-row magnitude-ranked drop (MagPrune, rescale 1/keep_prob), TIES election and mean, times lam.

    Always the mean form (mergekit's della default, normalize: true); dare_norm is ignored. With epsilon 0
    every keep probability is `density` and the draws are DARE's, so della == dare_ties(dare_norm="mean")."""
    kept = per_tensor(lambda i, x: random_keep(x, della_keep_prob(x, density, epsilon), draw_seed(seed, tag, i),
                                               rescale_power), tensors)
    return lam * elect_sign_merge(kept, _weights(weights, len(tensors), kept[0].device), "mean")


def factor_rescale_power(method, dare_norm):
    """Adapter space: the exponent of 1/keep_prob on each factor's kept entries, so that the product B A
    carries the method's rescale once (module docstring, "Two spaces"): 1/sqrt(keep_prob) per factor for the
    mean forms (dare_ties --dare-norm mean, della), 1/keep_prob per factor for the sum form (each factor
    unbiased, so E[B A] is the product of the factor soups). soup and ties draw nothing."""
    return 0.5 if method == "della" or (method == "dare_ties" and dare_norm == "mean") else 1.0


METHODS = {"soup": soup, "ties": ties, "dare_ties": dare_ties, "della": della}
SPACES = ("adapter", "delta")


# ----------------------------------------------------------------------------------------------------
# Low-rank output

def truncate(U, S, Vh, rank):
    """Balanced rank-`rank` factors (B = U sqrt(S), A = sqrt(S) Vh), zero-padded up to `rank` when the
    module has fewer singular values, and the relative Frobenius error sqrt(sum dropped S^2 / sum S^2)."""
    k = min(rank, S.numel())
    root = S[:k].sqrt()
    B = torch.zeros(U.shape[0], rank, dtype=U.dtype, device=U.device)
    A = torch.zeros(rank, Vh.shape[1], dtype=Vh.dtype, device=Vh.device)
    B[:, :k] = U[:, :k] * root
    A[:k] = root[:, None] * Vh[:k]
    total = S.square().sum()
    err = (S[k:].square().sum() / total).sqrt().item() if total > 0 else 0.0
    return B, A, err


def _svd(M):
    """torch.linalg.svd(M, full_matrices=False); where CUDA's solver does not converge (seen on the near-zero
    B factors of briefly trained adapters: cuSOLVER error 48), the same SVD on the CPU in float64."""
    try:
        return torch.linalg.svd(M, full_matrices=False)
    except torch.linalg.LinAlgError:
        if M.device.type == "cpu" and M.dtype == torch.float64:
            raise
        return tuple(t.to(M.device, M.dtype) for t in torch.linalg.svd(M.cpu().double(), full_matrices=False))


RANGE_TOL = 1e-12   # _orth drops directions whose squared singular value is below this fraction of the largest


def _orth(Y):
    """An orthonormal basis (float32, Y's device) of the range of the tall m x q matrix Y, q small.

    Two passes of: G = Y^T Y in float64, its q x q eigendecomposition on the CPU, Y V Lambda^(-1/2). Same span
    as a Householder QR's Q (the randomized SVD below depends on the span only), but no cuSOLVER call on a
    large matrix: a QR of a tall matrix is latency-bound on a GPU, and slow even on the CPU. Directions of Y
    below RANGE_TOL of its largest (numerically null: Y of rank < q, the zero matrix) are dropped, so the
    basis may have fewer than q columns (none for Y = 0)."""
    Q = Y.double()
    for _ in range(2):                                  # the second pass restores orthogonality to float64 level
        lam, V = torch.linalg.eigh((Q.T @ Q).cpu())
        keep = lam > RANGE_TOL * lam[-1] if lam.numel() and lam[-1] > 0 else torch.zeros_like(lam, dtype=torch.bool)
        Q = Q @ (V[:, keep] / lam[keep].sqrt()).to(Q.device)
    return Q.float()


def _small_svd(C, rank):
    """Top-`rank` SVD of a short k x n matrix C from its k x k Gram matrix (float64, on the CPU): returns
    (Uc (k x rank), S (rank,), A = sqrt(S) Vh (rank x n), zero beyond the numerical rank); Uc and A on C's
    device, S on the CPU."""
    Cd = C.double()
    lam, V = torch.linalg.eigh((Cd @ Cd.T).cpu())
    lam, V = lam.flip(0)[:rank].clamp(min=0), V.flip(1)[:, :rank]
    live = lam > RANGE_TOL * lam[0] if lam.numel() and lam[0] > 0 else torch.zeros_like(lam, dtype=torch.bool)
    S = torch.where(live, lam.sqrt(), torch.zeros_like(lam))
    inv_root = torch.where(live, S.clamp(min=1e-300).rsqrt(), torch.zeros_like(lam))
    A = (inv_root[:, None] * V.T).to(C.device) @ Cd                # sqrt(S) Vh = S^(-1/2) Uc^T C
    return V.to(C.device), S, A


def _balanced(Q, Uc, S, A_small, rank, like):
    """B = Q Uc sqrt(S), A as given, zero-padded up to `rank` columns / rows, in like's dtype and device."""
    k = S.numel()
    B = torch.zeros(Q.shape[0], rank, dtype=like.dtype, device=like.device)
    A = torch.zeros(rank, A_small.shape[1], dtype=like.dtype, device=like.device)
    if k:
        B[:, :k] = ((Q.double() @ Uc) * S.sqrt().to(Q.device)).to(like.dtype)
        A[:k] = A_small.to(like.dtype)
    return B, A


def svd_lowrank_product(B, A, rank):
    """Truncated SVD of B @ A without forming it: orthonormal bases of range(B) and range(A^T) (_orth), the SVD
    of the small core between them. Exact for a product (the optimal, Eckart-Young, rank-`rank` truncation)."""
    B, A = B.float(), A.float()
    if not (torch.isfinite(B).all() and torch.isfinite(A).all()):
        raise MergeError("a factor of the product is not finite (inf/NaN): no SVD of it")
    Qb, Qa = _orth(B), _orth(A.T)
    core = (Qb.T @ B) @ (A @ Qa)                                   # kb x ka, B A = Qb core Qa^T
    total = core.double().square().sum()
    if Qb.shape[1] == 0 or Qa.shape[1] == 0 or total == 0:
        return (torch.zeros(B.shape[0], rank, dtype=B.dtype, device=B.device),
                torch.zeros(rank, A.shape[1], dtype=A.dtype, device=A.device), 0.0)
    Uc, S, A_core = _small_svd(core, rank)                         # core ~ Uc diag(S) Vhc; A_core = sqrt(S) Vhc
    B_out, A_out = _balanced(Qb, Uc, S, A_core @ Qa.T.double(), rank, B)
    err = ((total - S.square().sum()).clamp(min=0) / total).sqrt().item()
    return B_out, A_out, err


SVD_OVERSAMPLE = 16     # extra columns of the randomized range finder (svd_dense)
SVD_POWER_ITERS = 4     # its power iterations, each re-orthonormalised
ERR_RECHECK = 1e-2      # svd_dense recomputes a relative error below this from the matrix (cancellation)


def svd_dense(delta, rank):
    """Truncated SVD of a dense merged delta -> (B, A, relative Frobenius error).

    Where the rank is small against the matrix (a 4B model's 2560 x 9728 modules at rank 48), a full SVD
    is slow (16 s per module on a 2-core CPU; TIES, DARE-TIES and DELLA each need one per module), so a
    randomized SVD takes its place (Halko, Martinsson & Tropp 2011): an orthonormal basis Q of the range
    of delta @ Omega (Omega Gaussian, rank + SVD_OVERSAMPLE columns, fixed seed: deterministic), refined
    by SVD_POWER_ITERS power iterations, then the exact SVD of the small Q^T delta. The large work is
    matrix products; the orthonormalisations and the small SVD are q x q eigenproblems in float64 on the CPU
    (_orth, _small_svd), since cuSOLVER's QR and SVD were the time of a merge on the GPU (results/merge_speed.md).
    The error is that of the matrix itself, ||delta - B A|| / ||delta||: B A = P delta with P an orthogonal
    projector, so ||delta - B A||^2 = ||delta||^2 - sum of the kept S^2 exactly; below ERR_RECHECK (where
    that difference cancels) it is measured on the matrix. A poor approximation shows in the report."""
    delta = delta.float()
    m, n = delta.shape
    total2 = torch.linalg.vector_norm(delta, dtype=torch.float64).square().item()
    if not math.isfinite(total2):
        raise MergeError("a merged delta is not finite (inf/NaN): no SVD of it")
    q = rank + SVD_OVERSAMPLE
    if 2 * q > min(m, n):
        U, S, Vh = _svd(delta)
        return truncate(U, S, Vh, rank)
    if total2 == 0:
        return (torch.zeros(m, rank, dtype=delta.dtype, device=delta.device),
                torch.zeros(rank, n, dtype=delta.dtype, device=delta.device), 0.0)
    gen = torch.Generator(device=delta.device).manual_seed(0)
    omega = torch.randn(n, q, generator=gen, device=delta.device, dtype=delta.dtype)
    Q = _orth(delta @ omega)
    for _ in range(SVD_POWER_ITERS):
        Q = _orth(delta.T @ Q)
        Q = _orth(delta @ Q)
    Uc, S, A_small = _small_svd(Q.T @ delta, rank)
    B, A = _balanced(Q, Uc, S, A_small, rank, delta)
    err = math.sqrt(max(total2 - S.square().sum().item(), 0.0) / total2)
    if err < ERR_RECHECK:
        err = ((delta - B @ A).norm() / math.sqrt(total2)).item()
    return B, A, err


# ----------------------------------------------------------------------------------------------------
# Adapter folders

def read_adapter(path):
    """Read an adapter folder's config and tensor index (not the tensors): modules, ranks, scaling, dtype.

    Only plain LoRA on linear layers is supported; anything else is refused with one line."""
    path = Path(path)
    if not (path / CONFIG_FILE).is_file() or not (path / ADAPTER_FILE).is_file():
        raise MergeError(f"{path}: not a peft adapter folder (needs {CONFIG_FILE} and {ADAPTER_FILE})")
    cfg = json.loads((path / CONFIG_FILE).read_text())
    if cfg.get("peft_type", "LORA") != "LORA":
        raise MergeError(f"{path}: peft_type {cfg.get('peft_type')!r}, only LORA adapters can be merged")
    for key, ok in (("use_dora", False), ("lora_bias", False), ("fan_in_fan_out", False), ("bias", "none")):
        if cfg.get(key, ok) not in (ok, None):
            raise MergeError(f"{path}: {key}={cfg[key]!r} is not supported (plain LoRA only)")
    for key in ("modules_to_save", "rank_pattern", "alpha_pattern", "trainable_token_indices"):
        if cfg.get(key):
            raise MergeError(f"{path}: {key} is set ({cfg[key]!r}); only uniform plain LoRA adapters are supported")
    with safe_open(str(path / ADAPTER_FILE), framework="pt") as f:
        keys = list(f.keys())
        stems = sorted(k[: -len(".lora_A.weight")] for k in keys if k.endswith(".lora_A.weight"))
        other = [k for k in keys if not k.endswith((".lora_A.weight", ".lora_B.weight"))]
        if other:
            raise MergeError(f"{path}: unsupported tensor {other[0]!r} (plain LoRA A/B on linear layers only)")
        shapes, ranks, dtype = {}, set(), None
        for s in stems:
            if s + ".lora_B.weight" not in keys:
                raise MergeError(f"{path}: {s}.lora_A.weight has no lora_B")
            a, b = f.get_slice(s + ".lora_A.weight"), f.get_slice(s + ".lora_B.weight")
            (r, n_in), (n_out, r_b) = a.get_shape(), b.get_shape()
            if r != r_b:
                raise MergeError(f"{path}: {s} has lora_A rank {r} but lora_B rank {r_b}")
            shapes[s] = (n_out, n_in)
            ranks.add(r)
            dtype = dtype or a.get_dtype()
    if not stems:
        raise MergeError(f"{path}: no LoRA tensors in {ADAPTER_FILE}")
    if ranks != {cfg["r"]}:
        raise MergeError(f"{path}: tensor ranks {sorted(ranks)} differ from config r={cfg['r']}")
    r, alpha = cfg["r"], cfg["lora_alpha"]
    scaling = alpha / math.sqrt(r) if cfg.get("use_rslora") else alpha / r
    dtypes = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16, "F64": torch.float64}
    return {"path": path, "config": cfg, "shapes": shapes, "r": r, "scaling": scaling,
            "dtype": dtypes.get(dtype, torch.float32)}


def check_compatible(adapters):
    """All adapters must share the base model, the set of adapted modules and their shapes."""
    first = adapters[0]
    for ad in adapters[1:]:
        if ad["config"].get("base_model_name_or_path") != first["config"].get("base_model_name_or_path"):
            raise MergeError(f"different base models: {first['path']} has "
                             f"{first['config'].get('base_model_name_or_path')!r}, {ad['path']} has "
                             f"{ad['config'].get('base_model_name_or_path')!r}")
        if set(ad["shapes"]) != set(first["shapes"]):
            extra = sorted(set(ad["shapes"]) ^ set(first["shapes"]))
            raise MergeError(f"different target modules: {first['path']} vs {ad['path']} "
                             f"({len(extra)} differ, e.g. {extra[0]})")
        for s, shape in first["shapes"].items():
            if ad["shapes"][s] != shape:
                raise MergeError(f"{s}: shape {shape} in {first['path']} but {ad['shapes'][s]} in {ad['path']}")


def module_name(stem):
    """peft's saved key stem 'base_model.model.<name>' -> the module name in the base model."""
    return stem[len("base_model.model."):] if stem.startswith("base_model.model.") else stem


def load_factors(ad, stem, device):
    """One module's (A, B) in fp32 on `device`, each times sqrt(scaling), so that B @ A is the task vector."""
    root = math.sqrt(ad["scaling"])
    with safe_open(str(ad["path"] / ADAPTER_FILE), framework="pt") as f:
        A = f.get_tensor(stem + ".lora_A.weight").to(device=device, dtype=torch.float32)
        B = f.get_tensor(stem + ".lora_B.weight").to(device=device, dtype=torch.float32)
    if not (torch.isfinite(A).all() and torch.isfinite(B).all()):   # the SVD would silently zero the module
        raise MergeError(f"{ad['path']}: module {stem} has non-finite LoRA weights (inf/NaN)")
    return A * root, B * root


# ----------------------------------------------------------------------------------------------------
# One module

def task_vectors(factors):
    """The dense task vectors delta_i = B_i @ A_i of one module's factors [(A_i, B_i)] (scaling folded in)."""
    return [b @ a for a, b in factors]


def merge_module(method, space, factors, weights, params, lam, rank, stem, want_delta=False, compare_delta=False):
    """Merge one module's factors [(A_i, B_i)] (scaling folded in) -> dict(A, B, svd_rel_error[, delta, ...]).

    params: density, epsilon, seed, dare_norm. lam is applied once per product: on B in adapter space, on
    the delta in delta space. In adapter space the random methods rescale each factor's kept entries by
    1/keep_prob**factor_rescale_power(...), so that the product carries their rescale once. `delta` (the
    merged task vector of this output before any --rank truncation) is returned when want_delta;
    `rel_error_vs_delta` (adapter space) is ||B A - method(deltas)|| / ||method(deltas)||, and
    `norm_ratio_vs_delta` is ||B A|| / ||method(deltas)||."""
    fn = METHODS[method]
    out = {}
    if space == "adapter":
        power = factor_rescale_power(method, params.get("dare_norm", DEFAULT_DARE_NORM))
        A = fn([a for a, _ in factors], weights, **params, lam=1.0, tag=stem + "/A", rescale_power=power)
        B = fn([b for _, b in factors], weights, **params, lam=lam, tag=stem + "/B", rescale_power=power)
        if rank is not None:
            B_out, A_out, err = svd_lowrank_product(B, A, rank)
        else:
            B_out, A_out, err = B, A, 0.0
        delta = B @ A if (want_delta or compare_delta) else None
        if compare_delta:
            ref = fn(task_vectors(factors), weights, **params, lam=lam, tag=stem + "/delta")
            norm = ref.norm()
            out["rel_error_vs_delta"] = ((delta - ref).norm() / norm).item() if norm > 0 else 0.0
            out["norm_ratio_vs_delta"] = (delta.norm() / norm).item() if norm > 0 else 0.0
    elif method == "soup":
        # the exact soup as a LoRA: concatenate the sqrt(w_i)-scaled factors (rank sum r_i); lam on B;
        # with --rank, the truncated SVD of that product (computed from the factors, never dense)
        w = _weights(weights, len(factors), factors[0][0].device)
        A_cat = torch.cat([w[i].sqrt() * a for i, (a, _) in enumerate(factors)], dim=0)
        B_cat = lam * torch.cat([w[i].sqrt() * b for i, (_, b) in enumerate(factors)], dim=1)
        if rank is None:
            B_out, A_out, err = B_cat, A_cat, 0.0
        else:
            B_out, A_out, err = svd_lowrank_product(B_cat, A_cat, rank)
        delta = B_cat @ A_cat if want_delta else None
    else:
        delta = fn(task_vectors(factors), weights, **params, lam=lam, tag=stem + "/delta")
        r_out = rank if rank is not None else sum(a.shape[0] for a, _ in factors)
        B_out, A_out, err = svd_dense(delta, r_out)
    out.update(A=A_out, B=B_out, svd_rel_error=err)
    if want_delta:
        out["delta"] = delta
    return out


# ----------------------------------------------------------------------------------------------------
# The whole merge

def merge_adapters(adapter_dirs, out_dir, method, space="adapter", weights=None, density=DEFAULT_DENSITY,
                   epsilon=DEFAULT_EPSILON, lam=1.0, rank=None, full=False, base=None, seed=0, device="cpu",
                   compare_delta=False, dare_norm=DEFAULT_DARE_NORM):
    """Merge the LoRA adapters in `adapter_dirs` (same base, same modules) into one peft adapter in `out_dir`.

    method: soup | ties | dare_ties | della; space: adapter | delta (see the module docstring).
    weights: relative per-adapter weights (default uniform). density: kept fraction (ties/dare_ties/della;
    soup ignores it). epsilon: DELLA window. dare_norm: "sum" | "mean", dare_ties' normalisation (module
    docstring; the others ignore it). lam: final scale. rank: output rank by truncated SVD of the
    merged delta (default: r in adapter space, the exact concatenation for a delta soup, sum r_i otherwise).
    full: also write W0 + delta as an HF model folder out_dir/full (needs base, an HF model folder).
    seed: random draws of dare_ties/della. device: where the arithmetic runs. compare_delta: in adapter
    space, also report each module's distance to the delta-space result of the same method.
    Returns the report dict (also written to out_dir/merge_report.json)."""
    t_start = time.time()
    # ---- validate everything before writing anything
    if method not in METHODS:
        raise MergeError(f"unknown method {method!r}; choose from {', '.join(METHODS)}")
    if space not in SPACES:
        raise MergeError(f"unknown space {space!r}; choose from {', '.join(SPACES)}")
    adapter_dirs = [Path(p) for p in adapter_dirs]
    if not adapter_dirs:
        raise MergeError("no adapters given")
    for p in adapter_dirs:
        if not p.is_dir():
            raise MergeError(f"adapter folder not found: {p}")
    out_dir = Path(out_dir)
    if any(out_dir.resolve() == p.resolve() for p in adapter_dirs):
        raise MergeError(f"output folder {out_dir} is one of the input adapters; choose another --out")
    if weights is not None:
        weights = [float(x) for x in weights]
        if len(weights) != len(adapter_dirs):
            raise MergeError(f"{len(weights)} weights for {len(adapter_dirs)} adapters")
        if not all(x > 0 and math.isfinite(x) for x in weights):
            raise MergeError(f"weights must be positive and finite, got {weights}")
    if dare_norm not in DARE_NORMS:
        raise MergeError(f"unknown dare_norm {dare_norm!r}; choose from {', '.join(DARE_NORMS)}")
    if not (0 < density <= 1):
        raise MergeError(f"density must be in (0, 1], got {density}")
    if method == "della" and not (0 <= epsilon and density - epsilon > 0 and density + epsilon <= 1):
        raise MergeError(f"della needs 0 <= epsilon and density +- epsilon inside (0, 1], got density {density}, "
                         f"epsilon {epsilon}")
    if rank is not None and (int(rank) != rank or rank < 1):
        raise MergeError(f"rank must be a positive integer, got {rank}")
    if full and (base is None or not (Path(base) / "config.json").is_file()):
        raise MergeError(f"--full needs --base MODEL_DIR, an HF model folder with config.json (got {base})")
    adapters = [read_adapter(p) for p in adapter_dirs]
    check_compatible(adapters)
    if space == "adapter" and len({ad["r"] for ad in adapters}) > 1:
        raise MergeError(f"adapter space needs equal ranks, got {[ad['r'] for ad in adapters]}; use --space delta")
    try:
        torch.empty(0, device=device)
    except (RuntimeError, AssertionError) as e:
        raise MergeError(f"device {device!r} is not usable: {e}") from None
    if torch.device(device).type == "cuda":
        common.apply_gpu_cap()          # $CHORUS_GPU_CAP_GIB, as in every other stage

    params = {"density": density, "epsilon": epsilon, "seed": seed, "dare_norm": dare_norm}
    w = weights
    model = None
    t_load = 0.0
    if full:
        t0 = time.time()
        from transformers import AutoModelForCausalLM
        model = AutoModelForCausalLM.from_pretrained(str(base), dtype="auto")
        t_load = time.time() - t0
    print(f"merge: {method} in {space} space, {len(adapters)} adapters (r={[ad['r'] for ad in adapters]}, "
          f"scaling={[round(ad['scaling'], 4) for ad in adapters]}), weights={w or 'uniform'}, density={density}, "
          f"epsilon={epsilon}, lam={lam}, rank={rank}, seed={seed}, device={device}"
          + (f", dare_norm={dare_norm}" if method == "dare_ties" else ""))

    # ---- module by module
    tensors, modules = {}, {}
    t_merge = 0.0
    stems = sorted(adapters[0]["shapes"])
    for stem in stems:
        t0 = time.time()
        factors = [load_factors(ad, stem, device) for ad in adapters]
        res = merge_module(method, space, factors, w, params, lam, rank, stem,
                           want_delta=full, compare_delta=compare_delta and space == "adapter")
        t_merge += time.time() - t0
        tensors[stem + ".lora_A.weight"] = res["A"].to("cpu", adapters[0]["dtype"]).contiguous()
        tensors[stem + ".lora_B.weight"] = res["B"].to("cpu", adapters[0]["dtype"]).contiguous()
        name = module_name(stem)
        entry = {"shape": list(adapters[0]["shapes"][stem]), "rank": res["A"].shape[0],
                 "svd_rel_error": round(res["svd_rel_error"], 6)}
        if "rel_error_vs_delta" in res:
            entry["rel_error_vs_delta"] = round(res["rel_error_vs_delta"], 6)
            entry["norm_ratio_vs_delta"] = round(res["norm_ratio_vs_delta"], 6)
        modules[name] = entry
        if model is not None:
            try:
                weight = model.get_submodule(name).weight
            except AttributeError:
                raise MergeError(f"--base {base} has no module {name}; is it the adapters' base model?") from None
            if tuple(weight.shape) != tuple(res["delta"].shape):
                raise MergeError(f"--base {base}: {name} has shape {tuple(weight.shape)}, the adapters expect "
                                 f"{tuple(res['delta'].shape)}")
            with torch.no_grad():
                weight.copy_((weight.float() + res["delta"].to(weight.device)).to(weight.dtype))

    # ---- write
    t0 = time.time()
    out_rank = tensors[stems[0] + ".lora_A.weight"].shape[0]
    config = dict(adapters[0]["config"])
    config.update(r=out_rank, lora_alpha=out_rank, use_rslora=False, rank_pattern={}, alpha_pattern={},
                  inference_mode=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out_dir / (ADAPTER_FILE + ".tmp")
    save_file(tensors, str(tmp), metadata={"format": "pt"})
    os.replace(tmp, out_dir / ADAPTER_FILE)
    (out_dir / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
    full_dir = None
    if model is not None:
        full_dir = out_dir / "full"
        model.save_pretrained(str(full_dir))
        for name in TOKENIZER_FILES:
            if (Path(base) / name).is_file():
                shutil.copy2(Path(base) / name, full_dir / name)
    t_save = time.time() - t0

    errs = [m["svd_rel_error"] for m in modules.values()]
    summary = {"svd_rel_error_mean": round(sum(errs) / len(errs), 6), "svd_rel_error_max": max(errs)}
    vs = [m["rel_error_vs_delta"] for m in modules.values() if "rel_error_vs_delta" in m]
    if vs:
        summary.update(rel_error_vs_delta_mean=round(sum(vs) / len(vs), 6), rel_error_vs_delta_max=max(vs))
        ratios = [m["norm_ratio_vs_delta"] for m in modules.values()]
        summary.update(norm_ratio_vs_delta_mean=round(sum(ratios) / len(ratios), 6),
                       norm_ratio_vs_delta_min=min(ratios), norm_ratio_vs_delta_max=max(ratios))
    import peft
    import transformers
    report = {
        "method": method, "space": space,
        "adapters": [str(p) for p in adapter_dirs],
        "params": {"weights": _weights(w, len(adapters), "cpu").tolist(), "density": density,
                   "drop_rate": round(1 - density, 6) if method in ("dare_ties", "della") else None,
                   "epsilon": epsilon if method == "della" else None,
                   "dare_norm": dare_norm if method == "dare_ties" else ("mean" if method == "della" else None),
                   "factor_rescale_power": (factor_rescale_power(method, dare_norm)
                                            if space == "adapter" and method in ("dare_ties", "della") else None),
                   "lam": lam, "rank": rank, "seed": seed,
                   "full": full, "base": str(base) if base is not None else None, "device": str(device)},
        "input": {"ranks": [ad["r"] for ad in adapters], "scalings": [ad["scaling"] for ad in adapters],
                  "base_model_name_or_path": adapters[0]["config"].get("base_model_name_or_path"),
                  "n_modules": len(stems), "dtype": str(adapters[0]["dtype"]).replace("torch.", "")},
        "output": {"dir": str(out_dir), "r": out_rank, "lora_alpha": out_rank,
                   "full_dir": str(full_dir) if full_dir else None},
        "summary": summary,
        "modules": modules,
        "timings_s": {"load_base": round(t_load, 3), "merge": round(t_merge, 3), "save": round(t_save, 3),
                      "total": round(time.time() - t_start, 3)},
        "versions": {"torch": torch.__version__, "peft": peft.__version__, "transformers": transformers.__version__},
    }
    (out_dir / REPORT_FILE).write_text(json.dumps(report, indent=2) + "\n")
    rundir.write_result(out_dir, {k: report[k] for k in ("method", "space", "adapters", "params")},
                        {k: report[k] for k in ("input", "timings_s", "versions")}, {**summary, "r": out_rank})
    rundir.write_done(out_dir, "merge.py", {"adapter": ADAPTER_FILE, "report": REPORT_FILE, "result": "result.json"})
    print(f"merge: wrote {out_dir} (r={out_rank}{', full/' if full_dir else ''}); svd rel error mean "
          f"{summary['svd_rel_error_mean']:.4f} max {summary['svd_rel_error_max']:.4f}; "
          f"{report['timings_s']['total']:.1f} s")
    return report


def rescale_merge(src, out_dir, lam):
    """A merge at another lambda without merging again: every method here is lam x (a merge at lambda 1), and lam
    sits on the B factors alone (both spaces), so SRC's B's are multiplied by lam / SRC's lambda. The product B A
    equals merging at `lam` up to float rounding (tests/test_merge.py). Writes OUT as merge_adapters does, its
    report's params.lam = lam and rescaled_from = SRC. Used by the merge stage for its lambda candidates."""
    src, out_dir = Path(src), Path(out_dir)
    if not math.isfinite(lam):
        raise MergeError(f"lambda {lam} is not a number")
    if out_dir.resolve() == src.resolve():
        raise MergeError(f"--out {out_dir} is the merge being rescaled; give another folder")
    report = json.loads((src / REPORT_FILE).read_text()) if (src / REPORT_FILE).is_file() else None
    if report is None or not (src / ADAPTER_FILE).is_file():
        raise MergeError(f"{src}: not a merge.py output (needs {ADAPTER_FILE} and {REPORT_FILE})")
    if report["params"].get("full"):
        raise MergeError(f"{src}: has a full model folder; rescale merges without --full")
    if not report["params"].get("lam"):
        raise MergeError(f"{src}: merged at lambda 0, which no rescale can undo")
    factor = lam / report["params"]["lam"]
    t0 = time.time()
    with safe_open(str(src / ADAPTER_FILE), framework="pt") as f:   # bf16 B's are rounded a second time here
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    tensors = {k: (t.float() * factor).to(t.dtype) if ".lora_B." in k else t for k, t in tensors.items()}
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out_dir / (ADAPTER_FILE + ".tmp")
    save_file(tensors, str(tmp), metadata={"format": "pt"})
    os.replace(tmp, out_dir / ADAPTER_FILE)
    shutil.copy2(src / CONFIG_FILE, out_dir / CONFIG_FILE)
    report = {**report, "params": {**report["params"], "lam": lam}, "rescaled_from": str(src),
              "output": {**report["output"], "dir": str(out_dir)},
              "timings_s": {"rescale": round(time.time() - t0, 3)}}
    (out_dir / REPORT_FILE).write_text(json.dumps(report, indent=2) + "\n")
    config = {k: report[k] for k in ("method", "space", "adapters", "params")} | {"rescaled_from": str(src)}
    # the outcome merge_adapters writes, from the source's report (B x factor scales the merged delta and its SVD
    # residual alike: the rank and relative errors hold), with the lambda and the factor
    rundir.write_result(out_dir, config, {"timings_s": report["timings_s"]},
                        {**report["summary"], "r": report["output"]["r"], "lam": lam, "factor": factor})
    rundir.write_done(out_dir, "merge.py", {"adapter": ADAPTER_FILE, "report": REPORT_FILE, "result": "result.json"})
    print(f"merge.py: {out_dir} = {src} at lambda {lam:g} (B x {factor:g})")
    return report


def main(argv=None):
    ap = argparse.ArgumentParser(description="Merge LoRA experts of one base into one peft LoRA adapter "
                                             "(soup, ties, dare_ties, della; adapter or delta space).")
    ap.add_argument("--method", choices=list(METHODS), help="required unless --rescale")
    ap.add_argument("--adapters", nargs="+",
                    help="peft adapter folders (same base, same modules); required unless --rescale")
    ap.add_argument("--rescale", metavar="MERGED",
                    help="instead of merging: MERGED (a merge.py output) at lambda --lam, by scaling its B factors")
    ap.add_argument("--out", required=True, help="output folder (adapter + merge_report.json [+ full/])")
    ap.add_argument("--space", default="adapter", choices=SPACES,
                    help="adapter: merge the A's and B's (cheap, cross terms); delta: merge B_i A_i exactly, then SVD")
    ap.add_argument("--weights", type=float, nargs="+", help="relative weight per adapter (default uniform)")
    ap.add_argument("--density", type=float, default=DEFAULT_DENSITY,
                    help="kept fraction for ties/dare_ties/della; DARE's drop rate is 1 - density")
    ap.add_argument("--epsilon", type=float, default=DEFAULT_EPSILON, help="DELLA keep-probability window +-epsilon")
    ap.add_argument("--dare-norm", default=DEFAULT_DARE_NORM, choices=DARE_NORMS,
                    help="dare_ties only: 'sum' = weighted sum of the rescaled sign-agreeing kept entries (mergekit's "
                         "dare_ties default, normalize: false; ~ the soup on experts of one lineage); 'mean' = their "
                         "weighted mean (peft, the DARE reference code, mergekit normalize: true; ~1/density x the "
                         f"soup on such experts). Default {DEFAULT_DARE_NORM}")
    ap.add_argument("--lam", "--lambda", dest="lam", type=float, default=None,
                    help="scale of the merged delta (default 1). DELLA and "
                    "DARE-TIES --dare-norm mean on experts that share a lineage come out ~1/density times the soup "
                    "(rescale + disjoint mean): lam ~ density compensates (results/small_run.md)")
    ap.add_argument("--rank", type=int, help="output rank by truncated SVD of the merged delta "
                                             "(default: r in adapter space; exact soup / sum r_i in delta space)")
    ap.add_argument("--full", action="store_true", help="also write W0 + delta as an HF model folder OUT/full")
    ap.add_argument("--base", help="base model folder (HF) for --full")
    ap.add_argument("--seed", type=int, default=0, help="seed of the dare_ties/della random drops")
    ap.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ...")
    ap.add_argument("--compare-delta", action="store_true",
                    help="adapter space: also report each module's distance to the delta-space merge")
    args = ap.parse_args(argv)
    if args.rescale:
        given = [flag for flag, v in (("--method", args.method), ("--adapters", args.adapters), ("--rank", args.rank),
                                      ("--full", args.full), ("--weights", args.weights)) if v]
        if given or args.lam is None:
            ap.error("--rescale takes only --lam (required) and --out" + (f", not {' '.join(given)}" if given else ""))
        try:
            rescale_merge(args.rescale, args.out, args.lam)
        except MergeError as e:
            sys.exit(f"merge.py: error: {e}")
        return
    if not args.method or not args.adapters:
        ap.error("--method and --adapters are required (unless --rescale)")
    try:
        merge_adapters(args.adapters, args.out, args.method, space=args.space, weights=args.weights,
                       density=args.density, epsilon=args.epsilon, lam=1.0 if args.lam is None else args.lam,
                       rank=args.rank, full=args.full,
                       base=args.base, seed=args.seed, device=args.device, compare_delta=args.compare_delta,
                       dare_norm=args.dare_norm)
    except MergeError as e:
        sys.exit(f"merge.py: error: {e}")


if __name__ == "__main__":
    main()
