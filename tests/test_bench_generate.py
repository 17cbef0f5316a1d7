"""Tests for the generation benchmarks: bench/bench_generate.py and bench/profile_decode.py on the tiny
model (CPU; the same code paths as the GPU runs, without CUDA graphs).

Run: python -m pytest -q tests/test_bench_generate.py
"""
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(*args, check=True):
    """stdout of a script run that must exit 0; check=False: stdout + stderr of a run that must fail."""
    proc = subprocess.run([sys.executable, *map(str, args)], capture_output=True, text=True, timeout=600, cwd=ROOT)
    if not check:
        assert proc.returncode != 0
        return proc.stdout + proc.stderr
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return proc.stdout


def test_bench_generate_tiny(tmp_path):
    out = tmp_path / "gen.json"
    run(ROOT / "bench" / "bench_generate.py", "--tiny", "--batches", "1,3", "--new-tokens", "8", "--out", out)
    r = json.loads(out.read_text())
    assert [row["batch"] for row in r["rows"]] == [1, 3]
    assert all(row["fast_tok_s"] > 0 and row["hf_tok_s"] > 0 for row in r["rows"])
    assert r["greedy_agreement"] == [8, 8, 8, 8]              # fp32 on CPU: the two paths agree fully
    assert set(r["git"]) == {"commit", "dirty"}                 # which code ran is recorded
    assert r["fused_small"] is False and r["fused_small_ran"] is False


def test_bench_generate_teachers_tiny(tmp_path):
    """--teachers: the same rows one adapter at a time and stacked in one call, each timed, each keeping the same
    tokens per row (the same stop lengths); bad input is one line."""
    out = tmp_path / "teachers.json"
    run(ROOT / "bench" / "bench_generate.py", "--tiny", "--lora-r", "4", "--teachers", "2", "--rl-prompts", "2",
        "--rl-group", "2", "--rl-cap", "12", "--rl-min", "60", "--rl-max", "90", "--rl-calls", "2",
        "--temperature", "0", "--out", out)
    r = json.loads(out.read_text())
    assert r["mode"] == "teachers" and r["teachers"] == 2
    assert [(c["mode"], c["call"], c["rows"]) for c in r["calls"]] == [
        ("one_at_a_time", 0, 8), ("one_at_a_time", 1, 8), ("stacked", 0, 8), ("stacked", 1, 8)]
    by_mode = {m: [c["new_tokens"] for c in r["calls"] if c["mode"] == m] for m in ("one_at_a_time", "stacked")}
    assert by_mode["one_at_a_time"] == by_mode["stacked"]
    assert r["speedup"] > 0 and set(r["steady_s_per_round"]) == {"one_at_a_time", "stacked"}
    assert r["greedy_agreement"] == [12] * 8                   # fp32 on CPU: every stacked row as its own call
    assert run(ROOT / "bench" / "bench_generate.py", "--tiny", "--lora-r", "0", "--teachers", "2",
               check=False).splitlines()[-1].endswith("--teachers needs --lora-r > 0 (the teachers are LoRA "
                                                      "adapters beside the active one)")


def test_bench_generate_fused_lora_modes(tmp_path):
    """--fused-lora --stacked-only: the stacked call timed with the torch form and with the fused kernel's setting
    (off the GPU its probe fails, so the torch form runs and the JSON says so), the same tokens kept per row; so
    does --fused-small."""
    out = tmp_path / "fused.json"
    run(ROOT / "bench" / "bench_generate.py", "--tiny", "--lora-r", "4", "--teachers", "2", "--rl-prompts", "2",
        "--rl-group", "1", "--rl-cap", "10", "--rl-min", "60", "--rl-max", "90", "--rl-calls", "2", "--temperature",
        "0", "--stacked-only", "--fused-lora", "--fused-small", "--out", out)
    r = json.loads(out.read_text())
    assert [(c["mode"], c["call"]) for c in r["calls"]] == [("stacked", 0), ("stacked", 1), ("stacked_fused", 0),
                                                              ("stacked_fused", 1)]
    assert len({c["new_tokens"] for c in r["calls"]}) == 1 and r["speedup"] is None and r["fused_speedup"] > 0
    assert r["fused_lora_ran"] is False and set(r["steady_s_per_round"]) == {"stacked", "stacked_fused"}
    assert r["fused_small"] is True and r["fused_small_ran"] is False      # asked for; its probe fails off the GPU
    assert r["model"] == "tiny"


def test_random_shape_is_smollm2s_layers_with_the_tiny_vocabulary():
    import importlib.util
    spec = importlib.util.spec_from_file_location("bench_generate", ROOT / "bench" / "bench_generate.py")
    bg = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bg)
    model, tok = bg.random_like("smollm2")
    c = model.config
    assert (c.hidden_size, c.intermediate_size, c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads) \
        == (576, 1536, 30, 9, 3) and c.vocab_size == len(tok) < 2000
    assert 100e6 < sum(p.numel() for p in model.parameters()) < 110e6       # SmolLM2-135M without its 49k vocabulary


def test_profile_decode_tiny_and_ab(tmp_path):
    """One profile of the kit's decoder and one of a decoder loaded from another file (--decoder)."""
    out = tmp_path / "prof.json"
    text = run(ROOT / "bench" / "profile_decode.py", "--tiny", "--batch", "3", "--new-tokens", "8",
               "--repeats", "1", "--out", out)
    r = json.loads(out.read_text())
    assert r["batch"] == 3 and r["profiled_steps"] == 2 and r["decoder"] == "fastgen.py"
    assert r["step_ms"] is not None and r["prefill_s"] > 0
    assert r["launches_per_step"] > 10 and r["kernels"] and r["kernels"][0]["us_per_step"] > 0
    assert "aten::" in " ".join(k["name"] for k in r["kernels"])    # CPU: ops stand in for kernels
    assert r["fused_small"] is False and r["fused_small_ran"] is False
    assert "step" in text and f"wrote {out}" in text
    copy = tmp_path / "fastgen_copy.py"
    copy.write_text((ROOT / "fastgen.py").read_text() + "\nprint('profiling the copy of fastgen.py')\n")
    out2 = tmp_path / "prof_ab.json"
    text = run(ROOT / "bench" / "profile_decode.py", "--tiny", "--batch", "2", "--new-tokens", "4", "--repeats", "1",
        "--decoder", copy, "--out", out2)
    assert json.loads(out2.read_text())["decoder"] == str(copy)
    assert text.count("profiling the copy of fastgen.py") == 1       # that file was imported, and only it
