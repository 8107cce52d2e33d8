"""Policy loading: LoRA on all or only the top decoder layers (model.lora_layers)."""

from __future__ import annotations

import pytest

from slea.config import ConfigError, ModelSection
from slea.policy.model import load_policy, lora_layer_indices
from slea.testing.numerics import (
    assert_same,
    assert_within,
    exact_on,
    forward_stages,
    gradient_tolerance,
    logprob_tolerance,
    tolerance,
)


def test_lora_layer_indices():
    assert lora_layer_indices(None, 30) is None
    assert lora_layer_indices(15, 30) == list(range(15, 30))
    assert lora_layer_indices(30, 30) == list(range(30))
    assert lora_layer_indices([3, 1, 3], 4) == [1, 3]
    for bad in (0, 31, [30], [-1], []):
        with pytest.raises(ConfigError, match="model.lora_layers"):
            lora_layer_indices(bad, 30)


def _adapted_layers(model) -> set[int]:
    return {int(n.split(".layers.")[1].split(".")[0]) for n, p in model.named_parameters()
            if p.requires_grad and "lora_" in n}


def test_lora_on_the_top_layers_only():
    everywhere, _ = load_policy(ModelSection(name_or_path="tiny", dtype="float32"))
    top, _ = load_policy(ModelSection(name_or_path="tiny", dtype="float32", lora_layers=1))
    assert _adapted_layers(everywhere) == {0, 1}  # the tiny model has 2 decoder layers
    assert _adapted_layers(top) == {1}
    assert all("lora_" in n for n, p in top.named_parameters() if p.requires_grad)
    with pytest.raises(ConfigError, match="model.lora_layers"):
        load_policy(ModelSection(name_or_path="tiny", dtype="float32", lora_layers=3))


def test_a_build_without_config_json_is_never_put_in_place(tmp_path):
    from slea.atomic import atomic_model_dir

    final = tmp_path / "models" / "broken"
    with pytest.raises(RuntimeError, match="wrote no config.json"):
        atomic_model_dir(final, lambda tmp: (tmp / "tokenizer.json").write_text("{}"))  # what a rank > 0 builds
    assert not final.exists() and list(final.parent.iterdir()) == []
    assert atomic_model_dir(final, lambda tmp: (tmp / "config.json").write_text("{}")) == final


# -- devices, base dtype, gradient checkpointing ----------------------------------------------------------------
def _grads(model, samples, share_prefix: bool):
    from slea.trainer.update import response_logprobs

    model.train()
    model.zero_grad()
    logp, mask = response_logprobs(model, samples, temperature=1.0, dtype="float32", share_prefix=share_prefix)
    (logp * mask).sum().backward()
    return logp.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}


def _samples():
    from slea.trainer.update import Sample

    common = [1, 5, 9, 14, 22, 30, 31, 40, *range(41, 53)]  # 20 tokens: long enough to be a trie node (MIN_SAVED)
    return [Sample(common + [50, 51], [60, 61, 62], [0.0] * 3, [1.0] * 3),
            Sample(common + [52], [63], [0.0], [1.0])]


def _nonzero_lora(model, seed: int = 0):
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_" in n:  # A too: two loads draw different A's
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)


def test_the_policy_loads_onto_the_device(device):
    model, _ = load_policy(ModelSection(name_or_path="tiny", dtype="float32"), device=device)
    assert {p.device.type for p in model.parameters()} == {device}


def test_a_bf16_base_keeps_the_adapters_fp32_and_trains_them(device):
    import torch

    from slea.policy.generation import autocast

    cfg = ModelSection(name_or_path="tiny", base_dtype="bfloat16", lora_r=4)
    model, _ = load_policy(cfg, device=device)
    frozen = {p.dtype for p in model.parameters() if not p.requires_grad}
    trainable = {n: p for n, p in model.named_parameters() if p.requires_grad}
    assert frozen == {torch.bfloat16}
    assert trainable and all("lora_" in n and p.dtype == torch.float32 for n, p in trainable.items())
    ref, _ = load_policy(cfg.model_copy(update={"base_dtype": "float32"}), device=device)
    _nonzero_lora(model)
    _nonzero_lora(ref)
    ids = torch.tensor([[1, 5, 9, 14, 22, 30]], device=device)
    with torch.no_grad(), autocast("bfloat16", device):
        a, b = model(input_ids=ids).logits.float(), ref(input_ids=ids).logits.float()
    # case 2 of slea.testing.numerics: the same function up to bf16 storage of the base. Autocast already rounds
    # every matmul's weights and outputs to bf16; what differs is the rest of the path (embeddings, norm weights,
    # residual stream) rounded to bf16 at the stages of forward_stages, relative to the largest logit
    config = model.config
    width = max(config.hidden_size, config.intermediate_size)
    assert_within(a, b, tolerance("bfloat16", scale=float(b.abs().max()), stages=forward_stages(config.num_hidden_layers),
                                  n=width), why="bf16 base against an fp32 base under bf16 autocast")
    with autocast("bfloat16", device):
        model(input_ids=ids).logits.float().logsumexp(-1).sum().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0
               for p in trainable.values())


def test_gradient_checkpointing_gives_the_plain_forwards_gradients_and_refuses_the_shared_prefix(device):
    import copy

    import torch

    from slea.policy.model import enable_gradient_checkpointing

    torch.manual_seed(0)
    plain, _ = load_policy(ModelSection(name_or_path="tiny", dtype="float32", lora_r=4), device=device)
    _nonzero_lora(plain)
    ckpt = copy.deepcopy(plain)
    enable_gradient_checkpointing(ckpt)
    samples = _samples()
    a, ga = _grads(plain, samples, share_prefix=False)
    b, gb = _grads(ckpt, samples, share_prefix=False)
    with torch.no_grad():
        ids = torch.tensor([samples[0].prompt_ids + samples[0].response_ids], device=device)
        max_logit = float(plain(input_ids=ids).logits.abs().max())
    logp_bound = logprob_tolerance("float32", plain.config, max_logit=max_logit)
    if exact_on(device):
        # case 1: checkpointing recomputes each layer's forward with the same kernels on the same inputs, and the
        # backward then runs on the same values (CPU kernels are deterministic at a fixed thread count)
        why = "a checkpointed layer recomputes the very forward the plain model ran"
        assert_same(b, a, why=why)
        assert_same(gb, ga, why=why)
    else:  # case 2: CUDA's attention backward may accumulate with atomics, in another order each run
        assert_within(b, a, logp_bound, why="checkpointed against plain forward")
        scale = max(float(g.abs().max()) for g in ga.values())
        for n in ga:
            assert_within(gb[n], ga[n], gradient_tolerance("float32", plain.config, scale=scale), why=n)
    # the layers drop the KV cache they are given: the prefix-shared forward would read nothing, so it refuses
    with pytest.raises(RuntimeError, match="gradient-checkpointed"):
        _grads(ckpt, samples, share_prefix=True)
    # without gradients (generation, reference log-probs) the cache is kept and the shared prefix is exact
    from slea.policy.prefix import build_trie

    assert build_trie([s.prompt_ids for s in samples]).nodes  # the rows' common prefix is run once, shared
    with torch.no_grad():
        from slea.trainer.update import response_logprobs

        ckpt.train()
        c, _ = response_logprobs(ckpt, samples, temperature=1.0, dtype="float32", share_prefix=True)
    # case 2: the prefix-shared forward (the prefix's KV cache, then the rest) against the plain one
    assert_within(c, a, logp_bound, why="shared-prefix forward against the plain forward")


def _bf16_step(model, samples):
    """Log-probs (with the shared prefix), the LoRA gradients of their sum and a sampled answer, under bf16."""

    from slea.policy.generation import HFGenerator
    from slea.policy.model import load_tokenizer
    from slea.trainer.update import response_logprobs

    model.train()
    model.zero_grad()
    logp, mask = response_logprobs(model, samples, temperature=1.0, dtype="bfloat16", share_prefix=True)
    (logp * mask).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
    gen = HFGenerator(model, load_tokenizer("tiny"), dtype="bfloat16", stop_at_newline=False)
    out = gen.generate([s.prompt_ids for s in samples], max_new_tokens=6, rng_keys=[[0, i] for i in range(2)])
    return logp.detach(), grads, [(g.ids, g.logprobs) for g in out]


def test_bf16_linears_compute_the_fp32_bases_numbers_bit_for_bit(device):
    """model.base_dtype: bfloat16_linears (auto on the CPU under bf16) stores the frozen linears and the LM head in
    bf16, the embeddings and norms in fp32; store_frozen_linears(model, float32) undoes it."""
    import torch

    from slea.policy.model import store_frozen_linears

    cfg = ModelSection(name_or_path="tiny", dtype="bfloat16", lora_r=4, lora_layers=1)
    if device == "cpu":
        assert load_policy(cfg)[0].get_base_model().model.layers[0].mlp.up_proj.weight.dtype == torch.bfloat16
    model, _ = load_policy(cfg.model_copy(update={"base_dtype": "bfloat16_linears"}), device=device)
    ref, _ = load_policy(cfg.model_copy(update={"base_dtype": "float32"}), device=device)
    base = model.get_base_model()
    frozen = {n: p.dtype for n, p in model.named_parameters() if not p.requires_grad}
    assert {d for n, d in frozen.items() if "proj" in n or n.endswith("lm_head.weight")} == {torch.bfloat16}
    assert {d for n, d in frozen.items() if "norm" in n or "embed_tokens" in n} == {torch.float32}
    assert all(p.dtype == torch.float32 for p in model.parameters() if p.requires_grad)
    assert base.lm_head.weight is not base.model.embed_tokens.weight  # the head's own bf16 copy
    assert torch.equal(base.lm_head.weight, base.model.embed_tokens.weight.to(torch.bfloat16))
    _nonzero_lora(model)
    _nonzero_lora(ref)
    got, want = _bf16_step(model, _samples()), _bf16_step(ref, _samples())
    # case 1 of slea.testing.numerics: under bf16 autocast every frozen linear computes on its weight cast to bf16
    # (round to nearest even), which is the tensor the bf16 storage holds; the embeddings, norms, adapters and the
    # residual stream are fp32 in both. So every kernel runs on the same inputs: logits, gradients and samples equal
    why = "a bf16-stored frozen weight is the tensor bf16 autocast casts the fp32 one to"
    if exact_on(device):
        assert_same(got, want, why=why)
    store_frozen_linears(model, torch.float32)
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    assert base.lm_head.weight is base.model.embed_tokens.weight  # tied again
    if exact_on(device):
        assert_same(_bf16_step(model, _samples()), want, why=why + " (and back in fp32, exactly)")


def test_bf16_linears_is_refused_where_it_cannot_mean_anything():
    from slea.config import build_config

    with pytest.raises(ConfigError, match="model.base_dtype: bfloat16_linears .* model.lora: false"):
        build_config({"model": {"base_dtype": "bfloat16_linears", "lora": False}})
    with pytest.raises(ConfigError, match="model.base_dtype: bfloat16_linears .* model.dtype: float32"):
        build_config({"model": {"base_dtype": "bfloat16_linears", "dtype": "float32"}})
    # on a CPU without native bf16, model.dtype: auto computes in bf16 for this base (its linears are bf16)
    assert build_config({"model": {"base_dtype": "bfloat16_linears"}}).model.dtype == "bfloat16"


def test_an_adapter_swapped_onto_bf16_linears_stays_fp32_and_computes_as_on_the_fp32_base():
    """slea serve swaps LoRA adapters into a loaded model (slea.policy.adapters.swap_lora): peft builds the new
    adapter beside bf16 base layers, and it must stay fp32 as the base's own adapters are."""
    import torch
    from peft import get_peft_model_state_dict

    from slea.policy.adapters import swap_lora
    from slea.policy.generation import autocast

    cfg = ModelSection(name_or_path="tiny", dtype="bfloat16", lora_r=4, lora_layers=1)
    donor, _ = load_policy(cfg.model_copy(update={"base_dtype": "float32"}))
    _nonzero_lora(donor, seed=3)
    state = get_peft_model_state_dict(donor)
    ids = torch.tensor([[1, 5, 9, 14, 22, 30]])
    logits = {}
    for base_dtype in ("bfloat16_linears", "float32"):
        model, _ = load_policy(cfg.model_copy(update={"base_dtype": base_dtype}))
        model = swap_lora(model, donor.peft_config["default"], state)
        assert {p.dtype for n, p in model.named_parameters() if "lora_" in n} == {torch.float32}
        with torch.no_grad(), autocast("bfloat16"):
            logits[base_dtype] = model(input_ids=ids).logits
    # case 1 of slea.testing.numerics: the same adapter on the same bf16 tensors (stored, or cast by autocast)
    assert_same(logits["bfloat16_linears"], logits["float32"], why="bf16 storage is the tensor autocast casts to")
