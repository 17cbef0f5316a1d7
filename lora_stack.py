"""The stack rule's LoRA term in one kernel, for fastgen.py's decode step.

In a decoder call whose rows run different adapters (fastgen's stack rule), a linear with the adapters stacked
beside it computes y = x W^T, then adds each row's own LoRA term: h = x la^T holds every adapter's A columns
(la [T*K, in]: adapter t in columns t*K .. t*K+K-1), the columns of the other adapters are zeroed, and lb
[out, T*K] (each adapter's scaled B in its columns) maps h back: y += (h * own) lb^T. The torch form (add_torch)
is three kernels per linear (the A product, the mask, the B product), four linears a layer; at decode shapes
(a few hundred rows) each is a launch of a few microseconds, so for a 135M model the stacked LoRA term costs
about as many kernels as the rest of the layer. add_triton does the same in one Triton kernel per linear:
each program takes a block of rows and a block of output columns, forms the rows' h in fp32 (rounded to the
weights' dtype, as the torch form's product is), keeps each row's own adapter's columns, multiplies by its
block of lb and adds the result to y in place.

kernel_works probes it once per device and dtype against the torch form (probe.py); fastgen uses it where its
FUSED_LORA switch is on and the probe passes (CUDA with Triton), and the torch form everywhere else (the switch is
"auto" by default: results/rl_throughput.md has the measurement). Of the project's files it imports only
probe.py.
"""
import torch

import probe


def add_torch(y, x, la, lb, arow, T):
    """y += ((x la^T) * own) lb^T, own[i, c] = (c // K == arow[i]), K = la.shape[0] // T. x [N, in], y [N, out]
    (updated in place and returned), la [T*K, in], lb [out, T*K], arow [N] int64 (each row's adapter)."""
    N = x.shape[0]
    own = (arow[:, None] == torch.arange(T, device=x.device)).to(x.dtype)             # [N, T]
    h = (torch.nn.functional.linear(x, la).view(N, T, -1) * own[:, :, None]).view(N, -1)
    return y.copy_(torch.addmm(y, h, lb.t()))


try:       # without Triton (CPU machines) only the torch form exists
    import triton
    import triton.language as tl
except ImportError:
    triton = None

if triton is not None:
    @triton.jit
    def _lora_stack_kernel(X, LA, LB, AROW, Y, N, IN, OUT, K, sx, sy, TKP: tl.constexpr, BM: tl.constexpr,
                           BN: tl.constexpr, BK: tl.constexpr, TK: tl.constexpr, IEEE: tl.constexpr):
        """One program per (row block, output block): h = x la^T for its BM rows (all TK columns, fp32, then
        rounded to la's dtype), each row's own adapter's K columns kept, times lb^T's BN columns, added to y."""
        pm, pn = tl.program_id(0), tl.program_id(1)
        rows = pm * BM + tl.arange(0, BM)
        rok = rows < N
        c = tl.arange(0, TKP)
        cok = c < TK
        h = tl.zeros([BM, TKP], tl.float32)
        for k0 in range(0, IN, BK):
            k = k0 + tl.arange(0, BK)
            kok = k < IN
            xb = tl.load(X + rows[:, None].to(tl.int64) * sx + k[None, :], mask=rok[:, None] & kok[None, :], other=0.0)
            ab = tl.load(LA + c[None, :] * IN + k[:, None], mask=cok[None, :] & kok[:, None], other=0.0)  # [BK, TKP]
            if IEEE:
                h += tl.dot(xb, ab, input_precision="ieee")
            else:
                h += tl.dot(xb, ab)
        arow = tl.load(AROW + rows, mask=rok, other=-1)
        own = (c[None, :] // K) == arow[:, None]
        h = tl.where(own & cok[None, :], h, 0.0).to(LA.dtype.element_ty)
        n = pn * BN + tl.arange(0, BN)
        nok = n < OUT
        bb = tl.load(LB + n[None, :] * TK + c[:, None], mask=cok[:, None] & nok[None, :], other=0.0)      # [TKP, BN]
        if IEEE:
            acc = tl.dot(h, bb, input_precision="ieee")
        else:
            acc = tl.dot(h, bb)
        at = Y + rows[:, None].to(tl.int64) * sy + n[None, :]
        ok = rok[:, None] & nok[None, :]
        y = tl.load(at, mask=ok, other=0.0).to(tl.float32)
        tl.store(at, (y + acc).to(Y.dtype.element_ty), mask=ok)


def add_triton(y, x, la, lb, arow, T):
    """add_torch's contract in one Triton kernel. x, y, la, lb: last dimension contiguous (la and lb wholly
    contiguous); arow int64."""
    N, IN = x.shape
    TK, OUT = la.shape[0], y.shape[1]
    TKP = max(16, triton.next_power_of_2(TK))
    BM, BN, BK = 16, 64, 64
    grid = (triton.cdiv(N, BM), triton.cdiv(OUT, BN))
    _lora_stack_kernel[grid](x, la, lb, arow, y, N, IN, OUT, TK // T, x.stride(0), y.stride(0), TKP=TKP, BM=BM,
                             BN=BN, BK=BK, TK=TK, IEEE=x.dtype == torch.float32)
    return y


_KERNEL_OK = {}     # (device, dtype) -> whether add_triton runs and agrees with add_torch


def kernel_works(device, dtype):
    """Whether add_triton runs here and matches add_torch on a random case of decode's shapes (three adapters
    of rank 16 on q, k and v; 37 rows, so the last row block is partial). Cached."""
    key = (str(device), dtype)
    if key not in _KERNEL_OK:
        ok = False
        if triton is not None and torch.device(device).type == "cuda":
            def run():
                gen = torch.Generator(device=device).manual_seed(0)
                r = lambda *s: (torch.randn(*s, generator=gen, device=device) * 0.1).to(dtype)   # noqa: E731
                T, K, N, IN, OUT = 3, 48, 37, 576, 960
                x, la, lb, y = r(N, IN), r(T * K, IN), r(OUT, T * K), r(N, OUT)
                arow = torch.randint(0, T, (N,), generator=gen, device=device)
                return add_triton(y.clone(), x, la, lb, arow, T), add_torch(y.clone(), x, la, lb, arow, T)
            ok = probe.agrees("stacked-LoRA kernel", run, dtype)
        _KERNEL_OK[key] = ok
    return _KERNEL_OK[key]
