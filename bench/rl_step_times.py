"""Step-time summary of rl.py / distill.py runs from their log.jsonl: the median (and min/max) of every
per-step time field over a window of steps (default 2-11: step 1 pays packing, graph capture and warm-up).

    python bench/rl_step_times.py --run before=OLD_RUN/log.jsonl --run after=RUN/log.jsonl \
        --run opd=OPD_RUN/log.jsonl --steps 2-11 --out results/rl_throughput.json

A step's wall time is t_rollout + t_train (+ t_ckpt where logged). Every other `t_*` field of the log (the
breakdown: generation per round, prefill / decode, scoring wait, log-prob recomputation, backward, optimizer
step, checkpoint) is summarised the same way. The JSON has one object per --run, plus `rl_step_s_median` and
`opd_step_s_median` taken from the runs named `after` and `opd` when they are given. No GPU needed: this
only reads logs (results/rl_throughput.md names the runs and their commands).
"""
import argparse
import json
import statistics
import sys
from pathlib import Path


def read_log(path):
    rows = []
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise SystemExit(f"rl_step_times.py: {path}:{n}: malformed JSON ({e.msg})") from None
    return rows


def step_time(row):
    return row.get("t_rollout", 0.0) + row.get("t_train", 0.0) + row.get("t_ckpt", 0.0)


def summarise(rows, first, last):
    """{field: {median, min, max}} over the rows with first <= step <= last, step_s included."""
    window = [r for r in rows if first <= r.get("step", 0) <= last and not r.get("val")]   # no validation rows
    if not window:
        return {"steps": 0}
    fields = sorted({k for r in window for k in r if k.startswith("t_") and isinstance(r[k], (int, float))})
    out = {"steps": len(window), "step_range": [window[0]["step"], window[-1]["step"]]}
    for name, values in [("step_s", [step_time(r) for r in window])] + \
            [(f, [r[f] for r in window if isinstance(r.get(f), (int, float))]) for f in fields]:
        out[name] = {"median": round(statistics.median(values), 3), "min": round(min(values), 3),
                     "max": round(max(values), 3)}
    for k in ("completions/mean_length", "num_tokens", "groups", "skipped"):
        vals = [r[k] for r in window if isinstance(r.get(k), (int, float))]
        if vals:
            out[k] = round(statistics.mean(vals), 2)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--run", action="append", required=True, metavar="NAME=LOG", help="a run's log.jsonl")
    ap.add_argument("--steps", default="2-11", help="window of steps, inclusive (default 2-11)")
    ap.add_argument("--out", help="JSON file to write (default: print only)")
    args = ap.parse_args(argv)
    first, last = (int(x) for x in args.steps.split("-"))
    result = {"steps": [first, last], "runs": {}}
    for spec in args.run:
        name, sep, path = spec.partition("=")
        if not sep or not Path(path).is_file():
            raise SystemExit(f"rl_step_times.py: --run {spec}: expected NAME=LOG with an existing log.jsonl")
        result["runs"][name] = summarise(read_log(path), first, last)
        result["runs"][name]["log"] = path
    for key, name in (("rl_step_s_median", "after"), ("opd_step_s_median", "opd")):
        if name in result["runs"] and "step_s" in result["runs"][name]:
            result[key] = result["runs"][name]["step_s"]["median"]
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
