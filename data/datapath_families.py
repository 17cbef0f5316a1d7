"""Synthetic design families, datapath and small blocks: ALU, encoders and decoders, shifters, comparators,
counters and timers, storage (register file, stack), CRC and parity, a pipeline stage and a memory handshake.

Each fam_<name>(rng) returns a design dict as described in data/design_families.py, which registers them in
FAMILIES beside the control families.
"""
import re

from data.rtl_writer import (
    style, ind, seq, comb, decl, port, clk_rst, fsm_decl, pick_name)


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
