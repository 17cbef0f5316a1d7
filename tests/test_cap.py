"""The emulated memory cap ($CHORUS_GPU_CAP_GIB, common.cap_memory), the per-stage CUDA peaks in result.json,
and bench/bench_pipeline_cap.py's JSON. CPU only: torch.cuda is faked where a GPU would answer."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import common
import onpolicy
import rundir

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import bench_pipeline_cap as capbench  # noqa: E402

G = 2**30


@pytest.fixture
def fake_h200(monkeypatch):
    """A 140 GiB card with 10 GiB reserved, 130 GiB free; records the fraction set on it."""
    state = {"fraction": None, "reserved": 10 * G}
    props = type("P", (), {"total_memory": 140 * G, "name": "Fake H200"})()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d=None: props)
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction",
                        lambda f, d=None: state.__setitem__("fraction", f))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda d=None: state["reserved"])
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda d=None: (130 * G, 140 * G))
    monkeypatch.setattr(common, "_CAP", {"applied": False, "record": None, "mem_get_info": None})
    monkeypatch.delenv(common.GPU_CAP_ENV, raising=False)
    return state


def test_cap_from_the_environment_applies_once_and_mem_get_info_reports_it(fake_h200, monkeypatch):
    assert common.gpu_capacity_bytes() == 140 * G and onpolicy.release_fast_default(None) is False
    monkeypatch.setattr(common, "_CAP", {"applied": False, "record": None, "mem_get_info": None})
    monkeypatch.setenv(common.GPU_CAP_ENV, "24")
    assert common.pick_device() == "cuda"
    assert fake_h200["fraction"] == pytest.approx(24 / 140)
    free, total = torch.cuda.mem_get_info()
    assert total == 24 * G and free == 14 * G                 # the cap less the 10 GiB reserved
    fake_h200["reserved"] = 30 * G
    assert torch.cuda.mem_get_info()[0] == 0                  # never negative
    fake_h200["fraction"] = None
    common.apply_gpu_cap()                                    # once: the second call changes nothing
    assert fake_h200["fraction"] is None
    assert common.gpu_capacity_bytes() == 24 * G
    assert onpolicy.release_fast_default(None) is True        # a 24 GiB card releases the decoder's state
    assert onpolicy.release_fast_default(False) is False


def test_a_second_cap_replaces_the_first(fake_h200):
    common.cap_memory(24)
    common.cap_memory(16)                                     # not stacked on the 24 GiB one
    assert torch.cuda.mem_get_info() == (6 * G, 16 * G)


def test_a_bad_cap_value_is_a_clear_error(fake_h200, monkeypatch):
    monkeypatch.setenv(common.GPU_CAP_ENV, "24GB")
    with pytest.raises(ValueError, match="CHORUS_GPU_CAP_GIB='24GB'"):
        common.apply_gpu_cap()
    monkeypatch.setattr(common, "_CAP", {"applied": False, "record": None, "mem_get_info": None})
    monkeypatch.setenv(common.GPU_CAP_ENV, "0")               # 0 = the real card
    assert common.apply_gpu_cap() is None and fake_h200["fraction"] is None


def test_result_json_has_the_gpu_peak_field(tmp_path):
    """On CPU the peak is null (no CUDA was used); a caller's own value is kept."""
    assert common.gpu_peak() is None or torch.cuda.is_initialized()
    res = rundir.write_result(tmp_path, {}, {"rows": 3}, {"ok": True})
    on_disk = json.loads((tmp_path / "result.json").read_text())
    assert on_disk["setup"] == {"rows": 3, "gpu_peak": None} == res["setup"]
    rundir.write_result(tmp_path, {}, {"gpu_peak": {"max_memory_reserved_gib": 1.5}}, {})
    assert json.loads((tmp_path / "result.json").read_text())["setup"]["gpu_peak"]["max_memory_reserved_gib"] == 1.5


def _peak(r, a):
    return {"gpu_peak": {"max_memory_reserved_gib": r, "max_memory_allocated_gib": a, "cap_gib": 24}}


def test_collect_reads_every_stage_seconds_and_the_largest_peak(tmp_path):
    import chorus_mini
    run = tmp_path / "run"
    for i, s in enumerate(chorus_mini.STAGES[:-1]):          # report missing
        (run / s).mkdir(parents=True)
        (run / s / "done.json").write_text(json.dumps({"seconds": 10.0 + i, "gpu_mem_peak_mib": 100 + i}))
        (run / s / "result.json").write_text(json.dumps({"setup": {"gpu_peak": None}}))
    (run / "sft0" / "result.json").write_text(json.dumps({"setup": _peak(7.5, 6.25)}))
    for k, (r, a) in enumerate(((3.0, 2.0), (5.5, 1.0), (4.0, 3.5))):      # val: three eval processes
        (run / "val" / f"rl{k}").mkdir()
        (run / "val" / f"rl{k}" / "result.json").write_text(json.dumps({"setup": _peak(r, a)}))
    rec = capbench.collect(run, chorus_mini.STAGES, 24)
    st = rec["stages"]
    assert list(st) == chorus_mini.STAGES
    assert st["sft0"]["seconds"] == 11.0 and st["sft0"]["peak_reserved_gib"] == 7.5
    assert st["val"]["peak_reserved_gib"] == 5.5 and st["val"]["peak_allocated_gib"] == 3.5
    assert len(st["val"]["processes"]) == 3
    assert st["data"]["peak_reserved_gib"] is None and st["data"]["nvidia_smi_peak_mib"] == 100
    assert st["report"]["status"] == "missing" and st["report"]["seconds"] is None
    assert not rec["all_done"] and rec["max_peak_reserved_gib"] == 7.5 and rec["fits_cap"] is True
    assert rec["seconds_total"] == sum(10.0 + i for i in range(len(chorus_mini.STAGES) - 1))
    assert st["sft0"]["log_tail"] is None                   # a finished stage keeps no log


def test_a_stage_that_did_not_finish_keeps_the_end_of_its_log(tmp_path):
    stage = tmp_path / "merge"
    stage.mkdir()
    (stage / "stdout.log").write_text("".join(f"line {i}\n" for i in range(40)) + "MergeError: boom\n")
    rec = capbench.stage_record(stage)
    assert rec["status"] == "partial"
    assert rec["log_tail"][-1] == "MergeError: boom" and len(rec["log_tail"]) == capbench.LOG_TAIL


def test_collect_counts_training_steps_whose_gradient_was_not_finite(tmp_path):
    """The 9fba6bc cap run's 4b SFT steps were all skipped (a finite loss, a NaN gradient) and the table did not say so."""
    (tmp_path / "sft0").mkdir()
    (tmp_path / "sft0" / "done.json").write_text(json.dumps({"seconds": 3.0}))
    (tmp_path / "sft0" / "log.jsonl").write_text("\n".join(json.dumps(r) for r in [
        {"step": 0, "val": 1}, {"step": 1, "skipped_nonfinite": 1}, {"step": 2, "skipped_nonfinite": 0},
        {"step": 3, "skipped_nonfinite": 1}]) + "\nnot json\n")
    (tmp_path / "rl0" / "ckpt").mkdir(parents=True)     # rl logs a count of mini-batches per step
    (tmp_path / "rl0" / "log.jsonl").write_text(json.dumps({"step": 1, "skipped_nonfinite": 0}) + "\n")
    rec = capbench.collect(tmp_path, ["sft0", "rl0", "merge"], 24)
    assert (rec["stages"]["sft0"]["train_steps"], rec["stages"]["sft0"]["nonfinite_steps"]) == (3, 2)
    assert (rec["stages"]["rl0"]["train_steps"], rec["stages"]["rl0"]["nonfinite_steps"]) == (1, 0)
    assert rec["stages"]["merge"]["train_steps"] is None and rec["nonfinite_steps"] == 2
    md = capbench.render_markdown({"hardware": {"gpu": None}, "command": "c", "git": {}, "started_at": "t", "wall_s": 1,
                                   "profiles": {"4b": {"model_note": "m", "sets": [], "exit_code": 0, **rec}}})
    assert "| sft0 | done | 3.0 | - | - | - | 2 of 3 |" in md and "2 training steps had a non-finite gradient" in md


def _tiny_qwen3():
    from transformers import AutoModelForCausalLM, Qwen3Config
    cfg = Qwen3Config(hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=16, vocab_size=300, tie_word_embeddings=True)
    return AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)


def test_the_random_model_weights_are_drawn_from_the_seed_and_checked():
    a, b = _tiny_qwen3(), _tiny_qwen3()
    capbench.init_random_weights(a, std=0.02, seed=3)
    capbench.init_random_weights(b, std=0.02, seed=3)
    for (n, pa), pb in zip(a.named_parameters(), b.parameters()):
        assert torch.equal(pa, pb), n                  # the seed decides every weight, whatever init ran before
    stats = capbench.weight_stats(a.named_parameters())
    assert stats["q_norm.weight"] == {"tensors": 2, "std": 0.0, "std_min": 0.0, "std_max": 0.0, "max_abs": 1.0,
                                      "nonfinite": 0}
    assert stats["down_proj.weight"]["tensors"] == 2 and abs(stats["down_proj.weight"]["std"] - 0.02) < 0.002
    assert stats["embed_tokens.weight"]["tensors"] == 1          # the tied lm_head is the same tensor
    capbench.check_init(stats, 0.02)
    for bad in (10.0, 0.0, 1.5):         # one layer's tensor off (the kind's mean alone would hide a 2-layer mix)
        c = _tiny_qwen3()
        capbench.init_random_weights(c, std=0.02, seed=3)
        with torch.no_grad():
            c.model.layers[1].mlp.up_proj.weight.mul_(bad)
        with pytest.raises(RuntimeError, match="up_proj.weight"):
            capbench.check_init(capbench.weight_stats(c.named_parameters()), 0.02)
    with torch.no_grad():
        b.model.layers[0].self_attn.k_norm.weight[0] = float("nan")
    with pytest.raises(RuntimeError, match="k_norm.weight"):
        capbench.check_init(capbench.weight_stats(b.named_parameters()), 0.02)


def test_the_random_folder_is_built_without_an_initialiser_and_reloads_tied(tmp_path):
    """build_qwen3_4b at a tiny Qwen3 shape: every weight comes from the seed (meta device, no transformers
    initialiser), the tied lm_head stays tied through to_empty, the folder reloads equal, and a second call reuses it."""
    from transformers import AutoModelForCausalLM
    tok_dir = tmp_path / "tok"
    common.tiny_tokenizer().save_pretrained(tok_dir)
    shape = dict(hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=16, rope_theta=1e6, max_position_embeddings=256, rms_norm_eps=1e-6,
                 tie_word_embeddings=True, hidden_act="silu", attention_bias=False)
    info = capbench.build_qwen3_4b(tmp_path / "m", str(tok_dir), seed=5, shape=shape)
    assert info["built"] and info["params"] > 0
    m = AutoModelForCausalLM.from_pretrained(tmp_path / "m", dtype=torch.bfloat16)
    assert m.lm_head.weight.data_ptr() == m.model.embed_tokens.weight.data_ptr()
    ref = _tiny_qwen3_like(shape, len(common.tiny_tokenizer()))
    capbench.init_random_weights(ref, std=0.02, seed=5)
    for (n, a), b in zip(ref.named_parameters(), m.parameters()):
        assert torch.equal(a, b), n              # the same draw as the seed gives any model of that shape
    built = json.loads((tmp_path / "m" / "build.json").read_text())
    assert built["weights"]["q_proj.weight"]["nonfinite"] == 0 and built["weights"]["norm.weight"]["max_abs"] == 1.0
    again = capbench.build_qwen3_4b(tmp_path / "m", str(tok_dir), seed=5, shape=shape)
    assert again["built"] is False and again["first_build_s"] == info["build_s"]   # the time the folder took, kept


def _tiny_qwen3_like(shape, vocab):
    from transformers import AutoModelForCausalLM, Qwen3Config
    cfg = Qwen3Config(vocab_size=vocab, **{k: v for k, v in shape.items() if k not in ("rope_theta", "max_position_embeddings")})
    return AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)


def test_the_4b_profile_builds_its_random_model_from_the_small_model_tokenizer(tmp_path, monkeypatch):
    """main's 4b branch (no --model-4b): the random folder is built (or reused) in OUT/qwen3_4b_random with the
    tokenizer of --model-small, and that folder is the model the profile runs with (stages not run here)."""
    calls, argvs = [], []
    monkeypatch.setattr(capbench, "build_qwen3_4b", lambda folder, tok: calls.append((folder, tok)) or {"built": True})
    monkeypatch.setattr(capbench, "run_profile", lambda argv, log, console=True: argvs.append(argv) or (lambda: 0))
    small = tmp_path / "smol_hf"
    small.mkdir()
    out = tmp_path / "cb"
    assert capbench.main(["--profiles", "4b", "--model-small", str(small), "--out", str(out), "--json",
                          str(tmp_path / "r.json"), "--cap-gib", "0"]) == 0
    assert calls == [(str(out / "qwen3_4b_random"), str(small))]
    argv = argvs[0]
    assert argv[argv.index("--profile") + 1] == "4b" and f"model={out / 'qwen3_4b_random'}" in argv


def test_budget_sets_are_valid_profile_overrides():
    import profiles
    args = capbench.parse_args(["--eval-tasks", "x.jsonl", "--set", "sim_workers=3"])
    for profile in ("4b", "small"):
        sets = capbench.budget_sets(profile, args)
        c = profiles.apply_overrides(profiles.PROFILES[profile], sets)   # unknown keys / types exit
        assert c["real_corpus"] == "" and c["real_tasks"] == 0 and c["test_tasks"] == 0 and c["sim_workers"] == 3
        assert c["max_new_tokens"] == 64 and c["rl_steps"] == 2 and c["eval_tasks"].endswith("x.jsonl")
    assert profiles.apply_overrides(profiles.PROFILES["small"], capbench.budget_sets("small", args))["sft_limit"] == 16


def test_cpu_smoke_writes_every_stage_with_seconds_and_peak_fields(tmp_path):
    """The data stage alone on CPU (~20 s): the JSON lists every stage, the one that ran with its seconds
    and null peaks (no CUDA), the rest as missing; --render prints its table."""
    out = tmp_path / "json" / "cap.json"
    out.parent.mkdir()           # an earlier command's profile: kept, with the command that measured it
    out.write_text(json.dumps({"bench": "bench_pipeline_cap", "command": "earlier", "git": {"commit": "abc"},
                               "started_at": "t", "profiles": {"small": {
                                   "model_note": "m", "sets": [], "all_done": True, "seconds_total": 1.0,
                                   "max_peak_reserved_gib": 2.0, "stages": {}}}}))
    r = subprocess.run([sys.executable, "bench/bench_pipeline_cap.py", "--cpu-smoke", "--stages", "data",
                        "--out", str(tmp_path / "runs"), "--json", str(out)], cwd=ROOT, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    res = json.loads(out.read_text())
    p = res["profiles"]["smoke"]
    import chorus_mini
    assert list(p["stages"]) == chorus_mini.STAGES
    for s, rec in p["stages"].items():
        assert {"seconds", "peak_reserved_gib", "peak_allocated_gib", "status"} <= set(rec), s
    assert p["stages"]["data"]["status"] == "done" and p["stages"]["data"]["seconds"] > 0
    assert p["stages"]["data"]["peak_reserved_gib"] is None and res["hardware"]["gpu"] is None
    assert p["stages"]["sft0"]["status"] == "missing" and p["exit_code"] == 0
    assert p["run"]["command"] == res["command"] != "earlier"
    assert res["profiles"]["small"]["run"]["command"] == "earlier" and res["profiles"]["small"]["run"]["git"] == {"commit": "abc"}
    md = subprocess.run([sys.executable, "bench/bench_pipeline_cap.py", "--render", str(out)], cwd=ROOT,
                        capture_output=True, text=True, timeout=60).stdout
    assert "| data | done |" in md and "CPU smoke run" in md
    assert "measured by an earlier command: `earlier`, commit abc" in md


def test_lanes_run_the_profile_through_run_small_with_its_own_simulator_share():
    argv = capbench.profile_argv("4b", Path("/o/4b"), ["sim_workers=7", "rl_steps=2"], "/m", None, lanes=True)
    assert argv[:5] == ["env", "PROFILE=4b", "bash", "bench/gpu/run_small.sh", "/o/4b"]
    assert argv[5:] == ["--set", "model=/m", "--set", "rl_steps=2"]
    plain = capbench.profile_argv("4b", Path("/o/4b"), ["sim_workers=7"], None, ["data"])
    assert plain[1:] == ["chorus_mini.py", "run", "--profile", "4b", "--out", "/o/4b", "--set", "sim_workers=7",
                         "--only", "data"]


def test_without_a_cap_the_budget_is_a_share_of_the_memory_free_at_start(fake_h200, monkeypatch):
    """Processes sharing a GPU each keep to their share of what was free when they started (130 GiB free +
    10 GiB this process already reserved): the budget is fixed once and reported in result.json's peak."""
    monkeypatch.setenv(common.GPU_SHARE_ENV, "1/4")
    record = common.apply_gpu_cap()
    assert record["cap_gib"] == pytest.approx(35) and fake_h200["fraction"] == pytest.approx(35 / 140)
    assert record["budget_from"] == "1/4 of the free memory at start"
    assert torch.cuda.mem_get_info()[1] == 35 * G
    for bad in ("0", "1.5", "x", "1/0"):
        with pytest.raises(ValueError, match="GPU share"):
            common.parse_share(bad)
    assert common.parse_share("0.5") == 0.5


def test_gpu_mem_flag_sets_the_cap_for_this_process_and_its_children(monkeypatch):
    import argparse
    monkeypatch.delenv(common.GPU_CAP_ENV, raising=False)
    p = argparse.ArgumentParser()
    common.add_gpu_mem_arg(p)
    assert p.parse_args(["--gpu-mem-gib", "10"]).gpu_mem_gib == 10
    assert __import__("os").environ[common.GPU_CAP_ENV] == "10"
    with pytest.raises(SystemExit):
        p.parse_args(["--gpu-mem-gib", "0"])
    with pytest.raises(SystemExit, match="above 0"):
        common.set_gpu_mem(-1)


def test_full_keeps_the_profile_budgets_and_sums_every_stage():
    """--full (the speedrun): no tiny budgets, only what the command line names; the heading carries total_s."""
    import profiles
    args = capbench.parse_args(["--full", "--eval-tasks", "x.jsonl", "--set", "rl_steps=7"])
    sets = capbench.budget_sets("small", args)
    assert sets == [f"eval_tasks={Path('x.jsonl').resolve()}", "rl_steps=7"]
    c = profiles.apply_overrides(profiles.PROFILES["small"], sets)
    assert c["max_new_tokens"] == profiles.PROFILES["small"]["max_new_tokens"] and c["rl_steps"] == 7
    assert capbench.budget_sets("small", capbench.parse_args(["--full"])) == []
    stage = {"status": "done", "seconds": 4.0, "peak_reserved_gib": None, "peak_allocated_gib": None,
             "nvidia_smi_peak_mib": None}
    md = capbench.render_markdown({"hardware": {"gpu": "H200", "cap_gib": None}, "command": "c", "git": {}, "full": True,
                                   "started_at": "t", "wall_s": 9, "total_s": 8.0, "profiles": {"small": {
                                       "model_note": "m", "sets": [], "exit_code": 0, "all_done": True, "seconds_total": 8.0,
                                       "max_peak_reserved_gib": None, "stages": {"sft0": stage, "rl0": stage}}}})
    assert md.startswith("## `run` at the profiles' own budgets: every stage's time, 8.0 s in all\n")
    assert "| rl0 | done | 4.0 |" in md
