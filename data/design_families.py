"""Synthetic design families: parameterised RTL generators for training the testbench writer.

Each *family* is one function `fam_<name>(rng) -> design dict` that draws a random *structure* (FSM graphs
and state counts, opcode tables, optional features such as load/enable/saturate/error states, coding styles:
always_ff vs always @(posedge), logic vs reg, localparam vs typedef'd states, case vs if-chains, sync vs
async reset of either polarity), renders Icarus-11-clean SystemVerilog, writes an English spec (markdown:
ports table, behaviour, reset, corner cases) and may add directed stimulus that reaches its deep states.
This file holds the control families (counters, shift registers, LFSRs, sequence detectors, FSMs, UARTs, FIFOs,
arbiters) and the registry; data/datapath_families.py the datapath and small blocks. Both write RTL through
data/rtl_writer.py (style, header, seq, comb, decl, port, fsm_decl, fsm_logic, ...). data/designs.py turns a design
dict into a task row.

FAMILIES maps each name to its function; VAL_FAMILIES are held out of training, so validation measures
transfer to unseen kinds of design.

API: FAMILIES; VAL_FAMILIES; fam_<name>(rng) -> dict.
"""
import re

from data.rtl_writer import (
    style, ind, seq, comb, decl, port, clk_rst, fsm_decl, fsm_logic, pick_name)
from data.datapath_families import (
    fam_alu, fam_priority_encoder, fam_decoder, fam_barrel_shifter, fam_comparator, fam_gray_counter,
    fam_debouncer, fam_pwm, fam_clock_divider, fam_edge_detector, fam_register_file, fam_stack, fam_crc,
    fam_parity, fam_bcd_counter, fam_timer, fam_pipe_stage, fam_mem_handshake)


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
