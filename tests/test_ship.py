"""The run state's round trip between device sessions (bench/gpu/): ship_list.py chooses what a session ships,
small2_run.sh packs it (PART=ship, and at the end of each PART=stage call) and unpacks the next session's bundle
(PART=stash / restore), unship.sh puts it in results/small2/state. Run in a copy of the scripts, with HOME and OUT
in tmp_path, as on the device."""
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench" / "gpu"))
import ship_list  # noqa: E402


def _put(path, text="x"):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _adapter(folder):
    _put(folder / "adapter_config.json", "{}")
    _put(folder / "adapter_model.safetensors", "weights")


def _run_folder(run):
    """sft0 done (its pick: validated step 2), sft1 cut (its best so far: validated step 1), rl0 cut after two
    checkpoints (and a deadline marker), merge done, val and data2 done (no adapter), data3 cut, the data stage."""
    _put(run / "data" / "stage0.jsonl")
    s = run / "sft0"
    _adapter(s / "adapter")
    _adapter(s / "val_ckpt" / "step_000001" / "adapter")
    _adapter(s / "val_ckpt" / "step_000002" / "adapter")
    _put(s / "result.json", json.dumps({"outcome": {"val_best_adapter": "val_ckpt/step_000002/adapter"},
                                        "config": {"data": "/root" + "/stage/runs/s2st/data/stage0.jsonl",
                                                   "out": "/root" + "/out/x"}}))
    for f in ("done.json", "log.jsonl", "curves.png", "stdout.log"):
        _put(s / f)
    _put(s / "ckpt" / "step_000002" / "meta.json")
    _put(run / "sft1" / "log.jsonl")
    _put(run / "sft1" / "result.json", json.dumps({"outcome": {"val_best_adapter": "val_ckpt/step_000001/adapter",
                                                                "steps_done": 2}}))    # a deadline stop at step 2
    for step in ("step_000001", "step_000002"):
        _put(run / "sft1" / "ckpt" / step / "meta.json", json.dumps({"step": int(step[-1])}))
        _adapter(run / "sft1" / "ckpt" / step / "adapter")
        _put(run / "sft1" / "ckpt" / step / "optimizer.pt")
    for step in ("step_000000", "step_000001", "step_000002", "step_000003"):   # 3: validated, then killed
        _adapter(run / "sft1" / "val_ckpt" / step / "adapter")
    r = run / "rl0"
    for step in ("step_000010", "step_000020"):
        _adapter(r / "ckpt" / step / "adapter")
        _put(r / "ckpt" / step / "meta.json", json.dumps({"step": int(step[-2:])}))
        _put(r / "ckpt" / step / "optimizer.pt")
    _adapter(r / "best" / "adapter")
    _put(r / "best" / "val.json")
    _put(r / "log.jsonl")
    _put(r / "deadline_stop.json")          # left by a deadline stop that a cut kept chorus_mini from removing
    m = run / "merge"
    _adapter(m / "tune" / "soup_lam1")
    for f in ("done.json", "merge_report.json", "tune_eval/metrics.json", "tune_eval/done.json"):
        _put(m / "tune" / "soup_lam1" / f)
    _adapter(m / "soup")
    _put(m / "soup" / "choice.json")
    _put(m / "done.json")
    for f in ("eval/rl0/metrics.json", "eval/rl0/result.json", "eval/rl0/done.json", "eval/rl0/samples.jsonl",
              "eval/rl1/metrics.json", "eval/rl1/samples.jsonl", "eval/stdout.log", "eval_syn/rl0/metrics.json"):
        _put(run / f)                           # eval cut after rl0 (rl1 unfinished), eval_syn begun
    for f in ("val/rl0/metrics.json", "val/rl0/samples.jsonl", "val/rl0/done.json", "val/done.json", "data2/stage2.jsonl", "data2/done.json", "data2/stdout.log",
              "data2/stage0.jsonl", "data2/stage1.jsonl", "data2/result.json", "data3/stage2.jsonl",
              "report/report.md", "report/report.json", "report/done.json", "report/stdout.log"):
        _put(run / f)


SHIPPED = {
    "s2st/sft0/result.json", "s2st/sft0/done.json", "s2st/sft0/log.jsonl", "s2st/sft0/curves.png",
    "s2st/sft0/val_ckpt/step_000002/adapter/adapter_config.json",
    "s2st/sft0/val_ckpt/step_000002/adapter/adapter_model.safetensors",
    "s2st/rl0/log.jsonl", "s2st/rl0/best/val.json",
    "s2st/rl0/ckpt/step_000020/meta.json", "s2st/rl0/ckpt/step_000020/adapter/adapter_config.json",
    "s2st/rl0/ckpt/step_000020/adapter/adapter_model.safetensors",
    "s2st/merge/tune/soup_lam1/tune_eval/metrics.json", "s2st/merge/tune/soup_lam1/tune_eval/done.json",
    "s2st/val/rl0/metrics.json", "s2st/val/rl0/done.json", "s2st/val/done.json",
    "s2st/eval/rl0/metrics.json", "s2st/eval/rl0/result.json", "s2st/eval/rl0/done.json",
    "s2st/sft1/log.jsonl", "s2st/sft1/result.json", "s2st/sft1/ckpt/step_000002/meta.json",
    "s2st/sft1/ckpt/step_000002/adapter/adapter_config.json",
    "s2st/sft1/ckpt/step_000002/adapter/adapter_model.safetensors",
    "s2st/sft1/val_ckpt/step_000001/adapter/adapter_config.json",
    "s2st/sft1/val_ckpt/step_000001/adapter/adapter_model.safetensors",
    "s2st/data2/stage2.jsonl", "s2st/data2/done.json", "s2st/data2/result.json",
    "s2st/report/report.md", "s2st/report/report.json", "s2st/report/done.json"}


def test_ship_list_keeps_the_handed_on_adapters_and_handoffs_only(tmp_path, monkeypatch):
    """A cut SFT or RL stage ships its newest checkpoint without optimizer.pt (SFT: and its best validated adapter so
    far), the merge stage its tuning scores only (the merges are recomputed), stages without adapters their small
    files (the report stage also its report.md), a done device-built data stage its stage2.jsonl and small files (not stages 0-1, data/'s rows, nor its
    stdout), data/ and a cut data stage nothing. An evaluation stage ships each finished model's small files but
    samples.jsonl, also when the stage is cut (eval: rl0 finished, rl1 not; eval_syn: none finished). A cut SFT stage's result.json names its best only if written at the
    newest checkpoint (a deadline stop); after a kill every validated adapter up to the checkpoint goes."""
    run = tmp_path / "s2st"
    _run_folder(run)
    monkeypatch.chdir(tmp_path)
    assert {p.as_posix() for p in ship_list.ship_list("s2st")} == SHIPPED
    stamp = tmp_path / "stamp"
    stamp.write_text("")
    old = stamp.stat().st_mtime - 100
    for p in run.rglob("*"):
        os.utime(p, (old, old))                         # as restored from the bundle
    _put(run / "rl0" / "log.jsonl", "one more step")    # only rl0 ran in this session
    assert {p.as_posix() for p in ship_list.ship_list("s2st", since=stamp)} == {
        p for p in SHIPPED if p.startswith("s2st/rl0/")}
    # killed after a deadline stop at step 1 had written result.json: every validated adapter up to the checkpoint
    _put(run / "sft1" / "result.json", json.dumps({"outcome": {"val_best_adapter": "val_ckpt/step_000000/adapter",
                                                                "steps_done": 1}}))
    every = {f"s2st/sft1/val_ckpt/step_00000{k}/adapter/{f}" for k in (0, 1, 2)
             for f in ("adapter_config.json", "adapter_model.safetensors")}
    assert {p.as_posix() for p in ship_list.ship_list("s2st")} == SHIPPED | every
    (run / "sft1" / "result.json").unlink()             # killed before any result: the same
    assert {p.as_posix() for p in ship_list.ship_list("s2st")} == SHIPPED - {"s2st/sft1/result.json"} | every
    (run / "sft0" / "val_ckpt" / "step_000002" / "adapter" / "adapter_model.safetensors").unlink()
    with pytest.raises(SystemExit, match="holds no adapter"):
        ship_list.ship_list("s2st")


def _repo_copy(tmp_path):
    repo = tmp_path / "repo"
    for f in ("bench/gpu/small2_run.sh", "bench/gpu/ship_list.py", "bench/gpu/unship.sh", "bench/gpu/lean_tree.sh",
              "bench/offline_setup.sh", "bench/gpu/publish_adapters.sh"):
        (repo / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / f, repo / f)
    return repo


def _sh(repo, env, *args):
    p = subprocess.run(["bash", *args], cwd=repo, env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    return p.stdout


def test_ship_then_unship_then_bundle_restores_the_run(tmp_path):
    repo = _repo_copy(tmp_path)
    home, out = tmp_path / "home", tmp_path / "out"
    out.mkdir()
    env = {**os.environ, "HOME": str(home), "OUT": str(out)}
    _run_folder(home / "stage" / "runs" / "s2st")
    _sh(repo, {**env, "PART": "ship"}, "bench/gpu/small2_run.sh")
    assert (out / "ship.sha256").is_file() and list(out.glob("ship.tgz.part*"))
    state = repo / "results" / "small2" / "state" / "s2st"
    _put(state / "sft2" / "done.json")                  # a stage of an earlier session, not in this ship: kept
    _put(state / "rl0" / "ckpt" / "step_000005" / "meta.json")   # rl0's older handoff: replaced
    _sh(repo, env, "bench/gpu/unship.sh", str(out))
    data2 = {p for p in SHIPPED if p.startswith("s2st/data2/")}
    assert {p.relative_to(state.parent).as_posix() for p in state.rglob("*") if p.is_file()} == (
        SHIPPED - data2 | {"s2st/sft2/done.json"})
    runs = repo / "runs"          # data2 stays out of results/, its sums do not (runs/: the device's, in this test)
    assert {p.relative_to(runs).as_posix() for p in (runs / "s2st" / "data2").rglob("*")} == data2
    assert (state.parent / "data2.sha256").read_text() == (
        f"{hashlib.sha256(b'x').hexdigest()}  data2/stage2.jsonl\n")
    assert json.loads((state / "sft0" / "result.json").read_text())["config"] == {
        "data": "~/stage/runs/s2st/data/stage0.jsonl", "out": "$OUT/x"}

    # the next session: a bundle of the state (+ data, wheels, GGUF) in two parts carried by two calls
    src = tmp_path / "bundle"
    shutil.copytree(state, src / "runs" / "s2st")
    _put(src / "runs" / "s2st" / "data" / "stage0.jsonl", "rows")
    _put(src / "smollm2.gguf", "gguf")
    with tarfile.open(tmp_path / "bundle.tgz", "w:gz") as t:
        for name in ("runs", "smollm2.gguf"):
            t.add(src / name, arcname=name)
    blob = (tmp_path / "bundle.tgz").read_bytes()
    half = len(blob) // 2
    for k, part in ((1, blob[:half]), (2, blob[half:])):
        (repo / ".stage" / f"r{k}").mkdir(parents=True)
        (repo / ".stage" / f"r{k}" / f"bundle.part0{k - 1}").write_bytes(part)
    (repo / ".stage" / "r2" / "bundle.sha256").write_text(f"{hashlib.sha256(blob).hexdigest()}  bundle.tgz\n")
    home2 = tmp_path / "home2"
    env2 = {**env, "HOME": str(home2)}
    hidden = tmp_path / "r2"
    shutil.move(repo / ".stage" / "r2", hidden)             # the first call carries r1 only
    _sh(repo, {**env2, "PART": "stash"}, "bench/gpu/small2_run.sh")
    shutil.rmtree(repo / ".stage" / "r1")
    shutil.move(hidden, repo / ".stage" / "r2")
    _sh(repo, {**env2, "PART": "stash"}, "bench/gpu/small2_run.sh")
    _sh(repo, {**env2, "PART": "restore"}, "bench/gpu/small2_run.sh")
    runs = home2 / "stage" / "runs" / "s2st"
    assert (runs / "data" / "stage0.jsonl").read_text() == "rows"
    assert (runs / "rl0" / "ckpt" / "step_000020" / "meta.json").is_file()
    assert (runs / "sft0" / "val_ckpt" / "step_000002" / "adapter" / "adapter_model.safetensors").is_file()
    (home2 / "stage" / "parts" / "bundle.part00").write_bytes(b"corrupt")    # a bad part is refused
    p = subprocess.run(["bash", "bench/gpu/small2_run.sh"], cwd=repo, env={**env2, "PART": "restore"},
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 1 and "missing or corrupt" in p.stdout


def test_lean_tree_hides_large_committed_results_and_restores_only_what_is_missing(tmp_path):
    repo = _repo_copy(tmp_path)
    git = lambda *a: subprocess.run(["git", *a], cwd=repo, check=True, capture_output=True, text=True).stdout
    git("init", "-q")
    git("config", "user.email", "t@t")
    git("config", "user.name", "t")
    (repo / ".gitignore").write_text("/.stage/\n")
    big = repo / "results" / "big.bin"
    _put(big, "b" * 1_500_000)
    _put(repo / "results" / "small.json", "{}")
    _put(repo / "results" / "other.bin", "o" * 1_200_000)
    git("add", "-A")
    git("commit", "-qm", "x")
    env = dict(os.environ)
    full = int(_sh(repo, env, "bench/gpu/lean_tree.sh", "size"))
    (repo / "results" / "other.bin").write_text("c" * 1_300_000)                     # changed, not committed
    p = subprocess.run(["bash", "bench/gpu/lean_tree.sh", "hide"], cwd=repo, capture_output=True, text=True)
    assert p.returncode == 1 and "uncommitted" in p.stdout and big.exists()          # nothing is touched
    git("checkout", "--", "results/other.bin")
    _sh(repo, env, "bench/gpu/lean_tree.sh", "hide")
    assert not big.exists() and (repo / "results" / "small.json").exists()
    assert int(_sh(repo, env, "bench/gpu/lean_tree.sh", "size")) == full - 2_700_000
    _sh(repo, env, "bench/gpu/lean_tree.sh", "hide", "0")                              # every file under results/
    assert not (repo / "results" / "small.json").exists()
    (repo / "results" / "other.bin").write_text("a newer file at the same path")     # e.g. unship.sh's
    _sh(repo, env, "bench/gpu/lean_tree.sh", "restore")
    assert big.read_text() == "b" * 1_500_000 and (repo / "results" / "other.bin").read_text().startswith("a newer")
    assert (repo / "results" / "small.json").read_text() == "{}"
    assert not (repo / ".stage" / "hidden.txt").exists()


def test_the_bundle_takes_the_committed_state_although_lean_tree_hid_its_adapters(tmp_path):
    """pack_stage.sh run after lean_tree.sh hide (downloads pre-filled in .stage/dl): the bundle's parts fit a call
    beside the lean tree, and joined they hold the data, the GGUF and the state's adapters from HEAD."""
    repo = _repo_copy(tmp_path)
    shutil.copy(ROOT / "bench/gpu/pack_stage.sh", repo / "bench/gpu/pack_stage.sh")
    git = lambda *a: subprocess.run(["git", *a], cwd=repo, check=True, capture_output=True, text=True).stdout
    git("init", "-q")
    git("config", "user.email", "t@t")
    git("config", "user.name", "t")
    (repo / ".gitignore").write_text("/.stage/\n/runs/\n")
    state = repo / "results" / "small2" / "state" / "s2st" / "sft0"
    _put(state / "done.json")
    _put(state / "adapter" / "adapter_config.json", "{}")
    weights = os.urandom(1_200_000)
    (state / "adapter" / "adapter_model.safetensors").write_bytes(weights)
    git("add", "-A")
    git("commit", "-qm", "state")
    dl = repo / ".stage" / "dl"
    for f in ("wheels/a.whl", "debs/b.deb", "done"):
        _put(dl / f)
    (dl / "smollm2.gguf").write_bytes(os.urandom(300_000))
    _put(tmp_path / "shared" / "data" / "dev_tasks.jsonl", "{}\n")
    _put(repo / "runs" / "s2st" / "data" / "stage0.jsonl", "rows\n")
    env = dict(os.environ)
    _sh(repo, env, "bench/gpu/lean_tree.sh", "hide")
    assert not (state / "adapter" / "adapter_model.safetensors").exists()
    out = _sh(repo, env, "bench/gpu/pack_stage.sh", "run")
    assert "wrote results/small2/state/data.sha256" in out
    parts = sorted(repo.glob(".stage/r*/bundle.part*"))
    tree = int(_sh(repo, env, "bench/gpu/lean_tree.sh", "size"))
    assert parts and all(p.stat().st_size + tree < 64 * 2 ** 20 for p in parts)
    blob = b"".join(p.read_bytes() for p in parts)
    want = (sorted(repo.glob(".stage/r*/bundle.sha256"))[-1]).read_text().split()[0]
    assert hashlib.sha256(blob).hexdigest() == want
    (tmp_path / "b.tgz").write_bytes(blob)
    with tarfile.open(tmp_path / "b.tgz") as t:
        names = set(t.getnames())
        assert {"smollm2.gguf", "runs/dev_tasks.jsonl", "runs/s2st/data/stage0.jsonl", "wheels/a.whl",
                "runs/s2st/sft0/adapter/adapter_model.safetensors"} <= names
        got = t.extractfile("runs/s2st/sft0/adapter/adapter_model.safetensors").read()
    assert got == weights
    reference = (repo / "results/small2/state/data.sha256").read_text()
    _put(repo / "runs" / "s2st" / "data" / "stage0.jsonl", "other rows\n")      # a rebuilt data stage that differs
    env.pop("DATA_DRIFT_OK", None)
    p = subprocess.run(["bash", "bench/gpu/pack_stage.sh", "run"], cwd=repo, env=env, capture_output=True, text=True)
    assert p.returncode == 1 and "differs" in p.stdout and "data/stage0.jsonl" in p.stdout
    assert not (repo / "results/small2/state/data_drift.txt").exists()
    out = _sh(repo, dict(env, DATA_DRIFT_OK="1"), "bench/gpu/pack_stage.sh", "run")    # accepted, and recorded
    assert "drift accepted" in out
    drift = (repo / "results/small2/state/data_drift.txt").read_text()
    assert drift.count("data/stage0.jsonl") == 3 and "< " in drift and "> " in drift and "data/stage0.jsonl 1;" in drift
    git("add", "results/small2/state/data.sha256", "results/small2/state/data_drift.txt")   # (the adapter is hidden)
    git("commit", "-qm", "sums")
    _sh(repo, env, "bench/gpu/lean_tree.sh", "restore")
    _sh(repo, env, "bench/gpu/lean_tree.sh", "hide", "0")          # all of results/, the committed sums too
    assert not (repo / "results/small2/state/data.sha256").exists()
    p = subprocess.run(["bash", "bench/gpu/pack_stage.sh", "run"], cwd=repo, env=env, capture_output=True, text=True)
    assert p.returncode == 1 and "differs" in p.stdout               # compared with HEAD's sums, not new ones
    assert (repo / "results/small2/state/data.sha256").read_text() == reference      # the run's reference is kept
    _sh(repo, dict(env, DATA_DRIFT_OK="1"), "bench/gpu/pack_stage.sh", "run")      # the hidden record grows
    assert (repo / "results/small2/state/data_drift.txt").read_text().startswith(drift)
    assert (repo / "results/small2/state/data_drift.txt").read_text().count("data/stage0.jsonl") == 6

    # data2, a device build unship.sh kept in runs/, goes in while sft2 is not done, and only as its sums say
    def bundled(**extra):
        _sh(repo, dict(env, DATA_DRIFT_OK="1", **extra), "bench/gpu/pack_stage.sh", "run")
        (tmp_path / "b.tgz").write_bytes(b"".join(p.read_bytes() for p in sorted(repo.glob(".stage/r*/bundle.part*"))))
        with tarfile.open(tmp_path / "b.tgz") as t:
            return {m.name for m in t.getmembers() if m.isfile() and m.name.startswith("runs/s2st/data2/")}
    _sh(repo, env, "bench/gpu/lean_tree.sh", "restore")
    _put(repo / "runs" / "s2st" / "data2" / "stage2.jsonl", "device rows\n")
    _put(repo / "runs" / "s2st" / "data2" / "done.json", "{}")
    (repo / "results/small2/state/data2.sha256").write_text(
        f"{hashlib.sha256(b'device rows' + bytes([10])).hexdigest()}  data2/stage2.jsonl\n")
    _put(state.parent / "sft2" / "log.jsonl", "{}")                    # sft2 cut, checkpointed
    _put(state.parent / "sft2" / "ckpt" / "step_000003" / "meta.json", '{"step": 3}')
    _adapter(state.parent / "sft2" / "ckpt" / "step_000003" / "adapter")
    git("add", "-A", "results")
    git("commit", "-qm", "data2 sums, sft2 cut")
    _sh(repo, env, "bench/gpu/lean_tree.sh", "hide", "0")
    assert bundled() == {"runs/s2st/data2/stage2.jsonl", "runs/s2st/data2/done.json"}
    shutil.move(repo / "runs" / "s2st" / "data2", tmp_path / "data2")          # the box lost it: refused
    p = subprocess.run(["bash", "bench/gpu/pack_stage.sh", "run"], cwd=repo, env=dict(env, DATA_DRIFT_OK="1"),
                       capture_output=True, text=True)
    assert p.returncode == 1 and "DATA2_REBUILD_OK=1" in p.stdout
    assert bundled(DATA2_REBUILD_OK="1") == set()                              # unless accepted
    _sh(repo, env, "bench/gpu/lean_tree.sh", "restore")
    git("rm", "-rq", "results/small2/state/s2st/sft2/ckpt")                   # cut before its first checkpoint:
    git("add", "-A", "results")                                                # it starts again, on any data2
    git("commit", "-qm", "sft2 not checkpointed (and the drift records)")
    _sh(repo, env, "bench/gpu/lean_tree.sh", "hide", "0")
    assert bundled() == set()
    shutil.move(tmp_path / "data2", repo / "runs" / "s2st" / "data2")
    _put(repo / "runs" / "s2st" / "data2" / "stage2.jsonl", "other rows\n")
    p = subprocess.run(["bash", "bench/gpu/pack_stage.sh", "run"], cwd=repo, env=dict(env, DATA_DRIFT_OK="1"),
                       capture_output=True, text=True)
    assert p.returncode == 1 and "not the data2" in p.stdout
    _sh(repo, env, "bench/gpu/lean_tree.sh", "restore")
    _put(state.parent / "sft2" / "done.json", "{}")                   # sft2 done: data2 is not needed any more
    _adapter(state.parent / "sft2" / "adapter")
    git("add", "-A", "results")
    git("commit", "-qm", "sft2 done")
    assert bundled() == set()


def test_unship_keeps_a_data_stage_out_of_results(tmp_path):
    """data2's rows quote the corpus's RTL: unship.sh puts it in the ignored runs/s2st/data2 (replacing an older
    one), rows unchanged, and only the rest in results/, with the adapters' base model path written as ~/stage."""
    repo = _repo_copy(tmp_path)
    src, parts = tmp_path / "src", tmp_path / "parts"
    _put(src / "s2st" / "sft0" / "done.json", "{}")
    _put(src / "s2st" / "sft0" / "adapter" / "adapter_config.json",
         json.dumps({"base_model_name_or_path": "/root" + "/stage/cache/hf/smollm2"}))
    _put(src / "s2st" / "data2" / "stage2.jsonl", '{"path": "/root' + '/stage/x.sv"}')
    _put(repo / "runs" / "s2st" / "data2" / "old.jsonl")
    parts.mkdir()
    with tarfile.open(parts / "ship.tgz.part00", "w:gz") as t:
        t.add(src / "s2st", arcname="s2st")
    digest = hashlib.sha256((parts / "ship.tgz.part00").read_bytes()).hexdigest()
    (parts / "ship.sha256").write_text(f"{digest}  ship.tgz\n")
    _sh(repo, dict(os.environ), "bench/gpu/unship.sh", str(parts))
    state = repo / "results" / "small2" / "state" / "s2st"
    assert sorted(p.name for p in state.iterdir()) == ["sft0"]
    assert [p.name for p in (repo / "runs" / "s2st" / "data2").iterdir()] == ["stage2.jsonl"]
    assert (repo / "runs" / "s2st" / "data2" / "stage2.jsonl").read_text() == '{"path": "/root' + '/stage/x.sv"}'
    assert json.loads((state / "sft0" / "adapter" / "adapter_config.json").read_text()) == {
        "base_model_name_or_path": "~/stage/cache/hf/smollm2"}


FAKE_RUN = """#!/bin/bash
# chorus_mini.py run --profile P --out R --only STAGE [STAGE ...] --set ...: per stage one RL checkpoint (a
# handoff) and, but for a data stage (which writes no log.jsonl), a log row with the cap the process was given
if [ "$1" = chorus_mini.py ]; then
  out=$6; shift 7
  while [ "${1#--}" = "$1" ]; do
    d=$out/$1; mkdir -p $d/ckpt/step_000010/adapter
    echo '{"step": 10}' > $d/ckpt/step_000010/meta.json
    echo '{}' > $d/ckpt/step_000010/adapter/adapter_config.json
    echo weights > $d/ckpt/step_000010/adapter/adapter_model.safetensors
    row="{\\"step\\": 10, \\"cap\\": \\"$CHORUS_GPU_CAP_GIB\\", \\"deadline\\": \\"$CHORUS_DEADLINE\\"}"
    case $1 in data*) ;; *) echo "$row" > $d/log.jsonl ;; esac
    echo "$1 ran"; shift
  done
  for a in "$@"; do case $a in eval_models=*) echo "models ${a#*=}" ;; esac; done
  exit 0
fi
exec PYTHON "$@"
"""


def _stage_env(tmp_path):
    """A repo copy and a device home restored 100 s ago, with the fake chorus_mini.py run first on PATH."""
    repo = _repo_copy(tmp_path)
    home, fake = tmp_path / "home", tmp_path / "bin"
    _put(fake / "python3", FAKE_RUN.replace("PYTHON", sys.executable))
    (fake / "python3").chmod(0o755)
    (home / "stage" / "runs" / "s2st").mkdir(parents=True)
    _put(home / "stage" / "restored.stamp")
    old = (home / "stage" / "restored.stamp").stat().st_mtime - 100
    os.utime(home / "stage" / "restored.stamp", (old, old))
    return repo, {**os.environ, "HOME": str(home), "PATH": f"{fake}:{os.environ['PATH']}"}


def test_a_stage_call_with_nothing_to_ship_says_so_and_a_chain_runs_without_parallel(tmp_path):
    """data2 alone, cut: no log.jsonl to return and nothing to ship (a data stage only when done): the call returns logs.tgz
    only and says why nothing was packed. data2+rl0 without PARALLEL: one process runs both, rl0 is shipped."""
    repo, env = _stage_env(tmp_path)
    out1, out2 = tmp_path / "out1", tmp_path / "out2"
    out1.mkdir(), out2.mkdir()
    log = _sh(repo, {**env, "OUT": str(out1), "PART": "stage", "STAGES": "data2", "T": "20"}, "bench/gpu/small2_run.sh")
    assert "ship: not packed: ship_list: nothing to ship" in log
    assert [p.name for p in out1.iterdir()] == ["logs.tgz"]
    with tarfile.open(out1 / "logs.tgz") as t:
        assert t.getnames() == ["stage.log"]
    log = _sh(repo, {**env, "OUT": str(out2), "PART": "stage", "STAGES": "data2+rl0", "T": "20"}, "bench/gpu/small2_run.sh")
    assert "data2 ran\nrl0 ran" in log and "ship: parts from 0 (four at most) of 1" in log
    assert sorted(p.name for p in out2.iterdir()) == ["logs.tgz", "ship.sha256", "ship.tgz.part00"]
    with tarfile.open(out2 / "ship.tgz.part00") as t:
        assert {n.split("/")[1] for n in t.getnames()} == {"rl0"}


def test_a_parallel_stage_call_caps_each_process_and_ships_in_the_same_call(tmp_path):
    """PART=stage PARALLEL=1: each process (a+b: one process that runs a then b) sees $CHORUS_GPU_CAP_GIB = 130 /
    the process count, and the call returns its logs as one file plus the ship of what ran since the restore,
    within the device's 8 files."""
    repo, env = _stage_env(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    env["OUT"] = str(out)
    t0 = time.time()
    log = _sh(repo, {**env, "PART": "stage", "STAGES": "rl0 rl1+rl2", "PARALLEL": "1", "T": "40"},
              "bench/gpu/small2_run.sh")
    assert "== rc 0" in log and "rl2 ran" in log and "ship: parts from 0" in log
    assert sorted(p.name for p in out.iterdir()) == ["logs.tgz", "ship.sha256", "ship.tgz.part00"]
    with tarfile.open(out / "logs.tgz") as t:
        logs = {m.name: t.extractfile(m).read().decode() for m in t.getmembers()}
    assert set(logs) == {"stage.log", "stage_rl0.log", "stage_rl1+rl2.log", "rl0_log.jsonl", "rl1_log.jsonl",
                         "rl2_log.jsonl"}
    assert [json.loads(logs[f"rl{k}_log.jsonl"])["cap"] for k in range(3)] == ["65"] * 3
    deadlines = {int(json.loads(logs[f"rl{k}_log.jsonl"])["deadline"]) for k in range(3)}    # T - SLACK (25 s)
    assert len(deadlines) == 1 and int(t0) + 15 - 1 <= deadlines.pop() <= time.time() + 15
    assert "rl1 ran\nrl2 ran" in logs["stage_rl1+rl2.log"]
    with tarfile.open(out / "ship.tgz.part00") as t:
        assert sorted(t.getnames()) == sorted(f"s2st/{s}/{f}" for s in ("rl0", "rl1", "rl2") for f in (
            "log.jsonl", "ckpt/step_000010/meta.json", "ckpt/step_000010/adapter/adapter_config.json",
            "ckpt/step_000010/adapter/adapter_model.safetensors"))


def test_stage_words_with_models_evaluate_a_subset_each(tmp_path):
    """STAGES="eval@rl0,rl1 eval_syn+eval@rl2 opd+eval@base" PARALLEL=1: each process runs its stages with --set
    eval_models= its models, logs to a file named without @ and commas (a training stage may come first: it ignores
    the subset); without PARALLEL one such word does the same."""
    repo, env = _stage_env(tmp_path)
    out1, out2 = tmp_path / "out1", tmp_path / "out2"
    out1.mkdir(), out2.mkdir()
    _sh(repo, {**env, "OUT": str(out1), "PART": "stage", "STAGES": "eval@rl0,rl1 eval_syn+eval@rl2 opd+eval@base",
               "PARALLEL": "1", "T": "20", "SHIP": "0"}, "bench/gpu/small2_run.sh")
    with tarfile.open(out1 / "logs.tgz") as t:
        logs = {m.name: t.extractfile(m).read().decode() for m in t.getmembers()}
    assert logs["stage_eval_rl0_rl1.log"] == "eval ran\nmodels rl0,rl1\n"
    assert logs["stage_eval_syn+eval_rl2.log"] == "eval_syn ran\neval ran\nmodels rl2\n"
    assert logs["stage_opd+eval_base.log"] == "opd ran\neval ran\nmodels base\n"
    assert {"eval_log.jsonl", "eval_syn_log.jsonl"} <= set(logs)
    log = _sh(repo, {**env, "OUT": str(out2), "PART": "stage", "STAGES": "eval+eval_syn@merge", "T": "20",
                     "SHIP": "0", "TAIL": "5"}, "bench/gpu/small2_run.sh")
    assert "eval ran\neval_syn ran\nmodels merge" in log


def test_ship_samples_packs_only_the_evaluations_samples(tmp_path):
    """PART=ship_samples: the samples.jsonl that PART=ship leaves out (val, eval, eval_syn) of the finished models
    (eval/rl1 has none: unfinished), and nothing else."""
    repo = _repo_copy(tmp_path)
    home, out = tmp_path / "home", tmp_path / "out"
    out.mkdir()
    _run_folder(home / "stage" / "runs" / "s2st")
    _put(home / "stage" / "runs" / "s2st" / "eval_syn" / "rl2" / "done.json")   # restored: finished, no samples
    _sh(repo, {**os.environ, "HOME": str(home), "OUT": str(out), "PART": "ship_samples"}, "bench/gpu/small2_run.sh")
    with tarfile.open(out / "samples.tgz.part00") as t:
        assert sorted(t.getnames()) == ["s2st/eval/rl0/samples.jsonl", "s2st/val/rl0/samples.jsonl"]
    assert (out / "samples.sha256").is_file()


@pytest.mark.parametrize("stages,parallel,why", [
    ("rl0@rl0", "1", "subsets eval and eval_syn only"), ("val@rl0", "1", "subsets eval and eval_syn only"),
    ("eval+opd@rl0", "1", "subsets eval and eval_syn only"),
    ("eval@rl0 eval_syn@rl1", "0", "takes one word"), ("merge+eval@soup merge+eval@ties", "1", "merge in two words")])
def test_bad_stage_words_end_in_one_line_before_anything_runs(tmp_path, stages, parallel, why):
    repo, env = _stage_env(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    p = subprocess.run(["bash", "bench/gpu/small2_run.sh"], cwd=repo, capture_output=True, text=True, timeout=60,
                       env={**env, "OUT": str(out), "PART": "stage", "STAGES": stages, "PARALLEL": parallel, "T": "5"})
    assert p.returncode == 2 and why in p.stdout and not list(out.iterdir())       # nothing ran, nothing came back


def test_ship_samples_with_no_finished_evaluation_says_so_and_fails(tmp_path):
    repo = _repo_copy(tmp_path)
    home, out = tmp_path / "home", tmp_path / "out"
    out.mkdir()
    _put(home / "stage" / "runs" / "s2st" / "eval" / "rl0" / "done.json")       # finished, restored: no samples
    p = subprocess.run(["bash", "bench/gpu/small2_run.sh"], cwd=repo, capture_output=True, text=True, timeout=60,
                       env={**os.environ, "HOME": str(home), "OUT": str(out), "PART": "ship_samples"})
    assert p.returncode == 1 and "pack samples: failed" in p.stdout and not list(out.iterdir())


def test_publish_adapters_copies_finished_stages_and_names_the_base_file(tmp_path):
    """publish_adapters.sh rl0: the weights byte for byte, the config with the GGUF's file name instead of the
    device's cache folder (the rest unchanged); a stage without done.json (a cut OPD run) is refused before
    anything is copied."""
    repo = _repo_copy(tmp_path)
    state = repo / "results" / "small2" / "state" / "s2st"
    cfg = {"base_model_name_or_path": "~/stage/cache/hf/smollm2-98362432", "r": 16, "peft_type": "LORA"}
    for stage in ("rl0", "opd"):
        _put(state / stage / "adapter" / "adapter_config.json", json.dumps(cfg))
        _put(state / stage / "adapter" / "adapter_model.safetensors", f"weights of {stage}")
    _put(state / "rl0" / "done.json", "{}")
    p = subprocess.run(["bash", "bench/gpu/publish_adapters.sh", "rl0", "opd"], cwd=repo, capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 1 and "s2st/opd is not a finished stage" in p.stdout
    assert not (repo / "results" / "small2" / "adapters").exists()
    _sh(repo, dict(os.environ), "bench/gpu/publish_adapters.sh", "rl0")
    out = repo / "results" / "small2" / "adapters" / "rl0_stimulus"
    assert (out / "adapter_model.safetensors").read_text() == "weights of rl0"
    assert json.loads((out / "adapter_config.json").read_text()) == {
        **cfg, "base_model_name_or_path": "SmolLM2-135M-Instruct.Q4_1.gguf"}
