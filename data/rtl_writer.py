"""Verilog-writing helpers the synthetic design families share (data/design_families.py, data/datapath_families.py).

A family draws a coding style once (style: process keywords, variable type, reset name, polarity and kind, FSM
coding) and writes its module through these helpers, so every family varies the same way: header (ports and
parameters), seq / comb (clocked and combinational processes in that style), decl, port, clk_rst, fsm_decl /
fsm_logic (state declaration and transitions), pick_name (the module name).
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
