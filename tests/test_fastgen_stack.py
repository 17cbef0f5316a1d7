"""Tests of fastgen's stack rule: one generate() call whose rows run different LoRA adapters (OPD's teachers in
one decoder call). Each row's greedy tokens equal HF generate's under that row's adapter, with adapters of other
ranks and one that wraps only some linears, through shared prefill, the shared-prefix layout and compaction;
sampled rows equal a call that runs the same rows with one adapter; the decoder's own state switches back to
folded weights for a plain call; bad input is one line. On CPU the decoder runs eagerly (no CUDA graphs).

Run: python -m pytest -q tests/test_fastgen_stack.py
"""
import pytest
import torch
from peft import LoraConfig

import common
import fastgen
import fastpack
from test_common import MSGS, _randomize_lora, _tokens, one_thread  # noqa: F401 (fixture, shared helpers)


def _three_adapters():
    """A tiny model with three adapters: "default" (r 4), "wide" (r 8) and "attn" (r 2, q and v only)."""
    model, tok = common.tiny_model(0)
    pm = common.add_lora(model, r=4, alpha=8, dropout=0.0)
    pm = common.add_lora(pm, r=8, alpha=8, dropout=0.0, adapter_name="wide")
    pm.add_adapter("attn", LoraConfig(r=2, lora_alpha=6, lora_dropout=0.0, target_modules=["q_proj", "v_proj"],
                                      task_type="CAUSAL_LM"))
    _randomize_lora(pm, 3)
    pm.set_adapter("default")
    return pm, tok


def _hf(pm, tok, prompts, name, seed_override=0, **kw):
    with common.use_adapter(pm, name):
        return common._generate_hf(pm, tok, prompts, seed=seed_override, batch_size=16, **kw)


@pytest.mark.parametrize("layout", ["plain", "shared_prefill", "shared_prefix"])
def test_each_row_decodes_with_its_own_adapter(layout, monkeypatch):
    """Nine rows: three chats x three adapters, mixed in the batch (two rows repeat a chat and an adapter, so
    the shared layouts group them); caps make rows leave at 16 and 32 tokens (compaction). Every row's greedy
    tokens equal HF's under its adapter, and the adapters do decode apart."""
    monkeypatch.setattr(fastgen, "SHARE_PREFILL", layout != "plain")
    monkeypatch.setattr(fastgen, "COMPACT", True)
    monkeypatch.setattr(fastgen, "SHARED_PREFIX", layout == "shared_prefix")
    pm, tok = _three_adapters()
    chats = [common.chat_ids(tok, m) for m in MSGS]
    rows = [(0, "wide"), (1, "default"), (2, "attn"), (0, "default"), (1, "attn"), (2, "wide"), (0, "attn"),
            (0, "wide"), (1, "default")]
    prompts, names = [chats[c] for c, _ in rows], [a for _, a in rows]
    caps = [40, 5, 20, 3, 12, 40, 7, 30, 18]
    kw = dict(max_new_tokens=40, temperature=0, top_p=1.0, ignore_stop=True)
    out = fastgen.generate(pm, tok, prompts, seed=0, batch_size=16, graphs=False, max_lens=caps, adapters=names, **kw)
    st = fastpack.hf_causal_lm(pm).__dict__["_chorus_fast_stack"]
    assert st["stack"] == ["attn", "default", "wide"] and "la" in st["W"]["layers"][0]["qkv"]
    assert "la" not in st["W"]["head"]                       # no adapter wraps the head: nothing stacked there
    for name in ("wide", "default", "attn"):
        mine = [i for i, a in enumerate(names) if a == name]
        hf = _hf(pm, tok, [prompts[i] for i in mine], name, **kw)
        assert [out[i].completion_ids for i in mine] == [c.completion_ids[:caps[i]] for c, i in zip(hf, mine)], name
    assert out[0].completion_ids[:3] != out[3].completion_ids[:3]             # chat 0 under wide vs default
    slot = next(iter(st["slots"].values()))
    if layout == "shared_prefix":
        assert list(slot["carves"]) == [(7, 2, 40)]          # 9 rows, 7 (chat, adapter) groups
    assert pm.active_adapter == "default"


def test_sampled_rows_equal_a_one_adapter_call_and_plain_calls_fold_again():
    """Sampling keys a row's noise by its place in the call, so rows of one adapter in a stacked call equal the
    same rows in a call where every row runs that adapter; a plain call afterwards folds the active adapter in a
    state of its own and equals HF; the stacked state stays for the next call of the same stack, another stack
    rebuilds it, and free_fast_cache drops both."""
    pm, tok = _three_adapters()
    chats = [common.chat_ids(tok, m) for m in MSGS]
    kw = dict(max_new_tokens=24, temperature=0.9, top_p=0.95, seed=5, batch_size=16, graphs=False)
    only = fastgen.generate(pm, tok, chats * 2, adapters=["attn"] * 6, **kw)
    mixed = fastgen.generate(pm, tok, chats * 2, adapters=["attn"] * 3 + ["wide"] * 3, **kw)
    assert _tokens(mixed[:3]) == _tokens(only[:3]) and _tokens(mixed[3:]) != _tokens(only[3:])
    hf = fastpack.hf_causal_lm(pm)
    stacked = hf.__dict__["_chorus_fast_stack"]
    plain = common.generate(pm, tok, MSGS, max_new_tokens=16, temperature=0, fast=True)
    assert hf.__dict__["_chorus_fast"]["stack"] is None and hf.__dict__["_chorus_fast_stack"] is stacked
    assert _tokens(plain) == _tokens(common.generate(pm, tok, MSGS, max_new_tokens=16, temperature=0, fast=False))
    again = fastgen.generate(pm, tok, chats * 2, adapters=["attn"] * 3 + ["wide"] * 3, **kw)
    assert hf.__dict__["_chorus_fast_stack"] is stacked and _tokens(again) == _tokens(mixed)   # kept, repacked
    fastgen.generate(pm, tok, chats, adapters=["wide"] * 3, **kw)                   # another stack: rebuilt
    assert hf.__dict__["_chorus_fast_stack"] is not stacked
    fastgen.free_fast_cache(pm)
    assert "_chorus_fast" not in hf.__dict__ and "_chorus_fast_stack" not in hf.__dict__


def test_a_stack_wider_than_the_rows_keeps_one_state_across_subsets():
    """stack= names adapters to stack beside the rows' (rl.py's joint experts: a call without one expert's rows):
    calls naming different subsets keep one stacked state, and each row's tokens equal those of a call whose stack
    is just its rows' adapters."""
    pm, tok = _three_adapters()
    chats = [common.chat_ids(tok, m) for m in MSGS]
    kw = dict(max_new_tokens=20, temperature=0.9, top_p=1.0, seed=3, batch_size=16, graphs=False)
    narrow = fastgen.generate(pm, tok, chats, adapters=["wide"] * 3, **kw)
    every = ["attn", "default", "wide"]
    wide = fastgen.generate(pm, tok, chats, adapters=["wide"] * 3, stack=every, **kw)
    hf = fastpack.hf_causal_lm(pm)
    st = hf.__dict__["_chorus_fast_stack"]
    assert st["stack"] == every and _tokens(wide) == _tokens(narrow)
    fastgen.generate(pm, tok, chats[:2], adapters=["attn", "default"], stack=every, **kw)
    assert hf.__dict__["_chorus_fast_stack"] is st                                 # the same state: no rebuild
    with pytest.raises(ValueError, match="not loaded"):
        fastgen.generate(pm, tok, chats[:1], adapters=["wide"], stack=["nope"], **kw)
    for bad in ({"stack": every}, {"adapters": ["wide"], "stack": "wide"}):         # no rows' adapters; a bare name
        with pytest.raises(ValueError, match="stack: a list"):
            fastgen.generate(pm, tok, chats[:1], **bad, **kw)


def test_common_generate_takes_adapters_on_both_paths():
    """common.generate(adapters=...): the fast call and HF's one-call-per-adapter give the same greedy tokens,
    in the chats' order; the active adapter stays active."""
    pm, tok = _three_adapters()
    msgs = [MSGS[0], MSGS[1], MSGS[0], MSGS[2]]
    names = ["attn", "wide", "default", "attn"]
    kw = dict(max_new_tokens=16, temperature=0, adapters=names)
    fast, hf = common.generate(pm, tok, msgs, fast=True, **kw), common.generate(pm, tok, msgs, fast=False, **kw)
    assert _tokens(fast) == _tokens(hf)
    assert _tokens(hf)[2] == _tokens(common.generate(pm, tok, [MSGS[0]], max_new_tokens=16, temperature=0,
                                                     fast=False))[0]    # "default" is the active adapter
    assert pm.active_adapter == "default"


def test_bad_adapters_are_one_line():
    pm, tok = _three_adapters()
    with pytest.raises(ValueError, match=r"^adapters: not loaded on the model: nope$"):
        common.generate(pm, tok, MSGS, max_new_tokens=4, adapters=["nope", "wide", "wide"])
    with pytest.raises(ValueError, match=r"^adapters: 2 names for 3 chats \(one per chat\)$"):
        common.generate(pm, tok, MSGS, max_new_tokens=4, adapters=["wide", "wide"])
    prompts = [common.chat_ids(tok, m) for m in MSGS]
    with pytest.raises(ValueError, match="not loaded on the model"):
        fastgen.generate(pm, tok, prompts, max_new_tokens=4, temperature=0, top_p=1.0, seed=0, batch_size=4,
                         adapters=["x"] * 3)


def test_lin_keeps_each_rows_columns():
    """_lin under the stack rule equals each row's own x (W + s B A)^T."""
    torch.manual_seed(0)
    n_in, outs, T, r = 6, (5, 3), 2, 2
    W = torch.randn(sum(outs), n_in, dtype=torch.float64)
    A = [[torch.randn(r, n_in, dtype=torch.float64) for _ in outs] for _ in range(T)]
    B = [[torch.randn(o, r, dtype=torch.float64) for o in outs] for _ in range(T)]
    la = torch.cat([torch.cat(A[t]) for t in range(T)])                       # [T * K, in], K = 2 r
    lb = torch.zeros(sum(outs), T * 2 * r, dtype=torch.float64)
    for t in range(T):
        lb[:outs[0], t * 2 * r:t * 2 * r + r] = B[t][0]
        lb[outs[0]:, t * 2 * r + r:(t + 1) * 2 * r] = B[t][1]
    x, arow = torch.randn(4, n_in, dtype=torch.float64), torch.tensor([1, 0, 0, 1])
    sel = (arow[:, None] == torch.arange(T)).double()
    y = fastgen._lin(x, {"w": W, "b": None, "la": la, "lb": lb}, sel=sel)
    for i, t in enumerate(arow.tolist()):
        own = W + torch.cat([B[t][j] @ A[t][j] for j in range(len(outs))])
        torch.testing.assert_close(y[i], x[i] @ own.T)


def test_the_stack_is_sorted_and_other_kinds_of_adapter_fall_back(monkeypatch):
    """The same adapters in another order keep the stacked state (and its graphs); an adapter other than LoRA in
    the call is FastUnsupported, so common.generate falls back to HF with a note."""
    pm, tok = _three_adapters()
    prompts = [common.chat_ids(tok, m) for m in MSGS]
    kw = dict(max_new_tokens=6, temperature=0, top_p=1.0, seed=0, batch_size=4, graphs=False)
    a = fastgen.generate(pm, tok, prompts, adapters=["wide", "attn", "wide"], **kw)
    st = fastpack.hf_causal_lm(pm).__dict__["_chorus_fast_stack"]
    b = fastgen.generate(pm, tok, [prompts[1], prompts[0], prompts[2]], adapters=["attn", "wide", "wide"], **kw)
    assert st["stack"] == ["attn", "wide"] and fastpack.hf_causal_lm(pm).__dict__["_chorus_fast_stack"] is st
    assert _tokens(b) == [_tokens(a)[i] for i in (1, 0, 2)]   # each (chat, adapter) row as before
    monkeypatch.setattr(pm.peft_config["attn"], "peft_type", "IA3")
    with pytest.raises(fastgen.FastUnsupported, match=r"adapters other than LoRA in one call: \['attn'\]"):
        fastgen.generate(pm, tok, prompts, adapters=["attn"] * 3, **kw)


def test_hf_path_gives_each_adapter_its_own_seed():
    """One HF call per adapter, each seeded by adapter_seed(seed, name): sampled rows of an adapter equal a plain
    HF call under it with that seed (so two teachers never share their noise)."""
    pm, tok = _three_adapters()
    msgs = [MSGS[0], MSGS[1], MSGS[0]]
    out = common.generate(pm, tok, msgs, max_new_tokens=12, temperature=1.0, seed=4, fast=False,
                          adapters=["wide", "attn", "attn"])
    assert common.adapter_seed(4, "wide") != common.adapter_seed(4, "attn") != common.adapter_seed(5, "attn")
    for name, rows in (("wide", [0]), ("attn", [1, 2])):
        alone = _hf(pm, tok, [common.chat_ids(tok, msgs[i]) for i in rows], name, max_new_tokens=12,
                    temperature=1.0, top_p=1.0, seed_override=common.adapter_seed(4, name))
        assert [out[i].completion_ids for i in rows] == _tokens(alone), name


def test_both_states_caches_keep_to_the_budget():
    """The folded state's cache counts against a stacked call's budget (and back): the two together stay within
    it, the stacked batch is cut into smaller ones instead, and no row loses a token."""
    pm, tok = _three_adapters()
    prompts = [common.chat_ids(tok, m) for m in MSGS] * 2
    kw = dict(max_new_tokens=8, temperature=0, top_p=1.0, seed=0, batch_size=8, graphs=False, ignore_stop=True)
    fastgen.generate(pm, tok, prompts, **kw)
    hf = fastpack.hf_causal_lm(pm)
    folded = fastgen._held_bytes(hf.__dict__["_chorus_fast"])
    budget = int(1.5 * folded)
    names = ["wide", "attn"] * 3
    out = fastgen.generate(pm, tok, prompts, adapters=names, budget=budget, **kw)
    stacked = fastgen._held_bytes(hf.__dict__["_chorus_fast_stack"])
    assert 0 < stacked and folded + stacked <= budget
    whole = fastgen.generate(pm, tok, prompts, adapters=names, **kw)       # no budget: one batch
    assert _tokens(out) == _tokens(whole)
