"""Does the whole chorus-mini pipeline fit one 24 GB GPU for a Qwen3-4B-class model? (issue 8)

Run (GPU; about 5 minutes on an H200, one command):
    python bench/bench_4b.py --out results/bench_4b.json
    python bench/bench_4b.py --render results/bench_4b.json     # the table only (results/bench.md quotes it)
CPU smoke run of the same code paths at toy size (tests/test_bench_4b.py runs it):
    python bench/bench_4b.py --tiny --out out/bench_tiny.json

What it does, in order:
 1. Builds a RANDOM model with Qwen3-4B-Instruct-2507's shape (QWEN3_4B below; nothing is downloaded),
    saves it as a bf16 HF folder in a temp dir, and loads it through the kit's own loader
    (common.load_model(quant="4bit"): nf4 + double quant, bf16 compute), then LoRA r=16 on every
    linear layer (common.add_lora). A 24 GiB cap is set first (common.cap_memory, the same one every
    stage applies from $CHORUS_GPU_CAP_GIB: set_per_process_memory_fraction, and torch.cuda.mem_get_info
    made to report the cap), so the kit sizes its batches as on a 24 GB card.
 2. Times each step and records peak memory (max_memory_allocated / max_memory_reserved, reset before
    every run): one warm-up, then --reps timed runs; time = median, peak = max over all runs.
      sft          one optimizer step: grad-accum micro-batches of 1 row x 4096 tokens (sft.py's step;
                   gradient checkpointing on); sft_nogc: the same without checkpointing (sft.py's default)
      rollout      one DAPO group on the fast path: G=4 samples x 4096 new tokens (fastgen.generate)
      dapo         rl.train_on_batch on G=4 x 2 rounds = 8 rows of up to 4096 response tokens,
                   micro-batched, with the old-log-prob recompute pass (steps_per_generation=2),
                   while the fast decoder's weights and KV cache stay resident as in rl.py
      opd          distill.py's update: for each of two frozen teacher adapters, distill_advantages
                   (student + teacher no-grad forwards, top-16 support), then one train_on_batch
      dapo_nofast, opd_nofast   the same after the fast decoder's state is released (what freeing it buys)
      gen_hf_bB / gen_fast_bB   tokens/s of HF generate vs the fast path, B sequences x 256 new tokens
 3. A step that runs out of memory is recorded as "oom" (with the peak reached) and the next one runs;
    any other error is recorded as "error" and makes the exit code 1. Cases still waiting when
    --time-budget (420 s after the model is loaded) runs out are "skipped".
 4. Writes JSON (every number, hardware, versions, the command) to --out and prints the markdown
    table last (render_markdown; --smollm2-json adds bench/bench_generate.py's SmolLM2 rows).

Token ids are random: the model is random, so only shapes matter. The tokenizer is the kit's tiny
test tokenizer (common.tiny_tokenizer); its ids are a subset of the model's 151936-id vocabulary.
"""
import argparse
import gc
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import common  # noqa: E402
from common import cap_memory  # noqa: E402,F401  (moved to common: every stage honours $CHORUS_GPU_CAP_GIB)
import distill  # noqa: E402
import fastgen  # noqa: E402
import rl  # noqa: E402
import sft  # noqa: E402

GIB = 2 ** 30

# -----------------------------------------------------------------------------
# Shapes and workload sizes

# Qwen3-4B-Instruct-2507 (Qwen/Qwen3-4B-Instruct-2507 config.json; cross-checked with the GGUF metadata
# of its quantisations: block_count 36, embedding_length 2560, feed_forward_length 9728, head_count 32,
# head_count_kv 8, key_length 128, rms eps 1e-6, context 262144, rope freq_base 5e6, 4.02 B params).
# The base Qwen3-4B differs only in rope_theta 1e6 and a 40960 context.
QWEN3_4B = dict(vocab_size=151936, hidden_size=2560, intermediate_size=9728, num_hidden_layers=36,
                num_attention_heads=32, num_key_value_heads=8, head_dim=128, tie_word_embeddings=True,
                rope_theta=5e6, max_position_embeddings=262144, rms_norm_eps=1e-6)
TINY = dict(vocab_size=2048, hidden_size=64, intermediate_size=128, num_hidden_layers=2,  # vocab > the
            num_attention_heads=4, num_key_value_heads=2, head_dim=16, tie_word_embeddings=True,  # tokenizer's,
            rope_theta=5e6, max_position_embeddings=8192, rms_norm_eps=1e-6)  # as in the real run

SIZES = {
    "full": {
        "sft_prompt": 2048, "sft_target": 2048,   # one 4096-token SFT row: prompt + the answer it learns
        "sft_grad_accum": 4,                       # micro-batches of 1 row per optimizer step
        "group_size": 4, "prompts": (1024, 2048),  # G; round-1 prompt, round-2 (refinement) prompt
        "max_response": 4096,                      # every response at the cap: the worst case for memory
        "max_tokens_per_micro": 16384,             # rl.py / distill.py default
        "chunk_tokens": 1024,                      # rl.per_token_logps default
        "steps_per_generation": 2,                 # > 1 so train_on_batch runs the old-log-prob pass
        "topk": 16,                                # distill.py default (paper)
        "gen_batches": (64, 16, 1), "gen_new_tokens": 256, "gen_prompt": 512,
        "reps": 2, "warmup": 1,
    },
    "tiny": {
        "sft_prompt": 48, "sft_target": 48, "sft_grad_accum": 2,
        "group_size": 4, "prompts": (24, 40), "max_response": 48,
        "max_tokens_per_micro": 200,               # 2 rows per micro-batch: micro-batching is exercised
        "chunk_tokens": 64,                        # several log-prob chunks per micro-batch
        "steps_per_generation": 2, "topk": 16,
        "gen_batches": (4, 1), "gen_new_tokens": 16, "gen_prompt": 24,
        "reps": 1, "warmup": 1,
    },
}
TARGET_GIB = 20.0   # every step must peak at or under this (reserved), leaving room for the CUDA context


# -----------------------------------------------------------------------------
# Model: a random Qwen3-4B-shaped checkpoint, loaded by the kit's 4-bit loader

def qwen3_config(shape, tok):
    from transformers import Qwen3Config
    kw = {k: v for k, v in shape.items() if k != "rope_theta"}
    kw.update(bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
              use_sliding_window=False, max_window_layers=shape["num_hidden_layers"])
    try:
        cfg = Qwen3Config(rope_parameters={"rope_type": "default", "rope_theta": shape["rope_theta"]}, **kw)
    except TypeError:  # a transformers without rope_parameters
        cfg = Qwen3Config(rope_theta=shape["rope_theta"], **kw)
    return cfg


def rope_theta_of(cfg):
    rp = getattr(cfg, "rope_parameters", None) or {}
    return rp.get("rope_theta", getattr(cfg, "rope_theta", None))


def build_checkpoint(folder, shape, device):
    """Random weights (init on the device, seconds) saved as an HF folder with the tiny tokenizer."""
    from transformers import AutoModelForCausalLM
    tok = common.tiny_tokenizer()
    cfg = qwen3_config(shape, tok)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    del model
    free_memory()


def count_params(cfg):
    """Parameters of the unquantised architecture (4-bit tensors count packed bytes), built on meta."""
    import copy
    from transformers import AutoModelForCausalLM
    cfg = copy.deepcopy(cfg)
    if hasattr(cfg, "quantization_config"):
        del cfg.quantization_config
    with torch.device("meta"):
        m = AutoModelForCausalLM.from_config(cfg)
    return sum(p.numel() for p in m.parameters())


def free_memory():
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def drop_fast_state(model):
    """Release the fast decoder's packed weights, KV slots and CUDA graphs (kept on the HF model)."""
    fastgen.free_fast_cache(model)
    free_memory()


def fast_state_info(model):
    """Batch sizes of the fast decoder's cached KV slots and their cache lengths (None when absent)."""
    hf = model.get_base_model() if hasattr(model, "get_base_model") else model
    st = hf.__dict__.get("_chorus_fast")
    return None if st is None else {str(b): s["L"] for b, s in st.get("slots", {}).items()}


# -----------------------------------------------------------------------------
# The steps (each mirrors the kit's own step; see the docstring)

def random_ids(gen, n, vocab):
    return torch.randint(0, vocab, (n,), generator=gen).tolist()


def sft_rows(gen, n_rows, prompt, target, vocab):
    """Encoded SFT rows as sft.encode_row returns them: labels -100 on the prompt."""
    rows = []
    for _ in range(n_rows):
        p, t = random_ids(gen, prompt, vocab), random_ids(gen, target, vocab)
        rows.append({"input_ids": p + t, "labels": [sft.IGNORE] * prompt + t, "prompt_cut": 0})
    return rows


def make_sft_step(model, optimizer, rows, pad_id, device):
    """One optimizer step of sft.train_sft's loop: batch 1, len(rows) accumulated micro-batches,
    bf16 autocast on CUDA, token-level mean over the step, grad clip 1.0, AdamW."""
    use_bf16 = device.type == "cuda" and torch.cuda.is_bf16_supported()
    trainable = [p for p in model.parameters() if p.requires_grad]

    def step():
        model.train()
        batches = [sft.collate([r], pad_id) for r in rows]
        n_tokens = sum(int((b["labels"][:, 1:] != sft.IGNORE).sum()) for b in batches)
        total = 0.0
        for b in batches:
            b = {k: v.to(device) for k, v in b.items()}
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=use_bf16):
                loss_sum, _ = sft.target_loss_sum(model, b)
            (loss_sum / n_tokens).backward()
            total += loss_sum.item() / n_tokens
        grad_norm = torch.nn.utils.clip_grad_norm_(trainable, 1.0).item()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return {"loss": total, "grad_norm": grad_norm}
    return step


def rl_rows(gen, S, vocab):
    """G rows per round, two rounds; each round's rows share one prompt; responses at the cap."""
    rows = []
    for P in S["prompts"]:
        prompt = random_ids(gen, P, vocab)
        rows += [common.Completion("", prompt, random_ids(gen, S["max_response"], vocab), True)
                 for _ in range(S["group_size"])]
    return rows


def make_dapo_step(model, optimizer, rows, S, pad_id):
    """rl.run's update: GRPO advantages of each group, then rl.train_on_batch."""
    rewards = [0.0, 1.35, 1.8, 0.0, 1.5, 0.0, 1.9, 1.2][:len(rows)]   # nonzero group variance

    def step():
        adv = rl.compute_advantages(rewards, S["group_size"])
        stats = rl.train_on_batch(model, optimizer, rows, adv.tolist(), temperature=1.0,
                                  max_tokens_per_micro=S["max_tokens_per_micro"],
                                  steps_per_generation=S["steps_per_generation"], pad_token_id=pad_id,
                                  chunk_tokens=S["chunk_tokens"])
        return {"loss": stats["loss"], "grad_norm": stats["grad_norm"], "num_tokens": stats["num_tokens"]}
    return step


def make_opd_step(model, optimizer, rows, teachers, S, pad_id):
    """distill.run's update with every group's gate open: group i is routed to teacher i; per teacher
    distill.distill_advantages (no-grad student + teacher forwards on the student's tokens, top-K
    support), then one rl.train_on_batch with the OPD tokens as their own normaliser group."""
    G = S["group_size"]
    per_teacher = [rows[i * G:(i + 1) * G] for i in range(len(teachers))]

    def step():
        all_rows, advantages, labels = [], [], []
        for name, opd_rows in zip(teachers, per_teacher):
            adv, _ = distill.distill_advantages(model, opd_rows, name, temperature=1.0, topk=S["topk"],
                                                lam=1.0, pad_token_id=pad_id,
                                                max_tokens_per_micro=S["max_tokens_per_micro"],
                                                chunk_tokens=S["chunk_tokens"])
            all_rows, advantages, labels = all_rows + opd_rows, advantages + adv, labels + ["opd"] * len(opd_rows)
        stats = rl.train_on_batch(model, optimizer, all_rows, advantages, temperature=1.0, norm_groups=labels,
                                  max_tokens_per_micro=S["max_tokens_per_micro"], pad_token_id=pad_id,
                                  chunk_tokens=S["chunk_tokens"])
        return {"loss": stats["loss"], "grad_norm": stats["grad_norm"], "num_tokens": stats["num_tokens"]}
    return step


def make_gen(model, tok, path, prompts, new_tokens, seed=0):
    """Exactly new_tokens per sequence (stop rules off) through one of common.generate's two paths."""
    fn = fastgen.generate if path == "fast" else common._generate_hf

    def run():
        model.eval()
        outs = fn(model, tok, prompts, max_new_tokens=new_tokens, temperature=1.0, top_p=1.0, seed=seed,
                  batch_size=len(prompts), ignore_stop=True)
        n = sum(len(o.completion_ids) for o in outs)
        if n != len(prompts) * new_tokens:
            raise RuntimeError(f"{path} generated {n} tokens, expected {len(prompts) * new_tokens}")
        return {"generated_tokens": n}
    return run


# -----------------------------------------------------------------------------
# Measurement

class Bench:
    """Runs cases (warm-up + timed runs), catches OOM per case, keeps every number."""

    def __init__(self, device, budget_s, reps, warmup, skip=()):
        self.device, self.cuda = device, device.type == "cuda"
        self.t0, self.budget_s = time.time(), budget_s
        self.reps, self.warmup, self.skip = reps, warmup, set(skip)
        self.cases = []

    def _sync(self):
        if self.cuda:
            torch.cuda.synchronize()

    def _run_once(self, fn):
        self._sync()
        rec = {}
        if self.cuda:
            torch.cuda.reset_peak_memory_stats()
            rec["resident_gib"] = torch.cuda.memory_allocated() / GIB
        t = time.perf_counter()
        info = fn() or {}
        self._sync()
        rec["time_s"] = time.perf_counter() - t
        if self.cuda:
            rec["peak_alloc_gib"] = torch.cuda.max_memory_allocated() / GIB
            rec["peak_reserved_gib"] = torch.cuda.max_memory_reserved() / GIB
        return {k: round(v, 4) for k, v in rec.items()}, info

    def case(self, name, what, fn, *, tokens=None, reps=None, warmup=None, warmup_fn=None, kind="train",
             on_fail=None, after=None, **extra):
        """Run fn warmup + reps times (warm-ups run warmup_fn when given). tokens: tokens per timed run
        (for tok/s). on_fail() cleans up after an OOM or error; after() returns extra fields at the end."""
        reps = self.reps if reps is None else reps
        warmup = self.warmup if warmup is None else warmup
        if warmup_fn is not None:
            reps = max(reps, 1)   # the warm-up runs another function: time the real one at least once
        rec = {"name": name, "kind": kind, "what": what, "status": "ok", "runs": [], "tokens": tokens, **extra}
        if name in self.skip:
            rec.update(status="skipped", error="--skip")
        elif time.time() - self.t0 > self.budget_s:
            rec.update(status="skipped", error=f"time budget {self.budget_s:.0f} s used up")
        else:
            try:
                for i in range(warmup + reps):
                    r, info = self._run_once(warmup_fn if (i < warmup and warmup_fn) else fn)
                    r["warmup"] = i < warmup
                    rec["runs"].append(r)
                    if i >= warmup or not warmup_fn:
                        rec["info"] = info
            except torch.OutOfMemoryError as e:
                rec.update(status="oom", error=str(e).split("\n")[0][:400])
            except Exception as e:  # recorded, printed, and (unless an allocation failure) exit code 1
                alloc = any(k in str(e) for k in ("out of memory", "ALLOC_FAILED", "CUBLAS_STATUS_ALLOC"))
                rec.update(status="oom" if alloc else "error", error=traceback.format_exc()[-3000:])
            if rec["status"] != "ok":
                if self.cuda:   # how far it got before failing
                    rec["peak_alloc_at_fail_gib"] = round(torch.cuda.max_memory_allocated() / GIB, 3)
                    rec["peak_reserved_at_fail_gib"] = round(torch.cuda.max_memory_reserved() / GIB, 3)
                if on_fail:
                    on_fail()
                free_memory()
            if after:
                rec.update(after())
        timed = [r for r in rec["runs"] if not r["warmup"]] or rec["runs"]
        if timed and rec["status"] == "ok":
            rec["time_s"] = round(statistics.median(r["time_s"] for r in timed), 4)
            if tokens and rec["time_s"] > 0:
                rec["tok_s"] = round(tokens / rec["time_s"], 1)
            if self.cuda:
                for k in ("peak_alloc_gib", "peak_reserved_gib"):
                    rec[k] = round(max(r[k] for r in rec["runs"]), 3)
                rec["resident_gib"] = round(rec["runs"][0]["resident_gib"], 3)
                rec["fits_target"] = rec["peak_reserved_gib"] <= TARGET_GIB
            grad_norm = rec.get("info", {}).get("grad_norm")
            if grad_norm is not None and not (grad_norm == grad_norm and abs(grad_norm) != float("inf")):
                rec["status"], rec["error"] = "nonfinite", f"grad_norm {grad_norm}"
        self.cases.append(rec)
        print(f"[bench] {name:12s} {rec['status']:8s} " + (
            f"{rec['time_s']:8.2f} s" if "time_s" in rec else "") + (
            f"  peak {rec['peak_alloc_gib']:.2f} / {rec['peak_reserved_gib']:.2f} GiB (alloc/reserved), "
            f"resident {rec['resident_gib']:.2f}" if "peak_reserved_gib" in rec else "") + (
            f"  {rec['tok_s']:.1f} tok/s" if "tok_s" in rec else "") + (
            f"  {rec['error'].strip().splitlines()[-1][:200]}" if rec.get("error") else ""), flush=True)
        return rec


# -----------------------------------------------------------------------------
# Report

def _fmt(v, spec=".2f"):
    return "-" if v is None else format(v, spec)


def render_markdown(result):
    """The results table (markdown) from the JSON this script writes."""
    hw, m, v = result["hardware"], result["model"], result["versions"]
    cap = hw.get("cap_gib")
    title = f"one {cap:g} GiB GPU" if cap else (hw.get("gpu") or "CPU (smoke run, no memory numbers)")
    lines = [f"# chorus-mini on {title}: {m['name']}" + (" (--no-upcast)" if m.get("no_upcast") else ""), "",
             f"- model: {m['source']}; {m['params'] / 1e9:.2f} B params; {m['quant']}; LoRA r={m['lora']['r']} "
             f"alpha={m['lora']['alpha']} on all linear layers ({m['trainable_params'] / 1e6:.1f} M trainable); "
             f"loaded in {_fmt(m.get('load_s'), '.0f')} s, {_fmt(m.get('resident_after_load_gib'))} GiB resident",
             f"- config: " + ", ".join(f"{k}={m['config'][k]}" for k in QWEN3_4B if k in m["config"]),
             f"- hardware: {hw.get('gpu') or 'CPU'}" + (f" ({hw['total_gib']} GiB), capped at {cap} GiB "
                                                         f"(fraction {hw['cap_fraction']}); mem_get_info reports the cap"
                                                         if cap else ""),
             f"- versions: " + ", ".join(f"{k} {val}" for k, val in v.items()),
             f"- commit: {result['git'].get('commit', '?')}{' (dirty)' if result['git'].get('dirty') else ''}; "
             f"total wall {result['wall_s']:.0f} s; target: every step <= {TARGET_GIB:.0f} GiB reserved", "",
             f"Command: `{result['command']}`", "",
             "| step | what | status | s/step | tok/s | peak alloc GiB | peak reserved GiB | resident GiB | <= 20 GiB |",
             "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | --- |"]
    for c in result["cases"]:
        if c["kind"] == "gen":
            continue
        peak_fail = (f" (reached {c['peak_reserved_at_fail_gib']:.2f})" if c.get("peak_reserved_at_fail_gib") is not None
                     and c["status"] == "oom" else "")
        lines.append(f"| {c['name']} | {c['what']} | {c['status']}{peak_fail} | {_fmt(c.get('time_s'))} | "
                     f"{_fmt(c.get('tok_s'), '.0f')} | {_fmt(c.get('peak_alloc_gib'))} | {_fmt(c.get('peak_reserved_gib'))} | "
                     f"{_fmt(c.get('resident_gib'))} | {'-' if c.get('fits_target') is None else ('yes' if c['fits_target'] else '**no**')} |")
    gen = {c["name"]: c for c in result["cases"] if c["kind"] == "gen"}
    batches = sorted({c["batch"] for c in gen.values()})
    S = result["sizes"]
    lines += ["", f"Generation: {S['gen_prompt']}-token prompt, {S['gen_new_tokens']} new tokens per sequence "
              "(stop rules off), temperature 1, active LoRA; fast path = fastgen.generate (static KV cache, "
              "CUDA graphs, 4-bit base dequantised once to bf16).", "",
              "| batch | HF tok/s | fast tok/s | fast / HF | fast 1st call s | HF peak GiB | fast peak GiB | status |",
              "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for b in batches:
        h, f = gen.get(f"gen_hf_b{b}", {}), gen.get(f"gen_fast_b{b}", {})
        ratio = f["tok_s"] / h["tok_s"] if h.get("tok_s") and f.get("tok_s") else None
        first = f["runs"][0]["time_s"] if f.get("runs") else None
        lines.append(f"| {b} | {_fmt(h.get('tok_s'), '.0f')} | {_fmt(f.get('tok_s'), '.0f')} | {_fmt(ratio, '.1f')} | "
                     f"{_fmt(first)} | {_fmt(h.get('peak_reserved_gib'))} | {_fmt(f.get('peak_reserved_gib'))} | "
                     f"HF {h.get('status', '-')}, fast {f.get('status', '-')} |")
    sm = result.get("smollm2")
    if sm:
        lines += ["", f"For comparison, bench/bench_generate.py on {sm.get('model')} ({sm.get('dtype')}, "
                  f"{sm.get('gpu')}, prompt {sm.get('prompt_tokens')} tokens):", "",
                  "| batch | HF tok/s | fast tok/s | fast / HF |", "| ---: | ---: | ---: | ---: |"]
        for r in sm.get("rows", []):
            lines.append(f"| {r['batch']} | {_fmt(r.get('hf_tok_s'), '.0f')} | {_fmt(r.get('fast_tok_s'), '.0f')} | "
                         f"{_fmt(r.get('speedup'), '.1f')} |")
    s = result["summary"]
    lines += ["", f"Summary: training steps within {TARGET_GIB:.0f} GiB: {s['train_fit']}; "
              f"fast/HF at batch {s['ratio_batch']}: {_fmt(s['fast_vs_hf'], '.1f')}x."]
    for n in result.get("notes", []):
        lines.append(f"- {n}")
    return "\n".join(lines) + "\n"


def versions():
    out = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda}
    for mod in ("transformers", "peft", "bitsandbytes", "accelerate"):
        try:
            out[mod] = __import__(mod).__version__
        except Exception as e:  # a missing package is shown, not fatal
            out[mod] = f"unavailable ({type(e).__name__})"
    return out


# -----------------------------------------------------------------------------
# Main

def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--out", default="results/bench_4b.json", help="JSON output path")
    p.add_argument("--tiny", action="store_true", help="toy shape on CPU, the same code paths (tests)")
    p.add_argument("--render", metavar="JSON", help="only print the markdown table of an earlier run's JSON")
    # Model
    p.add_argument("--model", default=None, help="an HF folder to load instead of the random 4B (e.g. a real Qwen3-4B)")
    p.add_argument("--ckpt-dir", default=None, help="keep/reuse the random checkpoint here (default: a temp dir, deleted)")
    p.add_argument("--cap-gib", type=float, default=24.0, help="emulated GPU size in GiB (0 = no cap)")
    p.add_argument("--no-upcast", action="store_true",
                   help="cast the non-4-bit base params (embedding/lm_head, norms) that peft's "
                        "prepare_model_for_kbit_training put in fp32 back to bf16: measures that fix")
    # Workload
    p.add_argument("--reps", type=int, default=None, help="timed runs per case after one warm-up (full: 2)")
    p.add_argument("--max-response", type=int, default=None, help="RL/OPD response tokens per row (full: 4096)")
    p.add_argument("--gen-batches", default=None, help="comma-separated batch sizes (full: 64,16,1)")
    p.add_argument("--skip", default="", help="comma-separated case names to skip (e.g. sft_nogc,dapo_nofast)")
    p.add_argument("--time-budget", type=float, default=420.0, help="seconds; later cases are skipped after it")
    p.add_argument("--smollm2-json", default=None, help="bench/bench_generate.py JSON to show beside (optional)")
    args = p.parse_args(argv)
    return args


def main(argv=None):
    args = parse_args(argv)
    if args.render:
        result = json.loads(Path(args.render).read_text())
        if args.smollm2_json:
            result["smollm2"] = json.loads(Path(args.smollm2_json).read_text())
        print(render_markdown(result), end="")
        return 0
    t_start = time.time()
    mode = "tiny" if args.tiny else "full"
    S = dict(SIZES[mode])
    if args.reps is not None:
        S["reps"] = args.reps
    if args.max_response is not None:
        S["max_response"] = args.max_response
    if args.gen_batches:
        S["gen_batches"] = tuple(int(b) for b in args.gen_batches.split(","))
    skip = {s for s in args.skip.split(",") if s}
    shape = TINY if args.tiny else QWEN3_4B
    device = "cpu" if args.tiny else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("bench_4b: no CUDA device; use --tiny for the CPU smoke run")
    if args.tiny:
        torch.set_num_threads(min(torch.get_num_threads(), 2))
    command = " ".join([Path(sys.executable).name, *sys.argv]) if argv is None else \
        " ".join(["python", "bench/bench_4b.py", *argv])
    print(f"[bench] {mode} run: {command}")
    hardware = {"gpu": None, "cpu_count": os.cpu_count()}
    if device == "cuda" and args.cap_gib > 0:
        hardware.update(cap_memory(args.cap_gib))
    elif device == "cuda":
        hardware.update(gpu=torch.cuda.get_device_name(), cap_gib=None)
    print(f"[bench] hardware: {hardware}")

    # 1. the model -------------------------------------------------------------------------
    tmp_dir = None
    folder = args.model
    t = time.time()
    if folder is None:
        folder = args.ckpt_dir or tempfile.mkdtemp(prefix="chorus_bench4b_")
        tmp_dir = None if args.ckpt_dir else folder
        if not (Path(folder) / "config.json").is_file():
            print(f"[bench] building a random {'tiny' if args.tiny else 'Qwen3-4B'}-shaped checkpoint in {folder}")
            build_checkpoint(folder, shape, device)
    build_s = time.time() - t
    try:
        t = time.time()
        model, tok = common.load_model(folder, quant="4bit", device=device)
        load_s = time.time() - t
    finally:
        if tmp_dir:
            shutil.rmtree(tmp_dir, ignore_errors=True)   # loaded: the 8 GB folder is not needed any more
    cfg = model.config
    n_params = count_params(cfg)
    footprint = model.get_memory_footprint()
    lora = {"r": 16, "alpha": 32, "dropout": 0.05, "target_modules": "all-linear"}
    model = common.add_lora(model, r=lora["r"], alpha=lora["alpha"], dropout=lora["dropout"])
    if args.no_upcast and device == "cuda":
        for p_ in model.parameters():
            if not p_.requires_grad and p_.dtype == torch.float32 and type(p_).__name__ != "Params4bit":
                p_.data = p_.data.to(torch.bfloat16)
        free_memory()
    if args.tiny:   # CPU only: bnb repacks Linear4bit for AVX512-BF16 at the first eval forward, after
        for m_ in model.modules():   # which its backward drops the input gradient (never on CUDA)
            if hasattr(m_, "support_avx512bf16_for_cpu"):
                m_.support_avx512bf16_for_cpu = False
    emb = model.get_input_embeddings().weight
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})  # rl.build_policy
    model.enable_input_require_grads()
    n_trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    dev = next(model.parameters()).device
    pad_id = tok.pad_token_id
    vocab = cfg.vocab_size
    resident = torch.cuda.memory_allocated() / GIB if dev.type == "cuda" else None
    model_info = {
        "name": "Qwen3-4B-Instruct-2507 shape (random weights)" if not args.model and not args.tiny else
        ("tiny Qwen3 shape (random weights)" if args.tiny else args.model),
        "source": f"random init, saved as a {'bf16' if device == 'cuda' else 'fp32'} HF folder, loaded by "
                  "common.load_model(quant='4bit')" if not args.model else f"common.load_model({args.model!r}, quant='4bit')",
        "config": {**{k: getattr(cfg, k, None) for k in shape if k != "rope_theta"}, "rope_theta": rope_theta_of(cfg),
                   "model_type": cfg.model_type, "use_sliding_window": getattr(cfg, "use_sliding_window", None)},
        "reference_qwen3_4b_instruct_2507": QWEN3_4B,
        "matches_reference": all((getattr(cfg, k, None) if k != "rope_theta" else rope_theta_of(cfg)) == v
                                 for k, v in QWEN3_4B.items()),
        "params": n_params, "quant": "nf4 + double quant, compute " + ("bf16" if device == "cuda" else "fp32"),
        "lora": lora, "trainable_params": n_trainable, "build_s": round(build_s, 1), "load_s": round(load_s, 1),
        "memory_footprint_gib": round(footprint / GIB, 3),
        "resident_after_load_gib": None if resident is None else round(resident, 3),
        "tokenizer_vocab": len(tok), "embedding_dtype": str(emb.dtype).replace("torch.", ""),
        "norm_dtype": str(model.get_base_model().model.norm.weight.dtype).replace("torch.", ""),
        "no_upcast": bool(args.no_upcast)}
    print(f"[bench] model: {n_params / 1e9:.3f} B params, {n_trainable / 1e6:.2f} M trainable, "
          f"footprint {footprint / GIB:.2f} GiB, loaded in {load_s:.0f} s (build {build_s:.0f} s)")

    bench = Bench(dev, args.time_budget, S["reps"], S["warmup"], skip)
    run = bench.case
    gen = torch.Generator().manual_seed(0)

    # 2. SFT ---------------------------------------------------------------------------------
    rows = sft_rows(gen, S["sft_grad_accum"], S["sft_prompt"], S["sft_target"], vocab)
    trainable = [p for p in model.parameters() if p.requires_grad]
    for p_ in trainable:                      # as sft.train_sft: optimizer math in fp32
        p_.data = p_.data.float()
    optimizer = torch.optim.AdamW(trainable, lr=2e-4, weight_decay=0.0)
    model.config.use_cache = False            # as sft.train_sft
    sft_tokens = S["sft_grad_accum"] * (S["sft_prompt"] + S["sft_target"])
    zero = lambda: optimizer.zero_grad(set_to_none=True)
    sft_what = (f"{S['sft_grad_accum']} micro-batches x 1 row x {S['sft_prompt'] + S['sft_target']} tok "
                f"({S['sft_target']} target), grad ckpt")
    run("sft", sft_what, make_sft_step(model, optimizer, rows, pad_id, dev), tokens=sft_tokens, on_fail=zero)
    model.gradient_checkpointing_disable()
    run("sft_nogc", sft_what.replace("grad ckpt", "no grad ckpt (sft.py default)"),
        make_sft_step(model, optimizer, rows, pad_id, dev), tokens=sft_tokens, reps=0, on_fail=zero)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    del optimizer, rows
    model.config.use_cache = True
    free_memory()

    # 3. RL: a rollout group on the fast path, then the DAPO update --------------------------
    rl.disable_dropout(model)                 # as rl.build_policy
    rows = rl_rows(gen, S, vocab)
    optimizer = rl.make_optimizer(model, 2e-5)
    zero = lambda: optimizer.zero_grad(set_to_none=True)
    G, R = S["group_size"], S["max_response"]
    prompt = rows[-1].prompt_ids              # the longer, round-2 prompt: the larger KV slot
    run("rollout", f"fast path, G={G} x {R} new tok, prompt {len(prompt)} (one round-2 group)",
        make_gen(model, tok, "fast", [prompt] * G, R), tokens=G * R, reps=1, kind="rollout",
        on_fail=lambda: drop_fast_state(model), after=lambda: {"fast_slots": fast_state_info(model)})
    rl_tokens = sum(len(r.prompt_ids) + len(r.completion_ids) for r in rows)
    dapo_what = (f"G={G} x 2 rounds = {len(rows)} rows, prompts {'/'.join(map(str, S['prompts']))} + {R} response, "
                 f"micro {S['max_tokens_per_micro']} tok, old-logp pass (spg={S['steps_per_generation']})")
    run("dapo", dapo_what + ", fast-path state resident", make_dapo_step(model, optimizer, rows, S, pad_id),
        tokens=rl_tokens, on_fail=zero, after=lambda: {"fast_slots": fast_state_info(model)})

    # 4. OPD: two frozen teacher adapters on the same base -----------------------------------
    teachers = ["teacher0", "teacher1"]
    adapter_dir = tempfile.mkdtemp(prefix="chorus_bench4b_adapter_")
    try:
        common.save_adapter(model, os.path.join(adapter_dir, "student"))
        for i, name in enumerate(teachers):   # as distill.build_models
            common.load_adapter(model, os.path.join(adapter_dir, "student"), adapter_name=name, trainable=False)
            with torch.no_grad():              # teachers differ from the student a little
                tg = torch.Generator().manual_seed(100 + i)
                for n_, p_ in model.named_parameters():
                    if f"lora_B.{name}." in n_:
                        p_.add_((torch.randn(p_.shape, generator=tg) * 1e-3).to(p_.device, p_.dtype))
    finally:
        shutil.rmtree(adapter_dir, ignore_errors=True)
    model.set_adapter("default")
    rl.disable_dropout(model)
    model_info["trainable_params_with_teachers"] = sum(p.numel() for p in model.parameters() if p.requires_grad)
    del optimizer
    optimizer = rl.make_optimizer(model, 2e-5)
    zero = lambda: optimizer.zero_grad(set_to_none=True)
    run("opd", f"2 teachers x {G} rows: distill_advantages (student+teacher no-grad, top-{S['topk']}), "
        f"then train_on_batch on {len(rows)} rows, fast-path state resident",
        make_opd_step(model, optimizer, rows, teachers, S, pad_id), tokens=rl_tokens, on_fail=zero)
    drop_fast_state(model)
    run("dapo_nofast", dapo_what + ", fast-path state released", make_dapo_step(model, optimizer, rows, S, pad_id),
        tokens=rl_tokens, on_fail=zero)
    run("opd_nofast", "the opd step, fast-path state released",
        make_opd_step(model, optimizer, rows, teachers, S, pad_id), tokens=rl_tokens, on_fail=zero)
    del optimizer, rows
    free_memory()

    # 5. generation: HF generate vs the fast path -------------------------------------------
    model.eval()
    prompt = random_ids(gen, S["gen_prompt"], vocab)
    N = S["gen_new_tokens"]
    for B in S["gen_batches"]:
        prompts = [prompt] * B
        run(f"gen_hf_b{B}", f"HF generate, batch {B} x {N} new tok (warm-up: 16 tok)",
            make_gen(model, tok, "hf", prompts, N), tokens=B * N, kind="gen", batch=B,
            warmup_fn=make_gen(model, tok, "hf", prompts, min(N, 16)))
        run(f"gen_fast_b{B}", f"fast path, batch {B} x {N} new tok (warm-up = 1st call: pack + graph capture)",
            make_gen(model, tok, "fast", prompts, N), tokens=B * N, kind="gen", batch=B,
            on_fail=lambda: drop_fast_state(model), after=lambda: {"fast_slots": fast_state_info(model)})
    drop_fast_state(model)

    # 6. JSON + table ------------------------------------------------------------------------
    train = [c for c in bench.cases if c["kind"] == "train"]
    gens = {c["name"]: c for c in bench.cases if c["kind"] == "gen"}
    ratio_batch = max(S["gen_batches"])
    h, f = gens.get(f"gen_hf_b{ratio_batch}", {}), gens.get(f"gen_fast_b{ratio_batch}", {})
    summary = {
        "train_fit": ("n/a (CPU)" if dev.type != "cuda" else
                      ", ".join(f"{c['name']} {'yes' if c.get('fits_target') else c['status'] if c['status'] != 'ok' else 'no'}"
                                for c in train)),
        "max_train_peak_reserved_gib": max((c["peak_reserved_gib"] for c in train if "peak_reserved_gib" in c), default=None),
        "ratio_batch": ratio_batch,
        "fast_vs_hf": round(f["tok_s"] / h["tok_s"], 2) if h.get("tok_s") and f.get("tok_s") else None}
    notes = [
        "peaks are torch allocator numbers (max over warm-up and timed runs); a real 24 GB card also holds the "
        "CUDA context (~0.5 GiB) outside them, hence the 20 GiB target",
        "resident = memory allocated when the step starts: the 4-bit base, the fp32 embedding that "
        "peft's prepare_model_for_kbit_training makes, LoRA + optimizer state, and (dapo/opd) the fast "
        "decoder's bf16 weights + KV slot that rl.py/distill.py keep between rollouts and updates",
        "responses are all at the cap and every gate is open: the worst case for memory",
        f"non-4-bit base params after common.add_lora: embedding {model_info['embedding_dtype']}, norms "
        f"{model_info['norm_dtype']} (peft's prepare_model_for_kbit_training upcasts them to fp32, which makes the "
        "residual stream, checkpointed activations and HF generate's KV cache fp32; --no-upcast measures the fix)",
        "sft_nogc runs once (no timed repeat): it shows whether sft.py's default (no gradient checkpointing) fits",
    ]
    result = {"bench": "bench_4b", "mode": mode, "command": command,
              "started_at": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t_start)),
              "wall_s": round(time.time() - t_start, 1), "hardware": hardware, "versions": versions(),
              "git": common.git_info(), "env": {k: os.environ.get(k) for k in ("PYTORCH_CUDA_ALLOC_CONF", "CUDA_VISIBLE_DEVICES")},
              "model": model_info, "sizes": {k: list(v) if isinstance(v, tuple) else v for k, v in S.items()},
              "cases": bench.cases, "summary": summary, "notes": notes}
    if args.smollm2_json and Path(args.smollm2_json).is_file():
        result["smollm2"] = json.loads(Path(args.smollm2_json).read_text())
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print(f"[bench] wrote {out}\n")
    print(render_markdown(result), end="")
    return 1 if any(c["status"] in ("error", "nonfinite") for c in bench.cases) else 0


if __name__ == "__main__":
    raise SystemExit(main())
