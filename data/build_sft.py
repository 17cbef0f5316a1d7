"""Staged SFT data (LLM4Cov, method.md §3.3), execution-validated with sim.py.

Stages (each file is the whole mixture of its stage, so stage k trains on stagek.jsonl):
  stage 0  direct rows: prompt -> the best of N teacher testbenches; kept only if it ran with coverage.
  stage 1  stage 0 + refinement rows from weak or failing states of a weak "state policy" (template
           levels minimal/weak/medium plus typical broken testbenches): per design the runs are
           reduced to worst-first states (the first failing run; the worst run always; the median run
           only if median - worst > 0.1 in coverage fraction), the teacher refines each state, and
           a row is kept only if the simulator error is fixed or overall coverage rises by > 1 point
           (0.01 as a fraction) with no metric falling; only the largest improvement (reward gain)
           per design is kept.
  stage 2  stage 1 + refinement rows whose states come from a model's own rollouts:
           `states_fn(tasks) -> [(task, answer_text)]` (the lead wires the stage-1 model in).

Rows (chat JSONL): {"messages": [...], "task_id", "stage", "kind": direct|refine_compile|refine_coverage,
"reward_before", "reward_after"}. Direct rows are common.build_messages(task) + the answer; refinement
rows are the memoryless state common.refine_messages(task, state_answer, state_result) + the answer;
answers are canonical (common.render_answer). Rewards are sim.reward (0, or 1 + overall/100).

CLI:
  python data/build_sft.py --synthetic 200 --seed 0 --out runs/sft_data        # data/designs.py tasks
  python data/build_sft.py --tasks train_tasks.jsonl --out runs/sft_data --n 2
  python data/build_sft.py ... --teacher-url http://127.0.0.1:8000 --teacher-model NAME   # chat teacher
Files written (under --out): stage0.jsonl, stage1.jsonl, build_info.json (counts, timings, config);
stage2.jsonl only from build_stage2() with a states_fn.
"""
import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # kit root: sim.py, common.py

from data import teacher as teacher_mod  # noqa: E402

MIN_GAIN_PCT = 1.0          # overall coverage must rise by more than 1 point (0.01 as a fraction)
MEDIAN_MINUS_WORST = 0.1    # keep the median state only if median - worst > 0.1 (fraction)
STATE_LEVELS = ("minimal", "weak", "medium")


# ----------------------------------------------------------------------------------------------
# Scoring
# ----------------------------------------------------------------------------------------------

def sim_score(pairs, workers=None):
    """[(task, answer_text)] -> [result dict] with the kit's scorer; no code -> status 'no_code'."""
    import sim
    jobs, idx = [], []
    out = [None] * len(pairs)
    for i, (task, answer) in enumerate(pairs):
        code = teacher_mod.answer_code(answer)
        if code is None:
            out[i] = {"status": "no_code", "overall_pct": None, "metrics": {}, "uncovered": [], "errors": []}
            continue
        jobs.append(sim.job_from_task(task, code))
        idx.append(i)
    for i, r in zip(idx, sim.simulate_many(jobs, workers=workers)):
        out[i] = r.to_dict()
    return out


def reward(res):
    """sim.reward on a result dict: 1 + overall/100 when it ran with coverage, else 0."""
    if res.get("status") == "ok" and res.get("overall_pct") is not None:
        return 1.0 + res["overall_pct"] / 100.0
    return 0.0


def rank_key(res):
    """Total order of results (LLM4Cov CovResult): ran, has coverage, overall."""
    ok = res.get("status") == "ok"
    cov = res.get("overall_pct")
    return (res.get("compile_ok", ok) is not False, ok and cov is not None, cov if ok and cov is not None else -1.0)


def improvement(before, after):
    """Kind of improvement from state `before` to `after` ("refine_compile" | "refine_coverage"), or None.

    refine_compile: the state failed (no coverage) and the new testbench runs with coverage.
    refine_coverage: both ran; overall rises by > MIN_GAIN_PCT points and no metric's pct falls.
    """
    if reward(after) == 0.0:
        return None
    if reward(before) == 0.0:
        return "refine_compile"
    if after["overall_pct"] - before["overall_pct"] <= MIN_GAIN_PCT:
        return None
    for name, m in (before.get("metrics") or {}).items():
        a = (after.get("metrics") or {}).get(name)
        if m and m.get("pct") is not None and a and a.get("pct") is not None and a["pct"] < m["pct"] - 1e-9:
            return None
    return "refine_coverage"


def select_states(runs):
    """Worst-first states of one design from its runs [(answer, result)] (method.md §3.3 step 5).

    Returns [(answer, result, tag)]: tag "fail" = the first run without coverage; "worst" = the
    lowest-coverage run below 100 % (always kept); "median" only if median - worst > 0.1 (fraction).
    """
    out = []
    fails = [r for r in runs if reward(r[1]) == 0.0]
    if fails:
        out.append((fails[0][0], fails[0][1], "fail"))
    ok = sorted((r for r in runs if reward(r[1]) > 0 and r[1]["overall_pct"] < 100.0),
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

def canonical(answer):
    import common
    a = common.parse_answer(answer)
    return common.render_answer(a.filename, a.code)


def direct_row(task, answer, res, stage=0):
    import common
    msgs = common.build_messages(task) + [{"role": "assistant", "content": canonical(answer)}]
    return {"messages": msgs, "task_id": task["id"], "stage": stage, "kind": "direct",
            "reward_before": None, "reward_after": reward(res)}


def refine_row(task, state_answer, state_res, answer, res, kind, stage):
    import common
    state = None if state_res.get("status") == "no_code" else state_res     # parse failure: no sim result
    msgs = common.refine_messages(task, state_answer, state)
    msgs = list(msgs) + [{"role": "assistant", "content": canonical(answer)}]
    return {"messages": msgs, "task_id": task["id"], "stage": stage, "kind": kind,
            "reward_before": reward(state_res), "reward_after": reward(res)}


# ----------------------------------------------------------------------------------------------
# Stages
# ----------------------------------------------------------------------------------------------

def build_stage0(tasks, teacher, n=2, score_fn=None, workers=None):
    """Direct rows: for each task the best of n teacher answers, kept if it ran with coverage.

    Returns (rows, stats). score_fn([(task, answer)]) -> [result dict] defaults to sim_score.
    """
    score_fn = score_fn or (lambda pairs: sim_score(pairs, workers))
    answers = teacher.direct(tasks, n)
    pairs = [(t, a) for t, ans in zip(tasks, answers) for a in ans]
    results = score_fn(pairs)
    rows, dropped, k = [], 0, 0
    for t, ans in zip(tasks, answers):
        runs = list(zip(ans, results[k:k + len(ans)]))
        k += len(ans)
        best = max(runs, key=lambda r: rank_key(r[1]))
        if reward(best[1]) == 0.0:
            dropped += 1
            continue
        rows.append(direct_row(t, best[0], best[1], stage=0))
    return rows, {"tasks": len(tasks), "tries": n, "rows": len(rows), "dropped_no_coverage": dropped}


def state_policy_runs(tasks, levels=STATE_LEVELS, fail_fraction=0.3, seed=0):
    """Weak states for stage 1: template answers at weak levels, plus (for `fail_fraction` of the
    designs) one broken copy with a typical mistake (teacher.CORRUPTIONS). Returns [(task, answer)]."""
    rng = random.Random(seed)
    pairs = []
    for t in tasks:
        try:
            answers = [teacher_mod.template_answer(t, lv, seed + i) for i, lv in enumerate(levels)]
        except teacher_mod.TeacherError as e:
            print(f"state policy: {e}", file=sys.stderr)
            continue
        if rng.random() < fail_fraction:
            answers.append(teacher_mod.corrupt(t, answers[-1], rng.choice(teacher_mod.CORRUPTIONS), rng.randrange(2)))
        pairs.extend((t, a) for a in answers)
    return pairs


def build_refine_rows(state_pairs, teacher, stage, score_fn=None, workers=None, rounds=1):
    """Refinement rows from runs [(task, answer)]: score, select worst-first states per design, let the
    teacher refine (up to `rounds` times, each from the previous improved answer), filter by
    improvement, keep the largest reward gain per design. Returns (rows, stats)."""
    score_fn = score_fn or (lambda pairs: sim_score(pairs, workers))
    results = score_fn(state_pairs)
    by_task, tasks = {}, {}
    for (t, a), r in zip(state_pairs, results):
        by_task.setdefault(t["id"], []).append((a, r))
        tasks[t["id"]] = t
    states = []
    for tid, runs in by_task.items():
        states.extend((tasks[tid], a, r, tag) for a, r, tag in select_states(runs))
    stats = {"designs": len(by_task), "runs": len(state_pairs), "states": len(states),
             "states_by_tag": {}, "candidates": 0, "kept_by_kind": {}, "rejected_no_improvement": 0}
    for s in states:
        stats["states_by_tag"][s[3]] = stats["states_by_tag"].get(s[3], 0) + 1
    best = {}
    cur = [(t, a, r) for t, a, r, _ in states]
    for _ in range(rounds):
        if not cur:
            break
        new_answers = teacher.refine(cur)
        new_results = score_fn([(t, a) for (t, _, _), a in zip(cur, new_answers)])
        nxt = []
        for (t, a0, r0), a1, r1 in zip(cur, new_answers, new_results):
            stats["candidates"] += 1
            kind = improvement(r0, r1)
            if kind is None:
                stats["rejected_no_improvement"] += 1
                continue
            gain = reward(r1) - reward(r0)
            if t["id"] not in best or gain > best[t["id"]][0]:
                best[t["id"]] = (gain, refine_row(t, a0, r0, a1, r1, kind, stage))
            if r1.get("overall_pct") is not None and r1["overall_pct"] < 100.0:
                nxt.append((t, a1, r1))
        cur = nxt
    rows = [row for _, row in best.values()]
    for row in rows:
        stats["kept_by_kind"][row["kind"]] = stats["kept_by_kind"].get(row["kind"], 0) + 1
    stats["rows"] = len(rows)
    return rows, stats


def build_stage1(tasks, teacher, stage0_rows, score_fn=None, workers=None, seed=0, fail_fraction=0.3, rounds=2):
    """Stage 0 rows + refinement rows from the template state policy (weak and broken testbenches)."""
    pairs = state_policy_runs(tasks, fail_fraction=fail_fraction, seed=seed)
    rows, stats = build_refine_rows(pairs, teacher, 1, score_fn, workers, rounds)
    return stage0_rows + rows, stats


def build_stage2(tasks, teacher, stage1_rows, states_fn, score_fn=None, workers=None, rounds=1):
    """Stage 1 rows + refinement rows whose states come from `states_fn(tasks) -> [(task, answer)]`
    (a model's own rollouts; the lead wires the stage-1 model in)."""
    pairs = list(states_fn(tasks))
    rows, stats = build_refine_rows(pairs, teacher, 2, score_fn, workers, rounds)
    return stage1_rows + rows, stats


def write_jsonl(path, rows):
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")


def build_all(tasks, out_dir, teacher, n=2, workers=None, seed=0, fail_fraction=0.3, rounds=2, score_fn=None):
    """Stages 0 and 1 into out_dir (stage0.jsonl, stage1.jsonl, build_info.json); returns the info."""
    t0 = time.time()
    s0, st0 = build_stage0(tasks, teacher, n, score_fn, workers)
    t1 = time.time()
    print(f"stage 0: {st0['rows']} direct rows from {len(tasks)} tasks ({t1 - t0:.0f} s)")
    s1, st1 = build_stage1(tasks, teacher, s0, score_fn, workers, seed, fail_fraction, rounds)
    t2 = time.time()
    print(f"stage 1: {len(s1)} rows = {len(s0)} direct + {st1['rows']} refinement {st1['kept_by_kind']} "
          f"from {st1['states']} states ({t2 - t1:.0f} s)")
    write_jsonl(Path(out_dir) / "stage0.jsonl", s0)
    write_jsonl(Path(out_dir) / "stage1.jsonl", s1)
    info = {"tasks": len(tasks), "config": {"n": n, "seed": seed, "fail_fraction": fail_fraction, "rounds": rounds,
                                             "teacher": type(teacher).__name__},
            "stage0": st0, "stage1": st1, "sizes": {"stage0": len(s0), "stage1": len(s1)},
            "seconds": {"stage0": round(t1 - t0, 1), "stage1": round(t2 - t1, 1)}}
    with open(Path(out_dir) / "build_info.json", "w") as f:
        json.dump(info, f, indent=2)
    return info


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    src = ap.add_argument_group("tasks (training designs only; never the dev/eval set)")
    src.add_argument("--tasks", help="task JSONL (e.g. from data/cvdp.py or data/designs.py)")
    src.add_argument("--synthetic", type=int, help="generate N tasks with data/designs.py (split 'train')")
    src.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True, help="output folder")
    ap.add_argument("--n", type=int, default=2, help="teacher tries per task for stage 0 (best kept)")
    ap.add_argument("--rounds", type=int, default=2, help="refinement rounds per stage-1 state")
    ap.add_argument("--fail-fraction", type=float, default=0.3, help="designs that also get a broken state")
    ap.add_argument("--workers", type=int, default=None, help="simulator processes (default: cores)")
    t = ap.add_argument_group("teacher (default: the template teacher)")
    t.add_argument("--level", default="strong", choices=teacher_mod.LEVELS)
    t.add_argument("--teacher-url", help="OpenAI-compatible endpoint, e.g. http://127.0.0.1:8000")
    t.add_argument("--teacher-model", help="model name for --teacher-url")
    args = ap.parse_args(argv)
    if bool(args.tasks) == bool(args.synthetic):
        sys.exit("error: give exactly one of --tasks FILE or --synthetic N")
    if args.tasks:
        import sim
        tasks = sim.load_tasks(args.tasks)
    else:
        from data.designs import generate_tasks
        tasks = generate_tasks(args.synthetic, args.seed, "train")
    if args.teacher_url:
        if not args.teacher_model:
            sys.exit("error: --teacher-url needs --teacher-model")
        teacher = teacher_mod.ChatTeacher(args.teacher_url, args.teacher_model)
    else:
        teacher = teacher_mod.TemplateTeacher(args.level, args.seed)
    print(f"build_sft: {len(tasks)} tasks, teacher {type(teacher).__name__}, n={args.n}, rounds={args.rounds}, "
          f"fail_fraction={args.fail_fraction}, workers={args.workers or 'all cores'} -> {args.out}")
    build_all(tasks, args.out, teacher, args.n, args.workers, args.seed, args.fail_fraction, args.rounds)


if __name__ == "__main__":
    main()
