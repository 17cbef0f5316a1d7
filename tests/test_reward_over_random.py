"""rl.py / distill.py --reward over_random: 1 + the coverage gained over the task's random floor (data/floor.py),
0 for an answer that does not run. Known answers on result dicts, and the floors read from a floor file or the
task itself; a task without a floor is a one-line error before anything starts."""
from types import SimpleNamespace

import pytest

import onpolicy
import score
from data import floor

RAN = {"status": "ok", "compile_ok": True, "passed": False, "overall_pct": 80.0, "metrics": {}, "uncovered": [], "errors": []}


def test_the_reward_pays_only_coverage_above_random():
    assert score.result_reward(RAN) == pytest.approx(1.8)                       # the paper's reward
    assert score.over_random_reward(RAN, 70.0) == pytest.approx(1.1)            # 10 points over random
    assert score.over_random_reward(RAN, 85.0) == 1.0                           # no better than random: no gain
    assert score.over_random_reward(score.parse_failure("no_code"), 0.0) == 0.0
    assert score.over_random_reward({**RAN, "status": "compile_error", "compile_ok": False}, 0.0) == 0.0
    s = score.Score.of(RAN, 70.0)
    assert s.reward == pytest.approx(1.1) and s.coverage == pytest.approx(0.8) and s.parsed
    assert score.Score.of(RAN).reward == pytest.approx(1.8)


def _task(tid, rtl):
    return {"id": tid, "rtl_files": [{"name": "a.sv", "content": rtl}], "dut_module_name": "a",
            "dut_instance_name": "uut", "targets": []}


def test_floors_come_from_the_task_or_the_floor_file(tmp_path):
    a, b = _task("a", "module a; endmodule"), _task("b", "module a; wire x; endmodule")
    b["random_floor"] = {"random_cov": 55.0, "random_pass": 0.0}
    path = tmp_path / "floor.json"
    floor.save_floor(path, {floor.task_key(a): {"random_cov": 40.0, "random_pass": 1.0}})
    args = SimpleNamespace(reward="over_random", floor=str(path))
    assert onpolicy.reward_floors(args, [a, b]) == {"a": 40.0, "b": 55.0}
    assert onpolicy.reward_floors(SimpleNamespace(reward="task", floor=None), [a]) is None
    c = _task("c", "module a; wire y; endmodule")
    with pytest.raises(SystemExit, match=r"no random floor for 1 task\(s\) \(c\)"):
        onpolicy.reward_floors(args, [a, c])


def test_rl_flags_accept_the_reward_choice():
    import rl
    args = rl.parse_args(["--tasks", "t.jsonl", "--out", "o", "--reward", "over_random", "--floor", "f.json"])
    assert (args.reward, args.floor) == ("over_random", "f.json")
    assert rl.parse_args(["--tasks", "t.jsonl", "--out", "o"]).reward == "task"
    with pytest.raises(SystemExit):
        rl.parse_args(["--tasks", "t.jsonl", "--out", "o", "--reward", "coverage"])
