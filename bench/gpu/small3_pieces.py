"""Which pieces of results/ travel with one call of a small3 job, and the rest hidden until the call has run.

A GPU call carries the checkout (64 MiB at most), and results/ alone is larger than that; small3_call.sh restores the
run folder from whatever part of results/small3/state/ (and the SFT adapters) a call carries, so each call carries
one piece of it beside one part of the offline bundle (.carry/cN). This script hides every tracked file of results/
except the named paths (restored from HEAD), and puts results/ back afterwards:

    python bench/gpu/small3_pieces.py hide --call 1        # an experts job's first call (then 2, then 3, the job)
    python bench/gpu/small3_pieces.py hide --call 4        # a further job on that machine: no piece of results/
    python bench/gpu/small3_pieces.py hide PATH [PATH ...]  # any other pieces
    python bench/gpu/small3_pieces.py restore               # results/ as in HEAD

hide prints the carry list the call needs and the checkout's size without .git, .carry and runs/. It refuses,
changing nothing, while results/ holds changes that are not a hide's deletions (an uncommitted edit or new file
there would be lost): commit them first. An expert's best/adapter is not carried (its val.json is enough to resume;
small3_back.py keeps the state's adapter when the job's best/ comes back without one).
"""
import argparse
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
S = "results/small3/state"
A = "results/small3/adapters"
# the experts job (rl0-rl2 jointly): the pieces of each call and what it carries beside them
CALLS = {
    1: ([f"{S}/{p}" for p in ("data.tgz", "data2", "eval", "eval_skill", "eval_syn", "refine", "sft0", "sft1", "sft2",
                             "sweep")], [".carry/c0"]),
    2: ([f"{S}/rl0", f"{S}/rl1"], [".carry/c1"]),
    3: ([f"{S}/rl2", f"{A}/sft0", f"{A}/sft1", f"{A}/sft2"], [".carry/c2", "runs/dev_tasks.jsonl"]),
    4: ([], ["runs/dev_tasks.jsonl"]),   # a further job on the same machine: its run folder is newer than the state
}
CAP = 64 * 2 ** 20


def git(root, *args):
    return subprocess.run(["git", *args], cwd=root, check=True, capture_output=True, text=True).stdout


def changes(root):
    """results/'s uncommitted changes other than deleted tracked files (what hiding or restoring would lose)."""
    lines = git(root, "status", "--porcelain", "--untracked-files=all", "--", "results").splitlines()
    return [ln for ln in lines if ln[:2] != " D"]


def tree_bytes(root):
    skip = {".git", ".carry", "runs"}
    total = 0
    for d, dirs, files in os.walk(root):
        if Path(d) == root:
            dirs[:] = [x for x in dirs if x not in skip]
        total += sum(os.path.getsize(os.path.join(d, f)) for f in files if not os.path.islink(os.path.join(d, f)))
    return total


def hide(root, paths):
    missing = [p for p in paths if not git(root, "ls-files", "--", p).strip()]
    if missing:
        raise SystemExit(f"small3_pieces: not tracked in HEAD's results/: {' '.join(missing)}")
    for f in git(root, "ls-files", "-z", "--", "results").split("\0"):
        if f and (root / f).exists():
            (root / f).unlink()
    if paths:
        git(root, "checkout", "HEAD", "--", *paths)
    for adapter in sorted((root / S).glob("rl*/best/adapter")):        # resuming reads best/val.json only
        for f in adapter.iterdir():
            f.unlink()
    for d in sorted((root / "results").rglob("*"), key=lambda p: -len(p.parts)):
        if d.is_dir() and not any(d.iterdir()):
            d.rmdir()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("action", choices=["hide", "restore"])
    ap.add_argument("paths", nargs="*", help="hide: the paths of results/ that stay (from HEAD)")
    ap.add_argument("--call", type=int, choices=sorted(CALLS), help="hide: the pieces of this call of an experts job")
    ap.add_argument("--root", default=str(ROOT), help=argparse.SUPPRESS)      # tests: another checkout
    args = ap.parse_args(argv)
    root = Path(args.root)
    left = changes(root)
    if left:
        print(f"small3_pieces: results/ has uncommitted changes ({left[0].strip()}"
              f"{f' and {len(left) - 1} more' if len(left) > 1 else ''}); commit them first", file=sys.stderr)
        return 2
    if args.action == "restore":
        git(root, "checkout", "HEAD", "--", "results")
        print("results/ restored from HEAD")
        return 0
    if bool(args.paths) == bool(args.call):
        ap.error("hide takes PATHs or --call N")
    paths, carry = CALLS[args.call] if args.call else (args.paths, [])
    hide(root, paths)
    size = tree_bytes(root) + sum(tree_bytes(root / c) if (root / c).is_dir() else os.path.getsize(root / c)
                                  for c in carry if (root / c).exists())
    print(f"results/ holds {' '.join(paths) or 'nothing'}; checkout + carry {size / 2 ** 20:.1f} MiB"
          + (f" (over the {CAP // 2 ** 20} MiB a call carries)" if size > CAP else ""))
    if carry:
        print("carry: " + " ".join(carry))
    return 0


if __name__ == "__main__":
    sys.exit(main())
