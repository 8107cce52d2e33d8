"""Text environments. Importing this package registers every env id (cheaply: families import their heavy
dependencies only when an env is built)."""

from __future__ import annotations

import importlib

from slea.envs.base import EnvSpec, MissingExtraError, TextEnv, make, register, registered

# One module per family; each calls ``register`` at import time and imports its engine lazily.
_FAMILIES = ("textworld", "sokoban", "scienceworld", "alfworld", "webshop", "search_qa", "recall", "ballot", "tools",
             "search_qa_tools")

for _name in _FAMILIES:
    try:
        importlib.import_module(f"slea.envs.{_name}")
    except ModuleNotFoundError as _exc:  # family not written yet, or its module is absent
        if _exc.name != f"slea.envs.{_name}":
            raise

__all__ = ["EnvSpec", "MissingExtraError", "TextEnv", "make", "register", "registered"]
