"""Does a merged adapter still speak the answer format? Teacher-forced NLL of fixed reference answers.

    python bench/merge_nll.py --rows runs/small/data/stage0.jsonl --limit 32 \
        --adapters rl2=runs/small/rl2/adapter soup=runs/small/merge/soup ... --out results/small/merge_nll.json

For each adapter (and the base, named `base`), the mean negative log-likelihood per answer token of the
last assistant turn of the first --limit chat rows (the SFT data format: every expert was trained on it),
loss masked exactly as sft.py trains. A cheap CPU check of a merge before a GPU evaluation: a merge whose
NLL sits far above every expert's has lost the format (the small run's DARE-TIES and DELLA, results/small_run.md).
Rows the experts were trained on score near 0 for them: the check is about the format, not generalisation.

--norms-vs NAME adds, per adapter, the task vectors' size and direction against adapter NAME's, module by
module (||delta|| / ||delta_NAME|| and their cosine; mean, min, max over modules); --no-nll skips the NLL.
"""
import argparse
import json
import math
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import common  # noqa: E402
import merge  # noqa: E402
import sft  # noqa: E402


def mean_nll(model, examples, pad_id, batch_size):
    total, count = 0.0, 0
    with torch.no_grad():
        for s in range(0, len(examples), batch_size):
            batch = {k: v.to(common._model_device(model)) for k, v in sft.collate(examples[s:s + batch_size], pad_id).items()}
            loss, n = sft.target_loss_sum(model, batch)
            total, count = total + loss.item(), count + n
    return total / max(count, 1), count


def delta_stats(pairs, ref):
    """{name: {norm_ratio: {mean, min, max}, cosine: {...}}} of each adapter's per-module task vector
    s * B @ A against adapter `ref`'s (from the folders, no model needed)."""
    ads = {name: merge.read_adapter(path) for name, path in pairs}
    merge.check_compatible(list(ads.values()))
    stats = {name: {"norm_ratio": [], "cosine": []} for name in ads}
    for stem in sorted(ads[ref]["shapes"]):
        deltas = {}
        for name, ad in ads.items():
            A, B = merge.load_factors(ad, stem, "cpu")
            deltas[name] = (B @ A).flatten()
        r = deltas[ref]
        for name, d in deltas.items():
            stats[name]["norm_ratio"].append((d.norm() / r.norm()).item())
            stats[name]["cosine"].append(torch.nn.functional.cosine_similarity(d, r, dim=0).item())
    summary = lambda xs: {"mean": sum(xs) / len(xs), "min": min(xs), "max": max(xs)}
    return {name: {k: summary(v) for k, v in st.items()} for name, st in stats.items()}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="base model (HF id, folder or GGUF; default: the embedded SmolLM2)")
    p.add_argument("--rows", default=None, help="chat JSONL (SFT format) whose last assistant turns are scored")
    p.add_argument("--limit", type=int, default=32, help="first N rows")
    p.add_argument("--max-len", type=int, default=4096)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--adapters", nargs="+", default=[], metavar="NAME=DIR", help="peft adapter folders to score")
    p.add_argument("--norms-vs", default=None, metavar="NAME", help="also compare task vectors with adapter NAME's")
    p.add_argument("--no-nll", action="store_true", help="skip the NLL (no model is loaded)")
    p.add_argument("--out", default=None, help="JSON output")
    args = p.parse_args(argv)
    pairs = []
    for a in args.adapters:
        name, sep, path = a.partition("=")
        if not sep or not os.path.isfile(os.path.join(path, "adapter_config.json")):
            sys.exit(f"merge_nll: --adapters wants NAME=DIR with a peft adapter folder, got {a!r}")
        if name == "base" or name in dict(pairs):
            sys.exit(f"merge_nll: adapter name {name!r} is reserved or repeated")
        pairs.append((name, path))
    if args.norms_vs is not None and args.norms_vs not in dict(pairs):
        sys.exit(f"merge_nll: --norms-vs {args.norms_vs!r} is not one of the --adapters names")
    out = {"command": "python bench/merge_nll.py " + " ".join(argv if argv is not None else sys.argv[1:])}
    if args.norms_vs is not None:
        out["norms_vs"] = args.norms_vs
        out["norms"] = delta_stats(pairs, args.norms_vs)
        for name, st in out["norms"].items():
            print(f"{name:24s} |delta|/|{args.norms_vs}| {st['norm_ratio']['mean']:.3f} "
                  f"({st['norm_ratio']['min']:.3f}-{st['norm_ratio']['max']:.3f})  cosine {st['cosine']['mean']:.3f} "
                  f"({st['cosine']['min']:.3f}-{st['cosine']['max']:.3f})", flush=True)
    if args.no_nll:
        return _write(out, args.out)
    if not args.rows:
        sys.exit("merge_nll: --rows is needed for the NLL (or pass --no-nll)")
    model, tok = common.load_model(args.model)
    rows = sft.load_rows(args.rows)[:args.limit]
    examples = [e for e in (sft.encode_row(tok, r["messages"], args.max_len) for r in rows) if e is not None]
    if not examples:
        sys.exit(f"merge_nll: no row of {args.rows} fits --max-len {args.max_len}")
    results = {}
    t0 = time.time()
    nll, n = mean_nll(model, examples, tok.pad_token_id, args.batch_size)
    results["base"] = {"nll": nll, "ppl": math.exp(nll), "tokens": n}
    print(f"{'base':24s} nll {nll:.4f}  ppl {math.exp(nll):9.3f}  ({n} tokens)", flush=True)
    for i, (name, path) in enumerate(pairs):
        model = common.load_adapter(model, path, adapter_name=f"a{i}")    # loaded and made active
        nll, n = mean_nll(model, examples, tok.pad_token_id, args.batch_size)
        results[name] = {"nll": nll, "ppl": math.exp(nll), "tokens": n, "adapter": path}
        print(f"{name:24s} nll {nll:.4f}  ppl {math.exp(nll):9.3f}", flush=True)
    out.update(rows=args.rows, limit=args.limit, rows_scored=len(examples), seconds=round(time.time() - t0, 1),
               results=results)
    return _write(out, args.out)


def _write(out, path):
    if path:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "w") as f:
            json.dump(out, f, indent=1)
    return out


if __name__ == "__main__":
    main()
