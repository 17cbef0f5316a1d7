"""Benchmark of the template teacher (data/teacher.py): coverage per strength level, one refinement, ceiling.

For every task it scores, with the kit's scorer (sim.py, default profile), the template testbenches at the
levels minimal / weak / medium / strong (seed 0), the weak testbench after ONE feedback-directed refinement
(teacher.refine on the weak testbench's own scorer result, seed 0), and, when the task has one, its
`reference_tb` ("ceiling": data/designs.py's long random + directed stimulus for synthetic tasks; on the
dev set the benchmark's own testbench, which RTLLM rows carry). Numbers are mean overall coverage in %; a run that did not
produce coverage (compile error, timeout, a design the teacher cannot drive, ...) counts 0.

Reported: the mean per family (task["family"], else the source benchmark, else "all") and overall; how many weak
testbenches one refinement raised by more than 1 point; how many designs/families the strong level brings
to the ceiling; status counts per column (what did not run); timings (wall seconds per phase, sims/s).

Run (results/data.md cites these):
  python bench/bench_teacher.py --synthetic 60 --seed 0 --workers 2 --out results/bench_teacher_syn60.json \
      --md results/bench_teacher_syn60.md
  python bench/bench_teacher.py --tasks ../shared/data/dev_tasks.jsonl --workers 2 \
      --out results/bench_teacher_dev.json --md results/bench_teacher_dev.md
--synthetic N draws N tasks round-robin over all 30 families (data/designs.py, split 'all'); --limit K keeps
the first K tasks (a reduced run on a slow machine).
"""
import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

LEVEL_COLS = ("minimal", "weak", "medium", "strong")
COLS = LEVEL_COLS + ("weak+refine", "ceiling")
IMPROVE_POINTS = 1.0       # "improved" = refined overall > weak overall + 1 point
CEIL_EPS = 0.05            # strong "reaches the ceiling" when within 0.05 points of it (table rounding)


def group_of(task):
    """task["family"] (synthetic), else the source benchmark (task["source"]["benchmark"] or a string
    source), else "all"."""
    src = task.get("source")
    if isinstance(src, dict):
        src = src.get("benchmark")
    return str(task.get("family") or src or "all")


def reference_tb(task):
    """The task's reference testbench text: data/designs.py stores a string, the dev set a {name, content}
    dict (the benchmark's own testbench); None when there is none."""
    ref = task.get("reference_tb")
    if isinstance(ref, dict):
        ref = ref.get("content")
    return ref or None


def _why(res):
    """A short reason for a result that did not run with coverage (for the JSON rows)."""
    msgs = [e.get("msg", "") for e in res.get("errors") or []] + list(res.get("notes") or [])
    return (msgs[0] if msgs else res.get("log_tail", ""))[:200]


def pct_of(res):
    """Overall % of a result dict, 0 when it did not run with coverage (the table's convention)."""
    if res and res.get("status") == "ok" and res.get("overall_pct") is not None:
        return float(res["overall_pct"])
    return 0.0


def _mean(xs):
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def run_bench(tasks, workers=None, seed=0):
    """Score every column for every task. Returns {rows, timings, sims}; rows[i] = {id, group,
    pct: {col: float or None}, status: {col: str}} (ceiling None when the task has no reference_tb)."""
    import sim
    import simpool
    from data import teacher
    t_start = time.perf_counter()
    rows, jobs, where = [], [], []
    answers = {}                                     # (task index, level) -> answer text
    for i, t in enumerate(tasks):
        row = {"id": t["id"], "group": group_of(t), "pct": {}, "status": {}}
        rows.append(row)
        for lv in LEVEL_COLS:
            try:
                a = teacher.template_answer(t, lv, seed)
            except teacher.TeacherError as e:
                row["pct"][lv], row["status"][lv] = 0.0, "teacher_error"
                print(f"bench_teacher: {e}", file=sys.stderr)
                continue
            answers[(i, lv)] = a
            jobs.append(sim.job_from_task(t, teacher.answer_code(a)))
            where.append((i, lv))
        ref = reference_tb(t)
        if ref:
            jobs.append(sim.job_from_task(t, ref))
            where.append((i, "ceiling"))
        else:
            row["pct"]["ceiling"], row["status"]["ceiling"] = None, "none"
    t_gen = time.perf_counter()
    results = {}
    for (i, col), r in zip(where, simpool.simulate_many(jobs, workers=workers)):
        d = r.to_dict()
        results[(i, col)] = d
        rows[i]["pct"][col], rows[i]["status"][col] = pct_of(d), d["status"]
        if d["status"] != "ok":
            rows[i].setdefault("why", {})[col] = _why(d)
    t_sim1 = time.perf_counter()
    ref_jobs, ref_idx = [], []
    for i, t in enumerate(tasks):
        if (i, "weak") not in results:
            rows[i]["pct"]["weak+refine"], rows[i]["status"]["weak+refine"] = 0.0, "teacher_error"
            continue
        a = teacher.refine(t, answers[(i, "weak")], results[(i, "weak")], seed)
        ref_jobs.append(sim.job_from_task(t, teacher.answer_code(a)))
        ref_idx.append(i)
    t_ref = time.perf_counter()
    for i, r in zip(ref_idx, simpool.simulate_many(ref_jobs, workers=workers)):
        d = r.to_dict()
        rows[i]["pct"]["weak+refine"], rows[i]["status"]["weak+refine"] = pct_of(d), d["status"]
        if d["status"] != "ok":
            rows[i].setdefault("why", {})["weak+refine"] = _why(d)
    t_end = time.perf_counter()
    versions = next((r.get("versions") for r in results.values() if r.get("versions")), None)
    timings = {"templates_s": round(t_gen - t_start, 1), "sims_s": round(t_sim1 - t_gen, 1),
               "refine_s": round(t_ref - t_sim1, 1), "refine_sims_s": round(t_end - t_ref, 1),
               "total_s": round(t_end - t_start, 1), "sims": len(jobs) + len(ref_jobs),
               "sims_per_s": round((len(jobs) + len(ref_jobs)) / max(1e-9, (t_sim1 - t_gen) + (t_end - t_ref)), 2)}
    return {"rows": rows, "timings": timings, "versions": versions}


def summarize(rows):
    """Per-group and overall means per column, improvement and ceiling counts, status counts."""
    groups = {}
    for r in rows:
        groups.setdefault(r["group"], []).append(r)
    per_group = {g: {"n": len(rs), **{c: _mean([r["pct"].get(c) for r in rs]) for c in COLS}}
                 for g, rs in sorted(groups.items())}
    overall = {"n": len(rows), **{c: _mean([r["pct"].get(c) for r in rows]) for c in COLS}}
    improved = sum(1 for r in rows if r["pct"]["weak+refine"] > r["pct"]["weak"] + IMPROVE_POINTS)
    with_ceil = [r for r in rows if r["pct"].get("ceiling") is not None]
    strong_at_ceil = sum(1 for r in with_ceil if r["pct"]["strong"] >= r["pct"]["ceiling"] - CEIL_EPS)
    fam_ceil = [g for g, m in per_group.items() if m["ceiling"] is not None]
    fam_at_ceil = [g for g in fam_ceil if round(per_group[g]["strong"], 1) >= round(per_group[g]["ceiling"], 1)]
    status = {c: {} for c in COLS}
    for r in rows:
        for c in COLS:
            s = r["status"].get(c, "none")
            status[c][s] = status[c].get(s, 0) + 1
    not_ok = {c: [(r["id"], r["status"][c]) for r in rows if r["status"].get(c) not in ("ok", "none")]
              for c in COLS}
    return {"per_group": per_group, "overall": overall,
            "improved_by_refine": improved, "improved_threshold_points": IMPROVE_POINTS,
            "strong_at_ceiling_designs": strong_at_ceil, "designs_with_ceiling": len(with_ceil),
            "strong_at_ceiling_groups": len(fam_at_ceil), "groups_with_ceiling": len(fam_ceil),
            "strong_below_ceiling_groups": sorted(set(fam_ceil) - set(fam_at_ceil)),
            "status_counts": status, "not_ok": not_ok}


def fmt(x):
    return "—" if x is None else f"{x:.1f}"


def markdown(summary, timings, command, label):
    s = summary
    out = [f"Command: `{command}`", "",
           f"| {label} | n | " + " | ".join(COLS) + " |", "|---|---|" + "---|" * len(COLS)]
    for g, m in s["per_group"].items():
        out.append(f"| {g} | {m['n']} | " + " | ".join(fmt(m[c]) for c in COLS) + " |")
    o = s["overall"]
    out.append(f"| **mean ({o['n']})** | **{o['n']}** | " + " | ".join(f"**{fmt(o[c])}**" for c in COLS) + " |")
    out.append("")
    out.append(f"- weak+refine raised {s['improved_by_refine']}/{o['n']} weak testbenches by > "
               f"{s['improved_threshold_points']:g} point.")
    if s["designs_with_ceiling"] and s["designs_with_ceiling"] < o["n"]:
        out.append(f"- ceiling column: mean over the {s['designs_with_ceiling']} designs that have a reference_tb.")
    if s["designs_with_ceiling"]:
        out.append(f"- strong reaches the ceiling on {s['strong_at_ceiling_designs']}/{s['designs_with_ceiling']} "
                   f"designs and {s['strong_at_ceiling_groups']}/{s['groups_with_ceiling']} groups (mean, 1 decimal); "
                   f"below: {', '.join(s['strong_below_ceiling_groups']) or 'none'}.")
    for c in COLS:
        bad = s["not_ok"][c]
        if bad:
            shown = ", ".join(f"{i} ({st})" for i, st in bad[:8]) + (" ..." if len(bad) > 8 else "")
            out.append(f"- {c}: {len(bad)} not ok: {shown}")
    if not any(s["not_ok"][c] for c in COLS):
        out.append("- every testbench compiled and ran with coverage.")
    out.append(f"- time: {timings['total_s']} s total ({timings['sims']} sims, {timings['sims_per_s']} sims/s; "
               f"level+ceiling sims {timings['sims_s']} s, refinement {timings['refine_s']} s + "
               f"its sims {timings['refine_sims_s']} s).")
    return "\n".join(out) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--tasks", help="task JSONL (e.g. the dev set)")
    src.add_argument("--synthetic", type=int, help="N synthetic tasks (data/designs.py, all families)")
    ap.add_argument("--seed", type=int, default=0, help="synthetic generation seed (templates always use seed 0)")
    ap.add_argument("--split", default="all", choices=["train", "val", "all"], help="family split for --synthetic")
    ap.add_argument("--limit", type=int, default=None, help="only the first K tasks (a reduced run)")
    ap.add_argument("--workers", type=int, default=None, help="simulator processes (default: cores)")
    ap.add_argument("--out", help="JSON output (per-task rows, summary, timings)")
    ap.add_argument("--md", help="markdown output (the table + summary lines)")
    args = ap.parse_args(argv)
    if args.tasks:
        import sim
        tasks = sim.load_tasks(args.tasks)
        label = "group"
    else:
        from data.designs import generate_tasks
        tasks = generate_tasks(args.synthetic, args.seed, args.split)
        label = "family"
    if args.limit:
        tasks = tasks[:args.limit]
    command = "python bench/bench_teacher.py " + " ".join(argv if argv is not None else sys.argv[1:])
    print(f"bench_teacher: {len(tasks)} tasks, workers={args.workers or os.cpu_count()}", file=sys.stderr)
    res = run_bench(tasks, workers=args.workers)
    summary = summarize(res["rows"])
    md = markdown(summary, res["timings"], command, label)
    print(md)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        info = {"command": command, "tasks": len(tasks), "workers": args.workers, "cpus": os.cpu_count(),
                "machine": platform.machine(), "versions": res["versions"], "timings": res["timings"],
                "summary": summary, "rows": res["rows"]}
        with open(args.out, "w") as f:
            json.dump(info, f, indent=1)
    if args.md:
        Path(args.md).parent.mkdir(parents=True, exist_ok=True)
        Path(args.md).write_text(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
