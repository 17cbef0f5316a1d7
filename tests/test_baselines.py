"""The baselines with no model weights (random, teacher:LEVEL) through evaluate.py's eval, and the random floor
(data/floor.py) on two tiny designs: one random stimulus passes, one it cannot (a 3-byte code lock).

Run: python -m pytest -q tests/test_baselines.py
"""
import json

import pytest

import evaluate
import harness
import sim
from data import floor

MUX = "module mux2(input a, input b, input sel, output y);\n  assign y = sel ? b : a;\nendmodule\n"
# opens only after the bytes 5a, c3, 0f arrive in a row on valid cycles: random input hits that once in 2^24
LOCK = """module lock3(input clk, input rst, input valid, input [7:0] d, output reg open);
  reg [1:0] st;
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
LOCK_OPEN = "valid = 1; d = 8'h5a; step(1); d = 8'hc3; step(1); d = 8'h0f; step(2); reset_dut();"


def make_task(tid, top, rtl, target=90.0):
    return {"id": tid, "rtl_files": [{"name": f"{top}.sv", "content": rtl}], "spec_files": [],
            "dut_module_name": top, "dut_instance_name": "uut", "instruction": f"Drive {top} as 'uut'.",
            "targets": [{"inst_name": "uut", "metric": "overall_average", "target_percentage": target}]}


TASKS = [make_task("t_mux", "mux2", MUX), make_task("t_lock", "lock3", LOCK)]


def write_tasks(path, tasks):
    path.write_text("".join(json.dumps(t) + "\n" for t in tasks))
    return str(path)


# ----------------------------------------------------------------------------------------------
# the stimulus and the policy (no simulator)

def test_random_stimulus_is_the_loop_within_the_watchdog():
    body = floor.random_stimulus(20_000, 1000, seed=7)
    assert "repeat (20) begin" in body and "repeat (1000) begin random_inputs(); step(1); end" in body
    assert "tb_seed = 7;" in body and harness.check_stimulus(body) is None
    assert floor.loop_shape(5000, None) == (1, 5000)          # no period: one reset, at the start
    assert floor.loop_shape(1000, 100) == (10, 100)
    with pytest.raises(ValueError, match="watchdog"):
        floor.loop_shape(harness.MAX_CYCLES, None)


def test_random_policy_seeds_per_sample_and_ignores_feedback():
    msgs = harness.first_messages(TASKS[1], "stimulus")
    policy = floor.random_policy(1000, None, seed=3)
    a, b = policy([msgs, msgs])
    assert a != b                                             # two samples of one task: two seeds
    again = floor.random_policy(1000, None, seed=3)([msgs])[0]
    assert again == a                                         # a run repeats exactly
    state = msgs + [{"role": "assistant", "content": a}, {"role": "user", "content": "coverage 40%"}]
    assert policy([state]) == [a]                             # feedback changes nothing
    tb_msgs = harness.first_messages(TASKS[1], "testbench")
    assert policy([tb_msgs]) == [floor.NOT_STIMULUS]          # no harness, no random answer


def test_baseline_names():
    assert evaluate.is_baseline("random") and evaluate.is_baseline("teacher:long")
    assert not evaluate.is_baseline(None) and not evaluate.is_baseline("HuggingFaceTB/SmolLM2-135M-Instruct")
    with pytest.raises(SystemExit, match="unknown teacher level"):
        evaluate.baseline_policy("teacher:huge", TASKS)


# ----------------------------------------------------------------------------------------------
# through the scorer

@pytest.mark.needs_iverilog
def test_random_through_eval(tmp_path):
    tasks = write_tasks(tmp_path / "tasks.jsonl", TASKS)
    assert evaluate.main(["eval", "--model", "random", "--tasks", tasks, "--out", str(tmp_path / "random"),
                          "--n", "2", "--rounds", "2", "--random-cycles", "1000", "--random-reset-period", "0",
                          "--sim-workers", "2"]) == 0
    m = json.loads((tmp_path / "random" / "metrics.json").read_text())
    assert m["answer_mode"] == "stimulus" and m["rounds"] == 2 and m["rounds_run"] == 0
    assert m["agentic"] == m["direct"]
    per = m["direct"]["per_task"]
    assert per["t_mux"]["pass_rate"] == 100.0 and per["t_mux"]["cov_mean"] == 100.0
    assert per["t_lock"]["pass_rate"] == 0.0 and per["t_lock"]["cov_mean"] < 90.0
    assert json.loads((tmp_path / "random" / "result.json").read_text())["config"]["model"] == "random"


@pytest.mark.needs_iverilog
def test_teacher_baseline_refines_through_eval(tmp_path):
    """teacher:minimal's first stimulus leaves the mux's inputs at 0; its refinement (from the scorer's
    uncovered items, scored again inside the policy) drives them: round 1 beats round 0."""
    tasks = write_tasks(tmp_path / "tasks.jsonl", TASKS[:1])
    assert evaluate.main(["eval", "--model", "teacher:minimal", "--tasks", tasks, "--out", str(tmp_path / "t"),
                          "--n", "1", "--rounds", "1", "--answer-mode", "stimulus", "--sim-workers", "1"]) == 0
    m = json.loads((tmp_path / "t" / "metrics.json").read_text())
    assert m["by_round"][0]["cov@1"] < m["by_round"][1]["cov@1"] == 100.0


# ----------------------------------------------------------------------------------------------
# the floor

@pytest.mark.needs_iverilog
def test_floor_on_a_design_random_passes_and_one_it_cannot(tmp_path, monkeypatch):
    budgets = ((100, None), (1000, 100))
    got = floor.calibrate_floor(TASKS, budgets, seeds=1, workers=2, progress=False)
    mux, lock = got[floor.task_key(TASKS[0])], got[floor.task_key(TASKS[1])]
    assert mux["random_pass"] == 1.0 and mux["random_cov"] == 100.0 and mux["random_cycles"] == 100
    assert lock["random_pass"] == 0.0 and 0 < lock["random_cov"] < 90.0
    assert [b["cycles"] for b in lock["budgets"]] == [100, 1000]
    # a constructed stimulus opens the lock: coverage is reachable, random just does not reach it
    h = harness.task_harness(TASKS[1])
    body = floor.random_stimulus(1000, 100, 0) + LOCK_OPEN
    known = sim.simulate(sim.job_from_task(TASKS[1], harness.assemble(h, body)[0]))
    assert known.overall_pct > lock["random_cov"] + 5
    # cached: same key and signature, nothing simulated again; other targets: computed again
    floor.save_floor(tmp_path / "floor.json", got)
    cache = floor.load_floor(tmp_path / "floor.json")
    monkeypatch.setattr(floor.simpool, "SimPool", None)
    assert floor.calibrate_floor(TASKS, budgets, cache=cache, progress=False) == got
    with pytest.raises(TypeError):
        floor.calibrate_floor([make_task("t_mux", "mux2", MUX, target=99.0)], budgets, cache=cache, progress=False)
    assert floor.floor_of(TASKS[1], cache)["random_cov"] == lock["random_cov"]
    assert floor.floor_of(make_task("t_lock", "lock3", LOCK.replace("5a", "5b")), cache) is None   # RTL changed


class _StarvingPool:
    """A SimPool whose first run comes back as a timeout the busy machine starved of CPU; the rest run for real."""
    def __init__(self, *a, **kw):
        self.n = 0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def submit(self, job):
        import concurrent.futures
        f = concurrent.futures.Future()
        self.n += 1
        f.set_result(sim.SimResult(id=job.get("id", ""), status=sim.TIMEOUT, timed_out=True,
                                   timings={"sim_cpu": 0.2, "sim_limit": 20.0}) if self.n == 1 else sim.simulate(job))
        return f


@pytest.mark.needs_iverilog
def test_floor_runs_a_starved_timeout_again(monkeypatch):
    """A wall-clock timeout that got little CPU (a loaded machine) is simulated once more: the floor is the quiet
    machine's, not 0 coverage for that run."""
    monkeypatch.setattr(floor.simpool, "SimPool", _StarvingPool)
    got = floor.calibrate_floor(TASKS[:1], ((100, None),), seeds=2, progress=False)[floor.task_key(TASKS[0])]
    assert [r["status"] for r in got["runs"]] == [sim.OK, sim.OK]
    assert got["random_pass"] == 1.0 and got["random_cov"] == 100.0


@pytest.mark.needs_iverilog
def test_floor_cli(tmp_path, capsys):
    tasks = write_tasks(tmp_path / "tasks.jsonl", TASKS[:1])
    out = tmp_path / "floor.json"
    assert floor.main([tasks, "--out", str(out), "--budgets", "100", "--workers", "1"]) == 0
    rec = floor.load_floor(out)[floor.task_key(TASKS[0])]
    assert rec["random_cov"] == 100.0 and rec["signature"]["budgets"] == [[100, None]]
    assert "random fails 0" in capsys.readouterr().out


# ----------------------------------------------------------------------------------------------
# metrics over the floor

def test_floor_metrics_by_hand():
    row = lambda p, c, rc, skill: {"samples": 2, "pass_rate": p, "cov_mean": c, "random_cov": rc, "skill": skill}
    table = {"a": row(100.0, 100.0, 80.0, False), "b": row(0.0, 50.0, 60.0, True), "c": row(50.0, 70.0, 40.0, True),
             "d": row(0.0, 10.0, None, False)}                       # d has no floor: left out
    m = evaluate.floor_metrics(table, n_boot=0)
    assert m["floor_tasks"] == 3 and m["cov_gain"] == pytest.approx(50 / 3)     # (20 + 0 + 30) / 3
    assert m["beats_random"] == pytest.approx(200 / 3) and m["random_cov"] == 60.0
    assert m["skill"] == {"tasks": 2, "pass@1": 25.0, "cov@1": 60.0, "cov_gain": 15.0}
    assert evaluate.floor_metrics({"d": table["d"]}) == {}


def test_skill_subset_is_the_labelled_tasks_else_where_random_fails():
    floors = {"a": {"random_pass": 0.0, "random_cov": 50.0}, "b": {"random_pass": 1.0, "random_cov": 99.0}}
    assert evaluate.skill_ids([{"id": "a"}, {"id": "b"}], floors) == {"a"}
    assert evaluate.skill_ids([{"id": "a"}, {"id": "b", "skill": {"source": "family"}}], floors) == {"b"}


@pytest.mark.needs_iverilog
def test_eval_with_a_floor_reports_gain_and_the_skill_subset(tmp_path):
    floor.save_floor(tmp_path / "floor.json", floor.calibrate_floor(TASKS, ((100, None),), progress=False))
    tasks = write_tasks(tmp_path / "tasks.jsonl", TASKS)
    assert evaluate.main(["eval", "--model", "random", "--tasks", tasks, "--out", str(tmp_path / "random"), "--n", "1",
                          "--mode", "direct", "--random-cycles", "100", "--random-reset-period", "0",
                          "--floor", str(tmp_path / "floor.json"), "--sim-workers", "1"]) == 0
    m = json.loads((tmp_path / "random" / "metrics.json").read_text())
    d = m["direct"]
    assert m["skill_ids"] == ["t_lock"] and d["floor_tasks"] == 2 and d["skill"]["tasks"] == 1
    assert d["skill"]["pass@1"] == 0.0 and d["per_task"]["t_mux"]["random_cov"] == 100.0
    assert d["cov_gain"] >= 0.0 and d["per_task"]["t_lock"]["skill"] is True
    c = evaluate.compare([tmp_path / "random", tmp_path / "random"])
    assert c["per_model"][c["models"][0]]["skill"]["tasks"] == 1
