"""A data-parallel run (``train.fsdp`` or not) interrupted after an iteration and resumed, next to the same run
left uninterrupted, all in the ranks of one spawned group (tests/reliability/test_dp_resume.py). It lives in the
package because spawned ranks import their entry point by name, which a test module cannot offer.

The interruption is the one tests/reliability/test_resume.py makes in one process: every rank raises right after
iteration ``KILL_AT``'s metrics row, before its checkpoint, so the resumed run redoes that iteration from the
checkpoint of the one before. Nothing in slea imports this module.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import torch.distributed as dist

from slea.runs import checkpoint as ckpt

KILL_AT = 1  # the iteration whose row is written and whose checkpoint is not


class Killed(Exception):
    """The stand-in for a kill: raised on every rank at the same point."""


def _dispose(trainer) -> None:
    """Close what an interrupted trainer opened (a kill would leave nothing running either): the loggers, env pools,
    library, engine and a rank's scratch folder (``Trainer.close``)."""
    trainer.close()


def interrupted(cfg, run: Path) -> None:
    """Train ``cfg`` into ``run`` and stop every rank after iteration :data:`KILL_AT`'s metrics row."""
    from slea.trainer.rl import Trainer

    victim = Trainer(cfg, run_dir=run)
    real_log = victim.log.log

    def log_then_die(it: int, metrics: dict[str, Any]) -> None:
        real_log(it, metrics)
        if it == KILL_AT:
            raise Killed

    victim.log.log = log_then_die
    try:
        victim.fit()
    except Killed:
        pass
    else:
        raise AssertionError("the interrupted run was not interrupted")
    finally:
        _dispose(victim)


def resumed(cfg, run: Path, optimizer: bool = True) -> None:
    """Resume ``run`` on every rank and train it to the end; each rank writes the iteration it resumed at to
    ``<run>.start-rank<r>`` beside the run (a resume that silently started over would give the uninterrupted
    run's numbers too). ``optimizer=False``: the negative control, a resume that leaves the optimizer state fresh
    (what the test must catch)."""
    from slea.trainer.rl import Trainer

    trainer = Trainer(cfg, run_dir=run)
    real = ckpt.load_latest  # what Trainer.resume calls (slea.trainer.rl reads it from this module)
    if not optimizer:
        ckpt.load_latest = lambda root, model, opt=None, **kw: real(root, model, None, **kw)
    try:
        trainer.resume()
    finally:
        ckpt.load_latest = real
    run.with_name(f"{run.name}.start-rank{dist.get_rank()}").write_text(str(trainer.state.first_step))
    trainer.fit()


def resume_rank_main(cfg, out: Path) -> None:
    """One rank (the entry point :func:`slea.parallel.distributed.launch` spawns) of three runs of ``cfg``: the
    uninterrupted run in ``out/ref``; the run interrupted after iteration :data:`KILL_AT` and resumed in
    ``out/run``; and a copy of the interrupted run resumed without its optimizer state in ``out/no_optimizer``."""
    from slea.trainer.rl import Trainer

    Trainer(cfg, run_dir=out / "ref").fit()
    interrupted(cfg, out / "run")
    if dist.get_rank() == 0:
        shutil.copytree(out / "run", out / "no_optimizer")
    dist.barrier()  # the copy is whole before any rank reads it
    resumed(cfg, out / "run")
    resumed(cfg, out / "no_optimizer", optimizer=False)
