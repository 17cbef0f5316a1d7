"""Shared-prefix decode attention for fastgen.py: a group's prompt K/V read once, each row's new tokens apart,
the two parts merged by their log-sum-exp. The torch form runs anywhere (the CPU tests check it against plain
attention); on CUDA two Triton kernels do the same where a probe agrees with the torch form (kernel_works).
fastgen.py's shared-prefix layout (its section 4) is the only caller; of the project's files it imports only probe.py.
"""
import torch

import probe

# The layout (fastgen.SHARED_PREFIX, fastgen's section 4). RL samples G answers per prompt; in today's layout
# every row reads its own copy of the prompt's K/V, and decode is bound by those reads. In the shared-prefix
# layout a group's prompt K/V is stored once (prefix buffers [U groups, hkv, Pb, d], left-aligned, plen [U]
# columns real) and each row's new tokens in a suffix of its own ([B, hkv, Sb, d], columns 0..col real).
# Attention over [prefix | suffix] runs in two parts merged by their log-sum-exp (FlashInfer's cascade):
# part A reads each group's prefix once for all its rows (the G rows x g query heads that share a KV head
# are one block of query rows), part B reads each row's suffix; out = (e^(lseA-M) oA + e^(lseB-M) oB) /
# (e^(lseA-M) + e^(lseB-M)), M = max(lseA, lseB), all in fp32. Groups are described by index buffers, so
# rows may leave (compaction) without touching the prefix: rowof [U, GM] = the slot row of member j of group
# u (a place whose row has left points at row 0: computed, never read), midx [B] = u GM + j of each row.
# The torch form runs anywhere (two matmuls per part, as the portable decode form); on CUDA two Triton
# kernels do the same where a probe passes (kernel_works). A single fused cuDNN call over one
# cache row per group with a per-row bias was measured slower than today's layout (fastgen's section 4 note).

def attend_lse(q, k, v, ok, scale):
    """Softmax attention with its log-sum-exp: q [.., n, d], k/v [.., L, d], ok broadcastable to [.., n, L]
    (True = attend). -> (out [.., n, d] fp32, lse [.., n] fp32); a query row with no column gets out 0 and
    lse -inf (so the merge weighs it 0). Scores and softmax in fp32, matmuls in q's dtype (as fastgen._decode_step's
    portable form)."""
    s = torch.matmul(q * scale, k.transpose(-1, -2)).float().masked_fill(~ok, float("-inf"))
    mx = s.amax(-1, keepdim=True)
    mx = torch.where(torch.isfinite(mx), mx, torch.zeros_like(mx))        # no column: avoid -inf - -inf
    p = (s - mx).exp()
    l = p.sum(-1, keepdim=True)
    o = torch.matmul(p.to(v.dtype), v).float() / l.clamp(min=1e-30)
    return o, (mx + l.log()).squeeze(-1)


def attention_torch(q, pk, pv, plen, rowof, midx, sk, sv, col, scale):
    """Decode attention over [group prefix | row suffix], the torch form. q [B, hq, d] (one token per row);
    pk/pv [U, hkv, Pb, d] with plen [U] real columns each; rowof [U, GM], midx [B] (the section's note);
    sk/sv [B, hkv, Sb, d] with columns 0..col real (col [1]; -1: no suffix). -> [B, hq, d] in q's dtype.
    Fixed shapes, no host sync: CUDA-graph capturable."""
    B, hq, d = q.shape
    U, hkv, Pb, _ = pk.shape
    GM, g = rowof.shape[1], hq // hkv
    qa = q[rowof.view(-1)].view(U, GM, hkv, g, d).transpose(1, 2).reshape(U, hkv, GM * g, d)
    okA = (torch.arange(Pb, device=q.device) < plen[:, None])[:, None, None]           # [U, 1, 1, Pb]
    oA, lseA = attend_lse(qa, pk, pv, okA, scale)                                      # part A: per group
    oA = oA.view(U, hkv, GM, g, d).transpose(1, 2).reshape(U * GM, hq, d)[midx]         # -> [B, hq, d]
    lseA = lseA.view(U, hkv, GM, g).transpose(1, 2).reshape(U * GM, hq)[midx]
    okB = torch.arange(sk.shape[2], device=q.device) <= col                             # [Sb]
    oB, lseB = attend_lse(q.view(B, hkv, g, d), sk, sv, okB, scale)                   # part B: per row
    oB, lseB = oB.view(B, hq, d), lseB.view(B, hq)
    mx = torch.maximum(lseA, lseB)
    wA, wB = (lseA - mx).exp()[..., None], (lseB - mx).exp()[..., None]
    return ((wA * oA + wB * oB) / (wA + wB)).to(q.dtype)


try:       # the CUDA kernels of the two-part attention; without Triton (CPU machines) the torch form runs
    import triton
    import triton.language as tl
except ImportError:
    triton = None

PREFIX_CHUNK = 256    # prefix columns per program of the Triton prefix kernel (split-K; more programs on short P)

if triton is not None:
    @triton.jit
    def _prefix_part_kernel(Q, K, V, PLEN, ROWOF, PO, PLSE, scale, sq_b, sq_h, sk_u, sk_h, sk_n,
                            sv_u, sv_h, sv_n, GM, NS, G: tl.constexpr, D: tl.constexpr, BM: tl.constexpr,
                            CHUNK: tl.constexpr, BN: tl.constexpr, IEEE: tl.constexpr):
        """Part A, one program per (prefix chunk s, group u, KV head h): the group's GM x G query rows of
        head h against columns [s CHUNK, min((s+1) CHUNK, plen[u])) of its prefix, read once. Writes the
        chunk's normalized out PO [U, hkv, NS, BM, D] and lse PLSE [U, hkv, NS, BM] (-inf: no column)."""
        s, u, h = tl.program_id(0), tl.program_id(1).to(tl.int64), tl.program_id(2).to(tl.int64)
        hkv = tl.num_programs(2)
        i = tl.arange(0, BM)                    # query row i: member i // G, query head h G + i % G
        row_ok = i < GM * G
        row = tl.load(ROWOF + u * GM + i // G, mask=row_ok, other=0)
        d = tl.arange(0, D)
        q = tl.load(Q + row[:, None] * sq_b + (h * G + i % G)[:, None] * sq_h + d[None, :],
                    mask=row_ok[:, None], other=0.0)
        hi = tl.minimum(s * CHUNK + CHUNK, tl.load(PLEN + u))
        m = tl.full([BM], -1e30, tl.float32)
        l = tl.zeros([BM], tl.float32)
        acc = tl.zeros([BM, D], tl.float32)
        kb, vb = K + u * sk_u + h * sk_h, V + u * sv_u + h * sv_h
        for n0 in range(s * CHUNK, hi, BN):
            n = n0 + tl.arange(0, BN)
            ok = n < hi
            k = tl.load(kb + n[:, None] * sk_n + d[None, :], mask=ok[:, None], other=0.0)
            if IEEE:
                sc = tl.dot(q, tl.trans(k), input_precision="ieee") * scale
            else:
                sc = tl.dot(q, tl.trans(k)) * scale
            sc = tl.where(ok[None, :], sc, float("-inf"))
            m_new = tl.maximum(m, tl.max(sc, 1))
            alpha = tl.exp(m - m_new)
            p = tl.exp(sc - m_new[:, None])
            l = l * alpha + tl.sum(p, 1)
            v = tl.load(vb + n[:, None] * sv_n + d[None, :], mask=ok[:, None], other=0.0)
            if IEEE:
                acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")
            else:
                acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
            m = m_new
        out = acc / tl.maximum(l, 1e-30)[:, None]
        lse = tl.where(l > 0, m + tl.log(tl.maximum(l, 1e-30)), float("-inf"))
        at = ((u * hkv + h) * NS + s) * BM + i
        tl.store(PO + at[:, None] * D + d[None, :], out)
        tl.store(PLSE + at, lse)

    @triton.jit
    def _suffix_merge_kernel(Q, K, V, COL, MIDX, PO, PLSE, OUT, scale, sq_b, sq_h, sk_b, sk_h, sk_n,
                             sv_b, sv_h, sv_n, so_b, so_h, GM, NS, G: tl.constexpr, D: tl.constexpr,
                             BQ: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, IEEE: tl.constexpr):
        """Part B and the merge, one program per (row b, KV head h): the row's G query heads of h against
        its suffix columns 0..col, then merged with its member's NS prefix chunks (PO, PLSE) by their lse.
        Writes OUT [B, hq, D] in OUT's dtype."""
        b, h = tl.program_id(0).to(tl.int64), tl.program_id(1).to(tl.int64)
        hkv = tl.num_programs(1)
        i = tl.arange(0, BQ)                    # query head h G + i
        ok_i = i < G
        d = tl.arange(0, D)
        q = tl.load(Q + b * sq_b + (h * G + i)[:, None] * sq_h + d[None, :], mask=ok_i[:, None], other=0.0)
        hi = tl.load(COL) + 1
        m = tl.full([BQ], -1e30, tl.float32)
        l = tl.zeros([BQ], tl.float32)
        acc = tl.zeros([BQ, D], tl.float32)
        kb, vb = K + b * sk_b + h * sk_h, V + b * sv_b + h * sv_h
        for n0 in range(0, hi, BN):
            n = n0 + tl.arange(0, BN)
            ok = n < hi
            k = tl.load(kb + n[:, None] * sk_n + d[None, :], mask=ok[:, None], other=0.0)
            if IEEE:
                sc = tl.dot(q, tl.trans(k), input_precision="ieee") * scale
            else:
                sc = tl.dot(q, tl.trans(k)) * scale
            sc = tl.where(ok[None, :], sc, float("-inf"))
            m_new = tl.maximum(m, tl.max(sc, 1))
            alpha = tl.exp(m - m_new)
            p = tl.exp(sc - m_new[:, None])
            l = l * alpha + tl.sum(p, 1)
            v = tl.load(vb + n[:, None] * sv_n + d[None, :], mask=ok[:, None], other=0.0)
            if IEEE:
                acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")
            else:
                acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
            m = m_new
        mi = tl.load(MIDX + b)
        u, j = mi // GM, mi % GM
        for s in range(0, NS):                  # the prefix chunks: each an (out, lse) pair to merge
            at = ((u * hkv + h) * NS + s) * BM + j * G + i
            lse = tl.load(PLSE + at, mask=ok_i, other=float("-inf"))
            o = tl.load(PO + at[:, None] * D + d[None, :], mask=ok_i[:, None], other=0.0)
            m_new = tl.maximum(m, lse)
            alpha = tl.exp(m - m_new)
            w = tl.exp(lse - m_new)
            acc = acc * alpha[:, None] + w[:, None] * o
            l = l * alpha + w
            m = m_new
        out = acc / tl.maximum(l, 1e-30)[:, None]
        tl.store(OUT + b * so_b + (h * G + i)[:, None] * so_h + d[None, :], out.to(OUT.dtype.element_ty),
                 mask=ok_i[:, None])


def attention_triton(q, pk, pv, plen, rowof, midx, sk, sv, col, scale):
    """attention_torch's contract on CUDA in two Triton kernels: the prefix part split over
    PREFIX_CHUNK-column chunks (each group's prefix read once), then per row its suffix and the merge of
    all parts. Inputs' last dimension must be contiguous; plen, rowof, midx, col int64."""
    B, hq, d = q.shape
    U, hkv, Pb, _ = pk.shape
    GM, g = rowof.shape[1], hq // hkv
    BM, NS, BN = max(16, triton.next_power_of_2(GM * g)), triton.cdiv(Pb, PREFIX_CHUNK), 64
    po = torch.empty(U, hkv, NS, BM, d, dtype=torch.float32, device=q.device)
    plse = torch.empty(U, hkv, NS, BM, dtype=torch.float32, device=q.device)
    ieee = q.dtype == torch.float32
    _prefix_part_kernel[(NS, U, hkv)](q, pk, pv, plen, rowof, po, plse, scale, q.stride(0), q.stride(1),
                                      pk.stride(0), pk.stride(1), pk.stride(2), pv.stride(0), pv.stride(1),
                                      pv.stride(2), GM, NS, G=g, D=d, BM=BM, CHUNK=PREFIX_CHUNK, BN=BN, IEEE=ieee)
    out = torch.empty(B, hq, d, dtype=q.dtype, device=q.device)
    _suffix_merge_kernel[(B, hkv)](q, sk, sv, col, midx, po, plse, out, scale, q.stride(0), q.stride(1),
                                   sk.stride(0), sk.stride(1), sk.stride(2), sv.stride(0), sv.stride(1),
                                   sv.stride(2), out.stride(0), out.stride(1), GM, NS, G=g, D=d,
                                   BQ=max(16, triton.next_power_of_2(g)), BM=BM, BN=BN, IEEE=ieee)
    return out


_KERNEL_OK = {}     # (device, dtype, hq, hkv, d) -> whether the Triton kernels run and agree with torch


def kernel_works(device, dtype, hq, hkv, d):
    """Whether attention_triton runs here and matches the torch form on a small random case
    (two groups, one prefix longer than a chunk, one short; a suffix over several tiles). Cached."""
    key = (str(device), dtype, hq, hkv, d)
    if key not in _KERNEL_OK:
        ok = False
        if triton is not None and torch.device(device).type == "cuda" and d >= 16 and d & (d - 1) == 0:
            def run():
                gen = torch.Generator(device=device).manual_seed(0)
                r = lambda *s: torch.randn(*s, generator=gen, device=device).to(dtype)   # noqa: E731
                U, B, S = 2, 6, 150                     # two groups of three rows (one row twice)
                q, pk, pv = r(B, hq, d), r(U, hkv, PREFIX_CHUNK + 44, d), r(U, hkv, PREFIX_CHUNK + 44, d)
                sk, sv = r(B, hkv, S, d), r(B, hkv, S, d)
                t = lambda x: torch.tensor(x, device=device)                               # noqa: E731
                args = (q, pk, pv, t([PREFIX_CHUNK + 44, 17]), t([[0, 1, 2], [3, 4, 0]]), t([0, 1, 2, 3, 4, 0]),
                        sk, sv, t([130]), d ** -0.5)
                return attention_triton(*args), attention_torch(*args)
            ok = probe.agrees("two-part attention", run, dtype)
        _KERNEL_OK[key] = ok
    return _KERNEL_OK[key]
