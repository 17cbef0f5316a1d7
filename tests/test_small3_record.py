"""bench/small3_record.py: the round-3 record's numbers come from the kept state (a synthetic one here): data counts
from data.tgz, each SFT stage's validation table (a stage cut at a deadline too), each pilot arm's validation rows,
step medians (from step 2) and wall time, the stage-2 data's counts, and each sweep temperature's reward spread and refinement outcomes."""
import gzip
import importlib.util
import io
import json
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("small3_record", ROOT / "bench" / "small3_record.py")
small3_record = importlib.util.module_from_spec(spec)
spec.loader.exec_module(small3_record)


def _write(path, obj):
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "".join(json.dumps(r) + "\n" for r in obj) if isinstance(obj, list) else json.dumps(obj)
    path.write_text(text)


def _state(tmp_path):
    s = tmp_path / "state"
    split = lambda n: {"tasks": n, "real": 0, "synthetic": n, "funnel": {}, "seconds": 1.0}      # noqa: E731
    files = {"mix.json": {"train_real": 3, "train_synthetic": 2, "licenses": {"MIT": 3}},
             "skill_mix.json": {"rl_tasks": 3}, "skill/skill_split.json": split(4), "skill_val/skill_split.json": split(2),
             "skill_train/skill_split.json": split(3),
             "build_info.json": {"sizes": {"stage0": 5}, "sizes_by_kind": {}, "seconds": {"total": 9.0}},
             "rl_floor.json": {"tasks": {"a": {"random_pass": False, "random_cov": 40.0},
                                         "b": {"random_pass": True, "random_cov": 100.0}, "c": {"error": "x"}}}}
    s.mkdir(parents=True)
    with tarfile.open(s / "data.tgz", "w:gz") as tar:
        for name, obj in files.items():
            data = json.dumps(obj).encode()
            info = tarfile.TarInfo(f"data/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    _write(s / "sft0/result.json", {"outcome": {"time_s": 12.5, "steps_done": 4, "val_best_adapter": "val_ckpt/x"},
                                    "setup": {"rows_used": 5, "steps": 4}})
    (s / "sft0/done.json").write_text('{"seconds": 20.0}')
    _write(s / "data2/build_info.json", {"stage2_policy": {"n": 2, "temperature": 0.7, "top_p": 0.8, "max_new_tokens": 9,
                                                           "adapter": "x"},
                                         "sizes_by_kind": {"stage2": {"direct": 5, "refine_coverage": 2}},
                                         "stage2": {"rows": 2, "runs_by_status": {"ok": 9, "truncated": 1}, "states": 3,
                                                    "kept_by_kind": {"refine_coverage": 2}, "rejected_no_improvement": 1}})
    _write(s / "data2/done.json", {"seconds": 30.5})
    _write(s / "sft1/result.json", {"outcome": {"time_s": 3.0, "steps_done": 2, "val_best_adapter": "val_ckpt/0"},
                                    "setup": {"rows_used": 7, "steps": 9}})     # stopped at a deadline: no done.json
    _write(s / "sft1/log.jsonl", [{"step": 0, "val": 1, "val/pass@1": 40.0}, {"step": 2, "loss": 0.5}])
    _write(s / "sft0/log.jsonl", [{"step": 1, "loss": 1.0}, {"step": 4, "val": 1, "val/pass@1": 50.0, "val/reward": 1.5}])
    for folder, ent in (("rl0", 0.1), ("r/rl0", 0.3)):
        _write(s / folder / "log.jsonl", [{"step": 1, "entropy": 9.0, "t_gen": 99.0}, {"step": 2, "entropy": ent, "t_gen": 2.0},
                                          {"step": 3, "entropy": ent, "t_gen": 4.0},
                                          {"step": 3, "val": 1, "val/pass@1": 25.0, "val/reward": 1.25}])
        _write(s / folder / "calls.jsonl", [{"seconds": 10.0}, {"seconds": 5.5}])
    head = {"pass@1": 25.0, "pass@2": 50.0, "cov@1": 60.0, "syn_pass": 75.0, "pass@1_ci95": [0.0, 50.0], "failures": {}}
    _write(s / "sweep/T1.3/metrics.json", {"n": 2, "num_tasks": 2, "direct": head, "agentic": head,
                                           "hole_fixes": {"steps": 1}})
    ran = lambda pct, status="ok": {"rounds": [{"result": {"status": status, "overall_pct": pct}}]}   # noqa: E731
    lines = [{"task_id": "a", **ran(50.0)}, {"task_id": "a", **ran(50.0)},                  # same reward: no spread
             {"task_id": "b", **ran(50.0)}, {"task_id": "b", "rounds": [{"result": {"status": "truncated"}}]},
             {"task_id": "c", **ran(40.0, "timeout")}, {"task_id": "c", **ran(60.0, "timeout")},  # both earn 0
             {"task_id": "d", **ran(40.0)}, {"task_id": "d", **ran(40.0, "timeout")}]             # 1.4 and 0
    refine = lambda state, new: {"round": 1, "state_round": 0, "result": {"status": new}}    # noqa: E731
    lines[0]["rounds"].append(refine(0, "truncated"))          # a state that ran, refined: counted
    lines[2]["rounds"].append(refine(0, "truncated"))
    lines[6]["rounds"].append(refine(0, "ok"))
    lines[3]["rounds"].append(refine(0, "ok"))                 # its state was cut off: not counted
    lines[4]["rounds"].append({"round": 1, "state_round": None, "result": {"status": "ok"}})   # a fresh answer
    with gzip.open(s / "sweep/T1.3/samples.jsonl.gz", "wt") as f:
        f.write("".join(json.dumps(x) + "\n" for x in lines))
    _write(s / "sweep/T1.0/metrics.json", {"n": 2, "num_tasks": 1, "direct": head, "agentic": head,
                                           "hole_fixes": {"steps": 0}})
    _write(s / "sweep/T1.0/samples.jsonl", [{"task_id": "a", **ran(50.0)}])           # as evaluate.py writes it
    (s / "sweep/T0.7").mkdir()                                                          # cut before metrics.json
    _write(s / "refine/sft1/metrics.json", {"n": 2, "num_tasks": 1, "direct": head, "agentic": head,
                                            "hole_fixes": {"steps": 1, "fixed_any": 100.0}})
    refined = [{"result": {"status": "ok", "overall_pct": 50.0}},
               {"state_round": 0, "result": {"status": "ok", "overall_pct": 80.0}}]         # a refinement that ran
    _write(s / "refine/sft1/samples.jsonl", [{"task_id": "a", "rounds": refined}])
    (s / "refine/sft2").mkdir()                                                         # not finished: left out
    ci = {"pass@1_ci95": [0.0, 0.0]}
    _write(s / "eval_skill/random/metrics.json", {"n": 5, "rounds": 3, "num_tasks": 4, **{mode: {
        "pass@1": 0.0, "pass@5": 0.0, "cov@1": 61.23456, "syn_pass": 100.0, **ci} for mode in ("direct", "agentic")}})
    (s / "eval_skill/teacher_strong").mkdir()                                          # not finished: left out
    return s


def test_the_record_reads_the_state(tmp_path):
    out = tmp_path / "rec.json"
    small3_record.main(["--state", str(_state(tmp_path)), "--out", str(out)])
    rec = json.loads(out.read_text())
    assert rec["data"]["rl_floor"] == {"tasks": 2, "errors": 1, "random_fails": 1, "mean_random_cov": 70.0}
    assert rec["data"]["mix"] == {"train_real": 3, "train_synthetic": 2}
    assert rec["data"]["skill_split"]["skill_train"]["tasks"] == 3
    sft0 = rec["stages"]["sft0"]
    assert sft0["done"] and sft0["wall_s"] == 20.0 and sft0["steps"] == 4 and sft0["val"] == [{"step": 4, "val/reward": 1.5, "val/pass@1": 50.0}]
    assert rec["data2"] == {"policy": {"n": 2, "temperature": 0.7, "top_p": 0.8, "max_new_tokens": 9},
                            "rows_by_kind": {"direct": 5, "refine_coverage": 2}, "new_rows": 2,
                            "runs_by_status": {"ok": 9, "truncated": 1}, "states": 3,
                            "kept_by_kind": {"refine_coverage": 2}, "rejected_no_improvement": 1, "wall_s": 30.5}
    assert "sft2" not in rec["stages"]
    assert rec["stages"]["sft1"] == {"done": False, "wall_s": None, "train_s": 3.0, "steps": 2, "steps_planned": 9, "pick": "val_ckpt/0",
                                     "rows_used": 7, "val": [{"step": 0, "val/pass@1": 40.0}]}
    task, over = rec["pilot"]["task"], rec["pilot"]["over_random"]
    assert task["entropy_median"] == 0.1 and over["entropy_median"] == 0.3      # step 1 is left out of the medians
    assert task["t_gen_median"] == 3.0 and task["steps"] == 3 and task["wall_s"] == 15.5
    assert task["wall_s_per_step"] == round(15.5 / 3, 2)
    assert task["trend"] == [{"steps": [1, 3], "entropy": 3.0667}]     # every step of the window, step 1 too
    assert over["val"] == [{"step": 3, "val/reward": 1.25, "val/pass@1": 25.0}]
    t13 = rec["sweep"]["1.3"]
    assert t13["tasks"] == 4 and t13["zero_spread"] == 0.5 and t13["direct"]["pass@2"] == 50.0   # a and c
    assert sorted(rec["sweep"]) == ["1.0", "1.3"] and rec["sweep"]["1.0"]["zero_spread"] == 1.0
    assert t13["refine_status"] == {"truncated": 2, "ok": 1} and rec["sweep"]["1.0"]["refine_status"] == {}
    assert list(rec["refine"]) == ["sft1"] and rec["refine"]["sft1"]["refine_status"] == {"ok": 1}
    assert rec["refine"]["sft1"]["hole_fixes"]["fixed_any"] == 100.0 and rec["refine"]["sft1"]["zero_spread"] == 1.0
    assert rec["reward_pick"] is None             # the arms have validated at step 3 only
    assert rec["evaluations"] == {"eval_skill": {"random": {"n": 5, "rounds": 3, "tasks": 4, **{mode: {
        "pass@1": 0.0, "pass@5": 0.0, "cov@1": 61.2346, "syn_pass": 100.0, "pass@1_ci95": [0.0, 0.0]}
        for mode in ("direct", "agentic")}}}}
    assert rec["sweep_pick"] == "1.3"             # both inside 1.0's interval [0, 50]; 1.3 has less zero spread
    assert rec["experts"] == {"rl0": {**{k: v for k, v in task.items() if k != "folder"}, "done": False}}
    log = tmp_path / "state/rl0/log.jsonl"                             # the arm goes on as rl0 past the pick's step
    log.write_text(log.read_text() + json.dumps({"step": 51, "entropy": 5.0}) + "\n")
    stats = small3_record.step_stats(log, 50)
    assert stats["steps"] == 3 and stats["entropy_median"] == 0.1 and stats["wall_s"] is None
    assert small3_record.step_stats(log)["steps"] == 51 and small3_record.step_stats(log)["wall_s"] == 15.5
    calls = log.with_name("calls.jsonl")                # the call that paused at step 50, then one past it
    calls.write_text(calls.read_text() + json.dumps({"seconds": 4.5, "why": "pause"}) + "\n"
                     + json.dumps({"seconds": 9.0, "why": "deadline"}) + "\n")
    assert small3_record.step_stats(log, 50)["wall_s"] == 20.0 and small3_record.step_stats(log)["wall_s"] == 29.0


def test_the_reward_rule():
    """At step 50: over_random only when its validation reward is ahead by more than the combined standard error
    and its Pass@1 is not lower; the task reward otherwise; no pick before both arms reach step 50."""
    row = lambda step, rew, se, p1: {"step": step, "val/reward": rew, "val/reward_se": se, "val/pass@1": p1}  # noqa: E731
    pilot = {"task": {"val": [row(30, 1.7, 0.05, 55.0), row(50, 1.70, 0.03, 60.0)]},
             "over_random": {"val": [row(30, 1.7, 0.05, 55.0)]}}
    assert small3_record.pick_reward(pilot) is None
    pilot["over_random"]["val"].append(row(50, 1.76, 0.04, 60.0))     # ahead by 0.06, margin 0.05
    assert small3_record.pick_reward(pilot) == "over_random"
    pilot["over_random"]["val"][-1]["val/pass@1"] = 59.0                # but passes less
    assert small3_record.pick_reward(pilot) == "task"
    pilot["over_random"]["val"][-1].update({"val/pass@1": 70.0, "val/reward": 1.74})   # within the margin
    assert small3_record.pick_reward(pilot) == "task"


def test_the_reward_pick_on_the_command_line(tmp_path, capsys):
    """--reward-pick reads the two arms' logs from a run folder (no data.tgz needed) and prints the pick; before
    step 50 it says so on one line and exits 2."""
    row = lambda step, rew, p1: {"step": step, "val": 1, "val/reward": rew, "val/reward_se": 0.02,  # noqa: E731
                                 "val/pass@1": p1}
    _write(tmp_path / "rl0/log.jsonl", [row(40, 1.70, 60.0), {"step": 41, "loss": 1.0}])
    _write(tmp_path / "r/rl0/log.jsonl", [row(40, 1.80, 61.0)])
    assert small3_record.main(["--state", str(tmp_path), "--reward-pick"]) == 2
    assert capsys.readouterr().err.strip() == "small3_record: no reward pick yet: both arms must validate at step 50"
    _write(tmp_path / "rl0/log.jsonl", [row(40, 1.70, 60.0), row(50, 1.70, 60.0)])
    _write(tmp_path / "r/rl0/log.jsonl", [row(40, 1.80, 61.0), row(50, 1.80, 61.0)])
    assert small3_record.main(["--state", str(tmp_path), "--reward-pick"]) == 0
    assert capsys.readouterr().out.strip() == "over_random"
    (tmp_path / "rl0").rename(tmp_path / "r/rl0_task")                # the job after the pick: the arms swap places
    (tmp_path / "r/rl0").rename(tmp_path / "rl0")
    assert small3_record.pilot_folders(tmp_path) == {"task": "r/rl0_task", "over_random": "rl0"}
    assert small3_record.main(["--state", str(tmp_path), "--reward-pick"]) == 0
    assert capsys.readouterr().out.strip() == "over_random"           # the same pick, read after the swap


def test_the_temperature_rule():
    """Within T 1.0's interval (or above): the fewest zero-spread tasks, then the higher Pass@n; a temperature
    below the interval is out whatever its spread."""
    row = lambda p1, pn, zero, ci=(0, 0): {"n": 4, "direct": {"pass@1": p1, "pass@4": pn}, "zero_spread": zero,  # noqa: E731
                                           "direct_pass@1_ci95": list(ci)}
    sweep = {"0.7": row(60.0, 70.0, 0.40), "1.0": row(55.0, 75.0, 0.30, (48.0, 62.0)), "1.3": row(40.0, 80.0, 0.05)}
    assert small3_record.pick_temperature(sweep) == "1.0"
    sweep["0.7"]["zero_spread"] = 0.30                       # a tie on spread: the higher Pass@4 (1.0's 75)
    assert small3_record.pick_temperature(sweep) == "1.0"
    sweep["1.3"]["direct"]["pass@1"] = 50.0                  # now inside the interval, with the least spread
    assert small3_record.pick_temperature(sweep) == "1.3"


STATE = ROOT / "results" / "small3" / "state"


@pytest.mark.skipif(not (STATE / "data.tgz").is_file(), reason="results/small3/state is not in this checkout "
                    "(a light clone leaves it out)")
def test_the_committed_record_is_the_kept_states():
    """results/small3_run.json is what the script makes of results/small3/state today: no figure edited by hand."""
    assert json.loads((ROOT / "results" / "small3_run.json").read_text()) == small3_record.record(STATE)


def _model_metrics(passes, n=5, cov=50.0):
    """metrics.json of a model evaluated on len(passes) skill tasks, n samples each (passes[i] of task i pass)."""
    per = {f"t{i}": {"samples": n, "passes": p, "pass_rate": 100.0 * p / n, "cov_mean": cov, "skill": True}
           for i, p in enumerate(passes)}
    rate = 100.0 * sum(passes) / (n * len(passes))
    head = {"pass@1": rate, "pass@5": rate, "cov@1": cov, "syn_pass": 100.0, "pass@1_ci95": [0.0, rate],
            "per_task": per}
    return {"n": n, "rounds": 3, "num_tasks": len(passes), "direct": {**head, "pass@1": rate / 2}, "agentic": head}


def test_models_claims_and_the_goal_once_the_models_are_evaluated(tmp_path):
    s = _state(tmp_path)
    table = {"sft0": [0, 0, 1, 0], "sft1": [2, 0, 0, 0], "sft2": [0, 1, 0, 0], "rl0": [1, 0, 1, 0],
             "rl1": [2, 1, 0, 0], "rl2": [0, 2, 0, 1], "soup": [2, 1, 1, 0], "opd": [3, 2, 1, 1],
             "opd_nogate": [1, 1, 0, 0]}
    for name, passes in table.items():
        _write(s / f"eval_skill/{name}/metrics.json", _model_metrics(passes))
    rec = small3_record.record(s)
    assert rec["models"]["rl1"]["skill"] == {"pass@1": 15.0, "pass@1_ci95": [0.0, 15.0], "direct_pass@1": 7.5,
                                             "cov@1": 50.0, "n": 5, "rounds": 3, "tasks": 4}
    assert rec["models"]["random"]["skill"]["pass@1"] == 0.0 and "reporting" not in rec["models"]["rl1"]
    assert rec["goal"] == {"best_expert": "rl1", "best_expert_pass@1": 15.0, "best_expert_at_least_20": False,
                           "opd_pass@1": 35.0, "opd_at_least_best_expert": True}
    c = rec["claims"]["skill"]
    assert list(rec["claims"]) == ["skill"] and c["eval_dir"] == "state/eval_skill" and c["missing"] == []
    assert sorted(c["claims"]) == ["a", "b", "c", "d"] and c["means"]["opd"] == 35.0
    assert all(row["verdict"] in ("holds", "does not hold", "inconclusive") for row in c["claims"].values())
    assert c == {**small3_record.claims.claims(s / "eval_skill"), "eval_dir": "state/eval_skill"}


def test_no_goal_before_every_expert_has_skill_numbers(tmp_path):
    s = _state(tmp_path)
    _write(s / "eval_skill/rl0/metrics.json", _model_metrics([1, 0, 0, 0]))
    rec = small3_record.record(s)
    assert rec["goal"] is None and rec["claims"]["skill"]["missing"] == ["a", "b", "c", "d"]
