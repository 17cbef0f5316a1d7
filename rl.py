"""Execution-guided RL (DAPO) on a LoRA adapter: turns one SFT checkpoint into an expert (method.md §4).

    python rl.py --model M --adapter runs/sft0/adapter --tasks TASKS.jsonl --out runs/rl0 --profile small
    python rl.py --model tiny --tasks TASKS.jsonl --out /tmp/rl --steps 2      # CPU smoke run
    python rl.py ... --resume                                                 # continue a killed run

Algorithm, per step (one optimizer update per rollout batch by default):
 1. Take P prompts from a seeded permutation of the tasks (indexed by a data cursor, so a resumed
    run sees the same prompts).
 2. Round 1: G samples per prompt from the initial prompt (temperature 1.0). Round 2: the WORST
    round-1 sample (reward, ties broken by coverage) plus its scorer feedback becomes the
    memoryless state (common.refine_messages); G more samples. Each round is its own group.
    Simulation of one chunk of prompts overlaps the generation of the next (sim.SimPool).
 3. Reward R = 1 + coverage (0..1) when the testbench parses, compiles and runs with coverage,
    else 0 (sim.reward; unparseable answers get 0 without simulating).
 4. Advantage A = (R - mean_group) / (std_group + 1e-6), std with unbiased=False, same for every
    token of the sample (compute_advantages).
 5. Loss: PPO clipped ratio with clip-higher (eps_low 0.2, eps_high 0.28), summed over every
    completion token of the batch and divided by the batch's token count (DAPO token-level
    aggregation), no KL, no entropy bonus (dapo_loss). Old log-probs are recomputed by the trainer
    with the weights that sampled; logits are divided by the sampling temperature first.
 6. Adam (betas 0.9/0.95, weight decay 0), constant LR, gradient clipping at 1.0.
Options (off in --profile paper, the paper's setting): dynamic sampling (drop groups whose rewards
have zero variance and refill from extra prompts, up to a cap), DAPO's soft overlong punishment,
and a k3 KL penalty to the initial adapter. The zero-variance group fraction is logged either way.

Where this deviates from the paper (CHORUS trained full weights with slime on 2x H100):
 - LoRA adapter (optionally on a 4-bit base) instead of full weights. The LR is therefore a flag
   whose default (2e-5) is larger than the paper's 1e-6 full fine-tune; choose it by experiment.
 - The Icarus coverage scorer (sim.py) instead of Xcelium/IMC.
 - Dropout is switched off in the adapter so that the recomputed old log-probs equal the new ones
   at the first update (TRL does the same by default).
 - Run length, batch and response cap come from the profile (the paper: 2 prompts x 2 rounds x 4
   samples, 16k-token responses, 1000 updates).

Public pieces other scripts import (distill.py; import them, don't copy):
 rollouts    Score, Sample, Group, worst_sample, two_round_rollouts, sim_score_fn, make_model_source,
             collect_groups (+ dynamic sampling), overlong_penalty, task_order, derive_seed
 objective   compute_advantages, dapo_loss, k3_kl
 log-probs   per_token_logps -> TokenLogps (sampled-token log-probs, entropy, top-K ids/log-probs,
             or log-probs at given ids for a teacher), use_adapter (borrow another adapter)
 training    train_on_batch (per-sequence or per-token advantages, norm_groups), make_optimizer,
             build_policy, disable_dropout, micro_batches
 bookkeeping save_checkpoint / load_checkpoint / latest_checkpoint, rng_state / set_rng_state,
             append_log, plot_log, rollout_metrics, run(args, source=..., score_fn=..., tasks=...)
"""
import argparse
import base64
import contextlib
import hashlib
import json
import math
import os
import random
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

# -----------------------------------------------------------------------------
# Profiles: the values an option takes when its flag is not given on the command line.

PROFILES = {
    # The paper's RL objective: no dynamic sampling, no overlong shaping, no KL (method.md §4.5).
    "paper": {"dynamic_sampling": False, "overlong_buffer": 0, "kl_beta": 0.0, "max_new_tokens": 16384},
    # Small runs: a weak model produces many all-zero groups, so dynamic sampling refills them.
    "small": {"dynamic_sampling": True, "overlong_buffer": 0, "kl_beta": 0.0, "max_new_tokens": 1024},
}


def derive_seed(*parts):
    """A stable 31-bit seed from any printable parts, e.g. (seed, "gen", step, round, task_index).
    (Python's hash() is salted per process, so it cannot be used for reproducible runs.)"""
    digest = hashlib.sha256(repr(parts).encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


def task_order(cursor, n_tasks, seed):
    """Index of the task at data cursor position `cursor`: epoch e = cursor // n uses its own seeded
    permutation, so the order depends only on (seed, cursor) and a resumed run repeats it."""
    epoch, pos = divmod(cursor, n_tasks)
    perm = np.random.default_rng(derive_seed(seed, "data", epoch)).permutation(n_tasks)
    return int(perm[pos])


# -----------------------------------------------------------------------------
# Rollouts: two rounds per prompt, each its own group

@dataclass
class Score:
    """What the trainer needs from the scorer for one sample."""
    reward: float                  # sim.reward: 1 + coverage, or 0
    status: str                    # SimResult.status, or "parse_error" (never simulated)
    coverage: float | None = None  # overall coverage 0..1 (partial metrics kept for failures)
    passed: bool = False           # all coverage targets met
    compile_ok: bool = False
    parsed: bool = False
    result: object = None          # the SimResult (None when the answer did not parse)


@dataclass
class Sample:
    task_id: str
    round: int                     # 1 or 2
    messages: list                 # the prompt messages the sample was drawn from
    text: str
    prompt_ids: list
    completion_ids: list
    truncated: bool
    score: Score
    reward: float = 0.0            # the reward the advantage sees (score.reward + overlong shaping)


@dataclass
class Group:
    """G samples of one prompt state; the unit of the GRPO advantage."""
    index: int                     # data cursor position of the task
    task_id: str
    round: int
    samples: list = field(default_factory=list)

    @property
    def rewards(self):
        return [s.reward for s in self.samples]


def worst_sample(samples):
    """The round-2 pivot: lowest reward; ties broken by lower coverage (unparsed / no coverage
    counts as below 0%), then by the first index."""
    def badness(i):
        s = samples[i].score
        return (s.reward, -1.0 if s.coverage is None else s.coverage, i)
    return samples[min(range(len(samples)), key=badness)]


def two_round_rollouts(tasks, *, generate_fn, score_fn, num_generations, seed_fn, first_index=0,
                       rounds=2, chunk_size=1, build_fn=None, refine_fn=None):
    """Sample and score `rounds` groups per task. Returns (groups, timings).

    generate_fn(messages_list, seed) -> list of objects with .text, .prompt_ids, .completion_ids,
        .truncated (common.Completion); one completion per entry.
    score_fn(task, completion) -> a zero-argument callable that waits for and returns a Score
        (so the simulation of one chunk runs while the next chunk generates).
    seed_fn(round, task_index) -> the generation seed of a chunk whose first task has that index.
    Tasks are processed in chunks of `chunk_size` prompts in the order R1(0), R1(1), R2(0), R1(2),
    R2(1), ..., so each chunk's round-1 simulation overlaps the next chunk's round-1 generation.
    Groups come back in task order, round 1 before round 2 for each task.
    """
    if build_fn is None or refine_fn is None:
        import common
        build_fn = build_fn or common.build_messages
        refine_fn = refine_fn or common.refine_messages
    G = num_generations
    chunks = [list(range(i, min(i + chunk_size, len(tasks)))) for i in range(0, len(tasks), chunk_size)]
    pending = {}                                   # (task position, round) -> [(Sample, wait)]
    timings = {"t_gen": 0.0, "t_sim": 0.0}

    def launch(chunk, rnd):
        messages_list = []
        for t in chunk:
            if rnd == 1:
                msgs = build_fn(tasks[t])
            else:
                worst = worst_sample(finish(t, rnd - 1))
                msgs = refine_fn(tasks[t], worst.text, worst.score.result)
            messages_list += [msgs] * G
        t0 = time.perf_counter()
        completions = generate_fn(messages_list, seed_fn(rnd, first_index + chunk[0]))
        timings["t_gen"] += time.perf_counter() - t0
        for j, t in enumerate(chunk):
            entry = []
            for c, msgs in zip(completions[j * G:(j + 1) * G], messages_list[j * G:(j + 1) * G]):
                sample = Sample(tasks[t].get("id", str(t)), rnd, msgs, c.text, list(c.prompt_ids),
                                list(c.completion_ids), bool(c.truncated), None)
                entry.append((sample, score_fn(tasks[t], c)))
            pending[(t, rnd)] = entry

    def finish(t, rnd):
        """Wait for the scores of (task, round); returns its samples."""
        entry = pending[(t, rnd)]
        t0 = time.perf_counter()
        for sample, wait in entry:
            if sample.score is None:
                sample.score = wait()
                sample.reward = sample.score.reward
        timings["t_sim"] += time.perf_counter() - t0
        return [s for s, _ in entry]

    # R1(0), then for each next chunk: R1(c) and R2(c-1) — a one-deep pipeline.
    for c, chunk in enumerate(chunks):
        launch(chunk, 1)
        for rnd in range(2, rounds + 1):
            if c >= 1:
                launch(chunks[c - 1], rnd)
    for rnd in range(2, rounds + 1):
        if chunks:
            launch(chunks[-1], rnd)
    groups = []
    for t in range(len(tasks)):
        for rnd in range(1, rounds + 1):
            groups.append(Group(first_index + t, tasks[t].get("id", str(t)), rnd, finish(t, rnd)))
    return groups, timings


def sim_score_fn(pool, target_mode="icarus"):
    """score_fn for two_round_rollouts backed by sim.SimPool. Unparseable answers (no code block,
    or a code block cut off by the token cap) get reward 0 without simulating."""
    import common
    import sim

    def score(task, completion):
        answer = common.parse_answer(completion.text)
        if answer.reason not in ("ok", "no_filename"):
            s = Score(0.0, "parse_error")
            return lambda: s
        future = pool.submit(sim.job_from_task(task, answer.code, target_mode=target_mode))

        def wait():
            r = future.result()
            cov = None if r.overall_pct is None else r.overall_pct / 100.0
            return Score(float(sim.reward(r)), r.status, cov, bool(r.passed), bool(r.compile_ok), True, r)
        return wait
    return score


def make_model_source(score_fn, *, num_generations, max_new_tokens, seed, rounds=2, chunk_size=1,
                      temperature=1.0, gen_batch_size=64, release_fast=False):
    """The real rollout source: the policy generates (common.generate, fast path on CUDA), the
    scorer rewards. Returns source(model, tok, tasks, *, step, first_index) -> (groups, timings).
    Generation seeds derive from (seed, step, round, task index), so a resumed run repeats them.
    release_fast drops the fast decoder's packed weights and KV cache after each step's rollouts, so
    the training phase gets that memory back (needed on 24 GB cards; costs a re-pack per step)."""
    import common

    def source(model, tok, tasks, *, step, first_index):
        def generate_fn(messages_list, call_seed):
            model.eval()
            return common.generate(model, tok, messages_list, max_new_tokens=max_new_tokens,
                                   temperature=temperature, top_p=1.0, seed=call_seed,
                                   batch_size=gen_batch_size)
        out = two_round_rollouts(
            tasks, generate_fn=generate_fn, score_fn=score_fn, num_generations=num_generations,
            seed_fn=lambda rnd, idx: derive_seed(seed, "gen", step, rnd, idx),
            first_index=first_index, rounds=rounds, chunk_size=chunk_size)
        if release_fast:
            common.free_fast_cache(model)
        return out
    return source


def release_fast_default(flag):
    """--release-fast default: on when the GPU has under 40 GiB (a 24 GB card cannot hold the fast
    decoder's packed weights + KV cache and the training activations at once), off elsewhere."""
    if flag is not None:
        return flag
    return torch.cuda.is_available() and torch.cuda.get_device_properties(0).total_memory < 40 * 2**30


def overlong_penalty(length, max_len, buffer):
    """DAPO's soft overlong punishment: 0 up to max_len - buffer tokens, then falling linearly to -1
    at max_len (and -1 beyond). buffer = 0 switches it off."""
    if buffer <= 0 or length <= max_len - buffer:
        return 0.0
    return max(-1.0, (max_len - buffer - length) / buffer)


# -----------------------------------------------------------------------------
# Advantages and the loss (pure tensor functions)

def compute_advantages(rewards, num_generations):
    """GRPO advantage per sample: (r - mean_group) / (std_group + 1e-6), groups of num_generations
    consecutive rewards, std with unbiased=False. A zero-variance group gets advantage 0."""
    rewards = torch.as_tensor(rewards, dtype=torch.float32)
    grouped = rewards.view(-1, num_generations)                         # (groups, G)
    mean_grouped_rewards = grouped.mean(dim=1, keepdim=True)
    std_rewards = grouped.std(dim=1, unbiased=False, keepdim=True)
    return ((grouped - mean_grouped_rewards) / (std_rewards + 1e-6)).view(-1)


def dapo_loss(per_token_logps, old_per_token_logps, advantages, completion_mask,
              epsilon_low=0.2, epsilon_high=0.28, num_items=None, per_token_kl=None, beta=0.0):
    """Clipped policy-gradient loss with clip-higher and token-level aggregation.

    per_token_logps, old_per_token_logps, completion_mask: (B, T). advantages: (B,) per sequence
    or (B, T) per token. num_items: the normaliser, i.e. the number of completion tokens of the
    WHOLE batch that one optimizer step covers (default: this mask's count). Passing the global
    count makes micro-batched gradient accumulation equal the full-batch loss. A (B,) tensor gives
    each row its own normaliser (distill.py averages RL and OPD tokens separately).
    per_token_kl with weight beta is added per token (0 = no KL, the paper).
    Returns (loss, stats); stats are token means over this mask.
    """
    mask = completion_mask.to(per_token_logps.dtype)
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(1)                            # (B, 1) -> every token
    log_ratio = per_token_logps - old_per_token_logps
    ratio = torch.exp(log_ratio)
    clipped_ratio = torch.clamp(ratio, 1 - epsilon_low, 1 + epsilon_high)
    per_token_loss = -torch.min(ratio * advantages, clipped_ratio * advantages)
    if per_token_kl is not None and beta != 0.0:
        per_token_loss = per_token_loss + beta * per_token_kl
    if num_items is None:
        num_items = mask.sum().clamp(min=1.0)
    if torch.is_tensor(num_items) and num_items.dim() == 1:
        num_items = num_items.unsqueeze(1)                              # per-row normaliser
    # DAPO token-level aggregation: one sum over all tokens / one token count (long answers weigh
    # by their length, unlike GRPO's per-sequence mean).
    loss = (per_token_loss * mask / num_items).sum()
    with torch.no_grad():
        n = mask.sum().clamp(min=1.0)
        is_low_clipped = (ratio < 1 - epsilon_low) & (advantages < 0)
        is_high_clipped = (ratio > 1 + epsilon_high) & (advantages > 0)
        stats = {
            "clip_ratio/low": float((is_low_clipped * mask).sum() / n),
            "clip_ratio/high": float((is_high_clipped * mask).sum() / n),
            "ratio": float((ratio * mask).sum() / n),
            "num_tokens": int(mask.sum()),
        }
        if per_token_kl is not None:
            stats["kl"] = float((per_token_kl * mask).sum() / n)
    return loss, stats


def k3_kl(per_token_logps, ref_per_token_logps):
    """Per-token KL(policy || ref) with Schulman's k3 estimator: exp(d) - d - 1, d = ref - policy."""
    d = ref_per_token_logps - per_token_logps
    return torch.exp(d) - d - 1


# -----------------------------------------------------------------------------
# Token log-probs, memory-efficiently

def _split_model(model):
    """(decoder, lm_head) of a causal LM, peft-wrapped or not: the decoder returns final hidden
    states, so the full (B, L, V) logits are never built."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    decoder = base.get_decoder() if hasattr(base, "get_decoder") else base.model
    return decoder, base.get_output_embeddings()


def _autocast(device):
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


@dataclass
class TokenLogps:
    logps: torch.Tensor                     # (B, T) log-prob of each sampled completion token
    mask: torch.Tensor                      # (B, T) 1 on real completion tokens
    entropy: torch.Tensor | None = None     # (B, T) policy entropy at each position (detached)
    topk_ids: torch.Tensor | None = None    # (B, T, K) the K most likely token ids (detached)
    topk_logps: torch.Tensor | None = None  # (B, T, K) log-probs at topk_ids (or at gather_ids)


def per_token_logps(model, rows, *, temperature=1.0, chunk_tokens=1024, pad_token_id=0,
                    entropy=False, topk=0, gather_ids=None):
    """Log-probs of the completion tokens under the model's active adapter.

    rows: objects with .prompt_ids and .completion_ids (or (prompt_ids, completion_ids) pairs).
    The decoder runs once; then for chunks of `chunk_tokens` completion positions the lm_head
    logits are built, divided by the sampling temperature, and reduced to
    logit[token] - logsumexp(logits). Each chunk runs under activation checkpointing when grads
    are on, so at most one chunk of (chunk_tokens, V) fp32 logits exists at a time, forward or
    backward. Gradients flow when torch.is_grad_enabled().
    entropy: also return the per-token entropy (cheap: the chunk's softmax is already there).
    topk: also return the K most likely ids and their log-probs (distillation's top-K support).
    gather_ids (B, T, K): return log-probs at these ids instead (score a teacher on the student's
    top-K). Returns TokenLogps.
    """
    rows = [(r.prompt_ids, r.completion_ids) if hasattr(r, "prompt_ids") else r for r in rows]
    decoder, lm_head = _split_model(model)
    device = lm_head.weight.device
    B = len(rows)
    P = torch.tensor([len(p) for p, _ in rows])
    C = torch.tensor([len(c) for _, c in rows])
    L, T = int((P + C).max()), max(int(C.max()), 1)
    input_ids = torch.full((B, L), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((B, L), dtype=torch.long)
    targets = torch.zeros((B, T), dtype=torch.long)
    for i, (p, c) in enumerate(rows):
        input_ids[i, :len(p) + len(c)] = torch.tensor(list(p) + list(c), dtype=torch.long)
        attention_mask[i, :len(p) + len(c)] = 1
        targets[i, :len(c)] = torch.tensor(list(c), dtype=torch.long)
    mask = torch.arange(T)[None, :] < C[:, None]                        # (B, T)
    # the logits at position p-1+j predict completion token j (right padding keeps positions exact)
    positions = ((P - 1).clamp(min=0)[:, None] + torch.arange(T)[None, :]).clamp(max=L - 1)
    input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)
    mask, targets, positions = mask.to(device), targets.to(device), positions.to(device)

    with _autocast(device):
        hidden = decoder(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state
    H = hidden.shape[-1]
    hidden = hidden.gather(1, positions[:, :, None].expand(-1, -1, H))  # (B, T, H)
    flat_hidden, flat_targets = hidden[mask], targets[mask]            # (N, H), (N,)
    flat_gather = gather_ids.to(device)[mask] if gather_ids is not None else None  # (N, K)

    def chunk_fn(h, tgt, ids):
        with _autocast(device):
            logits = lm_head(h)
        logits = logits.float() / temperature                          # (n, V)
        lse = torch.logsumexp(logits, dim=-1)
        logp = logits.gather(-1, tgt[:, None]).squeeze(-1) - lse
        extra = []
        with torch.no_grad():
            if entropy:
                probs = torch.softmax(logits, dim=-1)
                extra.append(lse - (probs * logits).sum(-1))
        if ids is not None:
            extra.append(logits.gather(-1, ids) - lse[:, None])
        elif topk:
            top = logits.detach().topk(topk, dim=-1)
            extra += [top.indices, top.values - lse.detach()[:, None]]
        return (logp, *extra)

    outs = []
    use_ckpt = torch.is_grad_enabled() and flat_hidden.requires_grad
    for s in range(0, flat_hidden.shape[0], chunk_tokens):
        args = (flat_hidden[s:s + chunk_tokens], flat_targets[s:s + chunk_tokens],
                None if flat_gather is None else flat_gather[s:s + chunk_tokens])
        if use_ckpt:
            outs.append(torch.utils.checkpoint.checkpoint(chunk_fn, *args, use_reentrant=False))
        else:
            outs.append(chunk_fn(*args))

    def unflatten(k, shape_tail=(), dtype=torch.float32):
        full = torch.zeros((B, T) + shape_tail, dtype=dtype, device=device)
        if outs:
            vals = torch.cat([o[k] for o in outs])
            full = full.masked_scatter(mask.view(B, T, *([1] * len(shape_tail))).expand_as(full), vals.to(dtype))
        return full

    res = TokenLogps(unflatten(0), mask)
    k = 1
    if entropy:
        res.entropy, k = unflatten(k), k + 1
    if gather_ids is not None:
        res.topk_logps = unflatten(k, (gather_ids.shape[-1],))
    elif topk:
        res.topk_ids = unflatten(k, (topk,), torch.long)
        res.topk_logps = unflatten(k + 1, (topk,))
    return res


@contextlib.contextmanager
def use_adapter(model, name):
    """Run a block under another adapter of the same peft model (name=None: the bare base model),
    then restore the active one. The trainable adapter stays trainable afterwards."""
    if name is None:
        with model.disable_adapter():
            yield
        return
    active = model.active_adapter
    model.set_adapter(name, inference_mode=True)     # frozen while borrowed
    try:
        yield
    finally:
        model.set_adapter(active)                    # peft makes the restored adapter trainable


def disable_dropout(model):
    """p = 0 in every Dropout (LoRA's included): old and new log-probs must agree before an update."""
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0


# -----------------------------------------------------------------------------
# The training step

def micro_batches(rows, max_tokens):
    """Consecutive row-index lists whose padded size (rows x longest row) stays under max_tokens
    (a single longer row goes alone)."""
    batches, cur, cur_max = [], [], 0
    for i, r in enumerate(rows):
        n = len(r.prompt_ids) + len(r.completion_ids)
        if cur and max(cur_max, n) * (len(cur) + 1) > max_tokens:
            batches.append(cur)
            cur, cur_max = [], 0
        cur.append(i)
        cur_max = max(cur_max, n)
    if cur:
        batches.append(cur)
    return batches


def _row_advantages(adv, n_tokens):
    a = torch.as_tensor(adv, dtype=torch.float32)
    return a.expand(n_tokens).clone() if a.dim() == 0 else a.reshape(-1)[:n_tokens]


def train_on_batch(model, optimizer, rows, advantages, *, temperature=1.0, epsilon_low=0.2,
                   epsilon_high=0.28, max_grad_norm=1.0, max_tokens_per_micro=16384,
                   steps_per_generation=1, beta=0.0, ref_adapter=None, norm_groups=None,
                   pad_token_id=0, chunk_tokens=1024):
    """One rollout batch of clipped policy-gradient updates. Returns a dict of diagnostics.

    rows: objects with .prompt_ids and .completion_ids (Sample, common.Completion, ...).
    advantages: one entry per row, a scalar (GRPO: the same for every token) or a 1-D sequence
        of per-token advantages (distillation).
    steps_per_generation: the batch is split into this many mini-batches, each one optimizer step
        (the first sees ratio 1; later ones are clipped against the old log-probs, which are
        computed once, before any update, by the weights that sampled). Within a mini-batch,
        micro-batches of at most max_tokens_per_micro padded tokens accumulate gradients, and the
        loss is normalised by the mini-batch's total completion-token count (not per micro-batch).
    beta > 0: add beta * k3 KL to ref_adapter (None = the base model without adapters).
    norm_groups: an optional label per row; the loss is then the sum over labels of each label's
        token mean (slime averages RL and OPD tokens separately).
    """
    device = next(p for p in model.parameters() if p.requires_grad).device
    n_rows = len(rows)
    norm_groups = list(norm_groups) if norm_groups is not None else [0] * n_rows
    adv_rows = [_row_advantages(a, len(r.completion_ids)) for a, r in zip(advantages, rows)]
    params = [p for g in optimizer.param_groups for p in g["params"]]
    totals = {"loss": 0.0, "clip_ratio/low": 0.0, "clip_ratio/high": 0.0, "ratio": 0.0,
              "entropy": 0.0, "kl": 0.0, "num_tokens": 0}
    grad_norms = []
    model.train()

    # Old log-probs, recomputed here. With one optimizer step per batch they equal the new ones
    # numerically, so we take new.detach() instead of a second forward (TRL does the same).
    old = None
    if steps_per_generation > 1:
        old = [None] * n_rows
        with torch.no_grad():
            for mb in micro_batches(rows, max_tokens_per_micro):
                out = per_token_logps(model, [rows[i] for i in mb], temperature=temperature,
                                      pad_token_id=pad_token_id, chunk_tokens=chunk_tokens)
                for j, i in enumerate(mb):
                    old[i] = out.logps[j, :len(rows[i].completion_ids)]

    order = list(range(n_rows))
    per_step = math.ceil(n_rows / steps_per_generation) if n_rows else 0
    for s in range(steps_per_generation):
        mini = order[s * per_step:(s + 1) * per_step]
        if not mini:
            continue
        # one normaliser per label: that label's completion-token count over the mini-batch
        counts = {}
        for i in mini:
            counts[norm_groups[i]] = counts.get(norm_groups[i], 0) + len(rows[i].completion_ids)
        optimizer.zero_grad(set_to_none=True)
        all_zero = beta == 0.0 and all(bool((adv_rows[i] == 0).all()) for i in mini)
        if not all_zero:   # all-zero advantages give an exactly zero gradient: skip the passes
            mb_list = micro_batches([rows[i] for i in mini], max_tokens_per_micro)
            for mb in mb_list:
                idx = [mini[j] for j in mb]
                mb_rows = [rows[i] for i in idx]
                ref = None
                if beta != 0.0:
                    with torch.no_grad(), use_adapter(model, ref_adapter):
                        ref = per_token_logps(model, mb_rows, temperature=temperature,
                                              pad_token_id=pad_token_id, chunk_tokens=chunk_tokens).logps
                out = per_token_logps(model, mb_rows, temperature=temperature, entropy=True,
                                      pad_token_id=pad_token_id, chunk_tokens=chunk_tokens)
                B, T = out.logps.shape
                adv = torch.zeros((B, T), device=device)
                old_logps = out.logps.detach().clone()
                for j, i in enumerate(idx):
                    n = len(rows[i].completion_ids)
                    adv[j, :n] = adv_rows[i].to(device)
                    if old is not None:
                        old_logps[j, :n] = old[i]
                num_items = torch.tensor([float(max(counts[norm_groups[i]], 1)) for i in idx], device=device)
                kl = k3_kl(out.logps, ref) if ref is not None else None
                loss, stats = dapo_loss(out.logps, old_logps, adv, out.mask, epsilon_low, epsilon_high,
                                        num_items=num_items, per_token_kl=kl, beta=beta)
                loss.backward()
                n_tok = stats["num_tokens"]
                totals["loss"] += float(loss.detach())
                totals["num_tokens"] += n_tok
                for k in ("clip_ratio/low", "clip_ratio/high", "ratio", "kl"):
                    totals[k] += stats.get(k, 0.0) * n_tok
                totals["entropy"] += float((out.entropy * out.mask).sum())
        else:
            for p in params:
                p.grad = torch.zeros_like(p)
        grad_norms.append(float(torch.nn.utils.clip_grad_norm_(params, max_grad_norm)))
        optimizer.step()
    n = max(totals["num_tokens"], 1)
    stats = {k: (v / n if k not in ("loss", "num_tokens") else v) for k, v in totals.items()}
    if totals["num_tokens"] == 0:        # nothing was computed: no entropy / clip numbers
        for k in ("clip_ratio/low", "clip_ratio/high", "ratio", "entropy", "kl"):
            stats[k] = float("nan")
    stats["grad_norm"] = max(grad_norms) if grad_norms else 0.0
    return stats


def make_optimizer(model, lr, weight_decay=0.0, betas=(0.9, 0.95)):
    """AdamW over the trainable (adapter) parameters, in named order (the checkpoint relies on it)."""
    params = [p for _, p in model.named_parameters() if p.requires_grad]
    return torch.optim.AdamW(params, lr=lr, betas=betas, weight_decay=weight_decay)


# -----------------------------------------------------------------------------
# Checkpoints: OUT/ckpt/step_000010/{adapter/, optimizer.pt, meta.json}

def _b64(t):
    return base64.b64encode(t.cpu().numpy().tobytes()).decode()


def _unb64(s):
    return torch.from_numpy(np.frombuffer(base64.b64decode(s), dtype=np.uint8).copy())


def rng_state():
    np_state = np.random.get_state()
    return {
        "python": [random.getstate()[0], list(random.getstate()[1]), random.getstate()[2]],
        "numpy": [np_state[0], np_state[1].tolist(), int(np_state[2]), int(np_state[3]), float(np_state[4])],
        "torch": _b64(torch.get_rng_state()),
        "cuda": [_b64(s) for s in torch.cuda.get_rng_state_all()] if torch.cuda.is_available() else [],
    }


def set_rng_state(state):
    py = state["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    npst = state["numpy"]
    np.random.set_state((npst[0], np.array(npst[1], dtype=np.uint32), npst[2], npst[3], npst[4]))
    torch.set_rng_state(_unb64(state["torch"]))
    if state.get("cuda") and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([_unb64(s) for s in state["cuda"]])


def save_checkpoint(ckpt_dir, step, model, optimizer, meta, keep_last=0):
    """Write OUT/ckpt/step_{step:06d} atomically (a temp folder renamed last, so a folder with the
    final name is always complete). The adapter folder is the standard peft one (bf16, via
    common.save_adapter); optimizer.pt also holds the exact trainable weights, so that --resume
    continues bit-for-bit rather than from bf16-rounded weights."""
    import common
    ckpt_dir = Path(ckpt_dir)
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    final = ckpt_dir / f"step_{step:06d}"
    tmp = ckpt_dir / f".tmp_step_{step:06d}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    common.save_adapter(model, str(tmp / "adapter"))
    trainable = {n: p.detach().cpu().clone() for n, p in model.named_parameters() if p.requires_grad}
    torch.save({"optimizer": optimizer.state_dict(), "trainable": trainable}, tmp / "optimizer.pt")
    meta = dict(meta, step=step, rng=rng_state(), saved_at=time.strftime("%Y-%m-%d %H:%M:%S"))
    (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    if keep_last > 0:
        for old in sorted(ckpt_dir.glob("step_*"))[:-keep_last]:
            shutil.rmtree(old, ignore_errors=True)
    return final


def latest_checkpoint(ckpt_dir):
    """The newest complete checkpoint folder, or None. (Temp folders start with '.')."""
    found = sorted(p for p in Path(ckpt_dir).glob("step_*") if (p / "meta.json").exists())
    return found[-1] if found else None


def load_checkpoint(path, model, optimizer):
    """Restore trainable weights, optimizer state and RNG states; returns the meta dict."""
    path = Path(path)
    state = torch.load(path / "optimizer.pt", map_location="cpu", weights_only=False)
    named = dict(model.named_parameters())
    with torch.no_grad():
        for n, t in state["trainable"].items():
            named[n].copy_(t.to(named[n].device, named[n].dtype))
    optimizer.load_state_dict(state["optimizer"])
    meta = json.loads((path / "meta.json").read_text())
    set_rng_state(meta["rng"])
    return meta


# -----------------------------------------------------------------------------
# Logging

PLOT_KEYS = ["reward", "reward_max", ("reward_r1", "reward_r2"), "pass_rate", "coverage", "compile_rate",
             "frac_reward_zero_std", ("clip_ratio/low", "clip_ratio/high"), "entropy", "completions/mean_length",
             "grad_norm", ("t_gen", "t_sim", "t_train")]


def append_log(path, row):
    with open(path, "a") as f:
        f.write(json.dumps(row) + "\n")


def plot_log(rows, path, keys=PLOT_KEYS):
    """One small panel per key (a tuple of keys shares a panel) against step, saved as a PNG."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    panels = [k if isinstance(k, tuple) else (k,) for k in keys]
    panels = [p for p in panels if any(k in r for r in rows for k in p)]
    if not panels:
        return
    cols, nrows = 4, math.ceil(len(panels) / 4)
    fig, axes = plt.subplots(nrows, cols, figsize=(4 * cols, 2.6 * nrows), squeeze=False)
    for ax, panel in zip(axes.flat, panels):
        for k in panel:
            xs = [r["step"] for r in rows if r.get(k) is not None]
            ys = [r[k] for r in rows if r.get(k) is not None]
            ax.plot(xs, ys, marker="." if len(xs) < 50 else None, label=k)
        ax.set_title(" / ".join(panel), fontsize=9)
        if len(panel) > 1:
            ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def rollout_metrics(groups):
    """Step metrics over every scored sample of the step."""
    samples = [s for g in groups for s in g.samples]
    if not samples:
        return {}
    mean = lambda xs: float(sum(xs) / len(xs)) if xs else None
    m = {
        "reward": mean([s.score.reward for s in samples]),
        "reward_max": max(s.score.reward for s in samples),
        "pass_rate": mean([float(s.score.passed) for s in samples]),
        "coverage": mean([(s.score.coverage or 0.0) if s.score.status == "ok" else 0.0 for s in samples]),
        "compile_rate": mean([float(s.score.compile_ok) for s in samples]),
        "parse_rate": mean([float(s.score.parsed) for s in samples]),
        "frac_reward_zero_std": mean([float(np.std(g.rewards) == 0) for g in groups]),
        "completions/mean_length": mean([len(s.completion_ids) for s in samples]),
        "completions/clipped_ratio": mean([float(s.truncated) for s in samples]),
    }
    for rnd in sorted({s.round for s in samples}):
        m[f"reward_r{rnd}"] = mean([s.score.reward for s in samples if s.round == rnd])
    return m


# -----------------------------------------------------------------------------
# One RL step's batch: rollouts + (optional) dynamic sampling

def collect_groups(source, model, tok, tasks, *, step, cursor, prompts_per_step, rounds, seed,
                   dynamic_sampling=False, max_extra_prompts=0, overlong=(0, 0), refill="ahead"):
    """Roll out P prompts from the data cursor; with dynamic sampling, drop zero-variance groups and
    refill from further prompts (batches of up to P, at most max_extra_prompts more) until P x rounds
    groups remain. Returns (kept_groups, all_groups, new_cursor, timings).

    refill="sequential" rolls out a refill batch only once the previous ones fell short. "ahead"
    rolls out the first batch and every possible refill batch together (one generate call per round
    instead of one per round and batch: the decode steps of a batch, not its width, set the time on a
    GPU), then uses the batches in the same order and by the same rule, so the kept groups, the data
    cursor and the logged counts follow the sequential procedure (the samples themselves differ: the
    generation seeds follow the generate calls); the unused rollouts are dropped. It pays only when one
    generate call covers them all (gen_chunk >= P + max_extra_prompts), so rl.py picks it only then."""
    max_len, buffer = overlong
    target = prompts_per_step * rounds
    timings = {"t_gen": 0.0, "t_sim": 0.0}
    sizes, left = [prompts_per_step], (max_extra_prompts if dynamic_sampling and prompts_per_step > 0 else 0)
    while left > 0:                                   # batch sizes of the sequential procedure
        sizes.append(min(prompts_per_step, left))
        left -= sizes[-1]

    def roll(first, n):
        batch = [tasks[task_order(first + i, len(tasks), seed)] for i in range(n)]
        groups, t = source(model, tok, batch, step=step, first_index=first)
        for k in timings:
            timings[k] += t.get(k, 0.0)
        for g in groups:
            for s in g.samples:
                s.reward = s.score.reward + overlong_penalty(len(s.completion_ids), max_len, buffer)
        return groups

    if refill not in ("ahead", "sequential"):
        raise ValueError(f"refill must be 'ahead' or 'sequential', not {refill!r}")
    ahead = roll(cursor, sum(sizes)) if refill == "ahead" and len(sizes) > 1 else None
    if ahead is not None and sorted({g.index for g in ahead}) != list(range(cursor, cursor + sum(sizes))):
        raise ValueError("refill='ahead' needs the source's groups indexed first_index + task position")
    all_groups, kept, used = [], [], 0
    for j, n in enumerate(sizes):
        if j > 0 and len(kept) >= target:
            break
        first = cursor + used
        groups = roll(first, n) if ahead is None else [g for g in ahead if first <= g.index < first + n]
        used += n
        all_groups += groups
        kept += [g for g in groups if not dynamic_sampling or np.std(g.rewards) > 0]
    timings["extra_prompts"] = used - prompts_per_step
    timings["unused_prompts"] = sum(sizes) - used if ahead is not None else 0
    return kept[:target], all_groups, cursor + used, timings


# -----------------------------------------------------------------------------
# The run

def build_policy(args):
    """Base model + the trainable adapter ("default") + optionally a frozen copy of the initial
    adapter ("ref", for the KL option). Returns (model, tok, ref_adapter_name)."""
    import common
    if args.model == "tiny":
        model, tok = common.tiny_model(seed=args.seed)
    else:
        model, tok = common.load_model(args.model, quant=args.quant)
    if args.adapter:
        model = common.load_adapter(model, args.adapter, trainable=True)
    else:
        torch.manual_seed(derive_seed(args.seed, "lora-init"))
        model = common.add_lora(model, r=args.lora_r, alpha=args.lora_alpha)
    ref = None          # KL reference: a fresh LoRA starts at zero delta, i.e. the base model
    if args.kl_beta > 0 and args.adapter:
        common.load_adapter(model, args.adapter, adapter_name="ref", trainable=False)
        model.set_adapter("default")
        ref = "ref"
    disable_dropout(model)
    if args.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.enable_input_require_grads()
    return model, tok, ref


def filter_long_prompts(tasks, tok, model, args):
    """Drop tasks whose round-1 prompt is too long for the context: the round-2 prompt adds one
    answer (<= max_new_tokens) and the feedback, and then generates another max_new_tokens.
    --max-prompt-tokens 0 derives the limit from the model's max_position_embeddings."""
    import common
    limit, why = args.max_prompt_tokens, "--max-prompt-tokens"
    if limit == 0:
        ctx = getattr(model.config, "max_position_embeddings", None) or 32768
        limit = max(256, ctx - args.rounds * args.max_new_tokens - 1024)
        why = f"context {ctx} - {args.rounds} rounds x {args.max_new_tokens} new tokens - 1024, at least 256"
    if limit < 0:
        return tasks
    kept = [t for t in tasks if len(common.chat_ids(tok, common.build_messages(t))) <= limit]
    print(f"prompt filter: {len(kept)}/{len(tasks)} tasks have <= {limit} prompt tokens ({why})")
    if not kept:
        raise SystemExit(f"no task has a prompt of <= {limit} tokens ({why}): lower --max-new-tokens "
                         "or set --max-prompt-tokens")
    return kept


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    # Model and data
    p.add_argument("--model", default=None, help="HF id, folder or GGUF (None: SmolLM2 GGUF); 'tiny' = random test model")
    p.add_argument("--quant", default="auto", help="common.load_model: auto (4-bit base for >= 1B on CUDA) | none | bf16 | fp32 | 4bit")
    p.add_argument("--adapter", default=None, help="the SFT stage adapter to start from (None: a fresh LoRA)")
    p.add_argument("--lora-r", type=int, default=16, help="rank of a fresh LoRA (ignored with --adapter)")
    p.add_argument("--lora-alpha", type=int, default=32)
    p.add_argument("--tasks", required=True, help="task JSONL (sim.load_tasks)")
    p.add_argument("--out", required=True, help="output folder: ckpt/, log.jsonl, curves.png, adapter/, done.json")
    # Horizon and batch
    p.add_argument("--profile", default="small", choices=sorted(PROFILES), help="defaults for the options below")
    p.add_argument("--steps", type=int, default=100, help="optimizer updates (paper: 1000)")
    p.add_argument("--prompts-per-step", type=int, default=2, help="P prompts per step (paper: 2)")
    p.add_argument("--group-size", type=int, default=4, help="G samples per group (paper: 4)")
    p.add_argument("--rounds", type=int, default=2, help="groups per prompt: round 1 + worst-state refinements (paper: 2)")
    p.add_argument("--max-new-tokens", type=int, default=None, help="response cap (profile: paper 16384, small 1024)")
    p.add_argument("--temperature", type=float, default=1.0, help="rollout sampling temperature (paper: 1.0)")
    p.add_argument("--max-prompt-tokens", type=int, default=0,
                   help="skip tasks with longer round-1 prompts; 0 = context - rounds x max-new-tokens - 1024; -1 = keep all")
    add_rollout_args(p)
    # Objective
    p.add_argument("--lr", type=float, default=2e-5, help="constant LR; LoRA needs more than the paper's 1e-6 full FT: pick by experiment (1e-5..5e-5)")
    p.add_argument("--epsilon-low", type=float, default=0.2)
    p.add_argument("--epsilon-high", type=float, default=0.28, help="DAPO clip-higher")
    p.add_argument("--max-grad-norm", type=float, default=1.0)
    p.add_argument("--steps-per-generation", type=int, default=1, help="optimizer steps per rollout batch (paper: 1)")
    p.add_argument("--max-tokens-per-micro", type=int, default=16384, help="padded tokens per micro-batch (gradient accumulation)")
    p.add_argument("--dynamic-sampling", action=argparse.BooleanOptionalAction, default=None,
                   help="drop zero-variance groups and refill (profile: paper off, small on)")
    p.add_argument("--max-extra-prompts", type=int, default=None, help="refill cap per step (default 2 x P)")
    p.add_argument("--refill", choices=["ahead", "sequential"], default=None,
                   help="ahead: roll out the refill prompts with the first ones, use them only as needed (fewer "
                        "generate calls; same rule); sequential: only when needed (less memory). Default: ahead "
                        "when --gen-chunk covers P + --max-extra-prompts, else sequential")
    p.add_argument("--overlong-buffer", type=int, default=None, help="DAPO soft overlong punishment buffer in tokens; 0 = off")
    p.add_argument("--kl-beta", type=float, default=None, help="k3 KL to the initial adapter; 0 = off (paper)")
    add_runtime_args(p, save_every=50)
    args = p.parse_args(argv)
    for k, v in PROFILES[args.profile].items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    if args.max_extra_prompts is None:
        args.max_extra_prompts = 2 * args.prompts_per_step
    if args.refill is None:
        args.refill = "ahead" if args.gen_chunk >= args.prompts_per_step + args.max_extra_prompts else "sequential"
    return args


def run(args, *, source=None, score_fn=None, tasks=None):
    """Train. source(model, tok, tasks, *, step, first_index) -> (groups, timings) replaces the
    default model+simulator source (tests pass a scripted one); score_fn replaces only the scorer."""
    from tqdm import tqdm
    out, ckpt_dir, log_path, done = start_run(args)
    if done is not None:
        return done
    user_config = vars(args).copy()
    print("rl.py config: " + json.dumps(user_config))
    if tasks is None:
        import sim
        tasks = sim.load_tasks(args.tasks)
    model, tok, ref_adapter = build_policy(args)
    tasks = filter_long_prompts(tasks, tok, model, args)
    optimizer = make_optimizer(model, args.lr)
    n_trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    print(f"tasks {len(tasks)}, trainable params {n_trainable:,}, profile {args.profile}: "
          f"dynamic_sampling={args.dynamic_sampling} overlong_buffer={args.overlong_buffer} kl_beta={args.kl_beta}")

    step, cursor, log, resumed_step = 0, 0, [], None
    ckpt = latest_checkpoint(ckpt_dir) if args.resume else None
    if ckpt:
        meta = load_checkpoint(ckpt, model, optimizer)
        step, cursor, log = meta["step"], meta["cursor"], meta["log"]
        resumed_step = step
        print(f"resumed from {ckpt} (step {step}, data cursor {cursor})")
    log_path.write_text("".join(json.dumps(r) + "\n" for r in log))   # drop steps past the checkpoint

    pool = None
    if source is None:
        if score_fn is None:
            pool, score_fn = make_scorer(args)
        source = make_model_source(score_fn, num_generations=args.group_size, max_new_tokens=args.max_new_tokens,
                                   seed=args.seed, rounds=args.rounds, chunk_size=args.gen_chunk,
                                   temperature=args.temperature, gen_batch_size=args.gen_batch_size,
                                   release_fast=release_fast_default(args.release_fast))
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else (tok.eos_token_id or 0)
    bar = tqdm(total=args.steps, initial=step, desc="rl", dynamic_ncols=True)
    try:
        while True:
            last_step = step == args.steps
            save_and_plot(args, step, resumed_step, ckpt_dir, model, optimizer,
                          {"user_config": user_config, "cursor": cursor, "log": log}, out / "curves.png")
            if last_step:
                break
            # ---------------------------------------------------------------- one RL step
            t0 = time.perf_counter()
            groups, all_groups, cursor, timings = collect_groups(
                source, model, tok, tasks, step=step, cursor=cursor, prompts_per_step=args.prompts_per_step,
                rounds=args.rounds, seed=args.seed, dynamic_sampling=args.dynamic_sampling,
                max_extra_prompts=args.max_extra_prompts, overlong=(args.max_new_tokens, args.overlong_buffer),
                refill=args.refill)
            t1 = time.perf_counter()
            rows = [s for g in groups for s in g.samples]
            torch.manual_seed(derive_seed(args.seed, "train", step))
            if rows:
                advantages = compute_advantages([s.reward for s in rows], args.group_size)
                stats = train_on_batch(model, optimizer, rows, advantages.tolist(), temperature=args.temperature,
                                       epsilon_low=args.epsilon_low, epsilon_high=args.epsilon_high,
                                       max_grad_norm=args.max_grad_norm, max_tokens_per_micro=args.max_tokens_per_micro,
                                       steps_per_generation=args.steps_per_generation, beta=args.kl_beta,
                                       ref_adapter=ref_adapter, pad_token_id=pad_id)
            else:   # dynamic sampling found no informative group within the cap: no update
                stats = {"grad_norm": 0.0}
            t2 = time.perf_counter()
            # ---------------------------------------------------------------- logging
            row = {"step": step + 1, **rollout_metrics(all_groups), "groups": len(groups),
                   "extra_prompts": timings["extra_prompts"], "unused_prompts": timings["unused_prompts"],
                   **{k: v for k, v in stats.items() if not (isinstance(v, float) and math.isnan(v))},
                   "t_gen": timings["t_gen"], "t_sim": timings["t_sim"],
                   "t_rollout": t1 - t0, "t_train": t2 - t1, "lr": args.lr, "cursor": cursor}
            log.append(row)
            append_log(log_path, row)
            fmt = lambda k, spec: format(row[k], spec) if row.get(k) is not None else "-"
            bar.write(f"step {step + 1:5d}/{args.steps} | reward {fmt('reward', '.3f')} (max {fmt('reward_max', '.2f')}) "
                      f"| pass {fmt('pass_rate', '.2f')} cov {fmt('coverage', '.3f')} compile {fmt('compile_rate', '.2f')} "
                      f"| zero-std {fmt('frac_reward_zero_std', '.2f')} | clip {fmt('clip_ratio/low', '.3f')}/"
                      f"{fmt('clip_ratio/high', '.3f')} | ent {fmt('entropy', '.3f')} | len {fmt('completions/mean_length', '.0f')} "
                      f"| gnorm {fmt('grad_norm', '.3f')} | gen {row['t_gen']:.1f}s sim {row['t_sim']:.1f}s train {row['t_train']:.1f}s")
            bar.update(1)
            step += 1
    finally:
        bar.close()
        if pool is not None:
            pool.close()

    last = log[-1] if log else {}
    return finish_run(out, model, step, {
        "config": user_config, "setup": {"tasks": len(tasks), "trainable_params": n_trainable},
        "outcome": {k: last.get(k) for k in ("reward", "pass_rate", "coverage", "compile_rate")}})


def add_rollout_args(p):
    """The rollout and scorer flags rl.py and distill.py share."""
    p.add_argument("--target-mode", default="icarus", help="coverage targets for pass_rate: icarus | cvdp")
    p.add_argument("--gen-chunk", type=int, default=1, help="prompts per (student) generate call; simulation of one "
                   "chunk overlaps the next")
    p.add_argument("--gen-batch-size", type=int, default=64, help="common.generate batch size")
    p.add_argument("--release-fast", action=argparse.BooleanOptionalAction, default=None,
                   help="free the fast decoder's memory after each step's rollouts (default: on for GPUs under 40 GiB)")
    p.add_argument("--sim-workers", type=int, default=None, help="SimPool workers (None: sim.py's default)")
    p.add_argument("--sim-timeout", type=float, default=20.0,
                   help="simulation wall-clock limit per rollout, seconds (a timeout earns 0; sim.py default 20)")


def make_scorer(args):
    """(SimPool, score_fn) from the rollout flags; the caller closes the pool."""
    import sim
    pool = sim.SimPool(args.sim_workers, cfg=sim.ScoreConfig(timeout_s=args.sim_timeout))
    return pool, sim_score_fn(pool, args.target_mode)


def save_and_plot(args, step, resumed_step, ckpt_dir, model, optimizer, meta, png, keys=PLOT_KEYS):
    """Top of a training step: every --save-every steps and at the end, checkpoint the state after `step`
    updates (not again right after resuming from it); every --plot-every steps and at the end, redraw."""
    last = step == args.steps
    if step > 0 and (last or step % args.save_every == 0) and step != resumed_step:
        save_checkpoint(ckpt_dir, step, model, optimizer, meta, args.keep_last)
    if meta["log"] and args.plot_every > 0 and (last or step % args.plot_every == 0):
        plot_log(meta["log"], png, keys=keys)


def add_runtime_args(p, save_every):
    """The runtime flags rl.py and distill.py share: checkpointing, seed, plots, resume."""
    p.add_argument("--gradient-checkpointing", action=argparse.BooleanOptionalAction, default=True)
    g = p.add_argument_group("runtime")
    g.add_argument("--seed", type=int, default=42, help="paper: 42")
    g.add_argument("--save-every", type=int, default=save_every, help="checkpoint every N steps (and at the end)")
    g.add_argument("--keep-last", type=int, default=3, help="checkpoints kept (0 = all)")
    g.add_argument("--plot-every", type=int, default=10, help="redraw curves.png every N steps (and at the end); 0 = never")
    g.add_argument("--resume", action="store_true", help="continue from the last complete checkpoint in OUT/ckpt")


def start_run(args):
    """Start of a training run (rl.py, distill.py): OUT folder, its ckpt/ and log.jsonl paths, and the
    contents of done.json when the run is already complete (None otherwise). Refuses to mix a new run
    into a folder with checkpoints unless --resume."""
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if (out / "done.json").exists():
        print(f"{out}/done.json exists: nothing to do")
        return out, out / "ckpt", out / "log.jsonl", json.loads((out / "done.json").read_text())
    ckpt_dir, log_path = out / "ckpt", out / "log.jsonl"
    if latest_checkpoint(ckpt_dir) and not args.resume:
        raise SystemExit(f"{ckpt_dir} has checkpoints: pass --resume to continue, or use a new --out")
    return out, ckpt_dir, log_path, None


def finish_run(out, model, step, result):
    """End of a training run (rl.py, distill.py): the final adapter (bf16 peft folder), result.json
    (config / setup / outcome), then done.json, written last: its presence means the run is complete."""
    import common
    common.save_adapter(model, str(out / "adapter"))
    result["setup"]["gpu_peak_mib"] = common.gpu_peak_mib()
    (out / "result.json").write_text(json.dumps(result, indent=1))
    done = {"step": step, "adapter": "adapter", "finished_at": time.strftime("%Y-%m-%d %H:%M:%S")}
    (out / "done.json").write_text(json.dumps(done, indent=1))
    return done


def main(argv=None):
    return run(parse_args(argv))


if __name__ == "__main__":
    main()
