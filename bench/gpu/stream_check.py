"""fastgen's on_done on a GPU: the decoder's default path there (CUDA graphs, the shared-prefix layout, the fused
kernels where their probes pass) with three stacked adapters, rows of different lengths, greedy and sampled. Checks
that each row is heard once, that the heard Completion is the one the call returns, that rows are heard before the
call ends, and that the tokens equal a call without on_done (tests/test_stream.py checks the same on CPU).
No model file and no simulator: random weights in SmolLM2-135M's shape (bench_generate.random_like). Writes JSON.

    python bench/gpu/stream_check.py --out results/stream_check.json [--shape smollm2] [--rows 48]
"""
import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
import common  # noqa: E402
import fastgen  # noqa: E402
import fastpack  # noqa: E402
from bench_generate import random_like  # noqa: E402


def stacked_model(shape, names):
    """The random model with one LoRA adapter per name, B random (not zero), so the adapters' rows differ."""
    model, tok = (common.tiny_model(0) if shape == "tiny" else random_like(shape))
    pm = common.add_lora(model, r=16, alpha=32, dropout=0.0, adapter_name=names[0])
    for n in names[1:]:
        common.add_lora(pm, r=16, alpha=32, dropout=0.0, adapter_name=n)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in pm.named_parameters():
            if "lora_B" in name:
                p.copy_((torch.randn(p.shape, generator=g) * 0.02).to(p.dtype))
    return pm.eval(), tok


def check(model, tok, prompts, adapters, caps, **kw):
    """One call with on_done and one without, same seed -> the case's record."""
    plain = fastgen.generate(model, tok, prompts, adapters=adapters, max_lens=caps, **kw)
    heard, t0 = [], time.perf_counter()
    out = fastgen.generate(model, tok, prompts, adapters=adapters, max_lens=caps,
                           on_done=lambda k, c: heard.append((k, c, time.perf_counter() - t0)), **kw)
    total = time.perf_counter() - t0
    ks = [k for k, _, _ in heard]
    return {"rows": len(prompts), "heard_once": sorted(ks) == list(range(len(prompts))),
            "same_objects": all(out[k] is c for k, c, _ in heard),
            "tokens_equal": [c.completion_ids for c in out] == [c.completion_ids for c in plain],
            "heard_before_end": sum(at < total * 0.9 for _, _, at in heard),
            "first_heard_s": round(min(at for _, _, at in heard), 3), "call_s": round(total, 3),
            "in_order": ks == sorted(ks)}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--shape", default="smollm2", choices=["smollm2", "tiny"])
    ap.add_argument("--rows", type=int, default=48, help="rows: prompts x G 4, each prompt under one of 3 adapters")
    ap.add_argument("--out", default="results/stream_check.json")
    a = ap.parse_args(argv)
    if a.rows < 12 or a.rows % 4:
        sys.exit("stream_check.py: --rows must be a multiple of 4, at least 12")
    names = ["e0", "e1", "e2"]
    model, tok = stacked_model(a.shape, names)
    gen = torch.Generator().manual_seed(0)
    n = a.rows // 4
    prompts = [torch.randint(3, len(tok), (int(x),), generator=gen).tolist()
               for x in torch.randint(40, 400, (n,), generator=gen) for _ in range(4)]
    adapters = [names[(k // 4) % 3] for k in range(a.rows)]
    caps = [int(x) for x in torch.randint(8, 160, (a.rows,), generator=gen)]
    kw = dict(max_new_tokens=160, top_p=1.0, seed=7, batch_size=a.rows, ignore_stop=True)
    cases = {"greedy": check(model, tok, prompts, adapters, caps, temperature=0.0, **kw),
             "sampled": check(model, tok, prompts, adapters, caps, temperature=1.0, **kw)}
    st = fastpack.hf_causal_lm(model).__dict__.get("_chorus_fast_stack") or {}   # the stacked decoder state
    record = {"device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu", "shape": a.shape,
              "torch": torch.__version__, "git": common.git_info(), "cases": cases,
              "kernels_ran": {k: st.get(k) for k in ("fused_small", "fused_lora")},
              "ok": all(c["heard_once"] and c["same_objects"] and c["tokens_equal"] for c in cases.values()),
              "command": "python bench/gpu/stream_check.py " + " ".join(argv if argv is not None else sys.argv[1:])}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps(record, indent=1))
    return 0 if record["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
