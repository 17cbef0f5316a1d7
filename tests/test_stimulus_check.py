"""The reward holes of issue 48, as known-answer tests: each hostile stimulus or testbench is rejected (or
scored as the honest one would be), honest ones still pass, and a seeded fuzz test feeds token soup and
fragments of real testbenches to harness.check_stimulus and the pre-scan (no exception, bounded time).

Run: python -m pytest -q tests/test_stimulus_check.py
"""
import json
import random
import time
from pathlib import Path

import pytest

import harness
import instrument
import sim
import simpool
import tbcheck
from helpers import COUNTER_RTL, COUNTER_TB_HEAD, DESIGNS

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data"


def counter_task(inst="uut"):
    return {"id": "chk_counter", "rtl_files": COUNTER_RTL, "spec_files": [], "dut_module_name": "counter",
            "dut_instance_name": inst, "instruction": "", "targets": []}


H = harness.make_harness(counter_task())

# (stimulus, what the reason must say): every way to reach the reward without exercising the design
HOSTILE_STIMULI = {
    # the escape: `\x//` is an escaped identifier, so blanking `//...` as a comment hid the rest
    "begin : \\x// end end end endmodule module evil; counter uut (); endmodule module tb_r; initial begin begin\nend":
        "`endmodule` is not allowed",
    "end end endmodule\nmodule evil; defparam tb_counter.uut.W = 1; endmodule\nmodule tb_r; initial begin begin":
        "`endmodule` is not allowed",
    "\\uut .q = 4'd3;": "writing into the DUT hierarchy (\\uut .q: assignment)",
    "`define P uut\n`P.q = 4'd3;": "macros",
    "`ifdef __ICARUS__\nuut.q = 4'd3;\n`endif": "directives",
    "uut.q++;": "++/--",
    "--uut.q;": "++/--",
    "uut.q += 4'd1;": "assignment",
    "{uut.q, d} = 8'hff;": "assignment",
    "tb_counter.uut.q = 4'd3;": "writing into the DUT hierarchy",
    "$root.tb_counter.uut.q = 4'd3;": "writing into the DUT hierarchy",
    '$sscanf("3", "%d", uut.q);': "$sscanf output",
    '$sformat(uut.q, "%d", 3);': "$sformat output",
    'begin int fd; fd = 0; $fscanf(fd, "%d", uut.q); end': "$fscanf output",
    '$readmemh("rom.hex", uut.q);': "$readmemh output",
    "$deposit(uut.q, 4'd2);": "$deposit",
    "force uut.q = 4'd0;": "`force`",
    "release d;": "`release`",
    "assign d = 4'd1;": "`assign`",
    "-> uut.ev;": "event trigger",
    "uut.some_task();": "a call of a subroutine inside the DUT",
    "logic en; en = 1;": "harness's name",
    "counter u2 (.clk(clk), .rst_n(rst_n));": "do not instantiate counter",
    "other #(.W(4)) u3 (clk, rst_n);": "instantiating a module",
    "step(1);\nend\nstep(1);": "close the harness",
    "initial begin step(1); end": "`initial`",
    "x = " + "(" * 3000 + "1" + ")" * 3000 + ";": "nested",
}

HONEST_STIMULI = [
    "",
    "en = 1'b1;\nrepeat (20) step(1);",
    "// drive the module; no endmodule here\nint k;\nfor (int i = 0; i < 4; i++) begin d = i; step(1); end\n"
    "if (uut.q <= 4'd3) step(1); else begin en = 1'b1; step(2); end\n"
    "$display(\"endmodule %0d\", q);\nrepeat (3) begin random_inputs(); step(); end\n#(20);\nreset_dut();\n"
    "fork step(1); join",
    "logic [3:0] seen [$];\nrepeat (8) begin en = 1; step(1); seen.push_back(uut.q); end\n"
    "$display(\"%0d %b\", seen.size(), uut.wrap);",
    "int tb_seed = 7;\nrepeat (16) begin {en, up, load, d} = $random(tb_seed); step(1); end",
    "begin : phase_1\n  load = 1; d = 4'hA; step(1); load = 0;\nend\nwait (q == 4'hA);\n@(negedge clk);",
    "logic [3:0] mem [0:15];\nmem[uut.q] = 4'd1;   // an index reads the DUT\nd = mem[0];\nstep(2);",
]


@pytest.mark.parametrize("body, needle", list(HOSTILE_STIMULI.items()))
def test_hostile_stimulus_is_rejected(body, needle):
    why = harness.check_stimulus(body, H)
    assert why and why.startswith("line ") and needle in why, why


@pytest.mark.parametrize("body", HONEST_STIMULI)
def test_honest_stimulus_passes(body):
    assert harness.check_stimulus(body, H) is None


def test_check_is_bounded_and_size_capped():
    # a 32 kB word used to take 11 s (quadratic regexes in the trainer's process); now: one parse
    for body in ["x" * 32000, "x = 1; " * 4500, "begin " * 2000 + "end " * 2000, "(" * 30000]:
        t0 = time.perf_counter()
        harness.check_stimulus(body, H)
        assert time.perf_counter() - t0 < 2.0, body[:20]
    why = harness.check_stimulus("x" * (harness.MAX_STIMULUS_BYTES + 1), H)
    assert "longer than" in why


def test_check_without_harness_still_guards_structure():
    assert harness.check_stimulus("step(1);") is None
    assert "endmodule" in harness.check_stimulus("end end endmodule module x; initial begin begin")


# ---------------------------------------------------------------------------------------------------------
# The pre-scan (testbench mode, and the assembled stimulus) on the same holes

HOSTILE_TB_BODIES = [
    "  initial begin #20 \\uut .q = 4'hF; end",
    "`define P uut\n  initial begin #20 `P.q = 4'hF; end",
    "  initial begin #20 uut.q++; end",
    '  initial begin #20 $sscanf("3", "%d", uut.q); end',
    '  initial begin #20 $sformat(uut.q, "%d", 3); end',
    '  integer fd; initial begin #20 $fscanf(fd, "%d", uut.q); end',
    '  initial $readmemh("f.hex", uut.q);',
    "  initial begin #20 release uut.q; end",
    "  initial begin #20 deassign uut.q; end",
    "  task t(output [3:0] o); o = 1; endtask\n  initial t(uut.q);",
    "  initial $root.tb.uut.q = 1;",
    "`ifdef __ICARUS__\n  initial uut.q = 1;\n`endif",
    "  mon m0 (.o(uut.q));",
    "  initial begin #20 uut.q = 1 +; end",        # a syntax error: skipped text naming the DUT
]
HONEST_TB_BODIES = [
    "  initial begin #20 release d; $display(\"%b\", uut.q); #20 $finish; end",
    "  task t(input [3:0] o); $display(o); endtask\n  initial t(uut.q);",
    "  logic [3:0] seen [$]; initial seen.push_back(uut.q);",
    "  logic [3:0] m [16]; initial m[uut.q] = 1;",
    "`ifndef __ICARUS__\n  initial uut.q = 1;\n`endif",
]


@pytest.mark.parametrize("body", HOSTILE_TB_BODIES)
def test_prescan_rejects_every_write_spelling(body):
    prepared = sim.prepare_dut(COUNTER_RTL, "counter")
    forbidden, _, _ = sim.check_testbench(COUNTER_TB_HEAD + body + "\nendmodule\n", prepared, "uut")
    assert forbidden and any("DUT" in e["msg"] for e in forbidden), forbidden


@pytest.mark.parametrize("body", HONEST_TB_BODIES)
def test_prescan_keeps_honest_testbenches(body):
    prepared = sim.prepare_dut(COUNTER_RTL, "counter")
    forbidden, _, _ = sim.check_testbench(COUNTER_TB_HEAD + body + "\nendmodule\n", prepared, "uut")
    assert forbidden == []


@pytest.mark.needs_iverilog
def test_assembled_hostile_stimuli_are_rejected_by_the_scorer_too():
    """Stimuli that skip check_stimulus (assembled directly) are refused by sim's pre-scan."""
    task = counter_task()
    bodies = ["\\uut .q = 4'd3;", "`define P uut\n`P.q = 4'd3;", "uut.q++;", '$sscanf("3", "%d", uut.q);',
              '$readmemh("rom.hex", uut.q);']
    jobs = [sim.job_from_task(task, harness.assemble(H, b)[0]) for b in bodies]
    for b, r in zip(bodies, simpool.simulate_many(jobs, workers=2, verbose=False)):
        assert r.status == sim.REJECTED and sim.reward(r) == 0, (b, r.status)


@pytest.mark.needs_iverilog
def test_never_ending_stimulus_scores_like_the_same_testbench():
    """One end-of-time rule in both answer modes: the scorer's simulated-time limit (reward 0)."""
    cfg = sim.ScoreConfig(timeout_s=10, sim_time_limit=2000)
    task = counter_task()
    stim_tb = harness.assemble(H, "en = 1'b1;\nforever step(1);")[0]
    whole_tb = COUNTER_TB_HEAD + "  initial begin #12 rst_n = 1; en = 1; forever @(negedge clk); end\nendmodule\n"
    jobs = [sim.job_from_task(task, stim_tb), dict(sim.job_from_task(task, whole_tb))]
    stim, whole = simpool.simulate_many(jobs, workers=2, cfg=cfg, verbose=False)
    assert stim.status == whole.status == sim.SIM_TIME_LIMIT, (stim.status, whole.status)
    assert sim.reward(stim) == sim.reward(whole) == 0


# ---------------------------------------------------------------------------------------------------------
# Real testbenches: every syntax kind they contain goes through the pre-scan without raising

# a fixture with statement kinds the small designs' testbenches lack (release/deassign used to raise)
KINDS_TB = COUNTER_TB_HEAD + r"""
  integer fd, n, i; reg [8*16:1] s; event ev; logic [3:0] qq [$];
  task automatic get(output [3:0] o, input [3:0] x); o = x; endtask
  function automatic [3:0] inc(input [3:0] x); return x + 1; endfunction
  initial begin
    assign d = 4'd1; deassign d; force en = 1; release en;
    fork begin #1; end begin #2; end join_any
    disable fork;
    for (i = 0; i < 2; i++) begin : lp get(d, uut.q); d = inc(d); end
    foreach (qq[j]) qq[j] = 0;
    case (uut.q) 4'd0: d = 1; default: d = 2; endcase
    while (0) ; do n = 1; while (0);
    repeat (2) @(posedge clk); wait (uut.q != 5);
    -> ev; @(ev or posedge clk);
    n = $sscanf("12", "%d", d); $sformat(s, "%0d", uut.q); $display("%s", s);
    if (uut.q inside {1, 2}) $display("in");
    #12 rst_n = 1; #20 $finish;
  end
  always @(posedge clk) if (uut.wrap) $display("wrap");
endmodule
"""


def real_testbenches():
    tbs = [("kinds", KINDS_TB)] + [(p.name, p.read_text()) for p in sorted(DESIGNS.glob("tb_*.sv"))]
    tbs += [(p.name, p.read_text()) for p in sorted((ROOT / "examples").glob("*.sv"))]
    cid = SHARED / "cvdp_example_cid012.jsonl"
    if cid.exists():
        for line in cid.read_text().splitlines():
            rec = json.loads(line)
            tbs += [(name, text) for name, text in rec["output"]["context"].items() if name.endswith(".sv")]
    return tbs


def test_prescan_walks_every_syntax_kind_of_real_testbenches():
    prepared = sim.prepare_dut(COUNTER_RTL, "counter")
    kinds = set()
    for name, tb in real_testbenches():
        forbidden, _, _ = tbcheck._check_testbench(tb, prepared, "uut")
        assert forbidden == [], (name, forbidden)
        tree, _ = tbcheck.parse_sv(tb)
        kinds |= {instrument._kind(n) for n in tbcheck.walk(tree.root)}
    assert {"ProceduralReleaseStatement", "ProceduralDeassignStatement", "ProceduralForceStatement",
            "ProceduralAssignStatement", "ForeachLoopStatement", "CaseStatement"} <= kinds


def test_cid012_reference_testbench_passes_the_prescan():
    cid = SHARED / "cvdp_example_cid012.jsonl"
    if not cid.exists():
        pytest.skip(f"{cid} not found: ../shared (the reference data) is absent from this checkout")
    assert any(name.endswith(".sv") for name, _ in real_testbenches() if name != "kinds")


# ---------------------------------------------------------------------------------------------------------
# Fuzz: token soup and fragments of real testbenches (seeded; no exception, bounded time)

SOUP = ["begin", "end", "fork", "join", "module", "endmodule", "initial", "uut", ".", "q", "=", "<=", "++", ";",
        "(", ")", "[", "]", "{", "}", "\\uut ", "`define P uut\n", "`P", "`ifdef X\n", "`endif\n", "//", "/*",
        "*/", '"', "$sscanf", "$readmemh", "force", "release", "#", "@", "step", "en", "d", "1", "4'hF", ",",
        "\n", " ", "\\x// ", "task", "endtask", "->", "tb_counter", "$root", "?", ":", "case", "endcase"]


def test_fuzz_check_stimulus_and_prescan():
    rng = random.Random(48)
    prepared = sim.prepare_dut(COUNTER_RTL, "counter")
    texts = [tb for _, tb in real_testbenches()]
    t0 = time.perf_counter()
    for i in range(150):
        if i % 2:
            body = "".join(rng.choice(SOUP) + rng.choice(["", " "]) for _ in range(rng.randint(1, 60)))
        else:
            src = rng.choice(texts)
            a = rng.randrange(len(src))
            body = src[a:a + rng.randint(1, 400)]
        why = harness.check_stimulus(body, H)
        assert why is None or why.startswith("line "), why
        forbidden, hints, diags = tbcheck._check_testbench(COUNTER_TB_HEAD + body + "\nendmodule\n",
                                                           prepared, "uut")
        assert isinstance(forbidden, list) and isinstance(diags, list)
        if why is None:       # what the stimulus check lets through, the assembled pre-scan lets through
            assert tbcheck._check_testbench(harness.assemble(H, body)[0], prepared, "uut")[0] == [], body
    assert time.perf_counter() - t0 < 10.0


def test_the_check_cache_holds_under_threads(monkeypatch):
    """Joint experts and joint evals check stimuli from several threads at once: with a full cache, eviction and
    insertion must not race (two threads evicting one key raised KeyError, or the dict changed under iteration)."""
    import sys
    import threading
    monkeypatch.setattr(harness, "_CHECK_CACHE", {})
    monkeypatch.setattr(harness, "_CHECK_CACHE_SIZE", 8)
    monkeypatch.setattr(harness, "_check_stimulus", lambda body, h: None if body.startswith("ok") else "line 1: no")
    errors, old = [], sys.getswitchinterval()

    def work(t):
        try:
            for i in range(5000):
                body = f"{'ok' if i % 2 else 'bad'} {t} {i}"
                assert (harness.check_stimulus(body) is None) == body.startswith("ok")
        except Exception as e:      # noqa: BLE001  (collected, asserted below)
            errors.append(repr(e))
    sys.setswitchinterval(1e-6)     # switch threads as often as possible: the race shows within a few thousand calls
    try:
        threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(old)
    assert errors == [] and len(harness._CHECK_CACHE) <= 8
