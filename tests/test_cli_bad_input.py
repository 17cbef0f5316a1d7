"""The command-line bad-input matrix of the scripts other than sim.py (issue 48; results/hostile.md, "CLI matrix"):
each bad input ends in one line naming the path, option or key and what is wrong, a non-zero exit and no traceback,
before any work: no done.json, build_info.json or run folder is left behind.

The scripts run in this process as their __main__ runs them (rundir.cli, and Python printing a SystemExit's
message), with the tiny model where one is needed; one test runs two of them as real subprocesses.

Run: python -m pytest -q tests/test_cli_bad_input.py
"""
import json
import subprocess
import sys

import pytest

import chorus_mini as cm
import profiles
import distill
import evaluate
import rl
import rundir
from data import build_sft
from helpers import COUNTER_RTL, ROOT

COUNTER_TASK = {"id": "c", "rtl_files": COUNTER_RTL, "dut_module_name": "counter", "dut_instance_name": "uut"}


def run_cli(prog, main, argv, capsys):
    """(exit code, stderr) of `prog argv` as its __main__ block runs it."""
    try:
        code = rundir.cli(prog, main, argv)
    except SystemExit as e:         # Python prints a string exit code on stderr and exits 1
        if isinstance(e.code, str):
            print(e.code, file=sys.stderr)
        code = 1 if isinstance(e.code, str) else e.code
    return code, capsys.readouterr().err


def assert_one_line(code, err, line):
    assert code == 1 and "Traceback" not in err
    assert line in err.splitlines(), err


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """Task files (empty, one counter task) and adapter folders that are not what --adapter needs."""
    from transformers import LlamaConfig, LlamaForCausalLM

    import common
    root = tmp_path_factory.mktemp("bad")
    (root / "empty.jsonl").write_text("")
    (root / "one.jsonl").write_text(json.dumps(COUNTER_TASK) + "\n")
    for name, text in (("empty_config", ""), ("no_peft_type", '{"r": 4}'), ("not_json", "{r: 4")):
        (root / name).mkdir()
        (root / name / "adapter_config.json").write_text(text)
    (root / "no_weights").mkdir()
    (root / "no_weights" / "adapter_config.json").write_text('{"peft_type": "LORA"}')
    tiny = dict(vocab_size=1024, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2)
    for name, shape in (("narrower", dict(hidden_size=32, num_hidden_layers=2)),   # the tiny base is 64 wide, 2 deep
                        ("deeper", dict(hidden_size=64, num_hidden_layers=3))):
        base = LlamaForCausalLM(LlamaConfig(**tiny, **shape))
        common.save_adapter(common.add_lora(base, r=4, alpha=8), str(root / name))
    (root / "plain_folder").mkdir()
    return root


def eval_argv(files, out, *more):
    return ["eval", "--tasks", str(files / "one.jsonl"), "--out", str(out), "--n", "1", "--rounds", "0", *more]


# -----------------------------------------------------------------------------
# --model and --adapter (common.load_model, common.load_adapter)

@pytest.mark.parametrize("model, why", [("/nonexistent", "no such file or folder"),
                                         ("plain_folder", "a folder without config.json, not an HF model folder"),
                                         ("one.jsonl", "a file, neither an HF model folder nor a .gguf file")])
def test_a_model_path_that_names_no_model(files, tmp_path, capsys, model, why):
    path = model if model.startswith("/") else str(files / model)
    code, err = run_cli("evaluate.py", evaluate.main, eval_argv(files, tmp_path / "out", "--model", path), capsys)
    assert_one_line(code, err, f"evaluate.py: error: model {path}: {why}")
    assert not (tmp_path / "out" / "done.json").exists()


@pytest.mark.parametrize("adapter, why", [
    ("empty_config", "{a}/adapter_config.json: empty: not a peft adapter config"),
    ("not_json", "{a}/adapter_config.json: not JSON (Expecting property name enclosed in double quotes, line 1): "
                 "not a peft adapter config"),
    ("no_peft_type", "{a}/adapter_config.json: no peft_type: not a peft adapter config"),
    ("no_weights", "adapter {a}: no adapter_model.safetensors (nor .bin) beside its config"),
    ("narrower", "adapter {a}: its weights do not fit this base model (trained on another base?): "
                 "base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight is [4, 32] in the adapter, "
                 "[4, 64] in the model"),
    ("deeper", "adapter {a}: 14 of its weights have no place in this base model "
               "(e.g. base_model.model.model.layers.2.mlp.down_proj.lora_A.weight): trained on another base?")])
def test_an_adapter_that_does_not_fit(files, tmp_path, capsys, adapter, why):
    """An empty or non-peft config, and an adapter of another base on --model: peft raised a KeyError,
    JSONDecodeError or a screenful of size mismatches; an adapter of a deeper base loaded with a warning."""
    a = files / adapter
    code, err = run_cli("evaluate.py", evaluate.main,
                        eval_argv(files, tmp_path / "out", "--model", "tiny", "--adapter", str(a)), capsys)
    assert_one_line(code, err, "evaluate.py: error: " + why.format(a=a))
    assert not (tmp_path / "out" / "done.json").exists()


# -----------------------------------------------------------------------------
# empty task files: an error, not an empty success

def test_eval_of_an_empty_task_file(files, tmp_path, capsys):
    argv = ["eval", "--tasks", str(files / "empty.jsonl"), "--out", str(tmp_path / "out"), "--model", "tiny"]
    code, err = run_cli("evaluate.py", evaluate.main, argv, capsys)
    assert_one_line(code, err, f"evaluate.py: error: --tasks {files / 'empty.jsonl'}: the file has no tasks")
    assert not (tmp_path / "out" / "done.json").exists() and not (tmp_path / "out" / "metrics.json").exists()


def test_build_sft_of_an_empty_task_file(files, tmp_path, capsys):
    argv = ["--tasks", str(files / "empty.jsonl"), "--out", str(tmp_path / "out")]
    code, err = run_cli("data/build_sft.py", build_sft.main, argv, capsys)
    assert_one_line(code, err, f"data/build_sft.py: error: --tasks {files / 'empty.jsonl'}: the file has no tasks")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("script", ["rl", "distill"])
def test_training_on_an_empty_task_file(files, tmp_path, capsys, script):
    mod = {"rl": rl, "distill": distill}[script]
    argv = ["--model", "tiny", "--tasks", str(files / "empty.jsonl"), "--out", str(tmp_path / "out"), "--steps", "1"]
    argv += ["--teachers", str(files / "deeper"), "--student", str(files / "narrower")] if script == "distill" else []
    code, err = run_cli(f"{script}.py", mod.main, argv, capsys)
    assert_one_line(code, err, f"{script}.py: error: --tasks {files / 'empty.jsonl'}: the file has no tasks")
    assert not (tmp_path / "out" / "done.json").exists()


# -----------------------------------------------------------------------------
# option ranges, refused before any work

RANGE_CASES = [
    ("rl", ["--steps", "0"], "rl.py: --steps must be at least 1, got 0"),
    ("rl", ["--group-size", "1"], "rl.py: --group-size must be at least 2, got 1"),
    ("rl", ["--temperature", "0"], "rl.py: --temperature must be above 0, got 0.0"),
    ("rl", ["--lr", "nan"], "rl.py: --lr must be above 0, got nan"),
    ("rl", ["--val-every", "0"], "rl.py: --val-every must be at least 1, got 0"),
    ("rl", ["--sim-timeout", "-1"], "rl.py: --sim-timeout must be above 0, got -1.0"),
    ("rl", ["--target-mode", "bogus"], "rl.py: --target-mode must be one of icarus, cvdp, got 'bogus'"),
    ("distill", ["--steps", "0"], "distill.py: --steps must be at least 1, got 0"),
    ("distill", ["--prompts-per-step", "0"], "distill.py: --prompts-per-step must be at least 1, got 0"),
    ("distill", ["--save-every", "0"], "distill.py: --save-every must be at least 1, got 0"),
    ("eval", ["--limit", "0"], "evaluate.py eval: --limit must be at least 1, got 0"),
    ("eval", ["--n", "0"], "evaluate.py eval: --n must be at least 1, got 0"),
    ("eval", ["--rounds", "-1"], "evaluate.py eval: --rounds must be at least 0, got -1"),
    ("eval", ["--top-p", "0"], "evaluate.py eval: --top-p must be within (0, 1], got 0.0"),
    ("eval", ["--sim-workers", "0"], "evaluate.py eval: --sim-workers must be at least 1, got 0"),
    ("build_sft", ["--synthetic", "0"], "build_sft.py: --synthetic must be at least 1, got 0"),
    ("build_sft", ["--rounds", "-1"], "build_sft.py: --rounds must be at least 0, got -1"),
    ("build_sft", ["--rounds", "0", "--stage2-model", "m"],
     "build_sft.py: --stage2-model with --rounds 0 refines nothing: give --stage2-rounds >= 1"),
    ("build_sft", ["--fail-fraction", "2"], "build_sft.py: --fail-fraction must be within 0..1, got 2.0"),
]


@pytest.mark.parametrize("script, bad, line", RANGE_CASES, ids=[" ".join([s, *b]) for s, b, _ in RANGE_CASES])
def test_an_option_out_of_range(files, tmp_path, capsys, script, bad, line):
    out = tmp_path / "out"
    tasks = ["--tasks", str(files / "one.jsonl")]
    prog, main, argv = {
        "rl": ("rl.py", rl.main, ["--model", "tiny", *tasks, "--out", str(out)]),
        "distill": ("distill.py", distill.main, ["--model", "tiny", *tasks, "--out", str(out),
                                                 "--teachers", str(files / "narrower")]),
        "eval": ("evaluate.py", evaluate.main, ["eval", "--model", "tiny", *tasks, "--out", str(out)]),
        "build_sft": ("data/build_sft.py", build_sft.main, ["--out", str(out)]
                      + (tasks if bad[0] != "--synthetic" else [])),
    }[script]
    code, err = run_cli(prog, main, argv + bad, capsys)
    assert_one_line(code, err, line)
    assert not out.exists()                 # refused before the run folder, its lock or a model


def test_as_real_commands(files, tmp_path):
    """Two rows of the matrix through `python SCRIPT`: the exit code and the whole of stderr."""
    for argv, line in [
        (["evaluate.py", *eval_argv(files, tmp_path / "e", "--model", "/nonexistent")],
         "evaluate.py: error: model /nonexistent: no such file or folder"),
        (["rl.py", "--model", "tiny", "--tasks", str(files / "one.jsonl"), "--out", str(tmp_path / "r"),
          "--steps", "0"],
         "rl.py: --steps must be at least 1, got 0")]:
        p = subprocess.run([sys.executable, *argv], cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert p.returncode == 1 and "Traceback" not in p.stderr
        assert p.stderr.strip().splitlines()[-1] == line, p.stderr
    assert not (tmp_path / "r").exists()


# -----------------------------------------------------------------------------
# chorus_mini.py run --set

@pytest.mark.parametrize("item, line", [
    ("answer_mode=bogus", "--set answer_mode=bogus: must be one of testbench, stimulus"),
    ("gpus=0", "--set gpus=0: must be at least 1"),
    ("sim_workers=-3", "--set sim_workers=-3: must be at least 1"),
    ("max_tokens_per_micro=-1", "--set max_tokens_per_micro=-1: must be 'auto' or a token count >= 0"),
    ("rl_group=1", "--set rl_group=1: must be at least 2"),
    ("merge_density=0", "--set merge_density=0: must be within (0, 1]"),
    ("tune_source=eval", "--set tune_source=eval: must be one of val, dev"),
    ("teacher_level=genius", "--set teacher_level=genius: must be one of minimal, weak, medium, strong, long"),
    ("eval_tasks=/no/such.jsonl", "--set eval_tasks=/no/such.jsonl: no such file /no/such.jsonl ('' for none)"),
    ("real_corpus=/no/such", "--set real_corpus=/no/such: no such folder /no/such ('' for none)")])
def test_run_refuses_a_bad_set_at_once(tmp_path, item, line):
    """Before: answer_mode=bogus ran the data stage for a minute, gpus=0 and sim_workers=-3 were accepted, and a
    missing eval_tasks file silently meant the synthetic validation tasks."""
    with pytest.raises(SystemExit) as e:
        cm.main(["run", "--out", str(tmp_path / "run"), "--set", item])
    assert str(e.value) == f"chorus_mini.py: {line}"
    assert not (tmp_path / "run").exists()          # no stage ran, no run_config.json


def test_every_profile_passes_its_value_checks():
    assert set(profiles.VALUE_CHECKS) <= set(profiles.PROFILES["smoke"])
    assert {"paper", "small"} == set(rl.PROFILES)   # VALUE_CHECKS["rl_profile"] names them
    for name, profile in profiles.PROFILES.items():
        for key, (ok, what) in profiles.VALUE_CHECKS.items():
            assert profile[key] is None or ok(profile[key]), (name, key, profile[key], what)
    assert profiles.apply_overrides(profiles.PROFILES["smoke"], ["max_tokens_per_micro=auto", "eval_tasks="])["eval_tasks"] == ""


def test_profiles_prints_a_profile_with_its_overrides(capsys):
    """python profiles.py NAME --set k=v: the settings run would use, as JSON; bad input is one line naming
    profiles.py."""
    assert profiles.main(["small3", "--set", "rl_temperature=0.9"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["rl_temperature"] == 0.9 and shown == {**profiles.PROFILES["small3"], "rl_temperature": 0.9}
    assert profiles.main([]) == 0 and capsys.readouterr().out.split() == sorted(profiles.PROFILES)
    for argv, line in ((["small3", "--set", "lora_r=0"], "profiles.py: --set lora_r=0: must be at least 1"),
                       (["--set", "lora_r=2"], "profiles.py: --set needs a profile name")):
        with pytest.raises(SystemExit) as e:
            profiles.main(argv)
        assert str(e.value) == line


def test_report_of_a_missing_run_folder_is_one_line(tmp_path, capsys):
    import report
    missing = tmp_path / "nope"
    code, err = run_cli("report.py", report.main, ["--out", str(missing)], capsys)
    assert_one_line(code, err, f"report.py: {missing}: no such run folder")
    assert not missing.exists()
