"""decode_fuse.py: decode's rotary + K/V write and SiLU-mul kernels. The torch forms equal the decoder's own code
(fastgen._qkv with its index_copy_ writes, fastgen._mlp); the Triton kernels equal the torch forms on SmolLM2-135M's
head shape and a smaller one (odd row counts, the write at the first, a middle and the last column, cache columns
other than col untouched), and generate() gives the same greedy tokens and logits with FUSED_SMALL on and off, on
the default layout, the shared-prefix layout and a qwen3 model (its layers keep the torch rotary). The Triton checks
run in Triton's interpreter on the CPU (fp32 only: bf16 is broken there), in a child process (the interpreter is
chosen when Triton is imported), and skip where Triton is not installed (the kit does not require it off the GPU);
on a GPU the decoder probes the kernels itself (decode_fuse.kernel_works).

Run: python -m pytest -q tests/test_decode_fuse.py
"""
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import decode_fuse
import fastgen

ROOT = Path(__file__).resolve().parents[1]


def _rope_case(N, hq, hkv, d, L, seed=0, dtype=torch.float32):
    """(qkv [N, (hq + 2 hkv) d], cos, sin_signed [N, 1, d] (real rotary rows at random positions), kc, vc [N, hkv,
    L, d]). The caches are views with a padded column stride, as a slot's narrower views are."""
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g).to(dtype)   # noqa: E731
    pos = torch.randint(0, 4000, (N, 1), generator=g).float()
    ang = pos * 10000.0 ** (-torch.arange(0, d, 2).float() / d)
    emb = torch.cat([ang, ang], -1)
    cos, sin = emb.cos()[:, None].to(dtype), fastgen._signed_sin(emb.sin())[:, None].to(dtype)
    return r(N, (hq + 2 * hkv) * d), cos, sin, r(N, hkv, L + 3, d)[:, :, :L], r(N, hkv, L + 3, d)[:, :, :L]


def _layer(H, hq, hkv, d, I, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: (torch.randn(*s, generator=g) * 0.2).to(dtype)   # noqa: E731
    return {"ln1": 1 + r(H), "qkv": {"w": r((hq + 2 * hkv) * d, H), "b": r((hq + 2 * hkv) * d)}, "ln2": 1 + r(H),
            "gu": {"w": r(2 * I, H), "b": None}, "down": {"w": r(H, I), "b": None}}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("hq,hkv,d,N,c", [(9, 3, 64, 5, 0), (4, 2, 32, 8, 17), (4, 2, 16, 3, 39)])
def test_the_torch_forms_are_the_decoders_own(hq, hkv, d, N, c, dtype):
    H, I, L = 48, 40, 40
    Lw, m = _layer(H, hq, hkv, d, I, seed=N, dtype=dtype), {"hq": hq, "hkv": hkv, "d": d, "eps": 1e-5}
    x = torch.randn(N, H, generator=torch.Generator().manual_seed(1)).to(dtype)
    qkv, cos, sin, kc, vc = _rope_case(N, hq, hkv, d, L, seed=N, dtype=dtype)
    col = torch.tensor([c])
    q, k, v = fastgen._qkv(Lw, m, x, cos, sin)                       # the decode step's own code
    want_k, want_v = kc.clone(), vc.clone()
    want_k.index_copy_(2, col, k[:, :, None])
    want_v.index_copy_(2, col, v[:, :, None])
    qkv = fastgen._lin(fastgen._rms(x, Lw["ln1"], m["eps"]), Lw["qkv"])
    got_k, got_v = kc.clone(), vc.clone()
    assert torch.equal(decode_fuse.rope_write_torch(qkv, cos, sin, got_k, got_v, col), q)
    assert torch.equal(got_k, want_k) and torch.equal(got_v, want_v)
    other = torch.arange(L) != c
    assert torch.equal(got_k[:, :, other], kc[:, :, other]) and not torch.equal(got_k[:, :, c], kc[:, :, c])
    gu = fastgen._lin(fastgen._rms(x, Lw["ln2"], m["eps"]), Lw["gu"])
    assert torch.equal(fastgen._lin(decode_fuse.silu_mul_torch(gu), Lw["down"], residual=x), fastgen._mlp(Lw, m, x))


def test_off_the_gpu_the_decoder_keeps_the_torch_forms(monkeypatch):
    assert not decode_fuse.kernel_works("cpu", torch.float32, 9, 3, 64)
    st = {"W": {"embed": torch.zeros(2, 2)}, "meta": {"dtype": torch.float32, "hq": 9, "hkv": 3, "d": 64}}
    assert fastgen.FUSED_SMALL == "auto"                 # on where the probe passes: never on a CPU
    assert fastgen._fused_small(st) is False and st["fused_small"] is False


CHILD = r'''
import os, sys, torch
sys.path.insert(0, os.getcwd()); sys.path.insert(0, os.path.join(os.getcwd(), "tests"))
import common, decode_fuse, fastgen, fastpack
from test_common import MSGS
from test_decode_fuse import _rope_case
L = 40
for hq, hkv, d in [(9, 3, 64), (4, 2, 32)]:
    for N in (1, 6, 37):
        for c in (0, L // 2 + 1, L - 1):
            qkv, cos, sin, kc, vc = _rope_case(N, hq, hkv, d, L, seed=N + c)
            qkv = torch.cat([qkv, qkv[:, :5]], 1)[:, :qkv.shape[1]]          # rows with a padded stride
            col = torch.tensor([c])
            k1, v1, k2, v2 = kc.clone(), vc.clone(), kc.clone(), vc.clone()
            q1 = decode_fuse.rope_write_triton(qkv, cos, sin, k1, v1, col)
            q2 = decode_fuse.rope_write_torch(qkv, cos, sin, k2, v2, col)
            assert torch.allclose(q1, q2, atol=1e-5, rtol=1e-5), (hq, N, c, (q1 - q2).abs().max())
            assert torch.allclose(k1, k2, atol=1e-5, rtol=1e-5) and torch.equal(v1, v2), (hq, N, c)
            other = torch.arange(L) != c
            assert torch.equal(k1[:, :, other], kc[:, :, other]) and torch.equal(v1[:, :, other], vc[:, :, other])
            assert not torch.equal(k1[:, :, c], kc[:, :, c])
for N, I in [(1, 1536), (7, 1000), (37, 64)]:
    gu = torch.randn(N, 2 * I, generator=torch.Generator().manual_seed(N)) * 3
    got, want = decode_fuse.silu_mul_triton(gu), decode_fuse.silu_mul_torch(gu)
    assert torch.allclose(got, want, atol=1e-6, rtol=1e-5), (N, I, (got - want).abs().max())
kw = dict(max_new_tokens=12, temperature=0, top_p=1.0, ignore_stop=True, seed=0, batch_size=16, graphs=False)
for arch, shared in (("llama", False), ("llama", True), ("qwen3", False)):
    model, tok = common.tiny_model(0, arch=arch)
    chats = [common.chat_ids(tok, m) for m in MSGS]
    fastgen.SHARED_PREFIX = shared
    outs, recs = {}, {}
    for fused in (False, True):
        fastgen.free_fast_cache(model)
        fastgen.FUSED_SMALL = fused
        recs[fused] = []
        outs[fused] = [c.completion_ids for c in fastgen.generate(model, tok, chats * 2, record=recs[fused], **kw)]
        st = fastpack.hf_causal_lm(model).__dict__["_chorus_fast"]
        assert st["fused_small"] is fused
        slot = next(iter(st["slots"].values()))
        assert bool(slot["carves"]) is shared, arch
    assert outs[True] == outs[False], (arch, shared, outs)
    for a, b in zip(recs[True], recs[False]):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
# rows that end at different steps (checked every 2 steps, the slot compacts to smaller row buckets), both layouts
fastgen.CHECK_EVERY = 2
model, tok = common.tiny_model(0)
chats = [common.chat_ids(tok, m) for m in MSGS] * 2
for shared in (False, True):
    fastgen.SHARED_PREFIX = shared
    outs = {}
    for fused in (False, True):
        fastgen.free_fast_cache(model)
        fastgen.FUSED_SMALL = fused
        outs[fused] = [c.completion_ids for c in fastgen.generate(model, tok, chats, **{**kw, "max_new_tokens": 14},
                                                                  max_lens=[2, 14, 5, 3, 9, 14])]
    assert outs[True] == outs[False] and sorted({len(o) for o in outs[True]}) != [14], (shared, outs)
# rows of three adapters in one call (the stack rule), with lora_stack's kernel too
from test_fastgen_stack import _three_adapters
pm, tok = _three_adapters()
fastgen.SHARED_PREFIX = False
outs = {}
for fused in (False, True):
    fastgen.free_fast_cache(pm)
    fastgen.FUSED_SMALL = fastgen.FUSED_LORA = fused
    outs[fused] = [c.completion_ids for c in fastgen.generate(
        pm, tok, chats, **kw, adapters=["wide", "default", "attn", "attn", "wide", "default"])]
    assert fastgen.fastpack.hf_causal_lm(pm).__dict__["_chorus_fast_stack"]["fused_small"] is fused
assert outs[True] == outs[False], outs
print("ok")
'''


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="Triton is not installed (GPU machines have it)")
def test_the_kernels_equal_the_torch_forms_in_the_interpreter():
    path = os.pathsep.join(filter(None, [str(ROOT), str(ROOT / "tests"), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": path}
    proc = subprocess.run([sys.executable, "-c", CHILD], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stdout[-2000:] + proc.stderr[-3000:]
