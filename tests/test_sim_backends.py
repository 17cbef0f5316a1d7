"""The two toggle backends (pure-Verilog monitors, VPI module vpi/toggle_cov.c) give identical results:
status, every metric's covered/total, per-instance rows, uncovered lists, targets and notes, on every test
design (the dev reference testbenches: tests/test_sim_devset.py). And "auto" falls back to the Verilog
monitors where the module cannot be built, saying which backend ran in the result record.

Run: python -m pytest -q tests/test_sim_backends.py
"""
from pathlib import Path

import pytest

import sim

DESIGNS = Path(__file__).resolve().parent / "designs"
CASES = [("counter.sv", "counter", "tb_counter.sv"), ("fsm.sv", "fsm", "tb_fsm.sv"), ("alu.sv", "alu", "tb_alu.sv"),
         ("sub_lane.sv", "gen_top", "tb_gen.sv"), ("andor.sv", "andor", "tb_andor.sv"),
         ("glitch.sv", "glitch", "tb_glitch.sv"), ("tricky.sv", "tricky", "tb_tricky.sv")]
COMPARED = ("status", "compile_ok", "sim_finished", "timed_out", "sim_time_limited", "sim_time", "metrics",
            "overall_pct", "overall_covered_pct", "passed", "targets", "per_instance", "uncovered", "errors",
            "found_dut_paths", "notes")


def job(rtl, top, tb):
    return {"id": tb, "top": top, "inst": "uut", "tb": (DESIGNS / tb).read_text(),
            "rtl_files": [{"name": rtl, "content": (DESIGNS / rtl).read_text()}],
            "targets": [{"inst_name": "uut", "metric": "overall_average", "target_percentage": 50.0},
                        {"inst_name": "uut", "metric": "toggle", "target_percentage": 40.0}]}


def same(a, b):
    return {k: getattr(a, k) for k in COMPARED} == {k: getattr(b, k) for k in COMPARED}


@pytest.mark.needs_iverilog
@pytest.mark.parametrize("toggle_ints", [False, True])
def test_backends_identical_on_test_designs(toggle_ints):
    if not sim.vpi_module_dir():
        pytest.skip("the VPI toggle module cannot be built here (no iverilog-vpi / C compiler)")
    for rtl, top, tb in CASES:
        results = {b: sim.simulate(job(rtl, top, tb), sim.ScoreConfig(toggle_backend=b, toggle_ints=toggle_ints,
                                                                      toggle_enums=toggle_ints))
                   for b in ("verilog", "vpi")}
        assert results["vpi"].status == sim.OK, (tb, results["vpi"].errors)
        assert results["vpi"].versions["toggle_backend"] == "vpi"
        assert results["verilog"].versions["toggle_backend"] == "verilog"
        assert same(results["verilog"], results["vpi"]), tb


@pytest.mark.needs_iverilog
def test_backends_identical_when_stopped():
    # partial coverage at the simulated-time limit, at the wall-clock timeout and at the output cap
    if not sim.vpi_module_dir():
        pytest.skip("the VPI toggle module cannot be built here (no iverilog-vpi / C compiler)")
    j = job("counter.sv", "counter", "tb_counter.sv")
    j["tb"] = j["tb"].replace("$finish", "$display(\"no finish\")")
    # (a 3 s wall-clock limit: at 1 s a loaded 2-core CI box once stopped the Verilog-monitor run before it wrote
    # any coverage; the comparison is the same at any limit the simulation reaches)
    for cfg in (sim.ScoreConfig(sim_time_limit=200), sim.ScoreConfig(sim_time_limit=0, timeout_s=3)):
        a = sim.simulate(j, sim.ScoreConfig(**{**cfg.__dict__, "toggle_backend": "verilog"}))
        b = sim.simulate(j, sim.ScoreConfig(**{**cfg.__dict__, "toggle_backend": "vpi"}))
        assert a.status == b.status and a.status in (sim.SIM_TIME_LIMIT, sim.TIMEOUT)
        assert a.metrics == b.metrics and a.uncovered == b.uncovered and a.metrics["toggle"]["covered"] > 0
        if a.status == sim.SIM_TIME_LIMIT:
            assert same(a, b)


@pytest.mark.needs_iverilog
def test_auto_falls_back_to_verilog_monitors(monkeypatch):
    monkeypatch.setitem(sim._VPI_STATE, "dir", "")
    monkeypatch.setitem(sim._VPI_STATE, "why", "VPI toggle module unavailable (simulated)")
    assert sim.toggle_backend(sim.ScoreConfig()) == "verilog"
    res = sim.simulate(job("counter.sv", "counter", "tb_counter.sv"))
    assert res.status == sim.OK and res.versions["toggle_backend"] == "verilog"
    assert (res.metrics["toggle"]["covered"], res.metrics["toggle"]["total"]) == (3, 14)
    with pytest.raises(RuntimeError):
        sim.toggle_backend(sim.ScoreConfig(toggle_backend="vpi"))
