"""Teachers that write execution-validated stimulus testbenches for the SFT data (docs/method.md §3.3).

Two teachers share one interface (`Teacher` below):
- `TemplateTeacher`: rule based, no model. It reads the DUT's ports with pyslang (clock and reset
  detection, widths), writes a compact testbench from a named strength level, and REFINES a given
  testbench from the scorer's uncovered items by editing it (extra phases inserted before `$finish`).
- `ChatTeacher(url, model)`: any OpenAI-compatible chat endpoint (POST /v1/chat/completions), for
  users with a large teacher model. Prompts come from common.build_messages / common.refine_messages.
- `HFTeacher(model, tok, ...)`: a loaded HF model (optionally one named peft adapter on it) sampled
  with common.generate on the same prompts (direct: build_messages; refine: the memoryless state
  refine_messages(task, answer, result)).

Answer modes (`mode=`): "testbench" (whole testbenches, the paper's format) or "stimulus" (the
body of harness.py's `stimulus` block: `template_stimulus` / `stimulus_answer` write the same phases in
the harness's vocabulary, `refine_stimulus` appends directed phases to a stimulus, `corrupt_stimulus`
breaks one; the results table's floor is FLOOR_LEVEL, its ceiling CEILING_LEVEL). The DUT analysis
(`analyze_dut`, `TeacherError` = harness.HarnessError) lives in harness.py; the answer format is
common.render_answer / common.parse_answer. Cycle counts are sized to the design: up to
CYCLE_BUDGET_CHARS of RTL as written, fewer in proportion beyond.

Teacher protocol: `direct(tasks, n) -> list[list[str]]` (n answer texts per task) and
`refine(states) -> list[str]` (one answer per state (task, answer_text, result); result is a SimResult,
its dict, or None when the answer did not parse, i.e. nothing was simulated).

Strength levels of the template teacher (weakest first):
  minimal  inputs at zero, one reset, a few cycles
  weak     reset + 8 random vectors
  medium   reset + corner values (0, all-ones) + 100 random vectors
  strong   reset + corners (0, ones, alternating) + walking ones/zeros + exhaustive sweep of narrow
           inputs + held/sparse/dense random sequences (FSMs, counters) + a mid-run reset pulse
  long     strong with 20x longer random sequences (used to measure reachable coverage)

Reachable targets (`calibrate`): the best overall coverage (sim.py metric) of the long template and
one refinement of it; the task gets a target entry `icarus_overall_average` =
min(cvdp_target, floor(reached)) (CVDP targets are 90, calibrated for Xcelium/IMC).

CLI:
  python data/teacher.py show TASKS.jsonl --id ID --level strong     # print one testbench
  python data/teacher.py show TASKS.jsonl --id ID --mode stimulus    # print one stimulus and its harness
  python data/teacher.py calibrate TASKS.jsonl --out tasks_cal.jsonl  # reachable targets
Files written: only by `calibrate` (--out, the tasks with an added Icarus target and a
`icarus_calibration` record).
"""
import argparse
import json
import math
import re
import sys
import urllib.request
from pathlib import Path

import pyslang

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # kit root: sim.py, common.py, harness.py
import common  # noqa: E402
import harness  # noqa: E402
import sim  # noqa: E402
import simpool  # noqa: E402
from harness import HarnessError, analyze_dut  # noqa: E402  (re-exported: callers use teacher.analyze_dut)

LEVELS = ("minimal", "weak", "medium", "strong", "long")
ICARUS_METRIC = "icarus_overall_average"
EXHAUSTIVE_BITS = 12        # sweep every input combination when the data inputs total <= this
# Cap on a refinement's long run (counters/FSMs). One long run is up to ~2.6 x this many clock periods of 10
# time units (three phases: random bursts, sparse values, all-ones); two refinements on the strong template
# must end inside the scorer's simulated-time limit (sim.SIM_TIME_LIMIT_DEFAULT, 1e6 units): 65536 took
# 1.7e6, and 14 % of the testbench-mode stage-1 states of results/stage0_real_mix.md's build hit it.
MAX_DEEP_CYCLES = sim.SIM_TIME_LIMIT_DEFAULT // (2 * 3 * 10)      # 16666 cycles
CYCLE_BUDGET_CHARS = 4000   # RTL size (characters) up to which cycle counts are used as written; larger
                            # designs get proportionally fewer cycles (issue 16: 20 s timeouts)


TeacherError = HarnessError     # a design the template teacher cannot drive (harness.py says why)


def answer_code(answer_text):
    """The testbench code of an answer text (common.parse_answer), or None when it has no code block."""
    return common.parse_answer(answer_text).code or None


def _as_dict(result):
    """A SimResult or its dict as a dict; None (a parse failure: nothing was simulated) -> {}."""
    if result is None:
        return {}
    return result.to_dict() if hasattr(result, "to_dict") else dict(result)


# ----------------------------------------------------------------------------------------------
# Templates
# ----------------------------------------------------------------------------------------------

LEVEL_KNOBS = {   # n_random: random vectors; the strong phases scale with `scale`
    "minimal": {"n_random": 0, "corners": False, "strong": False, "scale": 0},
    "weak": {"n_random": 8, "corners": False, "strong": False, "scale": 0},
    "medium": {"n_random": 100, "corners": True, "strong": False, "scale": 0},
    "strong": {"n_random": 300, "corners": True, "strong": True, "scale": 1},
    "long": {"n_random": 3000, "corners": True, "strong": True, "scale": 10},
}


def testbench_name(info):
    return f"tb_{info['top']}"


def _budget(info):
    """Share of the template's cycle counts a design gets: 1 up to a cost of CYCLE_BUDGET_CHARS, then
    inversely to the cost, at least 1/20. Cost: the RTL's characters (comments left out) or 32 per port
    bit, whichever is larger (a simulated cycle costs about in proportion to the RTL, and wide ports
    mean wide toggle monitors: a 256-cell array of 900 characters ran 7 s at full length)."""
    size = sum(len(re.sub(r"//[^\n]*|/\*.*?\*/", "", t, flags=re.S)) for t in info["rtl"].values())
    cost = max(size, 32 * sum(p["width"] for p in info["ports"]))
    return max(0.05, min(1.0, CYCLE_BUDGET_CHARS / max(1, cost)))


def _n(count, budget):
    return count if budget >= 1.0 else max(8, int(count * budget))


def _knobs(info, level):
    if level not in LEVEL_KNOBS:
        raise ValueError(f"unknown level {level!r}; choose from {', '.join(LEVELS)}")
    k = dict(LEVEL_KNOBS[level])
    W = sum(d["width"] for d in info["data"])
    if level == "long" and W > 64:      # wide designs are slow to simulate: fewer, still long, runs
        k["n_random"], k["scale"] = k["n_random"] * 64 // W, max(1, k["scale"] * 64 // W)
    return k, W


def _level_body(info, level, v):
    """The stimulus statements of one strength level, in a vocabulary `v`: W (the data width as text),
    drive(x) (assign x to all data inputs at once), step, reset, rnd (a W-bit random value), var (a
    W-bit scratch variable), start (statements that zero the inputs and reset the DUT)."""
    k, W = _knobs(info, level)
    b = _budget(info)
    clocked = bool(info["clocks"])
    TW, drive, step, rnd = v["W"], v["drive"], v["step"], v["rnd"]
    body = list(v["start"])
    if level == "minimal":
        body.append(f"repeat (4) {step}")
    if W and k["corners"]:
        body.append(f"{drive(chr(39) + '1')} {step} {step} {drive(chr(39) + '0')} {step} {step}")
    if W and k["strong"]:
        body.append(f"{drive(f'{{({TW}+1)/2{{2{chr(39)}b01}}}}')} {step} {drive(f'{{({TW}+1)/2{{2{chr(39)}b10}}}}')} {step}")
        body.append(f"for (int i = 0; i < {TW}; i++) begin {v['var']} = '0; {v['var']}[i] = 1'b1; {drive(v['var'])} {step} end")
        body.append(f"for (int i = 0; i < {TW}; i++) begin {v['var']} = '1; {v['var']}[i] = 1'b0; {drive(v['var'])} {step} end")
        if W <= EXHAUSTIVE_BITS:
            body.append(f"for (int i = 0; i < (1 << {TW}); i++) begin {drive('i')} {step} end")
        else:
            for d in info["data"]:
                if d["width"] <= 8:
                    body.append(f"for (int i = 0; i < {1 << d['width']}; i++) begin "
                                f"{drive(rnd)} {d['name']} = i; {step} end")
    if W and k["n_random"]:
        body.append(f"repeat ({_n(k['n_random'], b)}) begin {drive(rnd)} {step} end")
    if W and k["strong"] and clocked:
        s = k["scale"]
        body.append(f"repeat ({_n(150 * s, b)}) begin {drive(rnd)} repeat (1 + {v['urnd']} % 8) {step} end")
        body.append(f"repeat ({_n(300 * s, b)}) begin {drive(f'{rnd} & {rnd} & {rnd}')} {step} end")
        body.append(f"repeat ({_n(300 * s, b)}) begin {drive(f'{rnd} | {rnd} | {rnd}')} {step} end")
    if k["strong"] and clocked and not W:
        body.append(f"repeat ({_n(2000 * k['scale'], b)}) {step}")
    if k["strong"] and info["resets"]:
        body.append(v["reset"])
        if W:
            body.append(f"repeat ({_n(100 * k['scale'], b)}) begin {drive(rnd)} {step} end")
    return body


def template_code(task, level="strong", seed=0):
    """SystemVerilog code of a template testbench at one strength level (see the module docstring)."""
    info = analyze_dut(task)
    k, W = _knobs(info, level)
    clocked = bool(info["clocks"])
    L = []
    if info["timescale"]:
        L.append(info["timescale"])
    L.append(f"module {testbench_name(info)};")
    L.append(f"  integer tb_seed = {seed * 7919 + 1};")
    for p in info["ports"]:
        rng = f"[{p['width'] - 1}:0] " if p["width"] > 1 else ""
        L.append(f"  {'logic' if p['dir'] == 'input' else 'wire'} {rng}{p['name']};")
    if W:
        L.append(f"  localparam int TB_W = {W};")
        L.append("  logic [TB_W-1:0] tb_v;")
    conns = ", ".join(f".{p['name']}({p['name']})" for p in info["ports"])
    L.append(f"  {info['top']} {info['inst']} ({conns});")
    for i, c in enumerate(info["clocks"]):
        L.append(f"  initial {c} = 1'b0;")
        L.append(f"  always #{5 + 2 * i} {c} = ~{c};")
    if W:
        words = ", ".join(["$random(tb_seed)"] * math.ceil(W / 32))
        L.append("  function automatic logic [TB_W-1:0] tb_rnd();")
        L.append(f"    return {{{words}}};")
        L.append("  endfunction")
        L.append(f"  task tb_drive(input logic [TB_W-1:0] v); {{{', '.join(d['name'] for d in info['data'])}}} = v; endtask")
    step = f"@(negedge {info['clocks'][0]});" if clocked else "#5;"
    L.append(f"  task tb_step; {step} endtask")
    if info["resets"]:
        on = "; ".join(f"{r['name']} = 1'b{0 if r['active_low'] else 1}" for r in info["resets"])
        off = "; ".join(f"{r['name']} = 1'b{1 if r['active_low'] else 0}" for r in info["resets"])
        L.append(f"  task tb_reset; {on}; repeat (2) tb_step; {off}; tb_step; endtask")
    L.append("  initial begin")
    start = (["tb_drive('0);"] if W else []) + (["tb_reset;"] if info["resets"] else ["tb_step;"])
    voc = {"W": "TB_W", "drive": lambda x: f"tb_drive({x});", "step": "tb_step;", "reset": "tb_reset;",
           "rnd": "tb_rnd()", "urnd": "{$random(tb_seed)}", "var": "tb_v", "start": start}
    body = _level_body(info, level, voc) + ["// end of stimulus", "$finish;"]
    L.extend("    " + b for b in body)
    L.append("  end")
    L.append("endmodule")
    return "\n".join(L) + "\n"


def template_answer(task, level="strong", seed=0):
    """The answer text (filename line + systemverilog block) of a template testbench."""
    info = analyze_dut(task)
    return common.render_answer(testbench_name(info).lower() + ".sv", template_code(task, level, seed))


# ----------------------------------------------------------------------------------------------
# Feedback-directed refinement (edits the given testbench)
# ----------------------------------------------------------------------------------------------

def _tb_port_map(code, info):
    """DUT port -> testbench signal name, for ports wired to a plain, procedurally drivable signal."""
    m = re.search(r"\b" + re.escape(info["top"]) + r"\s*(#\s*\((?:[^()]|\([^()]*\))*\))?\s*"
                  + re.escape(info["inst"]) + r"\s*\(((?:[^()]|\((?:[^()]|\([^()]*\))*\))*)\)\s*;", code)
    if not m:
        return None
    conns = m.group(2)
    pairs = dict(re.findall(r"\.\s*(\w+)\s*\(\s*([A-Za-z_]\w*)\s*\)", conns))
    if re.search(r"\.\s*\*", conns):
        for p in info["ports"]:
            pairs.setdefault(p["name"], p["name"])
    if not pairs and "." not in conns:        # positional connections
        names = [c.strip() for c in conns.split(",")]
        pairs = {p["name"]: n for p, n in zip(info["ports"], names) if re.fullmatch(r"[A-Za-z_]\w*", n)}
    out = {}
    for port, sig in pairs.items():
        if re.search(r"\b(reg|logic|bit)\b[^;()]*\b" + re.escape(sig) + r"\b", code):
            out[port] = sig
    return out


def _finish_pos(code):
    """Offset where refinement phases are inserted: before the last un-delayed `$finish`."""
    best = None
    for m in re.finditer(r"\$finish\b", code):
        before = code[max(0, m.start() - 40):m.start()]
        if re.search(r"#\s*[\w.()*+\-]+\s*$", before):      # watchdog `#N $finish`
            continue
        best = m.start()
    if best is None:
        return None
    marker = code.rfind("// end of stimulus", 0, best)
    if marker != -1 and "\n" not in code[marker:best].split("\n", 1)[-1].strip():
        return marker
    line_start = code.rfind("\n", 0, best) + 1
    return line_start if code[line_start:best].strip() == "" else best


_LIT = re.compile(r"(\d*)\s*'\s*[sS]?([bBoOdDhH])\s*([0-9a-fA-FxXzZ?_]+)|\b(\d+)\b")


def _literals(text):
    vals = set()
    for m in _LIT.finditer(text):
        if m.group(4):
            vals.add(int(m.group(4)))
            continue
        base = {"b": 2, "o": 8, "d": 10, "h": 16}[m.group(2).lower()]
        digits = m.group(3).replace("_", "")
        for fill in "01":
            try:
                vals.add(int(re.sub(r"[xXzZ?]", fill if base == 2 else ("0" if fill == "0" else "f" if base == 16 else "7"),
                                    digits), base))
            except ValueError:
                pass
    return sorted(v for v in vals if v < (1 << 64))


def _control_context(info, file, line):
    """Condition/selector texts of the if/case/?: constructs enclosing (or on) a DUT line."""
    src = info["rtl"].get(file)
    if src is None and len(info["rtl"]) == 1:
        src = next(iter(info["rtl"].values()))
    if src is None or not line:
        return []
    tree = pyslang.syntax.SyntaxTree.fromText(src)
    sm = tree.sourceManager
    K = pyslang.syntax.SyntaxKind
    texts = []

    def visit(n):
        if n.kind in (K.CaseStatement, K.ConditionalStatement, K.ConditionalExpression):
            a, b = sm.getLineNumber(n.sourceRange.start), sm.getLineNumber(n.sourceRange.end)
            if a <= line <= b:
                if n.kind == K.CaseStatement:
                    texts.append(str(n.expr))
                    for it in n.items:
                        if sm.getLineNumber(it.sourceRange.start) <= line <= sm.getLineNumber(it.sourceRange.end):
                            texts.append(str(it).split(":")[0])
                elif n.kind == K.ConditionalStatement:
                    texts.append(str(n.predicate))
                else:
                    texts.append(str(n.predicate))
        return True

    tree.root.visit(visit)
    if not texts:
        texts.append(src.splitlines()[line - 1] if 0 < line <= len(src.splitlines()) else "")
    return texts


def _hex(width, value):
    return f"{width}'h{value & ((1 << width) - 1):x}"


def _phases(info, pmap, result, code, step=None):
    """Stimulus phases (SystemVerilog statements) that target the result's uncovered items. `step`: the
    statement that waits one cycle (default: the clock's falling edge, or #5 without a clock)."""
    clk = pmap.get(info["clocks"][0]) if info["clocks"] else None
    if info["clocks"] and not clk:
        return None
    step = step or (f"@(negedge {clk});" if clk else "#5;")
    data = [d for d in info["data"] if d["name"] in pmap]
    widths = {d["name"]: d["width"] for d in data}
    sig = {d["name"]: pmap[d["name"]] for d in data}
    rst = {r["name"]: r for r in info["resets"] if r["name"] in pmap}
    rnd_all = " ".join(f"{sig[d['name']]} = {{{', '.join(['$urandom'] * math.ceil(d['width'] / 32))}}};"
                       for d in data)
    phases, deep_bits, sweep_ports, literals = [], -1, [], set()
    toggled = set()
    uncovered = result.get("uncovered") or []
    for it in uncovered:
        metric, kind = it.get("metric"), it.get("kind")
        inst_path = it.get("instance") or ""
        at_top = inst_path.split(".")[-1] == info["inst"] or inst_path == info["inst"]
        if metric == "toggle":
            s = it.get("signal")
            bits = it.get("bits") or []
            if at_top and s in rst and s not in toggled:
                r = rst[s]
                a, i = (0, 1) if r["active_low"] else (1, 0)
                phases.append(f"// reset pulse: toggle {s}\n{pmap[s]} = 1'b{a}; repeat (2) {step} {pmap[s]} = 1'b{i}; {step}")
                toggled.add(s)
            elif at_top and s in widths and s not in toggled:
                w = widths[s]
                mask = sum(1 << b for b in bits if b < w) or (1 << w) - 1
                t = sig[s]
                phases.append(f"// toggle {s} bits {bits or 'all'} both ways\n"
                              f"repeat (2) begin {t} = {t} | {_hex(w, mask)}; {step} {t} = {t} & ~{_hex(w, mask)}; {step} end")
                toggled.add(s)
            elif not (at_top and s in info["clocks"]):
                deep_bits = max(deep_bits, max(bits) if bits else 0)
        elif metric == "fsm":
            deep_bits = max(deep_bits, 8)
        elif metric in ("block", "branch", "expression"):
            ctx = _control_context(info, it.get("file"), it.get("line"))
            text = " ".join(ctx)
            if metric == "expression":
                text += " " + (it.get("expr") or "")
                row = re.match(r"\s*(.+?)\s*=\s*([01])\s+while others\s+([01])", it.get("row") or "")
                if row:
                    term, tv, ov = row.group(1), row.group(2), row.group(3)
                    terms = [x.strip() for x in re.split(r"&&|\|\|", it.get("expr") or "") if x.strip()]
                    sets = []
                    for x in terms:
                        v = tv if x == term else ov
                        neg = re.fullmatch(r"[!~]\s*(\w+)", x)
                        name = neg.group(1) if neg else x
                        if name in widths and widths[name] == 1:
                            sets.append(f"{sig[name]} = 1'b{int(v) ^ (1 if neg else 0)};")
                    if sets and len(sets) == len(terms):
                        phases.append(f"// expression row: {it.get('row')}\n{' '.join(sets)} repeat (2) {step}")
                        continue
            names = [n for n in re.findall(r"[A-Za-z_]\w*", text) if n in widths]
            if names:
                for n in names:
                    if n not in sweep_ports:
                        sweep_ports.append(n)
                literals.update(_literals(text))
            else:
                deep_bits = max(deep_bits, 6)
                literals.update(_literals(text))
    if sweep_ports:
        total = sum(widths[n] for n in sweep_ports)
        if total <= EXHAUSTIVE_BITS:
            cat = "{" + ", ".join(sig[n] for n in sweep_ports) + "}"
            phases.append(f"// sweep {', '.join(sweep_ports)} (conditions of uncovered branches)\n"
                          f"for (int tb_i = 0; tb_i < {1 << total}; tb_i++) begin {rnd_all} {cat} = tb_i; {step} {step} end")
        else:
            for n in sweep_ports[:4]:
                w = widths[n]
                m = (1 << w) - 1
                lits = [v & m for v in sorted(literals)]
                order = lits + [0, m, 1 << (w - 1)] + [(v + 1) & m for v in lits] + [(v - 1) & m for v in lits]
                vals = list(dict.fromkeys(order))[:16]
                phases.append(_literal_case(n, sig[n], w, vals, rnd_all, step))
    if deep_bits >= 0:
        width = sum(d["width"] for d in data)      # wide designs simulate slowly: shorter runs
        cycles = min(MAX_DEEP_CYCLES, max(512, 1 << min(16, deep_bits + 2))) * 32 // max(32, width)
        cycles = _n(cycles, _budget(info))                  # and large designs too
        if clk:
            if data:
                sparse = " ".join(f"{sig[d['name']]} = {{{', '.join(['$urandom'] * math.ceil(d['width'] / 32))}}} & "
                                  f"{{{', '.join(['$urandom'] * math.ceil(d['width'] / 32))}}};" for d in data)
                ones = " ".join(f"{sig[d['name']]} = '1;" for d in data if d["width"] == 1)
                phases.append(f"// long runs for deep counter values / FSM states\n"
                              f"repeat ({max(64, cycles // 8)}) begin {rnd_all} repeat (1 + $urandom % 8) {step} end\n"
                              f"repeat ({cycles}) begin {sparse} {step} end"
                              + (f"\n{ones} repeat ({cycles}) {step}" if ones else ""))
            else:
                phases.append(f"// long run for deep counter values\nrepeat ({cycles}) {step}")
        elif data:
            phases.append(f"// more random vectors\nrepeat ({min(cycles, 4096)}) begin {rnd_all} {step} end")
    return phases


def _literal_case(n, s, w, vals, rnd_all, step):
    lines = [f"// drive {n} with the constants of the uncovered conditions (others random)"]
    lines.append(f"for (int tb_i = 0; tb_i < {len(vals)}; tb_i++) begin")
    lines.append(f"  {rnd_all}")
    lines.append("  case (tb_i)")
    lines.extend(f"    {i}: {s} = {_hex(w, v)};" for i, v in enumerate(vals))
    lines.append("  endcase")
    lines.append(f"  {step} {step}")
    lines.append("end")
    return "\n".join(lines)


def refine(task, answer_text, result, seed=0):
    """The teacher's improved answer for one state (testbench + its scorer result).

    - compile/reject/no-coverage failures: fall back to a fresh strong template;
    - wrong instance name (`no_dut_instance`): rename the instance in place;
    - timeout / simulated-time limit / output limit: fall back to the medium template (short);
    - ok: insert phases before `$finish` that target the uncovered items (toggle the missing input
      bits both ways, pulse the reset, sweep or drive the inputs in uncovered conditions with their
      constants, hold expression rows, long runs for deep counters/FSM states).
    """
    info = analyze_dut(task)
    res = _as_dict(result)
    status = res.get("status")
    code = answer_code(answer_text)
    fname = testbench_name(info).lower() + ".sv"
    if code is None:
        return template_answer(task, "strong", seed)
    if status == "no_dut_instance":
        fixed = re.sub(r"(\b" + re.escape(info["top"]) + r"\s*(#\s*\((?:[^()]|\([^()]*\))*\))?\s*)([A-Za-z_]\w*)(\s*\()",
                       lambda m: m.group(1) + info["inst"] + m.group(4), code, count=1)
        if fixed != code:
            return common.render_answer(fname, fixed)
        return template_answer(task, "strong", seed)
    if status in ("timeout", "sim_time_limit", "output_limit"):
        return template_answer(task, "medium", seed)
    if status != "ok":
        return template_answer(task, "strong", seed)
    pmap = _tb_port_map(code, info)
    pos = _finish_pos(code)
    phases = _phases(info, pmap, res, code) if pmap is not None else None
    if pmap is None or pos is None or phases is None:
        base = template_code(task, "strong", seed)
        pmap = {p["name"]: p["name"] for p in info["ports"]}
        phases = _phases(info, pmap, res, base) or []
        code, pos = base, _finish_pos(base)
    if not phases:   # nothing specific to chase: add a long random run
        phases = _phases(info, pmap, {"uncovered": [{"metric": "fsm"}]}, code) or []
    indent = re.match(r"[ \t]*", code[code.rfind("\n", 0, pos) + 1:]).group(0) or "    "
    first = len(re.findall(r"\btb_refine_\d+", code))       # fresh block names on a second refinement
    block = "".join(f"begin : tb_refine_{first + i}\n" + "\n".join(indent + "  " + ln for ln in ph.splitlines())
                    + f"\n{indent}end\n{indent}" for i, ph in enumerate(phases))
    return common.render_answer(fname, code[:pos] + block + code[pos:])


# ----------------------------------------------------------------------------------------------
# Failing states (typical testbench mistakes), for compile-fix refinement rows
# ----------------------------------------------------------------------------------------------

CORRUPTIONS = ("wrong_instance", "syntax", "undeclared", "unsupported")


def corrupt(task, answer_text, kind, seed=0):
    """A broken copy of an answer: one of CORRUPTIONS (the mistakes small models make)."""
    info = analyze_dut(task)
    code = answer_code(answer_text)
    fname = testbench_name(info).lower() + ".sv"
    if kind == "wrong_instance":
        wrong = "dut_0" if info["inst"] != "dut_0" else "uut_0"
        code = code.replace(f" {info['inst']} (", f" {wrong} (", 1)
    elif kind == "syntax":
        code = code.replace("endtask", "endtask;\n  task", 1) if seed % 2 else code.replace(";\n", "\n", 1)
    elif kind == "undeclared":
        code = code.replace("initial begin", "initial begin\n    tb_unused_sig = 1'b0;", 1)
    elif kind == "unsupported":
        code = code.replace("initial begin", "initial begin\n    assert property (@(posedge tb_seed[0]) 1);", 1)
    else:
        raise ValueError(f"unknown corruption {kind!r}; choose from {', '.join(CORRUPTIONS)}")
    return common.render_answer(fname, code)


# ----------------------------------------------------------------------------------------------
# Stimulus-mode answers (answer_mode "stimulus": harness.py writes the harness, the teacher the stimulus)
# ----------------------------------------------------------------------------------------------

ANSWER_MODES = harness.ANSWER_MODES
FLOOR_LEVEL, CEILING_LEVEL = "minimal", "strong"    # the results table's floor and ceiling stimulus


def template_stimulus(task, level="strong", seed=0):
    """The stimulus body of one strength level, in the harness's vocabulary (step, reset_dut): the same
    phases as the template testbench, driving the DUT's own inputs. Raises HarnessError (via
    harness.make_harness) for a design the kit cannot harness."""
    harness.make_harness(task)
    info = analyze_dut(task)
    W = sum(d["width"] for d in info["data"])
    names = [d["name"] for d in info["data"]]
    cat = names[0] if len(names) == 1 else "{" + ", ".join(names) + "}"
    rnd = "{" + ", ".join(["$random(tb_seed)"] * math.ceil(W / 32)) + "}"
    voc = {"W": str(W), "drive": lambda x: f"{cat} = {x};", "step": "step(1);", "reset": "reset_dut();",
           "rnd": rnd, "urnd": "{$random(tb_seed)}", "var": "tb_v", "start": []}
    body = _level_body(info, level, voc) or ["step(1);"]       # no inputs, no clock: still one statement
    text = "\n".join(body)
    decl = [f"logic [{W - 1}:0] tb_v;"] if "tb_v" in text else []
    if "tb_seed" in text:
        decl = ["integer tb_seed;"] + decl + [f"tb_seed = {seed * 7919 + 1};"]
    return "\n".join(decl + body) + "\n"


def stimulus_answer(task, level="strong", seed=0):
    """The answer text (one systemverilog block) of a template stimulus."""
    return harness.render_stimulus(template_stimulus(task, level, seed))


def refine_stimulus(task, answer_text, result, seed=0):
    """The teacher's improved stimulus for one state (stimulus answer + the scorer's result of the
    assembled testbench): on ok, the given stimulus with phases appended that target the uncovered
    items (as `refine` does for testbenches, in the harness's vocabulary); a parse failure, a rejected
    or failing stimulus gets the strong template; a timeout, simulated-time limit or output limit the
    medium one."""
    info = analyze_dut(task)
    st = harness.parse_stimulus(answer_text)
    res = _as_dict(result)
    status = res.get("status")
    if status in ("timeout", "sim_time_limit", "output_limit"):
        return stimulus_answer(task, "medium", seed)
    if st.reason != "ok" or status != "ok":
        return stimulus_answer(task, "strong", seed)
    pmap = {p["name"]: p["name"] for p in info["ports"]}       # the harness names signals after ports
    phases = _phases(info, pmap, res, st.body, step="step(1);") or \
        _phases(info, pmap, {"uncovered": [{"metric": "fsm"}]}, st.body, step="step(1);") or []
    first = len(re.findall(r"\btb_refine_\d+", st.body))     # fresh block names on a second refinement
    blocks = [f"begin : tb_refine_{first + i}\n" + "\n".join("  " + ln for ln in ph.splitlines()) + "\nend"
              for i, ph in enumerate(phases)]
    return harness.render_stimulus("\n".join([st.body.rstrip("\n")] + blocks))


STIMULUS_CORRUPTIONS = ("syntax", "undeclared", "unsupported")


def corrupt_stimulus(task, answer_text, kind, seed=0):
    """A broken copy of a stimulus answer: one of STIMULUS_CORRUPTIONS."""
    body = harness.parse_stimulus(answer_text).body
    lines = body.splitlines()
    at = min(len(lines), 1 + seed % max(1, len(lines)))             # after this line
    if kind == "syntax":
        i = next((j for j in range(at - 1, len(lines)) if lines[j].rstrip().endswith(";")), None)
        if i is None:
            lines.append("step(1)")
        else:
            lines[i] = lines[i].rstrip()[:-1]
    elif kind == "undeclared":
        lines.insert(at, "tb_unused_sig = 1'b0;")
    elif kind == "unsupported":
        lines.insert(at, "assert property (@(posedge tb_unused_clk) 1);")
    else:
        raise ValueError(f"unknown corruption {kind!r}; choose from {', '.join(STIMULUS_CORRUPTIONS)}")
    return harness.render_stimulus("\n".join(lines))


# the mode's prompts (harness.py's dispatch: a design the kit cannot harness is answered in testbench mode)
_first_messages = harness.first_messages
_refine_state = harness.refine_state_messages
_check_mode = harness.check_mode


# ----------------------------------------------------------------------------------------------
# Teacher interface
# ----------------------------------------------------------------------------------------------
# Teacher protocol: any object with
#   direct(tasks, n) -> list[list[str]]   n answer texts per task
#   refine(states)   -> list[str]         one improved answer per (task, answer_text, result) state;
#                                         result None = the answer did not parse (nothing simulated)

class TemplateTeacher:
    """Rule-based teacher. `level` is the strength of direct answers; tries differ by seed; `mode`
    "stimulus" answers with stimulus bodies for harness.py's harness instead of whole testbenches."""

    def __init__(self, level="strong", seed=0, mode="testbench"):
        if level not in LEVEL_KNOBS:
            raise ValueError(f"unknown level {level!r}; choose from {', '.join(LEVELS)}")
        self.level, self.seed, self.mode = level, seed, _check_mode(mode)

    def direct(self, tasks, n=1):
        make = lambda t: stimulus_answer if harness.task_mode(t, self.mode) == "stimulus" else template_answer
        return [[make(t)(t, self.level, self.seed + i) for i in range(n)] for t in tasks]

    def refine(self, states):
        fix = lambda t: refine_stimulus if harness.task_mode(t, self.mode) == "stimulus" else refine
        return [fix(t)(t, a, r, self.seed) for t, a, r in states]


def teacher_policy(tasks, level="strong", mode="testbench", seed=0, target_mode="cvdp", sim_cfg=None):
    """The template teacher as an evaluation Policy (message lists -> answer texts): the baseline
    `teacher:LEVEL` of evaluate.py. A Policy sees messages only, so the task is found by its first user
    message (harness.first_messages of each of `tasks`), and the k-th initial prompt of a task is answered
    with seed + k (as TemplateTeacher.direct's n tries). A refinement state [system, user, answer, feedback]
    is answered by TemplateTeacher.refine, which needs the scorer's structured result: the answer shown is
    scored again here (once per distinct answer; the scorer is deterministic), since the feedback text
    holds only part of it. A design the teacher cannot drive gets a text without code (no_code)."""
    import score            # here: the data builders that import this file need no scorer

    by_prompt = {harness.first_messages(t, mode)[1]["content"]: t for t in tasks}
    teach = TemplateTeacher(level, seed, mode)
    seen, scored = {}, {}

    def result_of(task, text):
        key = (task["id"], text)
        if key not in scored:
            _, job, res = score.prepare_answer(task, text, target_mode, mode)
            scored[key] = res if job is None else sim.simulate(job, sim_cfg).to_dict()
        return None if score.is_parse_failure(scored[key]) else scored[key]

    def answer(msgs):
        task = by_prompt.get(msgs[1]["content"])
        if task is None:
            raise ValueError("teacher baseline: a prompt of no task it was given (build it with the eval's tasks)")
        try:
            if len(msgs) > 2:
                return teach.refine([(task, msgs[2]["content"], result_of(task, msgs[2]["content"]))])[0]
            k = seen[task["id"]] = seen.get(task["id"], -1) + 1
            return TemplateTeacher(level, seed + k, mode).direct([task], 1)[0][0]
        except TeacherError as e:
            return f"The template teacher cannot drive this design: {e}"

    def policy(messages_list):
        return [answer(m) for m in messages_list]
    return policy


class HFTeacher:
    """A teacher that is a loaded HF causal LM (common.load_model / common.tiny_model), sampled with
    common.generate. `adapter_name`: a peft adapter on the model made active for each call (the one
    active before is restored afterwards), e.g. a teacher adapter next to the student's. Each call uses
    seed + the call's index, so repeated calls sample differently but a run is reproducible."""

    def __init__(self, model, tok, *, max_new_tokens=2048, temperature=0.7, top_p=0.8, seed=0,
                 adapter_name=None, batch_size=64, mode="testbench"):
        self.model, self.tok, self.mode = model, tok, _check_mode(mode)
        self.max_new_tokens, self.temperature, self.top_p = max_new_tokens, temperature, top_p
        self.seed, self.adapter_name, self.batch_size = seed, adapter_name, batch_size
        self.calls = 0
        self.last_completions = []          # the common.Completion objects of the last call

    def _generate(self, messages_list):
        prev = None
        if self.adapter_name is not None:
            if self.adapter_name not in getattr(self.model, "peft_config", {}):
                raise ValueError(f"HFTeacher: the model has no adapter named {self.adapter_name!r}")
            prev = self.model.active_adapter
            prev_trainable = any(p.requires_grad for n, p in self.model.named_parameters() if f".{prev}." in n)
            self.model.set_adapter(self.adapter_name, inference_mode=True)
        try:
            comps = common.generate(self.model, self.tok, messages_list, max_new_tokens=self.max_new_tokens,
                                    temperature=self.temperature, top_p=self.top_p,
                                    seed=self.seed + self.calls, batch_size=self.batch_size)
        finally:
            if prev is not None and prev != self.adapter_name:
                self.model.set_adapter(prev, inference_mode=not prev_trainable)
        self.calls += 1
        self.last_completions = comps
        return [c.text for c in comps]

    def direct(self, tasks, n=1):
        texts = self._generate([_first_messages(t, self.mode) for t in tasks for _ in range(n)])
        return [texts[i * n:(i + 1) * n] for i in range(len(tasks))]

    def refine(self, states):
        return self._generate([_refine_state(t, a, r, self.mode) for t, a, r in states])


class ChatTeacher:
    """A teacher behind an OpenAI-compatible chat endpoint (POST {url}/v1/chat/completions)."""

    def __init__(self, url, model, api_key=None, temperature=0.7, top_p=0.8, max_tokens=8192, timeout_s=600,
                 mode="testbench"):
        self.mode = _check_mode(mode)
        self.url = url.rstrip("/")
        if not self.url.endswith("/chat/completions"):
            self.url += "/chat/completions" if self.url.endswith("/v1") else "/v1/chat/completions"
        self.model, self.api_key = model, api_key
        self.temperature, self.top_p, self.max_tokens, self.timeout_s = temperature, top_p, max_tokens, timeout_s

    def chat(self, messages):
        body = json.dumps({"model": self.model, "messages": messages, "temperature": self.temperature,
                           "top_p": self.top_p, "max_tokens": self.max_tokens}).encode()
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        req = urllib.request.Request(self.url, data=body, headers=headers, method="POST")
        with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
            data = json.loads(resp.read().decode())
        try:
            return data["choices"][0]["message"]["content"]
        except (KeyError, IndexError, TypeError):
            raise RuntimeError(f"chat endpoint {self.url}: unexpected reply {str(data)[:200]}")

    def direct(self, tasks, n=1):
        return [[self.chat(_first_messages(t, self.mode)) for _ in range(n)] for t in tasks]

    def refine(self, states):
        return [self.chat(_refine_state(t, a, r, self.mode)) for t, a, r in states]


# ----------------------------------------------------------------------------------------------
# Reachable (Icarus-calibrated) targets
# ----------------------------------------------------------------------------------------------

def icarus_target(reached_pct, cvdp_target=90.0):
    """The calibration rule: min(CVDP target, floor(reached overall %)); 0 when nothing ran."""
    if reached_pct is None:
        return 0.0
    return float(min(cvdp_target, math.floor(reached_pct)))


def calibrate(tasks, workers=None, cfg=None, progress=True, runs=None):
    """Tasks with an `icarus_overall_average` target from the long template + one refinement.

    Each returned task is a copy with `targets` (old entries kept, the Icarus one replaced) and
    `icarus_calibration` = {reached_pct, strong_pct, long_pct, refined_pct, rule}.
    runs: a dict to receive {task id: [(name, result dict), ...]} of the three runs, each with every
    uncovered item (data/skill.py's exclusion rule reads them).
    """
    jobs, keep, whole = [], [], runs is not None
    for t in tasks:
        try:
            answers = [template_answer(t, "strong", 0), template_answer(t, "long", 0)]
        except TeacherError as e:
            print(f"calibrate: {e}", file=sys.stderr)
            answers = None
        keep.append(answers)
        for a in answers or []:
            jobs.append(sim.job_from_task(t, answer_code(a), all_uncovered=whole))
    results = simpool.simulate_many(jobs, workers=workers, cfg=cfg, retry_starved=True)
    it = iter(results)
    per_task = [[_as_dict(next(it)) for _ in a] if a else [] for a in keep]
    ref_jobs, ref_idx = [], []
    for i, (t, answers, res) in enumerate(zip(tasks, keep, per_task)):
        if answers and res[1].get("status") == "ok" and (res[1].get("overall_pct") or 0) < 100:
            ans = refine(t, answers[1], res[1])
            ref_jobs.append(sim.job_from_task(t, answer_code(ans), all_uncovered=whole))
            ref_idx.append(i)
    ref_res = dict(zip(ref_idx, (_as_dict(r) for r in simpool.simulate_many(ref_jobs, workers=workers, cfg=cfg,
                                                                             retry_starved=True))))
    out = []
    for i, t in enumerate(tasks):
        pcts = {"strong_pct": None, "long_pct": None, "refined_pct": None}
        for name, r in zip(("strong_pct", "long_pct"), per_task[i]):
            pcts[name] = r.get("overall_pct") if r.get("status") == "ok" else None
        if i in ref_res and ref_res[i].get("status") == "ok":
            pcts["refined_pct"] = ref_res[i].get("overall_pct")
        if whole:
            runs[t["id"]] = list(zip(("teacher strong", "teacher long"), per_task[i])) + (
                [("teacher long + refinement", ref_res[i])] if i in ref_res else [])
        got = [v for v in pcts.values() if v is not None]
        reached = max(got) if got else None
        cvdp = [x["target_percentage"] for x in t.get("targets", []) if not x["metric"].startswith("icarus_")]
        target = icarus_target(reached, min(cvdp) if cvdp else 90.0)
        nt = dict(t)
        nt["targets"] = [x for x in t.get("targets", []) if x["metric"] != ICARUS_METRIC] + [
            {"inst_name": t["dut_instance_name"], "metric": ICARUS_METRIC, "target_percentage": target}]
        nt["icarus_calibration"] = {"reached_pct": reached, **pcts,
                                    "rule": "min(cvdp_target, floor(reached_pct)) over strong, long, long+refine"}
        out.append(nt)
    return out


# ----------------------------------------------------------------------------------------------
# CLI
# ----------------------------------------------------------------------------------------------

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("show", help="print one template testbench")
    s.add_argument("tasks")
    s.add_argument("--id", required=True)
    s.add_argument("--level", default="strong", choices=LEVELS)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--mode", default="testbench", choices=ANSWER_MODES)
    c = sub.add_parser("calibrate", help="add Icarus-calibrated reachable targets to tasks")
    c.add_argument("tasks")
    c.add_argument("--out", required=True)
    c.add_argument("--workers", type=int, default=None)
    c.add_argument("--limit", type=int, default=None, help="only the first N tasks")
    args = ap.parse_args(argv)
    tasks = sim.load_tasks(args.tasks)
    if args.cmd == "show":
        hit = [t for t in tasks if t["id"] == args.id]
        if not hit:
            sys.exit(f"error: no task with id {args.id!r} in {args.tasks}")
        try:
            if args.mode == "stimulus":
                print(harness.make_harness(hit[0]).source() + "\n" + stimulus_answer(hit[0], args.level, args.seed))
            else:
                print(template_answer(hit[0], args.level, args.seed))
        except HarnessError as e:
            sys.exit(f"error: {e}")
        return
    tasks = tasks[:args.limit] if args.limit else tasks
    out = calibrate(tasks, workers=args.workers)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w") as f:
        for t in out:
            f.write(json.dumps(t) + "\n")
    reached = [t["icarus_calibration"]["reached_pct"] for t in out]
    n90 = sum(1 for r in reached if r is not None and r >= 90)
    ran = [r for r in reached if r is not None]
    print(f"calibrated {len(out)} tasks -> {args.out}: reachable >= 90: {n90}/{len(out)}; "
          f"mean reached {sum(ran) / max(1, len(ran)):.1f}% over {len(ran)} that ran")


if __name__ == "__main__":
    main()
