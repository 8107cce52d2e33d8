"""The trie of shared prefixes (slea/policy/prefix.py): which nodes a micro-batch's prompts make, and that the
update's forward over it gives the plain forward's log-probs and LoRA gradients while computing fewer tokens,
and generation's prefill over it the plain forward's log-probs."""

from __future__ import annotations

import functools
import random

import pytest
import torch

from slea.config import ModelSection
from slea.policy.model import load_policy
from slea.policy.prefix import Node, build_trie, fan_out
from slea.testing.numerics import (
    assert_same,
    assert_within,
    gradient_tolerance,
    logprob_tolerance,
    numerics_dtype,
)
from slea.trainer import update as U

DTYPE = numerics_dtype()
LAYOUT = "the trie of shared prefixes against the plain left-padded forward (case 2: another batch layout)"


# -- the trie ---------------------------------------------------------------------------------------------------
def test_nested_prefixes_make_one_node_per_shared_run():
    """Bodies (prompts less their last token) A=[1,2,3,4] twice, B=[1,2,3,7,8], C=[1,2]: [1,2] is shared by all,
    [3] by A, A, B, [4] by the two copies of A; each row continues from its deepest node."""
    a, b, c = [1, 2, 3, 4, 5], [1, 2, 3, 7, 8, 9], [1, 2, 6]
    trie = build_trie([a, a, b, c], min_saved=1)
    assert trie.nodes == (Node((1, 2), 0, -1, 1), Node((3,), 2, 0, 2), Node((4,), 3, 1, 3))
    assert trie.row_node == (2, 2, 1, 0)
    assert [trie.own_start(r) for r in range(4)] == [4, 4, 3, 2]  # own tokens: [5], [5], [7, 8, 9], [6]
    assert trie.chain(2, 3) == [0, 1, 2] and trie.chain(0, 3) == [0, -1, -1] and trie.chain(-1, 2) == [-1, -1]


def test_the_depth_bound_keeps_the_common_prefix_alone():
    a, b = [1, 2, 3, 4, 5], [1, 2, 7, 8, 9]
    assert build_trie([a, a, b], max_depth=1, min_saved=1).nodes == (Node((1, 2), 0, -1, 1),)
    assert build_trie([a, a, b], max_depth=1, min_saved=1).row_node == (0, 0, 0)
    assert build_trie([a, a, b], max_depth=0, min_saved=1).nodes == ()
    assert len(build_trie([a, a, b], min_saved=1).nodes) == 2


def test_a_run_that_saves_too_little_is_left_to_the_nodes_below():
    """[1, 2] is shared by 3 rows (saves 2 x 2 = 4 positions), [3, 4, 5, 6] then by 2 (saves 4): with
    ``min_saved`` 5 the top run is no node and the lower node starts at position 0, [1, 2] included."""
    a, b = [1, 2, 3, 4, 5, 6, 0], [1, 2, 9, 9]
    trie = build_trie([a, a, b], min_saved=5)
    assert trie.nodes == (Node((1, 2, 3, 4, 5, 6), 0, -1, 1),)
    assert trie.row_node == (0, 0, -1)
    assert build_trie([a, a, b], min_saved=4).nodes == (Node((1, 2), 0, -1, 1), Node((3, 4, 5, 6), 2, 0, 2))
    assert build_trie([a, a, b], min_saved=7).nodes == ()


def test_rows_without_a_common_prefix_share_their_repeats_only():
    trie = build_trie([[1, 2, 3], [4, 5, 6], [1, 2, 3], [9]], min_saved=1)
    assert trie.nodes == (Node((1, 2), 0, -1, 1),)
    assert trie.row_node == (0, -1, 0, -1)
    assert build_trie([[1, 2], [3, 4]], min_saved=1).nodes == () and build_trie([[1, 2, 3]], min_saved=1).nodes == ()


def test_fan_out_repeats_rows_and_sums_their_gradient():
    x = torch.tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)
    y = fan_out(x, [0, 0, -1, 1, 0])
    assert y.tolist() == [[1, 2], [1, 2], [0, 0], [3, 4], [1, 2]]
    (y * torch.arange(1.0, 6.0).unsqueeze(1)).sum().backward()
    assert x.grad.tolist() == [[8.0, 8.0], [4.0, 4.0]]  # row 0 read by rows 1, 2, 5 of y; row 1 by row 4


# -- the forward ------------------------------------------------------------------------------------------------
@pytest.fixture
def lora_model():
    """The tiny model with LoRA adapters whose B matrices are random (at init they are 0, and A's gradient too)."""
    torch.manual_seed(0)
    model, _ = load_policy(ModelSection(name_or_path="tiny", lora=True, lora_r=4, dtype="float32"))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.05)
    return model


def _rows(prompts: list[list[int]], seed: int) -> list[U.Sample]:
    rng = random.Random(seed)
    out = []
    for p in prompts:
        resp = [rng.randrange(10, 700) for _ in range(rng.randint(1, 6))]
        out.append(U.Sample(p, resp, [0.0] * len(resp), [rng.choice([-1.0, 0.5, 2.0])] * len(resp)))
    return out


def _tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(10, 700) for _ in range(n)]


def _cases() -> dict[str, list[list[int]]]:
    """Micro-batches of prompts: GRPO groups of one prompt (two games, prompts of different lengths), nested
    prompts (a later turn extends an earlier one), no repeats at all, repeats without a common prefix. Every
    shared run saves at least MIN_SAVED positions."""
    rng = random.Random(3)
    system, goal_a, goal_b = _tokens(rng, 20), _tokens(rng, 10), _tokens(rng, 14)
    turn_a, turn_b = system + goal_a + _tokens(rng, 8), system + goal_b + _tokens(rng, 12)
    later_a = turn_a + _tokens(rng, 20)
    return {
        "groups": [turn_a] * 3 + [turn_b] * 3,
        "nested": [turn_a, turn_a, later_a, later_a, system + goal_a + _tokens(rng, 3)],
        "distinct": [system + _tokens(rng, n) for n in (3, 8, 5, 2)],
        "no_common": [turn_a, _tokens(rng, 6), turn_a, _tokens(rng, 4)],
    }


def _forward(model, samples, share: bool):
    """Log-probs, mask and the LoRA gradient of a weighted sum of the log-probs."""
    model.zero_grad(set_to_none=True)
    logp, mask = U.response_logprobs(model, samples, dtype=DTYPE, share_prefix=share, prefix_levels=None)
    weights = torch.tensor([s.advantages[0] for s in samples]).unsqueeze(1)
    (logp * weights).sum().backward()
    grads = [p.grad.detach().clone() for p in model.parameters() if p.requires_grad]
    return logp.detach(), mask, grads


@functools.cache
def _tiny_config():
    from transformers import AutoConfig

    from slea.policy.tiny import tiny_model_dir

    return AutoConfig.from_pretrained(tiny_model_dir())


@pytest.mark.parametrize("case", list(_cases()))
def test_the_trie_forward_gives_the_plain_forward_s_logprobs_and_lora_gradient(lora_model, case):
    samples = _rows(_cases()[case], seed=len(case))
    trie = build_trie([s.prompt_ids for s in samples])
    assert trie.depth == {"groups": 2, "nested": 3, "distinct": 1, "no_common": 1}[case]
    got, mask, got_grad = _forward(lora_model, samples, share=True)
    want, want_mask, want_grad = _forward(lora_model, samples, share=False)
    assert_same(mask, want_mask, why="the same response lengths")
    with torch.no_grad():
        max_logit = max(float(lora_model(input_ids=torch.tensor([s.prompt_ids + s.response_ids])).logits.abs().max())
                        for s in samples)
    assert torch.isfinite(got).all()
    assert_within(got[mask.bool()], want[mask.bool()], logprob_tolerance(DTYPE, _tiny_config(), max_logit=max_logit),
                  why=LAYOUT)
    scale = max(float(g.abs().max()) for g in want_grad)
    assert scale > 0 and all(float(g.abs().max()) > 0 for g in got_grad[:2])
    assert_within(got_grad, want_grad, gradient_tolerance(DTYPE, _tiny_config(), scale=scale), why=LAYOUT)


def test_the_trie_s_gradient_is_bitwise_reproducible(lora_model):
    """The KV fan-out has no scatter in its backward: two runs give the same bits (case 1: one computation)."""
    samples = _rows(_cases()["nested"], seed=1)
    assert_same(_forward(lora_model, samples, True)[2], _forward(lora_model, samples, True)[2],
                why="the same forward and backward twice, on the same threads")


def _computed_tokens(model, samples, **kw) -> list[int]:
    """The number of token positions (padding included) of each call into the model."""
    counts: list[int] = []
    hook = model.get_input_embeddings().register_forward_hook(lambda _m, inp, _o: counts.append(inp[0].numel()))
    try:
        with torch.no_grad():
            U.response_logprobs_entropy(model, samples, dtype=DTYPE, **kw)
    finally:
        hook.remove()
    return counts


def test_each_shared_prompt_is_computed_once(lora_model):
    """Two GRPO groups of 3 rows: prompts of 16 and 20 tokens after a 6-token common prefix, responses of 2
    tokens. The plain forward computes 6 rows × 22 columns; the common prefix alone runs 6 tokens once, then
    6 rows × (14 + 2) columns; the trie runs the 6 tokens, each prompt's 9 and 13 further tokens once (padded to
    13 in one batch of 2), then 6 rows × (1 prompt token + 2)."""
    rng = random.Random(0)
    common = _tokens(rng, 6)
    a, b = common + [1] + _tokens(rng, 9), common + [2] + _tokens(rng, 13)
    samples = [U.Sample(p, [5, 6], [0.0, 0.0], [1.0, 1.0]) for p in [a] * 3 + [b] * 3]
    assert _computed_tokens(lora_model, samples, share_prefix=False) == [6 * 22]
    assert _computed_tokens(lora_model, samples, prefix_levels=1) == [6, 6 * 16]
    assert _computed_tokens(lora_model, samples) == [6, 6 * 16]  # the default: the common prefix alone
    assert _computed_tokens(lora_model, samples, prefix_levels=None) == [6, 2 * 13, 6 * 3]


# -- generation -------------------------------------------------------------------------------------------------
def _turns() -> dict[str, list[list[int]]]:
    """A rollout turn's prompts: ``_cases()``, and two games whose copies took different paths (a system prompt,
    each game's goal (18 and 23 tokens: its level pads one), each copy's own history; one copy a repeat)."""
    rng = random.Random(4)
    system, goals = _tokens(rng, 20), [_tokens(rng, 18), _tokens(rng, 23)]
    games = [system + g + _tokens(rng, n) for g in goals for n in (4, 7)]
    return {**_cases(), "games": games + games[:1]}


@pytest.mark.parametrize("case", list(_turns()))
def test_generation_prefills_over_the_trie_and_samples_each_row_as_it_would_alone(lora_model, case):
    """The engine prefills a call's distinct prompts over their trie and decodes from each row's fanned-out KV:
    each answer's log-probs are those of the plain forward over prompt + answer (no cache, no sharing) within the
    layout bound, and with keyed sampling a row draws what it draws when generated alone."""
    from slea.policy.generation import HFGenerator
    from slea.policy.model import load_tokenizer

    prompts = _turns()[case]
    assert build_trie(sorted({tuple(p) for p in prompts})).depth == {"groups": 1, "nested": 1, "distinct": 1,
                                                                     "no_common": 0, "games": 2}[case]
    gen = HFGenerator(lora_model, load_tokenizer("tiny"), dtype=DTYPE, stop_at_newline=False, prefix_levels=None)
    keys = [(9, row) for row in range(len(prompts))]
    together = gen.generate(prompts, max_new_tokens=6, temperature=1.0, rng_keys=keys)
    with torch.no_grad():
        plain = [U.response_logprobs(lora_model, [U.Sample(p, g.ids, [], [])], dtype=DTYPE, share_prefix=False)[0][0]
                 for p, g in zip(prompts, together)]
        max_logit = max(float(lora_model(input_ids=torch.tensor([p + g.ids])).logits.abs().max())
                        for p, g in zip(prompts, together))
    tol = logprob_tolerance(DTYPE, _tiny_config(), max_logit=max_logit)
    assert_within(torch.cat([torch.tensor(g.logprobs) for g in together]), torch.cat(plain), tol, why=LAYOUT)
    if DTYPE == "float32":  # in bf16 a draw can flip where rounding moves a CDF boundary past its uniform
        alone = [gen.generate([p], max_new_tokens=6, temperature=1.0, rng_keys=[k])[0] for p, k in zip(prompts, keys)]
        assert [g.ids for g in together] == [g.ids for g in alone]
