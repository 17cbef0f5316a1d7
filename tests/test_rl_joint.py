"""rl.py's experts in one process (--adapter A B --out X Y): the rendezvous that lets their rollouts share each
generate call (jointgen.JointGenerate) against known call sequences, and whole runs on the tiny model: on the HF
path (CPU) each expert of a joint run trains exactly as it does alone, and an expert's checkpoint resumes alone or
jointly alike (checkpoints name the weights "default" whatever the expert's adapter is called).

Run: python -m pytest -q tests/test_rl_joint.py
"""
import importlib.util
import json
import threading
from pathlib import Path

import pytest
import torch

import common
import onpolicy
import rl
import rundir
from jointgen import JointGenerate, joint_collect

from test_rl import AND_TASK, one_thread  # noqa: F401 (an autouse fixture: one torch thread)
from test_rl import RL_BASE as BASE
from test_rl import _hash_score as _score

spec = importlib.util.spec_from_file_location("joint_smoke", Path(__file__).resolve().parents[1] / "bench/gpu/joint_smoke.py")
joint_smoke = importlib.util.module_from_spec(spec)
spec.loader.exec_module(joint_smoke)

TASKS = [dict(AND_TASK, id=f"and{k}") for k in range(3)]


# -----------------------------------------------------------------------------
# the rendezvous

class _Member:
    def __init__(self, name, joint):
        self.name, self.joint = name, joint


def _fake_generate(record):
    def generate(model, tok, msgs, adapters=None, fast=None, **kw):
        record.append({"msgs": list(msgs), "adapters": adapters, "seed": kw["seed"], "active": model.active})
        return [f"{a}:{m}:{kw['seed']}" for m, a in zip(msgs, adapters or [model.active] * len(msgs))]
    return generate


class _Model:
    def __init__(self):
        self.active = "none"


def test_joint_calls_wait_for_every_policy_still_rolling_out(monkeypatch):
    """Three policies making 2, 3 and 1 calls: each call waits for every policy still rolling out, so the calls are
    {a, b, c}, {a, b}, {b}; rows keep the policies' order, the call's seed is the first waiting policy's, and each
    policy gets its own rows back."""
    record = []
    monkeypatch.setattr(common, "generate", _fake_generate(record))
    monkeypatch.setattr(common, "fast_path", lambda model, fast=None: True)
    joint = JointGenerate(_Model(), None, ["a", "b", "c"])
    plan = {"a": 2, "b": 3, "c": 1}
    seeds = {"a": 10, "b": 20, "c": 30}

    def collect(m):
        gen = m.joint.member(m.name)
        got = []
        for i in range(plan[m.name]):
            got.append(gen(None, None, [f"{m.name}{i}"] * (1 + (m.name == "b")), seed=seeds[m.name] + i))
        return got
    members = [_Member(n, joint) for n in ("c", "a", "b")]           # the policies' order is JointGenerate's
    out = dict(zip(("c", "a", "b"), joint_collect(members, collect)))
    assert [c for c, _ in joint.calls] == [["a", "b", "c"], ["a", "b"], ["b"]]
    assert [r for _, r in joint.calls] == [[1, 2, 1], [1, 2], [2]]
    assert record[0]["msgs"] == ["a0", "b0", "b0", "c0"] and record[0]["adapters"] == ["a", "b", "b", "c"]
    assert [r["seed"] for r in record] == [10, 11, 22]
    assert out["a"] == [["a:a0:10"], ["a:a1:11"]]
    assert out["b"] == [["b:b0:10"] * 2, ["b:b1:11"] * 2, ["b:b2:22"] * 2]
    assert out["c"] == [["c:c0:10"]]


def test_on_the_hf_path_each_policy_samples_as_alone(monkeypatch):
    """Without the fast path every policy's rows are a call of their own, under its adapter, with its own seed."""
    record = []
    model = _Model()
    monkeypatch.setattr(common, "generate", _fake_generate(record))
    monkeypatch.setattr(common, "fast_path", lambda model, fast=None: False)

    class _Use:
        def __init__(self, m, name):
            self.m, self.name = m, name

        def __enter__(self):
            self.before, self.m.active = self.m.active, self.name

        def __exit__(self, *exc):
            self.m.active = self.before
    monkeypatch.setattr(common, "use_adapter", _Use)
    joint = JointGenerate(model, None, ["a", "b"])
    out = joint_collect([_Member("a", joint), _Member("b", joint)],
                        lambda m: m.joint.member(m.name)(None, None, [m.name], seed={"a": 1, "b": 2}[m.name]))
    assert out == [["a:a:1"], ["b:b:2"]]
    assert [(r["active"], r["adapters"], r["seed"]) for r in record] == [("a", None, 1), ("b", None, 2)]


def test_an_error_reaches_every_policy_and_a_failing_policy_does_not_block_the_others(monkeypatch):
    monkeypatch.setattr(common, "fast_path", lambda model, fast=None: True)

    def boom(*a, **k):
        raise RuntimeError("out of memory")
    monkeypatch.setattr(common, "generate", boom)
    joint = JointGenerate(_Model(), None, ["a", "b"])
    seen = []

    def collect(m):
        try:
            m.joint.member(m.name)(None, None, ["x"], seed=0)
        except RuntimeError as e:
            seen.append((m.name, str(e)))
            raise
    with pytest.raises(RuntimeError, match="out of memory"):
        joint_collect([_Member("a", joint), _Member("b", joint)], collect)
    assert sorted(seen) == [("a", "out of memory"), ("b", "out of memory")]
    record = []
    monkeypatch.setattr(common, "generate", _fake_generate(record))
    joint = JointGenerate(_Model(), None, ["a", "b"])

    def collect2(m):
        if m.name == "a":
            raise ValueError("a's scorer died")
        return [m.joint.member(m.name)(None, None, ["y"], seed=5) for _ in range(2)]
    with pytest.raises(ValueError, match="scorer died"):
        joint_collect([_Member("a", joint), _Member("b", joint)], collect2)
    assert [c for c, _ in joint.calls] == [["b"], ["b"]]              # b went on alone, no deadlock
    assert threading.active_count() < 50


# -----------------------------------------------------------------------------
# whole runs on the tiny model

def _adapter(tmp_path, seed):
    """An initial adapter for the tiny model (--model tiny --seed 7), non-zero B so it matters (the GPU smoke
    script's own, bench/gpu/joint_smoke.py)."""
    return joint_smoke.initial_adapter(seed, tmp_path / f"init{seed}")


def _weights(out, step):
    return torch.load(out / "ckpt" / f"step_{step:06d}" / "optimizer.pt", weights_only=False)["trainable"]


def _same(wa, wb):
    return wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


def _log(out):
    return [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]


def test_a_joint_run_trains_each_expert_as_alone_and_resumes_from_a_solo_checkpoint(tmp_path):
    a0, a1 = _adapter(tmp_path, 1), _adapter(tmp_path, 2)
    base = BASE + ["--steps", "2", "--save-every", "1"]
    rl.run(rl.parse_args(base + ["--adapter", a0, "--out", str(tmp_path / "s0")]), score_fn=_score, tasks=TASKS)
    rl.run(rl.parse_args(base + ["--adapter", a1, "--out", str(tmp_path / "s1")]), score_fn=_score, tasks=TASKS)
    j0, j1 = tmp_path / "j0", tmp_path / "j1"
    args = rl.parse_args(base + ["--adapter", a0, a1, "--out", str(j0), str(j1)])
    rl.run(args, score_fn=_score, tasks=TASKS)
    for solo, joint in ((tmp_path / "s0", j0), (tmp_path / "s1", j1)):
        assert _same(_weights(solo, 2), _weights(joint, 2))
        assert _same(_weights(solo, 1), _weights(joint, 1))
        keys = ("reward", "cursor", "completions/mean_length", "grad_norm")
        assert [[r.get(k) for k in keys] for r in _log(solo)] == [[r.get(k) for k in keys] for r in _log(joint)]
        assert (joint / "done.json").is_file() and (joint / "adapter/adapter_config.json").is_file()
    assert not _same(_weights(j0, 2), _weights(j1, 2))
    cfg = json.loads((j1 / "result.json").read_text())["config"]
    assert cfg["adapter"] == a1 and cfg["out"] == str(j1) and cfg["joint"]["outs"] == [str(j0), str(j1)]
    # expert1's solo checkpoint at step 1 (weights named "default") resumes as "expert1" beside a fresh expert0
    r0, r1 = tmp_path / "r0", tmp_path / "r1"
    __import__("shutil").copytree(tmp_path / "s1", r1)
    for f in ("done.json", "result.json"):
        (r1 / f).unlink()
    __import__("shutil").rmtree(r1 / "ckpt" / "step_000002")
    rl.run(rl.parse_args(base + ["--adapter", a0, a1, "--out", str(r0), str(r1), "--resume"]), score_fn=_score,
           tasks=TASKS)
    assert _same(_weights(tmp_path / "s1", 2), _weights(r1, 2)) and _same(_weights(tmp_path / "s0", 2), _weights(r0, 2))
    assert [r["step"] for r in _log(r1)] == [1, 2]
    # and a joint checkpoint resumes alone
    q1 = tmp_path / "q1"
    __import__("shutil").copytree(j1, q1)
    for f in ("done.json", "result.json"):
        (q1 / f).unlink()
    __import__("shutil").rmtree(q1 / "ckpt" / "step_000002")
    rl.run(rl.parse_args(base + ["--adapter", a1, "--out", str(q1), "--resume"]), score_fn=_score, tasks=TASKS)
    assert _same(_weights(tmp_path / "s1", 2), _weights(q1, 2))


def test_a_deadline_stops_every_expert_checkpointed(tmp_path, monkeypatch):
    """One expert near the deadline stops all of them, each checkpointed at the same step, and --resume finishes
    both as an uninterrupted joint run does."""
    a0, a1 = _adapter(tmp_path, 1), _adapter(tmp_path, 2)
    base = BASE + ["--steps", "3", "--save-every", "5", "--adapter", a0, a1]
    rl.run(rl.parse_args(base + ["--out", str(tmp_path / "u0"), str(tmp_path / "u1")]), score_fn=_score, tasks=TASKS)
    near = iter([False, False, False, False, True, True])               # per expert, per between_steps call
    monkeypatch.setattr(onpolicy, "deadline_near", lambda *a, **k: next(near))
    outs = [str(tmp_path / "d0"), str(tmp_path / "d1")]
    assert rl.run(rl.parse_args(base + ["--out", *outs]), score_fn=_score, tasks=TASKS) == rundir.EXIT_DEADLINE
    for o in outs:
        assert rundir.latest_checkpoint(f"{o}/ckpt").name == "step_000002"
        assert (tmp_path / o / "deadline_stop.json").is_file() and not (tmp_path / o / "done.json").exists()
    monkeypatch.setattr(onpolicy, "deadline_near", lambda *a, **k: False)
    rl.run(rl.parse_args(base + ["--out", *outs, "--resume"]), score_fn=_score, tasks=TASKS)
    for k in range(2):
        assert _log(tmp_path / f"u{k}")[-1]["reward"] == _log(tmp_path / f"d{k}")[-1]["reward"]
        assert (tmp_path / f"d{k}" / "done.json").is_file()


def test_joint_flags_are_checked_before_any_work(tmp_path, capsys):
    for argv, words in ((["--adapter", "a", "b", "--out", "x"], "one --adapter per --out"),
                        (["--out", "x", "y"], "one --adapter per --out"),
                        (["--adapter", "a", "b", "--out", "x", "x"], "its own --out"),
                        (["--adapter", "a", "b", "--out", "x", "y", "--kl-beta", "0.1"], "train them apart")):
        with pytest.raises(SystemExit):
            rl.parse_args(BASE + argv)
        assert words in capsys.readouterr().err


def test_on_the_fast_path_the_experts_share_one_call_and_the_first_samples_as_alone(tmp_path, monkeypatch):
    """The GPU's path, run eagerly on CPU ($CHORUS_FAST_CPU): every generate call of a joint run is one stacked call
    over both experts' rows, and the first expert's rows (first in the call, its seed) are the ones it samples
    alone, so it trains exactly as alone; the second expert's rows have other places in the call: other samples."""
    monkeypatch.setenv(common.FAST_CPU_ENV, "1")
    a0, a1 = _adapter(tmp_path, 1), _adapter(tmp_path, 2)
    base = BASE + ["--steps", "2", "--save-every", "1", "--gen-batch-size", "8"]
    calls = []
    real = common.generate

    def spy(model, tok, msgs, **kw):
        calls.append(kw.get("adapters"))
        return real(model, tok, msgs, **kw)
    rl.run(rl.parse_args(base + ["--adapter", a0, "--out", str(tmp_path / "s0")]), score_fn=_score, tasks=TASKS)
    monkeypatch.setattr(common, "generate", spy)
    rl.run(rl.parse_args(base + ["--adapter", a0, a1, "--out", str(tmp_path / "j0"), str(tmp_path / "j1")]),
           score_fn=_score, tasks=TASKS)
    assert calls and all(c is not None and c == ["expert0"] * (len(c) // 2) + ["expert1"] * (len(c) // 2)
                         for c in calls)
    assert len(calls) == 2 * 2                                       # 2 steps x 2 rounds, one call each
    assert _same(_weights(tmp_path / "s0", 2), _weights(tmp_path / "j0", 2))
    assert [r["reward"] for r in _log(tmp_path / "s0")] == [r["reward"] for r in _log(tmp_path / "j0")]


def test_an_expert_that_ends_as_another_meets_the_deadline_is_finished(tmp_path, monkeypatch):
    """Expert 0 on a plateau in the round where expert 1 meets the deadline: expert 0's run is complete (adapter,
    done.json), expert 1 stops checkpointed at the same step, and the run exits 75."""
    a0, a1 = _adapter(tmp_path, 1), _adapter(tmp_path, 2)
    outs = [str(tmp_path / "d0"), str(tmp_path / "d1")]
    real = onpolicy.between_steps

    def ends(args, step, **kw):
        end, t = real(args, step, **kw)
        return ("plateau" if args.out == outs[0] and step == 2 else end), t
    monkeypatch.setattr(onpolicy, "between_steps", ends)
    monkeypatch.setattr(onpolicy, "deadline_near", lambda d, args, log, step, extra_s=0.0: args.out == outs[1] and step == 2)
    argv = BASE + ["--steps", "4", "--save-every", "5", "--adapter", a0, a1, "--out", *outs]
    assert rl.run(rl.parse_args(argv), score_fn=_score, tasks=TASKS) == rundir.EXIT_DEADLINE
    assert (tmp_path / "d0/done.json").is_file() and (tmp_path / "d0/adapter/adapter_config.json").is_file()
    assert json.loads((tmp_path / "d0/result.json").read_text())["outcome"]["steps"] == 2
    assert not (tmp_path / "d1/done.json").exists() and (tmp_path / "d1" / rundir.DEADLINE_MARKER).is_file()
    assert rundir.latest_checkpoint(tmp_path / "d1/ckpt").name == "step_000002"
    assert all(0 <= r["t_ckpt"] < 60 for r in _log(tmp_path / "d1"))    # seconds, not a clock reading


def test_pause_at_stops_each_expert_at_its_own_step(tmp_path):
    """Experts resumed at different steps: --pause-at 2 stops expert1 (resumed at step 2) at once and lets expert0
    train from step 0 to its own step 2; both checkpointed there, the markers say pause, the run exits 75."""
    a0, a1 = _adapter(tmp_path, 1), _adapter(tmp_path, 2)
    base = BASE + ["--steps", "3", "--save-every", "1"]
    rl.run(rl.parse_args(base + ["--adapter", a1, "--out", str(tmp_path / "s1")]), score_fn=_score, tasks=TASKS)
    p0, p1 = tmp_path / "p0", tmp_path / "p1"
    __import__("shutil").copytree(tmp_path / "s1", p1)
    for f in ("done.json", "result.json"):
        (p1 / f).unlink()
    __import__("shutil").rmtree(p1 / "ckpt" / "step_000003")
    argv = base + ["--adapter", a0, a1, "--out", str(p0), str(p1), "--pause-at", "2", "--resume"]
    assert rl.run(rl.parse_args(argv), score_fn=_score, tasks=TASKS) == rundir.EXIT_DEADLINE
    assert [r["step"] for r in _log(p0)] == [1, 2] and [r["step"] for r in _log(p1)] == [1, 2]
    for p in (p0, p1):
        assert rundir.latest_checkpoint(p / "ckpt").name == "step_000002" and not (p / "done.json").exists()
        assert json.loads((p / rundir.DEADLINE_MARKER).read_text())["why"] == "pause"
    rl.run(rl.parse_args(base + ["--adapter", a0, a1, "--out", str(p0), str(p1), "--resume"]), score_fn=_score,
           tasks=TASKS)
    assert _same(_weights(tmp_path / "s1", 3), _weights(p1, 3)) and (p0 / "done.json").is_file()
