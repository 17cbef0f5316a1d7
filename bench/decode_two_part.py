"""Decode attention of one layer, today's layout vs the shared-prefix two-part form (fastgen section 3).

Run (GPU):  python bench/decode_two_part.py --out results/decode_two_part.json
     (CPU smoke, eager, small): python bench/decode_two_part.py --device cpu --groups 2 --prefix 100,300 \
                                --suffix 1,40 --out out/decode_two_part.json

B = groups x G rows (default 64 x 4 = 256: RL's G answers per prompt), SmolLM2-135M's attention (3 KV heads,
9 query heads, head dim 64), bf16 on CUDA. Each group has its own prompt length, spread over
[0.75 P, P] (P = --prefix), and every row has S (= --suffix) new tokens. Variants, each CUDA-graph captured and
replayed (the mean of --iters replays; on CPU eager calls):
- today gqa: fastgen._gqa_attention (cuDNN, enable_gqa) over every row's own left-padded cache of
  bucket(P + S) columns with an additive mask: what _decode_step runs now
- today math: the portable form (two matmuls, fp32 softmax) over the same cache
- two-part torch: two_part.attention_torch (prefix once per group + own suffix, lse merge)
- two-part triton: two_part.attention_triton (CUDA with Triton only)
Every variant's output is compared with today's math form (max |diff| in the JSON). Writes microseconds per
call and the K/V bytes in the widths each layout attends (bucketed; the Triton kernels read only written columns).
"""
import argparse
import json
import math
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import fastgen  # noqa: E402
import two_part  # noqa: E402


def timed(fn, device, iters):
    """Microseconds per call: CUDA-graph captured and replayed on CUDA, eager calls on CPU. -> (us, out)."""
    out = fn()
    if device.type != "cuda":
        t = time.perf_counter()
        for _ in range(iters):
            fn()
        return (time.perf_counter() - t) / iters * 1e6, out
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    for _ in range(5):
        graph.replay()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(iters):
        graph.replay()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / iters * 1e6, out


def case(args, device, dt, P, S, res):
    U, G, hkv, hq, d = args.groups, args.group_size, args.kv_heads, args.q_heads, args.head_dim
    B, scale, g = U * G, d ** -0.5, hq // hkv
    gen = torch.Generator(device=device).manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=gen, device=device).to(dt)          # noqa: E731
    plens = [max(1, P - (P // 4) * u // max(1, U - 1)) for u in range(U)]         # P down to 0.75 P
    Pb = fastgen.BUCKET * math.ceil(P / fastgen.BUCKET)
    Sb = max(1, fastgen.BUCKET * math.ceil(S / fastgen.BUCKET))
    pk, pv = r(U, hkv, Pb, d), r(U, hkv, Pb, d)
    sk, sv = r(B, hkv, Sb, d), r(B, hkv, Sb, d)
    q = r(B, hq, d)
    plen = torch.tensor(plens, device=device)
    rowof = torch.arange(B, device=device).view(U, G)                                # rows group by group
    midx = torch.arange(B, device=device)
    col = torch.tensor([S - 1], device=device)                                       # suffix columns 0..S-1
    # today's layout: each row's own cache, its prompt right-aligned at column P (left padding), then S tokens
    Lb = fastgen.BUCKET * math.ceil((P + S) / fastgen.BUCKET)
    K, V = torch.zeros(B, hkv, Lb, d, dtype=dt, device=device), torch.zeros(B, hkv, Lb, d, dtype=dt, device=device)
    valid = torch.zeros(B, Lb, dtype=torch.bool, device=device)
    for b in range(B):
        u, n = b // G, plens[b // G]
        K[b, :, P - n:P], V[b, :, P - n:P] = pk[u, :, :n], pv[u, :, :n]
        K[b, :, P:P + S], V[b, :, P:P + S] = sk[b, :, :S], sv[b, :, :S]
        valid[b, P - n:P + S] = True
    bias = torch.zeros(B, 1, 1, Lb, dtype=dt, device=device).masked_fill(~valid[:, None, None], float("-inf"))
    biasf = bias.float()
    el = torch.finfo(dt).bits // 8
    tag = f"P{P} S{S}"
    res["bytes_read"][tag] = {"today": 2 * B * hkv * Lb * d * el,
                              "two_part": 2 * (U * hkv * Pb + B * hkv * Sb) * d * el}

    def today_math():
        qg = q.view(B, hkv, g, d) * scale
        p = (torch.matmul(qg, K.transpose(-1, -2)).float() + biasf).softmax(-1).to(dt)
        return torch.matmul(p, V).view(B, hq, d)

    def today_gqa():
        return fastgen._gqa_attention(q[:, :, None], K, V, bias, scale).view(B, hq, d)

    def bound(fn):
        return lambda: fn(q, pk, pv, plen, rowof, midx, sk, sv, col, scale)
    variants = [("today math", today_math), ("today gqa", today_gqa),
                ("two-part torch", bound(two_part.attention_torch))]
    if device.type == "cuda" and two_part.triton is not None:
        variants.append(("two-part triton", bound(two_part.attention_triton)))
    ref = None
    for name, fn in variants:
        key = f"{name} {tag}"
        try:
            us, out = timed(fn, device, args.iters)
        except Exception as e:           # a kernel that cannot run this case: record why, go on
            res["us_per_call"][key] = str(e)[:200]
            print(f"{key:36s} FAIL {str(e)[:150]}", flush=True)
            continue
        ref = out.float() if ref is None else ref
        res["us_per_call"][key] = round(us, 1)
        res["max_abs_diff_vs_math"][key] = (out.float() - ref).abs().max().item()
        print(f"{key:36s} {us:9.1f} us   max |diff| vs today math {res['max_abs_diff_vs_math'][key]:.2e}", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--groups", type=int, default=64)
    ap.add_argument("--group-size", type=int, default=4, help="rows per prompt (G)")
    ap.add_argument("--kv-heads", type=int, default=3)
    ap.add_argument("--q-heads", type=int, default=9)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--prefix", default="1700,4500,7000", help="longest prompt per case (groups: 0.75-1x)")
    ap.add_argument("--suffix", default="256,1024", help="new tokens per row")
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--out", default="results/decode_two_part.json")
    args = ap.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("decode_two_part.py: no CUDA GPU here (use --device cpu for a smoke run)")
    dt = torch.bfloat16 if device.type == "cuda" else torch.float32
    res = {"us_per_call": {}, "max_abs_diff_vs_math": {}, "bytes_read": {}}
    with torch.no_grad():
        for P in [int(x) for x in args.prefix.split(",")]:
            for S in [int(x) for x in args.suffix.split(",")]:
                case(args, device, dt, P, S, res)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"shape": {"groups": args.groups, "group_size": args.group_size, "kv_heads": args.kv_heads,
                             "q_heads": args.q_heads, "head_dim": args.head_dim, "dtype": str(dt)},
                   "prefix_chunk": two_part.PREFIX_CHUNK, **res,
                   "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
                   "torch": torch.__version__, "triton": getattr(two_part.triton, "__version__", None),
                   "command": "python " + " ".join(sys.argv)}, f, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
