"""The skill split: tasks where constrained random fails and a known stimulus passes (issue 41).

A task measures skill only when random stimulus cannot solve it. The split keeps a task when
  1. the kit can harness it (the random baseline is a stimulus for harness.py's harness);
  2. some known stimulus runs on it: the template teacher (data/teacher.calibrate: strong, long, long + one
     refinement), the task's `known_stimulus` (a stimulus body: the synthetic skill families), its `reference_tb`;
  3. after excluding the items no stimulus covers (below), random stays at least MIN_GAP (5) points below the
     best known stimulus: random_best <= reachable - MIN_GAP, where random_best is the floor's best single run
     (data/floor.py: 100 to 20,000 random cycles, with and without resets, SEEDS seeds each). The best run,
     not the mean: with one seed, 5-seed evaluations of the random baseline passed 5 % of a split built on
     the mean (a lucky seed opens a command decoder's frame).
Each kept task gets the target `icarus_overall_average` = (random_best + reachable) / 2, rounded down to 0.1:
halfway between what random reaches and what a known stimulus reaches, so random misses it by at least
MIN_GAP / 2 points and the known stimulus clears it by as much. Evaluate with --target-mode icarus. Kept rows
also carry `random_floor` (so eval needs no --floor), `exclusions` and `skill` = {source, reachable,
reached_by, random_cov, random_best, target, excluded_items, raw}.

Exclusion (EXCLUSION_RULE): an item is excluded from a task when no run of any stimulus known for it covers it:
the floor's whole random grid and every known stimulus's run. This is the empirical stand-in for the formal
unreachability analysis commercial flows run before writing an exclusion file: the kit has no formal engine.
It catches the constant drivers, tied bits and unsatisfiable expression rows random and directed stimulus
alike never move (div_16bit's zero-extended bits, an `x` assignment, a mux input tied to 0). Its risk is the
other way: an item every known stimulus misses but some stimulus could hit is excluded too, so a model that
hits it gets no credit; the bar random must clear is not lowered by that. The excluded items are listed
per task (their keys, sim.item_key, and descriptions) and the scorer drops them (sim.job_from_task).

Sources: real task files (../shared/data/dev_tasks.jsonl; a training pool's pool.jsonl, whose file stem
`pool` marks it) and the synthetic skill families (data/skill_designs.py). Qualifying pool designs are split
by group (SPLIT_RULE): HELDOUT of the groups evaluate (skill_tasks.jsonl), the rest train
(skill_train.jsonl); a data stage that trains on the pool decontaminates against skill_tasks.jsonl, which
drops the held-out designs (same RTL). With --screen, tasks first get one random run (SCREEN_BUDGET)
against their stored teacher calibration (100 % where they have none), and only those where random stays
SCREEN_GAP below it get the full grid.

    python data/skill.py --tasks ../shared/data/dev_tasks.jsonl --synthetic 50 --out runs/skill [--workers 2]
    python data/skill.py --tasks ../shared/data/dev_tasks.jsonl runs/pool/pool.jsonl --screen --synthetic 150 --out runs/skill
Files written under --out: skill_tasks.jsonl (the split), skill_train.jsonl (qualifying pool designs not held
out), skill_split.json (counts through every filter, the rules, per-task reasons), floor.json and screen.json
(data/floor.py's caches: a second run re-simulates no random run it has).
"""
import argparse
import hashlib
import json
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # kit root
import harness  # noqa: E402
import sim  # noqa: E402
import simpool  # noqa: E402
from data import floor, skill_designs, teacher  # noqa: E402

MIN_GAP = 5.0       # points random must stay below the reachable coverage (the rule)
SEEDS = 3           # random seeds per budget of the floor
# The screen runs 20,000 cycles: random at the full budget covers at least as much, so a task the screen drops
# the grid would drop too, at a fifth of the cycles.
SCREEN_BUDGET = (20_000, 1000)
SCREEN_GAP = 1.0    # points: a screened task whose one random run comes this close to the teacher's stops
HELDOUT = 0.7       # share of qualifying pool groups held out for evaluation; the rest train (RL prompts)
EXCLUSION_RULE = ("an item is excluded from a task when no run of any stimulus known for it covers it: the random "
                  "floor's grid (every budget and seed) and the known stimuli (template teacher strong, long, long + "
                  "one refinement; the task's known stimulus; its reference testbench)")
SPLIT_RULE = ("qualifying pool designs are grouped by repository + top folder (split_group); a group is held out "
              "for evaluation when sha256(group) falls in the first HELDOUT share, else its designs are training "
              "tasks (skill_train.jsonl); dev and synthetic tasks are evaluation tasks")


def skill_target(random_cov, reachable):
    """Halfway between the random floor and the reachable coverage, rounded down to 0.1 point."""
    return math.floor(5 * (random_cov + reachable)) / 10


def known_runs(tasks, workers=2, use_teacher=True):
    """{task id: [(by, result dict)]}: the runs of every known stimulus of each task, each with all its
    uncovered items: the template teacher (strong, long, long + one refinement; data/teacher.calibrate),
    the task's known_stimulus (the synthetic families) and its reference_tb."""
    runs = {t["id"]: [] for t in tasks}
    if use_teacher:
        got = {}
        teacher.calibrate([t for t in tasks if not t.get("known_stimulus")], workers=workers, progress=False, runs=got)
        for tid, rs in got.items():
            runs[tid] += rs
    jobs, whose = [], []
    for t in tasks:
        if t.get("known_stimulus"):
            try:
                tb = harness.assemble(harness.task_harness(t), t["known_stimulus"])[0]
                jobs.append(sim.job_from_task(t, tb, all_uncovered=True))
                whose.append((t["id"], "known stimulus"))
            except harness.HarnessError:
                pass
        if t.get("reference_tb"):       # a testbench text (data/designs.py) or a {name, content} file (RTLLM)
            ref = t["reference_tb"]
            jobs.append(sim.job_from_task(t, ref["content"] if isinstance(ref, dict) else ref, all_uncovered=True))
            whose.append((t["id"], "reference testbench"))
    for (tid, by), r in zip(whose, simpool.simulate_many(jobs, workers=workers, verbose=False) if jobs else []):
        runs[tid].append((by, r.to_dict()))
    return runs


def _counts(result):
    return {m: [v["covered"], v["total"]] for m, v in (result.get("metrics") or {}).items()}


def exclusion(floor_rec, runs):
    """The items to exclude (EXCLUSION_RULE): {key: description} of the items that neither any random run
    of the floor nor any known stimulus's run covers; None when no run of either kind ran."""
    ok = [r for _, r in runs if r.get("status") == sim.OK and r.get("overall_pct") is not None]
    if floor_rec.get("never_hit") is None or not ok:
        return None
    never = {x["key"]: {k: v for k, v in x.items() if k != "key"} for x in floor_rec["never_hit"]}
    for r in ok:
        keys = sim.uncovered_keys(r)
        never = {k: v for k, v in never.items() if k in keys}
    return never


def rescored(floor_rec, runs, excluded):
    """(random_best, random_cov, reachable, reached_by) with `excluded` items out of every run's totals
    (each run left them uncovered, so its covered counts stand)."""
    drop = {}
    for v in excluded.values():
        drop[v["metric"]] = drop.get(v["metric"], 0) + 1
    rows = floor_rec.get("runs") or []
    covs = [sim.overall_from_counts(r["counts"], dropped=drop) if "counts" in r else 0.0 for r in rows]
    covs = [c or 0.0 for c in covs]
    by_budget = {}
    for r, c in zip(rows, covs):
        by_budget.setdefault((r["cycles"], r["reset_period"]), []).append(c)
    random_cov = max(sum(v) / len(v) for v in by_budget.values()) if by_budget else 0.0
    best, by = None, None
    for name, r in runs:
        if r.get("status") == sim.OK and r.get("overall_pct") is not None:
            c = sim.overall_from_counts(_counts(r), dropped=drop)
            if c is not None and (best is None or c > best):
                best, by = c, name
    return (round(max(covs), 3) if covs else 0.0), round(random_cov, 3), best, by


def build_skill_split(tasks, *, workers=2, floor_cache=None, budgets=floor.BUDGETS, seeds=SEEDS, use_teacher=True,
                      on_floor=None, heldout=HELDOUT, screen=None, on_screen=None):
    """(kept eval rows, kept training rows, report) over `tasks` (real and synthetic together; each row's
    `skill.source` or the caller's `_source` names where it came from). Qualifying designs of a training
    pool (`_source` "pool") are split by group (split_group) into the eval split (share `heldout`) and a
    training share; every other qualifying task is an eval task. report: the counts through every filter.
    screen: None, or a floor cache dict: first one random run (SCREEN_BUDGET) per task without a known
    stimulus; a task whose run comes within SCREEN_GAP of its stored teacher calibration (a pool's), or of
    100 % where it has none, goes no further (random_passes_screen): no stimulus can beat that run by MIN_GAP
    (excluding items rescales a gap by at most 100 / (100 - excluded %), so this can drop a task whose
    exclusions would have widened a gap of under SCREEN_GAP points). It spares the full grid on most of a pool."""
    t0 = time.time()
    reasons, screened = {}, []
    if screen is not None:      # one random run against the stored teacher calibration (or 100 %)
        got = floor.calibrate_floor([t for t in tasks if not t.get("known_stimulus")], [SCREEN_BUDGET], 1,
                                    workers=workers, cache=screen, on_task=on_screen, progress=True)
        for t in tasks:
            g = got.get(floor.task_key(t))
            if g is not None and "error" not in g and g["random_cov_max"] >= (_stored_reach(t) or 100.0) - SCREEN_GAP:
                reasons[t["id"]] = "random_passes_screen"
        screened = [t for t in tasks if t["id"] not in reasons]
    else:
        screened = tasks
    floors = floor.calibrate_floor(screened, budgets, seeds, workers=workers, cache=floor_cache, on_task=on_floor)
    cand = [t for t in screened if "error" not in floors[floor.task_key(t)]]
    runs = known_runs(cand, workers=workers, use_teacher=use_teacher)
    kept, train, excluded_n, per_task_ex = [], [], 0, {}
    for t in screened:
        f = floors[floor.task_key(t)]
        if "error" in f:
            reasons[t["id"]] = "cannot_harness"
            continue
        ex = exclusion(f, runs.get(t["id"], []))
        if ex is None:
            reasons[t["id"]] = "no_known_stimulus_runs"
            continue
        best_raw = max((r.get("overall_pct") or 0.0) for _, r in runs[t["id"]] if r.get("status") == sim.OK)
        rbest, rcov, reach, by = rescored(f, runs[t["id"]], ex)
        per_task_ex[t["id"]] = len(ex)
        if reach is None:           # every item excluded: no stimulus covers anything the scorer counts
            reasons[t["id"]] = "nothing_covered"
            continue
        if rbest > reach - MIN_GAP:
            reasons[t["id"]] = ("random_passes" if f["random_pass"] > 0 else      # the task's own targets
                                "random_fails_unreachable_items" if ex else "random_within_5_points")
            continue
        target = skill_target(rbest, reach)
        row = {k: v for k, v in t.items() if k != "_source"}
        row["targets"] = [x for x in t.get("targets") or [] if x["metric"] != teacher.ICARUS_METRIC] + [
            {"inst_name": t["dut_instance_name"], "metric": teacher.ICARUS_METRIC, "target_percentage": target}]
        row["random_floor"] = {k: v for k, v in f.items() if k not in ("runs", "never_hit")}
        row["exclusions"] = {"rule": EXCLUSION_RULE, "items": [{"key": k, **v} for k, v in sorted(ex.items())]}
        row["skill"] = {**(t.get("skill") or {}), "source": (t.get("skill") or {}).get("source") or t.get("_source"),
                        "reachable": round(reach, 3), "reached_by": by, "random_cov": rcov, "random_best": rbest,
                        "target": target, "excluded_items": len(ex),
                        "raw": {"random_best": f["random_cov_max"], "reachable": round(best_raw, 3)}}
        excluded_n += len(ex)
        if row["skill"]["source"] == "pool" and not in_heldout(t, heldout):
            train.append(row)
            reasons[t["id"]] = "kept_for_training"
        else:
            kept.append(row)
            reasons[t["id"]] = "kept"
    funnel = {}
    for t in tasks:
        src = (t.get("skill") or {}).get("source") or t.get("_source") or "?"
        c = funnel.setdefault(src, {"tasks": 0})
        c["tasks"] += 1
        c[reasons[t["id"]]] = c.get(reasons[t["id"]], 0) + 1
    report = {"tasks": len(kept), "real": sum(r["skill"]["source"] != "synthetic" for r in kept),
              "synthetic": sum(r["skill"]["source"] == "synthetic" for r in kept), "training_tasks": len(train),
              "funnel": funnel,
              "excluded": {"items": excluded_n, "tasks_with_exclusions": sum(bool(r["exclusions"]["items"]) for r in kept),
                           "rule": EXCLUSION_RULE,
                           "items_on_every_candidate": sum(per_task_ex.values())},
              "rule": f"after exclusion, keep when random_best <= reachable - {MIN_GAP:g}; "
                      "target = (random_best + reachable) / 2",
              "heldout": {"share": heldout, "rule": SPLIT_RULE},
              "budgets": [list(b) for b in budgets], "seeds": seeds, "seconds": round(time.time() - t0, 1),
              "reasons": reasons}
    return kept, train, report


def _stored_reach(task):
    return (task.get("icarus_calibration") or {}).get("reached_pct")


def split_group(task):
    """The group a pool design is held out with: its repository and top folder (a TinyTapeout project, a
    library's rtl/ tree), so no sibling of an eval design (its submodules, a variant) trains."""
    prov = task.get("provenance") or {}
    if prov.get("repo"):
        return f"{prov['repo']}/{str(prov.get('path') or '').split('/')[0]}"
    return task["id"].split("#")[0]


def in_heldout(task, share=None):
    """Whether a pool design's group falls in the eval share (a hash of the group: stable, no RNG state)."""
    share = HELDOUT if share is None else share
    h = int(hashlib.sha256(split_group(task).encode()).hexdigest()[:8], 16) / 2**32
    return h < share


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--tasks", nargs="*", default=[], help="real task JSONL files (the file's stem names the source)")
    ap.add_argument("--synthetic", type=int, default=0, help="synthetic skill tasks (families round-robin)")
    ap.add_argument("--seed", type=int, default=0, help="synthetic generation seed")
    ap.add_argument("--out", required=True, help="output folder")
    ap.add_argument("--workers", type=int, default=2, help="parallel simulations")
    ap.add_argument("--limit", type=int, default=None, help="only the first N tasks of each file")
    ap.add_argument("--budgets", nargs="+", default=None, help="random budgets, as data/floor.py's --budgets")
    ap.add_argument("--seeds", type=int, default=SEEDS, help="random seeds per budget")
    ap.add_argument("--no-teacher", action="store_true",
                    help="skip the template teacher's runs (tasks need a known stimulus or a reference testbench)")
    ap.add_argument("--screen", action="store_true",
                    help="screen tasks with a stored teacher calibration (a pool's) by one random run first")
    ap.add_argument("--heldout", type=float, default=HELDOUT,
                    help="share of qualifying pool groups held out for evaluation (the rest: skill_train.jsonl)")
    args = ap.parse_args(argv)
    if not 0.0 <= args.heldout <= 1.0:
        ap.error(f"--heldout must be in [0, 1], got {args.heldout}")
    tasks = []
    for path in args.tasks:
        rows = sim.load_tasks(path)[:args.limit] if args.limit else sim.load_tasks(path)
        tasks += [{**t, "_source": Path(path).name.split(".")[0]} for t in rows]
    tasks += skill_designs.generate_tasks(args.synthetic, seed=args.seed)
    if not tasks:
        ap.error("no tasks: give --tasks and/or --synthetic")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cache = floor.load_floor(out / "floor.json") if (out / "floor.json").is_file() else {}
    budgets = [floor.parse_budget(b) for b in args.budgets] if args.budgets else floor.BUDGETS
    print(f"skill split: {len(tasks)} tasks ({len(tasks) - args.synthetic} real, {args.synthetic} synthetic), "
          f"{len(budgets)} random budgets, {args.workers} workers -> {out}")

    def save(key, rec):
        cache[key] = rec
        if len(cache) % 10 == 0:
            floor.save_floor(out / "floor.json", cache)
    scache = floor.load_floor(out / "screen.json") if (out / "screen.json").is_file() else {}

    def save_screen(key, rec):
        scache[key] = rec
        if len(scache) % 20 == 0:
            floor.save_floor(out / "screen.json", scache)
    kept, train, report = build_skill_split(tasks, workers=args.workers, floor_cache=cache, budgets=budgets,
                                            seeds=args.seeds, use_teacher=not args.no_teacher, on_floor=save,
                                            heldout=args.heldout, screen=scache if args.screen else None,
                                            on_screen=save_screen)
    floor.save_floor(out / "floor.json", cache)
    if args.screen:
        floor.save_floor(out / "screen.json", scache)
    (out / "skill_tasks.jsonl").write_text("".join(json.dumps(t) + "\n" for t in kept))
    (out / "skill_train.jsonl").write_text("".join(json.dumps(t) + "\n" for t in train))
    (out / "skill_split.json").write_text(json.dumps({**report, "argv": argv if argv is not None else sys.argv[1:]},
                                                     indent=1))
    for src, c in report["funnel"].items():
        print(f"  {src}: " + ", ".join(f"{k} {v}" for k, v in c.items()))
    print(f"skill split: {report['tasks']} tasks ({report['real']} real, {report['synthetic']} synthetic), "
          f"{report['training_tasks']} pool tasks kept for training, {report['excluded']['items']} items excluded, "
          f"in {report['seconds']:.0f} s -> {out / 'skill_tasks.jsonl'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
