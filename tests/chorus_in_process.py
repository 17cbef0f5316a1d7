"""`python tests/chorus_in_process.py chorus_mini.py ARGS...` does what `python chorus_mini.py ARGS...` does, with
each stage command run in this interpreter (helpers.run_in_process) instead of a subprocess of its own.

test_pipeline's lanes test gives bench/gpu/run_small.sh a PYTHON that runs this: each step of a lane then pays
one interpreter start-up (torch and transformers: seconds on 2 cores) instead of two or more. The subprocess
path of chorus_mini.execute is tested on its own (test_execute_tees_output_and_reports_failure).
tests/zygote.py forks `run` from one process that imported the kit once.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))     # the kit's root (tests/ is this script's folder)

import chorus_mini as cm  # noqa: E402
import rundir  # noqa: E402
from helpers import run_in_process  # noqa: E402


def run(argv):
    """Run `chorus_mini.py ARGS...` (argv) here, its stage commands in this interpreter; the exit code."""
    if argv[:1] != ["chorus_mini.py"]:
        raise SystemExit("usage: python tests/chorus_in_process.py chorus_mini.py ARGS...")
    sys.argv = list(argv)
    cm.execute = run_in_process
    return rundir.cli("chorus_mini.py", cm.main, argv[1:])


if __name__ == "__main__":
    raise SystemExit(run(sys.argv[1:]))
