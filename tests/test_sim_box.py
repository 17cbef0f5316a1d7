"""The persistent sandbox (sim._Box: one bubblewrap per process, runs one after another in fresh folders
inside it): nothing a run writes survives for the next run, the only writable path is the run's folder's
parent (emptied between runs), a printed fake end marker does not end a run, and the box is reused.
The hostile suite (tests/test_sim_hostile.py) runs unchanged on top of it. The run script's signals, with a
stand-in `vvp` that counts them: exactly one SIGINT at the wall-clock limit and at the output cap (a second
one while the `final` blocks run makes vvp drop them: no coverage records), SIGKILL to the whole process group
when the SIGINT is ignored.

Run: python -m pytest -q tests/test_sim_box.py
"""
import dataclasses
import os
import shutil
import subprocess
import sys
import tempfile
import time

import pytest

import sim
import simpool
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


# stand-in for vvp: spins like a zero-delay loop and counts the SIGINTs delivered to it (one byte each on the
# wakeup fd); a child in its process group notes whether a SIGINT reached the group too (what makes a second
# SIGINT arrive at vvp: sent back to back, the two often merge into one pending signal, so the count alone
# cannot tell). Mode "ignore": ignores SIGINT, its child sleeps (the SIGKILL must reach both).
FAKE_VVP = """import os, signal, subprocess, time
MODE = %r
r, w = os.pipe()
os.set_blocking(r, False)
os.set_blocking(w, False)
signal.signal(signal.SIGINT, signal.SIG_IGN if MODE == "ignore" else (lambda *a: None))
signal.set_wakeup_fd(w)
child = subprocess.Popen(["sleep", "60"] if MODE == "ignore" else
                         ["sh", "-c", "trap 'echo > child.sigint; exit 0' INT; while :; do sleep 0.05; done"])
open("child.pid", "w").write(str(child.pid))
n, stop = 0, None
while stop is None or time.monotonic() < stop:
    if MODE == "flood" and not n:
        print("flood " * 20, flush=True)
    try:
        n += len(os.read(r, 64))
    except BlockingIOError:
        pass
    if n and stop is None:
        stop = time.monotonic() + 0.5       # a second SIGINT would come within microseconds
child.terminate()
child.wait()
print("SIGINT x%%d, group %%s" %% (n, "too" if os.path.exists("child.sigint") else "not"), flush=True)
"""


def fake_tools(folder, mode):
    """A bin folder with a no-op `iverilog` and the counting `vvp` (mode: "count", "ignore", "flood")."""
    bin_dir = os.path.join(folder, "bin")
    os.makedirs(bin_dir)
    for name, text in (("iverilog", "#!/bin/sh\nexit 0\n"), ("vvp", f"#!{sys.executable}\n" + FAKE_VVP % mode)):
        with open(os.path.join(bin_dir, name), "w") as f:
            f.write(text)
        os.chmod(os.path.join(bin_dir, name), 0o755)
    return bin_dir


def run_script(tmp_path, mode, cfg):
    bin_dir = fake_tools(str(tmp_path), mode)
    script = sim.build_script(["dut.sv"], [], "tb.sv", "s.vvp", cfg)
    # in a subshell, as the box runs it: a run killed by a signal has exit status 128 + signal
    return subprocess.run(["sh", "-c", '( eval "$1" ); exit $?', "sh", script], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60, env={"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path)})


def test_time_limit_sends_one_sigint(tmp_path):
    p = run_script(tmp_path, "count", dataclasses.replace(FAST, timeout_s=2))
    assert p.returncode == 124 and p.stdout.strip().endswith("SIGINT x1, group not"), (p.returncode, p.stdout)


def test_ignored_sigint_gets_the_process_group_killed(tmp_path, monkeypatch):
    monkeypatch.setattr(sim.box, "KILL_AFTER_S", 1)
    p = run_script(tmp_path, "ignore", dataclasses.replace(FAST, timeout_s=2))
    assert p.returncode == 137, (p.returncode, p.stdout, p.stderr)
    with open(tmp_path / "child.pid") as f:
        child = int(f.read())
    for _ in range(50):                     # the SIGKILL went to the whole group: vvp's child too
        try:
            with open(f"/proc/{child}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            break
        if state in ("Z", "X"):
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"vvp's child {child} survived the SIGKILL")


def test_output_cap_sends_one_sigint(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", fake_tools(str(tmp_path), "flood") + ":" + os.environ["PATH"])
    sim._close_boxes()                      # a fresh unsandboxed box that finds the stand-in on its PATH
    cfg = dataclasses.replace(FAST, sandbox=False, output_cap_bytes=50_000)
    run_dir = tempfile.mkdtemp(prefix="chorus_sim_test_")
    try:
        out = sim.run_job_dir(run_dir, sim.build_script(["dut.sv"], [], "tb.sv", "s.vvp", cfg), cfg)
    finally:
        sim._close_boxes()
        shutil.rmtree(run_dir, ignore_errors=True)
    assert out.output_limited and out.rc == 0 and out.tail.strip().endswith(b"SIGINT x1, group not"), out


@pytest.mark.needs_iverilog
def test_a_run_records_the_cpu_seconds_of_its_simulation():
    """timings["sim_cpu"]: the shell's `times` around vvp. A zero-delay loop spends its wall-clock limit on the
    CPU (at most the wall time; how much of it depends on the machine's load, so only the bounds are checked)."""
    done = run("  initial #30 $finish;")
    assert done.status == sim.OK and 0 <= done.timings["sim_cpu"] <= done.timings["sim"] + 0.3
    assert done.timings["sim_limit"] == FAST.timeout_s
    loop = run("  reg x = 0;\n  initial while (1) x = ~x;", dataclasses.replace(FAST, timeout_s=2))
    assert loop.status == sim.TIMEOUT and 0 < loop.timings["sim_cpu"] <= loop.timings["sim"] + 0.3


def test_a_timeout_without_cpu_behind_it_is_starved(tmp_path, monkeypatch):
    """A stand-in vvp that sleeps through its limit (as a run does on a machine too busy to schedule it) times out
    with ~0 CPU seconds: sim.starved_timeout. One that spins has CPU seconds although it rewrites the run
    folder's compile.times (the shell read it before vvp started). A run that used its limit is not starved."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("iverilog", "#!/bin/sh\nexit 0\n"), ("vvp", "#!/bin/sh\nexec sleep 30\n")):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    sim._close_boxes()                      # a fresh unsandboxed box that finds the stand-ins on its PATH
    cfg = dataclasses.replace(FAST, sandbox=False, timeout_s=1)
    run_dir = tempfile.mkdtemp(prefix="chorus_sim_test_")
    script = sim.build_script(["dut.sv"], [], "tb.sv", "s.vvp", cfg)
    try:
        out = sim.run_job_dir(run_dir, script, cfg)
        # a vvp that works (a shell loop until its SIGINT) and rewrites the folder's compile.times to hide it
        (bin_dir / "vvp").write_text("#!/bin/sh\nprintf '0m0s 0m0s\\n999m0s 0m0s\\n' > compile.times\n"
                                     "while :; do :; done\n")
        busy = sim.run_job_dir(run_dir, script, cfg)
        (bin_dir / "vvp").write_text("#!/bin/sh\ntrap '' INT\nexec sleep 30\n")    # ignores the SIGINT: SIGKILL 1 s later
        monkeypatch.setattr(sim.box, "KILL_AFTER_S", 1)
        killed = sim.run_job_dir(run_dir, sim.build_script(["dut.sv"], [], "tb.sv", "s.vvp", cfg), cfg)
    finally:
        sim._close_boxes()
        shutil.rmtree(run_dir, ignore_errors=True)
    assert out.rc == 124 and out.sim_s >= 1 and out.sim_cpu_s is not None and out.sim_cpu_s < 0.2, out
    assert busy.rc == 124 and busy.sim_cpu_s > 0.05, busy     # the shell read compile.times before vvp ran
    assert not sim.starved_timeout({"status": sim.TIMEOUT, "timings": {"sim_cpu": killed.sim_cpu_s, "sim_limit": 1}})
    assert killed.rc == 137 and killed.sim_cpu_s is None, killed   # SIGKILLed: vvp's CPU was never reaped, unknown
    starved = {"status": sim.TIMEOUT, "timings": {"sim": 1.0, "sim_cpu": out.sim_cpu_s}}
    assert sim.starved_timeout(starved, 1) and sim.starved_timeout(sim.SimResult(**starved), 1)
    assert not sim.starved_timeout({"status": sim.TIMEOUT, "timings": {"sim_cpu": 0.9}}, 1)   # used its limit
    assert not sim.starved_timeout({"status": sim.OK, "timings": {"sim_cpu": 0.0}}, 1)
    assert not sim.starved_timeout({"status": sim.TIMEOUT, "timings": {}}, 1)                # not recorded
    assert sim.starved_timeout({"status": sim.TIMEOUT, "timings": {"sim_cpu": 0.1, "sim_limit": 1}})  # its own limit
    assert not sim.starved_timeout({"status": sim.TIMEOUT, "timings": {"sim_cpu": 0.1}})      # no limit known


def test_starved_timeouts_run_again_alone_when_asked(monkeypatch):
    """simulate_many(retry_starved=True) and score.score_answers(retry_starved=True), the data builds' scoring:
    each starved timeout is simulated once more and its second result kept; nothing else runs twice."""
    import score
    calls = []

    def fake(job, cfg=None):
        calls.append(job["id"])
        first = calls.count(job["id"]) == 1
        if job["id"] == "starved" and first:
            return sim.SimResult(id=job["id"], status=sim.TIMEOUT, timings={"sim": 20.0, "sim_cpu": 2.0, "sim_limit": 20.0})
        if job["id"] == "loop":
            return sim.SimResult(id=job["id"], status=sim.TIMEOUT, timings={"sim": 20.0, "sim_cpu": 19.5, "sim_limit": 20.0})
        return sim.SimResult(id=job["id"], status=sim.OK, overall_pct=50.0, timings={"sim": 1.0, "sim_cpu": 0.9})

    monkeypatch.setattr(sim, "simulate", fake)
    jobs = [{"id": i} for i in ("ok", "starved", "loop")]
    assert [r.status for r in simpool.simulate_many(jobs, workers=1)] == [sim.OK, sim.TIMEOUT, sim.TIMEOUT]
    calls.clear()
    got = simpool.simulate_many(jobs, workers=1, retry_starved=True)
    assert [r.status for r in got] == [sim.OK, sim.OK, sim.TIMEOUT] and calls == ["ok", "starved", "loop", "starved"]
    calls.clear()
    monkeypatch.setattr(score, "prepare_answer", lambda t, text, tm, am: (t, {"id": t["id"]}, None))
    out = score.score_answers([({"id": i}, "") for i in ("ok", "starved", "loop")], workers=1, retry_starved=True)
    assert [r["status"] for r in out] == [sim.OK, sim.OK, sim.TIMEOUT] and calls == ["ok", "starved", "loop", "starved"]


@pytest.mark.needs_iverilog
def test_last_line_without_newline_ends_the_run_at_once():
    """`$write("done")` leaves no newline after the last line; the end marker is still found at once (it
    used to hide mid-line and the run waited ~63 s for the backstop, then scored timeout)."""
    t0 = time.perf_counter()
    res = run('  initial begin #12 rst_n = 1; #20 $write("done"); $finish; end')
    assert res.status == sim.OK and time.perf_counter() - t0 < 5
    assert (res.log_head + res.log_tail).rstrip().endswith("done")
    assert sim.box._end_marker(b"abc\ntok 0\n", b"tok") == (b"\ntok 0\n", 0)
    assert sim.box._end_marker(b"abc\ntok 0x\n", b"tok") is None


@pytest.mark.needs_iverilog
def test_disk_budget_stops_a_run_that_fills_the_disk():
    """Many files each under RLIMIT_FSIZE add up: the per-run budget stops the run, coverage is kept."""
    cfg = dataclasses.replace(FAST, disk_limit_mb=8)
    res = run("""  integer fd, i, k;
  initial begin #12 rst_n = 1; en = 1;
    for (k = 0; k < 64; k = k + 1) begin
      fd = $fopen($sformatf("fill_%0d.txt", k), "w");
      for (i = 0; i < 20000; i = i + 1) $fdisplay(fd, "0123456789012345678901234567890123456789");
      $fclose(fd); #10;
    end
    $finish;
  end""", cfg)
    assert res.status == sim.OUTPUT_LIMIT and "8 MiB" in res.errors[0]["msg"] and sim.reward(res) == 0
    assert res.metrics["block"]["covered"] > 0
