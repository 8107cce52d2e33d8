"""Each component receives its own settings: a config section (or a few values), never the whole ``RunConfig``.

Every function, method and class constructor of the component modules below is read with :mod:`inspect`: no
parameter is annotated ``RunConfig`` (except :data:`WHOLE`, which still receive it), and a settings parameter
(``cfg``, ``*_cfg``) is annotated with a section class of :mod:`slea.config.schema`; the components that once
took the whole config (:data:`SIGNATURES`) take, by keyword, the sections they read, so who reads which section
is visible in the signature.
"""

from __future__ import annotations

import importlib
import inspect
import re

import pytest

from slea.config import schema

MODULES = ["slea.envs.factory", "slea.evaluation.agent", "slea.evaluation.evaluate", "slea.evaluation.frozen",
           "slea.experience.engine", "slea.experience.manager", "slea.policy.engines", "slea.policy.model",
           "slea.policy.openai_engine", "slea.policy.prompt_builder", "slea.policy.served", "slea.policy.vllm_server",
           "slea.rollout.collector", "slea.rollout.schemes", "slea.trainer.budgets", "slea.trainer.critic",
           "slea.trainer.update", "slea.evaluation.team"]
# still handed the whole config: the team trainer calls it so (its signature follows the team trainer's)
WHOLE = {"slea.evaluation.team.evaluate_team"}
SECTIONS = {name for name, obj in vars(schema).items()
            if inspect.isclass(obj) and issubclass(obj, schema._Section) and obj is not schema.RunConfig}
SETTINGS_NAME = re.compile(r"^(cfg|\w+_cfg)$")
# component -> its keyword-only section parameters and their classes
_PLAY = {"rollout": "RolloutSection", "env": "EnvSection", "eval_cfg": "EvalSection"}
_SCHEME = {"env": "EnvSection", "rollout": "RolloutSection", "algorithm": "AlgorithmSection"}
SIGNATURES = {
    "slea.rollout.schemes.OnPolicyRollouts": _SCHEME,
    "slea.rollout.schemes.SiblingRollouts": _SCHEME,
    "slea.trainer.critic.Critic": {"algorithm": "AlgorithmSection", "train": "TrainSection"},
    "slea.policy.served.served_text": {"model_cfg": "ModelSection", "experience": "ExperienceSection"},
    "slea.policy.served.played_policy": {"model_cfg": "ModelSection", "rollout": "RolloutSection"},
    "slea.experience.engine.experience_manager": {"experience": "ExperienceSection", "model_cfg": "ModelSection"},
    "slea.evaluation.frozen.evaluate_frozen": {**_PLAY, "experience": "ExperienceSection"},
    "slea.evaluation.frozen.play_agent": {**_PLAY, "experience": "ExperienceSection", "model_cfg": "ModelSection",
                                          "algorithm": "AlgorithmSection"},
    "slea.evaluation.agent.run_agent": _PLAY,
}


def _callables(module):
    """``(qualified name, callable)`` of the module's own functions, classes' constructors and methods."""
    for name, obj in vars(module).items():
        if getattr(obj, "__module__", None) != module.__name__:
            continue
        if inspect.isfunction(obj):
            yield f"{module.__name__}.{name}", obj
        elif inspect.isclass(obj):
            for attr, fn in vars(obj).items():
                fn = fn.__func__ if isinstance(fn, (classmethod, staticmethod)) else fn
                if inspect.isfunction(fn):
                    yield f"{module.__name__}.{name}.{attr}", fn


def _params(names):
    for qualname, fn in names:
        for p in inspect.signature(fn).parameters.values():
            yield qualname, p.name, p.annotation if p.annotation is not inspect.Parameter.empty else None


@pytest.mark.parametrize("module", MODULES)
def test_components_take_sections_not_the_whole_config(module):
    params = list(_params(_callables(importlib.import_module(module))))
    assert params, f"{module} has no functions"
    whole = [(q, n) for q, n, a in params if a is not None and "RunConfig" in re.findall(r"\w+", str(a))
             and q not in WHOLE]
    assert whole == [], f"{module}: the whole RunConfig is handed to {whole}"
    unnamed = [(q, n, a) for q, n, a in params if SETTINGS_NAME.match(n) and q not in WHOLE
               and (a is None or not SECTIONS & set(re.findall(r"\w+", str(a))))]
    assert unnamed == [], f"{module}: settings without their section class: {unnamed}"


def test_the_check_sees_what_it_refuses():
    def takes_all(collector, cfg: schema.RunConfig): ...

    def untyped(collector, rollout_cfg): ...

    def typed(collector, rollout: schema.RolloutSection, env: schema.EnvSection, dp=None): ...

    found = list(_params([("takes_all", takes_all), ("untyped", untyped), ("typed", typed)]))
    assert [(q, n) for q, n, a in found if "RunConfig" in str(a)] == [("takes_all", "cfg")]
    assert [(q, n) for q, n, a in found if SETTINGS_NAME.match(n) and a is None] == [("untyped", "rollout_cfg")]
    assert {"RolloutSection", "EnvSection", "ModelSection"} <= SECTIONS and "RunConfig" not in SECTIONS


@pytest.mark.parametrize("component", sorted(SIGNATURES))
def test_former_whole_config_takers_take_their_sections_by_keyword(component):
    module, name = component.rsplit(".", 1)
    obj = getattr(importlib.import_module(module), name)
    params = inspect.signature(obj.__init__ if inspect.isclass(obj) else obj).parameters
    assert "cfg" not in params
    got = {n: p.annotation for n, p in params.items() if n in SIGNATURES[component]}
    assert got == SIGNATURES[component]
    assert all(params[n].kind is inspect.Parameter.KEYWORD_ONLY for n in got)
