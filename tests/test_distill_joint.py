"""distill.py's students in one process (--out X Y Z --variants gated nogate rlfb): whole runs on the tiny model with
real generation (HF path, CPU): each student of a joint run trains exactly as it does alone, the teachers' answers
to a prompt the students share are decoded once, and checkpoints resume alone or jointly alike; scripted runs for
the deadline and --pause-at; chorus_mini's opd_joint (one command for the due variants, each stage its record).

Run: python -m pytest -q tests/test_distill_joint.py
"""
import contextlib
import json
import shutil
from collections import Counter

import pytest

import chorus_mini as cm
import common
import distill
import jointgen
import onpolicy
import profiles
import rundir
from helpers import deadline_after
from test_distill import _args, _hash_score, _two_scripted_steps
from test_rl import one_thread  # noqa: F401 (an autouse fixture: one torch thread)
from test_rl_joint import _log, _same, _weights

VARIANTS = ("gated", "nogate", "rlfb")
TASKS = [{"id": f"t{i}", "rtl_files": [{"name": "a.sv", "content": f"module a{i}(input x); endmodule"}],
          "spec_files": [], "dut_module_name": f"a{i}", "dut_instance_name": "dut", "instruction": f"test a{i}"}
         for i in range(2)]
REAL = ["--steps", "2", "--prompts-per-step", "1", "--group-size", "1", "--max-new-tokens", "8", "--save-every", "1",
        "--plot-every", "0", "--answer-mode", "testbench"]          # testbench prompts: 1.2k tokens, not 1.8k
FLAGS = {"gated": [], "nogate": ["--no-gate"], "rlfb": ["--on-fail", "rl"]}      # a solo run's gate flags


KEYS = ("reward", "gate_pass_rate", "opd_groups", "rl_groups", "skipped_groups", "teacher_reward_best",
        "teacher_chosen/t0", "opd/log_ratio", "loss", "grad_norm", "cursor")


def _strip(out):
    return [[r.get(k) for k in KEYS] for r in _log(out)]


def _teacher_rows(calls, real=common.generate):
    """A spy on common.generate: per call with teacher rows, those rows as (adapter, seed, prompt)."""

    def spy(model, tok, msgs, **kw):
        rows = [(a, s, json.dumps(m, sort_keys=True)) for m, a, s in
                zip(msgs, kw.get("adapters") or [None] * len(msgs), kw.get("seeds") or [None] * len(msgs))
                if a and a.startswith("teacher")]
        if rows:
            calls.append(rows)
        return real(model, tok, msgs, **kw)
    return spy


@pytest.fixture(scope="module")
def runs(experts, tmp_path_factory):
    """Each variant alone and the three in one process, on the same student, teachers and prompts; the teacher rows
    each run decoded, per generate call."""
    paths, _, _ = experts
    root = tmp_path_factory.mktemp("opd_joint")
    rows = {}
    with pytest.MonkeyPatch.context() as mp:
        for v in VARIANTS:
            rows[v] = []
            mp.setattr(common, "generate", _teacher_rows(rows[v]))
            distill.run(_args(paths, root / f"solo_{v}", *REAL, *FLAGS[v]), score_fn=_hash_score, tasks=TASKS)
        rows["joint"] = []
        mp.setattr(common, "generate", _teacher_rows(rows["joint"]))
        distill.run(_args(paths, [root / f"joint_{v}" for v in VARIANTS], "--variants", *VARIANTS, *REAL),
                    score_fn=_hash_score, tasks=TASKS)
    return root, rows


def test_each_student_of_a_joint_run_trains_exactly_as_alone(runs):
    """Real rollouts on the HF path, 2 steps: each student's checkpoints (bit for bit) and log rows equal its solo
    run's; each folder has its own finished run and a config naming its gate and who trained beside it."""
    root, _ = runs
    for v in VARIANTS:
        solo, joint = root / f"solo_{v}", root / f"joint_{v}"
        assert _same(_weights(solo, 1), _weights(joint, 1)) and _same(_weights(solo, 2), _weights(joint, 2)), v
        assert _strip(solo) == _strip(joint), v
        assert (joint / "done.json").is_file() and (joint / "adapter/adapter_config.json").is_file()
        cfg = json.loads((joint / "result.json").read_text())["config"]
        assert cfg["out"] == str(joint) and cfg["joint"]["variants"] == list(VARIANTS)
        assert (cfg["no_gate"], cfg["on_fail"]) == {"gated": (False, "skip"), "nogate": (True, "skip"),
                                                    "rlfb": (False, "rl")}[v]
    # the variants really part: other updates, so other weights (the test is not three copies of one run)
    w = {v: _weights(root / f"joint_{v}", 2) for v in VARIANTS}
    assert not _same(w["gated"], w["nogate"]) and not _same(w["nogate"], w["rlfb"])


def test_the_teachers_answers_to_a_shared_prompt_are_decoded_once(runs):
    """Step 0: the students are one start, so all their prompts are shared and the joint run decodes the teacher rows
    of one solo run, the same rows; over the run it decodes every teacher row any solo run decodes, each once (step
    1's round-2 prompts are each student's own worst answer, so only those can differ)."""
    _, rows = runs
    assert [len(call) for call in rows["joint"][:2]] == [len(call) for call in rows["gated"][:2]] == [2, 2]
    for v in VARIANTS:                                # 4 calls: 2 steps x 2 rounds, 1 prompt x 2 teachers each
        assert len(rows[v]) == 4 and rows[v][:2] == rows["joint"][:2] and rows[v][2] == rows["joint"][2], v
    solo = [r for v in VARIANTS for call in rows[v] for r in call]
    joint = [r for call in rows["joint"] for r in call]
    assert Counter(joint) == Counter(set(solo))                    # the union of the solo runs' rows, each once
    # step 1, round 2: each student's own state. gated and rlfb took no update at step 0 (every gate closed; GRPO on
    # groups of one sample is zero), so they share theirs (2 teacher rows) and nogate has its own (2 more)
    round2 = {r for v in VARIANTS for r in rows[v][3]}
    assert rows["gated"][3] == rows["rlfb"][3] != rows["nogate"][3] and len(round2) == 4
    assert len(joint) == 4 + 2 + 4 and len(solo) == 24


def _resumable(src, dst, step):
    """A copy of a finished run cut back to its checkpoint at `step` (as if it had stopped there)."""
    shutil.copytree(src, dst)
    for f in ("done.json", "result.json"):
        (dst / f).unlink()
    for ckpt in (dst / "ckpt").iterdir():
        if int(ckpt.name.split("_")[1]) > step:
            shutil.rmtree(ckpt)


def test_a_solo_checkpoint_resumes_jointly_and_a_joint_one_alone(runs, experts, tmp_path):
    """Checkpoints name the weights "default" whatever the student's adapter is called: solo nogate's step-1
    checkpoint resumes as student0 beside joint gated's (student0 there, student1 here), and joint rlfb's resumes
    alone; each ends with the weights of its uninterrupted solo run."""
    root, _ = runs
    paths, _, _ = experts
    _resumable(root / "solo_nogate", tmp_path / "nogate", 1)
    _resumable(root / "joint_gated", tmp_path / "gated", 1)
    _resumable(root / "joint_rlfb", tmp_path / "rlfb", 1)
    distill.run(_args(paths, [tmp_path / "nogate", tmp_path / "gated"], "--variants", "nogate", "gated", *REAL,
                      "--resume"), score_fn=_hash_score, tasks=TASKS)
    distill.run(_args(paths, tmp_path / "rlfb", *REAL, *FLAGS["rlfb"], "--resume"), score_fn=_hash_score, tasks=TASKS)
    for v in VARIANTS:
        assert _same(_weights(root / f"solo_{v}", 2), _weights(tmp_path / v, 2)), v
        assert _strip(root / f"solo_{v}") == _strip(tmp_path / v) and (tmp_path / v / "done.json").is_file(), v


# -----------------------------------------------------------------------------
# scripted rollouts (fast): the gate table of test_distill.py

SCRIPTED = ["--steps", "2", "--prompts-per-step", "2", "--group-size", "2", "--save-every", "10", "--plot-every", "0"]


def _scripted(experts, monkeypatch):
    """run(out, *flags): a scripted run on the gate table (curves.png, drawn at every stop, is left out: ~1 s each)."""
    monkeypatch.setattr(rundir, "plot_log", lambda *a, **k: None)
    paths, tasks, source, teacher_source, _ = _two_scripted_steps(experts, save_every=10)
    run = lambda out, *extra, **kw: distill.run(_args(paths, out, *SCRIPTED, *extra), source=source,   # noqa: E731
                                                teacher_source=teacher_source, tasks=tasks, **kw)
    return run


def test_a_deadline_one_student_meets_stops_every_student_checkpointed(experts, tmp_path, monkeypatch):
    """The nogate student near the deadline after step 1 stops all three, each checkpointed at step 1 (--save-every
    10: the stop writes it) with its marker, exit 75; --resume finishes each as its uninterrupted solo run."""
    run = _scripted(experts, monkeypatch)
    for v in VARIANTS:
        run(tmp_path / f"solo_{v}", *FLAGS[v])
    outs, real = [tmp_path / v for v in VARIANTS], onpolicy.deadline_near
    monkeypatch.setattr(onpolicy, "deadline_near", lambda d, args, log, step, extra_s=0.0:
                        args.out == str(outs[1]) and step == 1)
    assert run(outs, "--variants", *VARIANTS) == rundir.EXIT_DEADLINE
    for o in outs:
        assert rundir.latest_checkpoint(o / "ckpt").name == "step_000001" and not (o / "done.json").exists()
        assert json.loads((o / rundir.DEADLINE_MARKER).read_text())["why"] == "deadline"
    monkeypatch.setattr(onpolicy, "deadline_near", real)
    run(outs, "--variants", *VARIANTS, "--resume")
    for v, o in zip(VARIANTS, outs):
        assert _same(_weights(tmp_path / f"solo_{v}", 2), _weights(o, 2)) and (o / "done.json").is_file(), v


def test_pause_at_stops_every_student_checkpointed_and_a_deadline_after_k_steps_too(experts, tmp_path, monkeypatch):
    """--pause-at 1: each student stops at its step 1, checkpointed, its marker saying pause, exit 75; resumed with
    a deadline near after one step, all stop at step 2 of 3, checkpointed, unfinished."""
    run = _scripted(experts, monkeypatch)
    outs = [tmp_path / v for v in VARIANTS]
    assert run(outs, "--variants", *VARIANTS, "--steps", "3", "--pause-at", "1") == rundir.EXIT_DEADLINE
    for o in outs:
        assert [r["step"] for r in _log(o)] == [1] and rundir.latest_checkpoint(o / "ckpt").name == "step_000001"
        assert json.loads((o / rundir.DEADLINE_MARKER).read_text())["why"] == "pause"
    monkeypatch.setattr(rundir, "Deadline", deadline_after(1))      # every student near after one more step
    assert run(outs, "--variants", *VARIANTS, "--steps", "3", "--resume") == rundir.EXIT_DEADLINE
    for o in outs:
        assert [r["step"] for r in _log(o)] == [1, 2] and not (o / "done.json").exists()
        assert rundir.latest_checkpoint(o / "ckpt").name == "step_000002"


# -----------------------------------------------------------------------------
# the rendezvous with rows beside the policies' (jointgen.JointGenerate), against a scripted generate

class _Model:
    active = "none"


class _Member:
    def __init__(self, name, joint):
        self.name, self.joint = name, joint


def _record(record):
    def generate(model, tok, msgs, adapters=None, seeds=None, fast=None, stack=None, **kw):
        record.append({"msgs": list(msgs), "adapters": adapters, "seeds": seeds, "stack": stack, "seed": kw["seed"]})
        seeds = [kw["seed"] if s is None else s for s in seeds or [None] * len(msgs)]
        return [f"{a}:{m}:{s}" for m, a, s in zip(msgs, adapters or ["own"] * len(msgs), seeds)]
    return generate


@pytest.mark.parametrize("fast", [True, False])
def test_beside_rows_several_policies_ask_for_run_once_and_each_gets_its_own(monkeypatch, fast):
    """a and b ask teacher t for prompt p (same seed: shared) and each for a prompt of its own; a asks p twice (k = 2
    copies: both shared with b's two). The beside rows run once each, after the policies' rows, and every policy gets
    its rows then its beside rows in its own order."""
    record = []
    monkeypatch.setattr(common, "generate", _record(record))
    monkeypatch.setattr(common, "fast_path", lambda model, f=None: fast)
    monkeypatch.setattr(common, "use_adapter", lambda model, name: contextlib.nullcontext())
    joint = jointgen.JointGenerate(_Model(), None, ["a", "b"])
    beside = {"a": (["p", "p", "qa"], ["t", "t", "t"], [1, 1, 2]), "b": (["qb", "p", "p"], ["t", "t", "t"], [3, 1, 1])}
    out = jointgen.joint_collect([_Member("a", joint), _Member("b", joint)], lambda m: m.joint.member(m.name)(
        None, None, [m.name + "0"], beside=beside[m.name], seed={"a": 7, "b": 8}[m.name]))
    assert joint.beside == [(6, 4)]                                   # 6 asked, 4 run: p twice, qa, qb
    shared = ["t:p:1", "t:p:1", "t:qa:2", "t:qb:3"]
    if fast:                                                          # one call: a's row, b's row, the beside rows
        assert len(record) == 1 and record[0]["msgs"] == ["a0", "b0", "p", "p", "qa", "qb"]
        assert record[0]["adapters"] == ["a", "b", "t", "t", "t", "t"] and record[0]["stack"] == ["a", "b", "t"]
        assert record[0]["seeds"] == [None, None, 1, 1, 2, 3]          # for the HF fallback; the call has one seed
        assert out == [["a:a0:7", *shared[:3]], ["b:b0:7", shared[3], *shared[:2]]]
    else:                                                             # each policy alone, then the beside rows once
        assert [(r["msgs"], r["seed"]) for r in record[:2]] == [(["a0"], 7), (["b0"], 8)]
        assert record[2]["msgs"] == ["p", "p", "qa", "qb"] and record[2]["seeds"] == [1, 1, 2, 3]
        assert out == [["own:a0:7", *shared[:3]], ["own:b0:8", shared[3], *shared[:2]]]


def test_a_teachers_answers_on_the_hf_path_depend_on_nothing_else_in_the_call(experts):
    """common.generate's seeds: a row group of one (adapter, seed) samples alike alone and among other rows."""
    paths, _, _ = experts
    model, tok = distill.build_models(_args(paths, "unused"), paths["student"], [paths["t0"], paths["t1"]])
    p, q = [{"role": "user", "content": "test a"}], [{"role": "user", "content": "test the fifo"}]
    kw = dict(max_new_tokens=6, temperature=1.0, seed=11)
    alone = common.generate(model, tok, [p, p], adapters=["teacher0"] * 2, seeds=[5, 5], **kw)
    mixed = common.generate(model, tok, [q, p, q, p], adapters=["default", "teacher0", "teacher1", "teacher0"],
                            seeds=[None, 5, 9, 5], **kw)
    assert [c.completion_ids for c in alone] == [mixed[1].completion_ids, mixed[3].completion_ids]
    with pytest.raises(ValueError, match="seeds: 1 for 2 chats"):
        common.generate(model, tok, [p, p], adapters=["teacher0"] * 2, seeds=[5], **kw)


# -----------------------------------------------------------------------------
# the command line and chorus_mini

def test_joint_flags_are_checked_before_any_work(experts, tmp_path, capsys):
    paths, _, _ = experts
    for outs, extra, words in (([1, 2], ["--variants", "gated"], "one --variants entry per --out"),
                               ([1, 2], [], "one --variants entry per --out"),
                               ([1, 2], ["--variants", "gated", "rlfb", "--no-gate"], "leave out --no-gate"),
                               ([1, 2], ["--variants", "gated", "nogate", "--on-fail", "rl"], "leave out --no-gate"),
                               ([1, 1], ["--variants", "gated", "nogate"], "its own --out")):
        with pytest.raises(SystemExit):
            _args(paths, [tmp_path / str(k) for k in outs], *extra)
        assert words in capsys.readouterr().err
    one = _args(paths, tmp_path / "x", "--variants", "rlfb")          # one student: the variant's flags
    assert (one.no_gate, one.on_fail, getattr(one, "joint", None)) == (False, "rl", None)
    with pytest.raises(SystemExit):
        distill.parse_args(["--help"])
    assert "nogate = always distill (--no-gate)" in " ".join(capsys.readouterr().out.split())


def test_chorus_mini_runs_the_due_opd_variants_as_one_command_and_records_each_stage(tmp_path, monkeypatch, capsys):
    """opd_joint (small3): one distill.py for the variants still due (opd_nogate finished alone before), each stage
    folder its record of that command; a second run skips all three with no note (joint_stages prints the joint
    command again for the stages it finished). Without opd_joint: one command per variant."""
    o = tmp_path / "run"
    c = profiles.apply_overrides(profiles.PROFILES["small3"], ["model=M"])
    assert c["opd_joint"] is True and profiles.PROFILES["small"]["opd_joint"] is False
    for stage in ("val", "opd_nogate"):
        (o / stage).mkdir(parents=True)
    (o / "val/done.json").write_text("{}")
    nogate = {"script": "distill.py", "stage": "opd_nogate", "commands": [str(cm.opd_cmd(c, o, "M", "opd_nogate"))]}
    (o / "opd_nogate/done.json").write_text(json.dumps(nogate))
    ran = []
    monkeypatch.setattr(cm, "execute", lambda cmd, log: ran.append(cmd) or (0, None, None))
    argv = ["run", "--profile", "small3", "--set", "model=M", "--out", str(o), "--only", *cm.OPD_VARIANTS]
    assert cm.main(argv) == 0
    assert len(ran) == 1
    a = ran[0].argv
    i, j = a.index("--out"), a.index("--variants")
    assert a[i + 1:i + 3] == [str(cm.rel(o / "opd")), str(cm.rel(o / "opd_rlfb"))] and a[i + 3].startswith("--")
    assert a[j + 1:j + 3] == ["gated", "rlfb"] and a[j + 3].startswith("--")
    assert "--no-gate" not in a and "--on-fail" not in a
    for stage in ("opd", "opd_rlfb"):
        done = json.loads((o / stage / "done.json").read_text())
        assert done["stage"] == stage and done["commands"] == [str(ran[0])] and done["calls"] == 1
    assert json.loads((o / "opd_nogate/done.json").read_text()) == nogate
    capsys.readouterr()
    assert cm.main(argv) == 0 and len(ran) == 1
    text = capsys.readouterr().out
    assert text.count(": done, skipped") == 3 and "differ" not in text
    solo = tmp_path / "solo"
    (solo / "val").mkdir(parents=True)
    (solo / "val/done.json").write_text("{}")
    assert cm.main([*argv[:5], "--set", "opd_joint=false", "--out", str(solo), *argv[7:]]) == 0
    assert [r.argv.count("--variants") for r in ran[1:]] == [0, 0, 0]
    assert [r.argv[r.argv.index("--out") + 1] for r in ran[1:]] == [str(cm.rel(solo / v)) for v in cm.OPD_VARIANTS]
