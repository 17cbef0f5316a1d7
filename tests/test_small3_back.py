"""bench/gpu/small3_back.py: a job's packed parts into the kept state (paths rewritten, the newest checkpoint kept,
a best/ that travelled without its adapter keeps the state's, a mismatch changes nothing)."""
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench" / "gpu"))
import small3_back  # noqa: E402
from test_small3_call import _tar_bytes  # noqa: E402


def _parts(folder, members, size=40):
    data = _tar_bytes(members)
    folder.mkdir(parents=True)
    for k in range(0, len(data), size):
        (folder / f"back.tgz.part{k // size:02d}").write_bytes(data[k:k + size])


def _home(state):
    (state / "rl0/best/adapter").mkdir(parents=True)
    (state / "rl0/best/adapter/adapter_model.safetensors").write_text("home best")
    (state / "rl0/best/val.json").write_text(json.dumps({"step": 40}))
    (state / "rl0/ckpt/step_000059").mkdir(parents=True)
    (state / "rl0/old.txt").write_text("gone after")


def test_parts_replace_the_state_folders(tmp_path):
    state = tmp_path / "state"
    _home(state)
    meta = json.dumps({"adapter": "/gpu/home/stage/s3/sft0/val_ckpt/step_000312/adapter",
                       "model": "/gpu/home/stage/smollm2.gguf"}).encode()
    _parts(tmp_path / "back", {
        "rl0/best/val.json": json.dumps({"step": 40}).encode(),           # travelled without its adapter
        "rl0/ckpt/step_000070/meta.json": meta, "rl0/ckpt/step_000079/meta.json": meta,
        "rl0/log.jsonl": b'{"step": 79}\n', "rl0/stdout.log": b"noise", "rl0/.lock": b"{}",
        "r/rl0/log.jsonl": b'{"step": 50}\n'})
    assert small3_back.main([str(tmp_path / "back"), "--state", str(state)]) == 0
    rl0 = state / "rl0"
    assert sorted(p.name for p in (rl0 / "ckpt").iterdir()) == ["step_000079"]
    got = json.loads((rl0 / "ckpt/step_000079/meta.json").read_text())
    assert got == {"adapter": "runs/s3/sft0/val_ckpt/step_000312/adapter", "model": "~/stage/smollm2.gguf"}
    assert (rl0 / "best/adapter/adapter_model.safetensors").read_text() == "home best"
    assert not (rl0 / "stdout.log").exists() and not (rl0 / ".lock").exists() and not (rl0 / "old.txt").exists()
    assert (state / "r/rl0/log.jsonl").read_text() == '{"step": 50}\n'


def test_a_best_adapter_folder_that_came_back_empty_keeps_the_states(tmp_path):
    """The job's carry held best/adapter/ without its files (small3_pieces hides them), so the folder came back
    empty: it counts as no adapter, and the state's adapter stays."""
    import io
    import tarfile
    state = tmp_path / "state"
    _home(state)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        info = tarfile.TarInfo("rl0/best/adapter")
        info.type = tarfile.DIRTYPE
        tar.addfile(info)
        for name, text in {"rl0/best/val.json": b'{"step": 40}', "rl0/log.jsonl": b'{"step": 79}\n'}.items():
            info = tarfile.TarInfo(name)
            info.size = len(text)
            tar.addfile(info, io.BytesIO(text))
    (tmp_path / "back").mkdir()
    (tmp_path / "back/back.tgz.part00").write_bytes(buf.getvalue())
    assert small3_back.main([str(tmp_path / "back"), "--state", str(state)]) == 0
    assert (state / "rl0/best/adapter/adapter_model.safetensors").read_text() == "home best"


def test_the_stage_is_read_off_the_model_path_when_the_run_paths_are_relative(tmp_path):
    state = tmp_path / "state"
    meta = json.dumps({"out": "runs/s3/rl1", "model": "/home/u/stage/smollm2.gguf"}).encode()
    _parts(tmp_path / "back", {"rl1/ckpt/step_000019/meta.json": meta})
    small3_back.main([str(tmp_path / "back"), "--state", str(state)])
    got = json.loads((state / "rl1/ckpt/step_000019/meta.json").read_text())
    assert got == {"out": "runs/s3/rl1", "model": "~/stage/smollm2.gguf"}


def test_a_best_without_adapter_at_another_step_changes_nothing(tmp_path):
    state = tmp_path / "state"
    _home(state)
    _parts(tmp_path / "back", {"rl0/best/val.json": json.dumps({"step": 70}).encode(), "rl0/log.jsonl": b"{}\n"})
    with pytest.raises(SystemExit, match="step 70.*step 40"):
        small3_back.main([str(tmp_path / "back"), "--state", str(state)])
    assert (state / "rl0/old.txt").is_file() and (state / "rl0/ckpt/step_000059").is_dir()


def test_a_missing_part_is_named(tmp_path):
    _parts(tmp_path / "back", {f"rl0/f{k}.json": b"x" * 200 for k in range(5)}, size=60)
    last = sorted((tmp_path / "back").iterdir())[-1]
    last.unlink()
    with pytest.raises(SystemExit, match="part missing"):
        small3_back.main([str(tmp_path / "back"), "--state", str(tmp_path / "state")])
