"""Tests of common.py: prompts, parsing, feedback, tiny model, LoRA adapters, generate() (the HF path;
the fast decoder's tests are in test_fastgen.py).

Run: python -m pytest -q tests/test_common.py            (about half a minute on 2 CPU cores)
     python -m pytest -q tests/test_common.py -m slow    (the real SmolLM2 GGUF: ~1 min the first time)
"""
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
    monkeypatch.setattr(common, "sim", mod)
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


def test_as_saved_holds_the_saved_weights_for_the_duration(tmp_path):
    """Inside common.as_saved a trained (fp32) adapter holds exactly what save_adapter writes: its logits and its
    sampled answers equal those of the adapter loaded back from disk; afterwards the exact weights return."""
    model, tok = common.tiny_model(0)
    pm = common.add_lora(model, r=4, alpha=8, dropout=0.0)
    _randomize_lora(pm, 2)                                    # fp32 values that bf16 cannot hold
    exact = {n: p.detach().clone() for n, p in pm.named_parameters()}
    loaded = common.load_adapter(common.tiny_model(0)[0], common.save_adapter(pm, tmp_path / "ad"))
    x = torch.tensor([common.chat_ids(tok, [{"role": "user", "content": "hi"}])])
    chats = [[{"role": "user", "content": f"write {i}"}] for i in range(4)]
    sample = dict(max_new_tokens=24, temperature=1.0, top_p=1.0, seed=5)
    pm.eval()
    with torch.no_grad():
        assert not torch.equal(pm(x).logits, loaded(x).logits)             # the fp32 weights are not the saved ones
        with common.as_saved(pm) as changed:
            assert changed == sum("lora_" in n for n in exact)             # every LoRA tensor was rounded
            for n, p in pm.named_parameters():
                want = exact[n].bfloat16().float() if "lora_" in n else exact[n]
                assert torch.equal(p, want), n
            assert torch.equal(pm(x).logits, loaded(x).logits)
            inside = [c.text for c in common.generate(pm, tok, chats, **sample)]
            inside_fast = [c.text for c in common.generate(pm, tok, chats, fast=True, **sample)]   # GPU's path
        with common.as_saved(loaded) as unchanged:
            assert unchanged == 0                                           # bf16-exact already: nothing to do
    assert inside == [c.text for c in common.generate(loaded, tok, chats, **sample)]
    assert inside_fast == [c.text for c in common.generate(loaded, tok, chats, fast=True, **sample)]
    assert all(torch.equal(p, exact[n]) for n, p in pm.named_parameters())    # restored bit for bit
    with pytest.raises(RuntimeError, match="inside"):
        with common.as_saved(pm):
            raise RuntimeError("an error inside")
    assert all(torch.equal(p, exact[n]) for n, p in pm.named_parameters())    # also after an error


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


def test_no_cudnn_sdp_env_turns_the_cudnn_attention_kernel_off(monkeypatch):
    """$CHORUS_NO_CUDNN_SDP=1 (the workaround for cuDNN attention backward NaNs): SDPA's cuDNN kernel is off
    after the first CUDA set-up call; unset, nothing changes."""
    import torch
    was = torch.backends.cuda.cudnn_sdp_enabled()
    try:
        torch.backends.cuda.enable_cudnn_sdp(True)
        monkeypatch.delenv(common.NO_CUDNN_SDP_ENV, raising=False)
        assert common.apply_sdpa_env() is False and torch.backends.cuda.cudnn_sdp_enabled()
        monkeypatch.setenv(common.NO_CUDNN_SDP_ENV, "1")
        assert common.apply_sdpa_env() is True and not torch.backends.cuda.cudnn_sdp_enabled()
    finally:
        torch.backends.cuda.enable_cudnn_sdp(was)
