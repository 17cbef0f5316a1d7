"""Staged LoRA SFT: one LLM4Cov SFT stage per run (docs/method.md §3).

    python sft.py --model MODEL --data stage0.jsonl --out runs/sft0
    python sft.py --model MODEL --data stage1.jsonl --out runs/sft1 --init-adapter runs/sft0/adapter
    python sft.py ... --resume            # continue from runs/sftN/ckpt/ after an interruption

What one stage does, in order:
1. Read the chat JSONL rows of data/build_sft.py ({"messages": [...], "task_id", "stage", "kind", ...}).
2. Tokenize each row with the model's chat template. The loss covers the LAST assistant turn only
   (LLaMA-Factory `mask_history: true`); the prompt, earlier turns and padding get label -100.
   A row longer than --max-len loses tokens from the LEFT of its prompt; the target is never cut
   (a row whose target alone does not fit is dropped and counted). --max-answer-tokens N (the decoding cap)
   drops, and counts, a row whose target (answer + end-of-turn tokens) is longer than N: SFT then teaches no
   answer that decoding cannot finish, as the paper's data, whose generation retries a truncated completion.
3. Start the LoRA adapter: fresh (common.add_lora) for stage 0, or the previous stage's adapter
   (--init-adapter) so that stages are progressive, as in the paper.
4. Train: AdamW, cosine LR with linear warmup (ratio 0.03), gradient accumulation, grad-norm clip 1.0,
   bf16 autocast on CUDA (LoRA weights kept in fp32), fp32 on CPU (docs/stack.md §1.1: bf16 is ~30x slower
   there). The loss is the mean over all target tokens of one optimizer step (token-level, so long and
   short targets weigh by their tokens, not per row). A micro-batch runs in pieces of at most
   --max-tokens-per-micro padded tokens (auto: sized from the free GPU memory, so `small`'s 16 rows x 4096
   tokens fit a 24 GB card); the split changes the memory, not the loss or the gradients.
5. Write into --out: adapter/ (standard peft folder, bf16 tensors, via common.save_adapter),
   and rundir.py's run folder, shared with rl.py and distill.py: ckpt/step_N/ (adapter, exact fp32
   weights, optimizer, scheduler, RNG states, config and rows used; for --resume, which from a handoff without
   optimizer.pt goes on with fresh Adam moments and the schedule at its step), log.jsonl (one line
   per optimizer step), curves.png, result.json (config / setup / outcome) and, last, done.json.
6. Validation (optional; --val-data and/or --val-tasks): before the first step (step 0, the baseline), every
   --val-every optimizer steps (default: at each epoch's end) and at the last step, the model is validated:
   --val-data's rows give `val/loss` (their token-mean target loss, no gradients, batched as training) and
   --val-tasks' tasks give evaluate.validate's direct-answer numbers (`val/syn_pass`, `val/pass@1`, ...).
   Each validation appends a row {"step", "val": 1, ...} to log.jsonl and keeps that step's adapter in
   val_ckpt/step_N/adapter (bf16), so a later step can choose the stopping point; result.json's outcome names
   the best one (val_best_step, val_best_adapter: highest val/syn_pass, then lowest val/loss, then the
   earlier step; never step 0, the adapter the stage started from, when a later step was validated;
   val_beats_start says whether it beats step 0) and lists every val row (val_table). Validation runs on a
   forked RNG in eval mode, so the training is exactly that of a run without it.

Deviations from the paper (docs/method.md §3.2): LoRA instead of full fine-tuning, so the default LR is 2e-4 rather
than 1e-5; the cutoff is 4096 tokens rather than 40960.

Several processes (`accelerate launch --multi_gpu --num_processes N sft.py ...`, dist.py): the rows of
each optimizer step (batch_size x grad_accum, the same as with one process) are split into contiguous
blocks, one per rank, each run in micro-batches of batch_size; the loss divides by the step's global
target-token count and the LoRA gradients are summed over the ranks, so a step equals one process's
(LoRA dropout aside: each rank draws its own masks). Rank 0 writes every file.
"""
import argparse
import hashlib
import json
import math
import random
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

import common
from common import parse_tokens_per_micro  # noqa: F401  (sft.parse_tokens_per_micro: tests)
import dist
import evaluate
import harness
import onpolicy
import rundir
import sim

IGNORE = -100  # label of tokens that carry no loss


# ---------------------------------------------------------------------------------------------------
# Data: rows -> (input_ids, labels)

def load_rows(path):
    """Read a chat JSONL file; each row needs a `messages` list that ends with an assistant turn."""
    rows = []
    for lineno, row in sim.read_jsonl(path):
        if not isinstance(row.get("messages"), list) or not row["messages"]:
            raise ValueError(f"{path}:{lineno}: row has no 'messages' list")
        rows.append(row)
    return rows


def encode_row(tok, messages, max_len):
    """Tokenize one chat; labels are -100 everywhere except the last assistant turn.

    The prompt (everything before the last assistant turn, plus the generation prompt) and the target
    (the rest of the rendered chat: the answer and its end-of-turn tokens) are tokenized separately,
    exactly as generation sees them. Returns None when the target alone exceeds max_len, else
    {"input_ids", "labels", "prompt_cut"} where prompt_cut counts tokens removed from the left.
    """
    last = max(i for i, m in enumerate(messages) if m["role"] == "assistant")  # ValueError if none
    messages = messages[: last + 1]
    prompt_text = tok.apply_chat_template(messages[:-1], tokenize=False, add_generation_prompt=True)
    full_text = tok.apply_chat_template(messages, tokenize=False)
    if not full_text.startswith(prompt_text):
        raise ValueError("chat template: the rendered prompt is not a prefix of the rendered chat; "
                         "cannot locate the last assistant turn")
    prompt_ids = tok(prompt_text, add_special_tokens=False)["input_ids"]
    target_ids = tok(full_text[len(prompt_text):], add_special_tokens=False)["input_ids"]
    if len(target_ids) > max_len - 1:  # keep at least one prompt token to predict the first target token
        return None
    keep = max_len - len(target_ids)
    prompt_cut = max(0, len(prompt_ids) - keep)
    prompt_ids = prompt_ids[prompt_cut:]
    return {"input_ids": prompt_ids + target_ids,
            "labels": [IGNORE] * len(prompt_ids) + target_ids,
            "prompt_cut": prompt_cut}


def make_batches(lengths, batch_size, seed, epoch, group_by_length=False):
    """The micro-batches (lists of row indices) of one epoch; deterministic in (seed, epoch).

    group_by_length: shuffle, cut into mega-batches of 50 micro-batches, sort each by length and
    shuffle the resulting batches; this cuts padding while keeping the order random.
    """
    rng = random.Random(seed * 1_000_003 + epoch)
    order = list(range(len(lengths)))
    rng.shuffle(order)
    if group_by_length:
        mega = batch_size * 50
        order = [i for s in range(0, len(order), mega)
                 for i in sorted(order[s:s + mega], key=lambda i: -lengths[i])]
    batches = [order[s:s + batch_size] for s in range(0, len(order), batch_size)]
    if group_by_length:
        rng.shuffle(batches)
    return batches


def collate(examples, pad_id):
    """Right-pad a list of encoded rows into tensors; padding is masked in attention and labels."""
    width = max(len(e["input_ids"]) for e in examples)
    ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    labels = torch.full((len(examples), width), IGNORE, dtype=torch.long)
    mask = torch.zeros((len(examples), width), dtype=torch.long)
    for b, e in enumerate(examples):
        n = len(e["input_ids"])
        ids[b, :n] = torch.tensor(e["input_ids"])
        labels[b, :n] = torch.tensor(e["labels"])
        mask[b, :n] = 1
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def target_loss_sum(model, batch):
    """Sum of the next-token cross-entropy over labelled positions, and their count."""
    # no attention mask: collate pads on the right and attention is causal, so no target sees padding
    # (a mask would make SDPA run a masked full-matrix kernel instead of its causal one)
    logits = model(input_ids=batch["input_ids"]).logits
    labels = batch["labels"][:, 1:]
    keep = labels != IGNORE                                   # (B, T-1)
    picked = logits[:, :-1][keep].float()                     # (N, V): only target positions
    return F.cross_entropy(picked, labels[keep], reduction="sum"), int(keep.sum())


def split_rows(idx, lengths, max_tokens):
    """Cut one micro-batch (row indices, in order) into consecutive pieces whose padded size (rows x
    longest row) is at most max_tokens; a single longer row goes alone. None or 0 = no split."""
    return common.pack_rows(idx, lengths, max_tokens) or [list(idx)]


def auto_tokens_per_micro(model, encoded, pad_id, device, use_bf16, optimizer_state=True, fill=0.75):
    """The padded-token budget of one micro-batch, sized from the memory the card has (on CUDA; None =
    no split on CPU). A probe runs one forward + backward on the longest row with every position a
    target (the costliest row per token: sft's logits are kept for target positions in fp32) and
    measures its peak above the memory in use; the budget is `fill` of the free memory
    (common.gpu_free_bytes: within $CHORUS_GPU_CAP_GIB's cap), less the gradients and AdamW's two fp32
    moments still to come, divided by that per-token cost. The probe runs under a forked RNG and leaves
    no gradient, so the training that follows is the same as without it.
    Returns (tokens or None, record for result.json)."""
    if device.type != "cuda":
        return None, {"device": device.type, "note": "no split off CUDA"}
    trainable = [p for p in model.parameters() if p.requires_grad]
    param_bytes = sum(p.numel() * p.element_size() for p in trainable)
    row = max(encoded, key=lambda e: len(e["input_ids"]))
    n = len(row["input_ids"])
    probe = collate([{"input_ids": row["input_ids"], "labels": list(row["input_ids"])}], pad_id)
    torch.cuda.synchronize(device)
    base = torch.cuda.memory_allocated(device)
    common.reset_peak()
    with torch.random.fork_rng(devices=[device]), common.train_mode(model):   # as training runs (checkpointing)
        b = {k: v.to(device) for k, v in probe.items()}
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=use_bf16):
            loss_sum, _ = target_loss_sum(model, b)
        loss_sum.backward()
        del loss_sum, b
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - base
    for p in trainable:
        p.grad = None
    per_token = max(1.0, (peak - param_bytes) / n)
    free = common.gpu_free_bytes(device)
    room = free - param_bytes * (1 + (2 if optimizer_state else 0))     # grads + AdamW's moments
    tokens = max(n, int(fill * room / per_token))
    return tokens, {"probe_tokens": n, "probe_peak_gib": round(peak / common.GIB, 3),
                    "bytes_per_token": int(per_token), "free_gib": round(free / common.GIB, 3), "fill": fill,
                    "tokens_per_micro": tokens}


def accumulate_step(model, encoded, micro, lengths, n_tokens, pad_id, device, use_bf16, tokens_per_micro=None):
    """Forward + backward of one optimizer step's micro-batches (lists of row indices), each run as the
    pieces of split_rows(tokens_per_micro); every piece's summed loss is divided by n_tokens, the step's
    target-token count, so the accumulated gradient is that of the step's token mean however the rows
    are split. Returns (the step's loss, pieces run)."""
    pieces = [piece for idx in micro for piece in split_rows(idx, lengths, tokens_per_micro)]
    step_loss = 0.0
    for idx in pieces:
        b = {k: v.to(device) for k, v in collate([encoded[i] for i in idx], pad_id).items()}
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=use_bf16):
            loss_sum, _ = target_loss_sum(model, b)
        (loss_sum / n_tokens).backward()
        step_loss += loss_sum.item() / n_tokens
    return step_loss, len(pieces)


def cosine_with_warmup(warmup_steps, total_steps):
    """LR multiplier: linear 0 -> 1 over warmup_steps, then cosine 1 -> 0 at total_steps."""
    def factor(step):
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
    return factor


# ---------------------------------------------------------------------------------------------------
# Validation

def val_loss(model, encoded, lengths, pad_id, device, use_bf16, batch_size, tokens_per_micro=None):
    """Token-mean target loss of the encoded validation rows, without gradients, in micro-batches of
    batch_size rows split as training's (split_rows). Several processes: each rank runs its contiguous block of
    the rows and the sums are added over the ranks, so every rank gets the same number."""
    mine = dist.shard(list(range(len(encoded))))
    total, count = 0.0, 0
    with torch.no_grad():
        for s in range(0, len(mine), batch_size):
            for idx in split_rows(mine[s:s + batch_size], lengths, tokens_per_micro):
                b = {k: v.to(device) for k, v in collate([encoded[i] for i in idx], pad_id).items()}
                with torch.autocast(device.type, dtype=torch.bfloat16, enabled=use_bf16):
                    loss_sum, n = target_loss_sum(model, b)
                total, count = total + loss_sum.item(), count + n
    total, count = dist.all_sum([total, float(count)])
    return total / count


def validate_step(model, tok, step, *, val_encoded, val_lengths, val_tasks, val_options, pad_id, device,
                  use_bf16, batch_size, tokens_per_micro, seed):
    """One validation point: {"step", "val": 1, "val/loss"?, evaluate.validate's fields?}. It runs in eval
    mode without gradients on a forked RNG (torch on CPU and this rank's GPU, python's and numpy's), so the
    training after it draws the same dropout masks as a run without validation; the model goes back to the
    mode it was in."""
    rec = {"step": step, "val": 1}
    was, cache = model.training, getattr(getattr(model, "config", None), "use_cache", None)
    with onpolicy.keep_rng(), common.as_saved(model):      # the loss and the answers of the adapter as saved
        model.eval()
        try:
            if val_encoded:
                rec["val/loss"] = round(val_loss(model, val_encoded, val_lengths, pad_id, device, use_bf16,
                                                 batch_size, tokens_per_micro), 6)
            if val_tasks:
                if cache is not None:
                    model.config.use_cache = True        # generation wants its KV cache (training turned it off)
                rec.update(evaluate.validate(model, tok, val_tasks, seed=seed, **(val_options or {})))
                common.free_fast_cache(model)   # the decoder's packed weights and KV cache: not kept while training
        finally:
            model.train(was)
            if cache is not None:
                model.config.use_cache = cache
    return rec


def rows_digest(encoded):
    """The trained rows' token ids and labels, as 16 hex digits: a resume refuses other rows of the same count (a
    data2 rebuilt on the device after the box lost the one a cut sft2 trained on)."""
    h = hashlib.sha256()
    for e in encoded:
        h.update(np.asarray(e["input_ids"], dtype=np.int64).tobytes() + b"|")
        h.update(np.asarray(e["labels"], dtype=np.int64).tobytes() + b"/")
    return h.hexdigest()[:16]


def val_key(r):
    """Validation rows in order of preference: the highest val/syn_pass, ties (or no SynPass: every row) broken
    by the lower val/loss, then the earlier step."""
    syn, loss = r.get("val/syn_pass"), r.get("val/loss")
    return (-syn if syn is not None else 0.0, loss if loss is not None else math.inf, r["step"])


def best_val(rows):
    """The chosen stopping point among val rows (val_key), step 0 left out: it is the adapter the stage started
    from (the previous stage's, or an untrained LoRA), and a stage hands on a model trained on its own data; step 0
    only when no later step was validated. None when there are no val rows."""
    trained = [r for r in rows if r["step"] > 0] or rows
    return min(trained, key=val_key) if trained else None


def val_adapter_path(step):
    """Where a validated step's adapter is kept, relative to the run folder."""
    return f"val_ckpt/step_{step:06d}/adapter"


# ---------------------------------------------------------------------------------------------------
# Training

def _prepare_adapter(model, init_adapter, lora_r, lora_alpha, lora_dropout):
    if hasattr(model, "peft_config"):       # caller already attached (and activated) an adapter
        return model
    if init_adapter:
        return common.load_adapter(model, str(init_adapter), trainable=True)
    return common.add_lora(model, r=lora_r, alpha=lora_alpha, dropout=lora_dropout)


def train_sft(model, tok, rows, out_dir, *, epochs=1, lr=2e-4, batch_size=4, grad_accum=6, max_len=4096,
              warmup_ratio=0.03, seed=42, init_adapter=None, resume=False, lora_r=16, lora_alpha=32,
              lora_dropout=0.05, weight_decay=0.0, max_grad_norm=1.0, group_by_length=False,
              gradient_checkpointing=False, save_every=100, stop_after_steps=None, progress=True,
              extra_config=None, max_tokens_per_micro="auto", val_rows=None, val_tasks=None, val_every=None,
              val_options=None, deadline=None, max_answer_tokens=None):
    """Train one SFT stage on `rows` (chat dicts); write adapter/, logs, result.json and done.json.

    `model` is a base model (an adapter is added, or --init-adapter loaded, as trainable) or an
    already-wrapped PeftModel. `stop_after_steps` ends the run early without finishing the schedule
    (time budgets, tests); done.json is then not written, and `resume=True` continues it later.
    Returns result.json's dict; the trained PeftModel is result["model"] (not written to disk).

    max_tokens_per_micro: each micro-batch of batch_size rows runs as consecutive pieces of at most this
    many padded tokens ('auto': sized from the free GPU memory by auto_tokens_per_micro, no split on
    CPU; None or 0: no split). Only the memory changes: the loss of a step is still divided by the
    step's target-token count, so a split step gives the same loss and gradients (LoRA dropout aside).

    Validation (module docstring, 6.): val_rows (chat dicts, encoded as the training rows) and/or val_tasks
    (task dicts for evaluate.validate, with val_options: n, max_new_tokens, sim_workers, target_mode,
    answer_mode, batch_size); val_every = optimizer steps between validations (None: each epoch's end).
    Neither given: no validation.

    deadline: a rundir.Deadline (None: $CHORUS_DEADLINE's, read here): near it the run stops between steps,
    checkpointed, with outcome deadline_stop; done.json is not written and `resume=True` continues it.

    max_answer_tokens: training rows whose target is longer are dropped (setup's dropped_long_answers; None:
    kept). Validation rows are kept whatever their length.
    """
    t0 = time.time()
    dist.init()
    deadline = deadline or rundir.Deadline()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    config = {"epochs": epochs, "lr": lr, "batch_size": batch_size, "grad_accum": grad_accum,
              "max_len": max_len, "warmup_ratio": warmup_ratio, "seed": seed,
              "init_adapter": str(init_adapter) if init_adapter else None, "lora_r": lora_r,
              "lora_alpha": lora_alpha, "lora_dropout": lora_dropout, "weight_decay": weight_decay,
              "max_grad_norm": max_grad_norm, "group_by_length": group_by_length,
              "gradient_checkpointing": gradient_checkpointing, "max_tokens_per_micro": max_tokens_per_micro,
              "max_answer_tokens": max_answer_tokens, **(extra_config or {})}
    validating = bool(val_rows) or bool(val_tasks)
    if val_every is not None and val_every < 1:
        raise ValueError(f"val_every must be >= 1 optimizer step, got {val_every}")
    if validating:
        config["val"] = {"every": val_every, "rows": len(val_rows or []), "tasks": len(val_tasks or []),
                         **(val_options or {})}
    # (the process count is not part of the config: a run may resume with another one)

    # 1. data
    encoded, dropped, long_answers = [], 0, 0
    for row in rows:
        e = encode_row(tok, row["messages"], max_len)
        if e is None:
            dropped += 1
        elif max_answer_tokens and sum(label != IGNORE for label in e["labels"]) > max_answer_tokens:
            long_answers += 1
        else:
            encoded.append(e)
    if not encoded:
        why = f"{dropped} longer than max_len={max_len}"
        if long_answers:
            why += f", {long_answers} answers longer than max_answer_tokens={max_answer_tokens}"
        raise ValueError(f"no trainable rows ({len(rows)} given, {why})")
    lengths = [len(e["input_ids"]) for e in encoded]
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    micro_per_epoch = math.ceil(len(encoded) / batch_size)
    steps_per_epoch = math.ceil(micro_per_epoch / grad_accum)
    total_steps = steps_per_epoch * epochs
    warmup_steps = max(1, round(warmup_ratio * total_steps)) if warmup_ratio > 0 else 0
    setup = {"rows": len(rows), "rows_used": len(encoded), "rows_sha": rows_digest(encoded),
             "dropped_too_long": dropped, "dropped_long_answers": long_answers,
             "prompts_truncated": sum(e["prompt_cut"] > 0 for e in encoded),
             "tokens": sum(lengths), "target_tokens": sum(sum(l != IGNORE for l in e["labels"]) for e in encoded),
             "steps": total_steps, "warmup_steps": warmup_steps}
    val_encoded = []
    if val_rows:
        val_encoded = [e for e in (encode_row(tok, r["messages"], max_len) for r in val_rows) if e is not None]
        if not val_encoded:
            raise ValueError(f"no validation rows fit max_len={max_len} ({len(val_rows)} given)")
        setup.update(val_rows=len(val_rows), val_rows_used=len(val_encoded))
    val_lengths = [len(e["input_ids"]) for e in val_encoded]
    if val_tasks:
        setup["val_tasks"] = len(val_tasks)

    def val_due(s):   # validation points: the baseline, every val_every steps (or each epoch's end), the end
        return validating and (s == 0 or s == total_steps or s % (val_every or steps_per_epoch) == 0)

    # 2. model, adapter, dtype
    torch.manual_seed(seed)
    random.seed(seed)
    model = _prepare_adapter(model, init_adapter, lora_r, lora_alpha, lora_dropout)
    device = next(model.parameters()).device
    use_bf16 = device.type == "cuda" and torch.cuda.is_bf16_supported()
    trainable = [p for p in model.parameters() if p.requires_grad]
    for p in trainable:                      # optimizer math in fp32 even over a bf16 base
        p.data = p.data.float()
    if gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if hasattr(model, "config"):
        model.config.use_cache = False
    setup.update(device=str(device), processes=dist.world(), compute_dtype="bf16 autocast" if use_bf16 else "fp32",
                 trainable_params=sum(p.numel() for p in trainable))
    print(f"sft: {len(encoded)} rows ({dropped} dropped, {setup['prompts_truncated']} prompts cut), "
          f"{total_steps} steps x {batch_size}x{grad_accum}, lr {lr}, warmup {warmup_steps}, "
          f"{setup['trainable_params']:,} trainable params, {setup['compute_dtype']} on {device}")

    optimizer = torch.optim.AdamW(trainable, lr=lr, weight_decay=weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, cosine_with_warmup(warmup_steps, total_steps))

    # 3. resume (rundir's checkpoint format, as rl.py and distill.py)
    log_path, ckpt_dir = out_dir / "log.jsonl", out_dir / "ckpt"
    step, how = 0, ""
    ckpt = rundir.latest_checkpoint(ckpt_dir) if resume else None
    if ckpt:   # the data cursor only means something with the same data and batching
        saved = rundir.read_meta(ckpt)
        keys = ("epochs", "batch_size", "grad_accum", "max_len", "seed", "group_by_length")
        diff = {k: (saved["config"].get(k), config[k]) for k in keys if saved["config"].get(k) != config[k]}
        if saved.get("rows_used") != len(encoded):
            diff["rows_used"] = (saved.get("rows_used"), len(encoded))
        elif saved.get("rows_sha", setup["rows_sha"]) != setup["rows_sha"]:    # (older checkpoints: the count only)
            diff["rows_sha"] = (saved["rows_sha"], setup["rows_sha"])
        if diff:
            raise ValueError(f"--resume: the checkpoint was made with other settings (saved, now): {diff}")
        meta = rundir.load_checkpoint(ckpt, model, optimizer, scheduler)
        step, how = meta["step"], rundir.handoff_note(meta, ckpt, log_path)
    if resume:
        print(f"sft: resumed at step {step}/{total_steps}{how}" if step else "sft: no checkpoint, starting fresh")
    if dist.is_main():    # (at step 0 nothing is kept: a step-0 validation of an interrupted start is redone)
        log_path.write_text("".join(json.dumps(r) + "\n" for r in rundir.read_log(log_path) if step and r["step"] <= step))
        (out_dir / "done.json").unlink(missing_ok=True)
    dist.broadcast_params(trainable)
    if max_tokens_per_micro == "auto":
        tokens_per_micro, probe = auto_tokens_per_micro(model, encoded, pad_id, device, use_bf16,
                                                        optimizer_state=not optimizer.state)
    else:
        tokens_per_micro, probe = (max_tokens_per_micro or None), None
    setup.update(tokens_per_micro=tokens_per_micro, micro_probe=probe)
    if tokens_per_micro:
        print(f"sft: micro-batches of at most {tokens_per_micro} padded tokens"
              + (f" (auto: {probe['bytes_per_token']} B/token, {probe['free_gib']} GiB free)" if probe else ""))

    # 4. loop: one optimizer step = grad_accum micro-batches, token-level mean over the whole step
    model.train()
    bar = None
    if progress and dist.is_main():
        bar = tqdm(total=total_steps, initial=step, desc=f"sft {out_dir.name}", dynamic_ncols=True)

    # the last validation's duration ($CHORUS_DEADLINE: the step it follows takes that longer); after a resume, the
    # last one the log kept (val/s: its task part, by far the longer)
    val_seconds = [rundir.last_val_seconds(rundir.read_log(log_path))]

    def run_validation(s):    # before the step-s checkpoint: a resume from it keeps this row, never repeats it
        t_val = time.time()
        rec = validate_step(model, tok, s, val_encoded=val_encoded, val_lengths=val_lengths, val_tasks=val_tasks,
                            val_options=val_options, pad_id=pad_id, device=device, use_bf16=use_bf16,
                            batch_size=batch_size, tokens_per_micro=tokens_per_micro, seed=seed)
        rec["elapsed_s"] = round(time.time() - t0, 2)
        if dist.is_main():
            common.save_adapter(model, str(out_dir / val_adapter_path(s)))
        rundir.append_log(log_path, rec)
        shown = ", ".join(f"{k} {v:.4g}" for k, v in rec.items() if k in ("val/loss", "val/syn_pass", "val/reward"))
        (bar.write if bar else print)(f"sft: validation at step {s}: {shown}")
        val_seconds[0] = time.time() - t_val

    def save(s):
        rundir.save_checkpoint(ckpt_dir, s, model, optimizer,
                               {"config": config, "rows_used": len(encoded), "rows_sha": setup["rows_sha"]},
                               keep_last=1, scheduler=scheduler)

    # $CHORUS_DEADLINE: stop between steps, checkpointed; a stage started past it (the later stage of a chain)
    # does not even validate step 0
    limit = total_steps if stop_after_steps is None else min(total_steps, stop_after_steps)
    deadline_hit = step < limit and deadline.near()
    if step == 0 and val_due(0) and stop_after_steps != 0 and not deadline_hit:
        run_validation(0)
    last_epoch_batches, losses = (None, None), []
    start_step = step
    deadline.start()
    while step < total_steps and not deadline_hit:
        if stop_after_steps is not None and step >= stop_after_steps:
            break
        if deadline.near(extra=val_seconds[0] if val_due(step + 1) else 0.0):
            if step > start_step and step % save_every:      # (a multiple of save_every was saved after its step)
                save(step)
            deadline_hit = True
            break
        epoch, in_epoch = divmod(step, steps_per_epoch)
        if last_epoch_batches[0] != epoch:
            last_epoch_batches = (epoch, make_batches(lengths, batch_size, seed, epoch, group_by_length))
        micro = last_epoch_batches[1][in_epoch * grad_accum:(in_epoch + 1) * grad_accum]
        n_tokens = sum(sum(l != IGNORE for l in encoded[i]["labels"][1:]) for idx in micro for i in idx)
        if dist.world() > 1:      # this rank's block of the step's rows, in micro-batches of batch_size
            mine = dist.shard([i for idx in micro for i in idx])
            micro = [mine[s:s + batch_size] for s in range(0, len(mine), batch_size)]
        step_loss, n_pieces = accumulate_step(model, encoded, micro, lengths, n_tokens, pad_id, device, use_bf16,
                                              tokens_per_micro)
        dist.sync_grads(trainable)            # sum over the ranks: the loss already divides by the global count
        step_loss = dist.all_sum(step_loss)
        total_norm = torch.nn.utils.get_total_norm([p.grad for p in trainable if p.grad is not None])
        grad_norm = total_norm.item()
        lr_now = scheduler.get_last_lr()[0]
        finite = math.isfinite(grad_norm)
        bad = None if finite else common.nonfinite_grads(model)   # before clipping spreads the NaN to every grad
        if finite:
            torch.nn.utils.clip_grads_with_norm_(trainable, max_grad_norm, total_norm)
            optimizer.step()
        # else: a non-finite gradient (bf16 overflow) would write NaN into the adapter and every later stage;
        # the step is skipped (no update; the schedule moves on), as mixed-precision loss scaling does
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        losses.append(step_loss)
        rec = {"step": step, "epoch": epoch, "loss": round(step_loss, 6), "lr": lr_now,
               "grad_norm": round(grad_norm, 4) if finite else None, "target_tokens": n_tokens,
               "micro_batches": n_pieces, "skipped_nonfinite": int(not finite), "elapsed_s": round(time.time() - t0, 2)}
        if bad:
            rec["nonfinite_params"] = bad
        rundir.append_log(log_path, rec)
        if bar:
            bar.update(1)
            bar.set_postfix(loss=f"{step_loss:.4f}", lr=f"{lr_now:.2e}")
        if val_due(step):
            run_validation(step)
        if step % save_every == 0 or step == total_steps or step == stop_after_steps:
            save(step)
        deadline.tick()
    if deadline_hit:
        deadline.stop(out_dir, step, lambda m: (bar.write if bar else print)("sft: " + m))
    if bar:
        bar.close()
    dist.barrier()                            # rank 0's log is complete before any rank reads it

    # 5. outputs (first/final loss: the training rows; the val rows go to val_*)
    log = rundir.read_log(log_path)
    recs = [r for r in log if not r.get("val")]
    val_table = [r for r in log if r.get("val")]
    tail = recs[-max(1, len(recs) // 10):] if recs else []
    finished = step >= total_steps
    outcome = {"finished": finished, "steps_done": step, "deadline_stop": deadline_hit,
               "first_loss": recs[0]["loss"] if recs else None,
               "final_loss": sum(r["loss"] for r in tail) / len(tail) if tail else None,
               "last_step_loss": recs[-1]["loss"] if recs else None,
               "skipped_nonfinite_steps": sum(r.get("skipped_nonfinite", 0) for r in recs),
               "time_s": round(time.time() - t0, 2)}
    best = best_val(val_table)
    if best is not None:
        outcome.update(val_best_step=best["step"], val_best_adapter=val_adapter_path(best["step"]), val_table=val_table)
        if best["step"] != val_table[-1]["step"]:
            print(f"sft: the best validation is step {best['step']}, not the last validated step "
                  f"{val_table[-1]['step']}: {out_dir / val_adapter_path(best['step'])}")
        base = next((r for r in val_table if r["step"] == 0), None)
        if base is not None and best["step"] > 0:    # did the stage's data help at all, on the validation numbers?
            outcome["val_beats_start"] = val_key(best) < val_key(base)
            if not outcome["val_beats_start"]:
                print(f"sft: no validated step beats step 0 (the adapter the stage started from); the stage hands "
                      f"on step {best['step']}, its best trained one")
    rundir.plot_log(log, out_dir / "curves.png", keys=["loss", "val/loss", "val/syn_pass", "lr", "grad_norm"])
    if finished and dist.is_main():
        common.save_adapter(model, str(out_dir / "adapter"))
    result = rundir.write_result(out_dir, config, {**setup, "gpu_peak_mib": common.gpu_peak_mib()}, outcome)
    if finished:
        rundir.write_done(out_dir, "sft.py", {"adapter": "adapter", "result": "result.json", "log": "log.jsonl"})
    print(f"sft: {step}/{total_steps} steps, loss {outcome['first_loss']} -> {outcome['final_loss']}, "
          f"{outcome['time_s']} s" + ("" if finished else " (stopped early; --resume continues)"))
    return {**result, "model": model}


# ---------------------------------------------------------------------------------------------------
# CLI

def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    # Model loading
    p.add_argument("--model", default=None, help="HF id, local folder or GGUF (default: the bundled SmolLM2)")
    common.add_gpu_mem_arg(p)
    p.add_argument("--quant", default="auto", help="passed to common.load_model (auto | none | 4bit ...)")
    p.add_argument("--init-adapter", default=None, help="previous stage's adapter folder (progressive SFT)")
    p.add_argument("--lora-r", type=int, default=16)
    p.add_argument("--lora-alpha", type=int, default=32)
    p.add_argument("--lora-dropout", type=float, default=0.05)
    # Data
    p.add_argument("--data", required=True, nargs="+", help="chat JSONL file(s) from data/build_sft.py")
    p.add_argument("--max-len", type=int, default=4096, help="tokens; prompts are cut from the left")
    p.add_argument("--max-answer-tokens", type=int, default=None,
                   help="drop rows whose answer is longer (tokens; the decoding cap); default: keep every row")
    p.add_argument("--limit", type=int, default=None, help="use only the first N rows (smoke runs)")
    p.add_argument("--group-by-length", action="store_true", help="batch rows of similar length")
    # Validation (none given: no validation)
    p.add_argument("--val-data", default=None, help="chat JSONL rows (as --data) whose target loss is val/loss")
    p.add_argument("--val-tasks", default=None, help="task JSONL: direct-answer SynPass, Pass@1, ... (evaluate.validate)")
    p.add_argument("--val-every", type=int, default=None, help="optimizer steps between validations (default: each epoch's end)")
    p.add_argument("--val-n", type=int, default=1, help="samples per validation task")
    p.add_argument("--val-max-new-tokens", type=int, default=1024, help="answer cap of a validation sample")
    harness.add_answer_mode_arg(p, "validation tasks' answers")
    p.add_argument("--target-mode", choices=("cvdp", "icarus"), default="icarus", help="validation coverage targets")
    p.add_argument("--sim-workers", type=int, default=None, help="validation simulations in parallel (default: sim's)")
    p.add_argument("--gen-batch-size", type=int, default=64, help="validation generation batch size")
    # Optimization
    p.add_argument("--epochs", type=int, default=1, help="paper: 1")
    p.add_argument("--lr", type=float, default=2e-4, help="paper: 1e-5 for full FT; LoRA needs ~10-20x more")
    p.add_argument("--batch-size", type=int, default=4, help="rows per micro-batch")
    p.add_argument("--grad-accum", type=int, default=6, help="micro-batches per optimizer step (4x6=24=paper)")
    p.add_argument("--warmup-ratio", type=float, default=0.03, help="paper: 0.03")
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--max-grad-norm", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=42, help="paper: 42")
    # Runtime
    p.add_argument("--out", required=True, help="stage folder (adapter/, ckpt/, log.jsonl, curves.png, result.json, done.json)")
    p.add_argument("--gradient-checkpointing", action="store_true", help="trade compute for memory")
    p.add_argument("--max-tokens-per-micro", type=parse_tokens_per_micro, default="auto",
                   help="padded tokens per forward/backward: a micro-batch of --batch-size rows runs in pieces of at "
                        "most this size (same loss and gradients, less memory); auto = sized from the free GPU "
                        "memory (honours $CHORUS_GPU_CAP_GIB), no split on CPU; 0 = no split")
    p.add_argument("--save-every", type=int, default=100, help="optimizer steps between checkpoints")
    p.add_argument("--max-steps", type=int, default=None, help="stop after N steps (resumable)")
    p.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in OUT/ckpt")
    args = p.parse_args(argv)
    print(f"sft.py: answer mode {args.answer_mode} (validation)" if args.val_tasks else "sft.py: rows as given (--data)")

    if args.max_answer_tokens is not None and args.max_answer_tokens < 1:
        raise ValueError(f"--max-answer-tokens must be >= 1, got {args.max_answer_tokens}")
    dist.init()               # several processes: before the model lands on this rank's GPU
    deadline = rundir.Deadline()      # $CHORUS_DEADLINE, refused (one line) before anything loads
    rows = [r for path in args.data for r in load_rows(path)]
    if args.limit:
        rows = rows[:args.limit]
    # validation files: read (and refused) before the model loads
    if args.val_every is not None and args.val_every < 1:
        raise ValueError(f"--val-every must be >= 1, got {args.val_every}")
    if args.val_n < 1 or args.val_max_new_tokens < 1:
        raise ValueError("--val-n and --val-max-new-tokens must be >= 1")
    for opt, path in (("--val-data", args.val_data), ("--val-tasks", args.val_tasks)):
        if path and not Path(path).is_file():
            raise ValueError(f"{opt} {path}: no such file")
    val_rows = load_rows(args.val_data) if args.val_data else None
    if args.val_data and not val_rows:
        raise ValueError(f"{args.val_data}: --val-data has no rows")
    val_tasks = sim.load_tasks(args.val_tasks) if args.val_tasks else None
    if args.val_tasks and not val_tasks:
        raise ValueError(f"{args.val_tasks}: --val-tasks has no tasks")
    val_options = {"n": args.val_n, "max_new_tokens": args.val_max_new_tokens, "sim_workers": args.sim_workers,
                   "target_mode": args.target_mode, "answer_mode": args.answer_mode,
                   "batch_size": args.gen_batch_size} if val_tasks else None
    rundir.lock_run(args.out)         # one writer per folder: a second sft.py on it is refused (one line)
    model, tok = common.load_model(args.model, quant=args.quant)
    extra = {"model": args.model, "data": args.data, "limit": args.limit}
    if val_rows or val_tasks:
        extra.update(val_data=args.val_data, val_tasks=args.val_tasks)
    result = train_sft(model, tok, rows, args.out, epochs=args.epochs, lr=args.lr, batch_size=args.batch_size,
                       grad_accum=args.grad_accum, max_len=args.max_len, warmup_ratio=args.warmup_ratio,
                       seed=args.seed, init_adapter=args.init_adapter, resume=args.resume,
                       lora_r=args.lora_r, lora_alpha=args.lora_alpha, lora_dropout=args.lora_dropout,
                       weight_decay=args.weight_decay, max_grad_norm=args.max_grad_norm,
                       group_by_length=args.group_by_length, gradient_checkpointing=args.gradient_checkpointing,
                       save_every=args.save_every, stop_after_steps=args.max_steps, extra_config=extra,
                       max_tokens_per_micro=args.max_tokens_per_micro, val_rows=val_rows, val_tasks=val_tasks,
                       val_every=args.val_every, val_options=val_options, deadline=deadline,
                       max_answer_tokens=args.max_answer_tokens)
    if result["outcome"]["deadline_stop"]:
        dist.barrier()        # no rank exits before rank 0 has written (a launcher would kill it)
        return rundir.EXIT_DEADLINE
    return 0 if result["outcome"]["finished"] or args.max_steps else 1


if __name__ == "__main__":
    raise SystemExit(rundir.cli("sft.py", main))
