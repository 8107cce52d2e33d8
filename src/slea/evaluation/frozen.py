"""A frozen policy played on an env's games, with the experience library it plays with: ``slea eval``'s evaluation
(:func:`evaluate_frozen`: a run's checkpoint with a private copy of its library snapshot, as training's own
evaluation) and ``slea agent``'s paired comparison (:func:`play_agent`: without and with a library, which
``evolve`` lets learn). Each closes the generator it is given (a managed vLLM server stops) and the library it
opened, also on an error; a :class:`slea.policy.openai_engine.GeneratorError` (a server that went away or refused
mid-run) goes to the caller."""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from slea.atomic import atomic_write_text
from slea.runs.folder import LIBRARY, RunFolder

if TYPE_CHECKING:
    from slea.config import (
        AlgorithmSection,
        EnvSection,
        EvalSection,
        ExperienceSection,
        ModelSection,
        RolloutSection,
    )
    from slea.experience.manager import ExperienceManager

STEPS = "steps.jsonl"  # slea agent --trace: one row per step played


def eval_library(experience: ExperienceSection, last: Path | None, workdir: Path) -> ExperienceManager | None:
    """The experience library a run evaluates with: a private copy of its checkpoint's snapshot in ``workdir``
    (the evaluation's retrievals link entries and open clusters; the run's own files stay untouched), or None
    (``experience.mode`` off, or no snapshot)."""
    snap = last / LIBRARY if last is not None else None  # the checkpoint's snapshot
    if experience.mode == "off" or snap is None or not snap.is_file():
        return None
    from slea.experience.manager import ExperienceManager

    shutil.copyfile(snap, RunFolder(workdir).library)
    return ExperienceManager(experience, RunFolder(workdir).library)


def evaluate_frozen(generator, builder, env_kwargs: dict[str, Any], *, rollout: RolloutSection, env: EnvSection,
                    eval_cfg: EvalSection, experience: ExperienceSection, train_iterations: int, run: bool,
                    last: Path | None) -> dict:
    """``slea eval``: the policy's evaluation on ``env_kwargs``' split (:func:`slea.evaluation.evaluate.evaluate`),
    with its run's library snapshot when ``run`` (then at the run's last iteration, ``train_iterations``, "after":
    the warm-up gate open), plus the checkpoint's name."""
    from slea.evaluation.evaluate import evaluate
    from slea.policy.engines import close_generator
    from slea.rollout.collector import RolloutCollector

    with tempfile.TemporaryDirectory() as work:
        library = None
        try:
            library = eval_library(experience, last, Path(work)) if run else None
            collector = RolloutCollector(generator, builder, rollout, env.max_steps, experience=library,
                                         experience_mode=experience.mode)
            res = evaluate(collector, env, env_kwargs, eval_cfg,
                           iteration=train_iterations if run else 0)  # the run's "after": warm-up gate open
        finally:
            close_generator(generator)  # a managed vLLM server stops here
            if library is not None:
                library.close()
    res["checkpoint"] = last.name if last else None
    return res


def play_agent(generator, builder, library: Path, env_kwargs: dict[str, Any], *, model_cfg: ModelSection,
               rollout: RolloutSection, env: EnvSection, eval_cfg: EvalSection, experience: ExperienceSection,
               algorithm: AlgorithmSection, out: Path, evolve: bool, batch: int, say: Callable[[str], None],
               trace: bool) -> dict:
    """``slea agent``: :func:`slea.evaluation.agent.run_agent` with a working copy of ``library`` (kept in ``out``
    when ``evolve``, else in a temporary folder) and the trainer's experience manager, extractor and all
    (:func:`slea.experience.engine.experience_manager`; ``model_cfg`` and ``algorithm`` are read for it)."""
    from slea.algorithms.registry import get_algorithm
    from slea.evaluation.agent import run_agent
    from slea.experience.engine import experience_manager
    from slea.experience.portable import working_copy
    from slea.policy.engines import close_generator

    with tempfile.TemporaryDirectory() as work:
        workdir = out if evolve else Path(work)  # the evolved library is kept, a read-only use is not
        manager = None
        try:
            working_copy(library, RunFolder(workdir).library)
            manager = experience_manager(get_algorithm(algorithm.name), workdir, generator, experience=experience,
                                         model_cfg=model_cfg)
            return run_agent(generator, builder, manager, env_kwargs, rollout=rollout, env=env, eval_cfg=eval_cfg,
                             experience_mode=experience.mode, evolve=evolve, batch=batch, say=say, trace=trace)
        finally:
            if manager is not None:
                manager.close()
            close_generator(generator)


def write_agent(out: Path, res: dict) -> tuple[Path, list | None]:
    """``res`` as ``out/agent.json``, its ``steps`` (``--trace``) taken out into ``out/steps.jsonl``: the JSON's
    path and the steps (None without a trace)."""
    steps = res.pop("steps", None)
    saved = atomic_write_text(out / "agent.json", json.dumps(res, indent=2))
    if steps is not None:
        atomic_write_text(out / STEPS, "".join(json.dumps(r) + "\n" for r in steps))
    return saved, steps
