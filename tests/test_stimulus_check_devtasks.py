"""Hostile stimuli on real dev tasks (../shared/data/dev_tasks.jsonl): a write into the DUT must not buy a
pass that no honest stimulus reaches. Also the script that records results/hostile.json: every hostile class
of tests/test_stimulus_check.py, judged by the check and (when the check lets it through) by the scorer.

Run:    python -m pytest -q tests/test_stimulus_check_devtasks.py
Record: python tests/test_stimulus_check_devtasks.py --label after --json results/hostile.json
        (--label before with PYTHONPATH pointing at the older harness/instrument/tbcheck/box/sim files: results/hostile.md)
"""
import argparse
import dataclasses
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

# as a script: tests/ (helpers) and the repo after PYTHONPATH, so older scorer files given there are used
sys.path += [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]
import harness  # noqa: E402
import sim  # noqa: E402

DEV = Path(__file__).resolve().parents[2] / "shared" / "data" / "dev_tasks.jsonl"
CFG = sim.ScoreConfig(timeout_s=10)

# (class, task id, honest stimulus, the same plus the hostile lines)
DIV_HONEST = ("repeat (300) begin random_inputs(); step(1); end\n"
              "A = 16'hFFFF; B = 8'h01; step(1); A = 16'h0000; B = 8'hFF; step(1);\n"
              "A = 16'h00FF; B = 8'hFF; step(1); A = 16'hFF00; B = 8'h00; step(1);")
ROM_HONEST = "for (int i = 0; i < 256; i++) begin addr = i; step(1); end\naddr = 8'h00; step(1);"
DEV_CASES = [
    ("escaped-identifier write", "rtllm_v2/div_16bit", DIV_HONEST,
     DIV_HONEST + "\n\\uut .b_reg = 16'hFFFF; #1; \\uut .b_reg = 16'h0000; step(1);"),
    ("$readmemh into a DUT memory", "rtllm_v2/ROM", ROM_HONEST,
     "begin int fd; fd = $fopen(\"m.hex\", \"w\");\n"
     "  for (int i = 0; i < 256; i++) $fdisplay(fd, \"%h\", (i % 2) ? 16'hFFFF : 16'h0000);\n"
     "  $fclose(fd); $readmemh(\"m.hex\", rom_inst.mem);\nend\n" + ROM_HONEST),
]


def dev_tasks():
    if not DEV.exists():
        pytest.skip(f"{DEV} not found: ../shared (the dev tasks) is absent from this checkout")
    return {t["id"]: t for t in (json.loads(line) for line in DEV.read_text().splitlines() if line.strip())}


def judge(task, body):
    """{check: reason or None, status, overall, passed} of one stimulus: rejected at the check, else scored."""
    h = harness.make_harness(task)
    why = harness.check_stimulus(body, h)
    if why:
        return {"check": why, "status": "rejected", "overall": None, "passed": False}
    r = sim.simulate(sim.job_from_task(task, harness.assemble(h, body)[0]), CFG)
    return {"check": None, "status": r.status, "overall": r.overall_pct, "passed": r.passed,
            "errors": [e["msg"] for e in r.errors[:1]]}


@pytest.mark.needs_iverilog
@pytest.mark.parametrize("name, tid, honest, hostile", DEV_CASES)
def test_dev_task_write_buys_nothing(name, tid, honest, hostile):
    task = dev_tasks()[tid]
    good, bad = judge(task, honest), judge(task, hostile)
    assert good["status"] == "ok" and not good["passed"], good        # no honest stimulus passes these
    assert bad["status"] == "rejected" and "DUT hierarchy" in bad["check"], bad


def record(label):
    """Every hostile class (counter harness) and the dev-task cases, judged by the code on sys.path."""
    import test_stimulus_check as t
    task = t.counter_task()
    rows = []
    for body, _ in t.HOSTILE_STIMULI.items():
        rows.append({"mode": "stimulus", "task": "counter", "stimulus": body[:120], **judge(task, body)})
    prepared = sim.prepare_dut(t.COUNTER_RTL, "counter")
    for body in t.HOSTILE_TB_BODIES:
        tb = t.COUNTER_TB_HEAD + body + "\nendmodule\n"
        try:
            forbidden = sim.check_testbench(tb, prepared, "uut")[0]
            verdict = forbidden[0]["msg"] if forbidden else None
        except Exception as e:        # the pre-scan itself failed (the scorer reports internal_error)
            verdict = f"pre-scan raised {type(e).__name__}: {e}"
        rows.append({"mode": "testbench", "task": "counter", "stimulus": body.strip()[:120], "check": verdict})
    # one end-of-time rule: a never-ending stimulus and the same loop as a whole testbench
    rows.append({"mode": "stimulus", "task": "counter", "class": "never-ending stimulus",
                 **judge(task, "en = 1'b1;\nforever step(1);")})
    r = sim.simulate(sim.job_from_task(task, t.COUNTER_TB_HEAD + "  initial begin #12 rst_n = 1; en = 1; "
                                       "forever @(negedge clk); end\nendmodule\n"), CFG)
    rows.append({"mode": "testbench", "task": "counter", "class": "never-ending testbench", "check": None,
                 "status": r.status, "overall": r.overall_pct, "passed": r.passed})
    # the box: a last output line without a newline; many files under the per-file limit
    t0 = time.perf_counter()
    r = sim.simulate(sim.job_from_task(task, t.COUNTER_TB_HEAD + "  initial begin #12 rst_n = 1; #20 "
                                       "$write(\"done\"); $finish; end\nendmodule\n"), CFG)
    rows.append({"mode": "testbench", "task": "counter", "class": "last line without newline", "check": None,
                 "status": r.status, "wall_s": round(time.perf_counter() - t0, 2)})
    fill = ("  integer fd, i, k;\n  initial begin #12 rst_n = 1; en = 1;\n    for (k = 0; k < 64; k = k + 1) begin\n"
            "      fd = $fopen($sformatf(\"fill_%0d.txt\", k), \"w\");\n      for (i = 0; i < 20000; i = i + 1) "
            "$fdisplay(fd, \"0123456789012345678901234567890123456789\");\n      $fclose(fd); #10;\n    end\n"
            "    $finish;\n  end\nendmodule\n")
    cfg = dataclasses.replace(CFG, disk_limit_mb=8) if hasattr(CFG, "disk_limit_mb") else CFG
    r = sim.simulate(sim.job_from_task(task, t.COUNTER_TB_HEAD + fill), cfg)
    rows.append({"mode": "testbench", "task": "counter", "class": "64 files of 0.8 MB (budget 8 MiB)",
                 "check": None, "status": r.status, "errors": [e["msg"] for e in r.errors[:1]]})
    # the CLI's bad-input matrix
    tmp = Path(tempfile.mkdtemp(prefix="chorus_cli_"))
    for name, argv in cli_matrix(tmp):
        p = subprocess.run([sys.executable, sim.__file__] + argv, capture_output=True, text=True, timeout=120)
        err = p.stderr.strip().replace(str(tmp), "TMP").splitlines()
        rows.append({"mode": "cli", "class": name, "rc": p.returncode, "stderr_lines": len(err),
                     "last": err[-1][:160] if err else ""})
    shutil.rmtree(tmp, ignore_errors=True)
    tasks = dev_tasks()
    for name, tid, honest, hostile in DEV_CASES:
        for kind, body in (("honest", honest), ("hostile", hostile)):
            rows.append({"mode": "stimulus", "task": tid, "class": name, "kind": kind, **judge(tasks[tid], body)})
    return {"label": label, "rows": rows}


def cli_matrix(tmp):
    """(case, sim.py argv) of the bad-input matrix; the files are written into folder tmp."""
    (tmp / "bin.sv").write_bytes(b"\x7fELF\x02\x01\x01\x00" + bytes(range(256)))
    rtl = [{"name": "m.sv", "content": "module m; endmodule"}]
    (tmp / "str_rtl.jsonl").write_text(json.dumps({"id": "a", "rtl_files": "module m; endmodule",
                                                   "dut_module_name": "m", "dut_instance_name": "uut"}) + "\n")
    (tmp / "no_pct.jsonl").write_text(json.dumps({"id": "a", "rtl_files": rtl, "dut_module_name": "m",
                                                  "dut_instance_name": "uut", "targets": [
                                                      {"inst_name": "uut", "metric": "overall_average"}]}) + "\n")
    root = Path(__file__).resolve().parents[1]
    rtl_ok, tb_ok = str(root / "tests/designs/counter.sv"), str(root / "tests/designs/tb_counter.sv")
    return [("binary RTL file", ["score", "--rtl", str(tmp / "bin.sv"), "--top", "m", "--tb", tb_ok]),
            ("rtl_files as a string", ["score", "--tasks", str(tmp / "str_rtl.jsonl"), "--id", "a", "--tb", tb_ok]),
            ("target without target_percentage",
             ["score", "--tasks", str(tmp / "no_pct.jsonl"), "--id", "a", "--tb", tb_ok]),
            ("--timeout -1", ["score", "--rtl", rtl_ok, "--top", "counter", "--tb", tb_ok, "--timeout", "-1"])]


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--label", required=True, help="before | after")
    ap.add_argument("--json", required=True, help="the results file; the label's entry is replaced")
    args = ap.parse_args()
    path = Path(args.json)
    data = json.loads(path.read_text()) if path.exists() else {}
    data[args.label] = record(args.label)
    path.write_text(json.dumps(data, indent=1) + "\n")
    print(f"{args.label}: {len(data[args.label]['rows'])} rows -> {path}")
