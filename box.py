"""box.py: the run layer of the coverage scorer (sim.py): the sandbox and the one place that owns the
subprocesses. A run is a tiny sh script (build_script: rlimits as shell builtins, compile with iverilog,
record the compile status, then vvp under two `timeout`s: ONE SIGINT at the limit so the `final` blocks still
write partial coverage, SIGKILL to the whole process group KILL_AFTER_S later)
executed in a fresh run folder by this process's persistent sh loop (_Box: ONE bubblewrap start per process,
i.e. per SimPool worker; bwrap_argv says what the sandbox shows). run_job_dir hands a run to a box, drains its
output with head+tail kept and a byte cap (output_limit), and kills the process tree at a wall-clock backstop.
Isolation guarantees and what is not covered: sim.py's docstring. sim.py re-exports the public names here
(sim.run_job_dir, sim.bwrap_usable, ...), so callers keep using sim.X.
"""
import atexit
import os
import selectors
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import secrets
from collections import deque
from dataclasses import dataclass

from instrument import _short

LOG_KEEP_BYTES = 8 << 10        # head and tail of the combined log kept in the result
FSIZE_LIMIT = 256 << 20         # RLIMIT_FSIZE: largest file a run may write
DISK_POLL_S = 0.05              # how often the run folder's size is measured against cfg.disk_limit_mb
NOFILE_LIMIT = 256              # RLIMIT_NOFILE: open files
KILL_AFTER_S = 3                # SIGKILL to the process group this long after the SIGINT
BACKSTOP_EXTRA_S = 10           # outer Python backstop beyond the inner timeouts


# ---------------------------------------------------------------------------------------------------------
# Build: the sandbox script and argv

def build_script(dut_names, defines, tb_name, vvp_name, cfg, after_tb=(), vpi_dir=""):
    """The sh script run inside the sandbox: resource limits (shell builtins: no extra process), compile,
    record the compile status, then simulate: at timeout_s vvp gets exactly ONE SIGINT (it stops and runs
    the `final` blocks that write the coverage records), KILL_AFTER_S later the process group gets SIGKILL.
    Two timeouts, because one `timeout -s INT -k ...` sends its SIGINT twice: to vvp and then to its process
    group. vvp turns each SIGINT into its stop flag, and a stop flag raised again while the `final` blocks
    run makes vvp drop each `final` thread after its next system task call: no record is written at all.
    Measured with Icarus 11: a second SIGINT delivered 9 us after the first was harmless, each one delivered
    18 to 270 us after it (while the `final` blocks ran) lost every record; `timeout` preempted between its
    two kill() calls on a loaded machine is enough. The inner
    `timeout --foreground` signals vvp only; the outer one sends only the SIGKILL, to the whole group (vvp,
    its children, both timeouts: exit 137). The second `timeout` costs about 1 ms of CPU per run. The shell's
    `times` before and after the simulation give its CPU seconds (RunOutput.sim_cpu_s): a wall-clock timeout with
    little CPU behind it means a busy machine, not a slow testbench (sim.starved_timeout)."""
    q = shlex.quote
    cpu = int(cfg.timeout_s + cfg.compile_timeout_s) + 5
    return (f"ulimit -v {cfg.mem_limit_mb << 10}\nulimit -t {cpu}\nulimit -f {FSIZE_LIMIT // 512}\n"
            f"ulimit -n {NOFILE_LIMIT}\nulimit -c 0\n"
            f"iverilog -g2012 {' '.join(q(d) for d in defines)} -o {q(vvp_name)} "
            f"{' '.join(q(n) for n in list(dut_names) + [tb_name] + list(after_tb))} 1>&2\n"
            "rc=$?\n"
            "echo $rc > compile.rc\n"
            "[ $rc -eq 0 ] || exit 0\n"
            "{ times; } > compile.times\n"             # braced: a failed redirection does not end the script
            "{ read -r _ && read -r c0; } < compile.times\n"       # kept in the shell: vvp may rewrite the file
            f"timeout -s KILL {cfg.timeout_s + KILL_AFTER_S:g} timeout --foreground -s INT {cfg.timeout_s:g} vvp "
            + (f"-M {q(vpi_dir)} -m toggle_cov " if vpi_dir else "") + f"-n {q(vvp_name)} -none 2>&1\n"
            "rc=$?\n"
            "{ echo \"$c0\"; times; } > sim.times\n"
            "exit $rc\n")


def bwrap_argv(run_dir, vpi_dir=""):
    """bubblewrap: read-only /usr, the run dir as the only writable path (/, /dev are remounted read-only,
    no /tmp: TMPDIR is the run dir), no /proc, /etc, /home or network; the VPI module's folder (when
    given) read-only at /vpi."""
    argv = ["bwrap", "--ro-bind", "/usr", "/usr"] + (["--ro-bind", vpi_dir, "/vpi"] if vpi_dir else [])
    for d in ("/bin", "/sbin", "/lib", "/lib64", "/lib32"):
        if os.path.islink(d):
            argv += ["--symlink", os.readlink(d).lstrip("/"), d]
        elif os.path.isdir(d):
            argv += ["--ro-bind", d, d]
    return argv + ["--dev", "/dev", "--bind", run_dir, "/sim", "--remount-ro", "/", "--remount-ro", "/dev",
                   "--chdir", "/sim", "--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL",
                   "--clearenv", "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "HOME", "/sim",
                   "--setenv", "TMPDIR", "/sim"]


_BWRAP_STATE = {}     # "ok": bool, "why": str (checked once per process)


def bwrap_usable():
    """Check once whether bubblewrap can start here (user namespaces etc.) and run iverilog inside;
    log once when it cannot."""
    if "ok" not in _BWRAP_STATE:
        why = ""
        tool = os.path.realpath(shutil.which("iverilog") or "iverilog")
        if shutil.which("bwrap") is None:
            why = "bwrap not found (apt-get install bubblewrap)"
        elif not tool.startswith(("/usr/", "/bin/")):
            why = f"iverilog at {tool} is outside /usr, which is all the sandbox shows"
        else:
            d = tempfile.mkdtemp(prefix="chorus_sim_chk_")
            try:
                p = subprocess.run(bwrap_argv(d) + ["iverilog", "-V"], capture_output=True, timeout=20)
                if p.returncode != 0:
                    why = "bwrap cannot start: " + _short(p.stderr.decode("utf-8", "replace"), 120)
            except (OSError, subprocess.TimeoutExpired) as e:
                why = f"bwrap cannot start: {e}"
            finally:
                shutil.rmtree(d, ignore_errors=True)
        _BWRAP_STATE["ok"], _BWRAP_STATE["why"] = not why, why
        if why:
            print(f"sim.py: sandbox without bubblewrap ({why}); using rlimits + timeout + a per-run dir",
                  file=sys.stderr)
    return _BWRAP_STATE["ok"]


# ---------------------------------------------------------------------------------------------------------
# Run: the one function that owns the subprocess, sandbox, limits, timeouts and output caps

@dataclass
class RunOutput:
    rc: int | None
    compile_rc: int | None
    head: bytes
    tail: bytes
    total_bytes: int
    output_limited: bool
    backstop_killed: bool
    compile_s: float
    sim_s: float
    sandbox: str
    command: str
    sim_cpu_s: float | None = None      # CPU seconds of the simulation (vvp, user + sys; None: not recorded)
    disk_limited: bool = False          # the run's files grew past cfg.disk_limit_mb; vvp was stopped


def _sim_cpu(path):
    """CPU seconds (user + system) of the simulation, from the run script's sim.times: the line of the shell's
    children's times before vvp, then `times` after it (its own line, then its children's), e.g.
    `0m1.250000s 0m0.030000s`; None when the file is missing or malformed."""
    def seconds(line):
        return sum(int(m) * 60 + float(sec) for m, sec in (w.rstrip("s").split("m") for w in line.split()[:2]))
    try:
        with open(path) as f:
            lines = f.read().split("\n")
        return round(max(0.0, seconds(lines[2]) - seconds(lines[0])), 3)
    except (OSError, IndexError, ValueError):
        return None


def _descendants(pid):
    children = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    stat = f.read().decode("utf-8", "replace")
                ppid = int(stat.rsplit(")", 1)[1].split()[1])
                comm = stat[stat.index("(") + 1:stat.rindex(")")]
            except (OSError, ValueError, IndexError):
                continue      # the process ended while we looked: nothing to signal
            children.setdefault(ppid, []).append((int(entry), comm))
    out, todo = [], [pid]
    while todo:
        for child, comm in children.get(todo.pop(), []):
            out.append((child, comm))
            todo.append(child)
    return out


def _signal_tree(pid, sig, only_comm=None):
    for child, comm in _descendants(pid):
        if only_comm is None or comm == only_comm:
            try:
                os.kill(child, sig)
            except ProcessLookupError:
                pass
    if only_comm is None:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


class _Box:
    """A bubblewrap sandbox kept for many runs of one process (each SimPool worker has its own): a sh loop
    inside reads (token, run folder, script) lines from stdin and runs the script in a subshell in
    /sim/<run folder>, with all output on stdout, then prints `<token> <exit status>`. Without the
    sandbox the same sh loop runs unsandboxed (one process start per run fewer, like the sandbox). The runs of a box
    come one after another; between two, the host empties the box's folder, the only writable path
    (/ and /dev are read-only, there is no /tmp), so nothing a run wrote is left for the next one. The
    token is random per run and only in the sh loop's memory (no /proc in the sandbox), so a testbench
    cannot print a fake end marker. A box that misses its deadline is killed and replaced."""
    # the end marker starts with its own newline: a run whose last output line has none (`$write("done")`)
    # would otherwise hide the token mid-line, and the run would wait for the backstop
    DRIVER = ('while IFS= read -r tok && IFS= read -r dir && IFS= read -r script; do '
              '( cd "$0/$dir" && HOME="$0/$dir" TMPDIR="$0/$dir" && export HOME TMPDIR && eval "$script" ) '
              '</dev/null 2>&1; rc=$?; printf "\\n%s %s\\n" "$tok" "$rc"; done')

    def __init__(self, vpi_dir, sandboxed):
        self.key = (vpi_dir, sandboxed)
        self.owner = os.getpid()          # a forked child must not share its parent's box
        self.root = tempfile.mkdtemp(prefix="chorus_simbox_")
        if sandboxed:
            argv, env = bwrap_argv(self.root, vpi_dir) + ["sh", "-c", self.DRIVER, "/sim"], None
        else:
            argv = ["sh", "-c", self.DRIVER, self.root]
            env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": self.root}
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     start_new_session=True, cwd=self.root, env=env)

    def alive(self):
        return self.proc.poll() is None

    def close(self):
        if self.alive():
            _signal_tree(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                f.close()
            except OSError:
                pass
        shutil.rmtree(self.root, ignore_errors=True)

    def empty(self):
        for name in os.listdir(self.root):
            path = os.path.join(self.root, name)
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                os.unlink(path)


_BOXES = []                     # idle boxes of this process (one per thread that runs at the same time)
_BOXES_LOCK = threading.Lock()


def _take_box(vpi_dir, sandboxed):
    with _BOXES_LOCK:
        if any(box.owner != os.getpid() for box in _BOXES):
            _BOXES[:] = []                # forked: the parent's boxes are the parent's (it closes them)
        for i, box in enumerate(_BOXES):
            if box.key == (vpi_dir, sandboxed):
                _BOXES.pop(i)
                if box.alive():
                    return box
                box.close()
                break
    return _Box(vpi_dir, sandboxed)


def _close_boxes():
    with _BOXES_LOCK:
        while _BOXES:
            box = _BOXES.pop()
            if box.owner == os.getpid():
                box.close()


atexit.register(_close_boxes)


def _run_in_box(run_dir, script, vpi_dir, sandboxed):
    """Move the run dir into a box's folder: (box, its path there, the run's end token, the stdin line)."""
    box = _take_box(vpi_dir, sandboxed)
    name = os.path.basename(run_dir)
    inside = os.path.join(box.root, name)
    os.rename(run_dir, inside)           # same filesystem (both under the temp dir): no copy
    tok = secrets.token_hex(8)
    line = (tok + "\n" + name + "\n" + script.replace("\n", "; ") + "\n").encode()
    return box, inside, tok, line


def _end_marker(last, tok):
    """(marker bytes, exit status) when the output so far ends with `\n<tok> <status>\n` (the box prints
    the leading newline itself, so the marker is found whatever the run's last line was), else None. The
    marker bytes include that newline, so the run's own output is kept exactly. A plain string test: a regex
    compiled per run token cost 0.6 ms of CPU per run."""
    if not last.endswith(b"\n"):
        return None
    i = last.rfind(b"\n" + tok + b" ", 0, len(last) - 1)
    status = last[i + len(tok) + 2:-1] if i >= 0 else b""
    if status.isdigit():
        return last[i:], int(status)
    return None


def _disk_use(path):
    """Bytes of disk the files under path use (st_blocks, so a sparse file counts what it really holds)."""
    total, todo = 0, [path]
    while todo:
        try:
            with os.scandir(todo.pop()) as it:
                for e in it:
                    try:
                        if e.is_dir(follow_symlinks=False):
                            todo.append(e.path)
                        else:
                            total += e.stat(follow_symlinks=False).st_blocks * 512
                    except OSError:
                        continue       # removed while we looked
        except OSError:
            continue
    return total


def _drain(fileno_streams, proc_pid, deadline, cfg, until=None, run_dir=None):
    """Read the run's output with head+tail kept and a byte cap (SIGINT to `timeout` past it) until every
    stream ends or the output ends with the end marker line of token `until` (bytes); SIGKILL the process
    tree at the deadline. run_dir: measured every DISK_POLL_S against cfg.disk_limit_mb (a per-run budget
    beside RLIMIT_FSIZE, which bounds one file only): past it vvp gets ONE SIGINT (the `final` blocks still
    write the coverage), past twice it the process tree is killed. Returns (head, tail, total, limited,
    killed, (marker, exit status) or None, disk_limited)."""
    head, tail = bytearray(), deque()
    tail_len, total, limited, killed, end, last = 0, 0, False, False, None, b""
    disk_cap = int(getattr(cfg, "disk_limit_mb", 0) or 0) << 20
    disk_limited, next_poll = False, 0.0
    sel = selectors.DefaultSelector()
    for f in fileno_streams:
        sel.register(f, selectors.EVENT_READ)
    open_streams = len(fileno_streams)
    while open_streams and end is None:
        remaining = deadline - time.monotonic()
        if remaining <= 0 and not killed:
            killed = True
            _signal_tree(proc_pid, signal.SIGKILL)
        if run_dir is not None and disk_cap and time.monotonic() >= next_poll:
            next_poll = time.monotonic() + DISK_POLL_S
            used = _disk_use(run_dir)
            if used > disk_cap and not disk_limited:
                disk_limited = True
                _signal_tree(proc_pid, signal.SIGINT, only_comm="vvp")
            elif used > 2 * disk_cap and not killed:
                killed = True
                _signal_tree(proc_pid, signal.SIGKILL)
        wait = min(remaining, 1.0 if run_dir is None or not disk_cap else DISK_POLL_S)
        for key, _ in sel.select(timeout=max(0.01, wait)):
            chunk = os.read(key.fileobj.fileno(), 65536)
            if not chunk:
                sel.unregister(key.fileobj)
                open_streams -= 1
                continue
            if until is not None:
                last = (last + chunk)[-128:]
                end = _end_marker(last, until)
                if end is not None:              # the marker is the last thing written: drop it
                    chunk = chunk[:len(chunk) - len(end[0])] if len(end[0]) <= len(chunk) else b""
            total += len(chunk)
            if len(head) < LOG_KEEP_BYTES:
                take = LOG_KEEP_BYTES - len(head)
                head += chunk[:take]
                chunk = chunk[take:]
            if chunk:
                tail.append(chunk)
                tail_len += len(chunk)
                while tail_len - len(tail[0]) >= LOG_KEEP_BYTES:
                    tail_len -= len(tail.popleft())
            if total > cfg.output_cap_bytes and not limited:
                limited = True       # ONE SIGINT, to vvp itself (via the timeouts it could come twice): `final` runs
                _signal_tree(proc_pid, signal.SIGINT, only_comm="vvp")
    sel.close()
    return head, b"".join(tail)[-LOG_KEEP_BYTES:], total, limited, killed, end, disk_limited


def run_job_dir(run_dir, script, cfg, vpi_dir=""):
    """Run script (limits, compile, sim) in run_dir through this process's persistent sh loop (_Box), in
    bubblewrap when usable; drain output with caps; backstop. vpi_dir: the host folder of the VPI module,
    shown read-only at /vpi inside the sandbox. The run dir is where it was again on return."""
    use_bwrap = cfg.sandbox and bwrap_usable()
    deadline = time.monotonic() + cfg.compile_timeout_s + cfg.timeout_s + KILL_AFTER_S + BACKSTOP_EXTRA_S
    # the script travels through the box's stdin, never as a file in the run dir: it holds the per-run
    # secrets (-D values), and the sandbox has no /proc where a testbench could look for them
    command = shlex.join((bwrap_argv(run_dir, vpi_dir) if use_bwrap else []) + ["sh", "-c", script])  # as one command
    box, inside, tok, line = _run_in_box(run_dir, script, vpi_dir, use_bwrap)
    t0 = time.time()
    rc, ok = None, False
    try:
        box.proc.stdin.write(line)
        box.proc.stdin.flush()
        head, tail, total, limited, killed, end, disk_limited = _drain(
            [box.proc.stdout], box.proc.pid, deadline, cfg, until=tok.encode(), run_dir=inside)
        if end is not None:
            rc, ok = end[1], not killed
        else:
            killed = True
    except OSError:                   # the box died (killed at the deadline, or broken): a new one next time
        head, tail, total, limited, killed, disk_limited = b"", b"", 0, False, True, False
    t_end = time.time()
    os.rename(inside, run_dir)
    if ok:
        box.empty()
        with _BOXES_LOCK:
            _BOXES.append(box)
    else:
        box.close()
    compile_rc, t_compiled = None, t_end
    rc_path = os.path.join(run_dir, "compile.rc")
    if os.path.exists(rc_path):
        with open(rc_path) as f:
            txt = f.read().strip()
        compile_rc = int(txt) if txt.lstrip("-").isdigit() else None
        t_compiled = os.path.getmtime(rc_path)
    return RunOutput(rc=rc, compile_rc=compile_rc, head=bytes(head), tail=bytes(tail), total_bytes=total,
                     output_limited=limited, backstop_killed=killed, disk_limited=disk_limited, compile_s=max(0.0, t_compiled - t0),
                     sim_s=max(0.0, t_end - t_compiled), sandbox="bwrap" if use_bwrap else "none",
                     command=command,
                     # not after a SIGKILL: the killed `timeout`s never reaped vvp, so its CPU never reached the
                     # shell's `times` (a 137 would read as ~0 s); nor after the backstop (the shell wrote nothing)
                     sim_cpu_s=_sim_cpu(os.path.join(run_dir, "sim.times")) if ok and rc != 137 else None)
