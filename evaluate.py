"""Evaluation protocol: the memoryless agentic loop, the paper's metrics, model comparison, and the
everyday `generate` command. Every later stage reports its numbers through this file.

    python evaluate.py eval --model M [--adapter A] --tasks T.jsonl --out DIR [--n 5 --rounds 3]
    python evaluate.py eval --model M --adapter A B C --tasks T.jsonl --out X Y Z ...   # several models, one process
    python evaluate.py compare DIR1 DIR2 ... --out DIR
    python evaluate.py claims EVAL_DIR [--out claims.json]      # (a)-(d) of the paper, with verdicts
    python evaluate.py generate --model M [--adapter A] --rtl a.sv b.sv --top TOP [--inst uut]
(`python chorus_mini.py eval|compare|generate ...` are the same commands.)

The loop (docs/method.md §1.6), per task and sample, rounds r = 0..R (R = --rounds, default 3):
1. r = 0 sees the initial prompt [system, user] (common.build_messages); this is direct mode.
2. r >= 1 sees the memoryless state [system, user, best-so-far testbench, its feedback]
   (common.refine_messages); no other history.
3. Each answer is parsed and, when usable (not no_code / truncated), simulated (score.submit_answer,
   on a simpool.SimPool). Simulations of one batch run while the policy generates the next batch, and a
   policy that `streams` (model_policy) hands each answer on as its row finishes, so its simulation starts then.
4. The best-so-far is replaced whenever the new result is >= it under the ordering of result_key():
   (parsed, compiles, simulates, has coverage, passes targets, overall coverage), the LLM4Cov
   CovResult order (compiles, has coverage, passes targets, overall) with two refinements: an
   unparsed or truncated answer ranks below everything (the original client retried it, so it never became a
   state, and with no parsed best the next round starts again from the initial prompt), and "compiles"
   is split into compiles / compiles-and-simulates.
5. A sample stops once its best reaches 100% coverage. Its score is its best result over all rounds.
Per-round bests are recorded, so one agentic run gives both the direct metrics (round 0) and the
agentic metrics (last round).
Answer modes (--answer-mode, harness.py): testbench (the above: whole testbenches) or stimulus (the prompt
shows the kit's harness, the model writes the stimulus, the kit assembles and scores harness + stimulus;
refinement feedback names the stimulus's own lines). A design the kit cannot harness is answered in
testbench mode (metrics: answer_mode_fallbacks); each sample records the mode it was answered in.

Metrics (docs/method.md §2.3), all in percent, over tasks (each task weighs the same):
- Pass@k: unbiased estimator 1 - C(n-c, k)/C(n, k) per task (c = passing samples); Pass@n = any pass.
- Cov@1: mean over samples of the best overall coverage (a failed simulation counts as 0);
  Cov@k: expected max over k of the n samples (Cov@n = max).
- SynPass: samples whose best testbench compiles and simulates.
- failures: the best results' statuses in the groups of failure_breakdown() (parse / compile / timeout /
  sim_time_limit / other / ok), counts over samples.
- Pass@1, Cov@1 and SynPass carry a 95% bootstrap interval over tasks (seeded by --seed).
Several models (eval --adapter A B C --out X Y Z, as many of each): the base is loaded once with every adapter,
each model runs the loop in its own thread, and their generate calls meet in one (jointgen.JointGenerate; on the
fast path one decoder call whose rows run under their own adapters, fastgen's stack rule: decode is bound by its
steps, not its rows, so N models cost about one model's decode time); their simulations share one pool. Each
folder gets what its single eval writes (its config also names the command's other models under `joint`). On the
HF path (CPU) each model's calls run apart with its own seeds: its samples and metrics equal its single eval's. On
the fast path a joined call samples with its first model's seed and each row's noise follows its place in the
call, so a model's samples need not equal its single eval's bit for bit (the same distribution). A model that
fails ends the command with one line naming it, after the others have written their folders. A model's gen_s
(metrics' timing) is the wall time of the joined calls it waited through.
split_tasks() fixes a tuning split (30% of ids, by hash) and a reporting split, so that choices are
tuned on one and reported on the other.
"""
import argparse
import contextlib
import copy
import hashlib
import itertools
import json
import math
import sys
import time
import traceback
from pathlib import Path
from typing import Callable

import numpy as np

import common
import dist
import harness
import jointgen
import rundir
import score
import sim
import simpool
from claims import (add_claims_args, claims, claims_markdown, cmd_claims, paired_bootstrap,  # noqa: F401
                    pooled_samples_null, skill_file_ids, verdict)   # evaluate.claims & co.: report.py, demo.py, tests
from data import floor, teacher

Policy = Callable[[list[list[dict]]], list[str]]   # message lists in, one answer text per list out; optional
# attribute prompt_fits(messages) -> bool (model_policy's: the prompt leaves room in the model's context)
TOO_LONG = common.Answer("", "", "prompt_too_long")   # the answer never asked for
SIM_RAN = ("ok", "no_coverage", "no_dut_instance")   # statuses where the testbench compiled and simulated
BOTTOM = (False, False, False, False, False, 0.0)      # the key of "no result yet"


# ---------------------------------------------------------------------------------------------------
# Result ordering and per-result scores (on score.py's result dicts: SimResult.to_dict(), or
# score.parse_failure(reason) for an answer that did not parse)

def result_key(result):
    """Total order on results, larger is better (see the module docstring, step 4)."""
    if score.is_parse_failure(result):
        return BOTTOM
    has_cov = result["status"] == "ok" and result.get("overall_pct") is not None
    return (True, bool(result.get("compile_ok")), syn_ok(result), has_cov, bool(result.get("passed")),
            float(result["overall_pct"]) if has_cov else 0.0)


def syn_ok(result):
    return not score.is_parse_failure(result) and bool(result.get("compile_ok")) and result["status"] in SIM_RAN


def coverage(result):
    """Overall coverage in percent; anything but a clean run counts as 0 (docs/method.md §2.2)."""
    return result_key(result)[5]


def passed(result):
    return result_key(result)[4]


# ---------------------------------------------------------------------------------------------------
# Policies: list of message lists -> list of answer texts

def model_policy(model, tok, *, max_new_tokens=2048, temperature=0.7, top_p=0.8, seed=0, batch_size=64, gen=None):
    """Wrap a (PEFT) model as a Policy. Each call uses a fresh seed derived from (seed, call index).
    gen: what samples instead of common.generate(model, tok, messages_list, **kw) (eval_joint: a JointGenerate
    member, so that several models' calls meet in one)."""
    calls = itertools.count()
    context = common.context_length(model, tok)

    def policy(messages_list, on_done=None):
        outs = (gen or common.generate)(model, tok, messages_list, max_new_tokens=max_new_tokens,
                                        temperature=temperature, top_p=top_p,  # several processes: a stream per rank
                                        seed=(seed * 100_003 + next(calls)) * dist.world() + dist.rank(),
                                        batch_size=batch_size,
                                        on_done=None if on_done is None else (lambda k, c: on_done(k, c.text)))
        return [c.text for c in outs]
    policy.streams = True      # takes on_done(k, text): run_eval submits each answer as its row finishes
    # run_eval asks before generating: a prompt that leaves no room for one new token is not generated
    policy.prompt_fits = lambda messages: len(common.chat_ids(tok, messages)) < context
    return policy


# ---------------------------------------------------------------------------------------------------
# The loop

def run_eval(policy, tasks, *, n=5, rounds=3, sim_workers=None, seed=0, batch_size=64, target_mode="cvdp",
             sim_cfg=None, n_boot=1000, verbose=True, answer_mode="testbench", pool=None, tag=None):
    """Run the memoryless agentic loop (rounds=0: direct mode) and score it.

    Returns (samples, metrics). samples: one JSON-able dict per (task, sample) with every round's text,
    parsed answer, scorer result (SimResult.to_dict(), or score.parse_failure when unparsed), the round whose testbench the
    state showed (`state_round`, None = initial prompt) and `best_by_round` (index of the best round so
    far after each round 0..rounds). metrics: compute_metrics() for "direct" and, if rounds > 0, "agentic".
    answer_mode: testbench | stimulus (harness.first_messages / refine_state_messages, score.submit_answer).
    Several processes (dist.py): each rank runs its contiguous block of the tasks; every rank gets
    all the samples (in task order) and the metrics of all of them.
    pool: a simpool.SimPool to simulate on (eval_joint: one for every model of the process; sim_workers and
    sim_cfg are then its own); None: a pool of this run's. tag: the model's name in the progress lines.
    """
    all_tasks = list(tasks)
    if len({t["id"] for t in all_tasks}) != len(all_tasks):
        raise ValueError("duplicate task ids")
    tasks = dist.shard(all_tasks)
    by_id = {t["id"]: t for t in tasks}
    samples = [{"task_id": t["id"], "sample": s, "seed": seed, "answer_mode": harness.task_mode(t, answer_mode),
                "rounds": [], "best_by_round": []} for t in tasks for s in range(n)]
    prompt_fits = getattr(policy, "prompt_fits", lambda messages: True)
    best = [None] * len(samples)          # per sample: (key, round index, answer text, SimResult) or None
    stopped = [False] * len(samples)
    timing = []

    def state(i):
        task = by_id[samples[i]["task_id"]]
        if best[i] is None or not best[i][0][0]:        # nothing parsed yet: retry the initial prompt
            return harness.first_messages(task, answer_mode), None
        _, r, text, res = best[i]
        return harness.refine_state_messages(task, text, res, answer_mode), r

    own = pool is None          # a pool of its own, closed at the end; a given one is the caller's
    with simpool.SimPool(sim_workers or dist.cpu_share(), cfg=sim_cfg) if own else contextlib.nullcontext(pool) as pool:
        for r in range(rounds + 1):
            active = [i for i in range(len(samples)) if not stopped[i]]
            t_gen, t0, pending = 0.0, time.time(), []
            for start in range(0, len(active), batch_size):
                chunk = active[start:start + batch_size]
                states = [state(i) for i in chunk]
                fits = [prompt_fits(m) for m, _ in states]      # a prompt past the model's context: no answer
                asked = [m for (m, _), ok in zip(states, fits) if ok]
                whose = [i for i, ok in zip(chunk, fits) if ok]          # asked row -> sample
                sent = {}                           # asked row -> (text, answer, wait)

                def submit(k, text, whose=whose, sent=sent):
                    """Row k's simulation, once: as a streaming policy hands it on, else when the call returns
                    (then it simulates while the next chunk generates)."""
                    if sent.get(k, (None,))[0] != text:
                        sent[k] = (text, *score.submit_answer(pool, by_id[samples[whose[k]]["task_id"]], text,
                                                              target_mode, answer_mode))
                    return sent[k]
                tg = time.time()
                streams = getattr(policy, "streams", False)
                texts = iter((policy(asked, on_done=submit) if streams else policy(asked)) if asked else [])
                t_gen += time.time() - tg
                k = 0
                for i, (_, state_round), ok in zip(chunk, states, fits):
                    if not ok:
                        pending.append((i, state_round, "", TOO_LONG, lambda: score.parse_failure("prompt_too_long")))
                        continue
                    text = next(texts, None)
                    if text is None:
                        raise ValueError(f"policy returned fewer answers than the {len(asked)} prompts it was given")
                    pending.append((i, state_round, *submit(k, text)))
                    k += 1
                if next(texts, None) is not None:
                    raise ValueError(f"policy returned more answers than the {len(asked)} prompts it was given")
            for i, state_round, text, answer, wait in pending:
                res = wait()
                key = result_key(res)
                samples[i]["rounds"].append({
                    "round": r, "state_round": state_round, "text": text,
                    "answer": {"filename": answer.filename, "reason": answer.reason, "code": answer.code},
                    "result": res, "key": list(key)})
                if best[i] is None or key >= best[i][0]:
                    best[i] = (key, r, text, res)
                if key[3] and key[5] >= 100.0:
                    stopped[i] = True
            for i, s in enumerate(samples):
                s["best_by_round"].append(best[i][1])
            timing.append({"round": r, "samples": len(active), "gen_s": round(t_gen, 2),
                           "total_s": round(time.time() - t0, 2)})
            if verbose:
                bests = [s["rounds"][s["best_by_round"][-1]]["result"] for s in samples]
                say(f"eval{f' [{tag}]' if tag else ''} round {r}: {len(active)} generated, "
                    f"pass {_pct(map(passed, bests)):.1f}%, cov {np.mean([coverage(b) for b in bests]):.1f}%, "
                    f"syn {_pct(map(syn_ok, bests)):.1f}%, {sum(stopped)} at 100%; gen {t_gen:.1f}s, "
                    f"round {time.time() - t0:.1f}s")
    for i, s in enumerate(samples):
        s["best_round"] = best[i][1]
        s["best"] = s["rounds"][best[i][1]]["result"]
    if dist.world() > 1:        # every rank's samples, and per round the slowest rank's times
        samples, parts = dist.gather_lists(samples), dist.gather(timing)
        timing = [{"round": r["round"], "samples": sum(p[k]["samples"] for p in parts),
                   **{t: max(p[k][t] for p in parts) for t in ("gen_s", "total_s")}} for k, r in enumerate(timing)]
    fell_back = harness.fallbacks(all_tasks, answer_mode)
    metrics = {"seed": seed, "n": n, "rounds": rounds, "target_mode": target_mode, "num_tasks": len(all_tasks),
               "answer_mode": answer_mode, "answer_mode_fallbacks": len(fell_back),
               "answer_mode_notes": fell_back,
               "direct": compute_metrics(samples, round_index=0, seed=seed, n_boot=n_boot)}
    if rounds > 0:
        metrics["agentic"] = compute_metrics(samples, round_index=rounds, seed=seed, n_boot=n_boot)
        metrics["hole_fixes"] = hole_fixes(samples)
    metrics["by_round"] = [{"round": r, **{k: v for k, v in compute_metrics(
        samples, round_index=r, seed=seed, n_boot=0).items() if k in ("pass@1", "cov@1", "syn_pass")}}
        for r in range(rounds + 1)]
    metrics["timing"] = timing
    return samples, metrics


def validate(model, tok, tasks, *, n=1, max_new_tokens=2048, temperature=0.7, top_p=0.8, seed=0, batch_size=64,
             sim_workers=None, target_mode="icarus", answer_mode="testbench"):
    """A training run's validation: the current model's direct answers (no refinement) on `tasks`, n samples
    each, with eval's sampling settings and a seed fixed for the whole run (every validation sees the same
    noise, so a change is the model's). Returns a flat dict: `val/reward` (the RL reward 1 + coverage/100 of
    a testbench that ran, else 0, averaged over samples), `val/pass@1`, `val/cov@1`, `val/syn_pass` (percent,
    averaged over tasks), `val/reward_se` (the standard error of val/reward as a mean over this many tasks,
    from the spread of the per-task rewards; None for one task), `val/tasks`, `val/s`, and what tells two
    validations of the same weights apart:
    `val/timeouts` and `val/starved_timeouts` (sim.starved_timeout: the busy machine's, not the answer's) and
    `val/answers_sha` (sha256 of the answers in order, 16 hex digits: the same answers, or not). The answers
    come from the adapter as saved (common.as_saved: LoRA weights rounded to bf16 for the duration), so the
    validation of a stage's last step and the next stage's step 0 score the same weights. The model is left
    in the mode it was in, with its exact weights."""
    t0 = time.time()
    was = model.training
    model.eval()
    try:
        policy = model_policy(model, tok, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                              seed=seed, batch_size=batch_size)
        with common.as_saved(model):
            samples, metrics = run_eval(policy, tasks, n=n, rounds=0, sim_workers=sim_workers, seed=seed,
                                        batch_size=batch_size, target_mode=target_mode, n_boot=0, verbose=False,
                                        answer_mode=answer_mode)
    finally:
        model.train(was)
    d = metrics["direct"]
    results = [s["rounds"][0]["result"] or {} for s in samples]
    rewards = [score.result_reward(r) for r in results]
    per_task = {}
    for s, r in zip(samples, rewards):
        per_task.setdefault(s["task_id"], []).append(r)
    means = [float(np.mean(v)) for v in per_task.values()]
    answers = "\x00".join(s["rounds"][0]["text"] for s in samples)
    return {"val/reward": float(np.mean(rewards)) if rewards else 0.0,
            "val/reward_se": float(np.std(means, ddof=1) / np.sqrt(len(means))) if len(means) > 1 else None,
            "val/pass@1": d.get("pass@1", 0.0),
            "val/cov@1": d.get("cov@1", 0.0), "val/syn_pass": d.get("syn_pass", 0.0), "val/tasks": len(tasks),
            "val/s": round(time.time() - t0, 2), "val/timeouts": sum(r.get("status") == sim.TIMEOUT for r in results),
            "val/starved_timeouts": sum(sim.starved_timeout(r) for r in results),
            "val/answers_sha": hashlib.sha256(answers.encode()).hexdigest()[:16]}


def say(text):
    """print(text) in one write: the lines of models evaluated in threads (eval_joint) do not interleave."""
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def _pct(bools):
    bools = list(bools)
    return 100.0 * sum(bools) / len(bools) if bools else 0.0


# ---------------------------------------------------------------------------------------------------
# Metrics

def pass_at_k(n, c, k):
    """Unbiased Pass@k of one task with n samples of which c pass (Chen et al. 2021)."""
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def cov_at_k(values, k):
    """Expected max of k samples drawn without replacement from `values` (k = len: the max)."""
    v, n = sorted(values), len(values)
    return sum(v[i] * math.comb(i, k - 1) for i in range(k - 1, n)) / math.comb(n, k)


def bootstrap_ci(values, seed=0, n_boot=1000, level=0.95):
    """Percentile bootstrap interval of the mean of per-task values (resampling tasks)."""
    values = np.asarray(values, dtype=float)
    if n_boot <= 0 or len(values) == 0:
        return None
    return paired_bootstrap(values[:, None], lambda a: a[..., 0].mean(axis=-1), seed=seed, n_boot=n_boot,
                            level=level)["ci95"]


FAILURE_GROUPS = {"no_code": "parse", "truncated": "parse", "compile_error": "compile", "rejected": "compile",
                  "no_dut_instance": "compile", "timeout": "timeout", "sim_time_limit": "sim_time_limit", "ok": "ok",
                  "prompt_too_long": "prompt_too_long"}
FAILURE_KEYS = ("parse", "compile", "timeout", "sim_time_limit", "other", "ok", "prompt_too_long")


def failure_breakdown(results):
    """{group: count} of result dicts' statuses: parse (no_code, truncated) / compile (compile_error, a
    rejected testbench or stimulus, no_dut_instance) / timeout / sim_time_limit / other (runtime_error,
    output_limit, no_coverage, internal_error) / ok."""
    out = dict.fromkeys(FAILURE_KEYS, 0)
    for r in results:
        out[FAILURE_GROUPS.get((r or {}).get("status"), "other")] += 1
    return out


def hole_fixes(samples):
    """How often a refinement covers what the state it was shown left uncovered. A step is a round r >= 1 whose
    state (round `state_round`) ran with coverage and listed its holes in full (score.hole_fix: the rule for what
    counts). Returns {steps, fixed_any (% of steps that cover at least one hole), fixed_share (mean % of the
    state's holes covered), worse (% of steps whose answer did not run)}."""
    shares, ran = [], []
    for s in samples:
        for r in s["rounds"][1:]:
            if r.get("state_round") is None:
                continue
            h = score.hole_fix(s["rounds"][r["state_round"]]["result"], r["result"])
            if h is not None:
                shares.append(h[0])
                ran.append(h[1])
    steps = len(shares)
    pct = lambda k: 100.0 * k / steps if steps else 0.0
    return {"steps": steps, "fixed_any": pct(sum(x > 0 for x in shares)),
            "fixed_share": 100.0 * sum(shares) / steps if steps else 0.0, "worse": pct(ran.count(False))}


def compute_metrics(samples, round_index=-1, seed=0, n_boot=1000):
    """Pass@k / Cov@k / SynPass (percent) of the best result up to `round_index` (-1: last round)."""
    per_task, bests = {}, []
    for s in samples:
        pick = s["best_by_round"][round_index]
        res = s["rounds"][pick]["result"]
        bests.append(res)
        t = per_task.setdefault(s["task_id"], {"passed": [], "cov": [], "syn": []})
        t["passed"].append(passed(res))
        t["cov"].append(coverage(res))
        t["syn"].append(syn_ok(res))
    if not per_task:
        return {}
    n = min(len(t["passed"]) for t in per_task.values())
    out = {"tasks": len(per_task), "n": n}
    table = {}
    for tid, t in per_task.items():
        m = len(t["passed"])
        table[tid] = {"samples": m, "passes": sum(t["passed"]), "pass_rate": 100.0 * sum(t["passed"]) / m,
                      "cov_mean": float(np.mean(t["cov"])), "cov_max": max(t["cov"]),
                      "syn_rate": 100.0 * sum(t["syn"]) / m}
    for k in range(1, n + 1):
        out[f"pass@{k}"] = 100.0 * float(np.mean([pass_at_k(len(t["passed"]), sum(t["passed"]), k)
                                                  for t in per_task.values()]))
        out[f"cov@{k}"] = float(np.mean([cov_at_k(t["cov"], k) for t in per_task.values()]))
    out["syn_pass"] = float(np.mean([r["syn_rate"] for r in table.values()]))
    for name, col in (("pass@1", "pass_rate"), ("cov@1", "cov_mean"), ("syn_pass", "syn_rate")):
        ci = bootstrap_ci([r[col] for r in table.values()], seed=seed, n_boot=n_boot)
        if ci is not None:
            out[f"{name}_ci95"] = ci
    out["failures"] = failure_breakdown(bests)
    out["per_task"] = table
    return out


def skill_ids(tasks, floors):
    """The skill subset: the tasks labelled `skill` (a skill split's tasks, data/skill.py) when any task is;
    else the tasks whose random floor passes with no seed (random_pass 0). floors: {task id: floor record}."""
    labelled = {t["id"] for t in tasks if t.get("skill")}
    return labelled or {tid for tid, f in floors.items() if f["random_pass"] == 0}


def floor_metrics(per_task, seed=0, n_boot=1000):
    """What a model adds over constrained random, from a per-task table (compute_metrics') whose rows carry
    their task's `random_cov` and `skill` flag (add_floor_metrics); rows without a floor are left out:
    - cov_gain: mean over tasks of max(0, Cov@1 - random_cov), in points (0 where the model is no better);
    - beats_random: % of tasks whose Cov@1 is above random_cov;
    - skill: Pass@1 / Cov@1 / cov_gain on the skill subset (skill_ids), the headline where random fails.
    Each mean carries a 95 % bootstrap interval over tasks, as Pass@1 does."""
    rows = [r for r in per_task.values() if r.get("random_cov") is not None]
    if not rows:
        return {}
    gain = lambda r: max(0.0, r["cov_mean"] - r["random_cov"])

    def mean_ci(name, values):
        values = list(values)
        ci = bootstrap_ci(values, seed=seed, n_boot=n_boot)
        return {name: float(np.mean(values)) if values else 0.0, **({f"{name}_ci95": ci} if ci else {})}
    skill = [r for r in per_task.values() if r.get("skill")]
    return {"floor_tasks": len(rows), **mean_ci("cov_gain", map(gain, rows)),
            "beats_random": _pct(r["cov_mean"] > r["random_cov"] for r in rows),
            "random_cov": float(np.mean([r["random_cov"] for r in rows])),
            "skill": {"tasks": len(skill), **mean_ci("pass@1", (r["pass_rate"] for r in skill)),
                      **mean_ci("cov@1", (r["cov_mean"] for r in skill)),
                      **mean_ci("cov_gain", (gain(r) for r in skill if r.get("random_cov") is not None))}}


def add_floor_metrics(metrics, tasks, floor_records=None, seed=0, n_boot=1000):
    """metrics (run_eval's) with each per-task row given its task's `random_cov` and `skill` flag, floor_metrics
    in each mode, and the skill subset's ids (`skill_ids`); unchanged when no task has a floor (its own
    `random_floor`, or one in floor_records: data/floor.py's file)."""
    floors = {t["id"]: f for t in tasks if (f := floor.floor_of(t, floor_records))}
    if not floors:
        return metrics
    skill = skill_ids(tasks, floors)
    out = {**metrics, "skill_ids": sorted(skill)}
    for mode in ("direct", "agentic"):
        if mode in out:
            table = {tid: {**r, "random_cov": floors[tid]["random_cov"] if tid in floors else None,
                           "skill": tid in skill} for tid, r in out[mode]["per_task"].items()}
            out[mode] = {**out[mode], "per_task": table, **floor_metrics(table, seed, n_boot)}
    return out


# ---------------------------------------------------------------------------------------------------
# Task selection: fixed tuning / reporting split

def split_of(task_id, tuning_frac=0.3, salt="chorus-mini-split-v1"):
    """'tuning' or 'report', fixed per id (sha256 of salt + id), independent of the file's order."""
    h = int.from_bytes(hashlib.sha256(f"{salt}:{task_id}".encode()).digest()[:8], "big")
    return "tuning" if h / 2 ** 64 < tuning_frac else "report"


def split_tasks(tasks, tuning_frac=0.3):
    """(tuning, report) lists; choices are tuned on the first and numbers reported on the second."""
    tuning = [t for t in tasks if split_of(t["id"], tuning_frac) == "tuning"]
    report = [t for t in tasks if split_of(t["id"], tuning_frac) == "report"]
    return tuning, report


def select_tasks(tasks, ids=None, limit=None, split="all"):
    if split != "all":
        tasks = split_tasks(tasks)[0 if split == "tuning" else 1]
    if ids:
        known = {t["id"]: t for t in tasks}
        missing = [i for i in ids if i not in known]
        if missing:
            raise SystemExit(f"unknown task ids (in split {split!r}): {missing[:5]}")
        tasks = [known[i] for i in ids]
    return tasks[:limit] if limit else tasks


# ---------------------------------------------------------------------------------------------------
# Outputs

def write_eval(out_dir, samples, metrics, config):
    """samples.jsonl, metrics.json, result.json (config / setup / outcome), then done.json."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "done.json").unlink(missing_ok=True)
    with open(out / "samples.jsonl", "w") as f:
        for s in samples:
            f.write(json.dumps(s) + "\n")
    metrics = {**metrics, "config": config}
    (out / "metrics.json").write_text(json.dumps(metrics, indent=1))
    headline = {mode: {k: v for k, v in m.items() if k != "per_task"}
                for mode, m in metrics.items() if mode in ("direct", "agentic")}
    rundir.write_result(out, config, {"tasks": metrics["num_tasks"], "n": metrics["n"], "rounds": metrics["rounds"],
                                      "seed": metrics["seed"], "gpu_peak_mib": common.gpu_peak_mib(),
                                      "answer_mode": metrics.get("answer_mode", "testbench"),
                                      "answer_mode_fallbacks": metrics.get("answer_mode_fallbacks", 0)}, headline)
    rundir.write_done(out, "evaluate.py", {"metrics": "metrics.json", "samples": "samples.jsonl", "result": "result.json"})


def summary_lines(metrics):
    lines = []
    for mode in ("direct", "agentic"):
        m = metrics.get(mode)
        if not m:
            continue
        n = m["n"]
        ci = {k: f" [{m[k][0]:.1f}, {m[k][1]:.1f}]" if m.get(k) else "" for k in ("pass@1_ci95", "cov@1_ci95")}
        lines.append(f"{mode:8s} {m['tasks']} tasks x {n}, seed {metrics['seed']}: "
                     f"Pass@1 {m['pass@1']:.1f}{ci['pass@1_ci95']}  Pass@{n} {m[f'pass@{n}']:.1f}  "
                     f"Cov@1 {m['cov@1']:.1f}{ci['cov@1_ci95']}  Cov@{n} {m[f'cov@{n}']:.1f}  "
                     f"SynPass {m['syn_pass']:.1f}")
        if "cov_gain" in m:
            k = m["skill"]
            lines.append(f"{'':8s} over random ({m['floor_tasks']} tasks with a floor): cov_gain {m['cov_gain']:.1f}  "
                         f"beats random on {m['beats_random']:.1f}%  skill subset ({k['tasks']} tasks): "
                         f"Pass@1 {k['pass@1']:.1f}  Cov@1 {k['cov@1']:.1f}")
    h = metrics.get("hole_fixes")
    if h and h["steps"]:
        lines.append(f"refine   {h['steps']} steps: {h['fixed_any']:.1f}% cover a hole their state left, "
                     f"{h['fixed_share']:.1f}% of the holes on average; {h['worse']:.1f}% did not run")
    return lines


def is_baseline(model):
    """--model names a baseline (no weights): `random` or `teacher:LEVEL`."""
    return model == "random" or str(model or "").startswith("teacher:")


def baseline_policy(name, tasks, *, answer_mode="stimulus", seed=0, random_cycles=floor.CYCLES,
                    random_reset_period=floor.RESET_PERIOD, target_mode="cvdp"):
    """The Policy of a baseline: `random` (data/floor.py: the constrained-random loop, seeded, stimulus mode
    only) or `teacher:LEVEL` (data/teacher.py's template teacher at LEVEL, refined as a model is)."""
    if name == "random":
        return floor.random_policy(random_cycles, random_reset_period or None, seed)
    level = name.partition(":")[2]
    if level not in teacher.LEVELS:
        raise SystemExit(f"evaluate.py: unknown teacher level {level!r} in {name!r}; levels: {', '.join(teacher.LEVELS)}")
    return teacher.teacher_policy(tasks, level, answer_mode, seed, target_mode)


def mirror_agentic(metrics, rounds):
    """A baseline that ignores feedback answers each refinement round with its first answer, which scores the
    same: its agentic metrics are its direct ones, copied instead of simulated `rounds` more times."""
    out = {**metrics, "rounds": rounds, "rounds_run": 0, "agentic": metrics["direct"],
           "agentic_note": "the policy ignores feedback: every round repeats round 0's answer"}
    out["by_round"] = [{**metrics["by_round"][0], "round": r} for r in range(rounds + 1)]
    return out


def _load_policy(args, tasks=()):
    if is_baseline(args.model):
        if args.adapter:
            raise SystemExit(f"evaluate.py: the baseline {args.model} takes no --adapter")
        return baseline_policy(args.model, tasks, answer_mode=args.answer_mode, seed=args.seed,
                               random_cycles=args.random_cycles, random_reset_period=args.random_reset_period,
                               target_mode=getattr(args, "target_mode", "cvdp"))
    model, tok = _load_model(args, {"default": args.adapter} if args.adapter else {})
    return _policy(args, model, tok)


def _load_model(args, adapters):
    """--model with each adapter of `adapters` (name -> folder) loaded under its name, in eval mode."""
    model, tok = common.load_model(args.model, quant=args.quant)
    for name, path in adapters.items():
        model = common.load_adapter(model, path, adapter_name=name)
    model.eval()
    return model, tok


def _policy(args, model, tok, gen=None):
    return model_policy(model, tok, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                        top_p=args.top_p, seed=args.seed, batch_size=args.batch_size, gen=gen)


def _add_model_args(p, several=False):
    harness.add_answer_mode_arg(p)
    p.add_argument("--model", default=None, help="HF id, folder or GGUF (default: the bundled SmolLM2); or a "
                   "baseline with no weights, run on CPU: `random` (constrained-random stimulus, stimulus mode) or "
                   f"`teacher:LEVEL` (the template teacher; LEVEL one of {', '.join(teacher.LEVELS)})")
    p.add_argument("--random-cycles", type=int, default=floor.CYCLES,
                   help="--model random: random cycles per stimulus (its budget, within the harness watchdog)")
    p.add_argument("--random-reset-period", type=int, default=floor.RESET_PERIOD,
                   help="--model random: reset_dut() every this many random cycles (0: only at the start)")
    p.add_argument("--adapter", default=None, nargs="+" if several else None,
                   help="peft adapter folder to apply" + ("; several, with one --out each: the models evaluated in "
                                                         "one process (see 'Several models' below)" if several else ""))
    common.add_gpu_mem_arg(p)
    p.add_argument("--quant", default="auto", help="passed to common.load_model")
    p.add_argument("--temperature", type=float, default=0.7, help="paper eval: 0.7")
    p.add_argument("--top-p", type=float, default=0.8, help="paper eval: 0.8")
    p.add_argument("--max-new-tokens", type=int, default=2048, help="paper: 16384 (4B models)")
    p.add_argument("--batch-size", type=int, default=64, help="prompts per policy call")
    p.add_argument("--seed", type=int, default=0, help="sampling and bootstrap seed (named in the results)")
    p.add_argument("--sim-workers", type=int, default=None, help="parallel simulations (default: sim's)")


# Ranges of the model flags and of eval's and generate's own, checked before any work (rundir.check_options):
# `--limit 0` would otherwise mean all tasks and `--n 0` an empty success.
RANGES = {"random_cycles": rundir.at_least(1), "random_reset_period": rundir.at_least(0),
          "temperature": rundir.at_least(0), "top_p": (lambda v: 0 < v <= 1, "within (0, 1]"),
          "max_new_tokens": rundir.at_least(1), "batch_size": rundir.at_least(1), "sim_workers": rundir.at_least(1),
          "n": rundir.at_least(1), "rounds": rundir.at_least(0), "limit": rundir.at_least(1),
          "target": rundir.within(0, 100)}


# ---------------------------------------------------------------------------------------------------
# eval

def add_eval_args(p):
    p.formatter_class = argparse.RawDescriptionHelpFormatter      # eval --help ends with the docstring's paragraph
    p.epilog = __doc__[__doc__.index("Several models ("):__doc__.index("split_tasks() fixes")]
    _add_model_args(p, several=True)
    p.add_argument("--tasks", required=True, help="task JSONL (sim.load_tasks schema)")
    p.add_argument("--ids", nargs="+", default=None, help="only these task ids")
    p.add_argument("--limit", type=int, default=None, help="first N tasks (after --split / --ids)")
    p.add_argument("--split", choices=("all", "tuning", "report"), default="all",
                   help="fixed 30/70 split by id hash: tune on 'tuning', report on 'report'")
    p.add_argument("--out", required=True, nargs="+",
                   help="folder for samples.jsonl, metrics.json, result.json; one per --adapter when several")
    p.add_argument("--n", type=int, default=5, help="samples per task (paper: 5)")
    p.add_argument("--rounds", type=int, default=3, help="refinement rounds after the first (paper: 3)")
    p.add_argument("--mode", choices=("agentic", "direct"), default="agentic",
                   help="direct = --rounds 0; an agentic run also reports direct (round 0)")
    p.add_argument("--target-mode", choices=("cvdp", "icarus"), default="cvdp", help="see sim.job_from_task")
    p.add_argument("--floor", default=None, help="random-floor JSON (data/floor.py) for cov_gain, beats_random and "
                   "the skill subset's Pass@1 (tasks with their own `random_floor` need none)")


def cmd_eval(args):
    rundir.check_options("evaluate.py eval", args, RANGES)
    adapters, outs = several_models(args)
    dist.init()                 # several processes: before the model lands on this rank's GPU
    for out in outs:            # one writer per folder: a second eval into it is refused (one line)
        rundir.lock_run(out)
    every = sim.load_tasks(args.tasks)
    if not every:               # an empty file is bad input, not metrics of nothing and a done.json
        raise ValueError(f"--tasks {args.tasks}: the file has no tasks")
    tasks = select_tasks(every, ids=args.ids, limit=args.limit, split=args.split)
    if not tasks:
        raise ValueError(f"--tasks {args.tasks}: none of its {len(every)} tasks is in split {args.split!r}")
    if args.model == "random" and args.answer_mode != "stimulus":
        print("eval: the random baseline is a stimulus for the kit's harness: answer mode stimulus")
        args.answer_mode = "stimulus"
    rounds = 0 if args.mode == "direct" else args.rounds
    config = {k: v for k, v in vars(args).items() if k not in ("func", "command")}
    config["rounds"] = rounds
    print(f"eval: {len(tasks)} tasks x {args.n} samples, {rounds} refinement rounds, "
          f"T {args.temperature} top-p {args.top_p}, seed {args.seed}, split {args.split}, answer mode {args.answer_mode}")
    fell_back = harness.fallbacks(tasks, args.answer_mode)
    if fell_back:
        print(f"eval: {len(fell_back)} task(s) in testbench mode, the kit cannot harness them: "
              + "; ".join(list(fell_back.values())[:3]))
    floors = floor.load_floor(args.floor) if args.floor else None
    if len(outs) > 1:
        return eval_joint(args, tasks, rounds, config, floors, list(zip(adapters, outs)))
    eval_model(args, _load_policy(args, tasks), tasks, rounds, config, floors, args.out)
    return 0


def eval_model(args, policy, tasks, rounds, config, floors, out, pool=None, tag=None):
    """One model's eval into `out` (write_eval), its summary printed; tag: its name in a joint run's lines."""
    tagged = lambda text: say("\n".join(f"[{tag}] {line}" if tag else line for line in text.splitlines()))  # noqa: E731
    repeats = getattr(policy, "ignores_feedback", False)         # the random baseline
    if repeats and rounds:
        tagged(f"eval: {args.model} ignores feedback: run direct, its {rounds} refinement rounds reported as round 0")
    samples, metrics = run_eval(policy, tasks, n=args.n, rounds=0 if repeats else rounds, sim_workers=args.sim_workers,
                                seed=args.seed, batch_size=args.batch_size, target_mode=args.target_mode,
                                answer_mode=args.answer_mode, pool=pool, tag=tag)
    if repeats and rounds:
        metrics = mirror_agentic(metrics, rounds)
    metrics = add_floor_metrics(metrics, tasks, floors, seed=args.seed)
    if dist.is_main():
        write_eval(out, samples, metrics, config)
    tagged("\n".join(summary_lines(metrics)))
    tagged(f"eval: wrote {out}/metrics.json")


# ---------------------------------------------------------------------------------------------------
# Several models in one process: their rows in one decoder call

def several_models(args):
    """(adapters, outs) of `eval --adapter A B C --out X Y Z`, checked before any work (one line each); one --out
    leaves args as a single eval has them (adapter and out: one value each), so its config is unchanged."""
    adapters, outs = args.adapter or [], args.out
    if len(outs) > 1 or len(adapters) > 1:
        if is_baseline(args.model):
            raise SystemExit(f"evaluate.py eval: the baseline {args.model} takes no --adapter and one --out")
        if len(adapters) != len(outs):
            raise SystemExit(f"evaluate.py eval: several models need one --adapter per --out (got {len(adapters)} "
                             f"and {len(outs)})")
        if rundir.shared_folders(outs):
            raise SystemExit("evaluate.py eval: each model needs its own --out folder")
    args.adapter, args.out = (adapters[0] if adapters else None), outs[0]
    return adapters, outs


def eval_joint(args, tasks, rounds, config, floors, models):
    """Evaluate several adapters of one base (models: [(adapter folder, out folder)]) in one process: the model
    loaded once, each adapter under its own name (model0, model1, ...), each model's run_eval in its own thread
    with a policy whose generate calls meet the others' in one call (jointgen.JointGenerate: decode is bound by
    its steps, not its rows), and one SimPool for all of their simulations. Each folder gets what a single eval
    writes; its config adds `joint` (every adapter and out of the command). A model that fails does not stop
    the others: their folders are written, then the command ends with one line naming the failed ones."""
    if dist.world() > 1:
        raise SystemExit("evaluate.py eval: several models are evaluated in one process only (their generate "
                         "calls meet in it); run one per model under several processes")
    names = {f"model{k}": pair for k, pair in enumerate(models)}
    model, tok = _load_model(args, {name: adapter for name, (adapter, _) in names.items()})
    joint = jointgen.JointGenerate(model, tok, list(names))
    together = {"adapters": [a for a, _ in models], "outs": [o for _, o in models]}
    print(f"eval: {len(names)} models in one process, their generate calls joined: "
          + ", ".join(f"{n} {a} -> {o}" for n, (a, o) in names.items()))
    failed = {}

    def collect(member):
        adapter, out = names[member.name]
        try:        # its own tokenizer: the threads render prompts at once (prompt_fits), a fast one is not shared
            policy = _policy(args, model, copy.deepcopy(tok), gen=joint.member(member.name))
            eval_model(args, policy, tasks, rounds, {**config, "adapter": adapter, "out": out, "joint": together},
                       floors, out, pool=pool, tag=Path(out).name)
        except BaseException as e:      # noqa: BLE001  (named below, once every model has ended)
            failed[out] = e
            traceback.print_exc(file=sys.stdout)       # the stage log has it; stderr gets the one line
    with simpool.SimPool(args.sim_workers or dist.cpu_share()) as pool:
        jointgen.joint_collect([argparse.Namespace(joint=joint, name=n) for n in names], collect)
    if failed:
        why = "; ".join(f"{out}: {type(e).__name__}: {' '.join(str(e).split())}" for out, e in failed.items())
        rest = "; the others' folders are written" if len(failed) < len(models) else ""
        raise SystemExit(f"evaluate.py eval: {len(failed)} of {len(models)} models failed ({why}){rest}")
    return 0


# ---------------------------------------------------------------------------------------------------
# compare: complementarity of several models

def compare(result_dirs, out_dir=None, mode=None):
    """Task x model matrices, oracle union, best single model, pairwise 'solved by A not B'.

    A model solves a task when any of its samples passes (Pass@n). The oracle union solves a task when
    any model solves it; oracle Pass@1 / Cov@1 take, per task, the best model's pass rate / mean
    coverage. Only tasks present in every result are compared.
    """
    runs = []
    for d in result_dirs:
        m = json.loads((Path(d) / "metrics.json").read_text())
        runs.append((Path(d).name, m))
    names = [n for n, _ in runs]
    if len(set(names)) != len(names):
        names = [f"{Path(d).parent.name}/{Path(d).name}" for d in result_dirs]
    if mode is None:
        mode = "agentic" if all("agentic" in m for _, m in runs) else "direct"
    tables = [m[mode]["per_task"] for _, m in runs]
    tasks = sorted(set.intersection(*(set(t) for t in tables)))
    if not tasks:
        raise SystemExit("compare: the results share no task")
    pass_rate = np.array([[t[i]["pass_rate"] for t in tables] for i in tasks])      # (tasks, models)
    cov_mean = np.array([[t[i]["cov_mean"] for t in tables] for i in tasks])
    cov_max = np.array([[t[i]["cov_max"] for t in tables] for i in tasks])
    solved = np.array([[t[i]["passes"] > 0 for t in tables] for i in tasks])
    models = {name: {"pass@1": float(pass_rate[:, j].mean()), "solved": int(solved[:, j].sum()),
                     "solved_pct": 100.0 * float(solved[:, j].mean()), "cov@1": float(cov_mean[:, j].mean())}
              for j, name in enumerate(names)}
    for name, t in zip(names, tables):          # over random, on the common tasks (evals run with a floor)
        models[name].update(floor_metrics({i: t[i] for i in tasks}, n_boot=0))
    best_single = max(names, key=lambda n: (models[n]["pass@1"], models[n]["cov@1"]))
    result = {
        "mode": mode, "models": names, "tasks": tasks,
        "dropped_tasks": sorted(set.union(*(set(t) for t in tables)) - set(tasks)),
        "per_model": models, "best_single": best_single,
        "oracle": {"solved": int(solved.any(axis=1).sum()), "solved_pct": 100.0 * float(solved.any(axis=1).mean()),
                   "pass@1": float(pass_rate.max(axis=1).mean()), "cov@1": float(cov_mean.max(axis=1).mean()),
                   "cov_max": float(cov_max.max(axis=1).mean())},
        "solved_by_a_not_b": {a: {b: int((solved[:, i] & ~solved[:, j]).sum()) for j, b in enumerate(names)}
                              for i, a in enumerate(names)},
        "matrix": {"pass_rate": pass_rate.tolist(), "cov_mean": cov_mean.tolist(), "solved": solved.tolist()},
    }
    if out_dir:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / "compare.json").write_text(json.dumps(result, indent=1))
        _heatmap(pass_rate, cov_mean, tasks, names, out / "compare.png")
        rundir.write_result(out, {"results": [str(d) for d in result_dirs], "mode": mode},
                            {"tasks": len(tasks), "dropped_tasks": len(result["dropped_tasks"])},
                            {"tasks": len(tasks), **{k: result[k] for k in ("mode", "models", "per_model", "best_single",
                                                                           "oracle", "solved_by_a_not_b")}})
        rundir.write_done(out, "evaluate.py", {"compare": "compare.json", "plot": "compare.png", "result": "result.json"})
    return result


def _heatmap(pass_rate, cov_mean, tasks, names, path):
    import matplotlib          # optional heavy dependency: only when a plot is drawn
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    height = max(3.0, 0.18 * len(tasks) + 1.5)
    fig, axes = plt.subplots(1, 2, figsize=(3 + 1.6 * len(names), height), sharey=True)
    for ax, mat, title in ((axes[0], pass_rate, "pass rate %"), (axes[1], cov_mean, "mean best coverage %")):
        im = ax.imshow(mat, aspect="auto", vmin=0, vmax=100, cmap="viridis", interpolation="nearest")
        ax.set_xticks(range(len(names)), names, rotation=45, ha="right", fontsize=8)
        ax.set_title(title, fontsize=9)
        fig.colorbar(im, ax=ax, fraction=0.05)
    axes[0].set_yticks(range(len(tasks)), [t[-40:] for t in tasks], fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def add_compare_args(p):
    p.add_argument("results", nargs="+", help="eval output folders (each with metrics.json)")
    p.add_argument("--out", default=None, help="folder for compare.json and compare.png (default: print only)")
    p.add_argument("--mode", choices=("agentic", "direct"), default=None, help="default: agentic when all have it")


def cmd_compare(args):
    r = compare(args.results, args.out, args.mode)
    width = max(len(n) for n in r["models"]) + 2
    print(f"compare ({r['mode']}, {len(r['tasks'])} common tasks):")
    for name in r["models"]:
        m = r["per_model"][name]
        print(f"  {name:{width}s} Pass@1 {m['pass@1']:5.1f}  solved {m['solved']:3d}  Cov@1 {m['cov@1']:5.1f}"
              + (f"  cov_gain {m['cov_gain']:4.1f}  beats random {m['beats_random']:5.1f}%  skill Pass@1 "
                 f"{m['skill']['pass@1']:5.1f} ({m['skill']['tasks']} tasks)" if "cov_gain" in m else ""))
    o = r["oracle"]
    print(f"  {'oracle union':{width}s} Pass@1 {o['pass@1']:5.1f}  solved {o['solved']:3d}  Cov@1 {o['cov@1']:5.1f}")
    print(f"  best single: {r['best_single']}")
    return 0


# ---------------------------------------------------------------------------------------------------
# generate: the everyday use, one design in, the best testbench out

def make_task(rtl_paths, top, inst="uut", spec_paths=(), target=90.0):
    """A task dict (sim.load_tasks schema) for RTL files on disk."""
    def files(paths):
        return [{"name": Path(p).name, "content": Path(p).read_text()} for p in paths]
    instruction = (f"Write a SystemVerilog testbench for the RTL above. The top module is '{top}'; instantiate it "
                   f"as '{inst}'. Drive stimulus that exercises as much line, branch, expression, toggle and FSM "
                   f"coverage as possible. Do not add assertions or output checks.")
    return {"id": top, "rtl_files": files(rtl_paths), "spec_files": files(spec_paths), "dut_module_name": top,
            "dut_instance_name": inst, "instruction": instruction,
            "targets": [{"inst_name": inst, "metric": "overall_average", "target_percentage": target}]}


def generate_testbench(policy, task, *, n=1, rounds=3, out_dir=None, sim_workers=None, seed=0,
                       answer_mode="testbench"):
    """Best testbench over n samples x (1 + rounds); writes it and its scorer report into out_dir.
    In stimulus mode the testbench is the harness + the best stimulus (also written as stimulus.sv)."""
    samples, _ = run_eval(policy, [task], n=n, rounds=rounds, sim_workers=sim_workers, seed=seed, n_boot=0,
                          answer_mode=answer_mode)
    top = max(samples, key=lambda s: result_key(s["best"]))
    rec = top["rounds"][top["best_round"]]
    mode = top["answer_mode"]
    code = rec["answer"]["code"]
    if mode == "stimulus" and code and rec["answer"]["reason"] == "ok":
        code = harness.assemble(harness.task_harness(task), rec["answer"]["code"])[0]
    report = {"task": task["id"], "filename": rec["answer"]["filename"], "round": rec["round"],
              "sample": top["sample"], "answer_mode": mode, "result": rec["result"]}
    if mode != answer_mode:
        report["answer_mode_note"] = task.get("answer_mode_note")
    if out_dir:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        if code:
            (out / Path(rec["answer"]["filename"]).name).write_text(code)
        if mode == "stimulus" and rec["answer"]["code"]:
            (out / "stimulus.sv").write_text(rec["answer"]["code"])
        (out / "report.json").write_text(json.dumps(report, indent=1))
        feedback = f"answer not parsed ({rec['answer']['reason']})" if score.is_parse_failure(rec["result"]) \
            else sim.format_feedback(sim.SimResult.from_dict(rec["result"]))
        (out / "report.txt").write_text(feedback + "\n")
        with open(out / "samples.jsonl", "w") as f:
            for s in samples:
                f.write(json.dumps(s) + "\n")
    return {**report, "code": code}


def add_generate_args(p):
    _add_model_args(p)
    p.add_argument("--rtl", nargs="+", required=True, help="RTL files of the design")
    p.add_argument("--top", required=True, help="DUT top module")
    p.add_argument("--inst", default="uut", help="instance name of the DUT in the testbench")
    p.add_argument("--spec", nargs="*", default=[], help="optional spec files")
    p.add_argument("--target", type=float, default=90.0, help="overall coverage target (pass/fail)")
    p.add_argument("--n", type=int, default=1, help="independent samples (the best one is kept)")
    p.add_argument("--rounds", type=int, default=3, help="refinement rounds")
    p.add_argument("--out", default="out/generate", help="folder for the testbench and report")


def cmd_generate(args):
    rundir.check_options("evaluate.py generate", args, RANGES)
    task = make_task(args.rtl, args.top, args.inst, args.spec, args.target)
    policy = _load_policy(args, [task])
    rep = generate_testbench(policy, task, n=args.n, rounds=args.rounds, out_dir=args.out,
                             sim_workers=args.sim_workers, seed=args.seed, answer_mode=args.answer_mode)
    res = rep["result"] or {}
    print(f"generate: best from sample {rep['sample']} round {rep['round']}: status {res.get('status', 'unparsed')}, "
          f"coverage {res.get('overall_pct')}, passed {res.get('passed', False)} -> {args.out}/{rep['filename']}")
    return 0


# ---------------------------------------------------------------------------------------------------
# CLI (chorus_mini.py offers the same subcommands)

COMMANDS = {"eval": (add_eval_args, cmd_eval, "score a model on a task file"),
            "compare": (add_compare_args, cmd_compare, "compare several eval results"),
            "claims": (add_claims_args, cmd_claims, "the paper's four claims with bootstrap verdicts"),
            "generate": (add_generate_args, cmd_generate, "best testbench for one design")}


def add_commands(sub):
    """The eval / compare / generate subparsers, each with its function as `func`."""
    for name, (add_args, fn, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text)
        add_args(p)
        p.set_defaults(func=fn)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="evaluate.py", description=__doc__.split("\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    add_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    raise SystemExit(rundir.cli("evaluate.py", main))
