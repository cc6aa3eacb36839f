"""Shared tiny fixtures: a random 8-layer Qwen3 target (hidden 64, vocab 512) and a small dataset."""

from __future__ import annotations

import pytest
import torch

from dflash_trainer.make_tiny import write_dataset, write_target

torch.set_num_threads(2)


@pytest.fixture(scope="session")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    target, data = str(root / "target"), str(root / "data")
    write_target(target, seed=0)
    write_dataset(data, num_sequences=96, seed=0)
    return {"target": target, "data": data}
