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


class _InfGrad(__import__("torch").autograd.Function):
    """Identity forward; the backward returns an infinite gradient (an overflow planted at one module)."""
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return g * float("inf")


def test_trace_records_where_a_gradient_turns_non_finite():
    """--trace hooks every module: with an overflow planted in the last layer's MLP backward, the first non-finite
    output gradient is inside that MLP, the gradients arriving before it are finite, and the forward stays finite
    (the cap bench's 4b case: a finite loss, a gradient that overflowed in the backward)."""
    import torch
    model, tok = grad_check.common.tiny_model(seed=0)
    model = grad_check.common.add_lora(model, dropout=0.0)
    layers = model.get_base_model().model.layers
    last = len(layers) - 1
    boom = layers[last].mlp.register_forward_hook(lambda m, i, o: _InfGrad.apply(o))
    encoded = [grad_check.sft.encode_row(tok, r["messages"], 512) for r in grad_check.tiny_rows(1)]
    batch = grad_check.sft.collate(encoded, 0)
    model.train()
    try:
        t = grad_check.trace_pass(model, batch, torch.device("cpu"), False)
    finally:
        boom.remove()
    assert t["pass"]["finite"] is False and t["forward_nonfinite"] == []
    recs = t["backward_around_first_nonfinite"]
    first = next(i for i, r in enumerate(recs) if not r["grad_finite"])
    assert f"layers.{last}.mlp." in recs[first]["output"] and all(r["grad_finite"] for r in recs[:first]) and first > 0
    assert t["first_nonfinite_at"] is not None and t["backward_records"] > t["first_nonfinite_at"]
