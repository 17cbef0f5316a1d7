"""Where does a non-finite SFT gradient come from? One forward + backward of sft.py's loss on the same rows
under each attention kernel and with / without gradient checkpointing; the loss, the gradient norm and the
first parameters whose gradient holds inf/NaN, per variant (issue 19: the `4b` profile's SFT steps on the
H200 had a finite loss and a non-finite gradient; the same step on CPU was finite).

GPU (the capbench's random 4B folder and its stage-0 rows):
    python bench/grad_check.py --model runs/capbench/qwen3_4b_random --quant 4bit \\
        --data runs/capbench/4b/data/stage0.jsonl --out $OUT/grad_check_4b.json
CPU check (tests/test_grad_check.py): --tiny, rows of its own.

Variants: `default` (what sft.py runs: no attention mask, SDPA picks its kernel), `mask` (an attention mask:
SDPA's masked kernel), `no_cudnn` (SDPA without the cuDNN kernel), `math` (SDPA's reference kernel),
`eager` (transformers' own attention); each with gradient checkpointing on (`+gc`) and off. On CPU only
the kernels CPU has run. On CUDA with a 4-bit base, `default_fp32base` also runs the default kernel with the
norms and embeddings back in fp32 (the kit casts them to bf16 to fit 24 GB; peft leaves them fp32). The LoRA adapter is fresh (B = 0), as at sft0's first step, unless --adapter.
"""
import argparse
import contextlib
import json
import math
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
import common  # noqa: E402
import sft  # noqa: E402

KERNELS = ("default", "mask", "no_cudnn", "math", "eager")


def kernel_context(name, device):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    if name == "no_cudnn" and device.type == "cuda":
        return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])
    if name == "math":
        return sdpa_kernel([SDPBackend.MATH])
    return contextlib.nullcontext()


def one_pass(model, batch, kernel, device, use_bf16):
    """Loss per target token, gradient norm (inf/NaN kept) and the non-finite parameters of one pass."""
    model.zero_grad(set_to_none=True)
    b = {k: v.to(device) for k, v in batch.items()}
    if kernel != "mask":
        b.pop("attention_mask")
    with kernel_context(kernel, device):   # the backward too: checkpointing recomputes the forward in it
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=use_bf16):
            if kernel == "mask":     # sft's loss with the mask given to the model
                logits = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits
                labels = b["labels"][:, 1:]
                keep = labels != sft.IGNORE
                loss_sum = torch.nn.functional.cross_entropy(logits[:, :-1][keep].float(), labels[keep],
                                                             reduction="sum")
                n = int(keep.sum())
            else:
                loss_sum, n = sft.target_loss_sum(model, b)
        (loss_sum / n).backward()
    grads = [p.grad for p in model.parameters() if p.requires_grad and p.grad is not None]
    norm = float(torch.nn.utils.get_total_norm(grads)) if grads else 0.0
    bad = common.nonfinite_grads(model)
    return {"loss": loss_sum.item() / n, "target_tokens": n, "grad_norm": norm if math.isfinite(norm) else str(norm),
            "finite": math.isfinite(norm), "nonfinite_params": bad}


def scan_weights(folder):
    """bench_pipeline_cap.weight_stats of an HF folder's safetensors, one row per kind of tensor (the random 4B
    model: were its weights drawn as intended?)."""
    from safetensors import safe_open
    from bench_pipeline_cap import weight_stats

    def tensors():
        for f in sorted(Path(folder).glob("*.safetensors")):
            with safe_open(str(f), framework="pt") as st:
                for k in st.keys():
                    yield k, st.get_tensor(k)
    return weight_stats(tensors())


def trace_pass(model, batch, device, use_bf16, first=12):
    """One default-kernel pass without checkpointing, hooks on every module: the largest |output| per module in the
    forward, and in the backward (in the order the gradients arrive) the first module outputs whose gradient is
    non-finite, with the last finite ones before them. The module that turns a finite output gradient into a
    non-finite one is a consumer of the first listed output."""
    fwd, bwd, handles = {}, [], []

    def tensors(o):
        return [o] if torch.is_tensor(o) else [t for t in (o if isinstance(o, (tuple, list)) else []) if torch.is_tensor(t)]

    def on_forward(name):
        def hook(mod, inp, out):
            for i, t in enumerate(tensors(out)):
                if not t.is_floating_point():
                    continue
                d = t.detach()
                fin = torch.isfinite(d)
                fwd[f"{name}[{i}]"] = {"max_abs": float(d[fin].abs().max()) if fin.any() else None,
                                       "nonfinite": int((~fin).sum())}
                if t.requires_grad:
                    t.register_hook(lambda g, key=f"{name}[{i}]": bwd.append(
                        (key, bool(torch.isfinite(g).all()), float(g.float().abs().nan_to_num(0, 0, 0).max()))))
        return hook

    for name, mod in model.named_modules():
        if name:
            handles.append(mod.register_forward_hook(on_forward(name)))
    try:
        model.gradient_checkpointing_disable()
        set_kernel(model, "default")
        summary = one_pass(model, batch, "default", device, use_bf16)
    finally:
        for h in handles:
            h.remove()
    bad = [i for i, (_, ok, _) in enumerate(bwd) if not ok]
    start = max(bad[0] - 4, 0) if bad else 0
    order = [{"output": k, "grad_finite": ok, "grad_max_abs": m} for k, ok, m in bwd[start:start + first]]
    fwd_top = sorted(fwd.items(), key=lambda kv: -(float("inf") if kv[1]["max_abs"] is None else kv[1]["max_abs"]))[:first]
    return {"pass": summary, "backward_records": len(bwd), "first_nonfinite_at": bad[0] if bad else None,
            "backward_around_first_nonfinite": order,
            "forward_nonfinite": [k for k, v in fwd.items() if v["nonfinite"]][:first],
            "forward_largest": [{"output": k, **v} for k, v in fwd_top]}


def set_kernel(model, kernel):
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    base.set_attn_implementation("eager" if kernel == "eager" else "sdpa")


def tiny_rows(n=2):
    return [{"messages": [{"role": "user", "content": f"Write a counter of width {4 + i}."},
                          {"role": "assistant", "content": f"module counter; reg [{3 + i}:0] q; endmodule"}]}
            for i in range(n)]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="GGUF / HF folder (default: the embedded SmolLM2)")
    p.add_argument("--tiny", action="store_true", help="the random tiny test model and rows of its own (CPU check)")
    p.add_argument("--quant", default="auto")
    p.add_argument("--adapter", default=None, help="peft adapter to start from (default: a fresh LoRA r 16)")
    p.add_argument("--data", default=None, help="chat JSONL (sft.py's rows); the first --rows are used")
    p.add_argument("--rows", type=int, default=1, help="rows in the batch (right-padded, as sft.py batches them)")
    p.add_argument("--max-len", type=int, default=4096)
    p.add_argument("--kernels", nargs="+", default=list(KERNELS), choices=KERNELS)
    p.add_argument("--no-autocast", action="store_true",
                   help="on CUDA too, no bf16 autocast (with --quant fp32: every matmul in fp32)")
    p.add_argument("--random-tokens", action="store_true",
                   help="the rows' token ids replaced by uniform random ones (same length and target positions)")
    p.add_argument("--trace", action="store_true",
                   help="also one pass with hooks on every module: largest forward outputs and where the backward "
                        "first turns non-finite; and (an HF folder) the weights' largest / non-finite tensors")
    p.add_argument("--out", default=None, help="JSON file to write")
    args = p.parse_args(argv)
    if not args.tiny and not args.data:
        p.error("--data is required (or --tiny)")

    t0 = time.time()
    if args.tiny:
        model, tok = common.tiny_model(seed=0)
        device = torch.device("cpu")
        rows = tiny_rows(max(args.rows, 1))
    else:
        model, tok = common.load_model(args.model, quant=args.quant)
        device = next(model.parameters()).device
        rows = sft.load_rows(args.data)
    # no LoRA dropout: every variant sees the same network, so their norms compare
    model = (common.load_adapter(model, args.adapter, trainable=True) if args.adapter
             else common.add_lora(model, dropout=0.0))
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
    encoded = [e for e in (sft.encode_row(tok, r["messages"], args.max_len) for r in rows[:args.rows]) if e]
    if not encoded:
        raise SystemExit(f"grad_check.py: no row of {args.data} fits --max-len {args.max_len}")
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    batch = sft.collate(encoded, pad_id)
    if args.random_tokens:      # the same shape and target positions, token ids drawn uniformly (bench_4b's input)
        g = torch.Generator().manual_seed(0)
        ids = torch.randint(0, len(tok), batch["input_ids"].shape, generator=g)
        batch["input_ids"] = torch.where(batch["attention_mask"].bool(), ids, batch["input_ids"])
        batch["labels"] = torch.where(batch["labels"] == sft.IGNORE, batch["labels"], batch["input_ids"])
    use_bf16 = device.type == "cuda" and not args.no_autocast
    kernels = [k for k in args.kernels if device.type == "cuda" or k != "no_cudnn"]
    results = {}
    model.train()
    trace = None
    if args.trace:      # first: the model as loaded (the _fp32base variants below upcast its frozen weights)
        trace = trace_pass(model, batch, device, use_bf16)
        trace["frozen_dtypes"] = sorted({str(p.dtype).replace("torch.", "") for p in model.parameters()
                                         if not p.requires_grad})
        if args.model and Path(args.model).is_dir():
            trace["weights"] = scan_weights(args.model)
        print(json.dumps(trace, indent=1)[:6000])
    # common._prepare_kbit casts a 4-bit model's norms and embeddings to bf16 on CUDA (peft leaves them fp32): the
    # last variants undo that cast, with the default kernel (not on CPU or a model without a 4-bit base)
    upcast = [p for p in model.parameters()
              if not p.requires_grad and p.dtype == torch.bfloat16 and type(p).__name__ != "Params4bit"]
    runs = [(k, gc, "") for gc in (True, False) for k in kernels]
    if upcast and device.type == "cuda":
        runs += [("default", gc, "_fp32base") for gc in (True, False)]
    for kernel, gc, tag in runs:
        if tag == "_fp32base" and upcast[0].dtype != torch.float32:
            for p in upcast:
                p.data = p.data.float()
        if gc:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.gradient_checkpointing_disable()
        set_kernel(model, kernel)
        name = kernel + tag + ("+gc" if gc else "")
        try:
            results[name] = one_pass(model, batch, kernel, device, use_bf16)
        except Exception as e:  # a kernel this device lacks: recorded, the next one runs
            results[name] = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
        r = results[name]
        print(f"{name:14s} " + (r["error"] if "error" in r else
              f"loss {r['loss']:.4f}  grad norm {r['grad_norm']}  non-finite params {r['nonfinite_params']['count']}"
              + (f" (first {r['nonfinite_params']['first']})" if r["nonfinite_params"]["count"] else "")))
    out = {"bench": "grad_check", "command": "python " + " ".join(sys.argv), "git": common.git_info(),
           "device": torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu",
           "versions": {"torch": torch.__version__}, "model": "tiny" if args.tiny else args.model,
           "quant": args.quant, "autocast_bf16": use_bf16, "random_tokens": args.random_tokens, "rows": len(encoded),
           "tokens": int(batch["input_ids"].numel()),
           "seconds": round(time.time() - t0, 1), "variants": results}
    if trace:
        out["trace"] = trace
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(out, indent=1))
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
