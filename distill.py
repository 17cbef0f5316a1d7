"""Reward-gated multi-teacher on-policy distillation (OPD), the CHORUS main method (docs/method.md §6).

    python distill.py --model M --student best --val-metrics s0.json s1.json s2.json \
        --teachers runs/rl0/adapter runs/rl1/adapter runs/rl2/adapter --tasks TASKS.jsonl --out runs/opd
    python distill.py ... --out runs/opd runs/opd_nogate runs/opd_rlfb --variants gated nogate rlfb   # one process

One base model carries every adapter (peft, switched with set_adapter): the trainable "student"
and K frozen "teacher<i>" adapters. Per step:
 1. The student samples G rollouts per prompt with RL's two-round structure (onpolicy.py); each round is
    one group. Each teacher samples k rollouts (default 1) of the same group prompt. All are scored
    with sim.reward.
 2. Gate, per group: t* = argmax_t stat(teacher t's rewards) (ties -> lowest index); distill iff
    stat(t*) > stat(student) + eps. stat is "best" (max, the paper's Eq. 3) or "median".
 3. Passed groups: task reward is dropped and every student token gets the vOPD advantage
        A_t = -lam * ((log p_s(y_t) - log p_t*(y_t)) - b_t),
        b_t = sum_{k in TopK_s} q_s(k) (log q_s(k) - log q_t*(k))   (q renormalised on the student top-K)
    Failed groups: no gradient (--on-fail skip, the paper's 88.0% variant) or ordinary GRPO
    advantages (--on-fail rl). --no-gate always distills from t* (the "always distill" ablation).
 4. One clipped policy-gradient update (rl.dapo_loss); RL and OPD tokens are token-averaged
    separately and the two means summed (slime's policy_loss_function).

Rollouts, scoring, log-probs and the prompt-length filter (the same tasks as RL: --max-prompt-tokens) come
from onpolicy.py (shared with rl.py), the advantages and the optimizer step (compute_advantages,
train_on_batch) from rl.py, checkpoints and logs from rundir.py.
This file owns the teacher scoring, the pure gate, and the distillation advantage.

Validation (--val-tasks, off by default) works as in rl.py (onpolicy.validate_step): the student's direct
answers at step 0, every --val-every steps and the last step, log rows with "val": 1, OUT/best/adapter,
--stop-on-plateau.

Several students in one process (--out takes one folder per student, --variants one gate each: gated, nogate =
--no-gate, rlfb = --on-fail rl): the students of the OPD ablation share the start, teachers, prompts and budget, so
they are one run each (folder, checkpoints, log, optimizer, cursor; adapters student0..2) whose rollouts meet in
shared generate calls (jointgen.JointGenerate, as rl.py's experts). A teacher's answers to a prompt that several
students ask in the same call (every prompt of round 1, and of round 2 where their states agree) are decoded and
scored once and shared; each student gates its own groups against them. The teachers' answers to a prompt carry
their own seed (make_joint_teachers), so on the HF path (CPU) each student trains exactly as alone (a test); on the
fast path the rows' places in the shared call set their noise, so only the first student's own rows sample as alone.
Checkpoints name the weights "default", so a student resumes alone or jointly alike. chorus_mini's opd_joint (on in
small3) runs the due variants as one command.

Deviations from the paper: LoRA adapters on one (possibly 4-bit) base instead of full weights;
teachers are adapters sampled in-process instead of SGLang servers; the Icarus scorer instead of
xrun/IMC; run length and batch are flags (defaults: the authors' final OPD script where known).
"""
import argparse
import json
import math
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch

import common
import dist
import jointgen
import onpolicy
import rundir
import sim
from rl import compute_advantages, train_on_batch

GATE_STATS = ("best", "median")
ON_FAIL = ("skip", "rl")


# -----------------------------------------------------------------------------
# The gate (pure, no model)

def group_stat(rewards, stat="best"):
    """The statistic a gate compares: "best" = max, "median" = statistics.median (mean of the two
    middle values for an even count)."""
    rewards = [float(r) for r in rewards]
    if not rewards:
        raise ValueError("group_stat: empty reward list")
    if stat == "best":
        return max(rewards)
    if stat == "median":
        return statistics.median(rewards)
    raise ValueError(f"unknown gate statistic {stat!r} (choose from {GATE_STATS})")


@dataclass(frozen=True)
class GateDecision:
    teacher: int               # t*: the routed teacher, even when the gate fails (for logging)
    passed: bool               # distill from t* on this group
    student_stat: float
    teacher_stats: tuple       # stat of every teacher, in teacher order


def gate(student_rewards, teacher_rewards, eps=0.0, stat="best", always=False):
    """Route one group to a teacher and decide whether to distill.

    student_rewards: the G rewards of the student's group. teacher_rewards: one list per teacher
    (its k rollouts of the same prompt). t* = argmax of the teachers' statistic, ties to the lowest
    index; passes iff stat(t*) > stat(student) + eps (strict), or always with always=True (--no-gate).
    """
    if not teacher_rewards:
        raise ValueError("gate: no teachers")
    teacher_stats = tuple(group_stat(r, stat) for r in teacher_rewards)
    t_star = max(range(len(teacher_stats)), key=lambda i: (teacher_stats[i], -i))
    student_stat = group_stat(student_rewards, stat)
    passed = always or teacher_stats[t_star] > student_stat + eps
    return GateDecision(t_star, bool(passed), student_stat, teacher_stats)


def group_mode(decision, on_fail="skip"):
    """What a group trains with: "opd" (gate passed), else "rl" or "skip" per --on-fail."""
    if on_fail not in ON_FAIL:
        raise ValueError(f"unknown --on-fail {on_fail!r} (choose from {ON_FAIL})")
    return "opd" if decision.passed else on_fail


# -----------------------------------------------------------------------------
# The distillation advantage (pure tensors)

def topk_reverse_kl(student_logits, teacher_logits, k=16):
    """b_t: reverse KL(q_s || q_t) with both distributions renormalised over the student's top-k
    tokens at each position. Logits or log-probs (..., V), already divided by the temperature;
    returns (...). Renormalising makes the result independent of any per-position offset."""
    k = min(k, student_logits.shape[-1])
    top_ids = student_logits.topk(k, dim=-1).indices                       # (..., k)
    return support_reverse_kl(student_logits.gather(-1, top_ids), teacher_logits.gather(-1, top_ids))


def support_reverse_kl(student_support, teacher_support):
    """The same KL from values already gathered on the support (..., k): onpolicy.per_token_logps gives
    the student's top-k log-probs (topk=K) and the teacher's at those ids (gather_ids=...)."""
    dtype = torch.promote_types(student_support.dtype, torch.float32)     # bf16 -> fp32
    log_q_s = student_support.to(dtype).log_softmax(-1)                   # renormalise on the support
    log_q_t = teacher_support.to(dtype).log_softmax(-1)
    return (log_q_s.exp() * (log_q_s - log_q_t)).sum(-1)


def vopd_advantages(student_logps, teacher_logps, b, lam=1.0):
    """A_t = -lam * ((log p_s(y_t) - log p_t*(y_t)) - b_t), all detached (the advantage is a
    constant in the policy gradient). student_logps/teacher_logps: log-probs of the sampled tokens."""
    log_ratio = student_logps.detach() - teacher_logps.detach()
    return -lam * (log_ratio - b.detach())


# -----------------------------------------------------------------------------
# Teachers: their rollouts (for the gate) and their log-probs (for the advantage)

def make_teacher_source(score_fn, *, num_samples, max_new_tokens, seed, temperature=1.0,
                        gen_batch_size=64):
    """The real teacher source: each teacher adapter samples `num_samples` answers to every group's
    prompt (round-2 groups: the student's refinement state), scored like the student's.
    Returns teacher_source(model, tok, groups, group_tasks, teachers, *, step) ->
    (rewards[group][teacher] = list of num_samples floats, timings). All teachers sample in one decoder call
    whose seed derives from (seed, step), so a resumed run repeats them; each answer's simulation starts as its
    row finishes (common.generate's on_done)."""

    def teacher_source(model, tok, groups, group_tasks, teachers, *, step):
        k, timings = num_samples, {"t_gen": 0.0, "t_sim": 0.0}
        messages_list = [g.samples[0].messages for g in groups for _ in range(k)]
        tasks_list = [t for t in group_tasks for _ in range(k)]
        n = len(messages_list)
        row_tasks, waits = tasks_list * len(teachers), [None] * (n * len(teachers))

        def on_done(r, c):                # its simulation starts while the other rows still decode
            if waits[r] is None:
                waits[r] = score_fn(row_tasks[r], c)
        t0 = time.perf_counter()
        # every teacher in one decoder call (fastgen's stack rule): OPD's batches are small, and a decode step
        # of a small batch costs about the same for every teacher's rows as for one teacher's
        completions = common.generate(model, tok, messages_list * len(teachers),
                                      adapters=[name for name in teachers for _ in range(n)],
                                      max_new_tokens=max_new_tokens, temperature=temperature, top_p=1.0,
                                      batch_size=gen_batch_size,
                                      seed=onpolicy.derive_seed(seed, "teacher", step,
                                                                *([dist.rank()] if dist.world() > 1 else [])),
                                      on_done=on_done)
        timings["t_gen"] += time.perf_counter() - t0
        for r, c in enumerate(completions):
            on_done(r, c)
        t0 = time.perf_counter()
        rewards = [w().reward for w in waits]                                    # teacher-major: [teacher * n]
        timings["t_sim"] += time.perf_counter() - t0
        return [[rewards[i * n + g * k:i * n + (g + 1) * k] for i in range(len(teachers))]
                for g in range(len(groups))], timings
    return teacher_source


def make_joint_teachers(score_fn, teachers, *, num_samples, group_size, scores=None):
    """The teachers sampled inside the student's own generate calls (one process): each of the student's rollout
    calls (onpolicy.make_model_source's `extra`) adds num_samples rows per teacher for each of its prompts, after
    the student's rows, so one decoder call serves the student and every teacher (one per round when --gen-chunk
    covers the step's prompts), and the student's rows keep their place and seed (their samples are those of a
    call without the teachers: exactly on the HF path and in fp32; in bf16 the stacked LoRA rounds differently).
    A teacher's answers to one prompt carry a seed of their own, from the call's seed, the teacher, the prompt and
    its place in the call: on the HF path they are a generate call of their own with it, so they depend on nothing
    else in the call, and students of one process that ask a teacher the same prompt in the same call get the same
    answers, decoded once (jointgen.JointGenerate).
    Returns (extra, teacher_source): teacher_source scores the stashed answers to each group's prompt, with
    make_teacher_source's return shape. A prompt asked twice in a step (two groups of one task across an epoch's
    end) keeps both sets of answers, one per group, in order. scores: a dict the students of one process share,
    so an answer they share is scored once (the caller empties it after each step). Given the rows' tasks, extra's
    done submits each answer's simulation as its row finishes decoding; teacher_source then only waits."""
    stash, own = {}, {}                   # own: the answers scored so far when no shared `scores` dict is given
    memo = scores if scores is not None else own
    key = lambda messages: json.dumps(messages, sort_keys=True)          # noqa: E731

    def extra(messages_list, call_seed, tasks=None):
        if len(messages_list) % group_size:
            raise ValueError(f"joint teachers: {len(messages_list)} rows are not prompts x {group_size} samples")
        prompts = messages_list[::group_size]        # the rollouts repeat each prompt group_size times in a row
        more = [m for _ in teachers for m in prompts for _ in range(num_samples)]
        names = [name for name in teachers for _ in prompts for _ in range(num_samples)]
        seeds = [onpolicy.derive_seed(call_seed, "teacher", name, j, key(m))
                 for name in teachers for j, m in enumerate(prompts) for _ in range(num_samples)]
        n = len(prompts) * num_samples

        def take(completions):
            for j, m in enumerate(prompts):
                stash.setdefault(key(m), []).append(
                    [completions[i * n + j * num_samples:i * n + (j + 1) * num_samples] for i in range(len(teachers))])

        def done(r, c):                              # extra row r: teacher r // n, prompt (r % n) // num_samples
            score(tasks[(r % n) // num_samples * group_size], c)
        return more, names, seeds, take, (done if tasks is not None else None)

    def score(task, c):
        if id(c) not in memo:                        # the answer object itself is kept, so its id stays its own
            wait, got = score_fn(task, c), []

            def once():
                if not got:
                    got.append(wait())
                return got[0]
            memo[id(c)] = (c, once)
        return memo[id(c)][1]

    def teacher_source(model, tok, groups, group_tasks, names, *, step):
        if list(names) != list(teachers):
            raise ValueError(f"joint teachers: asked for {names}, sampled {teachers}")
        missing = [g.samples[0].task_id for g in groups if not stash.get(key(g.samples[0].messages))]
        if missing:
            raise RuntimeError(f"joint teachers: no teacher answers for the prompts of {missing[:3]} "
                               "(the rollouts ran without make_joint_teachers' extra rows)")
        waits = [[[score(task, c) for c in answers] for answers in stash[key(g.samples[0].messages)].pop(0)]
                 for g, task in zip(groups, group_tasks)]
        t0 = time.perf_counter()
        rewards = [[[w().reward for w in ws] for ws in per_teacher] for per_teacher in waits]
        stash.clear()                                 # one step's answers: the next step's prompts are others
        own.clear()
        return rewards, {"t_gen": 0.0, "t_sim": time.perf_counter() - t0}
    return extra, teacher_source


def distill_advantages(model, rows, teacher, *, temperature=1.0, topk=16, lam=1.0, pad_token_id=0,
                       max_tokens_per_micro=16384, chunk_tokens=1024):
    """Per-token vOPD advantages of student-sampled rows toward one teacher adapter.

    The student (the active adapter) and the teacher are scored without grad on the same tokens;
    both divide their logits by the sampling temperature (onpolicy.per_token_logps). The student's top-K
    ids at each position are the support of b_t; the teacher is scored on those ids.
    Returns (advantages: one 1-D tensor per row, sums: {"log_ratio", "b", "advantage", "tokens"}).
    """
    advantages, sums = [None] * len(rows), {"log_ratio": 0.0, "b": 0.0, "advantage": 0.0, "tokens": 0}
    with torch.no_grad():
        for mb in onpolicy.micro_batches(rows, max_tokens_per_micro):
            mb_rows = [rows[i] for i in mb]
            kw = dict(temperature=temperature, pad_token_id=pad_token_id, chunk_tokens=chunk_tokens)
            student = onpolicy.per_token_logps(model, mb_rows, topk=topk, **kw)
            with common.use_adapter(model, teacher):
                teacher_out = onpolicy.per_token_logps(model, mb_rows, gather_ids=student.topk_ids, **kw)
            b = support_reverse_kl(student.topk_logps, teacher_out.topk_logps)          # (B, T)
            adv = vopd_advantages(student.logps, teacher_out.logps, b, lam)           # (B, T)
            mask = student.mask
            sums["log_ratio"] += float(((student.logps - teacher_out.logps) * mask).sum())
            sums["b"] += float((b * mask).sum())
            sums["advantage"] += float((adv * mask).sum())
            sums["tokens"] += int(mask.sum())
            for j, i in enumerate(mb):
                advantages[i] = adv[j, :len(rows[i].completion_ids)].float().cpu()
    return advantages, sums


# -----------------------------------------------------------------------------
# Choosing the student and the teachers

def val_score(path):
    """(Pass@1, Cov@1) of an evaluate.py metrics.json (or a folder holding one): agentic when
    present, else direct."""
    path = Path(path)
    if path.is_dir():
        path = path / "metrics.json"
    metrics = json.loads(path.read_text())
    mode = metrics.get("agentic") or metrics.get("direct")
    if not mode or "pass@1" not in mode:
        raise SystemExit(f"{path}: no agentic/direct pass@1 (expected an evaluate.py metrics.json)")
    return float(mode["pass@1"]), float(mode.get("cov@1", 0.0))


def choose_experts(student, teachers, val_metrics=None):
    """(student adapter, teacher adapters). student="best": the expert of `teachers` with the best
    validation (Pass@1, then Cov@1; ties -> first), and the others are the teachers (paper: student =
    the best expert, teachers = the other experts). A student path that is also listed as a teacher
    is removed from the teachers."""
    if student == "best":
        if not val_metrics or len(val_metrics) != len(teachers):
            raise SystemExit("--student best needs --val-metrics with one metrics file per --teachers entry")
        scores = [val_score(m) for m in val_metrics]
        best = max(range(len(scores)), key=lambda i: (scores[i], -i))
        print("validation (pass@1, cov@1): " + ", ".join(f"{t}: {s}" for t, s in zip(teachers, scores))
              + f" -> student {teachers[best]}")
        student = teachers[best]
    same = lambda a, b: Path(a).resolve() == Path(b).resolve()
    kept = [t for t in teachers if not same(t, student)]
    if len(kept) < len(teachers):
        print(f"note: the student {student} is not used as its own teacher")
    if not kept:
        raise SystemExit("no teacher left: pass at least one --teachers adapter other than the student")
    return student, kept


def teacher_name(i):
    return f"teacher{i}"


def build_models(args, student, teachers, students=None):
    """One base model with the student as the trainable "default" adapter (onpolicy.build_policy), or one trainable
    copy of it per name in students (several students in one process), and each teacher as a frozen adapter
    "teacher<i>"; the (first) student is left active."""
    policy_args = argparse.Namespace(model=args.model, quant=args.quant, seed=args.seed, adapter=student,
                                     lora_r=None, lora_alpha=None, kl_beta=0.0,
                                     gradient_checkpointing=args.gradient_checkpointing)
    model, tok, _ = onpolicy.build_policy(policy_args, adapters={n: student for n in students} if students else None)
    for i, path in enumerate(teachers):
        common.load_adapter(model, path, adapter_name=teacher_name(i), trainable=False)
    model.set_adapter(students[0] if students else "default")   # active and trainable again; the teachers frozen
    onpolicy.disable_dropout(model)             # the teachers' LoRA dropout too
    return model, tok


def inherited_lr(student):
    """The LR of the RL run that produced the student adapter (OUT/result.json beside OUT/adapter),
    or None."""
    result = Path(student).parent / "result.json"
    try:
        return float(json.loads(result.read_text())["config"]["lr"])
    except (OSError, KeyError, TypeError, ValueError):
        return None


# -----------------------------------------------------------------------------
# The run

PLOT_KEYS = ["reward", "val/reward", "reward_max", "teacher_reward_best", "gate_pass_rate", "skipped_groups",
             "opd/log_ratio", "opd/b", "opd/advantage", "clip_ratio/low", "clip_ratio/high", "entropy",
             "grad_norm", "completions/mean_length", "t_gen", "t_sim", "t_train"]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    # Model, student and teachers
    p.add_argument("--model", default=None, help="HF id, folder or GGUF (None: SmolLM2 GGUF); 'tiny' = random test model")
    common.add_gpu_mem_arg(p)
    p.add_argument("--quant", default="auto", help="passed to common.load_model: auto | 4bit | none")
    p.add_argument("--student", default="best", help="student adapter to start from, or 'best' (needs --val-metrics)")
    p.add_argument("--teachers", nargs="+", required=True, help="expert adapters (the student is dropped from them)")
    p.add_argument("--val-metrics", nargs="+", default=None, help="evaluate.py metrics.json per --teachers entry, for --student best")
    p.add_argument("--tasks", required=True, help="task JSONL (sim.load_tasks)")
    p.add_argument("--out", nargs="+", required=True, metavar="FOLDER",
                   help="output folder: ckpt/, log.jsonl, curves.png, adapter/, done.json; several (one --variants "
                        "entry each): one student each, trained in one process")
    # Horizon and batch
    p.add_argument("--steps", type=int, default=100, help="optimizer updates (paper: 100, unverified)")
    p.add_argument("--prompts-per-step", type=int, default=4, help="prompts per step (authors' final script: 4)")
    p.add_argument("--group-size", type=int, default=4, help="G student samples per group (paper: 4)")
    p.add_argument("--rounds", type=int, default=2, help="groups per prompt, as in RL (paper: 2)")
    p.add_argument("--teacher-samples", type=int, default=1, help="k rollouts per teacher and group (final script: 1)")
    p.add_argument("--max-new-tokens", type=int, default=1024, help="response cap, student and teachers")
    p.add_argument("--temperature", type=float, default=1.0, help="rollout temperature; log-probs use the same (paper: 1.0)")
    onpolicy.add_rollout_args(p)
    # Gate and loss
    p.add_argument("--gate-stat", default="best", choices=GATE_STATS, help="reward statistic the gate compares (paper: best)")
    p.add_argument("--eps", type=float, default=0.0, help="gate margin: distill iff teacher > student + eps (paper: 0)")
    p.add_argument("--no-gate", action="store_true", help="always distill from t* (the 'always distill' ablation)")
    p.add_argument("--on-fail", default="skip", choices=ON_FAIL, help="closed gate: no gradient (paper) or a GRPO update")
    p.add_argument("--variants", nargs="+", default=None, choices=list(VARIANTS), metavar="VARIANT",
                   help="each --out's student's gate, in order: " + "; ".join(f"{k} = {v[0]}" for k, v in
                                                                             VARIANTS.items())
                   + " (instead of --no-gate / --on-fail; --gate-stat and --eps hold for all). The students share "
                     "the student start, teachers, prompts and budget, and the teachers' answers to a prompt they "
                     "share are decoded once")
    p.add_argument("--topk", type=int, default=16, help="student top-K support of the control variate b_t (paper: 16)")
    p.add_argument("--lam", type=float, default=1.0, help="lambda, the OPD advantage scale (paper: 1.0)")
    p.add_argument("--lr", type=float, default=None, help="constant LR (None: the student's RL run's LR, else 2e-5)")
    p.add_argument("--epsilon-low", type=float, default=0.2)
    p.add_argument("--epsilon-high", type=float, default=0.28, help="DAPO clip-higher, as in RL")
    p.add_argument("--max-grad-norm", type=float, default=1.0)
    p.add_argument("--max-tokens-per-micro", type=common.parse_tokens_per_micro, default=16384,
                   help="padded tokens per micro-batch; 'auto' = sized from the free GPU memory (onpolicy.micro_tokens)")
    onpolicy.add_runtime_args(p, save_every=10)
    p.add_argument("--cursor-start", type=int, default=0,
                   help="first position in the seeded task order: OPD continues on prompts RL has not used "
                        "(the authors' --dataset-step-offset; the pipeline passes RL steps x prompts per step)")
    args = p.parse_args(argv)
    outs, variants = args.out, args.variants
    if variants is not None or len(outs) > 1:
        if variants is None or len(variants) != len(outs):
            p.error(f"several students need one --variants entry per --out (got {len(variants or [])} and {len(outs)})")
        if args.no_gate or args.on_fail != "skip":
            p.error("--variants sets each student's gate: leave out --no-gate and --on-fail")
        if rundir.shared_folders(outs):
            p.error("each student needs its own --out folder")
        if len(outs) > 1:                 # in each student's config: who trained beside it
            args.joint = {"variants": variants, "outs": outs}
        else:
            vars(args).update(VARIANTS[variants[0]][1])
    args.out = outs[0]
    rundir.check_options("distill.py", args, {**onpolicy.SHARED_RANGES, **RANGES})
    return args


# --variants: a student's gate flags (chorus_mini's opd, opd_nogate and opd_rlfb stages)
VARIANTS = {"gated": ("the gate, closed groups skipped (the paper)", {"no_gate": False, "on_fail": "skip"}),
            "nogate": ("always distill (--no-gate)", {"no_gate": True, "on_fail": "skip"}),
            "rlfb": ("the gate, GRPO on closed groups (--on-fail rl)", {"no_gate": False, "on_fail": "rl"})}


# Checked before any work, as rl.py's: `--steps 0` would hand on the untrained student as a finished run
RANGES = {"steps": rundir.at_least(1), "prompts_per_step": rundir.at_least(1), "group_size": rundir.at_least(1),
          "rounds": rundir.at_least(1), "teacher_samples": rundir.at_least(1), "max_new_tokens": rundir.at_least(1),
          "temperature": rundir.above(0), "topk": rundir.at_least(1), "lr": rundir.above(0),
          "epsilon_low": rundir.within(0, 1), "epsilon_high": rundir.at_least(0), "max_grad_norm": rundir.above(0),
          "cursor_start": rundir.at_least(0)}


def step_metrics(groups, decisions, modes, teacher_rewards, n_teachers):
    """Gate and teacher numbers of one step (student reward etc. come from onpolicy.rollout_metrics)."""
    n = max(len(groups), 1)
    mean = lambda xs: float(sum(xs) / len(xs)) if xs else None
    m = {"groups": len(groups),
         "gate_pass_rate": sum(d.passed for d in decisions) / n,
         "opd_groups": modes.count("opd"), "rl_groups": modes.count("rl"), "skipped_groups": modes.count("skip"),
         "student_reward_best": mean([max(g.rewards) for g in groups]),
         "teacher_reward_best": mean([max(max(r) for r in tr) for tr in teacher_rewards])}
    for t in range(n_teachers):
        m[f"teacher_chosen/t{t}"] = sum(1 for d, mo in zip(decisions, modes) if mo == "opd" and d.teacher == t)
        m[f"teacher_reward/t{t}"] = mean([r for tr in teacher_rewards for r in tr[t]])
    return m


def make_students(args):
    """The students of a run, one per --out with its --variants gate (onpolicy.make_members: those to train, those
    finished)."""
    joint = getattr(args, "joint", None) or {}
    return onpolicy.make_members(args, "student", [{"out": o, **VARIANTS[v][1]} for v, o in
                                                   zip(joint.get("variants", []), joint.get("outs", []))], "distill.py")


def run(args, *, source=None, teacher_source=None, score_fn=None, tasks=None):
    """Train. source (onpolicy.make_model_source's rollout source: (model, tok, tasks, *, step, first_index) -> (groups,
    timings)) and teacher_source (see make_teacher_source) replace the model+simulator defaults
    (tests pass scripted ones); score_fn replaces only the scorer of both.
    Several processes (dist.py): each rank rolls out its block of the prompts, its block of the groups'
    teacher rollouts and its block of the distillation advantages; every rank gets all of them back and
    train_on_batch sums the gradients, so the update is the one of one process on the same batch.
    Several students (--out X Y Z --variants ...; one process): each is a run of its own (folder, checkpoints, log,
    optimizer, cursor) under its adapter; their rollouts meet in shared generate calls (jointgen.JointGenerate)
    where a teacher's answers to a prompt several students ask are decoded and scored once, and each student gates
    its own groups against them. On the HF path (CPU) each student trains exactly as alone (a test)."""
    dist.init()           # several processes: join the group before the model lands on this rank's GPU
    students, finished = make_students(args)
    if not students:
        return finished[-1].done
    deadline = rundir.Deadline()          # $CHORUS_DEADLINE: stop between steps, checkpointed (read before loading)
    student, teachers = choose_experts(args.student, args.teachers, args.val_metrics)
    if args.lr is None:
        args.lr = inherited_lr(student)
        print(f"Inherited lr {args.lr} from the student's RL run" if args.lr is not None
              else "lr: 2e-05 (default; the student's RL run has no result.json)")
        args.lr = 2e-5 if args.lr is None else args.lr
    for s in students:
        s.args.lr = args.lr
        s.config = dict(vars(s.args), student=student, teachers=teachers)
    print("distill.py config: " + json.dumps(students[0].config))
    if tasks is None:
        tasks = sim.load_tasks(args.tasks)
        if not tasks:
            raise ValueError(f"--tasks {args.tasks}: the file has no tasks")
    val_tasks = onpolicy.load_val_tasks(args)          # None: no validation
    joint = len(students) > 1 or getattr(args, "joint", None)
    model, tok = build_models(args, student, teachers, [s.name for s in students] if joint else None)
    tasks = onpolicy.filter_long_prompts(tasks, tok, model, args)   # as rl.py: prompts that fit both rounds
    names = [teacher_name(i) for i in range(len(teachers))]
    for s in students:
        model.set_adapter(s.name)                     # its weights alone are trainable: its optimizer holds them
        s.optimizer = onpolicy.make_optimizer(model, args.lr)
        s.step, s.cursor, s.log, s.resumed_step = rundir.resume_state(
            s.args, s.ckpt_dir, s.log_path, model, s.optimizer, cursor=args.cursor_start, adapter_name=s.name)
        onpolicy.check_best(s.out, s.log)
    model.set_adapter(students[0].name)
    dist.broadcast_params(p for p in model.parameters() if p.requires_grad)
    n_trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)      # one student's
    print(f"tasks {len(tasks)}, trainable params {n_trainable:,}" + (f" per student, {len(students)} students"
                                                                     if joint else "")
          + f", teachers {len(teachers)}: " + ", ".join(f"t{i}={t}" for i, t in enumerate(teachers))
          + " | " + ", ".join(f"{s.name}: gate {'off' if s.args.no_gate else f'{args.gate_stat} + eps {args.eps}'}, "
                              f"on fail {s.args.on_fail}" for s in students))

    pool, scores = None, {}               # scores: the teachers' answers the students share, scored once a step
    sampler = jointgen.JointGenerate(model, tok, [s.name for s in students]) if len(students) > 1 else None
    if (source is None or teacher_source is None) and score_fn is None:
        pool, score_fn = onpolicy.make_scorer(args, tasks)
    gen = dict(max_new_tokens=args.max_new_tokens, seed=args.seed, temperature=args.temperature,
               gen_batch_size=args.gen_batch_size)
    for s in students:
        s.joint, extra, s.teacher_source = sampler, None, teacher_source
        if source is None and teacher_source is None and dist.world() == 1:   # teachers in the student's calls
            extra, s.teacher_source = make_joint_teachers(score_fn, names, num_samples=args.teacher_samples,
                                                          group_size=args.group_size, scores=scores)
        s.source = source or onpolicy.make_model_source(
            score_fn, num_generations=args.group_size, rounds=args.rounds, chunk_size=args.gen_chunk, **gen,
            answer_mode=getattr(args, "answer_mode", "testbench"), extra=extra,
            gen=sampler.member(s.name) if sampler else None)
        s.teacher_source = s.teacher_source or make_teacher_source(score_fn, num_samples=args.teacher_samples, **gen)
    release_fast = onpolicy.release_fast_default(args.release_fast)
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else (tok.eos_token_id or 0)
    for k, s in enumerate(students):
        s.open_bar("distill", k, joint)
    live, paused, deadline_hit = list(students), [], False
    try:
        while live:
            left, deadline_hit = onpolicy.members_between_steps(
                live, model=model, tok=tok, val_tasks=val_tasks, deadline=deadline, plot_keys=PLOT_KEYS,
                release_fast=release_fast, finish=lambda s: finish_student(s, model, tasks, n_trainable, val_tasks))
            paused += [s for s in left if s.end == "pause"]
            finished += [s for s in left if s.end != "pause"]
            if deadline_hit or not live:
                break
            # ---------------------------------------------------------------- every live student's rollouts
            t0 = time.perf_counter()
            batches = jointgen.joint_collect(live, lambda s: onpolicy.collect_groups(
                s.source, model, tok, tasks, step=s.step, cursor=s.cursor, prompts_per_step=args.prompts_per_step,
                rounds=args.rounds, seed=args.seed))
            t_collect = time.perf_counter() - t0
            teacher_parts = [teacher_answers(s, model, tok, tasks, groups, names)
                             for s, (groups, _, _, _) in zip(live, batches)]
            scores.clear()
            if release_fast:         # the training phase gets the decoder's packed weights and KV cache back
                common.free_fast_cache(model)
            for s, (groups, _, cursor, timings), (teacher_rewards, t_timings, t_teacher) in zip(live, batches,
                                                                                                teacher_parts):
                model.set_adapter(s.name)
                s.cursor = cursor
                train_step(s, model, groups, teacher_rewards, names, args, pad_id,
                           {**timings, "t_gen": timings["t_gen"] + t_timings["t_gen"],
                            "t_sim": timings["t_sim"] + t_timings["t_sim"], "t_teacher_gen": t_timings["t_gen"],
                            "t_teacher_sim": t_timings["t_sim"], "t_rollout": t_collect + t_teacher})
            deadline.tick()
    finally:
        for s in students:
            if s.bar is not None:
                s.bar.close()
        if pool is not None:
            pool.close()
    if deadline_hit or paused:            # unfinished: no adapter/, result.json or done.json; --resume continues
        dist.barrier()                    # no rank exits before rank 0 has written (a launcher would kill it)
        return rundir.EXIT_DEADLINE
    return finished[-1].done


def teacher_answers(s, model, tok, tasks, groups, names):
    """The teachers' rewards on student s's groups (rank blocks gathered) -> (rewards, their t_gen / t_sim, seconds)."""
    t0 = time.perf_counter()
    group_tasks = [tasks[onpolicy.task_order(g.index, len(tasks), s.args.seed)] for g in groups]
    lo, hi = dist.shard_range(len(groups))          # this rank's block of the groups
    mine = (s.teacher_source(model, tok, groups[lo:hi], group_tasks[lo:hi], names, step=s.step)
            if hi > lo or dist.world() == 1 else ([], {}))
    parts = dist.gather(mine)
    t_timings = {k: max(t.get(k, 0.0) for _, t in parts) for k in ("t_gen", "t_sim")}
    return [r for rs, _ in parts for r in rs], t_timings, time.perf_counter() - t0


def train_step(s, model, groups, teacher_rewards, names, args, pad_id, timings):
    """Student s's gate, advantages, update and log row of one step (its adapter active); advances its step."""
    t1 = time.perf_counter()
    decisions = [gate(g.rewards, tr, args.eps, args.gate_stat, always=s.args.no_gate)
                 for g, tr in zip(groups, teacher_rewards)]
    modes = [group_mode(d, s.args.on_fail) for d in decisions]
    # ---------------------------------------------------------------- advantages and one update
    rows, advantages, labels = [], [], []
    for g, mode in zip(groups, modes):       # closed gate with --on-fail rl: GRPO on the task reward
        if mode == "rl":
            rows += g.samples
            advantages += compute_advantages(g.rewards, len(g.samples)).tolist()
            labels += ["rl"] * len(g.samples)
    every = [x for g, mode in zip(groups, modes) if mode in ("rl", "opd") for x in g.samples]
    micro = onpolicy.micro_tokens(model, every, args.max_tokens_per_micro, s.micro_memo) if every else None
    kl = {"log_ratio": 0.0, "b": 0.0, "advantage": 0.0, "tokens": 0}
    for t, name in enumerate(names):         # open gate: task reward dropped, distill toward t*
        opd_rows = [x for g, d, mode in zip(groups, decisions, modes) if mode == "opd" and d.teacher == t
                    for x in g.samples]
        if opd_rows:
            lo, hi = dist.shard_range(len(opd_rows))    # this rank's block; all ranks get every row's
            adv, sums = distill_advantages(model, opd_rows[lo:hi], name, temperature=args.temperature,
                                           topk=args.topk, lam=args.lam, pad_token_id=pad_id,
                                           max_tokens_per_micro=micro)
            adv, sums = dist.gather_lists(adv), dist.all_sum(sums)
            rows, advantages, labels = rows + opd_rows, advantages + adv, labels + ["opd"] * len(opd_rows)
            kl = {k: kl[k] + sums[k] for k in kl}
    t_adv = time.perf_counter() - t1    # teacher log-probs on the student's samples (the OPD advantages)
    torch.manual_seed(onpolicy.derive_seed(args.seed, "train", s.step))
    if rows:   # RL and OPD tokens are token-averaged separately, then summed (norm_groups)
        stats = train_on_batch(model, s.optimizer, rows, advantages, temperature=args.temperature,
                               epsilon_low=args.epsilon_low, epsilon_high=args.epsilon_high,
                               max_grad_norm=args.max_grad_norm, norm_groups=labels,
                               max_tokens_per_micro=micro, pad_token_id=pad_id)
    else:      # every group skipped: no gradient and no optimizer step
        stats = {"grad_norm": 0.0}
    t2 = time.perf_counter()
    # ---------------------------------------------------------------- logging
    row = {"step": s.step + 1, **onpolicy.rollout_metrics(groups),
           **step_metrics(groups, decisions, modes, teacher_rewards, len(names)),
           **({f"opd/{k}": kl[k] / kl["tokens"] for k in ("log_ratio", "b", "advantage")} if kl["tokens"] else {}),
           **{k: v for k, v in stats.items() if not (isinstance(v, float) and math.isnan(v))},
           **{k: v for k, v in timings.items() if k.startswith("t_")}, "t_adv": t_adv, "t_ckpt": s.t_ckpt,
           "t_train": t2 - t1, "lr": args.lr, "cursor": s.cursor, "micro_tokens": micro,
           **s.micro_memo.pop("probe", {})}
    fmt = lambda k, spec: format(row[k], spec) if row.get(k) is not None else "-"
    chosen = "/".join(str(row[f"teacher_chosen/t{t}"]) for t in range(len(names)))
    s.record(row, f"step {s.step + 1:5d}/{args.steps} | reward {fmt('reward', '.3f')} (best/group {fmt('student_reward_best', '.2f')}"
            f" vs teachers {fmt('teacher_reward_best', '.2f')}) | gate {fmt('gate_pass_rate', '.2f')} "
            f"chosen {chosen} skip {row['skipped_groups']} rl {row['rl_groups']} | log-ratio "
            f"{fmt('opd/log_ratio', '.3f')} b {fmt('opd/b', '.3f')} | clip {fmt('clip_ratio/low', '.3f')}/"
            f"{fmt('clip_ratio/high', '.3f')} | gnorm {fmt('grad_norm', '.3f')} | gen {row['t_gen']:.1f}s "
            f"sim {row['t_sim']:.1f}s train {row['t_train']:.1f}s")


def finish_student(s, model, tasks, n_trainable, val_tasks):
    """Student s's final adapter, result.json and done.json (its adapter active); returns done.json's contents."""
    train_log = [r for r in s.log if not r.get("val")]         # the training rows (val rows: validate_step)
    steps_with = lambda k: [r[k] for r in train_log if r.get(k) is not None]
    mean_over_steps = lambda k: sum(steps_with(k)) / len(steps_with(k)) if steps_with(k) else None
    n_teachers = len(s.config["teachers"])
    outcome = {"reward_last": train_log[-1].get("reward") if train_log else None,
               **{k: mean_over_steps(k) for k in ("reward", "gate_pass_rate", "teacher_reward_best",
                                                  "opd/log_ratio", "opd/b")},
               **{k: sum(steps_with(k)) for k in ["opd_groups", "rl_groups", "skipped_groups"]
                  + [f"teacher_chosen/t{t}" for t in range(n_teachers)]}}
    if val_tasks is not None:
        outcome.update(onpolicy.val_summary(s.log, s.args.val_patience), stopped_on_plateau=s.end == "plateau")
    return rundir.finish_run(s.out, "distill.py", model, {
        "config": s.config, "outcome": {"steps": s.step, **outcome},
        "setup": {"tasks": len(tasks), "trainable_params": n_trainable, "student": s.config["student"],
                  "teachers": s.config["teachers"]}}, adapter_name=s.name)


def main(argv=None):
    return run(parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(rundir.cli("distill.py", main))
