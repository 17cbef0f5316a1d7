"""Tests of fastgen.py, the fast static-cache decoder: greedy tokens equal HF generate's (three
architectures, LoRA adapters switched, a 4-bit base), sampled logits equal HF's forward, weights are
repacked in place, the fused-attention fallbacks, the sampler's distribution, the stop rule, the memory
estimate; shared prefill, compaction and the one reused slot keep every row's tokens. On CPU the decoder
runs eagerly (no CUDA graphs); the GPU runs are in results/bench.md.

Run: python -m pytest -q tests/test_fastgen.py
"""
import contextlib
import weakref

import pytest
import torch

import common
import fastgen
import fastpack
from test_common import MSGS, _randomize_lora, _tokens, one_thread, tiny  # noqa: F401 (fixtures, shared helpers)

@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_fast_greedy_equals_hf_with_lora_and_switch(arch):
    model, tok = common.tiny_model(0, arch=arch)
    pm = common.add_lora(model, r=4, alpha=8, dropout=0.0, adapter_name="student")
    pm = common.add_lora(pm, r=4, alpha=16, dropout=0.0, adapter_name="teacher")
    _randomize_lora(pm, 2)
    kw = dict(max_new_tokens=30, temperature=0, batch_size=2)
    for name in ("student", "teacher", "student"):
        pm.set_adapter(name)
        hf = common.generate(pm, tok, MSGS, fast=False, **kw)
        fast = common.generate(pm, tok, MSGS, fast=True, **kw)
        assert _tokens(hf) == _tokens(fast), (arch, name)
        assert [c.text for c in hf] == [c.text for c in fast]
    with pm.disable_adapter():  # base weights only: must differ from the adapter's output
        base = common.generate(pm, tok, MSGS, fast=True, **kw)
        assert _tokens(base) == _tokens(common.generate(pm, tok, MSGS, fast=False, **kw))
    assert _tokens(base) != _tokens(fast)


def test_fast_4bit_base_equals_hf(tmp_path):
    """A 4-bit base: the fast decoder dequantizes it into a dense copy with the LoRA folded in and decodes
    the same greedy tokens as HF generate."""
    pytest.importorskip("bitsandbytes")
    model, tok = common.tiny_model(0)
    model.save_pretrained(tmp_path / "m")
    tok.save_pretrained(tmp_path / "m")
    q, qtok = common.load_model(str(tmp_path / "m"), quant="4bit")
    pm = common.add_lora(q, r=4, alpha=8, dropout=0.0)
    _randomize_lora(pm, 5)
    kw = dict(max_new_tokens=20, temperature=0, batch_size=3)
    fast = common.generate(pm, qtok, MSGS, fast=True, **kw)
    assert _tokens(fast) == _tokens(common.generate(pm, qtok, MSGS, fast=False, **kw))
    layer = fastpack.hf_causal_lm(pm).__dict__["_chorus_fast"]["W"]["layers"][0]
    assert all(isinstance(layer[g]["w"], torch.Tensor) for g in ("qkv", "o", "gu", "down"))


def test_fast_base_weights_survive_adapter_on_off():
    """Packing folds the adapter into the decoder's own buffers, never into the model's weights: base,
    adapter, base again all decode like HF, and the base parameters are unchanged."""
    model, tok = common.tiny_model(0)
    pm = common.add_lora(model, r=4, alpha=8, dropout=0.0)
    _randomize_lora(pm, 6)
    before = {n: p.detach().clone() for n, p in pm.named_parameters()}
    kw = dict(max_new_tokens=16, temperature=0)
    outs = []
    for use_adapter in (False, True, False):
        ctx = contextlib.nullcontext() if use_adapter else pm.disable_adapter()
        with ctx:
            fast = common.generate(pm, tok, MSGS, fast=True, **kw)
            assert _tokens(fast) == _tokens(common.generate(pm, tok, MSGS, fast=False, **kw)), use_adapter
        outs.append(_tokens(fast))
    assert outs[0] == outs[2] != outs[1]
    assert all(torch.equal(p, before[n]) for n, p in pm.named_parameters())


def test_fast_repacks_into_the_same_buffers(monkeypatch):
    """A later generate() copies the new weights into the decoder's existing buffers layer by layer (no
    second full copy, and the captured graphs keep reading the same memory); a shape change rebuilds."""
    model, tok = common.tiny_model(0)
    pm = common.add_lora(model, r=4, alpha=8, dropout=0.0)
    _randomize_lora(pm, 4)
    kw = dict(max_new_tokens=12, temperature=0, fast=True)
    common.generate(pm, tok, MSGS, **kw)
    hf = fastpack.hf_causal_lm(pm)
    st = hf.__dict__["_chorus_fast"]
    ptrs = [L["qkv"]["w"].data_ptr() for L in st["W"]["layers"]] + [st["W"]["head"]["w"].data_ptr()]
    _randomize_lora(pm, 5)
    out = common.generate(pm, tok, MSGS, **kw)
    assert hf.__dict__["_chorus_fast"] is st
    assert ptrs == [L["qkv"]["w"].data_ptr() for L in st["W"]["layers"]] + [st["W"]["head"]["w"].data_ptr()]
    assert _tokens(out) == _tokens(common.generate(pm, tok, MSGS, max_new_tokens=12, temperature=0, fast=False))
    full = st["W"]["layers"][0]["gu"]["w"].shape
    st["W"]["layers"][0]["gu"]["w"] = st["W"]["layers"][0]["gu"]["w"][:-1]   # a stale shape: must rebuild
    old = weakref.ref(st["W"]["layers"][1]["qkv"]["w"])
    del st
    fresh_pack, freed_first = fastpack.pack_weights, []

    def spy(m, into=None, stack=None):
        if into is None:                        # the rebuild: the old copy must be gone by now
            freed_first.append(old() is None)
        return fresh_pack(m, into=into, stack=stack)
    monkeypatch.setattr(fastpack, "pack_weights", spy)
    out = common.generate(pm, tok, MSGS, **kw)
    assert freed_first == [True]
    assert hf.__dict__["_chorus_fast"]["W"]["layers"][0]["gu"]["w"].shape == full
    assert _tokens(out) == _tokens(common.generate(pm, tok, MSGS, max_new_tokens=12, temperature=0, fast=False))


def test_fast_picks_up_in_place_weight_updates(tiny):
    model, tok = common.tiny_model(0)
    pm = common.add_lora(model, r=4, alpha=8, dropout=0.0)
    _randomize_lora(pm, 3)
    kw = dict(max_new_tokens=20, temperature=0, fast=True)
    before = _tokens(common.generate(pm, tok, MSGS, **kw))
    with torch.no_grad():  # an optimizer-like in-place update of the adapter
        for n, p in pm.named_parameters():
            if "lora_B" in n:
                p.mul_(-1.5)
    after = common.generate(pm, tok, MSGS, **kw)
    assert _tokens(after) == _tokens(common.generate(pm, tok, MSGS, max_new_tokens=20, temperature=0, fast=False))
    assert _tokens(after) != before


@pytest.mark.parametrize("arch", ["qwen3", "llama"])
@pytest.mark.parametrize("fused", [False, True])
def test_fast_sampled_logits_match_hf_forward(arch, fused, monkeypatch):
    """Sampling with padding, temperature and top-p: every step's logits equal HF's full forward, with
    random norm weights (HF initialises them to ones). fused: the one-call GQA attention (on CPU through
    torch's math kernel; on a GPU cuDNN's), else the portable form (two matmuls / repeated K/V)."""
    from torch.nn.attention import SDPBackend
    if fused:
        monkeypatch.setattr(fastgen, "_GQA_BACKENDS", [SDPBackend.MATH])
    model, tok = common.tiny_model(1, arch=arch)
    with torch.no_grad():
        g = torch.Generator().manual_seed(7)
        for n, p in model.named_parameters():
            if "norm" in n:
                p.copy_(0.5 + torch.rand(p.shape, generator=g))
    pm = common.add_lora(model, r=4, alpha=8, dropout=0.0)
    _randomize_lora(pm, 4)
    prompts = [common.chat_ids(tok, m) for m in MSGS]
    record = []
    outs = fastgen.generate(pm, tok, prompts, max_new_tokens=24, temperature=0.8, top_p=0.9, seed=5,
                              batch_size=3, graphs=False, record=record, ignore_stop=True)
    slots = fastpack.hf_causal_lm(pm).__dict__["_chorus_fast"]["slots"]
    assert [(v["gqa"], s["gqa_prefill"]) for s in slots.values() for v in s["views"].values()] == [(fused, fused)]
    steps = torch.stack(record, 1)  # [B, steps, V]
    for b, (p, c) in enumerate(zip(prompts, outs)):
        assert len(c.completion_ids) == 24 and c.truncated
        with torch.no_grad():
            ref = pm(torch.tensor([p + c.completion_ids])).logits[0, len(p) - 1:-1]  # [24, V]
        torch.testing.assert_close(steps[b], ref, atol=2e-4, rtol=1e-4)   # fp32 sums in another order
    again = fastgen.generate(pm, tok, prompts, max_new_tokens=24, temperature=0.8, top_p=0.9, seed=5,
                               batch_size=3, graphs=False, ignore_stop=True)
    assert _tokens(again) == _tokens(outs)  # deterministic given seed


def test_fast_prefill_falls_back_when_the_fused_call_fails(monkeypatch):
    """A prefill shape the fused kernel refuses: that prefill and later ones take the portable form, decode
    keeps the fused one, and the tokens still equal HF's."""
    from torch.nn.attention import SDPBackend
    monkeypatch.setattr(fastgen, "_GQA_BACKENDS", [SDPBackend.MATH])
    fused = fastgen._gqa_attention

    def no_prefill(q, k, v, mask, scale):
        if q.shape[2] > 1:
            raise RuntimeError("no kernel for this shape")
        return fused(q, k, v, mask, scale)
    monkeypatch.setattr(fastgen, "_gqa_attention", no_prefill)
    model, tok = common.tiny_model(0)
    kw = dict(max_new_tokens=10, temperature=0)
    fast = common.generate(model, tok, MSGS, fast=True, **kw)
    slot = next(iter(fastpack.hf_causal_lm(model).__dict__["_chorus_fast"]["slots"].values()))
    assert all(v["gqa"] for v in slot["views"].values()) and not slot["gqa_prefill"]
    assert _tokens(fast) == _tokens(common.generate(model, tok, MSGS, fast=False, **kw))


def test_fast_declines_partial_rotary(capsys):
    """A model the decoder's rotary cannot do exactly (partial rotary) is declined: generate() says so in
    one line and uses HF generate, with HF's tokens."""
    model, tok = common.tiny_model(0)
    model.config.partial_rotary_factor = 0.5
    with pytest.raises(fastgen.FastUnsupported, match="partial rotary"):
        fastpack.pack_weights(model)
    kw = dict(max_new_tokens=8, temperature=0)
    out = common.generate(model, tok, MSGS, fast=True, **kw)
    assert "fast generation unsupported" in capsys.readouterr().out
    assert _tokens(out) == _tokens(common.generate(model, tok, MSGS, fast=False, **kw))


def test_sampler_matches_hf_warpers():
    """Our temperature + top-p + exponential-race draw has HF's distribution (frequencies)."""
    from transformers.generation.logits_process import TemperatureLogitsWarper, TopPLogitsWarper
    logits = torch.tensor([[2.0, 1.5, 1.0, 0.3, -1.0, -3.0]])
    T, top_p, n = 0.7, 0.8, 40000
    ref = TopPLogitsWarper(top_p)(None, TemperatureLogitsWarper(T)(None, logits.clone())).softmax(-1)[0]
    g = torch.Generator().manual_seed(0)
    noise = torch.empty(n, 6).exponential_(generator=g)
    draws = fastgen._sample(logits.expand(n, 6), T, top_p, noise)
    freq = torch.bincount(draws, minlength=6).float() / n
    assert (freq[ref == 0] == 0).all()
    assert torch.allclose(freq, ref, atol=0.01), (freq, ref)
    assert fastgen._sample(logits, 0, 1.0, None).item() == 0


def test_stop_at_closing_fence_and_eos(tiny):
    model, tok = tiny
    eos, ticks = fastgen.stop_sets(model, tok)
    ids = tok("filename: tb.sv\n```systemverilog\nmodule tb; endmodule\n```\nextra words", add_special_tokens=False
              )["input_ids"]
    i = fastgen.find_stop(tok, ids, eos, ticks)
    assert tok.decode(ids[:i + 1]).rstrip().endswith("```") and not fastgen.fence_closed(tok.decode(ids[:i]))
    c = fastgen.cut_completion(tok, [1], ids + [tok.eos_token_id], eos, ticks, 100)
    assert not c.truncated and c.completion_ids == ids[:i + 1]
    c = fastgen.cut_completion(tok, [1], ids[:5] + [tok.eos_token_id, 7], eos, ticks, 100)
    assert c.completion_ids == ids[:5] + [tok.eos_token_id] and not c.truncated
    c = fastgen.cut_completion(tok, [1], ids[:5], eos, ticks, 5)
    assert c.truncated and len(c.completion_ids) == 5


def test_gpu_free_bytes_applies_the_memory_cap_once(monkeypatch):
    """A 24 GiB cap on a 140 GiB card with 10 GiB allocated leaves 14 GiB, also when mem_get_info
    already reports the capped size (as bench_4b.py's emulated 24 GB card does). Multiplying the
    fraction into the reported size left ~0 and split every fast-path batch down to 1 (on an H200)."""
    G = 2**30
    card, frac, alloc = 140 * G, 24 / 140, 10 * G
    props = type("P", (), {"total_memory": card})()
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d=None: props)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda d=None: alloc)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda d=None: 11 * G)
    monkeypatch.setattr(torch.cuda, "get_per_process_memory_fraction", lambda d=None: frac, raising=False)
    for reported in ((card - 20 * G, card), (24 * G - 11 * G, 24 * G)):        # real card / emulated cap
        monkeypatch.setattr(torch.cuda, "mem_get_info", lambda d=None, r=reported: r)
        assert abs(fastgen._gpu_free_bytes(0) - 14 * G) < 0.01 * G, reported
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda d=None: (1 * G, card))   # others use the card
    assert abs(fastgen._gpu_free_bytes(0) - 2 * G) < 0.01 * G                    # 1 free + 1 reserved unused


def test_layering_and_common_reexports():
    """fastgen imports no project module but fastpack (its packed weights), two_part (its attention kernels),
    lora_stack (its stacked-LoRA kernel) and decode_fuse (its rotary + K/V write and SiLU-mul kernels); fastpack
    none, the kernel modules only probe (their kernels' check against the torch forms), probe none (common imports
    fastgen: one direction); and the names callers use through common are fastgen's own objects (FastUnsupported is
    fastpack's, as fastgen names it)."""
    import ast
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    project = {p.stem for p in root.glob("*.py")}
    for name, allowed in (("fastgen", {"fastpack", "two_part", "lora_stack", "decode_fuse"}), ("fastpack", set()),
                          ("two_part", {"probe"}), ("lora_stack", {"probe"}), ("decode_fuse", {"probe"}),
                          ("probe", set())):
        tree = ast.parse((root / f"{name}.py").read_text())
        imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert "torch" in imported and imported & project == allowed, (name, imported & project)
    for name in ("Completion", "FastUnsupported", "fence_closed", "find_stop", "free_fast_cache"):
        assert getattr(common, name) is getattr(fastgen, name), name
    assert fastgen.FastUnsupported is fastpack.FastUnsupported


def _rl_like(tok):
    """Six rows: one chat x 3, another x 2, a third once (as RL repeats each prompt G times)."""
    msgs = [MSGS[0]] * 3 + [MSGS[2]] * 2 + [MSGS[1]]
    return [common.chat_ids(tok, m) for m in msgs]


def _run(pm, tok, prompts, monkeypatch, fast_paths, **kw):
    """fastgen.generate with shared prefill and compaction on or off; -> (completions, record, prefill rows,
    row counts of the views used, left columns dropped at each compaction)."""
    monkeypatch.setattr(fastgen, "SHARE_PREFILL", fast_paths)
    monkeypatch.setattr(fastgen, "COMPACT", fast_paths)
    fastgen.free_fast_cache(pm)
    rows, prefill = [], fastgen._prefill
    monkeypatch.setattr(fastgen, "_prefill", lambda st, slot, ids, b0, b1: rows.append(b1 - b0) or
                        prefill(st, slot, ids, b0, b1))
    drops, compact = [], fastgen._compact
    monkeypatch.setattr(fastgen, "_compact", lambda st, slot, keep, C, m, pads: drops.append(m) or
                        compact(st, slot, keep, C, m, pads))
    record = []
    out = fastgen.generate(pm, tok, prompts, seed=11, batch_size=8, graphs=False, record=record, **kw)
    slot = next(iter(fastpack.hf_causal_lm(pm).__dict__["_chorus_fast"]["slots"].values()))
    return out, record, sum(rows), sorted(slot["views"]), drops


@pytest.mark.parametrize("temperature", [0, 0.9])
def test_shared_prefill_and_compaction_keep_every_rows_tokens(temperature, monkeypatch):
    """Repeated prompts are prefilled once and rows that reach their end leave the batch (6 rows on 6,
    then 4, then 2 slot rows; the longest prompts end first, so the first move also drops 6 columns of
    padding): every row's tokens, and its logits while it runs, equal the plain path's (each prompt
    prefilled, all rows to the end), greedy and sampled with the same seed."""
    model, tok = common.tiny_model(0)
    pm = common.add_lora(model, r=4, alpha=8, dropout=0.0)
    _randomize_lora(pm, 8)
    prompts = _rl_like(tok)
    kw = dict(max_new_tokens=40, temperature=temperature, top_p=0.95, ignore_stop=True,
              max_lens=[40, 5, 20, 3, 12, 40])                 # prompt lengths 32, 32, 32, 38, 38, 14
    fast, rec, pre, views, drops = _run(pm, tok, prompts, monkeypatch, True, **kw)
    plain, rec0, pre0, views0, drops0 = _run(pm, tok, prompts, monkeypatch, False, **kw)
    assert (pre, pre0) == (3, 6) and (views, views0) == ([2, 4, 6], [6])   # both mechanisms ran
    assert [len(p) for p in prompts] == [32, 32, 32, 38, 38, 14] and (drops, drops0) == ([6, 0], [])
    assert [len(c.completion_ids) for c in fast] == kw["max_lens"] and all(c.truncated for c in fast)
    assert _tokens(fast) == _tokens(plain)
    assert [c.text for c in fast] == [c.text for c in plain]
    torch.testing.assert_close(rec[0], rec0[0], atol=1e-4, rtol=1e-4)    # shared prefill: same logits
    for step, (a, b) in enumerate(zip(rec[1:], rec0[1:]), start=1):      # decode: same while a row runs
        running = ~a.isnan().any(1)
        assert running.tolist() == [step < 16 or cap > 16 * (step // 16) for cap in kw["max_lens"]]
        torch.testing.assert_close(a[running], b[running], atol=1e-4, rtol=1e-4)  # fp32 rounding of other batch shapes
    if temperature:
        assert len({tuple(c.completion_ids[:3]) for c in fast[:3]}) > 1   # twins still sample apart


def test_compaction_with_stop_tokens_equals_plain_path(monkeypatch):
    """Rows ending at a stop token (here: one frequent token made the EOS) leave the batch too, and each
    completion equals the plain path's, cut after its stop."""
    model, tok = common.tiny_model(0)
    prompts = _rl_like(tok)
    kw = dict(max_new_tokens=48, temperature=1.0, top_p=1.0)
    free = _run(model, tok, prompts, monkeypatch, False, ignore_stop=True, **kw)[0]
    counts = {}
    for c in free:
        for t in set(c.completion_ids[1:]):
            counts[t] = counts.get(t, 0) + 1
    stop_tok = max(counts, key=counts.get)             # ends most rows somewhere in the middle
    monkeypatch.setattr(fastgen, "stop_sets", lambda m, t: ({stop_tok}, frozenset()))
    fast, _, _, views, _ = _run(model, tok, prompts, monkeypatch, True, **kw)
    plain = _run(model, tok, prompts, monkeypatch, False, **kw)[0]
    assert _tokens(fast) == _tokens(plain) and len(views) > 1
    for c, f in zip(fast, free):
        i = f.completion_ids.index(stop_tok) if stop_tok in f.completion_ids else None
        assert c.completion_ids == (f.completion_ids if i is None else f.completion_ids[:i + 1])


def test_row_buckets_and_one_slot_reused_across_calls():
    """Calls with other batch sizes and longer prompts reuse the one slot while they fit; a call that
    does not fit grows it to the larger of both shapes, so the next smaller call reuses it again."""
    assert [fastgen._row_bucket(n) for n in (1, 2, 3, 5, 7, 9, 13, 17, 25, 33, 64, 65)] == \
        [1, 2, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96]
    model, tok = common.tiny_model(0)
    kw = dict(temperature=0, top_p=1.0, seed=0, batch_size=64, ignore_stop=True)
    prompts = _rl_like(tok)
    st = lambda: fastpack.hf_causal_lm(model).__dict__["_chorus_fast"]       # noqa: E731
    fastgen.generate(model, tok, prompts[:5], max_new_tokens=8, **kw)
    slot = st()["slots"][6]
    fastgen.generate(model, tok, prompts[:3], max_new_tokens=8, **kw)         # fewer rows: same slot
    assert list(st()["slots"].values()) == [slot]
    long = [p * 12 for p in prompts[:2]]                                       # prompts over one BUCKET
    fastgen.generate(model, tok, long, max_new_tokens=8, **kw)
    (R, grown), = st()["slots"].items()
    assert grown is not slot and (R, grown["L"]) == (6, 2 * fastgen.BUCKET)   # rows kept, columns grown
    out = fastgen.generate(model, tok, prompts, max_new_tokens=8, **kw)
    assert st()["slots"][6] is grown
    assert _tokens(out) == _tokens(common._generate_hf(model, tok, prompts, max_new_tokens=8, temperature=0,
                                                       top_p=1.0, seed=0, batch_size=64, ignore_stop=True))


def test_slot_growth_keeps_the_memory_rule(monkeypatch):
    """On a GPU the KV cache stays within half of the free memory (the old slot's counted as free): the
    slot grows to the larger of both shapes where that fits, else to what the call needs, else the batch
    is halved (the 24 GB card rule)."""
    model, _ = common.tiny_model(0)
    st = fastgen._fast_state(model)
    made = []

    def new_slot(st_, R, L, device):
        st_["slots"].clear()
        st_["slots"][R] = {"R": R, "L": L}
        made.append((R, L))
        return st_["slots"][R]
    monkeypatch.setattr(fastgen, "_new_slot", new_slot)
    cuda = type("D", (), {"type": "cuda"})()
    per = fastgen._cache_bytes(st, 1, 1)                       # bytes per row and column
    monkeypatch.setattr(fastgen, "_gpu_free_bytes", lambda d: 2 * per * 64 * 1024)
    assert fastgen._slot_for(st, 64, 1024, cuda)[1] == 64      # 64 x 1024 = half of free: fits
    assert fastgen._slot_for(st, 16, 512, cuda)[1] == 16 and made == [(64, 1024)]   # fits the slot
    assert fastgen._slot_for(st, 16, 2048, cuda)[1] == 16      # 64 x 2048 too big: just what it needs
    assert made[-1] == (16, 2048)
    assert fastgen._slot_for(st, 32, 2304, cuda)[1] == 32      # fits only with the old slot's bytes freed
    assert made[-1] == (32, 2304)
    monkeypatch.setattr(fastgen, "_gpu_free_bytes", lambda d: 0)
    slot, n = fastgen._slot_for(st, 64, 4096, cuda)            # half of 32 x 2304: 64 rows halved to 8
    assert (n, made[-1]) == (8, (8, 4096))


def _short_then_long(tok):
    """Four prompts, the longest last: a batch cut in front of it has shorter prompts than the window."""
    p = [common.chat_ids(tok, m) for m in (MSGS[1], MSGS[0], MSGS[2])]
    return [p[0], p[1], p[2], p[2] * 3]


@pytest.mark.parametrize("temperature", [0, 0.9])
def test_a_budget_that_cuts_the_batch_keeps_every_rows_tokens(temperature):
    """A KV budget that fits one row cuts a window of four prompts into four batches. Each row's tokens are
    those of the uncut call (greedy: also HF's), sampled too, since the noise is keyed by the row's place
    in the call. (The cut once kept the window's longest prompt length for shorter batches: their prompts
    sat at the wrong cache columns and rotary positions, and the answers were token soup.)"""
    model, tok = common.tiny_model(0)
    prompts = _short_then_long(tok)
    kw = dict(max_new_tokens=24, temperature=temperature, top_p=0.95, seed=3, batch_size=8, ignore_stop=True)
    whole = fastgen.generate(model, tok, prompts, **kw)
    st = fastpack.hf_causal_lm(model).__dict__["_chorus_fast"]
    assert list(st["slots"]) == [4]                                   # one batch of 4 rows
    cut = fastgen.generate(model, tok, prompts, budget=1, **kw)
    assert list(st["slots"]) == [1]                                   # rebuilt within the budget: 1 row
    assert _tokens(cut) == _tokens(whole) and [c.text for c in cut] == [c.text for c in whole]
    if temperature == 0:
        assert _tokens(whole) == _tokens(common._generate_hf(model, tok, prompts, max_new_tokens=24, temperature=0,
                                                             top_p=1.0, seed=0, batch_size=8, ignore_stop=True))
    else:
        assert len({tuple(c.completion_ids) for c in whole}) == 4     # rows sample apart
    L = fastgen.BUCKET * -(-(max(map(len, prompts)) + 24) // fastgen.BUCKET)
    two = fastgen.generate(model, tok, prompts, budget=fastgen._cache_bytes(st, 2, L), **kw)
    assert list(st["slots"]) == [2] and _tokens(two) == _tokens(whole)


def test_out_of_memory_cuts_the_batch_and_retries(monkeypatch, capsys):
    """A batch that runs out of memory (a fake allocator refuses more than two rows) is retried in halves
    after the slot is dropped; every answer comes back whole and equal to the uncut run's. One row that
    does not fit is an error, not a lost answer."""
    model, tok = common.tiny_model(0)
    prompts = _short_then_long(tok)
    kw = dict(max_new_tokens=16, temperature=0.9, top_p=1.0, seed=4, batch_size=4, ignore_stop=True)
    whole = fastgen.generate(model, tok, prompts, **kw)
    real, tried = fastgen._fast_batch, []

    def refusing(st, slot, tok_, batch, *a, **k):
        tried.append(len(batch))
        if len(batch) > rows_that_fit:
            raise torch.OutOfMemoryError("fake allocator: no room")
        return real(st, slot, tok_, batch, *a, **k)
    monkeypatch.setattr(fastgen, "_fast_batch", refusing)
    rows_that_fit, before = 2, fastgen.MEMORY["oom_retries"]
    cut = fastgen.generate(model, tok, prompts, **kw)
    assert tried == [4, 2, 2] and fastgen.MEMORY["oom_retries"] == before + 1
    assert _tokens(cut) == _tokens(whole) and all(len(c.completion_ids) == 16 for c in cut)
    assert "out of GPU memory at 4 rows" in capsys.readouterr().err
    rows_that_fit = 0
    with pytest.raises(torch.OutOfMemoryError):
        fastgen.generate(model, tok, prompts[:1], **kw)


def test_slot_for_keeps_to_the_budget_on_any_device(monkeypatch):
    """The budget bounds the slot on CPU as on CUDA: rows are halved until the cache fits (one row always
    gets a slot), and a slot made under a larger budget is rebuilt rather than reused."""
    model, _ = common.tiny_model(0)
    st = fastgen._fast_state(model)
    cpu = torch.device("cpu")
    per = fastgen._cache_bytes(st, 1, 512)
    slot, n = fastgen._slot_for(st, 16, 512, cpu, budget=None)
    assert (slot["R"], n) == (16, 16)
    slot2, n = fastgen._slot_for(st, 16, 512, cpu, budget=4 * per)
    assert (slot2["R"], n) == (4, 4) and slot2 is not slot
    assert fastgen._slot_for(st, 3, 256, cpu, budget=4 * per) == (slot2, 3)           # fits: reused
    slot3, n = fastgen._slot_for(st, 16, 512, cpu, budget=1)
    assert (slot3["R"], n) == (1, 1)
    assert fastgen.MEMORY["kv_peak_bytes"] >= 16 * per


def test_hf_path_retries_a_batch_that_runs_out_of_memory(monkeypatch, capsys):
    """The reference path halves a batch that runs out of memory and keeps every answer whole (greedy:
    the same tokens as the uncut call)."""
    model, tok = common.tiny_model(0)
    prompts = _short_then_long(tok)
    kw = dict(max_new_tokens=12, temperature=0, top_p=1.0, seed=0, batch_size=4, ignore_stop=True)
    whole = common._generate_hf(model, tok, prompts, **kw)
    real, sizes = model.generate, []

    def refusing(*a, **k):
        sizes.append(k["input_ids"].shape[0])
        if sizes[-1] > 1:
            raise torch.OutOfMemoryError("fake allocator: no room")
        return real(*a, **k)
    monkeypatch.setattr(model, "generate", refusing)
    cut = common._generate_hf(model, tok, prompts, **kw)
    assert sizes == [4, 2, 1, 1, 1, 1] and _tokens(cut) == _tokens(whole)
    assert "retrying with 2" in capsys.readouterr().err
