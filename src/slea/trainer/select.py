"""Which trainer ``slea train`` runs: the one whose provisions cover what the algorithm declares it needs.

Every algorithm declares its needs at registration (:class:`slea.algorithms.registry.AlgorithmSpec` ``needs``,
keys of :data:`slea.algorithms.registry.NEEDS`); every trainer below declares what it provides. The first trainer
that provides all of an algorithm's needs trains it; none is chosen by the algorithm's name. An algorithm whose
needs no single trainer covers is a :class:`slea.config.ConfigError` naming what is missing, raised before any
model loads. Both trainers take ``(cfg, run_dir=None)`` and run with ``fit(resume=False)``, writing the same run
folder layout (``config.yaml``, ``metrics.jsonl``, TensorBoard ``events/``, ``checkpoints/``, ``curves.png``,
``eval/before.json``, ``eval/after.json``, ``eval/summary.json``).

A trainer may also declare a config check that runs without a model (``check``, ``module:function``):
:func:`check_config` runs it, so ``slea compare`` refuses a bad sub-run before any sub-run trains.

This module imports neither torch nor a trainer until one is built or checked.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path

from slea.algorithms.registry import NEEDS, get_algorithm
from slea.config import ConfigError, RunConfig


@dataclass(frozen=True)
class TrainerKind:
    """A trainer ``slea train`` can run: ``provides`` (keys of ``NEEDS``), its class (``module:Class``) and
    optionally its model-free config check (``module:function``, raising :class:`ConfigError`)."""

    name: str
    provides: frozenset[str]
    target: str
    check: str | None = None

    def load(self):
        return _resolve(self.target)


def _resolve(target: str):
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


TRAINERS: tuple[TrainerKind, ...] = (
    # the on-policy loop (slea/trainer/rl.py); "snapshots" through its rollout scheme (slea/rollout/schemes.py)
    TrainerKind("rl", frozenset({"critic", "clusters", "reference", "snapshots"}), "slea.trainer.rl:Trainer"),
    # TeamTR's stage loop (slea/trainer/team.py): a team of LoRA agents, one single-agent update at a time
    TrainerKind("team", frozenset({"team"}), "slea.trainer.team:TeamTrainer", "slea.trainer.team:check_team_config"),
)


def trainer_kind(spec, trainers: tuple[TrainerKind, ...] = TRAINERS) -> TrainerKind:
    """The first of ``trainers`` providing every need of ``spec``; a :class:`ConfigError` when none does: it names
    the needs no trainer provides, or, when each is provided by some trainer but none provides them all, every
    need and what each trainer gives."""
    for kind in trainers:
        if spec.needs <= kind.provides:
            return kind
    unmet = sorted(spec.needs - frozenset().union(*(k.provides for k in trainers)))
    if unmet:
        what = "; ".join(NEEDS[m] for m in unmet)
        raise ConfigError(f"algorithm.name: {spec.name} needs {what}, which `slea train` does not provide")
    what = " and ".join(NEEDS[m] for m in sorted(spec.needs))
    gives = "; ".join(f"{k.name}: {', '.join(sorted(k.provides))}" for k in trainers)
    raise ConfigError(f"algorithm.name: {spec.name} needs {what}, which `slea train` does not provide together "
                      f"(its trainers provide {gives})")


def build_trainer(cfg: RunConfig, run_dir: str | Path | None = None):
    """The trainer for ``cfg.algorithm`` (:func:`trainer_kind`), built: its own config checks run first, so a
    config error costs no model load."""
    kind = trainer_kind(get_algorithm(cfg.algorithm.name))
    return kind.load()(cfg, Path(run_dir) if run_dir is not None else None)


def check_config(cfg: RunConfig) -> None:
    """The :class:`ConfigError` that building ``cfg``'s trainer would raise before its model loads: no trainer
    provides the algorithm's needs (:func:`trainer_kind`), or the chosen trainer's own check refuses the config."""
    kind = trainer_kind(get_algorithm(cfg.algorithm.name))
    if kind.check is not None:
        _resolve(kind.check)(cfg)
