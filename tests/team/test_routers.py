"""Routers: round-robin by default, pluggable through the registry, checked choices."""

from __future__ import annotations

import pytest

from slea.team import ENV, ROUTERS, SharedContext, get_router, register_router, round_robin, route
from slea.team.context import INVALID


def test_round_robin_cycles_through_the_agents():
    ctx = SharedContext()
    assert [round_robin(t, ctx, 3) for t in range(7)] == [0, 1, 2, 0, 1, 2, 0]
    assert [route(round_robin, t, ctx, 2) for t in range(4)] == [0, 1, 0, 1]
    assert get_router("round-robin") is round_robin  # names: case-insensitive, - equals _


def test_a_registered_router_is_found_by_name_and_reads_the_context():
    name = "test_critic_after_answers"
    try:
        @register_router(name)
        def critic_after_answers(turn, context, n_agents):
            return 1 if "<answer>" in context.messages[-1].text else 0

        ctx = SharedContext()
        ctx.add("env", "Question: who?")
        assert route(get_router(name), 0, ctx, 2) == 0
        ctx.add("proposer", "<answer> me </answer>", 0)
        assert route(get_router(name), 1, ctx, 2) == 1
        with pytest.raises(ValueError, match="already registered"):
            register_router(name)(lambda t, c, n: 0)
    finally:
        ROUTERS.remove(name)


def test_unknown_router_and_out_of_range_choice_are_errors():
    with pytest.raises(KeyError, match="known: .*round_robin"):
        get_router("nope")
    with pytest.raises(ValueError, match="chose agent 2; expected an index in 0..1"):
        route(lambda t, c, n: 2, 0, SharedContext(), 2)
    with pytest.raises(ValueError, match="chose agent"):
        route(lambda t, c, n: "actor", 0, SharedContext(), 2)


def test_retry_invalid_gives_a_refused_move_back_to_its_agent():
    retry = get_router("retry_invalid")
    ctx = SharedContext()
    ctx.add(ENV, "Ballot 1 of 3.")
    assert retry(0, ctx, 3) == 0
    ctx.add("a", "red", 0)
    ctx.add(ENV, "Ballot 2 of 3.")
    assert retry(1, ctx, 3) == 1
    ctx.add("b", "puppy", 1)
    ctx.add(ENV, INVALID + "it is not one of the valid commands.")
    assert retry(2, ctx, 3) == 1  # round-robin would say 2
    ctx.add("b", "dog", 1)
    ctx.add(ENV, "Ballot 3 of 3.")
    assert retry(3, ctx, 3) == 2
    ctx.add("c", "note to self", 2)  # a message the env does not answer (a planner's) passes the turn on
    assert retry(4, ctx, 3) == 0


def test_retry_invalid_is_round_robin_without_invalid_moves():
    retry, ctx = get_router("retry_invalid"), SharedContext()
    order = []
    for turn in range(7):
        order.append(retry(turn, ctx, 3))
        ctx.add(f"agent{order[-1]}", "move", order[-1])
        ctx.add(ENV, "ok")
    assert order == [round_robin(t, ctx, 3) for t in range(7)]
