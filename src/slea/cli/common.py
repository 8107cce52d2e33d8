"""What every ``slea`` command shares: the consoles, one-line errors (exit code 2; ``slea --debug`` adds the
traceback behind one), config loading and the check that an env's optional extra is installed."""

from __future__ import annotations

import os
import sys
import traceback
from pathlib import Path

import typer
from rich.console import Console

console = Console()
err = Console(stderr=True)
DEBUG_ENV = "SLEA_DEBUG"  # set by `slea --debug`: also read by the processes a command starts (--nproc ranks)


def debugging() -> bool:
    """Whether ``slea --debug`` (or ``SLEA_DEBUG=1``) asked for the traceback behind every one-line error."""
    return os.environ.get(DEBUG_ENV, "") not in ("", "0")


def fail(msg: str, code: int = 2) -> typer.Exit:
    """Print one line on stderr; return the Exit to raise (``raise fail(...) from None``). Under ``--debug`` the
    traceback of the exception being handled (and of its cause) comes first."""
    if debugging() and sys.exc_info()[1] is not None:
        traceback.print_exc()
    err.print(msg, markup=False, highlight=False, soft_wrap=True)
    return typer.Exit(code)


def plain(msg: str) -> None:
    """One line of progress as it is (no markup, highlighting or re-wrapping)."""
    console.print(msg, markup=False, highlight=False, soft_wrap=True)


def run_config(config: Path | None, overrides: list[str], *, trains: bool = True, saved: bool = False):
    """The config, or one line and exit code 2. ``trains=False``: a command that trains nothing (a served model
    then needs no LoRA adapter; :func:`slea.config.build_config`). ``saved``: ``config`` is a run's own
    config.yaml, written by slea with every key: a setting that was a default when the run was made is not a
    user's setting that has no effect, so the unused-settings refusal is skipped (a run made before a default
    changed still resumes and evaluates)."""
    from slea.config import ConfigError, load_config

    try:
        return load_config(config, overrides, trains=trains, check_unused=not saved)
    except ConfigError as exc:
        raise fail(f"config error: {exc}") from None


def require_env(env_id: str) -> None:
    """The env's optional extra must be installed: checked before any model loads."""
    from slea.envs import registered

    spec = registered().get(env_id)
    missing = spec.missing() if spec is not None else []
    if missing:
        hint = f"pip install 'slea[{spec.extra}]'" if spec.extra else "install " + ", ".join(missing)
        raise fail(f"config error: env.id: {env_id} needs {', '.join(missing)}: {hint}")
