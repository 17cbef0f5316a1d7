"""Tokens/s of HF `generate` vs the fast static-cache decoder (common.generate's two paths:
common._generate_hf and fastgen.generate).

Run (GPU):  python bench/bench_generate.py                      # SmolLM2-135M, batches 1/16/64/256
            python bench/bench_generate.py --model Qwen/Qwen3-4B-Instruct-2507 --batches 1,16,64
     (CPU): python bench/bench_generate.py --tiny --batches 1,16 --new-tokens 64
   RL round (GPU): python bench/bench_generate.py --rl-round    # --plain: shared prefill, compaction off
            (CPU): python bench/bench_generate.py --tiny --rl-round --rl-prompts 4 --rl-cap 48 --rl-min 1400 \
                  --rl-max 1800 --rl-extra 128 --rl-calls 2
   Shared-prefix layout (fastgen.SHARED_PREFIX) vs the default, batch 256 = 64 prompts x G 4 of 1.7-6.9k tokens:
            python bench/bench_generate.py --rl-round --rl-prompts 64 --rl-group 4 --rl-batch 256 --rl-min 1700 \
                  --rl-max 6900 --rl-extra 0 --rl-cap 1280 [--shared-prefix] --out results/bench_generate_rl_sp.json

Every row generates exactly --new-tokens per sequence (stop rules off, so both paths do the same work)
from the kit's real prompt shape (system prompt + a small RTL task), with a LoRA adapter (nonzero B)
active, as in RL rollouts. The fast path is timed twice: the first call includes packing and CUDA-graph
capture, the second is steady state. A greedy check reports how many leading tokens the two paths
agree on (bf16 on GPU may diverge after a while on near-ties; fp32 on CPU should agree fully).
Prints a table and writes JSON (--out).

--rl-round mimics the rollouts of one RL step instead: --rl-prompts distinct prompts of mixed lengths
(--rl-min..--rl-max tokens, the kit's prompt with its RTL repeated) x --rl-group repeats each, in one
call with stop lengths drawn per row (most answers end early, a few run to the --rl-cap; see
rl_lengths), then a "round 2" call whose prompts are --rl-extra tokens longer (refinement prompts; the defaults keep
prompt + answer within SmolLM2's 8192 positions). Both calls
are timed --rl-calls times (the first includes packing and graph capture); tokens/s counts the tokens
each row keeps. --plain turns off shared prefill and compaction (the decoder as it was, but with its
slot reuse); --fresh-slot drops the decoder's state before every call (re-pack, re-capture: what a new
batch size or a longer prompt cost before the slot reuse). pack_s is one weight re-pack (done per call). --shared-prefix turns fastgen.SHARED_PREFIX on (each group's prompt
K/V stored once, two-part attention); it applies to both modes (the plain batches repeat one prompt B times).

--teachers N mimics OPD's teacher rollouts of one round instead: N more adapters (random nonzero B, rank
--lora-r) answer --rl-prompts distinct prompts x --rl-group samples each, with RL-like stop lengths, first as
N calls one adapter at a time (as distill.py sampled them before the stack rule), then as one call whose rows run
their own adapters (fastgen's stack rule, what distill.py does now); each timed --rl-calls times; then a greedy
check: each stacked row's leading tokens equal to its one-adapter row's (greedy_agreement).
   OPD teachers (GPU): python bench/bench_generate.py --teachers 3 --rl-prompts 8 --rl-group 1 --rl-cap 1280 \
                  --rl-min 1700 --rl-max 6900 --rl-batch 256 --out results/bench_generate_teachers.json
--fused-lora adds a third timing of the stacked call with its LoRA term as one kernel per linear (lora_stack.py,
fastgen.FUSED_LORA "auto": where the kernel's probe passes), each of the two stacked modes from a fresh decoder
state; the JSON's fused_lora_ran says whether the kernel ran. The joint RL experts' rollouts are such calls
(three adapters, G 4, with the shared-prefix layout on, as fastgen's default is on CUDA):
   python bench/bench_generate.py --teachers 3 --rl-prompts 16 --rl-group 4 --rl-cap 1280 --rl-min 1700 \
                  --rl-max 6900 --rl-batch 256 --shared-prefix --stacked-only --fused-lora \
                  --out results/bench_generate_fused_lora.json
--fused-small (any case) runs decode steps with decode_fuse.py's kernels (rotary + K/V write, SiLU-mul;
fastgen.FUSED_SMALL "auto": where their probe passes); the JSON's fused_small says whether it was asked for,
fused_small_ran whether the kernels ran. A/B: the same command with and without it, on one machine, e.g.
   python bench/bench_generate.py --random-shape smollm2 --batches 64,256 [--fused-small] --out ...
"""
import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import common  # noqa: E402
import fastgen  # noqa: E402
import fastpack  # noqa: E402

TASK = {"id": "bench", "spec_files": [], "instruction":
        "Generate a SystemVerilog testbench. The top module is 'counter', and its instance name should be 'dut'.",
        "rtl_files": [{"name": "counter.v", "content":
                       "module counter #(parameter W = 8) (input clk, input rst_n, input en, input load,\n"
                       "  input [W-1:0] d, output reg [W-1:0] q, output wrap);\n"
                       "  assign wrap = &q;\n  always @(posedge clk or negedge rst_n)\n"
                       "    if (!rst_n) q <= 0;\n    else if (load) q <= d;\n    else if (en) q <= q + 1;\n"
                       "endmodule\n"}]}


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def timed(fn, device):
    sync(device)
    t0 = time.perf_counter()
    out = fn()
    sync(device)
    return out, time.perf_counter() - t0


def add_model_args(ap):
    """--model, --tiny, --quant, --lora-r: what bench_model reads (shared with profile_decode.py)."""
    ap.add_argument("--model", default=None, help="HF id, folder or .gguf (default: embedded SmolLM2 GGUF)")
    ap.add_argument("--tiny", action="store_true", help="use common.tiny_model (CPU smoke run)")
    ap.add_argument("--random-shape", choices=["smollm2"], default=None,
                    help="a random model of SmolLM2-135M's shape (random_like) instead of a model file: no GGUF needed")
    ap.add_argument("--quant", default="auto", help="auto | none | bf16 | fp32 | 4bit")
    ap.add_argument("--lora-r", type=int, default=16, help="LoRA rank of the active adapter (0 = none)")


# SmolLM2-135M-Instruct's public config.json (the dimensions that set a decode step's kernels and their sizes)
SHAPES = {"smollm2": dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                          num_key_value_heads=3, max_position_embeddings=8192, rope_theta=100000.0, rms_norm_eps=1e-5,
                          tie_word_embeddings=True)}


def random_like(shape, seed=0):
    """(model, tok): random weights in a named model's shape (SHAPES) with the kit's tiny tokenizer, bf16 on CUDA
    (fp32 on CPU). The vocabulary is the tokenizer's 1k, not the model's 49k: the output layer and sampling are
    smaller than the real model's, the layers are the same. For timing the decoder where no model file is."""
    from transformers import LlamaConfig, LlamaForCausalLM
    tok = common.tiny_tokenizer(seed)
    cfg = LlamaConfig(vocab_size=len(tok), initializer_range=0.05, bos_token_id=tok.bos_token_id,
                      eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, **SHAPES[shape])
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(cfg)
    if torch.cuda.is_available():
        model = model.to("cuda", torch.bfloat16)
    model.generation_config.pad_token_id = tok.pad_token_id
    model.generation_config.eos_token_id = tok.eos_token_id
    return model.eval(), tok


def bench_model(args):
    """(model, tok, device, prompt ids) from --model/--tiny/--quant, with an active LoRA adapter of rank
    --lora-r whose B is small random (not zero), as in RL rollouts. Shared with profile_decode.py."""
    if args.tiny:
        model, tok = common.tiny_model(0)
    elif getattr(args, "random_shape", None):
        model, tok = random_like(args.random_shape)
    else:
        model, tok = common.load_model(args.model, quant=args.quant)
    if args.lora_r:
        model = common.add_lora(model, r=args.lora_r, alpha=2 * args.lora_r, dropout=0.0)
        g = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for n, p in model.named_parameters():
                if "lora_B" in n:
                    p.copy_((torch.randn(p.shape, generator=g) * 1e-3).to(p.dtype))
    model.eval()
    return model, tok, next(model.parameters()).device, common.chat_ids(tok, common.build_messages(TASK))


def rl_lengths(n, cap, seed=0):
    """n stop lengths like an RL round's: ~10 % degenerate answers that run to the cap, the rest ending
    between 1/8 and 3/4 of it (uniform). Deterministic given seed."""
    g = torch.Generator().manual_seed(seed)
    u = torch.rand(n, generator=g).tolist()
    return [cap if x < 0.1 else max(1, int(cap * (0.125 + 0.625 * (x - 0.1) / 0.9))) for x in u]


def rl_prompts(tok, n, lo, hi, extra=0, seed=0):
    """n distinct chat prompts (ids) of lengths spread over lo..hi tokens (+ extra): the kit's prompt
    with its RTL module repeated under new names until long enough."""
    base = common.chat_ids(tok, common.build_messages(TASK))
    rtl = TASK["rtl_files"][0]["content"]
    per = max(1, len(tok(rtl, add_special_tokens=False)["input_ids"]))
    g = torch.Generator().manual_seed(seed)
    out = []
    for j in range(n):
        target = lo + (hi - lo) * j // max(1, n - 1) + extra
        copies = max(0, (target - len(base)) // per)
        body = "".join(rtl.replace("module counter", f"module counter_{j}_{c}") for c in range(copies + 1))
        task = {**TASK, "rtl_files": [{"name": "counter.v", "content": body}]}
        out.append(common.chat_ids(tok, common.build_messages(task)))
    perm = torch.randperm(n, generator=g).tolist()          # lengths mixed, not sorted
    return [out[i] for i in perm]


def rl_round(args, model, tok, device):
    fastgen.SHARED_PREFIX = args.shared_prefix
    if args.plain:
        fastgen.SHARE_PREFILL = fastgen.COMPACT = False
    G, cap = args.rl_group, args.rl_cap
    kw = dict(max_new_tokens=cap, temperature=args.temperature, top_p=args.top_p, ignore_stop=True,
              batch_size=args.rl_batch)
    calls = []
    for rnd, extra in ((1, 0), (2, args.rl_extra)):
        distinct = rl_prompts(tok, args.rl_prompts, args.rl_min, args.rl_max, extra=extra, seed=rnd)
        prompts = [p for p in distinct for _ in range(G)]
        lens = rl_lengths(len(prompts), cap, seed=rnd)
        for k in range(args.rl_calls):
            if args.fresh_slot:
                fastgen.free_fast_cache(model)
            out, t = timed(lambda: fastgen.generate(model, tok, prompts, seed=k, max_lens=lens, **kw), device)
            kept = sum(len(c.completion_ids) for c in out)
            calls.append({"round": rnd, "call": k, "rows": len(prompts), "prompt_tokens": [len(p) for p in distinct],
                          "new_tokens": kept, "longest": max(lens), "s": round(t, 3), "tok_s": round(kept / t, 1)})
            print({**{k_: v for k_, v in calls[-1].items() if k_ != "prompt_tokens"},
                   "prompt_tokens": f"{min(map(len, distinct))}..{max(map(len, distinct))}"}, flush=True)
    _, pack_s = timed(lambda: fastgen._fast_state(model), device)
    st = fastpack.hf_causal_lm(model).__dict__.get("_chorus_fast") or {}
    slots = {str(R): {"L": s["L"], "graphs": len(s["graphs"]), "carves": [list(k) for k in s.get("carves", {})]}
             for R, s in st.get("slots", {}).items()}
    steady = [c for c in calls if c["call"] > 0] or calls
    print(f"\nRL round: {args.rl_prompts} prompts x G {G}, cap {cap}, plain={args.plain}, "
          f"fresh_slot={args.fresh_slot}, shared_prefix={args.shared_prefix}")
    print(f"{'round':>5} {'call':>4} {'s':>8} {'tok/s':>9} {'tokens':>8}")
    for c in calls:
        print(f"{c['round']:>5} {c['call']:>4} {c['s']:>8.2f} {c['tok_s']:>9.1f} {c['new_tokens']:>8}")
    print(f"steady (calls > 0): {sum(c['new_tokens'] for c in steady) / sum(c['s'] for c in steady):.1f} tok/s, "
          f"{sum(c['s'] for c in steady) / len(steady):.2f} s per call; one weight re-pack {pack_s:.3f} s; "
          f"slot {slots}")
    return {"mode": "rl_round", "rl_prompts": args.rl_prompts, "rl_group": G, "rl_cap": cap,
            "plain": args.plain, "fresh_slot": args.fresh_slot, "rl_batch": args.rl_batch,
            "shared_prefix": args.shared_prefix, "stats": {k: round(v, 3) for k, v in fastgen.STATS.items()},
            "calls": calls, "pack_s": round(pack_s, 4), "slots": slots,
            "steady_tok_s": round(sum(c["new_tokens"] for c in steady) / sum(c["s"] for c in steady), 1),
            "steady_s_per_call": round(sum(c["s"] for c in steady) / len(steady), 3)}


def teachers_round(args, model, tok, device):
    """--teachers N: N calls of one adapter each against one stacked call, on the same rows."""
    names = [f"teacher{i}" for i in range(args.teachers)]
    for i, name in enumerate(names):
        model = common.add_lora(model, r=args.lora_r, alpha=2 * args.lora_r, dropout=0.0, adapter_name=name)
        g = torch.Generator().manual_seed(100 + i)
        with torch.no_grad():
            for n, prm in model.named_parameters():
                if f"lora_B.{name}." in n:
                    prm.copy_((torch.randn(prm.shape, generator=g) * 1e-3).to(prm.dtype))
    model.set_adapter("default")
    model.eval()
    fastgen.SHARED_PREFIX = args.shared_prefix
    distinct = rl_prompts(tok, args.rl_prompts, args.rl_min, args.rl_max, seed=1)
    rows = [p for p in distinct for _ in range(args.rl_group)]
    lens = [rl_lengths(len(rows), args.rl_cap, seed=10 + i) for i in range(len(names))]
    kw = dict(max_new_tokens=args.rl_cap, temperature=args.temperature, top_p=args.top_p, ignore_stop=True,
              batch_size=args.rl_batch)

    def one_at_a_time(k):
        out = []
        for name, ln in zip(names, lens):
            with common.use_adapter(model, name):
                out += fastgen.generate(model, tok, rows, seed=k, max_lens=ln, **kw)
        return out
    def stacked(k):
        return fastgen.generate(model, tok, rows * len(names), seed=k, max_lens=sum(lens, []),
                                adapters=[n for n in names for _ in rows], **kw)
    runs = {"stacked": stacked} if args.stacked_only else {"one_at_a_time": one_at_a_time, "stacked": stacked}
    # the stacked call with the LoRA term as lora_stack's one kernel (where its probe passes) against the torch
    # form: each mode starts from a fresh decoder state, since the captured graphs hold the path they were made on
    fused = {"stacked": False, "stacked_fused": "auto"} if args.fused_lora else {}
    if fused:
        runs["stacked_fused"] = stacked
    calls, fused_ran = [], None
    for mode, fn in runs.items():
        if mode in fused:
            fastgen.free_fast_cache(model)
            fastgen.FUSED_LORA = fused[mode]
        for k in range(args.rl_calls):
            out, sec = timed(lambda: fn(k), device)
            kept = sum(len(c.completion_ids) for c in out)
            calls.append({"mode": mode, "call": k, "rows": len(out), "new_tokens": kept, "s": round(sec, 3),
                          "tok_s": round(kept / sec, 1)})
            print(calls[-1], flush=True)
        if mode == "stacked_fused":
            fused_ran = fastpack.hf_causal_lm(model).__dict__["_chorus_fast_stack"].get("fused_lora")
    # greedy check under the same path (CUDA graphs on a GPU): each stacked row against its one-adapter row, as
    # leading tokens equal (bf16 may part at a near-tie after a while; fp32 on CPU agrees fully)
    check = {**kw, "temperature": 0, "top_p": 1.0, "max_new_tokens": min(128, args.rl_cap)}
    alone = []
    for name in names:
        with common.use_adapter(model, name):
            alone += fastgen.generate(model, tok, rows, seed=0, **check)
    stacked = fastgen.generate(model, tok, rows * len(names), seed=0, adapters=[n for n in names for _ in rows], **check)
    agree = [next((i for i, (u, v) in enumerate(zip(a.completion_ids, b.completion_ids)) if u != v),
                  min(len(a.completion_ids), len(b.completion_ids))) for a, b in zip(alone, stacked)]
    print(f"greedy agreement, stacked vs one adapter at a time (leading tokens of {check['max_new_tokens']}): {agree}")
    steady = {m: [c["s"] for c in calls if c["mode"] == m and c["call"] > 0] or
              [c["s"] for c in calls if c["mode"] == m] for m in runs}
    per_call = {m: round(sum(v) / len(v), 3) for m, v in steady.items()}
    alone_s = per_call.get("one_at_a_time")
    print(f"\nOPD teachers: {len(names)} adapters x {args.rl_prompts} prompts x {args.rl_group}, cap {args.rl_cap}: "
          + (f"one at a time {alone_s:.2f} s, " if alone_s else "") + f"stacked {per_call['stacked']:.2f} s per round"
          + (f" (x{alone_s / per_call['stacked']:.2f})" if alone_s else "")
          + (f", stacked with the fused LoRA kernel {per_call['stacked_fused']:.2f} s (ran: {fused_ran})" if fused else ""))
    return {"mode": "teachers", "teachers": len(names), "rl_prompts": args.rl_prompts, "rl_group": args.rl_group,
            "rl_cap": args.rl_cap, "rl_batch": args.rl_batch, "shared_prefix": args.shared_prefix,
            "prompt_tokens": [len(p) for p in distinct], "calls": calls, "steady_s_per_round": per_call,
            "greedy_agreement": agree, "fused_lora_ran": fused_ran,
            "speedup": round(alone_s / per_call["stacked"], 3) if alone_s else None,
            "fused_speedup": round(per_call["stacked"] / per_call["stacked_fused"], 3) if fused else None}


def fused_small_info(args, model):
    """--fused-small as asked, and whether the decoder's states ran decode_fuse's kernels (None: no state left)."""
    states = [st for st in map(fastpack.hf_causal_lm(model).__dict__.get, fastgen._STATE_KEYS) if st is not None]
    return {"fused_small": args.fused_small,
            "fused_small_ran": any(st.get("fused_small") for st in states) if states else None}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_model_args(ap)
    ap.add_argument("--rl-round", action="store_true", help="the RL-round case (see the docstring)")
    ap.add_argument("--teachers", type=int, default=0, help="the OPD-teachers case with N adapters (docstring)")
    ap.add_argument("--rl-prompts", type=int, default=16, help="distinct prompts per call")
    ap.add_argument("--rl-group", type=int, default=4, help="repeats of each prompt (G)")
    ap.add_argument("--rl-cap", type=int, default=1280, help="max new tokens")
    ap.add_argument("--rl-min", type=int, default=1000, help="shortest prompt, tokens")
    ap.add_argument("--rl-max", type=int, default=6000, help="longest prompt, tokens")
    ap.add_argument("--rl-extra", type=int, default=800, help="round 2: tokens added to every prompt")
    ap.add_argument("--rl-calls", type=int, default=3, help="timed calls per round")
    ap.add_argument("--rl-batch", type=int, default=64, help="decoder batch_size (rl.py's gen_batch_size)")
    ap.add_argument("--plain", action="store_true", help="--rl-round without shared prefill and compaction")
    ap.add_argument("--fresh-slot", action="store_true", help="--rl-round: drop the decoder state per call")
    ap.add_argument("--shared-prefix", action="store_true",
                    help="fastgen.SHARED_PREFIX on: each group's prompt K/V once, two-part decode attention")
    ap.add_argument("--stacked-only", action="store_true", help="--teachers: skip the one-adapter-at-a-time calls")
    ap.add_argument("--fused-lora", action="store_true",
                    help="--teachers: also time the stacked call with lora_stack's one-kernel LoRA term (the probe decides)")
    ap.add_argument("--fused-small", action="store_true",
                    help="decode steps with decode_fuse's rotary/K-V write and SiLU-mul kernels (the probe decides)")
    ap.add_argument("--batches", default="1,16,64,256", help="comma-separated batch sizes")
    ap.add_argument("--new-tokens", type=int, default=256, help="tokens generated per sequence")
    ap.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (RL rollouts: 1.0)")
    ap.add_argument("--top-p", type=float, default=1.0, help="nucleus mass (eval uses 0.8)")
    ap.add_argument("--hf-max-batch", type=int, default=256, help="skip HF generate above this batch")
    ap.add_argument("--out", default="results/bench_generate.json", help="JSON output path")
    args = ap.parse_args()
    if args.teachers and not args.lora_r:
        ap.error("--teachers needs --lora-r > 0 (the teachers are LoRA adapters beside the active one)")
    model, tok, device, prompt = bench_model(args)
    fastgen.FUSED_SMALL = "auto" if args.fused_small else False
    case = ((teachers_round, "results/bench_generate_teachers.json") if args.teachers else
            (rl_round, "results/bench_generate_rl.json") if args.rl_round else None)
    if case:                    # a case of its own: its rows, written to its own default file
        fn, default_out = case
        out = args.out if args.out != ap.get_default("out") else default_out
        write_json(out, {**run_info(args, model, device, prompt), "temperature": args.temperature,
                         "top_p": args.top_p, **fn(args, model, tok, device), **fused_small_info(args, model),
                         "command": "python " + " ".join(sys.argv)})
        return
    N = args.new_tokens
    fastgen.SHARED_PREFIX = args.shared_prefix
    print(f"device={device} ({torch.cuda.get_device_name() if device.type == 'cuda' else 'cpu'}), "
          f"prompt {len(prompt)} tokens, {N} new tokens per sequence, T={args.temperature}, top_p={args.top_p}")
    kw = dict(max_new_tokens=N, temperature=args.temperature, top_p=args.top_p, seed=0, ignore_stop=True)

    rows = []
    for B in [int(b) for b in args.batches.split(",")]:
        prompts = [prompt] * B
        row = {"batch": B, "new_tokens": N}
        _, t = timed(lambda: fastgen.generate(model, tok, prompts, batch_size=B, **kw), device)
        row["fast_first_s"] = round(t, 3)
        _, t = timed(lambda: fastgen.generate(model, tok, prompts, batch_size=B, **kw), device)
        row["fast_s"], row["fast_tok_s"] = round(t, 3), round(B * N / t, 1)
        if B <= args.hf_max_batch:
            _, t = timed(lambda: common._generate_hf(model, tok, prompts, batch_size=B, **kw), device)
            row["hf_s"], row["hf_tok_s"] = round(t, 3), round(B * N / t, 1)
            row["speedup"] = round(row["fast_tok_s"] / row["hf_tok_s"], 1)
        rows.append(row)
        print(row, flush=True)

    greedy = dict(max_new_tokens=min(N, 128), temperature=0, seed=0, batch_size=4, ignore_stop=True)
    a = common._generate_hf(model, tok, [prompt] * 4, top_p=1.0, **greedy)
    b = fastgen.generate(model, tok, [prompt] * 4, top_p=1.0, **greedy)
    agree = []
    for x, y in zip(a, b):
        n = next((i for i, (u, v) in enumerate(zip(x.completion_ids, y.completion_ids)) if u != v),
                 min(len(x.completion_ids), len(y.completion_ids)))
        agree.append(n)

    print(f"\n{'batch':>6} {'HF tok/s':>10} {'fast tok/s':>11} {'speedup':>8} {'fast 1st call s':>16}")
    for r in rows:
        print(f"{r['batch']:>6} {r.get('hf_tok_s', float('nan')):>10.1f} {r['fast_tok_s']:>11.1f} "
              f"{r.get('speedup', float('nan')):>8.1f} {r['fast_first_s']:>16.2f}")
    print(f"greedy agreement (leading tokens equal, of {greedy['max_new_tokens']}): {agree}")
    write_json(args.out, {**run_info(args, model, device, prompt), "temperature": args.temperature,
                          "top_p": args.top_p, "shared_prefix": args.shared_prefix, "rows": rows,
                          "greedy_agreement": agree, **fused_small_info(args, model)})


def run_info(args, model, device, prompt):
    """The fields that say what ran where (shared with profile_decode.py)."""
    shape = getattr(args, "random_shape", None)
    name = f"random, {shape}'s layers, tiny vocabulary" if shape else "tiny" if args.tiny else "SmolLM2-135M-Instruct (GGUF)"
    return {"git": common.git_info(), "model": args.model or name,
            "device": str(device), "gpu": torch.cuda.get_device_name() if device.type == "cuda" else None,
            "dtype": str(next(model.parameters()).dtype), "prompt_tokens": len(prompt), "lora_r": args.lora_r,
            "versions": {"torch": torch.__version__, "transformers": __import__("transformers").__version__}}


def write_json(path, result):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(result, f, indent=2)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
