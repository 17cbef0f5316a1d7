"""The scorer on the third-party dev set (../shared/data/dev_tasks.jsonl, 206 real designs, 48 with a
reference testbench): >= 97% of the DUTs instrument and compile, and every reference testbench that runs
under plain Icarus also runs under the scorer and gets a coverage number. Also the robustness design.

Run: python -m pytest -q -m "needs_shared" tests/test_sim_devset.py   (about a minute on 2 cores)
"""
import os
import subprocess
from pathlib import Path

import pytest

import sim
import simpool

DESIGNS = Path(__file__).resolve().parent / "designs"


@pytest.fixture(scope="module")
def tasks(shared_dir):
    return sim.load_tasks(shared_dir / "data" / "dev_tasks.jsonl")


@pytest.mark.needs_shared
@pytest.mark.needs_iverilog
@pytest.mark.slow
def test_dev_duts_instrument_and_compile(tasks):
    failures = []
    for t in tasks:
        ok, msg = sim.prepare_check(t["rtl_files"], t["dut_module_name"])
        if not ok:
            failures.append((t["id"], msg))
    assert len(tasks) == 206
    assert len(failures) <= 0.03 * len(tasks), failures


def plain_icarus_runs(task, tmp_path):
    """The reference flow without the scorer: iverilog DUT + tb, vvp; True when it compiles and exits 0."""
    d = tmp_path / task["id"].replace("/", "_")
    d.mkdir()
    names = []
    for f in task["rtl_files"]:
        (d / f["name"]).write_text(f["content"])
        names.append(f["name"])
    (d / "tb.sv").write_text(task["reference_tb"]["content"])
    c = subprocess.run(["iverilog", "-g2012", "-o", "x.vvp", *names, "tb.sv"], cwd=d, capture_output=True)
    if c.returncode != 0:
        return False
    r = subprocess.run(["timeout", "-s", "INT", "20", "vvp", "-n", "x.vvp", "-none"], cwd=d, capture_output=True)
    return r.returncode == 0


@pytest.mark.needs_shared
@pytest.mark.needs_iverilog
@pytest.mark.slow
def test_reference_testbenches_score(tasks, tmp_path):
    with_tb = [t for t in tasks if t.get("reference_tb")]
    assert len(with_tb) == 48
    results = simpool.simulate_many([sim.job_from_task(t, t["reference_tb"]["content"]) for t in with_tb],
                                workers=min(2, os.cpu_count() or 1), verbose=False)
    bad = []
    for t, r in zip(with_tb, results):
        if plain_icarus_runs(t, tmp_path) and not (r.status == sim.OK and r.overall_pct is not None):
            bad.append((t["id"], r.status, r.errors[:2]))
    assert bad == []
    # the simulated-time limit's default is generous to every reference testbench: none is stopped by it,
    # and those that end with $finish (all but 4, which run out of events) end 10x below it
    assert not [t["id"] for t, r in zip(with_tb, results) if r.status == sim.SIM_TIME_LIMIT or r.sim_time_limited]
    finished = [r.sim_time for r in results if r.sim_time is not None and r.sim_time < sim.ScoreConfig().sim_time_limit]
    assert len(finished) >= 44 and max(finished) * 10 <= sim.ScoreConfig().sim_time_limit


@pytest.mark.needs_shared
@pytest.mark.needs_iverilog
@pytest.mark.slow
def test_reference_testbenches_identical_with_both_toggle_backends(tasks):
    if not sim.vpi_module_dir():
        pytest.skip("the VPI toggle module cannot be built here (no iverilog-vpi / C compiler)")
    jobs = [sim.job_from_task(t, t["reference_tb"]["content"]) for t in tasks if t.get("reference_tb")]
    keys = ("status", "metrics", "overall_pct", "per_instance", "uncovered", "targets", "notes", "sim_time")
    got = {}
    for backend in ("verilog", "vpi"):
        results = simpool.simulate_many(jobs, workers=min(2, os.cpu_count() or 1), verbose=False,
                                    cfg=sim.ScoreConfig(toggle_backend=backend))
        assert all(r.versions["toggle_backend"] == backend for r in results)
        got[backend] = [{k: getattr(r, k) for k in keys} for r in results]
    assert [j["id"] for j, a, b in zip(jobs, got["verilog"], got["vpi"]) if a != b] == []


@pytest.mark.needs_iverilog
def test_tricky_design_runs():
    # enum FSM (typedef), unique case, casez, a function (not instrumented, noted), a macro statement (noted),
    # non-ANSI submodule with a for loop, generate if/else without begin/end, nested named generate, memory.
    res = sim.simulate({"id": "tricky", "top": "tricky", "inst": "uut", "targets": [],
                        "tb": (DESIGNS / "tb_tricky.sv").read_text(),
                        "rtl_files": [{"name": "tricky.sv", "content": (DESIGNS / "tricky.sv").read_text()}]})
    assert res.status == sim.OK, res.errors
    assert res.metrics["fsm"]["total"] == 7            # S_IDLE, S_A, S_B + 4 transitions
    assert any("functions/tasks are not instrumented" in n for n in res.notes)
    assert any("macro-expanded statement (line 40)" in n for n in res.notes)
    assert "uut.u_enc" in res.per_instance
