"""Shared fixtures: a tiny random model with a locally trained tokenizer (built once, cached), and the
``device`` a numerics test runs on (``cpu``, and ``cuda`` under the ``gpu`` marker, skipped without CUDA)."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    """``gpu`` tests need a CUDA device: skipped (with the reason) where torch sees none."""
    if any(item.get_closest_marker("gpu") for item in items) and not _cuda():
        skip = pytest.mark.skip(reason="needs a CUDA device (gpu marker); torch sees none")
        for item in items:
            if item.get_closest_marker("gpu"):
                item.add_marker(skip)


@pytest.fixture(params=["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def device(request) -> str:
    """The device a numerics test runs on: ``cpu`` always, ``cuda`` on a machine with a GPU (``-m gpu``)."""
    return request.param


@pytest.fixture(scope="session")
def tiny_policy():
    """(model, tokenizer) of the tiny test model, fp32, no LoRA."""
    import torch

    from slea.config import ModelSection
    from slea.policy.model import load_policy

    torch.manual_seed(0)
    model, tok = load_policy(ModelSection(name_or_path="tiny", lora=False, dtype="float32"))
    return model, tok
