"""Packing for fastgen.py, the fast decoder: a supported HF decoder's current weights (llama, qwen2, qwen3; a
peft wrapper and its LoRA adapters; a 4-bit base dequantized) copied into the plain tensors the decoder's graphs
read. pack_weights is the entry point; fastgen.py is its only caller, and nothing here imports project files.
"""
import torch

# Weight rule. At the start of every fast generate() call the current weights are copied ("packed")
# into private buffers, layer by layer: q/k/v and gate/up concatenated, with the ACTIVE peft adapter(s)
# folded in (W + sum_i s_i B_i A_i, summed in fp32, one rounding), or, for a call whose rows run different
# adapters (fastgen's stack rule), the base weights with every named adapter's A and scaled B beside them.
# CUDA graphs read only these buffers. So any change between calls is picked up: optimizer steps (in place
# or not), merging, swapping tensors, switching adapters; the shapes never change, so the graphs are reused.
# Do not change weights during a generate() call. Cost: one extra copy of the linear weights in the compute
# dtype; a 4-bit (bitsandbytes) base is dequantized into it (~7.5 GB for a 4B model). Keeping the base
# quantized and dequantizing inside every decode step was measured far slower on an H200 (a 4B rollout
# of 4 x 4096 tokens: over 250 s against ~100 s) and was dropped (results/bench.md).

FAST_ARCHS = ("llama", "qwen2", "qwen3")


class FastUnsupported(Exception):
    """The fast decoder cannot run this model; generate() falls back to HF with a one-line note."""


def hf_causal_lm(model):
    """The transformers CausalLM under an optional peft wrapper."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def _linear_parts(m, active=True):
    """A (possibly peft-wrapped, possibly 4-bit) linear -> (weight [out,in], bias|None,
    [(A [r,in], B [out,r], scaling)] for the active, unmerged LoRA adapters; none with active=False).
    A 4-bit weight comes back dequantized."""
    loras, base = [], m
    if hasattr(m, "lora_A") and hasattr(m, "get_base_layer"):
        base = m.get_base_layer()
        if active and not m.disable_adapters and not m.merged:
            for name in m.active_adapters:
                if name not in m.lora_A:
                    continue
                if name in getattr(m, "lora_variant", {}) or getattr(m, "lora_bias", {}).get(name, False):
                    raise FastUnsupported(f"LoRA variant/bias in adapter {name!r}")
                loras.append((m.lora_A[name].weight, m.lora_B[name].weight, m.scaling[name]))
    if not isinstance(base, torch.nn.Linear):
        raise FastUnsupported(f"layer type {type(base).__name__}")
    w = base.weight
    if hasattr(w, "quant_state"):  # bitsandbytes nf4/fp4
        import bitsandbytes.functional as bnbF
        w = bnbF.dequantize_4bit(w.data, w.quant_state)
    elif w.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise FastUnsupported(f"weight dtype {w.dtype}")
    return w, base.bias, loras


def _lora_of(m, name):
    """(A [r, in], B [out, r], scaling) of the adapter `name` on a peft-wrapped linear, or None where that
    adapter does not wrap it."""
    if not hasattr(m, "lora_A") or name not in m.lora_A:
        return None
    if name in getattr(m, "lora_variant", {}) or getattr(m, "lora_bias", {}).get(name, False):
        raise FastUnsupported(f"LoRA variant/bias in adapter {name!r}")
    return m.lora_A[name].weight, m.lora_B[name].weight, m.scaling[name]


def _stack_loras(mods, parts, stack, dtype):
    """The adapters of `stack` on the linears `mods` (one output block each), unfolded, for rows that each run
    their own adapter (the stack rule, section 3): la [T*K, in] (adapter t's A of every linear in its K
    columns; zeros where it has none) and lb [O, T*K] (its scaled B in its columns, zeros elsewhere).
    None when no adapter of the stack wraps any of them."""
    loras = [[_lora_of(m, name) for m in mods] for name in stack]
    ranks = [max((lo[0].shape[0] for lo in per if lo is not None), default=0) for per in zip(*loras)]
    K = sum(ranks)
    if K == 0:
        return None
    T, n_in, O = len(stack), parts[0][0].shape[1], sum(p[0].shape[0] for p in parts)
    dev = parts[0][0].device
    la = torch.zeros(T * K, n_in, dtype=torch.float32, device=dev)
    lb = torch.zeros(O, T * K, dtype=torch.float32, device=dev)
    for t, per in enumerate(loras):
        o, k = 0, t * K
        for lo, p, r in zip(per, parts, ranks):
            if lo is not None:
                A, B, scale = lo
                la[k:k + A.shape[0]] = A.detach().float()
                lb[o:o + p[0].shape[0], k:k + A.shape[0]] = B.detach().float() * scale
            o, k = o + p[0].shape[0], k + r
    return {"la": la.to(dtype), "lb": lb.to(dtype)}


def _pack_group(mods, dtype, stack=None):
    """Linears sharing one input -> {w [O, in], b [O] | None}, O = sum of outputs, with the active LoRA
    adapters folded in: W + s B A per linear, summed in fp32. Always a buffer of its own, never a
    parameter: the graphs read it, and later calls copy new weights into it (the weight rule).
    stack: adapter names for a call whose rows run different adapters; then nothing is folded, W is the
    base weight and la/lb hold the adapters (_stack_loras)."""
    parts = [_linear_parts(m, active=stack is None) for m in mods]     # with a stack: no adapter folded in
    lora = None if stack is None else _stack_loras(mods, parts, stack, dtype)
    if not any(p[2] for p in parts):
        w = torch.cat([p[0].detach().to(dtype) for p in parts])
    else:
        w = torch.cat([p[0].detach().float() for p in parts])
        o = 0
        for p in parts:
            rows = w[o:o + p[0].shape[0]]
            for A, B, scale in p[2]:
                rows.addmm_(B.detach().float(), A.detach().float(), alpha=scale)
            o += p[0].shape[0]
        w = w.to(dtype)
    b = None
    if any(p[1] is not None for p in parts):
        b = torch.cat([(p[1].detach() if p[1] is not None else torch.zeros(p[0].shape[0], device=w.device))
                       .to(dtype) for p in parts])
    return {"w": w, "b": b, **(lora or {})}


class Repack(Exception):
    """The packed shapes changed (the model's layers were replaced by others of another shape)."""


def pack_weights(model, into=None, stack=None):
    """Current weights of a supported decoder as a dict tree of packed tensors (see the weight rule); stack:
    the adapters of a call whose rows run different adapters (_pack_group).
    into: the tree of an earlier call; each layer is then packed and copied into it at once, so only one
    layer's weights exist twice (packing a whole new tree first briefly doubled the weight copy: ~7.5 GB
    more for a 4-bit 4B base, results/bench.md). Raises _Repack when a shape differs."""
    def keep(old, new):
        if into is None:
            return new
        if _tree_shapes(old) != _tree_shapes(new):
            raise Repack
        _tree_copy(old, new)
        return old
    hf = hf_causal_lm(model)
    cfg = hf.config
    if cfg.model_type not in FAST_ARCHS:
        raise FastUnsupported(f"architecture {cfg.model_type!r} (fast path: {', '.join(FAST_ARCHS)})")
    if getattr(cfg, "hidden_act", "silu") != "silu" or getattr(cfg, "use_sliding_window", False):
        raise FastUnsupported("activation other than silu, or sliding-window attention")
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    if head_dim % 2 or getattr(cfg, "partial_rotary_factor", 1.0) != 1.0:
        raise FastUnsupported("odd head_dim or partial rotary embedding")
    inner = hf.model
    emb = inner.embed_tokens
    if type(emb) is not torch.nn.Embedding:
        raise FastUnsupported("adapter on the embedding")
    dtype = _compute_dtype(hf)
    if into is not None and len(into["layers"]) != len(inner.layers):
        raise Repack
    layers = []
    for i, layer in enumerate(inner.layers):
        at, mlp = layer.self_attn, layer.mlp
        L = {"ln1": layer.input_layernorm.weight.detach().to(dtype),
             "ln2": layer.post_attention_layernorm.weight.detach().to(dtype),
             "qkv": _pack_group([at.q_proj, at.k_proj, at.v_proj], dtype, stack),
             "o": _pack_group([at.o_proj], dtype, stack),
             "gu": _pack_group([mlp.gate_proj, mlp.up_proj], dtype, stack),
             "down": _pack_group([mlp.down_proj], dtype, stack)}
        if hasattr(at, "q_norm"):    # one [hq + hkv, d] weight: q heads' norm, then k heads'
            L["qkn"] = torch.cat([at.q_norm.weight.detach().to(dtype).expand(cfg.num_attention_heads, -1),
                                  at.k_norm.weight.detach().to(dtype).expand(cfg.num_key_value_heads, -1)])
        layers.append(keep(into and into["layers"][i], L))
    rest = {"embed": emb.weight.detach().to(dtype), "norm": inner.norm.weight.detach().to(dtype)}
    rest = keep(into and {k: into[k] for k in rest}, rest)
    head = keep(into and into["head"], _pack_group([hf.lm_head], dtype, stack))
    return {**rest, "head": head, "layers": layers}


def _compute_dtype(hf):
    """Dtype the fast decoder computes in: the 4-bit compute dtype, else the linear weights' dtype."""
    qc = getattr(hf.config, "quantization_config", None)
    if getattr(hf, "is_loaded_in_4bit", False) and qc is not None:
        d = qc.get("bnb_4bit_compute_dtype") if isinstance(qc, dict) else qc.bnb_4bit_compute_dtype
        return getattr(torch, d) if isinstance(d, str) else d
    return _linear_parts(hf.model.layers[0].self_attn.o_proj)[0].dtype


def _tree_shapes(t):
    if isinstance(t, dict):
        return tuple((k, _tree_shapes(v)) for k, v in sorted(t.items()))
    if isinstance(t, list):
        return tuple(_tree_shapes(v) for v in t)
    return None if t is None else (tuple(t.shape), t.dtype)


def _tree_copy(dst, src):
    if isinstance(dst, dict):
        for k in dst:
            _tree_copy(dst[k], src[k])
    elif isinstance(dst, list):
        for d, s in zip(dst, src):
            _tree_copy(d, s)
    elif isinstance(dst, torch.Tensor):
        dst.copy_(src)
