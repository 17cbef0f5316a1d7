"""lora_stack.py: the stack rule's LoRA term in one kernel. Its torch form equals the decoder's own three-kernel
form (fastgen._lin with a one-hot sel); the Triton kernel equals the torch form on random shapes (partial row and
column blocks, one to three adapters, ranks that are not multiples of 16) and a stacked generate() gives the same
greedy tokens with and without it. The Triton checks run the kernel in Triton's interpreter on the CPU, in a
child process (the interpreter is chosen when Triton is imported), and skip where Triton is not installed (the
kit does not require it off the GPU); on a GPU the decoder probes the kernel itself (lora_stack.kernel_works).

Run: python -m pytest -q tests/test_lora_stack.py
"""
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import fastgen
import lora_stack

ROOT = Path(__file__).resolve().parents[1]


def _case(T, K, N, IN, OUT, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: (torch.randn(*s, generator=g) * 0.3).to(dtype)   # noqa: E731
    return r(N, OUT), r(N, IN), r(T * K, IN), r(OUT, T * K), torch.randint(0, T, (N,), generator=g)


@pytest.mark.parametrize("T,K,N", [(3, 48, 37), (1, 16, 5), (2, 24, 16)])
def test_the_torch_form_is_the_decoders_own(T, K, N):
    y, x, la, lb, arow = _case(T, K, N, 40, 56)
    sel = (arow[:, None] == torch.arange(T)).to(x.dtype)
    want = fastgen._lin(x, {"w": torch.zeros(56, 40), "b": None, "la": la, "lb": lb}, residual=y, sel=sel)
    assert torch.allclose(lora_stack.add_torch(y.clone(), x, la, lb, arow, T), want, atol=1e-5)
    # each row gets its own adapter's term only: a row of adapter 0 ignores the other adapters' columns
    la2 = la.clone()
    la2[K:] = 0
    mine = arow == 0
    assert torch.equal(lora_stack.add_torch(y.clone(), x, la2, lb, arow, T)[mine],
                       lora_stack.add_torch(y.clone(), x, la, lb, arow, T)[mine])


def test_off_the_gpu_the_decoder_keeps_the_torch_form():
    assert not lora_stack.kernel_works("cpu", torch.float32)
    st = {"W": {"embed": torch.zeros(2, 2)}, "meta": {"dtype": torch.float32}}
    assert fastgen.FUSED_LORA == "auto"                  # on where the probe passes: never on a CPU
    assert fastgen._fused_lora(st) is False and st["fused_lora"] is False


CHILD = r'''
import os, sys, torch
sys.path.insert(0, os.getcwd()); sys.path.insert(0, os.path.join(os.getcwd(), "tests"))
import common, fastgen, lora_stack
from test_fastgen_stack import _three_adapters
from test_common import MSGS
from test_lora_stack import _case
for T, K, N, IN, OUT in [(3, 48, 37, 576, 960), (2, 16, 5, 100, 70), (3, 32, 16, 576, 3072), (1, 16, 20, 64, 64), (3, 14, 9, 64, 40)]:
    y, x, la, lb, arow = _case(T, K, N, IN, OUT, seed=T + N)
    got = lora_stack.add_triton(y.clone(), x, la, lb, arow, T)
    want = lora_stack.add_torch(y.clone(), x, la, lb, arow, T)
    assert torch.allclose(got, want, atol=1e-4, rtol=1e-4), (T, K, N, (got - want).abs().max())
pm, tok = _three_adapters()
chats = [common.chat_ids(tok, m) for m in MSGS]
kw = dict(max_new_tokens=12, temperature=0, top_p=1.0, ignore_stop=True, seed=0, batch_size=16, graphs=False,
          adapters=["wide", "default", "attn", "attn", "wide", "default"])
outs = {}
for fused in (False, True):
    fastgen.free_fast_cache(pm)
    fastgen.FUSED_LORA = fused
    outs[fused] = [c.completion_ids for c in fastgen.generate(pm, tok, chats * 2, **kw)]
    st = fastgen.fastpack.hf_causal_lm(pm).__dict__["_chorus_fast_stack"]
    assert st["fused_lora"] is fused
assert outs[True] == outs[False], outs
print("ok")
'''


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="Triton is not installed (GPU machines have it)")
def test_the_kernel_equals_the_torch_form_in_the_interpreter():
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), str(ROOT / "tests"),
                                                                                              os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, "-c", CHILD], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stdout[-2000:] + proc.stderr[-3000:]
