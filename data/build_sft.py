"""Staged SFT data (LLM4Cov, docs/method.md §3.3), execution-validated with sim.py.

Stages (each file is the whole mixture of its stage, so stage k trains on stagek.jsonl):
  stage 0  direct rows: prompt -> the best of N teacher testbenches; kept only if it ran with coverage.
  stage 1  stage 0 + refinement rows from weak or failing states of a weak "state policy" (template
           levels minimal/weak/medium plus typical broken testbenches): per design the runs are
           reduced to worst-first states (the first failing run; the worst run always; the median run
           only if median - worst > 0.1 in coverage fraction), the teacher refines each state, and
           a row is kept only if the simulator error is fixed or overall coverage rises by > 1 point
           (0.01 as a fraction) with no metric falling; only the largest improvement (reward gain)
           per design is kept.
  stage 2  stage 1 + refinement rows whose states come from a model's OWN rollouts (DAgger-style:
           states from the policy, labels from the teacher): `states_fn(tasks) -> [(task, answer)]`;
           model_states_fn(model, tok, n=2, ...) = the stage-1 model's direct rollouts (CLI:
           --stage2-model M [--stage2-adapter DIR]). The same worst-first selection, refinement and
           filter as stage 1; a rollout that does not parse (no code block / cut off) is a parse-failure
           state: it is not simulated, the teacher sees common.refine_messages(task, answer, None) (the
           template teacher answers with its strong template) and the row kind is refine_parse.

Rows (chat JSONL): {"messages": [...], "task_id", "stage", "kind", "reward_before", "reward_after"};
kind: direct | refine_parse (the state did not parse) | refine_compile (the state was simulated and
failed: compile error, timeout, no coverage ...) | refine_coverage (coverage gain). Direct rows are
common.build_messages(task) + the answer; refinement rows are the memoryless state
common.refine_messages(task, state_answer, state_result or None) + the answer; answers are canonical
(common.render_answer). Rewards are sim.reward (0, or 1 + overall/100).

Answer modes (--answer-mode, harness.py): testbench (above) or stimulus: the prompts are
harness.first_messages / refine_state_messages (the kit's harness is in the prompt), the answers stimulus
bodies (harness.render_stimulus), the template teacher writes stimulus answers (teacher.stimulus_answer;
stage-1 states: weaker stimuli and teacher.corrupt_stimulus copies; refinement: teacher.refine_stimulus), and
scoring assembles harness + stimulus (score.prepare_answer). A design the kit cannot harness gets
testbench-mode rows. Every row names its mode (`answer_mode`); result.json's outcome counts the distinct
stimulus bodies of each stage's rows (`distinct_stimuli`: a design-aware teacher gives many).

Flow: tasks (--tasks FILE or --synthetic N) -> optional --decontaminate EVAL.jsonl ... (drops training
tasks whose RTL is too similar to an eval task's: data.decontam.contamination_filter) -> stage 0 ->
stage 1 -> optional stage 2. Teacher: the template teacher (default, --level), an OpenAI-compatible
endpoint (--teacher-url/--teacher-model) or an HF model (--teacher-hf M [--teacher-adapter DIR]).

CLI:
  python data/build_sft.py --synthetic 200 --seed 0 --out runs/sft_data        # data/designs.py tasks
  python data/build_sft.py --tasks train_tasks.jsonl --out runs/sft_data --n 2 \
      --decontaminate ../shared/data/dev_tasks.jsonl                           # drop dev look-alikes
  python data/build_sft.py ... --teacher-url http://127.0.0.1:8000 --teacher-model NAME   # chat teacher
  python data/build_sft.py ... --stage2-model Qwen/Qwen3-4B-Instruct-2507 --stage2-adapter runs/sft1/adapter
  python data/build_sft.py ... --stage2-model M --stage2-adapter A --stages01-from runs/sft_data   # stage 2 on
      # the stage-0/1 rows an earlier build wrote (what the stage-1 model trained on), not a rebuild of them
A design the teacher cannot drive (data.teacher.TeacherError, e.g. a port of non-integral type) is
counted by reason and skipped. Simulation phases show a tqdm bar.
Files written (under --out): stage0.jsonl, stage1.jsonl, stage2.jsonl (with --stage2-model), result.json
(sizes, skipped designs by reason) and done.json (rundir.py's run folder), and
build_info.json: config, per-stage stats (runs/states/candidates by status, kept rows by kind),
sizes (rows per stage), sizes_by_kind (rows per stage and kind), seconds (per stage, stage-2 rollouts,
total), decontamination (eval files, threshold, dropped ids with their F1) and stage2_policy.
"""
import argparse
import hashlib
import json
import random
import re
import sys
import time
from pathlib import Path

from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # kit root: sim.py, common.py

import common  # noqa: E402
import harness  # noqa: E402
import rundir  # noqa: E402
import sim  # noqa: E402
from data import teacher as teacher_mod  # noqa: E402
from data.decontam import contamination_filter  # noqa: E402
from data.designs import generate_tasks  # noqa: E402
from score import feedback_result, is_parse_failure, result_reward, score_answers  # noqa: E402

MIN_GAIN_PCT = 1.0          # overall coverage must rise by more than 1 point (0.01 as a fraction)
MEDIAN_MINUS_WORST = 0.1    # keep the median state only if median - worst > 0.1 (fraction)
STATE_LEVELS = ("minimal", "weak", "medium")


# ----------------------------------------------------------------------------------------------
# Scoring: score.score_answers (parse -> simulate; a parse failure is a result whose status is
# no_code / truncated, never simulated) and score.result_reward (sim.reward on a result dict)
# ----------------------------------------------------------------------------------------------

def rank_key(res):
    """Total order of results (LLM4Cov CovResult): ran, has coverage, overall."""
    ok = res.get("status") == "ok"
    cov = res.get("overall_pct")
    return (res.get("compile_ok", ok) is not False, ok and cov is not None, cov if ok and cov is not None else -1.0)


def improvement(before, after):
    """Kind of improvement from state `before` to `after`, or None:

    refine_parse: the state's answer did not parse (no code block / cut off; nothing was simulated) and
      the new testbench runs with coverage;
    refine_compile: the state was simulated but failed (compile error, timeout, no coverage, ...) and
      the new testbench runs with coverage;
    refine_coverage: both ran; overall rises by > MIN_GAIN_PCT points and no metric's pct falls.
    """
    if result_reward(after) == 0.0:
        return None
    if is_parse_failure(before):
        return "refine_parse"
    if result_reward(before) == 0.0:
        return "refine_compile"
    if after["overall_pct"] - before["overall_pct"] <= MIN_GAIN_PCT:
        return None
    for name, m in (before.get("metrics") or {}).items():
        a = (after.get("metrics") or {}).get(name)
        if m and m.get("pct") is not None and a and a.get("pct") is not None and a["pct"] < m["pct"] - 1e-9:
            return None
    return "refine_coverage"


def select_states(runs):
    """Worst-first states of one design from its runs [(answer, result)] (docs/method.md §3.3 step 5).

    Returns [(answer, result, tag)]: tag "fail" = the first run without coverage; "worst" = the
    lowest-coverage run below 100 % (always kept); "median" only if median - worst > 0.1 (fraction).
    """
    out = []
    fails = [r for r in runs if result_reward(r[1]) == 0.0]
    if fails:
        out.append((fails[0][0], fails[0][1], "fail"))
    ok = sorted((r for r in runs if result_reward(r[1]) > 0 and r[1]["overall_pct"] < 100.0),
                key=lambda r: r[1]["overall_pct"])
    if ok:
        out.append((ok[0][0], ok[0][1], "worst"))
        med = ok[(len(ok) - 1) // 2] if len(ok) > 2 else None
        if med is not None and (med[1]["overall_pct"] - ok[0][1]["overall_pct"]) / 100.0 > MEDIAN_MINUS_WORST:
            out.append((med[0], med[1], "median"))
    return out


# ----------------------------------------------------------------------------------------------
# Rows
# ----------------------------------------------------------------------------------------------

def canonical(answer, task=None, answer_mode="testbench"):
    """The canonical assistant text of an answer (harness.canonical_answer; testbench without a task)."""
    if task is None:
        a = common.parse_answer(answer)
        return common.render_answer(a.filename, a.code)
    return harness.canonical_answer(task, answer, answer_mode)


def direct_row(task, answer, res, stage=0, answer_mode="testbench"):
    msgs = harness.first_messages(task, answer_mode) + [
        {"role": "assistant", "content": canonical(answer, task, answer_mode)}]
    return {"messages": msgs, "task_id": task["id"], "stage": stage, "kind": "direct",
            "answer_mode": harness.task_mode(task, answer_mode),
            "reward_before": None, "reward_after": result_reward(res)}


def refine_row(task, state_answer, state_res, answer, res, kind, stage, answer_mode="testbench"):
    msgs = harness.refine_state_messages(task, state_answer, feedback_result(state_res), answer_mode)
    msgs = list(msgs) + [{"role": "assistant", "content": canonical(answer, task, answer_mode)}]
    return {"messages": msgs, "task_id": task["id"], "stage": stage, "kind": kind,
            "answer_mode": harness.task_mode(task, answer_mode),
            "reward_before": result_reward(state_res), "reward_after": result_reward(res)}


def distinct_stimuli(rows):
    """How many distinct stimulus bodies the stimulus-mode rows' answers hold (whitespace-normalised)."""
    bodies = {" ".join(harness.parse_stimulus(r["messages"][-1]["content"]).body.split())
              for r in rows if r.get("answer_mode") == "stimulus"}
    return len(bodies)


# ----------------------------------------------------------------------------------------------
# Stages
# ----------------------------------------------------------------------------------------------

def teacher_reason(err):
    """What a TeacherError is counted under: its message without the design's id and names."""
    reason = re.sub(r"'[^']*'", "'*'", str(err).split(": ", 1)[-1])
    return re.sub(r"(non-integral type) .*", r"\1", reason)


def teacher_direct(tasks, teacher, n):
    """(kept tasks, their n teacher answers each, {reason: count} of the skipped ones). A design the teacher
    cannot drive (data.teacher.TeacherError, e.g. a port of non-integral type) is counted and skipped; the
    batch call is tried first (an HF teacher generates in batches), then task by task."""
    try:
        return list(tasks), teacher.direct(tasks, n), {}
    except teacher_mod.TeacherError:
        pass
    kept, answers, skipped = [], [], {}
    for t in tqdm(tasks, desc="teacher", dynamic_ncols=True):
        try:
            answers.append(teacher.direct([t], n)[0])
        except teacher_mod.TeacherError as e:
            print(f"build_sft: skipped, the teacher cannot drive it: {e}", file=sys.stderr)
            skipped[teacher_reason(e)] = skipped.get(teacher_reason(e), 0) + 1
            continue
        kept.append(t)
    return kept, answers, skipped


def build_stage0(tasks, teacher, n=2, score_fn=None, workers=None, answer_mode="testbench"):
    """Direct rows: for each task the best of n teacher answers (and of its known stimulus, where it has one),
    kept if it ran with coverage.

    Returns (rows, stats); stats["skipped_ids"] are the designs the teacher cannot drive (counted per
    reason in stats["skipped_by_reason"]). score_fn([(task, answer)]) -> [result dict] defaults to
    score.score_answers.
    """
    score_fn = score_fn or (lambda pairs: score_answers(pairs, workers, desc="stage 0: teacher answers",
                                                        answer_mode=answer_mode, retry_starved=True))
    kept, answers, skipped = teacher_direct(tasks, teacher, n)
    # a task that comes with a known stimulus (the synthetic skill families) offers it beside the teacher's answers:
    # the teacher's template cannot open a code lock, and the best scored answer is the row
    answers = [list(ans) + ([harness.render_stimulus(t["known_stimulus"])]
                            if t.get("known_stimulus") and harness.task_mode(t, answer_mode) == "stimulus" else [])
               for t, ans in zip(kept, answers)]
    pairs = [(t, a) for t, ans in zip(kept, answers) for a in ans]
    results = score_fn(pairs)
    rows, dropped, k = [], 0, 0
    for t, ans in zip(kept, answers):
        runs = list(zip(ans, results[k:k + len(ans)]))
        k += len(ans)
        best = max(runs, key=lambda r: rank_key(r[1]))
        if result_reward(best[1]) == 0.0:
            dropped += 1
            continue
        rows.append(direct_row(t, best[0], best[1], stage=0, answer_mode=answer_mode))
    kept_ids = {t["id"] for t in kept}
    return rows, {"tasks": len(tasks), "tries": n, "rows": len(rows), "dropped_no_coverage": dropped,
                  "skipped_teacher": sum(skipped.values()), "skipped_by_reason": skipped,
                  "skipped_ids": [t["id"] for t in tasks if t["id"] not in kept_ids]}


def state_policy_runs(tasks, levels=STATE_LEVELS, fail_fraction=0.3, seed=0, answer_mode="testbench"):
    """Weak states for stage 1: template answers at weak levels, plus (for `fail_fraction` of the
    designs) one broken copy with a typical mistake (teacher.CORRUPTIONS; in stimulus mode
    teacher.STIMULUS_CORRUPTIONS of a template stimulus). Each design draws from a generator seeded by (seed, its
    id), so adding or dropping one design changes no other design's states (one stream over the list in order did:
    a design the simulator's wall clock kept out of the pool in one build shifted the draws of ~200 later rows).
    Returns [(task, answer)]."""
    pairs = []
    for t in tasks:
        rng = random.Random(f"{seed}:{t['id']}")      # str seeds hash with sha512: stable across processes
        stim = harness.task_mode(t, answer_mode) == "stimulus"
        make = teacher_mod.stimulus_answer if stim else teacher_mod.template_answer
        try:
            answers = [make(t, lv, seed + i) for i, lv in enumerate(levels)]
        except teacher_mod.TeacherError as e:
            print(f"state policy: {e}", file=sys.stderr)
            continue
        if rng.random() < fail_fraction:
            if stim:
                answers.append(teacher_mod.corrupt_stimulus(t, answers[-1], rng.choice(teacher_mod.STIMULUS_CORRUPTIONS),
                                                            rng.randrange(4)))
            else:
                answers.append(teacher_mod.corrupt(t, answers[-1], rng.choice(teacher_mod.CORRUPTIONS), rng.randrange(2)))
        pairs.extend((t, a) for a in answers)
    return pairs


def build_refine_rows(state_pairs, teacher, stage, score_fn=None, workers=None, rounds=1, answer_mode="testbench"):
    """Refinement rows from runs [(task, answer)]: score, select worst-first states per design, let the
    teacher refine (up to `rounds` times, each from the previous improved answer), filter by
    improvement, keep the largest reward gain per design. Returns (rows, stats)."""
    score_fn = score_fn or (lambda pairs: score_answers(pairs, workers, desc=f"stage {stage}: states / refinements",
                                                        answer_mode=answer_mode, retry_starved=True))
    results = score_fn(state_pairs)
    by_task, tasks = {}, {}
    for (t, a), r in zip(state_pairs, results):
        by_task.setdefault(t["id"], []).append((a, r))
        tasks[t["id"]] = t
    states = []
    for tid, runs in by_task.items():
        states.extend((tasks[tid], a, r, tag) for a, r, tag in select_states(runs))
    stats = {"designs": len(by_task), "runs": len(state_pairs), "runs_by_status": {}, "states": len(states),
             "states_by_tag": {}, "states_by_status": {}, "candidates": 0, "candidates_by_status": {},
             "kept_by_kind": {}, "rejected_no_improvement": 0}
    for r in results:
        stats["runs_by_status"][r["status"]] = stats["runs_by_status"].get(r["status"], 0) + 1
    for s in states:
        stats["states_by_tag"][s[3]] = stats["states_by_tag"].get(s[3], 0) + 1
        stats["states_by_status"][s[2]["status"]] = stats["states_by_status"].get(s[2]["status"], 0) + 1
    best = {}
    cur = [(t, a, r) for t, a, r, _ in states]
    for _ in range(rounds):
        if not cur:
            break
        # the teacher sees None for a parse failure (common.refine_messages' convention)
        new_answers = teacher.refine([(t, a, feedback_result(r)) for t, a, r in cur])
        new_results = score_fn([(t, a) for (t, _, _), a in zip(cur, new_answers)])
        nxt = []
        for (t, a0, r0), a1, r1 in zip(cur, new_answers, new_results):
            stats["candidates"] += 1
            stats["candidates_by_status"][r1["status"]] = stats["candidates_by_status"].get(r1["status"], 0) + 1
            kind = improvement(r0, r1)
            if kind is None:
                stats["rejected_no_improvement"] += 1
                continue
            gain = result_reward(r1) - result_reward(r0)
            if t["id"] not in best or gain > best[t["id"]][0]:
                best[t["id"]] = (gain, refine_row(t, a0, r0, a1, r1, kind, stage, answer_mode))
            if r1.get("overall_pct") is not None and r1["overall_pct"] < 100.0:
                nxt.append((t, a1, r1))
        cur = nxt
    rows = [row for _, row in best.values()]
    for row in rows:
        stats["kept_by_kind"][row["kind"]] = stats["kept_by_kind"].get(row["kind"], 0) + 1
    stats["rows"] = len(rows)
    return rows, stats


def build_stage1(tasks, teacher, stage0_rows, score_fn=None, workers=None, seed=0, fail_fraction=0.3, rounds=2,
                 answer_mode="testbench"):
    """Stage 0 rows + refinement rows from the template state policy (weak and broken testbenches); rounds 0:
    no state is run (nothing would refine it)."""
    pairs = [] if rounds == 0 else state_policy_runs(tasks, fail_fraction=fail_fraction, seed=seed,
                                                     answer_mode=answer_mode)
    rows, stats = build_refine_rows(pairs, teacher, 1, score_fn, workers, rounds, answer_mode)
    return stage0_rows + rows, stats


def build_stage2(tasks, teacher, stage1_rows, states_fn, score_fn=None, workers=None, rounds=1,
                 answer_mode="testbench"):
    """Stage 1 rows + refinement rows whose states come from `states_fn(tasks) -> [(task, answer)]`
    (a model's own rollouts, e.g. model_states_fn(stage-1 model)); labels come from the teacher.
    Rollouts that do not parse are parse-failure states (rows of kind refine_parse)."""
    t0 = time.time()
    pairs = list(states_fn(tasks))
    t1 = time.time()
    rows, stats = build_refine_rows(pairs, teacher, 2, score_fn, workers, rounds, answer_mode)
    stats["states_fn_s"] = round(t1 - t0, 1)
    return stage1_rows + rows, stats


def model_states_fn(model, tok, *, n=2, max_new_tokens=2048, temperature=0.7, top_p=0.8, seed=0,
                    adapter_name=None, batch_size=64, answer_mode="testbench"):
    """The states_fn of build_stage2 for a model: its direct rollouts (n per task, common.generate on
    harness.first_messages in `answer_mode`, with the adapter active on the model or `adapter_name`).
    Returns states_fn(tasks) -> [(task, answer_text)], n pairs per task in task order. The rollouts run one
    generation batch (batch_size // n tasks) per call, behind a progress bar."""
    policy = teacher_mod.HFTeacher(model, tok, max_new_tokens=max_new_tokens, temperature=temperature,
                                   top_p=top_p, seed=seed, adapter_name=adapter_name, batch_size=batch_size,
                                   mode=answer_mode)

    def states_fn(tasks):
        per, pairs = max(1, batch_size // n), []
        with tqdm(total=len(tasks), desc="stage-2 rollouts", unit="task", dynamic_ncols=True) as bar:
            for i in range(0, len(tasks), per):
                chunk = tasks[i:i + per]
                pairs += [(t, a) for t, ans in zip(chunk, policy.direct(chunk, n)) for a in ans]
                bar.update(len(chunk))
        return pairs

    return states_fn


def kinds_of(rows):
    out = {}
    for r in rows:
        out[r.get("kind")] = out.get(r.get("kind"), 0) + 1
    return out


def write_jsonl(path, rows):
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")


def build_config(tasks, teacher, n, seed, fail_fraction, rounds, answer_mode):
    """A build's settings, as build_info.json and result.json record them (and load_stages01 compares them):
    the teacher's class and level (the template teacher's), and the sha256 of the task list as given."""
    digest = hashlib.sha256(json.dumps(tasks, sort_keys=True).encode()).hexdigest()
    return {"n": n, "seed": seed, "fail_fraction": fail_fraction, "rounds": rounds, "teacher": type(teacher).__name__,
            "teacher_level": getattr(teacher, "level", None), "answer_mode": answer_mode, "tasks_sha256": digest}


# compared always; a build_config key outside these only when the earlier build recorded it (older builds did not)
ALWAYS_COMPARED = ("n", "seed", "fail_fraction", "rounds", "teacher", "answer_mode")


def load_stages01(folder, tasks, config):
    """Stages 0-1 of the finished earlier build in `folder` (its stage0.jsonl, stage1.jsonl, build_info.json and
    done.json) as (s0, st0, s1, st1). A stage-1 rebuild is not bit-exact (a simulator run near its wall-clock limit
    can pass in one build and time out in another), so stage 2 starts from the rows the stage-1 model trained on.
    The build must be of the same tasks with the same settings (`config`: build_config's): anything else raises
    ValueError, naming what differs."""
    folder = Path(folder)
    why = f"cannot reuse stages 0-1 of {folder}"
    try:
        info = json.loads((folder / "build_info.json").read_text())
        if not (folder / "done.json").is_file():
            raise ValueError("the build did not finish (no done.json)")
        s0, s1 = ([json.loads(x) for x in open(folder / f"stage{k}.jsonl")] for k in (0, 1))
        st0, st1, sizes = info["stage0"], info["stage1"], info["sizes"]
        st0["skipped_ids"]     # build_all reads it: a build_info.json without it is refused here
    except (OSError, ValueError) as e:
        raise ValueError(f"{why}: {e}") from None
    except (KeyError, TypeError) as e:
        raise ValueError(f"{why}: build_info.json lacks {e}") from None
    old = info.get("config") or {}
    keys = [k for k in config if k in ALWAYS_COMPARED or k in old]
    diff = {k: (old.get(k), config[k]) for k in keys if old.get(k) != config[k]}
    if diff:
        raise ValueError(f"{why}: built with other settings (then, now): {diff}")
    if info.get("tasks") != len(tasks):
        raise ValueError(f"{why}: built from {info.get('tasks')} tasks, not {len(tasks)}")
    if (sizes.get("stage0"), sizes.get("stage1")) != (len(s0), len(s1)):
        raise ValueError(f"{why}: its .jsonl files hold {len(s0)} + {len(s1)} rows, build_info.json says "
                         f"{sizes.get('stage0')} + {sizes.get('stage1')}")
    stray = sorted({r.get("task_id") for r in s1} - {t["id"] for t in tasks})
    if stray:
        raise ValueError(f"{why}: rows of {len(stray)} task(s) not in --tasks, e.g. {stray[0]}")
    return s0, st0, s1, st1


def build_all(tasks, out_dir, teacher, n=2, workers=None, seed=0, fail_fraction=0.3, rounds=2, score_fn=None,
              states_fn=None, stage2_rounds=None, extra_info=None, answer_mode="testbench", stages01=None):
    """Stages 0 and 1 (and stage 2 when `states_fn` is given) into out_dir: stage0.jsonl, stage1.jsonl,
    [stage2.jsonl], build_info.json, then result.json and done.json (rundir.py's run folder). Returns the
    info: {tasks, config, stage0/1/2 stats, sizes (rows per stage), sizes_by_kind (rows per stage and kind),
    seconds (per stage and total), plus `extra_info` (e.g. the decontamination report)}. Designs the teacher
    cannot drive are skipped after stage 0's try (stage0.skipped_by_reason) and left out of stages 1 and 2.
    `stages01`: (s0, st0, s1, st1) of an earlier build of the same tasks and settings (load_stages01), taken as
    they are instead of rebuilt."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "done.json").unlink(missing_ok=True)
    t0 = time.time()
    config = build_config(tasks, teacher, n, seed, fail_fraction, rounds, answer_mode)
    if stages01 is not None:   # stages 0-1 of an earlier build: the rows the stage-1 model trained on, as they were
        s0, st0, s1, st1 = stages01
        t1 = t2 = time.time()
        print(f"stages 0-1: {len(s0)} + {len(s1)} rows of an earlier build, not rebuilt")
        all_tasks, tasks = tasks, [t for t in tasks if t["id"] not in set(st0["skipped_ids"])]
    else:
        s0, st0 = build_stage0(tasks, teacher, n, score_fn, workers, answer_mode)
        t1 = time.time()
        print(f"stage 0: {st0['rows']} direct rows from {len(tasks)} tasks ({t1 - t0:.0f} s)"
              + (f"; skipped {st0['skipped_teacher']} the teacher cannot drive: {st0['skipped_by_reason']}"
                 if st0["skipped_teacher"] else ""))
        all_tasks, tasks = tasks, [t for t in tasks if t["id"] not in set(st0["skipped_ids"])]
        s1, st1 = build_stage1(tasks, teacher, s0, score_fn, workers, seed, fail_fraction, rounds, answer_mode)
        t2 = time.time()
        print(f"stage 1: {len(s1)} rows = {len(s0)} direct + {st1['rows']} refinement {st1['kept_by_kind']} "
              f"from {st1['states']} states ({t2 - t1:.0f} s)")
    write_jsonl(out_dir / "stage0.jsonl", s0)
    write_jsonl(out_dir / "stage1.jsonl", s1)
    info = {"tasks": len(all_tasks), "config": dict(config),
            "answer_mode_fallbacks": harness.fallbacks(all_tasks, answer_mode),
            **(extra_info or {}),
            "stage0": st0, "stage1": st1, "sizes": {"stage0": len(s0), "stage1": len(s1)},
            "sizes_by_kind": {"stage0": kinds_of(s0), "stage1": kinds_of(s1)},
            "distinct_stimuli": {"stage0": distinct_stimuli(s0), "stage1": distinct_stimuli(s1)},
            "seconds": {"stage0": round(t1 - t0, 1), "stage1": round(t2 - t1, 1)}}
    if states_fn is not None:
        r2 = rounds if stage2_rounds is None else stage2_rounds
        info["config"]["stage2_rounds"] = r2
        s2, st2 = build_stage2(tasks, teacher, s1, states_fn, score_fn, workers, r2, answer_mode)
        t3 = time.time()
        print(f"stage 2: {len(s2)} rows = {len(s1)} stage-1 + {st2['rows']} refinement {st2['kept_by_kind']} "
              f"from {st2['states']} states of {st2['runs']} model rollouts {st2['runs_by_status']} "
              f"({t3 - t2:.0f} s, rollouts {st2['states_fn_s']:.0f} s)")
        write_jsonl(out_dir / "stage2.jsonl", s2)
        info["stage2"] = st2
        info["sizes"]["stage2"] = len(s2)
        info["sizes_by_kind"]["stage2"] = kinds_of(s2)
        info["distinct_stimuli"]["stage2"] = distinct_stimuli(s2)
        info["seconds"]["stage2_rollouts"] = st2["states_fn_s"]
        info["seconds"]["stage2"] = round(t3 - t2, 1)
    info["seconds"]["total"] = round(time.time() - t0 + (extra_info or {}).get("seconds_before_build", 0.0), 1)
    with open(out_dir / "build_info.json", "w") as f:         # every statistic, for people
        json.dump(info, f, indent=2)
    rundir.write_result(out_dir, info["config"], {"tasks": len(all_tasks), "seconds": info["seconds"]},
                        {"sizes": info["sizes"], "sizes_by_kind": info["sizes_by_kind"], "drivable_tasks": len(tasks),
                         "skipped_by_reason": st0["skipped_by_reason"], "answer_mode": answer_mode,
                         "answer_mode_fallbacks": len(info["answer_mode_fallbacks"]),
                         "distinct_stimuli": info["distinct_stimuli"]})
    files = {k: f"{k}.jsonl" for k in info["sizes"]}
    rundir.write_done(out_dir, "data/build_sft.py", {**files, "info": "build_info.json", "result": "result.json"})
    return info


def _load_model_and_adapter(name, adapter, quant):
    model, tok = common.load_model(name, quant=quant)
    if adapter:
        model = common.load_adapter(model, adapter)
    return model, tok


# Checked before any work. rounds 0 builds stage 0 alone (stage 1 adds no row to it): chorus_mini's validation rows
# of the tuning tasks (--rounds 0 --fail-fraction 0)
RANGES = {"synthetic": rundir.at_least(1), "threshold": rundir.within(0, 1), "n": rundir.at_least(1),
          "rounds": rundir.at_least(0), "fail_fraction": rundir.within(0, 1), "workers": rundir.at_least(1),
          "teacher_max_new_tokens": rundir.at_least(1), "stage2_n": rundir.at_least(1),
          "stage2_max_new_tokens": rundir.at_least(1), "stage2_temperature": rundir.at_least(0),
          "stage2_top_p": (lambda v: 0 < v <= 1, "within (0, 1]"), "stage2_rounds": rundir.at_least(1),
          "stage2_batch_size": rundir.at_least(1)}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    src = ap.add_argument_group("tasks (training designs only; never the dev/eval set)")
    src.add_argument("--tasks", help="task JSONL (e.g. from data/cvdp.py or data/designs.py)")
    src.add_argument("--synthetic", type=int, help="generate N tasks with data/designs.py (split 'train')")
    src.add_argument("--seed", type=int, default=0, help="synthetic generation, template and sampling seed")
    src.add_argument("--decontaminate", nargs="+", metavar="EVAL.jsonl", default=[],
                     help="eval task files: drop training tasks whose RTL is too similar to any of them "
                          "(data.decontam.contamination_filter: 5-gram or ROUGE-L F1 >= --threshold); "
                          "the dropped ids go to build_info.json")
    src.add_argument("--threshold", type=float, default=0.5, help="F1 threshold for --decontaminate")
    ap.add_argument("--out", required=True, help="output folder")
    harness.add_answer_mode_arg(ap, "rows")
    ap.add_argument("--n", type=int, default=2, help="teacher tries per task for stage 0 (best kept)")
    ap.add_argument("--rounds", type=int, default=2, help="refinement rounds per stage-1 state (0: stage 0 only)")
    ap.add_argument("--fail-fraction", type=float, default=0.3, help="designs that also get a broken state")
    ap.add_argument("--workers", type=int, default=None, help="simulator processes (default: cores)")
    ap.add_argument("--quant", default="auto", help="precision for the HF models below (common.resolve_quant)")
    t = ap.add_argument_group("teacher (default: the template teacher)")
    t.add_argument("--level", default="strong", choices=teacher_mod.LEVELS)
    t.add_argument("--teacher-url", help="OpenAI-compatible endpoint, e.g. http://127.0.0.1:8000")
    t.add_argument("--teacher-model", help="model name for --teacher-url")
    t.add_argument("--teacher-hf", metavar="M", help="an HF model (id, folder or GGUF) as the teacher (HFTeacher)")
    t.add_argument("--teacher-adapter", metavar="DIR", help="peft adapter folder on --teacher-hf")
    t.add_argument("--teacher-max-new-tokens", type=int, default=2048)
    s2 = ap.add_argument_group("stage 2 (states from a model's own direct rollouts; labels from the teacher)")
    s2.add_argument("--stage2-model", metavar="M", help="the stage-1 model (HF id, folder or GGUF); "
                    "writes stage2.jsonl")
    s2.add_argument("--stage2-adapter", metavar="DIR", help="peft adapter folder on --stage2-model (e.g. the "
                    "stage-1 SFT adapter)")
    s2.add_argument("--stage2-n", type=int, default=2, help="rollouts per task")
    s2.add_argument("--stage2-max-new-tokens", type=int, default=2048)
    s2.add_argument("--stage2-temperature", type=float, default=0.7)
    s2.add_argument("--stage2-top-p", type=float, default=0.8)
    s2.add_argument("--stage2-rounds", type=int, default=None, help="refinement rounds (default: --rounds)")
    s2.add_argument("--stage2-batch-size", type=int, default=64, help="rollouts per generation call (a GPU takes "
                    "more: chorus_mini.py passes its gen_batch_size)")
    s2.add_argument("--stages01-from", metavar="DIR", help="take stages 0-1 from this earlier build of the same "
                    "--tasks and settings (its stage0/1.jsonl and build_info.json) instead of rebuilding them")
    args = ap.parse_args(argv)
    rundir.check_options("build_sft.py", args, RANGES)
    if args.stage2_model and (args.rounds if args.stage2_rounds is None else args.stage2_rounds) == 0:
        raise SystemExit("build_sft.py: --stage2-model with --rounds 0 refines nothing: give --stage2-rounds >= 1")
    print(f"build_sft.py: answer mode {args.answer_mode}")
    if bool(args.tasks) == bool(args.synthetic):
        ap.error("give exactly one of --tasks FILE or --synthetic N")
    if args.teacher_adapter and not args.teacher_hf:
        ap.error("--teacher-adapter needs --teacher-hf")
    if args.teacher_url and not args.teacher_model:
        ap.error("--teacher-url needs --teacher-model")
    if args.teacher_url and args.teacher_hf:
        ap.error("give at most one of --teacher-url and --teacher-hf")
    if args.stages01_from and not (args.stage2_model or args.stage2_adapter):
        ap.error("--stages01-from is for a stage-2 build: give --stage2-model (and --stage2-adapter)")
    t_start = time.time()
    if args.tasks:
        tasks = sim.load_tasks(args.tasks)
        if not tasks:           # no rows and a build_info.json would pass for a finished build
            raise ValueError(f"--tasks {args.tasks}: the file has no tasks")
    else:
        tasks = generate_tasks(args.synthetic, args.seed, "train")
    extra = {}
    if args.decontaminate:
        td = time.time()
        n_before = len(tasks)
        tasks, dropped = contamination_filter(tasks, args.decontaminate, threshold=args.threshold)
        extra["decontamination"] = {"eval_files": args.decontaminate, "threshold": args.threshold,
                                    "tasks_before": n_before, "kept": len(tasks), "dropped": len(dropped),
                                    "dropped_rows": dropped, "seconds": round(time.time() - td, 1)}
        print(f"decontaminate: dropped {len(dropped)}/{n_before} training tasks (threshold {args.threshold})")
        for d in dropped[:10]:
            print("  ", d)
        if not tasks:
            sys.exit("error: no training task left after --decontaminate")
    if args.teacher_url:
        teacher = teacher_mod.ChatTeacher(args.teacher_url, args.teacher_model, mode=args.answer_mode)
    elif args.teacher_hf:
        tm, tt = _load_model_and_adapter(args.teacher_hf, args.teacher_adapter, args.quant)
        teacher = teacher_mod.HFTeacher(tm, tt, max_new_tokens=args.teacher_max_new_tokens, temperature=0.7,
                                        top_p=0.8, seed=args.seed, mode=args.answer_mode)
    else:
        teacher = teacher_mod.TemplateTeacher(args.level, args.seed, mode=args.answer_mode)
    stages01 = None
    if args.stages01_from:     # checked before the stage-2 model loads
        stages01 = load_stages01(args.stages01_from, tasks, build_config(
            tasks, teacher, args.n, args.seed, args.fail_fraction, args.rounds, args.answer_mode))
        extra["stages01_from"] = args.stages01_from
    states_fn = None
    if args.stage2_model or args.stage2_adapter:   # no --stage2-model: the bundled SmolLM2
        sm, st = _load_model_and_adapter(args.stage2_model, args.stage2_adapter, args.quant)
        states_fn = model_states_fn(sm, st, n=args.stage2_n, max_new_tokens=args.stage2_max_new_tokens,
                                    temperature=args.stage2_temperature, top_p=args.stage2_top_p, seed=args.seed,
                                    answer_mode=args.answer_mode, batch_size=args.stage2_batch_size)
        extra["stage2_policy"] = {"model": args.stage2_model, "adapter": args.stage2_adapter,
                                  "n": args.stage2_n, "max_new_tokens": args.stage2_max_new_tokens,
                                  "temperature": args.stage2_temperature, "top_p": args.stage2_top_p,
                                  "batch_size": args.stage2_batch_size}
    extra["seconds_before_build"] = round(time.time() - t_start, 1)
    print(f"build_sft: {len(tasks)} tasks, teacher {type(teacher).__name__}, n={args.n}, rounds={args.rounds}, "
          f"fail_fraction={args.fail_fraction}, answer mode {args.answer_mode}, stage 2: {'yes' if states_fn else 'no'}, "
          f"workers={args.workers or 'all cores'} -> {args.out}")
    info = build_all(tasks, args.out, teacher, args.n, args.workers, args.seed, args.fail_fraction, args.rounds,
                     states_fn=states_fn, stage2_rounds=args.stage2_rounds, extra_info=extra, answer_mode=args.answer_mode,
                     stages01=stages01)
    print(f"sizes {info['sizes']}, by kind {info['sizes_by_kind']}, {info['seconds']['total']} s "
          f"-> {Path(args.out) / 'build_info.json'}")
    return info


if __name__ == "__main__":
    raise SystemExit(rundir.cli("data/build_sft.py", main))
