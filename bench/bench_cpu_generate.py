"""Tokens/s of the two generation paths on CPU: HF `generate` and the fast decoder run eagerly
(common.generate(..., fast=False | True)), at batch 1/8/32, fp32 and (where the CPU has AVX512-BF16) bf16.

    python bench/bench_cpu_generate.py                          # SmolLM2-135M, writes results/bench_cpu_generate.json
    python bench/bench_cpu_generate.py --threads 1 --batches 1,8 --new-tokens 32 --dtypes fp32
    python bench/bench_cpu_generate.py --tiny --batches 1,2 --new-tokens 8 --out out/b.json   # seconds

What it answers: which path `make demo` (demo.py) should generate with on a 2-core CPU. Every row
generates exactly --new-tokens per sequence (stop rules off, so both paths do the same work), with a rank-16
LoRA adapter (nonzero B) active, as when an expert is evaluated, from either --prompt short: bench_generate.py's
prompt (565 tokens with the current system prompt), or --prompt demo: a stimulus-mode prompt of
data/demo_tasks.jsonl (820 tokens and more). Times include the prefill. The fast path is timed twice: the first
call packs the weights (LoRA folded in), the second is steady state. The load average is recorded before
and after: the 2 cores of the development box are shared, and a busy box slows every row (a thread of a
2-thread matmul that loses its core stalls the other one at each barrier).
"""
import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import common  # noqa: E402
import fastgen  # noqa: E402
import harness  # noqa: E402
import sim  # noqa: E402
from bench.bench_generate import TASK, write_json  # noqa: E402


def cpu_has_bf16():
    """True when /proc/cpuinfo lists avx512_bf16 (or amx_bf16): bf16 matmuls then run at native speed."""
    try:
        flags = open("/proc/cpuinfo").read()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def load(args, dtype):
    """(model, tok) with an active rank-16 LoRA whose B is small random, as an expert's adapter."""
    if args.tiny:
        model, tok = common.tiny_model(0)
        model = model.to(getattr(torch, {"fp32": "float32", "bf16": "bfloat16"}[dtype]))
    else:
        model, tok = common.load_model(None, quant=dtype)
    model = common.add_lora(model, r=16, alpha=32, dropout=0.0)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.copy_((torch.randn(p.shape, generator=g) * 1e-3).to(p.dtype))
    model.eval()
    return model, tok


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tiny", action="store_true", help="the tiny random model (a smoke run of this script)")
    ap.add_argument("--prompt", choices=("short", "demo"), default="short", help="see the docstring")
    ap.add_argument("--tasks", default="data/demo_tasks.jsonl", help="--prompt demo: this file's task --task")
    ap.add_argument("--task", type=int, default=0, help="index of the prompt's task in --tasks")
    ap.add_argument("--batches", default="1,8,32", help="comma-separated batch sizes")
    ap.add_argument("--new-tokens", type=int, default=64, help="tokens generated per sequence")
    ap.add_argument("--dtypes", default=None, help="fp32,bf16 (default: bf16 only where the CPU has AVX512-BF16)")
    ap.add_argument("--threads", type=int, default=2, help="torch threads (the demo's box: 2 cores)")
    ap.add_argument("--out", default="results/bench_cpu_generate.json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    dtypes = args.dtypes.split(",") if args.dtypes else ["fp32"] + (["bf16"] if cpu_has_bf16() else [])
    task = sim.load_tasks(args.tasks)[args.task] if args.prompt == "demo" else TASK
    N = args.new_tokens
    kw = dict(max_new_tokens=N, temperature=0.7, top_p=0.8, seed=0, ignore_stop=True)
    load_before = os.getloadavg()
    rows = []
    for dtype in dtypes:
        model, tok = load(args, dtype)
        messages = harness.first_messages(task, "stimulus") if args.prompt == "demo" else common.build_messages(TASK)
        prompt = common.chat_ids(tok, messages)
        print(f"{dtype}: prompt {len(prompt)} tokens ({task['id']}), {N} new tokens per sequence, "
              f"{args.threads} threads", flush=True)
        for B in [int(b) for b in args.batches.split(",")]:
            prompts = [prompt] * B
            row = {"dtype": dtype, "batch": B, "new_tokens": N}
            for name, fn in (("hf", lambda: common._generate_hf(model, tok, prompts, batch_size=B, **kw)),
                             ("fast_first", lambda: fastgen.generate(model, tok, prompts, batch_size=B, **kw)),
                             ("fast", lambda: fastgen.generate(model, tok, prompts, batch_size=B, **kw))):
                t0 = time.perf_counter()
                fn()
                t = time.perf_counter() - t0
                row[f"{name}_s"], row[f"{name}_tok_s"] = round(t, 2), round(B * N / t, 1)
            row["fast_over_hf"] = round(row["fast_tok_s"] / row["hf_tok_s"], 2)
            row["loadavg_1m"] = round(os.getloadavg()[0], 2)
            rows.append(row)
            print(row, flush=True)
        fastgen.free_fast_cache(model)
    print(f"\n{'dtype':>5} {'batch':>5} {'HF tok/s':>9} {'fast tok/s':>10} {'fast/HF':>7}")
    for r in rows:
        print(f"{r['dtype']:>5} {r['batch']:>5} {r['hf_tok_s']:>9.1f} {r['fast_tok_s']:>10.1f} {r['fast_over_hf']:>7.2f}")
    write_json(args.out, {"git": common.git_info(), "model": "tiny" if args.tiny else "SmolLM2-135M-Instruct (GGUF)",
                          "cpu": _cpu_name(), "cores": os.cpu_count(), "threads": args.threads,
                          "cpu_bf16": cpu_has_bf16(), "task": task["id"], "prompt_tokens": len(prompt),
                          "lora_r": 16, "temperature": 0.7, "top_p": 0.8, "loadavg_before": load_before,
                          "loadavg_after": os.getloadavg(), "rows": rows,
                          "versions": {"torch": torch.__version__,
                                       "transformers": __import__("transformers").__version__},
                          "command": "python " + " ".join(sys.argv)})


def _cpu_name():
    try:
        return next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        return "?"


if __name__ == "__main__":
    main()
