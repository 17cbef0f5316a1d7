"""Print the files of a chorus_mini run folder that a later device session needs (small2_run.sh PART=ship).

    cd RUNS && python ship_list.py s2st | tar czf - -T -

Per stage folder (every folder of RUN but data/, which the CPU box builds):
- its small files: *.json, *.jsonl and *.png, outside checkpoints (ckpt/, val_ckpt/) and adapters;
- a finished stage (done.json): the adapter it hands on: the validated step that result.json's val_best_adapter
  names (sft_pick=best), else adapter/ (merged adapters excepted: merge.py recomputes them from the experts);
- an unfinished stage: its newest checkpoint as a handoff, adapter/ + meta.json without optimizer.pt (rundir.py
  resumes rl.py / distill.py from it with fresh optimizer moments).
Never: stdout logs, optimizer states, OUT/best/adapter (its best/val.json is kept), the data stage.
"""
import json
import sys
from pathlib import Path

SMALL = (".json", ".jsonl", ".png")


def files_of(folder):
    return sorted(p for p in Path(folder).rglob("*") if p.is_file())


def stage_files(stage):
    stage = Path(stage)
    parts = lambda p: p.relative_to(stage).parts
    out = [p for p in files_of(stage) if p.suffix in SMALL and not p.name.startswith("adapter_")
           and not {"ckpt", "val_ckpt", "adapter"} & set(parts(p))]
    if (stage / "done.json").is_file():
        if stage.name != "merge":
            result = json.loads((stage / "result.json").read_text()) if (stage / "result.json").is_file() else {}
            pick = (result.get("outcome") or {}).get("val_best_adapter") or "adapter"
            if not (stage / pick / "adapter_model.safetensors").is_file():
                sys.exit(f"ship_list: {stage} is done but {stage / pick} holds no adapter")
            out += files_of(stage / pick)
    else:
        ckpts = sorted(p for p in (stage / "ckpt").glob("step_*") if (p / "meta.json").is_file())
        if ckpts:
            out += [ckpts[-1] / "meta.json", *files_of(ckpts[-1] / "adapter")]
    return out


def ship_list(run):
    run = Path(run)
    seen, out = set(), []
    for stage in sorted(p for p in run.iterdir() if p.is_dir() and p.name != "data"):
        for p in stage_files(stage):
            if p not in seen and "best/adapter" not in p.as_posix():
                seen.add(p)
                out.append(p)
    return out


if __name__ == "__main__":
    if len(sys.argv) != 2 or not Path(sys.argv[1]).is_dir():
        sys.exit("usage: python ship_list.py RUN_FOLDER (relative to the folder the tar runs in)")
    for p in ship_list(sys.argv[1]):
        print(p.as_posix())
