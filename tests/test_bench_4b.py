"""Tests for bench/bench_4b.py: the --tiny run end to end on CPU (same code paths as the GPU run),
the per-case OOM handling, and the markdown table of a GPU-shaped result (OOM rows, peaks over 20 GiB).

Run: python -m pytest -q tests/test_bench_4b.py
"""
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import bench_4b  # noqa: E402

CASES = ["sft", "sft_nogc", "rollout", "dapo", "opd", "dapo_nofast", "opd_nofast", "gen_hf_b2", "gen_fast_b2"]


@pytest.mark.slow
def test_tiny_run_end_to_end(tmp_path):
    out = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_4b.py"), "--tiny", "--reps", "0",
                           "--gen-batches", "2", "--out", str(out)],
                          capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    status = {c["name"]: c["status"] for c in result["cases"]}
    assert status == {name: "ok" for name in CASES}, status
    for c in result["cases"]:
        assert c["time_s"] > 0
        if c["kind"] in ("gen", "rollout"):
            assert c["info"]["generated_tokens"] == c["tokens"]
        if c["name"].startswith(("sft", "dapo", "opd")):
            assert c["info"]["grad_norm"] > 0            # a real update happened
    m = result["model"]
    assert m["config"]["num_hidden_layers"] == 2 and m["trainable_params"] > 0
    assert m["trainable_params_with_teachers"] == m["trainable_params"]   # teachers stay frozen
    assert result["summary"]["fast_vs_hf"] > 0
    # the markdown table is printed last, and --render reproduces it from the JSON
    table = bench_4b.render_markdown(result)
    assert proc.stdout.endswith(table)
    rendered = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_4b.py"), "--render", str(out)],
                              capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert rendered.stdout == table
    sm = out.parent / "smollm2.json"                   # --render --smollm2-json adds the SmolLM2 rows beside
    sm.write_text(json.dumps({"model": "S", "rows": [{"batch": 64, "hf_tok_s": 10.0, "fast_tok_s": 400.0,
                                                       "speedup": 40.0}]}))
    rendered = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_4b.py"), "--render", str(out),
                               "--smollm2-json", str(sm)], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert "| 64 | 10 | 400 | 40.0 |" in rendered.stdout


def test_case_records_oom_and_continues():
    bench = bench_4b.Bench(torch.device("cpu"), budget_s=1e9, reps=2, warmup=1, skip={"skipped_one"})
    cleaned = []

    def boom():
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    a = bench.case("oom_one", "raises OOM", boom, on_fail=lambda: cleaned.append(1))
    b = bench.case("ok_one", "works", lambda: (time.sleep(0.01), {"grad_norm": 1.0})[1], tokens=10)
    c = bench.case("skipped_one", "not run", boom)
    d = bench.case("nan_one", "nan grad", lambda: {"grad_norm": float("nan")})
    assert a["status"] == "oom" and "Tried to allocate" in a["error"] and cleaned == [1]
    assert b["status"] == "ok" and len(b["runs"]) == 3 and b["tok_s"] > 0
    assert c["status"] == "skipped" and c["runs"] == []
    assert d["status"] == "nonfinite"


def test_markdown_of_a_gpu_result():
    def case(name, kind, status="ok", peak=None, tok_s=None, **kw):
        c = {"name": name, "kind": kind, "what": name, "status": status, "runs": [{"time_s": 1.0, "warmup": True}],
             "tokens": 100, **kw}
        if status == "ok":
            c.update(time_s=1.0, tok_s=tok_s or 100.0, peak_alloc_gib=peak - 1, peak_reserved_gib=peak,
                     resident_gib=3.5, fits_target=peak <= bench_4b.TARGET_GIB)
        return c
    result = {
        "command": "python bench/bench_4b.py", "wall_s": 300.0, "git": {"commit": "abc", "dirty": False},
        "hardware": {"gpu": "NVIDIA H200", "total_gib": 139.8, "cap_gib": 24.0, "cap_fraction": 0.17},
        "versions": {"torch": "2.11"}, "notes": ["a note"],
        "model": {"name": "Qwen3-4B shape", "source": "random", "params": 4.02e9, "quant": "nf4",
                  "lora": {"r": 16, "alpha": 32}, "trainable_params": 33e6, "load_s": 20, "resident_after_load_gib": 3.5,
                  "config": dict(bench_4b.QWEN3_4B)},
        "sizes": {"gen_prompt": 512, "gen_new_tokens": 256},
        "cases": [case("sft", "train", peak=12.0), case("dapo", "train", peak=21.5),
                  case("opd", "train", status="oom", error="CUDA out of memory", peak_reserved_at_fail_gib=23.9),
                  case("gen_hf_b64", "gen", peak=15.0, tok_s=400.0, batch=64),
                  case("gen_fast_b64", "gen", peak=18.0, tok_s=2000.0, batch=64)],
        "summary": {"train_fit": "sft yes, dapo no, opd oom", "ratio_batch": 64, "fast_vs_hf": 5.0},
        "smollm2": {"model": "SmolLM2", "dtype": "bf16", "gpu": "H200", "prompt_tokens": 300,
                    "rows": [{"batch": 64, "hf_tok_s": 1000.0, "fast_tok_s": 20000.0, "speedup": 20.0}]},
    }
    md = bench_4b.render_markdown(result)
    assert "one 24 GiB GPU" in md and "rope_theta=5000000.0" in md
    assert "| dapo |" in md and "**no**" in md                  # over the 20 GiB target
    assert "oom (reached 23.90)" in md
    assert "| 64 | 400 | 2000 | 5.0 |" in md                   # fast / HF at batch 64
    assert "| 64 | 1000 | 20000 | 20.0 |" in md                 # the SmolLM2 comparison rows
