"""Tests for rl.py: the loss and advantages against hand-computed numbers, the chunked log-probs
against a naive full log-softmax, the two-round rollout structure with a scripted policy, a
scripted step that must move the adapter toward the better testbench, exact resume, and two
real steps with the tiny model and the Icarus scorer.

Run: python -m pytest -q tests/test_rl.py
"""
import copy
import json
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

import common
import onpolicy
import rl
import sim
import simpool
import rundir
from onpolicy import Group, Sample, Score, per_token_logps
from rl import compute_advantages, dapo_loss
from helpers import deadline_after

@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """The tiny model is faster on one thread, and far faster on a shared, busy 2-core machine."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


AND_RTL = "module and_gate(input a, input b, output y);\n  assign y = a & b;\nendmodule\n"
AND_TASK = {
    "id": "test/and_gate", "spec_files": [], "rtl_files": [{"name": "and_gate.sv", "content": AND_RTL}],
    "dut_module_name": "and_gate", "dut_instance_name": "dut",
    "instruction": "Write a testbench for and_gate; instance name dut.",
    "targets": [{"inst_name": "dut", "metric": "overall_average", "target_percentage": 90.0}],
    "difficulty": "easy", "is_agentic": False,
}
GOOD_TB = """filename: tb_and.sv
```systemverilog
module tb;
  reg a, b;
  wire y;
  and_gate dut(.a(a), .b(b), .y(y));
  initial begin
    a = 0; b = 0; #1 a = 1; #1 b = 1; #1 a = 0; #1 b = 0; #1 $finish;
  end
endmodule
```"""
BAD_TB = "filename: tb_and.sv\n```systemverilog\nmodule tb; this is not verilog\n```"


# -----------------------------------------------------------------------------
# advantages and the loss, hand-computed

def test_advantages_hand_computed_ties_and_zero_variance():
    adv = compute_advantages([0.0, 0.0, 2.0, 2.0,     # mean 1, std 1 (unbiased=False)
                              1.5, 1.5, 1.5, 1.5,     # zero variance -> all 0
                              0.0, 1.0, 1.0, 2.0],    # mean 1, std sqrt(0.5); ties share a value
                             num_generations=4)
    s = math.sqrt(0.5)
    expected = [-1, -1, 1, 1, 0, 0, 0, 0, -1 / s, 0, 0, 1 / s]
    assert adv.tolist() == pytest.approx(expected, abs=1e-5)
    assert adv[4:8].abs().max() == 0                      # zero variance: no signal, no NaN
    assert float(adv[0]) == pytest.approx(-1 / (1 + 1e-6), abs=1e-7)    # the +1e-6 is in the denominator
    with pytest.raises(RuntimeError):
        compute_advantages([1.0, 2.0, 3.0], num_generations=2)


def _loss_and_grad(ratio, adv, eps_low=0.2, eps_high=0.28):
    logp = torch.tensor([[math.log(ratio)]], requires_grad=True)
    loss, stats = dapo_loss(logp, torch.zeros(1, 1), torch.tensor([adv]), torch.ones(1, 1), eps_low, eps_high)
    loss.backward()
    return float(loss.detach()), float(logp.grad), stats


def test_dapo_loss_clip_higher_is_asymmetric():
    # A > 0: the ratio may rise to 1.28 before clipping ...
    loss, grad, st = _loss_and_grad(1.25, +1.0)
    assert loss == pytest.approx(-1.25) and grad == pytest.approx(-1.25) and st["clip_ratio/high"] == 0
    loss, grad, st = _loss_and_grad(1.5, +1.0)
    assert loss == pytest.approx(-1.28) and grad == 0 and st["clip_ratio/high"] == 1
    # ... with a symmetric 0.2 the same 1.25 would already be clipped
    loss, grad, _ = _loss_and_grad(1.25, +1.0, eps_high=0.2)
    assert loss == pytest.approx(-1.2) and grad == 0
    # A < 0: the ratio may only fall to 0.8
    loss, grad, st = _loss_and_grad(0.78, -1.0)
    assert loss == pytest.approx(0.8) and grad == 0 and st["clip_ratio/low"] == 1
    loss, grad, st = _loss_and_grad(0.85, -1.0)
    assert loss == pytest.approx(0.85) and grad == pytest.approx(0.85) and st["clip_ratio/low"] == 0
    # pessimistic side is never clipped: A > 0 with a small ratio, A < 0 with a large ratio
    loss, grad, st = _loss_and_grad(0.5, +1.0)
    assert loss == pytest.approx(-0.5) and grad == pytest.approx(-0.5)
    loss, grad, st = _loss_and_grad(1.5, -2.0)
    assert loss == pytest.approx(3.0) and grad == pytest.approx(3.0)
    assert st["clip_ratio/low"] == 0 and st["clip_ratio/high"] == 0


def test_dapo_loss_token_level_aggregation():
    # two sequences, 1 and 3 tokens, ratio 1, advantages +1 and -1: per-token loss -A
    logp = torch.zeros(2, 3)
    mask = torch.tensor([[1, 0, 0], [1, 1, 1]])
    loss, stats = dapo_loss(logp, logp, torch.tensor([1.0, -1.0]), mask)
    token_level = (-1 * 1 + 1 * 3) / 4                  # 0.5: the long answer weighs 3x
    sequence_level = (-1 + 1) / 2                       # GRPO's per-sequence mean would give 0
    assert float(loss) == pytest.approx(token_level) and token_level != sequence_level
    assert stats["num_tokens"] == 4
    # a global normaliser: the two halves of a batch, each divided by the batch's 4 tokens, sum to it
    l0, _ = dapo_loss(logp[:1], logp[:1], torch.tensor([1.0]), mask[:1], num_items=4)
    l1, _ = dapo_loss(logp[1:], logp[1:], torch.tensor([-1.0]), mask[1:], num_items=4)
    assert float(l0 + l1) == pytest.approx(float(loss))
    # per-token advantages (distillation) and per-row normalisers
    adv = torch.tensor([[2.0, 9.0, 9.0], [1.0, 0.0, -1.0]])
    loss, _ = dapo_loss(logp, logp, adv, mask, num_items=torch.tensor([1.0, 3.0]))
    assert float(loss) == pytest.approx(-2.0 / 1 + (-1 + 0 + 1) / 3)


def test_k3_kl_and_beta():
    logp, ref = torch.tensor([[math.log(0.5)]]), torch.tensor([[math.log(0.25)]])
    kl = rl.k3_kl(logp, ref)                             # r = 0.5: r - log r - 1
    assert float(kl) == pytest.approx(0.5 - math.log(0.5) - 1)
    loss, st = dapo_loss(logp, logp, torch.tensor([0.0]), torch.ones(1, 1), per_token_kl=kl, beta=0.1)
    assert float(loss) == pytest.approx(0.1 * float(kl)) and st["kl"] == pytest.approx(float(kl))


def test_overlong_penalty():
    assert onpolicy.overlong_penalty(900, 1000, 0) == 0.0
    assert onpolicy.overlong_penalty(750, 1000, 250) == 0.0
    assert onpolicy.overlong_penalty(875, 1000, 250) == pytest.approx(-0.5)
    assert onpolicy.overlong_penalty(1000, 1000, 250) == pytest.approx(-1.0)
    assert onpolicy.overlong_penalty(1200, 1000, 250) == -1.0


def test_worst_sample_ties_broken_by_coverage():
    def s(reward, cov):
        return Sample("t", 1, [], f"{reward}/{cov}", [1], [2], False, Score(reward, "x", cov))
    assert onpolicy.worst_sample([s(1.5, .5), s(0.0, .3), s(0.0, .1), s(1.2, .2)]).text == "0.0/0.1"
    assert onpolicy.worst_sample([s(0.0, .3), s(0.0, None), s(1.0, 0.0)]).text == "0.0/None"
    first = s(1.4, .4)
    assert onpolicy.worst_sample([first, s(1.4, .4)]) is first


def test_task_order_is_a_seeded_permutation_per_epoch():
    order = [onpolicy.task_order(c, 5, seed=3) for c in range(10)]
    assert sorted(order[:5]) == list(range(5)) and sorted(order[5:]) == list(range(5))
    assert order == [onpolicy.task_order(c, 5, seed=3) for c in range(10)]
    assert order != [onpolicy.task_order(c, 5, seed=4) for c in range(10)]


# -----------------------------------------------------------------------------
# rollouts with a scripted policy and scorer (no model)

def _scripted_generate(calls):
    def generate_fn(messages_list, seed, on_done=None, tasks=None):
        calls.append((seed, [m[-1]["content"] for m in messages_list]))
        n = len(calls)
        return [SimpleNamespace(text=f"c{n}.{i}", prompt_ids=[1, 2], completion_ids=[3] * (i + 1), truncated=False)
                for i in range(len(messages_list))]
    return generate_fn


def test_two_round_rollouts_structure_and_pipeline_order():
    calls = []
    rewards = {}   # text -> reward; round-1 sample i of each call gets reward [1.5, 0, 0, 1.2][i]

    def score_fn(task, c):
        i = int(c.text.split(".")[1]) % 4
        r = [1.5, 0.0, 0.0, 1.2][i]
        cov = [0.5, 0.3, 0.1, 0.2][i]
        rewards[c.text] = r
        return lambda: Score(r, "ok" if r else "compile_error", cov)

    tasks = [{"id": f"t{k}"} for k in range(3)]
    groups, timings = onpolicy.two_round_rollouts(
        tasks, generate_fn=_scripted_generate(calls), score_fn=score_fn, num_generations=4,
        seed_fn=lambda rnd, idx: 1000 * rnd + idx, first_index=10, chunk_size=2,
        build_fn=lambda t: [{"role": "user", "content": "R1 " + t["id"]}],
        refine_fn=lambda t, text, res: [{"role": "user", "content": f"R2 {t['id']} from {text}"}])
    # chunks [t0,t1], [t2]: R1(0), R1(1), R2(0), R2(1)
    assert [c[0] for c in calls] == [1010, 1012, 2010, 2012]
    assert calls[0][1] == ["R1 t0"] * 4 + ["R1 t1"] * 4
    # the worst of t0's round 1 (c1.0..c1.3) is c1.2 (reward 0, coverage 0.1); t1's is c1.6
    assert calls[2][1] == ["R2 t0 from c1.2"] * 4 + ["R2 t1 from c1.6"] * 4
    assert calls[3][1] == ["R2 t2 from c2.2"] * 4
    assert [(g.index, g.task_id, g.round) for g in groups] == [
        (10, "t0", 1), (10, "t0", 2), (11, "t1", 1), (11, "t1", 2), (12, "t2", 1), (12, "t2", 2)]
    assert all(len(g.samples) == 4 for g in groups)
    assert groups[0].rewards == [1.5, 0.0, 0.0, 1.2]
    assert set(timings) == {"t_gen", "t_sim", "t_gen_r1", "t_gen_r2", "t_pack", "t_prefill", "t_capture", "t_decode"}
    assert timings["t_gen"] == pytest.approx(timings["t_gen_r1"] + timings["t_gen_r2"])   # the rounds split t_gen
    assert timings["t_prefill"] == timings["t_decode"] == 0.0                          # scripted: no decoder ran


def _fixed_source(reward_table):
    """A scripted source: task id -> list of rewards per round (same for every round)."""
    def source(model, tok, tasks, *, step, first_index):
        groups = []
        for k, t in enumerate(tasks):
            for rnd in (1, 2):
                samples = [Sample(t["id"], rnd, [], f"{t['id']}.{i}", [1], [2, 3], False, Score(r, "ok", r - 1))
                           for i, r in enumerate(reward_table[t["id"]])]
                groups.append(Group(first_index + k, t["id"], rnd, samples))
        return groups, {"t_gen": 0.0, "t_sim": 0.0}
    return source


@pytest.mark.parametrize("refill", ["ahead", "sequential"])
def test_collect_groups_dynamic_sampling_refills_up_to_the_cap(refill):
    table = {"flat0": [1.0] * 4, "flat1": [0.0] * 4, "var0": [0.0, 1.5, 0.0, 1.5], "var1": [1.2, 1.3, 1.2, 1.3]}
    tasks = [{"id": k} for k in table]
    kw = dict(step=0, cursor=0, prompts_per_step=2, rounds=2, seed=0, refill=refill)
    kept, all_groups, cursor, t = onpolicy.collect_groups(_fixed_source(table), None, None, tasks, **kw)
    assert len(kept) == 4 and cursor == 2 and t["extra_prompts"] == 0      # off: everything is kept
    kept, all_groups, cursor, t = onpolicy.collect_groups(_fixed_source(table), None, None, tasks,
                                                    dynamic_sampling=True, max_extra_prompts=2, **kw)
    assert all(len(set(g.rewards)) > 1 for g in kept)
    assert len(kept) == 4 and cursor == 4 and t["extra_prompts"] == 2      # all 4 tasks seen: 2 informative
    kept, _, cursor, t = onpolicy.collect_groups(_fixed_source(table), None, None, tasks,
                                           dynamic_sampling=True, max_extra_prompts=1, **kw)
    assert cursor == 3 and t["extra_prompts"] == 1 and len(kept) <= 4
    m = onpolicy.rollout_metrics(all_groups)
    assert m["frac_reward_zero_std"] == pytest.approx(0.5)
    assert m["timeout_rate"] == 0 and m["starved_timeouts"] == 0


def test_rollout_metrics_count_timeouts_and_the_starved_ones():
    """timeout_rate over the step's samples; starved_timeouts: those the busy machine gave less than half their
    limit in CPU time (sim.starved_timeout on the result's timings)."""
    timings = [{"sim": 20.0, "sim_cpu": 3.0, "sim_limit": 20.0}, {"sim": 20.0, "sim_cpu": 19.0, "sim_limit": 20.0}]
    samples = [Sample("t", 1, [], "x", [1], [2], False, Score(0.0, "timeout", None, result={"status": "timeout",
                                                                                            "timings": t}))
               for t in timings]
    samples.append(Sample("t", 1, [], "x", [1], [2], False, Score(1.5, "ok", 0.5, result={"status": "ok"})))
    m = onpolicy.rollout_metrics([Group(0, "t", 1, samples)])
    assert m["timeout_rate"] == pytest.approx(2 / 3) and m["starved_timeouts"] == 1


def test_rollout_metrics_count_refinements_that_cover_their_states_holes():
    """A round-2 group's samples against its state (the worst round-1 sample, holes a and b): one covers a, one
    covers nothing, one does not run; a round-1 group and a group whose state did not run count for nothing."""
    hole = lambda *keys: [{"metric": "block", "instance": "uut", "key": k} for k in keys]
    ok = lambda *keys: Score(1.5, "ok", 0.5, result={"status": "ok", "overall_pct": 50.0, "uncovered": hole(*keys)})
    bad = Score(0.0, "compile_error", None, result={"status": "compile_error", "overall_pct": None, "uncovered": []})
    sample = lambda sc, rnd=2: Sample("t", rnd, [], "x", [1], [2], False, sc)
    state = sample(ok("a", "b"), 1)
    groups = [Group(0, "t", 1, [state, sample(ok("a"), 1)]),
              Group(0, "t", 2, [sample(ok("b")), sample(ok("a", "b")), sample(bad)], state),
              Group(1, "u", 2, [sample(ok())], sample(bad, 1))]
    m = onpolicy.rollout_metrics(groups)
    assert m["hole_fix"] == pytest.approx(1 / 3) and m["hole_fix_share"] == pytest.approx(0.5 / 3)
    assert "hole_fix" not in onpolicy.rollout_metrics(groups[:1])


def test_two_round_rollouts_keep_the_state_each_refinement_saw():
    """Round 2's group carries the round-1 sample its prompt showed (the worst), round 1's none."""
    rewards = iter([1.2, 0.0, 1.5, 1.7])
    gen = lambda msgs, seed, on_done, tasks: [common.Completion(f"a{i}", [1], [2], False) for i in range(len(msgs))]
    score = lambda task, c: (lambda r=next(rewards, 1.0): Score(r, "ok", r - 1, result={"status": "ok"}))
    groups, _ = onpolicy.two_round_rollouts([{"id": "t"}], generate_fn=gen, score_fn=score, num_generations=2,
                                            seed_fn=lambda r, i: 0, build_fn=lambda t: ["p"],
                                            refine_fn=lambda t, a, r: [a])
    assert groups[0].state is None and groups[1].state is groups[0].samples[1]
    assert groups[1].samples[0].messages == ["a1"]


def test_refill_ahead_follows_the_sequential_rule_in_one_call():
    """Rolling the refill batches out ahead (one decoder call for a step's prompts and its refill) gives the
    sequential procedure's kept groups, rewards, advantages, cursor and counts, with one source call instead
    of one per batch; unused rollouts are counted and dropped."""
    rng = np.random.default_rng(0)
    table = {f"t{i}": list(rng.choice([0.0, 0.0, 1.5], size=4)) for i in range(12)}
    tasks = [{"id": k} for k in table]
    for cap in (0, 3, 4, 8):
        for cursor in (0, 5):
            calls = {"ahead": [], "sequential": []}
            out = {}
            for refill in calls:
                src = _fixed_source(table)

                def counting(*a, _src=src, _calls=calls[refill], **k):
                    _calls.append(len(a[2]))
                    return _src(*a, **k)
                out[refill] = onpolicy.collect_groups(counting, None, None, tasks, step=0, cursor=cursor, prompts_per_step=2,
                                                rounds=2, seed=1, dynamic_sampling=True, max_extra_prompts=cap,
                                                refill=refill)
            ka, aa, ca, ta = out["ahead"]
            ks, as_, cs, ts = out["sequential"]
            assert [(g.index, g.round) for g in ka] == [(g.index, g.round) for g in ks]
            assert [g.rewards for g in ka] == [g.rewards for g in ks]                      # same rewards
            adv = [rl.compute_advantages([s.reward for g in k for s in g.samples], 4).tolist() for k in (ka, ks)]
            assert adv[0] == adv[1]                                                         # and advantages
            assert [(g.index, g.round) for g in aa] == [(g.index, g.round) for g in as_]
            assert ca == cs and ta["extra_prompts"] == ts["extra_prompts"]
            assert len(calls["ahead"]) == 1 and calls["ahead"][0] == 2 + cap
            assert calls["sequential"][0] == 2 and sum(calls["sequential"]) == 2 + ta["extra_prompts"]
            assert ta["unused_prompts"] == cap - ta["extra_prompts"] and ts["unused_prompts"] == 0
    kept, all_groups, cursor, t = onpolicy.collect_groups(_fixed_source(table), None, None, tasks, step=0, cursor=3,
                                                    prompts_per_step=0, rounds=2, seed=1, dynamic_sampling=True,
                                                    max_extra_prompts=4)                 # no prompts: no loop
    assert kept == [] and all_groups == [] and cursor == 3 and t["extra_prompts"] == 0


# -----------------------------------------------------------------------------
# log-probs and the training step on a tiny model

@pytest.fixture(scope="module")
def tiny():
    return common.tiny_model(seed=0)


def _lora(model, seed=0):
    torch.manual_seed(seed)
    m = common.add_lora(copy.deepcopy(model), r=4, alpha=8)
    onpolicy.disable_dropout(m)
    with torch.no_grad():       # non-zero B so the adapter matters in these tests
        for n, p in m.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.05)
    return m


def _rows(tok):
    a = tok("module tb; reg a; initial a = 0; endmodule", add_special_tokens=False)["input_ids"]
    b = tok("filename: tb.sv", add_special_tokens=False)["input_ids"]
    return [SimpleNamespace(prompt_ids=b[:3], completion_ids=a), SimpleNamespace(prompt_ids=a[:5], completion_ids=b)]


def test_per_token_logps_match_naive_log_softmax(tiny):
    model, tok = tiny
    model = _lora(model)
    rows = _rows(tok)
    temp = 0.7
    out = per_token_logps(model, rows, temperature=temp, chunk_tokens=3, entropy=True, topk=4)
    for i, r in enumerate(rows):
        ids = torch.tensor([r.prompt_ids + r.completion_ids])
        logits = model(input_ids=ids).logits[0].float() / temp
        lp = logits.log_softmax(-1)
        P, C = len(r.prompt_ids), len(r.completion_ids)
        want = lp[P - 1:P + C - 1].gather(-1, torch.tensor(r.completion_ids)[:, None]).squeeze(-1)
        assert torch.allclose(out.logps[i, :C], want, atol=1e-5)
        ent = -(lp.exp() * lp).sum(-1)[P - 1:P + C - 1]
        assert torch.allclose(out.entropy[i, :C], ent, atol=1e-4)
        assert torch.allclose(out.topk_logps[i, :C], lp[P - 1:P + C - 1].topk(4).values, atol=1e-5)
        assert out.mask[i].sum() == C and (out.logps[i, C:] == 0).all()
    again = per_token_logps(model, rows, temperature=temp, gather_ids=out.topk_ids)
    assert torch.allclose(again.topk_logps, out.topk_logps, atol=1e-5)
    # gradients through the chunked + checkpointed path equal the naive ones
    params = [p for p in model.parameters() if p.requires_grad]
    g1 = torch.autograd.grad((per_token_logps(model, rows, chunk_tokens=2).logps.sum()), params)
    naive = 0
    for r in rows:
        ids = torch.tensor([r.prompt_ids + r.completion_ids])
        lp = model(input_ids=ids).logits[0].float().log_softmax(-1)
        P, C = len(r.prompt_ids), len(r.completion_ids)
        naive = naive + lp[P - 1:P + C - 1].gather(-1, torch.tensor(r.completion_ids)[:, None]).sum()
    g2 = torch.autograd.grad(naive, params)
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(g1, g2))


def test_micro_batches_accumulate_to_the_full_batch_gradient(tiny):
    model, tok = tiny
    rows = _rows(tok) * 2
    adv = [1.0, -0.5, [0.3] * len(rows[2].completion_ids), 0.0]
    grads = []
    for max_tokens in (10_000, 1):               # one micro-batch vs one row per micro-batch
        m = _lora(model)
        opt = torch.optim.SGD([p for p in m.parameters() if p.requires_grad], lr=0.0)
        stats = rl.train_on_batch(m, opt, rows, adv, max_tokens_per_micro=max_tokens, max_grad_norm=1e9)
        grads.append([p.grad.clone() for p in m.parameters() if p.requires_grad])
        assert stats["num_tokens"] == sum(len(r.completion_ids) for r in rows)
        assert stats["clip_ratio/low"] == 0 and stats["clip_ratio/high"] == 0
        assert stats["ratio"] == pytest.approx(1.0)
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(*grads))


def test_norm_groups_average_each_label_separately(tiny):
    model, tok = tiny
    rows = _rows(tok)
    n_a, n_b = (len(r.completion_ids) for r in rows)

    def grads(rows_, adv, groups=None):
        m = _lora(model)
        opt = torch.optim.SGD([p for p in m.parameters() if p.requires_grad], lr=0.0)
        rl.train_on_batch(m, opt, rows_, adv, norm_groups=groups, max_grad_norm=1e9)
        return [p.grad for p in m.parameters() if p.requires_grad]
    only_a = grads(rows[:1], [1.0])
    separate = grads(rows, [1.0, 0.0], groups=["rl", "opd"])          # A's mean + B's mean (0)
    pooled = grads(rows, [1.0, 0.0])                                  # one mean over A and B
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(only_a, separate))
    assert all(torch.allclose(a * n_a / (n_a + n_b), b, atol=1e-6) for a, b in zip(only_a, pooled))


def test_steps_per_generation_uses_old_logps(tiny):
    model, tok = tiny
    m = _lora(model)
    opt = onpolicy.make_optimizer(m, lr=1e-2)
    stats = rl.train_on_batch(m, opt, _rows(tok) * 2, [1.0, -1.0, 1.0, -1.0], steps_per_generation=2)
    assert opt.state[opt.param_groups[0]["params"][0]]["step"] == 2
    assert stats["ratio"] != pytest.approx(1.0, abs=1e-7)      # the second mini-batch moved


def test_all_zero_advantages_take_no_optimizer_step(tiny):
    """Issue 21: after a real step Adam has momentum, so stepping on a zero gradient would still move the
    weights; a step whose advantages are all zero must leave them bit-for-bit unchanged and say so."""
    model, tok = tiny
    m = _lora(model)
    opt = onpolicy.make_optimizer(m, lr=1e-2)
    first = rl.train_on_batch(m, opt, _rows(tok), [1.0, -1.0])
    assert first["skipped"] == 0 and first["grad_norm"] > 0
    before = {n: p.detach().clone() for n, p in m.named_parameters() if p.requires_grad}
    adam_steps = opt.state[opt.param_groups[0]["params"][0]]["step"].item()
    stats = rl.train_on_batch(m, opt, _rows(tok), [0.0, 0.0])
    assert stats["skipped"] == 1 and stats["grad_norm"] == 0.0
    assert all(torch.equal(p, before[n]) for n, p in m.named_parameters() if p.requires_grad)
    assert opt.state[opt.param_groups[0]["params"][0]]["step"].item() == adam_steps == 1
    # the control: Adam stepped on an explicit zero gradient does move them (what the skip avoids)
    for p in opt.param_groups[0]["params"]:
        p.grad = torch.zeros_like(p)
    opt.step()
    assert any(not torch.equal(p, before[n]) for n, p in m.named_parameters() if p.requires_grad)


def test_a_nonfinite_gradient_takes_no_optimizer_step(tiny):
    """A mini-batch whose gradient norm is inf/NaN (bf16 overflow; here an infinite advantage) must leave the
    adapter and Adam's state as they were, say so, and the next finite step trains normally."""
    model, tok = tiny
    m = _lora(model)
    opt = onpolicy.make_optimizer(m, lr=1e-2)
    rl.train_on_batch(m, opt, _rows(tok), [1.0, -1.0])
    before = {n: p.detach().clone() for n, p in m.named_parameters() if p.requires_grad}
    stats = rl.train_on_batch(m, opt, _rows(tok), [math.inf, -1.0])
    assert stats["skipped_nonfinite"] == 1 and stats["skipped"] == 0 and stats["grad_norm"] == 0.0
    assert all(torch.equal(p, before[n]) for n, p in m.named_parameters() if p.requires_grad)
    assert all(p.grad is None for p in opt.param_groups[0]["params"])
    assert opt.state[opt.param_groups[0]["params"][0]]["step"].item() == 1
    after = rl.train_on_batch(m, opt, _rows(tok), [1.0, -1.0])
    assert after["skipped_nonfinite"] == 0 and math.isfinite(after["grad_norm"]) and after["grad_norm"] > 0
    assert all(torch.isfinite(p).all() for p in m.parameters())


def test_kl_to_the_initial_adapter_and_adapter_switching(tiny, tmp_path):
    model, tok = tiny
    common.save_adapter(_lora(model), str(tmp_path / "stage"))
    args = rl.parse_args(["--model", "tiny", "--tasks", "x", "--out", str(tmp_path / "o"),
                          "--adapter", str(tmp_path / "stage"), "--kl-beta", "0.1", "--seed", "0",
                          "--no-gradient-checkpointing"])
    m, tok, ref = onpolicy.build_policy(args)
    assert ref == "ref" and set(m.peft_config) == {"default", "ref"} and m.active_adapter == "default"
    trainable = {n for n, p in m.named_parameters() if p.requires_grad}
    assert trainable and all(".default." in n for n in trainable)
    opt = onpolicy.make_optimizer(m, lr=1e-2)
    rows = _rows(tok)
    stats = rl.train_on_batch(m, opt, rows, [1.0, -1.0], beta=0.1, ref_adapter="ref")
    assert abs(stats["kl"]) < 1e-4                        # step 0: the policy is its initial adapter
    assert {n for n, p in m.named_parameters() if p.requires_grad} == trainable
    stats = rl.train_on_batch(m, opt, rows, [1.0, -1.0], beta=0.1, ref_adapter="ref")
    assert stats["kl"] > 1e-4                             # moved away from it
    with torch.no_grad(), common.use_adapter(m, None):        # None: the bare base model
        base = per_token_logps(m, rows).logps
    assert torch.allclose(base, per_token_logps(model, rows).logps, atol=1e-5)
    assert m.active_adapter == "default"


def test_scripted_step_moves_toward_the_high_reward_testbench(tiny, tmp_path):
    """Known testbenches with different rewards: after the update the better one is more likely."""
    model0, tok = tiny
    hi, lo = GOOD_TB, BAD_TB
    prompt = common.chat_ids(tok, [{"role": "user", "content": "and_gate"}])
    seen = {}

    def source(model, tok_, tasks, *, step, first_index):
        seen["model"] = model
        mk = lambda text, r, i: Sample("and", 1, [], text, prompt,
                                       tok(text, add_special_tokens=False)["input_ids"], False,
                                       Score(r, "ok" if r else "compile_error", r - 1 if r else None, r > 1.9, r > 0, True))
        samples = [mk(hi, 2.0, 0), mk(lo, 0.0, 1), mk(hi, 2.0, 2), mk(lo, 0.0, 3)]
        if "before" not in seen:
            with torch.no_grad():
                seen["before"] = per_token_logps(model, samples[:2]).logps.sum(-1)
        return [Group(first_index, "and", 1, samples)], {"t_gen": 0.0, "t_sim": 0.0}

    args = rl.parse_args(["--model", "tiny", "--tasks", "unused", "--out", str(tmp_path / "run"),
                          "--steps", "2", "--prompts-per-step", "1", "--rounds", "1", "--lr", "3e-3", "--max-new-tokens", "64",
                          "--profile", "paper", "--no-gradient-checkpointing"])
    rl.run(args, source=source, tasks=[AND_TASK])
    with torch.no_grad():
        after = per_token_logps(seen["model"], [SimpleNamespace(prompt_ids=prompt, completion_ids=tok(t, add_special_tokens=False)["input_ids"]) for t in (hi, lo)]).logps.sum(-1)
    assert after[0] > seen["before"][0] + 1.0        # the 2.0-reward testbench rose
    assert after[1] < seen["before"][1] - 1.0        # the 0-reward one fell
    out = tmp_path / "run"
    log = [json.loads(l) for l in (out / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [1, 2] and log[0]["reward"] == pytest.approx(1.0)
    assert log[0]["pass_rate"] == pytest.approx(0.5) and log[0]["frac_reward_zero_std"] == 0
    assert (out / "adapter" / "adapter_config.json").exists() and (out / "done.json").exists()
    assert (out / "curves.png").exists() and rundir.latest_checkpoint(out / "ckpt").name == "step_000002"


def _hash_score(task, c):
    """A scripted scorer for real generations: reward from the text, so groups have variance."""
    r = [0.0, 1.0 + (len(c.text) % 7) / 10, 1.2][sum(map(ord, c.text)) % 3]
    s = Score(r, "ok" if r else "compile_error", r - 1 if r else None, r > 1.5, r > 0, r > 0)
    return lambda: s


def test_resume_gives_the_same_weights_as_an_uninterrupted_run(tmp_path, monkeypatch):
    tasks = [dict(AND_TASK, id=f"and{k}") for k in range(3)]
    base = ["--model", "tiny", "--tasks", "unused", "--steps", "2", "--prompts-per-step", "1",
            "--group-size", "3", "--max-new-tokens", "8", "--lr", "1e-2", "--save-every", "1",
            "--profile", "paper", "--seed", "7", "--no-gradient-checkpointing", "--plot-every", "100"]
    rl.run(rl.parse_args(base + ["--out", str(tmp_path / "a")]), score_fn=_hash_score, tasks=tasks)

    class Killed(Exception):
        pass

    saved = []
    real_save = rundir.save_checkpoint

    def save_then_remember(*a, **k):
        saved.append(a[1])
        return real_save(*a, **k)

    def dying_score(task, c):               # "killed" during step 2, after checkpoint 1 was written
        if saved:
            raise Killed
        return _hash_score(task, c)

    monkeypatch.setattr(rundir, "save_checkpoint", save_then_remember)
    with pytest.raises(Killed):
        rl.run(rl.parse_args(base + ["--out", str(tmp_path / "b")]), score_fn=dying_score, tasks=tasks)
    monkeypatch.setattr(rundir, "save_checkpoint", real_save)
    assert rundir.latest_checkpoint(tmp_path / "b" / "ckpt").name == "step_000001"
    with pytest.raises(SystemExit):         # an existing run needs --resume
        rl.run(rl.parse_args(base + ["--out", str(tmp_path / "b")]), score_fn=_hash_score, tasks=tasks)
    rl.run(rl.parse_args(base + ["--out", str(tmp_path / "b"), "--resume"]), score_fn=_hash_score, tasks=tasks)

    wa = torch.load(tmp_path / "a/ckpt/step_000002/optimizer.pt", weights_only=False)["trainable"]
    wb = torch.load(tmp_path / "b/ckpt/step_000002/optimizer.pt", weights_only=False)["trainable"]
    assert wa.keys() == wb.keys()
    assert all(torch.allclose(wa[k], wb[k], atol=1e-6) for k in wa)
    w0 = torch.load(tmp_path / "a/ckpt/step_000001/optimizer.pt", weights_only=False)["trainable"]
    assert any(not torch.allclose(wa[k], w0[k]) for k in wa)         # the second step did move
    la = [json.loads(l) for l in (tmp_path / "a/log.jsonl").read_text().splitlines()]
    lb = [json.loads(l) for l in (tmp_path / "b/log.jsonl").read_text().splitlines()]
    keys = ("reward", "cursor", "completions/mean_length", "frac_reward_zero_std")
    assert [[r.get(k) for k in keys] for r in la] == [[r.get(k) for k in keys] for r in lb]
    assert len(lb) == 2


def test_a_handoff_checkpoint_restores_the_bf16_adapter_with_a_fresh_optimizer(tiny, tmp_path):
    """No optimizer.pt (what crosses between device sessions): the weights come back bf16-rounded from adapter/,
    the optimizer keeps no state, RNG and meta come back; an adapter of another rank is refused, nothing changed."""
    model, _ = tiny
    m = _lora(model)
    opt = torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], lr=1e-2)
    sum(p.sum() for p in m.parameters() if p.requires_grad).backward()
    opt.step()
    saved = {n: p.detach().clone() for n, p in m.named_parameters() if p.requires_grad}
    ck = rundir.save_checkpoint(tmp_path / "ckpt", 3, m, opt, {"cursor": 5, "log": [{"step": 3}]})
    (ck / "optimizer.pt").unlink()
    m2 = _lora(model, seed=1)
    opt2 = torch.optim.AdamW([p for p in m2.parameters() if p.requires_grad], lr=1e-2)
    meta = rundir.load_checkpoint(ck, m2, opt2)
    assert meta["optimizer_restored"] is False and (meta["step"], meta["cursor"]) == (3, 5)
    for n, p in m2.named_parameters():
        if p.requires_grad:
            assert torch.equal(p, saved[n].to(torch.bfloat16).float()), n
    assert opt2.state_dict()["state"] == {}
    sched = torch.optim.lr_scheduler.LambdaLR(opt2, lambda s: 1.0 / (1 + s))    # sft.py's case: on at step 3
    rundir.load_checkpoint(ck, m2, opt2, scheduler=sched)
    assert sched.get_last_lr() == [pytest.approx(1e-2 / 4)] and opt2.param_groups[0]["lr"] == pytest.approx(1e-2 / 4)
    torch.manual_seed(2)
    other = common.add_lora(copy.deepcopy(model), r=2, alpha=4)
    before = {n: p.detach().clone() for n, p in other.named_parameters() if p.requires_grad}
    with pytest.raises((ValueError, RuntimeError)):
        rundir.load_checkpoint(ck, other, torch.optim.AdamW([p for p in other.parameters() if p.requires_grad]))
    assert all(torch.equal(p, before[n]) for n, p in other.named_parameters() if p.requires_grad)


def test_rl_resumes_from_a_handoff_and_records_it(tmp_path):
    tasks = [dict(AND_TASK, id=f"and{k}") for k in range(3)]
    base = RL_BASE + ["--steps", "3", "--save-every", "1"]
    rl.run(rl.parse_args(base + ["--out", str(tmp_path / "a")]), score_fn=_hash_score, tasks=tasks)
    b = tmp_path / "b"
    __import__("shutil").copytree(tmp_path / "a", b)
    for f in ("done.json", "result.json"):
        (b / f).unlink()
    for step in ("step_000002", "step_000003"):
        __import__("shutil").rmtree(b / "ckpt" / step)
    (b / "ckpt" / "step_000001" / "optimizer.pt").unlink()
    rl.run(rl.parse_args(base + ["--out", str(b), "--resume"]), score_fn=_hash_score, tasks=tasks)
    assert [json.loads(l)["step"] for l in (b / "handoffs.jsonl").read_text().splitlines()] == [1]
    la, lb = _log(tmp_path / "a"), _log(b)
    assert [r["step"] for r in lb] == [1, 2, 3]
    assert [r["cursor"] for r in la] == [r["cursor"] for r in lb]          # the data order carries on
    assert la[0] == lb[0]                                                  # the step before the handoff is kept
    assert (b / "done.json").exists() and not (tmp_path / "a" / "handoffs.jsonl").exists()


def test_deadline_known_answers(monkeypatch):
    now = [0.0]
    d = rundir.Deadline("100", margin=5, clock=lambda: now[0])
    assert not d.near()                                   # 0 + 0 + 5 <= 100: nothing timed yet, only the margin
    for t in (10, 40, 60):                                # steps of 10, 30 and 20 s
        now[0] = t
        d.tick()
    assert d.durations == [10, 30, 20]
    now[0] = 65
    assert not d.near() and d.near(extra=1)               # 65 + 30 + 5 = 100 is in time; one second more is not
    now[0] = 66
    assert d.near()
    for t in (70, 74, 78):                                # three short steps: the 30 s one leaves the window
        now[0] = t
        d.tick()
    assert not d.near()                                   # 78 + 4 + 5 <= 100
    monkeypatch.delenv(rundir.DEADLINE_ENV, raising=False)
    assert rundir.Deadline().at is None and not rundir.Deadline().near()
    monkeypatch.setenv(rundir.DEADLINE_ENV, "1700000000.5")
    assert rundir.Deadline().at == 1700000000.5 and rundir.Deadline().near()      # long past
    for bad in ("soon", "inf", "nan"):
        monkeypatch.setenv(rundir.DEADLINE_ENV, bad)
        with pytest.raises(ValueError, match=rf"\$CHORUS_DEADLINE='{bad}': not a \(finite\) number"):
            rundir.Deadline()


def test_deadline_near_counts_the_validation_due_after_the_next_step():
    seen = []
    fake = SimpleNamespace(near=lambda extra=0.0: seen.append(extra) or False)
    args = SimpleNamespace(val_tasks="v.jsonl", val_every=10, steps=25)
    log = [{"step": 0, "val": 1, "val/s": 7.5}, {"step": 1}, {"step": 10, "val": 1, "val/s": 9.0}, {"step": 11}]
    # next steps 12 (none due), 10 (due: the last validation took 9 s), 25 (the last step), 20
    for step in (11, 9, 24, 19):
        onpolicy.deadline_near(fake, args, log, step)
    assert seen == [0.0, 9.0, 9.0, 9.0]
    onpolicy.deadline_near(fake, SimpleNamespace(val_tasks=None, val_every=10, steps=25), log, 9)   # no validation
    onpolicy.deadline_near(fake, args, [], 9)                                                         # none yet
    assert seen[-2:] == [0.0, 0.0]


def test_a_deadline_stops_between_steps_checkpointed_and_resume_finishes_the_same(tmp_path, monkeypatch):
    """A deadline after step 2 of 3 with --save-every 10: a checkpoint at step 2 all the same, no done.json,
    exit 75; --resume then ends with the weights and log of an uninterrupted run."""
    tasks = [dict(AND_TASK, id=f"and{k}") for k in range(3)]
    base = RL_BASE + ["--steps", "3", "--save-every", "10"]
    rl.run(rl.parse_args(base + ["--out", str(tmp_path / "a")]), score_fn=_hash_score, tasks=tasks)
    monkeypatch.setattr(rundir, "Deadline", deadline_after(2))
    b = tmp_path / "b"
    assert rl.run(rl.parse_args(base + ["--out", str(b)]), score_fn=_hash_score, tasks=tasks) == 75
    assert rundir.latest_checkpoint(b / "ckpt").name == "step_000002" and (b / "ckpt/step_000002/optimizer.pt").exists()
    assert not any((b / f).exists() for f in ("done.json", "result.json", "adapter"))
    assert [r["step"] for r in _log(b)] == [1, 2]
    assert json.loads((b / rundir.DEADLINE_MARKER).read_text())["step"] == 2
    monkeypatch.undo()
    rl.run(rl.parse_args(base + ["--out", str(b), "--resume"]), score_fn=_hash_score, tasks=tasks)
    wa, wb = (torch.load(tmp_path / r / "ckpt/step_000003/optimizer.pt", weights_only=False)["trainable"] for r in "ab")
    assert wa.keys() == wb.keys() and all(torch.allclose(wa[k], wb[k], atol=1e-6) for k in wa)
    keys = ("step", "reward", "cursor", "completions/mean_length")
    assert [[r.get(k) for k in keys] for r in _log(tmp_path / "a")] == [[r.get(k) for k in keys] for r in _log(b)]
    assert (b / "done.json").exists()


def test_pause_at_stops_after_that_step_as_a_deadline_does(tmp_path, capsys):
    """--pause-at 2 of 3 steps: checkpointed at step 2, exit 75, the marker; again with --pause-at 2 it stops at
    once (no step past 2); --resume without it ends with an uninterrupted run's weights and log."""
    tasks = [dict(AND_TASK, id=f"and{k}") for k in range(3)]
    base = RL_BASE + ["--steps", "3", "--save-every", "10"]
    rl.run(rl.parse_args(base + ["--out", str(tmp_path / "a")]), score_fn=_hash_score, tasks=tasks)
    b = tmp_path / "b"
    assert rl.run(rl.parse_args(base + ["--out", str(b), "--pause-at", "2"]), score_fn=_hash_score, tasks=tasks) == 75
    assert "--pause-at 2: stopped after step 2, checkpointed; run again with --resume and without --pause-at" \
        in capsys.readouterr().out
    assert rundir.latest_checkpoint(b / "ckpt").name == "step_000002" and not (b / "done.json").exists()
    assert json.loads((b / rundir.DEADLINE_MARKER).read_text())["step"] == 2
    assert rl.run(rl.parse_args(base + ["--out", str(b), "--pause-at", "2", "--resume"]), score_fn=_hash_score,
                  tasks=tasks) == 75
    assert [r["step"] for r in _log(b)] == [1, 2]
    rl.run(rl.parse_args(base + ["--out", str(b), "--resume"]), score_fn=_hash_score, tasks=tasks)
    wa, wb = (torch.load(tmp_path / r / "ckpt/step_000003/optimizer.pt", weights_only=False)["trainable"] for r in "ab")
    assert all(torch.allclose(wa[k], wb[k], atol=1e-6) for k in wa) and (b / "done.json").exists()
    assert [r["reward"] for r in _log(tmp_path / "a")] == [r["reward"] for r in _log(b)]


def test_checkpoint_temp_folders_are_ignored_and_rng_round_trips(tmp_path):
    (tmp_path / "ckpt" / ".tmp_step_000005").mkdir(parents=True)
    assert rundir.latest_checkpoint(tmp_path / "ckpt") is None
    state = rundir.rng_state()
    a = (torch.rand(3), __import__("random").random(), __import__("numpy").random.rand())
    rundir.set_rng_state(json.loads(json.dumps(state)))
    b = (torch.rand(3), __import__("random").random(), __import__("numpy").random.rand())
    assert torch.equal(a[0], b[0]) and a[1:] == b[1:]


# -----------------------------------------------------------------------------
# the real scorer (iverilog)

@pytest.mark.needs_iverilog
def test_sim_score_fn_rewards_a_real_testbench():
    with simpool.SimPool(2) as pool:
        score = onpolicy.sim_score_fn(pool)
        good = score(AND_TASK, SimpleNamespace(text=GOOD_TB))()
        bad = score(AND_TASK, SimpleNamespace(text=BAD_TB))()
        unparsed = score(AND_TASK, SimpleNamespace(text="no code here"))()
        cut = score(AND_TASK, SimpleNamespace(text="filename: tb.sv\n```systemverilog\nmodule tb;\n  reg a;"))()
    assert good.status == "ok" and 1.0 < good.reward <= 2.0 and good.compile_ok and good.parsed
    assert good.reward == pytest.approx(1 + good.coverage)
    assert good.reward == sim.reward(sim.SimResult.from_dict(good.result))   # one reward: sim.reward
    assert bad.reward == 0.0 and not bad.compile_ok and bad.parsed
    # one way to say "did not parse": a result whose status is the parse reason, never simulated
    assert unparsed.reward == 0.0 and unparsed.status == "no_code" and not unparsed.parsed
    assert unparsed.result == onpolicy.parse_failure("no_code") and onpolicy.is_parse_failure(unparsed.result)
    assert cut.reward == 0.0 and cut.status == "truncated" and onpolicy.feedback_result(cut.result) is None
    assert onpolicy.feedback_result(bad.result) is bad.result


@pytest.mark.needs_iverilog
def test_two_real_steps_with_the_tiny_model_and_the_scorer(tmp_path):
    tasks_path = tmp_path / "tasks.jsonl"
    tasks_path.write_text(json.dumps(AND_TASK) + "\n")
    out = tmp_path / "run"
    rl.main(["--model", "tiny", "--tasks", str(tasks_path), "--out", str(out), "--steps", "2",
             "--prompts-per-step", "1", "--group-size", "2", "--max-new-tokens", "16",
             "--profile", "paper", "--sim-workers", "1"])
    log = [json.loads(l) for l in (out / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [1, 2]
    assert all(r["reward"] == 0.0 and r["frac_reward_zero_std"] == 1.0 for r in log)   # a random model
    assert all(r["skipped"] == 1 for r in log)                # all-zero advantages: no optimizer step
    assert json.loads((out / "result.json").read_text())["outcome"]["steps"] == 2
    assert json.loads((out / "done.json").read_text())["files"]["adapter"] == "adapter"
    assert (out / "adapter" / "adapter_config.json").exists()


def test_a_missing_task_file_ends_in_one_line(tmp_path, capsys):
    missing = tmp_path / "none.jsonl"
    argv = ["--model", "tiny", "--tasks", str(missing), "--out", str(tmp_path / "o"), "--steps", "1"]
    assert rundir.cli("rl.py", rl.main, argv) == 1
    err = capsys.readouterr().err
    assert err.startswith("rl.py: error: ") and str(missing) in err and len(err.splitlines()) == 1


def test_micro_batches_pack_rows_of_similar_length_under_the_token_budget():
    rows = [SimpleNamespace(prompt_ids=[0], completion_ids=[0] * n) for n in (1, 7, 2, 6)]   # 2, 8, 3, 7 tokens
    assert onpolicy.micro_batches(rows, 16) == [[1, 3], [2, 0]]          # padded 2x8 + 2x3 = 22 (in order: 30)
    assert onpolicy.micro_batches(rows, 1) == [[1], [3], [2], [0]]       # a longer row goes alone
    assert onpolicy.micro_batches([], 16) == []


def test_micro_tokens_passes_numbers_through_and_auto_on_cpu_takes_the_cpu_budget(tiny):
    model, _ = tiny
    m = _lora(model)
    rows = [SimpleNamespace(prompt_ids=[0] * 3000, completion_ids=[0] * 2000),
            SimpleNamespace(prompt_ids=[0], completion_ids=[0] * 9)]
    assert onpolicy.micro_tokens(m, rows, 8192, {}) == 8192
    assert onpolicy.micro_tokens(m, rows, 0, {}) == 0                             # 0 = no split
    assert onpolicy.micro_batches(rows, 0) == [[0, 1]]
    assert onpolicy.micro_tokens(m, rows, "auto", {}) == max(onpolicy.AUTO_CPU_TOKENS, 5000)
    assert onpolicy.micro_tokens(m, rows[1:], "auto", {}) == onpolicy.AUTO_CPU_TOKENS


# -----------------------------------------------------------------------------
# validation during training (onpolicy.validate_step): rows, best adapter, plateau, resume, RNG

def test_val_plateau_and_summary_known_answers():
    plateau = onpolicy.val_plateau
    assert not plateau([1.0, 1.1], 2)                          # needs patience + 1 validations
    assert plateau([1.0, 1.2, 1.203, 1.1, 1.204], 3)           # best of the last 3: 1.204 <= 1.2 + 0.005
    assert not plateau([1.0, 1.2, 1.203, 1.1, 1.206], 3)       # 1.206 > 1.205
    assert plateau([1.0, 1.2, 1.1], 1) and not plateau([1.0, 1.1], 1)
    log = [{"step": 0, "val": 1, "val/reward": 0.5}, {"step": 1, "reward": 9.0},
           {"step": 2, "val": 1, "val/reward": 0.7}, {"step": 4, "val": 1, "val/reward": 0.7}]
    assert onpolicy.val_summary(log, 1) == {"val_best_step": 2, "val_best_reward": 0.7, "val_last_reward": 0.7,
                                            "val_plateau": True, "val_rows": 3}     # the tie at step 4 is no gain
    assert onpolicy.val_summary(log, 2)["val_plateau"] is False                      # 0.7 > 0.5 + 0.005
    assert onpolicy.val_summary([{"step": 1, "reward": 1.0}], 5)["val_rows"] == 0


def _val_file(tmp_path, n=1):
    path = tmp_path / "val.jsonl"
    path.write_text("".join(json.dumps(dict(AND_TASK, id=f"val{k}")) + "\n" for k in range(n)))
    return str(path)


def _scripted_validate(monkeypatch, rewards):
    """evaluate.validate returning rewards[i] at its i-th call; records the calls' seeds and the adapter's
    weight sum (validation must see the current weights)."""
    import evaluate
    calls = []

    def fake(model, tok, tasks, **kw):
        w = sum(float(p.detach().double().sum()) for p in model.parameters() if p.requires_grad)
        calls.append({"seed": kw["seed"], "n": kw["n"], "tasks": len(tasks), "weights": w})
        r = rewards[len(calls) - 1]
        return {"val/reward": r, "val/pass@1": 10 * r, "val/cov@1": 20 * r, "val/syn_pass": 30 * r,
                "val/tasks": len(tasks), "val/s": 0.0}
    monkeypatch.setattr(evaluate, "validate", fake)
    return calls


def _spy_best_saves(monkeypatch):
    saves, real = [], common.save_adapter

    def spy(model, path, *a, **k):
        if str(path).endswith("/best/adapter"):
            saves.append(str(path))
        return real(model, path, *a, **k)
    monkeypatch.setattr(common, "save_adapter", spy)
    return saves


RL_BASE = ["--model", "tiny", "--tasks", "unused", "--prompts-per-step", "1", "--group-size", "3",
           "--max-new-tokens", "8", "--lr", "1e-2", "--profile", "paper", "--seed", "7",
           "--no-gradient-checkpointing", "--plot-every", "100"]


def _log(out):
    return [json.loads(l) for l in (out / "log.jsonl").read_text().splitlines()]


def test_validation_rows_best_adapter_and_plateau(tmp_path, monkeypatch):
    tasks = [dict(AND_TASK, id=f"and{k}") for k in range(3)]
    calls = _scripted_validate(monkeypatch, [0.5, 0.7, 0.7, 0.6])     # steps 0, 2, 4, 5
    saves = _spy_best_saves(monkeypatch)
    out = tmp_path / "run"
    rl.run(rl.parse_args(RL_BASE + ["--out", str(out), "--steps", "5", "--val-tasks", _val_file(tmp_path, 2),
                                    "--val-every", "2", "--val-n", "3", "--val-patience", "2", "--save-every", "5"]),
           score_fn=_hash_score, tasks=tasks)
    log = _log(out)
    assert [r["step"] for r in log if r.get("val")] == [0, 2, 4, 5]
    assert [r["step"] for r in log if not r.get("val")] == [1, 2, 3, 4, 5]      # training rows as before
    assert all("val/reward" not in r for r in log if not r.get("val"))
    assert [r["val/pass@1"] for r in log if r.get("val")] == pytest.approx([5.0, 7.0, 7.0, 6.0])
    assert [c["seed"] for c in calls] == [7] * 4 and {c["n"] for c in calls} == {3} and calls[0]["tasks"] == 2
    assert len({c["weights"] for c in calls}) == 4                  # each validation sees the weights of its step
    assert saves == [str(out / "best" / "adapter")] * 2             # steps 0 and 2; 0.7 at step 4 is not better
    assert json.loads((out / "best" / "val.json").read_text())["step"] == 2
    outcome = json.loads((out / "result.json").read_text())["outcome"]
    assert outcome["steps"] == 5 and outcome["reward"] == log[-2]["reward"]       # the last training row
    assert {k: outcome[k] for k in ("val_best_step", "val_best_reward", "val_last_reward", "val_plateau",
                                    "val_rows", "stopped_on_plateau")} == \
        {"val_best_step": 2, "val_best_reward": 0.7, "val_last_reward": 0.6, "val_plateau": True, "val_rows": 4,
         "stopped_on_plateau": False}
    meta = rundir.read_meta(out / "ckpt" / "step_000005")          # the last checkpoint holds the last val row
    assert meta["log"][-1] == log[-1]


def test_stop_on_plateau_ends_the_run_as_a_finished_one(tmp_path, monkeypatch):
    tasks = [dict(AND_TASK, id=f"and{k}") for k in range(3)]
    # steps 0..3; at step 3 the last two (0.6, 0.602) beat the best before them (0.6) by <= 0.005: plateau,
    # while 0.602 > 0.6 is still saved as the best
    _scripted_validate(monkeypatch, [0.5, 0.6, 0.6, 0.602, 9.0])
    saves = _spy_best_saves(monkeypatch)
    out = tmp_path / "run"
    rl.run(rl.parse_args(RL_BASE + ["--out", str(out), "--steps", "10", "--val-tasks", _val_file(tmp_path),
                                    "--val-every", "1", "--val-patience", "2", "--stop-on-plateau"]),
           score_fn=_hash_score, tasks=tasks)
    log = _log(out)
    assert [r["step"] for r in log if r.get("val")] == [0, 1, 2, 3]
    assert [r["step"] for r in log if not r.get("val")] == [1, 2, 3]
    assert len(saves) == 3 and json.loads((out / "best" / "val.json").read_text())["step"] == 3
    outcome = json.loads((out / "result.json").read_text())["outcome"]
    assert outcome["steps"] == 3 and outcome["stopped_on_plateau"] is True and outcome["val_plateau"] is True
    assert outcome["val_best_step"] == 3 and outcome["val_best_reward"] == 0.602
    assert (out / "done.json").exists() and (out / "adapter" / "adapter_config.json").exists()
    assert (out / "curves.png").exists()


def test_min_steps_holds_the_plateau_stop_back(tmp_path, monkeypatch):
    """The same plateau at step 3 with --min-steps 5: the run goes on to step 5 (still on a plateau) and stops there."""
    tasks = [dict(AND_TASK, id=f"and{k}") for k in range(3)]
    _scripted_validate(monkeypatch, [0.5, 0.6, 0.6, 0.602, 0.6, 0.601, 9.0])
    _spy_best_saves(monkeypatch)
    out = tmp_path / "run"
    rl.run(rl.parse_args(RL_BASE + ["--out", str(out), "--steps", "10", "--val-tasks", _val_file(tmp_path),
                                    "--val-every", "1", "--val-patience", "2", "--stop-on-plateau", "--min-steps", "5"]),
           score_fn=_hash_score, tasks=tasks)
    log = _log(out)
    assert [r["step"] for r in log if not r.get("val")] == [1, 2, 3, 4, 5]
    assert json.loads((out / "result.json").read_text())["outcome"]["stopped_on_plateau"] is True


def test_resume_keeps_validations_and_the_best(tmp_path, monkeypatch):
    """Killed during update 4 (after step 3's validation, the best so far, but with checkpoint 2 the newest):
    the resumed run drops best/ of step 3, redoes step 3's validation and ends as the uninterrupted run."""
    import evaluate
    tasks = [dict(AND_TASK, id=f"and{k}") for k in range(3)]
    rewards, table, seen = [0.5, 0.9, 0.6, 1.0, 0.8], {}, []

    def by_weights(model, tok, val_tasks, **kw):         # the same weights get the same reward in every run
        key = tuple(float(p.detach().double().sum()) for p in model.parameters() if p.requires_grad)
        if key not in table:
            table[key] = rewards[len(table)]
        r = table[key]
        seen.append(r)
        return {"val/reward": r, "val/pass@1": 0.0, "val/cov@1": 0.0, "val/syn_pass": 0.0,
                "val/tasks": len(val_tasks), "val/s": 0.0}
    monkeypatch.setattr(evaluate, "validate", by_weights)
    base = RL_BASE + ["--steps", "4", "--save-every", "2", "--val-tasks", _val_file(tmp_path), "--val-every", "1"]
    rl.run(rl.parse_args(base + ["--out", str(tmp_path / "a")]), score_fn=_hash_score, tasks=tasks)
    assert seen == rewards and len(table) == 5

    class Killed(Exception):
        pass

    def dying_score(task, c):
        if len(seen) == 9:                 # run b has validated steps 0..3
            raise Killed
        return _hash_score(task, c)
    with pytest.raises(Killed):
        rl.run(rl.parse_args(base + ["--out", str(tmp_path / "b")]), score_fn=dying_score, tasks=tasks)
    b = tmp_path / "b"
    assert rundir.latest_checkpoint(b / "ckpt").name == "step_000002"
    assert json.loads((b / "best" / "val.json").read_text())["step"] == 3       # after the checkpoint
    rl.run(rl.parse_args(base + ["--out", str(b), "--resume"]), score_fn=_hash_score, tasks=tasks)
    assert seen[9:] == [1.0, 0.8] and len(table) == 5      # steps 0..2 not repeated; 3 redone, 4 new
    la, lb = _log(tmp_path / "a"), _log(b)
    strip = lambda log: [(r["step"], r.get("val"), r.get("val/reward"), r.get("reward"), r.get("cursor")) for r in log]
    assert strip(la) == strip(lb) and sum(1 for r in lb if r.get("val")) == 5
    assert json.loads((b / "best" / "val.json").read_text())["step"] == 3
    oa, ob = (json.loads((tmp_path / r / "result.json").read_text())["outcome"] for r in "ab")
    assert oa == ob and ob["val_best_step"] == 3 and ob["val_rows"] == 5
    wa, wb = (load_file(str(tmp_path / r / "best" / "adapter" / "adapter_model.safetensors")) for r in "ab")
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


@pytest.mark.needs_iverilog
def test_validation_does_not_change_training(tmp_path, monkeypatch):
    """The real evaluate.validate (plus every RNG stream drawn from inside it) between the steps: the
    training rows and the weights equal a run without validation."""
    import random
    import evaluate
    real = evaluate.validate

    def noisy(*a, **k):
        torch.rand(5), random.random(), np.random.rand()
        return real(*a, **k)
    monkeypatch.setattr(evaluate, "validate", noisy)
    tasks = [dict(AND_TASK, id=f"and{k}") for k in range(3)]
    base = RL_BASE + ["--steps", "3", "--sim-workers", "1"]
    rl.run(rl.parse_args(base + ["--out", str(tmp_path / "plain")]), score_fn=_hash_score, tasks=tasks)
    rl.run(rl.parse_args(base + ["--out", str(tmp_path / "val"), "--val-tasks", _val_file(tmp_path),
                                 "--val-every", "1"]), score_fn=_hash_score, tasks=tasks)
    lp, lv = _log(tmp_path / "plain"), _log(tmp_path / "val")
    vals = [r for r in lv if r.get("val")]
    assert [r["step"] for r in vals] == [0, 1, 2, 3] and all(r["val/tasks"] == 1 for r in vals)
    assert all(0.0 <= r["val/reward"] <= 2.0 and "val/pass@1" in r and "val/syn_pass" in r for r in vals)
    keys = ("step", "reward", "loss", "grad_norm", "entropy", "cursor", "completions/mean_length")
    train = [r for r in lv if not r.get("val")]
    assert [[r.get(k) for k in keys] for r in lp] == [[r.get(k) for k in keys] for r in train]
    assert any(r["grad_norm"] > 0 for r in lp)                       # the steps did update
    wp, wv = (_trainable(tmp_path / r / "ckpt" / "step_000003") for r in ("plain", "val"))
    assert wp.keys() == wv.keys() and all(torch.equal(wp[k], wv[k]) for k in wp)


def _trainable(path):
    return torch.load(path / "optimizer.pt", weights_only=False)["trainable"]


def test_validate_step_leaves_every_rng_stream_where_it_was(tmp_path, monkeypatch):
    """The trainers reseed per step, so the run above would not notice a moved stream: check the states."""
    import random
    import evaluate
    monkeypatch.setattr(evaluate, "validate", lambda *a, **k: (torch.rand(5), random.random(), np.random.rand(),
                        {"val/reward": 1.0, "val/pass@1": 0.0, "val/cov@1": 0.0, "val/syn_pass": 0.0, "val/s": 0.0})[-1])
    args = rl.parse_args(RL_BASE + ["--out", str(tmp_path), "--steps", "3", "--val-tasks", "unused"])
    model = torch.nn.Linear(2, 2)
    monkeypatch.setattr(common, "save_adapter", lambda m, path, **k: __import__("os").makedirs(path, exist_ok=True))
    before = rundir.rng_state()
    log = []
    assert onpolicy.validate_step(args, model, None, [AND_TASK], log, tmp_path / "log.jsonl", str(tmp_path), 0) is False
    assert rundir.rng_state() == before and [r["step"] for r in log] == [0]
    assert onpolicy.validate_step(args, model, None, [AND_TASK], log, tmp_path / "log.jsonl", str(tmp_path), 0) is False
    assert len(log) == 1                                           # a step already validated (resume) is not redone
    freed = []
    monkeypatch.setattr(common, "free_fast_cache", lambda m: freed.append(m))
    onpolicy.validate_step(args, model, None, [AND_TASK], log, tmp_path / "log.jsonl", str(tmp_path), 2)
    assert freed == [] and [r["step"] for r in log] == [0]          # step 2 is not due (--val-every 10)
    onpolicy.validate_step(args, model, None, [AND_TASK], log, tmp_path / "log.jsonl", str(tmp_path), 3,
                           release_fast=True)
    assert freed == [model] and [r["step"] for r in log] == [0, 3]  # the last step; the decoder's memory freed


def test_step_time_summary_skips_validation_rows(tmp_path):
    import importlib.util
    from pathlib import Path
    spec = importlib.util.spec_from_file_location("rl_step_times", Path(__file__).parent.parent / "bench" / "rl_step_times.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    rows = [{"step": 0, "val": 1, "val/reward": 1.0, "val/s": 50.0}, {"step": 1, "t_rollout": 2.0, "t_train": 1.0},
            {"step": 2, "t_rollout": 4.0, "t_train": 1.0}, {"step": 2, "val": 1, "val/reward": 1.1, "val/s": 50.0}]
    out = mod.summarise(rows, 0, 2)
    assert out["steps"] == 2 and out["step_range"] == [1, 2] and out["step_s"]["median"] == 4.0


def test_a_bad_val_tasks_file_ends_in_one_line(tmp_path, capsys):
    tasks_path = tmp_path / "tasks.jsonl"
    tasks_path.write_text(json.dumps(AND_TASK) + "\n")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    for bad, says in ((tmp_path / "none.jsonl", "no such file"), (empty, "has no tasks")):
        argv = ["--model", "tiny", "--tasks", str(tasks_path), "--out", str(tmp_path / "o"), "--steps", "1",
                "--val-tasks", str(bad)]
        assert rundir.cli("rl.py", rl.main, argv) == 1
        err = capsys.readouterr().err
        assert err.startswith("rl.py: error: --val-tasks ") and str(bad) in err and says in err
        assert len(err.splitlines()) == 1
    assert not (tmp_path / "o" / "log.jsonl").exists()              # refused before any work
