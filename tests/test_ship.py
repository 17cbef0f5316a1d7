"""The run state's round trip between device sessions (bench/gpu/): ship_list.py chooses what a session ships,
small2_run.sh packs it (PART=ship) and unpacks the next session's bundle (PART=stash / restore), unship.sh puts it
in results/small2/state. Run in a copy of the scripts, with HOME and OUT in tmp_path, as on the device."""
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
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
    """sft0 done (its pick: validated step 2), rl0 cut after two checkpoints, merge done, the data stage."""
    _put(run / "data" / "stage0.jsonl")
    s = run / "sft0"
    _adapter(s / "adapter")
    _adapter(s / "val_ckpt" / "step_000001" / "adapter")
    _adapter(s / "val_ckpt" / "step_000002" / "adapter")
    _put(s / "result.json", json.dumps({"outcome": {"val_best_adapter": "val_ckpt/step_000002/adapter"},
                                        "config": {"data": "/root/stage/runs/s2st/data/stage0.jsonl"}}))
    for f in ("done.json", "log.jsonl", "curves.png", "stdout.log"):
        _put(s / f)
    _put(s / "ckpt" / "step_000002" / "meta.json")
    r = run / "rl0"
    for step in ("step_000010", "step_000020"):
        _adapter(r / "ckpt" / step / "adapter")
        _put(r / "ckpt" / step / "meta.json", json.dumps({"step": int(step[-2:])}))
        _put(r / "ckpt" / step / "optimizer.pt")
    _adapter(r / "best" / "adapter")
    _put(r / "best" / "val.json")
    _put(r / "log.jsonl")
    m = run / "merge"
    _adapter(m / "tune" / "soup_lam1" / "adapter")
    _adapter(m / "soup")
    _put(m / "soup" / "choice.json")
    _put(m / "done.json")


def test_ship_list_keeps_the_handed_on_adapters_and_handoffs_only(tmp_path):
    run = tmp_path / "s2st"
    _run_folder(run)
    os.chdir(tmp_path)
    got = {p.as_posix() for p in ship_list.ship_list("s2st")}
    assert got == {
        "s2st/sft0/result.json", "s2st/sft0/done.json", "s2st/sft0/log.jsonl", "s2st/sft0/curves.png",
        "s2st/sft0/val_ckpt/step_000002/adapter/adapter_config.json",
        "s2st/sft0/val_ckpt/step_000002/adapter/adapter_model.safetensors",
        "s2st/rl0/log.jsonl", "s2st/rl0/best/val.json",
        "s2st/rl0/ckpt/step_000020/meta.json", "s2st/rl0/ckpt/step_000020/adapter/adapter_config.json",
        "s2st/rl0/ckpt/step_000020/adapter/adapter_model.safetensors",
        "s2st/merge/done.json", "s2st/merge/soup/choice.json"}
    (run / "sft0" / "val_ckpt" / "step_000002" / "adapter" / "adapter_model.safetensors").unlink()
    with pytest.raises(SystemExit, match="holds no adapter"):
        ship_list.ship_list("s2st")


def _repo_copy(tmp_path):
    repo = tmp_path / "repo"
    for f in ("bench/gpu/small2_run.sh", "bench/gpu/ship_list.py", "bench/gpu/unship.sh", "bench/offline_setup.sh"):
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
    _sh(repo, env, "bench/gpu/unship.sh", str(out))
    state = repo / "results" / "small2" / "state" / "s2st"
    assert (state / "rl0" / "ckpt" / "step_000020" / "adapter" / "adapter_model.safetensors").is_file()
    assert not (state / "rl0" / "ckpt" / "step_000020" / "optimizer.pt").exists() and not (state / "data").exists()
    assert json.loads((state / "sft0" / "result.json").read_text())["config"]["data"] == "~/stage/runs/s2st/data/stage0.jsonl"

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
