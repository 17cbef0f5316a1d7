"""Tests of the staged SFT data builder (data/build_sft.py) with scripted simulator results.

Run: python -m pytest -q tests/test_build_sft.py
"""
import json
import re

import pytest

import common
import onpolicy
import rundir
from data import build_sft
from data import teacher as teacher_mod
from data.designs import generate_tasks


def task(i):
    return {"id": f"t{i}", "rtl_files": [{"name": "d.sv", "content": f"module d{i}(input a); endmodule"}],
            "spec_files": [], "dut_module_name": f"d{i}", "dut_instance_name": "uut",
            "instruction": f"The top module is 'd{i}'. Instantiate it in the testbench with the instance name 'uut'.",
            "targets": [{"inst_name": "uut", "metric": "overall_average", "target_percentage": 90.0}]}


def ans(tag):
    """An answer whose code carries the scripted result: `// R status cov block toggle`."""
    return common.render_answer("tb_d.sv", f"module tb; // R {tag}\nendmodule")


def scripted_score(pairs):
    out = []
    for _, a in pairs:
        m = re.search(r"// R (\w+) ([\d.]+|-) ([\d.]+|-) ([\d.]+|-)", a)
        status, cov, blk, tog = m.groups()
        if status != "ok":
            out.append({"status": status, "overall_pct": None, "metrics": {}, "uncovered": [],
                        "errors": [{"source": "iverilog", "file": "tb.sv", "line": 1, "col": 1, "msg": "syntax"}]})
            continue
        out.append({"status": "ok", "overall_pct": float(cov), "uncovered": [], "errors": [],
                    "metrics": {"block": {"covered": 1, "total": 1, "pct": float(blk)},
                                "toggle": {"covered": 1, "total": 1, "pct": float(tog)}}})
    return out


class ScriptedTeacher:
    def __init__(self, direct_tags, refine_map):
        self.direct_tags, self.refine_map = direct_tags, refine_map

    def direct(self, tasks, n):
        return [[ans(tag) for tag in self.direct_tags[t["id"]][:n]] for t in tasks]

    def refine(self, states):
        out = []
        for t, a, r in states:
            tag = re.search(r"// R ([^\n]+)", a).group(1) if "// R" in (a or "") else "none"
            out.append(ans(self.refine_map.get((t["id"], tag), tag)))
        return out


@pytest.fixture(autouse=True)
def no_sim_feedback(monkeypatch):
    """Feedback text needs sim.format_feedback; the filters under test do not."""
    monkeypatch.setattr(common, "feedback_message", 
                        lambda r: f"FEEDBACK {r['status'] if isinstance(r, dict) else 'parse_failure'}")


def test_improvement_filter():
    ok = lambda c, b, t: {"status": "ok", "overall_pct": c, "metrics": {"block": {"pct": b}, "toggle": {"pct": t}}}
    fail = {"status": "compile_error", "overall_pct": None}
    assert build_sft.improvement(fail, ok(30, 30, 30)) == "refine_compile"
    assert build_sft.improvement(fail, fail) is None
    assert build_sft.improvement(ok(50, 50, 50), ok(50.9, 51.8, 50)) is None           # +0.9 points: too small
    assert build_sft.improvement(ok(50, 50, 50), ok(60, 80, 40)) is None               # toggle fell
    assert build_sft.improvement(ok(50, 50, 50), ok(60, 70, 50)) == "refine_coverage"
    assert build_sft.improvement(ok(50, 50, 50), fail) is None


def test_worst_state_selection():
    r = lambda c: {"status": "ok", "overall_pct": c}
    f = {"status": "compile_error", "overall_pct": None}
    tags = lambda runs: [s[2] for s in build_sft.select_states(runs)]
    assert tags([("a", r(40)), ("b", r(45)), ("c", r(48))]) == ["worst"]               # median - worst = 0.05
    sel = build_sft.select_states([("a", r(40)), ("b", r(60)), ("c", r(90)), ("d", f), ("e", r(100))])
    assert [(s[0], s[2]) for s in sel] == [("d", "fail"), ("a", "worst"), ("b", "median")]


def test_stage0_best_of_n_and_coverage_required():
    tasks = [task(0), task(1)]
    t = ScriptedTeacher({"t0": ["ok 40 40 40", "ok 70 70 70"], "t1": ["compile_error - - -", "timeout - - -"]}, {})
    rows, st = build_sft.build_stage0(tasks, t, n=2, score_fn=scripted_score)
    assert st["rows"] == 1 and st["dropped_no_coverage"] == 1
    (row,) = rows
    assert row["kind"] == "direct" and row["stage"] == 0 and row["reward_after"] == pytest.approx(1.7)
    assert [m["role"] for m in row["messages"]] == ["system", "user", "assistant"]
    assert row["messages"][:2] == common.build_messages(tasks[0])
    assert "// R ok 70 70 70" in row["messages"][2]["content"]


def test_refine_rows_filters_and_largest_per_design():
    tasks = [task(0), task(1), task(2)]
    pairs = [(tasks[0], ans("ok 20 20 20")), (tasks[0], ans("ok 50 50 50")), (tasks[0], ans("ok 52 52 52")),
             (tasks[1], ans("ok 30 30 30")),
             (tasks[2], ans("compile_error - - -")), (tasks[2], ans("ok 60 60 60"))]
    t = ScriptedTeacher({}, {
        ("t0", "ok 20 20 20"): "ok 45 45 45",      # +25 (worst state)
        ("t0", "ok 50 50 50"): "ok 80 80 80",      # +30 (median state, kept as candidate: 50-20 > 10)
        ("t1", "ok 30 30 30"): "ok 30.5 31 30",    # +0.5 points: rejected
        ("t2", "compile_error - - -"): "ok 40 40 40",   # fixes the compile error: reward 0 -> 1.4
        ("t2", "ok 60 60 60"): "ok 70 80 55",      # toggle falls: rejected
    })
    rows, st = build_sft.build_refine_rows(pairs, t, stage=1, score_fn=scripted_score, rounds=1)
    by = {r["task_id"]: r for r in rows}
    assert set(by) == {"t0", "t2"} and st["rejected_no_improvement"] == 2
    assert st["states_by_tag"] == {"worst": 3, "median": 1, "fail": 1}
    assert by["t0"]["kind"] == "refine_coverage" and by["t0"]["reward_before"] == pytest.approx(1.5)
    assert by["t0"]["reward_after"] == pytest.approx(1.8)                      # the largest improvement
    assert by["t2"]["kind"] == "refine_compile" and by["t2"]["reward_before"] == 0.0
    msgs = by["t2"]["messages"]
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user", "assistant"]
    assert msgs[:4] == common.refine_messages(tasks[2], ans("compile_error - - -"), None) or \
        msgs[3]["content"] == "FEEDBACK compile_error"
    assert "// R ok 40 40 40" in msgs[4]["content"]


def test_stage2_uses_states_fn_and_keeps_stage1():
    tasks = [task(0), task(1)]
    t = ScriptedTeacher({}, {("t0", "ok 10 10 10"): "ok 60 60 60"})
    calls = []

    def states_fn(ts):
        calls.append([x["id"] for x in ts])
        return [(tasks[0], ans("ok 10 10 10")), (tasks[1], "I cannot write this testbench.")]

    stage1 = [{"task_id": "old", "kind": "direct"}]
    rows, st = build_sft.build_stage2(tasks, t, stage1, states_fn, score_fn=build_sft_score)
    assert calls == [["t0", "t1"]] and rows[0] == stage1[0]
    new = rows[1:]
    assert [r["stage"] for r in new] == [2, 2] and {r["task_id"] for r in new} == {"t0", "t1"}
    t1 = next(r for r in new if r["task_id"] == "t1")          # parse failure state -> teacher answer
    assert t1["kind"] == "refine_parse" and t1["messages"][2]["content"] == "I cannot write this testbench."
    assert t1["messages"][3]["content"] == "FEEDBACK parse_failure"            # refine_messages(..., None)
    assert st["states_by_status"] == {"ok": 1, "no_code": 1}


def build_sft_score(pairs):
    """Scripted scoring that also handles answers without code (as build_sft.sim_score does)."""
    out = []
    for t, a in pairs:
        if "// R" not in a:
            out.append({"status": "no_code", "overall_pct": None, "metrics": {}, "uncovered": [], "errors": []})
        elif "// R none" in a:
            out.append(scripted_score([(t, ans("ok 55 55 55"))])[0])
        else:
            out.append(scripted_score([(t, a)])[0])
    return out


def test_sim_score_does_not_simulate_parse_failures():
    out = onpolicy.score_answers([(task(0), "no code here"), (task(0), "filename: tb.sv\n```systemverilog\nmodule tb;\n")])
    assert [r["status"] for r in out] == ["no_code", "truncated"]
    assert all(onpolicy.is_parse_failure(r) and onpolicy.result_reward(r) == 0.0 for r in out)
    ok = {"status": "ok", "overall_pct": 40.0, "metrics": {}}
    assert build_sft.improvement(out[0], ok) == "refine_parse"
    assert build_sft.improvement(out[1], ok) == "refine_parse"
    assert build_sft.improvement({"status": "compile_error", "overall_pct": None}, ok) == "refine_compile"


def _template_score(pairs):
    """Scores without a simulator: parse failures as sim_score; usable code = ok 80 %."""
    out = []
    for _, a in pairs:
        p = common.parse_answer(a or "")
        if p.reason not in ("ok", "no_filename"):
            out.append(onpolicy.parse_failure(p.reason))
        else:
            out.append({"status": "ok", "overall_pct": 80.0, "uncovered": [], "errors": [],
                        "metrics": {"block": {"covered": 4, "total": 5, "pct": 80.0}}})
    return out


def test_stage2_from_tiny_model_rollouts():
    """Stage 2 end to end with a tiny random model: its rollouts are junk (parse failures), the template
    teacher labels them with its strong template, rows are refine_parse on the memoryless state."""
    model, tok = common.tiny_model(seed=0)
    tasks = [task(0), task(1)]
    states_fn = build_sft.model_states_fn(model, tok, n=2, max_new_tokens=4, seed=0)
    pairs = states_fn(tasks)
    assert [t["id"] for t, _ in pairs] == ["t0", "t0", "t1", "t1"] and all(isinstance(a, str) for _, a in pairs)
    assert pairs == build_sft.model_states_fn(model, tok, n=2, max_new_tokens=4, seed=0)(tasks)   # reproducible
    one_each = build_sft.model_states_fn(model, tok, n=2, max_new_tokens=4, seed=0, batch_size=2)(tasks)
    assert [t["id"] for t, _ in one_each] == ["t0", "t0", "t1", "t1"]      # one task per generation call, in order
    stage1 = [{"task_id": "old", "kind": "direct"}]
    teacher = teacher_mod.TemplateTeacher("strong")
    rows, st = build_sft.build_stage2(tasks, teacher, stage1, lambda ts: pairs, score_fn=_template_score, rounds=1)
    assert rows[0] == stage1[0] and st["runs"] == 4 and st["states_by_tag"] == {"fail": 2}
    assert set(st["runs_by_status"]) <= set(onpolicy.PARSE_FAILURES)
    new = rows[1:]
    assert [r["kind"] for r in new] == ["refine_parse", "refine_parse"] and [r["stage"] for r in new] == [2, 2]
    for r, t in zip(new, tasks):
        state_answer = next(a for tt, a in pairs if tt["id"] == t["id"])         # the first failing run
        assert r["messages"][:4] == common.refine_messages(t, state_answer, None)
        assert r["messages"][4]["content"] == build_sft.canonical(teacher_mod.template_answer(t, "strong"))
        assert r["reward_before"] == 0.0 and r["reward_after"] == pytest.approx(1.8)
    assert "states_fn_s" in st


UNDRIVABLE_RTL = ("module grid(input clk, input logic [3:0] col_index [0:1], output y);\n"
                  "  assign y = col_index[0][0];\nendmodule\n")


def test_a_design_the_teacher_cannot_drive_is_counted_and_skipped(tmp_path):
    """Issue 16: a port of non-integral type (an unpacked array) makes the template teacher raise
    TeacherError; the build counts it by reason, leaves it out of every stage, and goes on."""
    bad = {**task(9), "id": "grid", "dut_module_name": "grid",
           "rtl_files": [{"name": "grid.sv", "content": UNDRIVABLE_RTL}]}
    with pytest.raises(teacher_mod.TeacherError, match="non-integral"):
        teacher_mod.template_answer(bad, "strong", 0)
    tasks = [task(0), bad, task(1)]
    info = build_sft.build_all(tasks, tmp_path / "out", teacher_mod.TemplateTeacher("strong"), n=1,
                               fail_fraction=0.0, rounds=1, score_fn=_template_score)
    reason = "port '*' has non-integral type"
    assert info["tasks"] == 3 and info["stage0"]["skipped_by_reason"] == {reason: 1}
    assert info["stage0"]["skipped_ids"] == ["grid"] and info["stage1"]["designs"] == 2
    rows = [json.loads(x) for k in ("stage0", "stage1") for x in (tmp_path / "out" / f"{k}.jsonl").read_text().splitlines()]
    assert {r["task_id"] for r in rows} == {"t0", "t1"}
    result = json.loads((tmp_path / "out" / "result.json").read_text())
    assert result["outcome"]["skipped_by_reason"] == {reason: 1} and result["outcome"]["drivable_tasks"] == 2
    assert result["outcome"]["sizes"] == info["sizes"]
    done = json.loads((tmp_path / "out" / "done.json").read_text())
    assert done["script"] == "data/build_sft.py" and done["files"]["stage1"] == "stage1.jsonl"


def test_stage2_on_an_earlier_builds_stages01_keeps_them_as_written(tmp_path):
    """--stages01-from (chorus_mini's data2): stage 2 starts from the stage-0/1 rows an earlier build wrote,
    row for row (not a rebuild), keeps its skipped designs out, and refuses a build of other tasks or settings."""
    bad = {**task(9), "id": "grid", "dut_module_name": "grid",
           "rtl_files": [{"name": "grid.sv", "content": UNDRIVABLE_RTL}]}
    tasks = [task(0), bad, task(1)]
    teacher = teacher_mod.TemplateTeacher("strong")
    cfg = dict(n=1, fail_fraction=0.0, rounds=1, score_fn=_template_score)
    build_sft.build_all(tasks, tmp_path / "a", teacher, **cfg)
    s1 = (tmp_path / "a" / "stage1.jsonl").read_text().splitlines()
    s1[0] = json.dumps({**json.loads(s1[0]), "marker": "as written"})        # a rebuild would not have it
    (tmp_path / "a" / "stage1.jsonl").write_text("\n".join(s1) + "\n")
    config = build_sft.build_config(tasks, teacher, 1, 0, 0.0, 1, "testbench")
    loaded = build_sft.load_stages01(tmp_path / "a", tasks, config)
    seen = []

    def states_fn(ts):
        seen.extend(t["id"] for t in ts)
        return [(t, "no code") for t in ts]
    info = build_sft.build_all(tasks, tmp_path / "b", teacher, states_fn=states_fn, stages01=loaded, **cfg)
    s2 = (tmp_path / "b" / "stage2.jsonl").read_text().splitlines()
    assert s2[:len(s1)] == s1 and json.loads(s2[0])["marker"] == "as written"
    assert [json.loads(x)["kind"] for x in s2[len(s1):]] == ["refine_parse", "refine_parse"] and seen == ["t0", "t1"]
    assert info["sizes"] == {"stage0": 2, "stage1": len(s1), "stage2": len(s1) + 2}
    assert info["seconds"]["stage0"] == info["seconds"]["stage1"] == 0.0
    with pytest.raises(ValueError, match=r"other settings \(then, now\): \{'rounds': \(1, 2\)\}"):
        build_sft.load_stages01(tmp_path / "a", tasks, {**config, "rounds": 2})
    with pytest.raises(ValueError, match="built from 3 tasks, not 2"):
        build_sft.load_stages01(tmp_path / "a", tasks[:2], config)
    with pytest.raises(ValueError, match="cannot reuse stages 0-1 of .*build_info.json"):
        build_sft.load_stages01(tmp_path / "c", tasks, config)
    weak = build_sft.build_config(tasks, teacher_mod.TemplateTeacher("weak"), 1, 0, 0.0, 1, "testbench")
    with pytest.raises(ValueError, match=r"\{'teacher_level': \('strong', 'weak'\)\}"):
        build_sft.load_stages01(tmp_path / "a", tasks, weak)
    edited = [tasks[0], bad, {**tasks[2], "instruction": "other"}]           # same ids and count, other content
    with pytest.raises(ValueError, match="'tasks_sha256'"):
        build_sft.load_stages01(tmp_path / "a", edited, build_sft.build_config(edited, teacher, 1, 0, 0.0, 1, "testbench"))
    old = {k: v for k, v in config.items() if k not in ("teacher_level", "tasks_sha256")}
    info = json.loads((tmp_path / "a" / "build_info.json").read_text())
    (tmp_path / "a" / "build_info.json").write_text(json.dumps({**info, "config": old}))   # an older build's record
    assert build_sft.load_stages01(tmp_path / "a", tasks, config)[2] == [json.loads(x) for x in s1]
    stray = [task(0), bad, task(2)]
    with pytest.raises(ValueError, match="rows of 1 task\\(s\\) not in --tasks, e.g. t1"):
        build_sft.load_stages01(tmp_path / "a", stray, build_sft.build_config(stray, teacher, 1, 0, 0.0, 1, "testbench"))
    (tmp_path / "a" / "stage1.jsonl").write_text("\n".join(s1[1:]) + "\n")
    with pytest.raises(ValueError, match="files hold 2 \\+ 1 rows, build_info.json says 2 \\+ 2"):
        build_sft.load_stages01(tmp_path / "a", tasks, config)
    (tmp_path / "a" / "build_info.json").write_text(json.dumps({**info, "stage0": {}}))
    with pytest.raises(ValueError, match="build_info.json lacks 'skipped_ids'"):
        build_sft.load_stages01(tmp_path / "a", tasks, config)
    (tmp_path / "a" / "done.json").unlink()
    with pytest.raises(ValueError, match="did not finish"):
        build_sft.load_stages01(tmp_path / "a", tasks, config)


def test_stages01_from_is_checked_before_the_stage2_model_loads(tmp_path, capsys):
    """The CLI refuses --stages01-from without a stage-2 model, and an earlier build of other settings before it
    loads one (the model path below does not exist: its error would come first otherwise)."""
    tasks = [task(0), task(1)]
    (tmp_path / "t.jsonl").write_text("".join(json.dumps(t) + "\n" for t in tasks))
    build_sft.build_all(tasks, tmp_path / "a", teacher_mod.TemplateTeacher("strong"), n=1, fail_fraction=0.0,
                        rounds=1, score_fn=_template_score)
    base = ["--tasks", str(tmp_path / "t.jsonl"), "--out", str(tmp_path / "b"), "--stages01-from", str(tmp_path / "a"),
            "--n", "1", "--fail-fraction", "0", "--answer-mode", "testbench"]   # as build_all's default above
    with pytest.raises(SystemExit):
        build_sft.main(base + ["--rounds", "1"])
    assert "--stages01-from is for a stage-2 build" in capsys.readouterr().err
    assert rundir.cli("data/build_sft.py", build_sft.main, base + ["--rounds", "2", "--stage2-model", "no/such"]) == 1
    assert "built with other settings (then, now): {'rounds': (1, 2)}" in capsys.readouterr().err
    assert not (tmp_path / "b").exists()


def _save_tiny(tmp_path):
    model, tok = common.tiny_model(seed=0)
    model.save_pretrained(tmp_path / "m")
    tok.save_pretrained(tmp_path / "m")
    peft_model = common.add_lora(model, r=4, alpha=8)
    common.save_adapter(peft_model, tmp_path / "a")
    return str(tmp_path / "m"), str(tmp_path / "a")


@pytest.mark.needs_iverilog
def test_cli_all_stages_with_stage2_model_and_decontamination(tmp_path):
    """The whole flow through the CLI: 2 synthetic designs, one of them also in the 'eval' file
    (dropped by --decontaminate), stages 0-1 with the template teacher, stage 2 from a saved tiny
    model + LoRA adapter (junk rollouts -> refine_parse rows), build_info.json complete."""
    m, a = _save_tiny(tmp_path)
    train = generate_tasks(2, 0, "train", families=["parity", "decoder"])
    (tmp_path / "eval.jsonl").write_text(json.dumps(train[1]) + "\n")
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(t) + "\n" for t in train))
    out = tmp_path / "sft"
    info = build_sft.main(["--tasks", str(tmp_path / "train.jsonl"), "--decontaminate", str(tmp_path / "eval.jsonl"),
                           "--out", str(out), "--n", "1", "--rounds", "1", "--fail-fraction", "0", "--workers", "1",
                           "--stage2-model", m, "--stage2-adapter", a, "--stage2-max-new-tokens", "4",
                           "--quant", "fp32", "--answer-mode", "testbench"])
    saved = json.loads((out / "build_info.json").read_text())
    assert saved == json.loads(json.dumps(info))
    assert json.loads((out / "result.json").read_text())["outcome"]["sizes"] == saved["sizes"]
    assert (out / "done.json").is_file()
    assert saved["decontamination"]["dropped"] == 1 and saved["decontamination"]["kept"] == 1
    assert saved["decontamination"]["dropped_rows"][0]["id"] == train[1]["id"]
    assert saved["tasks"] == 1
    rows = {k: [json.loads(x) for x in (out / f"{k}.jsonl").read_text().splitlines()]
            for k in ("stage0", "stage1", "stage2")}
    assert saved["sizes"] == {k: len(v) for k, v in rows.items()}
    assert saved["sizes_by_kind"]["stage0"] == {"direct": 1}
    assert saved["sizes_by_kind"]["stage2"].get("refine_parse") == 1
    assert all(r["task_id"] == train[0]["id"] for v in rows.values() for r in v)
    assert set(saved["seconds"]) >= {"stage0", "stage1", "stage2", "stage2_rollouts", "total"}
    assert saved["stage2_policy"]["adapter"] == a and saved["stage2"]["runs"] == 2


def test_a_malformed_task_file_ends_in_one_line(tmp_path, capsys):
    bad = tmp_path / "tasks.jsonl"
    bad.write_text(json.dumps(task(0)) + "\n" + json.dumps({"id": "x"}) + "\n")
    assert rundir.cli("data/build_sft.py", build_sft.main, ["--tasks", str(bad), "--out", str(tmp_path / "o")]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"data/build_sft.py: error: {bad}:2: task is missing field(s)") and len(err.splitlines()) == 1


def test_state_draws_are_per_design_so_dropping_one_leaves_the_others():
    """Weak states and their corruptions depend on (seed, design id) only, not on the designs before it:
    two data builds whose pools differ by one design (a simulator timeout under load) differ only there."""
    tasks = generate_tasks(12, 0, "train")
    full = build_sft.state_policy_runs(tasks, fail_fraction=0.5, seed=7)
    less = build_sft.state_policy_runs(tasks[:3] + tasks[4:], fail_fraction=0.5, seed=7)
    by_id = lambda pairs: {t["id"]: [a for u, a in pairs if u["id"] == t["id"]] for t, _ in pairs}
    a, b = by_id(full), by_id(less)
    assert set(a) - set(b) == {tasks[3]["id"]}
    assert all(a[i] == b[i] for i in b)
    assert sum(len(v) > len(build_sft.STATE_LEVELS) for v in a.values()) not in (0, len(a))   # some corrupted, not all
    again = build_sft.state_policy_runs(list(reversed(tasks)), fail_fraction=0.5, seed=7)
    assert by_id(again) == a                                   # the order of the list does not matter either
    assert by_id(build_sft.state_policy_runs(tasks, fail_fraction=0.5, seed=8)) != a


def test_a_skill_task_s_known_stimulus_is_its_stage0_row_where_the_template_fails():
    """A code lock's coverage needs the code the spec states: the template teacher's answers stay at random's
    coverage, the family's known stimulus passes, and stage 0 keeps the best scored answer (real simulator)."""
    from data import skill_designs
    t = skill_designs.make_task("code_lock", 3001)
    rows, st = build_sft.build_stage0([t], teacher_mod.TemplateTeacher(level="strong", mode="stimulus"), n=1, workers=1,
                                      answer_mode="stimulus")
    (row,) = rows
    body = " ".join(row["messages"][-1]["content"].split())
    assert " ".join(t["known_stimulus"].split()) in body
    assert row["reward_after"] == pytest.approx(2.0)        # the known stimulus covers everything


@pytest.mark.needs_iverilog
def test_the_pipelines_validation_rows_build_stage_0_alone(tmp_path):
    """chorus_mini's data stage builds the tuning tasks' validation rows with --rounds 0 --fail-fraction 0
    (train_val profiles): build_sft takes that command as emitted and writes stage-0 rows; stage 1 adds none."""
    import chorus_mini as cm
    import profiles
    (tmp_path / "data").mkdir()
    tasks = generate_tasks(2, 0, "train", families=["parity", "decoder"])
    (tmp_path / "data" / "tuning_tasks.jsonl").write_text("".join(json.dumps(t) + "\n" for t in tasks))
    c = profiles.apply_overrides(profiles.PROFILES["small3"], ["sim_workers=1", "eval_tasks=", "tune_source=val"])
    (cmd,) = [x for x in cm.data_cmds(c, tmp_path, tmp_path / "m") if "val_sft" in str(x.argv)]
    argv = [str(a) for a in cmd.argv[2:]]
    argv[argv.index("--tasks") + 1] = str(tmp_path / "data" / "tuning_tasks.jsonl")
    assert argv[argv.index("--rounds") + 1] == "0"
    build_sft.main(argv)
    out = tmp_path / "data" / "val_sft"
    assert len((out / "stage0.jsonl").read_text().splitlines()) == 2
    assert (out / "stage1.jsonl").read_text() == (out / "stage0.jsonl").read_text() and (out / "done.json").is_file()
