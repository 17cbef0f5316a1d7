"""bench/skill_table.py (the skill bench's rows) and bench/score_answers.py's --floor (a dev split's floor records).

Run: python -m pytest -q tests/test_skill_table.py
"""
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import score_answers  # noqa: E402
import skill_table  # noqa: E402

import score  # noqa: E402
from data import floor  # noqa: E402
from test_baselines import LOCK, make_task  # noqa: E402


def eval_folder(tmp_path, name, per_task, rounds=3):
    """An evaluate.py eval folder with agentic metrics over per_task {id: pass_rate}."""
    m = {"tasks": len(per_task), "pass@1": 100.0 * sum(per_task.values()) / len(per_task), "pass@1_ci95": [0, 100],
         "cov@1": 50.0, "cov_gain": 3.0, "beats_random": 40.0, "syn_pass": 100.0,
         "skill": {"tasks": len(per_task), "pass@1": 100.0 * sum(per_task.values()) / len(per_task)},
         "per_task": {tid: {"pass_rate": 100.0 * p, "cov_mean": 50.0} for tid, p in per_task.items()}}
    folder = tmp_path / name
    folder.mkdir()
    (folder / "metrics.json").write_text(json.dumps({"n": 1, "rounds": rounds, "direct": {**m, "pass@1": 0.0},
                                                     "agentic": m}))
    return folder


def test_pass_at_1_is_split_into_real_designs_and_each_synthetic_family(tmp_path):
    per_task = {"cvdp_a": 1.0, "tinytapeout/x#y": 0.0, "skill_code_lock_0": 0.0, "skill_code_lock_5": 1.0,
                "skill_handshake_2": 0.0}
    obj = skill_table.from_eval(eval_folder(tmp_path, "teacher_long", per_task))
    assert obj["mode"] == "agentic" and obj["rounds"] == 3          # a refining eval reports its agentic metrics
    src = obj["by_source"]
    assert src["real"] == {"tasks": 2, "pass@1": 50.0}
    assert src["synthetic"] == {"tasks": 3, "pass@1": pytest.approx(100 / 3)}
    assert src["skill_code_lock"] == {"tasks": 2, "pass@1": 50.0}
    assert src["skill_handshake"]["pass@1"] == 0.0


def test_rows_count_tasks_from_their_failures_and_the_table_shows_both_sources(tmp_path):
    rows = {"rl1": {"n": 5, "pass@1": 20.0, "cov@1": 60.0, "syn_pass": 100.0,
                    "failures": {"parse": 0, "ok": 15, "compile": 0},
                    "per_task": {"a": {"pass_rate": 60.0, "cov_mean": 90.0}, "skill_lock_1": {"pass_rate": 0.0,
                                                                                             "cov_mean": 40.0},
                                 "skill_lock_2": {"pass_rate": 0.0, "cov_mean": 40.0}}}}
    path = tmp_path / "rows.json"
    path.write_text(json.dumps(rows))
    obj = skill_table.from_rows(path)["rl1"]
    assert obj["tasks"] == 3 and obj["n"] == 5 and obj["mode"] == "direct"
    line = skill_table.table({"rl1": {"skill": obj}}, "skill").splitlines()[-1]
    assert line.startswith("| rl1 | 3 x 5 | 20.0 ") and line.endswith("| 60.0 | 0.0 |")


def test_json_keeps_the_earlier_split_rows_once_when_the_split_changes(tmp_path):
    doc = tmp_path / "skill_bench.json"
    doc.write_text(json.dumps({"skill_split": {"tasks": 154}, "skill_split_ids": ["old"],
                               "models": {"rl1": {"skill": {"pass@1": 2.3}}}}))
    split = tmp_path / "skill_split.json"
    split.write_text(json.dumps({"tasks": 3, "real": 1, "reasons": {"a": "kept", "b": "random_passes", "c": "kept"},
                                 "argv": ["x"]}))
    folder = eval_folder(tmp_path, "random_1000", {"a": 0.0, "c": 0.0}, rounds=0)
    args = ["--eval", f"skill:random_1000={folder}", "--json", str(doc), "--split", str(split)]
    assert skill_table.main(args) == 0
    out = json.loads(doc.read_text())
    assert out["earlier_split"]["models"]["rl1"]["skill"]["pass@1"] == 2.3
    assert out["earlier_split"]["skill_split_ids"] == ["old"]
    assert out["skill_split"] == {"tasks": 3, "real": 1} and out["skill_split_ids"] == ["a", "c"]
    assert list(out["models"]) == ["random_1000"] and out["models"]["random_1000"]["skill"]["mode"] == "direct"
    assert skill_table.main(args) == 0                                # a second write keeps the earlier rows
    assert json.loads(doc.read_text())["earlier_split"]["models"]["rl1"]["skill"]["pass@1"] == 2.3


def test_merge_replaces_only_the_given_rows(tmp_path):
    doc = tmp_path / "skill_bench.json"
    doc.write_text(json.dumps({"skill_split": {"tasks": 2}, "models": {
        "random_1000": {"skill": {"pass@1": 0.0}, "all": {"pass@1": 87.2}}, "rl1": {"skill": {"pass@1": 2.3}}}}))
    folder = eval_folder(tmp_path, "random_1000", {"a": 1.0, "c": 0.0}, rounds=0)
    assert skill_table.main(["--eval", f"all:random_1000={folder}", "--json", str(doc), "--merge"]) == 0
    models = json.loads(doc.read_text())["models"]
    assert models["rl1"]["skill"]["pass@1"] == 2.3                   # a model not given is kept
    assert models["random_1000"]["skill"]["pass@1"] == 0.0           # so is a given model's other set
    assert models["random_1000"]["all"]["pass@1"] == 0.0 and models["random_1000"]["all"]["tasks"] == 2   # replaced


def test_bad_specs_are_one_line_errors(tmp_path):
    with pytest.raises(SystemExit, match="SET:NAME=DIR"):
        skill_table.main(["--eval", "random"])
    with pytest.raises(SystemExit, match="no such file"):
        skill_table.main(["--eval", f"skill:x={tmp_path}"])
    with pytest.raises(SystemExit, match="SET=FILE"):
        skill_table.main(["--rows", "rows.json"])


def test_score_answers_takes_a_floor_for_tasks_that_carry_none(monkeypatch):
    """A dev split's tasks carry no random_floor; --floor's records (by task key) give them one."""
    tasks = [make_task("lock_a", "lock3", LOCK), make_task("lock_b", "lock3", LOCK.replace("8'h5a", "8'h5b"))]
    monkeypatch.setattr(score, "score_answers", lambda pairs, **kw: [score.parse_failure("no code")] * len(pairs))
    answers = {"task_ids": ["lock_a", "lock_b"], "texts": ["", ""], "n": 1}
    records = {floor.task_key(tasks[0]): {"random_pass": 0.0, "random_cov": 42.0}}
    without = score_answers.rows_of(answers, tasks, "cvdp", workers=1)["direct"]
    assert "floor_tasks" not in without
    d = score_answers.rows_of(answers, tasks, "cvdp", workers=1, floor_records=records)["direct"]
    assert d["floor_tasks"] == 1 and d["random_cov"] == 42.0
    assert d["per_task"]["lock_a"]["skill"] and d["per_task"]["lock_b"]["random_cov"] is None


def test_score_answers_writes_eval_metrics_for_claims(tmp_path, monkeypatch):
    """--metrics-dir DIR writes DIR/NAME/metrics.json, eval's file: claims reads scored answers as eval folders."""
    tasks = [make_task("lock_a", "lock3", LOCK), make_task("lock_b", "lock3", LOCK.replace("8'h5a", "8'h5b"))]
    (tmp_path / "t.jsonl").write_text("".join(json.dumps(t) + "\n" for t in tasks))
    monkeypatch.setattr(score, "score_answers", lambda pairs, **kw: [score.parse_failure("no code")] * len(pairs))
    (tmp_path / "a.json").write_text(json.dumps({"task_ids": ["lock_a", "lock_b"], "texts": ["", ""], "n": 1,
                                                 "adapter": "/x/rl1"}))
    score_answers.main(["--answers", str(tmp_path / "a.json"), "--tasks", str(tmp_path / "t.jsonl"), "--workers", "1",
                        "--out", str(tmp_path / "rows.json"), "--metrics-dir", str(tmp_path / "ev")])
    m = json.loads((tmp_path / "ev" / "rl1" / "metrics.json").read_text())
    assert set(m["direct"]["per_task"]) == {"lock_a", "lock_b"}
    assert m["direct"]["per_task"]["lock_a"]["pass_rate"] == 0.0
    assert json.loads((tmp_path / "rows.json").read_text())["rl1"]["pass@1"] == 0.0


def test_score_answers_runs_starved_timeouts_again(monkeypatch):
    """The scorer of recorded answers asks score.score_answers to rerun a starved timeout alone (its rows do not
    depend on the GPU generating beside it)."""
    seen = {}

    def fake(pairs, **kw):
        seen.update(kw)
        return [score.parse_failure("no code")] * len(pairs)
    monkeypatch.setattr(score, "score_answers", fake)
    score_answers.rows_of({"task_ids": ["lock_a"], "texts": [""], "n": 1}, [make_task("lock_a", "lock3", LOCK)],
                          "cvdp", workers=1)
    assert seen["retry_starved"] is True
