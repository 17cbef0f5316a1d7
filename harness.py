"""harness.py: stimulus-only answers. The kit writes the testbench harness from the DUT's ports; the model
writes only the stimulus (the statements of one block); the kit assembles harness + stimulus into one
testbench, which the scorer (sim.py) runs exactly like a whole-testbench answer (pre-scan included).
Whole-testbench answers (answer_mode "testbench") keep common.build_messages / parse_answer.

The harness (one module `tb_<top>`): every DUT input declared as a `logic` of its elaborated width (wide
and packed ports become one flat vector), outputs as wires, the DUT instance with the task's instance name
(parameters at their defaults, as the scorer elaborates them), each clock toggling by itself (periods 10,
14, 18, ...), three tasks (the vocabulary the prompt
documents), and one initial block: inputs to 0, `reset_dut()`, the named block `stimulus` holding the
model's lines, `$finish`.
  step(n)          wait n cycles of the main clock (inputs change at its falling edge); step() = step(1);
                   a design without a clock: n x 10 time units
  reset_dut()      assert every reset for 2 cycles, release it, wait 1 cycle (no reset port: wait 1 cycle)
  random_inputs()  give every data input (not clocks, not resets) a random value
Driving an input is a plain assignment (`en = 1'b1;`).

API (everything a caller needs; no model, no simulator run):
  HarnessError                                   a design the kit cannot harness; the reason is the message
  analyze_dut(task) -> dict                      ports, clocks, resets, data inputs (pyslang; cached)
  make_harness(task, max_cycles=MAX_CYCLES) -> Harness        raises HarnessError: that task falls back
                                                 to testbench mode (put the reason in its notes)
  Harness.source(placeholder=...) -> str         the harness text with a placeholder line (for prompts)
  assemble(harness, body) -> (tb_source, LineMap)
  LineMap(first, n_lines).stimulus_line(tb_line) -> int | None   (1-based; None: a harness line)
  map_errors(errors, line_map) -> list[dict]     sim error dicts; those in the testbench file ("tb.sv")
                                                 get file "stimulus" and the stimulus line, or file
                                                 "harness" (line N of the harness); others unchanged
  map_result(result, line_map) -> dict           a SimResult (or dict) with errors and notes mapped
  check_stimulus(body, harness=None) -> str | None   a one-line reason to reject the stimulus, or None
  Stimulus(body, reason) / parse_stimulus(text) -> Stimulus     reason ok | no_code | truncated
  render_stimulus(body) -> str                   canonical assistant text (one systemverilog block)
  prepare_stimulus(harness, text) -> Prepared(body, reason, tb, line_map, why)
                                                 parse + check + assemble in one call; reason ok |
                                                 no_code | truncated | rejected (why: the check's reason)
  rejected_result(task_id, why) -> dict          the SimResult dict of a stimulus check_stimulus refused
                                                 (status "rejected", reward 0): nothing is simulated
  STIMULUS_SYSTEM_PROMPT; stimulus_messages(task, harness) -> [system, user]
  stimulus_feedback(result, line_map=None) -> str     the follow-up user message (lines = stimulus lines)
  stimulus_refine_messages(task, harness, answer_text, result) -> messages  memoryless state, as
                                                 common.refine_messages: result = the scorer's result of
                                                 the assembled testbench (raw; mapped here), or None when
                                                 the answer did not parse
Answer modes (the one dispatch; every script calls these with the requested mode):
  ANSWER_MODES = ("testbench", "stimulus"); check_mode(mode)
  task_harness(task) -> Harness                 make_harness, cached per task (id + RTL hash)
  task_mode(task, requested) -> mode            stimulus falls back to testbench for a design the kit
                                                 cannot harness (reason in task["answer_mode_note"])
  fallbacks(tasks, requested) -> {id: note}     the tasks that fell back (results count them)
  first_messages(task, mode) / refine_state_messages(task, answer_text, result, mode) -> messages
  canonical_answer(task, answer_text, mode) -> str    the SFT label text
  (onpolicy.prepare_answer is the score path's side: answer text -> job or failure result)
Scoring a stimulus answer: p = prepare_stimulus(h, text); p.reason "ok" -> sim.job_from_task(task, p.tb);
"rejected" -> rejected_result(task["id"], p.why); no_code / truncated -> a parse failure, as today.
"""
import dataclasses
import hashlib
import re
import threading

import pyslang

import common
import instrument
import sim
import tbcheck

PERIOD = 10                # main clock period (time units); a combinational step is this long
# The end-of-time rule is the scorer's, in both answer modes: a run still driving the DUT after
# sim.SIM_TIME_LIMIT_DEFAULT time units scores sim_time_limit (reward 0). The harness has no watchdog of its
# own: one that ended the run with $finish turned a never-ending stimulus (`forever step(1);`) into a
# full-length run scored ok, while the same loop in a whole testbench earned 0, so a policy would be paid
# for not ending. MAX_CYCLES is that limit in main-clock cycles, as the prompt states it.
MAX_CYCLES = sim.SIM_TIME_LIMIT_DEFAULT // PERIOD
TASK_NAMES = ("step", "reset_dut", "random_inputs", "stimulus")
PLACEHOLDER = "// <your stimulus goes here>"
STIMULUS_FILE = "stimulus"  # the file name mapped errors carry


class HarnessError(Exception):
    """A design the kit cannot harness (e.g. unpacked-array or interface ports); the message says why."""


# ----------------------------------------------------------------------------------------------
# DUT analysis (pyslang): shared with the template teacher (data/teacher.py)
# ----------------------------------------------------------------------------------------------

_DUT_CACHE = {}


def analyze_dut(task):
    """Ports of the task's top module, elaborated with default parameters.

    Returns {top, inst, ports: [{name, dir, width}], clocks: [name], resets: [{name, active_low}],
    data: [{name, width}] (inputs that are neither clock nor reset), timescale (text or None),
    rtl: {file name: text}}. Raises HarnessError when the design cannot be driven.
    """
    key = (task["id"], task["dut_module_name"], task["dut_instance_name"],
           tuple((f["name"], f["content"]) for f in task["rtl_files"]))
    if key in _DUT_CACHE:
        return _DUT_CACHE[key]
    top = task["dut_module_name"]
    opts = pyslang.ast.CompilationOptions()
    opts.topModules = {top}
    comp = pyslang.ast.Compilation(pyslang.Bag([opts]))
    for f in task["rtl_files"]:
        comp.addSyntaxTree(pyslang.syntax.SyntaxTree.fromText(f["content"], f["name"]))
    insts = [i for i in comp.getRoot().topInstances if i.name == top]
    if not insts:
        raise HarnessError(f"{task['id']}: top module '{top}' not found in the RTL files")
    rtl_text = "\n".join(f["content"] for f in task["rtl_files"])
    ports = []
    for p in insts[0].body.portList:
        if p.kind != pyslang.ast.SymbolKind.Port:
            raise HarnessError(f"{task['id']}: port '{p.name}' is an interface/multiport, not supported")
        if not p.type.isIntegral:
            raise HarnessError(f"{task['id']}: port '{p.name}' has non-integral type {p.type}")
        d = {pyslang.ast.ArgumentDirection.In: "input", pyslang.ast.ArgumentDirection.Out: "output"}.get(
            p.direction, "inout")
        ports.append({"name": p.name, "dir": d, "width": int(p.type.bitWidth)})
    clocks, resets, data = [], [], []
    for p in ports:
        if p["dir"] != "input":
            continue
        kind = _classify_input(p, rtl_text)
        if kind == "clock":
            clocks.append(p["name"])
        elif kind == "reset":
            resets.append({"name": p["name"], "active_low": _reset_active_low(p["name"], rtl_text)})
        else:
            data.append({"name": p["name"], "width": p["width"]})
    m = re.search(r"`timescale\s+[^\n]+", rtl_text)
    info = {"top": top, "inst": task["dut_instance_name"], "ports": ports, "clocks": clocks,
            "resets": resets, "data": data, "timescale": m.group(0).strip() if m else None,
            "rtl": {f["name"]: f["content"] for f in task["rtl_files"]}}
    _DUT_CACHE[key] = info
    return info


def _classify_input(p, rtl):
    if p["width"] != 1:
        return "data"
    low = p["name"].lower()
    edge = re.search(r"(pos|neg)edge\s+" + re.escape(p["name"]) + r"\b", rtl) is not None
    if re.search(r"(rst|reset)", low):
        return "reset"
    if re.fullmatch(r"(i_|in_)?(clk|clock|sys_clk|clk_?i|clk_in|[a-z]?clk|clk\d|clock_?i)", low):
        return "clock"
    if edge and re.search(r"(clk|clock)", low) and not re.search(r"(en|enable|div|sel)", low):
        return "clock"
    return "data"


def _reset_active_low(name, rtl):
    n = re.escape(name)
    if re.search(r"negedge\s+" + n + r"\b", rtl) or re.search(r"if\s*\(\s*(!|~)\s*" + n + r"\s*\)", rtl) \
            or re.search(r"\b" + n + r"\s*==\s*(1'b)?0\b", rtl):
        return True
    if re.search(r"posedge\s+" + n + r"\b", rtl) or re.search(r"if\s*\(\s*" + n + r"\s*\)", rtl):
        return False
    return re.search(r"(_n|n|_b|_l|_ni)$", name.lower()) is not None and not name.lower().endswith("_in")


# ----------------------------------------------------------------------------------------------
# The harness and its assembly with a stimulus
# ----------------------------------------------------------------------------------------------

@dataclasses.dataclass
class Harness:
    """A task's harness: head + (indented stimulus lines) + tail is the testbench."""
    task_id: str
    top: str
    inst: str
    module: str                 # the testbench module name, tb_<top>
    clocks: list                # [{name, period}]; the first is the main clock (step counts its cycles)
    resets: list                # [{name, active_low}]
    inputs: list                # [{name, width}] data inputs the stimulus drives
    outputs: list               # [{name, width, dir}] outputs (and inouts) it may read
    max_cycles: int
    head: str
    tail: str
    indent: str = "      "

    def source(self, placeholder=PLACEHOLDER):
        """The harness text with one placeholder line where the stimulus goes (shown in the prompt)."""
        return self.head + self.indent + placeholder + "\n" + self.tail


@dataclasses.dataclass
class LineMap:
    """Where the stimulus sits in the assembled testbench: lines first .. first + n_lines - 1."""
    first: int
    n_lines: int

    def stimulus_line(self, tb_line):
        k = tb_line - self.first + 1
        return k if 1 <= k <= self.n_lines else None


def _bits(width):
    return f"[{width - 1}:0] " if width > 1 else ""


def _random_expr(width):
    words = -(-width // 32)
    return "$urandom" if words == 1 else "{" + ", ".join(["$urandom"] * words) + "}"


def make_harness(task, max_cycles=MAX_CYCLES):
    """The harness of one task, or HarnessError(reason) when the kit cannot write one."""
    info = analyze_dut(task)
    top, inst = info["top"], info["inst"]
    module = f"tb_{top}"
    names = {p["name"] for p in info["ports"]}
    clash = sorted(names & (set(TASK_NAMES) | {module}))
    if clash:
        raise HarnessError(f"{task['id']}: port name(s) {', '.join(clash)} clash with the harness's own names")
    if any(re.search(r"\bmodule\s+" + re.escape(module) + r"\b", t) for t in info["rtl"].values()):
        raise HarnessError(f"{task['id']}: the RTL already defines a module named {module}")
    clocks = [{"name": c, "period": PERIOD + 4 * i} for i, c in enumerate(info["clocks"])]
    inputs = [dict(d) for d in info["data"]]
    outputs = [dict(p) for p in info["ports"] if p["dir"] != "input"]
    L = [info["timescale"]] if info["timescale"] else []
    L.append(f"// Harness written by chorus-mini for {top}; the stimulus is the body of block `stimulus`.")
    L.append(f"module {module};")
    for p in info["ports"]:
        L.append(f"  {'logic' if p['dir'] == 'input' else 'wire'} {_bits(p['width'])}{p['name']};")
    conns = ", ".join(f".{p['name']}({p['name']})" for p in info["ports"])
    L.append(f"  {top} {inst} ({conns});")
    for c in clocks:
        L.append(f"  initial {c['name']} = 1'b0;")
        L.append(f"  always #{c['period'] // 2} {c['name']} = ~{c['name']};")
    wait = f"@(negedge {clocks[0]['name']})" if clocks else f"#{PERIOD}"
    L.append(f"  task automatic step(input int n = 1); repeat (n) {wait}; endtask")
    if info["resets"]:
        on = " ".join(f"{r['name']} = 1'b{0 if r['active_low'] else 1};" for r in info["resets"])
        off = " ".join(f"{r['name']} = 1'b{1 if r['active_low'] else 0};" for r in info["resets"])
        L.append(f"  task automatic reset_dut; {on} step(2); {off} step(1); endtask")
    else:
        L.append("  task automatic reset_dut; step(1); endtask")
    rnd = " ".join(f"{d['name']} = {_random_expr(d['width'])};" for d in inputs)
    L.append(f"  task automatic random_inputs; {rnd} endtask" if rnd else "  task automatic random_inputs; endtask")
    L.append("  initial begin")
    zero = " ".join(f"{d['name']} = '0;" for d in inputs)
    if zero:
        L.append(f"    {zero}")
    L.append("    reset_dut();")
    L.append("    begin : stimulus")
    head = "\n".join(L) + "\n"
    tail = "    end\n    $finish;\n  end\nendmodule\n"
    return Harness(task_id=task["id"], top=top, inst=inst, module=module, clocks=clocks,
                   resets=[dict(r) for r in info["resets"]], inputs=inputs, outputs=outputs,
                   max_cycles=max_cycles, head=head, tail=tail)


def assemble(harness, body):
    """harness + stimulus body -> (testbench source, LineMap). The body's lines are kept one for one."""
    lines = (body or "").splitlines()
    text = "".join(harness.indent + ln + "\n" if ln.strip() else "\n" for ln in lines)
    first = harness.head.count("\n") + 1
    return harness.head + text + harness.tail, LineMap(first, len(lines))


def map_errors(errors, line_map):
    """Scorer error dicts -> the same with lines in the testbench file given as stimulus lines.

    An error on a harness line after the stimulus (an unclosed `begin` is reported there) points at the
    stimulus's end (line n_lines + 1); one before it stays a harness error (file "harness")."""
    out = []
    for e in errors or []:
        e = dict(e)
        if e.get("file") == "tb.sv" and e.get("line"):
            k = line_map.stimulus_line(e["line"])
            if k is not None:
                e["file"], e["line"] = STIMULUS_FILE, k
            elif e["line"] >= line_map.first + line_map.n_lines:
                e["file"], e["line"] = STIMULUS_FILE, line_map.n_lines + 1
                e["msg"] = f"{e['msg']} (after the last stimulus line: check that every begin has its end)"
            else:
                e["file"] = "harness"
        out.append(e)
    return out


def map_result(result, line_map):
    """A SimResult (or its dict) as a dict whose errors and `tb.sv:N:` notes name stimulus lines."""
    d = result.to_dict() if hasattr(result, "to_dict") else dict(result)
    d["errors"] = map_errors(d.get("errors"), line_map)

    def note(m):
        k = line_map.stimulus_line(int(m.group(1)))
        return f"{STIMULUS_FILE}:{k}:" if k is not None else m.group(0)
    d["notes"] = [re.sub(r"\btb\.sv:(\d+):", note, n) for n in d.get("notes") or []]
    return d


# ----------------------------------------------------------------------------------------------
# Checks on a stimulus (before assembly; the assembled file also goes through sim's pre-scan)
# ----------------------------------------------------------------------------------------------

MAX_STIMULUS_BYTES = 32 << 10     # longer stimuli are refused before parsing (answers are a few kB; the
                                  # check runs in the trainer's process, so its cost must stay bounded)
_MODULE_CODE = {"module", "endmodule", "macromodule", "program", "endprogram", "interface", "endinterface",
                "package", "endpackage", "primitive", "endprimitive", "config", "endconfig", "bind", "checker",
                "endchecker", "class", "endclass", "defparam", "specify", "endspecify"}
_KEYWORD_REASONS = [
    (_MODULE_CODE, "`{kw}` is not allowed: the stimulus is statements inside the harness's block, not module code"),
    ({"initial", "always", "always_ff", "always_comb", "always_latch", "final", "generate", "endgenerate"},
     "`{kw}` is not allowed: the stimulus is already inside an initial block; write statements only"),
    ({"task", "endtask", "function", "endfunction"},
     "`{kw}` is not allowed: declare no tasks or functions; use loops and the harness's tasks"),
    ({"force", "release", "assign", "deassign"},
     "`{kw}` is not allowed: drive the DUT inputs with plain assignments (`x = 1'b1;`)"),
]
_CHECK_CACHE = {}
_CHECK_CACHE_SIZE = 1024
_CHECK_LOCK = threading.Lock()     # the cache is read and evicted from several threads (jointgen's members)


def _bare_harness():
    """The frame a stimulus is checked in when no task's harness is given (no DUT instance to protect)."""
    return Harness(task_id="", top="", inst="", module="tb_stimulus_check", clocks=[], resets=[], inputs=[],
                   outputs=[], max_cycles=0, head="module tb_stimulus_check;\n  initial begin\n    begin : stimulus\n",
                   tail="    end\n    $finish;\n  end\nendmodule\n")


def check_stimulus(body, harness=None):
    """One-line reason ('line N: ...') to reject a stimulus, or None when it may be assembled.

    The decision is taken on the tree pyslang parses from the assembled testbench (the lexer knows strings,
    comments and escaped identifiers, so no text trick hides a token). Rejected: a stimulus over
    MAX_STIMULUS_BYTES (checked first); compiler directives and macros; module-level keywords (module,
    initial/always, task/function declarations, force/release, procedural assign/deassign, defparam, bind)
    and $deposit; an `end`/`join` that closes the harness's block; pyslang syntax errors; any tree in which
    the harness's `stimulus` block does not end at the harness's own `end` (so nothing lands outside it);
    an instantiation; a declaration that shadows a harness name; and (with the harness) any write into the
    DUT instance's hierarchy (tbcheck.dut_writes: assignments, ++/--, output arguments, $readmem*, ...).
    Linear in the stimulus: one parse and one walk of the tree."""
    body = body or ""
    h = harness or _bare_harness()
    key = hashlib.sha256("\0".join((h.head, h.tail, h.inst, h.top, body)).encode("utf-8", "surrogatepass")).digest()
    with _CHECK_LOCK:
        if key in _CHECK_CACHE:
            return _CHECK_CACHE[key]
    reason = _check_stimulus(body, h)       # outside the lock: threads (joint experts, joint evals) check at once
    with _CHECK_LOCK:                       # eviction and insertion as one: two threads must not evict one key
        if key not in _CHECK_CACHE and len(_CHECK_CACHE) >= _CHECK_CACHE_SIZE:
            _CHECK_CACHE.pop(next(iter(_CHECK_CACHE)))
        _CHECK_CACHE[key] = reason
    return reason


def _check_stimulus(body, h):
    if len(body.encode("utf-8", "surrogatepass")) > MAX_STIMULUS_BYTES:
        return f"line 1: the stimulus is longer than {MAX_STIMULUS_BYTES} bytes; write loops, not unrolled code"
    tb, lm = assemble(h, body)
    try:
        tree, sm = tbcheck.parse_sv(tb, "tb.sv")
    except UnicodeError:
        return "line 1: the stimulus is not valid UTF-8 text"
    start = len(h.head.encode())
    tail_at = len(tb.encode()) - len(h.tail.encode())
    main = None

    def line(tok):
        k = lm.stimulus_line(tbcheck.sv_line(sm, tok))
        return k if k is not None else lm.n_lines + 1

    def inside(tok):
        return tok.location.buffer == main and start <= tok.location.offset < tail_at

    # 1. tokens, in source order (skipped ones included): directives, macros, keywords, begin/end balance
    toks = list(tbcheck.walk_tokens(tree.root))
    if len(toks) < 2:              # pyslang gave up (e.g. constructs nested too deeply): nothing to score
        engine = pyslang.DiagnosticEngine(sm)
        why = next((engine.formatMessage(d) for d in tree.diagnostics if d.isError()), "it does not parse")
        return f"line 1: {why}"
    main = toks[0].location.buffer
    mine = []
    for tok in toks:
        for tr in tok.trivia:
            d = tr.syntax() if tr.kind.name == "Directive" else None
            if d is not None and d.getFirstToken() is not None and inside(d.getFirstToken()):
                return (f"line {line(d.getFirstToken())}: compiler directives and macros "
                        f"(`{d.getFirstToken().valueText.lstrip('`')}) are not allowed in a stimulus")
        for t in tbcheck.skipped_tokens(tok) + [tok]:
            if t.location.buffer != main:
                return f"line {line(t)}: macros are not allowed in a stimulus"
            if inside(t):
                mine.append(t)
    for words, why in _KEYWORD_REASONS:
        for t in mine:
            if t.kind.name.endswith("Keyword") and t.valueText in words:
                return f"line {line(t)}: " + why.format(kw=t.valueText)
    for t in mine:
        if t.kind.name == "SystemIdentifier" and t.valueText == "$deposit":
            return f"line {line(t)}: `$deposit` is not allowed: drive the DUT inputs with plain assignments"
    depth = 0
    for t in mine:
        if t.valueText in ("begin", "fork", "end", "join", "join_any", "join_none") and t.kind.name.endswith("Keyword"):
            depth += 1 if t.valueText in ("begin", "fork") else -1
            if depth < 0:
                return (f"line {line(t)}: this `{t.valueText}` has no `begin`/`fork` in the stimulus: "
                        "it would close the harness's block")
    # 2. instantiations (parsed as checker instances inside a block) get their own message
    nodes = list(tbcheck.walk(tree.root))
    for n in nodes:
        if instrument._kind(n) in ("CheckerInstanceStatement", "HierarchyInstantiation"):
            first = n.getFirstToken()
            if first is not None and inside(first):
                name = (tbcheck.name_parts(n.instance.type) or [""])[-1] \
                    if instrument._kind(n) == "CheckerInstanceStatement" else n.type.valueText
                if h.top and name == h.top:
                    return f"line {line(first)}: do not instantiate {h.top}: the harness already has `{h.inst}`"
                return f"line {line(first)}: instantiating a module is not allowed: the harness instantiates the DUT"
    # 3. syntax errors: the tree must be what Icarus will compile, so an unparsed stimulus is not scored
    engine = pyslang.DiagnosticEngine(sm)
    for d in tree.diagnostics:
        if d.isError():
            for i, t in enumerate(mine):       # `mod #(...) name (...)`: say what it is rather than "expected ;"
                kinds = [u.kind.name for u in mine[i:i + 3]]
                if kinds[:1] == ["Identifier"] and kinds[1:] in (["Hash", "OpenParenthesis"],
                                                                 ["Identifier", "OpenParenthesis"]) \
                        and (i == 0 or mine[i - 1].kind.name in ("Semicolon", "BeginKeyword", "EndKeyword",
                                                                 "ElseKeyword")):
                    if h.top and t.valueText == h.top:
                        return f"line {line(t)}: do not instantiate {h.top}: the harness already has `{h.inst}`"
                    return f"line {line(t)}: instantiating a module is not allowed: the harness instantiates the DUT"
            k = lm.stimulus_line(sm.getLineNumber(d.location)) if d.location.buffer == main else None
            msg = engine.formatMessage(d)
            if k is None:
                k, msg = lm.n_lines + 1, f"{msg} (after the last stimulus line: check that every begin has its end)"
            return f"line {k}: {msg}"
    # 4. structure: one module, the harness's, whose `stimulus` block ends at the harness's own `end`
    members = instrument._nodes(getattr(tree.root, "members", None))
    end_at = tail_at + len(h.tail[:h.tail.index("end")].encode())
    blocks = [n for n in nodes if instrument._kind(n) == "SequentialBlockStatement"
              and n.blockName is not None and n.blockName.name.valueText == "stimulus"]
    if len(members) != 1 or instrument._kind(members[0]) != "ModuleDeclaration" \
            or members[0].header.name.valueText != h.module or len(blocks) != 1 \
            or blocks[0].end.location.buffer != main or blocks[0].end.location.offset != end_at:
        return "line 1: the stimulus must be statements that stay inside the harness's `stimulus` block"
    # 5. declarations: none may shadow what the harness declares
    own = ({p["name"] for p in h.inputs + h.outputs} | {c["name"] for c in h.clocks} | {r["name"] for r in h.resets}
           | set(TASK_NAMES) | {h.inst, h.module, h.top}) - {""}
    for n in nodes:
        if type(n).__name__ == "DeclaratorSyntax" and inside(n.name) and n.name.valueText in own:
            return (f"line {line(n.name)}: `{n.name.valueText}` is the harness's name; do not redeclare it "
                    "(drive the harness's signals, call its tasks)")
    # 6. no write of any kind into the DUT instance
    if h.inst:
        ports = {h.top: [(p["name"], p["dir"]) for p in analyze_ports(h)]}
        subs = tbcheck.declared_ports(tree.root, nodes)[0]
        for node, what in tbcheck.dut_writes(tree.root, h.inst, subs, ports, nodes):
            return f"line {line(node.getFirstToken())}: " + tbcheck.write_message(node, what)
    return None


def analyze_ports(h):
    """The DUT's ports as the harness sees them: [{name, dir}] (inputs, then outputs and inouts)."""
    return [{"name": p["name"], "dir": "input"} for p in h.inputs + [{"name": c["name"]} for c in h.clocks]
            + [{"name": r["name"]} for r in h.resets]] + [{"name": p["name"], "dir": p.get("dir", "output")}
                                                          for p in h.outputs]


# ----------------------------------------------------------------------------------------------
# Answer text: parse, render, prepare
# ----------------------------------------------------------------------------------------------

@dataclasses.dataclass
class Stimulus:
    """A parsed stimulus answer. reason: ok | no_code | truncated (partial body kept)."""
    body: str
    reason: str


def parse_stimulus(text):
    """Model text -> Stimulus: the first fenced code block, by common.parse_answer's rules (no filename
    is needed: 'no_filename' counts as ok)."""
    a = common.parse_answer(text)
    return Stimulus(a.code if a.reason != "no_code" else "", "ok" if a.reason == "no_filename" else a.reason)


def render_stimulus(body):
    """Canonical assistant text of a stimulus answer: one systemverilog block."""
    return f"```systemverilog\n{(body or '').strip(chr(10))}\n```"


@dataclasses.dataclass
class Prepared:
    """A stimulus answer made ready to score: reason ok (tb + line_map set) | no_code | truncated |
    rejected (why: check_stimulus's reason)."""
    body: str
    reason: str
    tb: str = None
    line_map: LineMap = None
    why: str = None


def prepare_stimulus(harness, text):
    """Parse, check and assemble one stimulus answer text."""
    st = parse_stimulus(text)
    if st.reason != "ok":
        return Prepared(st.body, st.reason)
    why = check_stimulus(st.body, harness)
    if why:
        return Prepared(st.body, "rejected", why=why)
    tb, lm = assemble(harness, st.body)
    return Prepared(st.body, "ok", tb, lm)


def rejected_result(task_id, why):
    """The SimResult dict of a stimulus that check_stimulus refused (status rejected: reward 0)."""
    m = re.match(r"line (\d+): (.*)", why)
    line, msg = (int(m.group(1)), m.group(2)) if m else (0, why)
    r = sim.SimResult(id=str(task_id))
    r.status, r.passed = sim.REJECTED, False
    r.errors = [{"source": "stimulus", "file": STIMULUS_FILE, "line": line, "col": 0, "msg": msg}]
    return r.to_dict()


# ----------------------------------------------------------------------------------------------
# Prompts and feedback (stimulus mode)
# ----------------------------------------------------------------------------------------------

STIMULUS_REQUIREMENTS = """OUTPUT REQUIREMENTS:
1. Give only the stimulus: the statements of the harness's `stimulus` block, in a single ```systemverilog fenced code block.
2. No module, endmodule, initial, always, task or function; do not instantiate anything; do not redeclare the harness's signals.
3. Drive DUT inputs with plain assignments (`en = 1'b1;`) and wait with step(n); never write into the DUT instance and never use force.
4. Stimulus only: no checks or assertions on outputs.
5. Put nothing except code inside the code block."""

STIMULUS_RULES = """SIMULATOR RULES (Icarus Verilog, iverilog -g2012):
- Not supported, do not use: covergroups, classes, randomize() and constraints, assertions, clocking blocks,
  `inside`, `unique if`/`priority if`, associative arrays.
- Local variables go first in the stimulus (`int i;`), or in the loop header (`for (int i = 0; i < 8; i++)`).
- Use $urandom or $urandom_range for random values, and for/repeat loops for sequences.
- Keep it compact (loops, well under 1000 tokens)."""

STIMULUS_SYSTEM_PROMPT = (
    "You are a testbench expert. The testbench harness of the DUT is written for you: it declares every DUT "
    "input, instantiates the DUT, drives the clocks, resets the DUT once and ends the simulation. Your job "
    "is to write the stimulus that maximizes code coverage of the DUT: which input values, in which order, "
    "for how long.\n\n" + STIMULUS_REQUIREMENTS + "\n\n" + STIMULUS_RULES)

STIMULUS_REQUEST = "Write the stimulus that maximizes coverage of the given RTL project."


def _width_list(ports):
    return ", ".join(f"{p['name']} ({p['width']} bit{'s' if p['width'] > 1 else ''})" for p in ports) or "none"


def interface_text(harness):
    """The harness interface and task vocabulary, as the prompt shows it."""
    h = harness
    main = h.clocks[0]["name"] if h.clocks else None
    L = [f"Harness {h.module}: the DUT {h.top} is instantiated as {h.inst}.",
         f"- inputs you drive (plain assignments): {_width_list(h.inputs)}"]
    if h.clocks:
        L.append("- clocks (toggle by themselves; do not drive them): "
                 + ", ".join(f"{c['name']} (period {c['period']})" for c in h.clocks))
    if h.resets:
        L.append("- resets: " + ", ".join(f"{r['name']} (active {'low' if r['active_low'] else 'high'})"
                                          for r in h.resets))
    L.append(f"- outputs you may read: {_width_list(h.outputs)}")
    L.append("Tasks:")
    L.append(f"- step(n): wait n cycles of {main} (inputs change at its falling edge); step() waits one"
             if main else f"- step(n): wait n x {PERIOD} time units (the design has no clock); step() waits one")
    L.append("- reset_dut(): assert the reset for 2 cycles, release it, wait 1 cycle" if h.resets
             else "- reset_dut(): the design has no reset port; waits one step")
    L.append("- random_inputs(): give every input above a random value")
    L.append(f"Before the stimulus every input is 0 and reset_dut() has run. After it the harness calls "
             f"$finish. A stimulus still running after {h.max_cycles} cycles fails (the run scores 0), as a "
             "testbench that never ends does.")
    return "\n".join(L)


def stimulus_messages(task, harness):
    """Initial stimulus-mode prompt: [system, user]. The user message holds the RTL and spec (as in
    common.build_messages), the harness source and its interface. The task's `instruction` (which asks
    for an instance name) is left out: the harness instantiates the DUT."""
    rtl = common.render_files(task["rtl_files"])
    spec = common.render_files(task.get("spec_files") or []) or "// No specification files provided."
    user = (f"<context>{rtl}{spec}</context>\n<harness>{harness.source()}</harness>\n"
            f"<instructions>{interface_text(harness)}</instructions>\n{STIMULUS_REQUEST}")
    return [{"role": "system", "content": STIMULUS_SYSTEM_PROMPT}, {"role": "user", "content": user}]


_INSTRUCTION = {
    "compile": "Fix the stimulus: line numbers above count the lines of your stimulus.",
    "simulate": "Fix the simulation failure by editing the stimulus.",
    "success": "Improve coverage toward 100% by editing the stimulus.",
}
_PARSE_INSTRUCTION = {
    "no_code": "Write the stimulus in the required format: one systemverilog code block.",
    "truncated": "Your answer was cut off before the code block closed. Write a shorter, complete stimulus.",
}


def stimulus_feedback(result, line_map=None):
    """The follow-up user message for one scored stimulus: common.feedback_message in stimulus words.

    result: the scorer's result of the assembled testbench (SimResult or dict; mapped with line_map when
    given, so line numbers count the stimulus's own lines), a rejected_result dict, or a Stimulus whose
    reason is no_code/truncated / None (a parse failure: nothing was simulated)."""
    if result is not None and not isinstance(result, Stimulus):
        result = map_result(result, line_map) if line_map is not None else (
            result.to_dict() if hasattr(result, "to_dict") else dict(result))
    return common.feedback_message(result, kind="stimulus", requirements=STIMULUS_REQUIREMENTS,
                                   instructions=_INSTRUCTION, parse_instructions=_PARSE_INSTRUCTION)


def stimulus_refine_messages(task, harness, answer_text, result):
    """Memoryless refinement state [system, first user, assistant, user (feedback)], as
    common.refine_messages. The assistant turn is the canonical stimulus (raw text capped at 4000
    characters when there is no code block); feedback lines count the stimulus's own lines."""
    st = parse_stimulus(answer_text)
    first = stimulus_messages(task, harness)
    if st.reason == "no_code":
        raw = answer_text or ""
        shown = raw if len(raw) <= 4000 else raw[:4000] + "\n... [cut]"
        return first + [{"role": "assistant", "content": shown},
                        {"role": "user", "content": stimulus_feedback(st)}]
    if result is None:
        fb = stimulus_feedback(st if st.reason == "truncated" else None)
    else:
        fb = stimulus_feedback(result, assemble(harness, st.body)[1])
    return first + [{"role": "assistant", "content": render_stimulus(st.body)},
                    {"role": "user", "content": fb}]


# ----------------------------------------------------------------------------------------------
# Answer modes: the one dispatch every script uses (data building, SFT rows, RL, OPD, eval, generate)
# ----------------------------------------------------------------------------------------------

ANSWER_MODES = ("testbench", "stimulus")
# Every script's --answer-mode defaults to the profiles' mode (profiles.py): stimulus, which the small models
# answer far better (results/answer_modes.md); the paper's whole testbenches are --answer-mode testbench.
DEFAULT_ANSWER_MODE = "stimulus"
_HARNESS_CACHE = {}         # (id, top, inst, sha256 of the RTL) -> Harness or the HarnessError


def add_answer_mode_arg(p, what="answers"):
    """The one --answer-mode declaration (evaluate.py, rl.py / distill.py through onpolicy, sft.py, build_sft.py)."""
    p.add_argument("--answer-mode", choices=ANSWER_MODES, default=DEFAULT_ANSWER_MODE,
                   help=f"{what}: stimulus (default; the kit writes the harness from the DUT's ports, the model the "
                        "stimulus; a design it cannot harness falls back to testbench) or testbench (whole testbenches)")


def check_mode(mode):
    """The mode itself, or ValueError naming the choices."""
    if mode not in ANSWER_MODES:
        raise ValueError(f"unknown answer mode {mode!r}; choose from {', '.join(ANSWER_MODES)}")
    return mode


def task_harness(task):
    """make_harness(task), made once per task (by id and RTL hash); raises the cached HarnessError."""
    rtl = hashlib.sha256("\0".join(f"{f['name']}\0{f['content']}" for f in task["rtl_files"]).encode()).hexdigest()
    key = (task["id"], task["dut_module_name"], task["dut_instance_name"], rtl)
    if key not in _HARNESS_CACHE:
        try:
            _HARNESS_CACHE[key] = make_harness(task)
        except HarnessError as e:
            _HARNESS_CACHE[key] = e
    h = _HARNESS_CACHE[key]
    if isinstance(h, HarnessError):
        raise h
    return h


def task_mode(task, requested):
    """The mode `task` is answered in: `requested`, except that in stimulus mode a design the kit cannot
    harness falls back to "testbench", with the reason written into task["answer_mode_note"]."""
    if check_mode(requested) == "testbench":
        return "testbench"
    try:
        task_harness(task)
    except HarnessError as e:
        task["answer_mode_note"] = f"stimulus mode not possible, testbench mode used: {e}"
        return "testbench"
    return "stimulus"


def fallbacks(tasks, requested):
    """{task id: note} of the tasks that fall back to testbench mode under `requested` (counted in results)."""
    return {t["id"]: t["answer_mode_note"] for t in tasks if task_mode(t, requested) != requested}


def first_messages(task, mode="testbench"):
    """The initial prompt [system, user] in the task's mode (common.build_messages / stimulus_messages)."""
    if task_mode(task, mode) == "stimulus":
        return stimulus_messages(task, task_harness(task))
    return common.build_messages(task)


def refine_state_messages(task, answer_text, result, mode="testbench"):
    """The memoryless refinement state in the task's mode (common.refine_messages /
    stimulus_refine_messages: compile errors name the stimulus's own lines). result: the scorer's raw
    result dict, or None when the answer did not parse."""
    if task_mode(task, mode) == "stimulus":
        return stimulus_refine_messages(task, task_harness(task), answer_text, result)
    return common.refine_messages(task, answer_text, result)


def canonical_answer(task, answer_text, mode="testbench"):
    """The canonical assistant text of an answer in the task's mode (SFT labels)."""
    if task_mode(task, mode) == "stimulus":
        return render_stimulus(parse_stimulus(answer_text).body)
    a = common.parse_answer(answer_text)
    return common.render_answer(a.filename, a.code)
