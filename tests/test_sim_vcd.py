"""Cross-check: the scorer's toggle result (both backends: in-HDL monitors and the VPI module) agrees bit for
bit with an independent count taken from a VCD of tb.uut, dumped from the UN-instrumented design on the same testbench (docs/coverage.md §3.3).

The reference rules: the value at the end of time 0 is the starting value; a bit is covered iff it rose
0->1 and fell 1->0 between end-of-timestep values; transitions from/to x or z don't count. (The designs here
have no int/enum signals, which the VCD would include and the scorer excludes on purpose.)

Run: python -m pytest -q tests/test_sim_vcd.py
"""
import subprocess
from pathlib import Path

import pytest

import sim

DESIGNS = Path(__file__).resolve().parent / "designs"
CASES = [("counter.sv", "counter", "tb_counter.sv"), ("fsm.sv", "fsm", "tb_fsm.sv"),
         ("alu.sv", "alu", "tb_alu.sv"), ("sub_lane.sv", "gen_top", "tb_gen.sv"),
         ("andor.sv", "andor", "tb_andor.sv"),
         ("glitch.sv", "glitch", "tb_glitch.sv"),     # zero-time glitches (blocking and across the NBA region)
         ("counter.sv", "counter", "tb_counter_last.sv")]   # a change in the step that calls $finish
SCORED_VAR_TYPES = {"wire", "reg", "logic", "bit", "tri"}


def parse_vcd(text):
    """Tiny VCD reader -> {(scope path, name): (width, [end-of-timestep values...])}."""
    scopes, vars_by_id, series = [], {}, {}
    tokens = text.split()
    i, cur = 0, {}
    changed = set()

    def flush():
        for vid in changed:
            for key in vars_by_id[vid]:
                series[key][1].append(cur[vid])
        changed.clear()
    while i < len(tokens):
        t = tokens[i]
        if t == "$scope":
            scopes.append(tokens[i + 2])
            i += 4
        elif t == "$upscope":
            scopes.pop()
            i += 2
        elif t == "$var":
            vtype, width, vid, name = tokens[i + 1], int(tokens[i + 2]), tokens[i + 3], tokens[i + 4]
            j = i + 5
            while tokens[j] != "$end":
                j += 1
            if vtype in SCORED_VAR_TYPES:
                key = (".".join(scopes), name)
                vars_by_id.setdefault(vid, []).append(key)
                series[key] = (width, [])
            i = j + 1
        elif t in ("$date", "$version", "$timescale", "$comment"):
            while tokens[i] != "$end":
                i += 1
            i += 1
        elif t in ("$enddefinitions", "$dumpvars", "$end", "$dumpall", "$dumpon", "$dumpoff"):
            i += 2 if t == "$enddefinitions" else 1
        elif t.startswith("#"):
            flush()
            i += 1
        else:
            if t[0] in "bB":
                val, vid = t[1:], tokens[i + 1]
                i += 2
            elif t[0] in "rR":
                i += 2
                continue
            else:
                val, vid = t[0], t[1:]
                i += 1
            if vid in vars_by_id:
                width = series[vars_by_id[vid][0]][0]
                pad = val[0] if val[0] in "xXzZ" else "0"
                cur[vid] = (pad * (width - len(val)) + val).lower()
                changed.add(vid)
    flush()
    return series


def vcd_toggle(values):
    """Per bit (LSB = 0) -> 'covered' | '0->1' | '1->0' | 'both' (the missing direction)."""
    width = len(values[0])
    out = {}
    for i in range(width):
        rose = fell = False
        for a, b in zip(values, values[1:]):
            rose |= a[i] == "0" and b[i] == "1"
            fell |= a[i] == "1" and b[i] == "0"
        out[width - 1 - i] = "covered" if rose and fell else ("both" if not rose and not fell else ("0->1" if not rose else "1->0"))
    return out


@pytest.mark.needs_iverilog
@pytest.mark.parametrize("backend", ["verilog", "vpi"])
@pytest.mark.parametrize("rtl, top, tb", CASES)
def test_toggle_matches_vcd(rtl, top, tb, backend, tmp_path):
    if backend == "vpi" and not sim.vpi_module_dir():
        pytest.skip("the VPI toggle module cannot be built here (no iverilog-vpi / C compiler)")
    src, tb_src = (DESIGNS / rtl).read_text(), (DESIGNS / tb).read_text()
    res = sim.simulate({"id": tb, "rtl_files": [{"name": rtl, "content": src}], "top": top, "inst": "uut",
                        "tb": tb_src, "targets": []}, sim.ScoreConfig(toggle_backend=backend))
    assert res.status == sim.OK, res.errors
    assert res.versions["toggle_backend"] == backend
    # reference: plain Icarus, un-instrumented DUT, VCD of tb.uut
    (tmp_path / rtl).write_text(src)
    (tmp_path / "tb.sv").write_text(tb_src)
    (tmp_path / "dump.sv").write_text('module __dump; initial begin $dumpfile("d.vcd"); $dumpvars(0, tb.uut); end endmodule\n')
    subprocess.run(["iverilog", "-g2012", "-o", "ref.vvp", rtl, "tb.sv", "dump.sv"], cwd=tmp_path, check=True,
                   capture_output=True)
    subprocess.run(["vvp", "-n", "ref.vvp"], cwd=tmp_path, check=True, capture_output=True, timeout=60)
    series = parse_vcd((tmp_path / "d.vcd").read_text())
    ref_missing, ref_total, ref_covered = set(), 0, 0
    for (scope, name), (width, values) in series.items():
        inst = scope[len("tb."):]
        for bit, state in vcd_toggle(values).items():
            ref_total += 1
            if state == "covered":
                ref_covered += 1
            else:
                ref_missing.add((inst, name, bit, state))
    got_missing = {(u["instance"], u["signal"], b, u["missing"]) for u in res.uncovered if u["metric"] == "toggle"
                   for b in u["bits"]}
    assert got_missing == ref_missing
    assert (res.metrics["toggle"]["covered"], res.metrics["toggle"]["total"]) == (ref_covered, ref_total)
