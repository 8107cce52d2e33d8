"""Both trainers give the run lifecycle what :class:`slea.trainer.lifecycle.Run` asks (slea/trainer/contract.py
checks it statically), with the same parameters; the contract is its run state and six methods, ``close`` the one
teardown."""

from __future__ import annotations

import inspect

import pytest

from slea.trainer.lifecycle import Run

METHODS = ("start", "step", "save", "evaluate", "summary", "close")


def _members(cls) -> set[str]:
    return {n for n in {*vars(cls), *cls.__annotations__} if not n.startswith("_")}


def test_the_contract_is_the_run_state_and_six_methods():
    assert _members(Run) == {"state", *METHODS}


@pytest.mark.parametrize("trainer", ["slea.trainer.rl:Trainer", "slea.trainer.team:TeamTrainer"])
def test_each_trainer_has_every_method_with_the_contract_s_parameters(trainer):
    import importlib

    module, name = trainer.split(":")
    cls = getattr(importlib.import_module(module), name)
    for method in METHODS:
        want = list(inspect.signature(getattr(Run, method)).parameters)
        got = list(inspect.signature(getattr(cls, method)).parameters)
        assert len(got) == len(want), (name, method, got)
    assert "state" in inspect.getsource(cls.__init__)  # its RunState, built with the trainer
    for gone in ("release", "finish", "close_rank", "budget_stop", "begin", "report", "interrupted"):
        assert not hasattr(Run, gone)
