"""bench/grad_check.py: on CPU every attention kernel, with and without gradient checkpointing, gives the same
loss and gradient norm for the same rows (the variants it compares on a GPU differ only in the kernel)."""
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import grad_check  # noqa: E402


def test_every_variant_gives_the_same_finite_gradient_on_cpu(tmp_path):
    out = tmp_path / "gc.json"
    grad_check.main(["--tiny", "--rows", "2", "--out", str(out)])
    res = json.loads(out.read_text())
    v = res["variants"]
    assert set(v) == {k + s for k in ("default", "mask", "math", "eager") for s in ("", "+gc")}   # no cuDNN on CPU
    ref = v["default"]
    assert ref["finite"] and ref["grad_norm"] > 0 and ref["target_tokens"] > 0 and res["rows"] == 2
    for name, r in v.items():
        assert "error" not in r, name
        assert r["nonfinite_params"] == {"count": 0, "first": []}, name
        assert abs(r["loss"] - ref["loss"]) < 1e-5 and abs(r["grad_norm"] - ref["grad_norm"]) < 1e-4 * ref["grad_norm"], name
