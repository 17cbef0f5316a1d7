"""The exclusion rule of the skill split (data/skill.py): items no known stimulus covers leave a task's
coverage, and the scorer drops exactly the listed items (sim.job_from_task -> job["exclude"]).

Fixtures: a register with zero-extended (constant) bits, an expression whose all-true row is unsatisfiable
(x > 10 && x < 3), and a code lock with a tied output bit (kept in the split, its tied bits excluded).
Random budgets are cut to two to keep it fast.

Run: python -m pytest -q tests/test_exclusion.py
"""
import pytest

import harness
import sim
from data import floor, skill
from test_baselines import LOCK_OPEN, make_task

BUDGETS = ((100, None), (1000, 100))
ZEXT = """module zext(input clk, input rst, input [3:0] a, output reg [7:0] y);
  always @(posedge clk) if (rst) y <= 8'd0; else y <= {4'b0000, a};
endmodule
"""
IMPOSSIBLE = """module imp(input clk, input rst, input [3:0] x, output reg f);
  always @(posedge clk) if (rst) f <= 1'b0; else f <= (x > 4'd10) && (x < 4'd3);
endmodule
"""
# lock3 with a status output whose two high bits are tied to 0
LOCK_TIED = """module lock3t(input clk, input rst, input valid, input [7:0] d, output reg open, output [3:0] stat);
  reg [1:0] st;
  assign stat = {2'b00, st};
  always @(posedge clk) begin
    if (rst) begin st <= 2'd0; open <= 1'b0; end
    else if (valid) begin
      if (st == 2'd0) st <= (d == 8'h5a) ? 2'd1 : 2'd0;
      else if (st == 2'd1) st <= (d == 8'hc3) ? 2'd2 : 2'd0;
      else if (st == 2'd2) begin
        if (d == 8'h0f) open <= 1'b1;
        st <= 2'd0;
      end
    end
  end
endmodule
"""


def excluded_of(task):
    f = floor.calibrate_floor([task], BUDGETS, 2, workers=2, progress=False)[floor.task_key(task)]
    runs = skill.known_runs([task], workers=2)[task["id"]]
    return f, runs, skill.exclusion(f, runs)


def test_item_keys_are_stable_names():
    assert sim.item_key("toggle", "uut", signal="y", bit=5) == "toggle:uut:y:5"
    assert sim.item_key("block", "uut.u_a", 0, 3) == "block:uut.u_a:0:3"
    assert sim.overall_from_counts({"block": [3, 4], "toggle": [6, 8], "branch": [0, 9]}) == 75.0
    assert sim.overall_from_counts({"block": [3, 4], "toggle": [6, 8]}, dropped={"toggle": 2}) == 87.5


@pytest.mark.needs_iverilog
def test_constant_bits_are_excluded_and_nothing_else():
    task = make_task("t_zext", "zext", ZEXT)
    f, runs, ex = excluded_of(task)
    assert {k for k in ex if k.startswith("toggle:uut:y:")} == {f"toggle:uut:y:{b}" for b in (4, 5, 6, 7)}
    assert all(v["metric"] == "toggle" for v in ex.values())            # every block and the low bits are hit
    tb = harness.assemble(harness.task_harness(task), floor.random_stimulus(1000, 100, 0))[0]
    plain = sim.simulate(sim.job_from_task(task, tb))
    rows = [{"key": k, **v} for k, v in ex.items()]
    scored = sim.simulate(sim.job_from_task({**task, "exclusions": {"items": rows}}, tb))
    assert plain.metrics["toggle"]["pct"] < 100 and scored.metrics["toggle"]["pct"] == 100.0
    assert scored.metrics["toggle"]["excluded"] == len(ex) and scored.overall_pct > plain.overall_pct
    assert not any(u["metric"] == "toggle" and u["signal"] == "y" for u in scored.uncovered)
    rbest, _, reach, _ = skill.rescored(f, runs, ex)                    # the rescoring agrees with the scorer
    assert rbest == pytest.approx(100.0) and reach == pytest.approx(100.0)


@pytest.mark.needs_iverilog
def test_an_unsatisfiable_expression_row_is_excluded():
    task = make_task("t_imp", "imp", IMPOSSIBLE)
    f, runs, ex = excluded_of(task)
    rows = [v for v in ex.values() if v["metric"] == "expression"]
    assert len(rows) == 1 and rows[0]["line"] == 2
    tb = harness.assemble(harness.task_harness(task), floor.random_stimulus(1000, 100, 0))[0]
    scored = sim.simulate(sim.job_from_task({**task, "exclusions": {"items": [{"key": k} for k in ex]}}, tb))
    assert scored.metrics["expression"]["pct"] == 100.0 and scored.metrics["expression"]["excluded"] == 1


@pytest.mark.needs_iverilog
def test_a_kept_task_carries_its_exclusions_and_the_scorer_agrees():
    lock = {**make_task("t_lockt", "lock3t", LOCK_TIED), "_source": "dev",
            "known_stimulus": floor.random_stimulus(1000, 100, 0) + LOCK_OPEN}
    kept, train, report = skill.build_skill_split([lock], workers=2, budgets=BUDGETS, seeds=2)
    assert report["reasons"] == {"t_lockt": "kept"} and train == []
    row = kept[0]
    keys = {x["key"] for x in row["exclusions"]["items"]}
    assert {"toggle:uut:stat:2", "toggle:uut:stat:3"} <= keys and row["skill"]["excluded_items"] == len(keys)
    assert report["excluded"]["items"] == len(keys) and row["skill"]["raw"]["reachable"] < row["skill"]["reachable"]
    tb = harness.assemble(harness.task_harness(row), row["known_stimulus"])[0]
    r = sim.simulate(sim.job_from_task(row, tb, target_mode="icarus"))
    assert r.passed and r.overall_pct == pytest.approx(row["skill"]["reachable"], abs=0.01)
    tb = harness.assemble(harness.task_harness(row), floor.random_stimulus(1000, 100, 0))[0]
    r = sim.simulate(sim.job_from_task(row, tb, target_mode="icarus"))
    assert not r.passed and r.overall_pct <= row["skill"]["random_best"] + 1e-6


def test_pool_designs_split_by_group():
    a = {"id": "x#m1", "provenance": {"repo": "o/r", "path": "proj/src/a.v"}}
    b = {"id": "x#m2", "provenance": {"repo": "o/r", "path": "proj/src/b.v"}}
    assert skill.split_group(a) == skill.split_group(b) == "o/r/proj"
    assert skill.in_heldout(a, 1.0) and not skill.in_heldout(a, 0.0) and skill.in_heldout(a, 0.5) == skill.in_heldout(b, 0.5)
    groups = [{"id": f"g{i}", "provenance": {"repo": f"o/r{i}", "path": "p"}} for i in range(400)]
    assert 0.6 < sum(skill.in_heldout(g, 0.7) for g in groups) / 400 < 0.8
