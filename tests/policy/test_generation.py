import copy

import pytest
import torch

from slea.policy import generation
from slea.policy.generation import HFGenerator, left_pad
from slea.trainer.update import Sample, response_logprobs


def _prompts(tok):
    texts = ["Goal: take the coin. Your command:", "You see a door. Your command:"]
    return [tok(t, add_special_tokens=False).input_ids for t in texts]


def on(device, tiny_policy):
    """The tiny policy on ``device`` (the session's own model on the CPU, a copy elsewhere)."""
    model, tok = tiny_policy
    return (model if device == "cpu" else copy.deepcopy(model).to(device)), tok


def test_left_pad(device):
    ids, mask = left_pad([[5, 6], [7]], pad_id=0, device=device)
    assert ids.tolist() == [[5, 6], [0, 7]]
    assert mask.tolist() == [[1, 1], [0, 1]]
    assert ids.device.type == mask.device.type == device


def test_generation_rows_stop_and_logprobs_match_training_forward(tiny_policy, device):
    model, tok = on(device, tiny_policy)
    gen = HFGenerator(model, tok, dtype="float32")
    torch.manual_seed(1)
    prompts = _prompts(tok)
    outs = gen.generate(prompts, max_new_tokens=8, temperature=1.0)
    assert gen.calls == 1 and len(outs) == 2
    for o in outs:
        assert 1 <= len(o.ids) <= 8 and len(o.ids) == len(o.logprobs)
        # nothing is kept after a stop token
        stops = set(gen.stop_ids) | {tok.eos_token_id}
        assert not any(t in stops for t in o.ids[:-1])
    samples = [Sample(p, o.ids, o.logprobs, [0.0] * len(o.ids)) for p, o in zip(prompts, outs)]
    logp, mask = response_logprobs(model, samples, temperature=1.0, dtype="float32")
    for row, s in enumerate(samples):
        k = len(s.response_ids)
        got = logp[row, -k:]
        assert mask[row].sum() == k
        assert torch.allclose(got.cpu(), torch.tensor(s.old_logprobs), atol=1e-4)


@pytest.mark.parametrize("temperature", [0.7, 0.0])
def test_each_generated_token_carries_the_entropy_of_the_distribution_it_was_drawn_from(tiny_policy, temperature):
    """``Generation.entropy``: per token, −Σ p log p of softmax(logits / T) (T = 1 for greedy), checked against
    an independent full forward of prompt + response."""
    model, tok = tiny_policy
    prompts = _prompts(tok)
    outs = HFGenerator(model, tok, dtype="float32", stop_at_newline=False).generate(
        prompts, max_new_tokens=4, temperature=temperature, rng_keys=[(0, 1), (0, 2)])
    for p, o in zip(prompts, outs):
        assert len(o.entropy) == len(o.ids)
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([p + o.ids])).logits[0, len(p) - 1:-1].float()
        probs = torch.softmax(logits / (temperature or 1.0), -1)
        want = (-(probs * probs.log()).sum(-1)).tolist()
        assert o.entropy == pytest.approx(want, rel=1e-4)


def test_response_logprobs_equal_unpadded_full_forward(tiny_policy):
    model, _ = tiny_policy
    samples = [Sample([3, 4, 5, 6, 7], [8, 9], [0.0, 0.0], [1.0] * 2), Sample([10, 11], [12, 13, 14], [0.0] * 3, [1.0] * 3)]
    logp, mask = response_logprobs(model, samples, temperature=0.7, dtype="float32")
    for row, s in enumerate(samples):
        ids = torch.tensor([s.prompt_ids + s.response_ids])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0].float() / 0.7
        ref = torch.log_softmax(logits[:-1], -1).gather(-1, ids[0, 1:].unsqueeze(-1)).squeeze(-1)
        k = len(s.response_ids)
        assert torch.allclose(logp[row, -k:], ref[-k:], atol=1e-4)
        assert mask[row, :-k].sum() == 0


def test_greedy_is_deterministic_and_the_same_on_every_device(tiny_policy, device):
    model, tok = on(device, tiny_policy)
    gen = HFGenerator(model, tok, dtype="float32")
    a = gen.generate(_prompts(tok), max_new_tokens=6, temperature=0.0)
    b = gen.generate(_prompts(tok), max_new_tokens=6, temperature=0.0)
    assert [o.ids for o in a] == [o.ids for o in b]
    cpu = HFGenerator(*tiny_policy, dtype="float32").generate(_prompts(tok), max_new_tokens=6, temperature=0.0)
    assert [o.ids for o in a] == [o.ids for o in cpu]
    for x, y in zip(a, cpu):
        assert max(abs(p - q) for p, q in zip(x.logprobs, y.logprobs)) < 1e-4


def test_max_batch_chunks_the_rows_without_changing_what_they_sample(tiny_policy):
    model, tok = tiny_policy
    prompts = _prompts(tok) * 3
    keys = [(2, 5, c, 0) for c in range(len(prompts))]
    runs = []
    for max_batch in (32, 4, 1):
        gen = HFGenerator(model, tok, dtype="float32", max_batch=max_batch)
        outs = gen.generate(prompts, max_new_tokens=6, temperature=1.0, rng_keys=keys)
        runs.append([(o.ids, o.logprobs) for o in outs])
    assert [[ids for ids, _ in r] for r in runs[1:]] == [[ids for ids, _ in runs[0]]] * 2
    for r in runs[1:]:
        for (_, a), (_, b) in zip(runs[0], r):
            assert max(abs(x - y) for x, y in zip(a, b)) < 1e-5


def test_sampled_tokens_reach_the_host_once_per_step_not_per_row(tiny_policy, monkeypatch):
    model, tok = tiny_policy
    calls = []
    real = generation.to_host

    def counting(tokens, logprobs, entropy):
        calls.append(tokens.shape[0])
        return real(tokens, logprobs, entropy)

    monkeypatch.setattr(generation, "to_host", counting)
    prompts = _prompts(tok) * 4  # 8 rows, one chunk
    outs = HFGenerator(model, tok, dtype="float32", stop_at_newline=False).generate(
        prompts, max_new_tokens=5, temperature=1.0, rng_keys=[(0, c) for c in range(8)])
    steps = max(len(o.ids) for o in outs)
    assert len(calls) == steps  # one copy per decode step, for all its live rows
    assert calls[0] == 8 and sum(calls) == sum(len(o.ids) for o in outs)


def test_shared_prefix_forward_equals_plain_forward_with_gradients(device):
    from slea.config import ModelSection
    from slea.policy.model import load_policy

    torch.manual_seed(0)
    model, _ = load_policy(ModelSection(name_or_path="tiny", lora=True, lora_r=4, dtype="float32"), device=device)
    # make the adapters non-zero so the prefix KV depends on trainable weights
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.05)
    common = [1, 5, 9, 14, 22, 30, 31, 40]
    samples = [Sample(common + [50, 51], [60, 61, 62], [0.0] * 3, [1.0] * 3),
               Sample(common + [52], [63], [0.0], [1.0]),
               Sample(common + [53, 54, 55], [64, 65], [0.0] * 2, [1.0] * 2)]
    results = []
    for share in (False, True):
        model.zero_grad()
        logp, mask = response_logprobs(model, samples, temperature=1.0, dtype="float32", share_prefix=share)
        (logp * mask).sum().backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
        results.append((logp.detach(), mask, grads))
    (a, ma, ga), (b, mb, gb) = results
    assert torch.equal(ma, mb)
    assert torch.allclose(a, b, atol=1e-5)
    for n in ga:
        assert torch.allclose(ga[n], gb[n], atol=1e-5), n


def test_inverse_cdf_hand_case():
    from slea.policy.generation import inverse_cdf

    # cdf = [.2, .2, .7, 1.0]: token 1 has probability 0 and is never drawn
    probs = torch.tensor([[0.2, 0.0, 0.5, 0.3]]).expand(6, -1)
    u = torch.tensor([0.0, 0.1, 0.21, 0.69, 0.71, 0.999])
    assert inverse_cdf(probs, u).tolist() == [0, 0, 2, 2, 3, 3]
    # unnormalised rows (what softmax of truncated logits may leave) scale the same way
    assert inverse_cdf(probs * 4, u).tolist() == [0, 0, 2, 2, 3, 3]


def test_keyed_sampling_ignores_the_global_rng_and_the_batch(tiny_policy):
    model, tok = tiny_policy
    gen = HFGenerator(model, tok, dtype="float32")
    prompts = _prompts(tok) * 2
    keys = [(1, 7, c, 0) for c in range(4)]
    torch.manual_seed(0)
    a = gen.generate(prompts, max_new_tokens=8, temperature=1.0, rng_keys=keys)
    torch.manual_seed(123)
    torch.rand(1000)  # whatever else ran in the process
    b = gen.generate(prompts, max_new_tokens=8, temperature=1.0, rng_keys=keys)
    assert [o.ids for o in a] == [o.ids for o in b]
    # a row's tokens depend on its key, not on the other rows of the batch or their order
    c = gen.generate([prompts[3], prompts[0]], max_new_tokens=8, temperature=1.0, rng_keys=[keys[3], keys[0]])
    assert [c[0].ids, c[1].ids] == [a[3].ids, a[0].ids]
    # the copies of one prompt draw from different streams
    assert len({tuple(o.ids) for o in a}) > 1
    with pytest.raises(ValueError, match="rng_keys"):
        gen.generate(prompts, rng_keys=keys[:1])


def test_newline_stop_is_chosen_per_call(tiny_policy):
    model, tok = tiny_policy
    gen = HFGenerator(model, tok, dtype="float32")  # default: stop at a newline
    prompts = _prompts(tok) * 8
    keys = [(0, 1, c, 0) for c in range(len(prompts))]
    one_line = gen.generate(prompts, max_new_tokens=24, temperature=1.0, rng_keys=keys)
    multi = gen.generate(prompts, max_new_tokens=24, temperature=1.0, rng_keys=keys, stop_at_newline=False)
    stopped = 0
    for a, b in zip(one_line, multi):
        assert b.ids[:len(a.ids)] == a.ids  # same stream: the one-line answer is a prefix of the free one
        if a.ids[-1] in gen.stop_ids and a.ids[-1] != tok.eos_token_id:
            stopped += 1
            assert len(b.ids) > len(a.ids)  # the newline did not end the multi-line answer
    assert stopped > 0  # the tiny model does emit newlines: the comparison above was exercised


def test_stop_strings_end_a_row_at_the_token_that_completes_one(tiny_policy):
    model, tok = tiny_policy
    gen = HFGenerator(model, tok, dtype="float32", stop_at_newline=False)
    prompts = _prompts(tok) * 4
    keys = [(0, 2, c, 0) for c in range(len(prompts))]
    free = gen.generate(prompts, max_new_tokens=24, temperature=1.0, rng_keys=keys)
    # a stop string spanning two tokens of the first row's answer, from its fourth token on
    stop = tok.decode(free[0].ids[3:5], skip_special_tokens=True)
    assert len(stop) >= 2
    cut = gen.generate(prompts, max_new_tokens=24, temperature=1.0, rng_keys=keys, stop=[stop])
    stopped = 0
    for a, b in zip(cut, free):
        assert b.ids[:len(a.ids)] == a.ids  # the same stream, cut (log-probs: up to the batch's numerics)
        assert a.logprobs == pytest.approx(b.logprobs[:len(a.logprobs)], abs=1e-4)
        if stop in b.text:
            stopped += 1
            assert stop in a.text and stop not in tok.decode(a.ids[:-1], skip_special_tokens=True)
            assert a.text == tok.decode(a.ids, skip_special_tokens=True)  # the ids as generated, stop included
        else:
            assert a.ids == b.ids
    assert stopped >= 1 and len(cut[0].ids) <= 5
    # no stop strings: the answers are the free ones
    assert [o.ids for o in gen.generate(prompts, max_new_tokens=24, temperature=1.0, rng_keys=keys, stop=[""])
            ] == [o.ids for o in free]
