"""Tokens/s of HF `generate` vs the fast static-cache decoder (common.generate's two paths:
common._generate_hf and fastgen.generate).

Run (GPU):  python bench/bench_generate.py                      # SmolLM2-135M, batches 1/16/64/256
            python bench/bench_generate.py --model Qwen/Qwen3-4B-Instruct-2507 --batches 1,16,64
     (CPU): python bench/bench_generate.py --tiny --batches 1,16 --new-tokens 64

Every row generates exactly --new-tokens per sequence (stop rules off, so both paths do the same work)
from the kit's real prompt shape (system prompt + a small RTL task), with a LoRA adapter (nonzero B)
active, as in RL rollouts. The fast path is timed twice: the first call includes packing and CUDA-graph
capture, the second is steady state. A greedy check reports how many leading tokens the two paths
agree on (bf16 on GPU may diverge after a while on near-ties; fp32 on CPU should agree fully).
Prints a table and writes JSON (--out).
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
    ap.add_argument("--quant", default="auto", help="auto | none | bf16 | fp32 | 4bit")
    ap.add_argument("--lora-r", type=int, default=16, help="LoRA rank of the active adapter (0 = none)")


def bench_model(args):
    """(model, tok, device, prompt ids) from --model/--tiny/--quant, with an active LoRA adapter of rank
    --lora-r whose B is small random (not zero), as in RL rollouts. Shared with profile_decode.py."""
    if args.tiny:
        model, tok = common.tiny_model(0)
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


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_model_args(ap)
    ap.add_argument("--batches", default="1,16,64,256", help="comma-separated batch sizes")
    ap.add_argument("--new-tokens", type=int, default=256, help="tokens generated per sequence")
    ap.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (RL rollouts: 1.0)")
    ap.add_argument("--top-p", type=float, default=1.0, help="nucleus mass (eval uses 0.8)")
    ap.add_argument("--hf-max-batch", type=int, default=256, help="skip HF generate above this batch")
    ap.add_argument("--out", default="results/bench_generate.json", help="JSON output path")
    args = ap.parse_args()
    model, tok, device, prompt = bench_model(args)
    N = args.new_tokens
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
                          "top_p": args.top_p, "rows": rows, "greedy_agreement": agree})


def run_info(args, model, device, prompt):
    """The fields that say what ran where (shared with profile_decode.py)."""
    return {"git": common.git_info(), "model": args.model or ("tiny" if args.tiny else "SmolLM2-135M-Instruct (GGUF)"),
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
