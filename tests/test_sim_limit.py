"""The simulated-time limit (ScoreConfig.sim_time_limit, in the testbench's time units): a testbench that
keeps driving the DUT past it stops right there with status sim_time_limit and its coverage kept; one that
ends just inside it, or that simply runs out of events, is ok. (The dev reference testbenches all finish
under the default: tests/test_sim_devset.py.)

Run: python -m pytest -q tests/test_sim_limit.py
"""
import dataclasses
from pathlib import Path

import pytest

import sim

DESIGNS = Path(__file__).resolve().parent / "designs"
COUNTER = [{"name": "counter.sv", "content": (DESIGNS / "counter.sv").read_text()}]
CFG = sim.ScoreConfig(sim_time_limit=1000, timeout_s=20)


def tb(body, timescale="`timescale 1ns/1ps", clock="  always #5 clk = ~clk;\n"):
    return (f"{timescale}\nmodule tb;\n  reg clk = 0, rst_n = 0, load = 0, en = 0, up = 1;\n  reg [3:0] d = 0;\n"
            "  wire [3:0] q; wire wrap;\n"
            "  counter uut (.clk(clk), .rst_n(rst_n), .load(load), .en(en), .up(up), .d(d), .q(q), .wrap(wrap));\n"
            f"{clock}{body}\nendmodule\n")


def run(text, cfg=CFG):
    return sim.simulate({"id": "limit", "rtl_files": COUNTER, "top": "counter", "inst": "uut", "tb": text,
                         "targets": []}, cfg)


@pytest.mark.needs_iverilog
def test_never_finishing_testbench_stops_at_the_limit_with_coverage():
    res = run(tb("  initial begin #12 rst_n = 1; en = 1; end"))        # free-running clock, never $finish
    assert res.status == sim.SIM_TIME_LIMIT and res.sim_time_limited
    assert not res.timed_out and not res.sim_finished and not res.passed and sim.reward(res) == 0
    assert 1000 <= res.sim_time <= 1005          # the first clock edge after the limit ends the run
    assert res.metrics["block"]["covered"] > 0 and res.metrics["toggle"]["total"] == 14
    assert res.metrics["toggle"]["covered"] >= 3    # clk, en, q[0] toggled before the stop
    fb = sim.format_feedback(res)
    assert "sim_time_limit" in fb and "$finish" in fb and "Coverage of uut" in fb


@pytest.mark.needs_iverilog
def test_finishing_just_inside_the_limit_is_ok():
    res = run(tb("  initial begin #12 rst_n = 1; en = 1; #987 $finish; end"))
    assert res.status == sim.OK and res.sim_finished and not res.sim_time_limited
    assert res.sim_time == 999
    res = run(tb("  initial begin #12 rst_n = 1; en = 1; #993 $finish; end"))     # 1005: just outside
    assert res.status == sim.SIM_TIME_LIMIT and 1000 <= res.sim_time <= 1005


@pytest.mark.needs_iverilog
def test_running_out_of_events_is_ok():
    # no clock and no $finish: the simulation ends by itself (the watchdog's own delay is its last event)
    res = run(tb("  initial begin #12 rst_n = 1; en = 1; #30 en = 0; end", clock=""))
    assert res.status == sim.OK and res.sim_finished and not res.sim_time_limited


@pytest.mark.needs_iverilog
def test_limit_counts_in_the_testbench_time_units():
    # 1 us units: $finish at 999 units (999 us) is inside a limit of 1000 units
    res = run(tb("  initial begin #12 rst_n = 1; en = 1; #987 $finish; end", timescale="`timescale 1us/1ns"))
    assert res.status == sim.OK and res.sim_time == 999


@pytest.mark.needs_iverilog
def test_limit_off_and_default():
    res = run(tb("  initial begin #12 rst_n = 1; en = 1; #20 $finish; end"), dataclasses.replace(CFG, sim_time_limit=0))
    assert res.status == sim.OK and res.sim_time is None
    assert sim.ScoreConfig().sim_time_limit == sim.SIM_TIME_LIMIT_DEFAULT > 0
