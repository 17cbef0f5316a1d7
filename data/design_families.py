"""Synthetic design families: parameterised RTL generators for training the testbench writer.

Each *family* is one function `fam_<name>(rng) -> design dict` that draws a random *structure* (FSM graphs
and state counts, opcode tables, optional features such as load/enable/saturate/error states, coding styles:
always_ff vs always @(posedge), logic vs reg, localparam vs typedef'd states, case vs if-chains, sync vs
async reset of either polarity), renders Icarus-11-clean SystemVerilog, writes an English spec (markdown:
ports table, behaviour, reset, corner cases) and may add directed stimulus that reaches its deep states.
The Verilog-writing helpers (style, header, seq, comb, decl, port, fsm_decl, fsm_logic, ...) are shared by
all families. data/designs.py turns a design dict into a task row.

FAMILIES maps each name to its function; VAL_FAMILIES are held out of training, so validation measures
transfer to unseen kinds of design.

API: FAMILIES; VAL_FAMILIES; fam_<name>(rng) -> dict; style(rng) -> dict; header(st, module, ports, params=()).
"""
import re

# ----------------------------------------------------------------------------------------------
# coding-style choices shared by all families


def style(rng):
    """Random coding style: process keywords, variable type, reset name/polarity/sync, FSM coding."""
    ff = rng.random() < 0.5
    rst = rng.choice(["rst_n", "rst_n", "rst", "reset", "arst_n", "rst_ni", "srst"])
    return {
        "ff": "always_ff" if ff else "always",
        "comb": "always_comb" if rng.random() < 0.6 else "always @*",
        "t": "logic" if (ff or rng.random() < 0.35) else "reg",
        "rst": rst,
        "rst_low": rst.endswith("_n") or rst.endswith("_ni"),
        "async": rng.random() < 0.6 and rst != "srst",
        "fsm": rng.choice(["localparam", "localparam", "enum"]),
        "fsm_proc": rng.choice(["one", "two"]),
        "default_arm": rng.random() < 0.35,
        "param_kw": rng.choice(["parameter", "parameter int"]),
    }


def rng_txt(w):
    """Packed range text for a width (int or parameter expression); '' for 1 bit."""
    if isinstance(w, str):
        return f"[{w}-1:0]"
    return "" if w == 1 else f"[{w - 1}:0]"


def ones(w):
    return f"{w}'d{(1 << w) - 1}"


def rst_cond(st):
    return f"!{st['rst']}" if st["rst_low"] else st["rst"]


def ind(text, n):
    pad = " " * n
    return "\n".join(pad + line if line.strip() else line for line in text.strip("\n").split("\n"))


def seq(st, reset, body, clk="clk"):
    """A clocked process with reset: `reset` and `body` are statement text (any indentation)."""
    if st["async"]:
        edge = "negedge" if st["rst_low"] else "posedge"
        sens = f"posedge {clk} or {edge} {st['rst']}"
    else:
        sens = f"posedge {clk}"
    return (f"  {st['ff']} @({sens}) begin\n    if ({rst_cond(st)}) begin\n{ind(reset, 6)}\n"
            f"    end else begin\n{ind(body, 6)}\n    end\n  end\n")


def comb(st, body):
    """A combinational process. Icarus 11 warns about constant selects inside always_comb, so
    bodies with any bit-select use always @* instead."""
    kw = st["comb"]
    if kw == "always_comb" and re.search(r"\w\[", body):
        kw = "always @*"
    return f"  {kw} begin\n{ind(body, 4)}\n  end\n"


def decl(st, name, w, proc=True, arr=""):
    """Internal signal declaration: logic, or reg/wire in the Verilog-2001 style."""
    t = st["t"] if (st["t"] == "logic" or proc) else "wire"
    r = rng_txt(w)
    return f"  {t}{' ' + r if r else ''} {name}{arr};\n"


def port(name, d, w, desc, kind="data", proc=False):
    """A port record. kind: clk | rst | data. proc: driven by a process (output reg)."""
    return {"name": name, "dir": d, "width": w, "desc": desc, "kind": kind, "proc": proc}


def clk_rst(st):
    pol = "active-low" if st["rst_low"] else "active-high"
    sync = "asynchronous" if st["async"] else "synchronous"
    return [port("clk", "input", 1, "Clock; all state changes on its rising edge.", "clk"),
            port(st["rst"], "input", 1, f"Reset, {pol}, {sync}.", "rst")]


def header(st, module, ports, params=()):
    """ANSI module header. params: [(name, value, desc)]; port widths may name a parameter."""
    out = "`timescale 1ns/1ps\n"
    out += f"module {module}"
    if params:
        out += " #(\n" + ",\n".join(f"  {st['param_kw']} {n} = {v}" for n, v, _ in params) + "\n)"
    lines = []
    for p in ports:
        if p["dir"] == "input":
            t = "logic" if st["t"] == "logic" else "wire"
        else:
            t = "logic" if st["t"] == "logic" else ("reg" if p["proc"] else "wire")
        r = rng_txt(p["pwidth"] if "pwidth" in p else p["width"])
        lines.append(f"  {p['dir']:<6} {t}{' ' + r if r else ''} {p['name']}")
    return out + " (\n" + ",\n".join(lines) + "\n);\n"


def fsm_decl(st, names, var="state", nxt="auto", onehot=False):
    """State declarations in the style's coding (localparam constants or a typedef'd enum).
    nxt="auto" declares `next_state` only for the two-process style (what fsm_logic needs);
    nxt=None declares none (hand-written one-process FSMs). Returns (text, bits)."""
    if nxt == "auto":
        nxt = "next_state" if st["fsm_proc"] == "two" else None
    n = len(names)
    bits = n if onehot else max(1, (n - 1).bit_length())
    if st["fsm"] == "enum" and not onehot:
        out = (f"  typedef enum logic [{bits - 1}:0] {{{', '.join(names)}}} {var}_t;\n"
               f"  {var}_t {var}{', ' + nxt if nxt else ''};\n")
        return out, bits
    vals = [(1 << i) if onehot else i for i in range(n)]
    out = "  localparam " + f"[{bits - 1}:0] " + ",\n             ".join(
        f"{nm} = {bits}'{'b' + format(v, '0' + str(bits) + 'b') if onehot else 'd' + str(v)}"
        for nm, v in zip(names, vals)) + ";\n"
    out += decl(st, var, bits) + (decl(st, nxt, bits) if nxt else "")
    return out, bits


def fsm_logic(st, trans, reset_state, var="state", nxt="next_state"):
    """Render a state machine. trans: {state: [(cond, target), ...]} in priority order
    (cond None = unconditional). One-process style writes `state <= X` inside a clocked case;
    two-process style computes next_state in a combinational case."""
    names = list(trans)
    one = st["fsm_proc"] == "one"
    arrow = "<=" if one else "="
    tgt = var if one else nxt
    items = []
    for s in names:
        edges = trans[s]
        if not edges:
            items.append(f"{s}: ;" if one else f"{s}: {tgt} {arrow} {s};")
            continue
        lines, first = [], True
        for cond, t in edges:
            if cond is None:
                lines.append(("else " if not first else "") + f"{tgt} {arrow} {t};")
                break
            lines.append(("if" if first else "else if") + f" ({cond}) {tgt} {arrow} {t};")
            first = False
        items.append(f"{s}: begin\n" + ind("\n".join(lines), 2) + "\nend")
    if st["default_arm"]:
        items.append(f"default: {tgt} {arrow} {reset_state};")
    case = f"case ({var})\n" + ind("\n".join(items), 2) + "\nendcase"
    if one:
        return seq(st, f"{var} <= {reset_state};", case)
    return (comb(st, f"{nxt} = {var};\n" + case)
            + seq(st, f"{var} <= {reset_state};", f"{var} <= {nxt};"))


# ----------------------------------------------------------------------------------------------
# names


def pick_name(rng, bases):
    """Module name: a random base plus an optional short suffix."""
    return rng.choice(bases) + rng.choice(["", "", "_unit", "_core", "_top", f"_v{rng.randint(1, 9)}"])


# ----------------------------------------------------------------------------------------------
# families: each returns a design dict
#   module, params [(name, value, desc)], ports [port()], body (RTL after the header), st (style),
#   overview (str), behaviour [str], reset (str), corner [str], directed (TB statements run after
#   the random phases; may use @(negedge clk) and the port names), deep (0..2, difficulty bump)


def fam_counter(rng):
    """Up/down counter with optional load, enable, clear, wrap-or-saturate at a terminal value."""
    st = style(rng)
    w = rng.randint(4, 9)
    top = rng.randint(2 ** (w - 1), 2 ** w - 1)
    updown, load, en, clr = (rng.random() < 0.5, rng.random() < 0.6, rng.random() < 0.7, rng.random() < 0.4)
    sat = rng.random() < 0.4
    ports = clk_rst(st)
    if clr:
        ports.append(port("clr", "input", 1, "Synchronous clear to zero (highest priority after reset)."))
    if load:
        ports += [port("load", "input", 1, "Load `din` into the counter."),
                  port("din", "input", w, "Value loaded when `load` is high.")]
    if en:
        ports.append(port("en", "input", 1, "Count enable."))
    if updown:
        ports.append(port("up", "input", 1, "Direction: 1 counts up, 0 counts down."))
    ports += [port("count", "output", w, "Current count.", proc=True),
              port("at_max", "output", 1, "High while count >= MAX_VAL."),
              port("at_zero", "output", 1, "High while count is zero.")]
    inc = (f"if (count >= MAX_VAL) count <= {'MAX_VAL' if sat else '0'};\n"
           f"else count <= count + 1'b1;")
    dec = (f"if (count == 0) count <= {'0' if sat else 'MAX_VAL'};\n"
           f"else count <= count - 1'b1;")
    step = f"if (up) begin\n{ind(inc, 2)}\nend else begin\n{ind(dec, 2)}\nend" if updown else inc
    chain, first = [], True
    for cond, act in [("clr", "count <= 0;"), ("load", "count <= din;")]:
        if (cond == "clr" and clr) or (cond == "load" and load):
            chain.append(("if" if first else "else if") + f" ({cond}) begin\n  {act}\nend")
            first = False
    if en:
        chain.append(("if" if first else "else if") + f" (en) begin\n{ind(step, 2)}\nend")
    else:
        chain.append(step if first else f"else begin\n{ind(step, 2)}\nend")
    body = f"  localparam [{w - 1}:0] MAX_VAL = {w}'d{top};\n\n"
    body += seq(st, "count <= 0;", "\n".join(chain))
    body += "\n  assign at_max = (count >= MAX_VAL);\n  assign at_zero = (count == 0);\n"
    beh = [f"The counter is {w} bits wide; MAX_VAL = {top}."]
    if clr:
        beh.append("`clr` forces the count to zero on the next edge.")
    if load:
        beh.append("`load` copies `din` into the counter (a loaded value above MAX_VAL is allowed).")
    beh.append(("Counting happens only while `en` is high. " if en else "The counter advances every cycle. ")
               + ("`up` selects the direction." if updown else "It counts up."))
    beh.append(f"Counting up at or above MAX_VAL {'holds at MAX_VAL (saturates)' if sat else 'wraps to 0'}."
               + (f" Counting down at 0 {'stays at 0' if sat else 'wraps to MAX_VAL'}." if updown else ""))
    dirc = ("    @(negedge clk); " + " ".join(
        [f"{p['name']} = {v};" for p, v in [(p, {'en': 1, 'up': 1, 'load': 0, 'clr': 0}.get(p['name'], 0))
                                            for p in ports if p['kind'] == 'data' and p['dir'] == 'input']])
            + f"\n    repeat ({top + 3}) @(negedge clk);\n")
    if updown:
        dirc += "    up = 0;\n    repeat ({}) @(negedge clk);\n".format(top + 3)
    return {"module": pick_name(rng, ["counter", "mod_counter", "event_counter", "ud_counter"]),
            "ports": ports, "body": body, "st": st, "deep": 1 if top > 100 else 0,
            "overview": f"A {w}-bit {'up/down ' if updown else ''}counter with a terminal value MAX_VAL = {top}.",
            "behaviour": beh, "reset": "count = 0.",
            "corner": ["Reaching MAX_VAL needs a long run of enabled cycles.",
                       "Loading a value above MAX_VAL, then counting." if load else "Wrap/saturate at the terminal value."],
            "directed": dirc}


def fam_shift_reg(rng):
    """Shift register: serial-in/parallel-out, parallel-load/serial-out or bidirectional."""
    st = style(rng)
    w = rng.randint(4, 12)
    kind = rng.choice(["sipo", "piso", "bidir"])
    en = rng.random() < 0.6
    ports = clk_rst(st)
    if en:
        ports.append(port("en", "input", 1, "Shift enable."))
    lines = []
    if kind == "sipo":
        ports += [port("sin", "input", 1, "Serial input bit."),
                  port("q", "output", w, "Parallel contents.", proc=True),
                  port("sout", "output", 1, "Bit shifted out (MSB).")]
        act = f"q <= {{q[{w - 2}:0], sin}};"
        lines.append("  assign sout = q[{}];\n".format(w - 1))
        beh = ["Each enabled cycle the register shifts left by one and `sin` enters at bit 0."]
    elif kind == "piso":
        ports += [port("load", "input", 1, "Parallel load of `pdata` (has priority over shifting)."),
                  port("pdata", "input", w, "Parallel data."),
                  port("q", "output", w, "Register contents.", proc=True),
                  port("sout", "output", 1, "Serial output (LSB).")]
        fill = rng.choice(["1'b0", "q[0]"])
        act = f"if (load) q <= pdata;\nelse q <= {{{fill}, q[{w - 1}:1]}};"
        lines.append("  assign sout = q[0];\n")
        beh = ["`load` copies `pdata`; otherwise each enabled cycle shifts right by one, "
               + ("filling with 0." if fill == "1'b0" else "rotating bit 0 into the MSB.")]
    else:
        ports += [port("dir", "input", 1, "1 shifts left, 0 shifts right."),
                  port("sin", "input", 1, "Serial input bit."),
                  port("mode", "input", 2, "0 shift, 1 rotate, 2 hold, 3 clear."),
                  port("q", "output", w, "Register contents.", proc=True)]
        act = ("case (mode)\n"
               f"  2'd0: if (dir) q <= {{q[{w - 2}:0], sin}}; else q <= {{sin, q[{w - 1}:1]}};\n"
               f"  2'd1: if (dir) q <= {{q[{w - 2}:0], q[{w - 1}]}}; else q <= {{q[0], q[{w - 1}:1]}};\n"
               "  2'd2: q <= q;\n  default: q <= 0;\nendcase")
        beh = ["`mode` selects shift (0), rotate (1), hold (2) or clear (3); `dir` picks the direction.",
               "When shifting, `sin` enters at the vacated end."]
    body = seq(st, "q <= 0;", f"if (en) begin\n{ind(act, 2)}\nend" if en else act) + "".join(lines)
    if en:
        beh.append("Nothing changes while `en` is low.")
    return {"module": pick_name(rng, ["shift_reg", "shifter_reg", f"{kind}_reg", "sreg"]),
            "ports": ports, "body": body, "st": st, "deep": 0,
            "overview": f"A {w}-bit {kind.upper() if kind != 'bidir' else 'bidirectional'} shift register.",
            "behaviour": beh, "reset": "q = 0.",
            "corner": ["All bits must see both a 0 and a 1 shifted through them."], "directed": ""}


LFSR_TAPS = {5: [5, 3], 6: [6, 5], 7: [7, 6], 8: [8, 6, 5, 4], 9: [9, 5], 10: [10, 7], 11: [11, 9],
             12: [12, 6, 4, 1], 13: [13, 4, 3, 1], 14: [14, 5, 3, 1], 15: [15, 14], 16: [16, 15, 13, 4]}


def fam_lfsr(rng):
    """LFSR, Fibonacci or Galois, with optional seed load, enable and lock-up recovery."""
    st = style(rng)
    w = rng.randint(5, 16)
    taps = LFSR_TAPS[w]
    galois = rng.random() < 0.5
    load, en, guard = rng.random() < 0.7, rng.random() < 0.5, rng.random() < 0.6
    seedv = rng.randint(1, 2 ** w - 1)
    ports = clk_rst(st)
    if en:
        ports.append(port("en", "input", 1, "Advance enable."))
    if load:
        ports += [port("load", "input", 1, "Load `seed` into the register."),
                  port("seed", "input", w, "Seed value.")]
    ports += [port("lfsr_q", "output", w, "Register state.", proc=True),
              port("bit_out", "output", 1, "Output bit (LSB).")]
    if galois:
        mask = sum(1 << (t - 1) for t in taps)
        nxt = f"lfsr_q[0] ? ({{1'b0, lfsr_q[{w - 1}:1]}} ^ {w}'h{mask:X}) : {{1'b0, lfsr_q[{w - 1}:1]}}"
        desc = f"Galois form: shift right; when the bit shifted out is 1, XOR the mask {w}'h{mask:X}."
    else:
        fb = " ^ ".join(f"lfsr_q[{t - 1}]" for t in taps)
        nxt = f"{{lfsr_q[{w - 2}:0], {fb}}}"
        desc = f"Fibonacci form: shift left; the new bit 0 is the XOR of bits {', '.join(str(t - 1) for t in taps)}."
    body = decl(st, "nxt", w, proc=False) + f"  assign nxt = {nxt};\n"
    chain = []
    if load:
        chain.append("if (load) lfsr_q <= seed;")
    adv = f"if (lfsr_q == 0) lfsr_q <= {w}'d1;\nelse lfsr_q <= nxt;" if guard else "lfsr_q <= nxt;"
    if en:
        chain.append(("else " if chain else "") + f"if (en) begin\n{ind(adv, 2)}\nend")
    else:
        chain.append((f"else begin\n{ind(adv, 2)}\nend") if chain else adv)
    body += seq(st, f"lfsr_q <= {w}'d{seedv};", "\n".join(chain)) + "  assign bit_out = lfsr_q[0];\n"
    beh = [desc, f"Taps from the polynomial with terms {', '.join('x^%d' % t for t in taps)}, 1."]
    if guard:
        beh.append("If the register ever holds all zeros it is forced to 1 on the next advance (lock-up recovery).")
    dirc = ""
    if load:
        dirc = ("    @(negedge clk); load = 1; seed = 0;" + (" en = 1;" if en else "")
                + "\n    @(negedge clk); load = 0;\n    repeat (4) @(negedge clk);\n")
    return {"module": pick_name(rng, ["lfsr", f"lfsr{w}", "prbs_gen", "rand_gen"]),
            "ports": ports, "body": body, "st": st, "deep": 0,
            "overview": f"A {w}-bit linear feedback shift register (pseudo-random sequence).",
            "behaviour": beh, "reset": f"lfsr_q = {seedv} (non-zero).",
            "corner": ["Loading an all-zero seed (lock-up)." if load else "Long runs to see every bit toggle."],
            "directed": dirc}


def kmp_graph(pat):
    """Transition table of an overlapping pattern detector: state = matched prefix length."""
    k = len(pat)
    nxt = {}
    for s in range(k + 1):
        for b in "01":
            cand = (pat[:s] if s < k else pat) + b
            j = min(k, len(cand))
            while j > 0 and cand[len(cand) - j:] != pat[:j]:
                j -= 1
            nxt[(s, b)] = j
    return nxt


def fam_seq_detector(rng):
    """Pattern detector FSM (Moore) on a serial input: random pattern and length, overlap or not, optional enable."""
    st = style(rng)
    k = rng.randint(3, 6)
    pat = "".join(rng.choice("01") for _ in range(k))
    overlap = rng.random() < 0.6
    en = rng.random() < 0.4
    nxt = kmp_graph(pat)
    if not overlap:
        for b in "01":
            nxt[(k, b)] = 1 if pat[0] == b else 0
    names = [f"S{i}" if i else "IDLE" for i in range(k)] + ["FOUND"]
    ports = clk_rst(st)
    if en:
        ports.append(port("en", "input", 1, "Input valid; the FSM holds while low."))
    ports += [port("din", "input", 1, "Serial input bit."),
              port("detected", "output", 1, "High while the FSM is in state FOUND (pattern just completed).")]
    trans = {}
    for s, nm in enumerate(names):
        t1, t0 = names[nxt[(s, "1")]], names[nxt[(s, "0")]]
        if en:
            edges = [(c, t) for c, t in [("en && din", t1), ("en && !din", t0)] if t != nm]
        elif t1 != nm and t0 != nm:
            edges = [("din", t1), (None, t0)]
        else:
            edges = [("din", t1)] if t1 != nm else [("!din", t0)]
        trans[nm] = edges
    dcl, bits = fsm_decl(st, names)
    body = dcl + fsm_logic(st, trans, "IDLE")
    body += "  assign detected = (state == FOUND);\n"
    feed = "".join(f"    @(negedge clk); din = 1'b{b};{' en = 1;' if en else ''}\n" for b in pat * 2)
    return {"module": pick_name(rng, ["seq_detector", "pattern_fsm", "seq_det", "bit_matcher"]),
            "ports": ports, "body": body, "st": st, "deep": 1 if k >= 5 else 0,
            "overview": f"A Moore FSM that detects the serial bit pattern `{pat}` on `din` (first bit first).",
            "behaviour": [f"States track the longest matched prefix of `{pat}`; FOUND means the whole pattern was seen.",
                          "Detection is " + ("overlapping: the tail of one match may start the next." if overlap
                                             else "non-overlapping: after FOUND matching restarts from scratch."),
                          "`detected` is a registered-state (Moore) output."] + (["Bits are consumed only while `en` is high."] if en else []),
            "reset": "state = IDLE, detected = 0.",
            "corner": ["Every mismatch edge of the prefix automaton must be exercised.",
                       "Back-to-back occurrences of the pattern."],
            "directed": feed}


def _cond_eval(cond, env):
    """Evaluate a generated Verilog condition (&&, ||, !, ==, 2'dK) in Python over an input dict."""
    py = re.sub(r"\d+'d(\d+)", r"\1", cond).replace("&&", " and ").replace("||", " or ")
    py = re.sub(r"!(?!=)", " not ", py)
    return bool(eval(py, {}, dict(env)))


def fam_fsm_random(rng):
    """Control FSM with a random transition graph over random input conditions, optional wait timer.

    A ring through all states guarantees reachability; each extra edge's condition is checked (by
    enumerating the inputs) to be reachable past the earlier, higher-priority conditions."""
    st = style(rng)
    pool = ["FETCH", "DECODE", "EXEC", "WAIT", "ACK", "HOLD", "SCAN", "LOAD", "STORE", "FLUSH", "ARM",
            "FIRE", "COOL", "SYNC", "CHECK", "DRAIN"]
    n = rng.randint(4, 8)
    names = ["IDLE"] + rng.sample(pool, n - 1)
    has_cmd = rng.random() < 0.6
    inputs = ["go", "stop", "mode"]
    lits = ["go", "!go", "stop", "!stop", "mode", "!mode"]
    if has_cmd:
        lits += [f"cmd == 2'd{k}" for k in range(4)]
    combos = []
    for v in range(2 ** (3 + 2 * has_cmd)):
        env = {"go": v & 1, "stop": (v >> 1) & 1, "mode": (v >> 2) & 1}
        if has_cmd:
            env["cmd"] = v >> 3
        combos.append(env)

    def rand_cond():
        a, b = rng.sample(lits, 2)
        r = rng.random()
        return a if r < 0.35 else (f"{a} && {b}" if r < 0.8 else f"{a} || {b}")

    timer_state = rng.choice(names[1:]) if rng.random() < 0.5 else None
    tk = rng.randint(3, 12)
    trans = {}
    for i, s in enumerate(names):
        ring = names[(i + 1) % n]
        targets = [ring] + [t for t in rng.sample(names, rng.randint(0, 2)) if t not in (s, ring)]
        edges = []
        for t in targets:
            for _ in range(20):
                c = "tmr_done" if (s == timer_state and t == ring) else rand_cond()
                prev = [e[0] for e in edges]
                ok = c not in prev and (c == "tmr_done" or any(
                    _cond_eval(c, e) and not any(_cond_eval(p, e) for p in prev if p != "tmr_done")
                    for e in combos))
                if ok:
                    edges.append((c, t))
                    break
        trans[s] = edges
    ow = rng.randint(2, 4)
    outv = {s: rng.randint(0, 2 ** ow - 1) for s in names}
    ports = clk_rst(st) + [port(x, "input", 1, d) for x, d in
                           [("go", "Start/advance request."), ("stop", "Stop request."), ("mode", "Mode select.")]]
    if has_cmd:
        ports.append(port("cmd", "input", 2, "Command code."))
    ports += [port("out", "output", ow, "Moore output code of the current state.", proc=True),
              port("busy", "output", 1, "High whenever the FSM is not in IDLE.")]
    dcl, bits = fsm_decl(st, names)
    body = dcl
    if timer_state:
        tw = tk.bit_length()
        body += decl(st, "tmr", tw) + decl(st, "tmr_done", 1, proc=False)
        body += seq(st, "tmr <= 0;", f"if (state == {timer_state} && !tmr_done) tmr <= tmr + 1'b1;\nelse tmr <= 0;")
        body += f"  assign tmr_done = (tmr == {tw}'d{tk});\n"
    body += fsm_logic(st, trans, "IDLE")
    cases = "\n".join(f"{s}: out = {ow}'d{outv[s]};" for s in names)
    body += comb(st, f"out = {ow}'d0;\ncase (state)\n{ind(cases, 2)}\n" + ("  default: out = 0;\n" if st["default_arm"] else "") + "endcase")
    body += "  assign busy = (state != IDLE);\n"
    beh = [f"States: {', '.join(names)}; reset state IDLE. Transitions (checked in order, first match wins; otherwise stay):"]
    for s in names:
        for c, t in trans[s]:
            beh.append(f"{s} -> {t} when `{c if c != 'tmr_done' else f'{tk} cycles have elapsed in ' + s}`")
    beh.append("`out` per state: " + ", ".join(f"{s}={outv[s]}" for s in names) + ".")
    return {"module": pick_name(rng, ["ctrl_fsm", "seq_ctrl", "main_fsm", "controller", "op_sequencer"]),
            "ports": ports, "body": body, "st": st, "deep": 1,
            "overview": f"A {n}-state control state machine driven by `go`, `stop`, `mode`{' and `cmd`' if has_cmd else ''}.",
            "behaviour": beh, "reset": "state = IDLE.",
            "corner": ["Some transitions need a specific combination of inputs in a specific state.",
                       f"State {timer_state} waits {tk} cycles before it can leave along the ring." if timer_state
                       else "Every transition arc, not just every state, counts for FSM coverage."],
            "directed": ""}


def fam_traffic_light(rng):
    """Two-road traffic light with per-phase timers, optional all-red, pedestrian and emergency states."""
    st = style(rng)
    allred, ped, emerg = rng.random() < 0.6, rng.random() < 0.6, rng.random() < 0.5
    names = ["NS_GREEN", "NS_YELLOW"] + (["ALL_RED_A"] if allred else []) + ["EW_GREEN", "EW_YELLOW"] \
        + (["ALL_RED_B"] if allred else []) + (["PED_WALK"] if ped else []) + (["FLASH"] if emerg else [])
    dur = {"NS_GREEN": rng.randint(4, 12), "EW_GREEN": rng.randint(4, 12), "NS_YELLOW": rng.randint(2, 4),
           "EW_YELLOW": rng.randint(2, 4), "ALL_RED_A": rng.randint(1, 3), "ALL_RED_B": rng.randint(1, 3),
           "PED_WALK": rng.randint(3, 8), "FLASH": 1}
    cyc = [s for s in names if s not in ("PED_WALK", "FLASH")]
    tw = max(dur.values()).bit_length()
    trans = {}
    for i, s in enumerate(cyc):
        nxt = cyc[(i + 1) % len(cyc)]
        edges = [("emergency", "FLASH")] if emerg else []
        if ped and s == "EW_YELLOW":
            edges.append(("tdone && ped_req_q", "PED_WALK"))
        edges.append(("tdone", nxt))
        trans[s] = edges
    if ped:
        trans["PED_WALK"] = ([("emergency", "FLASH")] if emerg else []) + [("tdone", cyc[(cyc.index("EW_YELLOW") + 1) % len(cyc)])]
    if emerg:
        trans["FLASH"] = [("!emergency", cyc[-1] if allred else "NS_GREEN")]
    ports = clk_rst(st) + ([port("ped_req", "input", 1, "Pedestrian button (latched until served).")] if ped else []) \
        + ([port("emergency", "input", 1, "Emergency override: all lights flash yellow while high.")] if emerg else []) \
        + [port("ns_light", "output", 2, "North-south light: 0 red, 1 yellow, 2 green.", proc=True),
           port("ew_light", "output", 2, "East-west light: 0 red, 1 yellow, 2 green.", proc=True)] \
        + ([port("walk", "output", 1, "Pedestrian walk signal.")] if ped else [])
    dcl, bits = fsm_decl(st, names)
    body = dcl + decl(st, "timer", tw) + decl(st, "tdone_lim", tw) + decl(st, "tdone", 1, proc=False)
    if ped:
        body += decl(st, "ped_req_q", 1)
    body += comb(st, "case (state)\n" + ind("\n".join(
        f"{s}: tdone_lim = {tw}'d{dur[s] - 1};" for s in names), 2) + "\n  default: tdone_lim = 0;\nendcase")
    body += "  assign tdone = (timer >= tdone_lim);\n"
    body += seq(st, "timer <= 0;", "if (tdone" + (" || emergency" if emerg else "") + ") timer <= 0;\nelse timer <= timer + 1'b1;")
    if ped:
        body += seq(st, "ped_req_q <= 1'b0;", "if (state == PED_WALK) ped_req_q <= 1'b0;\nelse if (ped_req) ped_req_q <= 1'b1;")
    body += fsm_logic(st, trans, "NS_GREEN")
    light = {"NS_GREEN": (2, 0), "NS_YELLOW": (1, 0), "EW_GREEN": (0, 2), "EW_YELLOW": (0, 1), "ALL_RED_A": (0, 0),
             "ALL_RED_B": (0, 0), "PED_WALK": (0, 0), "FLASH": (1, 1)}
    body += comb(st, "ns_light = 2'd0;\new_light = 2'd0;\ncase (state)\n" + ind("\n".join(
        f"{s}: begin ns_light = 2'd{light[s][0]}; ew_light = 2'd{light[s][1]}; end" for s in names), 2) + "\n  default: ;\nendcase")
    if ped:
        body += "  assign walk = (state == PED_WALK);\n"
    beh = ["Phases cycle " + " -> ".join(cyc) + " -> ...; each lasts a fixed number of cycles: "
           + ", ".join(f"{s}={dur[s]}" for s in names if s != "FLASH") + "."]
    if ped:
        beh.append("A `ped_req` pulse is remembered; at the end of EW_YELLOW the controller enters PED_WALK instead of continuing.")
    if emerg:
        beh.append("While `emergency` is high the controller goes to FLASH (both lights yellow); when it drops it resumes.")
    return {"module": pick_name(rng, ["traffic_light", "traffic_ctrl", "intersection_ctrl"]),
            "ports": ports, "body": body, "st": st, "deep": 1,
            "overview": "A traffic light controller for a two-road intersection.",
            "behaviour": beh, "reset": "state = NS_GREEN, timer = 0.",
            "corner": ["PED_WALK is only reached with a pending request at the end of EW_YELLOW." if ped else
                       "Each phase must run to its full duration.",
                       "Emergency asserted in every phase." if emerg else "A full cycle of all phases."],
            "directed": ""}


def fam_vending_machine(rng):
    """Vending machine: coin codes accumulate credit; vend, change and refund states."""
    st = style(rng)
    price = 5 * rng.randint(3, 12)
    coins = {1: 5, 2: 10, 3: rng.choice([25, 20])}
    two = rng.random() < 0.5
    price2 = price + 5 * rng.randint(1, 4)
    cw = (max(price, price2) + 25).bit_length()
    names = ["IDLE", "COLLECT", "VEND", "CHANGE", "REFUND"]
    ports = clk_rst(st) + [port("coin", "input", 2, f"Coin inserted this cycle: 0 none, 1 = {coins[1]}, 2 = {coins[2]}, 3 = {coins[3]}."),
                           port("cancel", "input", 1, "Abort and refund the credit.")]
    if two:
        ports.append(port("sel", "input", 1, f"Product select, sampled while collecting: 0 costs {price}, 1 costs {price2}."))
    ports += [port("vend", "output", 1, "One-cycle pulse: product dispensed.", proc=True),
              port("change_out", "output", 1, "One-cycle pulse per 5-unit coin returned.", proc=True),
              port("credit", "output", cw, "Current credit.", proc=True)]
    dcl, bits = fsm_decl(st, names, nxt=None)
    body = dcl + decl(st, "coin_val", cw) + (decl(st, "cost", cw) if two else f"  localparam [{cw - 1}:0] cost = {cw}'d{price};\n")
    body += comb(st, f"case (coin)\n  2'd1: coin_val = {cw}'d{coins[1]};\n  2'd2: coin_val = {cw}'d{coins[2]};\n"
                     f"  2'd3: coin_val = {cw}'d{coins[3]};\n  default: coin_val = {cw}'d0;\nendcase")
    if two:
        body += comb(st, f"if (sel) cost = {cw}'d{price2};\nelse cost = {cw}'d{price};")
    fsm = f"""vend <= 1'b0;
change_out <= 1'b0;
case (state)
  IDLE: begin
    if (coin != 2'd0) begin
      credit <= coin_val;
      state <= COLLECT;
    end
  end
  COLLECT: begin
    if (cancel) state <= REFUND;
    else if (credit >= cost) state <= VEND;
    else if (coin != 2'd0) credit <= credit + coin_val;
  end
  VEND: begin
    vend <= 1'b1;
    credit <= credit - cost;
    if (credit > cost) state <= CHANGE;
    else state <= IDLE;
  end
  CHANGE, REFUND: begin
    if (credit >= {cw}'d5) begin
      credit <= credit - {cw}'d5;
      change_out <= 1'b1;
    end else begin
      credit <= 0;
      state <= IDLE;
    end
  end
{'  default: state <= IDLE;' if st['default_arm'] else ''}
endcase"""
    body += seq(st, "state <= IDLE;\ncredit <= 0;\nvend <= 1'b0;\nchange_out <= 1'b0;", fsm)
    return {"module": pick_name(rng, ["vending_machine", "vend_ctrl", "coin_fsm"]),
            "ports": ports, "body": body, "st": st, "deep": 1,
            "overview": f"A vending machine controller; the product costs {price}" + (f" or {price2} (by `sel`)." if two else "."),
            "behaviour": ["IDLE waits for a coin; the first coin starts COLLECT with that credit.",
                          "In COLLECT, `cancel` goes to REFUND; once credit >= cost it goes to VEND; otherwise coins add credit.",
                          "VEND pulses `vend`, subtracts the cost and goes to CHANGE if credit remains, else IDLE.",
                          "CHANGE and REFUND return 5 units per cycle (`change_out` pulse) until the credit is below 5, then clear it and go to IDLE."],
            "reset": "state = IDLE, credit = 0, outputs low.",
            "corner": ["Overpaying so change is returned.", "Cancel in the middle of collecting.",
                       "Exact payment (no change)."],
            "directed": ""}


def _uart_params(rng):
    return {"clks": rng.randint(2, 6), "dbits": rng.randint(5, 8),
            "parity": rng.choice(["none", "even", "odd"]), "stop": rng.choice([1, 1, 2])}


def fam_uart_tx(rng):
    """UART transmitter: start bit, 5..8 data bits LSB first, optional parity, 1 or 2 stop bits."""
    st = style(rng)
    u = _uart_params(rng)
    names = ["IDLE", "START", "DATA"] + (["PARITY"] if u["parity"] != "none" else []) + ["STOP"]
    after = "PARITY" if u["parity"] != "none" else "STOP"
    cw = (u["clks"] * u["stop"]).bit_length()
    iw = max(1, (u["dbits"] - 1).bit_length())
    ports = clk_rst(st) + [port("tx_start", "input", 1, "Start a frame with `tx_data` (ignored while busy)."),
                           port("tx_data", "input", u["dbits"], "Data to send.")]
    ports += [port("tx", "output", 1, "Serial line (idle high).", proc=True),
              port("busy", "output", 1, "High while a frame is being sent.", proc=True),
              port("done", "output", 1, "One-cycle pulse when the stop bit(s) finished.", proc=True)]
    dcl, bits = fsm_decl(st, names, nxt=None)
    body = dcl + decl(st, "clk_cnt", cw) + decl(st, "bit_idx", iw) + decl(st, "shreg", u["dbits"]) + decl(st, "par", 1)
    odd = "1'b1" if u["parity"] == "odd" else "1'b0"
    par_state = f"""  PARITY: begin
    tx <= par;
    if (clk_cnt == {cw}'d{u['clks'] - 1}) begin
      clk_cnt <= 0;
      state <= STOP;
    end else clk_cnt <= clk_cnt + 1'b1;
  end
""" if u["parity"] != "none" else ""
    fsm = f"""done <= 1'b0;
case (state)
  IDLE: begin
    tx <= 1'b1;
    busy <= 1'b0;
    if (tx_start) begin
      shreg <= tx_data;
      par <= (^tx_data) ^ {odd};
      busy <= 1'b1;
      clk_cnt <= 0;
      state <= START;
    end
  end
  START: begin
    tx <= 1'b0;
    if (clk_cnt == {cw}'d{u['clks'] - 1}) begin
      clk_cnt <= 0;
      bit_idx <= 0;
      state <= DATA;
    end else clk_cnt <= clk_cnt + 1'b1;
  end
  DATA: begin
    tx <= shreg[0];
    if (clk_cnt == {cw}'d{u['clks'] - 1}) begin
      clk_cnt <= 0;
      shreg <= shreg >> 1;
      if (bit_idx == {iw}'d{u['dbits'] - 1}) state <= {after};
      else bit_idx <= bit_idx + 1'b1;
    end else clk_cnt <= clk_cnt + 1'b1;
  end
{par_state}  STOP: begin
    tx <= 1'b1;
    if (clk_cnt == {cw}'d{u['clks'] * u['stop'] - 1}) begin
      clk_cnt <= 0;
      done <= 1'b1;
      busy <= 1'b0;
      state <= IDLE;
    end else clk_cnt <= clk_cnt + 1'b1;
  end
{'  default: state <= IDLE;' if st['default_arm'] else ''}
endcase"""
    body += seq(st, "state <= IDLE;\ntx <= 1'b1;\nbusy <= 1'b0;\ndone <= 1'b0;\nclk_cnt <= 0;\nbit_idx <= 0;\nshreg <= 0;\npar <= 1'b0;", fsm)
    return {"module": pick_name(rng, ["uart_tx", "uart_transmitter", "serial_tx"]),
            "ports": ports, "body": body, "st": st, "deep": 1,
            "overview": f"A UART transmitter: {u['dbits']} data bits, parity {u['parity']}, {u['stop']} stop bit(s), {u['clks']} clocks per bit.",
            "behaviour": ["In IDLE the line is high; `tx_start` latches `tx_data` and starts a frame.",
                          f"The frame is a start bit (0), {u['dbits']} data bits LSB first"
                          + (f", a {u['parity']} parity bit" if u['parity'] != 'none' else "")
                          + f", then {u['stop']} stop bit(s) (1); every bit lasts {u['clks']} clocks.",
                          "`done` pulses for one cycle when the frame ends; `busy` is high during the frame."],
            "reset": "state = IDLE, tx = 1, busy = 0, done = 0.",
            "corner": ["Every data bit position must carry both a 0 and a 1.", "`tx_start` held while busy is ignored."],
            "directed": ""}


def fam_uart_rx(rng):
    """UART receiver with mid-bit sampling, start-bit glitch rejection, parity and framing errors."""
    st = style(rng)
    u = _uart_params(rng)
    u["clks"] = rng.randint(3, 6)
    names = ["IDLE", "START", "DATA"] + (["PARITY"] if u["parity"] != "none" else []) + ["STOP"]
    after = "PARITY" if u["parity"] != "none" else "STOP"
    cw = u["clks"].bit_length()
    iw = max(1, (u["dbits"] - 1).bit_length())
    half = u["clks"] // 2
    ports = clk_rst(st) + [port("rx", "input", 1, "Serial line (idle high).")]
    ports += [port("rx_data", "output", u["dbits"], "Last received data.", proc=True),
              port("rx_valid", "output", 1, "One-cycle pulse: a frame was received correctly.", proc=True),
              port("frame_err", "output", 1, "One-cycle pulse: stop bit was 0.", proc=True)]
    if u["parity"] != "none":
        ports.append(port("parity_err", "output", 1, "One-cycle pulse: parity mismatch (frame dropped).", proc=True))
    dcl, bits = fsm_decl(st, names, nxt=None)
    body = dcl + decl(st, "clk_cnt", cw) + decl(st, "bit_idx", iw) + decl(st, "shreg", u["dbits"]) + decl(st, "par_ok", 1)
    odd = "1'b1" if u["parity"] == "odd" else "1'b0"
    last = u["clks"] - 1
    par_state = f"""  PARITY: begin
    if (clk_cnt == {cw}'d{last}) begin
      clk_cnt <= 0;
      par_ok <= ((^shreg) ^ rx) == {odd};
      state <= STOP;
    end else clk_cnt <= clk_cnt + 1'b1;
  end
""" if u["parity"] != "none" else ""
    stop_ok = "rx && par_ok" if u["parity"] != "none" else "rx"
    perr = f"""    end else if (rx && !par_ok) begin
      parity_err <= 1'b1;
""" if u["parity"] != "none" else ""
    fsm = f"""rx_valid <= 1'b0;
frame_err <= 1'b0;
{'parity_err <= 1' + "'" + 'b0;' if u['parity'] != 'none' else ''}
case (state)
  IDLE: begin
    clk_cnt <= 0;
    if (!rx) state <= START;
  end
  START: begin
    if (clk_cnt == {cw}'d{half}) begin
      clk_cnt <= 0;
      bit_idx <= 0;
      if (!rx) state <= DATA;
      else state <= IDLE;
    end else clk_cnt <= clk_cnt + 1'b1;
  end
  DATA: begin
    if (clk_cnt == {cw}'d{last}) begin
      clk_cnt <= 0;
      shreg <= {{rx, shreg[{u['dbits'] - 1}:1]}};
      if (bit_idx == {iw}'d{u['dbits'] - 1}) state <= {after};
      else bit_idx <= bit_idx + 1'b1;
    end else clk_cnt <= clk_cnt + 1'b1;
  end
{par_state}  STOP: begin
    if (clk_cnt == {cw}'d{last}) begin
      clk_cnt <= 0;
      state <= IDLE;
      if ({stop_ok}) begin
        rx_data <= shreg;
        rx_valid <= 1'b1;
{perr}      end else begin
        frame_err <= 1'b1;
      end
    end else clk_cnt <= clk_cnt + 1'b1;
  end
{'  default: state <= IDLE;' if st['default_arm'] else ''}
endcase"""
    rst = "state <= IDLE;\nclk_cnt <= 0;\nbit_idx <= 0;\nshreg <= 0;\nrx_data <= 0;\nrx_valid <= 1'b0;\nframe_err <= 1'b0;\npar_ok <= 1'b1;"
    if u["parity"] != "none":
        rst += "\nparity_err <= 1'b0;"
    else:
        body = body.replace(decl(st, "par_ok", 1), "")
        rst = rst.replace("\npar_ok <= 1'b1;", "")
    body += seq(st, rst, fsm)
    # directed: well-formed frames, a bad parity one, a bad stop one, a start glitch
    dirc = f"    rx = 1'b1; repeat ({u['clks'] * 3}) @(negedge clk);\n"
    for k, (bad_par, bad_stop) in enumerate([(0, 0), (0, 0), (1, 0), (0, 1)]):
        data = [rng.randint(0, 1) for _ in range(u["dbits"])] if k else [1, 0] * 4
        data = data[:u["dbits"]]
        frame = [0] + data
        if u["parity"] != "none":
            p = sum(data) % 2 ^ (1 if u["parity"] == "odd" else 0)
            frame.append(p ^ bad_par)
        frame.append(0 if bad_stop else 1)
        for b in frame:
            dirc += f"    rx = 1'b{b}; repeat ({u['clks']}) @(negedge clk);\n"
        dirc += f"    rx = 1'b1; repeat ({u['clks'] * 2}) @(negedge clk);\n"
    dirc += "    rx = 1'b0; @(negedge clk); rx = 1'b1; repeat (8) @(negedge clk);\n"
    return {"module": pick_name(rng, ["uart_rx", "uart_receiver", "serial_rx"]),
            "ports": ports, "body": body, "st": st, "deep": 2,
            "overview": f"A UART receiver: {u['dbits']} data bits, parity {u['parity']}, {u['clks']} clocks per bit.",
            "behaviour": ["IDLE waits for `rx` low; START re-checks the line half a bit later and returns to IDLE on a glitch.",
                          f"DATA samples {u['dbits']} bits LSB first, one every {u['clks']} clocks."
                          + (" PARITY samples and checks the parity bit." if u['parity'] != 'none' else ""),
                          "STOP samples the stop bit: 1 gives `rx_valid` (and updates `rx_data`), 0 gives `frame_err`."],
            "reset": "state = IDLE, outputs zero.",
            "corner": ["A start bit shorter than half a bit (glitch).", "Stop bit 0 (framing error).",
                       "Wrong parity." if u["parity"] != "none" else "Back-to-back frames."],
            "directed": dirc}



def fam_sync_fifo(rng):
    """Synchronous FIFO: any depth, optional count/almost flags and sticky overflow/underflow errors."""
    st = style(rng)
    depth, w = rng.choice([3, 4, 5, 6, 8]), rng.randint(4, 12)
    aw = max(1, (depth - 1).bit_length())
    cw = depth.bit_length()
    has_cnt, almost, errs = rng.random() < 0.6, rng.random() < 0.5, rng.random() < 0.5
    reg_out = rng.random() < 0.4
    ports = clk_rst(st) + [port("wr_en", "input", 1, "Write request."), port("wr_data", "input", w, "Write data."),
                           port("rd_en", "input", 1, "Read request.")]
    if errs:
        ports.append(port("clr_err", "input", 1, "Clears the sticky error flags."))
    ports += [port("rd_data", "output", w, "Read data" + (" (registered on a read)." if reg_out else " (head of the queue)."), proc=reg_out),
              port("full", "output", 1, "FIFO holds DEPTH entries."), port("empty", "output", 1, "FIFO holds no entry.")]
    if has_cnt:
        ports.append(port("count", "output", cw, "Number of stored entries.", proc=True))
    if almost:
        ports += [port("almost_full", "output", 1, f"count >= {depth - 1}."), port("almost_empty", "output", 1, "count <= 1.")]
    if errs:
        ports += [port("overflow", "output", 1, "Sticky: a write was attempted while full.", proc=True),
                  port("underflow", "output", 1, "Sticky: a read was attempted while empty.", proc=True)]
    body = decl(st, "mem", w, arr=f" [0:{depth - 1}]") + decl(st, "wr_ptr", aw) + decl(st, "rd_ptr", aw)
    if not has_cnt:
        body += decl(st, "count", cw)
    body += decl(st, "do_wr", 1, proc=False) + decl(st, "do_rd", 1, proc=False)
    body += "  assign do_wr = wr_en && !full;\n  assign do_rd = rd_en && !empty;\n"
    body += f"  assign full = (count == {cw}'d{depth});\n  assign empty = (count == 0);\n"
    if almost:
        body += f"  assign almost_full = (count >= {cw}'d{depth - 1});\n  assign almost_empty = (count <= {cw}'d1);\n"
    wrap = lambda ptr: f"if ({ptr} == {aw}'d{depth - 1}) {ptr} <= 0;\nelse {ptr} <= {ptr} + 1'b1;"
    main = (f"if (do_wr) begin\n  mem[wr_ptr] <= wr_data;\n{ind(wrap('wr_ptr'), 2)}\nend\n"
            f"if (do_rd) begin\n{ind(wrap('rd_ptr'), 2)}\n" + ("  rd_data <= mem[rd_ptr];\n" if reg_out else "") + "end\n"
            "if (do_wr && !do_rd) count <= count + 1'b1;\nelse if (do_rd && !do_wr) count <= count - 1'b1;")
    rst = "wr_ptr <= 0;\nrd_ptr <= 0;\ncount <= 0;" + ("\nrd_data <= 0;" if reg_out else "")
    body += seq(st, rst, main)
    if not reg_out:
        body += "  assign rd_data = mem[rd_ptr];\n"
    if errs:
        body += seq(st, "overflow <= 1'b0;\nunderflow <= 1'b0;",
                    "if (clr_err) begin\n  overflow <= 1'b0;\n  underflow <= 1'b0;\nend else begin\n"
                    "  if (wr_en && full) overflow <= 1'b1;\n  if (rd_en && empty) underflow <= 1'b1;\nend")
    return {"module": pick_name(rng, ["sync_fifo", "fifo", "queue_buf", "fifo_sync"]),
            "ports": ports, "body": body, "st": st, "deep": 1,
            "overview": f"A synchronous FIFO, {depth} entries of {w} bits.",
            "behaviour": ["A write is accepted when `wr_en` is high and the FIFO is not full; a read when `rd_en` is high and it is not empty.",
                          "A simultaneous read and write (neither blocked) keeps the count.",
                          "Pointers wrap from DEPTH-1 to 0."] + (["Overflow/underflow flags stay set until `clr_err`."] if errs else []),
            "reset": "empty FIFO, pointers 0" + (", error flags clear." if errs else "."),
            "corner": ["Filling to full and writing once more.", "Reading while empty.",
                       "Simultaneous read and write while full and while empty."],
            "directed": ""}


def fam_rr_arbiter(rng):
    """Round-robin arbiter: rotating priority after the last grant, optional grant hold (lock)."""
    st = style(rng)
    n = rng.randint(3, 6)
    iw = max(1, (n - 1).bit_length())
    hold = rng.random() < 0.5
    ports = clk_rst(st) + [port("req", "input", n, "Request vector, one bit per client.")]
    ports += [port("grant", "output", n, "One-hot grant (registered).", proc=True),
              port("grant_id", "output", iw, "Index of the last granted client.", proc=True),
              port("grant_valid", "output", 1, "A grant is active.")]
    body = decl(st, "next_grant", n) + decl(st, "next_id", iw)
    items = []
    for last in range(n):
        order = [(last + 1 + k) % n for k in range(n)]
        chain = "\n".join(("if" if k == 0 else "else if") + f" (req[{c}]) begin next_grant = {n}'d{1 << c}; next_id = {iw}'d{c}; end"
                          for k, c in enumerate(order))
        items.append(f"{iw}'d{last}: begin\n{ind(chain, 2)}\nend")
    sel = "case (grant_id)\n" + ind("\n".join(items), 2) + "\n  default: ;\nendcase"
    pre = f"next_grant = {n}'d0;\nnext_id = grant_id;\n"
    if hold:
        sel = f"if ((grant & req) != 0) begin\n  next_grant = grant;\nend else begin\n{ind(sel, 2)}\nend"
    body += comb(st, pre + sel)
    body += seq(st, f"grant <= {n}'d0;\ngrant_id <= {iw}'d{n - 1};", "grant <= next_grant;\ngrant_id <= next_id;")
    body += "  assign grant_valid = (grant != 0);\n"
    return {"module": pick_name(rng, ["rr_arbiter", "round_robin_arb", "arbiter_rr"]),
            "ports": ports, "body": body, "st": st, "deep": 0,
            "overview": f"A {n}-client round-robin arbiter.",
            "behaviour": ["Each cycle the requester after the last granted one (in increasing index order, wrapping) has the highest priority.",
                          "The grant is registered; with no request the grant is 0 and `grant_id` keeps its value."]
            + (["A client keeps its grant while it keeps requesting (lock)."] if hold else []),
            "reset": f"grant = 0, grant_id = {n - 1} (so client 0 has first priority).",
            "corner": ["Every (last grant, requester) pair.", "All clients requesting at once."],
            "directed": ""}


def fam_priority_arbiter(rng):
    """Fixed-priority arbiter (LSB- or MSB-first) with optional mask and starvation promotion."""
    st = style(rng)
    n = rng.randint(3, 8)
    iw = max(1, (n - 1).bit_length())
    msb_first, has_mask, starve = rng.random() < 0.5, rng.random() < 0.5, rng.random() < 0.5
    lim = rng.randint(3, 10)
    ports = clk_rst(st) + [port("req", "input", n, "Request vector.")]
    if has_mask:
        ports.append(port("mask", "input", n, "Requests with a 1 here are ignored."))
    ports += [port("grant", "output", n, "One-hot grant.", proc=True),
              port("grant_idx", "output", iw, "Index of the granted request.", proc=True),
              port("valid", "output", 1, "Some request was granted.", proc=True)]
    eff = "req & ~mask" if has_mask else "req"
    body = decl(st, "eff_req", n, proc=False) + f"  assign eff_req = {eff};\n"
    order = list(range(n - 1, -1, -1)) if msb_first else list(range(n))
    victim = order[-1]
    chain = []
    if starve:
        body += decl(st, "wait_cnt", lim.bit_length()) + decl(st, "promote", 1, proc=False)
        body += f"  assign promote = (wait_cnt >= {lim.bit_length()}'d{lim});\n"
        chain.append(f"if (promote && eff_req[{victim}]) begin grant <= {n}'d{1 << victim}; grant_idx <= {iw}'d{victim}; valid <= 1'b1; end")
    for c in order:
        chain.append(("if" if not chain else "else if") + f" (eff_req[{c}]) begin grant <= {n}'d{1 << c}; grant_idx <= {iw}'d{c}; valid <= 1'b1; end")
    chain.append(f"else begin grant <= {n}'d0; grant_idx <= {iw}'d0; valid <= 1'b0; end")
    body += seq(st, f"grant <= {n}'d0;\ngrant_idx <= {iw}'d0;\nvalid <= 1'b0;", "\n".join(chain))
    if starve:
        body += seq(st, "wait_cnt <= 0;", f"if (eff_req[{victim}] && !grant[{victim}]) begin\n  if (!promote) wait_cnt <= wait_cnt + 1'b1;\nend else wait_cnt <= 0;")
    return {"module": pick_name(rng, ["priority_arbiter", "fixed_prio_arb", "prio_arb"]),
            "ports": ports, "body": body, "st": st, "deep": 1 if starve else 0,
            "overview": f"A {n}-request fixed-priority arbiter; {'the highest' if msb_first else 'the lowest'} index wins.",
            "behaviour": ["The grant is registered and one-hot; `valid` is low when nothing is requested."]
            + (["Masked requests are ignored."] if has_mask else [])
            + ([f"Starvation guard: if request {victim} waits {lim} cycles without a grant it wins next time."] if starve else []),
            "reset": "grant = 0, valid = 0.",
            "corner": ["Only the lowest-priority request active.", "All requests active."]
            + ([f"Request {victim} starved for {lim} cycles."] if starve else []),
            "directed": ""}


ALU_OPS = {"ADD": "a + b", "SUB": "a - b", "AND": "a & b", "OR": "a | b", "XOR": "a ^ b", "NOR": "~(a | b)",
           "NAND": "~(a & b)", "NOTA": "~a", "SHL": "a << 1", "SHR": "a >> 1", "INC": "a + 1'b1",
           "DEC": "a - 1'b1", "PASSB": "b", "MIN": "(a < b) ? a : b", "MAX": "(a > b) ? a : b",
           "SLT": "{{(W-1){1'b0}}, (a < b)}", "ROL": "{a[W-2:0], a[W-1]}", "ASR": "{a[W-1], a[W-1:1]}"}


def fam_alu(rng):
    """ALU with a random opcode table, optional flags and registered output."""
    st = style(rng)
    w = rng.randint(4, 12)
    ow = rng.choice([3, 4])
    ops = rng.sample(sorted(ALU_OPS), rng.randint(5, min(len(ALU_OPS), 2 ** ow - 1)))
    codes = rng.sample(range(2 ** ow), len(ops))
    flags = [f for f in ["zero", "carry", "neg", "ovf"] if rng.random() < 0.6]
    regd = rng.random() < 0.5
    ports = (clk_rst(st) if regd else []) + [port("a", "input", w, "Operand A."), port("b", "input", w, "Operand B."),
                                            port("op", "input", ow, "Operation code (see table).")]
    if regd:
        ports.append(port("valid_in", "input", 1, "Operands valid: the result register updates."))
    ports += [port("y", "output", w, "Result" + (" (registered)." if regd else "."), proc=True),
              port("illegal", "output", 1, "The opcode is not in the table.", proc=True)]
    ports += [port(f, "output", 1, {"zero": "Result is zero.", "carry": "Carry/borrow out of ADD/SUB/INC/DEC.",
                                    "neg": "Result MSB.", "ovf": "Signed overflow of ADD/SUB."}[f], proc=True) for f in flags]
    body = f"  localparam W = {w};\n" + decl(st, "res", w + 1) + decl(st, "bad", 1)
    items = []
    for o, c in sorted(zip(ops, codes), key=lambda x: x[1]):
        e = ALU_OPS[o]
        items.append(f"{ow}'d{c}: res = {{1'b0, {e}}};" if o not in ("ADD", "SUB", "INC", "DEC")
                     else f"{ow}'d{c}: res = {{1'b0, a}} {'+' if o in ('ADD', 'INC') else '-'} {'{1' + chr(39) + 'b0, b}' if o in ('ADD', 'SUB') else '1'};")
    opfun = "case (op)\n" + ind("\n".join(items), 2) + "\n  default: begin res = 0; bad = 1'b1; end\nendcase"
    body += comb(st, "res = 0;\nbad = 1'b0;\n" + opfun)
    outs = {"y": f"res[{w - 1}:0]", "illegal": "bad", "zero": f"(res[{w - 1}:0] == 0)", "carry": f"res[{w}]",
            "neg": f"res[{w - 1}]"}
    add = [c for o, c in zip(ops, codes) if o == "ADD"]
    sub = [c for o, c in zip(ops, codes) if o == "SUB"]
    ovf = []
    if add:
        ovf.append(f"(op == {ow}'d{add[0]} && a[{w - 1}] == b[{w - 1}] && res[{w - 1}] != a[{w - 1}])")
    if sub:
        ovf.append(f"(op == {ow}'d{sub[0]} && a[{w - 1}] != b[{w - 1}] && res[{w - 1}] != a[{w - 1}])")
    outs["ovf"] = " || ".join(ovf) if ovf else "1'b0"
    names = ["y", "illegal"] + flags
    if regd:
        body += seq(st, "\n".join(f"{n} <= 0;" for n in names), "if (valid_in) begin\n" + ind("\n".join(f"{n} <= {outs[n]};" for n in names), 2) + "\nend")
    else:
        body += comb(st, "\n".join(f"{n} = {outs[n]};" for n in names))
    if "ovf" in flags and not ovf:
        ports[:] = [p for p in ports if p["name"] != "ovf"]
        body = body.replace("ovf <= 0;\n", "").replace("ovf <= 1'b0;\n", "").replace("ovf = 1'b0;\n", "")
        body = re.sub(r"\n\s*ovf (<=|=) 1'b0;", "", body)
        flags.remove("ovf")
    table = ", ".join(f"{c}={o}" for o, c in sorted(zip(ops, codes), key=lambda x: x[1]))
    return {"module": pick_name(rng, ["alu", "simple_alu", "alu_core", "exec_unit"]),
            "ports": ports, "body": body, "st": st, "deep": 0,
            "overview": f"A {w}-bit ALU with a {ow}-bit opcode.",
            "behaviour": [f"Opcode table: {table}. Other opcodes give y = 0 and `illegal` = 1.",
                          "Shifts and rotates move by one bit; MIN/MAX/SLT compare unsigned."]
            + ([f"Flags: {', '.join(flags)}."] if flags else []) + (["Outputs update only on `valid_in`."] if regd else []),
            "reset": "all outputs 0.",
            "corner": ["Every opcode, including the illegal ones.", "Carry out and signed overflow." if flags else "All-ones operands."],
            "directed": ""}



def fam_priority_encoder(rng):
    """Combinational priority encoder: casez, if-chain or for-loop coding; LSB- or MSB-first."""
    st = style(rng)
    n = rng.randint(4, 12)
    iw = max(1, (n - 1).bit_length())
    msb, how, en = rng.random() < 0.5, rng.choice(["casez", "if", "loop"]), rng.random() < 0.4
    ports = [port("in_vec", "input", n, "Request bits.")] + ([port("en", "input", 1, "Enable; outputs are 0 when low.")] if en else [])
    ports += [port("idx", "output", iw, "Index of the winning bit.", proc=True), port("valid", "output", 1, "Some bit is set.", proc=True)]
    order = list(range(n - 1, -1, -1)) if msb else list(range(n))
    if how == "casez":
        items = []
        for c in order:
            pat = "".join("1" if b == c else ("?" if (b < c if msb else b > c) else "0") for b in range(n - 1, -1, -1))
            items.append(f"{n}'b{pat}: begin idx = {iw}'d{c}; valid = 1'b1; end")
        logic = "casez (in_vec)\n" + ind("\n".join(items), 2) + "\n  default: ;\nendcase"
    elif how == "if":
        logic = "\n".join(("if" if k == 0 else "else if") + f" (in_vec[{c}]) begin idx = {iw}'d{c}; valid = 1'b1; end"
                          for k, c in enumerate(order))
    else:
        rng_ = f"i = 0; i < {n}; i = i + 1" if msb else f"i = {n - 1}; i >= 0; i = i - 1"
        logic = f"for ({rng_}) begin\n  if (in_vec[i]) begin\n    idx = i[{iw - 1}:0];\n    valid = 1'b1;\n  end\nend"
    pre = f"idx = {iw}'d0;\nvalid = 1'b0;\n"
    body = "  integer i;\n" if how == "loop" else ""
    body += comb(st, pre + (f"if (en) begin\n{ind(logic, 2)}\nend" if en else logic))
    return {"module": pick_name(rng, ["priority_encoder", "prio_enc", "first_one"]),
            "ports": ports, "body": body, "st": st, "deep": 0,
            "overview": f"A {n}-input priority encoder; the {'highest' if msb else 'lowest'} set bit wins.",
            "behaviour": ["`idx` is the index of the winning set bit; `valid` is 0 (and idx 0) when no bit is set."]
            + (["With `en` low both outputs are 0."] if en else []),
            "reset": "", "corner": ["No bit set.", "Only the lowest-priority bit set.", "All bits set."], "directed": ""}


SEG7 = [0x3F, 0x06, 0x5B, 0x4F, 0x66, 0x6D, 0x7D, 0x07, 0x7F, 0x6F, 0x77, 0x7C, 0x39, 0x5E, 0x79, 0x71]


def fam_decoder(rng):
    """Decoders: binary to one-hot (case or shift), hex to 7-segment, or thermometer; enable/active-low."""
    st = style(rng)
    kind = rng.choice(["onehot", "onehot", "seg7", "thermo"])
    en, low = rng.random() < 0.6, rng.random() < 0.3
    n = rng.randint(2, 4) if kind != "seg7" else 4
    ow = {"onehot": 2 ** n, "seg7": 7, "thermo": 2 ** n - 1}[kind]
    ports = [port("sel", "input", n, "Code to decode.")] + ([port("en", "input", 1, "Enable.")] if en else [])
    ports += [port("y", "output", ow, "Decoded output" + (" (active-low)." if low else "."), proc=True)]
    if kind == "onehot" and rng.random() < 0.5:
        logic = f"dec = {ow}'d1 << sel;"
        desc = "One-hot: bit `sel` of y is set."
    elif kind == "onehot":
        logic = "case (sel)\n" + ind("\n".join(f"{n}'d{i}: dec = {ow}'d{1 << i};" for i in range(2 ** n)), 2) + "\n  default: dec = 0;\nendcase"
        desc = "One-hot: bit `sel` of y is set."
    elif kind == "seg7":
        logic = "case (sel)\n" + ind("\n".join(f"4'h{i:X}: dec = 7'h{SEG7[i]:02X};" for i in range(16)), 2) + "\n  default: dec = 7'h00;\nendcase"
        desc = "Hex digit to 7-segment pattern, bit 0 = segment a ... bit 6 = segment g (standard hex font)."
    else:
        logic = "case (sel)\n" + ind("\n".join(f"{n}'d{i}: dec = {ow}'d{(1 << i) - 1};" for i in range(2 ** n)), 2) + "\n  default: dec = 0;\nendcase"
        desc = "Thermometer: the lowest `sel` bits of y are set."
    body = decl(st, "dec", ow)
    body += comb(st, f"dec = 0;\n" + (f"if (en) begin\n{ind(logic, 2)}\nend" if en else logic))
    body += comb(st, "y = ~dec;" if low else "y = dec;")
    return {"module": pick_name(rng, ["decoder", f"dec{n}to{ow}", "seg7_decoder" if kind == "seg7" else "code_decoder"]),
            "ports": ports, "body": body, "st": st, "deep": 0,
            "overview": f"A combinational {kind} decoder from {n} bits to {ow} bits.",
            "behaviour": [desc] + (["With `en` low every output is inactive."] if en else [])
            + (["Outputs are active-low (inverted)."] if low else []),
            "reset": "", "corner": ["Every input code.", "Enable low."], "directed": ""}


def fam_barrel_shifter(rng):
    """Barrel shifter with a random subset of shift/rotate ops, saturating odd widths, optional output register."""
    st = style(rng)
    w = rng.choice([8, 8, 16, 12, 6])
    sw = (w - 1).bit_length()
    ops = rng.sample(["SLL", "SRL", "SRA", "ROL", "ROR"], rng.randint(2, 5))
    ow = max(1, (len(ops) - 1).bit_length())
    regd = rng.random() < 0.4
    ports = (clk_rst(st) if regd else []) + [port("din", "input", w, "Data in."), port("shamt", "input", sw, "Shift amount.")]
    if len(ops) > 1:
        ports.append(port("op", "input", ow, "Operation: " + ", ".join(f"{i}={o}" for i, o in enumerate(ops)) + "."))
    ports.append(port("dout", "output", w, "Shifted data" + (" (registered)." if regd else "."), proc=True))
    expr = {"SLL": "din << shamt", "SRL": "din >> shamt", "SRA": "$signed(din) >>> shamt",
            "ROL": f"(din << shamt) | (din >> ({w} - shamt))", "ROR": f"(din >> shamt) | (din << ({w} - shamt))"}
    body = decl(st, "res", w)
    if len(ops) == 1:
        logic = f"res = {expr[ops[0]]};"
    else:
        logic = "case (op)\n" + ind("\n".join(f"{ow}'d{i}: res = {expr[o]};" for i, o in enumerate(ops)), 2) + "\n  default: res = din;\nendcase"
    if w & (w - 1):   # not a power of two: large shift amounts saturate
        logic = f"if (shamt >= {sw}'d{w}) res = 0;\nelse begin\n{ind(logic, 2)}\nend"
    body += comb(st, "res = din;\n" + logic)
    body += seq(st, "dout <= 0;", "dout <= res;") if regd else comb(st, "dout = res;")
    return {"module": pick_name(rng, ["barrel_shifter", "shift_unit", "rotator"]),
            "ports": ports, "body": body, "st": st, "deep": 0,
            "overview": f"A {w}-bit barrel shifter supporting {', '.join(ops)}.",
            "behaviour": ["SLL/SRL shift in zeros, SRA replicates the sign bit, ROL/ROR rotate."]
            + ([f"Shift amounts >= {w} give 0."] if w & (w - 1) else []),
            "reset": "dout = 0.", "corner": ["Shift by 0 and by the maximum amount.", "Negative values for SRA."], "directed": ""}


def fam_comparator(rng):
    """Magnitude comparator: unsigned/signed (by input), optional cascade inputs, assign or if-chain."""
    st = style(rng)
    w = rng.randint(4, 12)
    sgn, casc, how = rng.random() < 0.5, rng.random() < 0.4, rng.choice(["assign", "if"])
    ports = [port("a", "input", w, "Operand A."), port("b", "input", w, "Operand B.")]
    if sgn:
        ports.append(port("is_signed", "input", 1, "Compare as two's complement when high."))
    if casc:
        ports += [port("in_lt", "input", 1, "Cascade: lower stage says less."), port("in_gt", "input", 1, "Cascade: lower stage says greater.")]
    ports += [port("eq", "output", 1, "a == b (and cascade equal).", proc=how == "if"),
              port("lt", "output", 1, "a < b.", proc=how == "if"), port("gt", "output", 1, "a > b.", proc=how == "if")]
    body = decl(st, "lt_raw", 1, proc=False) + decl(st, "gt_raw", 1, proc=False)
    if sgn:
        body += "  assign lt_raw = is_signed ? ($signed(a) < $signed(b)) : (a < b);\n"
        body += "  assign gt_raw = is_signed ? ($signed(a) > $signed(b)) : (a > b);\n"
    else:
        body += "  assign lt_raw = (a < b);\n  assign gt_raw = (a > b);\n"
    if how == "assign":
        if casc:
            body += "  assign lt = lt_raw || (a == b && in_lt && !in_gt);\n  assign gt = gt_raw || (a == b && in_gt && !in_lt);\n"
            body += "  assign eq = (a == b) && !(in_lt ^ in_gt);\n"
        else:
            body += "  assign lt = lt_raw;\n  assign gt = gt_raw;\n  assign eq = !(lt_raw || gt_raw);\n"
    else:
        tail = ("else if (in_lt && !in_gt) lt = 1'b1;\nelse if (in_gt && !in_lt) gt = 1'b1;\nelse eq = 1'b1;"
                if casc else "else eq = 1'b1;")
        body += comb(st, "eq = 1'b0;\nlt = 1'b0;\ngt = 1'b0;\nif (lt_raw) lt = 1'b1;\nelse if (gt_raw) gt = 1'b1;\n" + tail)
    return {"module": pick_name(rng, ["comparator", "mag_compare", "cmp_unit"]),
            "ports": ports, "body": body, "st": st, "deep": 0,
            "overview": f"A {w}-bit magnitude comparator.",
            "behaviour": ["Exactly one of eq/lt/gt is high."]
            + (["`is_signed` selects two's complement comparison."] if sgn else [])
            + (["When a == b the cascade inputs decide: in_lt only -> lt, in_gt only -> gt, otherwise eq."] if casc else []),
            "reset": "", "corner": ["a == b (rare with random values).", "Signed vs unsigned disagreement." if sgn else "Extreme values."],
            "directed": ""}


def fam_gray_counter(rng):
    """Gray-code counter: binary register with gray output, or a gray register with decode/encode."""
    st = style(rng)
    w = rng.randint(3, 8)
    how, en, updown = rng.choice(["bin", "gray"]), rng.random() < 0.6, rng.random() < 0.4
    ports = clk_rst(st) + ([port("en", "input", 1, "Count enable.")] if en else []) + ([port("up", "input", 1, "1 up, 0 down.")] if updown else [])
    ports += [port("gray", "output", w, "Gray-coded count.", proc=how == "gray"), port("bin_out", "output", w, "Binary count.", proc=how == "bin")]
    step = "bin_out + 1'b1" if not updown else "up ? bin_out + 1'b1 : bin_out - 1'b1"
    if how == "bin":
        body = seq(st, "bin_out <= 0;", f"if (en) bin_out <= {step};" if en else f"bin_out <= {step};")
        body += "  assign gray = bin_out ^ (bin_out >> 1);\n"
    else:
        body = "  integer i;\n" + decl(st, "nxt_bin", w)
        body += comb(st, f"bin_out = 0;\nbin_out[{w - 1}] = gray[{w - 1}];\nfor (i = {w - 2}; i >= 0; i = i - 1) bin_out[i] = bin_out[i + 1] ^ gray[i];")
        body += f"  assign nxt_bin = {step};\n"
        upd = "gray <= nxt_bin ^ (nxt_bin >> 1);"
        body += seq(st, "gray <= 0;", f"if (en) {upd}" if en else upd)
        ports[-1]["proc"] = True
        body = body.replace(decl(st, "nxt_bin", w), decl(st, "nxt_bin", w, proc=False))
    return {"module": pick_name(rng, ["gray_counter", "gray_cnt", "graycode_counter"]),
            "ports": ports, "body": body, "st": st, "deep": 1 if w >= 7 else 0,
            "overview": f"A {w}-bit Gray-code counter.",
            "behaviour": ["Consecutive `gray` values differ in exactly one bit; `bin_out` is the binary equivalent.",
                          "The count wraps at 2^W."] + (["It counts only while `en` is high."] if en else []),
            "reset": "count = 0.", "corner": ["Wrap-around from the last code to 0.", "Direction change." if updown else "Long enabled runs."],
            "directed": ""}



def fam_debouncer(rng):
    """Debouncer: counter style or 4-state FSM style, optional synchronizer and edge pulses."""
    st = style(rng)
    n = rng.randint(3, 15)
    cw = n.bit_length()
    sync, pulses, how = rng.random() < 0.5, rng.random() < 0.6, rng.choice(["counter", "fsm"])
    ports = clk_rst(st) + [port("noisy", "input", 1, "Bouncing input.")]
    ports += [port("clean", "output", 1, "Debounced level.", proc=True)]
    if pulses:
        ports += [port("rise", "output", 1, "One-cycle pulse when `clean` goes high.", proc=True),
                  port("fall", "output", 1, "One-cycle pulse when `clean` goes low.", proc=True)]
    body = decl(st, "cnt", cw)
    src = "noisy"
    if sync:
        body += decl(st, "sync_q", 2)
        body += seq(st, "sync_q <= 2'b00;", "sync_q <= {sync_q[0], noisy};")
        src = "sync_q[1]"
    pl = "\nrise <= 1'b0;\nfall <= 1'b0;" if pulses else ""
    if how == "counter":
        logic = (f"{pl.strip()}\nif ({src} == clean) cnt <= 0;\nelse if (cnt == {cw}'d{n - 1}) begin\n  cnt <= 0;\n  clean <= {src};\n"
                 + ("  if (" + src + ") rise <= 1'b1;\n  else fall <= 1'b1;\n" if pulses else "") + "end else cnt <= cnt + 1'b1;")
        body += seq(st, "cnt <= 0;\nclean <= 1'b0;" + pl, logic.strip())
    else:
        names = ["LOW", "WAIT_HIGH", "HIGH", "WAIT_LOW"]
        dcl, bits = fsm_decl(st, names, nxt=None)
        body = dcl + body
        fsm = f"""{pl.strip()}
case (state)
  LOW: begin
    cnt <= 0;
    if ({src}) state <= WAIT_HIGH;
  end
  WAIT_HIGH: begin
    if (!{src}) state <= LOW;
    else if (cnt == {cw}'d{n - 1}) begin
      state <= HIGH;
      clean <= 1'b1;{chr(10) + '      rise <= 1' + chr(39) + 'b1;' if pulses else ''}
    end else cnt <= cnt + 1'b1;
  end
  HIGH: begin
    cnt <= 0;
    if (!{src}) state <= WAIT_LOW;
  end
  WAIT_LOW: begin
    if ({src}) state <= HIGH;
    else if (cnt == {cw}'d{n - 1}) begin
      state <= LOW;
      clean <= 1'b0;{chr(10) + '      fall <= 1' + chr(39) + 'b1;' if pulses else ''}
    end else cnt <= cnt + 1'b1;
  end
{'  default: state <= LOW;' if st['default_arm'] else ''}
endcase"""
        body += seq(st, "state <= LOW;\ncnt <= 0;\nclean <= 1'b0;" + pl, fsm.strip())
    return {"module": pick_name(rng, ["debouncer", "debounce", "button_filter"]),
            "ports": ports, "body": body, "st": st, "deep": 1,
            "overview": f"A switch debouncer: the input must be stable for {n} cycles before `clean` follows it.",
            "behaviour": ["A change of the (synchronized) input that reverts before the count completes is ignored."]
            + (["`noisy` passes a 2-flop synchronizer first (2 cycles latency)."] if sync else []),
            "reset": "clean = 0.", "corner": [f"Input stable for exactly {n} cycles.", "Glitches shorter than the window."],
            "directed": f"    noisy = 1; repeat ({n + 6}) @(negedge clk);\n    noisy = 0; repeat ({n + 6}) @(negedge clk);\n"}


def fam_pwm(rng):
    """PWM generator: edge- or center-aligned, duty shadow register, polarity and period pulse options."""
    st = style(rng)
    w = rng.randint(3, 7)
    period = rng.randint(2 ** (w - 1), 2 ** w - 1)
    center, shadow, pol, en = rng.random() < 0.4, rng.random() < 0.5, rng.random() < 0.4, rng.random() < 0.6
    ports = clk_rst(st) + [port("duty", "input", w, "Duty value (compare level).")]
    ports += ([port("en", "input", 1, "Run enable; the counter holds while low.")] if en else []) + ([port("invert", "input", 1, "Invert the output.")] if pol else [])
    ports += [port("pwm_out", "output", 1, "PWM output."), port("period_end", "output", 1, "High on the last count of a period.")]
    body = f"  localparam [{w - 1}:0] PERIOD = {w}'d{period};\n" + decl(st, "cnt", w) + decl(st, "cmp", w)
    if center:
        body += decl(st, "down", 1)
        step = "if (!down) begin\n  if (cnt == PERIOD) down <= 1'b1;\n  else cnt <= cnt + 1'b1;\nend else begin\n  if (cnt == 0) down <= 1'b0;\n  else cnt <= cnt - 1'b1;\nend"
        body += seq(st, "cnt <= 0;\ndown <= 1'b0;", f"if (en) begin\n{ind(step, 2)}\nend" if en else step)
        pe = "down && cnt == 0"
    else:
        step = "if (cnt >= PERIOD) cnt <= 0;\nelse cnt <= cnt + 1'b1;"
        body += seq(st, "cnt <= 0;", f"if (en) begin\n{ind(step, 2)}\nend" if en else step)
        pe = "cnt >= PERIOD"
    body += decl(st, "pe", 1, proc=False) + f"  assign pe = ({pe});\n  assign period_end = pe;\n"
    if shadow:
        body += seq(st, "cmp <= 0;", "if (pe) cmp <= duty;")
    else:
        body = body.replace(decl(st, "cmp", w), "") + decl(st, "cmp", w, proc=False) + "  assign cmp = duty;\n"
    raw = "(cmp != 0) && (cmp > PERIOD || cnt < cmp)"
    body += f"  assign pwm_out = {'invert ^ (' + raw + ')' if pol else raw};\n"
    return {"module": pick_name(rng, ["pwm", "pwm_gen", "pwm_core"]),
            "ports": ports, "body": body, "st": st, "deep": 1,
            "overview": f"A {'center' if center else 'edge'}-aligned PWM generator with period {period + 1} counts.",
            "behaviour": ["`pwm_out` is high while the counter is below the compare value; duty 0 gives constant low and duty above PERIOD constant high."]
            + (["`duty` is copied into the compare register only at the end of a period."] if shadow else []),
            "reset": "counter 0" + (", compare 0." if shadow else "."),
            "corner": ["duty = 0 and duty > PERIOD.", "Changing duty mid-period." if shadow else "Counter reaching PERIOD."],
            "directed": ""}


def fam_clock_divider(rng):
    """Clock divider producing an enable pulse and a divided square wave; fixed or programmable."""
    st = style(rng)
    prog = rng.random() < 0.5
    div = rng.randint(2, 12)
    dw = 4 if prog else div.bit_length()
    ports = clk_rst(st) + ([port("div", "input", dw, "Divide ratio; 0 and 1 mean no division.")] if prog else [])
    ports += [port("tick", "output", 1, "One-cycle pulse every N input clocks.", proc=True), port("clk_out", "output", 1, "Divided clock (toggles on each tick).", proc=True)]
    lim = f"div - 1'b1" if prog else f"{dw}'d{div - 1}"
    body = decl(st, "cnt", dw)
    logic = f"tick <= 1'b0;\nif (cnt >= {lim}) begin\n  cnt <= 0;\n  tick <= 1'b1;\n  clk_out <= ~clk_out;\nend else cnt <= cnt + 1'b1;"
    if prog:
        logic = f"if (div < {dw}'d2) begin\n  cnt <= 0;\n  tick <= 1'b1;\n  clk_out <= ~clk_out;\nend else begin\n{ind(logic, 2)}\nend"
    body += seq(st, "cnt <= 0;\ntick <= 1'b0;\nclk_out <= 1'b0;", logic)
    return {"module": pick_name(rng, ["clock_divider", "clk_div", "freq_divider"]),
            "ports": ports, "body": body, "st": st, "deep": 0,
            "overview": "A clock divider built from a counter on the input clock" + (" with a programmable ratio." if prog else f", ratio {div}."),
            "behaviour": ["`tick` pulses once every N clocks and `clk_out` toggles on each tick (period 2N)."]
            + (["A ratio of 0 or 1 gives a tick every cycle."] if prog else []),
            "reset": "counter 0, clk_out 0.", "corner": ["Ratio changes mid-count." if prog else "Full count cycle."], "directed": ""}


def fam_edge_detector(rng):
    """Edge detector over 1..4 signals: rise/fall/both (fixed or selected), synchronizer, edge counter."""
    st = style(rng)
    n = rng.randint(1, 4)
    mode_in, sync, count = rng.random() < 0.5, rng.random() < 0.4, rng.random() < 0.5
    kind = rng.choice(["rise", "fall", "both"])
    ports = clk_rst(st) + [port("sig", "input", n, "Input signal(s).")] + ([port("mode", "input", 2, "0 rising, 1 falling, 2 both, 3 none.")] if mode_in else [])
    ports += [port("pulse", "output", n, "One-cycle pulse per detected edge.", proc=True)]
    if count:
        ports.append(port("edges", "output", 4, "Saturating count of cycles with any edge.", proc=True))
    body = decl(st, "prev", n) + decl(st, "cur", n)
    if sync:
        body += decl(st, "s1", n) + seq(st, "s1 <= 0;\ncur <= 0;", "s1 <= sig;\ncur <= s1;")
    else:
        body = body.replace(decl(st, "cur", n), decl(st, "cur", n, proc=False)) + "  assign cur = sig;\n"
    body += decl(st, "det", n)
    e = {"rise": "cur & ~prev", "fall": "~cur & prev", "both": "cur ^ prev"}
    if mode_in:
        body += comb(st, f"case (mode)\n  2'd0: det = {e['rise']};\n  2'd1: det = {e['fall']};\n  2'd2: det = {e['both']};\n  default: det = 0;\nendcase")
    else:
        body += comb(st, f"det = {e[kind]};")
    upd = "prev <= cur;\npulse <= det;" + ("\nif (det != 0 && edges != 4'd15) edges <= edges + 1'b1;" if count else "")
    body += seq(st, "prev <= 0;\npulse <= 0;" + ("\nedges <= 0;" if count else ""), upd)
    return {"module": pick_name(rng, ["edge_detector", "edge_det", "transition_detect"]),
            "ports": ports, "body": body, "st": st, "deep": 0,
            "overview": f"Detects {'selected' if mode_in else kind} edges on {n} signal(s).",
            "behaviour": ["`pulse` is registered: it is high the cycle after the edge is seen."]
            + (["Inputs pass a 2-flop synchronizer."] if sync else []) + (["`edges` saturates at 15."] if count else []),
            "reset": "pulse = 0" + (", edges = 0." if count else "."), "corner": ["Edges on all bits at once.", "Counter saturation." if count else "Both edge directions."],
            "directed": ""}


def fam_register_file(rng):
    """Register file: 1 write port, 1-2 combinational read ports, optional zero register and bypass."""
    st = style(rng)
    nreg, w = rng.choice([4, 8, 16]), rng.randint(4, 16)
    aw = (nreg - 1).bit_length()
    two, zero, bypass = rng.random() < 0.6, rng.random() < 0.5, rng.random() < 0.4
    ports = clk_rst(st) + [port("we", "input", 1, "Write enable."), port("waddr", "input", aw, "Write address."),
                           port("wdata", "input", w, "Write data."), port("raddr_a", "input", aw, "Read address A.")]
    if two:
        ports.append(port("raddr_b", "input", aw, "Read address B."))
    ports += [port("rdata_a", "output", w, "Read data A.", proc=True)] + ([port("rdata_b", "output", w, "Read data B.", proc=True)] if two else [])
    body = "  integer i;\n" + decl(st, "regs", w, arr=f" [0:{nreg - 1}]")
    wcond = "we && waddr != 0" if zero else "we"
    body += seq(st, f"for (i = 0; i < {nreg}; i = i + 1) regs[i] <= 0;", f"if ({wcond}) regs[waddr] <= wdata;")
    for port_ in (["a", "b"] if two else ["a"]):
        logic = f"rdata_{port_} = regs[raddr_{port_}];"
        if bypass:
            logic = f"if ({wcond} && waddr == raddr_{port_}) rdata_{port_} = wdata;\nelse " + logic
        if zero:
            logic = f"if (raddr_{port_} == 0) rdata_{port_} = 0;\nelse " + logic
        body += comb(st, logic)
    return {"module": pick_name(rng, ["register_file", "regfile", "reg_bank"]),
            "ports": ports, "body": body, "st": st, "deep": 0,
            "overview": f"A register file of {nreg} x {w}-bit registers.",
            "behaviour": ["Writes happen on the clock edge when `we` is high; reads are combinational."]
            + (["Register 0 always reads 0 and ignores writes."] if zero else []) + (["A read of the register being written returns `wdata` (bypass)."] if bypass else []),
            "reset": "all registers 0.", "corner": ["Read and write of the same address.", "Register 0." if zero else "Every register written."],
            "directed": ""}


def fam_stack(rng):
    """LIFO stack with full/empty, sticky errors and an optional push-while-pop replace."""
    st = style(rng)
    depth, w = rng.choice([4, 5, 6, 8]), rng.randint(4, 12)
    pw = depth.bit_length()
    errs, replace = rng.random() < 0.6, rng.random() < 0.5
    ports = clk_rst(st) + [port("push", "input", 1, "Push `din`."), port("pop", "input", 1, "Pop the top."), port("din", "input", w, "Data to push.")]
    ports += [port("top", "output", w, "Top of stack (0 when empty)."), port("full", "output", 1, "Stack is full."),
              port("empty", "output", 1, "Stack is empty."), port("level", "output", pw, "Number of entries.", proc=True)]
    if errs:
        ports.append(port("error", "output", 1, "Sticky: push when full or pop when empty.", proc=True))
    body = decl(st, "mem", w, arr=f" [0:{depth - 1}]")
    body += f"  assign full = (level == {pw}'d{depth});\n  assign empty = (level == 0);\n  assign top = empty ? {w}'d0 : mem[level - 1'b1];\n"
    chain = []
    if replace:
        chain.append(f"if (push && pop && !empty) begin\n  mem[level - 1'b1] <= din;\nend")
    chain.append(("else if" if chain else "if") + " (push && !full) begin\n  mem[level] <= din;\n  level <= level + 1'b1;\nend")
    chain.append("else if (pop && !empty) begin\n  level <= level - 1'b1;\nend")
    logic = "\n".join(chain)
    if errs:
        logic += "\nif ((push && full && !(pop && " + ("1'b1" if replace else "1'b0") + ")) || (pop && empty)) error <= 1'b1;"
    body += seq(st, "level <= 0;" + ("\nerror <= 1'b0;" if errs else ""), logic)
    return {"module": pick_name(rng, ["stack", "lifo", "lifo_stack"]),
            "ports": ports, "body": body, "st": st, "deep": 1,
            "overview": f"A LIFO stack of {depth} entries x {w} bits.",
            "behaviour": ["Push has priority over pop when both are requested" + (", except that push and pop together on a non-empty stack replace the top." if replace else "."),
                          "Pushes to a full stack and pops from an empty one are ignored."]
            + (["`error` is set by those ignored requests and stays set until reset."] if errs else []),
            "reset": "empty stack" + (", error 0." if errs else "."), "corner": ["Fill to full and push again.", "Pop when empty."], "directed": ""}



CRC_POLYS = [(4, 0x3), (5, 0x05), (8, 0x07), (8, 0x31), (16, 0x8005), (16, 0x1021)]


def fam_crc(rng):
    """CRC generator over 1/4/8 data bits per cycle, random polynomial/init, optional residue check."""
    st = style(rng)
    cw, poly = rng.choice(CRC_POLYS)
    dw = rng.choice([1, 4, 8])
    init = rng.choice([0, (1 << cw) - 1])
    check = cw <= 8 and rng.random() < 0.6
    target = rng.randint(0, (1 << cw) - 1)
    ports = clk_rst(st) + [port("clear", "input", 1, "Restart with the initial value."), port("valid", "input", 1, "`data` is consumed this cycle."),
                           port("data", "input", dw, f"{dw} data bit(s), MSB first.")]
    ports += [port("crc", "output", cw, "Current CRC register.", proc=True)]
    if check:
        ports.append(port("match", "output", 1, f"CRC register equals {cw}'h{target:X}."))
    body = "  integer i;\n" + decl(st, "nxt", cw) + decl(st, "fb", 1)
    loop = (f"nxt = crc;\nfor (i = {dw - 1}; i >= 0; i = i - 1) begin\n  fb = nxt[{cw - 1}] ^ data[i];\n"
            f"  nxt = {{nxt[{cw - 2}:0], 1'b0}};\n  if (fb) nxt = nxt ^ {cw}'h{poly:X};\nend") if dw > 1 else \
        (f"fb = crc[{cw - 1}] ^ data;\nnxt = {{crc[{cw - 2}:0], 1'b0}};\nif (fb) nxt = nxt ^ {cw}'h{poly:X};")
    body += comb(st, loop)
    if dw == 1:
        body = body.replace("  integer i;\n", "")
    body += seq(st, f"crc <= {cw}'h{init:X};", f"if (clear) crc <= {cw}'h{init:X};\nelse if (valid) crc <= nxt;")
    if check:
        body += f"  assign match = (crc == {cw}'h{target:X});\n"
    return {"module": pick_name(rng, ["crc_gen", f"crc{cw}", "crc_calc"]),
            "ports": ports, "body": body, "st": st, "deep": 0,
            "overview": f"A CRC-{cw} calculator, polynomial {cw}'h{poly:X} (implicit top bit), {dw} bit(s) per cycle.",
            "behaviour": [f"Each valid cycle the register absorbs the data bits MSB first (shift left, XOR the polynomial when the bit shifted out differs from the data bit).",
                          f"Initial value {cw}'h{init:X}; `clear` restarts."],
            "reset": f"crc = {cw}'h{init:X}.", "corner": ["`clear` and `valid` together.", "Reaching the match value." if check else "Long messages."],
            "directed": ""}


def fam_parity(rng):
    """Parity generator/checker: even/odd by parameter or input, optional error counter."""
    st = style(rng)
    w = rng.randint(4, 16)
    odd_in, counter = rng.random() < 0.5, rng.random() < 0.5
    odd = rng.random() < 0.5
    ports = (clk_rst(st) if counter else []) + [port("data", "input", w, "Data word."), port("rx_parity", "input", 1, "Received parity bit to check.")]
    if odd_in:
        ports.append(port("odd", "input", 1, "1 selects odd parity, 0 even."))
    ports += [port("parity", "output", 1, "Generated parity bit."), port("err", "output", 1, "rx_parity differs from the generated bit.")]
    if counter:
        ports.append(port("err_count", "output", 3, "Saturating count of cycles with `err`.", proc=True))
    body = f"  assign parity = (^data) ^ {'odd' if odd_in else ('1' + chr(39) + 'b1' if odd else '1' + chr(39) + 'b0')};\n"
    body += "  assign err = (parity != rx_parity);\n"
    if counter:
        body += seq(st, "err_count <= 0;", "if (err && err_count != 3'd7) err_count <= err_count + 1'b1;")
    return {"module": pick_name(rng, ["parity_gen", "parity_checker", "parity_unit"]),
            "ports": ports, "body": body, "st": st, "deep": 0,
            "overview": f"A {w}-bit parity generator and checker ({'selectable' if odd_in else ('odd' if odd else 'even')} parity).",
            "behaviour": ["`parity` makes the total number of ones (data + parity) even (or odd for odd parity).", "`err` flags a received parity bit that differs."]
            + (["`err_count` counts error cycles and saturates at 7."] if counter else []),
            "reset": "err_count = 0.", "corner": ["Both parity settings." if odd_in else "All-zero and all-one data."], "directed": ""}


def fam_bcd_counter(rng):
    """Multi-digit BCD counter with enable, optional down-count and clear, digit-carry cascade."""
    st = style(rng)
    nd = rng.choice([2, 2, 3])
    down, clr = rng.random() < 0.4, rng.random() < 0.5
    ports = clk_rst(st) + [port("en", "input", 1, "Count enable.")] + ([port("down", "input", 1, "Count down when high.")] if down else []) \
        + ([port("clr", "input", 1, "Synchronous clear.")] if clr else [])
    ports += [port(f"d{i}", "output", 4, f"Digit {i} ({'ones' if i == 0 else 10 ** i})", proc=True) for i in range(nd)]
    ports.append(port("carry", "output", 1, "High on the cycle the counter wraps."))
    up_lines, dn_lines = [], []
    for i in range(nd):
        cond_up = " && ".join(f"d{j} == 4'd9" for j in range(i)) or "1'b1"
        cond_dn = " && ".join(f"d{j} == 4'd0" for j in range(i)) or "1'b1"
        up_lines.append(f"if ({cond_up}) begin\n  if (d{i} == 4'd9) d{i} <= 4'd0;\n  else d{i} <= d{i} + 1'b1;\nend")
        dn_lines.append(f"if ({cond_dn}) begin\n  if (d{i} == 4'd0) d{i} <= 4'd9;\n  else d{i} <= d{i} - 1'b1;\nend")
    logic = "\n".join(up_lines)
    if down:
        logic = f"if (down) begin\n{ind(chr(10).join(dn_lines), 2)}\nend else begin\n{ind(logic, 2)}\nend"
    logic = f"if (en) begin\n{ind(logic, 2)}\nend"
    if clr:
        logic = "if (clr) begin\n" + ind("\n".join(f"d{i} <= 4'd0;" for i in range(nd)), 2) + "\nend else " + logic
    body = seq(st, "\n".join(f"d{i} <= 4'd0;" for i in range(nd)), logic)
    allnine = " && ".join(f"d{i} == 4'd9" for i in range(nd))
    allzero = " && ".join(f"d{i} == 4'd0" for i in range(nd))
    body += f"  assign carry = en && ({f'down ? ({allzero}) : ({allnine})' if down else allnine});\n"
    return {"module": pick_name(rng, ["bcd_counter", "decimal_counter", "bcd_cnt"]),
            "ports": ports, "body": body, "st": st, "deep": 2 if nd == 3 else 1,
            "overview": f"A {nd}-digit BCD counter (0 .. {10 ** nd - 1}).",
            "behaviour": ["Each digit counts 0..9; a digit advances when all lower digits wrap."]
            + (["`down` counts down, wrapping 0 -> all nines."] if down else []) + (["`clr` zeroes all digits."] if clr else []),
            "reset": "all digits 0.", "corner": [f"Wrap from {10 ** nd - 1} to 0 needs {10 ** nd} enabled cycles."],
            "directed": "    en = 1;" + (" down = 0;" if down else "") + (" clr = 0;" if clr else "") + f"\n    repeat ({10 ** nd + 5}) @(negedge clk);\n"
            + (f"    down = 1; repeat ({10 ** nd + 5}) @(negedge clk);\n" if down else "")}


def fam_timer(rng):
    """Programmable timer: prescaler, compare value, one-shot/periodic, sticky interrupt with clear."""
    st = style(rng)
    pre = rng.randint(1, 6)
    w = rng.randint(4, 7)
    periodic_in = rng.random() < 0.5
    ports = clk_rst(st) + [port("start", "input", 1, "Start (or restart) the timer."), port("stop", "input", 1, "Stop the timer."),
                           port("cmp_val", "input", w, "Compare value, sampled at start."), port("irq_clr", "input", 1, "Clear the interrupt.")]
    if periodic_in:
        ports.append(port("periodic", "input", 1, "1: reload and continue after expiry; 0: one-shot."))
    ports += [port("running", "output", 1, "Timer is counting.", proc=True), port("count", "output", w, "Current count.", proc=True),
              port("irq", "output", 1, "Sticky interrupt: set on expiry.", proc=True)]
    pw = max(1, pre.bit_length())
    body = decl(st, "psc", pw) + decl(st, "target", w) + decl(st, "tick", 1, proc=False)
    body += f"  assign tick = (psc == {pw}'d{pre});\n"
    body += seq(st, "psc <= 0;", f"if (!running || tick) psc <= 0;\nelse psc <= psc + 1'b1;")
    per = "periodic" if periodic_in else ("1'b1" if rng.random() < 0.5 else "1'b0")
    logic = f"""if (irq_clr) irq <= 1'b0;
if (start) begin
  running <= 1'b1;
  count <= 0;
  target <= cmp_val;
end else if (stop) begin
  running <= 1'b0;
end else if (running && tick) begin
  if (count >= target) begin
    irq <= 1'b1;
    count <= 0;
    if (!({per})) running <= 1'b0;
  end else count <= count + 1'b1;
end"""
    body += seq(st, "running <= 1'b0;\ncount <= 0;\ntarget <= 0;\nirq <= 1'b0;", logic)
    return {"module": pick_name(rng, ["timer", "prog_timer", "interval_timer"]),
            "ports": ports, "body": body, "st": st, "deep": 1,
            "overview": f"A programmable timer with a divide-by-{pre + 1} prescaler.",
            "behaviour": ["`start` loads the compare value and starts counting; `stop` halts.",
                          f"The count advances once every {pre + 1} clocks; when it reaches the compare value `irq` is set and the count restarts.",
                          "In one-shot mode the timer stops after expiry." + (" `periodic` selects the mode." if periodic_in else f" This instance is {'periodic' if per == chr(49) + chr(39) + 'b1' else 'one-shot'}."),
                          "`irq` stays set until `irq_clr`; expiry wins over a simultaneous clear."],
            "reset": "stopped, count 0, irq 0.", "corner": ["Compare value 0.", "Start while running.", "Expiry in periodic mode." if periodic_in else "Expiry."],
            "directed": f"    start = 1; stop = 0; irq_clr = 0; cmp_val = {2 ** w - 1}; @(negedge clk); start = 0;\n    repeat ({(2 ** w + 2) * (pre + 1)}) @(negedge clk);\n"}


def fam_pipe_stage(rng):
    """Valid/ready pipeline register: simple half-rate stage or full-rate skid buffer, optional transform."""
    st = style(rng)
    w = rng.randint(4, 16)
    skid = rng.random() < 0.5
    xf = rng.choice(["none", "add", "xor"])
    k = rng.randint(1, 2 ** min(w, 8) - 1)
    ports = clk_rst(st) + [port("in_valid", "input", 1, "Upstream data valid."), port("in_data", "input", w, "Upstream data."),
                           port("out_ready", "input", 1, "Downstream ready.")]
    ports += [port("in_ready", "output", 1, "This stage can accept data."), port("out_valid", "output", 1, "Output data valid.", proc=True),
              port("out_data", "output", w, "Output data.", proc=True)]
    f = {"none": "in_data", "add": f"in_data + {w}'d{k}", "xor": f"in_data ^ {w}'d{k}"}[xf]
    body = decl(st, "f_data", w, proc=False) + f"  assign f_data = {f};\n"
    if not skid:
        body += "  assign in_ready = !out_valid || out_ready;\n"
        body += seq(st, "out_valid <= 1'b0;\nout_data <= 0;",
                    "if (in_ready) begin\n  out_valid <= in_valid;\n  if (in_valid) out_data <= f_data;\nend")
    else:
        body += decl(st, "skid_valid", 1) + decl(st, "skid_data", w)
        body += "  assign in_ready = !skid_valid;\n"
        logic = """if (out_valid && !out_ready) begin
  if (in_valid && in_ready) begin
    skid_valid <= 1'b1;
    skid_data <= f_data;
  end
end else begin
  if (skid_valid) begin
    out_data <= skid_data;
    out_valid <= 1'b1;
    skid_valid <= 1'b0;
  end else begin
    out_valid <= in_valid;
    if (in_valid) out_data <= f_data;
  end
end"""
        body += seq(st, "out_valid <= 1'b0;\nout_data <= 0;\nskid_valid <= 1'b0;\nskid_data <= 0;", logic)
    return {"module": pick_name(rng, ["pipe_stage", "reg_slice", "skid_buffer" if skid else "pipe_reg"]),
            "ports": ports, "body": body, "st": st, "deep": 0,
            "overview": f"A valid/ready pipeline {'skid buffer' if skid else 'register stage'} for {w}-bit data.",
            "behaviour": ["A transfer happens on a cycle where valid and ready are both high (each side).",
                          {"none": "Data passes unchanged.", "add": f"Data is incremented by {k}.", "xor": f"Data is XORed with {k}."}[xf]]
            + (["When downstream stalls with a word in flight, one extra word is parked in the skid register and `in_ready` drops."] if skid else ["`in_ready` is high when the output register is empty or being drained."]),
            "reset": "no valid data.", "corner": ["Downstream stall with upstream valid.", "Back-to-back transfers."], "directed": ""}


def fam_mem_handshake(rng):
    """Memory-controller-like request/acknowledge FSM: address check, wait for ack with timeout, bursts."""
    st = style(rng)
    aw, dw = rng.randint(4, 8), rng.randint(4, 8)
    limit = rng.randint(2 ** (aw - 1), 2 ** aw - 1)
    tmo = rng.randint(3, 8)
    burst = rng.random() < 0.5
    names = ["IDLE", "REQ", "WAIT_ACK", "DONE", "ERROR"] + (["NEXT"] if burst else [])
    ports = clk_rst(st) + [port("cmd_valid", "input", 1, "Command request."), port("cmd_write", "input", 1, "1 write, 0 read."),
                           port("cmd_addr", "input", aw, "Address."), port("cmd_wdata", "input", dw, "Write data."),
                           port("mem_ack", "input", 1, "Memory acknowledge."), port("mem_rdata", "input", dw, "Memory read data.")]
    if burst:
        ports.append(port("cmd_len", "input", 2, "Burst length minus one."))
    ports += [port("mem_req", "output", 1, "Request to memory."), port("mem_we", "output", 1, "Write strobe.", proc=True),
              port("mem_addr", "output", aw, "Memory address.", proc=True), port("mem_wdata", "output", dw, "Memory write data.", proc=True),
              port("rdata", "output", dw, "Captured read data.", proc=True), port("busy", "output", 1, "Command in progress."),
              port("done", "output", 1, "Command finished OK (one cycle)."), port("err", "output", 1, "Address out of range or ack timeout (one cycle).")]
    dcl, bits = fsm_decl(st, names, nxt=None)
    tw = tmo.bit_length()
    body = dcl + decl(st, "wcnt", tw) + (decl(st, "beats", 2) if burst else "")
    nxt = "if (beats != 0) state <= NEXT;\n      else state <= DONE;" if burst else "state <= DONE;"
    fsm = f"""case (state)
  IDLE: begin
    if (cmd_valid) begin
      mem_addr <= cmd_addr;
      mem_we <= cmd_write;
      mem_wdata <= cmd_wdata;{chr(10) + '      beats <= cmd_len;' if burst else ''}
      if (cmd_addr > {aw}'d{limit}) state <= ERROR;
      else state <= REQ;
    end
  end
  REQ: begin
    wcnt <= 0;
    state <= WAIT_ACK;
  end
  WAIT_ACK: begin
    if (mem_ack) begin
      if (!mem_we) rdata <= mem_rdata;
      {nxt}
    end else if (wcnt == {tw}'d{tmo}) state <= ERROR;
    else wcnt <= wcnt + 1'b1;
  end
{'''  NEXT: begin
    beats <= beats - 1'b1;
    mem_addr <= mem_addr + 1'b1;
    if (mem_addr >= ''' + f"{aw}'d{limit}" + ''') state <= ERROR;
    else state <= REQ;
  end
''' if burst else ''}  DONE: state <= IDLE;
  ERROR: state <= IDLE;
{'  default: state <= IDLE;' if st['default_arm'] else ''}
endcase"""
    body += seq(st, "state <= IDLE;\nwcnt <= 0;\nmem_we <= 1'b0;\nmem_addr <= 0;\nmem_wdata <= 0;\nrdata <= 0;" + ("\nbeats <= 0;" if burst else ""), fsm)
    body += "  assign mem_req = (state == REQ) || (state == WAIT_ACK);\n  assign busy = (state != IDLE);\n"
    body += "  assign done = (state == DONE);\n  assign err = (state == ERROR);\n"
    return {"module": pick_name(rng, ["mem_ctrl", "mem_handshake", "bus_master", "mem_if"]),
            "ports": ports, "body": body, "st": st, "deep": 1,
            "overview": "A memory-interface controller that turns commands into request/acknowledge transactions.",
            "behaviour": [f"Addresses above {limit} are rejected (ERROR for one cycle).",
                          f"After the request, `mem_ack` must arrive within {tmo + 1} cycles, else ERROR.",
                          "Read data is captured on the acknowledge of a read."]
            + (["`cmd_len` + 1 beats are transferred at consecutive addresses."] if burst else []),
            "reset": "IDLE, outputs 0.", "corner": ["Ack timeout.", "Out-of-range address.", "Burst crossing the address limit." if burst else "Read and write."],
            "directed": ""}


# ----------------------------------------------------------------------------------------------
# registry

FAMILIES = {
    "counter": fam_counter, "shift_reg": fam_shift_reg, "lfsr": fam_lfsr, "seq_detector": fam_seq_detector,
    "fsm_random": fam_fsm_random, "traffic_light": fam_traffic_light, "vending_machine": fam_vending_machine,
    "uart_tx": fam_uart_tx, "uart_rx": fam_uart_rx, "sync_fifo": fam_sync_fifo, "rr_arbiter": fam_rr_arbiter,
    "priority_arbiter": fam_priority_arbiter, "alu": fam_alu, "priority_encoder": fam_priority_encoder,
    "decoder": fam_decoder, "barrel_shifter": fam_barrel_shifter, "comparator": fam_comparator,
    "gray_counter": fam_gray_counter, "debouncer": fam_debouncer, "pwm": fam_pwm, "clock_divider": fam_clock_divider,
    "edge_detector": fam_edge_detector, "register_file": fam_register_file, "stack": fam_stack, "crc": fam_crc,
    "parity": fam_parity, "bcd_counter": fam_bcd_counter, "timer": fam_timer, "pipe_stage": fam_pipe_stage,
    "mem_handshake": fam_mem_handshake,
}
# held-out kinds of design: one FSM, one storage, one datapath, one combinational, one timing family
VAL_FAMILIES = ["vending_machine", "stack", "crc", "barrel_shifter", "pwm"]
