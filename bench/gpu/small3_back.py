"""Bring one job of bench/gpu/small3_call.sh home: its back.tgz.partNN files into the kept state.

    python bench/gpu/small3_back.py FOLDER_WITH_PARTS [--state results/small3/state] [--stage STAGE]

The job packs the stage folders named by TAR_PATHS (relative to its run folder $STAGE/s3) and cuts the tar into
15 MB parts. This joins the parts in name order, checks the tar, and for each folder it holds (`rl0`, `r/rl0`, ...):
 - paths written on the GPU machine are rewritten to the kept state's forms: `STAGE/s3/` -> `runs/s3/` and
   `STAGE/smollm2.gguf` -> `~/stage/smollm2.gguf` (in .json and .jsonl files), so the state reads the same
   whichever machine ran a job (STAGE: the job's $STAGE, read off the first absolute path to `.../s3/` or
   `.../smollm2.gguf` in the folders' JSON unless --stage names it);
 - the stage's stdout.log (the job printed its tail) and a left-over .lock (rundir's writer lock) are dropped;
 - only the newest checkpoint under each `ckpt/` stays (the handoff the next job resumes from);
 - a `best/` that came back with its val.json but no adapter (a job may carry a stage's best/ without its adapter:
   resuming reads only val.json) keeps the state's own best adapter, when the state's best/val.json names the same
   step; a different step is an error and nothing is changed;
 - the folder then replaces the state's folder of that name.
Nothing in the state changes until every check has passed. Prints what it replaced.
"""
import argparse
import io
import json
import re
import shutil
import sys
import tarfile
import tempfile
from pathlib import Path


DROP = {"stdout.log", ".lock"}


def fail(msg):
    raise SystemExit(f"small3_back: {msg}")


def read_parts(folder):
    parts = sorted(Path(folder).rglob("back.tgz.part*"))
    if not parts:
        fail(f"no back.tgz.part* under {folder}")
    return b"".join(p.read_bytes() for p in parts), len(parts)


def stage_folders(root):
    """The folders of the tar's top: `rl0`, ... and `r/rl0` (a folder of the stage's `r/` run)."""
    out = []
    for top in sorted(p for p in root.iterdir() if p.is_dir()):
        out += sorted(p for p in top.iterdir() if p.is_dir()) if top.name == "r" else [top]
    return out


def tidy(folder, stage):
    for p in list(folder.rglob("*")):
        if p.is_file() and p.name in DROP:
            p.unlink()
        elif stage and p.is_file() and p.suffix in (".json", ".jsonl"):
            text = p.read_text()
            new = text.replace(f"{stage}/s3/", "runs/s3/").replace(f"{stage}/smollm2.gguf", "~/stage/smollm2.gguf")
            if new != text:
                p.write_text(new)
    for ckpt in folder.rglob("ckpt"):
        steps = sorted(d for d in ckpt.iterdir() if d.is_dir() and d.name.startswith("step_"))
        for d in steps[:-1]:
            shutil.rmtree(d)


def find_stage(root):
    """The job's $STAGE: the folder of the first absolute path into its run folder (STAGE/s3/...) or to its model
    file (STAGE/smollm2.gguf) in the JSON files (the run's own paths are mostly relative: runs/s3/...)."""
    for p in sorted(root.rglob("*.json*")):
        m = re.search(r'"(/[^"]*?)/(?:s3/|smollm2\.gguf")', p.read_text())
        if m:
            return m.group(1)
    return None


def best_step(folder):
    try:
        return json.loads((folder / "best" / "val.json").read_text()).get("step")
    except (OSError, ValueError):
        return None


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("folder", help="where the job's back.tgz.partNN files are (searched recursively)")
    p.add_argument("--state", default="results/small3/state", help="the kept state the folders replace")
    p.add_argument("--stage", default=None, help="$STAGE on the GPU machine (its paths are rewritten); default: "
                                                   "read off the packed JSON files")
    a = p.parse_args(argv)
    data, n = read_parts(a.folder)
    state = Path(a.state)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        try:
            with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
                tar.extractall(root, filter="data")
        except (tarfile.TarError, EOFError, OSError) as e:
            fail(f"{n} part(s) under {a.folder} do not make a whole tar ({e}): is a part missing?")
        plan, stage = [], (a.stage or find_stage(root) or "").rstrip("/")
        for f in stage_folders(root):
            rel = f.relative_to(root)
            home = state / rel
            tidy(f, stage)
            keep = None
            came = f / "best" / "adapter"   # a folder the job's carry emptied counts as none
            if (f / "best" / "val.json").is_file() and not (came.is_dir() and any(came.iterdir())):
                if best_step(f) != best_step(home) or not (home / "best" / "adapter").is_dir():
                    fail(f"{rel}: best/ came back without its adapter at step {best_step(f)}, and the state's best/ "
                         f"is step {best_step(home)}: nothing changed")
                keep = home / "best" / "adapter"
            plan.append((f, home, keep, rel))
        for f, home, keep, rel in plan:
            if keep is not None:
                shutil.rmtree(f / "best" / "adapter", ignore_errors=True)
                shutil.copytree(keep, f / "best" / "adapter")
            if home.exists():
                shutil.rmtree(home)
            home.parent.mkdir(parents=True, exist_ok=True)
            shutil.copytree(f, home)
            steps = sorted(d.name for d in (home / "ckpt").iterdir()) if (home / "ckpt").is_dir() else []
            print(f"{rel}: replaced ({', '.join(steps) or 'no checkpoint'}"
                  f"{'; best adapter kept from the state' if keep is not None else ''})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
