"""The fast decoder of chorus-mini: a functional re-implementation of the supported HF decoders
(llama, qwen2, qwen3) over packed copies of their weights, with a static KV cache and CUDA graphs.

RL and distillation spend most of their time sampling rollouts; this path makes that several times
faster than transformers' generate (results/bench.md). common.generate() is the public entry point: it
renders the chats and calls generate() here on CUDA (or HF generate, the reference, elsewhere). On CPU
the same code runs eagerly, so the tests compare it with HF without a GPU. Of the project's files it imports
only fastpack.py (the weights, packed), two_part.py (the shared-prefix attention kernels), lora_stack.py (the
stack rule's LoRA term in one kernel) and decode_fuse.py (decode's rotary + K/V write and SiLU-mul kernels); common
imports from here (one direction, no cycle).

Sections:
  1. what both generation paths share: the Completion record, the stop rule (EOS or the closing code
     fence), left padding
  2. the fast path's state: the packed weights (fastpack.py: LoRA adapters folded in, or stacked for a call
     whose rows run different adapters), the arithmetic and sampling rules
  3. the model's math: RMSNorm, linear, rotary, attention, prefill, one decode step, sampling (the
     shared-prefix two-part attention, its torch form and Triton kernels, is two_part.py)
  4. the KV-cache slot (row buckets, shared prefill, compaction, the shared-prefix layout), graph capture,
     the generation loop
"""
import dataclasses
import hashlib
import math
import sys
import time
import warnings

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import decode_fuse
import fastpack
import lora_stack
import two_part
from fastpack import FastUnsupported  # noqa: F401  (common and the tests name it from here)

# ----------------------------------------------------------------------------------------------
# 1. what both generation paths share

@dataclasses.dataclass
class Completion:
    """One sampled answer. completion_ids are exactly the sampled tokens (incl. a final EOS), so RL can
    recompute their log-probs; truncated = hit max_new_tokens before EOS or the closing code fence."""
    text: str
    prompt_ids: list
    completion_ids: list
    truncated: bool


def fence_closed(text):
    """True when text holds an opening ``` fence line and a later closing ```: the answer is complete."""
    start = text.find("```")
    if start < 0:
        return False
    nl = text.find("\n", start)
    return nl >= 0 and text.find("```", nl) >= 0


def stop_sets(model, tok):
    """(eos ids, ids of tokens whose text holds a backtick). Only a backtick token can complete a fence,
    so the (costly) text check runs only after one of those."""
    eos = set()
    for src in (tok.eos_token_id, getattr(model.generation_config, "eos_token_id", None)):
        eos.update(src if isinstance(src, (list, tuple)) else [src] if src is not None else [])
    ticks = getattr(tok, "_chorus_tick_ids", None)
    if ticks is None:
        pieces = tok.convert_ids_to_tokens(list(range(len(tok))))
        ticks = frozenset(i for i, p in enumerate(pieces) if p and "`" in p)
        tok._chorus_tick_ids = ticks
    return eos, ticks


def find_stop(tok, ids, eos, ticks, start=0):
    """Index of the first token (>= start) that ends the answer (EOS, or completes the closing fence
    after an opening one), or None. Both generation paths cut their output with this one rule."""
    for i in range(start, len(ids)):
        t = ids[i]
        if t in eos:
            return i
        if t in ticks and fence_closed(tok.decode(ids[:i + 1], skip_special_tokens=True)):
            return i
    return None


def cut_completion(tok, prompt_ids, gen_ids, eos, ticks, max_new_tokens, ignore_stop=False):
    """Generated ids -> Completion, cut after the stop token (or at max_new_tokens: truncated)."""
    stop = None if ignore_stop else find_stop(tok, gen_ids, eos, ticks)
    ids = gen_ids[:max_new_tokens] if stop is None else gen_ids[:stop + 1]
    return Completion(tok.decode(ids, skip_special_tokens=True), list(prompt_ids), list(ids), stop is None)


def left_pad(batch, pad_id, device):
    """list of id lists -> input_ids [B, P] (left padded), attention_mask [B, P]."""
    P = max(len(x) for x in batch)
    ids = torch.full((len(batch), P), pad_id, dtype=torch.long)
    mask = torch.zeros((len(batch), P), dtype=torch.long)
    for b, x in enumerate(batch):
        ids[b, P - len(x):] = torch.tensor(x, dtype=torch.long)
        mask[b, P - len(x):] = 1
    return ids.to(device), mask.to(device)


# ----------------------------------------------------------------------------------------------
# 2. the fast path: functional decoder over packed weights (fastpack.py), static KV cache, CUDA graphs
#
# The weights are packed by fastpack.py (its weight rule: what a call copies, when, and what it costs).
#
# Arithmetic. The model's math is HF's, with fewer kernels: attention is one fused call per layer where
# cuDNN can run it (see _GQA_BACKENDS), else two matmuls; RMSNorm one fused call that rounds once (HF
# rounds to the input dtype before the weight); rotary one roll + addcmul. In fp32 the logits match HF's
# forward within 1e-4 (tests); in bf16 they can differ by rounding, so greedy outputs of the two paths
# may part at a near-tie.
#
# Sampling is the same distribution as HF generate: logits / temperature, then HF's top-p rule (drop
# the smallest-probability tokens whose cumulative mass is <= 1 - top_p, always keep the top token),
# then an exact draw via the exponential race argmax(p / E), E ~ Exp(1) i.i.d. The noise is drawn
# outside the graph, keyed by (seed, the prompt's index in the call, the token's step) alone: a generator
# is re-seeded for each block of NOISE_ROWS rows and each step. So a row's tokens depend neither on when
# graphs were captured nor on how the call is cut into batches (a memory budget, an out-of-memory retry).
# Bit-identical outputs across runs also need the GPU kernels to be deterministic, which torch does not promise
# (results/bench.md saw one greedy run of HF vs the fast path part at a near-tie).

BUCKET = 256         # attention reads the cache up to the next multiple of this: one graph per bucket
CHECK_EVERY = 16     # decode steps between the (GPU->CPU sync) checks for finished sequences
NOISE_ROWS = 64      # sampling noise is drawn per block of this many rows of a call (see _draw_noise)
# The most bytes the KV slot may take (None: no limit beyond the memory rule, section 4). common sets it
# from $CHORUS_GPU_CAP_GIB / --gpu-mem-gib (common.apply_gpu_cap); generate(budget=...) overrides it.
KV_BUDGET_BYTES = None


_STATE_KEYS = ("_chorus_fast", "_chorus_fast_stack")    # the HF model's attributes: folded, stacked


def _fast_state(model, stack=None):
    """Refresh (or build) the packed weights of model; returns the state dict kept on the HF model:
    {W, meta, slots: {rows: slot}, stack} (at most one slot, section 4). Graphs live in the slot and survive
    while the packed shapes stay the same. A call with a stack of adapters (the stack rule) has a state of its
    own beside the folded one (OPD alternates the two every round: neither loses its graphs to the other), at
    the cost of a second copy of the packed weights; the memory rule counts both states' caches (_slot_for)."""
    hf = fastpack.hf_causal_lm(model)
    key = _STATE_KEYS[stack is not None]
    st = hf.__dict__.get(key)
    if st is not None:
        try:
            if st["stack"] != stack:
                raise fastpack.Repack
            fastpack.pack_weights(model, into=st["W"], stack=stack)   # in place: the captured graphs read these buffers
            return st
        except fastpack.Repack:                              # new shapes: drop the state (and its graphs), rebuild
            pass
        st = None                                    # no reference left: the old buffers are freed first
        hf.__dict__.pop(key, None)
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    W = fastpack.pack_weights(model, stack=stack)
    at = hf.model.layers[0].self_attn
    cfg = hf.config
    meta = {"hq": cfg.num_attention_heads, "hkv": cfg.num_key_value_heads, "d": at.head_dim,
            "scale": at.scaling, "eps": hf.model.norm.variance_epsilon,
            "qk_eps": getattr(getattr(at, "q_norm", None), "variance_epsilon", None), "dtype": W["embed"].dtype}
    st = {"W": W, "meta": meta, "slots": {}, "rotary": hf.model.rotary_emb, "stack": stack}
    hf.__dict__[key] = st  # plain attribute, not a submodule or buffer
    return st


def free_fast_cache(model):
    """Drop the fast decoder's packed weights, KV caches and CUDA graphs (frees their GPU memory, e.g.
    before a memory-hungry training phase). The next fast generate() rebuilds them."""
    for key in _STATE_KEYS:
        fastpack.hf_causal_lm(model).__dict__.pop(key, None)
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


# ----------------------------------------------------------------------------------------------
# 3. the model's math

def _rms(x, w, eps):
    """RMSNorm. w [H]: one fused kernel, fp32 statistics, one rounding at the end (HF casts back to the
    input dtype before scaling by w: two roundings, <= 1 ulp apart). w [heads, H] (qwen3's q/k norms, one
    weight per head): normalize, then scale, as HF does. x [..., H]."""
    if w.dim() == 1:
        return F.rms_norm(x, (x.shape[-1],), w, eps)
    return F.rms_norm(x, (x.shape[-1],), eps=eps) * w


# The stack rule: in a call whose rows run different adapters (generate(adapters=...)), nothing is folded;
# a group's la/lb hold every adapter's A and scaled B (_stack_loras), and sel [N, T] (one-hot: the adapter of
# each row) keeps each row's own columns: y = x W^T + ((x la^T) * sel) lb^T. Three small kernels per group; sel
# is made once per decode step or prefill chunk. FUSED_LORA "auto": in decode, where the probe passes (CUDA with
# Triton), the three are one kernel (lora_stack.py) and sel is the pair (arow [N], T) instead: on an H100 the
# joint experts' stacked round (three adapters, shared-prefix layout) runs 1.05x faster with it, 1.13x with
# FUSED_SMALL too (results/rl_throughput.md). False keeps the torch form, True forces the kernel (tests).
FUSED_LORA = "auto"


def _lin(x, G, residual=None, sel=None):
    """y = x W^T (+ b) (+ residual), W with the adapters folded in, or with each row's own adapter (the stack
    rule; sel [N, T] one-hot, or (arow [N], T) for the fused kernel). x [N, in] -> [N, out]."""
    add = G["b"] if residual is None else (residual if G["b"] is None else residual + G["b"])
    y = F.linear(x, G["w"]) if add is None else torch.addmm(add, x, G["w"].t())
    if "la" in G:
        if isinstance(sel, tuple):
            return lora_stack.add_triton(y, x, G["la"], G["lb"], *sel)
        N, T = sel.shape
        h = (F.linear(x, G["la"]).view(N, T, -1) * sel[:, :, None]).view(N, -1)
        y = torch.addmm(y, h, G["lb"].t())
    return y


def _kernel_on(st, key, switch, works):
    """A Triton kernel switch (FUSED_LORA, FUSED_SMALL) decided once per decoder state: True forces it, "auto" takes
    it on CUDA where works(device, meta) (the kernel's probe) passes, anything else keeps the torch form."""
    if key not in st:
        dev = st["W"]["embed"].device
        st[key] = switch is True or (switch == "auto" and dev.type == "cuda" and works(dev, st["meta"]))
    return st[key]


def _fused_lora(st):
    """Whether decode steps of this stacked state add the LoRA term with lora_stack's kernel."""
    return _kernel_on(st, "fused_lora", FUSED_LORA, lambda dev, m: lora_stack.kernel_works(dev, m["dtype"]))


# Decode's small kernels fused (decode_fuse.py): rotary with the K/V cache writes in one kernel instead of five, and
# SiLU times up in one instead of two, in every layer without qwen3's q/k norm: on an H100 a decode step of 64 rows
# (4.7k-token prompts, one adapter) takes 2.13 ms instead of 2.67 (results/rl_throughput.md). Same semantics as
# FUSED_LORA: "auto" where the probe passes, False off, True forced (tests).
FUSED_SMALL = "auto"


def _fused_small(st):
    """Whether decode steps of this state use decode_fuse's kernels."""
    return _kernel_on(st, "fused_small", FUSED_SMALL,
                      lambda dev, m: decode_fuse.kernel_works(dev, m["dtype"], m["hq"], m["hkv"], m["d"]))


def _select(slot, rows, T):
    """sel for the stack rule: one-hot [len(rows), T] of the adapter each slot row runs (slot["arow"]); None
    when the call folds its adapters (T = 0)."""
    if not T:
        return None
    arow = slot["arow"][rows]          # compared with 0..T-1, not F.one_hot: that checks its input on the host
    return (arow[:, None] == torch.arange(T, device=arow.device)).to(slot["cos"].dtype)


def _rope(x, cos, sin_signed):
    """Rotary embedding, HF's rotate-half convention: x cos + cat(-x2, x1) sin, written as
    x cos + roll(x, D/2) sin_signed with sin_signed = sin with its first half negated (3 kernels, not 5).
    x [N, heads, D], cos/sin_signed [N, 1, D]."""
    return torch.addcmul(x * cos, x.roll(x.shape[-1] // 2, -1), sin_signed)


def _qkv_proj(L, m, x, sel=None):
    """The q, k and v heads of one layer side by side, before any rotary: qkv(norm(x)). x [N, H]."""
    return _lin(_rms(x, L["ln1"], m["eps"]), L["qkv"], sel=sel)


def _qkv(L, m, x, cos, sin, sel=None):
    """Attention input of one layer. x [N, H] -> q [N, hq, d], k, v [N, hkv, d] (normed, rotated).
    q and k heads are normed and rotated together (one set of kernels instead of two); sin: signed (_rope)."""
    qkv = _qkv_proj(L, m, x, sel)
    hq, hkv, d = m["hq"], m["hkv"], m["d"]
    qk = qkv[:, :(hq + hkv) * d].view(-1, hq + hkv, d)
    v = qkv[:, (hq + hkv) * d:].view(-1, hkv, d)
    if "qkn" in L:  # qwen3: RMSNorm over head_dim before rotary (q heads and k heads have their own weight)
        qk = _rms(qk, L["qkn"], m["qk_eps"])
    qk = _rope(qk, cos, sin)
    return qk[:, :hq], qk[:, hq:], v


def _mlp(L, m, x, sel=None, fuse=False):
    """Second half of a layer: x + down(silu(gate(h)) * up(h)), h = norm(x). x [N, H]. fuse: silu * up in
    decode_fuse's kernel (decode steps, _fused_small)."""
    h = _rms(x, L["ln2"], m["eps"])
    gu = _lin(h, L["gu"], sel=sel)
    if fuse:
        return _lin(decode_fuse.silu_mul_triton(gu), L["down"], residual=x, sel=sel)
    g, u = gu.chunk(2, dim=-1)
    return _lin(F.silu(g) * u, L["down"], residual=x, sel=sel)


def _prefill(st, slot, ids, b0, b1):
    """Run rows b0:b1 of the left-padded prompt ids [b, P] through the model, writing cache columns
    0..P-1; returns last-position logits [b, V] fp32. Pad queries attend to themselves only."""
    W, m = st["W"], st["meta"]
    nb, P = ids.shape
    pos = slot["pos0"][b0:b1, None] + torch.arange(P, device=ids.device)          # [b, P] rotary positions
    cos = slot["cos"][pos.clamp(min=0)].view(nb * P, 1, -1)
    sin = slot["sin"][pos.clamp(min=0)].view(nb * P, 1, -1)
    ok = slot["key_ok"][b0:b1, :P]                                                  # [b, P] real tokens
    causal = torch.ones(P, P, dtype=torch.bool, device=ids.device).tril()
    allowed = (causal[None] & ok[:, None, :]) | torch.eye(P, dtype=torch.bool, device=ids.device)[None]
    x = F.embedding(ids, W["embed"]).view(nb * P, -1)
    sel_rows = _select(slot, slice(b0, b1), len(st["stack"] or ()))                # [b, T]: the stack rule
    sel = None if sel_rows is None else sel_rows.repeat_interleave(P, 0)           # [b * P, T]: per token
    for li, L in enumerate(W["layers"]):
        q, k, v = _qkv(L, m, x, cos, sin, sel)
        k4, v4 = k.view(nb, P, m["hkv"], m["d"]).transpose(1, 2), v.view(nb, P, m["hkv"], m["d"]).transpose(1, 2)
        slot["k"][li, b0:b1, :, :P] = k4
        slot["v"][li, b0:b1, :, :P] = v4
        q4 = q.view(nb, P, m["hq"], m["d"]).transpose(1, 2)
        att = None
        if slot["gqa_prefill"]:
            try:
                att = _gqa_attention(q4, k4, v4, allowed[:, None], m["scale"])          # [b, hq, P, d]
            except RuntimeError:
                slot["gqa_prefill"] = False
        if att is None:   # K/V repeated per query head: torch's memory-efficient kernel takes the mask
            g = m["hq"] // m["hkv"]
            att = F.scaled_dot_product_attention(q4, k4.repeat_interleave(g, 1), v4.repeat_interleave(g, 1),
                                                 attn_mask=allowed[:, None], scale=m["scale"])
        x = _lin(att.transpose(1, 2).reshape(nb * P, -1), L["o"], residual=x, sel=sel)
        x = _mlp(L, m, x, sel)
    x = _rms(x.view(nb, P, -1)[:, -1], W["norm"], m["eps"])
    return _lin(x, W["head"], sel=sel_rows).float()


def _sample(logits, temperature, top_p, noise):
    """Next tokens [B] from logits [B, V] fp32: greedy when temperature == 0, else HF-equivalent
    temperature + top-p, drawn exactly with the exponential race argmax(p / E) (noise = E [B, V])."""
    if temperature == 0:
        return logits.argmax(-1)
    if temperature != 1.0:
        logits = logits / temperature
    if top_p < 1.0:
        sorted_logits, order = logits.sort(-1)                       # ascending
        drop = sorted_logits.softmax(-1).cumsum(-1) <= (1 - top_p)
        drop[:, -1] = False                                          # always keep the most likely token
        logits = logits.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
    probs = logits.softmax(-1)
    return (probs / noise.clamp(min=1e-20)).argmax(-1)


def _decode_step(st, slot, Lb, temperature, top_p, record=None):
    """One token for every row, all state in slot buffers (graph-capturable: fixed shapes, no host
    sync): reads tok [B] at cache column col [1] / rotary position pos [B], writes K/V at col, attends
    to columns < Lb that are real and <= col, samples into tok, advances col and pos. On a shared-prefix
    view (section 4) k/v are the rows' suffixes, col their column, and Lb = (prefix width, suffix width)."""
    W, m = st["W"], st["meta"]
    B = slot["tok"].shape[0]
    cos, sin = slot["cos"][slot["pos"]][:, None], slot["sin"][slot["pos"]][:, None]   # [B, 1, d]
    shared = "pk" in slot
    if shared:
        Pb, Lb = Lb
    else:
        valid = slot["key_ok"][:, :Lb] & (slot["ar"][:Lb] <= slot["col"])           # [B, Lb]
        bias = torch.zeros(B, 1, 1, Lb, dtype=m["dtype"] if slot["gqa"] else torch.float32,
                           device=valid.device).masked_fill(~valid[:, None, None], float("-inf"))
    g = m["hq"] // m["hkv"]
    x = F.embedding(slot["tok"], W["embed"])                                          # [B, H]
    T = len(st["stack"] or ())
    sel = (slot["arow"], T) if T and _fused_lora(st) else _select(slot, slice(None), T)
    fuse = _fused_small(st)
    for li, L in enumerate(W["layers"]):
        if fuse and "qkn" not in L:   # rotary and the K/V writes in one kernel (decode_fuse.py)
            q = decode_fuse.rope_write_triton(_qkv_proj(L, m, x, sel), cos, sin, slot["k"][li], slot["v"][li],
                                              slot["col"])
        else:
            q, k, v = _qkv(L, m, x, cos, sin, sel)
            slot["k"][li].index_copy_(2, slot["col"], k[:, :, None])
            slot["v"][li].index_copy_(2, slot["col"], v[:, :, None])
        kc, vc = slot["k"][li, :, :, :Lb], slot["v"][li, :, :, :Lb]
        if shared:        # the group's prompt once, the row's own tokens, merged by their lse
            att = slot["two_part"](q, slot["pk"][li, :, :, :Pb], slot["pv"][li, :, :, :Pb], slot["plen"],
                                   slot["rowof"], slot["midx"], kc, vc, slot["col"], m["scale"])  # [B, hq, d]
        elif slot["gqa"]:   # one fused kernel per layer (on an H200 it reads the cache near memory bandwidth)
            att = _gqa_attention(q[:, :, None], kc, vc, bias, m["scale"])                   # [B, hq, 1, d]
        else:             # two batched matmuls, fp32 softmax; K/V read in place, never repeated
            qg = q.view(B, m["hkv"], g, m["d"]) * m["scale"]                             # [B, hkv, g, d]
            p = (torch.matmul(qg, kc.transpose(-1, -2)).float() + bias).softmax(-1).to(qg.dtype)
            att = torch.matmul(p, vc)                                                    # [B, hkv, g, d]
        x = _lin(att.reshape(B, -1), L["o"], residual=x, sel=sel)
        x = _mlp(L, m, x, sel, fuse)
    logits = _lin(_rms(x, W["norm"], m["eps"]), W["head"], sel=sel).float()
    if record is not None:
        record.append(logits.clone())
    slot["tok"].copy_(_sample(logits, temperature, top_p, slot["noise"]))
    slot["col"].add_(1)
    slot["pos"].add_(1)


# Attention kernels for GQA with a padding mask. cuDNN's fused kernel takes both without repeating K/V;
# torch's other fused kernels do not (flash: no mask; memory-efficient: no enable_gqa), and its math
# fallback would copy K/V in fp32 and build the full score matrix (O(P^2) memory in prefill). So the
# fused call is pinned to cuDNN, and a slot uses it only when a probe with its own shapes succeeds;
# elsewhere (CPU, GPUs or builds without it) the decoder keeps the portable forms. Tests set MATH here
# to run the same call on CPU.
_GQA_BACKENDS = [SDPBackend.CUDNN_ATTENTION]


def _gqa_attention(q, k, v, mask, scale):
    """SDPA with enable_gqa on the pinned backends: q [b, hq, n, d], k/v [b, hkv, L, d], mask
    broadcastable to [b, hq, n, L] (bool or additive in q's dtype). Raises RuntimeError where none runs."""
    with sdpa_kernel(_GQA_BACKENDS):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=True)


def _gqa_works(slot, m, B):
    """Whether _gqa_attention runs for this slot's decode shapes (one query row per head, additive mask).
    Prefill tries it too and keeps to the portable form after a first failure (it runs eagerly)."""
    dev, dt, L = slot["k"].device, m["dtype"], slot["L"]
    with warnings.catch_warnings():          # torch warns per backend it rules out; the probe's answer suffices
        warnings.simplefilter("ignore")
        try:
            for Lb in sorted({min(BUCKET, L), L}):
                q = torch.zeros(B, m["hq"], 1, m["d"], dtype=dt, device=dev)
                bias = torch.zeros(B, 1, 1, Lb, dtype=dt, device=dev)
                _gqa_attention(q, slot["k"][0, :, :, :Lb], slot["v"][0, :, :, :Lb], bias, m["scale"])
            return True
        except RuntimeError:
            return False


# ----------------------------------------------------------------------------------------------
# 4. KV-cache slots, CUDA graphs, the generation loop
#
# The slot. One set of static buffers per model (st["slots"] holds at most one): a KV cache of R rows x
# L columns (L a multiple of BUCKET) and the per-row state. A batch of B prompts runs on the slot's first
# _row_bucket(B) rows (1, 2, 4, 6, 8, 12, 16, 24, 32, 48, ...: rows past B decode filler that nothing
# reads), and graphs are keyed by (rows, attention width, sampling args). So calls with other batch sizes
# or longer prompts reuse the slot and its graphs while they fit in it. A call that does not fit grows the
# slot to the larger of both shapes (one re-capture; then RL's rounds and refills fit), or, where that
# would break the memory rule, to what the call needs. The memory rule: the KV cache takes at most half
# of the free memory (CUDA) and at most the budget (KV_BUDGET_BYTES, any device); a batch it cannot hold
# is cut, and a batch that still runs out of memory is retried in halves (generate). The cut batches run
# with their own longest prompt, never the window's: a prompt must start at the column its positions say.
#
# Shared prefill. Identical prompts of one batch (a chat repeated G times) are prefilled once; their K/V
# and logits are copied to the other rows. Each row still draws its own sampling noise.
#
# Compaction. At each stop check (every CHECK_EVERY tokens) the rows still running are counted; when they
# fit a smaller row bucket, their K/V and state move to the first rows and decoding goes on with that
# bucket's graphs, so finished rows stop costing compute. The move also drops the left padding that all
# remaining rows share (the longest prompts finished: the others stop reading their padding). A row's
# noise is keyed by its place in the call (the sampling note, section 2), so its tokens depend neither on
# when the others stopped nor on how the call was cut into batches: the same seed gives the same tokens with
# compaction and shared prefill on or off (tests, fp32). On a GPU in bf16 the kernels' rounding can depend
# on the batch size, so there a greedy or sampled row may part from the uncompacted run at a near-tie, as
# the arithmetic note says.
#
# Shared prefix (SHARED_PREFIX). A batch with groups of identical prompts (RL's G answers per prompt) can
# keep each group's prompt K/V once and each row's new tokens apart (two_part.py's two-part attention): the
# slot's K/V memory is carved, per layer, into prefix buffers [U groups, hkv, Pp, d] and suffix buffers
# [R rows, hkv, S, d] (S = max_new_tokens, Pp = R (L - S) / U >= the longest prompt, so the carve always
# fits the slot, keeps its memory rule and depends only on the slot, U, the largest group and S: its graphs
# are reused across calls). Each distinct prompt is prefilled once into its group's prefix, left-aligned
# (columns 0..plen-1, rotary positions 0..plen-1 as today), so no padding mask is read; a row's k-th new
# token sits at suffix column k-1 with rotary position plen + k - 1, as today. Compaction moves the
# running rows' suffixes and their row -> group map (rowof, midx); the prefix stays. Noise is keyed by the
# row's place in the call as in the default layout, so tokens are the default layout's (tests, fp32).
# Graphs are keyed by (rows, prefix width, suffix width, sampling args, the carve). An earlier shared-prefix
# layout (one cache row per group, new tokens interleaved, the group's rows as G query positions of one
# cuDNN call with a per-row bias) ran 6.40 ms per decode step against 3.59 ms for the default layout at batch
# 64 = 16 groups x 4, 4675-token prompts on one H200; the masked cuDNN kernel took 4.36 ms of it
# (results/rl_throughput.md). The two-part form reads each prefix once without a mask instead.

SHARE_PREFILL = True   # tests switch these off to compare against the plain path
COMPACT = True
# "auto": on where the Triton kernels run and pass their probe (CUDA), off elsewhere: there the torch form
# would run, slower than the default layout (bench/decode_two_part.py on an H100: attention 60-203 us per
# layer against 136-522 us for the default cuDNN call; 264-738 us for the torch form). End to end on an RL
# round (64 prompts x G 4, 1.7-6.9k-token prompts, cap 1280) it took 12.5 s per call against 19.0 s
# (results/rl_throughput.md). True / False force it (tests).
SHARED_PREFIX = "auto"
# Rows per group at most: a group's rows x query heads per KV head are one block of query rows in the prefix
# kernel (registers), so a prompt repeated more often is stored once per GROUP_MAX rows (and prefilled each time).
GROUP_MAX = 8
# Seconds spent so far, summed over calls (the RL/OPD step breakdown reads the difference around a call):
# pack = folding the current weights into the packed copy, prefill, capture = CUDA-graph captures,
# decode = the decode loop without its captures. On CUDA each boundary synchronises (a few per call).
STATS = {"pack_s": 0.0, "prefill_s": 0.0, "capture_s": 0.0, "decode_s": 0.0}
# Memory: the largest KV slot made (bytes) and the batches retried after an out-of-memory error.
MEMORY = {"kv_peak_bytes": 0, "oom_retries": 0}


def _clock(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def _row_bucket(n):
    """Rows a batch of n runs on: the smallest of 1, 2, 4, 6, 8, 12, 16, 24, 32, 48, ... that is >= n
    (powers of two and their 3/4 from 6 on: at most a third of the rows are filler)."""
    p = 1 << (n - 1).bit_length()                        # the next power of two >= n
    return 3 * p // 4 if p >= 8 and 4 * n <= 3 * p else p


def _signed_sin(sin):
    """sin [.., D] with its first half negated (see _rope)."""
    half = sin.shape[-1] // 2
    return torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)


def _cache_bytes(st, B, L):
    m = st["meta"]
    return 2 * len(st["W"]["layers"]) * B * m["hkv"] * L * m["d"] * torch.finfo(m["dtype"]).bits // 8


def _slot_for(st, n, L, device, budget=None, held=0):
    """A slot with >= _row_bucket(n) rows and >= L columns -> (slot, n). n comes back smaller (halved)
    where a cache for n rows would break the memory rule (the KV caches together: at most half of the free
    memory on CUDA, and at most `budget` bytes on any device; held: the bytes the model's other decoder
    state's cache holds); the caller then splits its batch. One row always gets a slot."""
    old = next(iter(st["slots"].values()), None)
    budget = None if budget is None else budget - held

    def fits(rows):
        return old is not None and old["R"] >= _row_bucket(rows) and old["L"] >= L
    limit = math.inf if budget is None else budget
    if device.type == "cuda":   # the old slot's memory counts as free: it is dropped first
        free = _gpu_free_bytes(device) + (_cache_bytes(st, old["R"], old["L"]) if old else 0)
        limit = min(limit, 0.5 * (free + held) - held)
    if old is not None and budget is not None and _cache_bytes(st, old["R"], old["L"]) > budget:
        old = None              # a slot made under a larger budget: rebuilt within this one
    if fits(n):
        return old, n
    if old is not None:
        grown = (max(_row_bucket(n), old["R"]), max(L, old["L"]))
        if _cache_bytes(st, *grown) <= limit:
            return _new_slot(st, *grown, device), n
    while n > 1 and _cache_bytes(st, _row_bucket(n), L) > limit:
        n = max(1, n // 2)
        if fits(n):
            return old, n
    return _new_slot(st, _row_bucket(n), L, device), n


def _other_state(model, st):
    """The model's decoder state beside `st` (the folded one beside a stacked one, or back), or None."""
    hf = fastpack.hf_causal_lm(model)
    return next((s for s in (hf.__dict__.get(k) for k in _STATE_KEYS) if s is not None and s is not st), None)


def _held_bytes(st):
    """Bytes the KV cache of a decoder state holds (0 for None)."""
    return 0 if st is None else sum(_cache_bytes(st, s["R"], s["L"]) for s in st["slots"].values())


def _new_slot(st, R, L, device):
    """Static buffers for R rows and L columns (the old slot and its graphs are dropped first)."""
    m, slots = st["meta"], st["slots"]
    if device.type == "cuda":
        torch.cuda.synchronize()       # nothing may still run on a slot whose graphs are dropped
    slots.clear()
    nl, V = len(st["W"]["layers"]), st["W"]["embed"].shape[0]
    dt = m["dtype"]
    with torch.no_grad():
        cos, sin = st["rotary"](torch.zeros(1, dtype=dt, device=device), torch.arange(L, device=device)[None])
    # Each slot has its own graph memory pool: its graphs are captured one after another and dropped
    # together. (One pool shared across slots broke a later capture once an evicted slot's graphs were
    # freed: CUDACachingAllocator "use_count > 0" assert, seen on an H200 with torch 2.11.)
    slot = {"R": R, "L": L, "graphs": {}, "views": {}, "carves": {},
            "pool": torch.cuda.graph_pool_handle() if device.type == "cuda" else None,
            "k": torch.zeros(nl, R, m["hkv"], L, m["d"], dtype=dt, device=device),
            "v": torch.zeros(nl, R, m["hkv"], L, m["d"], dtype=dt, device=device),
            "cos": cos[0].to(dt), "sin": _signed_sin(sin[0]).to(dt),
            "tok": torch.zeros(R, dtype=torch.long, device=device),
            "col": torch.zeros(1, dtype=torch.long, device=device),
            "pos": torch.zeros(R, dtype=torch.long, device=device),
            "pos0": torch.zeros(R, dtype=torch.long, device=device),
            "arow": torch.zeros(R, dtype=torch.long, device=device),       # each row's adapter (the stack rule)
            "key_ok": torch.ones(R, L, dtype=torch.bool, device=device),
            "ar": torch.arange(L, device=device),
            "noise": torch.ones(R, V, dtype=torch.float32, device=device)}
    slot["gqa_prefill"] = _view(st, slot, R)["gqa"]
    slots[R] = slot
    MEMORY["kv_peak_bytes"] = max(MEMORY["kv_peak_bytes"], _cache_bytes(st, R, L))
    return slot


def _view(st, slot, b):
    """The slot's first b rows as a slot of their own: views of the same memory (the K/V of one layer stay
    contiguous), sharing col, the rotary tables and the graph pool. Cached; probes the fused attention."""
    v = slot["views"].get(b)
    if v is None:
        v = {key: slot[key] for key in ("L", "pool", "cos", "sin", "col", "ar")}
        v.update({key: slot[key][:b] for key in ("tok", "pos", "key_ok", "noise", "arow")})
        v.update(k=slot["k"][:, :b], v=slot["v"][:, :b])
        v["gqa"] = _gqa_works(v, st["meta"], b)
        slot["views"][b] = v
    return v


def _capture(st, slot, Lb, temperature, top_p):
    """CUDA-graph one decode step (warm-up on a side stream first, state restored after it)."""
    saved = [slot[k].clone() for k in ("tok", "col", "pos")]
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        _decode_step(st, slot, Lb, temperature, top_p)  # warm-up: cuBLAS handles, kernel choice
    torch.cuda.current_stream().wait_stream(s)
    for k, v in zip(("tok", "col", "pos"), saved):
        slot[k].copy_(v)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, pool=slot["pool"], capture_error_mode="thread_local"):
        _decode_step(st, slot, Lb, temperature, top_p)
    return g


def _gpu_free_bytes(device):
    """Bytes this process can still allocate on a CUDA device: the device's free memory plus what the
    caching allocator holds unused, within torch.cuda.set_per_process_memory_fraction's cap if one is set
    (mem_get_info alone ignores the cap: a 24 GB budget on an H200 would look like 140 GB)."""
    free, _ = torch.cuda.mem_get_info(device)
    total = torch.cuda.get_device_properties(device).total_memory   # the card's size: the cap is a fraction of it
    allocated, reserved = torch.cuda.memory_allocated(device), torch.cuda.memory_reserved(device)
    getter = getattr(torch.cuda, "get_per_process_memory_fraction", None)
    frac = getter(device) if getter else 1.0
    return max(0, min(free + reserved - allocated, int(frac * total) - allocated))


def generate(model, tok, prompts, *, max_new_tokens, temperature, top_p, seed, batch_size,
             ignore_stop=False, graphs=None, record=None, max_lens=None, budget=None, adapters=None, stack=None,
             on_done=None):
    """Fast path (fastpack's weight rule). prompts: list of id lists -> list[Completion].
    graphs: None = CUDA graphs on CUDA; record: a list collecting per-step logits [B, V] of each batch
    (tests; rows that have left the batch are NaN); max_lens: optional per-prompt caps on new tokens
    (<= max_new_tokens; a row that reaches its cap ends there, truncated); budget: the most bytes the KV
    cache may take (default KV_BUDGET_BYTES). A batch whose cache would not fit the budget, or that runs
    out of memory, is cut into smaller batches; no answer is shortened or dropped, and each row's tokens
    are those of an uncut run (the noise rule; greedy and fp32 exactly, bf16 up to the kernels' rounding).
    adapters: one adapter name per prompt (peft adapters loaded on the model): each row runs its own in one
    call (the stack rule, section 3) instead of the active adapter folded in; rows of one prompt and one adapter
    share their prefill and prefix. stack: more adapters to stack beside the rows' (a caller whose calls name
    different subsets of its adapters keeps one stacked state, and its graphs, across them).
    on_done(k, completion): called once per prompt k as soon as its row has finished (seen at the decode loop's
    stop check, every CHECK_EVERY steps), the rest at their batch's end, so a caller can score early answers while
    the longest rows still decode; the returned list holds the same Completion objects."""
    if stack is not None and (adapters is None or isinstance(stack, str)):
        raise ValueError("stack: a list of adapter names, beside adapters (one per prompt)")
    if adapters is not None:
        if len(adapters) != len(prompts):
            raise ValueError("adapters: one adapter name per prompt")
        adapters_all = set(adapters) | set(stack or ())
        known = getattr(model, "peft_config", {})
        if not adapters_all <= set(known):
            raise ValueError(f"adapters: not loaded on the model: {sorted(adapters_all - set(known))}")
        other = sorted(a for a in adapters_all if getattr(known[a], "peft_type", None) != "LORA")   # a str enum
        if other:
            raise FastUnsupported(f"adapters other than LoRA in one call: {other}")
    # sorted: a call naming the same adapters in another order keeps the state (and its graphs)
    stack = None if adapters is None else sorted(adapters_all)
    arows = None if adapters is None else [stack.index(a) for a in adapters]
    if max_lens is not None and (len(max_lens) != len(prompts)
                                 or not all(1 <= x <= max_new_tokens for x in max_lens)):
        raise ValueError(f"max_lens: one cap in 1..{max_new_tokens} per prompt")
    device = next(model.parameters()).device
    budget = KV_BUDGET_BYTES if budget is None else budget
    t0 = _clock(device)
    st = _fast_state(model, stack)
    other = _other_state(model, st)       # the folded or the stacked state beside this one: its cache counts too
    STATS["pack_s"] += _clock(device) - t0
    use_graphs = device.type == "cuda" if graphs is None else graphs
    eos, ticks = stop_sets(model, tok)
    gen = torch.Generator(device=device)
    out, sent = [], {}               # sent: prompt index -> the Completion on_done got (a retried batch keeps it)

    def send(k, c):
        if k not in sent:
            sent[k] = c
            on_done(k, c)
    i, most = 0, batch_size          # most: rows per batch, lowered for good by an out-of-memory event
    while i < len(prompts):
        batch = prompts[i:i + most]
        L = BUCKET * math.ceil((max(len(p) for p in batch) + max_new_tokens) / BUCKET)
        try:
            slot, n = _slot_for(st, len(batch), L, device, budget,  # n < len(batch): the cache would not fit
                                _held_bytes(other))
            batch = batch[:n]
            P = max(len(p) for p in batch)      # of the rows that run: the slot's columns and positions follow it
            caps = None if max_lens is None else max_lens[i:i + n]
            done = _fast_batch(st, slot, tok, batch, P, device, gen, seed, i, max_new_tokens, temperature, top_p,
                               eos, ticks, ignore_stop, use_graphs, record, caps,
                               None if arows is None else arows[i:i + n],
                               None if on_done is None else (lambda b, c, i=i: send(i + b, c)))
        except torch.OutOfMemoryError:
            if len(batch) == 1:
                raise
            most = max(1, len(batch) // 2)
            print(f"[fastgen] out of GPU memory at {len(batch)} rows; dropping the KV slot and retrying "
                  f"with {most}", file=sys.stderr)
            MEMORY["oom_retries"] += 1
            for s in (st, other):
                if s is not None:
                    s["slots"].clear()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
                torch.cuda.empty_cache()
            continue
        if on_done is not None:
            for b, c in enumerate(done):
                send(i + b, c)
            done = [sent[i + b] for b in range(len(done))]
        out += done
        i += n
    return out


def _noise_seed(seed, step, block):
    """A 63-bit generator seed for one block of rows at one step (blake2b: well mixed, host side, ~1 us)."""
    digest = hashlib.blake2b(f"{seed}/{step}/{block}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def _noise_plan(rows, device):
    """(blocks, pick) for _draw_noise: the NOISE_ROWS-row blocks that the call rows `rows` (a host list of
    their indices in the generate() call) fall in, and each row's place in those blocks drawn one after
    another. Made once per set of running rows (it changes only when rows leave the batch)."""
    blocks = sorted({r // NOISE_ROWS for r in rows})
    at = {b: k for k, b in enumerate(blocks)}
    return blocks, torch.tensor([at[r // NOISE_ROWS] * NOISE_ROWS + r % NOISE_ROWS for r in rows], device=device)


def _draw_noise(out, gen, seed, step, plan):
    """Exp(1) noise for the rows of `plan` (_noise_plan) at decode step `step`, into out [rows, V]. Each
    block of NOISE_ROWS call rows is drawn whole from a generator seeded by (seed, step, block), so a row's
    noise does not depend on which rows share its batch (on CUDA a draw's values can depend on the
    tensor's size: a block's size never changes)."""
    blocks, pick = plan
    V = out.shape[1]
    buf = torch.empty(len(blocks), NOISE_ROWS, V, device=out.device)
    for k, b in enumerate(blocks):
        gen.manual_seed(_noise_seed(seed, step, b))
        buf[k].exponential_(generator=gen)
    torch.index_select(buf.view(-1, V), 0, pick, out=out)


def _prefill_shared(st, slot, batch, ids, pad, device, arow, arows):
    """Prefill batch (its left-padded ids [B, P], pad: [B] left pad counts, arow: [B] each row's adapter; arows:
    the same on the host, or None) into the slot's rows 0..B-1 and return the last-position logits [B, V]; each
    distinct (prompt, adapter) runs once and is copied to its twins."""
    B, P = ids.shape
    index, rep, uniq = {}, [], []      # distinct prompt -> its number; each row's number; first rows
    for b, prompt in enumerate(batch):
        key = (arows and arows[b], tuple(prompt)) if SHARE_PREFILL else b
        if key not in index:
            index[key] = len(uniq)
            uniq.append(b)
        rep.append(index[key])
    U, uniq = len(uniq), torch.tensor(uniq, device=device)
    slot["pos0"][:U].copy_(-pad[uniq])
    slot["key_ok"][:U].copy_(slot["ar"][None] >= pad[uniq, None])
    slot["arow"][:U].copy_(arow[uniq])
    ids = ids[uniq]
    rows = 32768 // P + 1                                                       # prefill rows per chunk
    logits = torch.cat([_prefill(st, slot, ids[b0:b0 + rows], b0, min(U, b0 + rows)) for b0 in range(0, U, rows)])
    if U < B:    # copy to the twins (one layer at a time: the temporary is one layer's rows)
        rep = torch.tensor(rep, device=device)
        for li in range(slot["k"].shape[0]):
            slot["k"][li, :B, :, :P] = slot["k"][li, rep, :, :P]
            slot["v"][li, :B, :, :P] = slot["v"][li, rep, :, :P]
        logits = logits[rep]
    slot["key_ok"][:B].copy_(slot["ar"][None] >= pad[:, None])
    slot["arow"][:B].copy_(arow)
    return logits


def _groups(batch, arows=None):
    """(rep, first, member): each row's group (rows with identical prompts, and the same adapter where arows
    names one per row, share one, numbered by first appearance; a prompt with more than GROUP_MAX rows gets a
    group per GROUP_MAX of them), each group's first row, and each row's place among its group's rows."""
    index, seen, rep, first, member = {}, {}, [], [], []
    for b, prompt in enumerate(batch):
        key = (0 if arows is None else arows[b], tuple(prompt))
        n = seen[key] = seen.get(key, -1) + 1
        u = index.setdefault((key, n // GROUP_MAX), len(first))
        if u == len(first):
            first.append(b)
        rep.append(u)
        member.append(n % GROUP_MAX)
    return rep, first, member


def _carve(st, slot, U, GM, S):
    """The slot's K/V memory as a shared-prefix layout (section 4's note) for U groups of at most GM rows
    and S suffix columns: per layer, prefix pk/pv [U, hkv, Pp, d] then suffix sk/sv [R, hkv, S, d], views
    of the same memory; with the index buffers plen [U], rowof [U, GM], midx [R]. Cached in the slot."""
    c = slot["carves"].get((U, GM, S))
    if c is None:
        nl, R, hkv, L, d = slot["k"].shape
        Pp = R * (L - S) // U
        a, z = U * hkv * Pp * d, U * hkv * Pp * d + R * hkv * S * d

        def part(buf, lo, hi, shape):
            return buf.view(nl, R * hkv * L * d)[:, lo:hi].view(nl, *shape)
        dev = slot["k"].device
        c = {"U": U, "GM": GM, "S": S, "Pp": Pp, "views": {},
             "pk": part(slot["k"], 0, a, (U, hkv, Pp, d)), "pv": part(slot["v"], 0, a, (U, hkv, Pp, d)),
             "sk": part(slot["k"], a, z, (R, hkv, S, d)), "sv": part(slot["v"], a, z, (R, hkv, S, d)),
             "plen": torch.ones(U, dtype=torch.long, device=dev),
             "rowof": torch.zeros(U, GM, dtype=torch.long, device=dev),
             "midx": torch.zeros(R, dtype=torch.long, device=dev)}
        slot["carves"][(U, GM, S)] = c
    return c


def _carve_view(st, slot, c, b):
    """The carve's first b rows as a slot view for _decode_step (the suffixes as its k/v). Cached."""
    v = c["views"].get(b)
    if v is None:
        m = st["meta"]
        v = {key: slot[key] for key in ("pool", "cos", "sin", "col")}
        v.update({key: slot[key][:b] for key in ("tok", "pos", "noise", "arow")})
        v.update({key: c[key] for key in ("pk", "pv", "plen", "rowof")})
        v.update(k=c["sk"][:, :b], v=c["sv"][:, :b], midx=c["midx"][:b], L=c["S"])
        fast = two_part.kernel_works(slot["k"].device, m["dtype"], m["hq"], m["hkv"], m["d"])
        v["two_part"] = two_part.attention_triton if fast else two_part.attention_torch
        c["views"][b] = v
    return v


def _set_members(c, live, rep, member):
    """rowof and midx for slot rows running the batch rows `live` (rep, member: _groups). Places whose row
    has left, and rows past len(live), point at row 0 / member 0: computed, never read."""
    rowof, midx = [[0] * c["GM"] for _ in range(c["U"])], [0] * c["midx"].shape[0]
    for r, b in enumerate(live):
        rowof[rep[b]][member[b]] = r
        midx[r] = rep[b] * c["GM"] + member[b]
    c["rowof"].copy_(torch.tensor(rowof))
    c["midx"].copy_(torch.tensor(midx))


def _prefill_prefix(st, slot, ids, pad, rep, first, member, S, arow):
    """Shared-prefix prefill: each group's prompt (its first row of the left-padded ids [B, P]) runs once
    into the group's prefix, then moves left by its padding (columns 0..plen-1). Returns (the
    last-position logits [B, V], each row its group's; the carve)."""
    B, P = ids.shape
    U, dev = len(first), ids.device
    c = _carve(st, slot, U, max(member) + 1, S)
    assert c["Pp"] >= P, (c["Pp"], P)            # L >= P + S and R >= U make it so (section 4's note)
    uniq = torch.tensor(first, device=dev)
    slot["pos0"][:U].copy_(-pad[uniq])
    slot["key_ok"][:U].copy_(slot["ar"][None] >= pad[uniq, None])
    slot["arow"][:U].copy_(arow[uniq])              # each group's adapter while its prompt runs
    into = {**slot, "k": c["pk"], "v": c["pv"]}     # _prefill writes the prompts' K/V into the prefixes
    rows = 32768 // P + 1
    logits = torch.cat([_prefill(st, into, ids[uniq[b0:b0 + rows]], b0, min(U, b0 + rows))
                        for b0 in range(0, U, rows)])
    slot["gqa_prefill"] = into["gqa_prefill"]
    for u, p in enumerate(pad[uniq].tolist()):
        if p:
            for buf in (c["pk"], c["pv"]):
                buf[:, u, :, :P - p] = buf[:, u, :, p:P].clone()
    c["plen"].copy_(P - pad[uniq])
    slot["arow"][:B].copy_(arow)
    _set_members(c, range(B), rep, member)
    return logits[torch.tensor(rep, device=dev)], c


def _compact_prefix(st, slot, c, keep, C, live, rep, member):
    """_compact for the shared-prefix layout: the rows `keep` (ascending) move to the first rows with their
    suffix columns 0..C-1 and row state; the group map follows them (live: their batch rows); the prefixes
    stay. Returns the view of the row bucket they fit in."""
    dev = slot["k"].device
    keep_t, n = torch.tensor(keep, device=dev), len(keep)
    for li in range(c["sk"].shape[0]):    # one layer at a time: the temporary is one layer's rows
        c["sk"][li, :n, :, :C] = c["sk"][li, keep_t, :, :C]
        c["sv"][li, :n, :, :C] = c["sv"][li, keep_t, :, :C]
    for key in ("tok", "pos", "arow"):
        slot[key][:n] = slot[key][keep_t]
    _set_members(c, live, rep, member)
    return _carve_view(st, slot, c, _row_bucket(n))


def _compact(st, slot, keep, C, m, pads):
    """Move the slot's rows `keep` (ascending) to its first rows: their row state, and their K/V columns
    m..C-1 to 0..C-m-1 (C: columns written; m: left padding all of them have, so attention stops reading
    it); pads: their left pad counts after the move. Returns the view of the row bucket they fit in."""
    dev = slot["k"].device
    keep_t, n = torch.tensor(keep, device=dev), len(keep)
    for li in range(slot["k"].shape[0]):   # one layer at a time: the temporary is one layer's rows
        slot["k"][li, :n, :, :C - m] = slot["k"][li, keep_t, :, m:C]
        slot["v"][li, :n, :, :C - m] = slot["v"][li, keep_t, :, m:C]
    for key in ("tok", "pos", "arow"):
        slot[key][:n] = slot[key][keep_t]
    slot["key_ok"][:n] = slot["ar"][None] >= torch.tensor(pads, device=dev)[:, None]
    slot["col"].sub_(m)
    return _view(st, slot, _row_bucket(n))


def _fast_batch(st, slot, tok, batch, P, device, gen, seed, row0, max_new_tokens, temperature, top_p, eos,
                ticks, ignore_stop, use_graphs, record, caps, arows=None, emit=None):
    """One batch's prefill and decode loop -> its Completions; emit(b, completion): row b's as soon as the stop
    check sees it finished."""
    B, R = len(batch), _row_bucket(len(batch))
    arow = torch.tensor(arows or [0] * B, dtype=torch.long, device=device)   # each row's adapter (stack rule)
    ids, mask = left_pad(batch, tok.pad_token_id, device)
    pad = (P - mask.sum(1))                                                     # [B] left pad counts
    pads, shift = [P - len(p) for p in batch], 0       # shift: columns dropped on the left by compaction
    tokens = torch.zeros(B, max_new_tokens, dtype=torch.long, device=device)
    sampling = temperature > 0
    n_max = max_new_tokens if caps is None else max(caps)
    check = not ignore_stop or caps is not None
    meta = st["meta"]
    share = SHARED_PREFIX is True or (SHARED_PREFIX == "auto" and device.type == "cuda" and two_part.kernel_works(
        device, meta["dtype"], meta["hq"], meta["hkv"], meta["d"]))
    rep, first, member = _groups(batch, arows) if share else (None, range(B), None)
    carve = None                           # the shared-prefix layout (section 4): where the batch repeats a prompt
    t_start = _clock(device)
    capture_s = 0.0
    with torch.no_grad():
        if len(first) < B:
            logits, carve = _prefill_prefix(st, slot, ids, pad, rep, first, member, max_new_tokens, arow)
            Pb = min(carve["Pp"], BUCKET * math.ceil(P / BUCKET))            # prefix columns attention reads
        else:
            logits = _prefill_shared(st, slot, batch, ids, pad, device, arow, arows)
        t_prefilled = _clock(device)
        STATS["prefill_s"] += t_prefilled - t_start
        if record is not None:
            record.append(logits.clone())
        if sampling:
            plan = _noise_plan(range(row0, row0 + B), device)
            _draw_noise(slot["noise"][:B], gen, seed, 0, plan)
        tokens[:, 0] = _sample(logits, temperature, top_p, slot["noise"][:B])
        slot["key_ok"][B:R] = True                              # filler rows: finite, positions in range
        slot["pos"][B:R] = 0
        slot["arow"][B:R] = 0
        slot["tok"][:B].copy_(tokens[:, 0])
        slot["col"].fill_(0 if carve else P)
        slot["pos"][:B].copy_(P - pad)
        view = _carve_view(st, slot, carve, R) if carve else _view(st, slot, R)
        live, live_t = list(range(B)), torch.arange(B, device=device)   # original row of each slot row
        moved = False                         # rows have moved (compaction)
        stops, checked = [None] * B, 0
        host = [[] for _ in range(B)]
        ended = {}                            # row -> its Completion, made when its stop was seen (emit)
        cap_of = (lambda b: max_new_tokens) if caps is None else (lambda b: caps[b])
        n = 1
        while n < n_max:
            c = (0 if carve else P - shift) + n - 1                             # column written this step
            Lb = min(view["L"], BUCKET * math.ceil((c + 1) / BUCKET))
            if carve:
                Lb = (Pb, Lb)
            if sampling:
                _draw_noise(slot["noise"][:len(live)], gen, seed, n, plan)
            rows = view["tok"].shape[0]
            gkey = (rows, Lb, temperature, top_p) + ((carve["U"], carve["GM"], carve["S"]) if carve else ())
            if use_graphs and gkey not in slot["graphs"]:
                t_cap = time.perf_counter()
                try:
                    slot["graphs"][gkey] = _capture(st, view, Lb, temperature, top_p)
                    capture_s += time.perf_counter() - t_cap
                except RuntimeError as e:   # never lose a generation to a capture failure: run eagerly
                    print(f"[fastgen] CUDA graph capture failed ({str(e)[:120]}); fast path continues "
                          "without graphs for this batch", file=sys.stderr)
                    use_graphs = False
            if use_graphs:
                slot["graphs"][gkey].replay()
            else:
                step = None if record is None else []
                _decode_step(st, view, Lb, temperature, top_p, step)
                if record is not None:
                    full = torch.full((B, step[0].shape[1]), float("nan"), device=device)
                    full[live_t] = step[0][:len(live)]
                    record.append(full)
            if not moved:
                tokens[:, n] = slot["tok"][:B]
            else:
                tokens[live_t, n] = slot["tok"][:len(live)]
            n += 1
            if check and (n % CHECK_EVERY == 0 or n == n_max):
                new = tokens[live_t, checked:n].tolist()                        # the one sync per window
                for j, b in enumerate(live):
                    host[b] += new[j]
                    if stops[b] is None and not ignore_stop:
                        stops[b] = find_stop(tok, host[b], eos, ticks, start=checked)
                    if stops[b] is None and caps is not None and n >= caps[b]:
                        stops[b] = caps[b] - 1
                    if emit is not None and stops[b] is not None and b not in ended:
                        # the cut needs no token past the stop, so this is the Completion the batch's end makes
                        ended[b] = cut_completion(tok, batch[b], host[b][:cap_of(b)], eos, ticks, cap_of(b),
                                                  ignore_stop)
                        emit(b, ended[b])
                checked = n
                running = [j for j, b in enumerate(live) if stops[b] is None]
                if not running:
                    break
                if COMPACT and _row_bucket(len(running)) < rows:   # finished rows leave the batch
                    live = [live[j] for j in running]
                    if carve:
                        view = _compact_prefix(st, slot, carve, running, n - 1, live, rep, member)
                    else:
                        m = min(pads[b] for b in live) - shift
                        view = _compact(st, slot, running, P - shift + n - 1, m, [pads[b] - shift - m for b in live])
                        shift += m
                    live_t = torch.tensor(live, device=device)
                    moved = True
                    if sampling:
                        plan = _noise_plan([row0 + b for b in live], device)
        rows_ids = tokens[:, :n].tolist()
    STATS["capture_s"] += capture_s
    STATS["decode_s"] += time.perf_counter() - t_prefilled - capture_s
    return [ended[b] if b in ended else cut_completion(tok, p, rows_ids[b][:cap_of(b)], eos, ticks, cap_of(b),
                                                       ignore_stop)
            for b, p in enumerate(batch)]
