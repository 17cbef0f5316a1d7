"""The paper's four claims (docs/method.md §2.4) from eval folders, each a paired bootstrap over tasks with a
verdict, and the statistics they rest on. `python evaluate.py claims EVAL_DIR` is its command line (evaluate.py
imports it; report.py and demo.py put the table into their reports).

    paired_bootstrap, gap, oracle_gain, permutation_null, pooled_samples_null, above_null, verdict, both
    claims(eval_dir, ...) -> dict, claims_markdown(c) -> lines, skill_file_ids(path)
    add_claims_args(p), cmd_claims(args)
"""
import json
from pathlib import Path

import numpy as np

import sim
from data import floor

CLAIM_MODELS = {"sft": ("sft0", "sft1", "sft2"), "experts": ("rl0", "rl1", "rl2")}


def paired_bootstrap(per_task, stat, *, seed=0, n_boot=2000, level=0.95):
    """{point, ci95} of stat(per_task), per_task a (tasks, models) array and stat a function of such an array
    (it also gets a batch of them, shape (n_boot, tasks, models)). The interval resamples tasks, the same tasks
    for every model (paired); percentile method."""
    x = np.asarray(per_task, dtype=float)
    idx = np.random.default_rng(seed).integers(0, len(x), size=(n_boot, len(x)))
    lo, hi = np.percentile(stat(x[idx]), [50 * (1 - level), 50 * (1 + level)])
    return {"point": float(stat(x)), "ci95": [float(lo), float(hi)]}


def gap(a):
    """The largest gap between the models' means: how far apart the checkpoints are."""
    means = a.mean(axis=-2)
    return means.max(axis=-1) - means.min(axis=-1)


def oracle_gain(a):
    """Oracle union minus the best model: mean over tasks of the per-task best score, less the best mean."""
    return a.max(axis=-1).mean(axis=-1) - a.mean(axis=-2).max(axis=-1)


def permutation_null(per_task, stat, *, seed=0, n_perm=2000):
    """stat under 'the models are exchangeable': each task's scores shuffled among the models (n_perm draws)."""
    x = np.asarray(per_task, dtype=float)
    rng = np.random.default_rng(seed + 1)
    keys = rng.random((n_perm, *x.shape)).argsort(axis=-1)
    return stat(np.take_along_axis(np.broadcast_to(x, (n_perm, *x.shape)), keys, axis=-1))


def pooled_samples_null(passes, samples, stat, *, seed=0, n_draws=2000):
    """stat (of pass rates in percent) when the models' samples were exchangeable within each task: a task's
    passes (over all its models' samples together) dealt out again among the models' samples at random
    (multivariate hypergeometric, model by model), n_draws times. passes, samples: (tasks, models) counts. This
    conditions on each task's total, so it is exact under that hypothesis; sampling noise alone lifts a per-task
    max above any single model, and this is how far."""
    passes, n = np.asarray(passes, dtype=int), np.asarray(samples, dtype=int)
    if (n < 1).any():
        raise ValueError("pooled_samples_null: every model needs at least one sample on every task")
    rng = np.random.default_rng(seed + 2)
    left_pass = np.broadcast_to(passes.sum(axis=1), (n_draws, len(n))).copy()
    left_all = np.broadcast_to(n.sum(axis=1), (n_draws, len(n))).copy()
    draws = np.zeros((n_draws, *n.shape))
    for m in range(n.shape[1]):
        k = np.broadcast_to(n[:, m], (n_draws, len(n)))
        got = rng.hypergeometric(left_pass, left_all - left_pass, k) if m < n.shape[1] - 1 else left_pass
        draws[:, :, m] = 100.0 * got / k
        left_pass, left_all = left_pass - got, left_all - k
    return stat(draws)


def above_null(observed, ci, null, level=0.95):
    """A never-negative statistic against its noise: {noise_floor (the null's `level` quantile), p (one-sided),
    verdict}: 'holds' when the observed value is above the floor, 'does not hold' when even the top of its
    bootstrap interval `ci` is not, else 'inconclusive'."""
    floor = float(np.quantile(null, level))
    p_value = float((np.sum(null >= observed - 1e-12) + 1) / (len(null) + 1))
    v = "holds" if observed > floor else "does not hold" if ci[1] <= floor else "inconclusive"
    return {"noise_floor": floor, "p": p_value, "verdict": v}


def verdict(ci, margin=0.0):
    """A difference claimed positive (margin 0): 'holds' when its interval is above 0, 'does not hold' when it is
    nowhere above 0 (e.g. [0, 0]: no difference at all). Non-inferiority (margin > 0): 'holds' when the interval
    is above -margin, 'does not hold' when it is wholly below -margin. Otherwise 'inconclusive'."""
    if ci[0] > -margin:
        return "holds"
    return "does not hold" if (ci[1] < -margin if margin else ci[1] <= 0) else "inconclusive"


def both(verdicts):
    """A claim made of two parts holds when both do, fails when either fails."""
    return "holds" if all(v == "holds" for v in verdicts) else \
        "does not hold" if "does not hold" in verdicts else "inconclusive"


def claims(eval_dir, *more_dirs, mode=None, metric="pass_rate", seed=0, n_boot=2000, margin=2.0, skill=None):
    """The paper's four claims (docs/method.md §2.4) on one eval folder (a subfolder per model, each with
    metrics.json), or on several whose task sets are disjoint (one split evaluated in parts: each model's
    per-task tables are joined; a task in two folders is an error), in points of Pass@1 (metric pass_rate) or
    Cov@1 (cov_mean). Each claim uses the tasks all of its models have, in agentic mode when all of them have it
    (else direct; `mode` forces one):
    (a) the SFT checkpoints differ, and identical RL brings them closer. `sft_gap` (the largest gap between
        sft0-2's means) must be above its noise floor: the gap when each task's scores are shuffled among the
        three models (a gap of maxima is never below 0, so an interval alone would always clear 0).
        `gap_shrink` (the SFT gap minus the experts' gap) must have its paired bootstrap interval above 0.
    (b) the experts are complementary: the oracle union (per task, the best expert's score) minus the best
        expert must be above its noise floor: the same statistic when each task's samples are dealt out among
        the experts at random (pooled_samples_null: exact given each task's passes). A gain that sampling noise
        among equal experts explains does not count; an expert that dominates gives a gain below it. Cov@1 has no
        per-sample values in metrics.json: its (b) is inconclusive unless the gain clears the floor of each
        task's scores shuffled among the experts.
    (c) the soup at least matches the best expert: soup - best expert, non-inferiority at `margin` points.
    (d) gated OPD beats the soup and always-distill: both differences' intervals above 0.
    A statistic held against a noise floor holds above the floor, does not hold when even the top of its
    interval is not above it, and is inconclusive in between (above_null). Intervals are 95 % paired bootstraps
    over tasks (n_boot resamples). The best expert has the highest mean on the claim's tasks. Claims whose models
    are missing (or share no task) are listed under `missing`.
    How much a split can show: each claim counts its `separating_tasks` (the claim's models do not all score
    the same there; the others add 0 to every difference above), and (b) its `room`: the points the best expert
    leaves below 100 (the most any oracle gain could be), on how many tasks, and how many of them no expert
    scores on at all (a task no stimulus can pass looks like this: results/small2/ceiling/).
    skill: restrict every claim to the skill split: a set of task ids, or True for the tasks the evals flagged
    `skill` (add_floor_metrics: evaluated with a random floor); the noise floors are computed the same way."""
    if n_boot < 1:
        raise SystemExit(f"claims: n_boot must be at least 1, got {n_boot}")
    sft, experts = CLAIM_MODELS["sft"], CLAIM_MODELS["experts"]
    parts = {}                           # model -> its metrics.json in each folder that has it
    for root in map(Path, (eval_dir, *more_dirs)):
        if not root.is_dir():
            raise SystemExit(f"claims: {root} is not a folder")
        found = [d for d in sorted(root.iterdir())
                 if d.name in (*sft, *experts, "soup", "opd", "opd_nogate") and (d / "metrics.json").is_file()]
        if not found:
            raise SystemExit(f"claims: no sft0-2 / rl0-2 / soup / opd folder with metrics.json under {root}")
        for d in found:
            parts.setdefault(d.name, []).append(json.loads((d / "metrics.json").read_text()))
    metrics = {}
    for name, ms in parts.items():       # joined per mode, over the modes every part has
        metrics[name] = {}
        for k in [k for k in ("direct", "agentic") if all(k in m for m in ms)]:
            tab = metrics[name].setdefault(k, {"per_task": {}})["per_task"]
            for m in ms:
                if twice := sorted(set(tab) & set(m[k]["per_task"])):
                    raise SystemExit(f"claims: {name}'s task {twice[0]} is in two of the folders "
                                     f"({len(twice)} tasks in all); give folders of disjoint task sets")
                tab.update(m[k]["per_task"])
    only = None if skill is None else set(skill) if skill is not True else {
        t for ms in metrics.values() for m in ms.values() for t, r in m["per_task"].items() if r.get("skill")}
    if only is not None and not only:
        raise SystemExit("claims: --skill: no task of the evals is flagged skill (evaluate with --floor, or give the "
                         "skill split's task file)")

    def table(*names):
        """(mode, tasks, {name: column}, per-task samples) over the tasks every one of `names` has."""
        m = mode or ("agentic" if all("agentic" in metrics[n] for n in names) else "direct")
        tabs = {n: metrics[n][m]["per_task"] for n in names if m in metrics[n]}
        if len(tabs) < len(names):
            return None
        tasks = sorted(set.intersection(*(set(t) for t in tabs.values())))
        tasks = [t for t in tasks if all(tabs[n][t].get("samples", 0) > 0 for n in names)]   # (none in metrics.json)
        dropped = len(set.union(*(set(t) for t in tabs.values())) - set(tasks))
        tasks = [t for t in tasks if only is None or t in only]
        cols = {n: np.array([tabs[n][t][metric] for t in tasks], dtype=float) for n in names}
        n_of = lambda r: r.get("samples", 0)
        passes_of = lambda r: r["passes"] if "passes" in r else round(r["pass_rate"] * n_of(r) / 100)
        counts = lambda get: np.array([[get(tabs[n][t]) for n in names] for t in tasks], dtype=int).reshape(len(tasks), -1)
        return {"mode": m, "tasks": tasks, "cols": cols, "samples": counts(n_of), "passes": counts(passes_of),
                "dropped": dropped}

    have = lambda *names: all(n in metrics for n in names)
    boot = lambda x, stat: paired_bootstrap(x, stat, seed=seed, n_boot=n_boot)
    diff = lambda a: a[..., 0].mean(axis=-1) - a[..., 1].mean(axis=-1)
    stack = lambda t, *names: np.stack([t["cols"][n] for n in names], axis=1)
    info = lambda t: {"mode": t["mode"], "tasks": len(t["tasks"]), "dropped_tasks": t["dropped"],
                      "separating_tasks": int(np.ptp(np.stack(list(t["cols"].values())), axis=0).astype(bool).sum())}
    out = {"eval_dir": str(eval_dir), **({"more_dirs": [str(d) for d in more_dirs]} if more_dirs else {}),
           "metric": metric, "n_boot": n_boot, "seed": seed, "margin": margin, "means": {}, "claims": {}, "missing": [],
           **({"skill_tasks": len(only)} if only is not None else {})}
    for key, names in (("a", (*sft, *experts)), ("b", experts), ("c", (*experts, "soup")),
                       ("d", ("opd", "soup", "opd_nogate"))):
        t = table(*names) if have(*names) else None
        if t is None or not t["tasks"]:
            out["missing"].append(key if t is None else f"{key} (its models share no task)")
            continue
        out["means"].update({n: float(col.mean()) for n, col in t["cols"].items() if n not in out["means"]})
        best = max(experts, key=lambda n: t["cols"][n].mean()) if set(experts) <= set(names) else None
        if key == "a":
            x = stack(t, *sft)
            sft_gap = boot(x, gap)
            sft_gap.update(above_null(sft_gap["point"], sft_gap["ci95"], permutation_null(x, gap, seed=seed)))
            shrink = boot(stack(t, *sft, *experts), lambda a: gap(a[..., :3]) - gap(a[..., 3:]))
            shrink["verdict"] = verdict(shrink["ci95"])
            row = {"claim": "the staged SFT checkpoints differ, and identical RL brings them closer",
                   "sft_gap": sft_gap, "expert_gap": boot(stack(t, *experts), gap), "gap_shrink": shrink,
                   "verdict": both([sft_gap["verdict"], shrink["verdict"]])}
        elif key == "b":
            x = stack(t, *experts)
            gain = boot(x, oracle_gain)
            if metric == "pass_rate":   # t's counts are in claim order: the experts
                null = pooled_samples_null(t["passes"], t["samples"], oracle_gain, seed=seed)
                test = {**above_null(gain["point"], gain["ci95"], null),
                        "null": "each task's samples exchangeable among the experts"}
            else:
                test = {**above_null(gain["point"], gain["ci95"], permutation_null(x, oracle_gain, seed=seed)),
                        "null": "each task's scores shuffled among the experts"}
                test["verdict"] = "holds" if test["verdict"] == "holds" else "inconclusive"
            below = x[:, experts.index(best)] < 100.0
            row = {"claim": "the experts are complementary: the oracle union is above the best expert",
                   "oracle_minus_best": {**gain, **test}, "verdict": test["verdict"],
                   "room": {"points": float((100.0 - x[:, experts.index(best)]).mean()), "tasks": int(below.sum()),
                            "none_score": int((below & (x.max(axis=1) == 0)).sum())}}
            if have(*sft) and (ts := table(*sft)) and ts["tasks"]:       # the same statistic for the SFT checkpoints
                row["sft_oracle_minus_best"] = float(oracle_gain(stack(ts, *sft)))
        elif key == "c":
            d = boot(stack(t, "soup", best), diff)
            row = {"claim": f"the soup at least matches the best expert (non-inferiority, margin {margin:g} points)",
                   "soup_minus_best": d, "verdict": verdict(d["ci95"], margin)}
        else:
            vs_soup, vs_nogate = boot(stack(t, "opd", "soup"), diff), boot(stack(t, "opd", "opd_nogate"), diff)
            vs_soup["verdict"], vs_nogate["verdict"] = verdict(vs_soup["ci95"]), verdict(vs_nogate["ci95"])
            row = {"claim": "gated OPD beats the soup and always-distill", "opd_minus_soup": vs_soup,
                   "opd_minus_nogate": vs_nogate, "verdict": both([vs_soup["verdict"], vs_nogate["verdict"]])}
        out["claims"][key] = {**row, **info(t), **({"best_expert": best} if best else {})}
    return out


def claims_markdown(c):
    """The claims as a markdown table (points of the metric, 95 % paired bootstrap intervals over tasks)."""
    unit = "Pass@1" if c["metric"] == "pass_rate" else "Cov@1"

    def f(name, s):
        text = f"{name} {s['point']:+.1f} [{s['ci95'][0]:+.1f}, {s['ci95'][1]:+.1f}]"
        return text + (f", noise floor {s['noise_floor']:+.1f} (p {s['p']:.3f})" if "noise_floor" in s else "")
    rows = []
    for key, stats in (("a", ("sft_gap", "expert_gap", "gap_shrink")), ("b", ("oracle_minus_best",)),
                       ("c", ("soup_minus_best",)), ("d", ("opd_minus_soup", "opd_minus_nogate"))):
        if key in c["claims"]:
            r = c["claims"][key]
            extra = (f"; the SFT checkpoints' own oracle gain {r['sft_oracle_minus_best']:+.1f}"
                     if "sft_oracle_minus_best" in r else "")
            if "room" in r:
                extra += (f"; room above {r['best_expert']} {r['room']['points']:+.1f} on {r['room']['tasks']} tasks, "
                          f"{r['room']['none_score']} of them at 0 for every expert")
            where = (f"{r['mode']}, {r['tasks']} tasks" + (f", the models differ on {r['separating_tasks']}"
                                                           if "separating_tasks" in r else "")
                     + (f", best expert {r['best_expert']}" if "best_expert" in r else ""))
            rows.append(f"| ({key}) {r['claim']} | {where} | " + "; ".join(f(s, r[s]) for s in stats) + extra
                        + f" | **{r['verdict']}** |")
    where = f" on the skill split ({c['skill_tasks']} tasks random stimulus fails)" if "skill_tasks" in c else ""
    return [f"{unit} differences in points{where}, each with its 95 % paired bootstrap interval over tasks ({c['n_boot']} "
            "resamples); a gap or oracle gain, never below 0, must also clear its noise floor (evaluate.claims)", "",
            "| claim | tasks | statistic | verdict |", "|---|---|---|---|", *rows,
            *([""] + [f"Not measured (models missing): {', '.join(c['missing'])}"] if c["missing"] else [])]


def add_claims_args(p):
    p.add_argument("eval_dir", nargs="+", help="folder with one eval folder per model (sft0..2, rl0..2, soup, opd, "
                   "opd_nogate); several: one split evaluated in parts (disjoint tasks), joined per model")
    p.add_argument("--out", default=None, help="JSON file to write (default: print only)")
    p.add_argument("--mode", choices=("agentic", "direct"), default=None,
                   help="default: agentic when every model has it")
    p.add_argument("--metric", choices=("pass_rate", "cov_mean"), default="pass_rate", help="Pass@1 or Cov@1")
    p.add_argument("--margin", type=float, default=2.0, help="claim (c)'s non-inferiority margin, in points")
    p.add_argument("--n-boot", type=int, default=2000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--skill", nargs="?", const=True, default=None, metavar="FILE",
                   help="only the skill split's tasks: those the evals flagged skill (no FILE), the ids of a task "
                   "JSONL (its `skill`-labelled ones when it has any), or a floor JSON's tasks random never passes")


def skill_file_ids(path):
    """The skill split's task ids from a task JSONL (the `skill`-labelled tasks, or all when none is) or from a
    random-floor JSON (data/floor.py: the tasks whose random_pass is 0)."""
    if str(path).endswith(".json"):
        return {r["id"] for r in floor.load_floor(path).values() if r.get("random_pass") == 0}
    tasks = sim.load_tasks(path)
    return {t["id"] for t in tasks if t.get("skill")} or {t["id"] for t in tasks}


def cmd_claims(args):
    skill = args.skill if args.skill in (None, True) else skill_file_ids(args.skill)
    c = claims(*args.eval_dir, mode=args.mode, metric=args.metric, seed=args.seed, n_boot=args.n_boot,
               margin=args.margin, skill=skill)
    print("\n".join(claims_markdown(c)))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(c, indent=1))
    return 0
