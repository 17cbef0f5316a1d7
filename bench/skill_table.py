"""Collect baseline and model rows into results/skill_bench.json's `models` and print the markdown tables.

    python bench/skill_table.py --eval skill:random_1000=runs/skill_eval/random_1000 ... \
        --rows skill=runs/skill_rows/rows_skill_*.json all=runs/skill_rows/rows_report_*.json \
        --json results/skill_bench.json

--eval SET:NAME=DIR reads an `evaluate.py eval` folder (its agentic metrics when it ran refinement rounds, else its
direct ones); --rows SET=FILE... reads bench/score_answers.py outputs (direct answers, one row per model). SET is
`skill` (the skill split) or `all` (the whole reporting set). Each metric object keeps Pass@1, Cov@1, the coverage
gained over the task's random floor (cov_gain), the share of tasks above the floor (beats_random), each with its
95 % bootstrap interval over tasks, and the skill subset's Pass@1 (the tasks whose floor never passes). With --json
the file's `models` is replaced by these rows (with --merge, each given NAME / SET replaces only its own entry, so
rows measured on another machine join the baselines already recorded); with --split its `skill_split` becomes that
construction, and when the task count differs the rows and split it held before move to `earlier_split` (once).
"""
import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import evaluate  # noqa: E402

KEEP = ("pass@1", "pass@1_ci95", "cov@1", "cov@1_ci95", "cov_gain", "cov_gain_ci95", "beats_random", "random_cov",
        "floor_tasks", "syn_pass", "failures")


def by_source(per_task):
    """Pass@1 on the real designs and on the synthetic skill families (ids `skill_FAMILY_N`), each family too."""
    groups = {}
    for tid, r in per_task.items():
        fam = tid.rsplit("_", 1)[0] if tid.startswith("skill_") else "real"
        groups.setdefault(fam, []).append(r["pass_rate"])
        if fam != "real":
            groups.setdefault("synthetic", []).append(r["pass_rate"])
    return {g: {"tasks": len(v), "pass@1": sum(v) / len(v)} for g, v in sorted(groups.items())}


def metric_object(m, mode, n):
    """eval's metrics for one mode (or a score_answers row) -> the bench's metric object."""
    sk = m.get("skill", {})
    return {"mode": mode, "tasks": m.get("tasks"), "n": n, **{k: m[k] for k in KEEP if k in m},
            "skill_tasks": sk.get("tasks", 0), "skill_pass@1": sk.get("pass@1"),
            **({"by_source": by_source(m["per_task"])} if m.get("per_task") else {})}


def from_eval(folder):
    """An evaluate.py eval folder -> its metric object (agentic when it refined, else direct)."""
    d = json.loads((Path(folder) / "metrics.json").read_text())
    mode = "agentic" if d.get("rounds") and "agentic" in d else "direct"
    obj = metric_object(d[mode], mode, d.get("n"))
    obj["rounds"] = d.get("rounds", 0)
    samples = Path(folder) / "samples.jsonl"
    if obj["rounds"] and samples.exists():       # how often a refinement covers a hole its state left, by source
        rows = [json.loads(line) for line in samples.read_text().splitlines() if line.strip()]
        real = [s for s in rows if not s["task_id"].startswith("skill_")]
        obj["hole_fixes"] = {"all": evaluate.hole_fixes(rows), "real": evaluate.hole_fixes(real),
                             "synthetic": evaluate.hole_fixes([s for s in rows if s["task_id"].startswith("skill_")])}
    return obj


def from_rows(path):
    """A score_answers output -> {model name: metric object}."""
    rows = json.loads(Path(path).read_text())
    out = {}
    for name, r in rows.items():
        tasks = sum(r["failures"].values()) // max(1, r.get("n") or 1)
        out[name] = {**metric_object({**r, "tasks": tasks}, "direct", r.get("n")), "rounds": 0}
    return out


def fmt(v, ci=None):
    if v is None:
        return "-"
    return f"{v:.1f}" + (f" [{ci[0]:.1f}, {ci[1]:.1f}]" if ci else "")


def table(models, split):
    extra = " Pass@1, tasks random fails |" if split == "all" else " Pass@1 real | Pass@1 synthetic |"
    lines = ["| model | tasks x n | Pass@1 | Cov@1 | cov_gain | beats random % | SynPass |" + extra,
             "|---|---|---|---|---|---|---|" + "---|" * extra.count("|")]
    for name, m in models.items():
        if split not in m:
            continue
        r = m[split]
        row = (f"| {name} | {r['tasks']} x {r['n']} | {fmt(r['pass@1'], r.get('pass@1_ci95'))} | "
               f"{fmt(r['cov@1'], r.get('cov@1_ci95'))} | {fmt(r.get('cov_gain'), r.get('cov_gain_ci95'))} | "
               f"{fmt(r.get('beats_random'))} | {fmt(r.get('syn_pass'))} |")
        if split == "all":
            row += f" {fmt(r.get('skill_pass@1'))} ({r.get('skill_tasks')}) |"
        else:
            src = r.get("by_source", {})
            row += "".join(f" {fmt(src[g]['pass@1']) if g in src else '-'} |" for g in ("real", "synthetic"))
        lines.append(row)
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--eval", nargs="*", default=[], help="SET:NAME=DIR (an evaluate.py eval folder)")
    p.add_argument("--rows", nargs="*", default=[], help="SET=FILE (a bench/score_answers.py output)")
    p.add_argument("--json", default=None, help="skill_bench.json whose `models` these rows replace")
    p.add_argument("--merge", action="store_true",
                   help="keep the file's other models and sets; replace only those given")
    p.add_argument("--split", default=None, help="the current split's construction (data/skill.py's skill_split.json "
                   "without its per-task reasons) for the file's `skill_split`")
    a = p.parse_args(argv)
    models = {}
    for spec in a.eval:
        try:
            head, folder = spec.split("=", 1)
            split, name = head.split(":", 1)
        except ValueError:
            raise SystemExit(f"skill_table: --eval takes SET:NAME=DIR, got {spec!r}")
        if not (Path(folder) / "metrics.json").exists():
            raise SystemExit(f"skill_table: {folder}/metrics.json: no such file (has the eval finished?)")
        models.setdefault(name, {})[split] = from_eval(folder)
    for spec in a.rows:
        split, _, path = spec.partition("=")
        if not path:
            raise SystemExit(f"skill_table: --rows takes SET=FILE, got {spec!r}")
        for name, obj in from_rows(path).items():
            models.setdefault(name, {})[split] = obj
    for split in ("skill", "all"):
        print(f"\n{split}:\n" + table(models, split))
    if a.json:
        path = Path(a.json)
        doc = json.loads(path.read_text())
        if a.split:
            built = json.loads(Path(a.split).read_text())
            new = {k: v for k, v in built.items() if k not in ("reasons", "argv")}
            if new.get("tasks") != doc.get("skill_split", {}).get("tasks") and "earlier_split" not in doc:
                doc["earlier_split"] = {"skill_split": doc.get("skill_split"),
                                        "skill_split_ids": doc.get("skill_split_ids"), "models": doc.get("models", {})}
            doc["skill_split"] = new
            if "reasons" in built:
                doc["skill_split_ids"] = sorted(k for k, v in built["reasons"].items() if v == "kept")
        if a.merge:
            kept = doc.get("models", {})
            for name, sets in models.items():
                kept.setdefault(name, {}).update(sets)
            models = kept
        doc["models"] = models
        path.write_text(json.dumps(doc, indent=1) + "\n")
        print(f"skill_table: {len(models)} models -> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
