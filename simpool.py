"""simpool.py: many scorer runs at once. SimPool keeps long-lived `python sim.py worker` processes, each of which
imports pyslang once (~0.4 s) and keeps its prepared-DUT cache and its sandbox, so simulation overlaps generation
in RL and evaluation; simulate_many scores a list of jobs with one, in input order.

  SimPool(workers=None, cfg=None)        .submit(job) -> Future[sim.SimResult]; .map(jobs); .close(); a context manager
  simulate_many(jobs, workers=None, cfg=None, verbose=True, retry_starved=False) -> list[sim.SimResult]
  rerun_starved(jobs, results, cfg=None) each starved timeout (sim.starved_timeout) run once more in this process
"""
import concurrent.futures
import dataclasses
import json
import os
import queue
import subprocess
import sys
import threading
import time

import sim


class SimPool:
    """Long-lived worker processes that score jobs: submit(job) -> Future[SimResult], so simulation overlaps
    generation. Each worker is `python sim.py worker` (JSON lines over pipes): no fork of the caller (safe
    next to CUDA and threads) and no `if __name__ == "__main__"` needed in the caller. Workers keep their
    prepared-DUT cache; a worker that dies is restarted and its job gets an internal_error result.
    script: the sim.py whose worker runs the jobs (default: the kit's; bench/bench_sim.py names an older one)."""

    def __init__(self, workers=None, cfg=None, script=None):
        self.cfg = cfg or sim.ScoreConfig()
        self.script = os.path.abspath(script or sim.__file__)
        self.workers = max(1, workers or os.cpu_count() or 1)
        self._jobs = queue.Queue()
        self._threads = [threading.Thread(target=self._serve, daemon=True) for _ in range(self.workers)]
        for t in self._threads:
            t.start()

    def _start_worker(self):
        return subprocess.Popen([sys.executable, self.script, "worker",
                                 "--cfg", json.dumps(dataclasses.asdict(self.cfg))],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)

    def _serve(self):
        proc = self._start_worker()
        while True:
            item = self._jobs.get()
            if item is None:
                break
            job, fut = item
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                proc.stdin.write(json.dumps(job) + "\n")
                proc.stdin.flush()
                line = proc.stdout.readline()
            except (BrokenPipeError, OSError):
                line = ""
            if not line:           # the worker died: report it on this job, start a fresh worker
                rc = proc.poll()
                proc.kill()
                proc.wait()
                proc = self._start_worker()
                res = sim.SimResult(id=str(job.get("id", "")), status=sim.INTERNAL_ERROR)
                res.notes.append(f"sim worker process died (rc={rc}); restarted")
                fut.set_result(res)
                continue
            out = json.loads(line)
            if "error" in out:
                fut.set_exception(ValueError(out["error"]))
            else:
                fut.set_result(sim.SimResult.from_dict(out))
        proc.stdin.close()
        proc.wait()

    def submit(self, job):
        sim.check_job(job)
        fut = concurrent.futures.Future()
        self._jobs.put((job, fut))
        return fut

    def map(self, jobs):
        futures = [self.submit(j) for j in jobs]
        return [f.result() for f in futures]

    def close(self):
        for _ in self._threads:
            self._jobs.put(None)
        for t in self._threads:
            t.join()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def rerun_starved(jobs, results, cfg=None):
    """results with each starved timeout (sim.starved_timeout) replaced by a second run of its job in this process; call it
    while no other simulation runs, so the second run gets the CPU the first lacked."""
    return [sim.simulate(j, cfg) if sim.starved_timeout(r) else r for j, r in zip(jobs, results)]


def simulate_many(jobs, workers=None, cfg=None, verbose=True, retry_starved=False):
    """Score jobs with `workers` long-lived processes (1 = in this process); results in input order.
    Ends with one summary line on stderr: runs, runs/s and counts per status. retry_starved: a starved timeout
    (sim.starved_timeout: the machine was too busy to give it its limit in CPU time) runs once more, alone in this
    process after the others, and its second result is kept (data builds: so a build on a loaded machine keeps
    the designs a quiet one keeps)."""
    t0 = time.perf_counter()
    workers = max(1, workers or os.cpu_count() or 1)
    if workers == 1 or len(jobs) <= 1:
        results = [sim.simulate(j, cfg) for j in jobs]
    else:
        with SimPool(workers, cfg) as pool:
            results = pool.map(jobs)
    starved = [i for i, r in enumerate(results) if sim.starved_timeout(r)]     # each result carries its limit
    if retry_starved:
        results = rerun_starved(jobs, results, cfg)
    dt = time.perf_counter() - t0
    if verbose:
        counts = {}
        for r in results:
            counts[r.status] = counts.get(r.status, 0) + 1
        print(f"sim: {len(results)} runs in {dt:.1f}s ({len(results) / max(dt, 1e-9):.1f} runs/s, {workers} workers): "
              + " ".join(f"{k}={v}" for k, v in sorted(counts.items()))
              + (f" (starved timeouts: {len(starved)}{', run again alone' if retry_starved else ''})" if starved else ""),
              file=sys.stderr)
    return results
