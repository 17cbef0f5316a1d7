"""demo.py (`make demo`) end to end on one shipped task: the tiny random model as the base and the random
baseline, through the same steps (eval, compare, report) as the full demo; plus the shipped task file and the
merge commands the demo runs on the published experts.

Run: python -m pytest -q tests/test_demo.py      (~15 s on 2 cores)
"""
import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

import demo
import sim

ROOT = Path(__file__).resolve().parents[1]


def test_demo_tasks_ship_with_licence_and_gpu_results():
    """Every shipped task is a real design with its licence and source, and the GPU evaluation has it, so
    each demo number has a GPU number to stand beside."""
    tasks = sim.load_tasks(ROOT / "data/demo_tasks.jsonl")
    assert 5 <= len(tasks) <= 12
    gpu = json.loads((demo.GPU_EVAL / "rl2" / "metrics.json").read_text())
    for t in tasks:
        assert t["license"] == "MIT" and t["source"]["commit"], t["id"]
        assert t["id"] in gpu["direct"]["per_task"] and t["id"] in gpu["agentic"]["per_task"], t["id"]
    assert (ROOT / "data/demo_tasks.LICENSE").is_file()


def test_merge_commands_are_the_published_ones(tmp_path):
    """The demo merges as results/small2_run.md did: delta space, rank 576 (soup exact), density 0.5, seed 42,
    and the mean forms at lambda 1 rescaled to 0.5."""
    args = argparse.Namespace(adapters=ROOT / "results/small2/adapters")
    cmds = demo.merge_cmds(args, tmp_path, demo.MODELS)
    assert list(cmds) == ["soup", "ties", "dare_ties", "dare_ties_mean", "della"]
    soup, ties = str(cmds["soup"][0]), str(cmds["ties"][0])
    assert "--rank" not in soup and "--rank 576" in ties and "--density 0.5 --seed 42" in ties
    assert "--dare-norm mean" in str(cmds["dare_ties_mean"][0])
    assert [str(c).split()[2] for c in cmds["della"]] == ["--method", "--rescale"]
    # paths print relative to the repo when beside it (a clone in /tmp with pytest's tmp_path there too)
    assert cmds["della"][1].argv[-4:] == ["--lam", "0.5", "--out", demo.rel(tmp_path / "merge" / "della")]


@pytest.mark.needs_iverilog
def test_demo_one_task_tiny_model_and_random(tmp_path):
    out = tmp_path / "demo"
    argv = [sys.executable, "demo.py", "--model", "tiny", "--models", "base,random", "--limit", "1",
            "--max-new-tokens", "16", "--out", str(out)]
    run = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "$ python evaluate.py eval --tasks data/demo_tasks.jsonl" in run.stdout + run.stderr   # commands printed
    result = json.loads((out / "report" / "demo.json").read_text())
    assert result["wall_s"] > 0 and result["tasks"] == 1
    assert set(result["models"]) == {"base", "random"}
    assert result["models"]["random"]["pass@1"] == 100.0        # the first task: random stimulus passes it
    assert result["models"]["base"]["gpu"] is None              # the tiny model has no GPU counterpart
    report = (out / "report" / "report.md").read_text()
    assert "small-sample demonstration" in report and "constrained random stimulus" in report
    assert (out / "report" / "all_heatmap.png").is_file()
    # resumable: a second run skips both evaluations and only rewrites the report
    again = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and again.stdout.count("(done: ") == 2, again.stdout[-2000:]


def test_missing_published_adapters_stop_with_one_line(tmp_path, capsys):
    """A sparse clone without results/small2/adapters: the demo names the missing adapters and how to fetch them
    before it starts anything; the baselines alone need none."""
    with pytest.raises(SystemExit):
        demo.main(["--adapters", str(tmp_path), "--models", "soup,opd", "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "no published adapter rl0, rl1, rl2, opd under" in err and "git sparse-checkout disable" in err
    assert not (tmp_path / "out").exists()
