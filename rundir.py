"""The run folder every stage writes (sft.py, rl.py, distill.py, evaluate.py, merge.py, data/build_sft.py):

    OUT/ckpt/step_000010/   adapter/ (peft, bf16), optimizer.pt (exact trainable weights, optimizer and
                            scheduler state), meta.json (step, RNG states, the stage's own data cursor/config)
    OUT/log.jsonl           one JSON object per optimizer step (rl.py / distill.py: also validation rows,
                            {"step", "val": 1, "val/...": ...}; readers of training rows skip them)
    OUT/curves.png          the log's columns against step
    OUT/result.json         {"config", "setup", "outcome"}: what was asked, what it ran on, what came out
    OUT/done.json           {"script", "finished_at", "files"}, written last: its presence means complete
    OUT/.lock               {"pid", "host", ...} of the one process writing OUT (lock_run; gone at its exit)

Checkpoints are written to a temporary folder renamed last, so a folder named step_* is always complete.
A checkpoint without optimizer.pt (a *handoff*: adapter/ + meta.json, ~10 MB instead of ~70 for the small profile,
what crosses between device sessions) resumes sft.py, rl.py or distill.py from the bf16 adapter with fresh Adam
moments (sft.py's learning-rate schedule goes on from the step); the run's handoffs.jsonl records each such resume.
A wall-clock deadline ($CHORUS_DEADLINE, unix seconds; class Deadline) makes sft.py, rl.py and distill.py stop between
steps, checkpointed and unfinished (no done.json; exit EXIT_DEADLINE), before a caller's time limit would kill them
and lose every step since the last --save-every checkpoint.
Under several processes (dist.py) only rank 0 writes; the checkpoint does not depend on the process count.
"""
import atexit
import base64
import json
import math
import os
import platform
import random
import shutil
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch

import common
import dist

# -----------------------------------------------------------------------------
# RNG state as JSON (python, numpy, torch, cuda)


def _b64(t):
    return base64.b64encode(t.cpu().numpy().tobytes()).decode()


def _unb64(s):
    return torch.from_numpy(np.frombuffer(base64.b64decode(s), dtype=np.uint8).copy())


def rng_state():
    np_state = np.random.get_state()
    return {
        "python": [random.getstate()[0], list(random.getstate()[1]), random.getstate()[2]],
        "numpy": [np_state[0], np_state[1].tolist(), int(np_state[2]), int(np_state[3]), float(np_state[4])],
        "torch": _b64(torch.get_rng_state()),
        "cuda": [_b64(s) for s in torch.cuda.get_rng_state_all()] if torch.cuda.is_available() else [],
    }


def set_rng_state(state):
    py = state["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    npst = state["numpy"]
    np.random.set_state((npst[0], np.array(npst[1], dtype=np.uint32), npst[2], npst[3], npst[4]))
    torch.set_rng_state(_unb64(state["torch"]))
    if state.get("cuda") and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([_unb64(s) for s in state["cuda"]])


# -----------------------------------------------------------------------------
# Checkpoints: OUT/ckpt/step_000010/{adapter/, optimizer.pt, meta.json}

def _as_default(name, adapter_name):
    """A trainable weight's name as it reads under the adapter name "default": a checkpoint names its weights so
    whatever adapter they trained as (rl.py's experts in one process each have their own), so that any run of the
    same LoRA settings resumes it."""
    return name.replace(f".{adapter_name}.", ".default.") if adapter_name != "default" else name


def save_checkpoint(ckpt_dir, step, model, optimizer, meta, keep_last=0, scheduler=None, adapter_name="default"):
    """Write ckpt_dir/step_{step:06d} atomically. The adapter folder is the standard peft one (bf16, via
    common.save_adapter); optimizer.pt also holds the exact trainable weights, so that a resumed run
    continues bit-for-bit rather than from bf16-rounded weights. keep_last > 0 keeps that many.
    adapter_name: the adapter saved; it must be the trainable one (optimizer.pt keeps the trainable weights)."""
    ckpt_dir = Path(ckpt_dir)
    final = ckpt_dir / f"step_{step:06d}"
    if not dist.is_main():
        return final
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    tmp = ckpt_dir / f".tmp_step_{step:06d}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    common.save_adapter(model, str(tmp / "adapter"), adapter_name=adapter_name)
    trainable = {_as_default(n, adapter_name): p.detach().cpu().clone()
                 for n, p in model.named_parameters() if p.requires_grad}
    state = {"optimizer": optimizer.state_dict(), "trainable": trainable}
    if scheduler is not None:
        state["scheduler"] = scheduler.state_dict()
    torch.save(state, tmp / "optimizer.pt")
    meta = dict(meta, step=step, rng=rng_state(), saved_at=time.strftime("%Y-%m-%d %H:%M:%S"))
    (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    if keep_last > 0:
        for old in sorted(ckpt_dir.glob("step_*"))[:-keep_last]:
            shutil.rmtree(old, ignore_errors=True)
    return final


# -----------------------------------------------------------------------------
# A wall-clock deadline: stop between steps, checkpointed, rather than be killed mid-interval

DEADLINE_ENV = "CHORUS_DEADLINE"
EXIT_DEADLINE = 75              # sysexits' EX_TEMPFAIL: stopped unfinished on purpose; --resume continues
DEADLINE_MARKER = "deadline_stop.json"


class Deadline:
    """$CHORUS_DEADLINE (unix seconds; unset or empty: no deadline), read when made (a script makes one before it
    loads anything, so a bad value costs nothing: a ValueError, one line). The training loop calls start() just
    before its first step and tick() after each, and stops (checkpointed) when near() says the next step, as long
    as the longest of the last three plus `extra` and `margin` seconds (the checkpoint and the exit), would end
    after it. Before the first step has been timed only extra and the margin count."""

    def __init__(self, value=None, margin=5.0, clock=time.time):
        value = os.environ.get(DEADLINE_ENV, "") if value is None else value
        try:
            self.at = float(value) if str(value).strip() else None
        except ValueError:
            self.at = math.nan
        if self.at is not None and not math.isfinite(self.at):
            raise ValueError(f"${DEADLINE_ENV}={value!r}: not a (finite) number of unix seconds")
        self.margin, self.clock, self.durations, self.t = margin, clock, [], clock()

    def start(self):
        self.t = self.clock()

    def tick(self):
        now = self.clock()
        self.durations.append(now - self.t)
        self.t = now

    def near(self, extra=0.0):
        """True on every rank when any rank is near the deadline (ranks stop at the same step); `extra`: seconds
        the next step is known to take beyond a plain one (a validation due after it)."""
        if self.at is None:
            return False
        near = self.clock() + max(self.durations[-3:], default=0.0) + extra + self.margin > self.at
        return dist.all_sum(float(near)) > 0

    def stop(self, out, step, write=print, pause=None):
        """Say so and leave OUT/deadline_stop.json {step, at, why} (rank 0), by which chorus_mini.py knows a deadline
        stop when a launcher (accelerate, torchrun) turns the exit code 75 into 1; returns EXIT_DEADLINE. pause: the
        step of a --pause-at stop (the same stop, other words: that flag must go for the run to go on)."""
        if pause is None:
            write(f"deadline (${DEADLINE_ENV}) near: stopped after step {step}" + (", checkpointed" if step else "")
                  + "; run again with --resume to continue")
        else:
            write(f"--pause-at {pause}: stopped after step {step}" + (", checkpointed" if step else "")
                  + "; run again with --resume and without --pause-at to go on")
        if dist.is_main():
            marker = {"step": step, "at": time.strftime("%Y-%m-%d %H:%M:%S"),
                      "why": "deadline" if pause is None else "pause"}
            (Path(out) / DEADLINE_MARKER).write_text(json.dumps(marker) + "\n")
        unlock_run(out)                 # the run is over for now: a resume (another process) may take the folder
        return EXIT_DEADLINE


def stop_reason(out):
    """Why the run in OUT stopped unfinished, from its marker: "pause" (--pause-at) or "deadline" (also without a
    marker: an exit 75 with none left is the deadline's)."""
    try:
        return json.loads((Path(out) / DEADLINE_MARKER).read_text()).get("why", "deadline")
    except (OSError, ValueError):
        return "deadline"


def deadline_stopped(out, code, since):
    """Did a command that wrote OUT and exited `code` stop at the deadline? Exit 75, or a nonzero exit (accelerate and
    torchrun turn 75 into 1) with OUT/deadline_stop.json written since `since` (unix s). The marker is removed."""
    marker = Path(out) / DEADLINE_MARKER
    fresh = marker.is_file() and marker.stat().st_mtime >= since - 1
    marker.unlink(missing_ok=True)
    return code == EXIT_DEADLINE or (code != 0 and fresh)


def last_val_seconds(log):
    """How long the last validation in a log took (its row's val/s; 0.0 without one): what a step followed by a
    validation takes beyond a plain one, for Deadline.near's `extra`."""
    return next((r.get("val/s") or 0.0 for r in reversed(log) if r.get("val")), 0.0)


def latest_checkpoint(ckpt_dir):
    """The newest complete checkpoint folder, or None. (Temp folders start with '.')."""
    found = sorted(p for p in Path(ckpt_dir).glob("step_*") if (p / "meta.json").exists())
    return found[-1] if found else None


def read_meta(path):
    return json.loads((Path(path) / "meta.json").read_text())


def load_checkpoint(path, model, optimizer, scheduler=None, adapter_name="default"):
    """Restore trainable weights, optimizer (and scheduler) state and RNG states; returns the meta dict.
    A checkpoint of other trainable parameters (another adapter or LoRA rank) is refused. A handoff (no
    optimizer.pt) restores the bf16 adapter's weights and leaves the optimizer fresh (a scheduler is stepped to the
    checkpoint's step): meta["optimizer_restored"] is False. adapter_name: the model's trainable adapter, which
    takes the checkpoint's weights (saved under any adapter name: _as_default)."""
    path = Path(path)
    if not (path / "optimizer.pt").exists():
        load_handoff_adapter(path / "adapter", model, adapter_name)
        meta = read_meta(path)
        if scheduler is not None:        # the learning-rate schedule goes on from the step; only the moments are new
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)    # "lr_scheduler.step() before optimizer.step()"
                for _ in range(meta["step"]):
                    scheduler.step()
        set_rng_state(meta["rng"])
        return dict(meta, optimizer_restored=False)
    state = torch.load(path / "optimizer.pt", map_location="cpu", weights_only=False)
    named = {_as_default(n, adapter_name): p for n, p in model.named_parameters()}
    mismatch = set(state["trainable"]) ^ {n for n, p in named.items() if p.requires_grad}
    if mismatch:
        raise ValueError(f"{path}: checkpoint does not match the adapter (e.g. {sorted(mismatch)[:3]}); "
                         "resume with the same adapter / LoRA settings")
    with torch.no_grad():
        for n, t in state["trainable"].items():
            named[n].copy_(t.to(named[n].device, named[n].dtype))
    optimizer.load_state_dict(state["optimizer"])
    if scheduler is not None:
        scheduler.load_state_dict(state["scheduler"])
    meta = read_meta(path)
    set_rng_state(meta["rng"])
    return dict(meta, optimizer_restored=True)


def load_handoff_adapter(folder, model, adapter_name="default"):
    """Copy a saved peft adapter's tensors into the model's trainable LoRA weights; every trainable weight must
    be in the file and every tensor of the file must land (else ValueError, naming the folder)."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file
    f = Path(folder) / "adapter_model.safetensors"
    if not f.is_file():
        raise FileNotFoundError(f"{f}: a checkpoint needs optimizer.pt or its adapter to resume from")
    trainable = {n: p for n, p in model.named_parameters() if p.requires_grad}
    before = {n: p.detach().clone() for n, p in trainable.items()}
    try:
        with torch.no_grad():
            for p in trainable.values():
                p.fill_(float("nan"))       # so a weight the file does not set is caught below
            res = set_peft_model_state_dict(model, load_file(str(f)), adapter_name=adapter_name)
        unset = [n for n, p in trainable.items() if not torch.isfinite(p).all()]
        unexpected = list(getattr(res, "unexpected_keys", []) or [])
        if unset or unexpected:
            raise ValueError(f"{folder}: the adapter does not match the model's LoRA weights (unset {unset[:2]}, "
                             f"unexpected {unexpected[:2]}); resume with the same adapter / LoRA settings")
    except (ValueError, RuntimeError):      # RuntimeError: a tensor of another shape (LoRA rank)
        with torch.no_grad():
            for n, p in trainable.items():
                p.copy_(before[n])
        raise


# -----------------------------------------------------------------------------
# log.jsonl and curves.png

def append_log(path, row):
    if not dist.is_main():
        return
    with open(path, "a") as f:
        f.write(json.dumps(row) + "\n")


def read_log(path):
    path = Path(path)
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []


def plot_log(rows, path, keys):
    """One small panel per key (a tuple of keys shares a panel) against step, saved as a PNG."""
    if not dist.is_main():
        return
    import matplotlib          # optional heavy dependency: only when a plot is drawn
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    panels = [k if isinstance(k, tuple) else (k,) for k in keys]
    panels = [p for p in panels if any(k in r for r in rows for k in p)]
    if not panels:
        return
    cols = min(4, len(panels))
    nrows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(4 * cols, 2.6 * nrows), squeeze=False)
    for ax, panel in zip(axes.flat, panels):
        for k in panel:
            xs = [r["step"] for r in rows if r.get(k) is not None]
            ys = [r[k] for r in rows if r.get(k) is not None]
            ax.plot(xs, ys, marker="." if len(xs) < 50 else None, label=k)
        ax.set_title(" / ".join(panel), fontsize=9)
        if len(panel) > 1:
            ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


# -----------------------------------------------------------------------------
# result.json and done.json

def write_result(out, config, setup, outcome):
    """OUT/result.json: {"config", "setup", "outcome"}; returns the dict. setup gains "gpu_peak": this
    process's CUDA peaks in GiB (common.gpu_peak: max_memory_reserved / max_memory_allocated and the
    emulated cap) or None when it never used CUDA, so every stage reports its peak memory."""
    setup = {**setup, "gpu_peak": setup.get("gpu_peak", common.gpu_peak())}
    result = {"config": config, "setup": setup, "outcome": outcome}
    if not dist.is_main():
        return result
    Path(out).mkdir(parents=True, exist_ok=True)
    (Path(out) / "result.json").write_text(json.dumps(result, indent=1))
    return result


def write_done(out, script, files=None, **extra):
    """OUT/done.json, written last: {"script", "finished_at", "files": {what: path in OUT}, ...}."""
    done = {"script": script, "finished_at": time.strftime("%Y-%m-%d %H:%M:%S"), "files": files or {}, **extra}
    if not dist.is_main():
        return done
    (Path(out) / "done.json").write_text(json.dumps(done, indent=1))
    return done


CALLS_LOG = "calls.jsonl"   # in a stage folder: one line per call that ran part of the stage and stopped


def log_call(folder, seconds, why):
    """Append an unfinished call's time (why: "deadline" or "subset"), so done.json's seconds count every call that
    worked on the stage, not only the one that finished it (a stage cut at its deadline resumes in a later call)."""
    with open(Path(folder) / CALLS_LOG, "a") as f:     # one short append per call: lanes may share the file
        f.write(json.dumps({"seconds": round(seconds, 1), "why": why, "at": time.strftime("%Y-%m-%d %H:%M:%S")}) + "\n")


def earlier_calls(folder):
    """(seconds, count) of the calls log_call recorded for this stage folder."""
    path = Path(folder) / CALLS_LOG
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []
    return sum(r["seconds"] for r in rows), len(rows)


def read_done(out):
    path = Path(out) / "done.json"
    return json.loads(path.read_text()) if path.is_file() else None


# -----------------------------------------------------------------------------
# One writer per stage folder: OUT/.lock holds the writer's pid, host and process start time

LOCK_NAME = ".lock"
_HELD = {}          # folder -> lock path, released at exit


def _proc_start(pid):
    """The kernel's start time of a process (clock ticks since boot), so a recycled pid is not taken for
    the writer that died; None when it does not exist (or /proc is not there)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def _alive(pid, started):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    now = _proc_start(pid)
    return now is None or started is None or now == started


def lock_run(out):
    """Take OUT/.lock for this process (rank 0 only), or SystemExit with one line when another writer holds
    it: two trainers on one folder interleave their log rows and overwrite each other's checkpoints. A lock
    left by a process that is dead (same host: its pid is gone or now names another process) is taken over;
    one from another host is never guessed about (delete it by hand when that run is gone). Released at exit."""
    out = Path(out)
    if not dist.is_main() or str(out) in _HELD:
        return
    out.mkdir(parents=True, exist_ok=True)
    path, host = out / LOCK_NAME, platform.node()
    me = {"pid": os.getpid(), "host": host, "started": _proc_start(os.getpid()),
          "since": time.strftime("%Y-%m-%d %H:%M:%S")}
    for _ in range(3):
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            try:
                held = json.loads(path.read_text())
                pid, where = int(held["pid"]), str(held["host"])
            except (OSError, ValueError, KeyError, TypeError):
                held, pid, where = {}, None, host        # unreadable (a writer died mid-write): stale
            if pid == os.getpid() and where == host:      # this process already holds it (another spelling)
                _HELD[str(out)] = path
                return
            if where != host:
                raise SystemExit(f"{out} is locked by pid {pid} on host {where} ({path}); one writer per folder: "
                                 "delete the lock if that run is gone")
            if pid is not None and _alive(pid, held.get("started")):
                raise SystemExit(f"{out} is in use by pid {pid} on this host (since {held.get('since', '?')}); "
                                 "one writer per folder: stop it first or use another --out")
            try:
                path.unlink()                             # stale: the writer is dead; take the folder over
            except FileNotFoundError:
                pass
            continue
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(me))
        _HELD[str(out)] = path
        return
    raise SystemExit(f"{out}: could not take {path} (another process keeps taking it)")


def unlock_run(out):
    """Drop OUT/.lock when this process holds it."""
    path = _HELD.pop(str(Path(out)), None)
    try:
        if path is not None and json.loads(path.read_text()).get("pid") == os.getpid():
            path.unlink()
    except (OSError, ValueError):
        pass


@atexit.register
def _unlock_all():
    for out in list(_HELD):
        unlock_run(out)


# -----------------------------------------------------------------------------
# A training run's start and end (rl.py, distill.py)

def start_run(args):
    """OUT folder, its ckpt/ and log.jsonl paths, and the contents of done.json when the run is already
    complete (None otherwise). Takes the folder's lock (lock_run: a second writer is refused). Refuses to
    mix a new run into a folder with checkpoints unless --resume."""
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    lock_run(out)
    ckpt_dir, log_path = out / "ckpt", out / "log.jsonl"
    done = read_done(out)
    if done is not None:
        print(f"{out}/done.json exists: nothing to do")
        unlock_run(out)
        return out, ckpt_dir, log_path, done
    if latest_checkpoint(ckpt_dir) and not args.resume:
        raise SystemExit(f"{ckpt_dir} has checkpoints: pass --resume to continue, or use a new --out")
    return out, ckpt_dir, log_path, None


def handoff_note(meta, ckpt, log_path):
    """For a resume from a handoff (load_checkpoint's meta): its row in the run's handoffs.jsonl, and the words
    that say so; "" for a full checkpoint."""
    if meta["optimizer_restored"]:
        return ""
    append_log(Path(log_path).with_name("handoffs.jsonl"),
               {"step": meta["step"], "checkpoint": Path(ckpt).name, "at": time.strftime("%Y-%m-%d %H:%M:%S")})
    return "; a handoff: bf16 adapter, fresh optimizer moments"


def resume_state(args, ckpt_dir, log_path, model, optimizer, cursor, adapter_name="default"):
    """(step, cursor, log, resumed_step) after --resume from the newest checkpoint (or a fresh start);
    log.jsonl is rewritten to the checkpoint's steps, dropping any logged after it."""
    step, log, resumed_step = 0, [], None
    ckpt = latest_checkpoint(ckpt_dir) if args.resume else None
    if ckpt:
        meta = load_checkpoint(ckpt, model, optimizer, adapter_name=adapter_name)
        step, cursor, log = meta["step"], meta["cursor"], meta["log"]
        resumed_step = step
        print(f"resumed from {ckpt} (step {step}, data cursor {cursor}{handoff_note(meta, ckpt, log_path)})")
    if dist.is_main():
        Path(log_path).write_text("".join(json.dumps(r) + "\n" for r in log))
    return step, cursor, log, resumed_step


def save_and_plot(args, step, resumed_step, ckpt_dir, model, optimizer, meta, png, keys, force=False,
                  adapter_name="default"):
    """Top of a training step: every --save-every steps, at the end and when `force`d (a deadline stop),
    checkpoint the state after `step` updates (not again right after resuming from it); every --plot-every
    steps and at the end, redraw."""
    last = step == args.steps
    if step > 0 and (last or force or step % args.save_every == 0) and step != resumed_step:
        save_checkpoint(ckpt_dir, step, model, optimizer, meta, args.keep_last, adapter_name=adapter_name)
    if meta["log"] and args.plot_every > 0 and (last or step % args.plot_every == 0):
        plot_log(meta["log"], png, keys=keys)


def finish_run(out, script, model, result, adapter_name="default"):
    """The final adapter (bf16 peft folder), result.json (config / setup / outcome), then done.json."""
    if dist.is_main():
        common.save_adapter(model, str(Path(out) / "adapter"), adapter_name=adapter_name)
    result["setup"]["gpu_peak_mib"] = common.gpu_peak_mib()
    result["setup"]["processes"] = dist.world()
    write_result(out, result["config"], result["setup"], result["outcome"])
    done = write_done(out, script, {"adapter": "adapter", "result": "result.json", "log": "log.jsonl"})
    unlock_run(out)
    return done


# -----------------------------------------------------------------------------
# The command-line boundary

BAD_INPUT = (ValueError, FileNotFoundError, IsADirectoryError, NotADirectoryError)

def shared_folders(outs):
    """Whether two of the --out folders of a joint run (rl.py's experts, distill.py's students, evaluate.py's
    models) are one folder, by their real paths: each run needs its own."""
    return len({os.path.realpath(o) for o in outs}) != len(outs)


# An option's range as (test, what it must be), for check_options and profiles.py's --set checks.
# NaN fails every test, so `--lr nan` is refused like `--lr -1`.
def at_least(n):
    return (lambda v: v >= n, f"at least {n}")


def above(n):
    return (lambda v: v > n, f"above {n}")


def within(lo, hi):
    return (lambda v: lo <= v <= hi, f"within {lo}..{hi}")


def one_of(*choices):
    return (lambda v: v in choices, "one of " + ", ".join(map(str, choices)))


def check_options(prog, args, ranges):
    """Refuse, in one line and before any work, the first option outside its range. ranges: argparse dest ->
    (test, what), e.g. {"steps": at_least(1)}; an option left at None (its default is derived later) passes."""
    for dest, (ok, what) in ranges.items():
        v = getattr(args, dest, None)
        if v is not None and not ok(v):
            raise SystemExit(f"{prog}: --{dest.replace('_', '-')} must be {what}, got {v!r}")


def cli(prog, main, argv=None):
    """Run a script's main(argv) and return its exit code; bad input (a malformed or missing file: the
    project's readers raise ValueError naming the file and line) ends in one line on stderr and exit 1."""
    try:
        code = main(argv)
    except BAD_INPUT as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 1
    return code if isinstance(code, int) else 0
