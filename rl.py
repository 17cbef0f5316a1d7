"""Execution-guided RL (DAPO) on a LoRA adapter: turns one SFT checkpoint into an expert (docs/method.md §4).

    python rl.py --model M --adapter runs/sft0/adapter --tasks TASKS.jsonl --out runs/rl0 --profile small
    python rl.py --model tiny --tasks TASKS.jsonl --out out/rl --steps 2      # CPU smoke run
    python rl.py ... --resume                                                 # continue a killed run
    python rl.py --model M --adapter A0 A1 A2 --out O0 O1 O2 ...              # three experts in one process

Algorithm, per step (one optimizer update per rollout batch by default):
 1. Take P prompts from a seeded permutation of the tasks (indexed by a data cursor, so a resumed
    run sees the same prompts).
 2. Round 1: G samples per prompt from the initial prompt (temperature 1.0). Round 2: the WORST
    round-1 sample (reward, ties broken by coverage) plus its scorer feedback becomes the
    memoryless state (common.refine_messages); G more samples. Each round is its own group.
    Simulation of one chunk of prompts overlaps the generation of the next (simpool.SimPool), and each
    answer's simulation starts as soon as its row finishes decoding (common.generate's on_done).
 3. Reward R = 1 + coverage (0..1) when the testbench parses, compiles and runs with coverage,
    else 0 (sim.reward; unparseable answers get 0 without simulating).
 4. Advantage A = (R - mean_group) / (std_group + 1e-6), std with unbiased=False, same for every
    token of the sample (compute_advantages).
 5. Loss: PPO clipped ratio with clip-higher (eps_low 0.2, eps_high 0.28), summed over every
    completion token of the batch and divided by the batch's token count (DAPO token-level
    aggregation), no KL, no entropy bonus (dapo_loss). Old log-probs are recomputed by the trainer
    with the weights that sampled; logits are divided by the sampling temperature first.
 6. Adam (betas 0.9/0.95, weight decay 0), constant LR, gradient clipping at 1.0. A step whose advantages
    are all zero (every group has zero reward variance, no KL) takes no optimizer step (Adam's momentum
    would still move the weights) and is logged as `skipped: 1`; one whose gradient norm is inf or NaN
    (bf16 overflow) takes none either, logged as `skipped_nonfinite` (an update would put NaN in the adapter).
Validation (--val-tasks, off by default): at step 0, every --val-every steps and the last step, the current
weights answer the validation tasks directly (evaluate.validate, one fixed --val-seed, the training RNG
untouched); each is a row {"step", "val": 1, "val/reward", ...} of log.jsonl, a strictly better val/reward
saves OUT/best/adapter (OUT/best/val.json: its row), and --stop-on-plateau ends the run once the last
--val-patience validations gained at most 0.005 over the best before them (onpolicy.validate_step).
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

Several experts in one process (--adapter and --out take one folder per expert): each is its own run (its own
folder, checkpoints, log, optimizer and data cursor, the same settings), and their rollouts share each generate
call (jointgen.JointGenerate: fastgen's stack rule runs each row under its expert's adapter; decode is bound by its
steps, not its rows, so three experts' rollouts cost about one's). On the fast path an expert other than the first
samples other tokens than it would alone (the call's seed and its rows' places); on the HF path (CPU) each expert's
rows are a call of their own with its seed, so each expert trains exactly as alone (a test). A checkpoint names its
weights as "default" whatever the expert's adapter is called, so an expert resumes alone or jointly alike. Times in a
joint run: an expert's t_gen is the shared calls' wall time it waited through, and the decoder's t_pack / t_prefill /
t_decode count each shared call whole for every expert in it; chorus_mini gives each expert's stage the joint
command's wall time (their sum counts it once per expert).

Rollouts, scoring, log-probs and the policy come from onpolicy.py (shared with distill.py); checkpoints,
logs and the run folder from rundir.py. This file owns the DAPO objective and the RL run.
"""
import argparse
import json
import math
import time

import torch

import common
import dist
import rundir
import sim
from jointgen import JointGenerate, joint_collect
from onpolicy import (SHARED_RANGES, add_rollout_args, add_runtime_args, build_policy, check_best,
                      collect_groups, derive_seed, filter_long_prompts, load_val_tasks, make_members,
                      make_model_source, make_optimizer, make_scorer, members_between_steps, micro_batches,
                      micro_tokens, per_token_logps, release_fast_default, rollout_metrics, val_summary)
from onpolicy import disable_dropout  # noqa: F401  (bench/bench_4b.py builds its policy with rl.*)


# -----------------------------------------------------------------------------
# The DAPO objective: advantages and the loss (pure tensor functions)

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
# The training step

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
    Several processes (dist.py): every rank passes the whole batch; each runs forward/backward on its
    contiguous block of every mini-batch, with the normalisers of the whole mini-batch, and the
    gradients are summed over the ranks before clipping, so the update equals one process's.
    """
    device = next(p for p in model.parameters() if p.requires_grad).device
    n_rows = len(rows)
    norm_groups = list(norm_groups) if norm_groups is not None else [0] * n_rows
    adv_rows = [_row_advantages(a, len(r.completion_ids)) for a, r in zip(advantages, rows)]
    params = [p for g in optimizer.param_groups for p in g["params"]]
    totals = {"loss": 0.0, "clip_ratio/low": 0.0, "clip_ratio/high": 0.0, "ratio": 0.0,
              "entropy": 0.0, "kl": 0.0, "num_tokens": 0}
    grad_norms, skipped, nonfinite = [], 0, 0
    clock = (lambda: (torch.cuda.synchronize(device), time.perf_counter())[1]) if device.type == "cuda" \
        else time.perf_counter                   # the step's time breakdown (t_logp_old, t_fwd_bwd, t_opt)
    times = {"t_logp_old": 0.0, "t_fwd_bwd": 0.0, "t_opt": 0.0}
    model.train()

    # Old log-probs, recomputed here. With one optimizer step per batch they equal the new ones
    # numerically, so we take new.detach() instead of a second forward (TRL does the same).
    order = list(range(n_rows))
    per_step = math.ceil(n_rows / steps_per_generation) if n_rows else 0
    minis = [order[s * per_step:(s + 1) * per_step] for s in range(steps_per_generation)]
    old = None
    t0 = clock()
    if steps_per_generation > 1:
        old = [None] * n_rows
        mine = [i for mini in minis for i in dist.shard(mini)]       # the rows this rank trains on
        with torch.no_grad():
            for mb in micro_batches([rows[i] for i in mine], max_tokens_per_micro):
                out = per_token_logps(model, [rows[mine[j]] for j in mb], temperature=temperature,
                                      pad_token_id=pad_token_id, chunk_tokens=chunk_tokens)
                for k, j in enumerate(mb):
                    old[mine[j]] = out.logps[k, :len(rows[mine[j]].completion_ids)]
    times["t_logp_old"] = clock() - t0

    for mini in minis:
        if not mini:
            continue
        # one normaliser per label: that label's completion-token count over the mini-batch
        counts = {}
        for i in mini:
            counts[norm_groups[i]] = counts.get(norm_groups[i], 0) + len(rows[i].completion_ids)
        optimizer.zero_grad(set_to_none=True)
        all_zero = beta == 0.0 and all(bool((adv_rows[i] == 0).all()) for i in mini)
        t0 = clock()
        if not all_zero:   # all-zero advantages give an exactly zero gradient: skip the passes
            local = dist.shard(mini)                  # the whole mini-batch for one process
            for mb in micro_batches([rows[i] for i in local], max_tokens_per_micro):
                idx = [local[j] for j in mb]
                mb_rows = [rows[i] for i in idx]
                ref = None
                if beta != 0.0:
                    with torch.no_grad(), common.use_adapter(model, ref_adapter):
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
        else:   # no optimizer step: Adam's momentum would still move the weights on a zero gradient
            skipped += 1
            grad_norms.append(0.0)
            continue
        t1 = clock()
        times["t_fwd_bwd"] += t1 - t0
        dist.sync_grads(params)           # sum over the ranks (the loss already divides by the global count)
        norm = float(torch.nn.utils.clip_grad_norm_(params, max_grad_norm))
        if math.isfinite(norm):
            grad_norms.append(norm)
            optimizer.step()
        else:   # a non-finite gradient would write NaN into the adapter: no step (as loss scaling does)
            nonfinite += 1
            optimizer.zero_grad(set_to_none=True)
        times["t_opt"] += clock() - t1
    totals = dist.all_sum(totals)
    totals["num_tokens"] = int(totals["num_tokens"])
    n = max(totals["num_tokens"], 1)
    stats = {k: (v / n if k not in ("loss", "num_tokens") else v) for k, v in totals.items()}
    if totals["num_tokens"] == 0:        # nothing was computed: no entropy / clip numbers
        for k in ("clip_ratio/low", "clip_ratio/high", "ratio", "entropy", "kl"):
            stats[k] = float("nan")
    stats["grad_norm"] = max(grad_norms) if grad_norms else 0.0
    stats["skipped"] = skipped        # mini-batches whose advantages were all zero: no optimizer step
    stats["skipped_nonfinite"] = nonfinite   # mini-batches whose gradient norm was inf/NaN: no optimizer step
    stats.update(times)
    return stats


# -----------------------------------------------------------------------------
# The run

# -----------------------------------------------------------------------------
# Profiles: the values an option takes when its flag is not given on the command line.

PROFILES = {
    # The paper's RL objective: no dynamic sampling, no overlong shaping, no KL (docs/method.md §4.5).
    "paper": {"dynamic_sampling": False, "overlong_buffer": 0, "kl_beta": 0.0, "max_new_tokens": 16384},
    # Small runs: a weak model produces many all-zero groups, so dynamic sampling refills them.
    "small": {"dynamic_sampling": True, "overlong_buffer": 0, "kl_beta": 0.0, "max_new_tokens": 1024},
}

PLOT_KEYS = ["reward", "val/reward", "reward_max", ("reward_r1", "reward_r2"), "pass_rate", "coverage", "compile_rate",
             "frac_reward_zero_std", ("clip_ratio/low", "clip_ratio/high"), "entropy", "completions/mean_length",
             "grad_norm", ("hole_fix", "hole_fix_share"), ("t_gen", "t_sim", "t_train")]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    # Model and data
    p.add_argument("--model", default=None, help="HF id, folder or GGUF (None: SmolLM2 GGUF); 'tiny' = random test model")
    common.add_gpu_mem_arg(p)
    p.add_argument("--quant", default="auto", help="common.load_model: auto (4-bit base for >= 1B on CUDA) | none | bf16 | fp32 | 4bit")
    p.add_argument("--adapter", nargs="+", default=None, metavar="FOLDER",
                   help="the SFT stage adapter to start from (None: a fresh LoRA); several: one expert each, trained in "
                        "one process (one --out each)")
    p.add_argument("--lora-r", type=int, default=16, help="rank of a fresh LoRA (ignored with --adapter)")
    p.add_argument("--lora-alpha", type=int, default=32)
    p.add_argument("--tasks", required=True, help="task JSONL (sim.load_tasks)")
    p.add_argument("--out", nargs="+", required=True, metavar="FOLDER",
                   help="output folder: ckpt/, log.jsonl, curves.png, adapter/, done.json (one per --adapter)")
    # Horizon and batch
    p.add_argument("--profile", default="small", choices=sorted(PROFILES), help="defaults for the options below")
    p.add_argument("--steps", type=int, default=100, help="optimizer updates (paper: 1000)")
    p.add_argument("--prompts-per-step", type=int, default=2, help="P prompts per step (paper: 2)")
    p.add_argument("--group-size", type=int, default=4, help="G samples per group (paper: 4)")
    p.add_argument("--rounds", type=int, default=2, help="groups per prompt: round 1 + worst-state refinements (paper: 2)")
    p.add_argument("--max-new-tokens", type=int, default=None, help="response cap (profile: paper 16384, small 1024)")
    p.add_argument("--temperature", type=float, default=1.0, help="rollout sampling temperature (paper: 1.0)")
    add_rollout_args(p)
    # Objective
    p.add_argument("--lr", type=float, default=2e-5, help="constant LR; LoRA needs more than the paper's 1e-6 full FT: pick by experiment (1e-5..5e-5)")
    p.add_argument("--epsilon-low", type=float, default=0.2)
    p.add_argument("--epsilon-high", type=float, default=0.28, help="DAPO clip-higher")
    p.add_argument("--max-grad-norm", type=float, default=1.0)
    p.add_argument("--steps-per-generation", type=int, default=1, help="optimizer steps per rollout batch (paper: 1)")
    p.add_argument("--max-tokens-per-micro", type=common.parse_tokens_per_micro, default=16384,
                   help="padded tokens per micro-batch (gradient accumulation); 'auto' = sized from the free GPU "
                        "memory by a probe of the first batch's longest row (onpolicy.micro_tokens); 0 = no split")
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
    outs, adapters = args.out, args.adapter
    if len(outs) > 1 or (adapters and len(adapters) > 1):
        if not adapters or len(adapters) != len(outs):
            p.error(f"several experts need one --adapter per --out (got {len(adapters or [])} and {len(outs)})")
        if rundir.shared_folders(outs):
            p.error("each expert needs its own --out folder")
        args.joint = {"adapters": adapters, "outs": outs}        # in each expert's config: who trained beside it
    args.out, args.adapter = outs[0], adapters[0] if adapters else None
    for k, v in PROFILES[args.profile].items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    if args.max_extra_prompts is None:
        args.max_extra_prompts = 2 * args.prompts_per_step
    if args.refill is None:
        args.refill = "ahead" if args.gen_chunk >= args.prompts_per_step + args.max_extra_prompts else "sequential"
    rundir.check_options("rl.py", args, {**SHARED_RANGES, **RANGES})
    if getattr(args, "joint", None) and args.kl_beta > 0:
        p.error("--kl-beta > 0 with several experts: each would need its own reference adapter; train them apart")
    return args


# Checked before any work: `--steps 0` would save the untrained adapter as a finished run (done.json), and a group
# of one sample has no baseline (every advantage is 0)
RANGES = {"steps": rundir.at_least(1), "prompts_per_step": rundir.at_least(1), "group_size": rundir.at_least(2),
          "rounds": rundir.at_least(1), "max_new_tokens": rundir.at_least(1), "temperature": rundir.above(0),
          "lr": rundir.above(0), "epsilon_low": rundir.within(0, 1), "epsilon_high": rundir.at_least(0),
          "max_grad_norm": rundir.above(0), "steps_per_generation": rundir.at_least(1),
          "max_extra_prompts": rundir.at_least(0), "overlong_buffer": rundir.at_least(0), "kl_beta": rundir.at_least(0),
          "lora_r": rundir.at_least(1), "lora_alpha": rundir.above(0)}


def make_experts(args):
    """The experts of a run, one per --out (onpolicy.make_members: those to train, those finished)."""
    joint = getattr(args, "joint", None) or {}
    return make_members(args, "expert", [{"adapter": a, "out": o} for a, o in zip(joint.get("adapters", []),
                                                                                   joint.get("outs", []))], "rl.py")


def run(args, *, source=None, score_fn=None, tasks=None):
    """Train. source(model, tok, tasks, *, step, first_index) -> (groups, timings) replaces the
    default model+simulator source (tests pass a scripted one); score_fn replaces only the scorer."""
    dist.init()           # several processes: join the group before the model lands on this rank's GPU
    experts, finished = make_experts(args)
    if not experts:
        return finished[-1].done
    deadline = rundir.Deadline()          # $CHORUS_DEADLINE: stop between steps, checkpointed (read before loading)
    print("rl.py config: " + json.dumps(experts[0].config))
    if tasks is None:
        tasks = sim.load_tasks(args.tasks)
        if not tasks:
            raise ValueError(f"--tasks {args.tasks}: the file has no tasks")
    val_tasks = load_val_tasks(args)                  # None: no validation
    joint = len(experts) > 1 or getattr(args, "joint", None)
    model, tok, ref_adapter = build_policy(args, adapters={e.name: e.args.adapter for e in experts} if joint else None)
    tasks = filter_long_prompts(tasks, tok, model, args)
    for e in experts:
        model.set_adapter(e.name)                     # its weights alone are trainable: its optimizer holds them
        e.optimizer = make_optimizer(model, args.lr)
        e.step, e.cursor, e.log, e.resumed_step = rundir.resume_state(e.args, e.ckpt_dir, e.log_path, model, e.optimizer,
                                                                      cursor=0, adapter_name=e.name)
        check_best(e.out, e.log)
    model.set_adapter(experts[0].name)
    dist.broadcast_params(p for p in model.parameters() if p.requires_grad)
    n_trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)      # one expert's
    print(f"tasks {len(tasks)}, trainable params {n_trainable:,}" + (f" per expert, {len(experts)} experts" if joint else "")
          + f", profile {args.profile}: dynamic_sampling={args.dynamic_sampling} overlong_buffer={args.overlong_buffer} "
          f"kl_beta={args.kl_beta}")

    pool = None
    if source is None and score_fn is None:
        pool, score_fn = make_scorer(args, tasks)
    sampler = JointGenerate(model, tok, [e.name for e in experts]) if len(experts) > 1 else None
    release_fast = release_fast_default(args.release_fast)    # with several experts: once all their rollouts end
    for e in experts:
        e.joint = sampler
        e.source = source or make_model_source(
            score_fn, num_generations=args.group_size, max_new_tokens=args.max_new_tokens, seed=args.seed,
            rounds=args.rounds, chunk_size=args.gen_chunk, temperature=args.temperature,
            gen_batch_size=args.gen_batch_size, release_fast=release_fast and not sampler,
            answer_mode=getattr(args, "answer_mode", "testbench"), gen=sampler.member(e.name) if sampler else None)
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else (tok.eos_token_id or 0)
    for k, e in enumerate(experts):
        e.open_bar("rl", k, joint)
    live, paused, deadline_hit = list(experts), [], False
    try:
        while live:
            # validate when due, checkpoint, decide: each expert under its adapter; a paused one stops checkpointed
            # while the others go on to their own step
            left, deadline_hit = members_between_steps(
                live, model=model, tok=tok, val_tasks=val_tasks, deadline=deadline, plot_keys=PLOT_KEYS,
                release_fast=release_fast, finish=lambda e: finish_expert(e, model, tasks, n_trainable, val_tasks))
            paused += [e for e in left if e.end == "pause"]
            finished += [e for e in left if e.end != "pause"]
            if deadline_hit or not live:
                break
            # ---------------------------------------------------------------- one RL step of every live expert
            t0 = time.perf_counter()
            batches = joint_collect(live, lambda e: collect_groups(
                e.source, model, tok, tasks, step=e.step, cursor=e.cursor, prompts_per_step=args.prompts_per_step,
                rounds=args.rounds, seed=args.seed, dynamic_sampling=args.dynamic_sampling,
                max_extra_prompts=args.max_extra_prompts, overlong=(args.max_new_tokens, args.overlong_buffer),
                refill=args.refill))
            if sampler and release_fast:
                common.free_fast_cache(model)
            t1 = time.perf_counter()
            for e, (groups, all_groups, cursor, timings) in zip(live, batches):
                model.set_adapter(e.name)
                t2 = time.perf_counter()
                stats, micro = update(e, model, groups, args, ref_adapter, pad_id)
                t3 = time.perf_counter()
                e.cursor = cursor
                log_step(e, all_groups, groups, stats, timings, micro, t_rollout=t1 - t0, t_train=t3 - t2, args=args)
            deadline.tick()
    finally:
        for e in experts:
            if e.bar is not None:
                e.bar.close()
        if pool is not None:
            pool.close()
    if deadline_hit or paused:            # unfinished: no adapter/, result.json or done.json; --resume continues
        dist.barrier()                    # no rank exits before rank 0 has written (a launcher would kill it)
        return rundir.EXIT_DEADLINE
    return finished[-1].done


def update(e, model, groups, args, ref_adapter, pad_id):
    """One optimizer update of expert e (its adapter active) on its kept groups; (stats, micro-batch tokens)."""
    rows = [s for g in groups for s in g.samples]
    torch.manual_seed(derive_seed(args.seed, "train", e.step))
    micro = micro_tokens(model, rows, args.max_tokens_per_micro, e.micro_memo) if rows else None
    if not rows:                          # dynamic sampling found no informative group within the cap: no update
        return {"grad_norm": 0.0, "skipped": 1}, micro
    advantages = compute_advantages([s.reward for s in rows], args.group_size)
    return train_on_batch(model, e.optimizer, rows, advantages.tolist(), temperature=args.temperature,
                          epsilon_low=args.epsilon_low, epsilon_high=args.epsilon_high,
                          max_grad_norm=args.max_grad_norm, max_tokens_per_micro=micro,
                          steps_per_generation=args.steps_per_generation, beta=args.kl_beta,
                          ref_adapter=ref_adapter, pad_token_id=pad_id), micro


def log_step(e, all_groups, groups, stats, timings, micro, *, t_rollout, t_train, args):
    """Expert e's log row of the step it just took (log.jsonl, the progress line); advances its step."""
    row = {"step": e.step + 1, **rollout_metrics(all_groups), "groups": len(groups),
           "extra_prompts": timings["extra_prompts"], "unused_prompts": timings["unused_prompts"],
           **{k: v for k, v in stats.items() if not (isinstance(v, float) and math.isnan(v))},
           **{k: v for k, v in timings.items() if k.startswith("t_")}, "t_ckpt": e.t_ckpt,
           "t_rollout": t_rollout, "t_train": t_train, "lr": args.lr, "cursor": e.cursor,
           "micro_tokens": micro, **e.micro_memo.pop("probe", {})}
    fmt = lambda k, spec: format(row[k], spec) if row.get(k) is not None else "-"
    e.record(row, f"step {e.step + 1:5d}/{args.steps} | reward {fmt('reward', '.3f')} (max {fmt('reward_max', '.2f')}) "
            f"| pass {fmt('pass_rate', '.2f')} cov {fmt('coverage', '.3f')} compile {fmt('compile_rate', '.2f')} "
            f"| zero-std {fmt('frac_reward_zero_std', '.2f')} | clip {fmt('clip_ratio/low', '.3f')}/"
            f"{fmt('clip_ratio/high', '.3f')} | ent {fmt('entropy', '.3f')} | len {fmt('completions/mean_length', '.0f')} "
            f"| gnorm {fmt('grad_norm', '.3f')} | gen {row['t_gen']:.1f}s sim {row['t_sim']:.1f}s train {row['t_train']:.1f}s")


def finish_expert(e, model, tasks, n_trainable, val_tasks):
    """Expert e's final adapter, result.json and done.json (its adapter active); returns done.json's contents."""
    last = next((r for r in reversed(e.log) if not r.get("val")), {})       # the last training row
    val = {**val_summary(e.log, e.args.val_patience), "stopped_on_plateau": e.end == "plateau"} \
        if val_tasks is not None else {}
    return rundir.finish_run(e.out, "rl.py", model, {
        "config": e.config, "setup": {"tasks": len(tasks), "trainable_params": n_trainable},
        "outcome": {"steps": e.step, **{k: last.get(k) for k in ("reward", "pass_rate", "coverage", "compile_rate")},
                    **val}}, adapter_name=e.name)


def main(argv=None):
    return run(parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(rundir.cli("rl.py", main))
