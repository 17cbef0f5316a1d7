"""Answer modes side by side (issue 17): results/answer_modes.json + results/answer_modes.md.

Two parts, each keeping the other's keys in the JSON file:
1. On CPU (no model): the floor and the ceiling of stimulus mode on the eval stage's tasks, i.e. the
   harness with the template teacher's FLOOR_LEVEL stimulus and the teacher's CEILING_LEVEL stimulus,
   scored through the kit's one score path (onpolicy.score_answers, answer_mode "stimulus") and measured
   with evaluate.compute_metrics (SynPass, Pass@1, Cov@1 with 95 % bootstrap intervals over tasks) plus the
   failure breakdown (evaluate.failure_breakdown: parse / compile / timeout / sim_time_limit / other / ok).
   Tasks: the eval stage's fixed reporting subset (chorus_mini.select_tasks: evaluate's 'report' split,
   at most the profile's eval_max_chars of RTL + spec, ordered by id hash, the first eval_limit).
       python bench/answer_modes.py [--profile small] [--tasks ../shared/data/dev_tasks.jsonl]
2. After two GPU eval runs of stage-0 models (one per mode, same SFT budget): their metrics.json, direct
   and agentic, under the keys `testbench` and `stimulus`:
       python bench/answer_modes.py --merge-evals testbench=runs/a/eval/sft0 stimulus=runs/b/eval/sft0
A design the kit cannot harness is answered in testbench mode (the floor/ceiling use the teacher's
testbench at that level); `fallbacks` lists them. A design the teacher cannot drive at all scores as a
parse failure (`teacher_errors`).
"""
import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import chorus_mini  # noqa: E402
import profiles  # noqa: E402
import common  # noqa: E402
import evaluate  # noqa: E402
import harness  # noqa: E402
import onpolicy  # noqa: E402
import rundir  # noqa: E402
import sim  # noqa: E402
from data import teacher as teacher_mod  # noqa: E402

METRIC_KEYS = ("tasks", "n", "syn_pass", "syn_pass_ci95", "pass@1", "pass@1_ci95", "cov@1", "cov@1_ci95", "failures")
DEFAULT_OUT = ROOT / "results" / "answer_modes.json"


def hardware():
    """CPU model and core count (the floor/ceiling part runs on CPU; GPU evals name theirs in their config)."""
    model = platform.machine()
    try:
        model = next(x.split(":", 1)[1].strip() for x in open("/proc/cpuinfo") if x.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{model}, {os.cpu_count()} cores visible"


def metric_object(m):
    """The headline of one compute_metrics() result (no per-task table)."""
    return {k: m[k] for k in METRIC_KEYS if k in m}


def eval_tasks(path, profile):
    """The eval stage's reporting subset of `path` under a chorus_mini profile."""
    c = profiles.PROFILES[profile]
    with tempfile.TemporaryDirectory() as d:
        chorus_mini.select_tasks(path, c["eval_limit"], c["eval_max_chars"], Path(d) / "tasks.jsonl")
        return sim.load_tasks(Path(d) / "tasks.jsonl"), c


def teacher_answers(tasks, level, seed):
    """(answer text per task, {id: TeacherError text}): the template teacher in stimulus mode."""
    teacher = teacher_mod.TemplateTeacher(level, seed, mode="stimulus")
    texts, errors = [], {}
    for t in tasks:
        try:
            texts.append(teacher.direct([t], 1)[0][0])
        except teacher_mod.TeacherError as e:
            texts.append("")                         # scores as a parse failure (no_code)
            errors[t["id"]] = str(e)
    return texts, errors


def score_level(tasks, level, *, seed, workers, target_mode, n_boot):
    """compute_metrics of one teacher level's stimulus per task (one sample each, as a direct eval)."""
    texts, errors = teacher_answers(tasks, level, seed)
    t0 = time.time()
    results = onpolicy.score_answers(list(zip(tasks, texts)), workers, target_mode, desc=f"{level} stimulus",
                                     answer_mode="stimulus")
    samples = [{"task_id": t["id"], "sample": 0, "rounds": [{"result": r}], "best_by_round": [0]}
               for t, r in zip(tasks, results)]
    m = metric_object(evaluate.compute_metrics(samples, round_index=0, seed=seed, n_boot=n_boot))
    m.update(level=level, teacher_errors=errors, seconds=round(time.time() - t0, 1),
             statuses={s: sum(r["status"] == s for r in results) for s in sorted({r["status"] for r in results})})
    return m


def merge_eval(folder):
    """{direct, agentic} metric objects of an evaluate.py run folder (failures from samples.jsonl when
    its metrics.json predates them), with the run's answer mode and config."""
    folder = Path(folder)
    if not (folder / "metrics.json").is_file():
        raise SystemExit(f"answer_modes: {folder}/metrics.json not found (an evaluate.py eval run folder?)")
    m = json.loads((folder / "metrics.json").read_text())
    samples = None
    out = {"folder": str(folder), "answer_mode": m.get("answer_mode", "testbench"),
           "answer_mode_fallbacks": m.get("answer_mode_fallbacks"), "config": m.get("config")}
    for part in ("direct", "agentic"):
        if part not in m:
            continue
        obj = metric_object(m[part])
        if "failures" not in obj:
            if samples is None:
                samples = [json.loads(x) for x in (folder / "samples.jsonl").read_text().splitlines() if x.strip()]
            idx = 0 if part == "direct" else m["rounds"]
            obj["failures"] = evaluate.failure_breakdown(
                [s["rounds"][s["best_by_round"][idx]]["result"] for s in samples])
        out[part] = obj
    return out


def _ci(m, key):
    ci = m.get(f"{key}_ci95")
    return f"{m[key]:.1f} [{ci[0]:.1f}, {ci[1]:.1f}]" if ci else f"{m[key]:.1f}"


def write_md(data, path):
    rows = []
    for mode in ("testbench", "stimulus"):
        for part in ("direct", "agentic"):
            m = (data.get(mode) or {}).get(part)
            rows.append((f"{mode} stage-0, {part}", m))
    rows += [(f"floor (harness + `{(data.get('floor') or {}).get('level', teacher_mod.FLOOR_LEVEL)}` stimulus)",
              data.get("floor")),
             (f"ceiling (teacher's `{(data.get('ceiling') or {}).get('level', teacher_mod.CEILING_LEVEL)}` stimulus)",
              data.get("ceiling"))]
    keys = evaluate.FAILURE_KEYS
    L = ["# Answer modes: whole testbench vs stimulus only (issue 17)", "",
         f"Tasks: {data.get('tasks', {}).get('description', '?')}. Percent over tasks, 95 % bootstrap interval over "
         "tasks in brackets; failures count samples by the status of their best result.", "",
         "| run | SynPass | Pass@1 | Cov@1 | " + " | ".join(keys) + " |",
         "|---|---|---|---|" + "---|" * len(keys)]
    for name, m in rows:
        if not m:
            L.append(f"| {name} | (not measured yet) | " + " | ".join([""] * (2 + len(keys))) + " |")
            continue
        f = m.get("failures") or {}
        L.append(f"| {name} | {_ci(m, 'syn_pass')} | {_ci(m, 'pass@1')} | {_ci(m, 'cov@1')} | "
                 + " | ".join(str(f.get(k, 0)) for k in keys) + " |")
    L += ["", "Floor and ceiling: no model; the kit's harness with the template teacher's stimulus, scored through "
          "onpolicy.score_answers (answer_mode stimulus) and evaluate.compute_metrics, as a direct eval with one "
          "sample per task. What a model adds over the harness is its distance above the floor."]
    if data.get("fallbacks"):
        L.append(f"\nDesigns answered in testbench mode (the kit cannot harness them): {len(data['fallbacks'])}: "
                 + "; ".join(f"{k}: {v}" for k, v in list(data["fallbacks"].items())[:5]))
    L += ["", "Commands (part: command; commit; hardware):"]
    for part, c in (data.get("commands") or {}).items():
        git = (data.get("commit") or {}).get(part) or {}
        L.append(f"- {part}: `{c}`; commit {git.get('commit')}{' (dirty)' if git.get('dirty') else ''}; "
                 f"{(data.get('hardware') or {}).get(part)}")
    Path(path).write_text("\n".join(L) + "\n")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--tasks", default=str(ROOT.parent / "shared" / "data" / "dev_tasks.jsonl"),
                    help="task JSONL (default ../shared/data/dev_tasks.jsonl)")
    ap.add_argument("--profile", default="small", choices=sorted(profiles.PROFILES),
                    help="the chorus_mini profile whose eval_limit / eval_max_chars / target_mode pick the tasks")
    ap.add_argument("--seed", type=int, default=0, help="teacher seed and bootstrap seed")
    ap.add_argument("--n-boot", type=int, default=1000)
    ap.add_argument("--workers", type=int, default=None, help="simulator processes (default: cores)")
    ap.add_argument("--merge-evals", nargs=2, metavar="MODE=DIR",
                    help="testbench=DIR stimulus=DIR: evaluate.py eval folders of the two stage-0 models")
    ap.add_argument("--out", default=str(DEFAULT_OUT), help="the JSON file (the .md beside it)")
    args = ap.parse_args(argv)
    out = Path(args.out)
    data = json.loads(out.read_text()) if out.is_file() else {}
    cmd = "python " + " ".join([str(Path(sys.argv[0]).relative_to(ROOT)) if Path(sys.argv[0]).is_absolute()
                                and ROOT in Path(sys.argv[0]).parents else sys.argv[0]] + sys.argv[1:])
    if args.merge_evals:
        pairs = dict(x.split("=", 1) for x in args.merge_evals if "=" in x)
        if sorted(pairs) != ["stimulus", "testbench"]:
            raise SystemExit("answer_modes: --merge-evals needs testbench=DIR stimulus=DIR")
        for mode, folder in pairs.items():
            data[mode] = merge_eval(folder)
            if data[mode]["answer_mode"] != mode:
                raise SystemExit(f"answer_modes: {folder} was evaluated in {data[mode]['answer_mode']} mode, not {mode}")
    else:
        if not Path(args.tasks).is_file():
            raise SystemExit(f"answer_modes: task file {args.tasks} not found")
        tasks, c = eval_tasks(args.tasks, args.profile)
        kw = dict(seed=args.seed, workers=args.workers, target_mode=c["target_mode"], n_boot=args.n_boot)
        data["floor"] = score_level(tasks, teacher_mod.FLOOR_LEVEL, **kw)
        data["ceiling"] = score_level(tasks, teacher_mod.CEILING_LEVEL, **kw)
        data["fallbacks"] = harness.fallbacks(tasks, "stimulus")
        data["tasks"] = {"file": os.path.relpath(args.tasks, ROOT), "profile": args.profile, "split": "report",
                         "limit": c["eval_limit"], "max_chars": c["eval_max_chars"], "target_mode": c["target_mode"],
                         "count": len(tasks), "ids": [t["id"] for t in tasks],
                         "description": f"{len(tasks)} tasks of {os.path.relpath(args.tasks, ROOT)}: the '{args.profile}' "
                                        f"profile's eval subset (report split, <= {c['eval_max_chars']} chars, first "
                                        f"{c['eval_limit']} by id hash), targets {c['target_mode']}"}
    part = "merge_evals" if args.merge_evals else "floor_ceiling"
    data.setdefault("commands", {})[part] = cmd
    data.setdefault("commit", {})[part] = common.git_info()
    data.setdefault("hardware", {})[part] = hardware()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=1) + "\n")
    write_md(data, out.with_suffix(".md"))
    for name in ("floor", "ceiling"):
        m = data.get(name)
        if m:
            print(f"{name:8s} ({m.get('level')}): SynPass {_ci(m, 'syn_pass')}  Pass@1 {_ci(m, 'pass@1')}  "
                  f"Cov@1 {_ci(m, 'cov@1')}  failures {m.get('failures')}")
    for mode in ("testbench", "stimulus"):
        for part in ("direct", "agentic"):
            m = (data.get(mode) or {}).get(part)
            if m:
                print(f"{mode} {part}: SynPass {_ci(m, 'syn_pass')}  Pass@1 {_ci(m, 'pass@1')}  Cov@1 {_ci(m, 'cov@1')}")
    print(f"answer_modes: wrote {out} and {out.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(rundir.cli("bench/answer_modes.py", main))
