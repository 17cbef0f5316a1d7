"""Answers handed on as their rows finish (on_done): fastgen.generate calls it for each row at the decode loop's
stop check that sees the row end, so the rollouts submit its simulation while the longer rows still decode;
common.generate on the HF path after each (sub)call; jointgen.JointGenerate maps the shared call's rows back to each
policy's own numbering (its rows, then its beside rows); onpolicy.two_round_rollouts scores each row when it hears of
it. Known answers: which decode step each row is heard at, each row heard once, the heard objects are the returned
ones, and the tokens equal a call without on_done.

Run: python -m pytest -q tests/test_stream.py
"""
import contextlib
import math
from types import SimpleNamespace

import pytest

import common
import fastgen
import jointgen
import onpolicy
from score import Score
from test_common import _randomize_lora, _tokens, one_thread  # noqa: F401 (fixture, shared helpers)
from test_fastgen_prefix import CAPS, _prompts


@pytest.mark.parametrize("shared", [False, True])
def test_fastgen_hands_on_each_row_at_the_check_that_sees_it_end(shared, monkeypatch):
    """Ten rows capped at CAPS (both layouts; the shared one compacts its groups): with CHECK_EVERY 4, a row capped
    at c is heard after min(4 ceil(c / 4), 40) - 1 decode steps, before the call returns, once, as the very object
    the call returns; the tokens are those of a call without on_done."""
    model, tok = common.tiny_model(0)
    monkeypatch.setattr(fastgen, "SHARED_PREFIX", shared)
    monkeypatch.setattr(fastgen, "CHECK_EVERY", 4)
    prompts = _prompts(tok)
    kw = dict(max_new_tokens=40, temperature=0.9, top_p=0.95, seed=3, batch_size=16, graphs=False, ignore_stop=True,
              max_lens=CAPS)
    plain = fastgen.generate(model, tok, prompts, **kw)
    steps, decode_step = [0], fastgen._decode_step
    monkeypatch.setattr(fastgen, "_decode_step", lambda *a: steps.__setitem__(0, steps[0] + 1) or decode_step(*a))
    heard = []
    out = fastgen.generate(model, tok, prompts, on_done=lambda k, c: heard.append((k, c, steps[0])), **kw)
    assert sorted(k for k, _, _ in heard) == list(range(len(prompts)))
    assert all(out[k] is c for k, c, _ in heard)
    assert {k: at for k, _, at in heard} == {k: min(4 * math.ceil(cap / 4), 40) - 1 for k, cap in enumerate(CAPS)}
    assert _tokens(out) == _tokens(plain) and [len(c.completion_ids) for c in out] == CAPS
    assert [c.text for c in out] == [c.text for c in plain] and all(c.truncated for c in out)


def test_fastgen_hands_on_a_row_at_its_stop_token_and_the_rest_at_the_end(monkeypatch):
    """Rows that end at a stop token are heard at the check after it, cut after it as the returned Completion is;
    rows that run to max_new_tokens are heard at the end. A batch cut by the budget numbers its rows in the call."""
    model, tok = common.tiny_model(0)
    monkeypatch.setattr(fastgen, "CHECK_EVERY", 2)
    prompts = _prompts(tok)
    kw = dict(max_new_tokens=24, temperature=0.9, top_p=0.95, seed=5, batch_size=4, graphs=False)
    first = fastgen.generate(model, tok, prompts, ignore_stop=True, **kw)
    stop_tok = first[6].completion_ids[1]                             # ends row 6 (second batch) after 2 tokens
    monkeypatch.setattr(fastgen, "stop_sets", lambda m, t: ({stop_tok}, frozenset()))
    plain = fastgen.generate(model, tok, prompts, **kw)
    heard = []
    out = fastgen.generate(model, tok, prompts, on_done=lambda k, c: heard.append((k, c)), **kw)
    assert sorted(k for k, _ in heard) == list(range(len(prompts))) and all(out[k] is c for k, c in heard)
    assert _tokens(out) == _tokens(plain) and [c.truncated for c in out] == [c.truncated for c in plain]
    assert out[6].completion_ids == first[6].completion_ids[:2] and not out[6].truncated
    # in each batch of 4: the stopped rows in the order of the check that saw them, then the others in order
    seen_at = lambda k: (min(2 * math.ceil(len(out[k].completion_ids) / 2), 24) if not out[k].truncated  # noqa: E731
                         else math.inf, k)
    for lo in range(0, len(prompts), 4):
        assert [k for k, _ in heard if lo <= k < lo + 4] == sorted(range(lo, min(lo + 4, len(prompts))), key=seen_at)
    assert [k for k, _ in heard] != sorted(k for k, _ in heard)       # row 6 before rows 4 and 5


def test_common_generate_hf_path_hands_on_each_chat_once():
    """HF generate (CPU): each chat heard once, with the returned object; with adapters, after its adapter's call."""
    model, tok = common.tiny_model(0)
    pm = common.add_lora(model, r=4, alpha=8, dropout=0.0)
    common.add_lora(pm, r=4, alpha=8, dropout=0.0, adapter_name="other")
    _randomize_lora(pm, 8)
    msgs = [[{"role": "user", "content": f"test {w}"}] for w in ("a", "the fifo", "b")]
    kw = dict(max_new_tokens=5, temperature=1.0, seed=2, fast=False)
    for extra in ({}, {"adapters": ["other", "default", "other"]}):
        heard = []
        out = common.generate(pm, tok, msgs, on_done=lambda k, c: heard.append((k, c)), **kw, **extra)
        assert sorted(k for k, _ in heard) == [0, 1, 2] and all(out[k] is c for k, c in heard)
        assert _tokens(out) == _tokens(common.generate(pm, tok, msgs, **kw, **extra))
        if extra:
            assert [k for k, _ in heard] == [0, 2, 1]                 # "other"'s call first, then "default"'s


class _Model:
    active = "none"


class _Member:
    def __init__(self, name, joint):
        self.name, self.joint = name, joint


def _reverse_generate(model, tok, msgs, adapters=None, seeds=None, fast=None, stack=None, on_done=None, **kw):
    """A scripted generate that hands its rows on last to first."""
    out = [f"{a}:{m}" for m, a in zip(msgs, adapters or ["own"] * len(msgs))]
    for k in reversed(range(len(out))):
        if on_done is not None:
            on_done(k, out[k])
    return out


@pytest.mark.parametrize("fast", [True, False])
def test_joint_calls_hand_each_policy_its_rows_in_its_own_numbering(monkeypatch, fast):
    """a and b share teacher t's answer to p; each policy hears each of its answers once, at its place in what it
    gets back (its rows, then its beside rows), whether one shared call or one call each made them; a policy
    without on_done hears nothing and gets its answers as before."""
    monkeypatch.setattr(common, "generate", _reverse_generate)
    monkeypatch.setattr(common, "fast_path", lambda model, f=None: fast)
    monkeypatch.setattr(common, "use_adapter", lambda model, name: contextlib.nullcontext())
    joint = jointgen.JointGenerate(_Model(), None, ["a", "b", "c"])
    beside = {"a": (["p", "qa"], ["t", "t"], [1, 2]), "b": (["qb", "p"], ["t", "t"], [3, 1]), "c": None}
    heard = {"a": [], "b": []}

    def collect(m):
        done = (lambda k, c: heard[m.name].append((k, c))) if m.name in heard else None
        return m.joint.member(m.name)(None, None, [m.name + "0", m.name + "1"], beside=beside[m.name], seed=7,
                                      on_done=done)
    out = dict(zip("abc", jointgen.joint_collect([_Member(n, joint) for n in "abc"], collect)))
    assert joint.beside == [(4, 3)]
    for n in "ab":
        assert sorted(k for k, _ in heard[n]) == [0, 1, 2, 3]
        assert all(out[n][k] == c for k, c in heard[n])
    assert out["a"][2:] == ["t:p", "t:qa"] and out["b"][2:] == ["t:qb", "t:p"]
    assert len(out["c"]) == 2


@pytest.mark.parametrize("fast", [True, False])
def test_an_error_in_one_policys_on_done_stays_its_own(monkeypatch, fast):
    """Policy a's scorer raises while its answers are handed on: a's call raises it, b gets its answers."""
    monkeypatch.setattr(common, "generate", _reverse_generate)
    monkeypatch.setattr(common, "fast_path", lambda model, f=None: fast)
    monkeypatch.setattr(common, "use_adapter", lambda model, name: contextlib.nullcontext())
    joint = jointgen.JointGenerate(_Model(), None, ["a", "b"])
    heard = []

    def hear(name):
        def on_done(k, c):
            if name == "a":
                raise ValueError("a's scorer failed")
            heard.append((k, c))
        return on_done

    def collect(m):
        try:
            return m.joint.member(m.name)(None, None, [m.name + "0", m.name + "1"], seed=7, on_done=hear(m.name))
        except ValueError as e:
            return str(e)
    out = jointgen.joint_collect([_Member(n, joint) for n in "ab"], collect)
    assert out[0] == "a's scorer failed" and len(out[1]) == 2
    assert sorted(k for k, _ in heard) == [0, 1] and all(out[1][k] == c for k, c in heard)


def test_rollouts_score_each_row_when_heard():
    """A generate_fn that hands rows on before it returns: their simulations are submitted during the call (the
    scorer's log shows them before the call's end), each once, and the groups equal those of a generate_fn that
    hands nothing on."""
    def run(stream):
        log = []

        def gen(msgs, seed, on_done, tasks):
            out = [common.Completion(f"{m[-1]}{i}", [1], [2] * (i + 1), False) for i, m in enumerate(msgs)]
            if stream:
                for k in reversed(range(len(out))):
                    on_done(k, out[k])
            log.append("returned")
            return out

        def score(task, c):
            log.append(c.text)
            r = 1.0 + len(c.completion_ids) / 10
            return lambda: Score(r, "ok", r - 1, result={"status": "ok"})
        groups, _ = onpolicy.two_round_rollouts([{"id": "t0"}, {"id": "t1"}], generate_fn=gen, score_fn=score,
                                                num_generations=2, seed_fn=lambda r, i: 0, build_fn=lambda t: [t["id"]],
                                                refine_fn=lambda t, a, r: [a])
        return groups, log
    streamed, log = run(True)
    plain, log0 = run(False)
    assert log[:3] == ["t01", "t00", "returned"] and log0[:3] == ["returned", "t00", "t01"]
    assert sorted(log) == sorted(log0)                                # each row scored once either way
    assert [[(s.text, s.reward) for s in g.samples] for g in streamed] == \
        [[(s.text, s.reward) for s in g.samples] for g in plain]


def test_model_source_hands_the_rollouts_only_the_policys_rows(monkeypatch):
    """With extra rows (distill.py's teachers) in the call, only the policy's rows reach the scorer early."""
    seen = []

    def gen(model, tok, msgs, beside=None, on_done=None, **kw):
        out = [common.Completion(f"p{k}", [1], [2], False) for k in range(len(msgs))] + \
              [common.Completion(f"x{k}", [1], [2], False) for k in range(len(beside[0]))]
        for k in reversed(range(len(out))):
            on_done(k, out[k])
        return out
    taken = []
    extra = lambda msgs, seed, tasks: (["m"] * 3, ["t"] * 3, [1] * 3, taken.append, None)     # noqa: E731

    def score(task, c):
        seen.append(c.text)
        return lambda: Score(1.0, "ok", 0.0, result={"status": "ok"})
    source = onpolicy.make_model_source(score, num_generations=2, max_new_tokens=4, seed=0, rounds=1, extra=extra,
                                        gen=gen)
    monkeypatch.setattr(onpolicy.harness, "first_messages", lambda t, mode: [t["id"]])
    groups, _ = source(SimpleNamespace(eval=lambda: None), None, [{"id": "t"}], step=0, first_index=0)
    assert seen == ["p1", "p0"] and [c.text for c in taken[0]] == ["x0", "x1", "x2"]
    assert [s.text for s in groups[0].samples] == ["p0", "p1"]


@pytest.mark.parametrize("shared", [False, True])
def test_joint_teachers_score_each_answer_as_its_row_finishes(shared):
    """distill.make_joint_teachers' done: a teacher answer handed on during the call is submitted then, with its
    prompt's task, and teacher_source only waits for it (each answer simulated once, with or without the students'
    shared scores dict); the rewards equal those of answers scored at the end."""
    import distill
    submitted = []

    def score_fn(task, c):
        submitted.append((task["id"], c.text))
        return lambda: Score(1.0 + len(c.text) / 10, "ok", 0.0, result={"status": "ok"})
    extra, teacher_source = distill.make_joint_teachers(score_fn, ["t0", "t1"], num_samples=2, group_size=2,
                                                        scores={} if shared else None)
    ma, mb = [{"role": "user", "content": "a"}], [{"role": "user", "content": "b"}]
    tasks = [{"id": "A"}, {"id": "A"}, {"id": "B"}, {"id": "B"}]
    more, names, _, take, done = extra([ma, ma, mb, mb], 0, tasks)
    assert names == ["t0"] * 4 + ["t1"] * 4 and more == [ma, ma, mb, mb] * 2
    answers = [SimpleNamespace(text="x" * (k + 1)) for k in range(8)]
    for r in (6, 1, 4):                                # three rows finish early: t1's b, t0's a, t1's a
        done(r, answers[r])
    assert submitted == [("B", "x" * 7), ("A", "xx"), ("A", "x" * 5)]
    take(answers)
    groups = [SimpleNamespace(samples=[SimpleNamespace(messages=m, task_id=t["id"])]) for m, t in ((ma, tasks[0]),
                                                                                                   (mb, tasks[2]))]
    rewards, _ = teacher_source(None, None, groups, [tasks[0], tasks[2]], ["t0", "t1"], step=0)
    assert sorted(submitted) == sorted((t, "x" * (k + 1)) for k, t in enumerate("AABBAABB"))   # each once
    assert rewards == [[[1.1, 1.2], [1.5, 1.6]], [[1.3, 1.4], [1.7, 1.8]]]
    assert extra([ma, ma], 1)[4] is None               # without the rows' tasks nothing is scored early


def test_the_gpu_check_passes_on_the_tiny_model(tmp_path):
    """bench/gpu/stream_check.py (the same checks on a GPU's default decoder path) on CPU: every row heard once, the
    returned objects, equal tokens, and most rows heard before the call ends."""
    import importlib.util
    from pathlib import Path
    path = Path(__file__).resolve().parents[1] / "bench/gpu/stream_check.py"
    spec = importlib.util.spec_from_file_location("stream_check", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = tmp_path / "sc.json"
    assert mod.main(["--shape", "tiny", "--rows", "12", "--out", str(out)]) == 0
    import json
    rec = json.loads(out.read_text())
    assert rec["ok"] and all(c["heard_before_end"] >= 6 and not c["in_order"] for c in rec["cases"].values())
    with pytest.raises(SystemExit, match="multiple of 4"):
        mod.main(["--rows", "10"])


def test_the_teachers_own_call_scores_each_answer_as_its_row_finishes(monkeypatch):
    """distill.make_teacher_source (teachers in a call of their own): answers handed on during the call are submitted
    then, the rest after it, each once, and the rewards keep their places."""
    import distill
    log = []

    def fake_generate(model, tok, msgs, adapters=None, on_done=None, **kw):
        out = [SimpleNamespace(text=f"{a}{k}") for k, a in enumerate(adapters)]
        for k in (5, 0, 2):
            on_done(k, out[k])
        log.append("returned")
        return out
    monkeypatch.setattr(common, "generate", fake_generate)

    def score(task, c):
        log.append(c.text)
        return lambda: Score(1.0 + int(c.text[-1]) / 10, "ok", 0.0, result={"status": "ok"})
    source = distill.make_teacher_source(score, num_samples=1, max_new_tokens=4, seed=0)
    groups = [SimpleNamespace(samples=[SimpleNamespace(messages=[m])]) for m in "abc"]
    rewards, _ = source(None, None, groups, ["A", "B", "C"], ["t", "u"], step=0)
    assert log == ["u5", "t0", "t2", "returned", "t1", "u3", "u4"]
    assert rewards == [[[1.0], [1.3]], [[1.1], [1.4]], [[1.2], [1.5]]]


@pytest.mark.needs_iverilog
def test_run_eval_submits_each_answer_as_the_policy_hands_it_on(monkeypatch):
    """evaluate.run_eval with a policy that `streams`: each answer is simulated from when the policy hands it on
    (before the policy's call returns), once, and the samples equal those of the same answers handed back at the end."""
    import evaluate
    import score as score_mod
    from test_evaluate import TASKS, scripted

    class Streaming:
        streams = True

        def __init__(self, inner, log):
            self.inner, self.log = inner, log

        def __call__(self, msgs, on_done=None):
            texts = self.inner(msgs)
            for k in reversed(range(len(texts))):
                on_done(k, texts[k])
            self.log.append("returned")
            return texts
    log, submit = [], score_mod.submit_answer
    monkeypatch.setattr(score_mod, "submit_answer", lambda pool, task, text, *a: log.append("submit")
                        or submit(pool, task, text, *a))
    streamed, m1 = evaluate.run_eval(Streaming(scripted(), log), TASKS, n=3, rounds=2, sim_workers=2, seed=7,
                                     batch_size=2, verbose=False, n_boot=0)
    assert log[:3] == ["submit", "submit", "returned"]                # a chunk of 2: both submitted during the call
    assert log.count("submit") == sum(len(s["rounds"]) for s in streamed)   # each answer once
    plain, m0 = evaluate.run_eval(scripted(), TASKS, n=3, rounds=2, sim_workers=2, seed=7, batch_size=2,
                                  verbose=False, n_boot=0)
    strip = lambda s: [(r["text"], r["key"], r["state_round"]) for r in s["rounds"]]    # noqa: E731
    assert [strip(s) for s in streamed] == [strip(s) for s in plain]
    assert m1["agentic"]["pass@1"] == m0["agentic"]["pass@1"]
