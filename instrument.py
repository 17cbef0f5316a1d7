"""instrument.py: the scorer's build layer (used by sim.py). Parses a DUT with pyslang and writes an
instrumented copy (probe registers for block/branch/expression/FSM items, per-signal toggle monitors, per
scope a `final` block that writes the probe bits). The testbench pre-scan is tbcheck.py.
Design and metric definitions: docs/coverage.md; the scorer's contract and the run/parse layers: sim.py.

Public names (sim.py re-exports them): prepare_dut, PreparedDUT, PrepareError, Item, Scope, run_defines,
METRIC_DEF_VERSION. Inserted text never contains a newline, so file:line in messages is the ORIGINAL file
and line. The instrumented DUT is cached per process by content hash.
"""
import hashlib
import os
import re
import time
from dataclasses import dataclass, field

import pyslang
from pyslang import syntax as S

METRIC_DEF_VERSION = 1
MAX_ERRORS = 30                 # errors kept in a result
PREPARE_CACHE_SIZE = 128        # prepared DUTs kept per process
TOGGLE_BACKENDS = ("verilog", "vpi")   # how toggle coverage is collected (same result)
# pure system functions allowed inside re-evaluated expression terms (everything else is skipped)
PURE_SYSTEM_FUNCS = {"$signed", "$unsigned", "$clog2", "$bits", "$countones", "$onehot", "$onehot0",
                     "$isunknown", "$size", "$high", "$low", "$left", "$right"}


class PrepareError(Exception):
    """The DUT cannot be parsed or instrumented (message is one line; .errors has details)."""

    def __init__(self, msg, errors=()):
        super().__init__(msg)
        self.errors = list(errors)



# ---------------------------------------------------------------------------------------------------------
# Build, part 1: instrument the DUT (pyslang syntax tree -> text edits -> instrumented copy)

@dataclass
class Item:
    metric: str             # block | branch | expression | fsm
    kind: str               # block, if_true, if_false, case_item, default, ternary_true, ..., row, state, transition
    file: str
    line: int
    detail: str
    probe: int              # index of the probe register in its scope
    extra: dict = field(default_factory=dict)


@dataclass
class Scope:
    sid: int
    module: str
    kind: str               # "module" | "generate"
    file: str
    line: int
    items: list = field(default_factory=list)
    probes: list = field(default_factory=list)     # probe register names, in record order
    signals: dict = field(default_factory=dict)    # name -> {line, dims, excluded}
    comb: list = field(default_factory=list)       # probe statements for continuous assigns
    tail: list = field(default_factory=list)       # extra text placed before the scope end
    cases: list = field(default_factory=list)      # FSM candidates: (var, labels, item nodes, line)
    assigns: list = field(default_factory=list)    # (lhs name, rhs node) of procedural assignments
    port_dirs: dict = field(default_factory=dict)


@dataclass
class PreparedDUT:
    key: str
    top: str
    nonce: str
    files: list             # [{name, content}] instrumented, same names as the originals
    scopes: list            # Scope per module body / generate block (items without syntax nodes)
    modules: list           # module names defined by the DUT files
    notes: list
    prepare_s: float
    toggle_backend: str = "verilog"


_PREPARE_CACHE = {}


def prepare_dut(rtl_files, top, cfg, toggle_backend="verilog"):
    """Parse and instrument the DUT once (cached per process by content hash); raises PrepareError.
    cfg: sim.ScoreConfig (its toggle_ints, toggle_enums and assign_blocks fields are used).
    toggle_backend: "verilog" (a monitor process per signal) or "vpi" (vpi/toggle_cov.c's value-change
    callbacks; the run must load that module). Both give the same toggle result."""
    if toggle_backend not in TOGGLE_BACKENDS:
        raise ValueError(f"unknown toggle backend {toggle_backend!r} (use {', '.join(TOGGLE_BACKENDS)})")
    h = hashlib.sha256()
    for f in rtl_files:
        h.update(f["name"].encode() + b"\0" + f["content"].encode() + b"\0")
    h.update(f"{top}|{cfg.toggle_ints}|{cfg.toggle_enums}|{cfg.assign_blocks}|{METRIC_DEF_VERSION}|{toggle_backend}".encode())
    key = h.hexdigest()
    if key in _PREPARE_CACHE:
        return _PREPARE_CACHE[key]
    t0 = time.perf_counter()
    prepared = _instrument(rtl_files, top, cfg, key, toggle_backend)
    prepared.prepare_s = time.perf_counter() - t0
    if len(_PREPARE_CACHE) >= PREPARE_CACHE_SIZE:
        _PREPARE_CACHE.pop(next(iter(_PREPARE_CACHE)))
    _PREPARE_CACHE[key] = prepared
    return prepared


_INCLUDE_RE = re.compile(rb"`include\b[^\n]*")


def _blank_includes(data):
    """Replace `include directives by spaces (same byte length), so pyslang never reads another file."""
    return _INCLUDE_RE.sub(lambda m: b" " * len(m.group(0)), data)


def _nodes(seq):
    return [c for c in (seq or []) if isinstance(c, S.SyntaxNode)]


def _kind(node):
    return node.kind.name


def _tokens(node):
    out = []

    def rec(n):
        for c in n:
            if isinstance(c, S.SyntaxNode):
                rec(c)
            elif c is not None and not c.isMissing:
                out.append(c)
    rec(node)
    return out


def _text(node):
    """Source text of a node rebuilt from its tokens on ONE line (comments and newlines dropped)."""
    parts = []
    for i, tok in enumerate(_tokens(node)):
        if i and tok.trivia:
            parts.append(" ")
        parts.append(tok.rawText)
    return "".join(parts)


def _short(text, n=80):
    text = " ".join(text.split())
    return text if len(text) <= n else text[:n - 3] + "..."


@dataclass
class _Ctx:
    """State of one instrumentation pass (the edit lists, scopes and name tables)."""
    sm: object
    buf_file: dict           # buffer id -> file index
    names: list              # file names
    edits: list              # per file: [(offset, order, seq, text, delete_end)]
    nonce: str
    top: str                 # the DUT top module (its ports feed the sim-time watchdog)
    toggle_backend: str      # "verilog" | "vpi"
    cfg: object              # sim.ScoreConfig
    constants: set           # parameter / localparam / enum member names (FSM labels)
    typedefs: dict           # typedef name -> ("vector", dims) | ("enum", dims) | ("other", None)
    scopes: list = field(default_factory=list)
    notes: list = field(default_factory=list)
    seq: int = 0


def _loc(ctx, loc):
    """(file index, byte offset) of a location in one of the DUT files, or None (macro/include)."""
    if loc is None or not ctx.sm.isFileLoc(loc):
        return None
    fi = ctx.buf_file.get(loc.buffer)
    return None if fi is None else (fi, loc.offset)


def _start(ctx, node):
    tok = node.getFirstToken()
    return _loc(ctx, tok.location) if tok is not None else None


def _end(ctx, node):
    tok = node.getLastToken()
    if tok is None:
        return None
    loc = _loc(ctx, tok.location)
    return None if loc is None else (loc[0], loc[1] + len(tok.rawText.encode()))


def _line(ctx, node):
    tok = node.getFirstToken()
    loc = ctx.sm.getFullyOriginalLoc(tok.location)
    return ctx.sm.getLineNumber(loc)


def _note(ctx, msg):
    if msg not in ctx.notes:
        ctx.notes.append(msg)


def _edit(ctx, pos, text, close_depth=None, delete_end=None):
    """Queue an insertion at pos=(file, offset). At one offset, closing texts (the end of a wrapper, an
    implicit else, a scope tail) come first, deepest syntax node first; then openings in call order. So
    nested wrappers nest. Never inserts a newline: instrumented lines stay aligned with the original."""
    assert "\n" not in text and "\r" not in text, "instrumentation text must stay on one line"
    ctx.seq += 1
    key = (0, -close_depth, -ctx.seq) if close_depth is not None else (1, ctx.seq, 0)
    ctx.edits[pos[0]].append((pos[1], key, text, delete_end))


def _depth(node):
    d = 0
    while node.parent is not None:
        node, d = node.parent, d + 1
    return d


def _apply_edits(data, edits):
    out, cur = [], 0
    for off, _, text, delete_end in sorted(edits, key=lambda e: (e[0], e[1])):
        if off < cur:
            raise PrepareError(f"internal: overlapping instrumentation edits at byte {off}")
        out.append(data[cur:off])
        out.append(text.encode())
        cur = delete_end if delete_end is not None else off
    out.append(data[cur:])
    return b"".join(out)


def _new_probe(ctx, sc, metric, kind, node, detail, **extra):
    """A new probe register + its item; returns the statement that sets it."""
    name = f"__cv{ctx.nonce}p{sc.sid}_{len(sc.probes)}"
    sc.probes.append(name)
    sc.items.append(Item(metric, kind, sc.file, _line(ctx, node), detail, len(sc.probes) - 1, extra))
    return f"{name} = 1'b1; "


def _share_probe(ctx, sc, metric, kind, node, detail, **extra):
    """An extra item (e.g. the branch item of an if arm) that shares the most recent probe."""
    sc.items.append(Item(metric, kind, sc.file, _line(ctx, node), detail, len(sc.probes) - 1, extra))


def _instrument(rtl_files, top, cfg, key, toggle_backend):
    sm = pyslang.SourceManager()
    names, datas, bufs = [], [], []
    for i, f in enumerate(rtl_files):
        name = os.path.basename(f["name"])
        if not re.fullmatch(r"[A-Za-z0-9_.+-]+", name) or name in names or name.startswith("."):
            raise PrepareError(f"unusable RTL file name {f['name']!r} (letters, digits, _.+- only, unique)")
        data = f["content"].encode("utf-8")
        names.append(name)
        datas.append(data)
        bufs.append(sm.assignText(name, _blank_includes(data).decode("utf-8")))
    tree = S.SyntaxTree.fromBuffers(bufs, sm)
    engine = pyslang.DiagnosticEngine(sm)
    errors = [_diag(engine, sm, d) for d in tree.diagnostics if d.isError()]
    if errors:
        e = errors[0]
        raise PrepareError(f"DUT does not parse: {e['file']}:{e['line']}: {e['msg']}", errors)
    ctx = _Ctx(sm=sm, buf_file={b.id: i for i, b in enumerate(bufs)}, names=names,
               edits=[[] for _ in names], nonce=key[:6], top=top, toggle_backend=toggle_backend, cfg=cfg, constants=set(), typedefs={})
    for i, data in enumerate(datas):
        if _INCLUDE_RE.search(data):
            _note(ctx, f"{names[i]}: `include'd code is not instrumented")
    _collect_names(ctx, tree.root)
    modules = []
    for m in _iter_modules(tree.root):
        modules.append(m.header.name.valueText)
        _module(ctx, m)
    if top not in modules:
        raise PrepareError(f"top module {top!r} is not defined in the RTL files (found: {', '.join(modules) or 'none'})")
    files = [{"name": n, "content": _apply_edits(d, e).decode("utf-8")} for n, d, e in zip(names, datas, ctx.edits)]
    for sc in ctx.scopes:      # drop syntax nodes: PreparedDUT must pickle and stay small
        sc.cases, sc.assigns, sc.comb, sc.tail = [], [], [], []
    return PreparedDUT(key=key, top=top, nonce=ctx.nonce, files=files, scopes=ctx.scopes, modules=modules,
                       notes=ctx.notes, prepare_s=0.0, toggle_backend=toggle_backend)


def _diag(engine, sm, d, source="pyslang"):
    loc = d.location
    try:
        line, col, fname = sm.getLineNumber(loc), sm.getColumnNumber(loc), sm.getFileName(loc)
    except Exception:    # a diagnostic without a usable location: keep the message, say so
        line, col, fname = 0, 0, "?"
    return {"source": source, "file": fname, "line": line, "col": col, "msg": engine.formatMessage(d)}


def _iter_modules(root):
    for m in _nodes(root.members):
        if _kind(m) == "ModuleDeclaration":
            yield m


def _collect_names(ctx, root):
    """Parameter/localparam/enum-member names (FSM state constants) and typedefs, over all files."""
    def rec(n):
        k = _kind(n)
        if k == "ParameterDeclaration":
            for d in _nodes(n.declarators):
                ctx.constants.add(d.name.valueText)
        elif k == "EnumType":
            for d in _nodes(n.members):
                ctx.constants.add(d.name.valueText)
        elif k == "TypedefDeclaration":
            t = n.type
            if _kind(t) == "EnumType":
                base = t.baseType
                dims = _dims_text(base) if base is not None and _kind(base) in ("LogicType", "RegType", "BitType") else None
                ctx.typedefs[n.name.valueText] = ("enum", dims if dims is not None else "[31:0]")
            elif _kind(t) in ("LogicType", "RegType", "BitType") and not _nodes(n.dimensions):
                ctx.typedefs[n.name.valueText] = ("vector", _dims_text(t))
            else:
                ctx.typedefs[n.name.valueText] = ("other", None)
        for c in n:
            if isinstance(c, S.SyntaxNode):
                rec(c)
    rec(root)


def _dims_text(type_node):
    dims = _nodes(getattr(type_node, "dimensions", None))
    return "".join(_text(d) for d in dims)


INT_WIDTHS = {"IntType": "[31:0]", "IntegerType": "[31:0]", "ShortIntType": "[15:0]",
              "LongIntType": "[63:0]", "ByteType": "[7:0]"}
PROCEDURAL = {"AlwaysBlock", "AlwaysCombBlock", "AlwaysFFBlock", "AlwaysLatchBlock", "InitialBlock"}


def _module(ctx, m):
    name = m.header.name.valueText
    start = _end(ctx, m.header)
    end = _loc(ctx, m.endmodule.location)
    if start is None or end is None:
        _note(ctx, f"module {name}: produced by a macro, not instrumented")
        return
    sc = Scope(sid=len(ctx.scopes), module=name, kind="module", file=ctx.names[start[0]], line=_line(ctx, m))
    ctx.scopes.append(sc)
    ports = m.header.ports
    if ports is not None and _kind(ports) == "AnsiPortList":
        prev = None
        for p in _nodes(ports.ports):
            if _kind(p) != "ImplicitAnsiPort":
                _note(ctx, f"module {name}: explicit/interface ports are not toggle-scored")
                continue
            hdr = p.header
            if _kind(hdr) == "InterfacePortHeader":
                continue
            empty = (not _text(hdr).strip())
            if empty and prev is not None:      # `input logic [7:0] a, b`: b inherits a's header
                hdr = prev
            prev = hdr
            direction = hdr.direction.valueText if getattr(hdr, "direction", None) is not None else ""
            _add_signal(ctx, sc, hdr.dataType, p.declarator, direction)
    for it in _nodes(m.members):           # `timeunit`/`timeprecision` must stay the first items
        if _kind(it) != "TimeUnitsDeclaration":
            break
        start = _end(ctx, it) or start
    _scope_members(ctx, sc, m.members)
    _finish_scope(ctx, sc, start, end)


def _scope_members(ctx, sc, members):
    for it in _nodes(members):
        _member(ctx, sc, it)


def _member(ctx, sc, it):
    k = _kind(it)
    if k in PROCEDURAL:
        if _kind(it.statement) == "TimingControlStatement":     # `always @(...) body`: the body is the block
            _compound(ctx, sc, it.statement)
        else:
            _arm(ctx, sc, it.statement, "block", it.keyword.valueText, None)
    elif k == "ContinuousAssign":
        if ctx.cfg.assign_blocks:       # optional: an elaborated continuous assign counts as a covered block
            sc.tail.append(f"initial begin {_new_probe(ctx, sc, 'block', 'assign', it, 'continuous assign')}end ")
        for a in _nodes(it.assignments):
            right = getattr(a, "right", None)
            if right is not None:
                sc.comb.append(_expr_probes(ctx, sc, right))
    elif k == "NetDeclaration":
        for d in _nodes(it.declarators):
            _add_signal(ctx, sc, it.type, d, "")
            if d.initializer is not None:
                sc.comb.append(_expr_probes(ctx, sc, d.initializer.expr))
    elif k == "DataDeclaration":
        for d in _nodes(it.declarators):
            _add_signal(ctx, sc, it.type, d, "")
    elif k == "PortDeclaration":
        hdr = it.header
        if _kind(hdr) != "InterfacePortHeader":
            direction = hdr.direction.valueText if getattr(hdr, "direction", None) is not None else ""
            for d in _nodes(it.declarators):
                _add_signal(ctx, sc, hdr.dataType, d, direction)
    elif k == "GenerateRegion":
        _scope_members(ctx, sc, it.members)
    elif k == "LoopGenerate":
        _gen_body(ctx, sc, it.block)
    elif k == "IfGenerate":
        _gen_body(ctx, sc, it.block)
        if it.elseClause is not None:
            _gen_body(ctx, sc, it.elseClause.clause)
    elif k == "CaseGenerate":
        for ci in _nodes(it.items):
            _gen_body(ctx, sc, ci.clause)
    elif k == "GenerateBlock":
        _gen_body(ctx, sc, it)
    elif k in ("FunctionDeclaration", "TaskDeclaration"):
        _note(ctx, f"module {sc.module}: functions/tasks are not instrumented")


def _gen_body(ctx, parent, node):
    k = _kind(node)
    if k in ("IfGenerate", "CaseGenerate", "LoopGenerate"):
        _member(ctx, parent, node)
        return
    sc = Scope(sid=len(ctx.scopes), module=parent.module, kind="generate", file=parent.file, line=_line(ctx, node))
    sc.port_dirs = parent.port_dirs
    if k == "GenerateBlock":
        start = _end(ctx, node.beginName) if node.beginName is not None else _end_tok(ctx, node.begin)
        end = _loc(ctx, node.end.location)
        if start is None or end is None:
            _note(ctx, f"module {parent.module}: generate block from a macro, not instrumented")
            return
        ctx.scopes.append(sc)
        _scope_members(ctx, sc, node.members)
        _finish_scope(ctx, sc, start, end)
    else:                       # a single generate item without begin/end: wrap it so it is its own scope
        start, end = _start(ctx, node), _end(ctx, node)
        if start is None or end is None:
            _note(ctx, f"module {parent.module}: generate item from a macro, not instrumented")
            return
        ctx.scopes.append(sc)
        _edit(ctx, start, "begin ")
        _member(ctx, sc, node)
        _finish_scope(ctx, sc, start, end, closing_text=" end")


def _end_tok(ctx, tok):
    loc = _loc(ctx, tok.location)
    return None if loc is None else (loc[0], loc[1] + len(tok.rawText.encode()))


def _add_signal(ctx, sc, type_node, decl, direction):
    """Record a toggle-scored signal (scalar / packed vector) declared in this scope."""
    name = decl.name.valueText
    if not name:
        return
    if direction:
        sc.port_dirs[name] = direction
    if _nodes(decl.dimensions):
        sc.signals[name] = {"line": _line(ctx, decl), "dims": None, "why": "unpacked array", "ranged": False}
        return
    k = _kind(type_node) if type_node is not None else "ImplicitType"
    dtype, why = None, None          # dtype: how to declare the monitor registers (same packed shape)
    if k in ("LogicType", "RegType", "BitType", "ImplicitType"):
        dtype = "reg " + _dims_text(type_node)
    elif k in INT_WIDTHS:
        if ctx.cfg.toggle_ints:
            dtype = "reg " + INT_WIDTHS[k] + _dims_text(type_node)
        else:
            why = "int family"
    elif k == "NamedType":
        text = _text(type_node)
        td = ctx.typedefs.get(text.split("::")[-1])
        if td is None or td[0] == "other":
            why = "user type"
        elif td[0] == "enum":
            dtype, why = ("reg " + td[1], None) if ctx.cfg.toggle_enums else (None, "enum")
        else:
            dtype = text             # a typedef of a plain vector: declare the monitors with that type
    elif k == "EnumType":
        why = "enum"
        if ctx.cfg.toggle_enums:
            base = type_node.baseType
            dtype, why = "reg " + (_dims_text(base) if base is not None else "[31:0]"), None
    else:
        why = k
    ranged = dtype is not None and dtype.strip() != "reg"
    old = sc.signals.get(name)
    if old is not None and old["dims"] is not None and (dtype is None or (old["ranged"] and not ranged)):
        return       # non-ANSI `output [3:0] q; reg [3:0] q;` / `output q; reg [3:0] q;`: keep the ranged one
    sc.signals[name] = {"line": _line(ctx, decl), "dims": dtype, "why": why, "ranged": ranged}


# --- statements ------------------------------------------------------------------------------------------

SIMPLE_STMTS = {"ExpressionStatement", "EmptyStatement", "ProceduralAssignStatement", "ProceduralForceStatement",
                "ProceduralReleaseStatement", "ProceduralDeassignStatement", "BlockingEventTriggerStatement",
                "NonblockingEventTriggerStatement", "DisableStatement", "DisableForkStatement", "JumpStatement",
                "ReturnStatement", "VoidCastedCallStatement", "WaitForkStatement", "ImmediateAssertStatement",
                "ImmediateAssumeStatement", "ImmediateCoverStatement"}
DECL_ITEMS = {"DataDeclaration", "NetDeclaration", "ParameterDeclarationStatement", "TypedefDeclaration",
              "LocalVariableDeclaration", "PackageImportDeclaration", "LetDeclaration", "PortDeclaration"}


def _arm(ctx, sc, stmt, kind, detail, branch_kind, label=None):
    """Instrument a statement that is the whole body of an if/else arm, case item, loop, timing control or
    process: it starts a block (and maybe a branch item sharing the probe). Wraps it in begin/end if needed."""
    start, end = _start(ctx, stmt), _end(ctx, stmt)
    if start is None or end is None:
        _note(ctx, f"module {sc.module}: a macro-expanded statement (line {_line(ctx, stmt)}) is not instrumented")
        return
    extra = {"label": label} if label is not None else {}
    probe = _new_probe(ctx, sc, "block", kind, stmt, detail, **extra)
    if branch_kind:
        _share_probe(ctx, sc, "branch", branch_kind, stmt, detail, **extra)
    k = _kind(stmt)
    if k == "SequentialBlockStatement":
        items = _nodes(stmt.items)
        first = next((i for i in items if _kind(i) not in DECL_ITEMS), None)
        at = _start(ctx, first) if first is not None else _loc(ctx, stmt.end.location)
        if at is None:
            _note(ctx, f"module {sc.module}: a macro-expanded statement (line {_line(ctx, stmt)}) is not instrumented")
            return
        _edit(ctx, at, probe)
        _seq(ctx, sc, items, False)
    elif k == "EmptyStatement":      # `default: ;` -> `default: begin probe end` (replace, don't prefix)
        _edit(ctx, start, f"begin {probe}end", delete_end=end[1])
    else:
        _edit(ctx, start, "begin " + probe + _pre(ctx, sc, stmt))
        _edit(ctx, end, " end", close_depth=_depth(stmt))
        _compound(ctx, sc, stmt)


def _seq(ctx, sc, items, new_block):
    """Walk the statements of a begin/end; returns whether the statement after it starts a new block."""
    for st in items:
        if _kind(st) in DECL_ITEMS:
            continue
        at = _start(ctx, st)
        if at is None:
            _note(ctx, f"module {sc.module}: a macro-expanded statement (line {_line(ctx, st)}) is not instrumented")
            continue
        text = ""
        if new_block:
            text = _new_probe(ctx, sc, "block", "block", st, "statements after a compound statement")
        text += _pre(ctx, sc, st)
        if text:
            _edit(ctx, at, text)
        new_block = _compound(ctx, sc, st)
    return new_block


def _compound(ctx, sc, st):
    """Instrument the arms inside statement st; returns whether the next statement starts a new block."""
    k = _kind(st)
    if k in SIMPLE_STMTS:
        return False
    if k == "SequentialBlockStatement":
        return _seq(ctx, sc, _nodes(st.items), False)
    if k == "ConditionalStatement":
        cond = _text(st.predicate)
        _arm(ctx, sc, st.statement, "if_true", f"if ({_short(cond, 60)})", "if_true")
        if st.elseClause is not None:
            _arm(ctx, sc, st.elseClause.clause, "if_false", f"else of if ({_short(cond, 60)})", "if_false")
        else:
            end = _end(ctx, st.statement)
            if end is not None:
                probe = _new_probe(ctx, sc, "branch", "if_false", st, f"implicit else of if ({_short(cond, 60)})")
                _edit(ctx, end, f" else begin {probe}end", close_depth=_depth(st) + 0.5)
        return True
    if k == "CaseStatement":
        if st.matchesOrInside is not None and st.matchesOrInside.valueText:
            _note(ctx, f"module {sc.module}: case-inside/matches at line {_line(ctx, st)} is not instrumented")
            return True
        expr = _text(st.expr)
        labels_all = []
        has_default = False
        for ci in _nodes(st.items):
            if _kind(ci) == "DefaultCaseItem":
                has_default = True
                _arm(ctx, sc, ci.clause, "default", f"case ({_short(expr, 40)}) default", "default", label="default")
            elif _kind(ci) == "StandardCaseItem":
                labels = [_text(e) for e in _nodes(ci.expressions)]
                labels_all.append((labels, ci))
                lab = ", ".join(labels)
                _arm(ctx, sc, ci.clause, "case_item", f"case ({_short(expr, 40)}) item {_short(lab, 40)}",
                     "case_item", label=lab)
        if not has_default:
            at = _loc(ctx, st.endcase.location)
            if at is not None:
                probe = _new_probe(ctx, sc, "branch", "default", st, f"case ({_short(expr, 40)}) implicit default",
                                   label="default")
                _edit(ctx, at, f"default: begin {probe}end ")
        if _kind(st.expr) == "IdentifierName":
            sc.cases.append((st.expr.identifier.valueText, labels_all, _line(ctx, st)))
        return True
    if k in ("LoopStatement", "ForLoopStatement", "ForeverStatement", "DoWhileStatement", "ForeachLoopStatement"):
        _arm(ctx, sc, st.statement, "loop_body", f"loop body ({_short(_text(st), 50)})", None)
        return True
    if k in ("TimingControlStatement", "WaitStatement"):
        inner = st.statement
        if inner is None or _kind(inner) == "EmptyStatement":
            return True           # `#5;` / `@(e);` / `wait (c);`: the next statement starts a new block
        timing = _text(st.timingControl) if k == "TimingControlStatement" else f"wait ({_text(st.expr)})"
        _arm(ctx, sc, inner, "block", f"after {_short(timing, 50)}", None)
        return _kind(inner) not in SIMPLE_STMTS
    if k == "ParallelBlockStatement":
        for it in _nodes(st.items):
            if _kind(it) not in DECL_ITEMS:
                _arm(ctx, sc, it, "block", "fork branch", None)
        return True
    _note(ctx, f"module {sc.module}: statement kind {k} (line {_line(ctx, st)}) is not instrumented")
    return True


def _pre(ctx, sc, st):
    """Probe statements evaluated just before statement st: ternary arms and &&/|| rows of its own
    expressions (assignment right-hand sides, if conditions). Also records assignments for FSM extraction."""
    k = _kind(st)
    if k == "ExpressionStatement":
        e = st.expr
        if _kind(e).endswith("AssignmentExpression") and _kind(e) != "AssignmentPatternExpression":
            if _kind(e.left) == "IdentifierName":
                sc.assigns.append((e.left.identifier.valueText, e.right))
            return _expr_probes(ctx, sc, e.right)
        return ""
    if k == "ConditionalStatement":
        return "".join(_expr_probes(ctx, sc, c.expr) for c in _nodes(st.predicate.conditions)
                       if _kind(c) == "ConditionalPattern" and c.matchesClause is None)
    return ""


# --- expressions ------------------------------------------------------------------------------------------

def _unsafe(node):
    """Why re-evaluating this expression before its statement would be wrong or costly (else None)."""
    k = _kind(node)
    if k == "InvocationExpression":
        left = node.left
        if not (_kind(left) == "SystemName" and left.systemIdentifier.valueText in PURE_SYSTEM_FUNCS):
            return "call"
    if k in ("PostincrementExpression", "PostdecrementExpression", "UnaryPreincrementExpression",
             "UnaryPredecrementExpression") or (k.endswith("AssignmentExpression") and k != "AssignmentPatternExpression"):
        return "side effect"
    if k == "SystemName" and node.systemIdentifier.valueText not in PURE_SYSTEM_FUNCS:
        return "system function"
    for c in node:
        if isinstance(c, S.SyntaxNode):
            why = _unsafe(c)
            if why:
                return why
    return None


def _expr_probes(ctx, sc, expr):
    out = []
    _ternaries(ctx, sc, expr, [], out)
    _chains(ctx, sc, expr, out)
    return "".join(out)


def _ternaries(ctx, sc, node, guards, out):
    if _kind(node) == "ConditionalExpression":
        conds = [c for c in _nodes(node.predicate.conditions)]
        if len(conds) == 1 and _kind(conds[0]) == "ConditionalPattern" and guards is not None \
                and not _unsafe(conds[0].expr):
            c = _text(conds[0].expr)
            g = "".join(f"({x}) && " for x in guards)
            pt = _new_probe(ctx, sc, "branch", "ternary_true", node, f"({_short(c, 50)}) ? ... true arm")
            pf = _new_probe(ctx, sc, "branch", "ternary_false", node, f"({_short(c, 50)}) ? ... false arm")
            out.append(f"if ({g}({c})) {pt}if ({g}!({c})) {pf}")
            _ternaries(ctx, sc, conds[0].expr, guards, out)
            _ternaries(ctx, sc, node.left, guards + [c], out)
            _ternaries(ctx, sc, node.right, guards + [f"!({c})"], out)
        else:
            _note(ctx, f"module {sc.module}: a ternary at line {_line(ctx, node)} is not instrumented (calls/side effects)")
            for c in conds:
                _ternaries(ctx, sc, c, None, out)
            _ternaries(ctx, sc, node.left, None, out)
            _ternaries(ctx, sc, node.right, None, out)
        return
    for c in node:
        if isinstance(c, S.SyntaxNode):
            _ternaries(ctx, sc, c, guards, out)


def _flatten(node, k):
    if _kind(node) == k:
        return _flatten(node.left, k) + _flatten(node.right, k)
    return [node]


def _chains(ctx, sc, node, out, parent_kind=None):
    k = _kind(node)
    if k in ("LogicalAndExpression", "LogicalOrExpression") and parent_kind != k:
        terms = _flatten(node, k)
        if any(_unsafe(t) for t in terms):
            _note(ctx, f"module {sc.module}: an &&/|| chain at line {_line(ctx, node)} is not instrumented (calls/side effects)")
        else:
            texts = [_text(t) for t in terms]
            chain = _short(_text(node), 80)
            op_true = k == "LogicalAndExpression"     # &&: rows are "all 1" and "term i 0, others 1"
            # row "all 1" holds iff every term is logically 1 (`if ((a) && (b))`), row i iff term i is 0
            # and the others 1 (`if (!(a) && (b))`); an X term satisfies neither. So each term is evaluated
            # ONCE to its logical value ((t) ? 1'b1 : 1'b0 is 1, 0 or X) and the rows are the items of a
            # case on the concatenation (case matches X only with X): n evaluations instead of n*(n+1).
            one, zero = ("1", "0") if op_true else ("0", "1")
            n = len(texts)
            rows = [("all terms 1" if op_true else "all terms 0", one * n)]
            for i, t in enumerate(texts):
                rows.append((f"{_short(t, 30)}={zero} while others {one}", one * i + zero + one * (n - i - 1)))
            probes, text = [], ""
            for desc, pattern in rows:
                probes.append(_new_probe(ctx, sc, "expression", "row", node, f"`{chain}`: {desc}", expr=chain, row=desc))
                text += f"{n}'b{pattern}: {probes[-1]}"
            values = ", ".join(f"({t}) ? 1'b1 : 1'b0" for t in texts)
            out.append(f"case ({{{values}}}) {text}default: ; endcase ")
        for t in terms:
            _chains(ctx, sc, t, out, k)
        return
    for c in node:
        if isinstance(c, S.SyntaxNode):
            _chains(ctx, sc, c, out, k)


# --- scope end: FSM monitors, toggle monitors, the final block --------------------------------------------

def _fsm(ctx, sc):
    """Heuristic FSM extraction (docs/coverage.md §3.5): case (X) with identifier labels + constant assignments
    to X or its next-state variable. Returns monitor text; adds state/transition items."""
    by_var = {}
    for var, labels_all, line in sc.cases:
        by_var.setdefault(var, []).append((labels_all, line))
    text = []
    for var, cases in by_var.items():
        if sc.port_dirs.get(var, "") in ("input", "inout"):
            continue
        labels = []
        for labels_all, _ in cases:
            for labs, _ci in labels_all:
                labels.extend(labs)
        if len(set(labels)) < 2 or any(lab not in ctx.constants for lab in labels):
            continue
        nexts = {rhs.identifier.valueText for lhs, rhs in sc.assigns
                 if lhs == var and _kind(rhs) == "IdentifierName" and rhs.identifier.valueText not in ctx.constants}
        targets = {var} | nexts
        trans = []
        for labels_all, _ in cases:
            for labs, ci in labels_all:
                for c in _assigned_constants(ctx, ci.clause, targets):
                    for lab in labs:
                        if c != lab and (lab, c) not in trans:
                            trans.append((lab, c))
        if not trans:
            continue
        states = list(dict.fromkeys(labels))
        for lhs, rhs in sc.assigns:
            if lhs in targets:
                for c in _constants_of(ctx, rhs):
                    if c not in states:
                        states.append(c)
        for a, b in trans:
            for s in (a, b):
                if s not in states:
                    states.append(s)
        line = cases[0][1]
        cur, nxt = f"__cv{ctx.nonce}f{sc.sid}_{len(sc.probes)}c", f"__cv{ctx.nonce}f{sc.sid}_{len(sc.probes)}n"
        body = [f"{nxt} = -1; "]
        for i, s in enumerate(states):
            name = f"__cv{ctx.nonce}p{sc.sid}_{len(sc.probes)}"
            sc.probes.append(name)
            sc.items.append(Item("fsm", "state", sc.file, line, f"FSM {var}: state {s} never reached", len(sc.probes) - 1,
                                 {"fsm_var": var, "state": s}))
            body.append(f"if ({var} === {s}) begin {name} = 1'b1; {nxt} = {i}; end ")
        for a, b in trans:
            name = f"__cv{ctx.nonce}p{sc.sid}_{len(sc.probes)}"
            sc.probes.append(name)
            sc.items.append(Item("fsm", "transition", sc.file, line, f"FSM {var}: transition {a} -> {b} never taken",
                                 len(sc.probes) - 1, {"fsm_var": var, "from_state": a, "to_state": b}))
            body.append(f"if ({cur} == {states.index(a)} && {nxt} == {states.index(b)}) {name} = 1'b1; ")
        body.append(f"{cur} = {nxt}; ")
        text.append(f"integer {cur} = -1, {nxt}; always @({var}) begin {''.join(body)}end ")
    return "".join(text)


def _constants_of(ctx, rhs):
    k = _kind(rhs)
    if k == "IdentifierName" and rhs.identifier.valueText in ctx.constants:
        return [rhs.identifier.valueText]
    if k == "ParenthesizedExpression":
        return _constants_of(ctx, rhs.expression)
    if k == "ConditionalExpression":
        return _constants_of(ctx, rhs.left) + _constants_of(ctx, rhs.right)
    return []


def _assigned_constants(ctx, node, targets):
    out = []

    def rec(n):
        k = _kind(n)
        if k.endswith("AssignmentExpression") and _kind(n.left) == "IdentifierName" \
                and n.left.identifier.valueText in targets:
            out.extend(_constants_of(ctx, n.right))
        for c in n:
            if isinstance(c, S.SyntaxNode):
                rec(c)
    rec(node)
    return out


def _toggle_monitor(pre, toggles):
    """Toggle monitors of one scope, one process per signal. They compare END-OF-TIMESTEP values (like a
    VCD): tl = latest value seen; on the first wake-up in a new time step the previous step's final value
    (tl) is committed against the value committed before it (tp), so zero-time glitches never count.
    $realtime (a VPI call, the dominant cost) is called once per wake-up, and a monitor whose bits have all
    risen and fallen stops (`disable`): later changes cannot alter its result, so saturated clocks, counters
    and datapath bits cost nothing for the rest of the simulation."""
    out = []
    for j, (name, tr, tf, _, dims) in enumerate(toggles):
        tp, tl, tt, tn, blk = (f"{pre}{j}{x}" for x in "plt" "nb")
        out.append(f"{dims} {tr}, {tf}, {tp}, {tl}; real {tt}, {tn}; initial begin : {blk} {tl} = {name}; "
                   f"{tt} = $realtime; forever begin @({name}); {tn} = $realtime; if ({tn} != {tt}) begin "
                   f"{tr} = {tr} | (~{tp} & {tl}); {tf} = {tf} | ({tp} & ~{tl}); {tp} = {tl}; {tt} = {tn}; "
                   f"if (&({tr} & {tf}) === 1'b1) disable {blk}; end {tl} = {name}; end end ")
    return "".join(out)


def _toggle_vpi(pre, toggles, group):
    """The VPI backend's toggle monitoring of one scope: one call registers a value-change callback per signal
    (vpi/toggle_cov.c keeps the end-of-timestep state); the `final` block calls $__cv_toggle_end(group),
    which commits the last step and writes the rise/fall registers that the record prints."""
    regs = "".join(f"{dims} {tr}, {tf}; " for _, tr, tf, _, dims in toggles)
    args = "".join(f", {name}, {tr}, {tf}" for name, tr, tf, _, _ in toggles)
    return f"{regs}integer {group} = -1; initial $__cv_toggle({group}{args}); "


def _toggle_commit(pre, toggles):
    """The last commits, run in the scope's `final` block. The simulation may end ($finish) after a change
    but before the monitor woke up for it, so the final value is read from the signal itself: if the time
    moved on since the monitor's last wake-up, its last value (tl) is committed first, then the signal's
    final value is committed against the one before it."""
    out = []
    for j, (name, tr, tf, _, _) in enumerate(toggles):
        tp, tl, tt = f"{pre}{j}p", f"{pre}{j}l", f"{pre}{j}t"
        out.append(f"if ($realtime != {tt}) begin {tr} = {tr} | (~{tp} & {tl}); {tf} = {tf} | ({tp} & ~{tl}); "
                   f"{tp} = {tl}; end {tl} = {name}; {tr} = {tr} | (~{tp} & {tl}); {tf} = {tf} | ({tp} & ~{tl}); ")
    return "".join(out)


def _finish_scope(ctx, sc, start, end, closing_text=""):
    """Declare probes at the scope start; FSM and toggle monitors and the `final` block at its end."""
    tail = list(sc.tail)
    if sc.comb:
        comb = "".join(sc.comb)
        if comb:
            tail.append(f"always_comb begin {comb}end ")
    if sc.cases:
        tail.append(_fsm(ctx, sc))
    out_file, tag = f"`__cv{ctx.nonce}_F", f"`__cv{ctx.nonce}_T"     # per-run values from iverilog -D
    fd = f"__cv{ctx.nonce}fd{sc.sid}"
    toggles, skipped = [], []
    for name, s in sc.signals.items():
        if s["dims"] is None:
            skipped.append(f"{name} ({s['why']})")
            continue
        j = len(toggles)
        toggles.append((name, f"__cv{ctx.nonce}t{sc.sid}_{j}r", f"__cv{ctx.nonce}t{sc.sid}_{j}f", s["line"], s["dims"]))
    commits = []
    if toggles and ctx.toggle_backend == "vpi":
        group = f"__cv{ctx.nonce}g{sc.sid}"
        tail.append(_toggle_vpi(f"__cv{ctx.nonce}t{sc.sid}_", toggles, group))
        commits = [f"$__cv_toggle_end({group}); "]
    elif toggles:
        tail.append(_toggle_monitor(f"__cv{ctx.nonce}t{sc.sid}_", toggles))
        commits = [_toggle_commit(f"__cv{ctx.nonce}t{sc.sid}_", toggles)]
    if skipped:
        _note(ctx, f"toggle: not scored in {sc.module}: {_short(', '.join(skipped), 200)}")
    sc.signals = {name: {"line": line, "index": j} for j, (name, _, _, line, _) in enumerate(toggles)}
    if sc.probes:
        probe_fmt, probe_args = "%b", ", {" + ", ".join(sc.probes) + "}"
    else:
        probe_fmt, probe_args = "-", ""
    if toggles:
        tog_fmt = ",".join("%b,%b" for _ in toggles)
        tog_args = "".join(f", {tr}, {tf}" for _, tr, tf, _, _ in toggles)
    else:
        tog_fmt, tog_args = "-", ""
    tail.append(f"integer {fd}; final begin {''.join(commits)}{fd} = $fopen({out_file}, \"a\"); "
                f"$fdisplay({fd}, \"%s I {sc.sid} {probe_fmt} %m\", {tag}{probe_args}); "
                f"$fdisplay({fd}, \"%s T {sc.sid} {tog_fmt} %m\", {tag}{tog_args}); $fclose({fd}); end ")
    if sc.kind == "module" and sc.module == ctx.top:
        tail.append(_watchdog_trigger(ctx, sc))
    if sc.probes:
        _edit(ctx, start, " reg " + ", ".join(sc.probes) + "; ")
    _edit(ctx, end, " " + "".join(tail) + closing_text, close_depth=-1)


def _watchdog_trigger(ctx, sc):
    """In the DUT top: once the watchdog module (watchdog_source) has reached the simulated-time limit, the
    next change on any DUT port ends the run with $finish (a process that waits for the arming, so it
    costs nothing before the limit). Compiled only when the limit macro is defined.
    A run whose events have all run out before the limit therefore still ends by itself (the watchdog's
    own delay is its last event), while one that keeps driving the DUT stops right after the limit."""
    ports = [n for n in sc.port_dirs if sc.signals.get(n, {}).get("why") != "unpacked array"]
    if not ports:
        _note(ctx, f"module {sc.module}: no ports, so no simulated-time limit (the wall-clock timeout applies)")
        return ""
    wd = f"__cv{ctx.nonce}wd"
    return (f"`ifdef __cv{ctx.nonce}_L initial begin wait ({wd}.armed); @({', '.join(ports)}); {wd}.hit = 1; "
            f"$finish; end `endif ")


def watchdog_source(nonce):
    """The watchdog module, compiled after the testbench so it inherits the testbench's `timescale: it waits
    the limit (in the testbench's time units), then arms the trigger in the DUT top; its `final` block
    writes `<tag> E <hit> <end time>` to the run's record file."""
    wd, tag = f"__cv{nonce}wd", f"`__cv{nonce}_T"
    return (f"module {wd}; reg armed = 1'b0, hit = 1'b0; integer fd; initial begin #(`__cv{nonce}_L); armed = 1'b1; end\n"
            f"final begin fd = $fopen(`__cv{nonce}_F, \"a\"); $fdisplay(fd, \"%s E %0d %0d\", {tag}, hit, $time); "
            f"$fclose(fd); end\nendmodule\n")


def run_defines(nonce, out_file, tag, sim_time_limit=0):
    """iverilog -D flags that tell the instrumented DUT where and how to write its records (per run; the
    values end up only in the compiled program, whose file name is random), and the simulated-time limit
    (only with a positive limit; then watchdog_source(nonce) must be compiled too)."""
    limit = [f"-D__cv{nonce}_L={int(sim_time_limit)}"] if sim_time_limit and sim_time_limit > 0 else []
    return [f'-D__cv{nonce}_F="{out_file}"', f'-D__cv{nonce}_T="{tag}"'] + limit
