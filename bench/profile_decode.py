"""Where the fast decoder's time goes at one batch size: step time with CUDA graphs, and a per-kernel
table of one decode step from torch.profiler.

Run (GPU):  python bench/profile_decode.py --model SmolLM2-135M-Instruct.Q4_1.gguf --batch 256
A/B against another version of the decoder (e.g. the last commit's):
            mkdir -p OLD && git show HEAD:fastgen.py > OLD/fastgen.py    # OLD: any folder outside the checkout
            git show HEAD:two_part.py > OLD/two_part.py     # where that commit has one
            python bench/profile_decode.py --model ... --decoder OLD/fastgen.py --out old.json
     (commits before the decoder left common.py for fastgen.py cannot be loaded this way)
     (CPU): python bench/profile_decode.py --tiny --batch 4 --new-tokens 8
RL's shape, 16 distinct long prompts of 4 rows each (prefill_s then runs 16 prompts, not 1):
            python bench/profile_decode.py --model ... --batch 64 --group 4 --prompt-tokens 4500
decode_fuse's kernels against the torch forms: the same command with and without --fused-small.

Same prompt, LoRA adapter and sampling as bench_generate.py (temperature 1, stop rules off).
- prefill_s: a call that generates 1 token (prefill of the whole batch + the first sample).
- step_ms: one decode step, steady state, CUDA graphs on: (t(1 + N new tokens) - t(1 new token)) / N,
  median of --repeats, after a warm-up call that packs the weights and captures the graphs. It includes
  the host's share per token (copying the tokens back, detokenising them: ~0.2 ms per step at batch 256
  on a fast host), as a real generate() call does.
- kernels: a profiled run without graphs, minus a profiled prefill-only run, divided by the steps:
  kernel launches per step and GPU time per step, by kernel name. Only the first N/8 steps are
  profiled, so their attention reads the shortest cache lengths of the run. step_ms well above kernel_ms_per_step
  means the step is bound by launches and gaps between kernels; close to it, by the kernels themselves.
Writes JSON (--out).
"""
import argparse
import importlib.util
import os
import statistics
import sys

import torch

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def load_decoder(path):
    """Import `fastgen` from path (another version of the decoder) before anything else imports it. Its
    two_part import finds a two_part.py beside it first, else this checkout's."""
    sys.path[:0] = [os.path.dirname(os.path.abspath(path)), ROOT]
    spec = importlib.util.spec_from_file_location("fastgen", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["fastgen"] = mod
    spec.loader.exec_module(mod)
    return mod


def kernel_table(prof, cuda):
    """{name: [launches, microseconds]} over the CUDA kernels of a profiler run (cuda), else over the
    CPU ops (self time: nested ops are not counted twice)."""
    out = {}
    for e in prof.key_averages():
        if str(getattr(e, "device_type", "")).endswith("CUDA") == cuda:
            row = out.setdefault(e.key, [0, 0.0])
            row[0] += e.count
            row[1] += e.self_device_time_total if cuda else e.self_cpu_time_total
    return out


def main():
    pre = argparse.ArgumentParser(add_help=False)       # --decoder first: it must be imported before the kit's
    pre.add_argument("--decoder", default=None)
    other = pre.parse_known_args()[0].decoder
    if other:
        load_decoder(other)
    sys.path.insert(0, ROOT)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import fastgen
    from bench_generate import add_model_args, bench_model, fused_small_info, rl_prompts, run_info, timed, write_json

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_model_args(ap)
    ap.add_argument("--batch", type=int, default=256, help="sequences decoded together")
    ap.add_argument("--new-tokens", type=int, default=256, help="decode steps timed (and profiled: 1/8 of them)")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs (median)")
    ap.add_argument("--decoder", default=None, help="path of another fastgen.py to profile instead of the kit's")
    ap.add_argument("--prompt-tokens", type=int, default=0,
                    help="a prompt of about this many tokens (the kit's RTL repeated, as RL's long prompts) "
                         "instead of the 565-token one: the step's share that grows with the cache")
    ap.add_argument("--group", type=int, default=0,
                    help="rows per prompt: batch/group distinct prompts of about the prompt's length, each "
                         "repeated this many times (RL's groups: prefill runs each distinct prompt once); "
                         "0: every row the same prompt")
    ap.add_argument("--fused-small", action="store_true",
                    help="decode with decode_fuse's rotary/K-V write and SiLU-mul kernels (fastgen.FUSED_SMALL "
                         "auto: where their probe passes); the A/B is the same command without it (off)")
    ap.add_argument("--top", type=int, default=20, help="kernels listed")
    ap.add_argument("--out", default="results/profile_decode.json", help="JSON output path")
    args = ap.parse_args()

    B, N = args.batch, args.new_tokens
    if args.group and (args.group < 2 or B % args.group):
        sys.exit(f"profile_decode.py: --group {args.group} must be >= 2 and divide --batch {B}")
    model, tok, device, prompt = bench_model(args)
    fastgen.FUSED_SMALL = "auto" if args.fused_small else False    # the A/B: without the flag, off
    if args.prompt_tokens:
        prompt = rl_prompts(tok, 1, args.prompt_tokens, args.prompt_tokens)[0]
    prompts = [prompt] * B
    if args.group:                                     # distinct prompts of about the same length, G rows each
        n = args.prompt_tokens or len(prompt)
        prompts = [p for p in rl_prompts(tok, B // args.group, n, n) for _ in range(args.group)]
    kw = dict(temperature=1.0, top_p=1.0, seed=0, batch_size=B, ignore_stop=True)

    def run(n, **extra):
        return timed(lambda: fastgen.generate(model, tok, prompts, max_new_tokens=n, **kw, **extra), device)[1]

    first_s = run(1 + N)                               # packs, allocates the slot, captures every graph
    long = [run(1 + N) for _ in range(args.repeats)]
    short = [run(1) for _ in range(args.repeats)]
    step_ms = 1000 * (statistics.median(long) - statistics.median(short)) / N

    S = max(2, N // 8)
    tables = []
    for n in (1, 1 + S):
        run(n, graphs=False)                           # eager warm-up at this length
        acts = [torch.profiler.ProfilerActivity.CPU]
        if device.type == "cuda":
            acts.append(torch.profiler.ProfilerActivity.CUDA)
        with torch.profiler.profile(activities=acts) as prof:
            run(n, graphs=False)
        tables.append(kernel_table(prof, device.type == "cuda"))
    per_step = {}
    for k, (c, us) in tables[1].items():
        c0, us0 = tables[0].get(k, (0, 0.0))
        if c > c0:
            per_step[k] = ((c - c0) / S, (us - us0) / S)
    rows = sorted(per_step.items(), key=lambda kv: -kv[1][1])
    kernel_us = sum(us for _, us in per_step.values())
    launches = sum(c for c, _ in per_step.values())

    result = {**run_info(args, model, device, prompt), "decoder": args.decoder or "fastgen.py",
              "batch": B, "new_tokens": N, "prompt_tokens": max(len(p) for p in prompts),
              "group": args.group, **fused_small_info(args, model), "first_call_s": round(first_s, 3),
              "prefill_s": round(statistics.median(short), 4), "step_ms": round(step_ms, 3),
              "tok_s": round(B * 1000 / step_ms, 1) if step_ms > 0 else None,
              "profiled_steps": S, "launches_per_step": round(launches, 1),
              "kernel_ms_per_step": round(kernel_us / 1000, 3),
              "kernels": [{"name": k[:120], "launches_per_step": round(c, 2), "us_per_step": round(us, 1)}
                          for k, (c, us) in rows[:args.top]],
              "command": "python " + " ".join(sys.argv)}
    print(f"batch {B}: step {step_ms:.3f} ms ({result['tok_s']} tok/s with graphs); eager profile: "
          f"{launches:.0f} kernel launches and {kernel_us / 1000:.3f} ms of kernel time per step")
    for r in result["kernels"]:
        print(f"  {r['us_per_step']:>9.1f} us  {r['launches_per_step']:>6.1f}x  {r['name'][:100]}")
    write_json(args.out, result)


if __name__ == "__main__":
    main()
