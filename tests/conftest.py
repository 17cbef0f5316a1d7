"""Shared pytest fixtures and markers. Run all tests with `make test` (or `python -m pytest -q tests`)."""
import os
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
SHARED = ROOT.parent / "shared"          # third-party data lives beside the checkout, never in it


def pytest_configure(config):
    config.addinivalue_line("markers", "needs_iverilog: needs iverilog/vvp on PATH")
    config.addinivalue_line("markers", "needs_shared: needs ../shared/data (absent in a user's fresh clone)")
    config.addinivalue_line("markers", "slow: takes more than ~20 s on 2 cores")


def pytest_collection_modifyitems(config, items):
    no_iverilog = shutil.which("iverilog") is None or shutil.which("vvp") is None
    for item in items:
        if no_iverilog and "needs_iverilog" in item.keywords:
            item.add_marker(pytest.mark.skip(reason="iverilog not on PATH (make sysdeps installs it)"))
        if "needs_shared" in item.keywords and not (SHARED / "data").is_dir():
            item.add_marker(pytest.mark.skip(reason="../shared/data is absent (third-party data is not shipped)"))


@pytest.fixture(scope="session")
def shared_dir():
    return SHARED


@pytest.fixture(scope="session")
def experts(tmp_path_factory):
    """Saved adapters student/t0/t1 on the tiny base distill.py builds with --seed helpers.EXPERTS_SEED (random
    non-zero B, so they differ) -> ({name: path}, the base model, its tokenizer). Made once per test run;
    tests read the adapters and never write into their folders."""
    import copy

    import torch       # here, not at the top: the simulator tests need no torch (seconds of import on 2 cores)

    import common
    from helpers import EXPERTS_SEED
    root = tmp_path_factory.mktemp("experts")
    model, tok = common.tiny_model(seed=EXPERTS_SEED)
    paths = {}
    for i, name in enumerate(["student", "t0", "t1"]):
        torch.manual_seed(100 + i)
        m = common.add_lora(copy.deepcopy(model), r=4, alpha=8)
        with torch.no_grad():
            for n, p in m.named_parameters():
                if "lora_B" in n:
                    p.normal_(0, 0.3)
        paths[name] = str(common.save_adapter(m, str(root / name)))
    return paths, model, tok
