"""The random baseline and each task's random floor: what a stimulus must beat to show skill (issue 41).

Constrained-random stimulus is the baseline of hardware verification, and in stimulus mode the kit's
harness (harness.py) already holds it: `random_inputs()` gives every data input a random value and
`reset_dut()` resets the DUT. The baseline stimulus is the loop a new user writes first,

    repeat (R) begin reset_dut(); repeat (P) begin random_inputs(); step(1); end end

with a cycle budget C = R x P and a reset period P (P = C: one reset, at the start). It is seeded:
`$urandom(seed)` reseeds the simulator's random stream that random_inputs() draws from (Icarus 11 and the
LRM alike), so samples of one task differ and a run repeats exactly. Budgets stay inside the harness's
watchdog (harness.MAX_CYCLES) and the scorer's simulated-time limit.

As a model (`evaluate.py eval --model random`): `random_policy` answers every stimulus-mode prompt with
the loop, seeded per (task prompt, sample); it ignores feedback, so a refinement state gets its own answer
back (evaluate.py therefore runs it direct and reports agentic = direct). A task the kit cannot harness
is answered in testbench mode, where the baseline has no answer: it gets a text without code (no_code).

The random floor of a task: the loop simulated over a grid of budgets (BUDGETS: 100 to 99,000 cycles,
with and without periodic resets; the last is the whole cycle budget every stimulus has) and seeds, giving
  random_pass    the best budget's share of seeds that pass the task's targets (0..1)
  random_cov     the best budget's mean overall coverage (percent; a failed run counts 0)
  random_cycles  the fewest cycles of a budget that reaches random_pass and random_cov
  random_cov_max the best single run (any budget, any seed): what a lucky seed reaches
plus every budget's numbers. Floors are cached per task in a JSON file keyed by task id + RTL hash (and
recomputed when the grid, seeds, target mode or targets change). A record also keeps each run's per-metric
counts (`runs`) and the items no run covered (`never_hit`, sim.item_key names): data/skill.py excludes the
items no stimulus at all covers and rescores every run without them.

    python data/floor.py TASKS.jsonl --out floor.json [--budgets 100 1000 1000:100 5000 5000:1000 20000:1000]
                         [--seeds 1] [--target-mode cvdp] [--workers 2] [--limit N]
Files written: --out (JSON {"version", "tasks": {"<id>:<rtl sha256[:16]>": floor record}}), rewritten
every few tasks, so an interrupted run resumes where it stopped.
API: random_stimulus, random_answer, random_policy, task_key, calibrate_floor, load_floor, floor_of.
"""
import argparse
import collections
import hashlib
import json
import sys
from pathlib import Path

from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # kit root: sim.py, harness.py
import harness  # noqa: E402
import sim  # noqa: E402
import simpool  # noqa: E402

CYCLES, RESET_PERIOD = 20_000, 1_000   # the default baseline: 20 resets x 1,000 random cycles
RESET_CYCLES = 3                       # reset_dut(): 2 cycles asserted + 1 released
# The one cycle budget every stimulus has, models and baselines alike: the scorer's end-of-time rule
# (sim.SIM_TIME_LIMIT_DEFAULT), which the stimulus prompt states as harness.MAX_CYCLES main-clock cycles.
# The floor's grid ends at the largest loop inside it, so a model cannot beat the floor by running
# longer than random was allowed to.
BUDGET_LOOP = (99_000, 1000)    # 99 resets x 1,000 cycles: 99,300 cycles with the resets, <= MAX_CYCLES
# (cycles, reset period; None = one reset at the start): 100 .. 5,000 cycles with and without a reset, the
# default baseline's 20,000, and the budget's
BUDGETS = ((100, None), (1000, None), (1000, 100), (5000, None), (5000, 1000), (20_000, 1000), BUDGET_LOOP)
NOT_STIMULUS = ("The random baseline writes stimulus for the kit's harness only; this task is answered in "
                "testbench mode, so it has no answer.")
VERSION = 2    # 2: records keep each run's per-metric counts and the items no run covered (never_hit)


# ----------------------------------------------------------------------------------------------
# The stimulus and the policy
# ----------------------------------------------------------------------------------------------

def loop_shape(cycles=CYCLES, reset_period=RESET_PERIOD):
    """(resets R, period P) of a budget: P = the reset period (None: all cycles), R = cycles // P."""
    if cycles < 1:
        raise ValueError(f"random baseline: cycles must be >= 1, got {cycles}")
    period = cycles if reset_period is None else max(1, min(int(reset_period), cycles))
    resets = max(1, cycles // period)
    used = resets * (period + RESET_CYCLES) + RESET_CYCLES       # + the harness's own reset before the stimulus
    if used > harness.MAX_CYCLES:
        raise ValueError(f"random baseline: {cycles} cycles with {resets} resets need {used} cycles, over the "
                         f"harness watchdog's {harness.MAX_CYCLES}")
    return resets, period


def random_stimulus(cycles=CYCLES, reset_period=RESET_PERIOD, seed=0):
    """The baseline's stimulus body (harness vocabulary), seeded."""
    resets, period = loop_shape(cycles, reset_period)
    return ("integer tb_seed;\n"
            f"tb_seed = {int(seed) % 2**31};\n"
            "tb_seed = $urandom(tb_seed);   // reseeds the stream random_inputs() draws from\n"
            f"repeat ({resets}) begin\n"
            "  reset_dut();\n"
            f"  repeat ({period}) begin random_inputs(); step(1); end\n"
            "end\n")


def random_answer(cycles=CYCLES, reset_period=RESET_PERIOD, seed=0):
    return harness.render_stimulus(random_stimulus(cycles, reset_period, seed))


def sample_seed(seed, key, k):
    """The seed of the k-th answer to one prompt (key: a hash of it): independent of the other tasks in a run."""
    return int(hashlib.sha256(f"{seed}:{key}:{k}".encode()).hexdigest()[:8], 16) % 2**31


def random_policy(cycles=CYCLES, reset_period=RESET_PERIOD, seed=0):
    """The random baseline as a Policy (message lists -> answer texts); see the module docstring."""
    loop_shape(cycles, reset_period)            # a budget over the watchdog fails here, not per answer
    seen = collections.Counter()

    def policy(messages_list):
        out = []
        for msgs in messages_list:
            if msgs[0]["content"] != harness.STIMULUS_SYSTEM_PROMPT:
                out.append(NOT_STIMULUS)
            elif len(msgs) > 2:                 # a refinement state: feedback changes nothing
                out.append(msgs[2]["content"])
            else:
                key = hashlib.sha256(msgs[1]["content"].encode()).hexdigest()[:16]
                out.append(random_answer(cycles, reset_period, sample_seed(seed, key, seen[key])))
                seen[key] += 1
        return out
    policy.ignores_feedback = True
    return policy


# ----------------------------------------------------------------------------------------------
# The floor
# ----------------------------------------------------------------------------------------------

def rtl_sha(task):
    return hashlib.sha256("\0".join(f"{f['name']}\0{f['content']}" for f in task["rtl_files"]).encode()).hexdigest()


def task_key(task):
    """The cache key of a task's floor: id + the first 16 hex digits of its RTL's sha256."""
    return f"{task['id']}:{rtl_sha(task)[:16]}"


def _signature(task, budgets, seeds, target_mode):
    """What a cached floor depends on besides the RTL: the grid, the seeds, the target mode and targets."""
    job = sim.job_from_task(task, "", target_mode)
    return {"budgets": [list(b) for b in budgets], "seeds": seeds, "target_mode": target_mode,
            "targets": job["targets"]}


def summarize(rows):
    """Floor record fields from per-run rows [{cycles, reset_period, seed, status, cov, passed}]."""
    by_budget = {}
    for r in rows:
        by_budget.setdefault((r["cycles"], r["reset_period"]), []).append(r)
    budgets = [{"cycles": c, "reset_period": p, "pass": sum(x["passed"] for x in rs) / len(rs),
                "cov": sum(x["cov"] for x in rs) / len(rs), "statuses": sorted({x["status"] for x in rs})}
               for (c, p), rs in by_budget.items()]
    best = max(budgets, key=lambda b: (b["pass"], b["cov"]))
    enough = [b for b in budgets if b["pass"] >= best["pass"] and b["cov"] >= best["cov"] - 1e-9]
    return {"random_pass": best["pass"], "random_cov": round(best["cov"], 3),
            "random_cov_max": round(max(r["cov"] for r in rows), 3),
            "random_cycles": min(b["cycles"] for b in enough), "budgets": budgets}


def calibrate_floor(tasks, budgets=BUDGETS, seeds=1, target_mode="cvdp", workers=None, cfg=None, cache=None,
                    progress=True, on_task=None):
    """{task_key: floor record} for `tasks` (records found in `cache` with the same signature are reused).

    A record: {id, rtl_sha, signature, random_pass, random_cov, random_cycles, budgets} or, for a task the
    kit cannot harness, {id, rtl_sha, signature, error}. Runs are scored on one simpool.SimPool under a tqdm bar;
    on_task(key, record) is called as each task completes (the CLI saves there)."""
    cache = dict(cache or {})
    out, todo = {}, []
    for t in tasks:
        key, sig = task_key(t), _signature(t, budgets, seeds, target_mode)
        if key in cache and cache[key].get("signature") == sig and ("runs" in cache[key] or "error" in cache[key]):
            out[key] = cache[key]
            continue
        base = {"id": t["id"], "rtl_sha": rtl_sha(t), "signature": sig}
        try:
            h = harness.task_harness(t)
        except harness.HarnessError as e:
            out[key] = {**base, "error": f"cannot harness: {e}"}
            if on_task:
                on_task(key, out[key])
            continue
        runs = [(c, p, s) for c, p in budgets for s in range(seeds)]
        todo.append((key, base, t, h, runs))
    n_runs = sum(len(x[4]) for x in todo)
    if not todo:
        return out
    with simpool.SimPool(workers or 2, cfg=cfg) as pool, \
            tqdm(total=n_runs, desc="random floor", dynamic_ncols=True, disable=not progress or not n_runs) as bar:
        for key, base, t, h, runs in todo:
            jobs = []
            for c, p, s in runs:
                tb, _ = harness.assemble(h, random_stimulus(c, p, sample_seed(s, key, 0)))
                jobs.append(sim.job_from_task(t, tb, target_mode, all_uncovered=True))
            results = []
            for f in [pool.submit(j) for j in jobs]:
                results.append(f.result())
                bar.update(1)
            # the pool is idle between tasks: a timeout the busy machine starved of CPU runs once more here, so the
            # floor does not depend on what else the machine runs
            results = simpool.rerun_starved(jobs, results, cfg)
            rows, never = [], None
            for (c, p, s), r in zip(runs, results):
                ok = r.status == sim.OK and r.overall_pct is not None
                rows.append({"cycles": c, "reset_period": p, "seed": s, "status": r.status,
                             "cov": float(r.overall_pct) if ok else 0.0, "passed": bool(r.passed) and ok,
                             **({"counts": {m: [v["covered"], v["total"]] for m, v in r.metrics.items()}} if ok else {})})
                if ok:      # the items no run covers: data/skill.py's exclusion candidates
                    keys = sim.uncovered_keys(r)
                    never = keys if never is None else {k: v for k, v in never.items() if k in keys}
            out[key] = {**base, **summarize(rows), "runs": rows,
                        "never_hit": None if never is None else [{"key": k, **v} for k, v in sorted(never.items())]}
            bar.set_postfix_str(f"{t['id'][:30]} cov {out[key]['random_cov']:.1f}", refresh=False)
            if on_task:
                on_task(key, out[key])
    return out


def load_floor(path):
    """The records of a floor file: {task_key: record}."""
    data = json.loads(Path(path).read_text())
    if data.get("version") not in (1, VERSION):    # version 1 records lack runs/never_hit: read, recomputed on reuse
        raise SystemExit(f"{path}: floor file version {data.get('version')!r}, expected {VERSION}")
    return data["tasks"]


def floor_of(task, floor):
    """A task's floor record: the task's own `random_floor`, else floor[task_key(task)] (same RTL), else None.
    A record without random_cov (the task could not be harnessed) counts as none."""
    rec = task.get("random_floor") or (floor or {}).get(task_key(task))
    return rec if rec and rec.get("random_cov") is not None else None


def save_floor(path, records):
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps({"version": VERSION, "tasks": records}, indent=1))
    tmp.replace(path)


def parse_budget(text):
    """'5000' -> (5000, None): one reset; '5000:1000' -> (5000, 1000): a reset every 1,000 cycles."""
    c, _, p = text.partition(":")
    return int(c), (int(p) if p else None)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("tasks", help="task JSONL (sim.load_tasks schema)")
    ap.add_argument("--out", required=True, help="floor JSON (also the cache: tasks already in it are kept)")
    ap.add_argument("--budgets", nargs="+", default=[f"{c}:{p}" if p else str(c) for c, p in BUDGETS],
                    help="CYCLES or CYCLES:RESET_PERIOD, each one budget of the grid")
    ap.add_argument("--seeds", type=int, default=1, help="seeds per budget")
    ap.add_argument("--target-mode", choices=("cvdp", "icarus"), default="cvdp", help="see sim.job_from_task")
    ap.add_argument("--workers", type=int, default=2, help="parallel simulations")
    ap.add_argument("--limit", type=int, default=None, help="only the first N tasks")
    args = ap.parse_args(argv)
    tasks = sim.load_tasks(args.tasks)[:args.limit] if args.limit else sim.load_tasks(args.tasks)
    budgets = [parse_budget(b) for b in args.budgets]
    for c, p in budgets:
        loop_shape(c, p)
    records = load_floor(args.out) if Path(args.out).is_file() else {}
    done = collections.Counter()

    def save(key, rec):
        records[key] = rec
        done["n"] += 1
        if done["n"] % 5 == 0:
            save_floor(args.out, records)
    print(f"floor: {len(tasks)} tasks x {len(budgets)} budgets x {args.seeds} seeds, target mode {args.target_mode}, "
          f"{args.workers} workers -> {args.out}")
    got = calibrate_floor(tasks, budgets, args.seeds, args.target_mode, workers=args.workers, cache=records,
                          on_task=save)
    records.update(got)
    save_floor(args.out, records)
    ok = [r for r in got.values() if "random_cov" in r]
    fails = sum(r["random_pass"] == 0 for r in ok)
    mean = sum(r["random_cov"] for r in ok) / max(1, len(ok))
    print(f"floor: {len(ok)} tasks with a floor ({len(got) - len(ok)} cannot be harnessed); random fails "
          f"{fails}, mean random coverage {mean:.1f}%")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
