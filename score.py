"""The score path: one answer text -> parsed answer -> simulation job -> result dict -> reward. Every stage that
scores answers goes through here: RL and OPD rollouts (onpolicy.py), evaluation (evaluate.py), the SFT data's
execution checks (data/build_sft.py) and the template teacher (data/teacher.py). It sits below all of them and
imports none of them (common, harness and sim only), so the training side and the evaluation side never import
each other in a circle.
"""
import contextlib
import os
from dataclasses import dataclass

from tqdm import tqdm

import common
import harness
import sim
import simpool

# -----------------------------------------------------------------------------
# Scoring one answer: parse -> simulate -> reward -> usable or not
#
# A result is a dict: SimResult.to_dict() when the answer was simulated, else parse_failure(reason), whose
# status is the parse reason ("no_code": no code block; "truncated": the block was cut off by the token cap).

PARSE_FAILURES = ("no_code", "truncated", "prompt_too_long")   # never simulated (the last: no answer was asked for)


def parse_failure(reason):
    """The result dict of an answer that did not parse (nothing simulated, reward 0)."""
    return {"status": reason if reason in PARSE_FAILURES else "no_code", "compile_ok": False, "passed": False,
            "overall_pct": None, "metrics": {}, "uncovered": [], "errors": []}


def is_parse_failure(result):
    return result is None or result.get("status") in PARSE_FAILURES


def hole_fix(state, new):
    """What a refinement did to the holes of the state it was shown (both result dicts). None where it proves
    nothing: the state did not run with coverage or listed no holes, or either list may be cut at
    sim.MAX_UNCOVERED items (a missing key there proves nothing). Else (share, ran): the share of the state's
    uncovered item keys (sim.uncovered_keys) the new result no longer lists, 0.0 when the new answer did not run."""
    if is_parse_failure(state) or state.get("overall_pct") is None:
        return None
    holes = set(sim.uncovered_keys(state))
    if not holes or len(state.get("uncovered") or []) >= sim.MAX_UNCOVERED:
        return None
    if is_parse_failure(new) or new.get("overall_pct") is None:
        return 0.0, False
    if len(new.get("uncovered") or []) >= sim.MAX_UNCOVERED:
        return None
    return len(holes - set(sim.uncovered_keys(new))) / len(holes), True


def result_reward(result):
    """sim.reward of a result dict: 1 + overall/100 when it ran with coverage, else 0."""
    return 0.0 if is_parse_failure(result) else float(sim.reward(sim.SimResult.from_dict(result)))


REWARDS = ("task", "over_random")


def over_random_reward(result, random_cov):
    """The reward behind rl.py/distill.py --reward over_random: 1 + (coverage gained over the task's random floor,
    percent) / 100 when the answer ran with coverage, else 0. The gain is 0 when the run does no better than
    random stimulus (random_cov: the floor's mean coverage, data/floor.py), so a long random loop earns 1 and no
    more, while 1 + coverage (the paper's reward) pays it for coverage any stimulus reaches."""
    base = result_reward(result)
    if base == 0.0:
        return 0.0
    return 1.0 + max(0.0, float(result["overall_pct"]) - float(random_cov)) / 100.0


def feedback_result(result):
    """What common.refine_messages takes for a scored answer: the result, or None after a parse failure."""
    return None if is_parse_failure(result) else result


def prepare_answer(task, text, target_mode="cvdp", answer_mode="testbench"):
    """One answer text -> (Answer, job, result): either a sim job to run (result None) or no job and the
    failure result. answer_mode (the requested mode; harness.task_mode picks the task's own):
    testbench: common.parse_answer; no_code / truncated -> parse_failure.
    stimulus: harness.prepare_stimulus (the Answer's code is the stimulus body, its filename the
    harness's tb_<top>.sv); ok -> the job of harness + stimulus; rejected -> harness.rejected_result
    (status "rejected", reward 0, nothing simulated); no_code / truncated -> parse_failure."""
    text = text or ""
    if harness.task_mode(task, answer_mode) == "stimulus":
        h = harness.task_harness(task)
        p = harness.prepare_stimulus(h, text)
        answer = common.Answer(f"{h.module}.sv", p.body, p.reason)
        if p.reason == "ok":
            return answer, sim.job_from_task(task, p.tb, target_mode=target_mode), None
        if p.reason == "rejected":
            return answer, None, harness.rejected_result(task["id"], p.why)
        return answer, None, parse_failure(p.reason)
    answer = common.parse_answer(text)
    if answer.reason in PARSE_FAILURES:
        return answer, None, parse_failure(answer.reason)
    return answer, sim.job_from_task(task, answer.code, target_mode=target_mode), None


def submit_answer(pool, task, text, target_mode="cvdp", answer_mode="testbench"):
    """Parse `text` (prepare_answer) and, when it gave a job, submit its simulation to a simpool.SimPool.
    Returns (Answer, wait): wait() -> the result dict (the simulation runs meanwhile, so the caller can
    generate the next batch)."""
    answer, job, res = prepare_answer(task, text, target_mode, answer_mode)
    if job is None:
        return answer, lambda: res
    future = pool.submit(job)
    return answer, lambda: future.result().to_dict()


def score_answers(pairs, workers=None, target_mode="cvdp", desc="simulate", answer_mode="testbench",
                  retry_starved=False):
    """[(task, answer text)] -> [result dict], in order (prepare_answer per pair). The jobs are simulated
    with `workers` processes (simpool.SimPool; 1 = in this process), under a tqdm bar with the counts per status.
    retry_starved: as simpool.simulate_many's (a timeout the busy machine starved of CPU runs once more, alone)."""
    prepared = [prepare_answer(t, text, target_mode, answer_mode) for t, text in pairs]
    todo = [i for i, (_, job, _) in enumerate(prepared) if job is not None]
    jobs = [prepared[i][1] for i in todo]
    out = [res for _, _, res in prepared]
    counts = {}
    with tqdm(total=len(jobs), desc=desc, dynamic_ncols=True, disable=not jobs) as bar, \
            contextlib.ExitStack() as stack:
        if (workers or os.cpu_count() or 1) > 1 and len(jobs) > 1:
            pool = stack.enter_context(simpool.SimPool(workers))
            futures = [pool.submit(j) for j in jobs]
            done = (f.result() for f in futures)
        else:
            done = (sim.simulate(j) for j in jobs)
        for i, r in zip(todo, done):
            out[i] = r.to_dict()
            counts[r.status] = counts.get(r.status, 0) + 1
            bar.set_postfix_str(" ".join(f"{k}={v}" for k, v in sorted(counts.items())), refresh=False)
            bar.update(1)
    if retry_starved:                   # alone: the pool is closed
        for i, job in zip(todo, jobs):
            if sim.starved_timeout(out[i]):
                out[i] = sim.simulate(job).to_dict()
    return out


@dataclass
class Score:
    """What the trainer needs from the scorer for one sample."""
    reward: float                  # sim.reward: 1 + coverage, or 0 (--reward over_random: over_random_reward)
    status: str                    # SimResult.status, or the parse failure (no_code / truncated)
    coverage: float | None = None  # overall coverage 0..1 (partial metrics kept for failures)
    passed: bool = False           # all coverage targets met
    compile_ok: bool = False
    parsed: bool = False
    result: dict = None            # the result dict (see parse_failure)

    @classmethod
    def of(cls, result, random_cov=None):
        """random_cov given: the reward is over_random_reward's, else the task reward (result_reward)."""
        pct = result.get("overall_pct")
        reward = result_reward(result) if random_cov is None else over_random_reward(result, random_cov)
        return cls(reward, result["status"], None if pct is None else pct / 100.0,
                   bool(result.get("passed")), bool(result.get("compile_ok")), not is_parse_failure(result), result)
