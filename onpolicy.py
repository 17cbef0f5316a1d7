"""What rl.py (DAPO) and distill.py (gated OPD) share: sampling the policy, scoring its answers, and
reading its token log-probs. Both trainers import from here; neither imports the other's loop.

    seeds       derive_seed, task_order (a resumable, seeded task order)
    scoring     parse_failure, is_parse_failure, result_reward, feedback_result, prepare_answer,
                submit_answer, score_answers (one answer: parse -> simulate -> reward; usable or not),
                in either answer mode (testbench: a whole testbench; stimulus: harness.py's harness +
                the model's stimulus; the mode's prompts are harness.first_messages / refine_state_messages)
    rollouts    Score, Sample, Group, worst_sample, two_round_rollouts, sim_score_fn, make_scorer,
                make_model_source, release_fast_default, overlong_penalty, collect_groups (+ dynamic
                sampling), rollout_metrics
    log-probs   per_token_logps -> TokenLogps (sampled-token log-probs, entropy, top-K ids/log-probs, or
                log-probs at given ids for a teacher), micro_batches
    the policy  build_policy (base + trainable LoRA, dropout off), disable_dropout, make_optimizer
    flags       add_rollout_args, add_runtime_args
"""
import argparse
import contextlib
import hashlib
import json
import os
import random
import shutil
import time
from dataclasses import dataclass, field

import numpy as np
import torch
from tqdm import tqdm

import common
import dist
import evaluate
import fastgen
import harness
import rundir
import sim
import simpool


# -----------------------------------------------------------------------------
# Seeds: every random draw derives from (seed, what, where), so a resumed run repeats it

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
# Scoring: score.py (re-exported here for the trainers' callers)

from score import (PARSE_FAILURES, Score, feedback_result, hole_fix, is_parse_failure, parse_failure,  # noqa: E402,F401
                   prepare_answer, result_reward, score_answers, submit_answer)   # (also onpolicy.X for old callers)


# -----------------------------------------------------------------------------
# Rollouts: two rounds per prompt, each its own group

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
    state: "Sample | None" = None  # round >= 2: the previous round's worst sample, the state the prompt showed

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

    generate_fn(messages_list, seed, on_done, tasks) -> list of objects with .text, .prompt_ids, .completion_ids,
        .truncated (common.Completion); one completion per entry. on_done(k, completion) (common.generate's): a
        row's answer as soon as it has finished, so its simulation starts while longer rows still decode; rows
        it never got are scored when the call returns. tasks: each row's task (rows beside the policy's, as
        make_model_source's extra adds, can be scored early with them).
    score_fn(task, completion) -> a zero-argument callable that waits for and returns a Score
        (so the simulation of one chunk runs while the next chunk generates).
    seed_fn(round, task_index) -> the generation seed of a chunk whose first task has that index.
    Tasks are processed in chunks of `chunk_size` prompts in the order R1(0), R1(1), R2(0), R1(2),
    R2(1), ..., so each chunk's round-1 simulation overlaps the next chunk's round-1 generation.
    Groups come back in task order, round 1 before round 2 for each task.
    """
    build_fn = build_fn or common.build_messages
    refine_fn = refine_fn or common.refine_messages
    G = num_generations
    chunks = [list(range(i, min(i + chunk_size, len(tasks)))) for i in range(0, len(tasks), chunk_size)]
    pending = {}                                   # (task position, round) -> [(Sample, wait)]
    states = {}                                    # (task position, round >= 2) -> the worst Sample it refines
    timings = {"t_gen": 0.0, "t_sim": 0.0, **{f"t_gen_r{r}": 0.0 for r in range(1, rounds + 1)},
               **{f"t_{k[:-2]}": 0.0 for k in fastgen.STATS}}   # t_pack, t_prefill, t_capture, t_decode

    def launch(chunk, rnd):
        messages_list = []
        for t in chunk:
            if rnd == 1:
                msgs = build_fn(tasks[t])
            else:
                worst = states[(t, rnd)] = worst_sample(finish(t, rnd - 1))
                msgs = refine_fn(tasks[t], worst.text, feedback_result(worst.score.result))
            messages_list += [msgs] * G
        owner = [t for t in chunk for _ in range(G)]
        scored = {}                                # call row -> (Sample, wait), made as the row finishes

        def on_done(k, c):
            if k not in scored:
                t = owner[k]
                sample = Sample(tasks[t].get("id", str(t)), rnd, messages_list[k], c.text, list(c.prompt_ids),
                                list(c.completion_ids), bool(c.truncated), None)
                scored[k] = (sample, score_fn(tasks[t], c))
        t0, fast0 = time.perf_counter(), dict(fastgen.STATS)
        completions = generate_fn(messages_list, seed_fn(rnd, first_index + chunk[0]), on_done,
                                  [tasks[t] for t in owner])
        dt = time.perf_counter() - t0
        timings["t_gen"] += dt
        timings[f"t_gen_r{rnd}"] += dt
        for k, v in fastgen.STATS.items():         # the fast decoder's share (0 on the HF path)
            timings[f"t_{k[:-2]}"] += v - fast0[k]
        for k, c in enumerate(completions):
            on_done(k, c)
        for j, t in enumerate(chunk):
            pending[(t, rnd)] = [scored[k] for k in range(j * G, (j + 1) * G)]

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
            groups.append(Group(first_index + t, tasks[t].get("id", str(t)), rnd, finish(t, rnd),
                                states.get((t, rnd))))
    return groups, timings


def sim_score_fn(pool, target_mode="icarus", answer_mode="testbench", floors=None):
    """score_fn for two_round_rollouts backed by simpool.SimPool (submit_answer): unparseable answers get
    reward 0 without simulating. floors: {task id: random_cov} for --reward over_random (None: task reward)."""
    def score(task, completion):
        _, wait = submit_answer(pool, task, completion.text, target_mode, answer_mode)
        random_cov = None if floors is None else floors[task["id"]]
        return lambda: Score.of(wait(), random_cov)
    return score


def reward_floors(args, tasks):
    """{task id: random_cov} for --reward over_random, from each task's `random_floor` or the --floor file
    (data/floor.py); None for the task reward. A task without a floor is an error naming it: its reward would
    be undefined."""
    if getattr(args, "reward", "task") == "task":
        return None
    from data import floor
    records = floor.load_floor(args.floor) if args.floor else {}
    out, missing = {}, []
    for t in tasks:
        rec = floor.floor_of(t, records)
        if rec is None:
            missing.append(t["id"])
        else:
            out[t["id"]] = float(rec["random_cov"])
    if missing:
        raise SystemExit(f"--reward over_random: no random floor for {len(missing)} task(s) ({', '.join(missing[:3])}"
                         f"{', ...' if len(missing) > 3 else ''}): run `python data/floor.py TASKS --out FLOOR` and "
                         "pass --floor FLOOR")
    return out


def make_model_source(score_fn, *, num_generations, max_new_tokens, seed, rounds=2, chunk_size=1,
                      temperature=1.0, gen_batch_size=64, release_fast=False, answer_mode="testbench", extra=None,
                      gen=None):
    """The real rollout source: the policy generates (common.generate, fast path on CUDA), the
    scorer rewards. Returns source(model, tok, tasks, *, step, first_index) -> (groups, timings).
    Generation seeds derive from (seed, step, round, task index), so a resumed run repeats them.
    release_fast drops the fast decoder's packed weights and KV cache after each step's rollouts, so
    the training phase gets that memory back (needed on 24 GB cards; costs a re-pack per step).
    answer_mode: the prompts of both rounds (harness.first_messages / refine_state_messages; give the
    score_fn the same mode).
    extra: more rows for each generate call, run after the policy's in the same call under other adapters
    (distill.py's teachers on the student's prompts): extra(messages_list, call_seed, tasks) -> (messages, adapter
    names, seeds, take, done), take(their completions) after the call, and done(j, completion) (or None) as extra
    row j finishes (tasks: each policy row's task, for scoring them early). The policy's rows keep their samples
    (they come first, under the active adapter and the call's seed); on the HF path each (adapter, seed) of the
    extra rows is a call of its own (common.generate's seeds).
    gen: what samples instead of common.generate(model, tok, messages_list, **kw) (several policies in one
    process: a JointGenerate's member; with extra, it takes beside=(messages, adapter names, seeds) and returns the
    policy's completions, then the extra rows')."""
    def source(model, tok, tasks, *, step, first_index):
        def generate_fn(messages_list, call_seed, on_done=None, row_tasks=None):
            model.eval()
            kw = dict(max_new_tokens=max_new_tokens, temperature=temperature, top_p=1.0, seed=call_seed,
                      batch_size=gen_batch_size, on_done=on_done)
            if extra is None:
                return (gen or common.generate)(model, tok, messages_list, **kw)
            more, names, seeds, take, done = extra(messages_list, call_seed, row_tasks)
            n = len(messages_list)           # the extra rows follow the policy's: each hears of its own

            def route(k, c):
                if k >= n:
                    if done is not None:
                        done(k - n, c)
                elif on_done is not None:
                    on_done(k, c)
            kw["on_done"] = route if on_done or done else None
            out = (gen or generate_beside)(model, tok, messages_list, beside=(more, names, seeds), **kw)
            take(out[len(messages_list):])
            return out[:len(messages_list)]
        out = two_round_rollouts(
            tasks, generate_fn=generate_fn, score_fn=score_fn, num_generations=num_generations,
            seed_fn=lambda rnd, idx: derive_seed(seed, "gen", step, rnd, idx),
            first_index=first_index, rounds=rounds, chunk_size=chunk_size,
            build_fn=lambda t: harness.first_messages(t, answer_mode),
            refine_fn=lambda t, a, r: harness.refine_state_messages(t, a, r, answer_mode))
        if release_fast:
            common.free_fast_cache(model)
        return out
    return source


def generate_beside(model, tok, messages_list, *, beside, **kw):
    """One common.generate call of the policy's rows (the active adapter, the call's seed) and, after them, the
    rows beside=(messages, adapter names, seeds) under their adapters (seeds: common.generate's)."""
    more, names, seeds = beside
    n = len(messages_list)
    return common.generate(model, tok, list(messages_list) + list(more), adapters=[model.active_adapter] * n
                           + list(names), seeds=[None] * n + list(seeds), **kw)


def release_fast_default(flag):
    """--release-fast default: on when the GPU has under 40 GiB (a 24 GB card cannot hold the fast
    decoder's packed weights + KV cache and the training activations at once), off elsewhere. The size is
    common.gpu_capacity_bytes: an emulated card ($CHORUS_GPU_CAP_GIB) counts as its cap."""
    if flag is not None:
        return flag
    capacity = common.gpu_capacity_bytes()
    return capacity is not None and capacity < 40 * 2**30


class Member:
    """One adapter's training run inside this process (rl.py's experts, distill.py's students): its own folder,
    checkpoints, log, optimizer and data cursor. The usual run has one member, adapter "default"."""

    def __init__(self, name, args):
        self.name, self.args = name, args
        self.out, self.ckpt_dir, self.log_path, self.done = rundir.start_run(args)
        self.config = vars(args).copy()
        self.optimizer = self.log = self.source = self.bar = self.joint = None
        self.step = self.cursor = 0
        self.resumed_step, self.micro_memo, self.end, self.t_ckpt, self.write = None, {}, None, 0.0, print

    def state(self):
        """What its checkpoints hold besides the weights and the optimizer."""
        return {"user_config": self.config, "cursor": self.cursor, "log": self.log}

    def record(self, row, line):
        """Its step's log row (log.jsonl) and progress line; advances its step."""
        self.log.append(row)
        rundir.append_log(self.log_path, row)
        self.write(line)
        self.bar.update(1)
        self.step += 1

    def open_bar(self, desc, position, joint):
        """Its progress bar; in a joint run its lines say whose they are."""
        self.bar = tqdm(total=self.args.steps, initial=self.step, desc=desc + (f" {self.name}" if joint else ""),
                        position=position, dynamic_ncols=True, disable=not dist.is_main())
        self.write = (lambda msg: self.bar.write(f"[{self.name}] {msg}")) if joint else self.bar.write


def make_members(args, prefix, overrides, prog):
    """The runs of one process: with args.joint, one Member per entry of overrides (args updated by it: its --out
    and what else differs), adapters prefix0, prefix1, ...; else one, "default". Their folders are locked
    (rundir.start_run). Returns (those to train, those already finished: done.json)."""
    if not getattr(args, "joint", None):
        members = [Member("default", args)]
    elif dist.world() > 1:
        raise SystemExit(f"{prog}: several runs train in one process only (their rollouts share its generate calls)")
    else:
        members = [Member(f"{prefix}{k}", argparse.Namespace(**{**vars(args), **o})) for k, o in enumerate(overrides)]
    return [m for m in members if m.done is None], [m for m in members if m.done is not None]


def members_between_steps(live, *, model, tok, val_tasks, deadline, plot_keys, release_fast, finish):
    """The top of a step of the live members (rl.py's experts, distill.py's students, or one run): each validates
    when due, checkpoints and decides under its own adapter (between_steps; the others' validations due next count
    toward the deadline). A member done or on a plateau leaves live finished (m.done = finish(m), under its
    adapter); a paused one leaves checkpointed; when one meets the deadline every member still live stops
    checkpointed at its own step. Returns (the members that left, whether the deadline stopped the others)."""
    for m in live:
        model.set_adapter(m.name)
        extra = sum(val_due_s(x.args, x.log, x.step) for x in live if x is not m)
        m.end, t = between_steps(
            m.args, m.step, model=model, tok=tok, optimizer=m.optimizer, val_tasks=val_tasks, log=m.log,
            log_path=m.log_path, out=m.out, ckpt_dir=m.ckpt_dir, resumed_step=m.resumed_step, deadline=deadline,
            state=m.state(), plot_keys=plot_keys, release_fast=release_fast, write=m.write, adapter_name=m.name,
            extra_s=extra)
        m.t_ckpt = time.perf_counter() - t          # its checkpoint and plot, logged with its next step
    left = [m for m in live if m.end in ("done", "plateau", "pause")]
    for m in left:
        live.remove(m)
        if m.end != "pause":                 # done or on a plateau: this member's run is complete
            model.set_adapter(m.name)
            m.done = finish(m)
    if not any(m.end == "deadline" for m in live):
        return left, False
    for m in live:                           # all stop together, each checkpointed
        saved = rundir.latest_checkpoint(m.ckpt_dir)
        if m.end is None and not (saved and saved.name == f"step_{m.step:06d}"):
            model.set_adapter(m.name)
            rundir.save_and_plot(m.args, m.step, m.resumed_step, m.ckpt_dir, model, m.optimizer, m.state(),
                                 m.out / "curves.png", plot_keys, force=True, adapter_name=m.name)
        if m.end is None:
            deadline.stop(m.out, m.step, m.write)
    return left, True


def overlong_penalty(length, max_len, buffer):
    """DAPO's soft overlong punishment: 0 up to max_len - buffer tokens, then falling linearly to -1
    at max_len (and -1 beyond). buffer = 0 switches it off."""
    if buffer <= 0 or length <= max_len - buffer:
        return 0.0
    return max(-1.0, (max_len - buffer - length) / buffer)


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
        # a timeout earns 0; one the busy machine starved of CPU (sim.starved_timeout) says the load, not the
        # policy, cost the reward (several trainers or too many simulator workers on one machine)
        "timeout_rate": mean([float(s.score.status == sim.TIMEOUT) for s in samples]),
        "starved_timeouts": sum(sim.starved_timeout(s.score.result or {}) for s in samples),
        "parse_rate": mean([float(s.score.parsed) for s in samples]),
        "frac_reward_zero_std": mean([float(np.std(g.rewards) == 0) for g in groups]),
        "completions/mean_length": mean([len(s.completion_ids) for s in samples]),
        "completions/clipped_ratio": mean([float(s.truncated) for s in samples]),
    }
    for rnd in sorted({s.round for s in samples}):
        m[f"reward_r{rnd}"] = mean([s.score.reward for s in samples if s.round == rnd])
    # refinement samples against the holes their state left (score.hole_fix; samples it proves nothing on are out)
    fixes = [h for g in groups if g.state is not None for s in g.samples
             if (h := hole_fix(g.state.score.result, s.score.result)) is not None]
    if fixes:
        m["hole_fix"] = mean([float(share > 0) for share, _ in fixes])   # covers at least one of its state's holes
        m["hole_fix_share"] = mean([share for share, _ in fixes])
    return m


# -----------------------------------------------------------------------------
# One step's batch: rollouts + (optional) dynamic sampling

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
    generate call covers them all (gen_chunk >= P + max_extra_prompts), so rl.py picks it only then.
    Under several processes (dist.py) each rank rolls out its contiguous block of every batch, and every
    rank gets all the groups back, so the kept groups and the cursor are the same on every rank."""
    max_len, buffer = overlong
    target = prompts_per_step * rounds
    timings = {"t_gen": 0.0, "t_sim": 0.0}
    sizes, left = [prompts_per_step], (max_extra_prompts if dynamic_sampling and prompts_per_step > 0 else 0)
    while left > 0:                                   # batch sizes of the sequential procedure
        sizes.append(min(prompts_per_step, left))
        left -= sizes[-1]

    def roll(first, n):
        batch = [tasks[task_order(first + i, len(tasks), seed)] for i in range(n)]
        lo, hi = dist.shard_range(n)        # several processes: each rolls out its block, all get every group
        mine = source(model, tok, batch[lo:hi], step=step, first_index=first + lo) if hi > lo or n == 0 else ([], {})
        parts = dist.gather(mine)
        groups = [g for gs, _ in parts for g in gs]
        for k in {k for _, t in parts for k in t if k.startswith("t_")}:   # the slowest rank sets the time
            timings[k] = timings.get(k, 0.0) + max(t.get(k, 0.0) for _, t in parts)
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
    targets = torch.zeros((B, T), dtype=torch.long)
    for i, (p, c) in enumerate(rows):
        input_ids[i, :len(p) + len(c)] = torch.tensor(list(p) + list(c), dtype=torch.long)
        targets[i, :len(c)] = torch.tensor(list(c), dtype=torch.long)
    mask = torch.arange(T)[None, :] < C[:, None]                        # (B, T)
    # the logits at position p-1+j predict completion token j (right padding keeps positions exact)
    positions = ((P - 1).clamp(min=0)[:, None] + torch.arange(T)[None, :]).clamp(max=L - 1)
    input_ids = input_ids.to(device)
    mask, targets, positions = mask.to(device), targets.to(device), positions.to(device)

    # No attention mask: the rows are right-padded and attention is causal, so a real position never sees
    # the padding after it, and the positions read (prompt and completion) are exactly those of an unpadded
    # row. Without a mask, SDPA runs its causal kernel (flash on a GPU) instead of a masked full-matrix one.
    # (Running a shared prompt once, its KV cache repeated for the rows that share it, was built and measured
    # slower on the H200: an update of 56 rows 8.91 s against 2.11 s, RL's t_train 14.1 s against 2.6 s,
    # results/rl_throughput.md; it was removed.)
    with _autocast(device):
        hidden = decoder(input_ids=input_ids, use_cache=False).last_hidden_state
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


def disable_dropout(model):
    """p = 0 in every Dropout (LoRA's included): old and new log-probs must agree before an update."""
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0


def micro_batches(rows, max_tokens):
    """Row-index lists whose padded size (rows x longest row) stays under max_tokens (a single longer
    row goes alone; 0 = one list). Rows are taken longest first, so each micro-batch holds rows of similar length and
    little padding (RL's rows run from ~2k to ~8k tokens, mixed in the order they were sampled). The
    callers sum gradients over micro-batches with one whole-batch normaliser, so the order changes the
    result only by float rounding."""
    lengths = [len(r.prompt_ids) + len(r.completion_ids) for r in rows]
    return common.pack_rows(sorted(range(len(rows)), key=lambda i: -lengths[i]), lengths, max_tokens)


# --max-tokens-per-micro auto: the micro-batch budget sized from the memory the card has. A 135M model is
# launch-bound at small micro-batches (on an H200: 6 s per update at 16384 padded tokens per
# micro-batch, ~13 s at 8192 with rows sorted by length, in another call), so a large card should take big
# ones, a 24 GB card smaller ones.
AUTO_FILL = 0.6          # of the free memory (within $CHORUS_GPU_CAP_GIB) one micro-batch may use
AUTO_MAX_TOKENS = 65536  # ceiling of the auto budget
AUTO_CPU_TOKENS = 4096   # auto off CUDA (host memory is not probed)


def micro_tokens(model, rows, setting, memo):
    """The padded-token budget of a micro-batch for this batch of rows (0 = no split). setting: a number or
    'auto'. Auto probes once per run (memo, a dict the caller keeps): one forward + backward of
    per_token_logps on the longest row measures the bytes per token above the memory in use; the budget is
    AUTO_FILL of the free memory over that, between the longest row and AUTO_MAX_TOKENS. The probe runs
    under a forked RNG and leaves no gradient, so the update that follows is the same as without it.
    Returns the budget; memo["probe"] holds the measurement (logged once)."""
    if setting != "auto":
        return setting
    longest = max((len(r.prompt_ids) + len(r.completion_ids) for r in rows), default=1)
    device = next(p for p in model.parameters() if p.requires_grad).device
    if device.type != "cuda":
        return max(AUTO_CPU_TOKENS, longest)
    if "bytes_per_token" not in memo:
        row = max(rows, key=lambda r: len(r.prompt_ids) + len(r.completion_ids))
        torch.cuda.synchronize(device)
        base = torch.cuda.memory_allocated(device)
        common.reset_peak()
        with torch.random.fork_rng(devices=[device]), common.train_mode(model):   # as the update runs
            per_token_logps(model, [row], entropy=True).logps.sum().backward()
        torch.cuda.synchronize(device)
        peak = torch.cuda.max_memory_allocated(device) - base
        for p in model.parameters():
            p.grad = None
        memo["bytes_per_token"] = max(1.0, peak / longest)
        memo["probe"] = {"probe_tokens": longest, "probe_peak_gib": round(peak / 2**30, 3),
                         "bytes_per_token": int(memo["bytes_per_token"])}
    free = common.gpu_free_bytes(device)
    return int(min(AUTO_MAX_TOKENS, max(longest, AUTO_FILL * free / memo["bytes_per_token"])))


# -----------------------------------------------------------------------------
# The policy: base model + trainable adapter

def build_policy(args, adapters=None):
    """Base model + the trainable adapter ("default") + optionally a frozen copy of the initial
    adapter ("ref", for the KL option). Returns (model, tok, ref_adapter_name).
    adapters: {name: folder} instead of args.adapter: several trainable adapters on one base (rl.py's experts
    in one process; no KL reference), the first one active."""
    if args.model == "tiny":
        model, tok = common.tiny_model(seed=args.seed)
    else:
        model, tok = common.load_model(args.model, quant=args.quant)
    if adapters:
        for name, path in adapters.items():
            model = common.load_adapter(model, path, adapter_name=name, trainable=True)
        model.set_adapter(next(iter(adapters)))
    elif args.adapter:
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


def make_optimizer(model, lr, weight_decay=0.0, betas=(0.9, 0.95)):
    """AdamW over the trainable (adapter) parameters, in named order (the checkpoint relies on it)."""
    params = [p for _, p in model.named_parameters() if p.requires_grad]
    return torch.optim.AdamW(params, lr=lr, betas=betas, weight_decay=weight_decay)


# -----------------------------------------------------------------------------
# Flags both trainers take

def add_rollout_args(p):
    """The rollout and scorer flags rl.py and distill.py share."""
    p.add_argument("--target-mode", default="icarus", help="coverage targets for pass_rate: icarus | cvdp")
    harness.add_answer_mode_arg(p, "rollouts and validation")
    p.add_argument("--gen-chunk", type=int, default=1, help="prompts per (student) generate call; simulation of one "
                   "chunk overlaps the next")
    p.add_argument("--gen-batch-size", type=int, default=64, help="common.generate batch size")
    p.add_argument("--release-fast", action=argparse.BooleanOptionalAction, default=None,
                   help="free the fast decoder's memory after each step's rollouts (default: on for GPUs under 40 GiB)")
    p.add_argument("--sim-workers", type=int, default=None, help="SimPool workers per process (None: its share of the cores)")
    p.add_argument("--reward", choices=("task", "over_random"), default="task",
                   help="task: 1 + coverage when the answer runs (the paper); over_random: 1 + the coverage gained over "
                        "the task's random floor (needs --floor or tasks with random_floor)")
    p.add_argument("--floor", default=None, help="random-floor file of data/floor.py (for --reward over_random)")
    p.add_argument("--sim-timeout", type=float, default=20.0,
                   help="simulation wall-clock limit per rollout, seconds (a timeout earns 0; sim.py default 20)")
    p.add_argument("--max-prompt-tokens", type=int, default=0, help="skip tasks with longer round-1 prompts; "
                   "0 = context - rounds x max-new-tokens - 1024; -1 = keep all")


def filter_long_prompts(tasks, tok, model, args):
    """Drop tasks whose round-1 prompt is too long for the context (rl.py and distill.py alike): the round-2
    prompt adds one answer (<= max_new_tokens) and the feedback, and then generates another max_new_tokens.
    --max-prompt-tokens 0 derives the limit from the model's max_position_embeddings."""
    limit, why = args.max_prompt_tokens, "--max-prompt-tokens"
    if limit == 0:
        ctx = getattr(model.config, "max_position_embeddings", None) or 32768
        limit = max(256, ctx - args.rounds * args.max_new_tokens - 1024)
        why = f"context {ctx} - {args.rounds} rounds x {args.max_new_tokens} new tokens - 1024, at least 256"
    if limit < 0:
        return tasks
    mode = getattr(args, "answer_mode", "testbench")          # the round-1 prompt of the answer mode
    kept = [t for t in tasks if len(common.chat_ids(tok, harness.first_messages(t, mode))) <= limit]
    print(f"prompt filter: {len(kept)}/{len(tasks)} tasks have <= {limit} prompt tokens ({why})")
    if not kept:
        raise SystemExit(f"no task has a prompt of <= {limit} tokens ({why}): lower --max-new-tokens "
                         "or set --max-prompt-tokens")
    return kept


def make_scorer(args, tasks=()):
    """(SimPool, score_fn) from the rollout flags (tasks: the run's, for --reward over_random's floors); the
    caller closes the pool."""
    floors = reward_floors(args, tasks)            # before the pool: a missing floor is one line, nothing started
    pool = simpool.SimPool(args.sim_workers or dist.cpu_share(), cfg=sim.ScoreConfig(timeout_s=args.sim_timeout))
    return pool, sim_score_fn(pool, args.target_mode, getattr(args, "answer_mode", "testbench"), floors)



def add_runtime_args(p, save_every):
    """The runtime flags rl.py and distill.py share: checkpointing, seed, plots, resume."""
    p.add_argument("--gradient-checkpointing", action=argparse.BooleanOptionalAction, default=True)
    g = p.add_argument_group("runtime")
    g.add_argument("--seed", type=int, default=42, help="paper: 42")
    g.add_argument("--save-every", type=int, default=save_every, help="checkpoint every N steps (and at the end)")
    g.add_argument("--keep-last", type=int, default=3, help="checkpoints kept (0 = all)")
    g.add_argument("--plot-every", type=int, default=10, help="redraw curves.png every N steps (and at the end); 0 = never")
    g.add_argument("--resume", action="store_true", help="continue from the last complete checkpoint in OUT/ckpt")
    g.add_argument("--pause-at", type=int, default=0, metavar="STEP",
                   help="stop after this step as at a deadline (checkpointed, exit 75; --resume goes on): a GPU job "
                        "that runs a stage to a step and then something else; 0 = never")
    v = p.add_argument_group("validation (off without --val-tasks)")
    v.add_argument("--val-tasks", default=None, help="task JSONL validated (evaluate.validate) at step 0, every --val-every "
                   "steps and the last step; the best adapter goes to OUT/best/adapter")
    v.add_argument("--val-every", type=int, default=10, help="optimizer steps between validations")
    v.add_argument("--val-n", type=int, default=1, help="samples per validation task")
    v.add_argument("--val-seed", type=int, default=None, help="sampling seed of every validation (None: --seed)")
    v.add_argument("--val-patience", type=int, default=5,
                   help=f"plateau: the last P validations beat the best before them by <= {PLATEAU_DELTA} in reward")
    v.add_argument("--stop-on-plateau", action="store_true", help="end the run (as a finished one) once on a plateau")
    v.add_argument("--min-steps", type=int, default=0, help="--stop-on-plateau ends no run before this step")


# The ranges of the flags above (rundir.check_options), checked by rl.py and distill.py before any work
SHARED_RANGES = {"target_mode": rundir.one_of("icarus", "cvdp"), "gen_chunk": rundir.at_least(1),
                 "gen_batch_size": rundir.at_least(1), "sim_workers": rundir.at_least(1),
                 "sim_timeout": rundir.above(0), "max_prompt_tokens": rundir.at_least(-1),
                 "save_every": rundir.at_least(1), "keep_last": rundir.at_least(0), "plot_every": rundir.at_least(0),
                 "val_every": rundir.at_least(1), "val_n": rundir.at_least(1), "val_patience": rundir.at_least(1),
                 "min_steps": rundir.at_least(0), "pause_at": rundir.at_least(0)}


# -----------------------------------------------------------------------------
# Validation during training (rl.py, distill.py): rows {"step", "val": 1, "val/...": ...} in log.jsonl

PLATEAU_DELTA = 0.005          # a validation reward gain of at most this is no improvement (for the plateau)


def between_steps(args, step, *, model, tok, optimizer, val_tasks, log, log_path, out, ckpt_dir, resumed_step,
                  deadline, state, plot_keys, release_fast=False, write=print, adapter_name="default", extra_s=0.0):
    """What rl.py and distill.py do before each step (and after the last): validate when due (validate_step),
    checkpoint and plot (rundir.save_and_plot; forced before a deadline stop), then decide whether the run ends.
    Validation runs before the checkpoint, so a checkpoint's log holds its step's val row. Returns (end, t):
    end None (go on), "done" (step == --steps), "plateau" (--stop-on-plateau), "deadline" ($CHORUS_DEADLINE:
    checkpointed, resumable) or "pause" (--pause-at: stopped as at a deadline); t = perf_counter() before the
    checkpoint (the step logs the checkpoint's time).
    adapter_name: the trainable adapter (rl.py's experts in one process: this expert's, made active by the caller);
    extra_s: seconds the next step takes beyond this run's own (the other experts' validations due then)."""
    last_step = step == args.steps
    plateau = validate_step(args, model, tok, val_tasks, log, log_path, out, step, release_fast=release_fast,
                            write=write, adapter_name=adapter_name) and not last_step
    deadline.start()              # a step's time without its validation: deadline_near adds the one due next
    pause = bool(getattr(args, "pause_at", 0)) and step >= args.pause_at
    hit = not last_step and not plateau and (pause or deadline_near(deadline, args, log, step, extra_s))
    t = time.perf_counter()
    rundir.save_and_plot(args, step, resumed_step, ckpt_dir, model, optimizer, state, out / "curves.png", plot_keys,
                         force=hit, adapter_name=adapter_name)
    if last_step:
        return "done", t
    if plateau:
        write(f"validation plateau at step {step}: stopping (--stop-on-plateau)")
    elif hit:
        deadline.stop(out, step, write, pause=args.pause_at if pause else None)
    else:
        return None, t
    rundir.plot_log(log, out / "curves.png", plot_keys)
    return ("plateau" if plateau else "pause" if pause else "deadline"), t


def val_due_s(args, log, step):
    """Seconds the validation due after step `step` + 1 will take (validate_step's rule; as long as the last one
    took, its val/s row), 0.0 when none is due."""
    nxt = step + 1
    due = args.val_tasks is not None and (nxt % args.val_every == 0 or nxt == args.steps)
    return rundir.last_val_seconds(log) if due else 0.0


def deadline_near(deadline, args, log, step, extra_s=0.0):
    """rundir.Deadline.near() at the top of step `step`: the next step plus, when a validation is due after it,
    as long as the last validation took (val_due_s), plus extra_s."""
    return deadline.near(extra=val_due_s(args, log, step) + extra_s)


def load_val_tasks(args):
    """--val-tasks' tasks (None without the flag); a missing or empty file is a ValueError (one line)."""
    path = args.val_tasks
    if path is None:
        return None
    for flag in ("val_every", "val_n", "val_patience"):
        if getattr(args, flag) < 1:
            raise ValueError(f"--{flag.replace('_', '-')} must be >= 1, got {getattr(args, flag)}")
    if not os.path.isfile(path):
        raise ValueError(f"--val-tasks {path}: no such file")
    tasks = sim.load_tasks(path)
    if not tasks:
        raise ValueError(f"--val-tasks {path}: the file has no tasks")
    return tasks


def val_plateau(rewards, patience, delta=PLATEAU_DELTA):
    """True when the last `patience` validation rewards beat the best one before them by at most delta
    (so at least patience + 1 validations are needed)."""
    if len(rewards) <= patience:
        return False
    return max(rewards[-patience:]) <= max(rewards[:-patience]) + delta


def val_summary(log, patience):
    """result.json's validation numbers from the log's val rows: the best is the first row of the highest
    reward (a later one must beat it strictly), the plateau val_plateau's."""
    rows = [r for r in log if r.get("val")]
    rewards = [r["val/reward"] for r in rows]
    best = max(range(len(rows)), key=lambda i: (rewards[i], -i)) if rows else None
    return {"val_best_step": rows[best]["step"] if rows else None, "val_best_reward": rewards[best] if rows else None,
            "val_last_reward": rewards[-1] if rows else None, "val_plateau": val_plateau(rewards, patience),
            "val_rows": len(rows)}


@contextlib.contextmanager
def keep_rng():
    """Run a block without moving the training RNG streams (torch CPU and this process's CUDA device, python,
    numpy). Only the current device: forking every visible GPU would open a CUDA context on each from every
    rank of a multi-process run."""
    py, npst = random.getstate(), np.random.get_state()
    devices = [torch.cuda.current_device()] if torch.cuda.is_available() and torch.cuda.is_initialized() else []
    try:
        with torch.random.fork_rng(devices=devices):
            yield
    finally:                       # also when the block raises (the run may catch it and go on)
        random.setstate(py)
        np.random.set_state(npst)


def check_best(out, log):
    """On (re)start: OUT/best/ must hold the best of the log's val rows; one saved after the checkpoint
    resumed from (those steps are redone and validated again) is removed."""
    best_dir = os.path.join(out, "best")
    if not os.path.isdir(best_dir):
        return
    saved = None
    try:
        with open(os.path.join(best_dir, "val.json")) as f:
            saved = json.load(f).get("step")
    except (OSError, ValueError):
        pass
    want = val_summary(log, 1)["val_best_step"]
    if saved != want and dist.is_main():
        print(f"{best_dir}: step {saved} is not the logged best (step {want}): removed, the redone steps validate again")
        shutil.rmtree(best_dir, ignore_errors=True)


def validate_step(args, model, tok, val_tasks, log, log_path, out, step, *, release_fast=False, write=print,
                  adapter_name="default"):
    """At step 0, every --val-every steps and the last step (unless the log already has that step's row: a
    resumed run): validate the current weights (evaluate.validate, direct answers, the run's fixed --val-seed)
    without moving the training RNG, log the row and, on a strictly better val/reward, save OUT/best/adapter.
    Returns True when --stop-on-plateau should end the run now."""
    if val_tasks is None:
        return False
    due = step == 0 or step % args.val_every == 0 or step == args.steps
    if due and not any(r.get("val") and r["step"] == step for r in log):
        best = val_summary(log, args.val_patience)["val_best_reward"]
        with keep_rng():
            m = evaluate.validate(model, tok, val_tasks, n=args.val_n, max_new_tokens=args.max_new_tokens,
                                  seed=args.seed if args.val_seed is None else args.val_seed,
                                  batch_size=args.gen_batch_size, sim_workers=args.sim_workers,
                                  target_mode=args.target_mode, answer_mode=getattr(args, "answer_mode", "testbench"))
        if release_fast:           # the update gets the decoder's packed weights and KV cache back
            common.free_fast_cache(model)
        row = {"step": step, "val": 1, **m}
        log.append(row)
        rundir.append_log(log_path, row)
        better = best is None or m["val/reward"] > best
        if better and dist.is_main():
            common.save_adapter(model, os.path.join(out, "best", "adapter"), adapter_name=adapter_name)
            with open(os.path.join(out, "best", "val.json"), "w") as f:
                json.dump(row, f, indent=1)
        se = m.get("val/reward_se")
        write(f"val step {step:5d} | reward {m['val/reward']:.3f}" + (f" (se {se:.3f}) " if se is not None else " ")
              + f"pass@1 {m['val/pass@1']:.1f} cov@1 {m['val/cov@1']:.1f} syn {m['val/syn_pass']:.1f} | "
              f"{m['val/s']:.0f}s" + (" | best" if better else ""))
    return bool(args.stop_on_plateau and step >= getattr(args, "min_steps", 0)
                and val_summary(log, args.val_patience)["val_plateau"])
