"""Decode-step attention variants on one GPU: which kernel reads a batch's KV cache fastest.

Run (CUDA only):  python bench/decode_attention.py --out results/generate_s4/decode_attention.json

One query token per sequence against a left-padded bf16 KV cache slice [B, kv_heads, Lb, d] (a view of a
cache allocated at the largest Lb, as in fastgen._decode_step; at that largest Lb the view is the whole,
contiguous cache), masked by an additive bias [B, 1, 1, Lb]. The printed floor assumes the card's spec
bandwidth (--bandwidth-tb-s); a real copy reaches less, so the floor is optimistic. Each variant is
CUDA-graph captured and replayed; the time is the mean of 50 replays. Variants:
- math_old: two batched matmuls with fp32 softmax in between (the fast decoder up to commit ea1538f)
- <backend> grouped-rows: SDPA, the g query heads sharing a KV head passed as g query rows
- <backend> gqa q1: SDPA with one query row per head and enable_gqa=True (what fastgen.py uses now)
- FLASH ... NOMASK: no mask at all (not usable for padded batches; a speed reference only)
- math 2 gemm only-core: math_old without the scale multiply (scale folded into q beforehand)
The default shape is SmolLM2-135M's (3 KV heads, 3 query heads each, head dim 64) at batch 256.
"""
import argparse
import json
import os
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from decode_two_part import timed  # noqa: E402  (graph capture + replay timing, shared with that bench)


def bench(res, name, fn, n=50):
    """Capture fn in a CUDA graph, replay it n times; res[name] = microseconds per replay (or the error)."""
    try:
        us, out = timed(fn, torch.device("cuda"), n)
        res[name] = round(us, 1)
        print(f"{name:40s} {us:8.1f} us", flush=True)
        return out
    except Exception as e:  # a backend that cannot run this case: record why, go on
        res[name] = str(e)[:200]
        print(f"{name:40s} FAIL {str(e)[:150]}", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--kv-heads", type=int, default=3)
    ap.add_argument("--group", type=int, default=3, help="query heads per KV head")
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--lens", default="768,1024", help="attended cache lengths Lb (cache allocated at the largest)")
    ap.add_argument("--bandwidth-tb-s", type=float, default=4.8, help="for the printed floor (H200: 4.8)")
    ap.add_argument("--out", default="results/decode_attention.json")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("decode_attention.py: needs a CUDA GPU")
    torch.manual_seed(0)
    dev, dt = "cuda", torch.bfloat16
    B, hkv, g, d = args.batch, args.kv_heads, args.group, args.head_dim
    lens = [int(x) for x in args.lens.split(",")]
    scale = d ** -0.5
    K = torch.randn(B, hkv, max(lens), d, device=dev, dtype=dt)
    V = torch.randn_like(K)
    q = torch.randn(B, hkv, g, d, device=dev, dtype=dt)
    res = {}
    for Lb in lens:
        valid = torch.ones(B, Lb, dtype=torch.bool, device=dev)
        valid[:, :40] = False                              # left padding
        valid[:, Lb - 100:] = False                        # columns not written yet
        bias = torch.zeros(B, 1, 1, Lb, dtype=dt, device=dev).masked_fill(~valid[:, None, None], float("-inf"))
        biasf = bias.float()
        k, v = K[:, :, :Lb], V[:, :, :Lb]
        gb = B * hkv * Lb * d * 2 * 2 / 1e9
        print(f"Lb {Lb}: K+V {gb * 1e3:.0f} MB per layer -> {gb / args.bandwidth_tb_s * 1e3:.1f} us at "
              f"{args.bandwidth_tb_s} TB/s")

        def math_old():
            s_ = torch.matmul(q * scale, k.transpose(-1, -2))
            return torch.matmul((s_.float() + biasf).softmax(-1).to(dt), v)
        ref = bench(res, f"math_old Lb{Lb}", math_old)

        for be in (SDPBackend.CUDNN_ATTENTION, SDPBackend.EFFICIENT_ATTENTION):
            def grouped(be=be):
                with sdpa_kernel([be]):
                    return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=scale)
            out = bench(res, f"{be.name} grouped-rows Lb{Lb}", grouped)
            if out is not None and ref is not None:
                print("   max |diff| vs math_old", (out.float() - ref.float()).abs().max().item())
        qh = q.reshape(B, hkv * g, 1, d)
        for be in (SDPBackend.CUDNN_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.FLASH_ATTENTION):
            nomask = be == SDPBackend.FLASH_ATTENTION

            def gqa(be=be, nomask=nomask):
                with sdpa_kernel([be]):
                    return F.scaled_dot_product_attention(qh, k, v, attn_mask=None if nomask else bias,
                                                          scale=scale, enable_gqa=True)
            out = bench(res, f"{be.name} gqa q1 Lb{Lb}" + (" NOMASK" if nomask else ""), gqa)
            if out is not None and ref is not None and not nomask:
                print("   max |diff| vs math_old", (out.float().view_as(ref) - ref.float()).abs().max().item())

        def flash_rows():
            with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
                return F.scaled_dot_product_attention(q, k, v, scale=scale)
        bench(res, f"FLASH grouped-rows NOMASK Lb{Lb}", flash_rows)
        kc, vc = k.contiguous(), v.contiguous()

        def eff_contig():
            with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION]):
                return F.scaled_dot_product_attention(q, kc, vc, attn_mask=bias, scale=scale)
        bench(res, f"EFFICIENT grouped-rows contig Lb{Lb}", eff_contig)
        qs = q * scale

        def math_core():
            s_ = torch.matmul(qs, k.transpose(-1, -2)).float() + biasf
            return torch.matmul(s_.softmax(-1).to(dt), v)
        bench(res, f"math 2 gemm only-core Lb{Lb}", math_core)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"shape": {"batch": B, "kv_heads": hkv, "group": g, "head_dim": d, "lens": lens},
                   "us_per_call": res, "gpu": torch.cuda.get_device_name(), "torch": torch.__version__}, f, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
