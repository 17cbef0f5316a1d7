"""One writer per stage folder (rundir.lock_run), and a stopped orchestrator ends its stage's process group
(chorus_mini.execute).

Run: python -m pytest -q tests/test_rundir_lock.py
"""
import json
import os
import platform
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import rundir

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def fresh_locks(monkeypatch):
    monkeypatch.setattr(rundir, "_HELD", {})


def write_lock(out, pid, host=None):
    out.mkdir(parents=True, exist_ok=True)
    (out / rundir.LOCK_NAME).write_text(json.dumps({"pid": pid, "host": host or platform.node(),
                                                    "started": rundir._proc_start(pid), "since": "then"}))


def test_lock_is_taken_and_released(tmp_path, fresh_locks):
    out = tmp_path / "stage"
    rundir.lock_run(out)
    held = json.loads((out / ".lock").read_text())
    assert held["pid"] == os.getpid() and held["host"] == platform.node()
    rundir.lock_run(out)                                  # the holder may ask again
    rundir.unlock_run(out)
    assert not (out / ".lock").exists()


def test_second_writer_is_refused_with_one_line(tmp_path, fresh_locks):
    out = tmp_path / "stage"
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        write_lock(out, other.pid)
        with pytest.raises(SystemExit) as e:
            rundir.lock_run(out)
        msg = str(e.value)
        assert f"pid {other.pid}" in msg and "\n" not in msg and "in use" in msg
    finally:
        other.kill()
        other.wait()


def test_stale_lock_of_a_dead_pid_is_taken_over(tmp_path, fresh_locks):
    out = tmp_path / "stage"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    write_lock(out, dead.pid)
    rundir.lock_run(out)
    assert json.loads((out / ".lock").read_text())["pid"] == os.getpid()
    (out / ".lock").write_text("{not json")               # a writer that died mid-write
    rundir._HELD.clear()
    rundir.lock_run(out)
    assert json.loads((out / ".lock").read_text())["pid"] == os.getpid()
    rundir.unlock_run(out)


def test_lock_of_another_host_is_never_guessed_about(tmp_path, fresh_locks):
    out = tmp_path / "stage"
    write_lock(out, 1, host="some-other-host")
    with pytest.raises(SystemExit, match="some-other-host"):
        rundir.lock_run(out)


def test_stopped_orchestrator_ends_its_child_process_group(tmp_path):
    """SIGTERM to a process running chorus_mini.execute: the stage's child and grandchild are gone."""
    pidfile = tmp_path / "grandchild.pid"
    child = tmp_path / "stage.py"
    child.write_text("import subprocess, sys, time\n"
                     "g = subprocess.Popen(['sleep', '300'])\n"
                     f"open({str(pidfile)!r}, 'w').write(str(g.pid))\n"
                     "print('started', flush=True)\n"
                     "time.sleep(300)\n")
    driver = ("import sys, chorus_mini\n"
              f"chorus_mini.execute(chorus_mini.Cmd(['python', {str(child)!r}]), {str(tmp_path / 'log.txt')!r})\n")
    orch = subprocess.Popen([sys.executable, "-c", driver], cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        t0 = time.time()
        while not pidfile.exists() or not pidfile.read_text():
            assert time.time() - t0 < 60 and orch.poll() is None, "the stage never started"
            time.sleep(0.1)
        grandchild = int(pidfile.read_text())
        time.sleep(0.2)
        orch.send_signal(signal.SIGTERM)
        assert orch.wait(timeout=30) == 128 + signal.SIGTERM
        t1 = time.time()
        while time.time() - t1 < 10:
            try:
                os.kill(grandchild, 0)
            except ProcessLookupError:
                break
            with open(f"/proc/{grandchild}/stat") as f:     # a zombie (reaped by init later) is gone too
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    break
            time.sleep(0.1)
        else:
            pytest.fail("the stage's grandchild survived the orchestrator")
    finally:
        if orch.poll() is None:
            orch.kill()
