"""The persistent sandbox (sim._Box: one bubblewrap per process, runs one after another in fresh folders
inside it): nothing a run writes survives for the next run, the only writable path is the run's folder's
parent (emptied between runs), a printed fake end marker does not end a run, and the box is reused.
The hostile suite (tests/test_sim_hostile.py) runs unchanged on top of it.

Run: python -m pytest -q tests/test_sim_box.py
"""
import dataclasses

import pytest

import sim
from helpers import COUNTER_RTL as COUNTER, COUNTER_TB_HEAD as HEAD

FAST = sim.ScoreConfig(timeout_s=5, compile_timeout_s=20, mem_limit_mb=1024)
PATHS = ["../planted.txt", "/planted.txt", "/tmp/planted.txt", "/dev/shm/planted.txt", "/dev/planted.txt",
         "planted.txt"]


def run(body, cfg=FAST):
    return sim.simulate({"id": "box", "rtl_files": COUNTER, "top": "counter", "inst": "uut",
                         "tb": HEAD + body + "\nendmodule\n", "targets": []}, cfg)


def sandboxed_boxes():
    return [b for b in sim._BOXES if b.key[1]]


@pytest.fixture
def box_used():
    """Each test starts with no idle box in this process (earlier tests of a whole-suite run may have left
    several: one per thread that simulated at the same time)."""
    if not sim.bwrap_usable():
        pytest.skip("bubblewrap unusable here: no sandbox, no box")
    sim._close_boxes()


@pytest.mark.needs_iverilog
def test_nothing_survives_between_runs(box_used):
    writes = "".join(f'    fd = $fopen("{p}", "w"); $display("W {p} %0d", fd != 0); if (fd) begin $fdisplay(fd, "x"); '
                     f'$fclose(fd); end\n' for p in PATHS)
    first = run(f"  integer fd;\n  initial begin\n{writes}    #30 $finish;\n  end")
    assert first.status == sim.OK
    log = first.log_head + first.log_tail
    assert "W ../planted.txt 1" in log and "W planted.txt 1" in log          # its own folder and the box's
    for p in ("/planted.txt", "/tmp/planted.txt", "/dev/shm/planted.txt", "/dev/planted.txt"):
        assert f"W {p} 0" in log                                              # read-only / missing
    reads = "".join(f'    fd = $fopen("{p}", "r"); $display("R {p} %0d", fd != 0);\n' for p in PATHS)
    second = run(f"  integer fd;\n  initial begin\n{reads}    #30 $finish;\n  end")
    assert second.status == sim.OK
    log = second.log_head + second.log_tail
    assert all(f"R {p} 0" in log for p in PATHS), log


@pytest.mark.needs_iverilog
def test_box_is_reused_and_fake_markers_do_not_end_a_run(box_used):
    run("  initial #30 $finish;")
    boxes = sandboxed_boxes()
    assert len(boxes) == 1
    res = run('  initial begin $display("0123456789abcdef 0"); $display("ffff 0"); #30 $display("after"); '
              '$finish; end')
    assert res.status == sim.OK and "after" in res.log_head + res.log_tail
    assert sandboxed_boxes() == boxes and boxes[0].alive()


@pytest.mark.needs_iverilog
def test_box_killed_at_the_backstop_is_replaced(box_used, monkeypatch):
    monkeypatch.setattr(sim.box, "BACKSTOP_EXTRA_S", -FAST.compile_timeout_s - FAST.timeout_s - sim.KILL_AFTER_S + 1)
    run("  initial #30 $finish;")
    old = sandboxed_boxes()
    res = run("  initial begin #12 rst_n = 1; end", dataclasses.replace(FAST, sim_time_limit=0))
    assert res.status == sim.TIMEOUT and res.timed_out      # no $finish, no limit: the backstop at 1 s
    assert not old[0].alive() and sandboxed_boxes() == []    # the killed box is not handed out again
    monkeypatch.undo()
    assert run("  initial #30 $finish;").status == sim.OK
