"""Staged LoRA SFT on the tiny random model (CPU, seconds).

Run: python -m pytest -q tests/test_sft.py
"""
import json
import os

import pytest
import torch

import common
import rundir
import sft
from helpers import deadline_after


def chat(i, turns=1):
    """A chat with `turns` assistant answers; the last one is the SFT target."""
    msgs = [{"role": "system", "content": "You are a testbench expert."},
            {"role": "user", "content": f"<context>module m{i}(input clk); endmodule</context>"}]
    for t in range(turns):
        if t:
            msgs.append({"role": "user", "content": f"EDA result: status compile_error (round {t})"})
        msgs.append({"role": "assistant", "content": common.render_answer(
            f"tb_{i}_{t}.sv", f"module tb;\n  reg clk = {t % 2};\n  m{i} uut(.clk(clk));\n  initial #{10 + t} $finish;\nendmodule")})
    return msgs


@pytest.fixture(scope="module")
def rows():
    return [{"messages": chat(i, turns=1 + i % 2), "task_id": f"t{i}", "stage": 0, "kind": "direct"}
            for i in range(8)]


def fresh():
    torch.manual_seed(0)
    return common.tiny_model(seed=0)


def set_loss(model, tok, rows, max_len=512):
    """Token-mean target loss of `rows`, in eval mode (no dropout)."""
    model.eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for r in rows:
            e = sft.encode_row(tok, r["messages"], max_len)
            s, n = sft.target_loss_sum(model, sft.collate([e], tok.pad_token_id))
            total, count = total + s.item(), count + n
    return total / count


def test_label_mask_is_exactly_the_last_assistant_turn():
    model, tok = fresh()
    msgs = chat(3, turns=2)
    e = sft.encode_row(tok, msgs, max_len=4096)
    ids, labels = e["input_ids"], e["labels"]
    assert len(ids) == len(labels) and e["prompt_cut"] == 0
    first = next(i for i, l in enumerate(labels) if l != -100)
    assert all(l == -100 for l in labels[:first])           # one contiguous labelled tail
    assert labels[first:] == ids[first:]
    prompt = tok.apply_chat_template(msgs[:-1], tokenize=False, add_generation_prompt=True)
    full = tok.apply_chat_template(msgs, tokenize=False)
    assert tok.decode(ids[first:]) == full[len(prompt):]    # the answer plus its end-of-turn tokens
    assert msgs[-1]["content"] in tok.decode(ids[first:])
    assert msgs[2]["content"] not in tok.decode(ids[first:])  # the earlier assistant turn carries no loss
    assert tok.decode(ids[:first]) == prompt

    # padding: masked in attention and labels
    short = sft.encode_row(tok, chat(1), 4096)
    batch = sft.collate([e, short], tok.pad_token_id)
    pad = batch["attention_mask"][1] == 0
    assert pad.any() and (batch["labels"][1][pad] == -100).all()
    assert int((batch["labels"] != -100).sum()) == sum(l != -100 for l in e["labels"] + short["labels"])


def test_target_loss_of_a_padded_batch_equals_each_row_alone():
    """collate pads on the right and target_loss_sum runs without an attention mask (causal attention: no
    target sees the padding after it): the batch's loss sum equals the rows' losses computed one by one."""
    model, tok = fresh()
    rows = [sft.encode_row(tok, chat(i, turns=1 + i % 2), 4096) for i in range(4)]
    assert len({len(r["input_ids"]) for r in rows}) >= 2                 # lengths differ: padding present
    with torch.no_grad():
        batch, n = sft.target_loss_sum(model, sft.collate(rows, tok.pad_token_id))
        alone = [sft.target_loss_sum(model, sft.collate([r], tok.pad_token_id)) for r in rows]
    assert n == sum(k for _, k in alone)
    torch.testing.assert_close(batch, sum(x for x, _ in alone), rtol=1e-5, atol=1e-4)


def test_truncation_cuts_the_prompt_from_the_left_never_the_target():
    model, tok = fresh()
    full = sft.encode_row(tok, chat(2, turns=2), 4096)
    n_target = sum(l != -100 for l in full["labels"])
    cut = sft.encode_row(tok, chat(2, turns=2), n_target + 5)
    assert len(cut["input_ids"]) == n_target + 5
    assert cut["input_ids"] == full["input_ids"][-(n_target + 5):]
    assert cut["prompt_cut"] == len(full["input_ids"]) - n_target - 5
    assert sum(l != -100 for l in cut["labels"]) == n_target
    assert sft.encode_row(tok, chat(2, turns=2), n_target) is None  # target alone does not fit: dropped


def test_sft_lowers_loss_and_saves_a_reloadable_adapter(rows, tmp_path):
    model, tok = fresh()
    before = set_loss(model, tok, rows)
    res = sft.train_sft(model, tok, rows, tmp_path / "s0", epochs=6, lr=5e-3, batch_size=4, grad_accum=1,
                        max_len=512, seed=0, progress=False)
    trained = res["model"]
    after = set_loss(trained, tok, rows)
    assert after < before - 0.3, (before, after)
    out = tmp_path / "s0"
    for name in ("adapter/adapter_config.json", "log.jsonl", "curves.png", "result.json", "done.json"):
        assert (out / name).exists(), name
    result = json.loads((out / "result.json").read_text())
    assert result["setup"]["rows_used"] == 8 and result["setup"]["steps"] == 12
    assert result["outcome"]["finished"] and result["outcome"]["final_loss"] < result["outcome"]["first_loss"]
    assert len((out / "log.jsonl").read_text().splitlines()) == 12

    # reload onto a fresh base: same predictions (adapter stored in bf16, hence the tolerance)
    base, _ = fresh()
    reloaded = common.load_adapter(base, str(out / "adapter"))
    x = sft.collate([sft.encode_row(tok, rows[0]["messages"], 512)], tok.pad_token_id)
    trained.eval()
    reloaded.eval()
    with torch.no_grad():
        a = trained(input_ids=x["input_ids"]).logits
        b = reloaded(input_ids=x["input_ids"]).logits
    assert torch.allclose(a, b, atol=5e-2), (a - b).abs().max()
    assert abs(set_loss(reloaded, tok, rows) - after) < 0.05

    # the next stage starts from this adapter (progressive SFT)
    base, _ = fresh()
    res1 = sft.train_sft(base, tok, rows[:4], tmp_path / "s1", epochs=1, lr=1e-3, batch_size=4, grad_accum=1,
                         max_len=512, seed=0, init_adapter=out / "adapter", progress=False)
    first = json.loads((tmp_path / "s1" / "log.jsonl").read_text().splitlines()[0])["loss"]
    assert first < before - 0.3       # stage 1 step 1 already sees the trained stage-0 weights
    assert (tmp_path / "s1" / "done.json").exists() and res1["config"]["init_adapter"]


def test_a_nonfinite_gradient_skips_the_update(rows, tmp_path, monkeypatch):
    """A step whose gradient is inf/NaN (bf16 overflow) must not write NaN into the adapter: no optimizer
    step, the log says so (grad_norm null, skipped_nonfinite 1) and result.json counts it. Steps 2 and 3 of 4
    get a NaN gradient here: the adapter stays finite, and steps 1 and 4 still train it."""
    calls, real = [], sft.accumulate_step

    def poisoned(model, *a, **kw):
        out = real(model, *a, **kw)
        calls.append(1)
        if len(calls) in (2, 3):
            next(p for p in model.parameters() if p.requires_grad).grad.view(-1)[0] = float("nan")
        return out
    monkeypatch.setattr(sft, "accumulate_step", poisoned)
    model, tok = fresh()
    res = sft.train_sft(model, tok, rows, tmp_path / "s", epochs=1, lr=1e-3, batch_size=2, grad_accum=1,
                        max_len=512, seed=0, progress=False)
    log = [json.loads(line) for line in (tmp_path / "s" / "log.jsonl").read_text().splitlines()]
    assert [r["skipped_nonfinite"] for r in log] == [0, 1, 1, 0]
    assert [r["grad_norm"] is None for r in log] == [False, True, True, False]
    first = next(n for n, p in res["model"].named_parameters() if p.requires_grad)
    assert log[1]["nonfinite_params"] == {"count": 1, "first": [first]} and "nonfinite_params" not in log[0]
    assert res["outcome"]["skipped_nonfinite_steps"] == 2 and res["outcome"]["finished"]
    assert all(torch.isfinite(p).all() for p in res["model"].parameters())
    lora_b = [p for n, p in res["model"].named_parameters() if "lora_B" in n]
    assert any(p.abs().sum() > 0 for p in lora_b)          # steps 1 and 4 did train


def test_resume_repeats_the_uninterrupted_run(rows, tmp_path):
    kw = dict(epochs=2, lr=3e-3, batch_size=2, grad_accum=2, max_len=512, seed=1, lora_dropout=0.1,
              group_by_length=True, progress=False)
    model, tok = fresh()
    whole = sft.train_sft(model, tok, rows, tmp_path / "whole", **kw)
    model, tok = fresh()
    part = sft.train_sft(model, tok, rows, tmp_path / "split", stop_after_steps=3, **kw)
    assert not part["outcome"]["finished"] and not (tmp_path / "split" / "done.json").exists()
    assert rundir.latest_checkpoint(tmp_path / "split" / "ckpt").name == "step_000003"   # rl.py's format
    model, tok = fresh()
    with pytest.raises(ValueError, match="batch_size"):          # the data cursor needs the same batching
        sft.train_sft(model, tok, rows, tmp_path / "split", resume=True, **{**kw, "batch_size": 4})
    other = [dict(r, messages=chat(10 + k, turns=1 + k % 2)) for k, r in enumerate(rows)]   # as many rows, others
    with pytest.raises(ValueError, match="rows_sha"):
        sft.train_sft(*fresh(), other, tmp_path / "split", resume=True, **kw)
    model, tok = fresh()
    rest = sft.train_sft(model, tok, rows, tmp_path / "split", resume=True, **kw)
    assert rest["outcome"]["finished"]

    def losses(d):
        return [json.loads(l)["loss"] for l in (tmp_path / d / "log.jsonl").read_text().splitlines()]
    assert len(losses("whole")) == 4
    assert losses("split") == pytest.approx(losses("whole"), abs=1e-5)
    a = {k: v for k, v in whole["model"].named_parameters() if v.requires_grad}
    b = {k: v for k, v in rest["model"].named_parameters() if v.requires_grad}
    assert a.keys() == b.keys() and all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)


def test_a_deadline_stops_between_steps_checkpointed_and_resume_repeats_the_run(rows, tmp_path, monkeypatch):
    """A deadline after step 3 (of 4; --save-every 100): checkpointed at step 3 all the same, outcome
    deadline_stop, no done.json; resuming gives the uninterrupted run's losses and weights."""
    kw = dict(epochs=2, lr=3e-3, batch_size=2, grad_accum=2, max_len=512, seed=1, progress=False, save_every=100)
    model, tok = fresh()
    whole = sft.train_sft(model, tok, rows, tmp_path / "whole", **kw)
    monkeypatch.setattr(rundir, "Deadline", deadline_after(3))
    model, tok = fresh()
    part = sft.train_sft(model, tok, rows, tmp_path / "split", **kw)
    assert part["outcome"]["deadline_stop"] and part["outcome"]["steps_done"] == 3 and not part["outcome"]["finished"]
    assert rundir.latest_checkpoint(tmp_path / "split" / "ckpt").name == "step_000003"
    assert not (tmp_path / "split" / "done.json").exists()
    monkeypatch.undo()
    model, tok = fresh()
    rest = sft.train_sft(model, tok, rows, tmp_path / "split", resume=True, **kw)
    assert rest["outcome"]["finished"] and not rest["outcome"]["deadline_stop"]
    losses = lambda d: [json.loads(l)["loss"] for l in (tmp_path / d / "log.jsonl").read_text().splitlines()]
    assert len(losses("split")) == 4 and losses("split") == pytest.approx(losses("whole"), abs=1e-5)
    a, b = ({k: v for k, v in r["model"].named_parameters() if v.requires_grad} for r in (whole, rest))
    assert a.keys() == b.keys() and all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)


def test_a_resume_counts_the_logged_validation_time_before_a_validated_step(rows, val_rows, tmp_path, monkeypatch):
    """Resumed at step 3 of 8 with --val-every 4: the first deadline check (before step 4, a validation step) counts
    the duration of the last validation the log kept, before any validation has run in the new process."""
    kw = dict(epochs=2, lr=3e-3, batch_size=2, grad_accum=1, max_len=512, seed=0, progress=False, val_every=4)
    sft.train_sft(*fresh(), rows, tmp_path / "s", val_rows=val_rows, stop_after_steps=3, **kw)
    log = _log(tmp_path / "s")
    (tmp_path / "s" / "log.jsonl").write_text("".join(json.dumps(dict(r, **{"val/s": 123.0}) if r.get("val") else r)
                                                      + "\n" for r in log))    # step 0's row, as if tasks ran
    extras = []

    class Record(rundir.Deadline):
        def __init__(self, *a, **kw):
            super().__init__("1e18")

        def near(self, extra=0.0):
            extras.append(extra)
            return False
    monkeypatch.setattr(rundir, "Deadline", Record)
    sft.train_sft(*fresh(), rows, tmp_path / "s", val_rows=val_rows, resume=True, **kw)
    assert extras[:2] == [0.0, 123.0]        # the check before the loop, then before step 4
    assert extras[2] == 0.0                  # before step 5: no validation follows it


def test_a_handoff_resumes_sft_on_schedule_with_fresh_moments_and_is_recorded(rows, tmp_path, monkeypatch):
    """A checkpoint without optimizer.pt (what a device session ships of a cut SFT stage): the resumed run logs the
    uninterrupted run's learning rates and data order, starts from the bf16 adapter, finishes, records the handoff."""
    kw = dict(epochs=2, lr=3e-3, batch_size=2, grad_accum=2, max_len=512, seed=1, progress=False, save_every=1)
    sft.train_sft(*fresh(), rows, tmp_path / "whole", **kw)
    sft.train_sft(*fresh(), rows, tmp_path / "h", stop_after_steps=2, **kw)
    (tmp_path / "h" / "ckpt" / "step_000002" / "optimizer.pt").unlink()
    model, tok = fresh()
    fresh_moments = []
    real_step = torch.optim.AdamW.step

    def first_step(self, *a, **kw):                 # the optimizer state at the resumed run's first update
        if not fresh_moments:
            fresh_moments.append(len(self.state))
        return real_step(self, *a, **kw)
    monkeypatch.setattr(torch.optim.AdamW, "step", first_step)
    rest = sft.train_sft(model, tok, rows, tmp_path / "h", resume=True, **kw)
    monkeypatch.undo()
    assert fresh_moments == [0]
    assert rest["outcome"]["finished"] and (tmp_path / "h" / "done.json").exists()
    rows_of = lambda d: [{k: v for k, v in json.loads(l).items() if k != "elapsed_s"}
                         for l in (tmp_path / d / "log.jsonl").read_text().splitlines()]
    whole, h = rows_of("whole"), rows_of("h")
    assert [r["step"] for r in h] == [1, 2, 3, 4] and h[:2] == whole[:2]
    assert [r["lr"] for r in h] == pytest.approx([r["lr"] for r in whole], rel=1e-9)   # the schedule goes on
    assert [r["target_tokens"] for r in h] == [r["target_tokens"] for r in whole]    # and the data order
    assert h[2]["loss"] == pytest.approx(whole[2]["loss"], rel=1e-2)    # the same batch on bf16-rounded weights
    assert [json.loads(l)["step"] for l in (tmp_path / "h" / "handoffs.jsonl").read_text().splitlines()] == [2]
    assert not (tmp_path / "whole" / "handoffs.jsonl").exists()


def test_a_deadline_on_the_save_grid_or_right_after_a_resume_saves_nothing_twice(rows, tmp_path, monkeypatch):
    kw = dict(epochs=2, lr=3e-3, batch_size=2, grad_accum=2, max_len=512, seed=1, progress=False, save_every=2)
    monkeypatch.setattr(rundir, "Deadline", deadline_after(2))
    part = sft.train_sft(*fresh(), rows, tmp_path / "s", **kw)          # step 2 was saved after it ran
    ckpt = tmp_path / "s" / "ckpt" / "step_000002"
    assert part["outcome"]["deadline_stop"] and part["outcome"]["steps_done"] == 2 and ckpt.is_dir()
    os.utime(ckpt / "meta.json", (1, 1))
    monkeypatch.setattr(rundir, "Deadline", deadline_after(0))          # past the deadline at once after resuming
    again = sft.train_sft(*fresh(), rows, tmp_path / "s", resume=True, **kw)
    assert again["outcome"]["deadline_stop"] and again["outcome"]["steps_done"] == 2
    assert (ckpt / "meta.json").stat().st_mtime == 1 and rundir.latest_checkpoint(ckpt.parent) == ckpt   # not redone
    assert [json.loads(l)["step"] for l in (tmp_path / "s" / "log.jsonl").read_text().splitlines()] == [1, 2]
    assert not (tmp_path / "s" / "done.json").exists()


def test_schedule_warmup_then_cosine_to_zero():
    f = sft.cosine_with_warmup(3, 13)
    assert [round(f(s), 3) for s in (0, 1, 2)] == [0.333, 0.667, 1.0]
    assert f(3) == 1.0 and abs(f(8) - 0.5) < 1e-9 and f(13) == 0.0


def test_batches_cover_every_row_once_per_epoch():
    lengths = [5, 50, 7, 30, 9, 11, 2]
    for group in (False, True):
        b = sft.make_batches(lengths, 3, seed=0, epoch=1, group_by_length=group)
        assert sorted(i for x in b for i in x) == list(range(7))
        assert b == sft.make_batches(lengths, 3, seed=0, epoch=1, group_by_length=group)
    assert sft.make_batches(lengths, 3, 0, 1) != sft.make_batches(lengths, 3, 0, 2)


def test_answers_longer_than_the_decoding_cap_are_dropped_and_counted(rows, tmp_path, capsys):
    """--max-answer-tokens N: a row whose target is longer than N tokens is not trained on (the decoder could never
    finish it); the rest train exactly as a run given only them. Validation rows stay whatever their length."""
    model, tok = fresh()
    rows = [{**r, "messages": r["messages"][:-1] + [{"role": "assistant", "content": r["messages"][-1]["content"]
                                                     + "\n// more stimulus" * (3 * i)}]} for i, r in enumerate(rows)]
    n = [sum(label != -100 for label in sft.encode_row(tok, r["messages"], 4096)["labels"]) for r in rows]
    cap = sorted(n)[len(n) // 2]                          # the median target: about half the rows are longer
    kept = [r for r, k in zip(rows, n) if k <= cap]
    assert 0 < len(kept) < len(rows)
    kw = dict(epochs=1, lr=1e-3, batch_size=2, grad_accum=1, max_len=512, stop_after_steps=1, progress=False,
              max_tokens_per_micro=None)
    capped = sft.train_sft(*fresh(), rows, tmp_path / "cap", max_answer_tokens=cap, val_rows=rows[:1], **kw)
    alone = sft.train_sft(*fresh(), kept, tmp_path / "alone", **kw)
    assert capped["setup"]["rows_used"] == len(kept) and capped["setup"]["dropped_long_answers"] == len(rows) - len(kept)
    assert capped["setup"]["rows_sha"] == alone["setup"]["rows_sha"] and alone["setup"]["dropped_long_answers"] == 0
    assert capped["config"]["max_answer_tokens"] == cap and capped["setup"]["val_rows_used"] == 1
    with pytest.raises(ValueError, match=f"{len(rows)} answers longer than max_answer_tokens=1"):
        sft.train_sft(*fresh(), rows, tmp_path / "none", max_answer_tokens=1, **kw)
    assert rundir.cli("sft.py", sft.main, ["--data", "x.jsonl", "--out", str(tmp_path / "o"),
                                           "--max-answer-tokens", "0"]) == 1
    assert capsys.readouterr().err == "sft.py: error: --max-answer-tokens must be >= 1, got 0\n"


def test_a_malformed_row_file_ends_in_one_line(tmp_path, capsys):
    bad = tmp_path / "rows.jsonl"
    bad.write_text(json.dumps({"messages": [{"role": "user", "content": "x"}]}) + "\n" + json.dumps({"kind": "x"}) + "\n")
    assert rundir.cli("sft.py", sft.main, ["--data", str(bad), "--out", str(tmp_path / "o")]) == 1
    err = capsys.readouterr().err
    assert err == f"sft.py: error: {bad}:2: row has no 'messages' list\n"


def test_split_rows_keeps_order_and_the_padded_budget():
    lengths = [10, 30, 20, 5, 40]
    assert sft.split_rows([0, 1, 2, 3, 4], lengths, None) == [[0, 1, 2, 3, 4]]
    assert sft.split_rows([0, 1, 2, 3, 4], lengths, 0) == [[0, 1, 2, 3, 4]]
    # 60 padded tokens: [10, 30] -> 2 x 30 = 60 fits; + 20 -> 3 x 30 = 90 does not; [20, 5] = 40; + 40 -> 120
    assert sft.split_rows([0, 1, 2, 3, 4], lengths, 60) == [[0, 1], [2, 3], [4]]
    assert sft.split_rows([4, 0], lengths, 39) == [[4], [0]]       # a row longer than the budget goes alone
    assert sft.split_rows([3, 0, 2], lengths, 1000) == [[3, 0, 2]]


def _lora_tiny(tok_rows):
    model, tok = fresh()
    model = common.add_lora(model, r=8, alpha=16, dropout=0.0)
    with torch.no_grad():              # a nonzero B, so every LoRA matrix gets a gradient
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.05, generator=torch.Generator().manual_seed(len(n)))
    encoded = [sft.encode_row(tok, r["messages"], 512) for r in tok_rows]
    return model, tok, encoded


def test_a_split_step_has_the_unsplit_loss_and_gradients(rows):
    """Known answer: the step's loss is the token mean over all 8 rows' targets (one forward per row, summed),
    and its gradient is the same whether the rows run as 2 micro-batches of 4 or in pieces of 1-2 rows."""
    model, tok, encoded = _lora_tiny(rows)
    model.train()
    lengths = [len(e["input_ids"]) for e in encoded]
    micro = [[0, 1, 2, 3], [4, 5, 6, 7]]
    n_tokens = sum(sum(l != sft.IGNORE for l in e["labels"][1:]) for e in encoded)
    with torch.no_grad():
        expected = sum(sft.target_loss_sum(model, sft.collate([e], tok.pad_token_id))[0].item() for e in encoded)
    expected /= n_tokens
    trainable = {n: p for n, p in model.named_parameters() if p.requires_grad}
    runs = {}
    for budget in (None, 2 * max(lengths), 1):
        loss, pieces = sft.accumulate_step(model, encoded, micro, lengths, n_tokens, tok.pad_token_id,
                                           torch.device("cpu"), False, budget)
        runs[budget] = (loss, pieces, {n: p.grad.clone() for n, p in trainable.items()})
        for p in trainable.values():
            p.grad = None
    assert runs[None][1] == 2 and runs[1][1] == 8 and 2 < runs[2 * max(lengths)][1] < 8
    for budget, (loss, _, grads) in runs.items():
        assert loss == pytest.approx(expected, rel=1e-5), budget
        for n, g in grads.items():
            assert torch.allclose(g, runs[None][2][n], rtol=1e-4, atol=1e-7), (budget, n)
    assert sum(float(g.abs().sum()) for g in runs[None][2].values()) > 0


def test_train_sft_split_equals_unsplit_and_auto_does_not_split_on_cpu(rows, tmp_path):
    kw = dict(epochs=1, lr=3e-3, batch_size=4, grad_accum=1, max_len=512, seed=0, lora_dropout=0.0, progress=False)
    out = {}
    for name, budget in (("whole", 0), ("split", 1), ("auto", "auto")):
        model, tok = fresh()
        res = sft.train_sft(model, tok, rows, tmp_path / name, max_tokens_per_micro=budget, **kw)
        log = rundir.read_log(tmp_path / name / "log.jsonl")
        out[name] = (res, log, {k: v.detach() for k, v in res["model"].named_parameters() if v.requires_grad})
    assert [r["micro_batches"] for r in out["whole"][1]] == [1, 1]
    assert [r["micro_batches"] for r in out["split"][1]] == [4, 4]      # one row per piece
    assert [r["micro_batches"] for r in out["auto"][1]] == [1, 1]       # CPU: auto = no split
    assert out["auto"][0]["setup"]["tokens_per_micro"] is None and out["split"][0]["setup"]["tokens_per_micro"] == 1
    for name in ("split", "auto"):
        assert [r["loss"] for r in out[name][1]] == pytest.approx([r["loss"] for r in out["whole"][1]], abs=1e-5)
        a, b = out[name][2], out["whole"][2]
        # Adam's first steps move each weight by ~lr (3e-3) whatever the gradient's size: float noise between
        # the two summation orders shows up as ~1e-5, a different update as ~1e-3
        assert all(torch.allclose(a[k], b[k], atol=1e-4) for k in a), name
    result = json.loads((tmp_path / "split" / "result.json").read_text())
    assert result["config"]["max_tokens_per_micro"] == 1 and "gpu_peak" in result["setup"]


def test_max_tokens_per_micro_argument():
    assert sft.parse_tokens_per_micro("auto") == "auto" and sft.parse_tokens_per_micro("8192") == 8192
    assert sft.parse_tokens_per_micro("0") == 0
    import argparse
    for bad in ("-1", "lots"):
        with pytest.raises(argparse.ArgumentTypeError):
            sft.parse_tokens_per_micro(bad)


# ---------------------------------------------------------------------------------------------------
# Validation during training (--val-data, --val-tasks)

@pytest.fixture(scope="module")
def val_rows():
    return [{"messages": chat(20 + i, turns=1 + i % 2)} for i in range(3)]


def _log(out):
    return rundir.read_log(out / "log.jsonl")


def test_val_rows_at_the_expected_steps_and_val_loss_is_the_token_mean(rows, val_rows, tmp_path):
    """8 rows, batch 2, 2 epochs = 8 steps. Default: the baseline (step 0) and each epoch's end (4, 8);
    --val-every 3: 0, 3, 6 and the last step 8. val/loss at the end is the token mean of the val rows'
    target losses under the trained model (set_loss: one row at a time through sft.target_loss_sum)."""
    kw = dict(epochs=2, lr=3e-3, batch_size=2, grad_accum=1, max_len=512, seed=0, lora_dropout=0.1, progress=False)
    model, tok = fresh()
    res = sft.train_sft(model, tok, rows, tmp_path / "epoch", val_rows=val_rows, **kw)
    log = _log(tmp_path / "epoch")
    assert [r["step"] for r in log if r.get("val")] == [0, 4, 8]
    assert [r["step"] for r in log if not r.get("val")] == list(range(1, 9))   # training rows as before
    assert all("loss" in r and "val/loss" not in r for r in log if not r.get("val"))
    assert log[0]["step"] == 0 and log[0]["val"] == 1                          # the baseline comes first
    with common.as_saved(res["model"]):                 # validation scores the adapter as saved (bf16 weights)
        expected = set_loss(res["model"], tok, val_rows)
    assert log[-1]["step"] == 8 and log[-1]["val/loss"] == pytest.approx(expected, abs=1e-5)
    assert set_loss(res["model"], tok, val_rows) != pytest.approx(expected, abs=1e-6)   # the fp32 weights differ
    train = [r for r in log if not r.get("val")]
    o = res["outcome"]
    assert o["first_loss"] == train[0]["loss"] and o["last_step_loss"] == train[-1]["loss"]   # training-only
    assert o["val_table"] == [r for r in log if r.get("val")]
    best = min(o["val_table"], key=lambda r: r["val/loss"])                     # only --val-data: lowest loss
    assert o["val_best_step"] == best["step"] and o["val_best_adapter"] == f"val_ckpt/step_{best['step']:06d}/adapter"
    for s in (0, 4, 8):
        assert (tmp_path / "epoch" / f"val_ckpt/step_{s:06d}/adapter/adapter_config.json").exists()
    # the step-4 adapter reloads to the step-4 val loss: the validation scored the weights as saved
    base, _ = fresh()
    mid = common.load_adapter(base, str(tmp_path / "epoch" / "val_ckpt/step_000004/adapter"))
    assert set_loss(mid, tok, val_rows) == pytest.approx(log[[r["step"] for r in log].index(4, 5)]["val/loss"], abs=1e-5)
    assert json.loads((tmp_path / "epoch" / "result.json").read_text())["outcome"]["val_best_step"] == o["val_best_step"]

    model, tok = fresh()
    sft.train_sft(model, tok, rows, tmp_path / "every3", val_rows=val_rows, val_every=3, **kw)
    assert [r["step"] for r in _log(tmp_path / "every3") if r.get("val")] == [0, 3, 6, 8]
    assert sorted(p.name for p in (tmp_path / "every3" / "val_ckpt").iterdir()) == \
        ["step_000000", "step_000003", "step_000006", "step_000008"]


def test_validation_does_not_change_training(rows, val_rows, tmp_path, monkeypatch):
    """Dropout on, validation after every step: the val loss's forwards and a validate() that draws from
    torch's, python's and numpy's RNGs leave the training losses and final weights exactly those of a run
    without validation."""
    import random as pyrandom
    import numpy as np
    import evaluate
    seen = []

    def scripted(model, tok, tasks, **kw):
        seen.append((model.training, torch.is_grad_enabled(), kw))
        torch.rand(100), pyrandom.random(), np.random.rand()
        model.train()           # even a validate that leaves the model in train mode: sft restores its mode
        return {"val/syn_pass": 0.0, "val/reward": 0.0}
    monkeypatch.setattr(evaluate, "validate", scripted)
    kw = dict(epochs=1, lr=3e-3, batch_size=2, grad_accum=1, max_len=512, seed=3, lora_dropout=0.2, progress=False)
    runs = {}
    for name, extra in (("plain", {}), ("val", dict(val_rows=val_rows, val_tasks=[{"id": "x"}], val_every=1,
                                                     val_options={"n": 2, "max_new_tokens": 7}))):
        model, tok = fresh()
        res = sft.train_sft(model, tok, rows, tmp_path / name, **extra, **kw)
        runs[name] = ([r["loss"] for r in _log(tmp_path / name) if not r.get("val")],
                      {k: v.detach().clone() for k, v in res["model"].named_parameters() if v.requires_grad})
        assert res["model"].training
    assert len(seen) == 5 and all(not training for training, _, _ in seen)        # steps 0..4, in eval mode
    assert seen[0][2] == {"seed": 3, "n": 2, "max_new_tokens": 7}
    assert runs["val"][0] == runs["plain"][0] and len(runs["plain"][0]) == 4
    assert runs["val"][1].keys() == runs["plain"][1].keys()
    assert all(torch.equal(runs["val"][1][k], runs["plain"][1][k]) for k in runs["plain"][1])
    assert "val_best_step" not in json.loads((tmp_path / "plain" / "result.json").read_text())["outcome"]
    assert not (tmp_path / "plain" / "val_ckpt").exists()


def test_best_val_tie_rules():
    rows = [{"step": 0, "val/syn_pass": 0.0, "val/loss": 2.0}, {"step": 2, "val/syn_pass": 50.0, "val/loss": 1.5},
            {"step": 4, "val/syn_pass": 50.0, "val/loss": 1.2}, {"step": 6, "val/syn_pass": 50.0, "val/loss": 1.2},
            {"step": 8, "val/syn_pass": 25.0, "val/loss": 0.5}]
    assert sft.best_val(rows)["step"] == 4               # top SynPass, then the lower loss, then the earlier step
    assert sft.best_val([{k: v for k, v in r.items() if k != "val/loss"} for r in rows])["step"] == 2
    assert sft.best_val([{k: v for k, v in r.items() if k != "val/syn_pass"} for r in rows])["step"] == 8
    assert sft.best_val([]) is None
    # step 0 is where the stage started (sft2 of the small run: sft1's adapter, best on n=1 by one task): a later
    # step is handed on even when step 0 validates better, so the staged checkpoints differ; alone, step 0 stands
    start = [{"step": 0, "val/syn_pass": 98.3, "val/loss": 0.0116}, {"step": 189, "val/syn_pass": 96.6, "val/loss": 0.0109},
             {"step": 378, "val/syn_pass": 94.8, "val/loss": 0.0082}, {"step": 567, "val/syn_pass": 96.6, "val/loss": 0.0076}]
    assert sft.best_val(start)["step"] == 567 and sft.best_val(start[:1])["step"] == 0
    assert sft.val_key(start[0]) < sft.val_key(start[3])          # what result.json's val_beats_start=False says


def test_best_step_from_scripted_validation(rows, tmp_path, monkeypatch, capsys):
    """SynPass scripted per validation (steps 0..4): 0, 50, 50, 25, 10 -> step 1 (the earlier of the tie, no
    val loss); its adapter is kept, and stdout says the best is not the last step."""
    import evaluate
    script = iter([0.0, 50.0, 50.0, 25.0, 10.0])
    monkeypatch.setattr(evaluate, "validate", lambda model, tok, tasks, **kw: {"val/syn_pass": next(script),
                                                                             "val/tasks": len(tasks)})
    model, tok = fresh()
    res = sft.train_sft(model, tok, rows, tmp_path / "s", epochs=1, lr=3e-3, batch_size=2, grad_accum=1,
                        max_len=512, seed=0, progress=False, val_tasks=[{"id": "a"}, {"id": "b"}], val_every=1)
    o = res["outcome"]
    assert [(r["step"], r["val/syn_pass"], r["val/tasks"]) for r in o["val_table"]] == \
        [(0, 0.0, 2), (1, 50.0, 2), (2, 50.0, 2), (3, 25.0, 2), (4, 10.0, 2)]
    assert o["val_best_step"] == 1 and o["val_best_adapter"] == "val_ckpt/step_000001/adapter"
    assert (tmp_path / "s" / o["val_best_adapter"] / "adapter_model.safetensors").exists()
    assert o["val_beats_start"] is True
    out = capsys.readouterr().out
    assert "sft: the best validation is step 1, not the last validated step 4" in out
    assert "no validated step beats step 0" not in out


def test_a_stage_that_does_not_beat_its_start_still_hands_on_a_trained_step(rows, tmp_path, monkeypatch, capsys):
    """SynPass 90 at step 0 (the adapter the stage started from), then 50, 60, 25, 10: step 2 is handed on,
    result.json says it does not beat the start, and stdout says so."""
    import evaluate
    script = iter([90.0, 50.0, 60.0, 25.0, 10.0])
    monkeypatch.setattr(evaluate, "validate", lambda model, tok, tasks, **kw: {"val/syn_pass": next(script)})
    model, tok = fresh()
    o = sft.train_sft(model, tok, rows, tmp_path / "s", epochs=1, lr=3e-3, batch_size=2, grad_accum=1, max_len=512,
                      seed=0, progress=False, val_tasks=[{"id": "a"}], val_every=1)["outcome"]
    assert o["val_best_step"] == 2 and o["val_beats_start"] is False
    assert json.loads((tmp_path / "s" / "result.json").read_text())["outcome"]["val_best_step"] == 2
    assert "no validated step beats step 0 (the adapter the stage started from); the stage hands on step 2" \
        in capsys.readouterr().out


def test_bad_validation_files_end_in_one_line(rows, tmp_path, capsys):
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    base = ["--data", str(data), "--out", str(tmp_path / "o")]
    cases = [(["--val-data", str(tmp_path / "nope.jsonl")], f"--val-data {tmp_path / 'nope.jsonl'}: no such file"),
             (["--val-tasks", str(tmp_path / "nope.jsonl")], f"--val-tasks {tmp_path / 'nope.jsonl'}: no such file"),
             (["--val-data", str(empty)], f"{empty}: --val-data has no rows"),
             (["--val-tasks", str(empty)], f"{empty}: --val-tasks has no tasks"),
             (["--val-data", str(data), "--val-every", "0"], "--val-every must be >= 1, got 0")]
    for extra, msg in cases:
        assert rundir.cli("sft.py", sft.main, base + extra) == 1
        assert capsys.readouterr().err == f"sft.py: error: {msg}\n"
    assert not (tmp_path / "o").exists()               # refused before anything was written


def test_resume_keeps_validation_rows_once(rows, val_rows, tmp_path):
    """An interrupted run (stopped after step 3; its log also holds a step-4 validation written after the
    step-3 checkpoint, as a crash between a validation and its checkpoint would leave) resumes into the same
    log as an uninterrupted run: every val row once, none lost, and the val_ckpt folders stay."""
    kw = dict(epochs=2, lr=3e-3, batch_size=2, grad_accum=2, max_len=512, seed=1, lora_dropout=0.1,
              progress=False, val_rows=val_rows, val_every=1)
    model, tok = fresh()
    sft.train_sft(model, tok, rows, tmp_path / "whole", **kw)
    model, tok = fresh()
    sft.train_sft(model, tok, rows, tmp_path / "split", stop_after_steps=3, **kw)
    assert [r["step"] for r in _log(tmp_path / "split") if r.get("val")] == [0, 1, 2, 3]
    rundir.append_log(tmp_path / "split" / "log.jsonl", {"step": 4, "val": 1, "val/loss": 99.0})
    model, tok = fresh()
    rest = sft.train_sft(model, tok, rows, tmp_path / "split", resume=True, **kw)
    whole, split = _log(tmp_path / "whole"), _log(tmp_path / "split")
    assert [(r["step"], r.get("val", 0)) for r in split] == [(r["step"], r.get("val", 0)) for r in whole]
    assert [r["step"] for r in split if r.get("val")] == [0, 1, 2, 3, 4]
    assert [r.get("val/loss", r.get("loss")) for r in split] == \
        pytest.approx([r.get("val/loss", r.get("loss")) for r in whole], abs=1e-5)
    assert sorted(p.name for p in (tmp_path / "split" / "val_ckpt").iterdir()) == [f"step_{s:06d}" for s in range(5)]
    assert len(rest["outcome"]["val_table"]) == 5 and rest["outcome"]["val_best_step"] == \
        min(range(5), key=lambda s: whole[[r["step"] if r.get("val") else -1 for r in whole].index(s)]["val/loss"])
