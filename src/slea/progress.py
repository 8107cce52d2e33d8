"""Log lines and progress, for a person at a terminal and for logs nobody watches.

Everything slea reports goes through the standard :mod:`logging` module, logger ``"slea"`` (and its children).
:func:`setup_logging` (called by the CLI) gives it a rich handler when the output is a terminal, and plain
timestamped lines otherwise (CI logs, ``| tee``, ``nohup``). A :class:`Progress` phase shows a transient rich bar
on a terminal; elsewhere it logs a plain line at most every ``every_s`` seconds and one when the phase ends, with
what is done and the time elapsed. Used as a library without :func:`setup_logging`, slea prints only warnings.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from typing import IO, TYPE_CHECKING, Any, Self

if TYPE_CHECKING:  # rich is imported where a terminal needs it
    from rich.console import Console, ConsoleRenderable
    from rich.progress import Progress as Bar
    from rich.progress import TaskID

log = logging.getLogger("slea")

PLAIN_FORMAT = "%(asctime)s %(message)s"


def setup_logging(level: int = logging.INFO, stream: IO[str] | None = None) -> None:
    """Point the ``slea`` logger at ``stream`` (default stdout): rich on a terminal, plain lines otherwise."""
    stream = stream or sys.stdout
    for h in list(log.handlers):
        log.removeHandler(h)
    if _isatty(stream):
        from rich.console import Console

        handler: logging.Handler = _terminal_handler(Console(file=stream))
    else:
        handler = logging.StreamHandler(stream)
        handler.setFormatter(logging.Formatter(PLAIN_FORMAT, datefmt="%H:%M:%S"))
    log.addHandler(handler)
    log.setLevel(level)


def _terminal_handler(console: Console) -> logging.Handler:
    """rich's log handler, narrow enough for 80 columns: no time and no level column (a warning or error says so
    in its first word instead; progress bars and phase lines carry their own seconds), so a line of 80 characters
    is shown whole. Plain lines (not a terminal) keep their timestamps."""
    from rich.logging import RichHandler

    class Handler(RichHandler):
        def render_message(self, record: logging.LogRecord, message: str) -> ConsoleRenderable:
            if record.levelno >= logging.WARNING:
                message = f"{record.levelname.lower()}: {message}"
            return super().render_message(record, message)

    return Handler(console=console, show_path=False, show_level=False, show_time=False, markup=False,
                   rich_tracebacks=False)


def _isatty(stream: IO[Any]) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def _rich_console() -> Console | None:
    """The console of the rich handler, when the ``slea`` logger writes to a terminal (else ``None``)."""
    for h in log.handlers:
        console: Console | None = getattr(h, "console", None)
        if console is not None:
            return console
    return None


class Progress:
    """One phase of work: ``with Progress("rollout", total=8, unit="turns") as p: p.update(3, "12/24 episodes
    done")`` reads ``rollout: 3/8 turns, 12/24 episodes done``: the counter names what it counts (``unit``)."""

    def __init__(self, name: str, total: int, *, unit: str = "", every_s: float = 15.0) -> None:
        self.name = name
        self.unit = unit
        self.total = max(int(total), 1)
        self.every_s = every_s
        self.done = 0
        self.note = ""
        self._t0 = self._last = 0.0
        self._bar: Bar | None = None
        self._task: TaskID | None = None

    def __enter__(self) -> Self:
        self._t0 = self._last = time.perf_counter()
        console = _rich_console()
        if console is not None:
            from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
            from rich.progress import Progress as Bar

            bar = Bar(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                      TextColumn(self.unit), TimeElapsedColumn(), console=console, transient=True)
            bar.start()
            self._bar, self._task = bar, bar.add_task(self.name, total=self.total)
        return self

    def update(self, done: int, note: str = "", total: int | None = None) -> None:
        self.done, self.note = int(done), note
        if total is not None:
            self.total = max(int(total), 1)
        if self._bar is not None and self._task is not None:
            desc = f"{self.name} ({note})" if note else self.name
            self._bar.update(self._task, completed=self.done, total=self.total, description=desc)
        elif time.perf_counter() - self._last >= self.every_s:
            self._line()

    def _line(self) -> None:
        self._last = time.perf_counter()
        note = f", {self.note}" if self.note else ""
        unit = f" {self.unit}" if self.unit else ""
        log.info("%s: %d/%d%s%s [%.0fs]", self.name, self.done, self.total, unit, note, self._last - self._t0)

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()
        elif exc[0] is None and log.isEnabledFor(logging.INFO):
            self._line()


def episodes_note(bar: Progress, n: int) -> Callable[[int, int], None]:
    """A collection's ``progress(turn, live)`` callback: the bar's note says how many of its ``n`` episodes ended."""
    return lambda turn, live: bar.update(turn, f"{n - live}/{n} episodes done")
