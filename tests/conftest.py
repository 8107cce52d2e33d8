"""Shared fixtures: a tiny random model with a locally trained tokenizer (built once, cached)."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def tiny_policy():
    """(model, tokenizer) of the tiny test model, fp32, no LoRA."""
    import torch

    from slea.config import ModelSection
    from slea.policy.model import load_policy

    torch.manual_seed(0)
    model, tok = load_policy(ModelSection(name_or_path="tiny", lora=False, dtype="float32"))
    return model, tok
