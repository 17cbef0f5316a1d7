"""Benchmark of the coverage scorer (sim.py) against bare Icarus, with the previous sim.py beside it.

Jobs: the dev set's 48 reference testbenches (../shared/data/dev_tasks.jsonl, RTLLM) plus the 7 test
designs of tests/designs. Measures, in one run, for 1 and 2 workers: bare `iverilog -g2012` + `vvp -n ...
-none` on the un-instrumented DUT (same files, same parallelism), and the scorer with the sandbox on and
off, for this sim.py ("new") and for sim.py at --old-commit ("old", run from a copy taken with `git show`).
Every configuration gets one warm-up pass (fills the prepared-DUT cache, as in RL where a DUT is scored
many times; with 2 workers each SimPool is started once and stays warm), then --repeat timed passes with
the configurations interleaved, so a change in the machine's load hits all of them alike (the timed passes
also hit the pre-scan cache, as RL/eval re-scores do). Figures are the best pass; overhead = scorer wall
/ bare wall (best against best, and pass by pass). It also checks
that old and new give the same results (status, covered/total per metric, per instance, uncovered items,
targets) and lists the jobs where they differ. Prints a table and writes JSON.

Run: python bench/bench_sim.py [--repeat 3] [--old-commit 2e18093] [--out results/bench_sim.json]   (make bench)
Targets (issue 18, 2 cores): sandbox on <= 1.3x bare with 1 and 2 workers; sandbox off <= 1.1x.
"""
import argparse
import concurrent.futures
import importlib.util
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import sim  # noqa: E402
import simpool  # noqa: E402


def plain_run(job, timeout_s):
    """The reference flow without the scorer: write files, iverilog, vvp (same timeout), clean up."""
    d = tempfile.mkdtemp(prefix="bench_plain_")
    try:
        names = []
        for f in job["rtl_files"]:
            Path(d, f["name"]).write_text(f["content"])
            names.append(f["name"])
        Path(d, "tb.sv").write_text(job["tb"])
        c = subprocess.run(["iverilog", "-g2012", "-o", "x.vvp", *names, "tb.sv"], cwd=d, capture_output=True)
        if c.returncode != 0:
            return "compile_error"
        r = subprocess.run(["timeout", "-s", "INT", f"{timeout_s:g}", "vvp", "-n", "x.vvp", "-none"], cwd=d,
                           capture_output=True)
        return "ok" if r.returncode == 0 else f"rc{r.returncode}"
    finally:
        shutil.rmtree(d, ignore_errors=True)


def cpu_s():
    """CPU seconds (user + sys) of this process, its waited-for children and the runs done by sim.py's
    persistent sh loops (sim._BOXES: their own and their reaped children's CPU, from /proc/<pid>/stat; only
    complete without the sandbox, where the loop is our child): less load-sensitive than wall."""
    me, ch = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    total = me.ru_utime + me.ru_stime + ch.ru_utime + ch.ru_stime
    for box in list(getattr(sim, "_BOXES", [])):
        try:
            with open(f"/proc/{box.proc.pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")   # utime stime cutime cstime
        except (OSError, ValueError, IndexError):
            pass
    return total


def runners(mod_new, mod_old, jobs, workers, timeout_s):
    """name -> function(jobs) -> statuses or results, for bare Icarus and the four scorer configurations.
    With 2 workers each scorer configuration has its own SimPool (started once, kept warm); close()s."""
    ex = concurrent.futures.ThreadPoolExecutor(workers)                # bare flow: subprocess-bound threads
    out, closers = {"bare": lambda js: list(ex.map(lambda j: plain_run(j, timeout_s), js))}, [ex.shutdown]
    for which, mod in (("new", mod_new), ("old", mod_old)):
        for label, sandbox in (("sandbox_on", True), ("sandbox_off", False)):
            cfg = mod.ScoreConfig(sandbox=sandbox)
            if workers == 1:                                           # in-process, like simulate_many
                out[f"{which}_{label}"] = lambda js, mod=mod, cfg=cfg: [mod.simulate(j, cfg) for j in js]
            else:
                pool = (mod.SimPool(workers, cfg) if hasattr(mod, "SimPool")        # before simpool.py
                        else simpool.SimPool(workers, cfg, script=mod.__file__))
                out[f"{which}_{label}"] = pool.map
                closers.append(pool.close)
    return out, closers


def measure(run, jobs, repeat):
    """Warm-up pass, then `repeat` passes with the configurations interleaved (pass 1: every configuration,
    pass 2: every configuration, ...), so a change in the machine's load hits all of them alike.
    Returns name -> {"wall": [s per pass], "cpu": [s per pass], "last": last pass's output}."""
    for f in run.values():
        f(jobs)                                                        # warm-up: page cache, DUT cache
    got = {name: {"wall": [], "cpu": [], "last": None} for name in run}
    for _ in range(repeat):
        for name, f in run.items():
            t0, c0 = time.perf_counter(), cpu_s()
            got[name]["last"] = f(jobs)
            got[name]["wall"].append(time.perf_counter() - t0)
            got[name]["cpu"].append(cpu_s() - c0)
    return got


def old_sim(commit):
    """sim.py (and instrument.py, tbcheck.py, box.py when that commit has them) at a commit, imported as a
    separate module; its workers (its own SimPool, or simpool.SimPool with script=) run that copy."""
    d = Path(tempfile.mkdtemp(prefix="bench_old_sim_"))
    for name in ("sim.py", "instrument.py", "tbcheck.py", "box.py", "vpi/toggle_cov.c"):
        p = subprocess.run(["git", "show", f"{commit}:{name}"], cwd=ROOT, capture_output=True)
        if p.returncode == 0:
            (d / name).parent.mkdir(parents=True, exist_ok=True)
            (d / name).write_bytes(p.stdout)
    if not (d / "sim.py").exists():
        raise SystemExit(f"bench_sim: no sim.py at commit {commit!r}")
    spec = importlib.util.spec_from_file_location("sim_old", d / "sim.py")
    mod = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(d))
    try:
        spec.loader.exec_module(mod)
    finally:
        sys.path.remove(str(d))
    return mod


COMPARED = ("status", "metrics", "per_instance", "uncovered", "targets", "overall_pct")


def test_design_jobs():
    d = ROOT / "tests" / "designs"
    cases = [("counter.sv", "counter", "tb_counter.sv"), ("fsm.sv", "fsm", "tb_fsm.sv"), ("alu.sv", "alu", "tb_alu.sv"),
             ("sub_lane.sv", "gen_top", "tb_gen.sv"), ("andor.sv", "andor", "tb_andor.sv"),
             ("glitch.sv", "glitch", "tb_glitch.sv"), ("tricky.sv", "tricky", "tb_tricky.sv")]
    return [{"id": f"tests/designs/{tb}", "top": top, "inst": "uut", "tb": (d / tb).read_text(), "targets": [],
             "rtl_files": [{"name": rtl, "content": (d / rtl).read_text()}]} for rtl, top, tb in cases]


def machine():
    cpu = ""
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        cpu = platform.processor()
    return {"cpu": cpu, "cores": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
            "loadavg_at_start": list(os.getloadavg()), **sim.tool_versions(), "bwrap_usable": sim.bwrap_usable()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tasks", default=str(ROOT.parent / "shared" / "data" / "dev_tasks.jsonl"),
                    help="task JSONL with reference_tb rows")
    ap.add_argument("--repeat", type=int, default=3, help="timed passes over the jobs (interleaved)")
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2], help="worker counts to measure")
    ap.add_argument("--old-commit", default="2e18093", help="the sim.py to compare with (git commit)")
    ap.add_argument("--out", default=str(ROOT / "results" / "bench_sim.json"), help="JSON output path")
    args = ap.parse_args()
    if not Path(args.tasks).exists():
        raise SystemExit(f"bench_sim: {args.tasks} not found (the dev set lives in ../shared/data)")
    try:
        tasks = [t for t in sim.load_tasks(args.tasks) if t.get("reference_tb")]
    except ValueError as e:
        raise SystemExit(f"bench_sim: {e}")
    jobs = [sim.job_from_task(t, t["reference_tb"]["content"]) for t in tasks] + test_design_jobs()
    commit = git_commit()           # taken before the measurement
    old = old_sim(args.old_commit)
    info = machine()
    info["toggle_backend"] = sim.toggle_backend(sim.ScoreConfig())
    print(f"bench_sim: {len(jobs)} jobs x {args.repeat} passes; {info['cpu']} ({info['cores']} cores), "
          f"iverilog {info['iverilog']}, bwrap usable: {info['bwrap_usable']}, toggle backend "
          f"{info['toggle_backend']}, old sim.py at {args.old_commit}, load {info['loadavg_at_start']}")
    rows = []
    n = len(jobs)
    for workers in args.workers:
        run, closers = runners(sim, old, jobs, workers, sim.ScoreConfig().timeout_s)
        try:
            got = measure(run, jobs, args.repeat)
        finally:
            for close in closers:
                close()
        bare = got["bare"]
        row = {"workers": workers, "runs_per_pass": n, "passes": args.repeat,
               "bare_runs_per_s": round(n / min(bare["wall"]), 2), "bare_ok": bare["last"].count("ok")}
        if workers == 1:
            row["bare_cpu_ms_per_run"] = round(1000 * min(bare["cpu"]) / n, 1)
        for name in run:
            if name == "bare":
                continue
            g, results = got[name], got[name]["last"]
            row[f"{name}_runs_per_s"] = round(n / min(g["wall"]), 2)
            # overhead: best pass against best pass, and pass by pass (the same moment's load) as a range
            row[f"{name}_overhead"] = round(min(g["wall"]) / min(bare["wall"]), 3)
            row[f"{name}_overhead_per_pass"] = [round(a / b, 3) for a, b in zip(g["wall"], bare["wall"])]
            if workers == 1 and name.endswith("sandbox_off"):   # bwrap's children are not reaped by us, and
                # pool workers' children are invisible from here: CPU only in-process with the sandbox off
                row[f"{name}_cpu_ms_per_run"] = round(1000 * min(g["cpu"]) / n, 1)
                row[f"{name}_cpu_overhead"] = round(min(g["cpu"]) / min(bare["cpu"]), 3)
            row[f"{name}_ok"] = sum(r.status == "ok" for r in results)
            row[f"{name}_median_ms"] = {k: round(1000 * sorted(r.timings.get(k, 0) for r in results)[len(results) // 2], 1)
                                        for k in ("prepare", "check", "compile", "sim", "score", "total")}
            if name.startswith("old_"):          # same jobs, same order: old and new results side by side
                new = got["new_" + name[4:]]["last"]
                row[f"{name[4:]}_results_differ"] = [
                    j["id"] for j, a, b in zip(jobs, new, results)
                    if {k: getattr(a, k) for k in COMPARED} != {k: getattr(b, k) for k in COMPARED}]
        rows.append(row)
        print(f"workers={workers}: bare {row['bare_runs_per_s']:6.1f} runs/s | "
              + " | ".join(f"{w} {lab.replace('_', ' ')} {row[f'{w}_{lab}_runs_per_s']:6.1f} runs/s "
                           f"({row[f'{w}_{lab}_overhead']:.2f}x)" for w in ("new", "old")
                           for lab in ("sandbox_on", "sandbox_off"))
              + (f" | CPU ms/run bare {row['bare_cpu_ms_per_run']}, new {row['new_sandbox_off_cpu_ms_per_run']}, "
                 f"old {row['old_sandbox_off_cpu_ms_per_run']} (sandbox off)" if workers == 1 else "")
              + f" | results differ old/new: {row['sandbox_on_results_differ']}")
    out = {"command": "python bench/bench_sim.py " + " ".join(sys.argv[1:]), "commit": commit,
           "old_commit": args.old_commit, "machine": info, "jobs": len(jobs), "repeat": args.repeat, "rows": rows,
           "prescan_cache_size": sim.PRESCAN_CACHE_SIZE, "loadavg_at_end": list(os.getloadavg()),
           "targets": {"overhead_sandbox_on": 1.3, "overhead_sandbox_off": 1.1}}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.out}")


def git_commit():
    p = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True,
                           text=True).stdout.strip()
    return p.stdout.strip() + ("+dirty" if dirty else "")


if __name__ == "__main__":
    main()
