"""Tests of fastgen's shared-prefix layout (SHARED_PREFIX): the two-part attention (a group's prompt once,
each row's own tokens, merged by log-sum-exp) equals plain softmax attention over [prompt | own tokens], and
generation with the layout on gives every row the tokens it gets with it off (greedy: also HF generate's),
with groups of 1-4 identical prompts of different lengths, rows leaving the batch (compaction) and sampling.
On CPU the torch form runs eagerly; the Triton kernels are checked here through Triton's interpreter where
Triton is installed, and on a GPU by bench/decode_two_part.py.

Run: python -m pytest -q tests/test_fastgen_prefix.py
"""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import common
import fastgen
import fastpack
import two_part
from test_common import MSGS, _randomize_lora, _tokens, one_thread  # noqa: F401 (fixture, shared helpers)

ROOT = Path(__file__).resolve().parents[1]


def _case(plens, G, S, col, hq=6, hkv=2, d=16, seed=0, dtype=torch.float32, order=None):
    """Random inputs of two_part.attention_* for groups of G rows with prefix lengths plens and suffixes
    of S columns (col: last real one), plus one filler row; rows of the groups in `order` (default: group by
    group). -> (args tuple, the plain-attention reference out [B, hq, d] for the group rows)."""
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g).to(dtype)         # noqa: E731
    U, Pb = len(plens), max(plens) + 5
    B = U * G + 1
    q = r(B, hq + hkv, d)[:, :hq]                                 # strided, as _qkv gives it
    pk, pv, sk, sv = r(U, hkv, Pb, d), r(U, hkv, Pb, d), r(B, hkv, max(S, 1), d), r(B, hkv, max(S, 1), d)
    order = list(range(U * G)) if order is None else order        # slot row of member (u, j): order[u G + j]
    rowof = torch.tensor(order).view(U, G)
    midx = torch.zeros(B, dtype=torch.long)
    midx[rowof.view(-1)] = torch.arange(U * G)
    args = (q, pk, pv, torch.tensor(plens), rowof, midx, sk, sv, torch.tensor([col]), d ** -0.5)
    ref = torch.zeros(B, hq, d)
    for u in range(U):
        for j in range(G):
            b = order[u * G + j]
            k = torch.cat([pk[u, :, :plens[u]], sk[b, :, :col + 1]], 1).float()      # [hkv, n, d]
            v = torch.cat([pv[u, :, :plens[u]], sv[b, :, :col + 1]], 1).float()
            qb = q[b].float().view(hkv, hq // hkv, d)
            p = (qb @ k.transpose(-1, -2) * d ** -0.5).softmax(-1)
            ref[b] = (p @ v).reshape(hq, d)
    return args, ref


@pytest.mark.parametrize("plens,G,S,col", [
    ([7, 30, 1], 4, 12, 11),          # groups of different lengths, a one-column prefix
    ([300, 45], 2, 20, 0),            # suffix of one column (the first decode step)
    ([20, 9, 64], 3, 8, -1),          # no suffix at all: the prefix part alone
    ([17], 1, 40, 25),                # one row, suffix partly written (columns past col masked)
])
def test_two_part_attention_equals_plain_attention(plens, G, S, col):
    args, ref = _case(plens, G, S, col)
    out = two_part.attention_torch(*args)
    n = len(plens) * G
    assert out.dtype == torch.float32 and out.shape == ref.shape
    torch.testing.assert_close(out[:n], ref[:n], atol=1e-5, rtol=1e-5)
    assert torch.isfinite(out).all()                              # the filler row too


def test_two_part_attention_rows_in_any_order():
    """Rows of a group need not be neighbours (a batch lists prompts in any order; compaction reorders):
    rowof/midx say which row is which member."""
    plens, G = [11, 33, 5], 3
    order = torch.randperm(len(plens) * G, generator=torch.Generator().manual_seed(3)).tolist()
    args, ref = _case(plens, G, 10, 6, order=order)
    out = two_part.attention_torch(*args)
    torch.testing.assert_close(out[:-1], ref[:-1], atol=1e-5, rtol=1e-5)


def test_two_part_kernels_under_the_triton_interpreter():
    """The Triton kernels' logic (chunks, masks, the lse merge, gathers through rowof/midx) against the
    torch form, run by Triton's CPU interpreter in a subprocess (fp32 and fp16; the interpreter's bf16 dot is
    not exact). Skipped where Triton is not installed."""
    pytest.importorskip("triton")
    # Triton 3.6's interpreter turns a loaded scalar (a 1-element array) into a loop bound with int(array), which
    # NumPy 2.4 refuses (triton-lang/triton#9171, fixed upstream by squeezing first); the shim does the same here
    # where the interpreter has that hook (a Triton without it runs the test unshimmed)
    code = (
        "import inspect, numpy, triton.runtime.interpreter as interp\n"
        "_patch = getattr(interp, '_patch_lang_tensor', None)\n"
        "if _patch is not None and list(inspect.signature(_patch).parameters) == ['tensor', 'scope']:\n"
        "    def _squeezed(tensor, scope):\n"
        "        _patch(tensor, scope)\n"
        "        scope.set_attr(tensor, '__index__', lambda self: int(numpy.asarray(self.handle.data).reshape(-1)[0]))\n"
        "    interp._patch_lang_tensor = _squeezed\n"
        "import torch, two_part, test_fastgen_prefix as t\n"
        "two_part.PREFIX_CHUNK = 32\n"
        "for dt, tol in ((torch.float32, 1e-5), (torch.float16, 2e-3)):\n"
        "    for plens, G, S, col in (([7, 70, 1], 4, 80, 70), ([40, 9], 2, 8, -1), ([64], 1, 3, 0)):\n"
        "        args, _ = t._case(plens, G, S, col, hq=4, hkv=2, d=16, dtype=dt)\n"
        "        want = two_part.attention_torch(*[a.float() if a.is_floating_point() else a\n"
        "                                                   for a in args[:-1]], args[-1])\n"
        "        got = two_part.attention_triton(*args).float()\n"
        "        assert torch.allclose(got, want, atol=tol, rtol=tol), (dt, plens, (got - want).abs().max())\n"
        "print('ok')\n")
    env = {**os.environ, "TRITON_INTERPRET": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-2000:]


def test_groups(monkeypatch):
    assert fastgen._groups([[1, 2], [3], [1, 2], [1, 2], [3], [4]]) == \
        ([0, 1, 0, 0, 1, 2], [0, 1, 5], [0, 0, 1, 2, 1, 0])
    monkeypatch.setattr(fastgen, "GROUP_MAX", 2)             # a prompt's third row starts a second group
    assert fastgen._groups([[1, 2], [3], [1, 2], [1, 2], [3], [1, 2]]) == \
        ([0, 1, 0, 2, 1, 2], [0, 1, 3], [0, 0, 1, 0, 1, 1])


def _prompts(tok, order="grouped"):
    """Ten rows: groups of 4, 2, 3 and 1 identical prompts of 32, 14, 64 and 38 tokens."""
    a, b, c = (common.chat_ids(tok, m) for m in MSGS)
    groups = [[a] * 4, [b] * 2, [a[:32] + a] * 3, [c]]
    rows = [p for grp in groups for p in grp]
    if order == "mixed":                               # members of a group apart
        rows = [rows[i] for i in (0, 4, 6, 1, 9, 7, 2, 5, 8, 3)]
    return rows


def _run(model, tok, prompts, monkeypatch, shared, **kw):
    """fastgen.generate with SHARED_PREFIX on or off -> (completions, per-step logits, carves' row views,
    compactions)."""
    monkeypatch.setattr(fastgen, "SHARED_PREFIX", shared)
    fastgen.free_fast_cache(model)
    moves, compact = [], fastgen._compact_prefix
    monkeypatch.setattr(fastgen, "_compact_prefix", lambda st, slot, c, keep, *a: moves.append(len(keep)) or
                        compact(st, slot, c, keep, *a))
    record = []
    out = fastgen.generate(model, tok, prompts, seed=11, batch_size=16, graphs=False, record=record, **kw)
    slot = next(iter(fastpack.hf_causal_lm(model).__dict__["_chorus_fast"]["slots"].values()))
    views = {key: sorted(c["views"]) for key, c in slot["carves"].items()}
    return out, record, views, moves


CAPS = [40, 5, 20, 3, 12, 40, 7, 30, 18, 2]     # rows leave after 16 and 32 tokens: two compactions


@pytest.mark.parametrize("order", ["grouped", "mixed", "split"])
def test_shared_prefix_greedy_equals_default_layout_and_hf(order, monkeypatch):
    """mixed: a group's rows apart in the batch; split: GROUP_MAX 3 stores the four-row prompt twice."""
    if order == "split":
        monkeypatch.setattr(fastgen, "GROUP_MAX", 3)
    model, tok = common.tiny_model(0)
    pm = common.add_lora(model, r=4, alpha=8, dropout=0.0)
    _randomize_lora(pm, 8)
    prompts = _prompts(tok, order)
    caps = CAPS if order != "mixed" else [CAPS[i] for i in (0, 4, 6, 1, 9, 7, 2, 5, 8, 3)]
    kw = dict(max_new_tokens=40, temperature=0, top_p=1.0, ignore_stop=True, max_lens=caps)
    on, rec, views, moves = _run(pm, tok, prompts, monkeypatch, True, **kw)
    off, rec0, views0, _ = _run(pm, tok, prompts, monkeypatch, False, **kw)
    carve = (5, 3, 40) if order == "split" else (4, 4, 40)             # (groups, most rows in one, S)
    assert views == {carve: [2, 6, 12]} and views0 == {}               # on 12, then 6, then 2 slot rows
    assert moves == [5, 2]
    assert _tokens(on) == _tokens(off) and [len(c.completion_ids) for c in on] == caps
    for a, b in zip(rec, rec0):                                        # the same logits while a row runs
        running = ~a.isnan().any(1)
        torch.testing.assert_close(a[running], b[running], atol=1e-4, rtol=1e-4)
    hf = common._generate_hf(pm, tok, prompts, max_new_tokens=40, temperature=0, top_p=1.0, seed=0,
                             batch_size=16, ignore_stop=True)
    assert _tokens(on) == [c.completion_ids[:cap] for c, cap in zip(hf, caps)]


def test_shared_prefix_sampling_keeps_every_rows_tokens(monkeypatch):
    """Sampled with the same seed, every row's tokens equal the default layout's (noise keyed by the row's
    place in the call), twins sample apart, and rows ending at a stop token leave the batch."""
    model, tok = common.tiny_model(0)
    prompts = _prompts(tok)
    kw = dict(max_new_tokens=40, temperature=0.9, top_p=0.95, ignore_stop=True, max_lens=CAPS)
    on, _, _, moves = _run(model, tok, prompts, monkeypatch, True, **kw)
    off = _run(model, tok, prompts, monkeypatch, False, **kw)[0]
    assert _tokens(on) == _tokens(off) and moves == [5, 2]
    assert len({tuple(c.completion_ids[:4]) for c in on[:4]}) > 1
    stop_tok = on[0].completion_ids[6]                                 # a token that ends some rows early
    monkeypatch.setattr(fastgen, "stop_sets", lambda m, t: ({stop_tok}, frozenset()))
    kw = dict(max_new_tokens=40, temperature=0.9, top_p=0.95)
    on, _, _, moves = _run(model, tok, prompts, monkeypatch, True, **kw)
    off = _run(model, tok, prompts, monkeypatch, False, **kw)[0]
    assert _tokens(on) == _tokens(off) and any(not c.truncated for c in on)


def test_shared_prefix_off_without_twins_and_slot_reuse(monkeypatch):
    """A batch without repeated prompts runs the default layout; a grouped call carves the same slot, and a
    call with the same group shapes reuses the carve."""
    model, tok = common.tiny_model(0)
    monkeypatch.setattr(fastgen, "SHARED_PREFIX", True)
    kw = dict(max_new_tokens=8, temperature=0, top_p=1.0, seed=0, batch_size=16, ignore_stop=True)
    distinct = [common.chat_ids(tok, m) for m in MSGS]
    slot = lambda: next(iter(fastpack.hf_causal_lm(model).__dict__["_chorus_fast"]["slots"].values()))  # noqa: E731
    fastgen.generate(model, tok, distinct + [p[:-1] for p in distinct], **kw)   # 6 distinct rows: no carve
    assert slot()["carves"] == {}
    grouped = [p for p in distinct for _ in range(2)]
    first = fastgen.generate(model, tok, grouped, **kw)
    slot = slot()
    carve = slot["carves"][(3, 2, 8)]
    again = fastgen.generate(model, tok, grouped[::-1], **kw)
    assert slot["carves"] == {(3, 2, 8): carve} and _tokens(again) == _tokens(first)[::-1]
    monkeypatch.setattr(fastgen, "SHARED_PREFIX", False)
    assert _tokens(fastgen.generate(model, tok, grouped, **kw)) == _tokens(first)


def test_decode_two_part_bench_cpu_smoke(tmp_path, monkeypatch):
    """bench/decode_two_part.py's CPU smoke: both layouts' outputs agree on the bench's own data."""
    import importlib.util
    import json
    spec = importlib.util.spec_from_file_location("decode_two_part", ROOT / "bench" / "decode_two_part.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "d.json"
    monkeypatch.setattr(sys, "argv", ["decode_two_part.py", "--device", "cpu", "--groups", "2", "--prefix", "40,300",
                                      "--suffix", "1,30", "--iters", "1", "--out", str(out)])
    bench.main()
    r = json.loads(out.read_text())
    diffs = r["max_abs_diff_vs_math"]
    assert len(diffs) == 8 and max(diffs.values()) < 1e-5                # today math and two-part torch, 4 cases
    assert r["bytes_read"]["P300 S30"]["two_part"] < r["bytes_read"]["P300 S30"]["today"]
