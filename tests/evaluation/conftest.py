"""The parts a ``slea agent`` test plays with: the config of the test module's ``SETTINGS``, the tiny model's
in-process engine and its prompt builder."""

from __future__ import annotations

import pytest


@pytest.fixture()
def setup(request, tiny_policy):
    from slea.config import load_config
    from slea.policy.generation import HFGenerator
    from slea.policy.prompt_builder import PromptBuilder

    model, tok = tiny_policy
    cfg = load_config(None, request.module.SETTINGS)
    return cfg, HFGenerator(model, tok, dtype="float32"), PromptBuilder(tok)
