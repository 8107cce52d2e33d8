"""Shared fixtures: a tiny random model with a locally trained tokenizer (built once, cached), a tiny SLEA-RL run
folder with a library (trained once per test process), and the ``device`` a numerics test runs on (``cpu``, and ``cuda`` under the ``gpu`` marker, skipped without CUDA).

Under pytest-xdist (``make test`` runs two worker processes) every worker computes on one thread, so the workers
do not oversubscribe the cores: ``OMP_NUM_THREADS`` (and MKL's, OpenBLAS's) default to 1 in the worker and in the
commands it starts, and torch's intra-op thread count is put back to 1 before each test (an in-process training
sets it to its ``run.threads``). A command started with an explicit ``run.threads`` still uses that many."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

XDIST_WORKER = os.environ.get("PYTEST_XDIST_WORKER")  # "gw0", "gw1", ... in a pytest-xdist worker, else None
if XDIST_WORKER:
    for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ.setdefault(_var, "1")


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    """``gpu`` tests need a CUDA device: skipped (with the reason) where torch sees none."""
    if any(item.get_closest_marker("gpu") for item in items) and not _cuda():
        skip = pytest.mark.skip(reason="needs a CUDA device (gpu marker); torch sees none")
        for item in items:
            if item.get_closest_marker("gpu"):
                item.add_marker(skip)


@pytest.fixture(autouse=True)
def _one_thread_per_xdist_worker():
    """In a pytest-xdist worker: torch computes on one thread in each test (see the module's docstring)."""
    if XDIST_WORKER:
        import torch

        torch.set_num_threads(1)


@pytest.fixture(params=["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def device(request) -> str:
    """The device a numerics test runs on: ``cpu`` always, ``cuda`` on a machine with a GPU (``-m gpu``)."""
    return request.param


@pytest.fixture(scope="session")
def tiny_policy():
    """(model, tokenizer) of the tiny test model, fp32, no LoRA."""
    import torch

    from slea.config import ModelSection
    from slea.policy.model import load_policy

    torch.manual_seed(0)
    model, tok = load_policy(ModelSection(name_or_path="tiny", lora=False, dtype="float32"))
    return model, tok


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory):
    """A two-iteration SLEA-RL run of the tiny model on Sokoban (``slea.testing.tiny_run``) whose library holds
    entries: what the library, agent and serve tests read as "a saved run". Trained once per test process, in a
    child interpreter (the training's thread count, random states and logging stay out of this one); read it,
    never write into it. The folder is named ``tiny-run`` (the run's name in its library's provenance)."""
    import subprocess
    import sys
    from pathlib import Path

    run = tmp_path_factory.mktemp("saved") / "tiny-run"
    code = f"from slea.testing.tiny_run import tiny_slea_run; tiny_slea_run({str(run)!r})"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=300,
                       env=dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1] / "src")))
    assert r.returncode == 0, r.stderr[-3000:]
    return run


@pytest.fixture
def qa_files(tmp_path) -> dict:
    """Env kwargs of ``slea/SearchQA-file-v0`` / ``slea/SearchQA-tools-file-v0`` over a two-document corpus and
    two questions (Paris, Berlin) written under ``tmp_path``, every question in the played split."""
    import json

    docs = [{"title": "Paris", "text": "Paris is the capital of France."},
            {"title": "Berlin", "text": "Berlin is the capital of Germany."}]
    qs = [{"question": "What is the capital of France?", "answers": ["Paris"]},
          {"question": "What is the capital of Germany?", "answers": ["Berlin"]}]
    (tmp_path / "corpus.jsonl").write_text("\n".join(json.dumps(d) for d in docs))
    (tmp_path / "q.jsonl").write_text("\n".join(json.dumps(q) for q in qs))
    return {"dataset_path": str(tmp_path / "q.jsonl"), "corpus": str(tmp_path / "corpus.jsonl"), "split": "all"}


@pytest.fixture
def slea_cli(monkeypatch):
    """``slea ARGS`` run in this process (typer's CliRunner) instead of a fresh interpreter, which spends 1-2 s
    importing before it reads its first argument: for error paths and cheap commands. Returns a
    ``subprocess.CompletedProcess`` (``returncode``, ``stdout``, ``stderr``), as a real ``slea`` would: an
    exception that escapes the command is exit code 1 with its traceback on stderr. ``cwd``: run from that folder
    (a ``plugins: [module]`` there is found as the real command finds it). What a command changes in the process
    (torch's thread count, the global random states, the ``slea`` logger's handlers, ``sys.path``, the
    environment, the working folder) is put back."""
    import logging
    import random
    import subprocess
    import sys
    import traceback

    import numpy as np
    import torch
    from typer.testing import CliRunner

    from slea.cli import app

    def run(*args, cwd=None) -> subprocess.CompletedProcess:
        log = logging.getLogger("slea")
        handlers, level, threads = list(log.handlers), log.level, torch.get_num_threads()
        states = torch.get_rng_state(), random.getstate(), np.random.get_state()
        environ = dict(os.environ)
        try:
            with monkeypatch.context() as m:
                m.setattr(sys, "path", list(sys.path))
                if cwd is not None:
                    m.chdir(cwd)
                res = CliRunner().invoke(app, [str(a) for a in args])
        finally:
            log.handlers[:] = handlers
            log.setLevel(level)
            torch.set_num_threads(threads)
            torch.set_rng_state(states[0])
            random.setstate(states[1])
            np.random.set_state(states[2])
            os.environ.clear()
            os.environ.update(environ)
        stderr = res.stderr
        if res.exception is not None and not isinstance(res.exception, SystemExit):
            stderr += "".join(traceback.format_exception(res.exception))
        return subprocess.CompletedProcess(["slea", *map(str, args)], res.exit_code, res.stdout, stderr)

    return run
