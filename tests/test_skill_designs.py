"""Synthetic skill families (data/skill_designs.py): for every family, the constructed stimulus passes the task's
target (coverage reachable by construction) and the random baseline's floor (data/floor.py: the best of 100 to
20,000 random cycles, with and without resets) fails it, at least 5 points below.

Run: python -m pytest -q tests/test_skill_designs.py
"""
import pytest

import harness
import sim
from data import floor
from data import skill_designs as sd


def test_rows_follow_the_task_schema():
    tasks = sd.generate_tasks(10, seed=3)
    assert [t["family"] for t in tasks[:5]] == list(sd.SKILL_FAMILIES)
    assert len({t["id"] for t in tasks}) == 10 and tasks[0]["id"] == "skill_code_lock_300000"
    for t in tasks:
        assert t["skill"] == {"source": "synthetic", "family": t["family"]} and t["split"] == "skill"
        assert t["dut_instance_name"] in ("dut", "uut", f"inst_{t['dut_module_name']}")
        assert harness.check_stimulus(t["known_stimulus"], harness.task_harness(t)) is None
    assert sd.make_task("handshake", 7) == sd.make_task("handshake", 7)          # deterministic
    assert sd.make_task("code_lock", 7)["rtl_files"] != sd.make_task("code_lock", 8)["rtl_files"]   # other codes
    with pytest.raises(ValueError, match="unknown skill family"):
        sd.make_task("fifo", 0)


@pytest.mark.needs_iverilog
@pytest.mark.parametrize("family", list(sd.SKILL_FAMILIES))
def test_known_stimulus_passes_and_random_fails(family):
    tasks = [sd.make_task(family, seed) for seed in (0, 1)]
    floors = floor.calibrate_floor(tasks, seeds=1, workers=2, progress=False)
    for t in tasks:
        tb, _ = harness.assemble(harness.task_harness(t), t["known_stimulus"])
        known = sim.simulate(sim.job_from_task(t, tb))
        f = floors[floor.task_key(t)]
        assert known.status == "ok" and known.passed and known.overall_pct >= 98.0, (t["id"], known.uncovered[:3])
        assert f["random_pass"] == 0.0 and f["random_cov"] <= known.overall_pct - 5.0, (t["id"], f)
