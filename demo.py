"""make demo: the CHORUS method on a CPU in about 20 minutes, from the published experts.

    python demo.py                              # everything (what `make demo` runs); again after a crash: continues
    python demo.py --n 2 --rounds 3             # closer to the GPU protocol (n 5, 3 rounds), slower
    python demo.py --models rl2,random --limit 1 --out out/d   # one model and the random baseline on one task

Nothing is trained here. The kit publishes its three RL experts and three OPD students for SmolLM2-135M
(results/small2/adapters/, evaluated on an H200 in results/small2_run.md); this script
  1. merge    merges the experts as the GPU run did (merge.py: soup, TIES, DARE-TIES in its sum and mean
              forms, DELLA; delta space, rank 576, the lambdas the tuning split chose),
  2. eval     scores every model on a small fixed set of real designs (data/demo_tasks.jsonl, MIT): the base
              model, the experts, the merges, the OPD students, and two baselines without weights: constrained
              random stimulus and the template teacher (evaluate.py eval; every number comes from simulation),
  3. compare  the per-task complementarity of the experts and of all the models (oracle union, heatmaps),
  4. report   OUT/report/report.md and demo.json: each number with its 95 % interval beside the GPU result
              it approximates (the same models on the same tasks, from results/small2/eval/), and the paper's
              claims, marked as what they are here: a small-sample demonstration.
Each step prints the command it runs (paste it to re-run one step) and logs to OUT/<step>/stdout.log; a step
whose done.json exists is skipped, so the same command continues after a crash. `--from STEP` redoes a step
and the ones after it.

Budget (2 cores, <= 20 minutes with `make install`'s checks): the GPU protocol (40 tasks, n 5, 1 + 3 rounds,
1280 tokens) is cut to 8 tasks, n 1, direct answers (round 0, compared with the GPU run's round 0) and 512
tokens. Two evaluations run side by side on one torch thread each: on a shared 2-core box a 2-thread matmul
stalls whenever another process takes one of its cores. They generate with the fast decoder run eagerly, in bf16
(the GPU run's dtype; this CPU has AVX512-BF16): ~1.75x faster than HF generate in fp32 on the demo's prompts
(results/demo.md; bench/bench_cpu_generate.py for tok/s by batch; --hf-generate --quant fp32 goes back to HF).
"""
import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from tqdm import tqdm

import chorus_mini
import common
import evaluate
import report
from chorus_mini import Cmd, opts, read_json, rel, run_stage

ROOT = Path(__file__).resolve().parent
GPU_EVAL = ROOT / "results/small2/eval"              # their H200 evaluation: NAME/metrics.json with per-task rows
EXPERTS = ["rl0", "rl1", "rl2"]
# The merges exactly as the GPU run made them (results/small2_run.md): delta space, density 0.5, seed 42, rank 576
# (SmolLM2's hidden size: every module at full rank, so the SVD loses nothing); the soup is the exact rank-48
# concatenation. The lambda is the one each method's tuning-split search chose; the mean forms were merged at 1
# and rescaled (merge.py --rescale), which reproduces the published merge exactly.
MERGE_LAM = {"soup": 1.0, "ties": 1.0, "dare_ties": 1.0, "dare_ties_mean": 0.5, "della": 0.5}
OPD = ["opd", "opd_nogate", "opd_rlfb"]
BASELINES = {"random": "random", "teacher": "teacher:strong"}   # eval folder -> evaluate.py --model
MODELS = ["base", *EXPERTS, *MERGE_LAM, *OPD, *BASELINES]
LABELS = {**report.LABELS, "random": "constrained random stimulus (no model)",
          "teacher": "template teacher, strong (no model)"}
STEPS = ["merge", "eval", "compare", "report"]


def merge_cmds(args, out, names):
    """{merge: its merge.py commands} for the merges among `names`."""
    experts = [rel(args.adapters / f"{e}_stimulus") for e in EXPERTS]
    cmds = {}
    for name in [n for n in names if n in MERGE_LAM]:
        lam, folder = MERGE_LAM[name], out / "merge" / name
        first = folder if lam == 1.0 else out / "merge" / f"{name}_lam1"
        merge = Cmd(["python", "merge.py", "--method", *chorus_mini.MERGES[name], "--adapters", *experts,
                     "--out", rel(first), "--space", "delta", "--density", 0.5, "--seed", 42, "--device", "cpu",
                     *([] if name == "soup" else ["--rank", 576]), "--lam", 1.0], done=first / "done.json")
        cmds[name] = [merge] if lam == 1.0 else [
            merge, Cmd(["python", "merge.py", "--rescale", rel(first), "--lam", lam, "--out", rel(folder)],
                       done=folder / "done.json")]
    return cmds


def eval_cmd(args, out, name):
    """evaluate.py eval for one model; each eval has its own torch threads (OMP_NUM_THREADS, set in main)."""
    adapter = {**{e: args.adapters / f"{e}_stimulus" for e in EXPERTS + OPD}, **{m: out / "merge" / m for m in MERGE_LAM}}
    model = BASELINES.get(name, args.model)
    return Cmd(["python", "evaluate.py", "eval", "--tasks", rel(args.tasks), "--out", rel(out / "eval" / name),
                *opts(model=model, adapter=adapter.get(name) and rel(adapter[name]), limit=args.limit, n=args.n,
                      rounds=args.rounds, max_new_tokens=args.max_new_tokens, batch_size=64, seed=args.seed,
                      temperature=0.7, top_p=0.8, sim_workers=args.sim_workers, quant=args.quant),
                "--answer-mode", "stimulus", "--target-mode", "icarus"], done=out / "eval" / name / "done.json")


def gpu_reference(name, mode, task_ids, seed=0):
    """The H200 evaluation of `name` (n 5, 1 + 3 rounds; its round 0 is the direct mode) restricted to these
    tasks: Pass@1 in `mode` with its 95 % bootstrap interval over them; None without a GPU evaluation."""
    m = read_json(GPU_EVAL / name / "metrics.json")
    if not m or not all(t in m[mode]["per_task"] for t in task_ids):
        return None
    rates = np.array([m[mode]["per_task"][t]["pass_rate"] for t in task_ids])
    lo, hi = evaluate.bootstrap_ci(rates, seed=seed)
    return {"pass@1": float(rates.mean()), "pass@1_ci95": [lo, hi], "mode": mode, "n": m["n"], "rounds": m["rounds"],
            "max_new_tokens": m["config"]["max_new_tokens"], "source": rel(GPU_EVAL / name / "metrics.json")}


def write_report(args, out, names, times, t0):
    """OUT/report/report.md + demo.json: each model beside the GPU number it approximates, the experts'
    complementarity, the claims, the heatmaps and the step times."""
    r = out / "report"
    r.mkdir(parents=True, exist_ok=True)
    mode = "agentic" if args.rounds > 0 else "direct"
    table, rows = {}, []
    for name in names:
        m = read_json(out / "eval" / name / "metrics.json")
        if not m:
            continue
        x = m[mode]
        # the GPU run evaluated the embedded SmolLM2: another --model (tests: tiny) has no GPU counterpart
        gpu = gpu_reference(name, mode, list(x["per_task"]), args.seed) if args.model is None else None
        inside = bool(gpu) and gpu["pass@1_ci95"][0] <= x["pass@1"] <= gpu["pass@1_ci95"][1]
        table[name] = {"pass@1": x["pass@1"], "pass@1_ci95": x["pass@1_ci95"], "cov@1": x["cov@1"],
                       "syn_pass": x["syn_pass"], "tasks": x["tasks"], "gpu": gpu, "inside_gpu_ci95": inside}
        ci = lambda d: "{:.1f} [{:.0f}, {:.0f}]".format(d["pass@1"], *d["pass@1_ci95"])
        if gpu:
            ref = (ci(gpu), f"{LABELS[name]}, H200, {mode}, n {gpu['n']}, <= {gpu['max_new_tokens']} tokens "
                   f"(`{gpu['source']}`): {'inside' if inside else '**outside**'} its interval")
        else:
            ref = ("-", "no GPU run: a baseline without weights (CPU only)")
        rows.append(f"| {LABELS[name]} | {ci(x)} | {x['cov@1']:.1f} | {x['syn_pass']:.1f} | {ref[0]} | {ref[1]} |")
    k = max((t["tasks"] for t in table.values()), default=0)
    experts = read_json(out / "compare" / "experts" / "compare.json")
    claims = evaluate.claims(out / "eval", seed=args.seed) if all(
        n in table for n in (*EXPERTS, "soup", "opd", "opd_nogate")) else None
    plots = []
    for src, dst in ((out / "compare/experts/compare.png", "experts_heatmap.png"),
                     (out / "compare/all/compare.png", "all_heatmap.png")):
        if src.is_file():
            shutil.copy2(src, r / dst)
            plots.append(dst)
    git = common.git_info()
    wall = round(time.time() - t0, 1)
    L = ["# chorus-mini demo: the published experts merged, distilled and scored on a CPU", "",
         f"- commit `{(git['commit'] or '?')[:7]}`{' (dirty)' if git['dirty'] else ''}, {platform.machine()}, "
         f"{os.cpu_count()} cores; wall {wall:.0f} s (steps done by an earlier invocation are skipped, not counted)",
         f"- {k} real designs of `{rel(args.tasks)}` (VerilogEval v2 and RTLLM v2.0, MIT), n {args.n}, 1 + {args.rounds} "
         f"rounds ({mode} Pass@1), <= {args.max_new_tokens} new tokens, T 0.7, top-p 0.8, seed {args.seed}, stimulus "
         "answers, the kit's Icarus targets", "",
         f"**A small-sample demonstration**: {k} tasks x {args.n} sample(s), so each interval spans tens of points. "
         "What it shows: the published models, merged and run on a CPU, score what they scored on the GPU on the same "
         "tasks (the last two columns: the same model, same tasks, same mode, n 5 on an H200), and random stimulus "
         "is a strong baseline on small real designs. It cannot rank the methods.", "",
         "| model | Pass@1 [95 % CI] | Cov@1 | SynPass | GPU Pass@1 [95 % CI] | approximates |", "|---|---|---|---|---|---|",
         *rows, ""]
    if experts:
        e = experts
        L += [f"Complementarity: the oracle union of the three experts solves {e['oracle']['solved']} of {len(e['tasks'])} "
              f"tasks (oracle Pass@1 {e['oracle']['pass@1']:.1f}) against {e['per_model'][e['best_single']]['solved']} for "
              f"the best single expert ({e['best_single']}); tasks solved by A, not B: {json.dumps(e['solved_by_a_not_b'])}.", ""]
    if claims and claims["claims"]:
        L += ["## The paper's claims on this small sample", "",
              f"Paired bootstraps over {k} tasks: 'inconclusive' is the expected verdict here; claim (a) needs SFT stages "
              "1 and 2, which are not published. The GPU run's verdicts on 40 tasks are in results/small2_run.md.", "",
              *evaluate.claims_markdown(claims), ""]
    L += ["## Heatmaps (per task: pass rate, mean coverage)", "", *[f"![{p}]({p})" for p in plots], "",
          "## Steps", "", "| step | seconds | peak RSS (MiB) |", "|---|---|---|",
          *[f"| {s} | {v['s']:.0f} | {v.get('rss_mib') or '-'} |" for s, v in times.items()], ""]
    (r / "report.md").write_text("\n".join(L))
    result = {"wall_s": wall, "steps": times, "tasks": k, "mode": mode, "git": git,
              "config": {key: str(v) if isinstance(v, Path) else v for key, v in vars(args).items()},
              "models": table, "oracle": experts and experts["oracle"], "claims": claims, "plots": plots}
    (r / "demo.json").write_text(json.dumps(result, indent=1))
    print(f"report: {rel(r / 'report.md')}, {rel(r / 'demo.json')}")
    return result


def run_parallel(cmds, folder, jobs, env):
    """Run (name, Cmd) pairs, `jobs` at a time, from the repo root, each child's output in folder/NAME/stdout.log.
    The children stay in this process group, so Ctrl-C stops them too; the first failure stops the demo.
    Returns {name: {"s": seconds, "rss_mib": peak RSS}}."""
    running, queue, times = {}, list(cmds), {}
    bar = tqdm(total=len(cmds), desc="eval", unit="model")
    while queue or running:
        while queue and len(running) < jobs:
            name, cmd = queue.pop(0)
            (folder / name).mkdir(parents=True, exist_ok=True)
            log = open(folder / name / "stdout.log", "ab")
            log.write(f"\n$ {cmd}\n".encode())
            tqdm.write(f"$ {cmd}")
            proc = subprocess.Popen([sys.executable, *cmd.argv[1:]], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                    env={**os.environ, **env, "PYTHONUNBUFFERED": "1"})
            running[proc.pid] = (name, cmd, proc, log, time.time())
        pid, status, usage = os.wait4(-1, 0)
        if pid not in running:
            continue
        name, cmd, proc, log, started = running.pop(pid)
        log.close()
        code = os.waitstatus_to_exitcode(status)
        if code != 0:
            for _, _, other, _, _ in running.values():
                other.terminate()
            tail = (folder / name / "stdout.log").read_text(errors="replace").splitlines()[-15:]
            raise SystemExit("\n".join(tail) + f"\ndemo.py: {name} failed (exit {code}); log {folder / name / 'stdout.log'};"
                             f" re-run by hand from {ROOT.name}/:\n  {cmd}")
        times[name] = {"s": round(time.time() - started, 1), "rss_mib": usage.ru_maxrss // 1024}
        summary = chorus_mini.headline(folder / name)
        mode = "agentic" if "agentic" in summary else "direct"
        tqdm.write(f"   {name}: {time.time() - started:.0f} s, {mode} Pass@1 {summary[mode]['pass@1']:.1f}, "
                   f"Cov@1 {summary[mode]['cov@1']:.1f}")
        bar.update(1)
    bar.close()
    return times


def main(argv=None):
    ap = argparse.ArgumentParser(prog="demo.py", description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    # what runs
    ap.add_argument("--out", default="runs/demo", help="output folder (one subfolder per step)")
    ap.add_argument("--models", default=",".join(MODELS), help="comma-separated, of: " + ",".join(MODELS))
    ap.add_argument("--from", dest="from_step", choices=STEPS, help="redo this step and the ones after it")
    # the evaluation protocol (the GPU run: n 5, 3 rounds, 1280 tokens)
    ap.add_argument("--tasks", default="data/demo_tasks.jsonl", help="task JSONL (shipped: 8 real designs)")
    ap.add_argument("--limit", type=int, default=None, help="first N tasks only")
    ap.add_argument("--n", type=int, default=1, help="samples per task (GPU run: 5)")
    ap.add_argument("--rounds", type=int, default=0, help="refinement rounds after the first (GPU run: 3; 0 = "
                    "direct answers, compared with the GPU run's round 0)")
    ap.add_argument("--max-new-tokens", type=int, default=512, help="answer cap (GPU run: 1280; the experts' "
                    "stimulus answers on these tasks run 200-500 tokens)")
    ap.add_argument("--seed", type=int, default=42, help="sampling and bootstrap seed (GPU run: 42)")
    # the machine
    ap.add_argument("--model", default=None, help="base model (default: the embedded SmolLM2-135M GGUF; "
                    "'tiny' = the random test model, for tests: it takes no published adapter)")
    ap.add_argument("--adapters", default="results/small2/adapters", help="the published NAME_stimulus adapters")
    ap.add_argument("--quant", default="bf16", help="common.load_model's quant: bf16 (the GPU run's dtype; fast on "
                    "a CPU with AVX512-BF16) or fp32")
    ap.add_argument("--hf-generate", action="store_true", help="generate with HF generate, not the fast decoder "
                    "(eager on CPU; $CHORUS_FAST_CPU): ~1.75x slower here")
    ap.add_argument("--jobs", type=int, default=2, help="evaluations side by side (each on cores / jobs threads)")
    ap.add_argument("--sim-workers", type=int, default=1, help="simulator processes per evaluation")
    ap.add_argument("--t0", type=float, default=None, help="start time (epoch s) to count from; `make demo` "
                    "passes the time before `make install`")
    args = ap.parse_args(argv)
    t0 = args.t0 or time.time()
    out = (ROOT / args.out).resolve() if not Path(args.out).is_absolute() else Path(args.out)
    args.tasks, args.adapters = (ROOT / args.tasks).resolve(), (ROOT / args.adapters).resolve()
    names = args.models.split(",")
    if unknown := [n for n in names if n not in MODELS]:
        ap.error(f"unknown model(s) {unknown}; models: {','.join(MODELS)}")
    if args.model == "tiny" and (bad := [n for n in names if n not in ("base", *BASELINES)]):
        ap.error(f"--model tiny takes no published adapter: {bad}")
    merged = any(n in MERGE_LAM for n in names)              # a merge reads all three experts
    needed = [e for e in EXPERTS + OPD if e in names or (merged and e in EXPERTS)]
    if args.from_step in (None, "merge", "eval") and (missing := [
            e for e in needed if not (args.adapters / f"{e}_stimulus" / "adapter_config.json").is_file()]):
        ap.error(f"no published adapter {', '.join(missing)} under {rel(args.adapters)} (a sparse clone leaves them "
                 "out: `git sparse-checkout disable` fetches them)")
    threads = max(1, (os.cpu_count() or 1) // args.jobs)
    # each evaluation's torch reads these at start-up (the merges keep every core)
    eval_env = {"OMP_NUM_THREADS": str(threads), common.FAST_CPU_ENV: "0" if args.hf_generate else "1"}
    print(f"demo: out {out}, {len(names)} models, tasks {rel(args.tasks)}" + (f" (first {args.limit})" if args.limit else "")
          + f", n {args.n}, 1 + {args.rounds} rounds, <= {args.max_new_tokens} tokens, seed {args.seed}; "
          f"{args.jobs} evaluation(s) side by side, {threads} torch thread(s) each, {args.sim_workers} simulator(s) each, "
          f"{args.quant}, {'HF generate' if args.hf_generate else 'the fast decoder'}")
    if args.from_step:
        for step in STEPS[STEPS.index(args.from_step):]:
            if (out / step).exists():
                print(f"--from {args.from_step}: removing {out / step}")
                shutil.rmtree(out / step)
    ctx = argparse.Namespace(out=out, only=set())
    times = {}      # step -> {"s": seconds, "rss_mib": peak RSS of its processes}

    # 1. merges of the published experts (deterministic: seeded CPU generators and an exact rank)
    merges = merge_cmds(args, out, names)
    for name, cmds in tqdm(merges.items(), desc="merge", unit="merge", disable=not merges):
        t = time.time()
        run_stage(ctx, f"merge/{name}", cmds, needs=[])
        done = read_json(out / "merge" / name / "done.json") or {}
        times[f"merge/{name}"] = {"s": round(time.time() - t, 1), "rss_mib": done.get("peak_rss_mib")}

    # 2. evaluations, `jobs` processes at a time (each logs to OUT/eval/NAME/stdout.log; a finished one is skipped)
    t = time.time()
    todo = [(n, eval_cmd(args, out, n)) for n in names]
    for n, cmd in todo:
        if cmd.done.exists():
            print(f"   (done: {rel(cmd.done)}) {cmd}")
    ran = run_parallel([(n, c) for n, c in todo if not c.done.exists()], out / "eval", args.jobs, eval_env)
    times.update({f"eval/{n}": v for n, v in ran.items()})
    times["eval (wall)"] = {"s": round(time.time() - t, 1), "rss_mib": max((v["rss_mib"] for v in ran.values()), default=None)}

    # 3. complementarity: per-task heatmaps, oracle union (in process: no model is loaded)
    t = time.time()
    cmds = [chorus_mini.compare_cmd(out, names, out / "compare" / "all")]
    if all(e in names for e in EXPERTS):
        cmds.insert(0, chorus_mini.compare_cmd(out, EXPERTS, out / "compare" / "experts"))
    run_stage(ctx, "compare", cmds, needs=[])
    times["compare"] = {"s": round(time.time() - t, 1)}

    # 4. the report
    print(f"$ python demo.py report (in process) -> {rel(out / 'report')}")
    result = write_report(args, out, names, times, t0)
    print(f"demo: done in {result['wall_s']:.0f} s; " + ", ".join(
        f"{n} {m['pass@1']:.0f}" for n, m in result["models"].items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
