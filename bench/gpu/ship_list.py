"""Print the files of a chorus_mini run folder that a later device session needs (small2_run.sh PART=ship).

    cd RUNS && python ship_list.py s2st [--since STAMP] | tar czf - -T -

A stage folder is every folder of RUN but data/ (the CPU box builds it). data2/ (built on the device, 323 s on an
H200 in session 15, from sft1's rollouts, so the CPU box cannot rebuild it) is shipped when done, its stage2.jsonl
(what sft2 reads; its stages 0-1 are data/'s rows) and small files: a cut sft2 resumes only on the same rows.
unship.sh keeps it in the CPU box's ignored runs/s2st/data2, never in results/: its rows quote the third-party
corpus's RTL, which stays out of the repository. With --since, only the
stages with a file newer than STAMP (what this session ran; the restored ones keep their archive times) are
listed: unship.sh replaces those stage folders and keeps the others. Per stage:
- training stages (sft*, rl*, opd*): when done (done.json), their small files (*.json, *.jsonl, *.png outside
  checkpoints and adapter folders) and the adapter they hand on: the validated step that result.json's
  val_best_adapter names (sft_pick=best), else adapter/; RL's and OPD's best/adapter is not kept (nothing reads
  it; best/val.json is). rl* / opd* not done: their small files and the newest checkpoint as a handoff, adapter/ +
  meta.json without optimizer.pt (rundir.py resumes them with fresh optimizer moments). sft* not done: the same
  handoff and the validated adapter its result.json names as the best so far, if that result was written at the
  checkpoint's step (a deadline stop), else every validated adapter up to that step (a kill leaves an older
  result): sft2 (567 steps, ~10 min alone) did not fit the calls of session 15, whose machine went cold with 362
  steps done and nothing shipped.
- merge: its candidates' tuning evaluations (tune/*/tune_eval/, small files) only. The merges themselves (rank 576 in
  the small profile, ~335 MiB each; the soup rank 48) are recomputed from the experts when the next session runs
  `--only merge`: merge.py is seeded, the evaluated candidates are not evaluated again, and pick-merge picks again
  from the same scores.
- evaluation stages (val, eval, eval_syn): one folder per model, each finished on its own (its done.json; eval and
  eval_syn also take `eval_models` subsets, several side by side; any of them may be cut with the session): the
  finished models' small files, and the stage's own when done; chorus_mini.py skips a finished model, so a later
  session evaluates only the rest (a merged model after `merge` again: merges are recomputed, not shipped). Not
  samples.jsonl (several MB a model at n = 5 with 3 rounds; claims and compare read metrics.json's per-task table):
  small2_run.sh PART=ship_samples packs those for the CPU box.
- other stages (compare, report): their small files when done (the report also its report.md; session 21 rendered
  it again on the CPU box from the shipped JSON), nothing otherwise.
Never: stdout logs, optimizer states, data/, a data stage not done, a deadline-stop marker (rundir.DEADLINE_MARKER).
"""
import argparse
import json
import sys
from pathlib import Path

SMALL = (".json", ".jsonl", ".png")
TRAINING = ("sft", "rl", "opd")
EVALS = ("val", "eval", "eval_syn")


def files_of(folder):
    return sorted(p for p in Path(folder).rglob("*") if p.is_file())


def small_files(stage):
    parts = lambda p: set(p.relative_to(stage).parts)
    return [p for p in files_of(stage) if p.suffix in SMALL and not p.name.startswith("adapter_")
            and p.name != "deadline_stop.json" and not {"ckpt", "val_ckpt", "adapter"} & parts(p)]


def stage_files(stage):
    stage = Path(stage)
    done = (stage / "done.json").is_file()
    if stage.name.startswith("data"):     # data2: its rows (stage2.jsonl; stages 0-1 are data/'s) and small files
        keep = lambda p: p.name == "stage2.jsonl" or (p.suffix == ".json" and p.parent == stage)
        return [p for p in files_of(stage) if keep(p)] if done and stage.name != "data" else []
    if stage.name == "merge":
        return [p for p in small_files(stage) if "tune_eval" in p.relative_to(stage).parts]
    if stage.name in EVALS:
        finished = {d for d in stage.iterdir() if (d / "done.json").is_file()}
        return [p for p in small_files(stage) if p.name != "samples.jsonl" and (done or finished & set(p.parents))]
    if not stage.name.startswith(TRAINING):
        return small_files(stage) + [p for p in files_of(stage) if p.suffix == ".md"] if done else []
    if done:
        result = json.loads((stage / "result.json").read_text()) if (stage / "result.json").is_file() else {}
        pick = (result.get("outcome") or {}).get("val_best_adapter") or "adapter"
        if not (stage / pick / "adapter_model.safetensors").is_file():
            sys.exit(f"ship_list: {stage} is done but {stage / pick} holds no adapter")
        return small_files(stage) + files_of(stage / pick)
    ckpts = sorted(p for p in (stage / "ckpt").glob("step_*") if (p / "meta.json").is_file())
    handoff = [ckpts[-1] / "meta.json", *files_of(ckpts[-1] / "adapter")] if ckpts else []
    if stage.name.startswith("sft") and ckpts:
        # result.json's best so far, when it was written at the newest checkpoint (a deadline stop); a kill leaves
        # an older one, so then every validated adapter up to the checkpoint (a later stage may pick any of them)
        result = json.loads((stage / "result.json").read_text()) if (stage / "result.json").is_file() else {}
        outcome, step = result.get("outcome") or {}, json.loads(handoff[0].read_text())["step"]
        pick = outcome.get("val_best_adapter") if outcome.get("steps_done") == step else None
        picks = [stage / pick] if pick and (stage / pick).is_dir() else [
            f for f in sorted(stage.glob("val_ckpt/step_*/adapter")) if int(f.parent.name[5:]) <= step]
        handoff += [p for folder in picks for p in files_of(folder)]
    return small_files(stage) + handoff


def ship_list(run, since=None):
    run = Path(run)
    stamp = Path(since).stat().st_mtime if since else None
    out = []
    for stage in sorted(p for p in run.iterdir() if p.is_dir() and p.name != "data"):
        if stamp is not None and not any(p.stat().st_mtime > stamp for p in files_of(stage)):
            continue                           # restored from the bundle and not run since
        out += [p for p in dict.fromkeys(stage_files(stage)) if "best/adapter" not in p.as_posix()]
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run", help="the run folder, relative to the folder the tar runs in")
    ap.add_argument("--since", default=None, help="list only stages with a file newer than this file")
    a = ap.parse_args()
    if not Path(a.run).is_dir():
        sys.exit(f"ship_list: {a.run} is not a folder")
    files = ship_list(a.run, a.since)
    if not files:
        sys.exit("ship_list: nothing to ship (no stage finished or left a checkpoint since the restore; "
                 "data/ is never shipped)")
    for p in files:
        print(p.as_posix())
