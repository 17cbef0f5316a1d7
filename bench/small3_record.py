"""results/small3_run.json from the round-3 run's kept state (results/small3/state/): the data counts, each
stage's validation table and step statistics, the reward pilot's two rl0 arms side by side, the rollout
temperature sweep (state/sweep/T*/: evaluate.py's metrics.json and samples.jsonl, plain or gzipped, per
temperature), later stages' picks on the sweep's tasks and decoding (state/refine/STAGE/, the same files) and the
evaluations kept so far (state/eval*/NAME/metrics.json: the reporting, skill and synthetic test splits), by model
(`models` -> NAME -> skill -> pass@1), the four claims on each split whose claim models have been evaluated, and the
run's goal on the skill split.
Re-run it as the run goes on; results/small3_run.md quotes its numbers.

Run: python bench/small3_record.py [--state results/small3/state] [--out results/small3_run.json]
     python bench/small3_record.py --state runs/s3 --reward-pick      # the pilot's pick, for the next job
"""
import argparse
import collections
import gzip
import json
import statistics
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import claims  # noqa: E402  (the paper's four claims from eval folders)
import score  # noqa: E402  (the kit's reward of a result dict)
VAL_KEYS = ("val/reward", "val/reward_se", "val/pass@1", "val/cov@1", "val/syn_pass", "val/loss")
STEP_KEYS = ("reward", "pass_rate", "coverage", "compile_rate", "entropy", "clip_ratio/low", "clip_ratio/high",
             "ratio", "frac_reward_zero_std", "completions/mean_length", "t_rollout", "t_gen", "t_train", "t_sim",
             "hole_fix", "hole_fix_share")   # hole_fix: of the refinements whose state showed holes, those fixing one


def rows(path):
    return [json.loads(x) for x in Path(path).read_text().splitlines() if x.strip()]


def val_table(log, upto=None):
    return [{"step": r["step"], **{k: round(r[k], 6) for k in VAL_KEYS if r.get(k) is not None}}
            for r in rows(log) if r.get("val") and (upto is None or r["step"] <= upto)]


def step_stats(log, upto=None):
    """Medians of the training rows from step 2 on (step 1 carries the graph captures), up to step `upto`; the wall
    time: the calls' sum, up to the call that paused at `upto` where later steps follow (None without that pause)."""
    every = [r for r in rows(log) if not r.get("val")]
    later = upto is not None and any(r["step"] > upto for r in every)
    every = [r for r in every if upto is None or r["step"] <= upto]
    train = [r for r in every if r["step"] >= 2]
    out = {"steps": max((r["step"] for r in every), default=0)}
    for k in STEP_KEYS:
        v = [r[k] for r in train if r.get(k) is not None]
        if v:
            out[k + "_median"] = round(statistics.median(v), 6)
    calls = rows(Path(log).with_name("calls.jsonl")) if Path(log).with_name("calls.jsonl").is_file() else []
    if later:       # the calls up to the pause at `upto`; the later ones ran the steps after it
        paused = next((k for k, c in enumerate(calls) if c.get("why") == "pause"), None)
        calls = None if paused is None else calls[:paused + 1]
    out["wall_s"] = None if calls is None else round(sum(c["seconds"] for c in calls), 1)
    out["wall_s_per_step"] = round(out["wall_s"] / out["steps"], 2) if out["steps"] and calls is not None else None
    return out


TREND_KEYS = ("reward", "reward_r1", "reward_r2", "pass_rate", "coverage", "compile_rate", "completions/mean_length",
              "entropy", "hole_fix")


def trend(log, size=10, upto=None):
    """The training rows' means per window of `size` steps (steps 1-10, 11-20, ...; up to step `upto`): how the
    reward's parts move (round 1 and round 2, runs, passes, coverage, answer length) as RL goes on."""
    every = [r for r in rows(log) if not r.get("val") and (upto is None or r["step"] <= upto)]
    out = []
    for a in range(1, max((r["step"] for r in every), default=0) + 1, size):
        win = [r for r in every if a <= r["step"] < a + size]
        means = {k: round(statistics.mean(v), 4) for k in TREND_KEYS
                 if (v := [r[k] for r in win if r.get(k) is not None])}
        if means:
            out.append({"steps": [a, min(a + size - 1, max(r["step"] for r in win))], **means})
    return out


def data_counts(state):
    with tarfile.open(state / "data.tgz") as tar:
        read = lambda name: json.load(tar.extractfile(f"data/{name}"))             # noqa: E731
        split = {k: read(f"{k}/skill_split.json") for k in ("skill", "skill_val", "skill_train")}
        build = read("build_info.json")
        floors = read("rl_floor.json")["tasks"].values()
        ok = [f for f in floors if "error" not in f]
        return {"mix": {k: v for k, v in read("mix.json").items() if k != "licenses"},
                "skill_mix": read("skill_mix.json"),
                "skill_split": {k: {"tasks": s["tasks"], "real": s["real"], "synthetic": s["synthetic"],
                                    "funnel": s["funnel"], "seconds": s["seconds"]} for k, s in split.items()},
                "sft_rows": build["sizes"], "sft_rows_by_kind": build["sizes_by_kind"], "build_sft_s": build["seconds"],
                "rl_floor": {"tasks": len(ok), "errors": len(floors) - len(ok), "random_fails": sum(not f["random_pass"] for f in ok),
                             "mean_random_cov": round(statistics.mean(f["random_cov"] for f in ok), 2)}}


def spread(samples):
    """Round 0 (direct answers): the number of tasks and the share whose samples all earn the same task reward
    (score.result_reward: 1 + coverage for a run that finished, else 0), a group RL could not learn from."""
    by_task = {}
    for smp in samples:
        by_task.setdefault(smp["task_id"], []).append(score.result_reward(smp["rounds"][0]["result"]))
    groups = list(by_task.values())
    return {"tasks": len(groups), "zero_spread": round(sum(len(set(g)) == 1 for g in groups) / len(groups), 4)}


def read_samples(folder):
    """evaluate.py's samples.jsonl in a sweep folder, as written or gzipped for keeping."""
    plain = folder / "samples.jsonl"
    if plain.is_file():
        text = plain.read_text()
    else:
        with gzip.open(folder / "samples.jsonl.gz", "rt") as f:
            text = f.read()
    return [json.loads(x) for x in text.splitlines() if x.strip()]


def eval_summary(folder):
    """One evaluate.py folder: the direct and agentic headline, hole fixes, what became of the refinements of
    states that ran, and round-0 reward spread; None until it is finished (metrics.json: evaluate.py writes it last)."""
    if not (folder / "metrics.json").is_file():
        return None
    m = json.loads((folder / "metrics.json").read_text())
    samples = read_samples(folder)
    n = m["n"]
    pick = lambda h: {k: round(h[k], 4) for k in ("pass@1", f"pass@{n}", "cov@1", "syn_pass")}   # noqa: E731
    return {"n": n, "tasks": m["num_tasks"], "direct": pick(m["direct"]), "agentic": pick(m["agentic"]),
            "direct_pass@1_ci95": [round(x, 4) for x in m["direct"]["pass@1_ci95"]],
            "hole_fixes": m["hole_fixes"], "failures_direct": m["direct"]["failures"],
            **spread(samples), "refine_status": refine_status(samples)}


def summaries(folder, prefix=""):
    """{name without prefix: eval_summary} of the finished evaluation folders in `folder` whose names start with
    prefix: state/sweep/T* (the temperature sweep), state/refine/* (a stage's pick on the same tasks and decoding)."""
    found = ((d.name[len(prefix):], eval_summary(d)) for d in sorted(folder.glob(prefix + "*")) if d.is_dir())
    return {name: summary for name, summary in found if summary is not None}


def pick_temperature(sweep):
    """results/small3_run.md's rule, fixed before the sweep ran: of the temperatures whose direct Pass@1 is inside
    T 1.0's 95 % interval or above it, the fewest zero-spread tasks, then the higher direct Pass@n."""
    ref = sweep["1.0"]["direct_pass@1_ci95"][0]      # rounded as pass@1 is, so T 1.0 is always inside its own
    ok = [t for t, r in sweep.items() if r["direct"]["pass@1"] >= ref]
    return min(ok, key=lambda t: (sweep[t]["zero_spread"], -sweep[t]["direct"][f"pass@{sweep[t]['n']}"]))


REWARD_STEP = 50


def pilot_folders(state):
    """{arm: folder} of the reward pilot's two rl0 arms: rl0 (task) and r/rl0 (over_random) until the pick; once
    over_random is picked, its arm has taken rl0's place and the task arm is r/rl0_task."""
    if (Path(state) / "r/rl0_task").is_dir():
        return {"task": "r/rl0_task", "over_random": "rl0"}
    return {"task": "rl0", "over_random": "r/rl0"}


def pick_reward(pilot, step=REWARD_STEP):
    """results/small3_run.md's rule, fixed before the arms resumed past step 34: at validation step `step`,
    over_random only if its validation reward (the task reward, 1 + coverage, for both arms) beats the task arm's
    by more than their standard errors combined and its Pass@1 is not lower; else the task reward (the paper's).
    None until both arms have validated at that step."""
    at = {arm: next((r for r in pilot[arm]["val"] if r["step"] == step), None) for arm in ("task", "over_random")}
    if None in at.values():
        return None
    task, over = at["task"], at["over_random"]
    margin = (task["val/reward_se"] ** 2 + over["val/reward_se"] ** 2) ** 0.5
    better = over["val/reward"] - task["val/reward"] > margin and over["val/pass@1"] >= task["val/pass@1"]
    return "over_random" if better else "task"


def sft_stage(folder):
    """An SFT stage's kept folder: finished or not (done.json), time and steps so far, its pick, rows, validation."""
    res = json.loads((folder / "result.json").read_text())
    done = folder / "done.json"
    return {"done": done.is_file(), "wall_s": json.loads(done.read_text()).get("seconds") if done.is_file() else None,
            "train_s": res["outcome"]["time_s"],
            "steps": res["outcome"]["steps_done"], "steps_planned": res["setup"]["steps"],
            "pick": res["outcome"]["val_best_adapter"], "rows_used": res["setup"]["rows_used"],
            "val": val_table(folder / "log.jsonl")}


def self_induced(folder):
    """The stage-2 data (data/build_sft.py with sft1's pick as the policy): row counts by kind, what became of the
    policy's own runs and refinement candidates, and the stage's wall time."""
    info, done = (json.loads((folder / f).read_text()) for f in ("build_info.json", "done.json"))
    s2 = info["stage2"]
    return {"policy": {k: info["stage2_policy"][k] for k in ("n", "temperature", "top_p", "max_new_tokens")},
            "rows_by_kind": info["sizes_by_kind"]["stage2"], "new_rows": s2["rows"],
            "runs_by_status": s2["runs_by_status"], "states": s2["states"], "kept_by_kind": s2["kept_by_kind"],
            "rejected_no_improvement": s2["rejected_no_improvement"], "wall_s": done["seconds"]}


SPLITS = {"eval": "reporting", "eval_skill": "skill", "eval_syn": "synthetic test"}


def evaluations(state):
    """{split folder: {name: headline}} of the kept evaluations (state/eval*/NAME/metrics.json: the weightless
    baselines so far, the models later): direct and agentic Pass@1 with its 95 % interval, Pass@n, Cov@1, SynPass."""
    out = {}
    for sub in SPLITS:
        for d in sorted((state / sub).glob("*/")):
            if not (d / "metrics.json").is_file():
                continue
            m = json.loads((d / "metrics.json").read_text())
            n = m["n"]
            out.setdefault(sub, {})[d.name] = {"n": n, "rounds": m["rounds"], "tasks": m["num_tasks"], **{
                mode: {**{k: round(m[mode][k], 4) for k in ("pass@1", f"pass@{n}", "cov@1", "syn_pass")},
                       "pass@1_ci95": [round(x, 4) for x in m[mode]["pass@1_ci95"]]} for mode in ("direct", "agentic")}}
    return out


SPLIT_KEYS = {sub: label.replace(" ", "_") for sub, label in SPLITS.items()}    # models' keys


def models(evals):
    """{NAME: {split: headline}}: each evaluated model's numbers by split (skill, reporting, synthetic_test). pass@1
    is the protocol's (the last refinement round: 1 + 3 rounds on the skill and reporting splits), with its 95 %
    interval; direct_pass@1 is round 0's."""
    out = {}
    for sub, names in evals.items():
        for name, e in names.items():
            out.setdefault(name, {})[SPLIT_KEYS[sub]] = {
                "pass@1": e["agentic"]["pass@1"], "pass@1_ci95": e["agentic"]["pass@1_ci95"],
                "direct_pass@1": e["direct"]["pass@1"], "cov@1": e["agentic"]["cov@1"], "n": e["n"],
                "rounds": e["rounds"], "tasks": e["tasks"]}
    return out


def split_claims(state):
    """{split: claims.claims(the split's eval folder)}: the four claims with paired bootstrap intervals and verdicts,
    for each split where a claim's models (sft0-2, rl0-2, soup, opd, opd_nogate) have been evaluated."""
    import claims
    out = {}
    for sub in SPLITS:
        folder = state / sub
        names = [n for group in claims.CLAIM_MODELS.values() for n in group] + ["soup", "opd", "opd_nogate"]
        if any((folder / n / "metrics.json").is_file() for n in names):
            out[SPLIT_KEYS[sub]] = {**claims.claims(folder), "eval_dir": f"state/{sub}"}
    return out


def goal(table):
    """The run's bar on the skill split (points of Pass@1, the protocol's rounds): the best expert at least 20, gated
    OPD at least the best expert (point estimates; claims (c)/(d) carry the intervals). None until rl0-rl2 have
    skill numbers."""
    sk = {n: m["skill"]["pass@1"] for n, m in table.items() if "skill" in m}
    if not all(n in sk for n in ("rl0", "rl1", "rl2")):
        return None
    best = max(("rl0", "rl1", "rl2"), key=sk.get)
    out = {"best_expert": best, "best_expert_pass@1": sk[best], "best_expert_at_least_20": sk[best] >= 20.0}
    if "opd" in sk:
        out.update({"opd_pass@1": sk["opd"], "opd_at_least_best_expert": sk["opd"] >= sk[best]})
    return out


def refine_status(samples):
    """What became of the refinements of states that ran: the scorer's status of each round r >= 1 answer whose
    state (round `state_round`) finished its run, counted (a hole can only be fixed by an answer that runs)."""
    return dict(collections.Counter(r["result"].get("status") for smp in samples for r in smp["rounds"][1:]
                                    if r.get("state_round") is not None
                                    and smp["rounds"][r["state_round"]]["result"].get("status") == "ok").most_common())


def record(state):
    """The record's dict from a kept state folder."""
    state = Path(state)
    rec = {"status": "in progress", "data": data_counts(state), "stages": {}, "pilot": {}}
    for name in ("sft0", "sft1", "sft2"):
        if (state / name / "result.json").is_file():
            rec["stages"][name] = sft_stage(state / name)
    if (state / "data2/done.json").is_file():
        rec["data2"] = self_induced(state / "data2")
    for arm, folder in pilot_folders(state).items():     # up to the pick's step: the chosen arm goes on as rl0
        log = state / folder / "log.jsonl"
        rec["pilot"][arm] = {"folder": folder, "val": val_table(log, REWARD_STEP), **step_stats(log, REWARD_STEP),
                             "trend": trend(log, upto=REWARD_STEP)}
    rec["reward_pick"] = pick_reward(rec["pilot"])
    for name in ("rl0", "rl1", "rl2"):          # the experts (rl0: the pilot's chosen arm, from step 0)
        log = state / name / "log.jsonl"
        if log.is_file():
            rec.setdefault("experts", {})[name] = {"done": (state / name / "done.json").is_file(), "val": val_table(log),
                                                   **step_stats(log), "trend": trend(log)}
    if (state / "sweep").is_dir():
        rec["sweep"] = summaries(state / "sweep", "T")
        if "1.0" in rec["sweep"]:
            rec["sweep_pick"] = pick_temperature(rec["sweep"])
    if (state / "refine").is_dir():
        rec["refine"] = summaries(state / "refine")
    rec["evaluations"] = evaluations(state)
    rec["models"] = models(rec["evaluations"])
    rec["claims"] = split_claims(state)
    rec["goal"] = goal(rec["models"])
    return rec


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--state", default=str(ROOT / "results/small3/state"))
    ap.add_argument("--out", default=str(ROOT / "results/small3_run.json"))
    ap.add_argument("--reward-pick", action="store_true",
                    help="print only the reward rule's pick from the pilot arms' logs (--state: a kept state or the "
                         "run folder itself, so a GPU job can act on it); exit 2 before both arms reach step 50")
    a = ap.parse_args(argv)
    if a.reward_pick:
        state = Path(a.state)
        pilot = {arm: {"val": val_table(state / folder / "log.jsonl")} for arm, folder in pilot_folders(state).items()}
        pick = pick_reward(pilot)
        if pick is None:
            print(f"small3_record: no reward pick yet: both arms must validate at step {REWARD_STEP}", file=sys.stderr)
            return 2
        print(pick)
        return 0
    Path(a.out).write_text(json.dumps(record(a.state), indent=1) + "\n")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    sys.exit(main())
