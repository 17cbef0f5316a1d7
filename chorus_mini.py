"""chorus-mini: the whole CHORUS pipeline in one command, plus the kit's everyday commands.

    python chorus_mini.py run --profile smoke                    # everything at a tiny budget on CPU (make smoke)
    python chorus_mini.py run --profile small --only rl0 rl1     # some stages alone (a GPU session does a few)
    python report.py --out runs/smoke                            # rebuild OUT/report/ from the stage folders

`run` executes the stages below in order. Stage S works in OUT/S/ (OUT defaults to runs/<profile>) and is
complete when OUT/S/done.json exists; that file is written last. A complete stage is skipped, so running
the same command again after a crash continues where it stopped (sft.py, rl.py and distill.py also resume
from their own checkpoints). Every stage prints the command it runs (from the repo root) before running it
and logs its output to OUT/S/stdout.log, so any stage can be re-run by hand.
  --from S    deletes the folders of S and of every stage after it, then runs the pipeline (deleting,
              not just unmarking: a training stage would otherwise "resume" from its final checkpoint)
  --only S..  runs just these stages (their inputs must exist); with --from S it deletes only the folders
              of the --only stages, so `--from rl0 --only rl0` redoes rl0 alone
  --set k=v   overrides one value of the profile (profiles.py; the key, its type and range are checked)
  --set gpus=N  runs the sft, rl, opd, val and eval stages as `accelerate launch --multi_gpu --num_processes N`

Stages:
   data        synthetic train tasks (data/designs.py, train families, decontaminated against the eval
               tasks), validation tasks (the held-out families), eval tasks (a fixed subset of the dev set:
               its 'report' split ordered by an id hash; without ../shared the validation tasks), held-out
               synthetic test tasks, a seeded sample of real designs (data/design_pool.py on the shared
               corpus, decontaminated against the eval and test tasks) mixed into train and val
               (mix-tasks; real_tasks / real_val_tasks), the tuning tasks every choice is made on (tune_source:
               the val tasks, or the dev set's tuning split), and the stage-0/1 SFT data (data/build_sft.py)
   sft0        SFT stage 0 (sft.py) on direct teacher data
   sft1        SFT stage 1 from sft0, on stage-0 + refinement data
   data2       stage-2 SFT data: states from the sft1 model's own rollouts (build_sft.py --stage2-model), added to
               the data stage's stage-1 rows (--stages01-from: what sft1 trained on, not a rebuild)
   sft2        SFT stage 2 from sft1
   rl0-rl2     one RL expert per SFT stage (rl.py), same tasks, budget and hyperparameters
   merge       soup / TIES / DARE-TIES (sum and mean forms) / DELLA of the three experts (merge.py); with
               merge_lams, each at several lambdas, the best on the tuning tasks kept (pick-merge)
   val         the three experts on the tuning tasks (picks the OPD student)
   opd         reward-gated multi-teacher OPD (distill.py): student = best expert on val, teachers = others
   opd_nogate  ablation "always distill" (--no-gate), same budget
   opd_rlfb    ablation "gate + RL fallback" (--on-fail rl), same budget (opd_joint: the due variants in one
               distill.py process, sharing the teachers' answers; each stage folder gets its record)
   eval        every model (base, sft0-2, rl0-2, merges, opd variants) on the eval tasks; one agentic run
               gives the direct (round 0) and agentic (last round) numbers
   eval_syn    every model on held-out synthetic designs (the validation families, another seed; test_tasks,
               test_n, test_rounds; 0 tasks = skipped): the training distribution without its designs
   eval_skill  every model on the skill split the data stage builds (data/skill.py: the eval tasks random
               stimulus fails and a known stimulus passes, the synthetic skill families, skill_pool's held-out
               designs; skill_tasks, eval_n, eval_rounds; 0 = skipped): the headline, what a model adds over random
   compare     complementarity of the three experts (per-task heatmap, oracle union), and of all models,
               on the eval tasks and on the synthetic test tasks
   report      OUT/report/: report.md, report.json and the plots

Other subcommands: eval, compare, generate (the same as evaluate.py's); select-tasks, pick-merge and tiny-model
(steps of `run`).
"""
import argparse
import collections
import contextlib
import hashlib
import itertools
import json
import os
import random
import shlex
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import common
import evaluate
import profiles
import rundir
import sim

ROOT = Path(__file__).resolve().parent

# -----------------------------------------------------------------------------
# The pipeline: its stages, what each needs, the models each makes (settings: profiles.py)

STAGES = ["data", "sft0", "sft1", "data2", "sft2", "rl0", "rl1", "rl2", "merge", "val",
          "opd", "opd_nogate", "opd_rlfb", "eval", "eval_syn", "eval_skill", "compare", "report"]
NEEDS = {"sft0": ["data"], "sft1": ["sft0"], "data2": ["sft1"], "sft2": ["data2", "sft1"],
         "rl0": ["sft0"], "rl1": ["sft1"], "rl2": ["sft2"], "merge": ["rl0", "rl1", "rl2"],
         "val": ["rl0", "rl1", "rl2"], "opd": ["val"], "opd_nogate": ["val"], "opd_rlfb": ["val"],
         "eval": ["sft0", "sft1", "sft2", "rl0", "rl1", "rl2", "merge", "opd", "opd_nogate", "opd_rlfb"],
         "eval_syn": ["sft0", "sft1", "sft2", "rl0", "rl1", "rl2", "merge", "opd", "opd_nogate", "opd_rlfb"],
         "eval_skill": ["sft0", "sft1", "sft2", "rl0", "rl1", "rl2", "merge", "opd", "opd_nogate", "opd_rlfb"],
         "compare": ["eval", "eval_syn", "eval_skill"], "report": []}
MODEL_STAGE = {"base": "data", **{f"sft{k}": f"sft{k}" for k in range(3)}, **{f"rl{k}": f"rl{k}" for k in range(3)},
               "soup": "merge", "ties": "merge", "dare_ties": "merge", "dare_ties_mean": "merge", "della": "merge",
               "opd": "opd", "opd_nogate": "opd_nogate", "opd_rlfb": "opd_rlfb"}   # model -> the stage making it
MERGES = {"soup": ["soup"], "ties": ["ties"],                                  # name -> merge.py's method arguments
          "dare_ties": ["dare_ties", "--dare-norm", "sum"],                   # mergekit's default form
          "dare_ties_mean": ["dare_ties", "--dare-norm", "mean"],             # peft's / the DARE code's form
          "della": ["della"]}
OPD_VARIANTS = {"opd": [], "opd_nogate": ["--no-gate"], "opd_rlfb": ["--on-fail", "rl"]}
OPD_GATES = {"opd": "gated", "opd_nogate": "nogate", "opd_rlfb": "rlfb"}      # distill.py --variants (opd_joint)


# -----------------------------------------------------------------------------
# Running commands: print, tee to the stage log, measure

class Cmd:
    """One command of a stage: argv as printed (first words 'python' or 'accelerate launch'), the file whose existence means it
    already ran (so a stage with several commands resumes by command), and optionally the in-process
    function that does the same work (light steps that load no model)."""
    def __init__(self, argv, done=None, fn=None):
        self.argv, self.done, self.fn = [str(a) for a in argv], done, fn

    def __str__(self):
        return shlex.join(self.argv)


def gpu_memory_used_mib():
    """Used memory of the first GPU by nvidia-smi (MiB), or None without one."""
    if not shutil.which("nvidia-smi"):
        return None
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10).stdout
        return int(out.split()[0])
    except (OSError, ValueError, IndexError, subprocess.SubprocessError):
        return None


def execute(cmd, log_path):
    """Run cmd from the repo root with its output on the console and appended to log_path. Returns
    (exit code, peak RSS MiB of the process, peak GPU memory MiB above the level at the start or None)."""
    with open(log_path, "ab") as log:
        log.write(f"\n$ {cmd}\n".encode())
        log.flush()
        if cmd.fn is not None:          # in-process: same work, no interpreter start-up
            tee = _Tee(log)
            with contextlib.redirect_stdout(tee):
                cmd.fn()
            return 0, None, None
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        base, peak, stop = gpu_memory_used_mib(), [0], threading.Event()

        def poll():                     # whole-GPU usage: includes other processes on a shared GPU
            while not stop.wait(2.0):
                used = gpu_memory_used_mib()
                peak[0] = max(peak[0], (used or 0) - (base or 0))
        poller = threading.Thread(target=poll, daemon=True)
        if base is not None:
            poller.start()
        head = [sys.executable, "-m", "accelerate.commands.launch"] if cmd.argv[0] == "accelerate" else [sys.executable]
        # its own process group, ended with this one (_end_child_group): a stopped orchestrator must not
        # leave its stage's trainer (and that trainer's workers) running on the folder
        proc = subprocess.Popen(head + cmd.argv[1 + (cmd.argv[0] == "accelerate"):], cwd=ROOT, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
        with _end_child_group(proc):
            while chunk := os.read(proc.stdout.fileno(), 65536):
                sys.stdout.buffer.write(chunk)
                sys.stdout.flush()
                log.write(chunk)
                log.flush()
        _, status, usage = os.wait4(proc.pid, 0)   # per-child rusage (ru_maxrss in KiB on Linux)
        proc.returncode = os.waitstatus_to_exitcode(status)
        stop.set()
        return proc.returncode, usage.ru_maxrss // 1024, (peak[0] if base is not None else None)


@contextlib.contextmanager
def _end_child_group(proc, grace_s=10.0):
    """While the block runs, SIGTERM or SIGINT to this process is passed to the child's process group;
    after grace_s the group gets SIGKILL, then this process exits 128 + the signal."""
    import signal
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum, frame):
        for sig, wait_s in ((signum, grace_s), (signal.SIGKILL, 0)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                if wait_s:
                    proc.wait(timeout=wait_s)
            except subprocess.TimeoutExpired:
                pass
        raise SystemExit(128 + signum)
    old = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)


class _Tee:
    """stdout of an in-process step: the console (the stdout before redirection) and the stage log."""
    def __init__(self, log):
        self.console, self.log = sys.stdout, log

    def write(self, text):
        self.console.write(text)
        self.log.write(text.encode())
        return len(text)

    def flush(self):
        self.console.flush()
        self.log.flush()


def run_stage(ctx, name, commands, needs=None, partial=False, also=()):
    """Run one stage unless OUT/name/done.json exists; done.json (written last) records the commands,
    the time and the peak memory, merged into what the stage script wrote there itself. needs replaces
    NEEDS[name]; partial: the commands are only part of the stage (eval of some models), so neither
    result.json nor done.json is written and a later full run does the rest. done.json's seconds sum every call
    that ran part of the stage (rundir.CALLS_LOG; parallel lanes' subsets add up, so theirs is a sum, not a wall time).
    also: more stages the same commands complete (rl0-rl2 in one process); each gets the same record."""
    if ctx.only and name not in ctx.only:
        return
    folder, done = ctx.out / name, ctx.out / name / "done.json"
    if done.exists():
        before = json.loads(done.read_text()).get("commands")
        changed = before is not None and before != [str(c) for c in commands]
        print(f"== {name}: done, skipped ({done})" + (f"; note: its commands differ from this run's "
              f"(--from {name} redoes it)" if changed else ""))
        return
    missing = [n for n in (NEEDS.get(name, []) if needs is None else needs) if not (ctx.out / n / "done.json").exists()]
    if missing:
        raise SystemExit(f"chorus_mini.py: stage {name} needs {', '.join(missing)} (no done.json in {ctx.out}): "
                         "run those first")
    folder.mkdir(parents=True, exist_ok=True)
    print(f"== {name}: {len(commands)} command(s), log {folder / 'stdout.log'}"
          + (f" (the commands also complete {', '.join(also)})" if also else ""))
    folders = [folder, *(ctx.out / n for n in also)]
    for f in folders[1:]:
        f.mkdir(parents=True, exist_ok=True)
    t0, rss, gpu = time.time(), [], []
    for cmd in commands:
        if cmd.done and Path(cmd.done).exists():
            print(f"   (done: {rel(cmd.done)}) {cmd}")
            continue
        print(f"$ {cmd}", flush=True)
        t_cmd = time.time()
        code, peak_rss, peak_gpu = execute(cmd, folder / "stdout.log")
        rss.append(peak_rss)
        gpu.append(peak_gpu)
        why = [rundir.stop_reason(f) for f in folders]           # read before deadline_stopped takes the marker
        if any([rundir.deadline_stopped(f, code, t_cmd) for f in folders]):   # checkpointed, stopped on purpose
            for stage, f, w in zip([name, *also], folders, why):
                done = rundir.read_done(f)          # one expert of a joint run may finish before the others stop
                if also and done is not None and "stage" not in done:
                    record_stage(stage, f, commands, t0, rss, gpu)
                else:
                    rundir.log_call(f, time.time() - t0, w)
            if "deadline" in why:
                print(f"chorus_mini.py: stage {name} stopped at the deadline (${rundir.DEADLINE_ENV}), checkpointed: "
                      f"the same command resumes it", file=sys.stderr)
            else:
                print(f"chorus_mini.py: stage {name} paused (rl_pause_at), checkpointed: the same command without "
                      f"rl_pause_at goes on", file=sys.stderr)
            raise SystemExit(rundir.EXIT_DEADLINE)
        if code != 0:           # a member of a joint command that finished before it failed keeps its record
            for stage, f in zip([name, *also], folders):
                done = rundir.read_done(f)
                if also and done is not None and "stage" not in done:
                    record_stage(stage, f, commands, t0, rss, gpu)
            raise SystemExit(f"chorus_mini.py: stage {name} failed (exit {code}); log {folder / 'stdout.log'}; "
                             f"re-run by hand from {ROOT.name}/:\n  {cmd}")
    if partial:
        rundir.log_call(folder, time.time() - t0, "subset")
        print(f"== {name}: {len(commands)} command(s) finished in {time.time() - t0:.0f} s; the stage is not complete "
              "(a subset of it ran): run it again with the full set to finish it")
        return
    for stage, f in zip([name, *also], folders):
        record_stage(stage, f, commands, t0, rss, gpu)


def record_stage(stage, folder, commands, t0, rss, gpu):
    """A finished stage's done.json: the commands, the seconds since t0 plus its earlier calls', the peaks, merged
    into what the stage script wrote there (result.json too for a stage of several commands: OUTCOMES)."""
    earlier_s, earlier_calls = rundir.earlier_calls(folder)
    seconds = round(time.time() - t0 + earlier_s, 1)
    if stage in OUTCOMES:    # stages made of several commands: one result.json over them (data: + build_sft's)
        rundir.write_result(folder, {"commands": [str(c) for c in commands]}, {"seconds": seconds},
                            OUTCOMES[stage](folder))
    script = rundir.read_done(folder) or {}        # the stage script's own done.json (one shape: rundir)
    ok = lambda xs: max([x for x in xs if x is not None], default=None)
    record = rundir.write_done(folder, script.get("script", "chorus_mini.py"), script.get("files"), stage=stage,
                               commands=[str(c) for c in commands], seconds=seconds, calls=earlier_calls + 1,
                               peak_rss_mib=ok(rss), gpu_mem_peak_mib=ok(gpu))
    print(f"== {stage}: finished in {record['seconds']:.0f} s")


def read_json(path):
    path = Path(path)
    return json.loads(path.read_text()) if path.is_file() else None


def headline(eval_dir):
    """Pass@1 / Cov@1 / SynPass of one eval folder, direct and agentic."""
    m = read_json(Path(eval_dir) / "metrics.json") or {}
    return {mode: {k: round(m[mode][k], 2) for k in ("pass@1", "cov@1", "syn_pass") if k in m[mode]}
            for mode in ("direct", "agentic") if mode in m}


def outcome_of(folder):
    """The outcome of a stage script's run folder (its result.json), {} when it wrote none."""
    return (read_json(Path(folder) / "result.json") or {}).get("outcome") or {}


def count_lines(path):
    return sum(1 for line in open(path) if line.strip()) if Path(path).is_file() else None


OUTCOMES = {   # stage -> its outcome numbers, for stages whose commands write no result.json themselves
    "data": lambda f: {"train_tasks": count_lines(f / "train_tasks.jsonl"), "val_tasks": count_lines(f / "val_tasks.jsonl"),
                       "eval_tasks": count_lines(f / "eval_tasks.jsonl"),
                       "tuning_tasks": count_lines(f / "tuning_tasks.jsonl"), "mix": read_json(f / "mix.json"),
                       "skill_tasks": count_lines(f / "skill" / "skill_tasks.jsonl"),
                       "skill_val_tasks": count_lines(f / "skill_val" / "skill_tasks.jsonl"),
                       "skill_mix": read_json(f / "skill_mix.json"),
                       **outcome_of(f)},   # + build_sft.py's
    "merge": lambda f: {m: outcome_of(f / m) for m in MERGES},
    "val": lambda f: {d.name: headline(d) for d in sorted(f.iterdir()) if (d / "metrics.json").is_file()},
    "eval": lambda f: {d.name: headline(d) for d in sorted(f.iterdir()) if (d / "metrics.json").is_file()},
    "eval_syn": lambda f: {d.name: headline(d) for d in sorted(f.iterdir()) if (d / "metrics.json").is_file()},
    "eval_skill": lambda f: {d.name: headline(d) for d in sorted(f.iterdir()) if (d / "metrics.json").is_file()},
    "compare": lambda f: {"oracle": outcome_of(f / "experts").get("oracle"),
                          "oracle_syn": outcome_of(f / "experts_syn").get("oracle"),
                          "oracle_skill": outcome_of(f / "experts_skill").get("oracle")},
}


def rel(path):
    """A path as printed in commands: relative to the repo root when inside it or beside it (../shared)."""
    path = Path(path).resolve()
    return os.path.relpath(path, ROOT) if path.is_relative_to(ROOT.parent) else str(path)


# -----------------------------------------------------------------------------
# The commands of each stage

def opts(**kw):
    """--flag value pairs; None is left out, True is a bare flag, False is left out."""
    out = []
    for k, v in kw.items():
        if v is None or v is False:
            continue
        out += [f"--{k.replace('_', '-')}"] + ([] if v is True else [str(v)])
    return out


def eval_source(c):
    """The eval task file (repo-relative path of the profile) or None when it is absent."""
    path = ROOT / c["eval_tasks"]
    return path if path.is_file() else None


def real_corpus(c):
    """The real-design corpus files (*.jsonl.gz of the profile's folder), [] when absent or switched off."""
    folder = ROOT / c["real_corpus"] if c["real_corpus"] and c["real_tasks"] > 0 else None
    return sorted(folder.glob("*.jsonl.gz")) if folder and folder.is_dir() else []


def tune_tasks(c, o):
    """The task file choices are made on (tune_source): the dev tuning split when asked and an eval file exists."""
    return o / "data" / ("tuning_tasks.jsonl" if c["tune_source"] == "dev" and eval_source(c) else "val_tasks.jsonl")


def train_val_tasks(c, o):
    """The tasks SFT / RL / OPD validate on: the skill validation tasks (train_val_source skill), else the tuning tasks."""
    if c["train_val_source"] == "skill":
        if c["skill_val_tasks"] <= 0:
            raise SystemExit("chorus_mini.py: train_val_source=skill needs skill_val_tasks > 0")
        return o / "data" / "skill_val" / "skill_tasks.jsonl"
    return tune_tasks(c, o)


def sft_tasks(c, o):
    """The SFT rows' tasks: the training tasks, with the skill training tasks when the profile has them."""
    return o / "data" / ("sft_tasks.jsonl" if c["skill_train_tasks"] > 0 else "train_tasks.jsonl")


def rl_tasks(c, o):
    """RL's and OPD's prompt pool: mostly skill training tasks (skill_mix) when the profile has them."""
    return o / "data" / ("rl_tasks.jsonl" if c["skill_train_tasks"] > 0 else "train_tasks.jsonl")


def data_cmds(c, o, model_path):
    """Synthetic train/val designs, the eval subset, the held-out synthetic test designs, the real-design pool
    mixed into train/val (when the corpus is there), then the staged SFT rows of the training tasks."""
    d = o / "data"
    cmds = []
    if c["model"] == "tiny":
        cmds.append(Cmd(["python", "chorus_mini.py", "tiny-model", "--out", rel(model_path), "--seed", 0],
                        done=Path(model_path) / "config.json", fn=lambda: make_tiny_model(model_path, 0)))
    corpus = real_corpus(c)
    syn = "syn_" if corpus else ""          # with real designs the synthetic files are mixed into train/val
    cmds.append(Cmd(["python", "data/designs.py", "--split", "val", "--n", c["val_tasks"], "--seed", c["seed"],
                     *opts(families=c["val_families"] or None), "--out", rel(d / f"{syn}val_tasks.jsonl")],
                    done=d / f"{syn}val_tasks.jsonl"))
    source = eval_source(c)
    if source:
        argv = ["python", "chorus_mini.py", "select-tasks", "--tasks", rel(source), "--limit", c["eval_limit"],
                "--max-chars", c["eval_max_chars"], "--out", rel(d / "eval_tasks.jsonl")]
        cmds.append(Cmd(argv, done=d / "eval_tasks.jsonl",
                        fn=lambda: select_tasks(source, c["eval_limit"], c["eval_max_chars"], d / "eval_tasks.jsonl")))
        if c["tune_source"] == "dev":
            argv = ["python", "chorus_mini.py", "select-tasks", "--tasks", rel(source), "--split", "tuning",
                    *opts(limit=c["tune_limit"]), "--max-chars", c["eval_max_chars"], "--out", rel(d / "tuning_tasks.jsonl")]
            cmds.append(Cmd(argv, done=d / "tuning_tasks.jsonl",
                            fn=lambda: select_tasks(source, c["tune_limit"], c["eval_max_chars"],
                                                    d / "tuning_tasks.jsonl", split="tuning")))
    if c["test_tasks"] > 0:                 # held-out synthetic test designs: val families, a seed of their own
        cmds.append(Cmd(["python", "data/designs.py", "--split", "val", "--n", c["test_tasks"], "--seed",
                         c["seed"] + 1000, *opts(families=c["val_families"] or None), "--out", rel(d / "test_tasks.jsonl")],
                        done=d / "test_tasks.jsonl"))
    if c["skill_tasks"] > 0:               # the skill split: eval tasks random fails + skill families (+ a pool's)
        pool = ROOT / c["skill_pool"] if c["skill_pool"] else None
        if pool and not pool.is_file():
            raise SystemExit(f"chorus_mini.py: skill_pool {c['skill_pool']!r} is not a file")
        real = [rel(d / "eval_tasks.jsonl")] if source else []
        cmds.append(Cmd(["python", "data/skill.py", "--tasks", *real, *([rel(pool), "--screen"] if pool else []),
                         "--synthetic", c["skill_tasks"], "--seed", c["seed"], "--workers", c["sim_workers"],
                         "--out", rel(d / "skill")], done=d / "skill" / "skill_split.json"))
    if c["skill_val_tasks"] > 0:           # fresh family instances: the val stage's tasks
        cmds.append(Cmd(["python", "data/skill.py", "--synthetic", c["skill_val_tasks"], "--seed", c["seed"] + 2000,
                         "--workers", c["sim_workers"], "--out", rel(d / "skill_val")],
                        done=d / "skill_val" / "skill_split.json"))
    cmds.append(Cmd(["python", "data/designs.py", "--split", "train", "--n", c["train_tasks"], "--seed", c["seed"],
                     *opts(families=c["train_families"] or None), "--decontaminate", rel(source or d / f"{syn}val_tasks.jsonl"),
                     "--out", rel(d / f"{syn}train_tasks.jsonl")], done=d / f"{syn}train_tasks.jsonl"))
    if corpus:
        evals = [rel(p) for p in (source, d / "test_tasks.jsonl" if c["test_tasks"] > 0 else None,
                                  d / "skill" / "skill_tasks.jsonl" if c["skill_tasks"] > 0 else None) if p]
        cmds.append(Cmd(["python", "data/design_pool.py", "--corpus", *[rel(p) for p in corpus],
                         "--eval-tasks", *(evals or [rel(d / "syn_val_tasks.jsonl")]),
                         "--sample", c["real_tasks"] + c["real_val_tasks"], "--seed", c["seed"],
                         "--max-tokens", c["real_max_tokens"], "--workers", c["sim_workers"],
                         *(["--tokenizer", "chars"] if c["model"] == "tiny" else []), "--out", rel(d / "pool")],
                        done=d / "pool" / "pool_stats.json"))
        argv = ["python", "chorus_mini.py", "mix-tasks", "--data", rel(d), "--real-val", c["real_val_tasks"]]
        cmds.append(Cmd(argv, done=d / "mix.json", fn=lambda: mix_tasks(d, c["real_val_tasks"])))
    if c["skill_train_tasks"] > 0:         # skill training tasks: fresh family instances + the split's training pool
        cmds.append(Cmd(["python", "data/skill.py", "--synthetic", c["skill_train_tasks"], "--seed", c["seed"] + 3000,
                         "--workers", c["sim_workers"], "--out", rel(d / "skill_train")],
                        done=d / "skill_train" / "skill_split.json"))
        argv = ["python", "chorus_mini.py", "skill-mix", "--data", rel(d), "--easy-share", c["rl_easy_share"],
                "--seed", c["seed"]]
        cmds.append(Cmd(argv, done=d / "skill_mix.json", fn=lambda: skill_mix(d, c["rl_easy_share"], c["seed"])))
    if c["rl_reward"] == "over_random":    # every prompt's random floor, for the reward over it
        cmds.append(Cmd(["python", "data/floor.py", rel(rl_tasks(c, o)), "--out", rel(d / "rl_floor.json"),
                         "--workers", c["sim_workers"]], done=d / "rl_floor.json"))
    if c["train_val"]:   # the tuning tasks' teacher rows (stage 0 only): sft.py's val/loss, never trained on;
                         # before the training rows, whose done.json (= the stage's) comes last
        cmds.append(Cmd(["python", "data/build_sft.py", "--tasks", rel(tune_tasks(c, o)), "--out", rel(d / "val_sft"),
                         *opts(n=c["sft_tries"], rounds=0, fail_fraction=0, level=c["teacher_level"], seed=c["seed"],
                               workers=c["sim_workers"], answer_mode=c["answer_mode"])], done=d / "val_sft" / "done.json"))
    cmds.append(Cmd(["python", "data/build_sft.py", "--tasks", rel(sft_tasks(c, o)), "--out", rel(d),
                     *opts(n=c["sft_tries"], rounds=c["sft_rounds"], level=c["teacher_level"], seed=c["seed"],
                           workers=c["sim_workers"], answer_mode=c["answer_mode"])], done=d / "done.json"))
    return cmds


def data2_cmd(c, o, model):
    # build_sft.py has no default --stage2-model: name the bundled SmolLM2 GGUF
    model = model or common.default_model_path()
    return Cmd(["python", "data/build_sft.py", "--tasks", rel(sft_tasks(c, o)), "--out", rel(o / "data2"),
                *opts(n=c["sft_tries"], rounds=c["sft_rounds"], level=c["teacher_level"], seed=c["seed"],
                      workers=c["sim_workers"], quant=c["quant"], answer_mode=c["answer_mode"], stage2_model=model,
                      stage2_adapter=rel(sft_adapter(c, o, "sft1")), stage2_n=c["stage2_n"],
                      stage2_max_new_tokens=c["max_new_tokens"], stage2_batch_size=c["gen_batch_size"],
                      stages01_from=rel(o / "data"))])


def launch(c, script):
    """How a training or eval script starts: `python script`, or on c["gpus"] > 1 GPUs one process per GPU."""
    if c["gpus"] <= 1:
        return ["python", script]
    return ["accelerate", "launch", "--multi_gpu", "--num_processes", c["gpus"], "--num_machines", 1,
            "--mixed_precision", "no", "--dynamo_backend", "no", script]


def sft_adapter(c, o, name):
    """The adapter SFT stage `name` hands on: its final one, or with sft_pick 'best' the validated step its
    result.json names best (sft.py --val-*). Read when a later stage starts, after this one finished."""
    folder = o / name
    if c["sft_pick"] not in ("last", "best"):
        raise SystemExit(f"chorus_mini.py: sft_pick must be 'last' or 'best', not {c['sft_pick']!r}")
    if c["sft_pick"] == "best":
        best = ((read_json(folder / "result.json") or {}).get("outcome") or {}).get("val_best_adapter")
        if best:
            return folder / best
    return folder / "adapter"


def sft_cmd(c, o, model, data, init=None, name="sft0"):
    return Cmd([*launch(c, "sft.py"), "--data", rel(o / data), "--out", rel(o / name),
                *opts(model=model, quant=c["quant"], init_adapter=init and rel(sft_adapter(c, o, init)),
                      lora_r=c["lora_r"], epochs=c["sft_epochs"], lr=c["sft_lr"], batch_size=c["sft_batch_size"],
                      grad_accum=c["sft_grad_accum"], max_len=c["sft_max_len"], limit=c["sft_limit"],
                      max_answer_tokens=c["max_new_tokens"] if c["sft_answer_cap"] else None,
                      seed=c["seed"], gradient_checkpointing=c["grad_ckpt"]), *sft_val_opts(c, o), "--resume"])


def sft_val_opts(c, o):
    """sft.py's validation (train_val): val/loss on the tuning tasks' teacher rows (data/val_sft), the rates on
    train_val_tasks (the tuning tasks, or the skill validation tasks)."""
    if not c["train_val"]:
        return []
    return opts(val_data=rel(o / "data/val_sft/stage0.jsonl"), val_tasks=rel(train_val_tasks(c, o)),
                val_every=c["sft_val_every"], val_n=c["train_val_n"], val_max_new_tokens=c["max_new_tokens"],
                answer_mode=c["answer_mode"], target_mode=c["target_mode"], sim_workers=c["sim_workers"],
                gen_batch_size=c["gen_batch_size"])


def common_train_opts(c, o):
    """Options rl.py and distill.py share (o: the run folder)."""
    return [*opts(max_new_tokens=c["max_new_tokens"], seed=c["seed"], sim_workers=c["sim_workers"],
                  target_mode=c["target_mode"], gen_batch_size=c["gen_batch_size"],
                  max_tokens_per_micro=c["max_tokens_per_micro"], save_every=c["save_every"],
                  gen_chunk=c["gen_chunk"], sim_timeout=c["train_sim_timeout"], answer_mode=c["answer_mode"],
                  temperature=c["rl_temperature"]),
            "--gradient-checkpointing" if c["grad_ckpt"] else "--no-gradient-checkpointing",
            *({True: ["--release-fast"], False: ["--no-release-fast"]}.get(c["release_fast"], [])),
            *(opts(val_tasks=rel(train_val_tasks(c, o)), val_every=c["rl_val_every"], val_n=c["train_val_n"],
                   val_patience=c["rl_val_patience"]) if c["train_val"] else []), "--resume"]


def reward_opts(c, o):
    """rl.py's and distill.py's reward flags: none for the task reward, else over_random with the prompts' floors."""
    if c["rl_reward"] == "task":
        return []
    return ["--reward", c["rl_reward"], "--floor", rel(o / "data" / "rl_floor.json")]


def rl_cmd(c, o, model, ks):
    """rl.py for expert k, or for the experts in a list ks in one process (rl_joint)."""
    ks = [ks] if isinstance(ks, int) else ks
    return Cmd([*launch(c, "rl.py"), "--adapter", *[rel(sft_adapter(c, o, f"sft{k}")) for k in ks],
                "--tasks", rel(rl_tasks(c, o)), "--out", *[rel(o / f"rl{k}") for k in ks],
                *opts(model=model, quant=c["quant"], profile=c["rl_profile"], steps=c["rl_steps"],
                      prompts_per_step=c["rl_prompts"], group_size=c["rl_group"], rounds=c["rl_rounds"],
                      lr=c["rl_lr"], max_extra_prompts=c["rl_max_extra_prompts"]), *common_train_opts(c, o),
                *reward_opts(c, o),
                *opts(pause_at=c["rl_pause_at"] or None),
                *(opts(stop_on_plateau=c["rl_stop_on_plateau"], min_steps=c["rl_min_steps"] or None)
                  if c["train_val"] else [])])


def command_outs(command):
    """The --out folders a recorded command (a done.json's `commands` entry) names, as it printed them."""
    argv = shlex.split(command)
    return list(itertools.takewhile(lambda a: not a.startswith("--"), argv[argv.index("--out") + 1:])) \
        if "--out" in argv else []


def joint_stages(o, name, names):
    """The stages of `names` whose one command finished stage `name` (its done.json's command names their --out
    folders, in that order), or name alone: what rl_cmd / opd_cmd must be given to print that command again."""
    done = rundir.read_done(o / name) or {}
    outs = command_outs((done.get("commands") or [""])[0])
    got = [n for out in outs for n in names if out == str(rel(o / n))]
    return got if len(got) > 1 and name in got else name


def joint_experts(o, k):
    """joint_stages of stage rl{k}, as expert numbers (k alone, or a list of them)."""
    got = joint_stages(o, f"rl{k}", [f"rl{j}" for j in range(3)])
    return [int(n[2:]) for n in got] if isinstance(got, list) else k


def merge_cmd(c, o, name, lam=None, out=None):
    experts = [rel(o / f"rl{k}/adapter") for k in range(3)]
    out = out or o / "merge" / name
    return Cmd(["python", "merge.py", "--method", *MERGES[name], "--adapters", *experts, "--out", rel(out),
                *opts(space=c["merge_space"], rank=None if name == "soup" else c["merge_rank"],   # soup: exact concat
                      density=c["merge_density"], seed=c["seed"], device=c["merge_device"], lam=lam)],
               done=out / "done.json")


def merge_cmds(c, o, model):
    """The merge stage. With merge_lams (several lambdas): each method merged once (at lambda 1 when listed) and
    rescaled to the other lambdas (every method is lambda x its lambda-1 merge: merge.py --rescale) into
    merge/tune/NAME_lamL, each candidate scored on the tuning tasks (tune_tasks: direct answers, tune_n samples),
    and the best (Pass@1, then Cov@1, then the lambda nearest 1) copied to merge/NAME with its choice.json.
    Without: each method once, at merge.py's lambda 1."""
    lams = c["merge_lams"] or []
    if len(lams) < 2:
        return [merge_cmd(c, o, m, lams[0] if lams else None) for m in MERGES]
    cmds = []
    if not any(lams):
        raise SystemExit(f"chorus-mini: merge_lams {lams} has no non-zero lambda to merge at")
    # merged once (at 1 when listed, else the first non-zero lambda); the others rescale it (merge.py --rescale)
    first = 1.0 if 1.0 in lams else next(lam for lam in lams if lam)
    for m in MERGES:
        cands = [o / "merge" / "tune" / f"{m}_lam{lam:g}" for lam in lams]
        base = cands[lams.index(first)]
        for lam, cand in sorted(zip(lams, cands), key=lambda lc: lc[0] != first):
            cmds.append(merge_cmd(c, o, m, lam, cand) if cand == base else
                        Cmd(["python", "merge.py", "--rescale", rel(base), "--lam", lam, "--out", rel(cand)],
                            done=cand / "done.json"))
            cmds.append(eval_cmd(c, o, model, cand, tune_tasks(c, o), cand / "tune_eval", c["tune_n"], 0))
        argv = ["python", "chorus_mini.py", "pick-merge", "--out", rel(o / "merge" / m), "--candidates", *map(rel, cands)]
        cmds.append(Cmd(argv, done=o / "merge" / m / "choice.json",
                        fn=lambda m=m, cands=cands: pick_merge(o / "merge" / m, cands)))
    return cmds


def pick_merge(out, candidates):
    """Copy the candidate merge with the best tuning score (direct Pass@1, then Cov@1, then |lambda - 1| smallest)
    to `out`, with choice.json listing every candidate's score."""
    rows = []
    for cand in map(Path, candidates):
        report = read_json(cand / "merge_report.json") or {}
        m = (read_json(cand / "tune_eval" / "metrics.json") or {}).get("direct")
        if not m:
            raise SystemExit(f"pick-merge: {cand}/tune_eval/metrics.json has no direct metrics")
        lam = (report.get("params") or {}).get("lam", 1.0)
        rows.append({"candidate": str(cand), "lam": lam, "pass@1": m["pass@1"], "cov@1": m["cov@1"],
                     "syn_pass": m.get("syn_pass"), "tasks": m.get("tasks")})
    best = max(rows, key=lambda r: (r["pass@1"], r["cov@1"], -abs(r["lam"] - 1.0)))
    out = Path(out)
    if out.exists():
        shutil.rmtree(out)
    # without the candidate's done.json: merge/NAME/done.json means "merged at the default lambda" to merge_cmd
    shutil.copytree(best["candidate"], out, ignore=shutil.ignore_patterns("tune_eval", "done.json"))
    (out / "choice.json").write_text(json.dumps({"chosen": best, "candidates": rows,
                                                 "rule": "tuning-task direct Pass@1, then Cov@1, then lambda nearest 1"},
                                                indent=1))
    print(f"pick-merge: {out.name} lambda {best['lam']:g} (tuning Pass@1 {best['pass@1']:.1f}, Cov@1 {best['cov@1']:.1f}; "
          + ", ".join(f"{r['lam']:g}: {r['pass@1']:.1f}" for r in rows) + ")")


def eval_cmd(c, o, model, adapter, tasks, out, n, rounds):
    """evaluate.py eval of one model (adapter None: the base model, or a baseline's spec as model) into out; adapter
    and out may be lists of as many (eval_joint: several adapters in one process)."""
    adapters, outs = (adapter, out) if isinstance(out, list) else ([adapter] if adapter else [], [out])
    return Cmd([*launch(c, "evaluate.py"), "eval", "--tasks", rel(tasks), "--out", *map(rel, outs),
                *opts(model=model), *(["--adapter", *map(rel, adapters)] if adapters else []),
                *opts(quant=c["quant"], n=n, rounds=rounds,
                      max_new_tokens=c["max_new_tokens"], batch_size=c["gen_batch_size"], seed=c["seed"],
                      sim_workers=c["sim_workers"], target_mode=c["target_mode"], answer_mode=c["answer_mode"])],
               done=Path(outs[0]) / "done.json" if len(outs) == 1 else None)


def eval_cmds(c, o, model, stage, models, tasks, n, rounds, base=None):
    """An eval stage's commands (eval, eval_syn, eval_skill, val): each model (name -> adapter folder, None = the
    base model) into OUT/stage/NAME, then each baseline (name -> evaluate.py --model spec). With eval_joint the
    adapters of joint_models run as one evaluate.py command, the others (finished, or the base model) alone."""
    joint = joint_models(c, o, stage, models)
    return ([eval_cmd(c, o, model, [models[m] for m in joint], tasks, [o / stage / m for m in joint], n, rounds)]
            if joint else []) \
        + [eval_cmd(c, o, model, models[m], tasks, o / stage / m, n, rounds) for m in models if m not in joint] \
        + [eval_cmd(c, o, spec, None, tasks, o / stage / name, n, rounds) for name, spec in (base or {}).items()]


def joint_models(c, o, stage, models):
    """The models of an eval stage that one evaluate.py command evaluates together (eval_joint, one process: not
    under accelerate's several): the trained adapters (rank lora_r) whose folder has no done.json yet; in a finished
    stage, those of the joint command its done.json records, so that the stage's commands print again as they ran.
    [] when fewer than two (one model's command is the same either way). The merges run alone, their adapter folded
    into the weights: they have rank merge_rank (576 in small3) or 3 x lora_r (the soup), and the stack rule pads
    every adapter of a call to the largest rank and multiplies every row by all of them."""
    if not c["eval_joint"] or c["gpus"] > 1:
        return []
    record = rundir.read_done(o / stage)
    if record is not None and "commands" in record:
        outs = max((command_outs(cmd) for cmd in record["commands"]), key=len, default=[])
        joint = [m for out in outs for m in models if out == str(rel(o / stage / m))]
    else:
        joint = [m for m, adapter in models.items()
                 if adapter is not None and m not in MERGES and not (o / stage / m / "done.json").exists()]
    return joint if len(joint) > 1 else []


def rl_prompts_used(c):
    """Prompts an RL expert can consume from the task order: P per step, plus the dynamic-sampling refill
    (rl.py's small profile; at most rl_max_extra_prompts, default 2 P, per step). OPD starts after them."""
    p = c["rl_prompts"]
    extra = 0 if c["rl_profile"] == "paper" else (2 * p if c["rl_max_extra_prompts"] is None else c["rl_max_extra_prompts"])
    return c["rl_steps"] * (p + extra)


def opd_cmd(c, o, model, variant):
    """distill.py for one OPD stage (its gate flags), or for the stages in a list in one process (opd_joint:
    --variants)."""
    experts = [rel(o / f"rl{k}/adapter") for k in range(3)]
    metrics = [rel(o / f"val/rl{k}/metrics.json") for k in range(3)]
    several = isinstance(variant, list)
    return Cmd([*launch(c, "distill.py"), "--student", "best", "--teachers", *experts, "--val-metrics", *metrics,
                "--tasks", rel(rl_tasks(c, o)), "--out", *[rel(o / v) for v in (variant if several else [variant])],
                *opts(model=model, quant=c["quant"], steps=c["opd_steps"], prompts_per_step=c["opd_prompts"],
                      group_size=c["opd_group"], rounds=c["rl_rounds"], teacher_samples=c["opd_teacher_samples"],
                      cursor_start=rl_prompts_used(c)),          # continue on prompts RL has not used
                *(["--variants", *[OPD_GATES[v] for v in variant]] if several else OPD_VARIANTS[variant]),
                *common_train_opts(c, o), *reward_opts(c, o)])


def model_adapters(o, c=None):
    """Every evaluated model: name -> adapter folder (None = the base model); c: the SFT stages' sft_pick."""
    return {"base": None, **{f"sft{k}": sft_adapter(c, o, f"sft{k}") if c else o / f"sft{k}/adapter" for k in range(3)},
            **{f"rl{k}": o / f"rl{k}/adapter" for k in range(3)},
            **{m: o / "merge" / m for m in MERGES}, **{v: o / v / "adapter" for v in OPD_VARIANTS}}


def baselines(c):
    """The profile's eval_baselines: folder name -> evaluate.py --model spec (random, teacher:LEVEL)."""
    specs = [b.strip() for b in c["eval_baselines"].split(",") if b.strip()]
    bad = [b for b in specs if b != "random" and not (b.startswith("teacher:") and len(b) > len("teacher:"))]
    if bad:
        raise SystemExit(f"chorus_mini.py: eval_baselines: unknown baseline(s) {bad} (random, teacher:LEVEL)")
    return {b.replace(":", "_"): b for b in specs}


def compare_cmd(o, names, out, sub="eval"):
    dirs = [o / sub / n for n in names]
    argv = ["python", "chorus_mini.py", "compare", *map(rel, dirs), "--out", rel(out)]
    return Cmd(argv, done=out / "done.json", fn=lambda: main(argv[2:]))


# -----------------------------------------------------------------------------
# The pipeline

def cmd_run(args):
    c = profiles.apply_overrides(profiles.PROFILES[args.profile], args.set)
    for key, kind, is_there in (("eval_tasks", "file", Path.is_file), ("real_corpus", "folder", Path.is_dir)):
        if c[key] and c[key] != profiles.PROFILES[args.profile][key] and not is_there(ROOT / c[key]):
            raise SystemExit(f"chorus_mini.py: --set {key}={c[key]}: no such {kind} {ROOT / c[key]} ('' for none)")
    if c["gpu_mem_gib"] is not None:    # each stage's process keeps to this budget (common.apply_gpu_cap)
        if not c["gpu_mem_gib"] > 0:
            raise SystemExit(f"chorus_mini.py: gpu_mem_gib={c['gpu_mem_gib']!r}: expected a size in GiB above 0")
        os.environ[common.GPU_CAP_ENV] = f"{c['gpu_mem_gib']:g}"
    if c["gpu_share"] is not None:
        try:
            common.parse_share(c["gpu_share"])
        except ValueError as e:
            raise SystemExit(f"chorus_mini.py: gpu_share: {e}") from None
        os.environ[common.GPU_SHARE_ENV] = str(c["gpu_share"])
    baselines(c)                # a bad eval_baselines: one line now, not after training
    if c["train_val"] and c["train_val_source"] == "skill" and c["skill_val_tasks"] <= 0:
        raise SystemExit("chorus_mini.py: train_val_source=skill needs skill_val_tasks > 0")   # before the data stage
    o = Path(args.out or ROOT / "runs" / args.profile).resolve()
    model = rel(o / "data/tiny_model") if c["model"] == "tiny" else c["model"]
    ctx = argparse.Namespace(out=o, only=set(args.only or []))
    for name in [*(args.only or []), *([args.from_stage] if args.from_stage else [])]:
        if name not in STAGES:
            raise SystemExit(f"chorus_mini.py: unknown stage {name!r} (stages: {' '.join(STAGES)})")
    rundir.Deadline()       # a bad $CHORUS_DEADLINE: one line now, not when the first training stage starts
    print(f"chorus-mini run: profile {args.profile}, out {o}, commands run from {ROOT}")
    for k, v in c.items():
        print(f"  {k:22s} {v!r}" + ("   (--set)" if v != profiles.PROFILES[args.profile][k] else ""))
    if not eval_source(c):
        print(f"note: {c['eval_tasks']} is absent (a fresh clone has no ../shared): the eval tasks are the "
              "synthetic validation tasks" if c["eval_tasks"] else "note: eval_tasks '': the eval tasks are the "
              "synthetic validation tasks")
    if args.from_stage:     # with --only, only those stages are redone (--from rl0 --only rl0: just rl0)
        for name in STAGES[STAGES.index(args.from_stage):]:
            if (o / name).exists() and (not ctx.only or name in ctx.only):
                print(f"--from {args.from_stage}: removing {o / name}")
                shutil.rmtree(o / name)
    o.mkdir(parents=True, exist_ok=True)
    (o / "run_config.json").write_text(json.dumps({"profile": args.profile, "config": c, "argv": sys.argv[1:]}, indent=1))
    eval_tasks = o / "data" / ("eval_tasks.jsonl" if eval_source(c) else "val_tasks.jsonl")
    wanted = list(model_adapters(o)) if c["eval_models"] == "all" else c["eval_models"].split(",")
    if set(wanted) - set(model_adapters(o)):
        raise SystemExit(f"chorus_mini.py: eval_models: unknown model(s) {sorted(set(wanted) - set(model_adapters(o)))} "
                         f"(models: {','.join(model_adapters(o))})")
    subset = set(wanted) != set(model_adapters(o))     # e.g. the SFT stages while RL still runs elsewhere

    run_stage(ctx, "data", data_cmds(c, o, o / "data/tiny_model"))
    tuned = {"sft0", "sft1", "sft2", "rl0", "rl1", "rl2", "merge", "val", *OPD_VARIANTS}   # stages that read the tuning tasks
    if (c["tune_source"] == "dev" and eval_source(c) and (o / "data/done.json").is_file()
            and not tune_tasks(c, o).is_file() and (not ctx.only or ctx.only & tuned)):
        raise SystemExit(f"chorus_mini.py: {rel(tune_tasks(c, o))} is missing: this run's data stage predates "
                         "tune_source=dev. Make it with `python chorus_mini.py select-tasks --split tuning ...` and "
                         "rebuild data/val_sft from it (README, validation), or --set tune_source=val")
    run_stage(ctx, "sft0", [sft_cmd(c, o, model, "data/stage0.jsonl", None, "sft0")])
    run_stage(ctx, "sft1", [sft_cmd(c, o, model, "data/stage1.jsonl", "sft0", "sft1")])
    run_stage(ctx, "data2", [data2_cmd(c, o, model)])
    run_stage(ctx, "sft2", [sft_cmd(c, o, model, "data2/stage2.jsonl", "sft1", "sft2")])
    joint = c["rl_joint"] and c["gpus"] <= 1          # one process: not under accelerate's several
    due = [k for k in range(3) if (not ctx.only or f"rl{k}" in ctx.only) and not (o / f"rl{k}/done.json").exists()]
    if joint and len(due) > 1:      # one process trains them all; each stage folder gets its record
        run_stage(ctx, f"rl{due[0]}", [rl_cmd(c, o, model, due)], needs=[f"sft{k}" for k in due],
                  also=[f"rl{k}" for k in due[1:]])
    for k in range(3):              # a stage a joint command finished is compared with that command: no note
        run_stage(ctx, f"rl{k}", [rl_cmd(c, o, model, joint_experts(o, k))])
    run_stage(ctx, "merge", merge_cmds(c, o, model))
    val_tasks = o / "data/skill_val/skill_tasks.jsonl" if c["skill_val_tasks"] > 0 else tune_tasks(c, o)
    run_stage(ctx, "val", eval_cmds(c, o, model, "val", {f"rl{k}": o / f"rl{k}/adapter" for k in range(3)}, val_tasks,
                                    c["val_n"], c["val_rounds"]))
    joint = c["opd_joint"] and c["gpus"] <= 1
    due = [v for v in OPD_VARIANTS if (not ctx.only or v in ctx.only) and not (o / v / "done.json").exists()]
    if joint and len(due) > 1:      # one process trains the due variants; each stage folder gets its record
        run_stage(ctx, due[0], [opd_cmd(c, o, model, due)], needs=["val"], also=due[1:])
    for variant in OPD_VARIANTS:    # a stage a joint command finished is compared with that command: no note
        run_stage(ctx, variant, [opd_cmd(c, o, model, joint_stages(o, variant, list(OPD_VARIANTS)))])
    needs = sorted({MODEL_STAGE[m] for m in wanted})
    base = baselines(c)         # weightless: evaluated beside the models, and in every comparison
    models = {m: model_adapters(o, c)[m] for m in wanted}
    run_stage(ctx, "eval", eval_cmds(c, o, model, "eval", models, eval_tasks, c["eval_n"], c["eval_rounds"], base),
              needs=needs, partial=subset)
    syn = []                    # the held-out synthetic test designs of the data stage
    if c["test_tasks"] > 0:
        syn = eval_cmds(c, o, model, "eval_syn", models, o / "data" / "test_tasks.jsonl", c["test_n"],
                        c["test_rounds"], base)
    run_stage(ctx, "eval_syn", syn, needs=needs, partial=subset)
    skill = []                  # the skill split of the data stage
    if c["skill_tasks"] > 0:
        skill = eval_cmds(c, o, model, "eval_skill", models, o / "data" / "skill" / "skill_tasks.jsonl", c["eval_n"],
                          c["eval_rounds"], base)
    run_stage(ctx, "eval_skill", skill, needs=needs, partial=subset)
    if subset:
        print(f"chorus-mini run: eval_models={c['eval_models']} is a subset of the models: compare and report wait "
              "for a run with all of them")
        return 0
    experts = [m for m in ("rl0", "rl1", "rl2") if m in wanted]
    everyone = wanted + list(base)
    run_stage(ctx, "compare", [compare_cmd(o, experts, o / "compare/experts"), compare_cmd(o, everyone, o / "compare/all")]
              + ([compare_cmd(o, experts, o / "compare/experts_syn", "eval_syn"),
                  compare_cmd(o, everyone, o / "compare/all_syn", "eval_syn")] if syn else [])
              + ([compare_cmd(o, experts, o / "compare/experts_skill", "eval_skill"),
                  compare_cmd(o, everyone, o / "compare/all_skill", "eval_skill")] if skill else []))
    run_stage(ctx, "report", [Cmd(["python", "report.py", "--out", rel(o)])])
    if ctx.only and "report" not in ctx.only:
        print(f"chorus-mini run: stage(s) {' '.join(args.only)} done")
    else:
        print(f"chorus-mini run: done; report {o / 'report/report.md'}")
    return 0


# -----------------------------------------------------------------------------
# Small steps of `run` (also subcommands)

def mix_tasks(d, real_val):
    """DATA/train_tasks.jsonl = the synthetic train designs + the pool's designs after the first `real_val`;
    DATA/val_tasks.jsonl = the synthetic val designs + the pool's first `real_val` (the pool is a seeded sample,
    so its order is random); DATA/mix.json counts them. Real tasks keep their licence and provenance."""
    d = Path(d)
    pool = sim.load_tasks(d / "pool" / "pool.jsonl")
    train = sim.load_tasks(d / "syn_train_tasks.jsonl") + pool[real_val:]
    val = sim.load_tasks(d / "syn_val_tasks.jsonl") + pool[:real_val]
    for name, rows in (("train_tasks.jsonl", train), ("val_tasks.jsonl", val)):
        with open(d / name, "w") as f:
            f.writelines(json.dumps(t) + "\n" for t in rows)
    counts = {"train_real": len(pool[real_val:]), "train_synthetic": len(train) - len(pool[real_val:]),
              "val_real": len(pool[:real_val]), "val_synthetic": len(val) - len(pool[:real_val]),
              "licenses": dict(collections.Counter(t.get("license") or "?" for t in pool))}
    (d / "mix.json").write_text(json.dumps(counts, indent=1))
    print(f"mix-tasks: train {counts['train_synthetic']} synthetic + {counts['train_real']} real, "
          f"val {counts['val_synthetic']} synthetic + {counts['val_real']} real")
    return counts


def skill_mix(d, easy_share, seed=0):
    """DATA/sft_tasks.jsonl = the training tasks + the skill training tasks (DATA/skill_train's synthetic family
    instances and DATA/skill/skill_train.jsonl's pool designs, which random stimulus fails and a known stimulus
    passes); DATA/rl_tasks.jsonl = every skill training task + enough other training tasks (seeded draw) to make
    `easy_share` of the pool, shuffled with the seed; DATA/skill_mix.json counts them."""
    d = Path(d)
    easy = sim.load_tasks(d / "train_tasks.jsonl")
    skill_syn = sim.load_tasks(d / "skill_train" / "skill_tasks.jsonl")
    skill_real = sim.load_tasks(d / "skill" / "skill_train.jsonl") if (d / "skill" / "skill_train.jsonl").is_file() else []
    skill = skill_syn + skill_real
    rng = random.Random(f"skill-mix:{seed}")
    n_easy = min(len(easy), round(len(skill) * easy_share / (1 - easy_share)))
    pool = skill + rng.sample(easy, n_easy)
    rng.shuffle(pool)
    for name, rows in (("sft_tasks.jsonl", easy + skill), ("rl_tasks.jsonl", pool)):
        (d / name).write_text("".join(json.dumps(t) + "\n" for t in rows))
    counts = {"sft_tasks": len(easy) + len(skill), "rl_tasks": len(pool), "rl_skill_synthetic": len(skill_syn),
              "rl_skill_real": len(skill_real), "rl_easy": n_easy,
              "rl_easy_share": round(n_easy / len(pool), 3) if pool else 0.0}
    (d / "skill_mix.json").write_text(json.dumps(counts, indent=1))
    print(f"skill-mix: RL/OPD prompts {len(pool)} = {len(skill_syn)} synthetic + {len(skill_real)} real skill tasks "
          f"+ {n_easy} others ({counts['rl_easy_share']:.0%}); SFT tasks {counts['sft_tasks']}")
    return counts


def select_tasks(path, limit, max_chars, out, split="report"):
    """The fixed reporting subset: tasks of evaluate's 'report' split (or 'tuning') with at most max_chars of
    RTL+spec, ordered by sha256 of the id (independent of file order and seed), the first `limit` (None: all)."""
    tasks = evaluate.split_tasks(sim.load_tasks(path))[0 if split == "tuning" else 1]
    size = lambda t: sum(len(f["content"]) for f in (t.get("rtl_files") or []) + (t.get("spec_files") or []))
    fit = [t for t in tasks if size(t) <= max_chars]
    fit.sort(key=lambda t: hashlib.sha256(t["id"].encode()).hexdigest())
    chosen = fit[:limit]
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text("".join(json.dumps(t) + "\n" for t in chosen))
    print(f"select-tasks: {len(chosen)} of {len(fit)} {split}-split tasks with <= {max_chars} chars "
          f"({len(tasks)} in the split): {', '.join(t['id'] for t in chosen[:8])}{' ...' if len(chosen) > 8 else ''}")


def make_tiny_model(out, seed=0):
    """common.tiny_model saved as an HF folder, so every stage script loads it like any model."""
    model, tok = common.tiny_model(seed=seed)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    print(f"tiny-model: random test model (seed {seed}) -> {out}")


# -----------------------------------------------------------------------------
# CLI

def main(argv=None):
    parser = argparse.ArgumentParser(prog="chorus_mini.py", description=__doc__.split("\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("run", help="the whole pipeline (or some stages of it)")
    p.add_argument("--profile", choices=sorted(profiles.PROFILES), default="smoke")
    p.add_argument("--out", default=None, help="run folder (default: runs/<profile>)")
    p.add_argument("--from", dest="from_stage", default=None, metavar="STAGE",
                   help="delete STAGE and every later stage's folder, then run")
    p.add_argument("--only", nargs="+", default=None, metavar="STAGE", help="run only these stages")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a profile value")
    p = sub.add_parser("report", help="rebuild OUT/report/ from a run folder (runs report.py)")
    p.add_argument("--out", required=True, help="run folder")
    p = sub.add_parser("select-tasks", help="the fixed reporting subset of a task file")
    p.add_argument("--tasks", required=True)
    p.add_argument("--limit", type=int, default=None, help="tasks at most (default: all that fit)")
    p.add_argument("--max-chars", type=int, required=True, help="RTL+spec characters at most")
    p.add_argument("--split", choices=("report", "tuning"), default="report", help="evaluate.split_tasks's split")
    p.add_argument("--out", required=True)
    p = sub.add_parser("pick-merge", help="keep the merge candidate that scores best on the tuning tasks")
    p.add_argument("--out", required=True, help="the merge's folder (merge/NAME)")
    p.add_argument("--candidates", nargs="+", required=True, help="candidate folders, each with tune_eval/metrics.json")
    p = sub.add_parser("mix-tasks", help="mix the real-design pool into the synthetic train/val tasks (data stage)")
    p.add_argument("--data", required=True, help="the run's data folder (pool/pool.jsonl, syn_*_tasks.jsonl)")
    p.add_argument("--real-val", type=int, default=0, help="pool designs that go to the validation tasks")
    p = sub.add_parser("skill-mix", help="add the skill training tasks to SFT and draw RL/OPD prompts mostly from them")
    p.add_argument("--data", required=True, help="the run's data folder (train_tasks.jsonl, skill_train/, skill/)")
    p.add_argument("--easy-share", type=float, default=0.2, help="share of RL/OPD prompts from the other training tasks")
    p.add_argument("--seed", type=int, default=0)
    p = sub.add_parser("tiny-model", help="save the tiny random test model as an HF folder")
    p.add_argument("--out", required=True)
    p.add_argument("--seed", type=int, default=0)
    evaluate.add_commands(sub)                        # eval, compare, generate
    args = parser.parse_args(argv)
    if args.command == "run":
        return cmd_run(args)
    if args.command == "report":          # report.py reads this module's stage tables: a process of its own
        return subprocess.call([sys.executable, str(ROOT / "report.py"), "--out", args.out])
    if args.command == "select-tasks":
        return select_tasks(args.tasks, args.limit, args.max_chars, args.out, args.split) or 0
    if args.command == "pick-merge":
        return pick_merge(args.out, args.candidates) or 0
    if args.command == "mix-tasks":
        return mix_tasks(args.data, args.real_val) and 0
    if args.command == "skill-mix":
        if not 0 <= args.easy_share < 1:
            raise SystemExit(f"chorus_mini.py skill-mix: --easy-share {args.easy_share} is not in [0, 1)")
        return skill_mix(args.data, args.easy_share, args.seed) and 0
    if args.command == "tiny-model":
        return make_tiny_model(args.out, args.seed) or 0
    return args.func(args)


if __name__ == "__main__":
    raise SystemExit(rundir.cli("chorus_mini.py", main))
