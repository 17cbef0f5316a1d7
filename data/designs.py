"""Synthetic design tasks: task rows from the parameterised RTL families, for training the testbench writer.

The kit has no hub access, so it makes its own training designs. data/design_families.py draws each
design (RTL structure, coding style, spec, directed stimulus); this module renders it as a task row with
a reference testbench, checks it under Icarus and measures its coverage ceiling.

Rows come out in the kit's task schema (CVDP-ECov columns, see docs/interfaces.md):
  id (syn_<family>_<seed>), spec_files, rtl_files, dut_module_name, dut_instance_name
  (dut / uut / inst_<top> by a hash of the id), instruction (CodeV-R1 style), targets,
  difficulty, is_agentic=False, plus family, split, reference_tb (a long random + directed
  stimulus testbench generated from the ports) and, with --ceilings, ceiling (the coverage that
  reference_tb reaches under sim.py: the design's practical ceiling).

Validation holds out whole families (VAL_FAMILIES), so it measures transfer to unseen kinds of design.

Usage:
  python data/designs.py --n 200 --seed 0 --split train --out tasks_train.jsonl --ceilings
  python data/designs.py --n 50 --split val --out tasks_val.jsonl
  python data/designs.py --n 200 --out t.jsonl --decontaminate ../shared/data/dev_tasks.jsonl
  python data/designs.py --list

API: generate_tasks(n, seed=0, split="train", families=None) -> list[dict];
     make_task(family, seed, split=None) -> dict; attach_ceilings(tasks, workers=None);
     check_icarus(task) -> dict. FAMILIES and VAL_FAMILIES are in data/design_families.py,
     contamination_filter in data/decontam.py.
"""
import argparse
import hashlib
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # kit root: sim.py, data/
from data.decontam import contamination_filter, rtl_tokens  # noqa: E402
from data.design_families import FAMILIES, VAL_FAMILIES  # noqa: E402
from data.rtl_writer import header, rng_txt  # noqa: E402

# ----------------------------------------------------------------------------------------------
# spec, reference testbench, task row


def render_spec(d):
    """English spec (markdown): overview, parameters, ports table, behaviour, reset, corner cases."""
    st = d["st"]
    out = [f"# `{d['module']}` specification", "", d["overview"], ""]
    if d.get("params"):
        out += ["## Parameters", "", "| name | default | meaning |", "|---|---|---|"]
        out += [f"| `{n}` | {v} | {desc} |" for n, v, desc in d["params"]] + [""]
    out += ["## Ports", "", "| name | direction | width | description |", "|---|---|---|---|"]
    out += [f"| `{p['name']}` | {p['dir']} | {p['width']} | {p['desc']} |" for p in d["ports"]] + [""]
    out += ["## Behaviour", ""] + [f"- {b}" for b in d["behaviour"]] + [""]
    if is_clocked(d):
        pol = "low" if st["rst_low"] else "high"
        kind = "asynchronous" if st["async"] else "synchronous (sampled on the rising clock edge)"
        out += ["## Reset", "", f"`{st['rst']}` is active-{pol} and {kind}. On reset: {d['reset']}", ""]
    else:
        out += ["## Timing", "", "The module is purely combinational: outputs follow the inputs with no clock.", ""]
    out += ["## Notable corner cases", ""] + [f"- {c}" for c in d["corner"]] + [""]
    return "\n".join(out)


def is_clocked(d):
    return any(p["kind"] == "clk" for p in d["ports"])


def _rand_expr(w):
    """A random value expression of width w for the testbench (32 random bits per $random call)."""
    n = (w + 31) // 32
    return "$random(tb_seed)" if n == 1 else "{" + ", ".join(["$random(tb_seed)"] * n) + "}"


def reference_testbench(d, inst, seed=1, phases=60, max_len=300):
    """Generic strong random stimulus from the ports (plus the family's directed part).

    Clocked designs: reset for 3 cycles, then `phases` phases; in each phase every data input gets a
    random drive mode (random, zeros, ones, small values, hold, mostly-1/mostly-0 for 1-bit inputs,
    single-bit walk, increment) for 1..max_len cycles; a short reset pulse follows some phases.
    Combinational designs with <= 12 input bits are first driven exhaustively. Stimulus only."""
    clocked = is_clocked(d)
    st = d["st"]
    ins = [p for p in d["ports"] if p["dir"] == "input" and p["kind"] == "data"]
    outs = [p for p in d["ports"] if p["dir"] == "output"]
    L = ["`timescale 1ns/1ps", "module tb;"]
    if clocked:
        L.append("  reg clk;")
        L.append(f"  reg {st['rst']};")
    for p in ins:
        L.append(f"  reg {rng_txt(p['width'])} {p['name']};".replace("  reg  ", "  reg "))
    for p in outs:
        L.append(f"  wire {rng_txt(p['width'])} {p['name']};".replace("  wire  ", "  wire "))
    L.append("  integer tb_seed, tb_ph, tb_i, tb_len;")
    for p in ins:
        L.append(f"  integer tb_m_{p['name']};")
    conns = ", ".join(f".{p['name']}({p['name']})" for p in d["ports"])
    L.append(f"  {d['module']} {inst} ({conns});")
    step = "@(negedge clk);" if clocked else "#5;"
    if clocked:
        L.append("  initial begin clk = 1'b0; forever #5 clk = ~clk; end")
    on, off = ("1'b0", "1'b1") if st["rst_low"] else ("1'b1", "1'b0")
    for p in ins:
        n, w = p["name"], p["width"]
        if w == 1:
            modes = ["N = $random(tb_seed);", "N = 1'b0;", "N = 1'b1;", "N = N;",
                     "N = ($unsigned($random(tb_seed)) % 8) != 0;", "N = ($unsigned($random(tb_seed)) % 8) == 0;",
                     "N = ~N;", "N = $random(tb_seed);"]
        else:
            modes = [f"N = {_rand_expr(w)};", "N = 0;", "N = ~0;", "N = $unsigned($random(tb_seed)) % 4;",
                     "N = N;", f"N = N ^ (1 << ($unsigned($random(tb_seed)) % {w}));", "N = N + 1;",
                     f"N = ~({_rand_expr(w)} & {_rand_expr(w)});"]
        L.append(f"  task tb_drive_{n}; begin")
        L.append(f"    case (tb_m_{n})")
        L += [f"      {i}: " + m.replace("N", n) for i, m in enumerate(modes)]
        L.append("    endcase")
        L.append("  end endtask")
    L.append("  initial begin")
    L.append(f"    tb_seed = {seed};")
    for p in ins:
        L.append(f"    {p['name']} = 0;")
    if clocked:
        L += [f"    {st['rst']} = {on};", "    repeat (3) @(posedge clk);", f"    @(negedge clk) {st['rst']} = {off};"]
    tot = sum(p["width"] for p in ins)
    if not clocked and 0 < tot <= 12:
        L.append(f"    for (tb_i = 0; tb_i < {1 << tot}; tb_i = tb_i + 1) begin")
        L.append(f"      {{{', '.join(p['name'] for p in ins)}}} = tb_i;")
        L.append("      #5;")
        L.append("    end")
    L.append(f"    for (tb_ph = 0; tb_ph < {phases}; tb_ph = tb_ph + 1) begin")
    for p in ins:
        L.append(f"      tb_m_{p['name']} = $unsigned($random(tb_seed)) % 8;")
    L.append(f"      tb_len = 1 + $unsigned($random(tb_seed)) % {max_len};")
    L.append("      for (tb_i = 0; tb_i < tb_len; tb_i = tb_i + 1) begin")
    L.append(f"        {step}")
    for p in ins:
        L.append(f"        tb_drive_{p['name']};")
    L.append("      end")
    if clocked:
        L.append(f"      if (($unsigned($random(tb_seed)) % 6) == 0) begin {st['rst']} = {on}; @(negedge clk); {st['rst']} = {off}; end")
    L.append("    end")
    if d.get("directed"):
        L.append("    // directed part: deep states")
        L.append(d["directed"].rstrip("\n"))
    L.append(f"    {step}")
    L.append("    $finish;")
    L.append("  end")
    L.append("endmodule")
    return "\n".join(L) + "\n"


def instance_name(task_id, top):
    """dut / uut / inst_<top>, chosen by a hash of the id (docs/method.md §1.2)."""
    r = int(hashlib.sha256(task_id.encode()).hexdigest()[:8], 16) / 2 ** 32
    return "dut" if r < 0.33 else ("uut" if r < 0.66 else f"inst_{top}")


def instruction_text(top, inst):
    """CodeV-R1-style instruction naming the top module and the instance name (own wording)."""
    return (f"Generate a SystemVerilog testbench for the given RTL design. The top module is '{top}', "
            f"and its instance name in the testbench should be '{inst}'. Target coverage only in your "
            "testbench: aim for high line, branch, expression, toggle and FSM coverage of the design. "
            "Also, don't include assertion statements or any checks on the outputs; drive stimulus only.")


def difficulty(d, rtl):
    """easy / medium / hard from the RTL size and the family's depth hint."""
    n = sum(1 for line in rtl.split("\n") if line.strip())
    score = (n >= 45) + (n >= 90) + d.get("deep", 0)
    return ["easy", "medium", "hard"][min(2, score)]


def make_task(family, seed, split=None):
    """One task row for `family` drawn with integer `seed` (deterministic)."""
    if family not in FAMILIES:
        raise ValueError(f"unknown family {family!r}; known: {', '.join(sorted(FAMILIES))}")
    rng = random.Random(f"{family}:{seed}")
    d = FAMILIES[family](rng)
    d["module"] = re.sub(r"\W", "_", d["module"])
    rtl = header(d["st"], d["module"], d["ports"], d.get("params", ())) + "\n" + d["body"] + "endmodule\n"
    tid = f"syn_{family}_{seed}"
    inst = instance_name(tid, d["module"])
    return {
        "id": tid,
        "spec_files": [{"name": "specification.md", "content": render_spec(d)}],
        "rtl_files": [{"name": f"{d['module']}.sv", "content": rtl}],
        "dut_module_name": d["module"],
        "dut_instance_name": inst,
        "instruction": instruction_text(d["module"], inst),
        "targets": [{"inst_name": inst, "metric": "overall_average", "target_percentage": 90.0}],
        "difficulty": difficulty(d, rtl),
        "is_agentic": False,
        "family": family,
        "split": split or ("val" if family in VAL_FAMILIES else "train"),
        "reference_tb": reference_testbench(d, inst, seed=1 + seed % 100000),
    }

# ----------------------------------------------------------------------------------------------
# validation with plain Icarus, and ceilings with the kit's scorer


def check_icarus(task, tb=None, timeout=60):
    """Compile the task's RTL with its reference testbench (or `tb`) under iverilog -g2012 and run
    vvp. Returns {ok, compile_ok, warnings: [str], errors: [str], seconds}. No coverage."""
    import time
    if shutil.which("iverilog") is None:
        raise RuntimeError("iverilog not on PATH (make sysdeps installs it)")
    t0 = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        files = []
        for f in task["rtl_files"]:
            path = os.path.join(tmp, f["name"])
            with open(path, "w") as fh:
                fh.write(f["content"])
            files.append(path)
        tbp = os.path.join(tmp, "tb.sv")
        with open(tbp, "w") as fh:
            fh.write(tb if tb is not None else task["reference_tb"])
        rtl_only = subprocess.run(["iverilog", "-g2012", "-o", os.path.join(tmp, "rtl.vvp")] + files,
                                  capture_output=True, text=True, timeout=timeout)
        comp = subprocess.run(["iverilog", "-g2012", "-o", os.path.join(tmp, "sim.vvp"), tbp] + files,
                              capture_output=True, text=True, timeout=timeout)
        out = {"compile_ok": comp.returncode == 0 and rtl_only.returncode == 0,
               "warnings": [x for x in (rtl_only.stdout + rtl_only.stderr).splitlines() if x.strip()],
               "errors": [x for x in (comp.stdout + comp.stderr).splitlines() if "error" in x.lower()]}
        out["ok"] = out["compile_ok"]
        if out["compile_ok"]:
            run = subprocess.run(["vvp", "-n", os.path.join(tmp, "sim.vvp"), "-none"], cwd=tmp,
                                 capture_output=True, text=True, timeout=timeout)
            out["ok"] = run.returncode == 0
            if run.returncode != 0:
                out["errors"].append((run.stdout + run.stderr)[-500:])
    out["seconds"] = round(time.time() - t0, 3)
    return out


def attach_ceilings(tasks, workers=None, cfg=None):
    """Score every task's reference_tb with the kit's scorer and store task["ceiling"] =
    {block, branch, expression, toggle, fsm (pct or None), overall, status}. Returns tasks."""
    try:
        import sim
        import simpool
    except ImportError as e:
        raise RuntimeError("ceilings need the kit's scorer sim.py (run from the repo root)") from e
    jobs = [sim.job_from_task(t, t["reference_tb"]) for t in tasks]
    for t, r in zip(tasks, simpool.simulate_many(jobs, workers=workers, cfg=cfg)):
        ceil = {m: (v or {}).get("pct") for m, v in (r.metrics or {}).items()}
        ceil["overall"] = r.overall_pct
        ceil["status"] = r.status
        t["ceiling"] = ceil
    return tasks


def ceiling_table(tasks, command=""):
    """Markdown table per family: designs, RTL lines/tokens, mean ceiling per metric (from
    task["ceiling"]), min overall, and the uncovered-metric notes."""
    def mean(xs):
        xs = [x for x in xs if x is not None]
        return f"{sum(xs) / len(xs):.1f}" if xs else "-"
    out = ["# Synthetic design families: size and coverage ceiling", "",
           "Ceiling = coverage that each design's `reference_tb` (generic random stimulus from the ports,",
           "about 9k cycles in 60 phases of random drive modes with reset pulses, plus the family's directed",
           "part) reaches under `sim.py` (default profile: overall = mean of block, expression, toggle, FSM).", ""]
    if command:
        out += ["Command:", "", f"    {command}", ""]
    out += ["| family | split | n | lines | tokens (alnum) | block | branch | expr | toggle | fsm | overall (mean) | overall (min) |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    fams = sorted({t["family"] for t in tasks}, key=lambda f: (f in VAL_FAMILIES, f))
    for f in fams:
        ts = [t for t in tasks if t["family"] == f]
        c = [t.get("ceiling", {}) for t in ts]
        lines = [len(t["rtl_files"][0]["content"].splitlines()) for t in ts]
        toks = [len(rtl_tokens(t["rtl_files"][0]["content"])) for t in ts]
        ov = [x.get("overall") for x in c if x.get("overall") is not None]
        out.append(f"| {f} | {ts[0]['split']} | {len(ts)} | {min(lines)}-{max(lines)} | {min(toks)}-{max(toks)} | "
                   + " | ".join(mean([x.get(m) for x in c]) for m in ["block", "branch", "expression", "toggle", "fsm"])
                   + f" | {mean(ov)} | {min(ov):.1f} |" if ov else " | - |")
    allov = [t["ceiling"]["overall"] for t in tasks if t.get("ceiling", {}).get("overall") is not None]
    out += ["", f"All: {len(allov)}/{len(tasks)} scored, mean overall {sum(allov) / max(1, len(allov)):.1f}, "
            f"{sum(x >= 90 for x in allov)} at or above the 90% target.", ""]
    return "\n".join(out)


# ----------------------------------------------------------------------------------------------
# the public entry point


def generate_tasks(n, seed=0, split="train", families=None):
    """n task rows, families taken round-robin from the split's families (train: all but
    VAL_FAMILIES; val: VAL_FAMILIES; all: every family), optionally restricted to `families`.
    Design i gets the integer seed seed * 100000 + i, so the same arguments give the same rows."""
    if split not in ("train", "val", "all"):
        raise ValueError(f"split must be train, val or all, not {split!r}")
    pool = [f for f in FAMILIES if split == "all" or (f in VAL_FAMILIES) == (split == "val")]
    if families:
        unknown = [f for f in families if f not in FAMILIES]
        if unknown:
            raise ValueError(f"unknown families {unknown}; known: {', '.join(sorted(FAMILIES))}")
        pool = [f for f in families if f in pool]
        if not pool:
            raise ValueError(f"none of {list(families)} belongs to split {split!r}")
    return [make_task(pool[i % len(pool)], seed * 100000 + i) for i in range(n)]


def main(argv=None):
    ap = argparse.ArgumentParser(description="Generate synthetic RTL design tasks (CVDP-ECov schema JSONL).")
    ap.add_argument("--n", type=int, default=200, help="number of designs")
    ap.add_argument("--seed", type=int, default=0, help="generation seed")
    ap.add_argument("--split", default="train", choices=["train", "val", "all"], help="family split (val = held-out families)")
    ap.add_argument("--families", default=None, help="comma-separated subset of families")
    ap.add_argument("--out", default=None, help="output JSONL path (required unless --list)")
    ap.add_argument("--ceilings", action="store_true", help="score reference_tb with sim.py and store task['ceiling']")
    ap.add_argument("--workers", type=int, default=None, help="sim.py workers for --ceilings")
    ap.add_argument("--decontaminate", nargs="*", default=[], help="eval task JSONL files; drop too-similar designs")
    ap.add_argument("--threshold", type=float, default=0.5, help="n-gram / ROUGE-L F1 threshold for --decontaminate")
    ap.add_argument("--table", default=None, help="with --ceilings: write the per-family ceiling table (markdown) here")
    ap.add_argument("--list", action="store_true", help="list the families and exit")
    args = ap.parse_args(argv)
    if args.list:
        for f, fn in FAMILIES.items():
            print(f"{f:<18} {'val  ' if f in VAL_FAMILIES else 'train'} {fn.__doc__.strip().splitlines()[0]}")
        return 0
    if not args.out:
        ap.error("--out is required")
    fams = args.families.split(",") if args.families else None
    tasks = generate_tasks(args.n, seed=args.seed, split=args.split, families=fams)
    print(f"generated {len(tasks)} designs from {len({t['family'] for t in tasks})} families (split={args.split}, seed={args.seed})")
    if args.decontaminate:
        tasks, dropped = contamination_filter(tasks, args.decontaminate, threshold=args.threshold)
        print(f"decontaminate: dropped {len(dropped)} designs (threshold {args.threshold})")
        for d in dropped[:20]:
            print("  ", d)
    if args.ceilings:
        attach_ceilings(tasks, workers=args.workers)
        ok = [t["ceiling"]["overall"] for t in tasks if t["ceiling"].get("overall") is not None]
        print(f"ceilings: {len(ok)}/{len(tasks)} scored, mean overall {sum(ok) / max(1, len(ok)):.1f}")
        if args.table:
            cmd = "python data/designs.py " + " ".join(argv if argv is not None else sys.argv[1:])
            with open(args.table, "w") as fh:
                fh.write(ceiling_table(tasks, cmd))
            print(f"wrote {args.table}")
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    tmp = f"{args.out}.tmp{os.getpid()}"     # written whole, then renamed: a reader never sees half a file
    with open(tmp, "w") as fh:
        for t in tasks:
            fh.write(json.dumps(t) + "\n")
    os.replace(tmp, args.out)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
