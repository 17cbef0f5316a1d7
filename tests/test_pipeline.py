"""The whole-pipeline command (chorus_mini.py run): --set parsing, stage markers, resume, --from, report.

    python -m pytest -q tests/test_pipeline.py            # a few minutes: the two pipeline runs (slow)
    python -m pytest -q tests/test_pipeline.py -m "not slow"

The pipeline test runs every stage on the tiny random model (--set model=tiny) with 2 synthetic eval tasks.
Its stage commands run in this interpreter (runpy) instead of subprocesses: each subprocess would pay ~8 s of
torch/transformers imports on 2 cores, ~30 of them. The subprocess path (execute: tee to the log, exit code,
peak RSS) is tested on its own with a command that imports no torch.
"""
import json
import os
import signal
import sys
from pathlib import Path

import pytest
import torch

import chorus_mini as cm
import profiles
import rundir
from helpers import EXECUTED, run_in_process

ROOT = Path(__file__).resolve().parents[1]


# -----------------------------------------------------------------------------
# --set

def test_set_parses_types():
    base = profiles.PROFILES["smoke"]
    c = profiles.apply_overrides(base, ["rl_steps=7", "sft_lr=1", "grad_ckpt=true", "model=tiny", "merge_rank=32",
                                  "sft_limit=None", "eval_tasks=../x/y.jsonl", "quant='4bit'"])
    assert c["rl_steps"] == 7 and isinstance(c["rl_steps"], int)
    assert c["sft_lr"] == 1.0 and isinstance(c["sft_lr"], float)        # int accepted for a float
    assert c["grad_ckpt"] is True
    assert c["model"] == "tiny" and c["merge_rank"] == 32 and c["sft_limit"] is None
    assert c["eval_tasks"] == "../x/y.jsonl" and c["quant"] == "4bit"
    assert base["rl_steps"] != 7                                         # the profile itself is untouched
    assert profiles.apply_overrides(base, ["model=123"])["model"] == "123"    # a str key keeps numbers as text
    assert profiles.apply_overrides(base, ["model=None"])["model"] is None    # nullable: None in some profile
    c = profiles.apply_overrides(base, ["tune_limit=4", "sft_val_every=50"])  # None in every profile: int when set
    assert (c["tune_limit"], c["sft_val_every"]) == (4, 50)
    assert profiles.apply_overrides(c, ["tune_limit=None"])["tune_limit"] is None


@pytest.mark.parametrize("item, message", [
    ("rl_stepz=3", "unknown key 'rl_stepz'"),
    ("rl_steps=2.5", "expected int, got float"),
    ("rl_steps=many", "expected int, got str"),
    ("rl_steps=None", "expected int, got NoneType"),     # not nullable: no profile has None
    ("grad_ckpt=1", "expected bool, got int"),
    ("tune_limit=all", "expected NoneType or int, got str"),
    ("rl_steps", "expected key=value"),
])
def test_set_rejects(item, message):
    with pytest.raises(SystemExit) as e:
        profiles.apply_overrides(profiles.PROFILES["smoke"], [item])
    assert message in str(e.value) and "\n" not in str(e.value)       # one line


def test_profiles_share_keys():
    keys = set(profiles.PROFILES["smoke"])
    for name, profile in profiles.PROFILES.items():
        assert set(profile) == keys, name
    assert profiles.PROFILES["4b"]["model"] == "Qwen/Qwen3-4B-Instruct-2507" and profiles.PROFILES["4b"]["quant"] == "4bit"
    assert set(cm.NEEDS) <= set(cm.STAGES)
    # release_fast: True/False are passed on to rl.py and distill.py, None leaves their GPU-size default
    o = Path("runs/x")
    assert "--release-fast" in cm.common_train_opts(profiles.PROFILES["4b"], o)
    small = cm.common_train_opts(profiles.PROFILES["small"], o)
    assert "--release-fast" not in small and "--no-release-fast" not in small
    assert "--no-release-fast" in cm.common_train_opts(profiles.apply_overrides(profiles.PROFILES["small"], ["release_fast=false"]), o)


# -----------------------------------------------------------------------------
# running one command

def test_train_val_reaches_sft_rl_and_opd(tmp_path):
    """train_val on: sft.py gets the val tasks and the val tasks' teacher rows (built by the data stage, stage 0
    only), rl.py and distill.py the val tasks, period and patience (and --stop-on-plateau when asked); off (the
    smoke profile): none of it. The small profile validates."""
    o = tmp_path

    def argv(cmd):
        return [str(x) for x in cmd.argv]

    def value(args, flag):
        return args[args.index(flag) + 1] if flag in args else None
    assert profiles.PROFILES["small"]["train_val"] and not profiles.PROFILES["smoke"]["train_val"]
    off = profiles.PROFILES["smoke"]
    cmds = [cm.sft_cmd(off, o, "M", "data/stage0.jsonl"), cm.rl_cmd(off, o, "M", 0), cm.opd_cmd(off, o, "M", "opd")]
    assert not {"--val-tasks", "--val-data", "--val-every", "--stop-on-plateau"} & {a for c in cmds for a in argv(c)}
    assert not any("val_sft" in a for c in cm.data_cmds(off, o, o / "m") for a in argv(c))
    assert "--max-answer-tokens" not in argv(cmds[0])           # sft_answer_cap off: every row trains
    capped = profiles.apply_overrides(off, ["sft_answer_cap=true", "max_new_tokens=1280"])
    assert value(argv(cm.sft_cmd(capped, o, "M", "data/stage0.jsonl")), "--max-answer-tokens") == "1280"
    on = profiles.apply_overrides(profiles.PROFILES["smoke"], ["train_val=true", "rl_val_every=7", "rl_stop_on_plateau=true"])
    sft = argv(cm.sft_cmd(on, o, "M", "data/stage0.jsonl"))
    tasks = str(cm.rel(o / "data/val_tasks.jsonl"))            # paths as the stage commands write them
    assert value(sft, "--val-data") == str(cm.rel(o / "data/val_sft/stage0.jsonl"))
    assert value(sft, "--val-tasks") == tasks and "--val-every" not in sft   # each epoch
    for cmd in (cm.rl_cmd(on, o, "M", 1), cm.opd_cmd(on, o, "M", "opd_nogate")):
        a = argv(cmd)
        assert (value(a, "--val-tasks"), value(a, "--val-every"), value(a, "--val-patience")) == (tasks, "7", "5")
    assert "--stop-on-plateau" in argv(cm.rl_cmd(on, o, "M", 1))               # RL only: OPD's variants keep one budget
    assert "--stop-on-plateau" not in argv(cm.opd_cmd(on, o, "M", "opd_nogate"))
    assert "--min-steps" not in argv(cm.rl_cmd(on, o, "M", 0))
    assert value(argv(cm.rl_cmd(profiles.apply_overrides(on, ["rl_min_steps=100"]), o, "M", 0)), "--min-steps") == "100"
    build = [argv(c) for c in cm.data_cmds(on, o, o / "m") if any("val_sft" in a for a in argv(c))]
    assert len(build) == 1 and value(build[0], "--tasks") == tasks
    assert value(build[0], "--rounds") == "0"
    # tune_source=dev: every choice on the dev file's tuning split (selected by the data stage), not the val tasks
    dev = profiles.apply_overrides(on, ["tune_source=dev"])
    (o / "dev.jsonl").write_text("")
    dev["eval_tasks"] = str(o / "dev.jsonl")
    tuning = str(cm.rel(o / "data/tuning_tasks.jsonl"))
    for cmd in (cm.sft_cmd(dev, o, "M", "data/stage0.jsonl"), cm.rl_cmd(dev, o, "M", 1), cm.opd_cmd(dev, o, "M", "opd")):
        assert value(argv(cmd), "--val-tasks") == tuning
    data = [argv(c) for c in cm.data_cmds(dev, o, o / "m")]
    select = [a for a in data if "select-tasks" in a and "--split" in a]
    assert len(select) == 1 and value(select[0], "--split") == "tuning" and value(select[0], "--out") == tuning
    assert value(next(a for a in data if any("val_sft" in x for x in a)), "--tasks") == tuning
    assert data.index(select[0]) < next(i for i, a in enumerate(data) if any("val_sft" in x for x in a))


def test_sft_pick_best_hands_on_the_best_validated_adapter(tmp_path):
    """sft_pick=best: the next SFT stage, the stage's RL expert, the stage-2 data and the eval take the adapter
    its result.json names best; 'last' (the default), or a stage without validation, the final adapter/."""
    o = tmp_path

    def value(cmd, flag):
        a = [str(x) for x in cmd.argv]
        return a[a.index(flag) + 1]
    for k in (0, 1):
        (o / f"sft{k}").mkdir()
    (o / "sft0/result.json").write_text(json.dumps({"outcome": {"val_best_adapter": "val_ckpt/step_000004/adapter"}}))
    (o / "sft1/result.json").write_text(json.dumps({"outcome": {"finished": True}}))          # no validation
    best = profiles.apply_overrides(profiles.PROFILES["smoke"], ["sft_pick=best"])
    last = profiles.PROFILES["smoke"]
    assert value(cm.rl_cmd(best, o, "M", 0), "--adapter") == str(cm.rel(o / "sft0/val_ckpt/step_000004/adapter"))
    assert value(cm.sft_cmd(best, o, "M", "d.jsonl", init="sft0", name="sft1"), "--init-adapter") == \
        str(cm.rel(o / "sft0/val_ckpt/step_000004/adapter"))
    assert value(cm.rl_cmd(best, o, "M", 1), "--adapter") == str(cm.rel(o / "sft1/adapter"))
    assert value(cm.data2_cmd(best, o, "M"), "--stage2-adapter") == str(cm.rel(o / "sft1/adapter"))
    assert value(cm.data2_cmd(best, o, "M"), "--stages01-from") == str(cm.rel(o / "data"))   # what sft1 trained on
    assert value(cm.data2_cmd(best, o, "M"), "--stage2-batch-size") == str(best["gen_batch_size"])
    assert cm.model_adapters(o, best)["sft0"] == o / "sft0/val_ckpt/step_000004/adapter"
    assert value(cm.rl_cmd(last, o, "M", 0), "--adapter") == str(cm.rel(o / "sft0/adapter"))
    with pytest.raises(SystemExit, match="sft_pick"):
        cm.rl_cmd(profiles.apply_overrides(profiles.PROFILES["smoke"], ["sft_pick=bst"]), o, "M", 0)


def test_execute_tees_output_and_reports_failure(tmp_path):
    log = tmp_path / "stdout.log"
    code, rss, gpu = cm.execute(cm.Cmd(["python", "data/designs.py", "--list"]), log)
    assert code == 0 and rss > 0
    text = log.read_text()
    assert "$ python data/designs.py --list" in text and "alu" in text
    ctx = type("Ctx", (), {"out": tmp_path, "only": set()})()
    with pytest.raises(SystemExit) as e:        # designs.py without --out exits 2
        cm.run_stage(ctx, "data", [cm.Cmd(["python", "data/designs.py", "--n", "1"])])
    assert "stage data failed (exit 2)" in str(e.value) and "python data/designs.py --n 1" in str(e.value)
    assert not (tmp_path / "data" / "done.json").exists()


def test_a_deadline_stop_ends_the_run_unfinished_with_its_exit_code(tmp_path, capsys):
    ctx = type("Ctx", (), {"out": tmp_path, "only": set()})()
    with pytest.raises(SystemExit) as e:        # a stage script that stopped at $CHORUS_DEADLINE exits 75
        cm.run_stage(ctx, "rl0", [cm.Cmd(["python", "-c", f"raise SystemExit({rundir.EXIT_DEADLINE})"])], needs=[])
    assert e.value.code == rundir.EXIT_DEADLINE == 75
    assert "stage rl0 stopped at the deadline ($CHORUS_DEADLINE), checkpointed" in capsys.readouterr().err
    assert not (tmp_path / "rl0" / "done.json").exists()
    # under accelerate / torchrun the 75 arrives as 1: the marker the stopped script left tells (and is removed)
    marker = tmp_path / "rl0" / rundir.DEADLINE_MARKER
    leave = f"import pathlib; pathlib.Path({str(marker)!r}).write_text('{{}}'); raise SystemExit(1)"
    with pytest.raises(SystemExit) as e:
        cm.run_stage(ctx, "rl0", [cm.Cmd(["python", "-c", leave])], needs=[])
    assert e.value.code == 75 and not marker.exists()
    marker.write_text("{}")                     # a stale marker (from an earlier stop) does not make a failure one
    os.utime(marker, (1, 1))
    with pytest.raises(SystemExit) as e:
        cm.run_stage(ctx, "rl0", [cm.Cmd(["python", "-c", "raise SystemExit(1)"])], needs=[])
    assert "stage rl0 failed (exit 1)" in str(e.value) and not marker.exists()


def test_stage_seconds_count_every_call_that_worked_on_it(tmp_path):
    """A stage cut at the deadline and resumed, or run as subsets (one model's eval per lane): done.json's seconds
    are the sum of its calls, and `calls` says how many there were."""
    ctx = type("Ctx", (), {"out": tmp_path, "only": set()})()
    nap = lambda s, code=0: cm.Cmd(["python", "-c", f"import time; time.sleep({s}); raise SystemExit({code})"])
    with pytest.raises(SystemExit):
        cm.run_stage(ctx, "rl0", [nap(0.6, rundir.EXIT_DEADLINE)], needs=[])
    cm.run_stage(ctx, "rl0", [nap(0.6)], needs=[], partial=True)      # a subset: no done.json yet
    assert not (tmp_path / "rl0" / "done.json").exists()
    cm.run_stage(ctx, "rl0", [nap(0.0)], needs=[])
    done = json.loads((tmp_path / "rl0" / "done.json").read_text())
    calls = [json.loads(line) for line in (tmp_path / "rl0" / rundir.CALLS_LOG).read_text().splitlines()]
    assert [c["why"] for c in calls] == ["deadline", "subset"] and all(c["seconds"] >= 0.6 for c in calls)
    assert done["calls"] == 3 and done["seconds"] >= 1.2
    cm.run_stage(ctx, "eval", [nap(0.0)], needs=[])                  # one call: no log, its own time
    done = json.loads((tmp_path / "eval" / "done.json").read_text())
    assert done["calls"] == 1 and done["seconds"] < 1.2 and not (tmp_path / "eval" / rundir.CALLS_LOG).exists()


def test_rl_joint_trains_the_due_experts_in_one_command_and_records_each_stage(tmp_path):
    """rl_joint: one rl.py for every expert still due (the ones --only names, less the finished), each stage folder
    with its own record of the one command; a deadline stop leaves every folder resumable, its call logged."""
    o = tmp_path
    c = profiles.apply_overrides(profiles.PROFILES["small3"], ["model=M"])
    assert c["rl_joint"] is True and profiles.PROFILES["small"]["rl_joint"] is False
    assert "--pause-at" not in cm.rl_cmd(c, o, "M", 0).argv
    paused = cm.rl_cmd(profiles.apply_overrides(c, ["rl_pause_at=50"]), o, "M", 0).argv
    assert paused[paused.index("--pause-at") + 1] == "50"
    argv = lambda cmd: cmd.argv                                      # noqa: E731
    joint = argv(cm.rl_cmd(c, o, "M", [0, 2]))
    i, j = joint.index("--adapter"), joint.index("--out")
    assert joint[i + 1:i + 3] == [str(cm.rel(cm.sft_adapter(c, o, "sft0"))), str(cm.rel(cm.sft_adapter(c, o, "sft2")))]
    assert joint[j + 1:j + 3] == [str(cm.rel(o / "rl0")), str(cm.rel(o / "rl2"))] and joint[j + 3].startswith("--")
    ctx = type("Ctx", (), {"out": o, "only": set()})()
    cmd = cm.Cmd(["python", "-c", f"import pathlib; [pathlib.Path({str(o)!r}, d).mkdir(exist_ok=True) "
                  f"for d in ('rl0', 'rl1')]"])
    cm.run_stage(ctx, "rl0", [cmd], needs=[], also=["rl1"])
    for name in ("rl0", "rl1"):
        done = json.loads((o / name / "done.json").read_text())
        assert done["stage"] == name and done["commands"] == [str(cmd)] and done["calls"] == 1
    stop = cm.Cmd(["python", "-c", f"raise SystemExit({rundir.EXIT_DEADLINE})"])
    with pytest.raises(SystemExit) as e:
        cm.run_stage(ctx, "rl2", [stop], needs=[], also=["rl3"])
    assert e.value.code == 75 and not (o / "rl2/done.json").exists() and not (o / "rl3/done.json").exists()
    for name in ("rl2", "rl3"):
        assert [json.loads(x)["why"] for x in (o / name / rundir.CALLS_LOG).read_text().splitlines()] == ["deadline"]
    # an expert that finished before the others stopped (rl.py's own done.json) gets its stage record now
    finish = f"import json, pathlib; pathlib.Path({str(o / 'rl3/done.json')!r}).write_text(json.dumps({{'script': 'rl.py'}}))"
    with pytest.raises(SystemExit):
        cm.run_stage(ctx, "rl2", [cm.Cmd(["python", "-c", finish + f"; raise SystemExit({rundir.EXIT_DEADLINE})"])],
                     needs=[], also=["rl3"])
    done = json.loads((o / "rl3/done.json").read_text())
    assert done["stage"] == "rl3" and done["script"] == "rl.py" and done["calls"] == 2 and not (o / "rl2/done.json").exists()
    # and so does one that finished before the command failed
    finish6 = finish.replace("rl3/done.json", "rl6/done.json")
    with pytest.raises(SystemExit) as e:
        cm.run_stage(ctx, "rl5", [cm.Cmd(["python", "-c", finish6 + "; raise SystemExit(1)"])], needs=[], also=["rl6"])
    assert "stage rl5 failed (exit 1)" in str(e.value) and not (o / "rl5/done.json").exists()
    done = json.loads((o / "rl6/done.json").read_text())
    assert done["stage"] == "rl6" and done["script"] == "rl.py" and done["commands"]
    # a pause (rl_pause_at) is such a stop, logged and said as one
    mark = f"import json, pathlib; pathlib.Path({str(o / 'rl2' / rundir.DEADLINE_MARKER)!r}).write_text(json.dumps({{'why': 'pause'}}))"
    with pytest.raises(SystemExit) as e:
        cm.run_stage(ctx, "rl2", [cm.Cmd(["python", "-c", mark + "; raise SystemExit(1)"])], needs=[])
    assert e.value.code == 75 and json.loads((o / "rl2" / rundir.CALLS_LOG).read_text().splitlines()[-1])["why"] == "pause"
    # the experts one command finished: rl_cmd prints that command again (run_stage's comparison), others alone
    c2 = profiles.apply_overrides(c, ["model=M"])
    (o / "rl4").mkdir()
    (o / "rl1/done.json").write_text(json.dumps({"commands": [str(cm.rl_cmd(c2, o, "M", [1, 2]))]}))
    assert cm.joint_experts(o, 1) == [1, 2] and cm.joint_experts(o, 0) == 0
    assert str(cm.rl_cmd(c2, o, "M", cm.joint_experts(o, 1))) == json.loads((o / "rl1/done.json").read_text())["commands"][0]


def test_only_needs_upstream_stages(tmp_path):
    with pytest.raises(SystemExit) as e:
        cm.main(["run", "--profile", "smoke", "--out", str(tmp_path), "--only", "rl0", "--set", "model=tiny"])
    assert "stage rl0 needs sft0" in str(e.value)
    with pytest.raises(SystemExit) as e:
        cm.main(["run", "--out", str(tmp_path), "--only", "rl9"])
    assert "unknown stage 'rl9'" in str(e.value)


def test_eval_of_some_models_needs_only_their_stages(tmp_path, monkeypatch):
    """--set eval_models=a,b evaluates those models once their own stages are done (e.g. the SFT stages
    while RL still trains elsewhere) and leaves the eval stage open; the full eval then does the rest."""
    ran = []

    def fake(cmd, log_path):
        ran.append(cmd.argv[cmd.argv.index("--out") + 1])
        Path(cmd.done).parent.mkdir(parents=True, exist_ok=True)
        Path(cmd.done).write_text("{}")
        return 0, None, None
    monkeypatch.setattr(cm, "execute", fake)
    out = tmp_path / "run"
    for stage in ("data", "sft0"):
        (out / stage).mkdir(parents=True)
        (out / stage / "done.json").write_text("{}")
    run = lambda *a: cm.main(["run", "--out", str(out), *TINY, "--only", "eval", *a])
    assert run("--set", "eval_models=base,sft0") == 0
    assert [Path(r).name for r in ran] == ["base", "sft0"]
    assert not (out / "eval" / "done.json").exists()                    # partial: the stage stays open
    with pytest.raises(SystemExit) as e:
        run("--set", "eval_models=rl0")
    assert "stage eval needs rl0" in str(e.value)
    with pytest.raises(SystemExit) as e:
        run("--set", "eval_models=rl7")
    assert "unknown model(s) ['rl7']" in str(e.value)
    for stage in cm.STAGES[:cm.STAGES.index("eval")]:
        (out / stage).mkdir(exist_ok=True)
        (out / stage / "done.json").write_text("{}")
    ran.clear()
    assert run() == 0                                                   # all models: the other 12, then done
    assert sorted(Path(r).name for r in ran) == sorted(set(cm.model_adapters(out)) - {"base", "sft0"})
    assert (out / "eval" / "done.json").is_file()


# -----------------------------------------------------------------------------
# the whole pipeline on the tiny model

TINY = ["--profile", "smoke", "--set", "model=tiny", "--set", "train_tasks=4", "--set", "eval_tasks=",
        "--set", "sim_workers=2", "--set", "max_new_tokens=24", "--set", "test_tasks=2", "--set", "real_tasks=0"]


def fixture_corpus(folder):
    """A real-design corpus in the shared corpus's record schema: three of tests/designs, each padded with a
    header comment past design_pool's 300-token lower bound."""
    import gzip
    folder.mkdir(parents=True, exist_ok=True)
    with gzip.open(folder / "fixture.jsonl.gz", "wt") as f:
        for name, top in (("counter.sv", "counter"), ("alu.sv", "alu"), ("fsm.sv", "fsm")):
            rtl = "// " + f"fixture design {name}, padded to a realistic size. " * 20 + "\n" \
                + (ROOT / "tests/designs" / name).read_text()
            f.write(json.dumps({"id": f"fixture/{top}", "source": "library", "license": "MIT", "spec": f"The {top}.",
                                "rtl_files": {f"rtl/{name}": rtl}, "top_module": top,
                                "provenance": {"repo": "tests", "commit": "0" * 40, "path": name}}) + "\n")
    return folder


@pytest.fixture
def one_torch_thread():
    """The stage scripts in this interpreter on one torch thread, whatever earlier tests left: on a busy
    2-core box two spinning threads made the whole pipeline ~5x slower (523 s against 94 s)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.mark.slow
@pytest.mark.needs_iverilog
def test_pipeline_runs_resumes_and_redoes(tmp_path, monkeypatch, capsys, one_torch_thread):
    monkeypatch.setattr(cm, "execute", run_in_process)
    out = tmp_path / "run"
    tiny = [*TINY, "--set", "real_tasks=2", "--set", "real_val_tasks=1",
            "--set", f"real_corpus={fixture_corpus(tmp_path / 'corpus')}", "--set", "rl_joint=true",
            "--set", "eval_joint=true"]
    assert cm.main(["run", "--out", str(out), *tiny]) == 0
    text = capsys.readouterr().out
    assert "eval tasks are the synthetic validation tasks" in text        # no such eval file -> val tasks
    mix = json.loads((out / "data" / "mix.json").read_text())             # 2 real designs train, 1 validates
    assert (mix["train_real"], mix["val_real"], mix["licenses"]) == (2, 1, {"MIT": 3})
    train = [json.loads(x) for x in (out / "data" / "train_tasks.jsonl").read_text().splitlines()]
    assert sum(t["id"].startswith("fixture/") for t in train) == 2 and len(train) == mix["train_synthetic"] + 2
    for stage in cm.STAGES:
        assert (out / stage / "done.json").is_file(), stage
        record = json.loads((out / stage / "done.json").read_text())
        assert record["stage"] == stage and record["seconds"] >= 0 and record["commands"]
        if stage != "report":
            assert (out / stage / "result.json").is_file(), stage
    for name in cm.model_adapters(out):                                  # every model was evaluated
        metrics = json.loads((out / "eval" / name / "metrics.json").read_text())
        assert "direct" in metrics and "agentic" in metrics, name
        assert json.loads((out / "eval_syn" / name / "metrics.json").read_text())["num_tasks"] == 2, name
        assert json.loads((out / "eval_skill" / name / "metrics.json").read_text())["num_tasks"] == 1, name
    skill_row = json.loads((out / "data" / "skill" / "skill_tasks.jsonl").read_text())    # one synthetic skill task
    assert skill_row["skill"]["source"] == "synthetic" and skill_row["random_floor"]["random_pass"] == 0
    assert "$ python rl.py --adapter" in (out / "rl0" / "stdout.log").read_text()
    rl_cmds = [json.loads((out / f"rl{k}" / "done.json").read_text())["commands"] for k in range(3)]
    assert rl_cmds[0] == rl_cmds[1] == rl_cmds[2] and len(rl_cmds[0]) == 1     # rl_joint: one process, three experts
    assert rl_cmds[0][0].count(" --out ") == 1 and all(f"{cm.rel(out / f'rl{k}')}" in rl_cmds[0][0] for k in range(3))
    trained = [m for m in list(cm.model_adapters(out))[1:] if m not in cm.MERGES]          # the merges run alone
    for stage, names in (("val", [f"rl{k}" for k in range(3)]), ("eval", trained)):
        joint = json.loads((out / stage / "done.json").read_text())["commands"][0]       # eval_joint: one process
        assert cm.command_outs(joint) == [cm.rel(out / stage / m) for m in names], stage
        assert json.loads((out / stage / names[1] / "metrics.json").read_text())["config"]["joint"]["outs"] == \
            cm.command_outs(joint)
    md = (out / "report" / "report.md").read_text()
    assert "smoke run" in md and "oracle union of the 3 experts" in md and "OPD, gate + RL fallback" in md
    assert "How this run differs from the paper" in md
    assert all(f"{m} (rank 16) SVD rel. error" in md for m in cm.MERGES)     # adapter space: the experts' rank
    rep = json.loads((out / "report" / "report.json").read_text())
    assert rep["smoke"] and set(rep["table"]) >= {"base", "rl0", "oracle", "soup", "opd_rlfb"}
    assert set(rep["table_syn"]) >= {"base", "rl0", "oracle", "opd"} and "Held-out synthetic families" in md
    assert (out / "report" / "experts_heatmap.png").is_file() and (out / "report" / "rl0_curves.png").is_file()
    claims = json.loads((out / "report" / "claims.json").read_text())      # the four claims, on every task set
    assert set(claims) == {"eval", "eval_syn", "eval_skill"} and set(claims["eval"]["claims"]) == {"a", "b", "c", "d"}
    assert set(rep["table_skill"]) >= {"base", "rl0", "opd"} and "### The skill split (1 tasks" in md
    assert rep["claims"] == claims and "## The paper's four claims (eval tasks)" in md

    # a second run finds every done.json and runs nothing
    EXECUTED.clear()
    assert cm.main(["run", "--out", str(out), *tiny]) == 0
    assert EXECUTED == []
    text = capsys.readouterr().out
    assert text.count(": done, skipped") == len(cm.STAGES) and "its commands differ" not in text

    # --from compare redoes compare and report only
    before = {s: (out / s / "done.json").stat().st_mtime_ns for s in cm.STAGES}
    assert cm.main(["run", "--out", str(out), "--from", "compare", *tiny]) == 0
    after = {s: (out / s / "done.json").stat().st_mtime_ns for s in cm.STAGES}
    assert [s for s in cm.STAGES if before[s] != after[s]] == ["compare", "report"]
    assert [c.split()[2] for c in EXECUTED[:-1]] == ["compare"] * 6 and EXECUTED[-1].split()[1] == "report.py"


@pytest.mark.slow
@pytest.mark.needs_iverilog
def test_run_small_lanes_finish_the_pipeline(tmp_path):
    """bench/gpu/run_small.sh (the GPU box's way to run a profile in parallel lanes) on the tiny model:
    every stage completes, each model is evaluated once, and the report is written. Its PYTHON runs
    chorus_mini.py with the stage commands in the same interpreter (tests/chorus_in_process.py), each call
    forked from one process that imported the kit once (tests/zygote.py)."""
    import subprocess
    out = tmp_path / "lanes"
    python = tmp_path / "python"
    sock = tmp_path / "zygote.sock"
    python.write_text(f"#!/bin/sh\nexec {sys.executable} {ROOT / 'tests/zygote.py'} call {sock} \"$@\"\n")
    python.chmod(0o755)
    # one torch thread per process: five lanes share the cores, and torch's spinning threads would fight over
    # them (the three OPD stages side by side took ~4 min each instead of ~5 s)
    env = {**os.environ, "PROFILE": "smoke", "PYTHON": str(python), "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    # the ~28 chorus_mini calls fork from one process that imported the kit once (tests/zygote.py)
    server = subprocess.Popen([sys.executable, str(ROOT / "tests/zygote.py"), "serve", str(sock)], env=env,
                              stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert server.stdout.readline().startswith("zygote: serving"), "the fork server did not start"
        sets = [a for a in TINY[2:] if a != "--set"]
        argv = ["bash", str(ROOT / "bench/gpu/run_small.sh"), str(out)] + [x for s in sets for x in ("--set", s)]
        p = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=1500)
    finally:   # the server and any child still running (its process group)
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    assert "run_small: done" in p.stdout and not (out / "lanes" / "FAILED").exists()
    for stage in cm.STAGES:
        assert (out / stage / "done.json").is_file(), stage
    import re
    log = (out / "eval" / "stdout.log").read_text()
    for name in cm.model_adapters(out):
        assert (out / "eval" / name / "metrics.json").is_file() and (out / "eval_syn" / name / "metrics.json").is_file()
        runs = re.findall(rf"^\$ python evaluate.py eval .*--out \S*/eval/{name} ", log, flags=re.M)
        assert len(runs) == 1, name                                        # each model evaluated once
    assert (out / "report" / "report.md").is_file()


def test_select_tasks_tuning_and_report_splits_are_disjoint(tmp_path):
    """select-tasks --split tuning takes evaluate's fixed tuning split (by id hash), all that fit without
    --limit; the reporting subset never shares a task with it."""
    import evaluate
    rtl = "module m(input a, output b); assign b = a; endmodule"
    tasks = [{"id": f"dev/{i}", "rtl_files": [{"name": "m.v", "content": rtl}], "dut_module_name": "m",
              "dut_instance_name": "uut"} for i in range(60)]
    src = tmp_path / "dev.jsonl"
    src.write_text("".join(json.dumps(t) + "\n" for t in tasks))
    assert cm.main(["select-tasks", "--tasks", str(src), "--split", "tuning", "--max-chars", "1000",
                    "--out", str(tmp_path / "tune.jsonl")]) == 0
    cm.select_tasks(src, 10, 1000, tmp_path / "report.jsonl")
    tune = [json.loads(x)["id"] for x in (tmp_path / "tune.jsonl").read_text().splitlines()]
    report = [json.loads(x)["id"] for x in (tmp_path / "report.jsonl").read_text().splitlines()]
    expected = {t["id"] for t in tasks if evaluate.split_of(t["id"]) == "tuning"}
    assert set(tune) == expected and 8 < len(tune) < 30 and len(report) == 10 and not set(tune) & set(report)


def test_merge_lambdas_are_chosen_on_the_tuning_tasks(tmp_path):
    """merge_lams: every method merged at each lambda and scored on the tuning tasks, then pick-merge keeps the
    best (Pass@1, then Cov@1, then the lambda nearest 1) in merge/NAME; both DARE-TIES forms are merges."""
    o = tmp_path
    c = profiles.apply_overrides(profiles.PROFILES["smoke"], ["merge_lams=[0.5, 1.0, 1.5]", "tune_n=2"])
    cmds = [[str(x) for x in cmd.argv] for cmd in cm.merge_cmds(c, o, "M")]
    merges = [a for a in cmds if a[1] == "merge.py" and "--rescale" not in a]
    assert len(merges) == len(cm.MERGES) == 5                    # one merge per method, at lambda 1
    mean = next(a for a in merges if "dare_ties_mean_lam1" in " ".join(a))
    assert mean[mean.index("--dare-norm") + 1] == "mean" and mean[mean.index("--lam") + 1] == "1.0"
    rescales = [a for a in cmds if "--rescale" in a]               # the other lambdas scale it, after it
    assert sorted((a[a.index("--rescale") + 1].rsplit("/", 1)[1], a[a.index("--lam") + 1]) for a in rescales
                  if "soup" in a[a.index("--out") + 1]) == [("soup_lam1", "0.5"), ("soup_lam1", "1.5")]
    assert len(rescales) == 10 and all(cmds.index(a) > cmds.index(next(
        m for m in merges if m[m.index("--out") + 1] == a[a.index("--rescale") + 1])) for a in rescales)
    evals = [a for a in cmds if "eval" in a and "--tasks" in a]
    assert len(evals) == 15 and all(a[a.index("--rounds") + 1] == "0" and a[a.index("--n") + 1] == "2" for a in evals)
    assert all(a[a.index("--tasks") + 1] == str(cm.rel(cm.tune_tasks(c, o))) for a in evals)
    picks = [a for a in cmds if "pick-merge" in a]
    assert len(picks) == 5 and cmds.index(picks[0]) == 6          # after soup's 3 merges and 3 scores
    # pick-merge on three fake candidates: 1.5 and 0.5 tie on Pass@1; 0.5 has the higher Cov@1
    for lam, p1, cov in ((0.5, 40.0, 60.0), (1.0, 30.0, 70.0), (1.5, 40.0, 50.0)):
        cand = o / "merge" / "tune" / f"soup_lam{lam:g}"
        (cand / "tune_eval").mkdir(parents=True)
        (cand / "merge_report.json").write_text(json.dumps({"params": {"lam": lam}}))
        (cand / "adapter_model.safetensors").write_text(f"weights {lam}")
        (cand / "done.json").write_text("{}")
        (cand / "tune_eval" / "metrics.json").write_text(json.dumps({"direct": {"pass@1": p1, "cov@1": cov, "tasks": 3}}))
    cands = [o / "merge" / "tune" / f"soup_lam{lam:g}" for lam in (0.5, 1.0, 1.5)]
    assert cm.main(["pick-merge", "--out", str(o / "merge" / "soup"), "--candidates", *map(str, cands)]) == 0
    choice = json.loads((o / "merge" / "soup" / "choice.json").read_text())
    assert choice["chosen"]["lam"] == 0.5 and len(choice["candidates"]) == 3
    assert (o / "merge" / "soup" / "adapter_model.safetensors").read_text() == "weights 0.5"
    assert not (o / "merge" / "soup" / "tune_eval").exists() and not (o / "merge" / "soup" / "done.json").exists()
    c0 = profiles.apply_overrides(profiles.PROFILES["smoke"], ["merge_lams=[0.0, 0.5]"])     # no 1: merged at 0.5, 0 rescales it
    a0 = [[str(x) for x in cmd.argv] for cmd in cm.merge_cmds(c0, o, "M")]
    soup0 = [a for a in a0 if a[1] == "merge.py" and "soup" in " ".join(a)]
    assert soup0[0][soup0[0].index("--lam") + 1] == "0.5" and "--rescale" in soup0[1]
    assert soup0[1][soup0[1].index("--lam") + 1] == "0.0"
    with pytest.raises(SystemExit, match="no non-zero lambda"):
        cm.merge_cmds(profiles.apply_overrides(profiles.PROFILES["smoke"], ["merge_lams=[0.0, 0.0]"]), o, "M")
    c1 = profiles.apply_overrides(profiles.PROFILES["smoke"], ["merge_lams=[1.0]"])           # one lambda: no tuning
    assert all("pick-merge" not in [str(x) for x in cmd.argv] for cmd in cm.merge_cmds(c1, o, "M"))
    assert profiles.PROFILES["small"]["merge_lams"] == [0.5, 1.0, 1.5]
    # the small profile merges at SmolLM2's full rank (exact); the soup never takes --rank: its exact form is
    # the concatenation of the experts' factors (rank 48), which an SVD at --rank 576 would only pad with zeros
    small = {a[a.index("--out") + 1].rsplit("/", 1)[1]: a for a in
             ([str(x) for x in cmd.argv] for cmd in cm.merge_cmds(profiles.PROFILES["small"], o, "M"))
             if a[1] == "merge.py" and "--rescale" not in a}
    assert "--rank" not in small["soup_lam1"] and len(small) == 5
    assert all(a[a.index("--rank") + 1] == "576" for k, a in small.items() if k != "soup_lam1")


def test_a_run_folder_older_than_tune_source_dev_is_a_clear_error(tmp_path):
    """tune_source=dev on a run whose data stage is done but made no tuning tasks: one line saying how to
    make them, before any training stage runs."""
    o = tmp_path / "run"
    (o / "data").mkdir(parents=True)
    (o / "data" / "done.json").write_text("{}")
    (tmp_path / "dev.jsonl").write_text("")
    with pytest.raises(SystemExit, match="tuning_tasks.jsonl is missing: this run's data stage predates"):
        cm.main(["run", "--out", str(o), "--profile", "smoke", "--set", "tune_source=dev",
                 "--set", f"eval_tasks={tmp_path / 'dev.jsonl'}", "--only", "sft0"])
    with pytest.raises(SystemExit) as e:                 # eval never reads the tuning tasks: no such error
        cm.main(["run", "--out", str(o), "--profile", "smoke", "--set", "tune_source=dev",
                 "--set", f"eval_tasks={tmp_path / 'dev.jsonl'}", "--only", "eval"])
    assert "tuning_tasks" not in str(e.value) and "stage eval needs" in str(e.value)


def test_eval_baselines_are_evaluated_beside_the_models(tmp_path):
    """The small profiles evaluate random stimulus and the template teacher as models of their own (evaluate.py
    --model random | teacher:LEVEL, no adapter), in eval/random and eval/teacher_strong; a bad name is one line."""
    c = profiles.PROFILES["small"]
    assert cm.baselines(c) == {"random": "random", "teacher_strong": "teacher:strong"}
    assert cm.baselines(profiles.PROFILES["smoke"]) == {}
    cmd = cm.eval_cmd(c, tmp_path, "random", None, tmp_path / "t.jsonl", tmp_path / "eval" / "random", 5, 3)
    argv = cmd.argv
    assert argv[argv.index("--model") + 1] == "random" and "--adapter" not in argv
    with pytest.raises(SystemExit, match="unknown baseline"):
        cm.baselines(profiles.apply_overrides(c, ["eval_baselines=random,teacher:"]))


def test_train_val_source_skill_validates_sft_rl_and_opd_on_the_skill_val_tasks(tmp_path):
    """train_val_source=skill (small3): SFT's pick, RL's plateau and OPD's best are validated on the skill
    validation tasks; tune (the default) keeps the tuning tasks; skill without skill_val_tasks is one line."""
    o = tmp_path
    value = lambda cmd, flag: str(cmd.argv[cmd.argv.index(flag) + 1])
    small3 = profiles.PROFILES["small3"]
    skill = str(cm.rel(o / "data/skill_val/skill_tasks.jsonl"))
    for cmd in (cm.sft_cmd(small3, o, "M", "data/stage0.jsonl"), cm.rl_cmd(small3, o, "M", 1),
                cm.opd_cmd(small3, o, "M", "opd")):
        assert value(cmd, "--val-tasks") == skill and value(cmd, "--val-n") == "2"
    hot = profiles.apply_overrides(small3, ["rl_temperature=1.2"])
    assert value(cm.rl_cmd(hot, o, "M", 0), "--temperature") == value(cm.opd_cmd(hot, o, "M", "opd"), "--temperature") == "1.2"
    tune = profiles.apply_overrides(small3, ["train_val_source=tune"])
    assert value(cm.rl_cmd(tune, o, "M", 0), "--val-tasks") == str(cm.rel(cm.tune_tasks(tune, o)))    # tuning or val
    assert value(cm.rl_cmd(tune, o, "M", 0), "--val-tasks") != skill
    assert profiles.PROFILES["small"]["train_val_source"] == "tune"
    with pytest.raises(SystemExit, match="skill_val_tasks > 0"):
        cm.rl_cmd(profiles.apply_overrides(small3, ["skill_val_tasks=0"]), o, "M", 0)
    with pytest.raises(SystemExit, match="train_val_source"):
        profiles.apply_overrides(small3, ["train_val_source=dev"])
    with pytest.raises(SystemExit, match="skill_val_tasks > 0"):       # refused before the data stage runs
        cm.main(["run", "--profile", "small3", "--set", "skill_val_tasks=0", "--out", str(o / "run"), "--only", "data"])
    assert not (o / "run" / "data").exists()


def test_skill_training_tasks_feed_sft_and_make_most_of_the_rl_prompts(tmp_path):
    """skill_train_tasks > 0: the data stage builds fresh skill-family instances and skill-mix writes sft_tasks
    (every training task + the skill ones) and rl_tasks (the skill ones + easy_share others); build_sft, rl.py and
    distill.py read them. 0 (the default): train_tasks.jsonl everywhere, as before."""
    o = tmp_path
    argv = lambda cmd: [str(x) for x in cmd.argv]
    value = lambda args, flag: args[args.index(flag) + 1]
    base = profiles.PROFILES["smoke"]
    assert base["skill_train_tasks"] == 0
    train = str(cm.rel(o / "data/train_tasks.jsonl"))
    assert value(argv(cm.rl_cmd(base, o, "M", 0)), "--tasks") == train
    assert value(argv(cm.opd_cmd(base, o, "M", "opd")), "--tasks") == train
    on = profiles.apply_overrides(base, ["skill_train_tasks=8", "rl_easy_share=0.25"])
    assert value(argv(cm.rl_cmd(on, o, "M", 2)), "--tasks") == str(cm.rel(o / "data/rl_tasks.jsonl"))
    assert value(argv(cm.opd_cmd(on, o, "M", "opd")), "--tasks") == str(cm.rel(o / "data/rl_tasks.jsonl"))
    data = [argv(c) for c in cm.data_cmds(on, o, o / "m")]
    (skill,) = [a for a in data if a[1] == "data/skill.py" and str(cm.rel(o / "data/skill_train")) in a]
    assert value(skill, "--synthetic") == "8" and value(skill, "--seed") == str(on["seed"] + 3000)
    assert value(data[-1], "--tasks") == str(cm.rel(o / "data/sft_tasks.jsonl"))     # build_sft comes last
    assert value(argv(cm.data2_cmd(on, o, "M")), "--tasks") == str(cm.rel(o / "data/sft_tasks.jsonl"))
    with pytest.raises(SystemExit, match="rl_easy_share"):
        profiles.apply_overrides(base, ["rl_easy_share=1"])
    assert "--reward" not in argv(cm.rl_cmd(on, o, "M", 0))           # the paper's reward by default
    over = profiles.apply_overrides(on, ["rl_reward=over_random"])
    floor_file = str(cm.rel(o / "data/rl_floor.json"))
    for cmd in (cm.rl_cmd(over, o, "M", 0), cm.opd_cmd(over, o, "M", "opd_rlfb")):
        assert value(argv(cmd), "--reward") == "over_random" and value(argv(cmd), "--floor") == floor_file
    (fl,) = [argv(c) for c in cm.data_cmds(over, o, o / "m") if argv(c)[1] == "data/floor.py"]
    assert fl[2] == str(cm.rel(o / "data/rl_tasks.jsonl")) and value(fl, "--out") == floor_file

    d = tmp_path / "data"
    (d / "skill_train").mkdir(parents=True)
    (d / "skill").mkdir()
    task = lambda i: {"id": i, "rtl_files": [{"name": "d.sv", "content": "module d(input a); endmodule"}],
                      "spec_files": [], "dut_module_name": "d", "dut_instance_name": "uut", "instruction": "",
                      "targets": [{"inst_name": "uut", "metric": "overall_average", "target_percentage": 90.0}]}
    write = lambda path, ids: path.write_text("".join(json.dumps(task(i)) + "\n" for i in ids))
    write(d / "train_tasks.jsonl", [f"easy{i}" for i in range(20)])
    write(d / "skill_train" / "skill_tasks.jsonl", [f"skill_lock_{i}" for i in range(4)])
    write(d / "skill" / "skill_train.jsonl", ["pool_a", "pool_b"])
    counts = cm.skill_mix(d, 0.25, seed=1)
    assert counts == {"sft_tasks": 26, "rl_tasks": 8, "rl_skill_synthetic": 4, "rl_skill_real": 2, "rl_easy": 2,
                      "rl_easy_share": 0.25}
    rl = [json.loads(line)["id"] for line in (d / "rl_tasks.jsonl").read_text().splitlines()]
    assert {"pool_a", "pool_b", "skill_lock_0", "skill_lock_3"} <= set(rl) and sum(i.startswith("easy") for i in rl) == 2
    assert rl == [json.loads(line)["id"] for line in (d / "rl_tasks.jsonl").read_text().splitlines()]
    cm.skill_mix(d, 0.25, seed=1)                                 # seeded: the same pool again
    assert rl == [json.loads(line)["id"] for line in (d / "rl_tasks.jsonl").read_text().splitlines()]
    assert json.loads((d / "skill_mix.json").read_text())["rl_tasks"] == 8
