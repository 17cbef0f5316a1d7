"""tbcheck.py: the scorer's testbench pre-scan (used by sim.py before it compiles a candidate testbench).
Parses the testbench with pyslang as Icarus preprocesses it and rejects what would let it tamper with its
score: `include, $system, macro token pasting, probe-prefix (__cv) names, bind, a redefined DUT module, and
every write into the DUT instance's hierarchy (assignments, output arguments, $readmem*, port connections,
...), since a testbench drives the DUT only through its ports. It also names constructs Icarus 11 cannot
run (hints shown if the compile then fails). Results are cached per process on the hash of the testbench,
the prepared DUT and the instance name.

Public names: check_testbench (sim.py re-exports it, with MAX_TB_BYTES and PRESCAN_CACHE_SIZE). The tree
readers the pre-scan and harness.check_stimulus share: parse_sv, sv_line, walk, walk_tokens,
skipped_tokens, name_parts, declared_ports, dut_writes, write_message.
"""
import hashlib
import os
import re

import pyslang
from pyslang import syntax as S

from instrument import MAX_ERRORS, _INCLUDE_RE, _diag, _kind, _nodes, _short, _text

MAX_TB_BYTES = 1 << 20          # a testbench larger than this is rejected
PRESCAN_CACHE_SIZE = 512        # pre-scan results kept per process (keyed by testbench + DUT + inst)


# ---------------------------------------------------------------------------------------------------------
# Reading a testbench like the compiler: one parse (macros expanded, escaped identifiers resolved, the
# macros iverilog -g2012 predefines defined), then decisions on the tree. Shared by the pre-scan below and
# by harness.check_stimulus. Everything here is linear in the text: one parse, one iterative walk.

ICARUS_PREDEFINES = ("__ICARUS__=1",)     # what `iverilog -g2012 -E` defines: `ifdef branches must match


def parse_sv(text, name="tb.sv"):
    """(tree, source manager) of one SystemVerilog text, preprocessed as Icarus preprocesses it."""
    sm = pyslang.SourceManager()
    po = pyslang.parsing.PreprocessorOptions()
    po.predefines = list(ICARUS_PREDEFINES)
    po.maxIncludeDepth = 0
    tree = S.SyntaxTree.fromBuffers([sm.assignText(name, text)], sm, pyslang.Bag([po]))
    return tree, sm


def sv_line(sm, tok):
    """1-based line of a token in its file (a macro-expanded token: where the macro was used)."""
    try:
        return sm.getLineNumber(sm.getFullyOriginalLoc(tok.location))
    except Exception:          # a token without a usable location (made up by error recovery)
        return 0


def walk(root):
    """Every syntax node under root (root included), depth first, without recursion (a testbench may nest
    expressions deeper than Python's stack)."""
    stack = [root]
    while stack:
        n = stack.pop()
        yield n
        stack.extend(c for c in reversed(list(n)) if isinstance(c, S.SyntaxNode))


def walk_tokens(root):
    """Every token under root in source order, missing ones (error recovery) left out."""
    stack = [root]
    while stack:
        n = stack.pop()
        if isinstance(n, S.SyntaxNode):
            stack.extend(reversed(list(n)))
        elif n is not None and not n.isMissing:
            yield n


def skipped_tokens(tok):
    """Tokens the parser skipped (error recovery) that sit in a token's trivia."""
    out = []
    for tr in tok.trivia:
        k = tr.kind.name
        if k == "SkippedTokens":
            out.extend(tr.getSkippedTokens())
        elif k == "SkippedSyntax" and tr.syntax() is not None:
            out.extend(walk_tokens(tr.syntax()))
    return out


_NAME_CLASSES = {"IdentifierNameSyntax", "IdentifierSelectNameSyntax", "ScopedNameSyntax", "KeywordNameSyntax",
                  "SystemNameSyntax", "ClassNameSyntax"}


def _is_name(n):
    return type(n).__name__ in _NAME_CLASSES


def name_parts(node):
    """The components of a (hierarchical) name node: `tb.uut[0].q` -> ["tb", "uut", "q"]; None when node is
    not a name."""
    parts, stack = [], [node]
    while stack:
        n = stack.pop()
        k = type(n).__name__
        if k == "ScopedNameSyntax":
            stack += [n.right, n.left]
        elif k in ("IdentifierNameSyntax", "IdentifierSelectNameSyntax", "ClassNameSyntax"):
            parts.append(n.identifier.valueText)
        elif k == "KeywordNameSyntax":
            parts.append(n.keyword.valueText)
        elif k == "SystemNameSyntax":
            parts.append(n.systemIdentifier.valueText)
        else:
            return None
    return parts


def under_instance(parts, inst):
    """A name that reaches inside instance `inst` (`uut.q`, `tb.uut.g[0].x`, `$root.tb.uut.q`)."""
    return bool(inst) and parts is not None and inst in parts[:-1]


_WRAPPERS = {"SimplePropertyExpr": "expr", "SimpleSequenceExpr": "expr", "ParenthesizedExpression": "expression",
             "OrderedArgument": "expr", "NamedArgument": "expr", "OrderedPortConnection": "expr",
             "NamedPortConnection": "expr"}


def _unwrap(n):
    while n is not None and isinstance(n, S.SyntaxNode) and _kind(n) in _WRAPPERS:
        n = getattr(n, _WRAPPERS[_kind(n)])
    return n


def lvalue_names(node, sure=True):
    """The name nodes an lvalue expression writes: `{a, m[i].f}` -> a, m[i].f (never the names inside an
    index: `m[uut.i] = 0` reads uut.i). sure: the position is certainly written (an assignment's left
    side): a shape that is not a name/select/concatenation yields every name in it (caution); otherwise (an
    argument whose direction is unknown) only name/select/concatenation shapes count."""
    out, stack = [], [_unwrap(node)]
    while stack:
        n = _unwrap(stack.pop())
        if n is None or not isinstance(n, S.SyntaxNode):
            continue
        k = _kind(n)
        if _is_name(n):
            out.append(n)
        elif k in ("ElementSelectExpression", "MemberAccessExpression"):
            stack.append(n.left)
        elif k in ("ConcatenationExpression", "StreamingConcatenationExpression", "StreamExpression",
                   "SimpleAssignmentPattern", "AssignmentPatternExpression", "ExpressionOrDist"):
            stack.extend(c for c in n if isinstance(c, S.SyntaxNode))
        elif k.endswith("AssignmentPattern") or k == "SeparatedList":
            stack.extend(c for c in n if isinstance(c, S.SyntaxNode))
        elif sure:
            out.extend(m for m in walk(n) if _is_name(m) and _kind(m.parent) != "ScopedName")
    return out


# System subroutines that only read their arguments (anything not here and not in SYSTEM_OUTPUTS is
# treated as possibly writing every argument that is a plain name).
SYSTEM_READS = set("""$display $displayb $displayh $displayo $write $writeb $writeh $writeo $strobe $strobeb
$strobeh $strobeo $monitor $monitorb $monitorh $monitoro $monitoron $monitoroff $fdisplay $fdisplayb
$fdisplayh $fdisplayo $fwrite $fwriteb $fwriteh $fwriteo $fstrobe $fstrobeb $fstrobeh $fstrobeo $fmonitor
$fmonitorb $fmonitorh $fmonitoro $sformatf $psprintf $info $warning $error $fatal $finish $stop $exit
$time $stime $realtime $signed $unsigned $bits $size $left $right $low $high $increment $dimensions
$unpacked_dimensions $clog2 $countones $countbits $onehot $onehot0 $isunknown $typename $rtoi $itor $realtobits
$bitstoreal $shortrealtobits $bitstoshortreal $ln $log10 $exp $sqrt $pow $floor $ceil $sin $cos $tan $asin $acos
$atan $atan2 $hypot $sinh $cosh $tanh $asinh $acosh $atanh $urandom $urandom_range $fopen $fclose $fflush $feof
$fgetc $ftell $fseek $rewind $test$plusargs $dumpfile $dumpvars $dumpon $dumpoff $dumpall $dumplimit
$dumpflush $printtimescale $timeformat $past $rose $fell $stable $changed $sampled $cast_ok $isunbounded""".split())
# System subroutines with output arguments: the argument positions they write ("n+": n and every later one).
SYSTEM_OUTPUTS = {"$sscanf": "2+", "$fscanf": "2+", "$sformat": "0", "$swrite": "0", "$swriteb": "0",
                  "$swriteh": "0", "$swriteo": "0", "$readmemh": "1", "$readmemb": "1", "$fread": "0",
                  "$fgets": "0", "$value$plusargs": "1", "$cast": "0", "$random": "0", "$dist_uniform": "0",
                  "$dist_normal": "0", "$dist_exponential": "0", "$dist_poisson": "0", "$dist_chi_square": "0",
                  "$dist_t": "0", "$dist_erlang": "0", "$deposit": "0", "$ungetc": "", "$writememh": "",
                  "$writememb": "", "$q_initialize": "3", "$q_add": "", "$q_remove": "1+", "$q_exam": "2+",
                  "$q_full": "1", "$ferror": "1"}
# Built-in methods of queues, arrays and strings whose arguments are inputs (`exp_q.push_back(uut.q)` reads
# uut.q); first/last/next/prev write theirs, so they are not here.
INPUT_METHODS = {"push_back", "push_front", "insert", "exists", "delete", "size", "num", "len", "getc",
                 "substr", "compare", "icompare", "atoi", "atohex", "atobin", "atooct", "atoreal", "toupper",
                 "tolower", "find", "find_index", "find_first", "find_first_index", "find_last",
                 "find_last_index", "sum", "product", "min", "max", "unique", "unique_index", "and", "or", "xor"}


def _writes_position(rule, i):
    if not rule:
        return False
    return i >= int(rule[:-1]) if rule.endswith("+") else i == int(rule)


def _dir_of(tok, previous):
    """A port direction from its keyword token, inheriting the previous one when absent."""
    if tok is None or tok.isMissing or not tok.valueText:
        return previous
    return {"input": "input", "output": "output", "inout": "inout", "ref": "ref"}.get(tok.valueText, previous)


def declared_ports(root, nodes=None):
    """({subroutine name: [(port, direction)]}, {module name: [(port, direction)]}) of the tasks,
    functions and modules declared in a tree (ANSI and non-ANSI port styles). nodes: list(walk(root)),
    when the caller has it already."""
    subs, mods = {}, {}
    for n in (nodes if nodes is not None else walk(root)):
        k = _kind(n)
        if k in ("TaskDeclaration", "FunctionDeclaration"):
            proto, ports, d = n.prototype, [], "input"
            names = name_parts(proto.name) or [""]
            if proto.portList is not None:
                for p in _nodes(proto.portList.ports):
                    d = _dir_of(p.direction, d)
                    ports.append((p.declarator.name.valueText, d))
            for it in _nodes(n.items):
                if _kind(it) == "PortDeclaration":
                    d = _dir_of(getattr(it.header, "direction", None), "input")
                    ports += [(dc.name.valueText, d) for dc in _nodes(it.declarators)]
            subs[names[-1]] = ports
        elif k in ("ModuleDeclaration", "InterfaceDeclaration", "ProgramDeclaration"):
            ports, d, pl = [], "inout", n.header.ports
            if pl is not None and _kind(pl) == "AnsiPortList":
                for p in _nodes(pl.ports):
                    if _kind(p) == "ImplicitAnsiPort":
                        d = _dir_of(getattr(p.header, "direction", None), d)
                        ports.append((p.declarator.name.valueText, d))
                    else:
                        ports.append(("", "inout"))
            elif pl is not None:
                decl = {}
                for it in _nodes(n.members):
                    if _kind(it) == "PortDeclaration":
                        dd = _dir_of(getattr(it.header, "direction", None), "inout")
                        decl.update({dc.name.valueText: dd for dc in _nodes(it.declarators)})
                for p in _nodes(pl.ports):
                    ref = [t.valueText for t in walk_tokens(p) if t.kind.name == "Identifier"]
                    ports.append((ref[0] if ref else "", decl.get(ref[-1] if ref else "", "inout")))
            mods[n.header.name.valueText] = ports
    return subs, mods


def _arguments(arglist):
    """[(position, formal name or None, expression)] of an argument or port-connection list."""
    out, pos = [], 0
    for a in _nodes(arglist):
        k = _kind(a)
        if k in ("NamedArgument", "NamedPortConnection"):
            out.append((None, a.name.valueText, a.expr))
        elif k in ("OrderedArgument", "OrderedPortConnection"):
            out.append((pos, None, a.expr))
            pos += 1
        elif k == "EmptyArgument":
            pos += 1
    return out


def _formal_writes(ports, pos, name):
    """Whether the formal at (pos or name) of a declared port list may write its actual: True (output,
    inout, ref), False (input) or None (no such formal)."""
    if name is not None:
        hit = [d for p, d in ports if p == name]
    else:
        hit = [ports[pos][1]] if pos is not None and pos < len(ports) else []
    return None if not hit else hit[0] != "input"


def write_message(node, what):
    """The one-line reason for a dut_writes finding."""
    return (f"writing into the DUT hierarchy ({_short(_text(node), 40)}: {what}) is not allowed: "
            "drive the DUT through its ports")


def dut_writes(root, inst, subs=None, mods=None, nodes=None):
    """Every place in a tree that may write into instance `inst` (or anything under it), as
    [(name or call node, what)]: assignments of every kind (=, op=, <=, ++/--, procedural assign/force,
    release/deassign), output/inout/ref arguments of declared tasks and functions (and every plain-name
    argument of an undeclared one), the output arguments of system tasks ($sscanf, $readmemh, $fgets, ...;
    every plain-name argument of an unknown one), calls of subroutines or methods inside the instance,
    event triggers, net aliases, and output/inout port connections of other instances (every plain-name
    connection when the module's ports are unknown). subs/mods: declared_ports(); when None, the tree's own.
    nodes: list(walk(root)), when the caller has it already."""
    if not inst:
        return []
    if subs is None or mods is None:
        own_subs, own_mods = declared_ports(root, nodes)
        subs = own_subs if subs is None else {**own_subs, **subs}
        mods = own_mods if mods is None else {**own_mods, **mods}
    found = []

    def check(expr, what, sure=True):
        for nm in lvalue_names(expr, sure):
            if under_instance(name_parts(nm), inst):
                found.append((nm, what))

    for n in (nodes if nodes is not None else walk(root)):
        k = _kind(n)
        if k.endswith("AssignmentExpression") and k != "AssignmentPatternExpression":
            check(n.left, "assignment")
        elif k in ("PostincrementExpression", "PostdecrementExpression", "UnaryPreincrementExpression",
                   "UnaryPredecrementExpression"):
            check(n.operand, "++/--")
        elif k in ("ProceduralReleaseStatement", "ProceduralDeassignStatement"):
            check(n.variable, "release/deassign")
        elif k in ("BlockingEventTriggerStatement", "NonblockingEventTriggerStatement"):
            check(n.name, "event trigger")
        elif k == "NetAlias":
            for c in _nodes(n.nets):
                check(c, "alias")
        elif k in ("InvocationExpression", "ArrayOrRandomizeMethodExpression"):
            callee = n.left if k == "InvocationExpression" else n.method
            parts = name_parts(callee) if callee is not None else None
            args = _arguments(n.arguments.parameters) if getattr(n, "arguments", None) is not None else []
            if parts and parts[0].startswith("$"):
                if parts[0] in SYSTEM_READS:
                    continue
                rule = SYSTEM_OUTPUTS.get(parts[0])
                for pos, _, e in args:
                    if rule is None:
                        check(e, f"argument of {parts[0]}", sure=False)
                    elif pos is not None and _writes_position(rule, pos):
                        check(e, f"{parts[0]} output")
                continue
            if under_instance(parts, inst):
                found.append((callee, "a call of a subroutine inside the DUT"))
                continue
            ports = subs.get(parts[-1]) if parts else None
            if ports is None and parts and len(parts) > 1 and parts[-1] in INPUT_METHODS:
                ports = [("", "input")] * len(args)
            for pos, name, e in args:
                writes = _formal_writes(ports, pos, name) if ports is not None else None
                if writes:
                    check(e, f"output argument of {parts[-1]}")
                elif writes is None:
                    check(e, f"argument of {'.'.join(parts or ['?'])}, whose direction is unknown", sure=False)
        elif k in ("HierarchyInstantiation", "CheckerInstantiation"):
            tname = n.type.valueText if k == "HierarchyInstantiation" else (name_parts(n.type) or ["?"])[-1]
            ports = mods.get(tname)
            for hi in _nodes(n.instances):
                for pos, name, e in _arguments(hi.connections):
                    writes = _formal_writes(ports, pos, name) if ports is not None else None
                    if writes:
                        check(e, f"output port of {tname}")
                    elif writes is None:
                        check(e, f"port of {tname}, whose direction is unknown", sure=False)
    return found

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
    tree, sm = parse_sv(tb, "tb.sv")
    engine = pyslang.DiagnosticEngine(sm)
    diags = [_diag(engine, sm, d) for d in tree.diagnostics if d.isError()][:MAX_ERRORS]

    def line_of(tok):
        return sv_line(sm, tok)

    toks = list(walk_tokens(tree.root))
    skipped = [t for tok in toks for t in skipped_tokens(tok)] if diags else []
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
    # text the parser skipped is not in the tree, so the write check below cannot see it; Icarus may still
    # compile it, so skipped text that names the DUT instance is refused
    for tok in skipped:
        if tok.kind.name == "Identifier" and tok.valueText == inst:
            err(forbidden, line_of(tok), f"text pyslang cannot parse names the DUT instance {inst!r}; fix the "
                "syntax errors first")
            break
    dut_modules = set(prepared.modules)
    for m in _nodes(tree.root.members) if _kind(tree.root) == "CompilationUnit" else []:
        if _kind(m) == "ModuleDeclaration" and m.header.name.valueText in dut_modules:
            err(forbidden, line_of(m.getFirstToken()),
                f"the testbench redefines DUT module {m.header.name.valueText!r}; instantiate it instead")
    dut_ports = {sc.module: list(sc.port_dirs.items()) for sc in prepared.scopes if sc.kind == "module"}
    nodes = list(walk(tree.root))
    subs, mods = declared_ports(tree.root, nodes)
    for node, what in dut_writes(tree.root, inst, subs, {**dut_ports, **mods}, nodes):
        err(forbidden, line_of(node.getFirstToken()), write_message(node, what))
    return forbidden, hints, diags
