"""Where an RL update's time goes: rl.train_on_batch on a batch shaped like the `small` profile's steps,
timed at several micro-batch sizes, and a per-kernel table of one update from torch.profiler.

Run (GPU):  python bench/profile_train_step.py --model SmolLM2-135M-Instruct.Q4_1.gguf \
                --adapter results/small2/adapters/sft0_stimulus --tasks runs/s2st/data/train_tasks.jsonl
     (CPU):  python bench/profile_train_step.py --tiny --groups 2 --micro 2048 --repeats 1
     (GPU, no model file): --random-smollm2 builds random weights in SmolLM2-135M's shape (bf16): the same
                 compute, so the same time; prompt lengths then come from --tasks or the default range

The batch: --groups groups of G 4 rows; each group's prompt is one task's first prompt (its real token
count, from --tasks; without it, 1,500-7,000 tokens), the completions random ids of 200 to 1,280 tokens
(only the shapes matter for time). Advantages alternate +-1, so no row is skipped. Every variant sees the
same batch; the optimizer is SGD with lr 0, so the weights do not move between repeats.
Writes JSON (--out): seconds per update (median of --repeats) for each --micro, and the kernel table.
"""
import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import common        # noqa: E402
import harness       # noqa: E402
import rl            # noqa: E402
import sim           # noqa: E402


def prompt_lengths(tok, tasks_path, n, answer_mode, seed):
    """Token counts of n tasks' first prompts (chat template applied)."""
    rng = random.Random(seed)
    if not tasks_path:
        return [rng.randint(1500, 7000) for _ in range(n)]
    tasks = sim.load_tasks(tasks_path)
    rng.shuffle(tasks)
    out = []
    for t in tasks[:n]:
        out.append(len(common.chat_ids(tok, harness.first_messages(t, answer_mode))))
    return out


def make_rows(lengths, group_size, vocab, seed):
    rng = random.Random(seed)
    rows = []
    for P in lengths:
        prompt = [rng.randrange(vocab) for _ in range(P)]
        for _ in range(group_size):
            rows.append(common.Completion(text="", prompt_ids=prompt,
                                          completion_ids=[rng.randrange(vocab) for _ in range(rng.randint(200, 1280))],
                                          truncated=False))
    return rows


def kernel_table(prof, top):
    rows = [(e.key, e.count, e.self_device_time_total) for e in prof.key_averages()
            if str(getattr(e, "device_type", "")).endswith("CUDA")]
    total = sum(r[2] for r in rows) or 1.0
    rows.sort(key=lambda r: -r[2])
    return {"kernel_ms_total": round(total / 1e3, 1),
            "top": [{"name": k[:90], "launches": c, "ms": round(t / 1e3, 1), "share": round(t / total, 3)}
                    for k, c, t in rows[:top]]}


def random_smollm2(seed):
    """SmolLM2-135M-Instruct's architecture (its config.json's shape) with random weights, and the kit's tiny
    tokenizer (only used for the chat template of --tasks prompts; token ids are drawn from the model's vocab)."""
    from transformers import AutoModelForCausalLM, LlamaConfig
    cfg = LlamaConfig(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                      num_key_value_heads=3, vocab_size=49152, max_position_embeddings=8192, rms_norm_eps=1e-5,
                      rope_theta=100000.0, tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=2)
    torch.manual_seed(seed)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16 if device == "cuda" else torch.float32)
    return model, common.tiny_tokenizer()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="GGUF / HF folder (default: the embedded SmolLM2)")
    p.add_argument("--tiny", action="store_true", help="the random tiny test model (CPU check)")
    p.add_argument("--random-smollm2", action="store_true",
                   help="random weights in SmolLM2-135M's shape (bf16 on CUDA): times without the GGUF")
    p.add_argument("--adapter", default=None, help="peft adapter to train (default: a fresh LoRA r 16)")
    p.add_argument("--tasks", default=None, help="task JSONL whose prompts give the prompt lengths")
    p.add_argument("--answer-mode", default="stimulus", choices=harness.ANSWER_MODES)
    p.add_argument("--groups", type=int, default=14, help="informative groups per update (small profile: 13-16)")
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--micro", type=int, nargs="+", default=[16384, 32768, 65536],
                   help="max_tokens_per_micro values to time")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--profile", action="store_true", help="also a torch.profiler kernel table of one update "
                   "(at the first --micro)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="JSON file to write")
    args = p.parse_args()

    if args.tiny:
        model, tok = common.tiny_model(seed=args.seed)
    elif args.random_smollm2:
        model, tok = random_smollm2(args.seed)
    else:
        model, tok = common.load_model(args.model)
    model = common.load_adapter(model, args.adapter, trainable=True) if args.adapter else common.add_lora(model, r=16)
    device = next(model.parameters()).device
    lengths = prompt_lengths(tok, args.tasks, args.groups, args.answer_mode, args.seed)
    rows = make_rows(lengths, args.group_size, model.get_input_embeddings().num_embeddings, args.seed)
    adv = [1.0 if i % 2 else -1.0 for i in range(len(rows))]
    opt = torch.optim.SGD([q for q in model.parameters() if q.requires_grad], lr=0.0)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    res = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
           "rows": len(rows), "prompt_tokens": sum(len(r.prompt_ids) for r in rows),
           "completion_tokens": sum(len(r.completion_ids) for r in rows), "micro": {}}
    print(f"{len(rows)} rows, {res['prompt_tokens']} prompt + {res['completion_tokens']} completion tokens")
    rl.train_on_batch(model, opt, rows, adv, max_tokens_per_micro=args.micro[0])     # warm-up
    for micro in args.micro:
        times, split = [], None
        for _ in range(args.repeats):
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats()
            sync()
            t0 = time.perf_counter()
            stats = rl.train_on_batch(model, opt, rows, adv, max_tokens_per_micro=micro)
            sync()
            times.append(time.perf_counter() - t0)
            split = {k: round(stats[k], 3) for k in ("t_fwd_bwd", "t_opt") if k in stats}
        peak = torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else None
        res["micro"][str(micro)] = {"s_median": round(statistics.median(times), 3), "s_all": [round(t, 3) for t in times],
                                    "last_split": split, "peak_alloc_gib": peak and round(peak, 2),
                                    "tokens_per_s": round((res["prompt_tokens"] + res["completion_tokens"])
                                                          / statistics.median(times))}
        print(f"micro {micro:6d}: {statistics.median(times):.2f} s per update  {res['micro'][str(micro)]}")
        if args.out:              # written after every variant: a run cut short keeps what it measured
            Path(args.out).write_text(json.dumps(res, indent=1))
    if args.profile:
        acts = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA]
                                                         if device.type == "cuda" else [])
        with torch.profiler.profile(activities=acts) as prof:
            rl.train_on_batch(model, opt, rows, adv, max_tokens_per_micro=args.micro[0])
            sync()
        res["kernels"] = kernel_table(prof, 25)
        cpu = sorted(((e.key, e.count, e.self_cpu_time_total) for e in prof.key_averages()), key=lambda r: -r[2])
        res["cpu_ops"] = [{"name": k[:90], "calls": c, "ms": round(t / 1e3, 1)} for k, c, t in cpu[:15]]
        for k in res["kernels"]["top"][:12]:
            print(f"  {k['ms']:8.1f} ms {k['launches']:6d}x  {k['name']}")
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
