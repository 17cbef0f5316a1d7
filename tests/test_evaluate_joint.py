"""Several models evaluated in one process (evaluate.py eval --adapter A B C --out X Y Z) and chorus_mini's
eval_joint: on the HF path (CPU) each model's samples and metrics equal its single eval's; on the fast path (run
eagerly on CPU) every generate call is one stacked call over every model's rows; the simulations share one pool
(run_eval(pool=): scripted policies in threads on one pool score as alone); a model that fails ends the command
with one line after the others have written their folders; bad --adapter / --out counts are one line before any
work; chorus_mini builds one joint command per eval stage for the models still due.

Run: python -m pytest -q tests/test_evaluate_joint.py
"""
import json
import threading

import pytest

import chorus_mini as cm
import common
import evaluate
import jointgen
import onpolicy
import profiles
import simpool
from test_common import one_thread  # noqa: F401  (an autouse fixture: one torch thread)
from test_evaluate import TASKS, scripted

ARGS = ["--model", "tiny", "--n", "2", "--rounds", "1", "--max-new-tokens", "16", "--sim-workers", "1", "--seed", "3"]


def _tasks(tmp_path):
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps(t) + "\n" for t in TASKS))
    return str(path)


def _samples(out):
    return [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]


def _metrics(out):
    """metrics.json less what a joint run may change: its config (adapter, out, joint) and the timings."""
    m = json.loads((out / "metrics.json").read_text())
    return {k: v for k, v in m.items() if k not in ("config", "timing")}


@pytest.fixture
def spies(monkeypatch):
    """Records every SimPool made and every JointGenerate (its .calls: the names in each joined call)."""
    made = {"pools": [], "joints": []}

    class Pool(simpool.SimPool):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            made["pools"].append(self)

    class Joint(jointgen.JointGenerate):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            made["joints"].append(self)
    monkeypatch.setattr(simpool, "SimPool", Pool)
    monkeypatch.setattr(jointgen, "JointGenerate", Joint)
    return made


def test_on_the_hf_path_each_model_samples_and_scores_as_alone(tmp_path, experts, spies):
    """Three adapters in one command: each folder's samples and metrics equal that adapter's single eval; its config
    is the single eval's plus `joint` (every adapter and out); every generate call joined all three models; one
    SimPool served them (a single eval makes its own)."""
    paths = [experts[0][n] for n in ("student", "t0", "t1")]
    tasks = _tasks(tmp_path)
    for k, a in enumerate(paths):
        assert evaluate.main(["eval", *ARGS, "--tasks", tasks, "--adapter", a, "--out", str(tmp_path / f"s{k}")]) == 0
    assert len(spies["pools"]) == 3 and not spies["joints"]
    outs = [str(tmp_path / f"j{k}") for k in range(3)]
    assert evaluate.main(["eval", *ARGS, "--tasks", tasks, "--adapter", *paths, "--out", *outs]) == 0
    assert len(spies["pools"]) == 4                                   # one for the three models
    assert [names for names, _ in spies["joints"][0].calls] == [["model0", "model1", "model2"]] * 2   # 2 rounds
    for k in range(3):
        solo, joint = tmp_path / f"s{k}", tmp_path / f"j{k}"
        assert _samples(solo) == _samples(joint) and _metrics(solo) == _metrics(joint)
        cfg = json.loads((joint / "metrics.json").read_text())["config"]
        alone = json.loads((solo / "metrics.json").read_text())["config"]
        assert cfg.pop("joint") == {"adapters": paths, "outs": outs}
        assert cfg == {**alone, "out": outs[k]} and cfg["adapter"] == paths[k]
        assert (joint / "done.json").is_file() and json.loads((joint / "result.json").read_text())["config"] == \
            json.loads((joint / "metrics.json").read_text())["config"]
    texts = [[r["text"] for s in _samples(tmp_path / f"j{k}") for r in s["rounds"]] for k in range(3)]
    assert texts[0] != texts[1] != texts[2] != texts[0]              # each model its own adapter


def test_on_the_fast_path_every_call_is_one_stacked_call(tmp_path, experts, monkeypatch, spies):
    """The GPU's path, run eagerly on CPU ($CHORUS_FAST_CPU): every generate call is one call over the rows of all
    three models (in their order, each under its adapter); the first model's rows come first under its seed, so
    they are its single eval's samples."""
    monkeypatch.setenv(common.FAST_CPU_ENV, "1")
    paths = [experts[0][n] for n in ("student", "t0", "t1")]
    tasks = _tasks(tmp_path)
    assert evaluate.main(["eval", *ARGS, "--tasks", tasks, "--adapter", paths[0], "--out", str(tmp_path / "s0")]) == 0
    calls, real = [], common.generate

    def spy(model, tok, msgs, **kw):
        calls.append(kw.get("adapters"))
        return real(model, tok, msgs, **kw)
    monkeypatch.setattr(common, "generate", spy)
    outs = [str(tmp_path / f"j{k}") for k in range(3)]
    assert evaluate.main(["eval", *ARGS, "--tasks", tasks, "--adapter", *paths, "--out", *outs]) == 0
    rows = 2 * len(TASKS)                                              # n 2 per task, none at 100 %: all go on
    assert calls == [["model0"] * rows + ["model1"] * rows + ["model2"] * rows] * 2      # one per round
    assert _samples(tmp_path / "s0") == _samples(tmp_path / "j0")
    assert len(spies["pools"]) == 2


@pytest.mark.needs_iverilog
def test_models_in_threads_on_one_pool_score_as_alone():
    """run_eval(pool=): two scripted models in their own threads on one SimPool get the coverages each gets alone
    (test_evaluate's known table), and no pool of their own."""
    want = {("t_cnt", 0): [100.0], ("t_cnt", 1): [47.5, 90.0, 47.5], ("t_cnt", 2): [0.0, 0.0, 47.5],
            ("t_mux", 0): [50.0, 50.0, 100.0], ("t_mux", 1): [0.0, 0.0, 50.0], ("t_mux", 2): [50.0, 50.0, 100.0]}
    got = {}
    with simpool.SimPool(2) as pool:
        made = []
        real = simpool.SimPool
        simpool.SimPool = lambda *a, **k: made.append(1) or real(*a, **k)
        try:
            def run(k):
                samples, _ = evaluate.run_eval(scripted(), TASKS, n=3, rounds=2, seed=7, batch_size=2, pool=pool,
                                               verbose=False, n_boot=0)
                got[k] = {(s["task_id"], s["sample"]): [evaluate.coverage(r["result"]) for r in s["rounds"]]
                          for s in samples}
            threads = [threading.Thread(target=run, args=(k,)) for k in range(2)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=120)
        finally:
            simpool.SimPool = real
    assert got == {0: want, 1: want} and made == []


def test_a_failing_model_ends_the_command_in_one_line_and_the_others_finish(tmp_path, experts, monkeypatch, spies):
    """model1's policy raises at its second call (round 1): model0 goes on alone (its call no longer waits for
    model1) and writes its folder; the command then ends with one line naming model1's folder and the error."""
    real = evaluate.eval_model

    def eval_model(args, policy, *a, tag=None, **k):
        calls = []

        def failing(msgs):
            calls.append(len(msgs))
            if len(calls) == 2:
                raise RuntimeError("CUDA error: an illegal memory access\nwas encountered")
            return policy(msgs)
        failing.prompt_fits = policy.prompt_fits
        return real(args, failing if tag == "j1" else policy, *a, tag=tag, **k)
    monkeypatch.setattr(evaluate, "eval_model", eval_model)
    outs = [tmp_path / "j0", tmp_path / "j1"]
    ended = {}

    def main():
        try:
            evaluate.main(["eval", *ARGS, "--rounds", "2", "--tasks", _tasks(tmp_path),
                           "--adapter", experts[0]["t0"], experts[0]["t1"], "--out", *map(str, outs)])
        except SystemExit as e:
            ended["why"] = e
    t = threading.Thread(target=main, daemon=True)
    t.start()
    t.join(timeout=300)
    assert not t.is_alive(), "the joint eval hung"
    why = str(ended["why"])
    assert why.startswith("evaluate.py eval: 1 of 2 models failed") and "\n" not in why
    assert f"{outs[1]}: RuntimeError: CUDA error: an illegal memory access was encountered);" in why
    assert why.endswith("the others' folders are written")
    assert (outs[0] / "done.json").is_file() and not (outs[1] / "done.json").exists()
    assert [names for names, _ in spies["joints"][0].calls] == [["model0", "model1"], ["model0"], ["model0"]]
    assert len(_samples(outs[0])) == 4 and all(len(s["rounds"]) == 3 for s in _samples(outs[0]))


@pytest.mark.parametrize("argv, words", [
    (["--adapter", "a", "b", "--out", "x"], "several models need one --adapter per --out (got 2 and 1)"),
    (["--out", "x", "y"], "several models need one --adapter per --out (got 0 and 2)"),
    (["--adapter", "a", "b", "--out", "x", "./x"], "each model needs its own --out folder"),
    (["--model", "random", "--adapter", "a", "b", "--out", "x", "y"], "the baseline random takes no --adapter"),
])
def test_bad_adapter_and_out_counts_are_one_line_before_any_work(tmp_path, monkeypatch, argv, words):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as e:
        evaluate.main(["eval", "--tasks", "none.jsonl", *argv])
    assert str(e.value).startswith("evaluate.py eval: ") and words in str(e.value) and "\n" not in str(e.value)
    assert list(tmp_path.iterdir()) == []                           # no folder made, no lock taken


def test_chorus_mini_runs_each_eval_stage_as_one_joint_command(tmp_path, monkeypatch):
    """eval_joint (on in small3 only): each eval stage runs the adapters still due as one evaluate.py command, the
    finished ones (skipped), the merges (high rank) and the base model alone, the baselines alone; val joins rl0-rl2. Off, or on several
    GPUs: one command per model. A finished stage prints its commands as its record has them (no false note)."""
    assert profiles.PROFILES["small3"]["eval_joint"] and not profiles.PROFILES["small2"]["eval_joint"]
    assert not profiles.PROFILES["smoke"]["eval_joint"]
    stages = {}
    monkeypatch.setattr(cm, "run_stage", lambda ctx, name, commands, **kw: stages.setdefault(name, commands))
    o = tmp_path / "run"
    (o / "eval/rl1").mkdir(parents=True)
    (o / "eval/rl1/done.json").write_text("{}")                      # finished in an earlier call
    argv = ["run", "--profile", "smoke", "--out", str(o), "--set", "model=tiny", "--set", "eval_baselines=random",
            "--set", "test_tasks=2", "--set", "skill_tasks=1"]
    assert cm.main([*argv, "--set", "eval_joint=true"]) == 0
    models = list(cm.model_adapters(o))
    adapters = [m for m in models if m != "base"]
    outs = lambda cmd: cm.command_outs(str(cmd))                      # noqa: E731
    for stage in ("eval", "eval_syn", "eval_skill"):
        cmds = stages[stage]
        due = [m for m in adapters if not (stage == "eval" and m == "rl1") and m not in cm.MERGES]   # merges: alone
        assert outs(cmds[0]) == [cm.rel(o / stage / m) for m in due] and cmds[0].done is None
        argv0 = cmds[0].argv
        assert argv0[argv0.index("--adapter") + 1:argv0.index("--adapter") + 1 + len(due)] == \
            [cm.rel(cm.model_adapters(o, profiles.PROFILES["smoke"])[m]) for m in due]
        alone = [m for m in models if m not in due] + ["random"]
        assert [outs(c) for c in cmds[1:]] == [[cm.rel(o / stage / m)] for m in alone]
        assert all(c.done == o / stage / m / "done.json" for c, m in zip(cmds[1:], alone))
    assert outs(stages["val"][0]) == [cm.rel(o / f"val/rl{k}") for k in range(3)] and len(stages["val"]) == 1
    # the commands of a stage as its record has them: the joint command prints again once every model is done
    c = profiles.apply_overrides(profiles.PROFILES["small3"], ["model=M"])
    every = {m: cm.model_adapters(o, c)[m] for m in models}
    first = cm.eval_cmds(c, o, "M", "eval", every, o / "t.jsonl", 5, 3)
    for m in models:
        (o / "eval" / m).mkdir(exist_ok=True)
        (o / "eval" / m / "done.json").write_text("{}")
    assert [str(x) for x in cm.eval_cmds(c, o, "M", "eval", every, o / "t.jsonl", 5, 3)] != [str(x) for x in first]
    (o / "eval/done.json").write_text(json.dumps({"commands": [str(x) for x in first]}))
    assert [str(x) for x in cm.eval_cmds(c, o, "M", "eval", every, o / "t.jsonl", 5, 3)] == [str(x) for x in first]
    # off, or under several GPUs: one command per model, as without the key
    for sets in (["eval_joint=false"], ["gpus=2"]):
        stages.clear()
        assert cm.main([*argv, *[x for s in sets for x in ("--set", s)]]) == 0
        assert all(len(outs(x)) == 1 for x in stages["eval_syn"]) and len(stages["eval_syn"]) == len(models) + 1
