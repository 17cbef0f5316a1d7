"""answer_mode testbench | stimulus through the kit: the dispatch (harness.task_mode / first_messages /
refine_state_messages, the testbench fallback of a design the kit cannot harness), the score path
(onpolicy.prepare_answer), one RL step and the eval loop with scripted policies in both modes, generate,
and stimulus-mode SFT rows.

Run: python -m pytest -q tests/test_answer_mode.py
"""
import json
from pathlib import Path

import pytest
import torch

import common
import distill
import evaluate
import harness
import onpolicy
import rl
import sim
from data import build_sft
from data import teacher as teacher_mod
from test_rl import BAD_TB, GOOD_TB  # noqa: E402  (the and_gate testbenches test_rl scores)

AND_RTL = "module and_gate(input a, input b, output y);\n  assign y = a & b;\nendmodule\n"
AND_TASK = {"id": "am/and_gate", "spec_files": [], "rtl_files": [{"name": "and_gate.sv", "content": AND_RTL}],
            "dut_module_name": "and_gate", "dut_instance_name": "dut",
            "instruction": "Write a testbench for and_gate; instance name dut.",
            "targets": [{"inst_name": "dut", "metric": "overall_average", "target_percentage": 90.0}]}
# a port named `step` clashes with the harness's task of that name: the kit cannot harness it
CLASH_RTL = "module clash(input step, input b, output y);\n  assign y = step ^ b;\nendmodule\n"
CLASH_TASK = {**AND_TASK, "id": "am/clash", "rtl_files": [{"name": "clash.sv", "content": CLASH_RTL}],
              "dut_module_name": "clash"}
GOOD_STIM = "```systemverilog\na = 1'b1;\nstep(1);\nb = 1'b1;\nstep(1);\na = 1'b0;\nb = 1'b0;\nstep(1);\n```"
BAD_STIM = "```systemverilog\na = 1'b1;\nstep(1);\nb = 1'b1\nstep(2);\n```"      # line 3 lacks its ';'


def fresh(task):
    return json.loads(json.dumps(task))


def direct_reward(task, answer_text):
    """Reward of a stimulus answer scored by hand: harness + stimulus through sim.simulate."""
    body = harness.parse_stimulus(answer_text).body
    tb, _ = harness.assemble(harness.make_harness(task), body)
    return sim.reward(sim.simulate(sim.job_from_task(task, tb)))


# -----------------------------------------------------------------------------
# the dispatch

def test_testbench_mode_is_the_common_prompts():
    t = fresh(AND_TASK)
    assert harness.task_mode(t, "testbench") == "testbench"
    assert harness.first_messages(t, "testbench") == common.build_messages(t)
    res = {"status": "compile_error", "compile_ok": False, "errors": [{"source": "iverilog", "file": "tb.sv",
                                                                       "line": 3, "col": 0, "msg": "syntax error"}]}
    assert harness.refine_state_messages(t, BAD_TB, res, "testbench") == common.refine_messages(t, BAD_TB, res)
    assert harness.canonical_answer(t, GOOD_TB, "testbench") == build_sft.canonical(GOOD_TB)
    a, job, r = onpolicy.prepare_answer(t, GOOD_TB)
    assert r is None and job == sim.job_from_task(t, common.parse_answer(GOOD_TB).code)
    with pytest.raises(ValueError, match="answer mode"):
        harness.task_mode(t, "essay")


def test_stimulus_mode_prompts_and_score_path():
    t = fresh(AND_TASK)
    h = harness.make_harness(t)
    assert harness.task_mode(t, "stimulus") == "stimulus" and "answer_mode_note" not in t
    assert harness.first_messages(t, "stimulus") == harness.stimulus_messages(t, h)
    assert harness.task_harness(t) is harness.task_harness(fresh(AND_TASK))          # cached by id + RTL
    assert harness.canonical_answer(t, "text\n" + GOOD_STIM, "stimulus") == harness.render_stimulus(
        harness.parse_stimulus(GOOD_STIM).body)
    a, job, r = onpolicy.prepare_answer(t, GOOD_STIM, answer_mode="stimulus")
    assert r is None and a.reason == "ok" and a.filename == "tb_and_gate.sv"
    assert job["tb"] == harness.assemble(h, a.code)[0]
    a, job, r = onpolicy.prepare_answer(t, "```systemverilog\nendmodule\n```", answer_mode="stimulus")
    assert job is None and a.reason == "rejected" and r["status"] == "rejected" and r["errors"][0]["line"] == 1
    assert not onpolicy.is_parse_failure(r) and onpolicy.result_reward(r) == 0.0
    a, job, r = onpolicy.prepare_answer(t, "no code at all", answer_mode="stimulus")
    assert job is None and r == onpolicy.parse_failure("no_code")
    a, job, r = onpolicy.prepare_answer(t, "```systemverilog\na = 1;", answer_mode="stimulus")
    assert job is None and r == onpolicy.parse_failure("truncated")


def test_a_design_the_kit_cannot_harness_falls_back_to_testbench_with_a_note():
    t = fresh(CLASH_TASK)
    with pytest.raises(harness.HarnessError):
        harness.make_harness(t)
    assert harness.task_mode(t, "stimulus") == "testbench"
    assert "testbench mode used" in t["answer_mode_note"] and "step" in t["answer_mode_note"]
    assert harness.first_messages(t, "stimulus") == common.build_messages(t)
    assert harness.fallbacks([fresh(AND_TASK), t], "stimulus") == {"am/clash": t["answer_mode_note"]}
    assert harness.fallbacks([t], "testbench") == {}
    a, job, r = onpolicy.prepare_answer(t, GOOD_TB.replace("and_gate", "clash").replace("a(a)", "step(a)"),
                                        answer_mode="stimulus")
    assert a.reason == "ok" and job is not None and "module tb;" in job["tb"]     # a whole testbench
    tt = teacher_mod.TemplateTeacher("weak", 0, mode="stimulus")
    assert tt.direct([t], 1)[0][0] == teacher_mod.template_answer(t, "weak", 0)


# -----------------------------------------------------------------------------
# RL: one step with a scripted policy (common.generate replaced), both modes

def _scripted_generate(monkeypatch, first, second, seen):
    """common.generate -> round-1 prompts get `first` (one text per sample), round-2 prompts `second`."""
    def fake(model, tok, messages_list, **kw):
        rnd = 2 if len(messages_list[0]) > 2 else 1               # [system, user] vs the refinement state
        seen.setdefault(rnd, []).extend(messages_list)
        texts = (first if rnd == 1 else second)[:len(messages_list)]
        return [common.Completion(x, common.chat_ids(tok, m), tok(x, add_special_tokens=False)["input_ids"], False)
                for x, m in zip(texts, messages_list)]
    monkeypatch.setattr(common, "generate", fake)


@pytest.mark.needs_iverilog
@pytest.mark.parametrize("mode", ["testbench", "stimulus"])
def test_one_rl_step_with_a_scripted_policy(mode, monkeypatch, tmp_path):
    torch.set_num_threads(1)
    t = fresh(AND_TASK)
    good, bad = (GOOD_STIM, BAD_STIM) if mode == "stimulus" else (GOOD_TB, BAD_TB)
    if mode == "stimulus":
        good = teacher_mod.stimulus_answer(t, "medium", 0)     # the teacher's own stimulus answer
    seen = {}
    _scripted_generate(monkeypatch, [good, bad], [good, good], seen)
    args = rl.parse_args(["--model", "tiny", "--tasks", "unused", "--out", str(tmp_path / "run"), "--steps", "1",
                          "--prompts-per-step", "1", "--group-size", "2", "--rounds", "2", "--max-new-tokens", "64",
                          "--profile", "paper", "--sim-workers", "1", "--no-gradient-checkpointing",
                          "--answer-mode", mode, "--target-mode", "cvdp", "--plot-every", "0"])
    rl.run(args, tasks=[t])
    log = [json.loads(x) for x in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    want = direct_reward(t, good) if mode == "stimulus" else \
        sim.reward(sim.simulate(sim.job_from_task(t, common.parse_answer(good).code)))
    assert want > 1.0
    assert log[0]["reward_r1"] == pytest.approx(want / 2)          # good + a compile error (0)
    assert log[0]["reward_r2"] == pytest.approx(want)
    assert seen[1][0] == harness.first_messages(t, mode)
    feedback = seen[2][0][-1]["content"]
    if mode == "stimulus":
        assert "<harness>" in seen[1][0][1]["content"]
        assert "- stimulus:3: expected ';'" in feedback             # the model's own line 3
        assert seen[2][0][2]["content"] == harness.render_stimulus(harness.parse_stimulus(bad).body)
    else:
        assert "<harness>" not in seen[1][0][1]["content"] and "stimulus:" not in feedback
        assert seen[2][0][:3] == common.refine_messages(t, bad, None)[:3] and "stage: compile" in feedback
    cfg = json.loads((tmp_path / "run" / "result.json").read_text())["config"]
    assert cfg["answer_mode"] == mode


def test_distill_takes_the_answer_mode(tmp_path):
    args = distill.parse_args(["--teachers", "a", "b", "--tasks", "x", "--out", str(tmp_path),
                               "--answer-mode", "stimulus"])
    assert args.answer_mode == "stimulus"
    assert distill.parse_args(["--teachers", "a", "--tasks", "x", "--out", str(tmp_path)]).answer_mode == "stimulus"


# -----------------------------------------------------------------------------
# eval and generate with scripted policies

@pytest.mark.needs_iverilog
def test_eval_in_stimulus_mode_refines_from_the_mapped_feedback(tmp_path):
    t, clash = fresh(AND_TASK), fresh(CLASH_TASK)
    clash_tb = GOOD_TB.replace("and_gate dut(.a(a)", "clash dut(.step(a)")
    seen = []

    def policy(messages_list):
        seen.append(messages_list)
        out = []
        for m in messages_list:
            if "<harness>" not in m[1]["content"]:
                out.append(clash_tb)                   # the fallback task: a whole testbench
            else:
                out.append(BAD_STIM if len(seen) == 1 else GOOD_STIM)
        return out

    samples, metrics = evaluate.run_eval(policy, [t, clash], n=1, rounds=1, sim_workers=1, n_boot=50,
                                         answer_mode="stimulus", verbose=False)
    by_id = {s["task_id"]: s for s in samples}
    assert by_id["am/and_gate"]["answer_mode"] == "stimulus" and by_id["am/clash"]["answer_mode"] == "testbench"
    assert metrics["answer_mode"] == "stimulus" and metrics["answer_mode_fallbacks"] == 1
    assert "am/clash" in metrics["answer_mode_notes"]
    r0 = by_id["am/and_gate"]["rounds"][0]
    # the stimulus check parses like the compiler, so the missing ';' is refused before simulation, with its line
    assert r0["result"]["status"] == "rejected" and r0["answer"]["reason"] == "rejected"
    state = [m for m in seen[1] if "<harness>" in m[1]["content"]][0]
    assert "- stimulus:3: expected ';'" in state[-1]["content"]
    assert by_id["am/and_gate"]["best"]["status"] == "ok"
    assert by_id["am/and_gate"]["best"]["overall_pct"] == pytest.approx(
        100 * (direct_reward(t, GOOD_STIM) - 1))
    assert metrics["direct"]["failures"] == {"parse": 0, "compile": 1, "timeout": 0, "sim_time_limit": 0,
                                             "other": 0, "ok": 1, "prompt_too_long": 0}
    assert metrics["agentic"]["failures"]["ok"] == 2 and metrics["agentic"]["syn_pass"] == 100.0
    assert metrics["direct"]["syn_pass"] == 50.0


@pytest.mark.needs_iverilog
def test_eval_in_testbench_mode_records_the_mode():
    t = fresh(AND_TASK)
    samples, metrics = evaluate.run_eval(lambda ms: [GOOD_TB] * len(ms), [t], n=1, rounds=0, sim_workers=1,
                                         n_boot=0, verbose=False)
    assert samples[0]["answer_mode"] == "testbench" and metrics["answer_mode"] == "testbench"
    assert metrics["answer_mode_fallbacks"] == 0 and metrics["direct"]["failures"]["ok"] == 1


@pytest.mark.needs_iverilog
def test_generate_in_stimulus_mode_writes_the_assembled_testbench(tmp_path):
    t = fresh(AND_TASK)
    rep = evaluate.generate_testbench(lambda ms: [GOOD_STIM] * len(ms), t, n=1, rounds=0, out_dir=tmp_path,
                                      sim_workers=1, answer_mode="stimulus")
    body = harness.parse_stimulus(GOOD_STIM).body
    assert rep["answer_mode"] == "stimulus" and rep["result"]["status"] == "ok"
    assert (tmp_path / "tb_and_gate.sv").read_text() == harness.assemble(harness.make_harness(t), body)[0]
    assert (tmp_path / "stimulus.sv").read_text() == body


# -----------------------------------------------------------------------------
# SFT rows in stimulus mode (template teacher)

DESIGNS = Path(__file__).resolve().parent / "designs"


@pytest.mark.needs_iverilog
def test_build_sft_writes_stimulus_rows(tmp_path):
    tasks = [{**fresh(AND_TASK), "rtl_files": [{"name": f"{top}.sv", "content": (DESIGNS / f"{top}.sv").read_text()}],
              "id": f"am/{top}", "dut_module_name": top, "dut_instance_name": "uut",
              "targets": [{"inst_name": "uut", "metric": "overall_average", "target_percentage": 90.0}]}
             for top in ("counter", "alu")] + [fresh(CLASH_TASK)]
    tt = teacher_mod.TemplateTeacher("strong", 0, mode="stimulus")
    info = build_sft.build_all(tasks, tmp_path, tt, n=1, workers=1, seed=0, fail_fraction=0.0, rounds=1,
                               answer_mode="stimulus")
    rows = {k: [json.loads(x) for x in (tmp_path / f"stage{k}.jsonl").read_text().splitlines()] for k in (0, 1)}
    modes = {r["task_id"]: r["answer_mode"] for r in rows[0]}
    assert modes == {"am/counter": "stimulus", "am/alu": "stimulus", "am/clash": "testbench"}
    for r in rows[1]:
        assert r["answer_mode"] == modes[r["task_id"]]
        first = r["messages"][:2]
        assert first == harness.first_messages(next(t for t in tasks if t["id"] == r["task_id"]), "stimulus")
        if r["answer_mode"] == "stimulus":
            ans = r["messages"][-1]["content"]
            assert ans == harness.render_stimulus(harness.parse_stimulus(ans).body) and "module" not in ans
    assert any(r["kind"] == "refine_coverage" and r["answer_mode"] == "stimulus" for r in rows[1])
    bodies = {" ".join(harness.parse_stimulus(r["messages"][-1]["content"]).body.split())
              for r in rows[1] if r["answer_mode"] == "stimulus"}
    out = json.loads((tmp_path / "result.json").read_text())
    assert out["config"]["answer_mode"] == "stimulus" and out["outcome"]["answer_mode_fallbacks"] == 1
    assert out["outcome"]["distinct_stimuli"]["stage0"] == 2
    assert out["outcome"]["distinct_stimuli"]["stage1"] == len(bodies) > 2
    assert info["answer_mode_fallbacks"] == {"am/clash": tasks[2]["answer_mode_note"]}


def test_stage1_states_in_stimulus_mode_are_weak_and_broken_stimuli():
    t = {**fresh(AND_TASK), "id": "am/counter", "dut_module_name": "counter", "dut_instance_name": "uut",
         "rtl_files": [{"name": "counter.sv", "content": (DESIGNS / "counter.sv").read_text()}]}
    pairs = build_sft.state_policy_runs([t], fail_fraction=1.0, seed=3, answer_mode="stimulus")
    answers = [a for _, a in pairs]
    assert answers[:3] == [teacher_mod.stimulus_answer(t, lv, 3 + i) for i, lv in enumerate(build_sft.STATE_LEVELS)]
    assert len(answers) == 4 and answers[3] not in answers[:3]
    assert harness.parse_stimulus(answers[3]).reason == "ok" and "module" not in answers[3]
    tb_pairs = build_sft.state_policy_runs([t], fail_fraction=0.0, seed=3)
    assert [a for _, a in tb_pairs] == [teacher_mod.template_answer(t, lv, 3 + i)
                                        for i, lv in enumerate(build_sft.STATE_LEVELS)]


# -----------------------------------------------------------------------------
# bench/answer_modes.py --merge-evals: two eval folders -> results JSON keys

@pytest.mark.needs_iverilog
def test_answer_modes_merges_two_eval_runs_and_keeps_floor_and_ceiling(tmp_path):
    import importlib.util
    spec = importlib.util.spec_from_file_location("answer_modes", Path(__file__).resolve().parents[1]
                                                  / "bench" / "answer_modes.py")
    am = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(am)
    t = fresh(AND_TASK)
    for mode, texts in (("testbench", [BAD_TB, GOOD_TB]), ("stimulus", [GOOD_STIM, GOOD_STIM])):
        calls = iter(texts)

        def policy(ms, calls=calls):
            x = next(calls)
            return [x] * len(ms)
        samples, metrics = evaluate.run_eval(policy, [t], n=1, rounds=1, sim_workers=1, n_boot=20, verbose=False,
                                             answer_mode=mode)
        evaluate.write_eval(tmp_path / mode, samples, metrics, {"answer_mode": mode})
    out = tmp_path / "answer_modes.json"
    out.write_text(json.dumps({"floor": {"level": "minimal", "syn_pass": 1.0, "pass@1": 0.0, "cov@1": 5.0}}))
    assert am.main(["--merge-evals", f"testbench={tmp_path / 'testbench'}", f"stimulus={tmp_path / 'stimulus'}",
                    "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["floor"]["cov@1"] == 5.0                                       # the CPU part is kept
    tb, st = data["testbench"], data["stimulus"]
    assert tb["direct"]["syn_pass"] == 0.0 and tb["direct"]["failures"]["compile"] == 1
    assert tb["agentic"]["syn_pass"] == 100.0 and tb["agentic"]["failures"]["ok"] == 1
    assert st["answer_mode"] == "stimulus" and st["direct"]["failures"]["ok"] == 1
    for m in (tb["direct"], tb["agentic"], st["direct"], st["agentic"]):
        assert {"syn_pass", "pass@1", "cov@1", "pass@1_ci95", "failures"} <= set(m)
    md = out.with_suffix(".md").read_text()
    assert "| testbench stage-0, direct | 0.0" in md and "| stimulus stage-0, agentic | 100.0" in md
    with pytest.raises(SystemExit, match="stimulus mode, not testbench"):
        am.main(["--merge-evals", f"testbench={tmp_path / 'stimulus'}", f"stimulus={tmp_path / 'stimulus'}",
                 "--out", str(out)])


# -----------------------------------------------------------------------------
# chorus_mini: the profile key reaches every stage that builds prompts or scores answers

def test_chorus_mini_passes_the_answer_mode_to_every_prompt_building_stage(tmp_path):
    import chorus_mini as cm
    import profiles
    assert all(p["answer_mode"] in harness.ANSWER_MODES for p in profiles.PROFILES.values())
    c = profiles.apply_overrides(profiles.PROFILES["smoke"], ["answer_mode=stimulus"])
    o = tmp_path
    cmds = {"data": cm.data_cmds(c, o, o / "m")[-1], "data2": cm.data2_cmd(c, o, "M"), "rl0": cm.rl_cmd(c, o, "M", 0),
            "opd": cm.opd_cmd(c, o, "M", "opd"),
            "eval": cm.eval_cmd(c, o, "M", None, o / "t.jsonl", o / "e", 1, 0)}
    for name, cmd in cmds.items():
        argv = [str(x) for x in cmd.argv]
        assert argv[argv.index("--answer-mode") + 1] == "stimulus", name
    assert "--answer-mode" not in [str(x) for x in cm.sft_cmd(c, o, "M", "data/stage0.jsonl").argv]   # rows carry it
