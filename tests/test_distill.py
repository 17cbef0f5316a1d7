"""Tests for distill.py: gate and routing on hand-made reward tables, the top-K control variate
against brute force, the advantage sign, and CPU steps with a tiny student and two tiny teachers.

Run: python -m pytest -q tests/test_distill.py
"""
import json
import math
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file

import common
import distill
import harness
import onpolicy
import rl
import rundir
from distill import gate, group_mode, group_stat, topk_reverse_kl, vopd_advantages
from helpers import EXPERTS_SEED, deadline_after
from onpolicy import Group, Sample, Score


# -----------------------------------------------------------------------------
# gate and routing on hand-made reward tables

def test_gate_routes_to_best_teacher_and_passes_when_it_beats_student():
    d = gate([1.2, 1.5, 0.0, 1.1], [[1.4], [1.7]])
    assert d.teacher == 1 and d.passed
    assert d.student_stat == 1.5 and d.teacher_stats == (1.4, 1.7)


def test_gate_fails_when_no_teacher_beats_student_and_is_strict():
    assert not gate([1.8, 1.0], [[1.5], [1.7]]).passed
    assert not gate([1.7, 1.0], [[1.5], [1.7]]).passed      # equal is not better
    assert gate([1.7, 1.0], [[1.5], [1.7000001]]).passed


def test_gate_ties_go_to_lowest_teacher_index():
    assert gate([1.0], [[1.6], [1.6], [1.2]]).teacher == 0
    assert gate([1.0], [[1.2], [1.6, 0.0], [1.6]]).teacher == 1
    # all teachers scored zero: routed to teacher 0, gate closed against a zero student
    d = gate([0.0, 0.0], [[0.0], [0.0]])
    assert d.teacher == 0 and not d.passed


def test_gate_eps_margin():
    student, teachers = [1.50, 1.2], [[1.55], [1.52]]
    assert gate(student, teachers, eps=0.0).passed
    assert gate(student, teachers, eps=0.04).passed
    assert not gate(student, teachers, eps=0.05).passed     # 1.55 > 1.55 is false
    assert not gate(student, teachers, eps=0.1).passed


def test_gate_median_statistic():
    # best: student 1.9 beats both teachers' best 1.8 -> skip
    student, teachers = [1.9, 0.0, 0.0, 1.0], [[1.8, 1.1, 1.2], [1.3, 1.3, 1.3]]
    assert not gate(student, teachers, stat="best").passed
    # median: student (0+1)/2 = 0.5; teachers 1.2 and 1.3 -> teacher 1 wins, gate opens
    d = gate(student, teachers, stat="median")
    assert d.passed and d.teacher == 1
    assert d.student_stat == 0.5 and d.teacher_stats == (1.2, 1.3)
    assert group_stat([3.0, 1.0, 2.0], "median") == 2.0
    with pytest.raises(ValueError):
        group_stat([1.0], "mean")
    with pytest.raises(ValueError):
        group_stat([], "best")


def test_no_gate_always_distills_from_t_star():
    d = gate([2.0, 2.0], [[0.0], [1.0]], always=True)
    assert d.passed and d.teacher == 1


def test_routing_over_a_table_with_all_skip_and_on_fail_rl():
    table = [  # (student group rewards, per-teacher rewards) for 4 groups
        ([1.1, 1.2, 1.0, 0.0], [[1.5], [1.3]]),   # teacher 0 wins
        ([1.9, 1.2, 1.0, 1.0], [[1.5], [1.8]]),   # student is best -> fail
        ([0.0, 0.0, 0.0, 0.0], [[0.0], [1.0]]),   # teacher 1 wins
        ([1.4, 1.4, 1.4, 1.4], [[1.4], [1.4]]),   # tie with student -> fail
    ]
    decisions = [gate(s, t) for s, t in table]
    assert [d.teacher for d in decisions] == [0, 1, 1, 0]
    assert [group_mode(d, "skip") for d in decisions] == ["opd", "skip", "opd", "skip"]
    assert [group_mode(d, "rl") for d in decisions] == ["opd", "rl", "opd", "rl"]
    all_skip = [gate(s, t) for s, t in [([2.0], [[1.9], [1.0]]), ([1.0], [[1.0], [0.0]])]]
    assert [group_mode(d) for d in all_skip] == ["skip", "skip"]
    with pytest.raises(ValueError):
        group_mode(decisions[0], "distill")
    with pytest.raises(ValueError):
        gate([1.0], [])


# -----------------------------------------------------------------------------
# the control variate b_t and the advantage

def _brute_force_b(student_logits, teacher_logits, k):
    """Reverse KL on the student's top-k support, one position at a time, in plain Python."""
    s = [float(x) for x in student_logits]
    t = [float(x) for x in teacher_logits]
    top = sorted(range(len(s)), key=lambda i: -s[i])[:k]
    zs = sum(math.exp(s[i]) for i in top)
    zt = sum(math.exp(t[i]) for i in top)
    return sum(math.exp(s[i]) / zs * ((s[i] - math.log(zs)) - (t[i] - math.log(zt))) for i in top)


@pytest.mark.parametrize("k", [1, 3, 16, 40])
def test_topk_reverse_kl_matches_brute_force(k):
    g = torch.Generator().manual_seed(k)
    student = torch.randn(2, 5, 20, generator=g, dtype=torch.float64) * 2
    teacher = torch.randn(2, 5, 20, generator=g, dtype=torch.float64) * 2
    b = topk_reverse_kl(student, teacher, k)
    assert b.shape == (2, 5)
    for i in range(2):
        for j in range(5):
            want = _brute_force_b(student[i, j], teacher[i, j], min(k, 20))
            assert b[i, j].item() == pytest.approx(want, abs=1e-9)
    assert (b >= -1e-12).all()                                   # a KL
    if k == 1:
        assert torch.allclose(b, torch.zeros_like(b))            # one token: q_s = q_t = 1
    # logits vs log-probs and a per-position shift of the teacher give the same value
    shifted = teacher.log_softmax(-1) + torch.randn(2, 5, 1, generator=g, dtype=torch.float64)
    assert torch.allclose(topk_reverse_kl(student.log_softmax(-1), shifted, k), b)


def test_topk_reverse_kl_is_zero_when_teacher_equals_student():
    x = torch.randn(3, 7, 50)
    assert topk_reverse_kl(x, x.clone(), 16).abs().max() < 1e-6


def test_vopd_advantages_formula_and_detach():
    s = torch.tensor([[-1.0, -2.0, -0.5]], requires_grad=True)
    t = torch.tensor([[-0.5, -3.0, -0.5]])
    b = torch.tensor([[0.1, 0.2, 0.0]], requires_grad=True)
    a = vopd_advantages(s, t, b, lam=2.0)
    assert not a.requires_grad
    assert torch.allclose(a, torch.tensor([[-2.0 * (-0.5 - 0.1), -2.0 * (1.0 - 0.2), 0.0]]))


# -----------------------------------------------------------------------------
# a tiny base model with three adapters on it: the student and two teachers

SEED = EXPERTS_SEED   # distill.py builds its tiny base with --seed; the `experts` fixture (conftest.py) made
                     # the adapters on the same one


def _args(paths, out, *extra):
    """distill.py's args on the experts fixture; out: a folder, or a list of them (students in one process)."""
    outs = [str(o) for o in out] if isinstance(out, (list, tuple)) else [str(out)]
    return distill.parse_args(["--model", "tiny", "--student", paths["student"], "--teachers", paths["t0"],
                               paths["t1"], "--tasks", "unused", "--out", *outs, "--seed", str(SEED),
                               "--lr", "1e-2", "--no-gradient-checkpointing", "--max-prompt-tokens", "-1", *extra])


def _trainable(path):
    return torch.load(path / "optimizer.pt", weights_only=False)["trainable"]


def test_build_models_one_base_student_trainable_teachers_frozen(experts):
    paths, _, _ = experts
    args = _args(paths, "unused")
    model, tok = distill.build_models(args, paths["student"], [paths["t0"], paths["t1"]])
    assert set(model.peft_config) == {"default", "teacher0", "teacher1"}
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all(".default." in n for n in trainable)
    with common.use_adapter(model, "teacher1"):
        assert model.active_adapter == "teacher1"
    assert model.active_adapter == "default"
    assert [n for n, p in model.named_parameters() if p.requires_grad] == trainable
    # the teachers really differ from the student on the same tokens
    ids = tok("module tb; reg a; initial a = 0; endmodule", add_special_tokens=False)["input_ids"]
    row = [(ids[:4], ids[4:])]
    with torch.no_grad():
        s = onpolicy.per_token_logps(model, row).logps
        with common.use_adapter(model, "teacher0"):
            t = onpolicy.per_token_logps(model, row).logps
    assert (s - t).abs().max() > 1e-3


def test_choose_experts_best_by_validation_and_student_not_its_own_teacher(tmp_path):
    files = []
    for i, (p1, c1) in enumerate([(40.0, 70.0), (55.0, 60.0), (55.0, 80.0)]):
        d = tmp_path / f"eval{i}"
        d.mkdir()
        (d / "metrics.json").write_text(json.dumps({"direct": {"pass@1": 1.0, "cov@1": 1.0},
                                                    "agentic": {"pass@1": p1, "cov@1": c1}}))
        files.append(str(d) if i else str(d / "metrics.json"))      # a folder or the file itself
    experts_ = [str(tmp_path / f"rl{i}") for i in range(3)]
    assert distill.choose_experts("best", experts_, files) == (experts_[2], experts_[:2])
    assert distill.choose_experts(experts_[0], experts_) == (experts_[0], experts_[1:])
    assert distill.choose_experts("other", experts_) == ("other", experts_)
    with pytest.raises(SystemExit):
        distill.choose_experts("best", experts_, files[:2])
    with pytest.raises(SystemExit):
        distill.choose_experts(experts_[0], experts_[:1])


def test_distill_advantages_match_a_naive_full_softmax(experts):
    paths, _, tok = experts
    model, _ = distill.build_models(_args(paths, "unused"), paths["student"], [paths["t0"], paths["t1"]])
    a = tok("module tb; reg a; initial a = 0; endmodule", add_special_tokens=False)["input_ids"]
    b = tok("filename: tb.sv", add_special_tokens=False)["input_ids"]
    rows = [SimpleNamespace(prompt_ids=b[:3], completion_ids=a), SimpleNamespace(prompt_ids=a[:5], completion_ids=b)]
    temp, k, lam = 0.7, 5, 0.5
    adv, sums = distill.distill_advantages(model, rows, "teacher1", temperature=temp, topk=k, lam=lam,
                                           max_tokens_per_micro=1, chunk_tokens=3)
    for r, got in zip(rows, adv):
        ids = torch.tensor([r.prompt_ids + r.completion_ids])
        P, C = len(r.prompt_ids), len(r.completion_ids)
        with torch.no_grad():
            s = model(input_ids=ids).logits[0, P - 1:P + C - 1].float() / temp
            with common.use_adapter(model, "teacher1"):
                t = model(input_ids=ids).logits[0, P - 1:P + C - 1].float() / temp
        y = torch.tensor(r.completion_ids)[:, None]
        log_ratio = (s.log_softmax(-1).gather(-1, y) - t.log_softmax(-1).gather(-1, y)).squeeze(-1)
        want = -lam * (log_ratio - topk_reverse_kl(s, t, k))
        assert got.shape == (C,) and torch.allclose(got, want, atol=1e-4)
    assert sums["tokens"] == len(a) + len(b)


def test_one_distillation_step_pulls_the_student_toward_the_teacher(experts):
    """A token where the teacher is more likely than the student gets A > 0 (b_t >= 0 only adds),
    and after one clipped policy-gradient step (rl.train_on_batch) on that token alone the
    student's log-prob of it rises."""
    paths, _, tok = experts
    model, _ = distill.build_models(_args(paths, "unused"), paths["student"], [paths["t0"], paths["t1"]])
    ids = tok("module tb; reg a, b; initial begin a = 0; b = 1; end endmodule", add_special_tokens=False)["input_ids"]
    row = SimpleNamespace(prompt_ids=ids[:4], completion_ids=ids[4:])
    with torch.no_grad():
        s = onpolicy.per_token_logps(model, [row]).logps[0]
        with common.use_adapter(model, "teacher0"):
            t = onpolicy.per_token_logps(model, [row]).logps[0]
    j = int(torch.argmax(t - s))
    assert t[j] > s[j]
    adv, _ = distill.distill_advantages(model, [row], "teacher0")
    assert adv[0][j] > 0
    only_j = torch.zeros_like(adv[0])
    only_j[j] = adv[0][j]
    opt = onpolicy.make_optimizer(model, lr=1e-3)
    rl.train_on_batch(model, opt, [row], [only_j], norm_groups=["opd"])
    with torch.no_grad():
        s_after = onpolicy.per_token_logps(model, [row]).logps[0]
    assert s_after[j] > s[j]


# -----------------------------------------------------------------------------
# the loop: scripted rollouts with known rewards, one real step, resume

def _scripted_sources(tok, table):
    """Student and teacher sources that return the rewards of table[(task_id, round)] =
    (student rewards, per-teacher rewards); the student's tokens are fixed short strings."""
    prompt = tok("module dut; endmodule", add_special_tokens=False)["input_ids"]
    texts = ["initial a = 0;", "initial begin b = 1; end", "reg [3:0] c;", "always @(posedge clk) d <= 1;"]

    def source(model, tok_, tasks, *, step, first_index):
        groups = []
        for t, task in enumerate(tasks):
            for rnd in (1, 2):
                rewards = table[(task["id"], rnd)][0]
                samples = [Sample(task["id"], rnd, [], texts[j % 4], prompt,
                                  tok(texts[j % 4], add_special_tokens=False)["input_ids"], False,
                                  Score(r, "ok" if r else "compile_error", r - 1 if r else None, r >= 2.0, r > 0, True))
                           for j, r in enumerate(rewards)]
                groups.append(Group(first_index + t, task["id"], rnd, samples))
        return groups, {"t_gen": 0.0, "t_sim": 0.0}

    def teacher_source(model, tok_, groups, group_tasks, teachers, *, step):
        assert [t["id"] for t in group_tasks] == [g.task_id for g in groups]
        assert teachers == ["teacher0", "teacher1"]
        return [table[(g.task_id, g.round)][1] for g in groups], {"t_gen": 0.0, "t_sim": 0.0}
    return source, teacher_source


def _gate_table():
    """Four tasks; step 0 sees p, q (mixed gates), step 1 sees x, y (every gate closed)."""
    tasks = [{"id": k} for k in "abcd"]
    p, q, x, y = [tasks[onpolicy.task_order(i, 4, SEED)]["id"] for i in range(4)]
    table = {  # (task, round): (student rewards, [teacher 0 rewards, teacher 1 rewards])
        (p, 1): ([1.2, 1.0], [[1.5], [1.3]]),    # teacher 0 beats the student      -> opd t0
        (p, 2): ([1.8, 1.0], [[1.5], [1.7]]),    # the student's best is higher     -> closed
        (q, 1): ([0.0, 0.0], [[0.0], [1.1]]),    # only teacher 1 compiles          -> opd t1
        (q, 2): ([1.4, 1.2], [[1.4], [1.4]]),    # tie with the student: not better -> closed
        (x, 1): ([1.9, 1.0], [[1.2], [1.2]]),    # step 1: every gate closed
        (x, 2): ([1.5, 0.0], [[1.5], [0.0]]),
        (y, 1): ([2.0, 1.0], [[1.0], [1.9]]),
        (y, 2): ([1.6, 1.6], [[1.6], [1.0]]),
    }
    return tasks, (p, q, x, y), table


def _record_training(monkeypatch):
    """Wrap rl.train_on_batch and record, per call, {(task_id, round): label} of the trained rows."""
    calls, real = [], rl.train_on_batch

    def spy(model, optimizer, rows, advantages, **kw):
        calls.append({(r.task_id, r.round): lab for r, lab in zip(rows, kw["norm_groups"])})
        return real(model, optimizer, rows, advantages, **kw)
    monkeypatch.setattr(distill, "train_on_batch", spy)
    return calls


def test_scripted_rollouts_gate_opens_and_skips_exactly_where_it_should(experts, tmp_path, monkeypatch):
    paths, _, tok = experts
    tasks, (p, q, x, y), table = _gate_table()
    source, teacher_source = _scripted_sources(tok, table)

    # default: gate on best reward, skip on failure
    calls = _record_training(monkeypatch)
    out = tmp_path / "skip"
    distill.run(_args(paths, out, "--steps", "2", "--prompts-per-step", "2", "--group-size", "2", "--save-every", "1"),
                source=source, teacher_source=teacher_source, tasks=tasks)
    assert calls == [{(p, 1): "opd", (q, 1): "opd"}]                   # step 1 trained nothing
    log = [json.loads(l) for l in (out / "log.jsonl").read_text().splitlines()]
    assert [r["gate_pass_rate"] for r in log] == [0.5, 0.0]
    assert [r["skipped_groups"] for r in log] == [2, 4] and [r["opd_groups"] for r in log] == [2, 0]
    assert [(r["teacher_chosen/t0"], r["teacher_chosen/t1"]) for r in log] == [(1, 1), (0, 0)]
    assert log[0]["student_reward_best"] == pytest.approx((1.2 + 1.8 + 0.0 + 1.4) / 4)
    assert log[0]["teacher_reward/t1"] == pytest.approx((1.3 + 1.7 + 1.1 + 1.4) / 4)
    assert "opd/log_ratio" in log[0] and "opd/b" in log[0] and log[0]["opd/b"] >= 0
    assert "opd/log_ratio" not in log[1] and log[1]["grad_norm"] == 0.0
    w1, w2 = _trainable(out / "ckpt" / "step_000001"), _trainable(out / "ckpt" / "step_000002")
    assert all(torch.equal(w1[k], w2[k]) for k in w1)                # the all-skip step changed nothing
    assert json.loads((out / "result.json").read_text())["outcome"]["skipped_groups"] == 6
    assert (out / "done.json").exists() and (out / "adapter" / "adapter_config.json").exists()
    assert (out / "curves.png").exists()

    # --on-fail rl: the closed groups get a GRPO update on the task reward instead
    calls.clear()
    distill.run(_args(paths, tmp_path / "rl", "--plot-every", "0",
                      "--steps", "2", "--prompts-per-step", "2", "--group-size", "2",
                      "--on-fail", "rl"), source=source, teacher_source=teacher_source, tasks=tasks)
    assert calls == [{(p, 1): "opd", (q, 1): "opd", (p, 2): "rl", (q, 2): "rl"},
                     {(x, 1): "rl", (x, 2): "rl", (y, 1): "rl", (y, 2): "rl"}]

    # --no-gate: always distill from t* (ties -> teacher 0)
    calls.clear()
    distill.run(_args(paths, tmp_path / "always", "--plot-every", "0",
                      "--steps", "2", "--prompts-per-step", "2", "--group-size", "2",
                      "--no-gate"), source=source, teacher_source=teacher_source, tasks=tasks)
    assert [set(c.values()) for c in calls] == [{"opd"}, {"opd"}] and sum(map(len, calls)) == 8
    log = [json.loads(l) for l in (tmp_path / "always" / "log.jsonl").read_text().splitlines()]
    assert [(r["teacher_chosen/t0"], r["teacher_chosen/t1"]) for r in log] == [(2, 2), (3, 1)]

    # --gate-stat median, eps 0.25. Medians (student vs best teacher): (p,1) 1.1 vs 1.5 open;
    # (p,2) 1.4 vs 1.7 open (closed under "best"); (q,1) 0 vs 1.1 open; (q,2) 1.3 vs 1.4 closed by eps
    calls.clear()
    distill.run(_args(paths, tmp_path / "median", "--plot-every", "0",
                      "--steps", "1", "--prompts-per-step", "2", "--group-size", "2",
                      "--gate-stat", "median", "--eps", "0.25"), source=source, teacher_source=teacher_source, tasks=tasks)
    assert calls == [{(p, 1): "opd", (p, 2): "opd", (q, 1): "opd"}]


def _hash_score(task, c):
    """A scripted scorer for real generations: the reward depends on the text only."""
    r = [0.0, 1.0 + (len(c.text) % 7) / 10, 1.2][sum(map(ord, c.text)) % 3]
    s = Score(r, "ok" if r else "compile_error", r - 1 if r else None, r > 1.5, r > 0, r > 0)
    return lambda: s


def test_one_real_step_tiny_student_two_teachers(experts, tmp_path, monkeypatch):
    """Real generation by the student and both teacher adapters on one tiny base; scripted scores. The teachers
    answer inside the student's two generate calls (one per round); --release-fast frees the decoder once per
    step, after the rollouts, before training."""
    paths, _, _ = experts
    out = tmp_path / "run"
    tasks = [{"id": "t0", "rtl_files": [{"name": "a.sv", "content": "module a(input x); endmodule"}],
              "spec_files": [], "dut_module_name": "a", "dut_instance_name": "dut", "instruction": "test a"}]
    events, generate, free = [], common.generate, common.free_fast_cache
    monkeypatch.setattr(common, "generate", lambda *a, **k: events.append("gen") or generate(*a, **k))
    monkeypatch.setattr(common, "free_fast_cache", lambda m: events.append("free") or free(m))
    distill.run(_args(paths, out, "--steps", "1", "--prompts-per-step", "1", "--group-size", "2",
                      "--max-new-tokens", "8", "--no-gate", "--plot-every", "0", "--release-fast"),
                score_fn=_hash_score, tasks=tasks)
    assert events[-1] == "free" and events.count("free") == 1 and events.count("gen") == 2   # 2 rounds, teachers inside
    log = [json.loads(l) for l in (out / "log.jsonl").read_text().splitlines()]
    assert len(log) == 1 and log[0]["groups"] == 2 and log[0]["opd_groups"] == 2
    assert log[0]["num_tokens"] > 0 and log[0]["opd/b"] >= 0
    assert log[0]["teacher_chosen/t0"] + log[0]["teacher_chosen/t1"] == 2
    before = load_file(f"{paths['student']}/adapter_model.safetensors")
    after = load_file(str(out / "adapter" / "adapter_model.safetensors"))
    assert before.keys() == after.keys() and any(not torch.equal(before[k], after[k]) for k in before)
    assert json.loads((out / "result.json").read_text())["outcome"]["steps"] == 1
    assert json.loads((out / "done.json").read_text())["script"] == "distill.py"


def test_the_teachers_sample_in_one_call_each_with_its_own_adapter(experts, monkeypatch):
    """make_teacher_source: one generate call for every teacher; each group's rewards per teacher are the scores
    of that teacher's own answers (as a call under that adapter alone gives them), num_samples of them."""
    paths, _, _ = experts
    model, tok = distill.build_models(_args(paths, "unused"), paths["student"], [paths["t0"], paths["t1"]])
    msgs = [[{"role": "user", "content": "test a"}], [{"role": "user", "content": "test the fifo"}]]
    groups = [SimpleNamespace(samples=[SimpleNamespace(messages=m)]) for m in msgs]
    calls, generate = [], common.generate
    monkeypatch.setattr(common, "generate", lambda *a, **k: calls.append(k.get("adapters")) or generate(*a, **k))
    texts = {}

    def score(task, c):
        texts.setdefault(task, []).append(c.text)
        return _hash_score(task, c)
    source = distill.make_teacher_source(score, num_samples=2, max_new_tokens=12, seed=5, temperature=0.0)
    rewards, timings = source(model, tok, groups, ["ga", "gb"], ["teacher0", "teacher1"], step=3)
    assert calls == [["teacher0"] * 4 + ["teacher1"] * 4] and set(timings) == {"t_gen", "t_sim"}
    assert len(rewards) == 2 and all(len(r) == 2 and all(len(s) == 2 for s in r) for r in rewards)
    for i, name in enumerate(("teacher0", "teacher1")):
        alone = generate(model, tok, [msgs[0], msgs[0], msgs[1], msgs[1]], max_new_tokens=12, temperature=0.0,
                         adapters=[name] * 4)
        assert [rewards[g][i] for g in range(2)] == [[_hash_score(None, c)().reward for c in alone[2 * g:2 * g + 2]]
                                                     for g in range(2)], name
    assert len(texts["ga"]) == 4 and texts["ga"][:2] != texts["ga"][2:]      # the two teachers answer apart
    assert model.active_adapter == "default"


def test_joint_teachers_answer_in_the_students_calls_and_leave_its_samples(experts):
    """make_model_source with make_joint_teachers' extra rows: one generate call per round carries the student's
    rows and num_samples rows per teacher for each prompt; the student's samples equal a source without them,
    and each group's teacher rewards score that teacher's own answers to the group's prompt."""
    paths, _, _ = experts
    model, tok = distill.build_models(_args(paths, "unused"), paths["student"], [paths["t0"], paths["t1"]])
    tasks = [{"id": f"t{i}", "rtl_files": [{"name": "a.sv", "content": f"module a{i}(input x); endmodule"}],
              "spec_files": [], "dut_module_name": f"a{i}", "dut_instance_name": "dut", "instruction": f"test a{i}"}
             for i in range(2)]
    kw = dict(num_generations=2, max_new_tokens=10, seed=3, rounds=2, chunk_size=2, temperature=1.0)
    plain = onpolicy.make_model_source(_hash_score, **kw)(model, tok, tasks, step=0, first_index=0)[0]
    extra, teacher_source = distill.make_joint_teachers(_hash_score, ["teacher0", "teacher1"], num_samples=2,
                                                        group_size=2)
    calls, generate = [], common.generate
    seen = []

    def spy(*a, **k):
        calls.append(k.get("adapters"))
        out = generate(*a, **k)
        seen.append(out)
        return out
    common.generate = spy
    try:
        groups = onpolicy.make_model_source(_hash_score, extra=extra, **kw)(model, tok, tasks, step=0, first_index=0)[0]
    finally:
        common.generate = generate
    assert calls == [["default"] * 4 + ["teacher0"] * 4 + ["teacher1"] * 4] * 2   # one call per round
    assert [[s.completion_ids for s in g.samples] for g in groups] == [[s.completion_ids for s in g.samples]
                                                                       for g in plain]
    rewards, timings = teacher_source(model, tok, groups, tasks * 2, ["teacher0", "teacher1"], step=0)
    assert timings["t_gen"] == 0.0 and len(rewards) == 4
    first = seen[0][4:]                               # round 1: teacher0's 2 x 2 rows, then teacher1's
    for g in range(2):                                # groups come back task by task, round 1 then round 2
        got = rewards[[0, 2][g]]
        assert got == [[_hash_score(None, c)().reward for c in first[i * 4 + g * 2:i * 4 + g * 2 + 2]]
                       for i in range(2)]
    with pytest.raises(RuntimeError, match="joint teachers: no teacher answers for the prompts of"):
        teacher_source(model, tok, groups, tasks * 2, ["teacher0", "teacher1"], step=1)   # the stash is spent


def test_joint_teachers_keep_one_set_of_answers_per_group_of_a_repeated_prompt():
    """A prompt asked twice in one step (one task in two groups) keeps both sets of teacher answers, one per group,
    in order; rows that are not prompts x group_size are refused."""
    extra, teacher_source = distill.make_joint_teachers(_hash_score, ["teacher0"], num_samples=1, group_size=2)
    msgs = [{"role": "user", "content": "test a"}]
    answer = lambda text: SimpleNamespace(text=text)                                       # noqa: E731
    seeds = []
    for call_seed, text in ((5, "x"), (6, "yy")):   # two calls, each with the prompt twice (the student's G = 2)
        more, names, row_seeds, take, _ = extra([msgs, msgs], call_seed)
        assert more == [msgs] and names == ["teacher0"]
        seeds += row_seeds
        take([answer(text)])
    assert seeds == [onpolicy.derive_seed(c, "teacher", "teacher0", 0, json.dumps(msgs, sort_keys=True)) for c in (5, 6)]
    group = SimpleNamespace(samples=[SimpleNamespace(messages=msgs, task_id="a")])
    rewards, _ = teacher_source(None, None, [group, group], [None, None], ["teacher0"], step=0)
    assert rewards == [[[0.0]], [[1.2]]]                # "x" scores 0, "yy" 1.2 (_hash_score)
    with pytest.raises(ValueError, match="joint teachers: 3 rows are not prompts x 2 samples"):
        extra([msgs, msgs, msgs], 0)


def _two_scripted_steps(experts, save_every):
    """A two-step run's pieces on the gate table: (paths, tasks, source, teacher_source, distill.py flags)."""
    paths, _, tok = experts
    tasks, _, table = _gate_table()
    source, teacher_source = _scripted_sources(tok, table)
    extra = ["--steps", "2", "--prompts-per-step", "2", "--group-size", "2", "--save-every", str(save_every),
             "--on-fail", "rl", "--plot-every", "0"]
    return paths, tasks, source, teacher_source, extra


def test_resume_gives_the_same_weights_as_an_uninterrupted_run(experts, tmp_path):
    """Scripted rollouts (so the test is fast) with OPD and RL-fallback updates in both steps."""
    paths, tasks, source, teacher_source, extra = _two_scripted_steps(experts, save_every=1)
    distill.run(_args(paths, tmp_path / "a", *extra), source=source, teacher_source=teacher_source, tasks=tasks)

    class Killed(Exception):
        pass

    def dying_source(model, tok_, tasks_, *, step, first_index):
        if step == 1:
            raise Killed
        return source(model, tok_, tasks_, step=step, first_index=first_index)

    with pytest.raises(Killed):
        distill.run(_args(paths, tmp_path / "b", *extra), source=dying_source, teacher_source=teacher_source, tasks=tasks)
    assert rundir.latest_checkpoint(tmp_path / "b" / "ckpt").name == "step_000001"
    with pytest.raises(SystemExit):             # an existing run needs --resume
        distill.run(_args(paths, tmp_path / "b", *extra), source=source, teacher_source=teacher_source, tasks=tasks)
    distill.run(_args(paths, tmp_path / "b", *extra, "--resume"), source=source, teacher_source=teacher_source,
                tasks=tasks)
    wa, wb = (_trainable(tmp_path / r / "ckpt" / "step_000002") for r in "ab")
    w1 = _trainable(tmp_path / "a" / "ckpt" / "step_000001")
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    assert any(not torch.equal(wa[k], w1[k]) for k in wa)          # the second step did move
    la, lb = ([json.loads(l) for l in (tmp_path / r / "log.jsonl").read_text().splitlines()] for r in "ab")
    keys = ("reward", "gate_pass_rate", "opd/log_ratio", "opd/b", "loss", "grad_norm", "cursor")
    assert len(lb) == 2 and [[r.get(k) for k in keys] for r in la] == [[r.get(k) for k in keys] for r in lb]


def test_a_deadline_stops_between_steps_checkpointed(experts, tmp_path, monkeypatch):
    """A deadline after step 1 of 2 (--save-every 10): exit 75 with a checkpoint at step 1 and no done.json;
    --resume finishes with the uninterrupted run's weights."""
    paths, tasks, source, teacher_source, extra = _two_scripted_steps(experts, save_every=10)
    distill.run(_args(paths, tmp_path / "a", *extra), source=source, teacher_source=teacher_source, tasks=tasks)
    monkeypatch.setattr(rundir, "Deadline", deadline_after(1))
    code = distill.run(_args(paths, tmp_path / "b", *extra), source=source, teacher_source=teacher_source, tasks=tasks)
    assert code == rundir.EXIT_DEADLINE
    assert rundir.latest_checkpoint(tmp_path / "b" / "ckpt").name == "step_000001"
    assert not (tmp_path / "b" / "done.json").exists()
    monkeypatch.undo()
    distill.run(_args(paths, tmp_path / "b", *extra, "--resume"), source=source, teacher_source=teacher_source,
                tasks=tasks)
    wa, wb = (_trainable(tmp_path / r / "ckpt" / "step_000002") for r in "ab")
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


def test_cursor_start_continues_after_the_prompts_rl_used(experts, tmp_path):
    """--cursor-start N: OPD's first step takes the tasks at positions N.. of the seeded RL order."""
    paths, _, tok = experts
    tasks, (p, q, x, y), table = _gate_table()
    source, teacher_source = _scripted_sources(tok, table)
    seen = []

    def recording_source(model, tok_, step_tasks, *, step, first_index):
        seen.append((first_index, [t["id"] for t in step_tasks]))
        return source(model, tok_, step_tasks, step=step, first_index=first_index)
    out = tmp_path / "offset"
    distill.run(_args(paths, out, "--steps", "1", "--prompts-per-step", "2", "--group-size", "2",
                      "--cursor-start", "2"), source=recording_source, teacher_source=teacher_source, tasks=tasks)
    assert seen == [(2, [x, y])]


def test_prompts_too_long_for_both_rounds_are_dropped_as_in_rl(experts, tmp_path, capsys):
    """distill.py filters the task pool as rl.py does (onpolicy.filter_long_prompts): a task whose round-1 prompt
    is over --max-prompt-tokens never reaches a rollout, and the same tasks stay for both scripts."""
    paths, _, tok = experts
    design = "module a(input x); endmodule"
    short = [{"id": f"s{i}", "rtl_files": [{"name": "a.sv", "content": design}], "spec_files": [],
              "dut_module_name": "a", "dut_instance_name": "dut", "instruction": f"test a, case {i}"} for i in range(3)]
    long = {**short[0], "id": "long", "instruction": "test a " + "in every corner " * 200}
    sizes = {t["id"]: len(common.chat_ids(tok, harness.first_messages(t, "testbench"))) for t in short + [long]}
    limit = max(sizes[t["id"]] for t in short)
    assert sizes["long"] > limit + 100
    tasks, seen = short[:2] + [long] + short[2:], []
    _, _, table = _gate_table()
    ids = [t["id"] for t in tasks]
    rows = {(k, r): table[(q, r)] for k, q in zip(ids, "abcd") for r in (1, 2)}    # the gate table's rewards
    source, teacher_source = _scripted_sources(tok, rows)

    def recording_source(model, tok_, step_tasks, *, step, first_index):
        seen.extend(t["id"] for t in step_tasks)
        return source(model, tok_, step_tasks, step=step, first_index=first_index)
    distill.run(_args(paths, tmp_path / "run", "--steps", "2", "--prompts-per-step", "3", "--group-size", "2",
                      "--max-prompt-tokens", str(limit), "--answer-mode", "testbench"), source=recording_source,
                teacher_source=teacher_source, tasks=tasks)
    assert sorted(seen) == ["s0", "s0", "s1", "s1", "s2", "s2"]        # two passes over the three that fit
    assert f"prompt filter: 3/4 tasks have <= {limit} prompt tokens (--max-prompt-tokens)" in capsys.readouterr().out
    args = rl.parse_args(["--tasks", "x", "--out", str(tmp_path / "rl"), "--max-prompt-tokens", str(limit),
                          "--answer-mode", "testbench"])
    assert [t["id"] for t in onpolicy.filter_long_prompts(tasks, tok, None, args)] == ["s0", "s1", "s2"]
    # 0 (the pipeline's default): the limit from the student's context, 8192 - 2 rounds x new tokens - 1024
    new = (8192 - 1024 - limit) // 2
    seen.clear()
    distill.run(_args(paths, tmp_path / "ctx", "--steps", "1", "--prompts-per-step", "3", "--group-size", "2",
                      "--max-prompt-tokens", "0", "--max-new-tokens", str(new), "--answer-mode", "testbench"),
                source=recording_source, teacher_source=teacher_source, tasks=tasks)
    assert sorted(seen) == ["s0", "s1", "s2"]
    assert f"prompt filter: 3/4 tasks have <= {8192 - 2 * new - 1024} prompt tokens (context 8192 - 2 rounds" \
        in capsys.readouterr().out


# -----------------------------------------------------------------------------
# validation during distillation (onpolicy.validate_step, as in rl.py)

VAL_TASK = {"id": "val/and", "spec_files": [], "instruction": "Write a testbench for and_gate; instance name dut.",
            "rtl_files": [{"name": "and_gate.sv", "content": "module and_gate(input a, input b, output y);\n"
                                                              "  assign y = a & b;\nendmodule\n"}],
            "dut_module_name": "and_gate", "dut_instance_name": "dut",
            "targets": [{"inst_name": "dut", "metric": "overall_average", "target_percentage": 90.0}]}


def _val_file(tmp_path):
    path = tmp_path / "val.jsonl"
    path.write_text(json.dumps(VAL_TASK) + "\n")
    return str(path)


def _validate_by_weights(monkeypatch, rewards):
    """evaluate.validate scripted: the i-th distinct student weights get rewards[i] (a resumed run's
    redone step sees the same weights, so the same reward). Returns the rewards in call order."""
    import evaluate
    table, seen = {}, []

    def fake(model, tok, tasks, **kw):
        key = tuple(float(p.detach().double().sum()) for p in model.parameters() if p.requires_grad)
        if key not in table:
            table[key] = rewards[len(table)]
        seen.append(table[key])
        return {"val/reward": table[key], "val/pass@1": 0.0, "val/cov@1": 0.0, "val/syn_pass": 0.0,
                "val/tasks": len(tasks), "val/s": 0.0}
    monkeypatch.setattr(evaluate, "validate", fake)
    return seen


def _log(out):
    return [json.loads(l) for l in (out / "log.jsonl").read_text().splitlines()]


VAL_EXTRA = ["--prompts-per-step", "2", "--group-size", "2", "--on-fail", "rl", "--plot-every", "100"]


def test_validation_rows_best_plateau_and_stop(experts, tmp_path, monkeypatch):
    paths, _, tok = experts
    tasks, _, table = _gate_table()
    source, teacher_source = _scripted_sources(tok, table)
    seen = _validate_by_weights(monkeypatch, [0.5, 0.7, 0.7, 0.6])           # steps 0, 2, 4, 5
    out = tmp_path / "run"
    distill.run(_args(paths, out, *VAL_EXTRA, "--steps", "5", "--val-tasks", _val_file(tmp_path), "--val-every", "2",
                      "--val-patience", "2"), source=source, teacher_source=teacher_source, tasks=tasks)
    log = _log(out)
    assert [r["step"] for r in log if r.get("val")] == [0, 2, 4, 5] and seen == [0.5, 0.7, 0.7, 0.6]
    train = [r for r in log if not r.get("val")]
    assert [r["step"] for r in train] == [1, 2, 3, 4, 5]
    assert json.loads((out / "best" / "val.json").read_text())["step"] == 2       # 0.7 at step 4 is no gain
    outcome = json.loads((out / "result.json").read_text())["outcome"]
    assert outcome["reward_last"] == train[-1]["reward"]
    assert outcome["reward"] == pytest.approx(sum(r["reward"] for r in train) / 5)   # training rows only
    assert {k: outcome[k] for k in ("val_best_step", "val_best_reward", "val_last_reward", "val_plateau", "val_rows",
                                    "stopped_on_plateau")} == \
        {"val_best_step": 2, "val_best_reward": 0.7, "val_last_reward": 0.6, "val_plateau": True, "val_rows": 4,
         "stopped_on_plateau": False}

    seen = _validate_by_weights(monkeypatch, [0.5, 0.6, 0.6, 0.602, 9.0])     # plateau at step 3 (patience 2)
    out = tmp_path / "stop"
    distill.run(_args(paths, out, *VAL_EXTRA, "--steps", "10", "--val-tasks", _val_file(tmp_path), "--val-every", "1",
                      "--val-patience", "2", "--stop-on-plateau"), source=source, teacher_source=teacher_source,
                tasks=tasks)
    log = _log(out)
    assert [r["step"] for r in log if r.get("val")] == [0, 1, 2, 3] and len(log) == 7
    outcome = json.loads((out / "result.json").read_text())["outcome"]
    assert outcome["steps"] == 3 and outcome["stopped_on_plateau"] is True and outcome["val_best_step"] == 3
    assert (out / "done.json").exists() and (out / "adapter" / "adapter_config.json").exists()


def test_resume_keeps_validations_and_the_best(experts, tmp_path, monkeypatch):
    paths, _, tok = experts
    tasks, _, table = _gate_table()
    source, teacher_source = _scripted_sources(tok, table)
    seen = _validate_by_weights(monkeypatch, [0.5, 0.9, 0.6, 1.0, 0.8])
    extra = [*VAL_EXTRA, "--steps", "4", "--save-every", "2", "--val-tasks", _val_file(tmp_path), "--val-every", "1"]
    distill.run(_args(paths, tmp_path / "a", *extra), source=source, teacher_source=teacher_source, tasks=tasks)
    assert seen == [0.5, 0.9, 0.6, 1.0, 0.8]

    class Killed(Exception):
        pass

    def dying_source(model, tok_, tasks_, *, step, first_index):
        if step == 3:                      # update 4, after step 3's validation (the best); checkpoint 2 newest
            raise Killed
        return source(model, tok_, tasks_, step=step, first_index=first_index)
    b = tmp_path / "b"
    with pytest.raises(Killed):
        distill.run(_args(paths, b, *extra), source=dying_source, teacher_source=teacher_source, tasks=tasks)
    assert json.loads((b / "best" / "val.json").read_text())["step"] == 3
    distill.run(_args(paths, b, *extra, "--resume"), source=source, teacher_source=teacher_source, tasks=tasks)
    assert seen[5:] == [0.5, 0.9, 0.6, 1.0, 1.0, 0.8]       # run b: steps 0..3, killed; resumed: 3 redone, 4
    strip = lambda log: [(r["step"], r.get("val"), r.get("val/reward"), r.get("reward"), r.get("loss")) for r in log]
    assert strip(_log(tmp_path / "a")) == strip(_log(b))
    oa, ob = (json.loads((tmp_path / r / "result.json").read_text())["outcome"] for r in "ab")
    assert oa == ob and ob["val_best_step"] == 3 and ob["val_rows"] == 5
    wa, wb = (load_file(str(tmp_path / r / "best" / "adapter" / "adapter_model.safetensors")) for r in "ab")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


@pytest.mark.needs_iverilog
def test_validation_does_not_change_training(experts, tmp_path, monkeypatch):
    """The real evaluate.validate of the student (plus draws from every RNG inside it) at every step:
    training rows and weights equal a run without validation."""
    import random
    import evaluate
    paths, _, tok = experts
    tasks, _, table = _gate_table()
    source, teacher_source = _scripted_sources(tok, table)
    real = evaluate.validate
    monkeypatch.setattr(evaluate, "validate", lambda *a, **k: (torch.rand(5), random.random(), real(*a, **k))[-1])
    extra = [*VAL_EXTRA, "--steps", "2", "--max-new-tokens", "8", "--sim-workers", "1"]
    distill.run(_args(paths, tmp_path / "plain", *extra), source=source, teacher_source=teacher_source, tasks=tasks)
    distill.run(_args(paths, tmp_path / "val", *extra, "--val-tasks", _val_file(tmp_path), "--val-every", "1"),
                source=source, teacher_source=teacher_source, tasks=tasks)
    lp, lv = _log(tmp_path / "plain"), _log(tmp_path / "val")
    assert [r["step"] for r in lv if r.get("val")] == [0, 1, 2]
    keys = ("step", "reward", "loss", "grad_norm", "opd/log_ratio", "cursor")
    assert [[r.get(k) for k in keys] for r in lp] == [[r.get(k) for k in keys] for r in lv if not r.get("val")]
    wp, wv = (_trainable(tmp_path / r / "ckpt" / "step_000002") for r in ("plain", "val"))
    assert all(torch.equal(wp[k], wv[k]) for k in wp)


def test_a_bad_val_tasks_file_ends_in_one_line(experts, tmp_path, capsys):
    paths, _, _ = experts
    tasks_path = tmp_path / "tasks.jsonl"
    tasks_path.write_text(json.dumps(VAL_TASK) + "\n")
    missing = tmp_path / "none.jsonl"
    argv = ["--model", "tiny", "--student", paths["student"], "--teachers", paths["t0"], paths["t1"], "--tasks",
            str(tasks_path), "--out", str(tmp_path / "o"), "--steps", "1", "--val-tasks", str(missing)]
    assert rundir.cli("distill.py", distill.main, argv) == 1
    err = capsys.readouterr().err
    assert err == f"distill.py: error: --val-tasks {missing}: no such file\n"
