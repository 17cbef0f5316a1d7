"""Contamination guard: drops training designs whose RTL is too close to an evaluation design's.

Both measures work on RTL token sequences (comments removed, lower-case alphanumeric runs): 5-gram overlap
F1 and ROUGE-L F1 (longest common subsequence). A training task at or above the threshold on either measure
against any evaluation task is dropped, so evaluation scores do not reward designs seen in training.

API: contamination_filter(train_tasks, eval_task_files, threshold=0.5, n=5) -> (kept, dropped);
     rtl_tokens(text); lcs_length(a, b); rouge_l_f1(a, b); ngram_f1(a_grams, b_grams).
"""
import json
import re
from collections import Counter


def rtl_tokens(text):
    """Tokens for the similarity measures: comments removed, then the rouge_score default
    tokenization (lower-case alphanumeric runs). Punctuation is dropped on purpose: Verilog's
    `;`, `(`, `<=` would make any two designs look alike (ROUGE-L about 0.5 on raw tokens)."""
    text = re.sub(r"//[^\n]*|/\*.*?\*/", " ", text, flags=re.S)
    return re.findall(r"[a-z0-9]+", text.lower())


def lcs_length(a, b):
    """Length of the longest common subsequence of two token lists (bit-parallel, Hyyro 2004):
    one big-int add/or per token of `a`, so about a millisecond for two 1000-token designs."""
    if not a or not b:
        return 0
    masks = {}
    for i, t in enumerate(b):
        masks[t] = masks.get(t, 0) | (1 << i)
    full = (1 << len(b)) - 1
    v = full
    for t in a:
        u = v & masks.get(t, 0)
        v = ((v + u) | (v - u)) & full
    return len(b) - bin(v).count("1")


def rouge_l_f1(a, b):
    """ROUGE-L F1 = 2 * LCS / (|a| + |b|) (precision and recall are LCS/|a| and LCS/|b|)."""
    return 2.0 * lcs_length(a, b) / (len(a) + len(b)) if a and b else 0.0


def ngram_f1(a_grams, b_grams):
    """Overlap of two n-gram sets: 2 |A & B| / (|A| + |B|)."""
    if not a_grams or not b_grams:
        return 0.0
    return 2.0 * len(a_grams & b_grams) / (len(a_grams) + len(b_grams))


def _ngrams(toks, n=5):
    return {tuple(toks[i:i + n]) for i in range(len(toks) - n + 1)}


def _task_rtl(task):
    return "\n".join(f["content"] for f in task.get("rtl_files", []))


def contamination_filter(train_tasks, eval_task_files, threshold=0.5, n=5):
    """Drop training tasks whose RTL is too similar to any evaluation task's RTL: 5-gram overlap F1
    >= threshold or ROUGE-L F1 >= threshold. ROUGE-L runs only on pairs that pass a sound upper
    bound (LCS <= bag-of-tokens overlap, so F1 <= 2 * |bag(a) & bag(b)| / (|a| + |b|)).
    eval_task_files: JSONL paths (or already-loaded lists of task dicts).
    Returns (kept, dropped_report), report rows {id, eval_id, ngram_f1, rouge_l_f1}."""
    evals = []
    for src in eval_task_files:
        rows = src if isinstance(src, list) else [json.loads(line) for line in open(src) if line.strip()]
        for r in rows:
            toks = rtl_tokens(_task_rtl(r))
            evals.append((r.get("id", "?"), toks, Counter(toks), _ngrams(toks, n)))
    kept, dropped = [], []
    for t in train_tasks:
        toks = rtl_tokens(_task_rtl(t))
        bag, grams = Counter(toks), _ngrams(toks, n)
        worst = None
        for eid, etoks, ebag, egrams in evals:
            denom = len(toks) + len(etoks)
            if not denom:
                continue
            ng = ngram_f1(grams, egrams)
            rl = 0.0
            if ng < threshold and 2.0 * sum((bag & ebag).values()) / denom >= threshold:
                rl = rouge_l_f1(toks, etoks)
            if ng >= threshold or rl >= threshold:
                worst = {"id": t["id"], "eval_id": eid, "ngram_f1": round(ng, 3), "rouge_l_f1": round(rl, 3)}
                break
        if worst:
            dropped.append(worst)
        else:
            kept.append(t)
    return kept, dropped
