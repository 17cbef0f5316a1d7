"""Hostile testbenches: each test checks one property of the scorer's sandbox and pre-scan. Every case must
end with a clear status, leave nothing outside its run directory and stop within its (small) limits.

Run: python -m pytest -q tests/test_sim_hostile.py
"""
import dataclasses
import os

import pytest

import sim
from helpers import COUNTER_RTL as COUNTER, COUNTER_TB_HEAD as HEAD

FAST = sim.ScoreConfig(timeout_s=2, compile_timeout_s=20, mem_limit_mb=1024, output_cap_bytes=200_000)


def run(body, cfg=FAST):
    return sim.simulate({"id": "hostile", "rtl_files": COUNTER, "top": "counter", "inst": "uut",
                         "tb": HEAD + body + "\nendmodule\n", "targets": []}, cfg)


def sandboxed():
    return sim.bwrap_usable()


@pytest.mark.needs_iverilog
def test_read_outside_run_dir_fails():
    if not sandboxed():
        pytest.skip("bubblewrap unusable here: file reads are not contained (documented gap)")
    res = run("""  integer fd, n; reg [8*200:1] line;
  initial begin
    fd = $fopen("/etc/passwd", "r");
    if (fd == 0) $display("open failed"); else begin n = $fgets(line, fd); $display("LEAK %0s", line); end
    #30 $finish;
  end""")
    assert res.status == sim.OK
    log = res.log_head + res.log_tail
    assert "open failed" in log and "LEAK" not in log and "root:" not in log


@pytest.mark.needs_iverilog
def test_write_outside_run_dir_fails(tmp_path):
    if not sandboxed():
        pytest.skip("bubblewrap unusable here: file writes are not contained (documented gap)")
    target = tmp_path / "escaped.txt"
    res = run(f"""  integer fd, fd2;
  initial begin
    fd = $fopen("{target}", "w"); $fdisplay(fd, "escaped"); $fclose(fd);
    fd2 = $fopen("/usr/escaped_by_tb.txt", "w");
    $display("fd=%0d fd2=%0d", fd, fd2);
    #30 $finish;
  end""")
    assert res.status == sim.OK
    assert not target.exists() and not os.path.exists("/usr/escaped_by_tb.txt")
    assert "fd=0 fd2=0" in res.log_head + res.log_tail


@pytest.mark.needs_iverilog
def test_no_finish_times_out_with_partial_coverage():
    # the wall-clock guard (the simulated-time limit, tests/test_sim_limit.py, is off here)
    res = run("  initial begin #12 rst_n = 1; en = 1; end", dataclasses.replace(FAST, sim_time_limit=0))
    assert res.status == sim.TIMEOUT and res.timed_out and not res.passed and sim.reward(res) == 0
    assert res.metrics["block"]["covered"] > 0                  # SIGINT ran the final blocks
    assert "did not finish" in sim.format_feedback(res)


@pytest.mark.needs_iverilog
def test_zero_delay_loop_times_out():
    res = run("  reg x = 0;\n  initial while (1) x = ~x;")
    assert res.status == sim.TIMEOUT and res.metrics["toggle"]["total"] == 14


@pytest.mark.needs_iverilog
def test_memory_bomb_is_stopped():
    res = run("""  reg [63:0] mem [0:2**28-1];
  integer i;
  initial begin for (i = 0; i < 2**28; i = i + 1) mem[i] = i; $finish; end""",
              sim.ScoreConfig(timeout_s=5, mem_limit_mb=512))
    assert res.status in (sim.RUNTIME_ERROR, sim.COMPILE_ERROR) and res.status != sim.OK
    assert sim.reward(res) == 0 and res.errors


@pytest.mark.needs_iverilog
def test_output_flood_is_capped():
    res = run("""  initial begin #12 rst_n = 1; en = 1; end
  initial forever begin #1 $display("flood flood flood flood flood flood flood flood flood flood"); end""")
    assert res.status == sim.OUTPUT_LIMIT and not res.passed
    assert len(res.log_head) <= sim.LOG_KEEP_BYTES and len(res.log_tail) <= sim.LOG_KEEP_BYTES
    assert res.metrics["block"]["covered"] > 0                  # coverage survives the stop


@pytest.mark.needs_iverilog
def test_forged_probe_lines_are_ignored():
    honest = run("  initial begin #12 rst_n = 1; #20 $finish; end")
    forged = run("""  integer fd;
  initial begin
    $display("x I 0 111111111 tb.uut");
    fd = $fopen(".cov.txt", "a"); $fdisplay(fd, "x I 0 111111111 tb.uut"); $fclose(fd);
    fd = $fopen("cov.txt", "a"); $fdisplay(fd, "x T 0 1,1,1,1 tb.uut"); $fclose(fd);
    #12 rst_n = 1; #20 $finish;
  end""")
    assert honest.status == forged.status == sim.OK
    assert forged.metrics == honest.metrics and forged.overall_pct == honest.overall_pct


@pytest.mark.needs_iverilog
def test_run_dir_holds_no_secrets():
    if not sandboxed():
        pytest.skip("bubblewrap unusable here: /proc is visible (documented gap)")
    # the testbench lists what it can open in its run dir: the script and /proc must not be there
    res = run("""  integer fd;
  initial begin
    fd = $fopen("run.sh", "r"); $display("run.sh fd=%0d", fd);
    fd = $fopen("/proc/self/cmdline", "r"); $display("cmdline fd=%0d", fd);
    #30 $finish;
  end""")
    log = res.log_head + res.log_tail
    assert res.status == sim.OK and "run.sh fd=0" in log and "cmdline fd=0" in log


@pytest.mark.parametrize("body, needle", [
    ('`include "/etc/passwd"', "absolute or parent path"),
    ('`include "../secret.sv"', "absolute or parent path"),
    ('`include "counter.sv"', "DUT file"),
    ('  initial $system("touch /tmp/pwned");', "$system"),
    ('  initial begin #20 uut.q = 4\'hF; end', "DUT hierarchy"),
    ('  initial begin #20 force uut.q = 4\'hF; end', "DUT hierarchy"),
    ('  initial begin #20 force tb.uut.wrap = 1; end', "DUT hierarchy"),
    ('  initial $display("%b", __cv00p0_0);', "__cv"),
    ('  `define P(x) __c``x\n  initial $display("%b", `P(v));', "token pasting"),
    ('endmodule\nmodule counter; ', "redefines DUT module"),
    ('  bind counter tb b0();', "bind"),
])
def test_prescan_rejects(body, needle):
    prepared = sim.prepare_dut(COUNTER, "counter")
    forbidden, _, _ = sim.check_testbench(HEAD + body + "\nendmodule\n", prepared, "uut")
    assert forbidden and any(needle in e["msg"] for e in forbidden), forbidden


@pytest.mark.needs_iverilog
def test_rejected_run_reports_clearly():
    res = run('  initial $system("touch /tmp/pwned_by_tb");')
    assert res.status == sim.REJECTED and not os.path.exists("/tmp/pwned_by_tb")
    assert "$system is not allowed" in sim.format_feedback(res) and sim.reward(res) == 0


def test_hierarchical_reads_are_allowed():
    prepared = sim.prepare_dut(COUNTER, "counter")
    forbidden, _, _ = sim.check_testbench(
        HEAD + '  initial begin #20 $display("%b", uut.q); if (uut.q == 0) d = uut.q; end\nendmodule\n', prepared, "uut")
    assert forbidden == []


@pytest.mark.needs_iverilog
def test_fallback_without_bubblewrap_still_scores(monkeypatch):
    monkeypatch.setitem(sim._BWRAP_STATE, "ok", False)
    monkeypatch.setitem(sim._BWRAP_STATE, "why", "bwrap cannot start (simulated)")
    res = run("  initial begin #12 rst_n = 1; #20 $finish; end")
    assert res.status == sim.OK and res.versions["sandbox"] == "none"
    assert any("ran with rlimits + timeout only" in n for n in res.notes)
    assert "bwrap" not in res.command


def test_prescan_cache_is_keyed_and_returns_copies():
    prepared = sim.prepare_dut(COUNTER, "counter")
    tb = HEAD + '  initial begin #20 force uut.q = 4\'hF; $system("x"); end\nendmodule\n'
    first = sim.check_testbench(tb, prepared, "uut")
    assert first[0] and any("$system" in e["msg"] for e in first[0])
    first[0][0]["msg"] = "mutated"           # a caller changing its copy must not change the cached result
    first[0].clear()
    again = sim.check_testbench(tb, prepared, "uut")
    assert again[0] and all(e["msg"] != "mutated" for e in again[0])
    # another instance name is another key: writing into `other.q` is not into the DUT instance `uut`
    other = sim.check_testbench(tb, prepared, "other")
    assert not any("DUT hierarchy" in e["msg"] for e in other[0])
    assert any("DUT hierarchy" in e["msg"] for e in again[0])


@pytest.mark.needs_iverilog
def test_scored_instance_is_pinned_to_its_path():
    """A second `counter uut` (in another top module, or deeper) is an error, never "the shallowest"."""
    honest = run("  initial begin #12 rst_n = 1; en = 1; #200 $finish; end")
    second_top = run("  initial begin #12 rst_n = 1; en = 1; #200 $finish; end\nendmodule\n"
                     "module evil;\n  reg clk = 0;\n  counter uut (.clk(clk), .rst_n(1'b1), .load(1'b0), .en(1'b1), "
                     ".up(1'b1), .d(4'd0), .q(), .wrap());\n  always #1 clk = ~clk;")
    assert honest.status == sim.OK
    assert second_top.status == sim.NO_DUT_INSTANCE and sim.reward(second_top) == 0
    assert "exactly once" in second_top.errors[0]["msg"] and "evil.uut" in second_top.errors[0]["msg"]
    nested = sim.simulate({"id": "nested", "rtl_files": COUNTER, "top": "counter", "inst": "uut", "targets": [],
                           "tb": nested_tb()}, FAST)
    assert nested.status == sim.NO_DUT_INSTANCE and "tb.w.uut" in nested.errors[0]["msg"]
    pinned = sim.simulate({"id": "pinned", "rtl_files": COUNTER, "top": "counter", "inst": "uut", "targets": [],
                           "inst_path": "tb.w.uut", "tb": nested_tb()}, FAST)
    assert pinned.status == sim.OK


def nested_tb():
    return ("module tb; wrap w (); initial #50 $finish; endmodule\nmodule wrap;\n"
            "  reg clk = 0; always #5 clk = ~clk;\n  counter uut (.clk(clk), .rst_n(1'b1), "
            ".load(1'b0), .en(1'b1), .up(1'b1), .d(4'd0), .q(), .wrap());\nendmodule\n")
