"""The skill split builder (data/skill.py) on fixtures: a design random passes (dropped), a lock random cannot
open but a known stimulus does (kept, target halfway), a design the kit cannot harness (dropped), a synthetic
skill family (kept); and the CLI's files. Random budgets are cut to two to keep it fast.

Run: python -m pytest -q tests/test_skill.py
"""
import json

import pytest

from data import floor, skill, skill_designs
from test_baselines import LOCK, LOCK_OPEN, MUX, make_task

BUDGETS = ((100, None), (1000, 100))
ARRAY = "module arr(input clk, input [7:0] mem [0:3], output [7:0] y);\n  assign y = mem[0];\nendmodule\n"


def test_target_is_halfway_rounded_down():
    assert skill.skill_target(60.0, 100.0) == 80.0 and skill.skill_target(81.25, 92.5) == 86.8


@pytest.mark.needs_iverilog
def test_build_on_fixtures(tmp_path):
    lock = {**make_task("t_lock", "lock3", LOCK), "known_stimulus": floor.random_stimulus(1000, 100, 0) + LOCK_OPEN}
    tasks = [{**make_task("t_mux", "mux2", MUX), "_source": "dev"}, {**lock, "_source": "dev"},
             {**make_task("t_arr", "arr", ARRAY), "_source": "dev"}, skill_designs.make_task("term_counter", 0)]
    kept, train, report = skill.build_skill_split(tasks, workers=2, budgets=BUDGETS, seeds=2)
    assert report["reasons"] == {"t_mux": "random_passes", "t_lock": "kept", "t_arr": "cannot_harness",
                                 "skill_term_counter_0": "kept"}
    assert report["funnel"]["dev"] == {"tasks": 3, "random_passes": 1, "kept": 1, "cannot_harness": 1}
    assert report["tasks"] == 2 and report["real"] == 1 and report["synthetic"] == 1 and train == []
    row = {r["id"]: r for r in kept}["t_lock"]
    s = row["skill"]
    assert s["source"] == "dev" and s["reached_by"] == "known stimulus" and "_source" not in row
    assert s["random_cov"] <= s["random_best"] and s["random_best"] + skill.MIN_GAP <= s["reachable"]
    assert s["target"] == skill.skill_target(s["random_best"], s["reachable"])
    assert s["random_best"] < s["target"] < s["reachable"]
    assert row["targets"][-1] == {"inst_name": "uut", "metric": "icarus_overall_average",
                                  "target_percentage": s["target"]}
    assert row["random_floor"]["random_cov"] == s["random_cov"]
    assert {r["id"]: r for r in kept}["skill_term_counter_0"]["skill"]["family"] == "term_counter"


@pytest.mark.needs_iverilog
def test_cli_writes_the_split_and_a_reusable_floor(tmp_path, monkeypatch):
    path = tmp_path / "dev.jsonl"
    path.write_text(json.dumps(make_task("t_mux", "mux2", MUX)) + "\n")
    argv = ["--tasks", str(path), "--synthetic", "1", "--out", str(tmp_path / "out"), "--budgets", "100", "1000:100",
            "--workers", "1"]
    assert skill.main(argv) == 0
    rep = json.loads((tmp_path / "out" / "skill_split.json").read_text())
    assert rep["funnel"]["dev"] == {"tasks": 1, "random_passes": 1} and rep["funnel"]["synthetic"]["kept"] == 1
    rows = [json.loads(x) for x in (tmp_path / "out" / "skill_tasks.jsonl").read_text().splitlines()]
    assert [r["id"] for r in rows] == ["skill_code_lock_0"]
    assert len(floor.load_floor(tmp_path / "out" / "floor.json")) == 2
    monkeypatch.setattr(floor.simpool, "SimPool", None)         # a second run: every floor from the cache
    assert skill.main(argv) == 0


@pytest.mark.needs_iverilog
def test_pool_tasks_are_screened_then_split_into_eval_and_training():
    mux = {**make_task("p_mux", "mux2", MUX), "_source": "pool", "icarus_calibration": {"reached_pct": 100.0},
           "provenance": {"repo": "o/a", "path": "m.v"}}
    lock = {**make_task("p_lock", "lock3", LOCK), "_source": "pool", "icarus_calibration": {"reached_pct": 100.0},
            "known_stimulus": floor.random_stimulus(1000, 100, 0) + LOCK_OPEN, "provenance": {"repo": "o/b", "path": "l.v"}}
    screen = {}
    kept, train, report = skill.build_skill_split([mux, lock], workers=2, budgets=BUDGETS, seeds=1, screen=screen,
                                                  heldout=0.0, use_teacher=False)
    assert report["reasons"] == {"p_mux": "random_passes_screen", "p_lock": "kept_for_training"}
    assert kept == [] and [r["id"] for r in train] == ["p_lock"] and report["training_tasks"] == 1
    kept, train, _ = skill.build_skill_split([lock], workers=2, budgets=BUDGETS, seeds=1, heldout=1.0, use_teacher=False)
    assert [r["id"] for r in kept] == ["p_lock"] and train == [] and kept[0]["skill"]["source"] == "pool"
