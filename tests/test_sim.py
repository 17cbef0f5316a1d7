"""Known-answer tests for sim.py on the small designs in tests/designs/ (hand-derived counts), plus the
pure build layer, task loading, targets, feedback and the CLI.

Run: python -m pytest -q tests/test_sim.py
"""
import json
import subprocess
import sys
from pathlib import Path

import pytest

import sim
import simpool

DESIGNS = Path(__file__).resolve().parent / "designs"
ROOT = Path(__file__).resolve().parents[1]


def job(rtl, top, tb, inst="uut", targets=()):
    rtl = [rtl] if isinstance(rtl, str) else rtl
    return {"id": tb, "top": top, "inst": inst, "tb": (DESIGNS / tb).read_text(),
            "rtl_files": [{"name": r, "content": (DESIGNS / r).read_text()} for r in rtl], "targets": list(targets)}


def counts(res):
    return {m: (v["covered"], v["total"]) for m, v in res.metrics.items() if v["total"]}


# ----------------------------------------------------------------------------------------------- known answers

@pytest.mark.needs_iverilog
def test_counter_known_answer():
    # Blocks (8): always_ff body; if(!rst_n) then / else; if(load) then / else; if(en) then; if(up) then / else.
    #   tb never loads and never counts down -> `q <= d` and `q <= q - 1` missed: 6/8.
    # Branch (8): T/F of the 4 ifs (if(en) has an implicit else, hit while en=0) -> the same two missed: 6/8.
    # Toggle (14 bits: clk, rst_n, load, en, up, d[3:0], q[3:0], wrap): clk, en and q[0] (0-1-2-3) toggle both
    #   ways; rst_n only rises, q[1] only rises, the rest never move: 3/14.
    # Overall = mean(75, 21.43) = 48.21 (no expression or FSM items: those metrics drop out).
    res = sim.simulate(job("counter.sv", "counter", "tb_counter.sv"))
    assert res.status == sim.OK, res.errors
    assert counts(res) == {"block": (6, 8), "branch": (6, 8), "toggle": (3, 14)}
    assert res.overall_pct == pytest.approx((75 + 300 / 14) / 2, abs=1e-3)
    assert res.overall_covered_pct == pytest.approx(100 * 9 / 22, abs=1e-3)
    assert res.sim_finished and res.compile_ok and not res.timed_out
    missed = {(u["kind"], u["line"]) for u in res.uncovered if u["metric"] == "block"}
    assert missed == {("if_true", 15), ("if_false", 18)}        # original file lines, not instrumented ones
    q = [u for u in res.uncovered if u["metric"] == "toggle" and u["signal"] == "q"]
    assert {(tuple(u["bits"]), u["missing"]) for u in q} == {((2, 3), "both"), ((1,), "1->0")}
    assert sim.reward(res) == pytest.approx(1 + res.overall_pct / 100)
    # assign_blocks: the one continuous assign becomes an (always covered) block
    res = sim.simulate(job("counter.sv", "counter", "tb_counter.sv"), sim.ScoreConfig(assign_blocks=True))
    assert counts(res)["block"] == (7, 9)


@pytest.mark.needs_iverilog
def test_fsm_known_answer():
    # Blocks (10): always_ff body, reset then/else; always_comb body; case items IDLE, RUN, DONE, ERR, default;
    #   the `next = RUN` arm. ERR is never reached: 9/10. (`default: ;` is hit at time 0: always_comb runs once
    #   while state is still X, which matches no label.)
    # Branch (11): reset T/F, 5 case items, if(start && din) T + implicit F, ternary din?DONE:ERR T/F.
    #   Missed: ERR item, ternary false arm: 9/11.
    # Expression (3 rows of `start && din`): all-1 hit, start=0/din=1 hit (back in IDLE), din=0/start=1 never: 2/3.
    # Toggle (9 bits: clk, rst_n, start, din, busy, state[1:0], next[1:0]): rst_n only rises: 8/9.
    # FSM (4 states + 5 transitions IDLE->RUN, RUN->DONE, RUN->ERR, DONE->IDLE, ERR->IDLE): ERR, RUN->ERR and
    #   ERR->IDLE missed: 6/9.  Overall = mean(90, 66.67, 88.89, 66.67) = 78.06.
    res = sim.simulate(job("fsm.sv", "fsm", "tb_fsm.sv"))
    assert res.status == sim.OK, res.errors
    assert counts(res) == {"block": (9, 10), "branch": (9, 11), "expression": (2, 3), "toggle": (8, 9), "fsm": (6, 9)}
    assert res.overall_pct == pytest.approx((90 + 200 / 3 + 800 / 9 + 200 / 3) / 4, abs=1e-3)
    fsm_missed = {(u["kind"], u.get("state"), u.get("from_state"), u.get("to_state"))
                  for u in res.uncovered if u["metric"] == "fsm"}
    assert fsm_missed == {("state", "ERR", None, None), ("transition", None, "RUN", "ERR"),
                          ("transition", None, "ERR", "IDLE")}
    expr = [u for u in res.uncovered if u["metric"] == "expression"]
    assert len(expr) == 1 and expr[0]["expr"] == "start && din" and expr[0]["line"] == 19
    # strict profile adds branch to the average
    strict = sim.simulate(job("fsm.sv", "fsm", "tb_fsm.sv"), sim.ScoreConfig(profile="strict"))
    assert strict.overall_pct == pytest.approx((90 + 900 / 11 + 200 / 3 + 800 / 9 + 200 / 3) / 5, abs=1e-3)


@pytest.mark.needs_iverilog
def test_alu_known_answer():
    # Blocks (9): always_comb body; items 2'd0, 2'd1, 2'd2 (begin), if(a>b) then, if(sat) then/else, a>b else,
    #   default. op stays 0 then 2 -> 2'd1, default and `else y = b` missed: 6/9.
    # Branch (14): 4 case items, 2 ifs x 2, ternaries sat?..:.., sum[4]?..:.. and z's (y==0)?..:.. x 2 each.
    #   Missed: 2'd1, default, else-of-sat, sum[4] true arm: 10/14.
    # Toggle (21 bits: op 2, a 4, b 4, sat, y 4, z, sum 5): a[1], y[2:0], z and sum[2] toggle both ways: 6/21.
    res = sim.simulate(job("alu.sv", "alu", "tb_alu.sv"))
    assert res.status == sim.OK, res.errors
    assert counts(res) == {"block": (6, 9), "branch": (10, 14), "toggle": (6, 21)}
    tern = [u for u in res.uncovered if u["kind"].startswith("ternary")]
    assert [(u["kind"], u["line"]) for u in tern] == [("ternary_true", 13)]


@pytest.mark.needs_iverilog
def test_generate_known_answer():
    # 3 lane instances under a generate loop; only lane 0 is ever enabled.
    # Blocks: per lane the always_ff body (`if (en) ...`) and its then-arm -> 6; lanes 1, 2 miss the then: 4/6.
    # Branch: per lane if T + implicit F -> 6, same misses: 4/6.
    # Toggle 36 bits: gen_top clk, en[2:0], d[1:0], q[5:0] (12); g_lane[i].lq (3 x 2); lane clk, en, d, q (3 x 6).
    #   Covered: top clk, en[0], d[1:0], q[1:0] (6); g_lane[0].lq (2); lane0 all 6; lanes 1, 2 clk + d (3 + 3): 20.
    res = sim.simulate(job("sub_lane.sv", "gen_top", "tb_gen.sv"))
    assert res.status == sim.OK, res.errors
    assert counts(res) == {"block": (4, 6), "branch": (4, 6), "toggle": (20, 36)}
    assert set(res.per_instance) == {"uut", "uut.g_lane[0].u_lane", "uut.g_lane[1].u_lane", "uut.g_lane[2].u_lane"}
    lane1 = res.per_instance["uut.g_lane[1].u_lane"]
    assert (lane1["block"]["covered"], lane1["block"]["total"]) == (1, 2)
    assert (lane1["toggle"]["covered"], lane1["toggle"]["total"]) == (3, 6)
    # a target on a sub-instance, by its instance name
    t = [{"inst_name": "uut", "metric": "overall_average", "target_percentage": 60},
         {"inst_name": "u_lane", "metric": "block", "target_percentage": 100}]
    res = sim.simulate(job("sub_lane.sv", "gen_top", "tb_gen.sv", targets=t))
    assert [x["met"] for x in res.targets] == [True, True]     # u_lane = first match = g_lane[0].u_lane
    assert res.passed


@pytest.mark.needs_iverilog
def test_and_or_known_answer():
    # Inputs over time (a b c d): 0000, 1110, 1010, 0011.
    # `a && b && c` (4 rows): all-1 (1110), b=0 (1010) hit; a=0 and c=0 rows never: 2/4.
    # `(a || d) && c` (3 rows): all-1 hit; (a||d)=0 with c=1 and c=0 with (a||d)=1 never: 1/3.
    # nested `a || d` (3 rows): all-0 (0000 at time 0), a=1 (1110), d=1 (0011): 3/3.  Expression 6/10.
    # Blocks: always_comb body, then, else: 3/3; branch 2/2. Toggle: a, b, x toggle both ways; c, d, y only rise: 3/6.
    res = sim.simulate(job("andor.sv", "andor", "tb_andor.sv"))
    assert res.status == sim.OK, res.errors
    assert counts(res) == {"block": (3, 3), "branch": (2, 2), "expression": (6, 10), "toggle": (3, 6)}
    assert res.overall_pct == pytest.approx(70.0)
    rows = {(u["expr"], u["row"]) for u in res.uncovered if u["metric"] == "expression"}
    assert rows == {("a && b && c", "a=0 while others 1"), ("a && b && c", "c=0 while others 1"),
                    ("(a || d) && c", "(a || d)=0 while others 1"), ("(a || d) && c", "c=0 while others 1")}


@pytest.mark.needs_iverilog
def test_instance_named_wrongly_is_no_dut_instance():
    j = job("counter.sv", "counter", "tb_counter.sv")
    j["tb"] = j["tb"].replace("uut (", "dut (")
    res = sim.simulate(j)
    assert res.status == sim.NO_DUT_INSTANCE and res.overall_pct is None and sim.reward(res) == 0
    assert res.found_dut_paths == ["tb.dut"] and "tb.dut" in res.errors[0]["msg"]


@pytest.mark.needs_iverilog
def test_compile_error_maps_to_tb_line():
    j = job("counter.sv", "counter", "tb_counter.sv")
    j["tb"] = j["tb"].replace("en = 0;", "en = 0 +;")
    res = sim.simulate(j)
    assert res.status == sim.COMPILE_ERROR and not res.compile_ok
    assert any(e["file"] == "tb.sv" and e["line"] == 13 for e in res.errors), res.errors
    fb = sim.format_feedback(res)
    assert "Compilation failed" in fb and "tb.sv:13" in fb


@pytest.mark.needs_iverilog
def test_unsupported_construct_is_explained():
    j = job("counter.sv", "counter", "tb_counter.sv")
    j["tb"] = j["tb"].replace("initial begin", "covergroup cg @(posedge clk); coverpoint q; endgroup\n  initial begin", 1)
    res = sim.simulate(j)
    assert res.status == sim.COMPILE_ERROR
    assert "covergroup" in res.errors[0]["msg"] and res.errors[0]["source"] == "prescan"


@pytest.mark.needs_iverilog
def test_targets_and_passed():
    t = [{"inst_name": "uut", "metric": "overall_average", "target_percentage": 48.0},
         {"inst_name": "uut", "metric": "icarus_toggle", "target_percentage": 50.0},
         {"inst_name": "uut", "metric": "fsm", "target_percentage": 90.0}]       # no FSM items -> skipped
    res = sim.simulate(job("counter.sv", "counter", "tb_counter.sv", targets=t))
    assert [(x["met"], x["applies"]) for x in res.targets] == [(True, True), (False, True), (True, False)]
    assert res.status == sim.OK and not res.passed
    assert "NOT met" in sim.format_feedback(res)


@pytest.mark.needs_iverilog
def test_result_roundtrip_and_feedback_bound():
    res = sim.simulate(job("sub_lane.sv", "gen_top", "tb_gen.sv"))
    back = sim.SimResult.from_dict(json.loads(json.dumps(res.to_dict())))
    assert back == res
    fb = sim.format_feedback(res, max_chars=300)
    assert len(fb) <= 300 and fb.startswith("Coverage of uut: overall 61.1%")
    assert res.versions["iverilog"] and res.versions["metric_def_version"] == sim.METRIC_DEF_VERSION


@pytest.mark.needs_iverilog
def test_simulate_many_order_and_pool():
    jobs = [job("counter.sv", "counter", "tb_counter.sv"), job("andor.sv", "andor", "tb_andor.sv"),
            job("fsm.sv", "fsm", "tb_fsm.sv")]
    seq = simpool.simulate_many(jobs, workers=1, verbose=False)
    par = simpool.simulate_many(jobs, workers=2, verbose=False)
    assert [r.overall_pct for r in seq] == [r.overall_pct for r in par]
    assert [r.id for r in par] == [j["id"] for j in jobs]
    with simpool.SimPool(2) as pool:
        fut = pool.submit(jobs[1])
        assert fut.result().overall_pct == pytest.approx(70.0)


# ----------------------------------------------------------------------------------------------- pure parts

def test_instrumented_lines_stay_aligned():
    # inserted text never contains a newline, and every original token survives, in order, on its own line:
    # so iverilog's file:line messages point at the original source
    for rtl, top in (("fsm.sv", "fsm"), ("tricky.sv", "tricky"), ("sub_lane.sv", "gen_top")):
        src = (DESIGNS / rtl).read_text()
        out = sim.prepare_dut([{"name": rtl, "content": src}], top).files[0]["content"]
        assert out.count("\n") == src.count("\n")
        for a, b in zip(src.splitlines(), out.splitlines()):
            pos = 0
            for tok in a.split():
                pos = b.find(tok, pos)
                assert pos >= 0, (a, b)
                pos += len(tok)


def test_prepare_is_cached_and_rejects_missing_top():
    files = [{"name": "counter.sv", "content": (DESIGNS / "counter.sv").read_text()}]
    assert sim.prepare_dut(files, "counter") is sim.prepare_dut(files, "counter")
    with pytest.raises(sim.PrepareError, match="top module 'nope'"):
        sim.prepare_dut(files, "nope")
    with pytest.raises(sim.PrepareError, match="does not parse"):
        sim.prepare_dut([{"name": "bad.sv", "content": "module m(; endmodule"}], "m")


def test_argv_builders():
    cfg = sim.ScoreConfig(timeout_s=7)
    script = sim.build_script(["dut.sv"], sim.run_defines("abc", ".cov_1.txt", "t1"), "tb.sv", "s1.vvp", cfg)
    assert "iverilog -g2012 '-D__cvabc_F=\".cov_1.txt\"' '-D__cvabc_T=\"t1\"' -o s1.vvp dut.sv tb.sv" in script
    assert '; timeout -s KILL 10 timeout --foreground -s INT 7 vvp -n s1.vvp -none 2>&1; rc=$?; { echo "$c0"; times; } ' \
           '> sim.times; exit $rc' in script.replace("\n", "; ")
    assert script.index("{ times; } > compile.times") < script.index("vvp -n")     # CPU before and after the simulation
    assert "ulimit -v 4194304" in script and "ulimit -n 256" in script
    argv = sim.bwrap_argv("/x/run")
    assert argv[0] == "bwrap" and "--unshare-all" in argv and ["--bind", "/x/run", "/sim"] == argv[argv.index("--bind"):argv.index("--bind") + 3]
    assert "--proc" not in argv


def test_parse_records_detects_duplicates():
    text = "tag I 0 1x1 tb.uut\ntag T 0 1,1 tb.uut\nforged I 0 111 tb.uut\n"
    recs = sim.parse_records(text, "tag")
    assert recs == {(0, "tb.uut"): {"I": "1x1", "T": "1,1"}}
    with pytest.raises(ValueError, match="duplicated"):
        sim.parse_records(text + "tag I 0 111 tb.uut\n", "tag")


def test_load_tasks_and_job(tmp_path):
    p = tmp_path / "t.jsonl"
    row = {"id": "x", "rtl_files": [{"name": "a.sv", "content": "module a; endmodule"}], "dut_module_name": "a",
           "dut_instance_name": "uut", "targets": [{"inst_name": "uut", "metric": "overall_average", "target_percentage": 90},
                                                   {"inst_name": "uut", "metric": "icarus_overall_average", "target_percentage": 70}]}
    p.write_text(json.dumps(row) + "\n\n" + "{not json\n")
    with pytest.raises(ValueError, match=r"t.jsonl:3: malformed JSON"):
        sim.load_tasks(p)
    p.write_text(json.dumps(row) + "\n")
    task = sim.load_tasks(p)[0]
    j = sim.job_from_task(task, "module tb; endmodule")
    assert j["targets"] == [{"inst_name": "uut", "metric": "overall_average", "target_percentage": 90.0}]
    assert sim.job_from_task(task, "", "icarus")["targets"][0]["metric"] == "icarus_overall_average"
    assert set(j) == {"id", "rtl_files", "top", "inst", "tb", "targets"}


@pytest.mark.needs_iverilog
def test_cli_json_and_prepare():
    r = subprocess.run([sys.executable, "sim.py", "score", "--rtl", str(DESIGNS / "andor.sv"), "--top", "andor",
                        "--inst", "uut", "--tb", str(DESIGNS / "tb_andor.sv"), "--target", "60", "--json"],
                       cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["status"] == "ok" and d["overall_pct"] == pytest.approx(70.0) and d["passed"] is True
    r = subprocess.run([sys.executable, "sim.py", "prepare", "--rtl", str(DESIGNS / "fsm.sv"), "--top", "fsm"],
                       cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.startswith("ok:"), r.stdout + r.stderr
    r = subprocess.run([sys.executable, "sim.py", "prepare", "--rtl", str(DESIGNS / "fsm.sv"), "--top", "nope"],
                       cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and len(r.stdout.strip().splitlines()) == 1


@pytest.mark.needs_iverilog
def test_bundled_example_reaches_full_coverage():
    ex = ROOT / "examples"
    res = sim.simulate({"id": "example", "top": "counter", "inst": "uut", "tb": (ex / "tb_counter.sv").read_text(),
                        "rtl_files": [{"name": "counter.sv", "content": (DESIGNS / "counter.sv").read_text()}],
                        "targets": [{"inst_name": "uut", "metric": "overall_average", "target_percentage": 90}]})
    assert res.status == sim.OK and res.passed and res.overall_pct == 100.0


@pytest.mark.needs_iverilog
@pytest.mark.needs_shared
def test_cli_score_from_task_file(shared_dir, tmp_path):
    tasks = sim.load_tasks(shared_dir / "data" / "dev_tasks.jsonl")
    task = next(t for t in tasks if t["id"] == "rtllm_v2/accu")
    tb = tmp_path / "tb.v"
    tb.write_text(task["reference_tb"]["content"])
    r = subprocess.run([sys.executable, "sim.py", "score", "--tasks", str(shared_dir / "data" / "dev_tasks.jsonl"),
                        "--id", "rtllm_v2/accu", "--tb", str(tb), "--json"], cwd=ROOT, capture_output=True, text=True,
                       timeout=60)
    d = json.loads(r.stdout)
    assert r.returncode == 0 and d["status"] == "ok" and d["targets"][0]["metric"] == "overall_average"
    r = subprocess.run([sys.executable, "sim.py", "score", "--tasks", str(shared_dir / "data" / "dev_tasks.jsonl"),
                        "--id", "nope", "--tb", str(tb)], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "not found" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_cli_bad_input_is_one_line_and_nonzero(tmp_path):
    """Bad input of any shape: one line naming the file (and line, key), a non-zero exit, no traceback."""
    (tmp_path / "bin.sv").write_bytes(b"\x7fELF\x02\x01\x01\x00" + bytes(range(256)))
    (tmp_path / "latin.sv").write_bytes(b"module m; // caf\xe9\nendmodule\n")
    rtl = [{"name": "m.sv", "content": "module m; endmodule"}]
    rows = {"str_rtl": {"id": "a", "rtl_files": "module m; endmodule", "dut_module_name": "m",
                        "dut_instance_name": "uut"},
            "no_pct": {"id": "a", "rtl_files": rtl, "dut_module_name": "m", "dut_instance_name": "uut",
                       "targets": [{"inst_name": "uut", "metric": "overall_average"}]},
            "list_row": [1, 2]}
    for name, row in rows.items():
        (tmp_path / f"{name}.jsonl").write_text(json.dumps(row) + "\n")
    ok_rtl, ok_tb = str(DESIGNS / "counter.sv"), str(DESIGNS / "tb_counter.sv")
    cases = [
        (["score", "--rtl", str(tmp_path / "bin.sv"), "--top", "m", "--tb", ok_tb], "binary file"),
        (["score", "--rtl", str(tmp_path / "latin.sv"), "--top", "m", "--tb", ok_tb], "not UTF-8"),
        (["score", "--rtl", ok_rtl, "--top", "counter", "--tb", str(tmp_path / "bin.sv")], "binary file"),
        (["score", "--tasks", str(tmp_path / "str_rtl.jsonl"), "--id", "a", "--tb", ok_tb], "str_rtl.jsonl:1: "),
        (["score", "--tasks", str(tmp_path / "no_pct.jsonl"), "--id", "a", "--tb", ok_tb], "target_percentage"),
        (["score", "--tasks", str(tmp_path / "list_row.jsonl"), "--id", "a", "--tb", ok_tb], "JSON object"),
        (["score", "--rtl", ok_rtl, "--top", "counter", "--tb", ok_tb, "--timeout", "-1"], "--timeout"),
        (["score", "--rtl", ok_rtl, "--top", "counter", "--tb", ok_tb, "--timeout", "nan"], "--timeout"),
        (["score", "--rtl", ok_rtl, "--top", "counter", "--tb", ok_tb, "--sim-time-limit", "-5"], "--sim-time-limit"),
        (["score", "--rtl", ok_rtl, "--top", "counter", "--tb", ok_tb, "--target", "101"], "--target"),
        (["score", "--rtl", str(tmp_path / "nope.sv"), "--top", "m", "--tb", ok_tb], "cannot read"),
        (["prepare", "--rtl", str(tmp_path / "bin.sv"), "--top", "m"], "binary file"),
    ]
    for argv, needle in cases:
        with pytest.raises(SystemExit) as e:
            sim.main(argv)
        msg = str(e.value.code)
        assert msg.startswith("sim.py: ") and needle in msg and "\n" not in msg, (argv, msg)
    with pytest.raises(ValueError, match="rtl_files"):
        sim.simulate({"id": "j", "rtl_files": "module m; endmodule", "top": "m", "inst": "uut", "tb": ""})
