"""Ctrl-C and SIGTERM during ``slea train``: stop cleanly and say how to resume.

:class:`StopSignal` is what a trainer asks between its steps (``stop.requested``). ``with stop.installed():`` (the
CLI does it) routes SIGINT and SIGTERM to it: the first signal asks the run to stop after the step in progress
(an iteration, or a team's single-agent update), which is then logged and checkpointed; a second one abandons that
step at once (:class:`KeyboardInterrupt`: nothing of it is kept, the last checkpoint stays the last one). Either way
the trainer raises or lets through, and the CLI prints where the run stopped and the command that resumes it
(:func:`resume_hint`), exit code 130 (SIGINT) or 143 (SIGTERM).

Used as a library without ``installed()``, nothing changes: Ctrl-C is Python's KeyboardInterrupt.
"""

from __future__ import annotations

import contextlib
import logging
import shlex
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

log = logging.getLogger("slea.trainer")

EXIT_CODES = {"SIGINT": 130, "SIGTERM": 143}


class Interrupted(Exception):
    """The run stopped on a signal after a finished step: ``where`` says after what (``"iteration 5/40"``; '': before
    the first one), ``checkpoint`` is the last one written (None: none yet)."""

    def __init__(self, signal_name: str, where: str, run_dir: Path, checkpoint: str | None):
        self.signal_name, self.where, self.run_dir, self.checkpoint = signal_name, where, Path(run_dir), checkpoint
        super().__init__(f"{signal_name}: stopped after {where}" if where else f"{signal_name}: stopped before training")

    @property
    def exit_code(self) -> int:
        return EXIT_CODES.get(self.signal_name, 130)


class StopSignal:
    """Whether a stop was asked (``requested``: the signal's name, or None) and what the run is doing
    (``doing``: told to the person who pressed Ctrl-C)."""

    def __init__(self) -> None:
        self.requested: str | None = None
        self.doing = "setting up"  # '' once the step a first signal asked to stop after is checkpointed

    def _handle(self, signum, frame) -> None:
        name = signal.Signals(signum).name
        if self.requested is not None:  # the second signal: abandon the step in progress
            raise KeyboardInterrupt
        self.requested = name
        log.warning("%s: stopping after %s, which is then checkpointed (Ctrl-C again abandons it)",
                    "Ctrl-C" if name == "SIGINT" else name, self.doing)

    @contextlib.contextmanager
    def installed(self) -> Iterator[StopSignal]:
        """SIGINT and SIGTERM go to this object while the block runs (main thread only; elsewhere nothing
        changes)."""
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        old = {s: signal.signal(s, self._handle) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield self
        finally:
            for s, h in old.items():
                signal.signal(s, h)


def resume_hint(run_dir: Path) -> str:
    """The command that continues the run in ``run_dir``."""
    return f"slea train --resume {shlex.quote(str(run_dir))}"
