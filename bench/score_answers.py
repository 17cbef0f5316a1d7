"""Score first-round answers generated elsewhere (a GPU box without the simulator) into eval's direct metrics.

    python bench/score_answers.py --answers A1.json A2.json ... --tasks T.jsonl --target-mode icarus --out rows.json

Each A.json is `bench/gpu_memory.py answers` output (its task_ids and texts, n per task). Every answer goes through
the kit's one score path (score.score_answers, stimulus mode), then evaluate.compute_metrics gives Pass@1 / Cov@1 /
SynPass with their intervals as for `evaluate.py eval --mode direct`, and evaluate.add_floor_metrics the coverage
over each task's random floor and the skill subset (tasks that carry `random_floor` / `skill`: data/skill.py's
split). The rows are keyed by the adapter folder's name (`base` without one). A wall-clock timeout the busy machine
starved of CPU (sim.starved_timeout: a GPU generating beside the scorer, other jobs) runs once more alone, so the
rows do not depend on the machine's load.
"""
import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import evaluate  # noqa: E402
from data import floor  # noqa: E402
import score  # noqa: E402
import sim  # noqa: E402


def rows_of(answers, tasks, target_mode="icarus", workers=2, seed=0, n_boot=1000, floor_records=None):
    """answers: a gpu_memory.py answers record -> evaluate's direct metrics (with floor metrics where tasks have them,
    or where floor_records, data/floor.py's records by task key, hold them)."""
    by_id = {t["id"]: t for t in tasks}
    results = score.score_answers([(by_id[i], text) for i, text in zip(answers["task_ids"], answers["texts"])],
                                  workers=workers, target_mode=target_mode, answer_mode="stimulus",
                                  desc=Path(answers.get("adapter") or "base").name, retry_starved=True)
    seen = {}
    samples = []
    for tid, res in zip(answers["task_ids"], results):
        k = seen[tid] = seen.get(tid, -1) + 1
        samples.append({"task_id": tid, "sample": k, "rounds": [{"result": res}], "best_by_round": [0]})
    missing = answers.get("prompt_too_long", [])     # prompts past the context: a status, as eval counts them
    for tid in missing:
        for k in range(answers.get("n", 1)):
            samples.append({"task_id": tid, "sample": k, "rounds": [{"result": score.parse_failure("prompt_too_long")}],
                            "best_by_round": [0]})
    metrics = {"direct": evaluate.compute_metrics(samples, round_index=0, seed=seed, n_boot=n_boot)}
    ran = set(seen) | set(missing)                     # the tasks the answers file covers (it may hold a --limit)
    return evaluate.add_floor_metrics(metrics, [t for t in tasks if t["id"] in ran], floor_records, seed=seed,
                                      n_boot=n_boot)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--answers", nargs="+", required=True, help="bench/gpu_memory.py answers records")
    p.add_argument("--tasks", required=True, help="the task JSONL the answers were generated on")
    p.add_argument("--target-mode", choices=("cvdp", "icarus"), default="icarus")
    p.add_argument("--floor", default=None, help="random-floor JSON (data/floor.py) for tasks that carry none "
                   "(a dev split), as `evaluate.py eval --floor`")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--out", required=True)
    p.add_argument("--metrics-dir", default=None, help="also write DIR/NAME/metrics.json, eval's own file, so "
                   "`evaluate.py claims DIR` reads the scored answers as it reads eval folders")
    a = p.parse_args(argv)
    tasks = sim.load_tasks(a.tasks)
    floors = floor.load_floor(a.floor) if a.floor else None
    out = {}
    for path in a.answers:
        rec = json.loads(Path(path).read_text())
        name = Path(rec["adapter"]).name if rec.get("adapter") else "base"
        m = rows_of(rec, tasks, a.target_mode, a.workers, floor_records=floors)
        d = m["direct"]
        if a.metrics_dir:
            (Path(a.metrics_dir) / name).mkdir(parents=True, exist_ok=True)
            (Path(a.metrics_dir) / name / "metrics.json").write_text(json.dumps(m, indent=1))
        keep = ("pass@1", "pass@1_ci95", "cov@1", "cov@1_ci95", "syn_pass", "failures", "floor_tasks", "cov_gain",
                "cov_gain_ci95", "beats_random", "random_cov", "skill")
        out[name] = {"answers": Path(path).name, "n": rec.get("n"), "temperature": rec.get("temperature"),
                     **{k: d[k] for k in keep if k in d},
                     "per_task": {tid: {"pass_rate": r["pass_rate"], "cov_mean": r["cov_mean"]}
                                  for tid, r in d["per_task"].items()}}
        sk = d.get("skill", {})
        print(f"{name}: all Pass@1 {d['pass@1']:.1f} Cov@1 {d['cov@1']:.1f} | skill ({sk.get('tasks')}) "
              f"Pass@1 {sk.get('pass@1', float('nan')):.1f} cov_gain {sk.get('cov_gain', float('nan')):.1f}")
    Path(a.out).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
