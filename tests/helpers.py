"""Constants more than one test file uses (pytest puts tests/ on sys.path: `from helpers import ...`).
Shared fixtures are in conftest.py."""
import os
import runpy
import sys
from pathlib import Path

DESIGNS = Path(__file__).resolve().parent / "designs"

# tests/designs/counter.sv as sim.py's rtl_files, and the head of a testbench that drives it (no endmodule)
COUNTER_RTL = [{"name": "counter.sv", "content": (DESIGNS / "counter.sv").read_text()}]
COUNTER_TB_HEAD = """`timescale 1ns/1ps
module tb;
  reg clk = 0, rst_n = 0, load = 0, en = 0, up = 1;
  reg [3:0] d = 0;
  wire [3:0] q; wire wrap;
  counter uut (.clk(clk), .rst_n(rst_n), .load(load), .en(en), .up(up), .d(d), .q(q), .wrap(wrap));
  always #5 clk = ~clk;
"""

EXPERTS_SEED = 42    # the `experts` fixture's tiny base: distill.py must be given --seed EXPERTS_SEED to match


# -----------------------------------------------------------------------------
# chorus_mini's stage commands in this interpreter

ROOT = Path(__file__).resolve().parents[1]
EXECUTED = []       # the commands run_in_process ran, in order (str)


def run_in_process(cmd, log_path):
    """chorus_mini.execute without the subprocess: the script runs here as __main__ with its argv (each
    subprocess would pay seconds of torch/transformers imports on 2 cores). Same log line, same exit code."""
    EXECUTED.append(str(cmd))
    with open(log_path, "a") as log:
        log.write(f"\n$ {cmd}\n")
    if cmd.fn is not None:
        cmd.fn()
        return 0, None, None
    script, *argv = cmd.argv[1:]
    saved = sys.argv, os.getcwd()
    sys.argv = [script, *argv]
    os.chdir(ROOT)
    try:
        runpy.run_path(str(ROOT / script), run_name="__main__")
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        sys.argv = saved[0]
        os.chdir(saved[1])
    return code, None, None


def deadline_after(k):
    """A rundir.Deadline (monkeypatched in) that is near once k steps were timed: the deadline stop at a known
    step, with no clock."""
    import rundir

    class After(rundir.Deadline):
        def __init__(self, *a, **kw):
            super().__init__("1e18")

        def near(self, extra=0.0):
            return len(self.durations) >= k
    return After
