"""Progress when nobody watches a terminal: plain timestamped lines through the standard logging module."""

from __future__ import annotations

import io
import re

from slea.progress import Progress, log, setup_logging


def test_plain_lines_when_the_output_is_not_a_terminal():
    out = io.StringIO()  # not a TTY, like `| tee`, CI logs, nohup
    setup_logging(stream=out)
    try:
        with Progress("held-out eval (sampled)", total=8, unit="turns", every_s=0.0) as bar:
            bar.update(3, "5/32 episodes done")
            bar.update(8, "32/32 episodes done")
        log.warning("skipping damaged checkpoint iter_000002")
    finally:
        setup_logging(stream=io.StringIO())
    lines = out.getvalue().splitlines()
    # the counter names what it counts: 3 of 8 turns played, 5 of 32 episodes over
    assert re.fullmatch(r"\d\d:\d\d:\d\d held-out eval \(sampled\): 3/8 turns, 5/32 episodes done \[\d+s\]", lines[0])
    assert re.search(r"8/8 turns, 32/32 episodes done \[\d+s\]$", lines[-2])  # the closing line of the phase
    assert "skipping damaged checkpoint" in lines[-1]
    assert "\x1b[" not in out.getvalue()  # no terminal escape codes in a log


def test_lines_are_rate_limited_but_the_phase_always_ends_with_one():
    out = io.StringIO()
    setup_logging(stream=out)
    try:
        with Progress("rollout", total=100, every_s=3600.0) as bar:
            for i in range(100):
                bar.update(i + 1)
    finally:
        setup_logging(stream=io.StringIO())
    assert out.getvalue().count("rollout:") == 1 and "100/100" in out.getvalue()



def test_a_terminal_gets_lines_that_read_at_80_columns(monkeypatch):
    """On a terminal (rich): no time or level column eats the width, so an 80-character line is shown whole; a
    warning says so in its first word."""
    monkeypatch.setenv("COLUMNS", "80")

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    out = Terminal()
    setup_logging(stream=out)
    try:
        line = "iter 12/40  success 0.25  return -0.30  invalid 0.50  loss -0.0123  [16s]".ljust(80, ".")
        log.info(line)
        log.warning("skipping damaged checkpoint iter_000002")
    finally:
        setup_logging(stream=io.StringIO())
    text = re.sub(r"\x1b\[[0-9;]*m", "", out.getvalue())
    lines = [x.rstrip() for x in text.splitlines()]
    assert lines == [line, "warning: skipping damaged checkpoint iter_000002"]
