"""Tests of common.py: prompts, parsing, feedback, tiny model, LoRA adapters, both generation paths.

Run: python -m pytest -q tests/test_common.py            (about half a minute on 2 CPU cores)
     python -m pytest -q tests/test_common.py -m slow    (the real SmolLM2 GGUF: ~1 min the first time)
"""
import contextlib
import weakref
import sys
import types

import pytest
import torch

import common


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny matmuls on a shared 2-core machine run ~10x faster on one thread (no spin contention)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


TASK = {"id": "t0", "rtl_files": [{"name": "a.v", "content": "module a(input clk); endmodule"},
                                  {"name": "b.v", "content": "module b; endmodule"}],
        "spec_files": [], "instruction": "The top module is 'a', instance name 'dut'."}


# --- prompts and parsing --------------------------------------------------------------------------

def test_build_messages_format():
    sys_msg, user = common.build_messages(TASK)
    assert sys_msg["role"] == "system" and "OUTPUT REQUIREMENTS" in sys_msg["content"]
    assert "$finish" in sys_msg["content"] and "covergroup" in sys_msg["content"]
    assert user["content"] == (
        "<context>// File: a.v\nmodule a(input clk); endmodule\n\n// File: b.v\nmodule b; endmodule"
        "// No specification files provided.</context>\n<instructions>The top module is 'a', instance name "
        "'dut'.</instructions>\nWrite a SystemVerilog testbench that maximizes coverage of the given RTL project.")
    spec = dict(TASK, spec_files=[{"name": "s.md", "content": "spec"}])
    assert "b; endmodule// File: s.md\nspec</context>" in common.build_messages(spec)[1]["content"]
    with pytest.raises(ValueError, match="instruction"):
        common.build_messages({"id": "x", "rtl_files": []})


CODE = "module tb;\n  initial begin\n    $finish;\n  end\nendmodule"


@pytest.mark.parametrize("text,filename,reason,has_code", [
    (f"filename: tb_fifo.sv\n```systemverilog\n{CODE}\n```\nDone.", "tb_fifo.sv", "ok", True),
    (f"Here:\n```verilog\n{CODE}\n```", "tb_generated.sv", "no_filename", True),
    (f"filename: tb_x.sv\n```systemverilog\nmodule tb;\n  initial begin", "tb_x.sv", "truncated", False),
    ("I cannot help with that.", "tb_generated.sv", "no_code", False),
    (f"The output file is \"out/tb_m.v\".\n{CODE}\ntrailing words", "tb_m.v", "ok", True),
    (f"file name = sub/dir/tb_q.sv\n```\n{CODE}\n```", "tb_q.sv", "ok", True),
    (f"Save it as tb_bare.sv please.\n```sv\n{CODE}\n```", "tb_bare.sv", "ok", True),
])
def test_parse_answer(text, filename, reason, has_code):
    a = common.parse_answer(text)
    assert (a.filename, a.reason) == (filename, reason)
    if has_code:
        assert a.code == CODE
    if reason == "truncated":
        assert a.code.startswith("module tb;")  # partial code is kept, the reason says it is unusable


def test_render_answer_roundtrip():
    text = common.render_answer("tb_a.sv", CODE + "\n")
    assert text == f"filename: tb_a.sv\n```systemverilog\n{CODE}\n```"
    assert common.parse_answer(text) == common.Answer("tb_a.sv", CODE, "ok")


@pytest.fixture()
def fake_sim(monkeypatch):
    """A stand-in for sim.py with the contract's names: SimResult.from_dict and format_feedback."""
    mod = types.ModuleType("sim")

    class SimResult(types.SimpleNamespace):
        @classmethod
        def from_dict(cls, d):
            return cls(**d)

    mod.SimResult = SimResult
    mod.format_feedback = lambda r, max_chars=1500: f"DETAIL[{r.status}:{r.overall_pct}]"
    monkeypatch.setitem(sys.modules, "sim", mod)
    return mod


@pytest.mark.parametrize("status,stage,part,instruction", [
    ("ok", "success", "- coverage:", "Improve coverage toward 100%"),
    ("compile_error", "compile", "- log:", "Fix the compile failure"),
    ("timeout", "simulate", "- log:", "Fix the simulation failure"),
])
def test_feedback_message(fake_sim, status, stage, part, instruction):
    msg = common.feedback_message({"status": status, "overall_pct": 42.0})
    assert msg.startswith("Response parse result:\n- status: success\n- type: file\n\nEDA result:\n")
    assert f"- status: {status}\n- stage: {stage}\n{part}\nDETAIL[{status}:42.0]" in msg
    assert f"Instruction for next round:\n{instruction}" in msg and msg.endswith(common.OUTPUT_REQUIREMENTS)


def test_feedback_parse_failure_and_refine_state(fake_sim):
    msg = common.feedback_message(common.parse_answer("no code here"))
    assert "- status: failed" in msg and "stage: parse" in msg and "Instruction for next round:" in msg
    answer = f"Sure!\nfilename: tb_a.sv\n```systemverilog\n{CODE}\n```\nbye"
    state = common.refine_messages(TASK, answer, {"status": "ok", "overall_pct": 80.0})
    assert [m["role"] for m in state] == ["system", "user", "assistant", "user"]
    assert state[:2] == common.build_messages(TASK)
    assert state[2]["content"] == common.render_answer("tb_a.sv", CODE)
    assert "- stage: success" in state[3]["content"]
    bad = common.refine_messages(TASK, "nothing", None)
    assert bad[2]["content"] == "nothing" and "- status: failed" in bad[3]["content"]


# --- models ------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny():
    return common.tiny_model(0)


def test_tiny_model_deterministic_and_chat(tiny):
    model, tok = tiny
    model2, tok2 = common.tiny_model(0)
    assert tok.get_vocab() == tok2.get_vocab() and len(tok) == 1024
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), model2.state_dict().values()))
    msgs = [{"role": "system", "content": "s"}, {"role": "user", "content": "module x;"}]
    ids = common.chat_ids(tok, msgs)
    assert tok.decode(ids) == "<|im_start|>system\ns<|im_end|>\n<|im_start|>user\nmodule x;<|im_end|>\n" \
                              "<|im_start|>assistant\n"
    assert tok.pad_token_id == tok.eos_token_id  # like SmolLM2: padding must be masked by attention mask


def _randomize_lora(model, seed):
    """Give every LoRA B a nonzero value (peft initializes B = 0, which would hide bugs)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_" in n:
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)


def test_adapter_save_load_bf16(tiny, tmp_path):
    from safetensors.torch import load_file
    model, tok = common.tiny_model(0)
    pm = common.add_lora(model, r=4, alpha=8, dropout=0.0, adapter_name="stu")
    _randomize_lora(pm, 1)
    with torch.no_grad():  # make the adapter exactly bf16-representable: saving must then be lossless
        for n, p in pm.named_parameters():
            if "lora_" in n:
                p.copy_(p.bfloat16().float())
    path = common.save_adapter(pm, tmp_path / "ad", adapter_name="stu")
    tensors = load_file(f"{path}/adapter_model.safetensors")
    assert tensors and all(t.dtype == torch.bfloat16 for t in tensors.values())
    base, _ = common.tiny_model(0)
    loaded = common.load_adapter(base, path, adapter_name="stu")
    x = torch.tensor([common.chat_ids(tok, [{"role": "user", "content": "hi"}])])
    with torch.no_grad():
        a, b = pm(x).logits, loaded(x).logits
    assert torch.allclose(a, b, atol=1e-5)
    assert not any(p.requires_grad for p in loaded.parameters())  # loaded frozen (trainable=False)


def test_load_model_from_folder(tiny, tmp_path):
    model, tok = tiny
    model.save_pretrained(tmp_path / "m")
    tok.save_pretrained(tmp_path / "m")
    m2, t2 = common.load_model(str(tmp_path / "m"), quant="auto", device="cpu")
    assert next(m2.parameters()).dtype == torch.float32 and t2.padding_side == "left"
    assert common.resolve_quant("auto", "cuda", 4e9)[0] == "4bit"
    assert common.resolve_quant("auto", "cuda", 1.35e8)[1] == torch.bfloat16
    with pytest.raises(ValueError, match="unknown quant"):
        common.resolve_quant("8bit", "cpu", 1)


# --- generation --------------------------------------------------------------------------------

MSGS = [[{"role": "system", "content": "sys"}, {"role": "user", "content": "write a tb for fifo"}],
        [{"role": "user", "content": "x"}],
        [{"role": "system", "content": "a longer system prompt here"}, {"role": "user", "content": "alu"}]]


def _tokens(outs):
    return [c.completion_ids for c in outs]


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
    layer = common._hf_causal_lm(pm).__dict__["_chorus_fast"]["W"]["layers"][0]
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
    hf = common._hf_causal_lm(pm)
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
    fresh_pack, freed_first = common._pack_weights, []

    def spy(m, into=None):
        if into is None:                        # the rebuild: the old copy must be gone by now
            freed_first.append(old() is None)
        return fresh_pack(m, into=into)
    monkeypatch.setattr(common, "_pack_weights", spy)
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
        monkeypatch.setattr(common, "_GQA_BACKENDS", [SDPBackend.MATH])
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
    outs = common._generate_fast(pm, tok, prompts, max_new_tokens=24, temperature=0.8, top_p=0.9, seed=5,
                                 batch_size=3, graphs=False, record=record, ignore_stop=True)
    slots = common._hf_causal_lm(pm).__dict__["_chorus_fast"]["slots"]
    assert [(s["gqa"], s["gqa_prefill"]) for s in slots.values()] == [(fused, fused)]  # the path under test ran
    steps = torch.stack(record, 1)  # [B, steps, V]
    for b, (p, c) in enumerate(zip(prompts, outs)):
        assert len(c.completion_ids) == 24 and c.truncated
        with torch.no_grad():
            ref = pm(torch.tensor([p + c.completion_ids])).logits[0, len(p) - 1:-1]  # [24, V]
        torch.testing.assert_close(steps[b], ref, atol=1e-4, rtol=1e-4)
    again = common._generate_fast(pm, tok, prompts, max_new_tokens=24, temperature=0.8, top_p=0.9, seed=5,
                                  batch_size=3, graphs=False, ignore_stop=True)
    assert _tokens(again) == _tokens(outs)  # deterministic given seed


def test_fast_prefill_falls_back_when_the_fused_call_fails(monkeypatch):
    """A prefill shape the fused kernel refuses: that prefill and later ones take the portable form, decode
    keeps the fused one, and the tokens still equal HF's."""
    from torch.nn.attention import SDPBackend
    monkeypatch.setattr(common, "_GQA_BACKENDS", [SDPBackend.MATH])
    fused = common._gqa_attention

    def no_prefill(q, k, v, mask, scale):
        if q.shape[2] > 1:
            raise RuntimeError("no kernel for this shape")
        return fused(q, k, v, mask, scale)
    monkeypatch.setattr(common, "_gqa_attention", no_prefill)
    model, tok = common.tiny_model(0)
    kw = dict(max_new_tokens=10, temperature=0)
    fast = common.generate(model, tok, MSGS, fast=True, **kw)
    slot = next(iter(common._hf_causal_lm(model).__dict__["_chorus_fast"]["slots"].values()))
    assert slot["gqa"] and not slot["gqa_prefill"]
    assert _tokens(fast) == _tokens(common.generate(model, tok, MSGS, fast=False, **kw))


def test_fast_declines_partial_rotary(capsys):
    """A model the decoder's rotary cannot do exactly (partial rotary) is declined: generate() says so in
    one line and uses HF generate, with HF's tokens."""
    model, tok = common.tiny_model(0)
    model.config.partial_rotary_factor = 0.5
    with pytest.raises(common.FastUnsupported, match="partial rotary"):
        common._pack_weights(model)
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
    draws = common._sample(logits.expand(n, 6), T, top_p, noise)
    freq = torch.bincount(draws, minlength=6).float() / n
    assert (freq[ref == 0] == 0).all()
    assert torch.allclose(freq, ref, atol=0.01), (freq, ref)
    assert common._sample(logits, 0, 1.0, None).item() == 0


def test_stop_at_closing_fence_and_eos(tiny):
    model, tok = tiny
    eos, ticks = common._stop_sets(model, tok)
    ids = tok("filename: tb.sv\n```systemverilog\nmodule tb; endmodule\n```\nextra words", add_special_tokens=False
              )["input_ids"]
    i = common.find_stop(tok, ids, eos, ticks)
    assert tok.decode(ids[:i + 1]).rstrip().endswith("```") and not common.fence_closed(tok.decode(ids[:i]))
    c = common._completion(tok, [1], ids + [tok.eos_token_id], eos, ticks, 100)
    assert not c.truncated and c.completion_ids == ids[:i + 1]
    c = common._completion(tok, [1], ids[:5] + [tok.eos_token_id, 7], eos, ticks, 100)
    assert c.completion_ids == ids[:5] + [tok.eos_token_id] and not c.truncated
    c = common._completion(tok, [1], ids[:5], eos, ticks, 5)
    assert c.truncated and len(c.completion_ids) == 5


def test_generate_seeded_hf_and_training_mode_restored(tiny):
    model, tok = tiny
    model.train()
    a = common.generate(model, tok, MSGS, max_new_tokens=16, temperature=1.0, seed=3, fast=False)
    b = common.generate(model, tok, MSGS, max_new_tokens=16, temperature=1.0, seed=3, fast=False)
    assert _tokens(a) == _tokens(b) and model.training
    model.eval()
    assert all(len(c.completion_ids) <= 16 and c.prompt_ids for c in a)


# --- the real model (slow) ------------------------------------------------------------------------

@pytest.mark.slow
def test_smollm2_gguf_load_and_fast_equals_hf(tmp_path_factory):
    model, tok = common.load_model(quant="fp32", device="cpu")
    assert type(model).__name__ == "LlamaForCausalLM" and tok.model_max_length == 8192
    assert tok.pad_token_id == tok.eos_token_id
    msgs = [[{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]]
    hf = common.generate(model, tok, msgs, max_new_tokens=12, temperature=0, fast=False)
    fast = common.generate(model, tok, msgs, max_new_tokens=12, temperature=0, fast=True)
    assert _tokens(hf) == _tokens(fast) and "Paris" in hf[0].text


def test_gpu_free_bytes_applies_the_memory_cap_once(monkeypatch):
    """A 24 GiB cap on a 140 GiB card with 10 GiB allocated leaves 14 GiB, also when mem_get_info
    already reports the capped size (as bench_4b.py's emulated 24 GB card does). Multiplying the
    fraction into the reported size left ~0 and split every fast-path batch down to 1 (H200, session 3)."""
    G = 2**30
    card, frac, alloc = 140 * G, 24 / 140, 10 * G
    props = type("P", (), {"total_memory": card})()
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d=None: props)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda d=None: alloc)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda d=None: 11 * G)
    monkeypatch.setattr(torch.cuda, "get_per_process_memory_fraction", lambda d=None: frac, raising=False)
    for reported in ((card - 20 * G, card), (24 * G - 11 * G, 24 * G)):        # real card / emulated cap
        monkeypatch.setattr(torch.cuda, "mem_get_info", lambda d=None, r=reported: r)
        assert abs(common._gpu_free_bytes(0) - 14 * G) < 0.01 * G, reported
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda d=None: (1 * G, card))   # others use the card
    assert abs(common._gpu_free_bytes(0) - 2 * G) < 0.01 * G                    # 1 free + 1 reserved unused
