"""Algorithms: advantage estimators, policy/value losses, KL penalties and GAE, each registered by name.

``compute_advantages`` and the registries import only numpy. The torch parts (``losses``, ``kl``, ``gae``) are
imported on first use of one of their names, so ``from slea.algorithms import compute_advantages`` stays cheap.
Token-level GAE is ``slea.algorithms.gae.gae`` (exported here as ``token_gae``: the name ``gae`` on this
package is the submodule).
"""

from __future__ import annotations

import importlib
from typing import Any

from slea.algorithms.advantages import (
    compute_advantages,
    discounted_returns,
    episode_returns,
    group_normalize,
    index_rows,
    leave_one_out,
)
from slea.algorithms.registry import (
    advantage_names,
    get_advantage,
    get_policy_loss,
    policy_loss_names,
    register_advantage,
    register_policy_loss,
)

_LAZY = {
    "aggregate": "losses",
    "value_loss": "losses",
    "AGG_MODES": "losses",
    "kl_penalty": "kl",
    "kl_loss": "kl",
    "kl_estimator_names": "kl",
    "token_gae": "gae",
    "turn_gae": "gae",
    "masked_whiten": "gae",
}

__all__ = [
    "AGG_MODES",
    "advantage_names",
    "aggregate",
    "compute_advantages",
    "discounted_returns",
    "episode_returns",
    "get_advantage",
    "get_policy_loss",
    "group_normalize",
    "index_rows",
    "kl_estimator_names",
    "kl_loss",
    "kl_penalty",
    "leave_one_out",
    "masked_whiten",
    "policy_loss_names",
    "register_advantage",
    "register_policy_loss",
    "token_gae",
    "turn_gae",
    "value_loss",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(f"slea.algorithms.{_LAZY[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
