"""bench/check_readme.py: every figure the README cites equals its results file; and the README's published
run is the `small2` profile.

Run: python -m pytest -q tests/test_check_readme.py
"""
import importlib.util
import json
from pathlib import Path

import profiles

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("check_readme", ROOT / "bench" / "check_readme.py")
check_readme = importlib.util.module_from_spec(spec)
spec.loader.exec_module(check_readme)


def test_the_readme_agrees_with_its_results_files(capsys):
    assert check_readme.main() == 0, capsys.readouterr().out


def test_a_changed_figure_is_a_problem():
    text = check_readme.README.read_text()
    assert "| sft2 | 91.5 [81.5, 99.0] |" in text
    problems, _ = check_readme.check(text.replace("| sft2 | 91.5 [81.5, 99.0] |", "| sft2 | 92.5 [81.5, 99.0] |"))
    assert any("eval/sft2/metrics.json" in p for p in problems)
    problems, _ = check_readme.check(text + "\nSee results/no_such_record.md.\n")
    assert problems == ["README cites results/no_such_record.md, which does not exist"]


def test_a_figure_may_wrap_across_lines():
    text = check_readme.README.read_text().replace("about 4.5 H200 hours", "about 4.5\nH200 hours")
    assert check_readme.check(text)[0] == []


def test_an_optional_record_is_skipped_while_missing_and_checked_once_written(tmp_path, monkeypatch):
    fig = check_readme.Figure("results/suite.json", check_readme.suite, "{} tests, {} s on {} cores", optional=True)
    monkeypatch.setattr(check_readme, "FIGURES", [fig])
    problems, notes = check_readme.check("make test", root=tmp_path)
    assert problems == [] and notes == ["results/suite.json: missing, skipped"]
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "suite.json").write_text(json.dumps({"tests": 450, "seconds": 481.2, "cores": 2, "commit": "x"}))
    assert check_readme.check("make test (450 tests, 481 s on 2 cores)", root=tmp_path) == ([], [])
    problems, _ = check_readme.check("make test (446 tests, 481 s on 2 cores)", root=tmp_path)
    assert problems == ["results/suite.json: the README should say '450 tests, 481 s on 2 cores'"]


def test_small2_is_the_published_runs_settings():
    """The profile resolves to the config the run recorded, apart from two machine-local paths."""
    recorded = json.loads((ROOT / "results" / "small2" / "report" / "report.json").read_text())["config"]
    profile = profiles.PROFILES["small2"]
    local = {"model", "eval_tasks"}     # the staged GGUF's path (the embedded model) and a copy of the dev set
    local |= {"eval_baselines"}         # newer than the run: baselines evaluated beside the models, no model changes
    local |= {"rl_easy_share", "rl_reward"}   # newer: the mix is read only with skill_train_tasks > 0 (off here),
                                              # and rl_reward "task" is the reward the run used
    local |= {"rl_temperature", "train_val_source"}   # newer: 1.0 and the tuning tasks, what the run used
    assert recorded["eval_tasks"] == "runs/dev_tasks.jsonl"     # where data/dev_set.py writes by default
    differ = {k for k in recorded.keys() | profile.keys() if recorded.get(k) != profile.get(k)}
    off = {k for k in profile if k not in recorded and profile[k] in (None, 0, "")}   # newer keys, switched off
    assert differ <= local | off, differ
    assert (profile["rl_temperature"], profile["train_val_source"]) == (1.0, "tune")
    assert "--profile small2" in check_readme.README.read_text()
