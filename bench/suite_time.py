"""Time the test suite as CI runs it and record it in results/suite.json (README's `make test` line cites it).

    python bench/suite_time.py [--out results/suite.json] [-- extra pytest args]

Runs `python -m pytest -q -n 2 tests` (as `make test` does) once from the repository root, reads pytest's closing line (N passed, ...) and
writes {"tests", "passed", "failed", "skipped", "seconds", "cores", "commit", "python", "date"}. Run it on a quiet
machine (a fresh clone after `make install`): other work on the cores inflates the figure.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def counts(text):
    """pytest's closing line -> {"passed": N, "failed": N, "skipped": N, ...} (missing kinds are 0)."""
    found = dict.fromkeys(("passed", "failed", "skipped", "errors"), 0)
    last = [line for line in text.splitlines() if re.search(r"\d+ (passed|failed)", line)]
    for n, kind in re.findall(r"(\d+) (passed|failed|skipped|errors?)", last[-1] if last else ""):
        found["errors" if kind.startswith("error") else kind] = int(n)
    return found


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=str(ROOT / "results" / "suite.json"))
    p.add_argument("pytest_args", nargs="*", help="after --: passed to pytest")
    a = p.parse_args(argv)
    t0 = time.time()
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "2", "-p", "no:cacheprovider", "tests",
                          *a.pytest_args],
                         cwd=ROOT, capture_output=True, text=True)
    seconds = time.time() - t0
    c = counts(run.stdout)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    rec = {"tests": c["passed"] + c["failed"] + c["skipped"], **c, "seconds": round(seconds, 1),
           "cores": os.cpu_count(), "commit": commit, "python": sys.version.split()[0],
           "date": time.strftime("%Y-%m-%d"), "command": "python bench/suite_time.py (pytest -q -n 2 tests)"}
    print(run.stdout[-600:])
    print(json.dumps(rec))
    if run.returncode != 0:
        print("suite_time: the suite did not pass; nothing written", file=sys.stderr)
        return run.returncode
    Path(a.out).write_text(json.dumps(rec, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
