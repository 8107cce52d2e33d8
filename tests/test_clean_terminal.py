"""The user's terminal stays clean: a training job prints no library deprecation warning that slea's own calls
cause (a call of a deprecated transformers/peft/torch API, directly or through a library slea calls)."""

from __future__ import annotations

import traceback
import warnings
from pathlib import Path

import pytest

import slea

ROOT = Path(__file__).resolve().parents[1]
SLEA = Path(slea.__file__).resolve().parent
DEPRECATIONS = (DeprecationWarning, PendingDeprecationWarning, FutureWarning)


def caused_by_slea(stack: list[traceback.FrameSummary]) -> bool:
    """Whether a warning raised with this call stack (outermost first) comes from a call slea made: a frame of
    slea's package is on it, and no module is being imported between slea's innermost frame and the warning (a
    library that warns while it is imported warns about itself, whoever imports it)."""
    inside = [i for i, f in enumerate(stack) if Path(f.filename).resolve().is_relative_to(SLEA)]
    if not inside:
        return False
    return not any("importlib._bootstrap" in f.filename for f in stack[inside[-1] + 1:])


def test_caused_by_slea_reads_the_call_stack():
    def frame(path):
        return traceback.FrameSummary(str(path), 1, "f")

    lib = Path(warnings.__file__)
    assert caused_by_slea([frame(SLEA / "cli" / "main.py"), frame(lib)])
    assert not caused_by_slea([frame(lib), frame(lib)])
    assert not caused_by_slea([frame(SLEA / "cli" / "main.py"), frame("<frozen importlib._bootstrap>"), frame(lib)])


@pytest.mark.slow
def test_the_smoke_job_raises_no_deprecation_warning_of_slea_s_calls(tmp_path, slea_cli):
    """configs/smoke.yaml cut to one iteration and one held-out episode, with gradient checkpointing on (its
    enabling call is transformers API too), in this process with every deprecation warning shown."""
    pytest.importorskip("textworld")
    seen: list[tuple[str, str, list[str]]] = []

    def record(message, category, filename, lineno, file=None, line=None):
        stack = traceback.extract_stack()[:-1]
        if issubclass(category, DEPRECATIONS) and caused_by_slea(stack):
            calls = [f"{f.filename}:{f.lineno} {f.name}" for f in stack
                     if Path(f.filename).resolve().is_relative_to(SLEA)][-3:]
            seen.append((category.__name__, f"{filename}:{lineno}: {message}", calls))

    with warnings.catch_warnings():
        for category in DEPRECATIONS:
            warnings.simplefilter("always", category)
        warnings.showwarning = record
        r = slea_cli("train", ROOT / "configs" / "smoke.yaml", "--set", f"run.dir={tmp_path / 'run'}",
                     "--set", "train.iterations=1", "--set", "train.gradient_checkpointing=true",
                     "--set", "eval.before=false", "--set", "eval.greedy=false", "--set", "eval.games=1",
                     "--set", "eval.episodes_per_game=1", "--set", "env.max_steps=2")
    assert r.returncode == 0, r.stderr[-3000:]
    assert not seen, "\n".join(f"{c}: {m}\n  from slea: {calls}" for c, m, calls in seen)
