"""Run configuration: pydantic models with every default in one place.

Loaded from YAML, then ``--set key.sub=value`` overrides (values parsed as YAML scalars/lists). Unknown keys,
wrong types and bad values raise :class:`ConfigError` with one line naming the key; the CLI turns it into
exit code 2. Beyond types, a config is checked against what it names: ``plugins`` are imported first (a user's
module registers its algorithms, losses, envs, extractors), the algorithm's declared ``defaults`` fill the keys
the user did not set (``slea`` → ``experience.mode: step``), ``algorithm.name``, ``algorithm.policy_loss`` and
``env.id`` must be registered, ``env.kwargs`` and ``env.eval_kwargs`` must be keywords of its constructor with
values of the annotated types (read from the signature, before any model loads), ``algorithm.options`` must be
settings of the chosen estimator or loss, and a setting the chosen algorithm, loss or trainer path never reads is
refused when it differs from its default (:func:`unused_settings`): a value that would be silently ignored is an
error, not a surprise. An algorithm's and a loss's settings are their functions' keyword-only parameters, read from
the registry (a loss's under the names the schema's fields carry: :data:`LOSS_SETTINGS`); the trainer's own are
listed once, with the module that reads each and on which path (:data:`TRAINER_SETTINGS`); the team trainer
declares what it reads (slea/trainer/team_settings.py), and every other setting is refused for a team.

The package: :mod:`slea.config.schema` (the sections), :mod:`slea.config.checks` (the checks beyond types),
:mod:`slea.config.loading` (YAML, overrides, one-line errors) and :mod:`slea.config.foreign` (TRL's and verl's names
for its keys: an unknown key that is one of them is refused naming slea's).
"""

from __future__ import annotations

from slea.config.checks import (
    TRAINER_SETTINGS,
    estimator_settings,
    loss_settings,
    unused_settings,
)
from slea.config.loading import build_config, dump_config, load_config, parse_override
from slea.config.schema import (
    LOSS_SETTINGS,
    AlgorithmSection,
    AlignSection,
    ConfigError,
    EnvSection,
    EvalSection,
    ExperienceSection,
    ModelSection,
    OpenAISection,
    RolloutSection,
    RunConfig,
    RunSection,
    TeamSection,
    TrainSection,
    TrustRegionSection,
    VLLMSection,
)

__all__ = [
    "LOSS_SETTINGS",
    "TRAINER_SETTINGS",
    "AlgorithmSection",
    "AlignSection",
    "ConfigError",
    "EnvSection",
    "EvalSection",
    "ExperienceSection",
    "ModelSection",
    "OpenAISection",
    "RolloutSection",
    "RunConfig",
    "RunSection",
    "TeamSection",
    "TrainSection",
    "TrustRegionSection",
    "VLLMSection",
    "build_config",
    "dump_config",
    "estimator_settings",
    "load_config",
    "loss_settings",
    "parse_override",
    "unused_settings",
]
