"""Benchmark of the coverage scorer (sim.py) on the dev set's reference testbenches (RTLLM, 48 jobs).

Measures, in one run: scorer runs/s with 1 and 2 workers (sandbox on and off) and the overhead of the scorer
versus plain `iverilog -g2012` + `vvp -n ... -none` on the same jobs with the same number of parallel runs.
Each measurement is one warm-up pass (fills the prepared-DUT cache, as in RL where a DUT is scored many
times; with 2 workers the SimPool is started once and stays warm) followed by --repeat timed passes. The
timed passes re-score the same testbenches, so they also hit sim.py's pre-scan cache (as RL/eval re-scores
do); a never-seen testbench costs the median "check" of the warm-up pass more (about 1 ms on these jobs).
Prints a table and writes JSON.

Run: python bench/bench_sim.py [--repeat 2] [--out results/bench_sim.json]   (make bench)
Targets (small designs, 2 cores): sandbox on >= 30 runs/s with 2 workers and overhead <= 1.5x; off <= 1.2x.
"""
import argparse
import concurrent.futures
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
    """CPU seconds (user + sys) of this process and its waited-for children: less load-sensitive than wall."""
    me, ch = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + ch.ru_utime + ch.ru_stime


def time_plain(jobs, workers, repeat, timeout_s):
    with concurrent.futures.ThreadPoolExecutor(workers) as ex:      # subprocess-bound: threads suffice
        list(ex.map(lambda j: plain_run(j, timeout_s), jobs))        # warm-up (page cache)
        t0, c0 = time.perf_counter(), cpu_s()
        for _ in range(repeat):
            statuses = list(ex.map(lambda j: plain_run(j, timeout_s), jobs))
        dt, cpu = time.perf_counter() - t0, cpu_s() - c0
    return dt, cpu, statuses


def time_scorer(jobs, workers, repeat, cfg):
    if workers == 1:
        run = lambda js: [sim.simulate(j, cfg) for j in js]        # noqa: E731 (in-process, like simulate_many)
        pool = None
    else:
        pool = sim.SimPool(workers, cfg)
        run = pool.map
    try:
        run(jobs)                                                     # warm-up: worker start + DUT cache
        t0, c0 = time.perf_counter(), cpu_s()
        for _ in range(repeat):
            results = run(jobs)
        dt, cpu = time.perf_counter() - t0, cpu_s() - c0
    finally:
        if pool is not None:
            pool.close()
    # CPU is only complete in-process (workers=1); pool workers' children are not visible from here
    return dt, (cpu if pool is None else None), [r.status for r in results], results


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
    ap.add_argument("--repeat", type=int, default=2, help="timed passes over the jobs per measurement")
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2], help="worker counts to measure")
    ap.add_argument("--out", default=str(ROOT / "results" / "bench_sim.json"), help="JSON output path")
    args = ap.parse_args()
    if not Path(args.tasks).exists():
        raise SystemExit(f"bench_sim: {args.tasks} not found (the dev set lives in ../shared/data)")
    tasks = [t for t in sim.load_tasks(args.tasks) if t.get("reference_tb")]
    jobs = [sim.job_from_task(t, t["reference_tb"]["content"]) for t in tasks]
    info = machine()
    print(f"bench_sim: {len(jobs)} jobs x {args.repeat} passes; {info['cpu']} ({info['cores']} cores), "
          f"iverilog {info['iverilog']}, bwrap usable: {info['bwrap_usable']}, load {info['loadavg_at_start']}")
    rows = []
    for workers in args.workers:
        plain_dt, plain_cpu, plain_st = time_plain(jobs, workers, args.repeat, sim.ScoreConfig().timeout_s)
        n = len(jobs) * args.repeat
        row = {"workers": workers, "runs": n, "plain_s": round(plain_dt, 3), "plain_runs_per_s": round(n / plain_dt, 2),
               "plain_cpu_ms_per_run": round(1000 * plain_cpu / n, 1)}
        for label, cfg in (("sandbox_on", sim.ScoreConfig(sandbox=True)), ("sandbox_off", sim.ScoreConfig(sandbox=False))):
            dt, cpu, statuses, results = time_scorer(jobs, workers, args.repeat, cfg)
            if cpu is not None and label == "sandbox_off":     # bwrap's sandboxed children are not reaped
                # by us, so their CPU is invisible: CPU is reported for sandbox off (and plain) only
                row[f"{label}_cpu_ms_per_run"] = round(1000 * cpu / n, 1)
                row[f"{label}_cpu_overhead"] = round(cpu / plain_cpu, 3)
            row[f"{label}_s"] = round(dt, 3)
            row[f"{label}_runs_per_s"] = round(n / dt, 2)
            row[f"{label}_overhead"] = round(dt / plain_dt, 3)
            row[f"{label}_ok"] = statuses.count("ok")
            row[f"{label}_median_ms"] = {k: round(1000 * sorted(r.timings.get(k, 0) for r in results)[len(results) // 2], 1)
                                         for k in ("prepare", "check", "compile", "sim", "score", "total")}
        row["plain_ok"] = plain_st.count("ok")
        rows.append(row)
        print(f"workers={workers}: plain {row['plain_runs_per_s']:6.1f} runs/s | "
              f"sandbox on {row['sandbox_on_runs_per_s']:6.1f} runs/s (overhead {row['sandbox_on_overhead']:.2f}x) | "
              f"sandbox off {row['sandbox_off_runs_per_s']:6.1f} runs/s (overhead {row['sandbox_off_overhead']:.2f}x) | "
              f"ok {row['sandbox_on_ok']}/{len(jobs)} (plain {row['plain_ok']})"
              + (f" | CPU ms/run plain {row['plain_cpu_ms_per_run']}, scorer (sandbox off) "
                 f"{row['sandbox_off_cpu_ms_per_run']} ({row['sandbox_off_cpu_overhead']:.2f}x)" if workers == 1 else ""))
    out = {"command": "python bench/bench_sim.py " + " ".join(sys.argv[1:]), "machine": info, "jobs": len(jobs),
           "repeat": args.repeat, "rows": rows, "prescan_cache_size": sim.PRESCAN_CACHE_SIZE,
           "loadavg_at_end": list(os.getloadavg()),
           "targets": {"runs_per_s_2_workers_sandbox_on": 30, "overhead_sandbox_on": 1.5, "overhead_sandbox_off": 1.2}}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
