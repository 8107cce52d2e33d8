"""``make lint``'s type check (pyproject.toml ``[tool.mypy]``): the packages it covers are clean, and a call that
uses their public signatures wrongly is an error mypy reports at its line.

One mypy run (in-process, :func:`mypy.api.run`, with the project's configuration and ``make lint``'s cache) checks
the configured packages and a small module written here, whose lines marked ``# error: <code>`` must be reported
with that error code and whose other lines (among them the protocols' conformance: a real optimizer, an
:class:`~slea.runs.checkpoint.OptimizerSet`, the experience library and manager) must not; a trainer that lacks
methods of :class:`~slea.trainer.lifecycle.Run` is refused as one, and so is the whole config handed to a component
that takes its sections. That module's errors are told apart by its name: mypy's cache may replay them under the
folder of an earlier run.
"""

from __future__ import annotations

import re
import textwrap
import tomllib
from pathlib import Path

import pytest

mypy_api = pytest.importorskip("mypy.api", reason="mypy is not installed (the dev extra installs it)")

ROOT = Path(__file__).resolve().parents[1]
CALLS_FILE = "slea_typecheck_calls.py"

CALLS = textwrap.dedent('''\
    from pathlib import Path

    import torch

    from slea.algorithms.losses import aggregate
    from slea.algorithms.registry import get_algorithm
    from slea.config.loading import build_config
    from slea.experience.engine import experience_manager
    from slea.experience.library import ExperienceLibrary
    from slea.experience.manager import ExperienceManager
    from slea.policy.served import served_text
    from slea.runs.checkpoint import OptimizerSet, save_checkpoint
    from slea.runs.episodes import Experience, Library
    from slea.runs.folder import RunFolder
    from slea.trainer.critic import Critic
    from slea.trainer.lifecycle import Run
    from slea.trainer.run_state import RunState
    from slea.trainer.update import right_aligned

    model = torch.nn.Linear(2, 2)
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    RunFolder("runs/x").metrics.read_text()
    RunFolder(3)  # error: arg-type
    build_config(overrides=["algorithm.name=grpo"])
    build_config(overrides="algorithm.name=grpo")  # error: arg-type
    cfg = build_config(overrides=["algorithm.name=ppo"])
    Critic(model, "turn", algorithm=cfg.algorithm, train=cfg.train, dtype=cfg.model.dtype)
    Critic(model, "turn", algorithm=cfg, train=cfg.train, dtype=cfg.model.dtype)  # error: arg-type
    served_text(None, model_cfg=cfg.model, experience=cfg.experience)
    experience_manager(get_algorithm("ppo"), Path("x"), None, experience=cfg, model_cfg=cfg.model)  # error: arg-type
    aggregate(torch.zeros(2, 3), torch.ones(2, 3), "seq-mean-token-sum-norm", norm_const=3.0)
    aggregate(torch.zeros(2, 3), torch.ones(2, 3), norm_const="T")  # error: arg-type
    level: str = get_algorithm("grpo").level
    settings: int = get_algorithm("grpo").settings  # error: assignment
    save_checkpoint("runs/x/checkpoints", 0, model, sgd)
    save_checkpoint("runs/x/checkpoints", 0, dict(model.named_parameters()), OptimizerSet([sgd]))
    save_checkpoint("runs/x/checkpoints", 0, model, object())  # error: arg-type
    right_aligned([[0.5, 0.25], None, []], 3)
    right_aligned([[0.5, 0.25]], k="3")  # error: arg-type


    def conforms(library: ExperienceLibrary, manager: ExperienceManager) -> tuple[Library, Experience]:
        return library, manager


    class HalfTrainer:  # a trainer without save, evaluate, summary and close (slea/trainer/contract.py's check)
        state: RunState

        def start(self, resume: bool) -> tuple[None, None, int]:
            return None, None, -1

        def step(self, k: int) -> dict[str, float]:
            return {}


    def half_conforms(trainer: HalfTrainer) -> Run:
        return trainer  # error: return-value
''')


def _configured_files() -> list[str]:
    with (ROOT / "pyproject.toml").open("rb") as fh:
        files = tomllib.load(fh)["tool"]["mypy"]["files"]
    return [str(ROOT / f) for f in files]


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[tuple[str, int, str]], str, int]:
    """mypy on the configured packages plus the module of :data:`CALLS`: ``(file, line, code)`` of each error,
    its whole output and its exit status."""
    calls = tmp_path_factory.mktemp("typecheck") / CALLS_FILE
    calls.write_text(CALLS, encoding="utf-8")
    out, err, status = mypy_api.run(["--config-file", str(ROOT / "pyproject.toml"), "--cache-dir",
                                     str(ROOT / ".mypy_cache"), "--no-error-summary", "--show-error-codes",
                                     *_configured_files(), str(calls)])
    assert not err, err
    errors = []
    for line in out.splitlines():
        m = re.match(r"(.+?):(\d+): error: .*?(?:\[([a-z-]+)\])?$", line)
        if m:
            errors.append((m[1], int(m[2]), m[3] or ""))
    return errors, out, status


def test_configured_packages_are_clean(report: tuple[list[tuple[str, int, str]], str, int]) -> None:
    errors, out, _ = report
    assert _configured_files(), "pyproject.toml [tool.mypy] names no files"
    assert not [e for e in errors if Path(e[0]).name != CALLS_FILE], out


def test_wrong_calls_are_reported_at_their_lines(report: tuple[list[tuple[str, int, str]], str, int]) -> None:
    errors, out, status = report
    expected = {(n, m[1]) for n, text in enumerate(CALLS.splitlines(), start=1)
                if (m := re.search(r"# error: ([a-z-]+)$", text))}
    assert len(expected) == 9
    assert {(n, code) for file, n, code in errors if Path(file).name == CALLS_FILE} == expected, out
    assert status == 1
