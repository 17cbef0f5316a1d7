"""sim.py: chorus-mini's coverage scorer. Scores a SystemVerilog stimulus testbench by the code coverage it
reaches on a DUT instance, with plain Icarus Verilog (iverilog -g2012 + vvp), approximating the reference
flow (Cadence xrun -coverage all + IMC "Overall Average" of the `uut` row). Every number the kit uses (RL
reward, data curation, evaluation, the distillation gate) comes from here. Design: docs/coverage.md.

How it works (three layers, each testable alone):
  1. Build (instrument.py). `prepare_dut` parses the DUT with pyslang and writes an instrumented copy:
     1-bit probe registers for block/branch/expression/FSM items, toggle monitoring (VPI callbacks,
     vpi/toggle_cov.c, or per-signal Verilog monitors), and per scope (module body or generate block) a
     `final` block that appends `%m` and the probe bits to a per-run file. Inserted text
     never contains a newline, so file:line in messages is the ORIGINAL file and line. Cached by content hash.
     `check_testbench` (tbcheck.py) pre-scans the testbench (cached per testbench+DUT+inst hash).
     `build_script`/`bwrap_argv` turn a run into argv lists.
  2. Run (box.py, re-exported here). `run_job_dir` hands the run to this process's persistent sh loop (`_Box`: ONE bubblewrap start
     per process, i.e. per simpool.SimPool worker), which runs a tiny script in a subshell in the run's fresh
     folder: resource limits, compile (iverilog), simulate (one SIGINT at the limit, then SIGKILL: vvp -n ... -none).
  3. Parse. `score_run` reads the probe records (per-run secret tag), keeps `<tbtop>.<inst>` and everything
     below it (generate blocks, submodules), and computes metrics -> `SimResult`.

Metrics (metric_def_version 1; docs/coverage.md "Metric definitions"): block, branch, expression (n+1 rows per
&&/|| chain), toggle (bit covered iff 0->1 and 1->0 seen between END-OF-TIMESTEP values, as in a VCD, so
zero-time glitches never count; the time-0 value is the starting value; X/Z transitions don't count),
fsm (heuristic states + S->T transitions). overall_pct = mean over block, expression, toggle, fsm with
items (profile "imc"); profile "strict" adds branch. overall_covered_pct is item weighted.
reward = 1 + overall/100 when status is ok, else 0 (so timeout and sim_time_limit earn 0, as the paper's
harness fails a run that does not finish). For many runs keep one simpool.SimPool (workers start once).

What the sandbox covers (when bubblewrap works): the box's folder (mounted at /sim), holding only the
current run's fresh folder and emptied between runs, is the only writable path (/ and /dev are remounted
read-only, there is no /tmp); /usr is read-only; no /etc, /home, /proc or network; private pid/ipc/uts/user namespaces;
all capabilities dropped; rlimits (set with the shell's ulimit builtins: the same limits prlimit sets, one
process fewer) bound address space, CPU seconds, file size and open files; a timeout INSIDE the sandbox
sends SIGINT so vvp runs `final` blocks and partial coverage survives; stdout/stderr are
drained with head+tail kept and a byte cap (output_limit); an outer wall-clock backstop kills the process
tree. The pre-scan rejects `include, `$system`, `bind`, any mention of the probe prefix `__cv`, modules
that redefine DUT modules, and writes/forces into the DUT hierarchy. Probe records carry a per-run secret
tag and go to a per-run secret file name, both passed as iverilog -D macros, so they exist only inside the
compiled program, whose file name is random (there is no /proc in the sandbox and Verilog cannot list a
directory); macro token pasting is rejected so a testbench cannot assemble the macro names; duplicated
records are detected and rejected.
What it does NOT cover: without bubblewrap (missing, or no user namespaces; logged once) there is no
filesystem isolation: `$fopen` can read or write any file the user can, and a testbench that reads
/proc/self/cmdline could in principle learn the compiled program's name and forge probe records. CPU and
memory are bounded per process, not per run. The instrumented DUT sources stay readable in the run dir
(they hold probe names, never the per-run secrets). A DUT is trusted input: it is compiled as given.

Known gaps and deviations from docs/coverage.md:
  - Functions/tasks in the DUT are not instrumented (noted); macro-expanded statements are not
    instrumented (noted); `include in a DUT is not instrumented (noted).
  - FSM extraction is heuristic: `case (X)` with >= 2 identifier labels (parameters/localparams/enum
    members) and constant assignments to X or its next-state variable. Numeric-label FSMs and if-chain FSMs
    are missed; hold and reset arcs are not scored.
  - Toggle: types resolved syntactically (typedefs in the given files only); packed structs, enums, the
    int family, real, string, event and unpacked arrays are excluded (ints/enums configurable). Bits are
    reported as offsets from the LSB end of the declared packed range. Multi-dim packed vectors count as
    one flat vector.
  - Expression rows are evaluated locally per chain (not sensitised to the outer result); chains and
    ternaries whose terms contain calls, ++/-- or assignments are skipped. Continuous assignments are not
    blocks; their ternaries/chains are monitored by an always_comb (may see zero-time glitches).
  - Toggle backends: "vpi" (vpi/toggle_cov.c, value-change callbacks, built with iverilog-vpi at first use
    and cached by content hash) where a C compiler exists, else "verilog" (one monitor process per signal);
    identical results (tests/test_sim_backends.py, the VCD cross-check runs both). Both read the final
    value at the end, so a change in the time step that calls $finish counts, as in a VCD.
  - Simulated-time limit (ScoreConfig.sim_time_limit, in the testbench's time units): a watchdog module
    compiled after the testbench (so it inherits its `timescale) waits the limit, then the next change on
    any DUT top port ends the run with $finish -> status sim_time_limit, coverage kept, reward 0. A run
    that runs out of events ends by itself as before; one that keeps running without touching the DUT's
    ports is stopped by the wall-clock timeout only. A `timeunit` inside the tb module is not seen.
  - The wall-clock timeout depends on the machine's load: a run near its limit passes on a quiet machine and
    times out on a busy one. Each run records its simulation's CPU seconds (timings["sim_cpu"], the shell's
    `times` around vvp); starved_timeout() names a timeout that got less than half its limit in CPU time, and
    the data builds (teacher.calibrate, build_sft, the random floor) and bench/score_answers.py run those once
    more alone (simpool.rerun_starved; simpool.simulate_many / score_answers retry_starved). Training and
    evaluation score as before: a timeout earns 0 whatever its cause; rl.py and distill.py log each step's
    timeout_rate and starved_timeouts, so a run can see when load cost it rewards.
  - Pre-scan unsupported-construct findings (covergroup, SVA, randomize, clocking, ...) do not block the
    run: they are reported as the first errors when Icarus then fails, and as notes when it does not.
  - Limits: rlimits come from `ulimit` in the sandbox script rather than the prlimit binary (same kernel
    limits); the compile has no separate wall timer (CPU rlimit + the outer backstop bound it).
  - `passed` with no targets is just status == ok. always_comb blocks run once at time 0 (Icarus and the
    LRM), so a `default:` arm reached only while the case expression is still X counts as covered.
  - ScoreConfig adds compile_timeout_s and keep_run_dir to the contract's fields; SimResult adds targets
    (per-target actual/met), per_instance (cumulative per module instance), found_dut_paths, command, run_dir.

Usage:
  python sim.py score --rtl A.sv [B.sv ...] --top MODULE --inst NAME --tb tb.sv [--target 90] [--json]
  python sim.py score --tasks FILE.jsonl --id TASK_ID --tb tb.sv [--json]
  python sim.py prepare --rtl A.sv [...] --top MODULE
"""
import argparse
import dataclasses
import hashlib
import json
import os
import re
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field

import pyslang

from instrument import (METRIC_DEF_VERSION, MAX_ERRORS, Item, PreparedDUT, PrepareError, Scope,  # noqa: F401
                        _short, run_defines, watchdog_source)
import instrument
from tbcheck import MAX_TB_BYTES, PRESCAN_CACHE_SIZE, check_testbench  # noqa: F401
from box import (BACKSTOP_EXTRA_S, FSIZE_LIMIT, KILL_AFTER_S, LOG_KEEP_BYTES, NOFILE_LIMIT,  # noqa: F401
                 _BOXES, _BWRAP_STATE, RunOutput, _close_boxes, build_script, bwrap_argv, bwrap_usable,
                 run_job_dir)
import box  # noqa: F401,E402  (sim.box: for tests that patch the run layer's constants)

SIM_PY_VERSION = "1.0"

# simulated-time limit (ScoreConfig.sim_time_limit), in the testbench's own time units (its `timescale):
# derived from the dev set's 48 reference testbenches, see results/sim.md "Simulated-time limit"
SIM_TIME_LIMIT_DEFAULT = 1_000_000

# result statuses, defined once
OK = "ok"                           # ran, DUT instance found, coverage read
REJECTED = "rejected"               # pre-scan refused the testbench (security / policy)
COMPILE_ERROR = "compile_error"     # iverilog failed (or the DUT could not be parsed)
RUNTIME_ERROR = "runtime_error"     # vvp exited non-zero or was killed (memory, CPU, $fatal)
TIMEOUT = "timeout"                 # wall-clock limit hit; SIGINT ran `final`, partial coverage kept
OUTPUT_LIMIT = "output_limit"       # printed more than output_cap_bytes (or wrote more than disk_limit_mb); SIGINT
SIM_TIME_LIMIT = "sim_time_limit"   # still driving the DUT after sim_time_limit; stopped, coverage kept
NO_DUT_INSTANCE = "no_dut_instance"  # coverage records exist but none under <tbtop>.<inst>
NO_COVERAGE = "no_coverage"         # no probe records at all, or the DUT instance has no items
INTERNAL_ERROR = "internal_error"   # a bug or environment problem in the scorer itself
STATUSES = (OK, REJECTED, COMPILE_ERROR, RUNTIME_ERROR, TIMEOUT, OUTPUT_LIMIT, SIM_TIME_LIMIT, NO_DUT_INSTANCE,
            NO_COVERAGE, INTERNAL_ERROR)

METRICS = ("block", "branch", "expression", "toggle", "fsm")
PROFILES = {"imc": ("block", "expression", "toggle", "fsm"),          # IMC "Overall Average" (default)
            "strict": ("block", "branch", "expression", "toggle", "fsm")}

MAX_UNCOVERED = 400             # uncovered items kept in a result (most useful first)


@dataclass(frozen=True)
class ScoreConfig:
    profile: str = "imc"                # "imc": overall = block, expression, toggle, fsm; "strict": + branch
    timeout_s: float = 20.0             # simulation wall clock (inside the sandbox, SIGINT keeps coverage)
    sim_time_limit: int = SIM_TIME_LIMIT_DEFAULT  # simulated time, in the testbench's time units (0: off)
    toggle_backend: str = "auto"        # "auto": "vpi" where vpi/toggle_cov.c builds, else "verilog"
    compile_timeout_s: float = 30.0     # iverilog wall clock
    mem_limit_mb: int = 4096            # RLIMIT_AS per process (ulimit -v)
    output_cap_bytes: int = 16 << 20    # total stdout+stderr bytes before output_limit
    disk_limit_mb: int = 256            # total bytes of files one run may hold (beside RLIMIT_FSIZE per file)
    sandbox: bool = True                # bubblewrap when usable (rlimits + timeout always)
    toggle_ints: bool = False           # score int/integer/byte/shortint/longint bits (Xcelium: off)
    toggle_enums: bool = False          # score enum-typed signals (Xcelium default: off)
    assign_blocks: bool = False         # count continuous assigns as (always covered) blocks
    keep_run_dir: bool = False          # keep the per-run directory for debugging (path in result.run_dir)


@dataclass
class SimResult:
    id: str = ""
    status: str = INTERNAL_ERROR
    compile_ok: bool = False
    sim_finished: bool = False          # vvp ended by itself ($finish/$stop/$fatal/empty event queue)
    timed_out: bool = False
    sim_time_limited: bool = False      # stopped by the simulated-time limit (status sim_time_limit)
    sim_time: int | None = None         # simulated time at the end, in the testbench's time units
    exit_code: int | None = None
    metrics: dict = field(default_factory=dict)       # {metric: {covered, total, pct}}
    overall_pct: float | None = None
    overall_covered_pct: float | None = None
    passed: bool = False
    targets: list = field(default_factory=list)       # [{inst_name, metric, target_percentage, actual, met}]
    per_instance: dict = field(default_factory=dict)  # {"uut.u_sub": {metric: {covered, total}}}
    uncovered: list = field(default_factory=list)
    errors: list = field(default_factory=list)        # [{source, file, line, col, msg}]
    found_dut_paths: list = field(default_factory=list)
    log_head: str = ""
    log_tail: str = ""
    timings: dict = field(default_factory=dict)
    versions: dict = field(default_factory=dict)
    notes: list = field(default_factory=list)
    command: str = ""                   # the sandboxed command line (paste to reproduce inside run_dir)
    run_dir: str = ""

    def to_dict(self):
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d):
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


# ---------------------------------------------------------------------------------------------------------
# Tasks and jobs

def read_jsonl(path):
    """(line number, object) for every non-blank line of a JSONL file; a line that is not a JSON object
    raises ValueError naming the file and line. (Also sft.py's reader.)"""
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{lineno}: malformed JSON ({e.msg})") from None
            if not isinstance(row, dict):
                raise ValueError(f"{path}:{lineno}: expected a JSON object, got {type(row).__name__}")
            yield lineno, row


def load_tasks(path):
    """Read a CVDP-ECov JSONL task file (id, rtl_files, dut_module_name, dut_instance_name, targets, ...)."""
    tasks = []
    for lineno, row in read_jsonl(path):
        if not isinstance(row, dict):
            raise ValueError(f"{path}:{lineno}: a task must be a JSON object, got {type(row).__name__}")
        missing = [k for k in ("id", "rtl_files", "dut_module_name", "dut_instance_name") if k not in row]
        if missing:
            raise ValueError(f"{path}:{lineno}: task is missing field(s) {', '.join(missing)}")
        why = _task_shape_error(row)
        if why:
            raise ValueError(f"{path}:{lineno}: task {row.get('id')!r}: {why}")
        tasks.append(row)
    return tasks


def _files_error(files, key):
    if not isinstance(files, list) or not files:
        return f"{key} must be a non-empty list of {{name, content}} objects, got {type(files).__name__}"
    for i, f in enumerate(files):
        if not isinstance(f, dict) or not isinstance(f.get("name"), str) or not isinstance(f.get("content"), str):
            return f"{key}[{i}] must be an object with string fields name and content"
    return None


def _targets_error(targets):
    if targets is None:
        return None
    if not isinstance(targets, list):
        return f"targets must be a list, got {type(targets).__name__}"
    for i, t in enumerate(targets):
        if not isinstance(t, dict):
            return f"targets[{i}] must be an object"
        missing = [k for k in ("inst_name", "metric", "target_percentage") if k not in t]
        if missing:
            return f"targets[{i}] is missing {', '.join(missing)}"
        v = t["target_percentage"]
        if isinstance(v, bool) or not isinstance(v, (int, float, str)):
            return f"targets[{i}].target_percentage must be a number, got {v!r}"
        try:
            v = float(v)
        except ValueError:
            return f"targets[{i}].target_percentage must be a number, got {t['target_percentage']!r}"
        if not 0 <= v <= 100:
            return f"targets[{i}].target_percentage must be within 0..100, got {v:g}"
    return None


def _task_shape_error(task):
    """Why a task row cannot be scored (a field of the wrong shape), or None."""
    for k in ("dut_module_name", "dut_instance_name"):
        if not isinstance(task[k], str) or not task[k]:
            return f"{k} must be a non-empty string, got {task[k]!r}"
    return _files_error(task["rtl_files"], "rtl_files") or _targets_error(task.get("targets"))


def job_from_task(task, tb_source, target_mode="cvdp", inst_path=None, all_uncovered=False):
    """A picklable job for simulate(): the task's RTL, top/instance names, the testbench and its targets.
    inst_path: the scored instance's full path (stimulus mode: f"tb_{top}.{inst}"); default: the instance
    named dut_instance_name directly under the testbench's top module. A task's `exclusions` (data/skill.py:
    {"rule", "items": [{"key", ...}]}) become the job's `exclude` keys: those items count nowhere.
    all_uncovered: keep every uncovered item in the result (default: the first MAX_UNCOVERED).

    target_mode "cvdp": the task's CVDP targets (metrics not starting with icarus_); "icarus": the kit's
    Icarus-calibrated targets (metric prefixed icarus_) when the task has them, else the CVDP ones."""
    if target_mode not in ("cvdp", "icarus"):
        raise ValueError(f"target_mode must be 'cvdp' or 'icarus', got {target_mode!r}")
    targets = list(task.get("targets") or [])
    icarus = [t for t in targets if str(t.get("metric", "")).startswith("icarus_")]
    cvdp = [t for t in targets if not str(t.get("metric", "")).startswith("icarus_")]
    chosen = icarus if (target_mode == "icarus" and icarus) else cvdp
    return {"id": task["id"],
            "rtl_files": [{"name": f["name"], "content": f["content"]} for f in task["rtl_files"]],
            "top": task["dut_module_name"], "inst": task["dut_instance_name"], "tb": tb_source,
            "targets": [{"inst_name": t["inst_name"], "metric": t["metric"],
                         "target_percentage": float(t["target_percentage"])} for t in chosen],
            **({"inst_path": inst_path} if inst_path else {}),
            **({"exclude": [x["key"] for x in task["exclusions"]["items"]]}
               if (task.get("exclusions") or {}).get("items") else {}),
            **({"all_uncovered": True} if all_uncovered else {})}


def check_job(job):
    if not isinstance(job, dict):
        raise ValueError(f"a job must be a dict, got {type(job).__name__}")
    for k in ("rtl_files", "top", "inst", "tb"):
        if k not in job:
            raise ValueError(f"job {job.get('id', '?')!r} is missing {k!r}")
    if not job["rtl_files"]:
        raise ValueError(f"job {job.get('id', '?')!r} has no rtl_files")
    why = (_files_error(job["rtl_files"], "rtl_files") or _targets_error(job.get("targets"))
           or next((f"{k} must be a string" for k in ("top", "inst", "tb") if not isinstance(job[k], str)), None))
    if why:
        raise ValueError(f"job {job.get('id', '?')!r}: {why}")
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_$]*", job["inst"]):
        raise ValueError(f"job {job.get('id', '?')!r}: instance name {job['inst']!r} is not a simple identifier")
    ex = job.get("exclude")
    if ex is not None and (not isinstance(ex, (list, tuple, set, frozenset)) or not all(isinstance(k, str) for k in ex)):
        raise ValueError(f"job {job.get('id', '?')!r}: exclude must be a list of item keys (strings)")
    if job.get("inst_path") is not None and (not isinstance(job["inst_path"], str)
                                             or not job["inst_path"].endswith("." + job["inst"])):
        raise ValueError(f"job {job.get('id', '?')!r}: inst_path {job['inst_path']!r} must be a dotted path "
                         f"ending in .{job['inst']}")




def prepare_dut(rtl_files, top, cfg=None):
    """Parse and instrument the DUT once (instrument.py; cached per process by content hash); raises
    PrepareError."""
    cfg = cfg or ScoreConfig()
    return instrument.prepare_dut(rtl_files, top, cfg, toggle_backend(cfg))


VPI_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "vpi", "toggle_cov.c")
_VPI_STATE = {}       # "dir": folder holding toggle_cov.vpi, or "" with "why" (checked once per process)


def vpi_module_dir():
    """The folder of the VPI toggle module, built with iverilog-vpi at first use and cached by content hash
    (source + iverilog version) under $CHORUS_CACHE or ~/.cache/chorus-mini; "" when it cannot be built
    (no iverilog-vpi or C compiler: logged once, the pure-Verilog monitors are used instead)."""
    if "dir" not in _VPI_STATE:
        why, out = "", ""
        try:
            with open(VPI_SOURCE, "rb") as f:
                src = f.read()
            tool = shutil.which("iverilog-vpi")
            if tool is None:
                raise OSError("iverilog-vpi not found")
            ver = subprocess.run(["iverilog", "-V"], capture_output=True, text=True, timeout=20).stdout.split("\n")[0]
            key = hashlib.sha256(src + b"\0" + ver.encode()).hexdigest()[:16]
            cache = os.environ.get("CHORUS_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "chorus-mini")
            out = os.path.join(cache, "vpi", key)
            if not os.path.exists(os.path.join(out, "toggle_cov.vpi")):
                os.makedirs(os.path.dirname(out), exist_ok=True)
                tmp = tempfile.mkdtemp(prefix="build_", dir=os.path.dirname(out))
                try:
                    shutil.copy(VPI_SOURCE, tmp)
                    p = subprocess.run([tool, "toggle_cov.c"], cwd=tmp, capture_output=True, text=True, timeout=120)
                    if p.returncode != 0 or not os.path.exists(os.path.join(tmp, "toggle_cov.vpi")):
                        raise OSError("iverilog-vpi failed: " + _short(p.stderr or p.stdout, 160))
                    try:
                        os.rename(tmp, out)          # atomic: another worker may have won the race
                    except OSError:
                        if not os.path.exists(os.path.join(out, "toggle_cov.vpi")):
                            raise
                finally:
                    shutil.rmtree(tmp, ignore_errors=True)
        except (OSError, subprocess.SubprocessError) as e:
            why, out = f"VPI toggle module unavailable ({e})", ""
        _VPI_STATE["dir"], _VPI_STATE["why"] = out, why
        if why:
            print(f"sim.py: {why}; toggle coverage uses the pure-Verilog monitors", file=sys.stderr)
    return _VPI_STATE["dir"]


def toggle_backend(cfg):
    """The toggle backend a run uses: cfg.toggle_backend, "auto" meaning "vpi" where the module builds."""
    if cfg.toggle_backend == "auto":
        return "vpi" if vpi_module_dir() else "verilog"
    if cfg.toggle_backend == "vpi" and not vpi_module_dir():
        raise RuntimeError(_VPI_STATE["why"])
    return cfg.toggle_backend


_VERSIONS = {}


def tool_versions():
    if not _VERSIONS:
        if shutil.which("iverilog") is None or shutil.which("vvp") is None:
            raise RuntimeError("iverilog/vvp not found on PATH (apt-get install iverilog)")
        out = subprocess.run(["iverilog", "-V"], capture_output=True, text=True).stdout
        m = re.search(r"version\s+(\S+)", out)
        _VERSIONS.update({"iverilog": m.group(1) if m else "unknown", "pyslang": pyslang.__version__,
                          "sim_py": SIM_PY_VERSION, "metric_def_version": METRIC_DEF_VERSION})
    return dict(_VERSIONS)


# ---------------------------------------------------------------------------------------------------------
# Parse: probe records -> metrics -> SimResult

def parse_records(text, tag):
    """Probe records of one run: {(sid, path): {"I": bits, "T": [bits...]}}; raises on duplicates (forgery)."""
    recs = {}
    for line in text.splitlines():
        parts = line.split(" ", 4)
        if len(parts) != 5 or parts[0] != tag or parts[1] not in ("I", "T") or not parts[2].isdigit():
            continue
        key = (int(parts[2]), parts[4].strip())
        rec = recs.setdefault(key, {})
        if parts[1] in rec:
            raise ValueError(f"duplicated probe record for {key[1]}")
        rec[parts[1]] = parts[3]
    return recs


def parse_end_record(text, tag):
    """(limit hit, end time) from the watchdog's `<tag> E <hit> <time>` line, or None without one."""
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 4 and parts[0] == tag and parts[1] == "E" and parts[2] in ("0", "1") and parts[3].isdigit():
            return parts[2] == "1", int(parts[3])
    return None


def _pct(cov, tot):
    return round(100.0 * cov / tot, 4) if tot else None


def item_key(metric, inst, sid=None, probe=None, signal=None, bit=None):
    """The stable name of one coverage item, relative to the scored instance (inst: `dut.u_sub`): probe
    items `METRIC:INST:SCOPE:PROBE`, toggle bits `toggle:INST:SIGNAL:BIT`. The same RTL gives the same keys
    whatever the testbench, so a task can list items to exclude (job["exclude"]; data/skill.py)."""
    return f"toggle:{inst}:{signal}:{bit}" if metric == "toggle" else f"{metric}:{inst}:{sid}:{probe}"


def overall_from_counts(counts, profile="imc", dropped=None):
    """overall_pct from per-metric [covered, total] counts, less `dropped` {metric: items} from the totals
    (items excluded after the run: they were uncovered in it, so its covered counts stand)."""
    pcts = []
    for m in PROFILES[profile]:
        c, t = counts.get(m, (0, 0))
        t -= (dropped or {}).get(m, 0)
        if t > 0:
            pcts.append(100.0 * c / t)
    return round(sum(pcts) / len(pcts), 4) if pcts else None


def uncovered_keys(result):
    """{item key: {metric, instance, file, line, detail}} of every uncovered item a result lists (a toggle
    entry expands to one key per bit). Complete only for a job run with all_uncovered."""
    out = {}
    for u in (result.uncovered if isinstance(result, SimResult) else result.get("uncovered")) or []:
        if "key" not in u:
            continue
        base = {"metric": u["metric"], "instance": u["instance"], "file": u.get("file", ""), "line": u.get("line", 0)}
        if u["metric"] == "toggle":
            for b in u.get("bits") or []:
                out[f"{u['key']}:{b}"] = {**base, "detail": f"{u['signal']}[{b}] toggle"}
        else:
            out[u["key"]] = {**base, "detail": u.get("detail", "")}
    return out


def _tally(prepared, recs, paths, uncovered=None, rel=None, excluded=frozenset(), dropped=None):
    """Covered/total per metric over the records whose path is in paths (and uncovered items). Items whose
    key is in `excluded` count nowhere (dropped[metric] counts them); an uncovered item carries its "key"
    (a toggle entry its key prefix; its bits complete it)."""
    counts = {m: [0, 0] for m in METRICS}
    for (sid, path) in sorted(recs, key=lambda k: k[1]):
        if path not in paths or sid >= len(prepared.scopes):
            continue
        sc, rec = prepared.scopes[sid], recs[(sid, path)]
        inst = rel(path) if rel else path
        bits = rec.get("I", "-")
        bits = "" if bits == "-" else bits
        hit = [i < len(bits) and bits[i] == "1" for i in range(len(sc.probes))]
        for it in sc.items:
            key = item_key(it.metric, inst, sid, it.probe)
            if key in excluded:
                if dropped is not None:
                    dropped[it.metric] = dropped.get(it.metric, 0) + 1
                continue
            counts[it.metric][1] += 1
            if hit[it.probe]:
                counts[it.metric][0] += 1
            elif uncovered is not None:
                u = {"metric": it.metric, "instance": inst, "file": it.file, "line": it.line, "kind": it.kind,
                     "detail": it.detail, "key": key}
                u.update(it.extra)
                uncovered.append(u)
        tog = rec.get("T", "-")
        vecs = [] if tog == "-" else tog.split(",")
        for name, s in sc.signals.items():
            j = s["index"]
            if 2 * j + 1 >= len(vecs):
                continue
            rise, fall = vecs[2 * j], vecs[2 * j + 1]
            n = len(rise)
            missing = {}
            for i in range(n):
                if excluded and item_key("toggle", inst, signal=name, bit=n - 1 - i) in excluded:
                    if dropped is not None:
                        dropped["toggle"] = dropped.get("toggle", 0) + 1
                    continue
                counts["toggle"][1] += 1
                r, f = rise[i] == "1", fall[i] == "1"
                if r and f:
                    counts["toggle"][0] += 1
                else:
                    miss = "both" if not r and not f else ("0->1" if not r else "1->0")
                    missing.setdefault(miss, []).append(n - 1 - i)
            if uncovered is not None:
                for miss, bl in missing.items():
                    uncovered.append({"metric": "toggle", "instance": inst, "file": sc.file, "line": s["line"],
                                      "kind": "toggle", "detail": _toggle_detail(name, sorted(bl), n, miss),
                                      "signal": name, "bits": sorted(bl), "missing": miss, "width": n,
                                      "key": f"toggle:{inst}:{name}"})
    return counts


def _toggle_detail(name, bits, width, miss):
    sel = "" if width == 1 else ("[*]" if len(bits) == width else f"[{_bit_ranges(bits)}]")
    what = {"both": "never toggled", "0->1": "never rose 0->1", "1->0": "never fell 1->0"}[miss]
    return f"{name}{sel} {what}"


def _bit_ranges(bits):
    out, i = [], 0
    while i < len(bits):
        j = i
        while j + 1 < len(bits) and bits[j + 1] == bits[j] + 1:
            j += 1
        out.append(str(bits[i]) if i == j else f"{bits[i]}-{bits[j]}")
        i = j + 1
    return ",".join(out)


UNCOVERED_ORDER = {"block": 0, "branch": 1, "fsm": 2, "expression": 3, "toggle": 4}


def score_run(res, prepared, recs, job, cfg):
    """Fill metrics, overall, per-instance, targets and uncovered items of res from the probe records."""
    inst = job["inst"]
    top_sids = {sc.sid for sc in prepared.scopes if sc.kind == "module" and sc.module == prepared.top}
    dut_paths = sorted({p for (sid, p) in recs if sid in top_sids}, key=lambda p: (p.count("."), p))
    res.found_dut_paths = dut_paths[:20]
    # The scored instance is pinned to its full path: job["inst_path"] when given (stimulus mode:
    # tb_<top>.<inst>), else <testbench top>.<inst>. Any other instance of the DUT with that name is an
    # error, not a choice: "the shallowest" let a testbench add a second, easier `uut` and be scored on it.
    named = [p for p in dut_paths if p.split(".")[-1] == inst]
    want = job.get("inst_path")
    chosen = [p for p in named if (p == want if want else p.count(".") == 1)]
    if not named:
        return False
    if len(named) > 1 or len(chosen) != 1:
        where = want or f"<testbench top>.{inst}"
        res.errors = [{"source": "scorer", "file": "", "line": 0, "col": 0,
                       "msg": f"the DUT must be instantiated exactly once as {where}; found {prepared.top} "
                              f"instances named {inst!r} at {', '.join(named[:5])}"}]
        return False
    root = chosen[0]
    prefix = root[: -len(inst)]
    paths = {p for (_, p) in recs if p == root or p.startswith(root + ".")}

    def rel(p):
        return p[len(prefix):]
    uncovered, excluded, dropped = [], frozenset(job.get("exclude") or ()), {}
    counts = _tally(prepared, recs, paths, uncovered, rel, excluded, dropped)
    res.metrics = {m: {"covered": c, "total": t, "pct": _pct(c, t)} for m, (c, t) in counts.items()}
    if excluded:    # the task's exclusion list (unreachable items): said in the result, never silent
        for m in METRICS:
            res.metrics[m]["excluded"] = dropped.get(m, 0)
        res.notes.append(f"{sum(dropped.values())} coverage items excluded by the task's exclusion list "
                         f"({len(excluded)} listed)")
    use = PROFILES[cfg.profile]
    pcts = [res.metrics[m]["pct"] for m in use if res.metrics[m]["total"]]
    res.overall_pct = round(sum(pcts) / len(pcts), 4) if pcts else None
    cov, tot = sum(counts[m][0] for m in use), sum(counts[m][1] for m in use)
    res.overall_covered_pct = _pct(cov, tot)
    # per module instance (cumulative over everything below it)
    mod_sids = {sc.sid for sc in prepared.scopes if sc.kind == "module"}
    inst_paths = sorted({p for (sid, p) in recs if sid in mod_sids and p in paths}, key=lambda p: (p.count("."), p))
    for p in inst_paths[:200]:
        sub = {q for q in paths if q == p or q.startswith(p + ".")}
        c = counts if p == root else _tally(prepared, recs, sub, rel=rel, excluded=excluded)
        ent = {m: {"covered": cv, "total": t} for m, (cv, t) in c.items()}
        pp = [_pct(*c[m]) for m in use if c[m][1]]
        ent["overall_pct"] = round(sum(pp) / len(pp), 4) if pp else None
        res.per_instance[rel(p)] = ent
    uncovered.sort(key=lambda u: (UNCOVERED_ORDER[u["metric"]], u["instance"].count("."), u["line"]))
    if len(uncovered) > MAX_UNCOVERED and not job.get("all_uncovered"):
        res.notes.append(f"{len(uncovered)} uncovered items; kept the first {MAX_UNCOVERED}")
        uncovered = uncovered[:MAX_UNCOVERED]
    res.uncovered = uncovered
    return True


def _target_value(res, t, inst):
    metric = str(t["metric"]).lower()
    metric = metric[len("icarus_"):] if metric.startswith("icarus_") else metric
    name = t["inst_name"]
    if name == inst:
        row = res.per_instance.get(inst)
    else:
        row = res.per_instance.get(name) or next(
            (v for k, v in res.per_instance.items() if k.split(".")[-1] == name), None)
    if metric in ("overall_average", "overall", "average"):
        return (row or {}).get("overall_pct"), True
    if metric in METRICS:
        if row is None or not row[metric]["total"]:
            return None, False          # CVDP rule: a missing/null per-metric target is skipped
        return _pct(row[metric]["covered"], row[metric]["total"]), True
    raise ValueError(f"unknown target metric {t['metric']!r} (use overall_average, {', '.join(METRICS)}, "
                     "optionally prefixed icarus_)")


_ERR_RE = re.compile(r"^(?P<file>[^:\s]+):(?P<line>\d+):\s*(?P<msg>.*)$")


def _tool_errors(log, source, tb_name, names):
    errs = []
    for line in log.splitlines():
        m = _ERR_RE.match(line.strip())
        if not m:
            if source == "iverilog" and ("error" in line.lower() or "I give up" in line) and len(errs) < MAX_ERRORS:
                errs.append({"source": source, "file": "", "line": 0, "col": 0, "msg": line.strip()})
            continue
        msg = m.group("msg")
        low = msg.lower()
        if source == "iverilog" and not ("error" in low or (low.startswith("sorry") and "constant selects" not in low)):
            continue            # warnings and their follow-up lines (": Padding 3 high bits ...")
        if source == "vvp" and not ("error" in low or "fatal" in low):
            continue
        f = m.group("file")
        f = "tb.sv" if f == tb_name else f
        errs.append({"source": source, "file": f, "line": int(m.group("line")), "col": 0, "msg": msg})
        if len(errs) >= MAX_ERRORS:
            break
    return errs


def simulate(job, cfg=None):
    """Score one job ({id, rtl_files, top, inst, tb, targets}) -> SimResult. Never raises for bad
    testbenches: every failure is a status; scorer bugs become internal_error with the traceback in notes."""
    cfg = cfg or ScoreConfig()
    check_job(job)
    if cfg.profile not in PROFILES:
        raise ValueError(f"unknown profile {cfg.profile!r} (use {', '.join(PROFILES)})")
    res = SimResult(id=str(job.get("id", "")))
    t0 = time.perf_counter()
    try:
        res.versions = tool_versions()
        _simulate(job, cfg, res, t0)
    except Exception as e:      # a scorer bug or a broken environment: say so, never hide it
        res.status = INTERNAL_ERROR
        res.passed = False
        res.notes.append(f"internal error: {type(e).__name__}: {e}")
        res.notes.append(_short(traceback.format_exc(), 2000))
    res.timings["total"] = round(time.perf_counter() - t0, 4)
    return res


def _simulate(job, cfg, res, t0):
    try:
        prepared = prepare_dut(job["rtl_files"], job["top"], cfg)
    except PrepareError as e:
        res.status = COMPILE_ERROR
        res.errors = e.errors[:MAX_ERRORS] or [{"source": "pyslang", "file": "", "line": 0, "col": 0, "msg": str(e)}]
        res.notes.append(f"DUT could not be instrumented: {e}")
        return
    res.timings["prepare"] = round(time.perf_counter() - t0, 4)
    res.notes.extend(prepared.notes)
    t1 = time.perf_counter()
    forbidden, hints, diags = check_testbench(job["tb"], prepared, job["inst"])
    res.timings["check"] = round(time.perf_counter() - t1, 4)
    if forbidden:
        res.status = REJECTED
        res.errors = forbidden[:MAX_ERRORS]
        return
    run_dir = tempfile.mkdtemp(prefix="chorus_sim_")
    res.run_dir = run_dir
    try:
        names = [f["name"] for f in prepared.files]
        for f in prepared.files:
            with open(os.path.join(run_dir, f["name"]), "w", encoding="utf-8") as out:
                out.write(f["content"])
        tb_name = "tb.sv" if "tb.sv" not in names else "tb_0.sv"
        with open(os.path.join(run_dir, tb_name), "w", encoding="utf-8") as out:
            out.write(job["tb"])
        after_tb = []
        if cfg.sim_time_limit and cfg.sim_time_limit > 0:     # compiled last: inherits the tb's `timescale
            after_tb = ["cv_watchdog.sv" if "cv_watchdog.sv" not in names else "cv_watchdog_0.sv"]
            with open(os.path.join(run_dir, after_tb[0]), "w", encoding="utf-8") as out:
                out.write(watchdog_source(prepared.nonce))
        tag, out_file = secrets.token_hex(8), f".cov_{secrets.token_hex(8)}.txt"
        vpi_dir = vpi_module_dir() if prepared.toggle_backend == "vpi" else ""
        script = build_script(names, run_defines(prepared.nonce, out_file, tag, cfg.sim_time_limit), tb_name,
                              f"s{secrets.token_hex(6)}.vvp", cfg, after_tb,
                              ("/vpi" if cfg.sandbox and bwrap_usable() else vpi_dir) if vpi_dir else "")
        run = run_job_dir(run_dir, script, cfg, vpi_dir)
        res.versions["toggle_backend"] = prepared.toggle_backend
        res.command = run.command
        res.versions["sandbox"] = run.sandbox
        if run.sandbox == "none" and cfg.sandbox:
            res.notes.append(f"sandbox: {_BWRAP_STATE.get('why', 'bubblewrap unusable')}; ran with rlimits + timeout only")
        res.timings["compile"] = round(run.compile_s, 4)
        res.timings["sim"] = round(run.sim_s, 4)
        if run.sim_cpu_s is not None:
            res.timings["sim_cpu"] = run.sim_cpu_s
        res.timings["sim_limit"] = cfg.timeout_s      # what sim_cpu is measured against (starved_timeout)
        log = (run.head + (b"\n...[" + str(run.total_bytes - len(run.head) - len(run.tail)).encode()
                           + b" bytes cut]...\n" if run.total_bytes > len(run.head) + len(run.tail) else b"")
               + run.tail).decode("utf-8", "replace")
        res.log_head = run.head.decode("utf-8", "replace")
        res.log_tail = run.tail.decode("utf-8", "replace")
        t2 = time.perf_counter()
        if run.compile_rc is None:
            res.status = INTERNAL_ERROR if not run.backstop_killed else TIMEOUT
            res.errors = [{"source": "sandbox", "file": "", "line": 0, "col": 0,
                           "msg": f"the run script did not record a compile status (rc={run.rc})"}]
            res.notes.append("see log_head for the sandbox's message")
            return
        if run.compile_rc != 0:
            errs = _tool_errors(log, "iverilog", tb_name, names)
            if any("__cv" in e["msg"] for e in errs):
                res.status = INTERNAL_ERROR
                res.notes.append("the instrumented DUT failed to compile (scorer bug); run `sim.py prepare` on it")
            else:
                res.status = COMPILE_ERROR
            if not errs:       # no file:line message (e.g. the compiler crashed): show the log's end
                errs = [{"source": "iverilog", "file": "", "line": 0, "col": 0,
                         "msg": _short(log.strip()[-300:], 300) or f"iverilog exited with {run.compile_rc}"}]
            if run.compile_rc in (124, 137, -9):
                errs.insert(0, {"source": "iverilog", "file": "", "line": 0, "col": 0,
                                "msg": f"compile killed after {cfg.compile_timeout_s:g}s or by a limit"})
            res.errors = (hints + diags + errs)[:MAX_ERRORS]
            return
        res.compile_ok = True
        for h in hints:
            res.notes.append(f"tb.sv:{h['line']}: {h['msg']} (it compiled anyway)")
        res.exit_code = run.rc
        # 124: the inner `timeout` sent SIGINT; 137 after >= timeout_s: the outer one had to follow up with SIGKILL
        res.timed_out = run.rc == 124 or run.backstop_killed or (run.rc == 137 and run.sim_s >= cfg.timeout_s)
        res.sim_finished = not res.timed_out and not run.output_limited and not run.disk_limited and run.rc == 0
        cov_path = os.path.join(run_dir, out_file)
        text = ""
        if os.path.exists(cov_path):
            with open(cov_path, encoding="utf-8", errors="replace") as f:
                text = f.read(FSIZE_LIMIT)
        end = parse_end_record(text, tag)
        if end is not None:
            res.sim_time_limited, res.sim_time = end
            res.sim_finished = res.sim_finished and not res.sim_time_limited
        try:
            recs = parse_records(text, tag)
        except ValueError as e:
            res.status = REJECTED
            res.errors = [{"source": "scorer", "file": "", "line": 0, "col": 0,
                           "msg": f"forged or duplicated coverage records ({e})"}]
            return
        found = score_run(res, prepared, recs, job, cfg) if recs else False
        if run.output_limited:
            res.status = OUTPUT_LIMIT
            res.errors = [{"source": "vvp", "file": "", "line": 0, "col": 0,
                           "msg": f"the simulation printed more than {cfg.output_cap_bytes} bytes; stopped"}]
        elif run.disk_limited:
            res.status = OUTPUT_LIMIT
            res.errors = [{"source": "vvp", "file": "", "line": 0, "col": 0,
                           "msg": f"the run's files grew past {cfg.disk_limit_mb} MiB; stopped"}]
        elif res.timed_out:
            res.status = TIMEOUT
            res.errors = [{"source": "vvp", "file": "", "line": 0, "col": 0,
                           "msg": f"simulation did not finish within {cfg.timeout_s:g}s (missing $finish?)"}]
        elif res.sim_time_limited:
            res.status = SIM_TIME_LIMIT
            res.errors = [{"source": "vvp", "file": "", "line": 0, "col": 0,
                           "msg": f"the testbench was still driving the DUT after the simulated-time limit "
                                  f"({cfg.sim_time_limit} time units); end the stimulus with $finish"}]
        elif run.rc != 0:
            res.status = RUNTIME_ERROR
            why = {-9: "killed (CPU or memory limit)", 137: "killed (CPU or memory limit)",
                   134: "aborted (out of memory?)", -6: "aborted (out of memory?)"}.get(run.rc, f"exit code {run.rc}")
            res.errors = (_tool_errors(log, "vvp", tb_name, names) +
                          [{"source": "vvp", "file": "", "line": 0, "col": 0, "msg": f"vvp {why}"}])[:MAX_ERRORS]
        elif not recs:
            res.status = NO_COVERAGE
            res.errors = [{"source": "scorer", "file": "", "line": 0, "col": 0,
                           "msg": "the simulation wrote no coverage records (did it elaborate the DUT?)"}]
        elif not found and res.errors:        # score_run said why (the instance is not where it must be)
            res.status = NO_DUT_INSTANCE
        elif not found:
            res.status = NO_DUT_INSTANCE
            inst_paths = [p for p in res.found_dut_paths if "." in p]
            msg = (f"no instance named {job['inst']!r} of module {prepared.top!r} (found it at: "
                   f"{', '.join(inst_paths[:5])})" if inst_paths else
                   f"the testbench does not instantiate module {prepared.top!r} (expected instance {job['inst']!r})")
            res.errors = [{"source": "scorer", "file": "", "line": 0, "col": 0, "msg": msg}]
        elif res.overall_pct is None:
            res.status = NO_COVERAGE
            res.errors = [{"source": "scorer", "file": "", "line": 0, "col": 0,
                           "msg": "the DUT instance has no coverage items"}]
        else:
            res.status = OK
        if found:
            for t in job.get("targets") or []:
                actual, applies = _target_value(res, t, job["inst"])
                met = (actual is not None and actual >= float(t["target_percentage"])) if applies else True
                res.targets.append({**t, "actual": actual, "met": met, "applies": applies})
        res.passed = res.status == OK and all(t["met"] for t in res.targets)
        res.timings["score"] = round(time.perf_counter() - t2, 4)
    finally:
        if not cfg.keep_run_dir:
            shutil.rmtree(run_dir, ignore_errors=True)
            res.run_dir = run_dir + " (removed; ScoreConfig(keep_run_dir=True) keeps it)"


def reward(result):
    """RL reward: 1 + overall/100 when the run is ok and has coverage, else 0 (docs/method.md §4.3: R in {0} U [1,2])."""
    if result.status == OK and result.overall_pct is not None:
        return 1.0 + result.overall_pct / 100.0
    return 0.0


# ---------------------------------------------------------------------------------------------------------
# Many runs (simpool.py): `python sim.py worker` is what each of SimPool's long-lived processes runs

def _worker_main(cfg_json):
    """`python sim.py worker`: read one job (JSON) per stdin line, write one result (JSON) per stdout line."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)      # the parent decides about Ctrl-C
    cfg = ScoreConfig(**json.loads(cfg_json))
    for line in sys.stdin:
        try:
            out = simulate(json.loads(line), cfg).to_dict()
        except ValueError as e:                       # a malformed job: the caller gets the exception
            out = {"error": str(e)}
        sys.stdout.write(json.dumps(out) + "\n")
        sys.stdout.flush()
    return 0


STARVED_CPU_SHARE = 0.5     # a timeout whose simulation got less than this share of the limit in CPU time


def starved_timeout(result, timeout_s=None):
    """True for a wall-clock timeout (status timeout) whose simulation had less than STARVED_CPU_SHARE of the
    limit (timeout_s, else the result's timings["sim_limit"]) in CPU seconds (timings["sim_cpu"]): the machine
    was busy, and on a quieter one the run may finish. A zero-delay loop or a long testbench uses its whole
    limit, so it is not starved. result: a SimResult or its dict."""
    get = result.get if isinstance(result, dict) else (lambda k, d=None: getattr(result, k, d))
    timings = get("timings") or {}
    cpu, limit = timings.get("sim_cpu"), timeout_s or timings.get("sim_limit")
    return get("status") == TIMEOUT and cpu is not None and limit is not None and cpu < STARVED_CPU_SHARE * limit


# ---------------------------------------------------------------------------------------------------------
# Feedback for the model

def format_feedback(result, max_chars=1500):
    """Compact text for the model: errors on failure, else the coverage summary + most useful uncovered items."""
    r = result
    lines = []
    if r.status in (REJECTED, COMPILE_ERROR, INTERNAL_ERROR) or (r.status != OK and not r.metrics):
        head = {REJECTED: "Testbench rejected by the scorer", COMPILE_ERROR: "Compilation failed",
                INTERNAL_ERROR: "Scorer internal error"}.get(r.status, f"Simulation status: {r.status}")
        lines.append(head + ":")
        for e in r.errors:
            where = f"{e['file']}:{e['line']}: " if e.get("file") and e.get("line") else ""
            lines.append(f"- {where}{e['msg']}")
        if not r.errors and r.log_tail:
            lines.append(_short(r.log_tail, 400))
        if r.status == INTERNAL_ERROR:
            lines.extend(n for n in r.notes[:1])
        return _clip("\n".join(lines), max_chars)
    if r.status != OK:
        lines.append(f"Simulation status: {r.status}. " + " ".join(e["msg"] for e in r.errors[:2]))
        log = (r.log_head + r.log_tail).strip()
        if r.status == RUNTIME_ERROR and log:
            lines.append("Log tail: " + _short(log[-300:], 300))
    if r.status == NO_DUT_INSTANCE:
        return _clip("\n".join(lines), max_chars)
    m = r.metrics
    inst = next(iter(r.per_instance), "uut")
    parts = [f"{k} {m[k]['covered']}/{m[k]['total']}" for k in ("block", "branch", "expression", "toggle", "fsm")
             if m.get(k, {}).get("total")]
    ov = "n/a" if r.overall_pct is None else f"{r.overall_pct:.1f}%"
    lines.append(f"Coverage of {inst}: overall {ov} | " + " | ".join(parts))
    for t in r.targets:
        if t.get("applies", True):
            act = "n/a" if t["actual"] is None else f"{t['actual']:.1f}%"
            lines.append(f"Target {t['metric']} of {t['inst_name']} >= {t['target_percentage']:g}%: "
                         f"{act} ({'met' if t['met'] else 'NOT met'})")
    seen_probe = set()
    for u in r.uncovered:
        if u["metric"] == "branch" and (u["instance"], u["file"], u["line"], u["detail"]) in seen_probe:
            continue      # the branch item of an uncovered block: one line is enough
        seen_probe.add((u["instance"], u["file"], u["line"], u["detail"]))
        if u["metric"] == "toggle":
            lines.append(f"- [toggle] {u['instance']}.{u['detail']}")
        else:
            lines.append(f"- [{u['metric']}] {u['instance']} ({u['file']}:{u['line']}) {u['detail']}")
    return _clip("\n".join(lines), max_chars)


def _clip(text, n):
    if len(text) <= n:
        return text
    cut = text.rfind("\n", 0, n - 20)
    return text[: cut if cut > 0 else n - 20] + "\n- ... (more omitted)"


# ---------------------------------------------------------------------------------------------------------
# CLI

def _read(path):
    """A source file's text, or SystemExit with one line (missing, unreadable, binary, not UTF-8)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise SystemExit(f"sim.py: cannot read {path}: {e.strerror}")
    nul = data.find(b"\0")
    if nul >= 0:
        raise SystemExit(f"sim.py: {path}: a binary file (NUL byte at offset {nul}), not source text")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise SystemExit(f"sim.py: {path}: not UTF-8 text (byte {e.start})")


def main(argv=None):
    ap = argparse.ArgumentParser(description="Coverage scorer for SystemVerilog stimulus testbenches (Icarus).")
    sub = ap.add_subparsers(dest="cmd", required=True)
    sc = sub.add_parser("score", help="score a testbench against a DUT")
    sc.add_argument("--rtl", nargs="+", help="DUT source files")
    sc.add_argument("--top", help="DUT top module name")
    sc.add_argument("--inst", default="uut", help="DUT instance name in the testbench (default uut)")
    sc.add_argument("--tasks", help="CVDP-ECov task JSONL (instead of --rtl/--top/--inst)")
    sc.add_argument("--id", help="task id inside --tasks")
    sc.add_argument("--target-mode", default="cvdp", choices=["cvdp", "icarus"], help="which task targets to use")
    sc.add_argument("--tb", required=True, help="testbench file")
    sc.add_argument("--target", type=float, default=None, help="overall_average target %% for --inst (default: none)")
    sc.add_argument("--json", action="store_true", help="print exactly one JSON object (the result record)")
    sc.add_argument("--profile", default="imc", choices=sorted(PROFILES), help="overall metric set")
    sc.add_argument("--timeout", type=float, default=ScoreConfig.timeout_s, help="simulation timeout, seconds")
    sc.add_argument("--sim-time-limit", type=int, default=ScoreConfig.sim_time_limit,
                    help="simulated-time limit in the testbench's time units (0: off)")
    sc.add_argument("--no-sandbox", action="store_true", help="skip bubblewrap (rlimits + timeout still apply)")
    sc.add_argument("--keep", action="store_true", help="keep the per-run directory")
    pr = sub.add_parser("prepare", help="instrument + compile the DUT alone (exit 0 when it works)")
    pr.add_argument("--rtl", nargs="+", required=True, help="DUT source files")
    pr.add_argument("--top", required=True, help="DUT top module name")
    pr.add_argument("--show", action="store_true", help="print the instrumented source")
    wk = sub.add_parser("worker", help="internal: SimPool worker (JSON lines on stdin/stdout)")
    wk.add_argument("--cfg", default="{}", help="ScoreConfig fields as JSON")
    args = ap.parse_args(argv)

    if args.cmd == "worker":
        return _worker_main(args.cfg)
    if args.cmd == "score":          # ranges, before any work starts
        bad = (f"--timeout must be a positive number of seconds, got {args.timeout:g}"
               if not 0 < args.timeout < float("inf") else
               f"--sim-time-limit must be >= 0 (0: off), got {args.sim_time_limit}" if args.sim_time_limit < 0 else
               f"--target must be within 0..100, got {args.target:g}"
               if args.target is not None and not 0 <= args.target <= 100 else None)
        if bad:
            raise SystemExit(f"sim.py: {bad}")
    if shutil.which("iverilog") is None or shutil.which("vvp") is None:
        raise SystemExit("sim.py: iverilog/vvp not found on PATH (apt-get install iverilog, or make sysdeps)")

    if args.cmd == "prepare":
        files = [{"name": os.path.basename(p), "content": _read(p)} for p in args.rtl]
        ok, msg = prepare_check(files, args.top)
        if args.show and ok:
            for f in prepare_dut(files, args.top).files:
                print(f"// ---- {f['name']} (instrumented)\n{f['content']}")
        print(msg)
        return 0 if ok else 1

    if args.tasks:
        if not args.id:
            raise SystemExit("sim.py: --tasks needs --id")
        try:
            tasks = load_tasks(args.tasks)
        except (OSError, ValueError) as e:
            raise SystemExit(f"sim.py: {e}")
        task = next((t for t in tasks if t["id"] == args.id), None)
        if task is None:
            raise SystemExit(f"sim.py: task id {args.id!r} not found in {args.tasks}")
        job = job_from_task(task, _read(args.tb), args.target_mode)
    else:
        if not args.rtl or not args.top:
            raise SystemExit("sim.py: score needs --rtl and --top (or --tasks and --id)")
        job = {"id": os.path.basename(args.tb), "top": args.top, "inst": args.inst, "tb": _read(args.tb),
               "rtl_files": [{"name": os.path.basename(p), "content": _read(p)} for p in args.rtl], "targets": []}
    if args.target is not None:
        job["targets"] = [{"inst_name": job["inst"], "metric": "overall_average", "target_percentage": args.target}]
    cfg = ScoreConfig(profile=args.profile, timeout_s=args.timeout, sandbox=not args.no_sandbox,
                      sim_time_limit=args.sim_time_limit,
                      keep_run_dir=args.keep)
    try:
        res = simulate(job, cfg)
    except ValueError as e:
        raise SystemExit(f"sim.py: {e}")
    if args.json:
        print(json.dumps(res.to_dict()))
    else:
        print(format_feedback(res, max_chars=4000))
        print(f"status={res.status} passed={res.passed} reward={reward(res):.4f} "
              f"time={res.timings.get('total', 0):.2f}s sandbox={res.versions.get('sandbox', '?')}")
    return 0


def prepare_check(rtl_files, top, cfg=None):
    """Instrument the DUT and compile it alone (sandboxed); returns (ok, one-line message)."""
    cfg = cfg or ScoreConfig()
    try:
        prepared = prepare_dut(rtl_files, top, cfg)
    except PrepareError as e:
        return False, f"prepare failed: {e}"
    run_dir = tempfile.mkdtemp(prefix="chorus_sim_prep_")
    try:
        names = [f["name"] for f in prepared.files]
        for f in prepared.files:
            with open(os.path.join(run_dir, f["name"]), "w", encoding="utf-8") as out:
                out.write(f["content"])
        script = (f"iverilog -g2012 -s {shlex.quote(top)} -o prep.vvp "
                  + " ".join(shlex.quote(d) for d in run_defines(prepared.nonce, ".cov.txt", "x")) + " "
                  + " ".join(shlex.quote(n) for n in names) + " 1>&2\necho $? > compile.rc\n")
        run = run_job_dir(run_dir, script, cfg)
        log = (run.head + run.tail).decode("utf-8", "replace")
        if run.compile_rc != 0:
            errs = _tool_errors(log, "iverilog", "tb.sv", names)
            first = errs[0] if errs else {"file": "", "line": 0, "msg": _short(log, 200) or f"rc={run.compile_rc}"}
            where = f"{first['file']}:{first['line']}: " if first.get("line") else ""
            return False, f"compile failed: {where}{first['msg']}"
        items = sum(len(s.items) for s in prepared.scopes)
        sigs = sum(len(s.signals) for s in prepared.scopes)
        return True, (f"ok: {len(prepared.modules)} module(s), {len(prepared.scopes)} scope(s), {items} items, "
                      f"{sigs} toggle signals; instrument {prepared.prepare_s * 1000:.0f} ms, "
                      f"compile {run.compile_s * 1000:.0f} ms")
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
