"""Evaluation protocol: metrics by hand, the memoryless agentic loop through the real scorer with a
scripted policy, compare, generate, and the CLI with the tiny random model.

Run: python -m pytest -q tests/test_evaluate.py
"""
import hashlib
import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import chorus_mini
import common
import evaluate
import onpolicy
import rundir
import sim

CNT = """module cnt(input clk, input rst, input en, output reg [1:0] q);
  always @(posedge clk) begin
    if (rst) q <= 2'd0;
    else if (en) q <= q + 2'd1;
  end
endmodule
"""
MUX = """module mux2(input a, input b, input sel, output y);
  assign y = sel ? b : a;
endmodule
"""


def make_task(tid, top, inst, rtl):
    return {"id": tid, "rtl_files": [{"name": f"{top}.sv", "content": rtl}], "spec_files": [],
            "dut_module_name": top, "dut_instance_name": inst,
            "instruction": f"The top module is '{top}'; name its instance '{inst}'. Stimulus only.",
            "targets": [{"inst_name": inst, "metric": "overall_average", "target_percentage": 90.0}]}


TASKS = [make_task("t_cnt", "cnt", "uut", CNT), make_task("t_mux", "mux2", "dut", MUX)]


def cnt_tb(body):
    return ("module tb;\n  reg clk = 0, rst = 0, en = 0; wire [1:0] q;\n"
            "  cnt uut(.clk(clk), .rst(rst), .en(en), .q(q));\n  always #5 clk = ~clk;\n"
            f"  initial begin\n    {body}\n  end\nendmodule")


def mux_tb(body):
    return ("module tb;\n  reg a = 0, b = 0, sel = 0; wire y;\n  mux2 dut(.a(a), .b(b), .sel(sel), .y(y));\n"
            f"  initial begin\n    {body}\n  end\nendmodule")


# Coverage of each testbench under the scorer (metric_def_version 1): block + toggle for cnt, toggle for mux.
CNT_100 = cnt_tb("#2 rst = 1; #20 rst = 0; en = 1; #100 en = 0; #20 $finish;")   # 100%
CNT_90 = cnt_tb("rst = 1; #20 rst = 0; en = 1; #100 en = 0; #20 $finish;")       # 90%: rst never rises
CNT_47 = cnt_tb("rst = 1; #20 rst = 0; #40 $finish;")                           # 47.5%: en never set
MUX_100 = mux_tb("#1 a = 1; #1 a = 0; #1 sel = 1; #1 b = 1; #1 b = 0; #1 sel = 0; #1 $finish;")
MUX_50 = mux_tb("#1 a = 1; #1 a = 0; #1 $finish;")                              # 50%: b, sel idle
MUX_50B = mux_tb("#2 a = 1; #2 a = 0; #2 $finish;")                             # 50% again, other text
BROKEN = "module tb;\n  reg clk = 0\n  initial $finish;\nendmodule"             # compile error
NO_CODE = "I am not sure how to write this testbench."
TRUNCATED = "filename: tb_x.sv\n```systemverilog\nmodule tb;\n  reg clk = 0;\n  cnt uut(.clk(clk"   # cut off


def answer(code):
    return common.render_answer("tb_x.sv", code)


class ScriptedPolicy:
    """Round-0 answers come from a per-task queue (a retried initial prompt takes the next one);
    refinement answers are looked up by the testbench shown in the state (a list: one per visit).
    Logs every call."""

    def __init__(self, first, refine):
        self.first = {k: list(v) for k, v in first.items()}
        self.refine = refine
        self.calls = []

    def __call__(self, messages_list):
        self.calls.append(messages_list)
        out = []
        for msgs in messages_list:
            tid = "t_cnt" if "module cnt" in msgs[1]["content"] else "t_mux"
            if len(msgs) == 2:
                out.append(self.first[tid].pop(0))
            else:
                reply = self.refine[(tid, common.parse_answer(msgs[2]["content"]).code)]
                out.append(reply.pop(0) if isinstance(reply, list) else reply)
        return out


def scripted():
    first = {"t_cnt": [answer(CNT_100), answer(CNT_47), answer(BROKEN)],
             "t_mux": [answer(MUX_50), NO_CODE, answer(MUX_50), answer(BROKEN)]}
    refine = {("t_cnt", CNT_47): answer(CNT_90),      # improves and passes
              ("t_cnt", CNT_90): answer(CNT_47),      # gets worse: the best stays
              ("t_cnt", BROKEN): [TRUNCATED, answer(CNT_47)],  # unusable ranks below broken; then fixed
              ("t_mux", MUX_50): answer(MUX_50B),     # a tie replaces the best-so-far (>=)
              ("t_mux", MUX_50B): answer(MUX_100),
              ("t_mux", BROKEN): answer(MUX_50)}
    return ScriptedPolicy(first, refine)


# ---------------------------------------------------------------------------------------------------
# metric arithmetic by hand

def test_pass_at_k_and_cov_at_k_by_hand():
    assert evaluate.pass_at_k(5, 0, 1) == 0.0 and evaluate.pass_at_k(5, 5, 1) == 1.0
    assert evaluate.pass_at_k(5, 2, 1) == pytest.approx(0.4)
    assert evaluate.pass_at_k(4, 2, 2) == pytest.approx(1 - 1 / 6)     # 1 - C(2,2)/C(4,2)
    assert evaluate.pass_at_k(5, 1, 5) == 1.0                           # k = n: any pass
    assert evaluate.cov_at_k([0, 47.5, 100], 1) == pytest.approx(147.5 / 3)
    assert evaluate.cov_at_k([0, 47.5, 100], 2) == pytest.approx((47.5 + 2 * 100) / 3)
    assert evaluate.cov_at_k([10, 0, 30], 3) == 30
    a = evaluate.bootstrap_ci([0, 100, 50, 100], seed=3)
    assert a == evaluate.bootstrap_ci([0, 100, 50, 100], seed=3) and 0 <= a[0] <= 62.5 <= a[1] <= 100
    assert evaluate.bootstrap_ci([40, 40], seed=0) == [40.0, 40.0]


def test_summary_lines_round_the_intervals():
    m = {"tasks": 40, "n": 5, "pass@1": 76.0, "pass@5": 85.0, "cov@1": 85.0735085, "cov@5": 93.6, "syn_pass": 89.0,
         "pass@1_ci95": [62.48750000000001, 88.0], "cov@1_ci95": [76.1859645125, 92.7684186875]}
    lines = evaluate.summary_lines({"seed": 42, "direct": m, "agentic": {**m, "pass@1_ci95": None}})
    assert lines[0] == ("direct   40 tasks x 5, seed 42: Pass@1 76.0 [62.5, 88.0]  Pass@5 85.0  "
                        "Cov@1 85.1 [76.2, 92.8]  Cov@5 93.6  SynPass 89.0")
    assert "Pass@1 76.0  Pass@5" in lines[1]            # no interval (one task): nothing printed for it


def test_result_key_orders_parse_compile_run_coverage_pass():
    def r(status, compile_ok=True, pct=None, passed=False):
        return {"status": status, "compile_ok": compile_ok, "overall_pct": pct, "passed": passed}
    ladder = [None, r("compile_error", False), r("timeout", pct=80.0), r("no_coverage"),
              r("ok", pct=50.0), r("ok", pct=89.9), r("ok", pct=90.0, passed=True), r("ok", pct=100.0, passed=True)]
    keys = [evaluate.result_key(x) for x in ladder]
    assert keys == sorted(keys) and len(set(keys)) == len(keys)
    for reason in onpolicy.PARSE_FAILURES:    # a parse failure is the same bottom as "no result"
        assert evaluate.result_key(onpolicy.parse_failure(reason)) == evaluate.result_key(None)
        assert not evaluate.syn_ok(onpolicy.parse_failure(reason))
    assert evaluate.coverage(r("timeout", pct=80.0)) == 0.0             # a failed run counts as 0
    assert [evaluate.syn_ok(x) for x in ladder] == [False, False, False, True, True, True, True, True]


def test_split_is_fixed_by_id():
    tasks = [{"id": f"task_{i}"} for i in range(400)]
    tuning, report = evaluate.split_tasks(tasks)
    assert len(tuning) + len(report) == 400 and 0.22 < len(tuning) / 400 < 0.38
    again, _ = evaluate.split_tasks(list(reversed(tasks)))
    assert {t["id"] for t in again} == {t["id"] for t in tuning}
    assert evaluate.select_tasks(tasks, split="report", limit=3) == report[:3]


def test_compare_oracle_union_and_pairwise(tmp_path):
    def run(name, passes, covs):
        table = {t: {"samples": 2, "passes": p, "pass_rate": 50.0 * p, "cov_mean": c, "cov_max": c, "syn_rate": 100.0}
                 for t, p, c in zip(("a", "b", "c"), passes, covs)}
        d = tmp_path / name
        d.mkdir()
        (d / "metrics.json").write_text(json.dumps({"direct": {"per_task": table}, "agentic": {"per_task": table}}))
        return d
    x = run("expert0", [2, 1, 0], [100.0, 95.0, 60.0])
    y = run("expert1", [0, 2, 1], [50.0, 100.0, 91.0])
    r = evaluate.compare([x, y], tmp_path / "cmp")
    assert r["per_model"]["expert0"]["pass@1"] == pytest.approx(50.0)
    assert r["per_model"]["expert1"]["pass@1"] == pytest.approx(50.0)
    assert r["best_single"] == "expert0"                              # tie on Pass@1, higher Cov@1
    assert r["oracle"]["solved"] == 3 and r["oracle"]["pass@1"] == pytest.approx(100 * (1 + 1 + 0.5) / 3)
    assert r["oracle"]["cov@1"] == pytest.approx((100 + 100 + 91) / 3)
    assert r["solved_by_a_not_b"]["expert0"]["expert1"] == 1 and r["solved_by_a_not_b"]["expert1"]["expert0"] == 1
    assert (tmp_path / "cmp" / "compare.png").stat().st_size > 0
    assert json.loads((tmp_path / "cmp" / "compare.json").read_text())["models"] == ["expert0", "expert1"]


# ---------------------------------------------------------------------------------------------------
# the loop through the real scorer

@pytest.mark.needs_iverilog
def test_scripted_agentic_eval_through_the_scorer(tmp_path):
    policy = scripted()
    samples, metrics = evaluate.run_eval(policy, TASKS, n=3, rounds=2, sim_workers=2, seed=7, batch_size=2)
    by = {(s["task_id"], s["sample"]): s for s in samples}
    cov = {k: [evaluate.coverage(r["result"]) for r in s["rounds"]] for k, s in by.items()}
    assert cov == {("t_cnt", 0): [100.0],                   # 100% at once: stops early
                   ("t_cnt", 1): [47.5, 90.0, 47.5],
                   ("t_cnt", 2): [0.0, 0.0, 47.5],          # broken, truncated (not simulated), fixed
                   ("t_mux", 0): [50.0, 50.0, 100.0],
                   ("t_mux", 1): [0.0, 0.0, 50.0],          # unparsed, broken, fixed
                   ("t_mux", 2): [50.0, 50.0, 100.0]}
    assert by[("t_cnt", 2)]["rounds"][1]["answer"]["reason"] == "truncated"
    assert by[("t_cnt", 2)]["rounds"][1]["result"]["status"] == "truncated" and by[("t_cnt", 2)]["rounds"][0]["result"]["status"] == "compile_error"

    # the state each round showed: best-so-far by >=, an unparsed best restarts from the initial prompt
    states = {k: [r["state_round"] for r in s["rounds"]] for k, s in by.items()}
    assert states == {("t_cnt", 0): [None], ("t_cnt", 1): [None, 0, 1], ("t_cnt", 2): [None, 0, 0],
                      ("t_mux", 0): [None, 0, 1], ("t_mux", 1): [None, None, 1], ("t_mux", 2): [None, 0, 1]}
    assert {k: s["best_by_round"] for k, s in by.items()} == {
        ("t_cnt", 0): [0, 0, 0], ("t_cnt", 1): [0, 1, 1], ("t_cnt", 2): [0, 0, 2],
        ("t_mux", 0): [0, 1, 2], ("t_mux", 1): [0, 1, 2], ("t_mux", 2): [0, 1, 2]}

    # ... and exactly what the policy saw is the memoryless state of that best-so-far
    # (the policy got round 0's active samples in order, then round 1's, ...; 2 per call)
    flat = [m for call in policy.calls for m in call]
    order = [(s["task_id"], s["sample"], r) for r in range(3) for s in samples if len(s["rounds"]) > r]
    assert len(flat) == len(order) == 16 and all(len(c) <= 2 for c in policy.calls)
    seen = dict(zip(order, flat))
    for (tid, k, r), m in seen.items():
        task = TASKS[0] if tid == "t_cnt" else TASKS[1]
        src = by[(tid, k)]["rounds"][r]["state_round"]
        if src is None:
            assert m == common.build_messages(task)
        else:
            prev = by[(tid, k)]["rounds"][src]
            assert m == common.refine_messages(task, prev["text"], sim.SimResult.from_dict(prev["result"]))
    assert seen[("t_cnt", 1, 2)][2]["content"] == answer(CNT_90)      # round 2 refines the round-1 best
    assert "Improve coverage" in seen[("t_cnt", 1, 2)][3]["content"]
    assert "status: compile_error" in seen[("t_cnt", 2, 2)][3]["content"]

    # metrics by hand (percent). direct = round 0; agentic = best over rounds 0..2
    d, a = metrics["direct"], metrics["agentic"]
    assert d["pass@1"] == pytest.approx((100 / 3 + 0) / 2)
    assert d["pass@2"] == pytest.approx(100 * (1 - math.comb(2, 2) / math.comb(3, 2)) / 2)
    assert d["pass@3"] == pytest.approx(50.0)
    assert d["cov@1"] == pytest.approx(((100 + 47.5 + 0) / 3 + (50 + 0 + 50) / 3) / 2)
    assert d["cov@2"] == pytest.approx(((47.5 + 2 * 100) / 3 + (50 + 2 * 50) / 3) / 2)
    assert d["cov@3"] == pytest.approx((100 + 50) / 2)
    assert d["syn_pass"] == pytest.approx(200 / 3)
    assert a["pass@1"] == pytest.approx(200 / 3) and a["pass@2"] == pytest.approx(100.0)
    assert a["pass@3"] == pytest.approx(100.0)
    assert a["cov@1"] == pytest.approx(((100 + 90 + 47.5) / 3 + (100 + 50 + 100) / 3) / 2)
    assert a["cov@3"] == pytest.approx(100.0) and a["syn_pass"] == pytest.approx(100.0)
    assert a["per_task"]["t_cnt"]["passes"] == 2 and a["per_task"]["t_mux"]["cov_max"] == 100.0
    lo, hi = a["pass@1_ci95"]
    assert lo <= a["pass@1"] <= hi and metrics["seed"] == 7
    assert [r["pass@1"] for r in metrics["by_round"]] == pytest.approx([50 / 3, 100 / 3, 200 / 3])

    # outputs
    evaluate.write_eval(tmp_path / "ev", samples, metrics, {"note": "scripted"})
    lines = (tmp_path / "ev" / "samples.jsonl").read_text().splitlines()
    assert len(lines) == 6 and json.loads(lines[1])["rounds"][1]["text"] == answer(CNT_90)
    assert json.loads((tmp_path / "ev" / "metrics.json").read_text())["agentic"]["pass@1"] == pytest.approx(200 / 3)
    assert (tmp_path / "ev" / "done.json").exists()


@pytest.mark.needs_iverilog
def test_validate_reports_the_rl_reward_and_leaves_the_mode(monkeypatch):
    """validate() scores one direct answer per task with the policy built from the model: per sample the RL
    reward 1 + coverage/100 of a testbench that ran (CNT 90 % -> 1.9), 0 for one that did not compile; the
    model's train/eval mode is restored and the policy was built with the seed given."""
    built = []

    def fake_policy(model, tok, **kw):
        built.append(kw)
        return lambda msgs: [answer(CNT_90) if "module cnt" in m[1]["content"] else answer(BROKEN) for m in msgs]
    monkeypatch.setattr(evaluate, "model_policy", fake_policy)
    model = torch.nn.Linear(1, 1)
    model.train()
    out = evaluate.validate(model, None, TASKS, n=1, seed=3, sim_workers=2, target_mode="cvdp")
    assert model.training and built[0]["seed"] == 3
    assert out["val/reward"] == pytest.approx((1.9 + 0.0) / 2)
    assert out["val/reward_se"] == pytest.approx(0.95)       # sd of the task means (1.9, 0) / sqrt(2 tasks)
    assert (out["val/pass@1"], out["val/cov@1"], out["val/syn_pass"], out["val/tasks"]) == (50.0, 45.0, 50.0, 2)
    assert out["val/timeouts"] == out["val/starved_timeouts"] == 0
    both = "\x00".join(answer(CNT_90 if "cnt" in t["id"] else BROKEN) for t in TASKS)   # the answers, in task order
    assert out["val/answers_sha"] == hashlib.sha256(both.encode()).hexdigest()[:16]
    assert evaluate.validate(model, None, TASKS, n=1, seed=3, sim_workers=2, target_mode="cvdp")["val/answers_sha"] \
        == out["val/answers_sha"]


def test_generate_writes_the_best_testbench(tmp_path):
    (tmp_path / "cnt.sv").write_text(CNT)
    task = evaluate.make_task([tmp_path / "cnt.sv"], "cnt", "uut")
    assert task["dut_module_name"] == "cnt" and "cnt" in common.build_messages(task)[1]["content"]
    policy = ScriptedPolicy({"t_cnt": [answer(CNT_47)]}, {("t_cnt", CNT_47): answer(CNT_90),
                                                          ("t_cnt", CNT_90): answer(CNT_100)})
    rep = evaluate.generate_testbench(policy, task, n=1, rounds=3, out_dir=tmp_path / "gen", sim_workers=1)
    assert rep["round"] == 2 and rep["result"]["overall_pct"] == 100.0 and rep["result"]["passed"]
    assert (tmp_path / "gen" / "tb_x.sv").read_text() == CNT_100
    assert "100" in (tmp_path / "gen" / "report.txt").read_text()
    assert len(policy.calls) == 3                                       # stopped at 100%


@pytest.mark.needs_iverilog
def test_cli_eval_with_the_tiny_random_model_scores_zero(tmp_path):
    model, tok = common.tiny_model(seed=0)
    model.save_pretrained(tmp_path / "tiny")
    tok.save_pretrained(tmp_path / "tiny")
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps(t) + "\n" for t in TASKS))
    rc = chorus_mini.main(["eval", "--model", str(tmp_path / "tiny"), "--tasks", str(tasks), "--out",
                           str(tmp_path / "ev"), "--n", "2", "--rounds", "1", "--max-new-tokens", "24",
                           "--sim-workers", "1", "--seed", "3"])
    assert rc == 0
    m = json.loads((tmp_path / "ev" / "metrics.json").read_text())
    for mode in ("direct", "agentic"):
        assert m[mode]["pass@1"] == 0 and m[mode]["cov@1"] == 0 and m[mode]["tasks"] == 2
    assert m["seed"] == 3 and m["config"]["n"] == 2
    samples = [json.loads(l) for l in (tmp_path / "ev" / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 4 and all(len(s["rounds"]) == 2 for s in samples)
    assert (tmp_path / "ev" / "done.json").exists()
    shutil.copytree(tmp_path / "ev", tmp_path / "ev_copy")
    assert chorus_mini.main(["compare", str(tmp_path / "ev"), str(tmp_path / "ev_copy"), "--out", str(tmp_path / "cmp")]) == 0
    assert json.loads((tmp_path / "cmp" / "compare.json").read_text())["oracle"]["solved"] == 0


# ---------------------------------------------------------------------------------------------------
# the command line: --help, and bad input in one line

ROOT = Path(__file__).resolve().parents[1]


def test_evaluate_help_lists_its_subcommands():
    p = subprocess.run([sys.executable, "evaluate.py", "--help"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and "usage: evaluate.py" in p.stdout and "{eval,compare,claims,generate}" in p.stdout


def test_a_malformed_task_file_ends_in_one_line_naming_file_and_line(tmp_path, capsys):
    bad = tmp_path / "BAD.jsonl"
    bad.write_text(json.dumps(TASKS[0]) + "\n{not json\n")
    p = subprocess.run([sys.executable, "chorus_mini.py", "eval", "--tasks", str(bad), "--out", str(tmp_path / "o")],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 1 and "Traceback" not in p.stderr
    assert p.stderr.strip().splitlines() == [p.stderr.strip()] and f"{bad}:2: " in p.stderr
    assert p.stderr.startswith("chorus_mini.py: error: ")
    # the same boundary in-process, for evaluate.py and a missing file
    code = rundir.cli("evaluate.py", evaluate.main, ["eval", "--tasks", str(tmp_path / "none.jsonl"), "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert code == 1 and err.startswith("evaluate.py: error: ") and "none.jsonl" in err and len(err.splitlines()) == 1


def test_a_prompt_past_the_context_is_a_status_of_its_own():
    """A task whose prompt does not fit the model's context is never generated: its samples score
    `prompt_too_long` (reward 0, a failure group of its own), the other task runs as usual."""
    import harness
    model, tok = common.tiny_model(0)
    model.config.max_position_embeddings = 2048         # the short prompt: ~1.3k tokens, the long one ~2.9k
    real = evaluate.model_policy(model, tok, max_new_tokens=8, temperature=0, batch_size=8)
    asked = []

    def counting(msgs):
        asked.append(len(msgs))
        return real(msgs)
    counting.prompt_fits = real.prompt_fits
    long = dict(TASKS[0], id="t_long", instruction=TASKS[0]["instruction"] + " and so on" * 200)
    tasks = [TASKS[0], long]
    assert real.prompt_fits(harness.first_messages(tasks[0], "testbench"))
    assert not real.prompt_fits(harness.first_messages(long, "testbench"))
    samples, metrics = evaluate.run_eval(counting, tasks, n=2, rounds=0, sim_workers=1, n_boot=0, verbose=False)
    status = {(s["task_id"], s["sample"]): s["best"]["status"] for s in samples}
    assert status[("t_long", 0)] == status[("t_long", 1)] == "prompt_too_long"
    assert status[("t_cnt", 0)] != "prompt_too_long" and asked == [2]
    assert metrics["direct"]["failures"]["prompt_too_long"] == 2
    assert onpolicy.result_reward(samples[2]["best"]) == 0.0


def test_hole_fixes_counts_refinements_that_cover_what_their_state_left():
    """Round 1 refines round 0 (holes a, b): it covers a (one of two). Round 2 refines round 1 (hole b) and does
    not run. Round 3 refines round 0 again and covers nothing. A state that did not run gives no step."""
    hole = lambda *keys: [{"metric": "block", "instance": "uut", "key": k} for k in keys]
    ok = lambda *keys: {"status": "ok", "overall_pct": 50.0, "uncovered": hole(*keys)}
    fail = {"status": "compile_error", "overall_pct": None, "uncovered": []}
    sample = {"rounds": [{"round": 0, "state_round": None, "result": ok("a", "b")},
                         {"round": 1, "state_round": 0, "result": ok("b", "c")},
                         {"round": 2, "state_round": 1, "result": fail},
                         {"round": 3, "state_round": 0, "result": ok("a", "b")}]}
    broken = {"rounds": [{"round": 0, "state_round": None, "result": fail},
                         {"round": 1, "state_round": 0, "result": ok("a")}]}
    h = evaluate.hole_fixes([sample, broken])
    assert h["steps"] == 3 and h["worse"] == pytest.approx(100 / 3)
    assert h["fixed_any"] == pytest.approx(100 / 3)                  # only round 1 covered a hole
    assert h["fixed_share"] == pytest.approx(100 * (0.5 + 0 + 0) / 3)
    assert evaluate.hole_fixes([broken]) == {"steps": 0, "fixed_any": 0.0, "fixed_share": 0.0, "worse": 0.0}
