"""Tests of the template teacher and the chat teacher client (data/teacher.py).

Run: python -m pytest -q tests/test_teacher.py
"""
import json
import re
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from data import teacher

COUNTER = """module cnt #(parameter W = 8) (
  input logic clk,
  input logic rst_n,
  input logic en,
  input logic [1:0] op,
  input logic [W-1:0] din,
  output logic [W-1:0] q,
  output logic hit
);
  always_ff @(posedge clk or negedge rst_n) begin
    if (!rst_n) q <= '0;
    else if (en) begin
      case (op)
        2'd0: q <= q + 1'b1;
        2'd1: q <= q - 1'b1;
        2'd2: q <= din;
        default: q <= q;
      endcase
    end
  end
  assign hit = (din == 8'hA5) && en;
endmodule
"""

ALU = """module alu (input [2:0] opcode, input [7:0] a, input [7:0] b, output reg [7:0] y, output reg flag);
  always @* begin
    flag = 1'b0;
    case (opcode)
      3'd0: y = a + b;
      3'd1: y = a - b;
      3'd2: y = a & b;
      3'd3: y = a | b;
      3'd4: y = a ^ b;
      3'd5: y = ~a;
      3'd6: begin y = a << 1; flag = a[7]; end
      default: y = 8'h00;
    endcase
    if (a == 8'hFF && b == 8'h01) flag = 1'b1;
  end
endmodule
"""

FSM = """module det (input clk, input reset, input x, output reg z);
  localparam S0 = 2'd0, S1 = 2'd1, S2 = 2'd2, S3 = 2'd3;
  reg [1:0] state, next;
  always @(posedge clk) if (reset) state <= S0; else state <= next;
  always @* begin
    next = state; z = 1'b0;
    case (state)
      S0: next = x ? S1 : S0;
      S1: next = x ? S1 : S2;
      S2: next = x ? S3 : S0;
      S3: begin z = 1'b1; next = x ? S1 : S2; end
    endcase
  end
endmodule
"""


def make_task(src, top, inst="uut", tid=None):
    return {"id": tid or f"test_{top}", "rtl_files": [{"name": f"{top}.sv", "content": src}], "spec_files": [],
            "dut_module_name": top, "dut_instance_name": inst,
            "instruction": f"The top module is '{top}'. Instantiate it in the testbench with the instance name '{inst}'.",
            "targets": [{"inst_name": inst, "metric": "overall_average", "target_percentage": 90.0}],
            "difficulty": None, "is_agentic": False}


TASKS = [make_task(COUNTER, "cnt", "dut"), make_task(ALU, "alu", "uut"), make_task(FSM, "det", "inst_det")]


def test_ports_clock_reset_detection():
    info = teacher.analyze_dut(TASKS[0])
    assert info["clocks"] == ["clk"]
    assert info["resets"] == [{"name": "rst_n", "active_low": True}]
    assert [d["name"] for d in info["data"]] == ["en", "op", "din"]
    assert {p["name"]: p["width"] for p in info["ports"]}["q"] == 8      # parameter default elaborated
    fsm = teacher.analyze_dut(TASKS[2])
    assert fsm["resets"] == [{"name": "reset", "active_low": False}]
    alu = teacher.analyze_dut(TASKS[1])
    assert alu["clocks"] == [] and alu["resets"] == []


def test_template_format_and_size():
    for t in TASKS:
        for lv in teacher.LEVELS:
            ans = teacher.template_answer(t, lv)
            assert ans.startswith(f"filename: tb_{t['dut_module_name'].lower()}.sv\n```systemverilog\n")
            code = teacher.answer_code(ans)
            assert f"{t['dut_module_name']} {t['dut_instance_name']} (" in code
            assert len(code) / 3.5 < 2000                                   # well under 2k tokens
            assert not re.search(r"randomize|covergroup|assert property|clocking|inside", code)


@pytest.mark.needs_iverilog
def test_templates_compile_and_run(tmp_path):
    for t in TASKS:
        (tmp_path / "dut.sv").write_text(t["rtl_files"][0]["content"])
        for lv in ("minimal", "weak", "strong"):
            (tmp_path / "tb.sv").write_text(teacher.template_code(t, lv))
            c = subprocess.run(["iverilog", "-g2012", "-o", str(tmp_path / "a.vvp"), str(tmp_path / "dut.sv"),
                                str(tmp_path / "tb.sv")], capture_output=True, text=True)
            assert c.returncode == 0, (t["id"], lv, c.stderr)
            r = subprocess.run(["vvp", "-n", str(tmp_path / "a.vvp"), "-none"], capture_output=True, text=True,
                               timeout=60)
            assert r.returncode == 0, (t["id"], lv, r.stdout[-500:])


def uncovered_result(deep_q):
    """A scorer result on COUNTER with named uncovered items: din bits 3 and 7 and rst_n rising (toggle), the
    case item 2'd2 (block) and, with deep_q, the counter's top bit q[7] (toggle)."""
    line_case = COUNTER.splitlines().index("        2'd2: q <= din;") + 1
    toggle = lambda signal, bits, missing, line: {"metric": "toggle", "instance": "tb_cnt.dut", "signal": signal,
                                                  "bits": bits, "missing": missing, "file": "cnt.sv", "line": line,
                                                  "kind": "toggle", "detail": ""}
    items = [toggle("din", [3, 7], "both", 5), toggle("rst_n", [0], "0->1", 3)]
    items += [toggle("q", [7], "both", 7)] if deep_q else []
    items.append({"metric": "block", "instance": "tb_cnt.dut", "file": "cnt.sv", "line": line_case,
                  "kind": "case_item", "label": "2'd2", "detail": ""})
    return {"status": "ok", "overall_pct": 40.0, "uncovered": items}


def test_refine_edits_testbench_for_named_items():
    """The refinement keeps the given testbench and inserts phases aimed at the uncovered items."""
    t = TASKS[0]
    weak = teacher.template_answer(t, "weak")
    result = uncovered_result(deep_q=True)
    new = teacher.answer_code(teacher.refine(t, weak, result))
    old = teacher.answer_code(weak)
    head = old[:old.index("// end of stimulus")]
    assert new.startswith(head)                                  # an edit, not a rewrite
    assert "din = din | 8'h88" in new                            # toggle the missing bits both ways
    assert "rst_n = 1'b0; repeat (2) @(negedge clk); rst_n = 1'b1;" in new
    assert re.search(r"\{en, op\} = tb_i|\{op, en\} = tb_i|\{op\} = tb_i", new)   # sweep the case selector
    assert re.search(r"repeat \(\d+\)", new[len(head):])        # long run for the deep counter bit
    assert new.rstrip().endswith("endmodule")


def test_refine_expression_row_and_instance_fix():
    t = TASKS[0]
    weak = teacher.template_answer(t, "weak")
    res = {"status": "ok", "overall_pct": 50.0, "uncovered": [
        {"metric": "expression", "instance": "tb_cnt.dut", "file": "cnt.sv", "line": 20, "kind": "row",
         "expr": "(din == 8'hA5) && en", "row": "(din == 8'hA5)=1 while others 1", "detail": ""}]}
    new = teacher.answer_code(teacher.refine(t, weak, res))
    assert re.search(r"\{(din, en|en, din)\} = tb_i", new)      # sweep both terms' inputs (9 bits)
    wide = dict(t, id="test_cnt_wide", rtl_files=[{"name": "cnt.sv", "content": COUNTER.replace("W = 8", "W = 16")
                                                   .replace("8'hA5", "16'hBEEF")}])
    res["uncovered"][0]["expr"] = "(din == 16'hBEEF) && en"
    new = teacher.answer_code(teacher.refine(wide, teacher.template_answer(wide, "weak"), res))
    assert "16'hbeef" in new.lower()                             # too wide to sweep: drive the constant
    broken = weak.replace(" dut (", " dut_x (")
    fixed = teacher.answer_code(teacher.refine(t, broken, {"status": "no_dut_instance", "uncovered": []}))
    assert " dut (" in fixed and "dut_x" not in fixed
    fallback = teacher.refine(t, weak, {"status": "compile_error", "errors": [{"msg": "syntax error"}]})
    assert fallback == teacher.template_answer(t, "strong")


def test_icarus_target_rule():
    assert teacher.icarus_target(97.3) == 90.0
    assert teacher.icarus_target(71.9) == 71.0
    assert teacher.icarus_target(None) == 0.0


def _scored(task, answers):
    sim = pytest.importorskip("sim")
    import simpool
    res = simpool.simulate_many([sim.job_from_task(task, teacher.answer_code(a)) for a in answers], workers=2)
    return [r.to_dict() for r in res]


@pytest.mark.needs_iverilog
def test_weak_below_strong_and_refine_improves():
    weak_pcts, strong_pcts = [], []
    for t in TASKS:
        w, s = _scored(t, [teacher.template_answer(t, "weak"), teacher.template_answer(t, "strong")])
        assert w["status"] == "ok" and s["status"] == "ok", (w.get("errors"), s.get("errors"))
        weak_pcts.append(w["overall_pct"])
        strong_pcts.append(s["overall_pct"])
        ref = teacher.refine(t, teacher.template_answer(t, "weak"), w)
        (r,) = _scored(t, [ref])
        assert r["status"] == "ok" and r["overall_pct"] > w["overall_pct"] + 1.0, (t["id"], w["overall_pct"], r)
        named = {(u["metric"], u.get("signal"), u.get("line")) for u in w["uncovered"]}
        still = {(u["metric"], u.get("signal"), u.get("line")) for u in r["uncovered"]}
        assert len(still & named) < len(named)                   # some named items got covered
    assert sum(weak_pcts) / 3 < sum(strong_pcts) / 3 - 10


@pytest.mark.needs_iverilog
def test_corruptions_fail_and_refine_fixes():
    t = TASKS[1]
    base = teacher.template_answer(t, "weak")
    for kind in teacher.CORRUPTIONS:
        (bad,) = _scored(t, [teacher.corrupt(t, base, kind)])
        assert bad["status"] != "ok" or bad.get("overall_pct") is None, kind
        (good,) = _scored(t, [teacher.refine(t, teacher.corrupt(t, base, kind), bad)])
        assert good["status"] == "ok", (kind, good.get("errors"))


class _Handler(BaseHTTPRequestHandler):
    seen = []

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        _Handler.seen.append((self.path, body))
        text = "filename: tb_x.sv\n```systemverilog\nmodule tb; endmodule\n```"
        out = json.dumps({"choices": [{"message": {"role": "assistant", "content": text}}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *a):
        pass


def test_chat_teacher_against_local_server():
    pytest.importorskip("common")
    srv = HTTPServer(("127.0.0.1", 0), _Handler)
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    try:
        ct = teacher.ChatTeacher(f"http://127.0.0.1:{srv.server_address[1]}", "big-coder", timeout_s=10)
        out = ct.direct(TASKS[:2], n=2)
        assert len(out) == 2 and len(out[0]) == 2 and out[0][0].startswith("filename: tb_x.sv")
        ref = ct.refine([(TASKS[0], "no code here", None)])      # a parse-failure state (no sim needed)
        assert len(ref) == 1
    finally:
        srv.shutdown()
        srv.server_close()
    path, body = _Handler.seen[0]
    assert path == "/v1/chat/completions" and body["model"] == "big-coder"
    assert [m["role"] for m in body["messages"]] == ["system", "user"]
    assert [m["role"] for m in _Handler.seen[-1][1]["messages"]] == ["system", "user", "assistant", "user"]


# ----------------------------------------------------------------------------------------------
# HFTeacher (a tiny random model: junk text, so only the plumbing is tested)

def _spy_generate(monkeypatch, common):
    calls = []
    real = common.generate

    def spy(model, tok, messages_list, **kw):
        calls.append({"messages": messages_list, "kw": kw,
                      "active": getattr(model, "active_adapter", None)})
        return real(model, tok, messages_list, **kw)

    monkeypatch.setattr(common, "generate", spy)
    return calls


def test_hf_teacher_shapes_and_memoryless_refine_prompts(monkeypatch):
    common = pytest.importorskip("common")
    monkeypatch.setattr(common, "feedback_message", lambda r: f"FEEDBACK {getattr(r, 'reason', None) or r}")
    calls = _spy_generate(monkeypatch, common)
    model, tok = common.tiny_model(seed=0)
    ht = teacher.HFTeacher(model, tok, max_new_tokens=4, temperature=1.0, top_p=1.0, seed=3)
    out = ht.direct(TASKS[1:], n=2)
    assert len(out) == 2 and all(len(x) == 2 and all(isinstance(a, str) for a in x) for x in out)
    assert calls[0]["messages"] == [common.build_messages(t) for t in TASKS[1:] for _ in range(2)]
    assert calls[0]["kw"]["max_new_tokens"] == 4 and calls[0]["kw"]["seed"] == 3
    weak = teacher.template_answer(TASKS[0], "weak")
    res = {"status": "ok", "overall_pct": 50.0}
    states = [(TASKS[0], weak, res), (TASKS[2], out[1][0], None), (TASKS[1], "no code at all", None)]
    ref = ht.refine(states)
    assert len(ref) == 3 and all(isinstance(a, str) for a in ref)
    sent = calls[1]["messages"]
    assert sent == [common.refine_messages(t, a, r) for t, a, r in states]       # the memoryless state
    assert [m["role"] for m in sent[0]] == ["system", "user", "assistant", "user"]
    assert sent[0][:2] == common.build_messages(TASKS[0]) and sent[0][3]["content"] == f"FEEDBACK {res}"
    assert sent[2][2]["content"] == "no code at all" and sent[2][3]["content"] == "FEEDBACK no_code"
    assert calls[1]["kw"]["seed"] == 4                                            # seed + call index
    again = teacher.HFTeacher(model, tok, max_new_tokens=4, temperature=1.0, top_p=1.0, seed=3)
    assert again.direct(TASKS[1:], n=2) == out                                    # reproducible


def test_hf_teacher_adapter_switch_and_restore(monkeypatch):
    common = pytest.importorskip("common")
    pytest.importorskip("peft")
    calls = _spy_generate(monkeypatch, common)
    model, tok = common.tiny_model(seed=1)
    model = common.add_lora(model, r=4, alpha=8, adapter_name="teach")
    model = common.add_lora(model, r=4, alpha=8, adapter_name="student")       # active and trainable
    ht = teacher.HFTeacher(model, tok, max_new_tokens=4, temperature=0.0, top_p=1.0, seed=0, adapter_name="teach")
    assert len(ht.direct(TASKS[:1], n=1)[0]) == 1
    assert calls[-1]["active"] == "teach"
    assert model.active_adapter == "student"
    assert any(p.requires_grad for n, p in model.named_parameters() if ".student." in n)   # still trainable
    with pytest.raises(ValueError, match="no adapter named"):
        teacher.HFTeacher(model, tok, adapter_name="nope").direct(TASKS[:1], 1)


def test_template_teacher_refines_a_parse_failure_with_strong_template():
    t = TASKS[1]
    assert teacher.TemplateTeacher().refine([(t, "junk", None)]) == [teacher.template_answer(t, "strong")]


# ----------------------------------------------------------------------------------------------
# Stimulus mode (harness.py writes the harness, the teacher the stimulus)

harness = pytest.importorskip("harness")
DESIGNS = [("counter.sv", "counter"), ("alu.sv", "alu"), ("fsm.sv", "fsm"), ("andor.sv", "andor"),
           ("sub_lane.sv", "gen_top"), ("two_clk.sv", "two_clk"), ("wide_packed.sv", "wide_packed")]


def _design_tasks():
    from pathlib import Path
    root = Path(__file__).resolve().parent / "designs"
    return [make_task((root / f).read_text(), top, "uut", tid=f"stim_{top}") for f, top in DESIGNS]


def _scored_stimulus(task, answers, allow_rejected=False):
    """Result dicts of stimulus answers; with allow_rejected, one the harness's check refuses gets its
    rejected_result (nothing simulated), as the score path gives it."""
    sim = pytest.importorskip("sim")
    import simpool
    h = harness.make_harness(task)
    jobs, out = [], []
    for a in answers:
        p = harness.prepare_stimulus(h, a)
        if allow_rejected and p.reason == "rejected":
            out.append(harness.rejected_result(task["id"], p.why))
            continue
        assert p.reason == "ok", (task["id"], p.reason, p.why)
        jobs.append(sim.job_from_task(task, p.tb))
        out.append(None)
    results = iter(r.to_dict() for r in simpool.simulate_many(jobs, workers=2, verbose=False))
    return [r if r is not None else next(results) for r in out]


def test_stimulus_answers_are_design_aware_and_pass_the_checks():
    tasks = TASKS + _design_tasks()
    bodies = []
    for t in tasks:
        for lv in teacher.LEVELS:
            ans = teacher.stimulus_answer(t, lv)
            st = harness.parse_stimulus(ans)
            assert st.reason == "ok" and ans == harness.render_stimulus(st.body)
            assert harness.check_stimulus(st.body, harness.make_harness(t)) is None, (t["id"], lv)
            assert "$finish" not in st.body and "module" not in st.body
        bodies.append(harness.parse_stimulus(teacher.stimulus_answer(t, "strong")).body)
    assert len(set(bodies)) == len(tasks)                        # one distinct strong stimulus per design
    assert teacher.template_stimulus(TASKS[0], "strong", 0) != teacher.template_stimulus(TASKS[0], "strong", 1)
    assert teacher.template_stimulus(TASKS[0], teacher.FLOOR_LEVEL) == "repeat (4) step(1);\n"
    assert "{en, op, din} = {$random(tb_seed)};" in teacher.template_stimulus(TASKS[0], "weak")
    const = make_task("module k (output logic y);\n  assign y = 1'b0;\nendmodule\n", "k")
    assert harness.parse_stimulus(teacher.stimulus_answer(const, "strong")) == harness.Stimulus("step(1);", "ok")


def test_cycle_counts_are_sized_to_the_design():
    small = TASKS[0]
    extra = "".join(f"  logic [7:0] r{i};\n  always_ff @(posedge clk) r{i} <= din ^ 8'd{i} + r{i};\n" for i in range(60))
    big = dict(small, id="test_cnt_big", rtl_files=[{"name": "cnt.sv", "content": COUNTER.replace("endmodule", extra + "endmodule")}])
    padded = dict(small, id="test_cnt_pad", rtl_files=[{"name": "cnt.sv", "content": "// " + "x" * 9000 + "\n" + COUNTER}])
    wide = make_task("module w (input clk, input [511:0] a, output reg [511:0] y);\n"
                     "  always @(posedge clk) y <= a;\nendmodule\n", "w")
    counts = {t["id"]: [int(n) for n in re.findall(r"repeat \((\d+)\)", teacher.template_code(t, "strong")
                                                   .split("initial begin")[-1])] for t in (small, big, padded, wide)}
    assert all(w < s for w, s in zip(counts["test_w"], counts["test_cnt"]))   # wide ports cost too
    assert counts["test_cnt"] == [300, 150, 300, 300, 100]       # as written up to CYCLE_BUDGET_CHARS
    assert counts["test_cnt_pad"] == counts["test_cnt"]          # comments do not count
    assert all(b < s for b, s in zip(counts["test_cnt_big"], counts["test_cnt"]))
    res = {"status": "ok", "overall_pct": 50.0, "uncovered": [{"metric": "fsm"}]}
    deep = {t["id"]: max(int(n) for n in re.findall(r"repeat \((\d+)\)", teacher.answer_code(
        teacher.refine(t, teacher.template_answer(t, "weak"), res))[-600:])) for t in (small, big)}
    assert deep["test_cnt_big"] < deep["test_cnt"]


def test_refine_stimulus_appends_directed_phases():
    t = TASKS[0]
    weak = teacher.stimulus_answer(t, "weak")
    result = uncovered_result(deep_q=False)
    old = harness.parse_stimulus(weak).body
    new = harness.parse_stimulus(teacher.refine_stimulus(t, weak, result)).body
    assert new.startswith(old + "\nbegin : tb_refine_0\n")       # an edit of the stimulus, not a rewrite
    assert "din = din | 8'h88; step(1); din = din & ~8'h88; step(1);" in new
    assert "rst_n = 1'b0; repeat (2) step(1); rst_n = 1'b1; step(1);" in new
    assert re.search(r"\{en, op\} = tb_i", new) and "@(negedge" not in new
    assert harness.check_stimulus(new, harness.make_harness(t)) is None
    again = harness.parse_stimulus(teacher.refine_stimulus(t, harness.render_stimulus(new), result)).body
    assert "begin : tb_refine_3" in again                         # fresh block names on a second round
    strong = teacher.stimulus_answer(t, "strong")
    assert teacher.refine_stimulus(t, "junk", None) == strong
    assert teacher.refine_stimulus(t, weak, harness.rejected_result(t["id"], "line 1: no")) == strong
    assert teacher.refine_stimulus(t, weak, {"status": "timeout"}) == teacher.stimulus_answer(t, "medium")


@pytest.mark.needs_iverilog
def test_stimulus_beats_the_floor_and_refinement_improves():
    for t in TASKS + _design_tasks():
        floor, weak, strong = _scored_stimulus(t, [teacher.stimulus_answer(t, lv) for lv in ("minimal", "weak", "strong")])
        assert floor["status"] == weak["status"] == strong["status"] == "ok", t["id"]
        assert strong["overall_pct"] > floor["overall_pct"] + 20, (t["id"], floor["overall_pct"], strong["overall_pct"])
        if weak["overall_pct"] < 100:
            (ref,) = _scored_stimulus(t, [teacher.refine_stimulus(t, teacher.stimulus_answer(t, "weak"), weak)])
            assert ref["status"] == "ok" and ref["overall_pct"] > weak["overall_pct"], (t["id"], weak["overall_pct"])


@pytest.mark.needs_iverilog
def test_stimulus_corruptions_fail_and_refine_fixes():
    t = TASKS[1]
    base = teacher.stimulus_answer(t, "weak")
    for kind in teacher.STIMULUS_CORRUPTIONS:
        bad_text = teacher.corrupt_stimulus(t, base, kind)
        (bad,) = _scored_stimulus(t, [bad_text], allow_rejected=True)   # the check or the compiler refuses it
        assert bad["status"] in ("rejected", "compile_error"), (kind, bad["status"])
        (good,) = _scored_stimulus(t, [teacher.refine_stimulus(t, bad_text, bad)])
        assert good["status"] == "ok", (kind, good.get("errors"))


def test_teachers_in_stimulus_mode(monkeypatch):
    tt = teacher.TemplateTeacher("weak", seed=2, mode="stimulus")
    out = tt.direct(TASKS[:2], n=2)
    assert out[0] == [teacher.stimulus_answer(TASKS[0], "weak", 2), teacher.stimulus_answer(TASKS[0], "weak", 3)]
    assert tt.refine([(TASKS[1], "junk", None)]) == [teacher.stimulus_answer(TASKS[1], "strong", 2)]
    with pytest.raises(ValueError, match="answer mode"):
        teacher.TemplateTeacher(mode="whole")
    common = pytest.importorskip("common")
    calls = _spy_generate(monkeypatch, common)
    model, tok = common.tiny_model(seed=0)
    ht = teacher.HFTeacher(model, tok, max_new_tokens=4, temperature=1.0, top_p=1.0, mode="stimulus")
    ht.direct(TASKS[:1], n=1)
    ht.refine([(TASKS[0], "junk", None)])
    h = harness.make_harness(TASKS[0])
    assert calls[0]["messages"] == [harness.stimulus_messages(TASKS[0], h)]
    assert calls[1]["messages"] == [harness.stimulus_refine_messages(TASKS[0], h, "junk", None)]
