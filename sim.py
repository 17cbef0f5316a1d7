"""sim.py: chorus-mini's coverage scorer. Scores a SystemVerilog stimulus testbench by the code coverage it
reaches on a DUT instance, with plain Icarus Verilog (iverilog -g2012 + vvp), approximating the reference
flow (Cadence xrun -coverage all + IMC "Overall Average" of the `uut` row). Every number the kit uses (RL
reward, data curation, evaluation, the distillation gate) comes from here. Design: docs/coverage.md.

How it works (three layers, each testable alone):
  1. Build. `prepare_dut` parses the DUT with pyslang and writes an instrumented copy: 1-bit probe registers
     for block/branch/expression/FSM items, per-signal toggle monitors, and per scope (module body or
     generate block) a `final` block that appends `%m` and the probe bits to a per-run file. Inserted text
     never contains a newline, so file:line in messages is the ORIGINAL file and line. Cached by content hash.
     `check_testbench` pre-scans the testbench (cached per testbench+DUT+inst hash).
     `build_script`/`bwrap_argv` turn a run into argv lists.
  2. Run. `run_job_dir` owns the one subprocess: ONE bubblewrap start per run running a tiny sh script
     that sets resource limits, compiles (iverilog) and simulates (timeout -s INT ... vvp -n ... -none).
  3. Parse. `score_run` reads the probe records (per-run secret tag), keeps `<tbtop>.<inst>` and everything
     below it (generate blocks, submodules), and computes metrics -> `SimResult`.

Metrics (metric_def_version 1; coverage.md "Metric definitions"): block, branch, expression (n+1 rows per
&&/|| chain), toggle (bit covered iff 0->1 and 1->0 seen between END-OF-TIMESTEP values, as in a VCD, so
zero-time glitches never count; the time-0 value is the starting value; X/Z transitions don't count),
fsm (heuristic states + S->T transitions). overall_pct = mean over block, expression, toggle, fsm with
items (profile "imc"); profile "strict" adds branch. overall_covered_pct is item weighted.
reward = 1 + overall/100 when status is ok, else 0. For many runs keep one SimPool (workers start once).

What the sandbox covers (when bubblewrap works): a fresh per-run directory is the only writable path
(mounted at /sim); /usr is read-only; no /etc, /home, /proc or network; private pid/ipc/uts/user namespaces;
all capabilities dropped; rlimits (set with the shell's ulimit builtins: the same limits prlimit sets, one
process fewer) bound address space, CPU seconds, file size and open files; a timeout INSIDE the sandbox
sends SIGINT so vvp runs `final` blocks and partial coverage survives; stdout/stderr are
drained with head+tail kept and a byte cap (output_limit); an outer wall-clock backstop kills the process
tree. The pre-scan rejects `include, `$system`, `bind`, any mention of the probe prefix `__cv`, modules
that redefine DUT modules, and writes/forces into the DUT hierarchy. Probe records carry a per-run secret
tag and go to a per-run secret file name, both passed as iverilog -D macros, so they exist only inside the
compiled program, whose file name is random (there is no /proc in the sandbox and Verilog cannot list a
directory); macro token pasting is rejected so a testbench cannot assemble the macro names; duplicated
records are detected and rejected.
What it does NOT cover: without bubblewrap (missing, or no user namespaces; logged once) there is no
filesystem isolation: `$fopen` can read or write any file the user can, and a testbench that reads
/proc/self/cmdline could in principle learn the compiled program's name and forge probe records. CPU and
memory are bounded per process, not per run. The instrumented DUT sources stay readable in the run dir
(they hold probe names, never the per-run secrets). A DUT is trusted input: it is compiled as given.

Known gaps and deviations from docs/coverage.md:
  - Functions/tasks in the DUT are not instrumented (noted); macro-expanded statements are not
    instrumented (noted); `include in a DUT is not instrumented (noted).
  - FSM extraction is heuristic: `case (X)` with >= 2 identifier labels (parameters/localparams/enum
    members) and constant assignments to X or its next-state variable. Numeric-label FSMs and if-chain FSMs
    are missed; hold and reset arcs are not scored.
  - Toggle: types resolved syntactically (typedefs in the given files only); packed structs, enums, the
    int family, real, string, event and unpacked arrays are excluded (ints/enums configurable). Bits are
    reported as offsets from the LSB end of the declared packed range. Multi-dim packed vectors count as
    one flat vector.
  - Expression rows are evaluated locally per chain (not sensitised to the outer result); chains and
    ternaries whose terms contain calls, ++/-- or assignments are skipped. Continuous assignments are not
    blocks; their ternaries/chains are monitored by an always_comb (may see zero-time glitches).
  - The VPI toggle backend (coverage.md 3.4) is not implemented; toggle uses in-HDL monitors only.
  - Pre-scan unsupported-construct findings (covergroup, SVA, randomize, clocking, ...) do not block the
    run: they are reported as the first errors when Icarus then fails, and as notes when it does not.
  - Limits: rlimits come from `ulimit` in the sandbox script rather than the prlimit binary (same kernel
    limits); the compile has no separate wall timer (CPU rlimit + the outer backstop bound it).
  - `passed` with no targets is just status == ok. always_comb blocks run once at time 0 (Icarus and the
    LRM), so a `default:` arm reached only while the case expression is still X counts as covered.
  - ScoreConfig adds compile_timeout_s and keep_run_dir to the contract's fields; SimResult adds targets
    (per-target actual/met), per_instance (cumulative per module instance), found_dut_paths, command, run_dir.

Usage:
  python sim.py score --rtl A.sv [B.sv ...] --top MODULE --inst NAME --tb tb.sv [--target 90] [--json]
  python sim.py score --tasks FILE.jsonl --id TASK_ID --tb tb.sv [--json]
  python sim.py prepare --rtl A.sv [...] --top MODULE
"""
import argparse
import concurrent.futures
import dataclasses
import hashlib
import json
import queue
import os
import re
import secrets
import selectors
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections import deque
from dataclasses import dataclass, field

import pyslang
from pyslang import syntax as S

SIM_PY_VERSION = "1.0"
METRIC_DEF_VERSION = 1

# result statuses, defined once
OK = "ok"                           # ran, DUT instance found, coverage read
REJECTED = "rejected"               # pre-scan refused the testbench (security / policy)
COMPILE_ERROR = "compile_error"     # iverilog failed (or the DUT could not be parsed)
RUNTIME_ERROR = "runtime_error"     # vvp exited non-zero or was killed (memory, CPU, $fatal)
TIMEOUT = "timeout"                 # wall-clock limit hit; SIGINT ran `final`, partial coverage kept
OUTPUT_LIMIT = "output_limit"       # printed more than output_cap_bytes; stopped with SIGINT
NO_DUT_INSTANCE = "no_dut_instance"  # coverage records exist but none under <tbtop>.<inst>
NO_COVERAGE = "no_coverage"         # no probe records at all, or the DUT instance has no items
INTERNAL_ERROR = "internal_error"   # a bug or environment problem in the scorer itself
STATUSES = (OK, REJECTED, COMPILE_ERROR, RUNTIME_ERROR, TIMEOUT, OUTPUT_LIMIT, NO_DUT_INSTANCE,
            NO_COVERAGE, INTERNAL_ERROR)

METRICS = ("block", "branch", "expression", "toggle", "fsm")
PROFILES = {"imc": ("block", "expression", "toggle", "fsm"),          # IMC "Overall Average" (default)
            "strict": ("block", "branch", "expression", "toggle", "fsm")}

LOG_KEEP_BYTES = 8 << 10        # head and tail of the combined log kept in the result
MAX_ERRORS = 30                 # errors kept in a result
MAX_UNCOVERED = 400             # uncovered items kept in a result (most useful first)
MAX_TB_BYTES = 1 << 20          # a testbench larger than this is rejected
FSIZE_LIMIT = 256 << 20         # RLIMIT_FSIZE: largest file a run may write
NOFILE_LIMIT = 256              # RLIMIT_NOFILE: open files
KILL_AFTER_S = 3                # timeout -k: SIGKILL this long after SIGINT
BACKSTOP_EXTRA_S = 10           # outer Python backstop beyond the inner timeouts
PREPARE_CACHE_SIZE = 128        # prepared DUTs kept per process
PRESCAN_CACHE_SIZE = 512        # pre-scan results kept per process (keyed by testbench + DUT + inst)
# pure system functions allowed inside re-evaluated expression terms (everything else is skipped)
PURE_SYSTEM_FUNCS = {"$signed", "$unsigned", "$clog2", "$bits", "$countones", "$onehot", "$onehot0",
                     "$isunknown", "$size", "$high", "$low", "$left", "$right"}


@dataclass(frozen=True)
class ScoreConfig:
    profile: str = "imc"                # "imc": overall = block, expression, toggle, fsm; "strict": + branch
    timeout_s: float = 20.0             # simulation wall clock (inside the sandbox, SIGINT keeps coverage)
    compile_timeout_s: float = 30.0     # iverilog wall clock
    mem_limit_mb: int = 4096            # RLIMIT_AS per process (ulimit -v)
    output_cap_bytes: int = 16 << 20    # total stdout+stderr bytes before output_limit
    sandbox: bool = True                # bubblewrap when usable (rlimits + timeout always)
    toggle_ints: bool = False           # score int/integer/byte/shortint/longint bits (Xcelium: off)
    toggle_enums: bool = False          # score enum-typed signals (Xcelium default: off)
    assign_blocks: bool = False         # count continuous assigns as (always covered) blocks
    keep_run_dir: bool = False          # keep the per-run directory for debugging (path in result.run_dir)


@dataclass
class SimResult:
    id: str = ""
    status: str = INTERNAL_ERROR
    compile_ok: bool = False
    sim_finished: bool = False          # vvp ended by itself ($finish/$stop/$fatal/empty event queue)
    timed_out: bool = False
    exit_code: int | None = None
    metrics: dict = field(default_factory=dict)       # {metric: {covered, total, pct}}
    overall_pct: float | None = None
    overall_covered_pct: float | None = None
    passed: bool = False
    targets: list = field(default_factory=list)       # [{inst_name, metric, target_percentage, actual, met}]
    per_instance: dict = field(default_factory=dict)  # {"uut.u_sub": {metric: {covered, total}}}
    uncovered: list = field(default_factory=list)
    errors: list = field(default_factory=list)        # [{source, file, line, col, msg}]
    found_dut_paths: list = field(default_factory=list)
    log_head: str = ""
    log_tail: str = ""
    timings: dict = field(default_factory=dict)
    versions: dict = field(default_factory=dict)
    notes: list = field(default_factory=list)
    command: str = ""                   # the sandboxed command line (paste to reproduce inside run_dir)
    run_dir: str = ""

    def to_dict(self):
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d):
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


class PrepareError(Exception):
    """The DUT cannot be parsed or instrumented (message is one line; .errors has details)."""

    def __init__(self, msg, errors=()):
        super().__init__(msg)
        self.errors = list(errors)


# ---------------------------------------------------------------------------------------------------------
# Tasks and jobs

def read_jsonl(path):
    """(line number, object) for every non-blank line of a JSONL file; a line that is not a JSON object
    raises ValueError naming the file and line. (Also sft.py's reader.)"""
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{lineno}: malformed JSON ({e.msg})") from None
            if not isinstance(row, dict):
                raise ValueError(f"{path}:{lineno}: expected a JSON object, got {type(row).__name__}")
            yield lineno, row


def load_tasks(path):
    """Read a CVDP-ECov JSONL task file (id, rtl_files, dut_module_name, dut_instance_name, targets, ...)."""
    tasks = []
    for lineno, row in read_jsonl(path):
        missing = [k for k in ("id", "rtl_files", "dut_module_name", "dut_instance_name") if k not in row]
        if missing:
            raise ValueError(f"{path}:{lineno}: task is missing field(s) {', '.join(missing)}")
        tasks.append(row)
    return tasks


def job_from_task(task, tb_source, target_mode="cvdp"):
    """A picklable job for simulate(): the task's RTL, top/instance names, the testbench and its targets.

    target_mode "cvdp": the task's CVDP targets (metrics not starting with icarus_); "icarus": the kit's
    Icarus-calibrated targets (metric prefixed icarus_) when the task has them, else the CVDP ones."""
    if target_mode not in ("cvdp", "icarus"):
        raise ValueError(f"target_mode must be 'cvdp' or 'icarus', got {target_mode!r}")
    targets = list(task.get("targets") or [])
    icarus = [t for t in targets if str(t.get("metric", "")).startswith("icarus_")]
    cvdp = [t for t in targets if not str(t.get("metric", "")).startswith("icarus_")]
    chosen = icarus if (target_mode == "icarus" and icarus) else cvdp
    return {"id": task["id"],
            "rtl_files": [{"name": f["name"], "content": f["content"]} for f in task["rtl_files"]],
            "top": task["dut_module_name"], "inst": task["dut_instance_name"], "tb": tb_source,
            "targets": [{"inst_name": t["inst_name"], "metric": t["metric"],
                         "target_percentage": float(t["target_percentage"])} for t in chosen]}


def _check_job(job):
    for k in ("rtl_files", "top", "inst", "tb"):
        if k not in job:
            raise ValueError(f"job {job.get('id', '?')!r} is missing {k!r}")
    if not job["rtl_files"]:
        raise ValueError(f"job {job.get('id', '?')!r} has no rtl_files")
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_$]*", job["inst"]):
        raise ValueError(f"job {job.get('id', '?')!r}: instance name {job['inst']!r} is not a simple identifier")


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


_PREPARE_CACHE = {}


def prepare_dut(rtl_files, top, cfg=None):
    """Parse and instrument the DUT once (cached per process by content hash); raises PrepareError."""
    cfg = cfg or ScoreConfig()
    h = hashlib.sha256()
    for f in rtl_files:
        h.update(f["name"].encode() + b"\0" + f["content"].encode() + b"\0")
    h.update(f"{top}|{cfg.toggle_ints}|{cfg.toggle_enums}|{cfg.assign_blocks}|{METRIC_DEF_VERSION}".encode())
    key = h.hexdigest()
    if key in _PREPARE_CACHE:
        return _PREPARE_CACHE[key]
    t0 = time.perf_counter()
    prepared = _instrument(rtl_files, top, cfg, key)
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
    cfg: ScoreConfig
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


def _instrument(rtl_files, top, cfg, key):
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
               edits=[[] for _ in names], nonce=key[:6], cfg=cfg, constants=set(), typedefs={})
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
                       notes=ctx.notes, prepare_s=0.0)


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
            base = [f"({t})" if op_true else f"!({t})" for t in texts]
            rows = [("all terms 1" if op_true else "all terms 0", base)]
            for i, t in enumerate(texts):
                flipped = list(base)
                flipped[i] = f"!({t})" if op_true else f"({t})"
                rows.append((f"{_short(t, 30)}={'0' if op_true else '1'} while others {'1' if op_true else '0'}",
                             flipped))
            for desc, conds in rows:
                probe = _new_probe(ctx, sc, "expression", "row", node, f"`{chain}`: {desc}", expr=chain, row=desc)
                out.append(f"if ({' && '.join(conds)}) {probe}")
        for t in terms:
            _chains(ctx, sc, t, out, k)
        return
    for c in node:
        if isinstance(c, S.SyntaxNode):
            _chains(ctx, sc, c, out, k)


# --- scope end: FSM monitors, toggle monitors, the final block --------------------------------------------

def _fsm(ctx, sc):
    """Heuristic FSM extraction (coverage.md 3.5): case (X) with identifier labels + constant assignments
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


def _toggle_commit(pre, toggles):
    """The last time step's commit, run in the scope's `final` block."""
    out = []
    for j, (_, tr, tf, _, _) in enumerate(toggles):
        tp, tl = f"{pre}{j}p", f"{pre}{j}l"
        out.append(f"{tr} = {tr} | (~{tp} & {tl}); {tf} = {tf} | ({tp} & ~{tl}); ")
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
    if toggles:
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
    if sc.probes:
        _edit(ctx, start, " reg " + ", ".join(sc.probes) + "; ")
    _edit(ctx, end, " " + "".join(tail) + closing_text, close_depth=-1)


def run_defines(nonce, out_file, tag):
    """iverilog -D flags that tell the instrumented DUT where and how to write its records (per run; the
    values end up only in the compiled program, whose file name is random)."""
    return [f'-D__cv{nonce}_F="{out_file}"', f'-D__cv{nonce}_T="{tag}"']


# ---------------------------------------------------------------------------------------------------------
# Build, part 2: pre-scan the testbench

UNSUPPORTED_TOKENS = {
    "CoverGroupKeyword": "covergroup/coverpoint (functional coverage) is not supported by Icarus; remove it",
    "PropertyKeyword": "SVA property is not supported by Icarus; remove it",
    "SequenceKeyword": "SVA sequence is not supported by Icarus; remove it",
    "ClockingKeyword": "clocking blocks are not supported by Icarus; use @(posedge clk)",
    "DoubleHash": "##N cycle delays are not supported by Icarus; use repeat (N) @(posedge clk)",
    "IffKeyword": "`iff` in event controls is not supported by Icarus",
    "RandCaseKeyword": "randcase is not supported by Icarus; use $urandom_range and case",
    "RandSequenceKeyword": "randsequence is not supported by Icarus",
    "ConstraintKeyword": "constraints/randomize are not supported by Icarus; use $urandom/$urandom_range",
    "RandKeyword": "rand class members/randomize are not supported by Icarus; use $urandom/$urandom_range",
    "RandCKeyword": "randc class members/randomize are not supported by Icarus; use $urandom/$urandom_range",
    "InsideKeyword": "the inside operator is not supported by Icarus 11; compare explicitly",
}


_PRESCAN_CACHE = {}


def check_testbench(tb, prepared, inst):
    """Pre-scan a testbench. Returns (forbidden, hints, diags): forbidden errors reject the run; hints are
    constructs Icarus 11 cannot run (shown if it then fails); diags are pyslang's syntax errors.
    The result depends only on the testbench text, the prepared DUT (its file and module names) and the
    instance name, so it is cached per process on their hash (RL and evaluation re-score identical
    testbenches); every call returns fresh copies, so callers may modify what they get."""
    key = hashlib.sha256(tb.encode("utf-8", "surrogatepass") + b"\0" + prepared.key.encode() + b"\0"
                         + inst.encode("utf-8", "surrogatepass")).digest()
    hit = _PRESCAN_CACHE.get(key)
    if hit is None:
        hit = _check_testbench(tb, prepared, inst)
        if PRESCAN_CACHE_SIZE <= 0:
            return hit
        if len(_PRESCAN_CACHE) >= PRESCAN_CACHE_SIZE:
            _PRESCAN_CACHE.pop(next(iter(_PRESCAN_CACHE)))
        _PRESCAN_CACHE[key] = hit
    return tuple([dict(e) for e in lst] for lst in hit)


def _check_testbench(tb, prepared, inst):
    forbidden, hints = [], []

    def err(lst, line, msg, col=0):
        lst.append({"source": "prescan", "file": "tb.sv", "line": line, "col": col, "msg": msg})

    raw = tb.encode("utf-8")
    if len(raw) > MAX_TB_BYTES:
        err(forbidden, 0, f"testbench is larger than {MAX_TB_BYTES} bytes")
        return forbidden, hints, []
    for m in _INCLUDE_RE.finditer(raw):
        line = raw.count(b"\n", 0, m.start()) + 1
        path = re.search(rb'["<]([^">]*)[">]', m.group(0))
        target = path.group(1).decode("utf-8", "replace") if path else ""
        if target.startswith("/") or ".." in target.replace("\\", "/").split("/"):
            err(forbidden, line, f"`include of an absolute or parent path ({target!r}) is not allowed")
        elif os.path.basename(target) in {f["name"] for f in prepared.files}:
            err(forbidden, line, f"do not `include the DUT file {target!r}: the scorer compiles it itself")
        else:
            err(forbidden, line, f"`include {target!r} is not allowed: only the DUT files and the testbench exist")
    for m in re.finditer(rb"``", raw):
        err(forbidden, raw.count(b"\n", 0, m.start()) + 1, "macro token pasting (``) is not allowed in testbenches")
        break
    for m in re.finditer(rb"__cv", raw, re.IGNORECASE):
        err(forbidden, raw.count(b"\n", 0, m.start()) + 1, "names starting with __cv are reserved for the scorer")
        break
    if forbidden:
        return forbidden, hints, []
    sm = pyslang.SourceManager()
    buf = sm.assignText("tb.sv", tb)
    tree = S.SyntaxTree.fromBuffers([buf], sm)
    engine = pyslang.DiagnosticEngine(sm)
    diags = [_diag(engine, sm, d) for d in tree.diagnostics if d.isError()][:MAX_ERRORS]

    def line_of(tok):
        return sm.getLineNumber(sm.getFullyOriginalLoc(tok.location))

    toks = _tokens(tree.root)
    for i, tok in enumerate(toks):
        k = tok.kind.name
        if k == "SystemIdentifier" and tok.valueText == "$system":
            err(forbidden, line_of(tok), "$system is not allowed")
        elif k in ("Identifier", "SystemIdentifier") and "__cv" in tok.valueText.lower():
            err(forbidden, line_of(tok), "names starting with __cv are reserved for the scorer")
        elif k == "BindKeyword":
            err(forbidden, line_of(tok), "bind is not allowed: it would add code inside the DUT")
        elif k in UNSUPPORTED_TOKENS:
            if k == "PropertyKeyword" and i and toks[i - 1].kind.name == "AssertKeyword":
                err(hints, line_of(tok), "concurrent assertions (assert property) are not supported by Icarus")
            else:
                err(hints, line_of(tok), UNSUPPORTED_TOKENS[k])
        elif k in ("UniqueKeyword", "PriorityKeyword") and i + 1 < len(toks) and toks[i + 1].kind.name == "IfKeyword":
            err(hints, line_of(tok), f"{tok.valueText} if is not supported by Icarus; use a plain if")
        elif k == "Identifier" and tok.valueText in ("randomize", "mailbox", "semaphore"):
            err(hints, line_of(tok), f"{tok.valueText} is not supported by Icarus"
                + ("; use $urandom/$urandom_range" if tok.valueText == "randomize" else ""))
        elif k == "Identifier" and tok.valueText in ("name", "next", "prev") and i and toks[i - 1].kind.name == "Dot" \
                and i + 2 < len(toks) and toks[i + 1].kind.name == "OpenParenthesis" \
                and toks[i + 2].kind.name == "CloseParenthesis":
            err(hints, line_of(tok), f"enum method .{tok.valueText}() is not supported by Icarus 11")
    dut_modules = set(prepared.modules)
    for m in _nodes(tree.root.members):
        if _kind(m) == "ModuleDeclaration" and m.header.name.valueText in dut_modules:
            err(forbidden, line_of(m.getFirstToken()),
                f"the testbench redefines DUT module {m.header.name.valueText!r}; instantiate it instead")
    hier = re.compile(r"(^|\.)" + re.escape(inst) + r"(\[[^\]]*\])*\.")

    def lvalue_check(node, what):
        text = re.sub(r"\s+", "", _text(node))
        if hier.search(text):
            err(forbidden, line_of(node.getFirstToken()),
                f"{what} into the DUT hierarchy ({_short(text, 40)}) is not allowed: drive the DUT through its ports")

    def rec(n):
        k = _kind(n)
        if k.endswith("AssignmentExpression") and k != "AssignmentPatternExpression":
            lvalue_check(n.left, "writing")
        elif k in ("ProceduralReleaseStatement", "ProceduralDeassignStatement"):
            lvalue_check(n.expr, "release/deassign")
        elif k == "InvocationExpression" and _kind(n.left) == "SystemName" \
                and n.left.systemIdentifier.valueText == "$deposit" and n.arguments is not None:
            args = _nodes(n.arguments.parameters)
            if args:
                lvalue_check(args[0], "$deposit")
        for c in n:
            if isinstance(c, S.SyntaxNode):
                rec(c)
    if re.search(r"\b" + re.escape(inst) + r"\s*(\[[^\]]*\]\s*)*\.", tb):     # walk the tree only when
        rec(tree.root)                                                           # `inst.` appears at all
    return forbidden, hints, diags


# ---------------------------------------------------------------------------------------------------------
# Build, part 3: argv lists and the in-sandbox script (pure functions)

def build_script(dut_names, defines, tb_name, vvp_name, cfg):
    """The sh script run inside the sandbox: resource limits (shell builtins: no extra process), compile,
    record the compile status, then simulate under `timeout -s INT` so the `final` blocks still run."""
    q = shlex.quote
    cpu = int(cfg.timeout_s + cfg.compile_timeout_s) + 5
    return (f"ulimit -v {cfg.mem_limit_mb << 10}\nulimit -t {cpu}\nulimit -f {FSIZE_LIMIT // 512}\n"
            f"ulimit -n {NOFILE_LIMIT}\nulimit -c 0\n"
            f"iverilog -g2012 {' '.join(q(d) for d in defines)} -o {q(vvp_name)} "
            f"{' '.join(q(n) for n in list(dut_names) + [tb_name])} 1>&2\n"
            "rc=$?\n"
            "echo $rc > compile.rc\n"
            "[ $rc -eq 0 ] || exit 0\n"
            f"exec timeout -s INT -k {KILL_AFTER_S} {cfg.timeout_s:g} vvp -n {q(vvp_name)} -none 2>&1\n")


def bwrap_argv(run_dir):
    """bubblewrap: read-only /usr, the run dir as the only writable path, no /proc, /etc, /home or network."""
    argv = ["bwrap", "--ro-bind", "/usr", "/usr"]
    for d in ("/bin", "/sbin", "/lib", "/lib64", "/lib32"):
        if os.path.islink(d):
            argv += ["--symlink", os.readlink(d).lstrip("/"), d]
        elif os.path.isdir(d):
            argv += ["--ro-bind", d, d]
    return argv + ["--dev", "/dev", "--tmpfs", "/tmp", "--bind", run_dir, "/sim", "--chdir", "/sim",
                   "--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL",
                   "--clearenv", "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "HOME", "/sim"]


_BWRAP_STATE = {}     # "ok": bool, "why": str (checked once per process)


def bwrap_usable():
    """Check once whether bubblewrap can start here (user namespaces etc.) and run iverilog inside;
    log once when it cannot."""
    if "ok" not in _BWRAP_STATE:
        why = ""
        tool = os.path.realpath(shutil.which("iverilog") or "iverilog")
        if shutil.which("bwrap") is None:
            why = "bwrap not found (apt-get install bubblewrap)"
        elif not tool.startswith(("/usr/", "/bin/")):
            why = f"iverilog at {tool} is outside /usr, which is all the sandbox shows"
        else:
            d = tempfile.mkdtemp(prefix="chorus_sim_chk_")
            try:
                p = subprocess.run(bwrap_argv(d) + ["iverilog", "-V"], capture_output=True, timeout=20)
                if p.returncode != 0:
                    why = "bwrap cannot start: " + _short(p.stderr.decode("utf-8", "replace"), 120)
            except (OSError, subprocess.TimeoutExpired) as e:
                why = f"bwrap cannot start: {e}"
            finally:
                shutil.rmtree(d, ignore_errors=True)
        _BWRAP_STATE["ok"], _BWRAP_STATE["why"] = not why, why
        if why:
            print(f"sim.py: sandbox without bubblewrap ({why}); using rlimits + timeout + a per-run dir",
                  file=sys.stderr)
    return _BWRAP_STATE["ok"]


_VERSIONS = {}


def tool_versions():
    if not _VERSIONS:
        if shutil.which("iverilog") is None or shutil.which("vvp") is None:
            raise RuntimeError("iverilog/vvp not found on PATH (apt-get install iverilog)")
        out = subprocess.run(["iverilog", "-V"], capture_output=True, text=True).stdout
        m = re.search(r"version\s+(\S+)", out)
        _VERSIONS.update({"iverilog": m.group(1) if m else "unknown", "pyslang": pyslang.__version__,
                          "sim_py": SIM_PY_VERSION, "metric_def_version": METRIC_DEF_VERSION})
    return dict(_VERSIONS)


# ---------------------------------------------------------------------------------------------------------
# Run: the one function that owns the subprocess, sandbox, limits, timeouts and output caps

@dataclass
class RunOutput:
    rc: int | None
    compile_rc: int | None
    head: bytes
    tail: bytes
    total_bytes: int
    output_limited: bool
    backstop_killed: bool
    compile_s: float
    sim_s: float
    sandbox: str
    command: str


def _descendants(pid):
    children = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    stat = f.read().decode("utf-8", "replace")
                ppid = int(stat.rsplit(")", 1)[1].split()[1])
                comm = stat[stat.index("(") + 1:stat.rindex(")")]
            except (OSError, ValueError, IndexError):
                continue      # the process ended while we looked: nothing to signal
            children.setdefault(ppid, []).append((int(entry), comm))
    out, todo = [], [pid]
    while todo:
        for child, comm in children.get(todo.pop(), []):
            out.append((child, comm))
            todo.append(child)
    return out


def _signal_tree(pid, sig, only_comm=None):
    for child, comm in _descendants(pid):
        if only_comm is None or comm == only_comm:
            try:
                os.kill(child, sig)
            except ProcessLookupError:
                pass
    if only_comm is None:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def run_job_dir(run_dir, script, cfg):
    """Run script (limits, compile, sim) in run_dir with one bwrap start; drain output with caps; backstop."""
    use_bwrap = cfg.sandbox and bwrap_usable()
    # the script travels in argv, never as a file in the run dir: it holds the per-run secrets (-D values)
    # and the sandbox has no /proc where a testbench could read another process's command line
    argv = (bwrap_argv(run_dir) if use_bwrap else []) + ["sh", "-c", script]
    command = shlex.join(argv)
    t0 = time.time()
    proc = subprocess.Popen(argv, cwd=run_dir, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True,
                            env=None if use_bwrap else {"PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                                                        "HOME": run_dir})
    head, tail = bytearray(), deque()
    tail_len, total, limited, killed = 0, 0, False, False
    deadline = time.monotonic() + cfg.compile_timeout_s + cfg.timeout_s + KILL_AFTER_S + BACKSTOP_EXTRA_S
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    sel.register(proc.stderr, selectors.EVENT_READ)
    open_streams = 2
    while open_streams:
        remaining = deadline - time.monotonic()
        if remaining <= 0 and not killed:
            killed = True
            _signal_tree(proc.pid, signal.SIGKILL)
        for key, _ in sel.select(timeout=max(0.05, min(remaining, 1.0))):
            chunk = os.read(key.fileobj.fileno(), 65536)
            if not chunk:
                sel.unregister(key.fileobj)
                open_streams -= 1
                continue
            total += len(chunk)
            if len(head) < LOG_KEEP_BYTES:
                take = LOG_KEEP_BYTES - len(head)
                head += chunk[:take]
                chunk = chunk[take:]
            if chunk:
                tail.append(chunk)
                tail_len += len(chunk)
                while tail_len - len(tail[0]) >= LOG_KEEP_BYTES:
                    tail_len -= len(tail.popleft())
            if total > cfg.output_cap_bytes and not limited:
                limited = True       # SIGINT to `timeout` inside: it forwards INT to vvp, `final` runs
                _signal_tree(proc.pid, signal.SIGINT, only_comm="timeout")
    sel.close()
    try:
        rc = proc.wait(timeout=max(1.0, deadline - time.monotonic() + 5))
    except subprocess.TimeoutExpired:
        killed = True
        _signal_tree(proc.pid, signal.SIGKILL)
        rc = proc.wait()
    proc.stdout.close()
    proc.stderr.close()
    t_end = time.time()
    compile_rc, t_compiled = None, t_end
    rc_path = os.path.join(run_dir, "compile.rc")
    if os.path.exists(rc_path):
        with open(rc_path) as f:
            txt = f.read().strip()
        compile_rc = int(txt) if txt.lstrip("-").isdigit() else None
        t_compiled = os.path.getmtime(rc_path)
    tail_bytes = b"".join(tail)[-LOG_KEEP_BYTES:]
    return RunOutput(rc=rc, compile_rc=compile_rc, head=bytes(head), tail=tail_bytes, total_bytes=total,
                     output_limited=limited, backstop_killed=killed, compile_s=max(0.0, t_compiled - t0),
                     sim_s=max(0.0, t_end - t_compiled), sandbox="bwrap" if use_bwrap else "none",
                     command=command)


# ---------------------------------------------------------------------------------------------------------
# Parse: probe records -> metrics -> SimResult

def parse_records(text, tag):
    """Probe records of one run: {(sid, path): {"I": bits, "T": [bits...]}}; raises on duplicates (forgery)."""
    recs = {}
    for line in text.splitlines():
        parts = line.split(" ", 4)
        if len(parts) != 5 or parts[0] != tag or parts[1] not in ("I", "T") or not parts[2].isdigit():
            continue
        key = (int(parts[2]), parts[4].strip())
        rec = recs.setdefault(key, {})
        if parts[1] in rec:
            raise ValueError(f"duplicated probe record for {key[1]}")
        rec[parts[1]] = parts[3]
    return recs


def _pct(cov, tot):
    return round(100.0 * cov / tot, 4) if tot else None


def _tally(prepared, recs, paths, uncovered=None, rel=None):
    """Covered/total per metric over the records whose path is in paths (and uncovered items)."""
    counts = {m: [0, 0] for m in METRICS}
    for (sid, path) in sorted(recs, key=lambda k: k[1]):
        if path not in paths or sid >= len(prepared.scopes):
            continue
        sc, rec = prepared.scopes[sid], recs[(sid, path)]
        inst = rel(path) if rel else path
        bits = rec.get("I", "-")
        bits = "" if bits == "-" else bits
        hit = [i < len(bits) and bits[i] == "1" for i in range(len(sc.probes))]
        for it in sc.items:
            counts[it.metric][1] += 1
            if hit[it.probe]:
                counts[it.metric][0] += 1
            elif uncovered is not None:
                u = {"metric": it.metric, "instance": inst, "file": it.file, "line": it.line, "kind": it.kind,
                     "detail": it.detail}
                u.update(it.extra)
                uncovered.append(u)
        tog = rec.get("T", "-")
        vecs = [] if tog == "-" else tog.split(",")
        for name, s in sc.signals.items():
            j = s["index"]
            if 2 * j + 1 >= len(vecs):
                continue
            rise, fall = vecs[2 * j], vecs[2 * j + 1]
            n = len(rise)
            counts["toggle"][1] += n
            missing = {}
            for i in range(n):
                r, f = rise[i] == "1", fall[i] == "1"
                if r and f:
                    counts["toggle"][0] += 1
                else:
                    miss = "both" if not r and not f else ("0->1" if not r else "1->0")
                    missing.setdefault(miss, []).append(n - 1 - i)
            if uncovered is not None:
                for miss, bl in missing.items():
                    uncovered.append({"metric": "toggle", "instance": inst, "file": sc.file, "line": s["line"],
                                      "kind": "toggle", "detail": _toggle_detail(name, sorted(bl), n, miss),
                                      "signal": name, "bits": sorted(bl), "missing": miss, "width": n})
    return counts


def _toggle_detail(name, bits, width, miss):
    sel = "" if width == 1 else ("[*]" if len(bits) == width else f"[{_bit_ranges(bits)}]")
    what = {"both": "never toggled", "0->1": "never rose 0->1", "1->0": "never fell 1->0"}[miss]
    return f"{name}{sel} {what}"


def _bit_ranges(bits):
    out, i = [], 0
    while i < len(bits):
        j = i
        while j + 1 < len(bits) and bits[j + 1] == bits[j] + 1:
            j += 1
        out.append(str(bits[i]) if i == j else f"{bits[i]}-{bits[j]}")
        i = j + 1
    return ",".join(out)


UNCOVERED_ORDER = {"block": 0, "branch": 1, "fsm": 2, "expression": 3, "toggle": 4}


def score_run(res, prepared, recs, job, cfg):
    """Fill metrics, overall, per-instance, targets and uncovered items of res from the probe records."""
    inst = job["inst"]
    top_sids = {sc.sid for sc in prepared.scopes if sc.kind == "module" and sc.module == prepared.top}
    dut_paths = sorted({p for (sid, p) in recs if sid in top_sids}, key=lambda p: (p.count("."), p))
    res.found_dut_paths = dut_paths[:20]
    chosen = [p for p in dut_paths if p.split(".")[-1] == inst]
    if not chosen:
        return False
    root = chosen[0]
    if len(chosen) > 1:
        res.notes.append(f"{len(chosen)} instances named {inst!r}; scored the shallowest: {root}")
    prefix = root[: -len(inst)]
    paths = {p for (_, p) in recs if p == root or p.startswith(root + ".")}

    def rel(p):
        return p[len(prefix):]
    uncovered = []
    counts = _tally(prepared, recs, paths, uncovered, rel)
    res.metrics = {m: {"covered": c, "total": t, "pct": _pct(c, t)} for m, (c, t) in counts.items()}
    use = PROFILES[cfg.profile]
    pcts = [res.metrics[m]["pct"] for m in use if res.metrics[m]["total"]]
    res.overall_pct = round(sum(pcts) / len(pcts), 4) if pcts else None
    cov, tot = sum(counts[m][0] for m in use), sum(counts[m][1] for m in use)
    res.overall_covered_pct = _pct(cov, tot)
    # per module instance (cumulative over everything below it)
    mod_sids = {sc.sid for sc in prepared.scopes if sc.kind == "module"}
    inst_paths = sorted({p for (sid, p) in recs if sid in mod_sids and p in paths}, key=lambda p: (p.count("."), p))
    for p in inst_paths[:200]:
        sub = {q for q in paths if q == p or q.startswith(p + ".")}
        c = counts if p == root else _tally(prepared, recs, sub)
        ent = {m: {"covered": cv, "total": t} for m, (cv, t) in c.items()}
        pp = [_pct(*c[m]) for m in use if c[m][1]]
        ent["overall_pct"] = round(sum(pp) / len(pp), 4) if pp else None
        res.per_instance[rel(p)] = ent
    uncovered.sort(key=lambda u: (UNCOVERED_ORDER[u["metric"]], u["instance"].count("."), u["line"]))
    if len(uncovered) > MAX_UNCOVERED:
        res.notes.append(f"{len(uncovered)} uncovered items; kept the first {MAX_UNCOVERED}")
    res.uncovered = uncovered[:MAX_UNCOVERED]
    return True


def _target_value(res, t, inst):
    metric = str(t["metric"]).lower()
    metric = metric[len("icarus_"):] if metric.startswith("icarus_") else metric
    name = t["inst_name"]
    if name == inst:
        row = res.per_instance.get(inst)
    else:
        row = res.per_instance.get(name) or next(
            (v for k, v in res.per_instance.items() if k.split(".")[-1] == name), None)
    if metric in ("overall_average", "overall", "average"):
        return (row or {}).get("overall_pct"), True
    if metric in METRICS:
        if row is None or not row[metric]["total"]:
            return None, False          # CVDP rule: a missing/null per-metric target is skipped
        return _pct(row[metric]["covered"], row[metric]["total"]), True
    raise ValueError(f"unknown target metric {t['metric']!r} (use overall_average, {', '.join(METRICS)}, "
                     "optionally prefixed icarus_)")


_ERR_RE = re.compile(r"^(?P<file>[^:\s]+):(?P<line>\d+):\s*(?P<msg>.*)$")


def _tool_errors(log, source, tb_name, names):
    errs = []
    for line in log.splitlines():
        m = _ERR_RE.match(line.strip())
        if not m:
            if source == "iverilog" and ("error" in line.lower() or "I give up" in line) and len(errs) < MAX_ERRORS:
                errs.append({"source": source, "file": "", "line": 0, "col": 0, "msg": line.strip()})
            continue
        msg = m.group("msg")
        low = msg.lower()
        if source == "iverilog" and not ("error" in low or (low.startswith("sorry") and "constant selects" not in low)):
            continue            # warnings and their follow-up lines (": Padding 3 high bits ...")
        if source == "vvp" and not ("error" in low or "fatal" in low):
            continue
        f = m.group("file")
        f = "tb.sv" if f == tb_name else f
        errs.append({"source": source, "file": f, "line": int(m.group("line")), "col": 0, "msg": msg})
        if len(errs) >= MAX_ERRORS:
            break
    return errs


def simulate(job, cfg=None):
    """Score one job ({id, rtl_files, top, inst, tb, targets}) -> SimResult. Never raises for bad
    testbenches: every failure is a status; scorer bugs become internal_error with the traceback in notes."""
    cfg = cfg or ScoreConfig()
    _check_job(job)
    if cfg.profile not in PROFILES:
        raise ValueError(f"unknown profile {cfg.profile!r} (use {', '.join(PROFILES)})")
    res = SimResult(id=str(job.get("id", "")))
    t0 = time.perf_counter()
    try:
        res.versions = tool_versions()
        _simulate(job, cfg, res, t0)
    except Exception as e:      # a scorer bug or a broken environment: say so, never hide it
        res.status = INTERNAL_ERROR
        res.passed = False
        res.notes.append(f"internal error: {type(e).__name__}: {e}")
        res.notes.append(_short(traceback.format_exc(), 2000))
    res.timings["total"] = round(time.perf_counter() - t0, 4)
    return res


def _simulate(job, cfg, res, t0):
    try:
        prepared = prepare_dut(job["rtl_files"], job["top"], cfg)
    except PrepareError as e:
        res.status = COMPILE_ERROR
        res.errors = e.errors[:MAX_ERRORS] or [{"source": "pyslang", "file": "", "line": 0, "col": 0, "msg": str(e)}]
        res.notes.append(f"DUT could not be instrumented: {e}")
        return
    res.timings["prepare"] = round(time.perf_counter() - t0, 4)
    res.notes.extend(prepared.notes)
    t1 = time.perf_counter()
    forbidden, hints, diags = check_testbench(job["tb"], prepared, job["inst"])
    res.timings["check"] = round(time.perf_counter() - t1, 4)
    if forbidden:
        res.status = REJECTED
        res.errors = forbidden[:MAX_ERRORS]
        return
    run_dir = tempfile.mkdtemp(prefix="chorus_sim_")
    res.run_dir = run_dir
    try:
        names = [f["name"] for f in prepared.files]
        for f in prepared.files:
            with open(os.path.join(run_dir, f["name"]), "w", encoding="utf-8") as out:
                out.write(f["content"])
        tb_name = "tb.sv" if "tb.sv" not in names else "tb_0.sv"
        with open(os.path.join(run_dir, tb_name), "w", encoding="utf-8") as out:
            out.write(job["tb"])
        tag, out_file = secrets.token_hex(8), f".cov_{secrets.token_hex(8)}.txt"
        script = build_script(names, run_defines(prepared.nonce, out_file, tag), tb_name,
                              f"s{secrets.token_hex(6)}.vvp", cfg)
        run = run_job_dir(run_dir, script, cfg)
        res.command = run.command
        res.versions["sandbox"] = run.sandbox
        if run.sandbox == "none" and cfg.sandbox:
            res.notes.append(f"sandbox: {_BWRAP_STATE.get('why', 'bubblewrap unusable')}; ran with rlimits + timeout only")
        res.timings["compile"] = round(run.compile_s, 4)
        res.timings["sim"] = round(run.sim_s, 4)
        log = (run.head + (b"\n...[" + str(run.total_bytes - len(run.head) - len(run.tail)).encode()
                           + b" bytes cut]...\n" if run.total_bytes > len(run.head) + len(run.tail) else b"")
               + run.tail).decode("utf-8", "replace")
        res.log_head = run.head.decode("utf-8", "replace")
        res.log_tail = run.tail.decode("utf-8", "replace")
        t2 = time.perf_counter()
        if run.compile_rc is None:
            res.status = INTERNAL_ERROR if not run.backstop_killed else TIMEOUT
            res.errors = [{"source": "sandbox", "file": "", "line": 0, "col": 0,
                           "msg": f"the run script did not record a compile status (rc={run.rc})"}]
            res.notes.append("see log_head for the sandbox's message")
            return
        if run.compile_rc != 0:
            errs = _tool_errors(log, "iverilog", tb_name, names)
            if any("__cv" in e["msg"] for e in errs):
                res.status = INTERNAL_ERROR
                res.notes.append("the instrumented DUT failed to compile (scorer bug); run `sim.py prepare` on it")
            else:
                res.status = COMPILE_ERROR
            if not errs:       # no file:line message (e.g. the compiler crashed): show the log's end
                errs = [{"source": "iverilog", "file": "", "line": 0, "col": 0,
                         "msg": _short(log.strip()[-300:], 300) or f"iverilog exited with {run.compile_rc}"}]
            if run.compile_rc in (124, 137, -9):
                errs.insert(0, {"source": "iverilog", "file": "", "line": 0, "col": 0,
                                "msg": f"compile killed after {cfg.compile_timeout_s:g}s or by a limit"})
            res.errors = (hints + diags + errs)[:MAX_ERRORS]
            return
        res.compile_ok = True
        for h in hints:
            res.notes.append(f"tb.sv:{h['line']}: {h['msg']} (it compiled anyway)")
        res.exit_code = run.rc
        # 124: `timeout` sent SIGINT; 137 after >= timeout_s: it had to follow up with SIGKILL (-k)
        res.timed_out = run.rc == 124 or run.backstop_killed or (run.rc == 137 and run.sim_s >= cfg.timeout_s)
        res.sim_finished = not res.timed_out and not run.output_limited and run.rc == 0
        cov_path = os.path.join(run_dir, out_file)
        text = ""
        if os.path.exists(cov_path):
            with open(cov_path, encoding="utf-8", errors="replace") as f:
                text = f.read(FSIZE_LIMIT)
        try:
            recs = parse_records(text, tag)
        except ValueError as e:
            res.status = REJECTED
            res.errors = [{"source": "scorer", "file": "", "line": 0, "col": 0,
                           "msg": f"forged or duplicated coverage records ({e})"}]
            return
        found = score_run(res, prepared, recs, job, cfg) if recs else False
        if run.output_limited:
            res.status = OUTPUT_LIMIT
            res.errors = [{"source": "vvp", "file": "", "line": 0, "col": 0,
                           "msg": f"the simulation printed more than {cfg.output_cap_bytes} bytes; stopped"}]
        elif res.timed_out:
            res.status = TIMEOUT
            res.errors = [{"source": "vvp", "file": "", "line": 0, "col": 0,
                           "msg": f"simulation did not finish within {cfg.timeout_s:g}s (missing $finish?)"}]
        elif run.rc != 0:
            res.status = RUNTIME_ERROR
            why = {-9: "killed (CPU or memory limit)", 137: "killed (CPU or memory limit)",
                   134: "aborted (out of memory?)", -6: "aborted (out of memory?)"}.get(run.rc, f"exit code {run.rc}")
            res.errors = (_tool_errors(log, "vvp", tb_name, names) +
                          [{"source": "vvp", "file": "", "line": 0, "col": 0, "msg": f"vvp {why}"}])[:MAX_ERRORS]
        elif not recs:
            res.status = NO_COVERAGE
            res.errors = [{"source": "scorer", "file": "", "line": 0, "col": 0,
                           "msg": "the simulation wrote no coverage records (did it elaborate the DUT?)"}]
        elif not found:
            res.status = NO_DUT_INSTANCE
            inst_paths = [p for p in res.found_dut_paths if "." in p]
            msg = (f"no instance named {job['inst']!r} of module {prepared.top!r} (found it at: "
                   f"{', '.join(inst_paths[:5])})" if inst_paths else
                   f"the testbench does not instantiate module {prepared.top!r} (expected instance {job['inst']!r})")
            res.errors = [{"source": "scorer", "file": "", "line": 0, "col": 0, "msg": msg}]
        elif res.overall_pct is None:
            res.status = NO_COVERAGE
            res.errors = [{"source": "scorer", "file": "", "line": 0, "col": 0,
                           "msg": "the DUT instance has no coverage items"}]
        else:
            res.status = OK
        if found:
            for t in job.get("targets") or []:
                actual, applies = _target_value(res, t, job["inst"])
                met = (actual is not None and actual >= float(t["target_percentage"])) if applies else True
                res.targets.append({**t, "actual": actual, "met": met, "applies": applies})
        res.passed = res.status == OK and all(t["met"] for t in res.targets)
        res.timings["score"] = round(time.perf_counter() - t2, 4)
    finally:
        if not cfg.keep_run_dir:
            shutil.rmtree(run_dir, ignore_errors=True)
            res.run_dir = run_dir + " (removed; ScoreConfig(keep_run_dir=True) keeps it)"


def reward(result):
    """RL reward: 1 + overall/100 when the run is ok and has coverage, else 0 (method.md: R in {0} U [1,2])."""
    if result.status == OK and result.overall_pct is not None:
        return 1.0 + result.overall_pct / 100.0
    return 0.0


# ---------------------------------------------------------------------------------------------------------
# Many runs: long-lived worker processes (pyslang import ~0.4 s; prepared DUTs cached per worker)

class SimPool:
    """Long-lived worker processes that score jobs: submit(job) -> Future[SimResult], so simulation overlaps
    generation. Each worker is `python sim.py worker` (JSON lines over pipes): no fork of the caller (safe
    next to CUDA and threads) and no `if __name__ == "__main__"` needed in the caller. Workers keep their
    prepared-DUT cache; a worker that dies is restarted and its job gets an internal_error result."""

    def __init__(self, workers=None, cfg=None):
        self.cfg = cfg or ScoreConfig()
        self.workers = max(1, workers or os.cpu_count() or 1)
        self._jobs = queue.Queue()
        self._threads = [threading.Thread(target=self._serve, daemon=True) for _ in range(self.workers)]
        for t in self._threads:
            t.start()

    def _start_worker(self):
        return subprocess.Popen([sys.executable, os.path.abspath(__file__), "worker",
                                 "--cfg", json.dumps(dataclasses.asdict(self.cfg))],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)

    def _serve(self):
        proc = self._start_worker()
        while True:
            item = self._jobs.get()
            if item is None:
                break
            job, fut = item
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                proc.stdin.write(json.dumps(job) + "\n")
                proc.stdin.flush()
                line = proc.stdout.readline()
            except (BrokenPipeError, OSError):
                line = ""
            if not line:           # the worker died: report it on this job, start a fresh worker
                rc = proc.poll()
                proc.kill()
                proc.wait()
                proc = self._start_worker()
                res = SimResult(id=str(job.get("id", "")), status=INTERNAL_ERROR)
                res.notes.append(f"sim worker process died (rc={rc}); restarted")
                fut.set_result(res)
                continue
            out = json.loads(line)
            if "error" in out:
                fut.set_exception(ValueError(out["error"]))
            else:
                fut.set_result(SimResult.from_dict(out))
        proc.stdin.close()
        proc.wait()

    def submit(self, job):
        _check_job(job)
        fut = concurrent.futures.Future()
        self._jobs.put((job, fut))
        return fut

    def map(self, jobs):
        futures = [self.submit(j) for j in jobs]
        return [f.result() for f in futures]

    def close(self):
        for _ in self._threads:
            self._jobs.put(None)
        for t in self._threads:
            t.join()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _worker_main(cfg_json):
    """`python sim.py worker`: read one job (JSON) per stdin line, write one result (JSON) per stdout line."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)      # the parent decides about Ctrl-C
    cfg = ScoreConfig(**json.loads(cfg_json))
    for line in sys.stdin:
        try:
            out = simulate(json.loads(line), cfg).to_dict()
        except ValueError as e:                       # a malformed job: the caller gets the exception
            out = {"error": str(e)}
        sys.stdout.write(json.dumps(out) + "\n")
        sys.stdout.flush()
    return 0


def simulate_many(jobs, workers=None, cfg=None, verbose=True):
    """Score jobs with `workers` long-lived processes (1 = in this process); results in input order.
    Ends with one summary line on stderr: runs, runs/s and counts per status."""
    t0 = time.perf_counter()
    workers = max(1, workers or os.cpu_count() or 1)
    if workers == 1 or len(jobs) <= 1:
        results = [simulate(j, cfg) for j in jobs]
    else:
        with SimPool(workers, cfg) as pool:
            results = pool.map(jobs)
    dt = time.perf_counter() - t0
    if verbose:
        counts = {}
        for r in results:
            counts[r.status] = counts.get(r.status, 0) + 1
        print(f"sim: {len(results)} runs in {dt:.1f}s ({len(results) / max(dt, 1e-9):.1f} runs/s, {workers} workers): "
              + " ".join(f"{k}={v}" for k, v in sorted(counts.items())), file=sys.stderr)
    return results


# ---------------------------------------------------------------------------------------------------------
# Feedback for the model

def format_feedback(result, max_chars=1500):
    """Compact text for the model: errors on failure, else the coverage summary + most useful uncovered items."""
    r = result
    lines = []
    if r.status in (REJECTED, COMPILE_ERROR, INTERNAL_ERROR) or (r.status != OK and not r.metrics):
        head = {REJECTED: "Testbench rejected by the scorer", COMPILE_ERROR: "Compilation failed",
                INTERNAL_ERROR: "Scorer internal error"}.get(r.status, f"Simulation status: {r.status}")
        lines.append(head + ":")
        for e in r.errors:
            where = f"{e['file']}:{e['line']}: " if e.get("file") and e.get("line") else ""
            lines.append(f"- {where}{e['msg']}")
        if not r.errors and r.log_tail:
            lines.append(_short(r.log_tail, 400))
        if r.status == INTERNAL_ERROR:
            lines.extend(n for n in r.notes[:1])
        return _clip("\n".join(lines), max_chars)
    if r.status != OK:
        lines.append(f"Simulation status: {r.status}. " + " ".join(e["msg"] for e in r.errors[:2]))
        log = (r.log_head + r.log_tail).strip()
        if r.status == RUNTIME_ERROR and log:
            lines.append("Log tail: " + _short(log[-300:], 300))
    if r.status == NO_DUT_INSTANCE:
        return _clip("\n".join(lines), max_chars)
    m = r.metrics
    inst = next(iter(r.per_instance), "uut")
    parts = [f"{k} {m[k]['covered']}/{m[k]['total']}" for k in ("block", "branch", "expression", "toggle", "fsm")
             if m.get(k, {}).get("total")]
    ov = "n/a" if r.overall_pct is None else f"{r.overall_pct:.1f}%"
    lines.append(f"Coverage of {inst}: overall {ov} | " + " | ".join(parts))
    for t in r.targets:
        if t.get("applies", True):
            act = "n/a" if t["actual"] is None else f"{t['actual']:.1f}%"
            lines.append(f"Target {t['metric']} of {t['inst_name']} >= {t['target_percentage']:g}%: "
                         f"{act} ({'met' if t['met'] else 'NOT met'})")
    seen_probe = set()
    for u in r.uncovered:
        if u["metric"] == "branch" and (u["instance"], u["file"], u["line"], u["detail"]) in seen_probe:
            continue      # the branch item of an uncovered block: one line is enough
        seen_probe.add((u["instance"], u["file"], u["line"], u["detail"]))
        if u["metric"] == "toggle":
            lines.append(f"- [toggle] {u['instance']}.{u['detail']}")
        else:
            lines.append(f"- [{u['metric']}] {u['instance']} ({u['file']}:{u['line']}) {u['detail']}")
    return _clip("\n".join(lines), max_chars)


def _clip(text, n):
    if len(text) <= n:
        return text
    cut = text.rfind("\n", 0, n - 20)
    return text[: cut if cut > 0 else n - 20] + "\n- ... (more omitted)"


# ---------------------------------------------------------------------------------------------------------
# CLI

def _read(path):
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError as e:
        raise SystemExit(f"sim.py: cannot read {path}: {e.strerror}")


def main(argv=None):
    ap = argparse.ArgumentParser(description="Coverage scorer for SystemVerilog stimulus testbenches (Icarus).")
    sub = ap.add_subparsers(dest="cmd", required=True)
    sc = sub.add_parser("score", help="score a testbench against a DUT")
    sc.add_argument("--rtl", nargs="+", help="DUT source files")
    sc.add_argument("--top", help="DUT top module name")
    sc.add_argument("--inst", default="uut", help="DUT instance name in the testbench (default uut)")
    sc.add_argument("--tasks", help="CVDP-ECov task JSONL (instead of --rtl/--top/--inst)")
    sc.add_argument("--id", help="task id inside --tasks")
    sc.add_argument("--target-mode", default="cvdp", choices=["cvdp", "icarus"], help="which task targets to use")
    sc.add_argument("--tb", required=True, help="testbench file")
    sc.add_argument("--target", type=float, default=None, help="overall_average target %% for --inst (default: none)")
    sc.add_argument("--json", action="store_true", help="print exactly one JSON object (the result record)")
    sc.add_argument("--profile", default="imc", choices=sorted(PROFILES), help="overall metric set")
    sc.add_argument("--timeout", type=float, default=ScoreConfig.timeout_s, help="simulation timeout, seconds")
    sc.add_argument("--no-sandbox", action="store_true", help="skip bubblewrap (rlimits + timeout still apply)")
    sc.add_argument("--keep", action="store_true", help="keep the per-run directory")
    pr = sub.add_parser("prepare", help="instrument + compile the DUT alone (exit 0 when it works)")
    pr.add_argument("--rtl", nargs="+", required=True, help="DUT source files")
    pr.add_argument("--top", required=True, help="DUT top module name")
    pr.add_argument("--show", action="store_true", help="print the instrumented source")
    wk = sub.add_parser("worker", help="internal: SimPool worker (JSON lines on stdin/stdout)")
    wk.add_argument("--cfg", default="{}", help="ScoreConfig fields as JSON")
    args = ap.parse_args(argv)

    if args.cmd == "worker":
        return _worker_main(args.cfg)
    if shutil.which("iverilog") is None or shutil.which("vvp") is None:
        raise SystemExit("sim.py: iverilog/vvp not found on PATH (apt-get install iverilog, or make sysdeps)")

    if args.cmd == "prepare":
        files = [{"name": os.path.basename(p), "content": _read(p)} for p in args.rtl]
        ok, msg = prepare_check(files, args.top)
        if args.show and ok:
            for f in prepare_dut(files, args.top).files:
                print(f"// ---- {f['name']} (instrumented)\n{f['content']}")
        print(msg)
        return 0 if ok else 1

    if args.tasks:
        if not args.id:
            raise SystemExit("sim.py: --tasks needs --id")
        try:
            tasks = load_tasks(args.tasks)
        except (OSError, ValueError) as e:
            raise SystemExit(f"sim.py: {e}")
        task = next((t for t in tasks if t["id"] == args.id), None)
        if task is None:
            raise SystemExit(f"sim.py: task id {args.id!r} not found in {args.tasks}")
        job = job_from_task(task, _read(args.tb), args.target_mode)
    else:
        if not args.rtl or not args.top:
            raise SystemExit("sim.py: score needs --rtl and --top (or --tasks and --id)")
        job = {"id": os.path.basename(args.tb), "top": args.top, "inst": args.inst, "tb": _read(args.tb),
               "rtl_files": [{"name": os.path.basename(p), "content": _read(p)} for p in args.rtl], "targets": []}
    if args.target is not None:
        job["targets"] = [{"inst_name": job["inst"], "metric": "overall_average", "target_percentage": args.target}]
    cfg = ScoreConfig(profile=args.profile, timeout_s=args.timeout, sandbox=not args.no_sandbox,
                      keep_run_dir=args.keep)
    try:
        res = simulate(job, cfg)
    except ValueError as e:
        raise SystemExit(f"sim.py: {e}")
    if args.json:
        print(json.dumps(res.to_dict()))
    else:
        print(format_feedback(res, max_chars=4000))
        print(f"status={res.status} passed={res.passed} reward={reward(res):.4f} "
              f"time={res.timings.get('total', 0):.2f}s sandbox={res.versions.get('sandbox', '?')}")
    return 0


def prepare_check(rtl_files, top, cfg=None):
    """Instrument the DUT and compile it alone (sandboxed); returns (ok, one-line message)."""
    cfg = cfg or ScoreConfig()
    try:
        prepared = prepare_dut(rtl_files, top, cfg)
    except PrepareError as e:
        return False, f"prepare failed: {e}"
    run_dir = tempfile.mkdtemp(prefix="chorus_sim_prep_")
    try:
        names = [f["name"] for f in prepared.files]
        for f in prepared.files:
            with open(os.path.join(run_dir, f["name"]), "w", encoding="utf-8") as out:
                out.write(f["content"])
        script = (f"iverilog -g2012 -s {shlex.quote(top)} -o prep.vvp "
                  + " ".join(shlex.quote(d) for d in run_defines(prepared.nonce, ".cov.txt", "x")) + " "
                  + " ".join(shlex.quote(n) for n in names) + " 1>&2\necho $? > compile.rc\n")
        run = run_job_dir(run_dir, script, cfg)
        log = (run.head + run.tail).decode("utf-8", "replace")
        if run.compile_rc != 0:
            errs = _tool_errors(log, "iverilog", "tb.sv", names)
            first = errs[0] if errs else {"file": "", "line": 0, "msg": _short(log, 200) or f"rc={run.compile_rc}"}
            where = f"{first['file']}:{first['line']}: " if first.get("line") else ""
            return False, f"compile failed: {where}{first['msg']}"
        items = sum(len(s.items) for s in prepared.scopes)
        sigs = sum(len(s.signals) for s in prepared.scopes)
        return True, (f"ok: {len(prepared.modules)} module(s), {len(prepared.scopes)} scope(s), {items} items, "
                      f"{sigs} toggle signals; instrument {prepared.prepare_s * 1000:.0f} ms, "
                      f"compile {run.compile_s * 1000:.0f} ms")
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
