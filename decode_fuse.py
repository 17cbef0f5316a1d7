"""Two of fastgen.py's small decode kernels fused: rotary with the K/V cache writes, and SiLU times up.

A decode step of a small model is bound by kernel launches, not arithmetic: for SmolLM2-135M each of its 30
layers launches about 15 kernels on a few hundred rows. Two stretches of them are elementwise and fuse:
  rope_write: from the qkv projection [N, (hq + 2 hkv) d], rotate the q and k heads (fastgen._rope: x cos +
    roll(x, d/2) sin_signed), return q [N, hq, d] and write k and v into the layer's caches [B, hkv, L, d] at
    column col. The torch form is five kernels (the rotary's three, two index_copy_); the Triton kernel is one.
    col is a 1-element device tensor read inside the kernel (decode runs under CUDA-graph capture: no host sync).
  silu_mul: from the gate/up projection [N, 2 I] (gate first), silu(gate) * up [N, I]: two kernels, or one.
The Triton kernels round where torch's CUDA kernels do (the aim is the same bits; the probe checks agreement
within probe.py's tolerance): x cos is rounded to the input's dtype, then one fused multiply-add (torch's addcmul
with value 1 is one fma) adds roll(x) sin_signed and rounds; silu is x / (1 + exp(-x)) in fp32 with CUDA's expf and
an IEEE division (torch's SiLU kernel), rounded, then times up, rounded.

kernel_works probes both once per device, dtype and head shape against the torch forms (probe.py); fastgen uses
the kernels in decode steps where its FUSED_SMALL switch is on and the probe passes (CUDA with Triton), and its own
torch code everywhere else (rope_write_torch and silu_mul_torch are that code, here for the probe and the tests).
Layers with qwen3's per-head q/k norm keep the torch path (the norm sits between the projection and the rotary).
Of the project's files it imports only probe.py.
"""
import torch
import torch.nn.functional as F

import probe


def rope_write_torch(qkv, cos, sin, kc, vc, col):
    """fastgen's decode form: qkv [N, (hq + 2 hkv) d] (q heads, k heads, v heads), cos / sin (sin_signed) [N, 1, d];
    k rotated and v written into kc / vc [N, hkv, L, d] at column col ([1] int64, on the device). -> q [N, hq, d]
    rotated."""
    hkv, d = kc.shape[1], kc.shape[3]
    hq = qkv.shape[1] // d - 2 * hkv
    qk = qkv[:, :(hq + hkv) * d].view(-1, hq + hkv, d)
    qk = torch.addcmul(qk * cos, qk.roll(d // 2, -1), sin)
    kc.index_copy_(2, col, qk[:, hq:, None])
    vc.index_copy_(2, col, qkv[:, (hq + hkv) * d:].view(-1, hkv, 1, d))
    return qk[:, :hq]


def silu_mul_torch(gu):
    """fastgen's MLP activation: gu [N, 2 I] (gate, then up) -> silu(gate) * up [N, I]."""
    g, u = gu.chunk(2, dim=-1)
    return F.silu(g) * u


try:       # without Triton (CPU machines) only the torch forms exist
    import triton
    import triton.language as tl
except ImportError:
    triton = None

if triton is not None:
    try:   # CUDA's own expf (torch's SiLU kernel calls it); Triton's tl.exp is an approximation of it
        from triton.language.extra import libdevice
    except ImportError:
        libdevice = None

    @triton.jit
    def _rope_write_kernel(QKV, COS, SIN, COL, Q, KC, VC, sx, sc, ss, sq_n, sq_h, sk_b, sk_h, sk_l, sv_b, sv_h,
                           sv_l, HQ: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr, BH: tl.constexpr,
                           DP: tl.constexpr):
        """One program per (row r, block of BH of its HQ + 2 HKV heads): q and k heads rotated (x cos rounded to
        the dtype, then one fma adds roll(x, D/2) sin_signed), q stored to Q, k and v into the caches at column
        COL[0]."""
        r = tl.program_id(0).to(tl.int64)
        h = tl.program_id(1) * BH + tl.arange(0, BH)
        j = tl.arange(0, DP)
        jok = j < D
        ok = (h < HQ + 2 * HKV)[:, None] & jok[None, :]
        src = QKV + r * sx + h[:, None] * D
        x = tl.load(src + j[None, :], mask=ok, other=0.0)
        pj = tl.where(j < D // 2, j + D // 2, j - D // 2)             # roll(x, D/2)[j] = x[(j - D/2) mod D]
        xr = tl.load(src + pj[None, :], mask=ok, other=0.0).to(tl.float32)
        c = tl.load(COS + r * sc + j, mask=jok, other=0.0).to(tl.float32)
        s = tl.load(SIN + r * ss + j, mask=jok, other=0.0).to(tl.float32)
        a = (x.to(tl.float32) * c[None, :]).to(x.dtype).to(tl.float32)
        y = tl.where((h < HQ + HKV)[:, None], tl.math.fma(xr, s[None, :], a).to(x.dtype), x)
        col = tl.load(COL)
        isq, isk, isv = h < HQ, (h >= HQ) & (h < HQ + HKV), h >= HQ + HKV
        hk, hv = tl.where(isk, h - HQ, 0), tl.where(isv, h - HQ - HKV, 0)
        tl.store(Q + r * sq_n + h[:, None] * sq_h + j[None, :], y, mask=ok & isq[:, None])
        tl.store(KC + r * sk_b + hk[:, None] * sk_h + col * sk_l + j[None, :], y, mask=ok & isk[:, None])
        tl.store(VC + r * sv_b + hv[:, None] * sv_h + col * sv_l + j[None, :], y, mask=ok & isv[:, None])

    @triton.jit
    def _silu_mul_kernel(GU, OUT, I, sg, so, BLOCK: tl.constexpr, PRECISE: tl.constexpr):
        """One program per (row, block of BLOCK columns): silu(gate) in fp32, rounded to the dtype, times up,
        rounded. PRECISE: CUDA's expf (libdevice), as torch's kernel; else tl.exp (the interpreter has no
        libdevice)."""
        r = tl.program_id(0).to(tl.int64)
        c = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        ok = c < I
        g = tl.load(GU + r * sg + c, mask=ok, other=0.0)
        u = tl.load(GU + r * sg + I + c, mask=ok, other=0.0).to(tl.float32)
        gf = g.to(tl.float32)
        if PRECISE:
            e = libdevice.exp(-gf)
        else:
            e = tl.exp(-gf)
        s = tl.math.div_rn(gf, 1.0 + e).to(g.dtype).to(tl.float32)
        tl.store(OUT + r * so + c, (s * u).to(g.dtype), mask=ok)


def rope_write_triton(qkv, cos, sin, kc, vc, col):
    """rope_write_torch's contract in one Triton kernel (q comes back contiguous). Every tensor's last dimension
    contiguous; col int64. Fixed shapes, no host sync: CUDA-graph capturable."""
    N, hkv, d = qkv.shape[0], kc.shape[1], kc.shape[3]
    hq = qkv.shape[1] // d - 2 * hkv
    q = torch.empty(N, hq, d, dtype=qkv.dtype, device=qkv.device)
    DP = triton.next_power_of_2(d)
    BH = min(triton.next_power_of_2(hq + 2 * hkv), max(1, 1024 // DP))
    _rope_write_kernel[(N, triton.cdiv(hq + 2 * hkv, BH))](
        qkv, cos, sin, col, q, kc, vc, qkv.stride(0), cos.stride(0), sin.stride(0), q.stride(0), q.stride(1),
        kc.stride(0), kc.stride(1), kc.stride(2), vc.stride(0), vc.stride(1), vc.stride(2), HQ=hq, HKV=hkv, D=d,
        BH=BH, DP=DP)
    return q


def silu_mul_triton(gu):
    """silu_mul_torch's contract in one Triton kernel. gu's last dimension contiguous."""
    N, I = gu.shape[0], gu.shape[1] // 2
    out = torch.empty(N, I, dtype=gu.dtype, device=gu.device)
    BLOCK = min(512, triton.next_power_of_2(I))
    _silu_mul_kernel[(N, triton.cdiv(I, BLOCK))](gu, out, I, gu.stride(0), out.stride(0), BLOCK=BLOCK,
                                                 PRECISE=libdevice is not None and gu.is_cuda)
    return out


_KERNEL_OK = {}     # (device, dtype, hq, hkv, d) -> whether both kernels run and agree with their torch forms


def kernel_works(device, dtype, hq, hkv, d):
    """Whether rope_write_triton and silu_mul_triton run here and match the torch forms on a random case of
    decode's shapes (37 rows, the write at a middle column of 300; 1000 MLP columns, so the last block is
    partial). Cached."""
    key = (str(device), dtype, hq, hkv, d)
    if key not in _KERNEL_OK:
        ok = False
        if triton is not None and torch.device(device).type == "cuda" and d % 2 == 0:
            N, L = 37, 300

            def randn(seed):
                gen = torch.Generator(device=device).manual_seed(seed)
                return lambda *s: torch.randn(*s, generator=gen, device=device).to(dtype)

            def rope():
                r = randn(0)
                qkv, cos, sin = r(N, (hq + 2 * hkv) * d), r(N, 1, d), r(N, 1, d)
                kc, vc = r(N, hkv, L, d), r(N, hkv, L, d)
                col = torch.tensor([L // 2 + 1], device=device)

                def run(f):
                    k, v = kc.clone(), vc.clone()
                    return torch.cat([f(qkv, cos, sin, k, v, col).flatten(), k.flatten(), v.flatten()])
                return run(rope_write_triton), run(rope_write_torch)

            def silu():
                gu = randn(1)(N, 2000)
                return silu_mul_triton(gu), silu_mul_torch(gu)
            ok = probe.agrees("rotary/K-V write kernel", rope, dtype) and probe.agrees("SiLU-mul kernel", silu, dtype)
        _KERNEL_OK[key] = ok
    return _KERNEL_OK[key]
