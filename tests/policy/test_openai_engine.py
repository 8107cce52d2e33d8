"""The ``openai`` generator against slea's own OpenAI-compatible server on localhost: served token ids and
log-probs equal the training forward's and the in-process engine's; weight syncs reach the server; a bad
server is a clear error, never a hang."""

from __future__ import annotations

import socket
import tempfile
import threading

import pytest
import torch

from slea.config import ConfigError, ModelSection, build_config
from slea.policy.engines import make_generator
from slea.policy.generation import HFGenerator
from slea.policy.model import load_policy
from slea.policy.openai_engine import GeneratorError
from slea.policy.server import ServeSettings, load_engine, make_server
from slea.trainer.update import Sample, response_logprobs

LORA = {"name_or_path": "tiny", "dtype": "float32", "lora": True, "lora_r": 4, "lora_alpha": 8,
        "lora_targets": ["q_proj", "v_proj"]}


@pytest.fixture(scope="module")
def served():
    """A ``slea serve tiny`` server (fp32) on a free localhost port, in a thread: ``(engine, base_url)``; adapter
    loading on for the temp folder the generator's weight syncs write under (``--lora-dir``)."""
    engine = load_engine("tiny", dtype="float32")
    server = make_server(engine, "127.0.0.1", 0, ServeSettings(lora_dir=tempfile.gettempdir()))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield engine, f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    server.server_close()


def openai_cfg(base_url: str, **openai) -> ModelSection:
    return ModelSection(**LORA, generator="openai", openai={"base_url": base_url, "timeout_s": 30, **openai})


def policy():
    torch.manual_seed(0)
    model, tok = load_policy(ModelSection(**LORA))
    perturb(model, seed=1)
    return model, tok


def perturb(model, seed: int) -> None:
    """Non-zero adapters, so the served outputs depend on the synced weights."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_" in n:
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)


def prompts(tok):
    texts = ["Goal: take the coin. Your command:", "You see a door. Your command:", "Goal: take the coin. Go"]
    return [tok(t, add_special_tokens=False).input_ids for t in texts]


def forward_logprobs(model, ps, outs, temperature: float) -> list[list[float]]:
    samples = [Sample(p, o.ids, o.logprobs, [0.0] * len(o.ids)) for p, o in zip(ps, outs)]
    logp, _ = response_logprobs(model, samples, temperature=temperature, dtype="float32")
    return [logp[i, -len(o.ids):].tolist() for i, o in enumerate(outs)]


def test_the_factory_builds_the_configured_engine(served):
    _, url = served
    model, tok = policy()
    assert isinstance(make_generator(ModelSection(**LORA), model, tok), HFGenerator)
    gen = make_generator(openai_cfg(url), model, tok)
    assert type(gen).__name__ == "OpenAIGenerator" and gen.served_model() == "tiny"


def test_served_greedy_and_keyed_sampling_equal_the_hf_engine_and_the_training_forward(served):
    _, url = served
    model, tok = policy()
    gen = make_generator(openai_cfg(url), model, tok)
    gen.sync_weights(model)
    local = HFGenerator(model, tok, dtype="float32")
    ps = prompts(tok)
    for temp, keys in ((0.0, None), (0.8, [[7, i] for i in range(len(ps))])):
        got = gen.generate(ps, max_new_tokens=6, temperature=temp, rng_keys=keys, stop_at_newline=False)
        ref = local.generate(ps, max_new_tokens=6, temperature=temp, rng_keys=keys, stop_at_newline=False)
        assert [g.ids for g in got] == [r.ids for r in ref]
        for g, r in zip(got, ref):
            assert g.logprobs == pytest.approx(r.logprobs, abs=1e-5)
        # the training forward at the rollout temperature (greedy: the log-probs at T = 1)
        fwd = forward_logprobs(model, ps, got, temperature=temp or 1.0)
        for g, f in zip(got, fwd):
            assert g.logprobs == pytest.approx(f, abs=1e-4)


def test_a_weight_sync_changes_the_served_logprobs_to_the_new_forward(served):
    engine, url = served
    model, tok = policy()
    gen = make_generator(openai_cfg(url), model, tok)
    first = gen.sync_weights(model)
    ps = prompts(tok)[:2]
    before = gen.generate(ps, max_new_tokens=5, temperature=0.0, stop_at_newline=False)
    perturb(model, seed=2)  # what an update does
    stale = gen.generate(ps, max_new_tokens=5, temperature=0.0, stop_at_newline=False)
    assert [s.logprobs for s in stale] == [b.logprobs for b in before]  # not synced yet: the old weights
    second = gen.sync_weights(model)
    assert second != first and engine.lora == second and gen.served_model() == second
    after = gen.generate(ps, max_new_tokens=5, temperature=0.0, stop_at_newline=False)
    fwd = forward_logprobs(model, ps, after, temperature=1.0)
    for a, f in zip(after, fwd):
        assert a.logprobs == pytest.approx(f, abs=1e-4)
    assert any(abs(x - y) > 1e-3 for a, b in zip(after, before) for x, y in zip(a.logprobs, b.logprobs))


def test_text_prompts_and_newline_stops(served):
    _, url = served
    model, tok = policy()
    gen = make_generator(openai_cfg(url, prompt_format="text"), model, tok)
    gen.sync_weights(model)
    local = HFGenerator(model, tok, dtype="float32")
    ps = prompts(tok)  # these texts re-tokenize to the same ids
    got = gen.generate(ps, max_new_tokens=8, temperature=1.0, rng_keys=[[3, i] for i in range(3)])
    ref = local.generate(ps, max_new_tokens=8, temperature=1.0, rng_keys=[[3, i] for i in range(3)])
    assert [g.ids for g in got] == [r.ids for r in ref]
    stops = set(local.stop_ids) | {tok.eos_token_id}
    assert all(not any(t in stops for t in g.ids[:-1]) for g in got)


def test_stop_strings_end_served_answers_where_the_hf_engine_ends_them(served):
    _, url = served
    model, tok = policy()
    gen = make_generator(openai_cfg(url), model, tok)
    gen.sync_weights(model)
    local = HFGenerator(model, tok, dtype="float32", stop_at_newline=False)
    ps, keys = prompts(tok), [[4, i] for i in range(3)]
    free = local.generate(ps, max_new_tokens=12, temperature=1.0, rng_keys=keys)
    stop = tok.decode(free[0].ids[2:4], skip_special_tokens=True)
    got = gen.generate(ps, max_new_tokens=12, temperature=1.0, rng_keys=keys, stop_at_newline=False, stop=[stop])
    ref = local.generate(ps, max_new_tokens=12, temperature=1.0, rng_keys=keys, stop=[stop])
    assert [g.ids for g in got] == [r.ids for r in ref] and len(ref[0].ids) < len(free[0].ids)
    assert stop in got[0].text


def test_token_strings_are_retokenized_one_by_one_or_refused(served):
    _, url = served
    model, tok = policy()
    gen = make_generator(openai_cfg(url, extensions=False), model, tok)
    north = tok(" north", add_special_tokens=False).input_ids
    assert len(north) == 1
    assert gen._ids_of([" north", "token_id:5"]) == [north[0], 5]
    with pytest.raises(GeneratorError, match="ask the server for token ids"):
        gen._ids_of([" north north"])
    out = gen.generate(prompts(tok)[:1], max_new_tokens=3, temperature=0.0, stop_at_newline=False)
    assert len(out[0].ids) == len(out[0].logprobs) >= 1


@pytest.mark.timeout(120)  # a hang fails the test; no wall-clock bound that a busy machine could break
def test_an_unreachable_or_silent_server_is_a_clear_error_not_a_hang():
    model, tok = policy()
    with socket.socket() as s:  # a free port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    gen = make_generator(openai_cfg(f"http://127.0.0.1:{port}/v1", retries=1, timeout_s=2), model, tok)
    with pytest.raises(GeneratorError, match="cannot reach .* is the server running"):
        gen.generate([[5, 6]], max_new_tokens=2)
    with socket.socket() as silent:  # accepts connections, never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(4)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}/v1"
        gen = make_generator(openai_cfg(url, model="tiny", timeout_s=0.5, retries=0), model, tok)
        with pytest.raises(GeneratorError, match="no answer within"):
            gen.generate([[5, 6]], max_new_tokens=2)


def test_server_refusals_are_http_errors(served):
    _, url = served
    model, tok = policy()
    gen = make_generator(openai_cfg(url), model, tok)
    with pytest.raises(GeneratorError, match="404.*does not exist"):
        gen.request("POST", "/completions", {"model": "nope", "prompt": [5]})
    with pytest.raises(GeneratorError, match="400.*stop"):
        gen.request("POST", "/completions", {"prompt": [5], "stop": [".", ",", ";", ":", "!"]})
    with pytest.raises(GeneratorError, match="400.*not a LoRA adapter folder"):  # under the server's --lora-dir
        gen.request("POST", "/load_lora_adapter", {"lora_name": "x",
                                                   "lora_path": f"{tempfile.gettempdir()}/slea-no-such-adapter"})
    with pytest.raises(GeneratorError, match="403.*must be a folder under"):  # outside it: refused, never read
        gen.request("POST", "/load_lora_adapter", {"lora_name": "x", "lora_path": "/nonexistent"})


def test_generator_config_refusals():
    with pytest.raises(ConfigError, match="model.generator: vllm: the vllm package is not installed"):
        build_config({"model": {"generator": "vllm"}})
    with pytest.raises(ConfigError, match="model.openai: not read by model.generator hf"):
        build_config({"model": {"openai": {"timeout_s": 3}}})
    with pytest.raises(ConfigError, match="model.generator: openai sends weights .* LoRA"):
        build_config({"model": {"generator": "openai", "lora": False}})
    # a command that trains nothing (slea agent, slea eval) plays a frozen served model: no LoRA, chat allowed
    frozen = build_config({"model": {"generator": "openai", "lora": False, "openai": {"api": "chat"}}}, trains=False)
    assert (frozen.model.lora, frozen.model.openai.api) == (False, "chat")
    with pytest.raises(ConfigError, match="model.openai.api: chat returns text, not the token ids"):
        build_config({"model": {"generator": "openai", "openai": {"api": "chat"}}})
    with pytest.raises(ConfigError, match="model.openai.api_key_env"):
        build_config({"model": {"generator": "openai", "openai": {"api_key_env": "sk-secret"}}})


def test_trainers_that_cannot_use_a_served_engine_refuse_it():
    from slea.parallel.checks import check_data_parallel
    from slea.parallel.distributed import DataParallel
    from slea.trainer.team import check_team_config

    cfg = build_config({"model": {"generator": "openai"}})
    with pytest.raises(ConfigError, match="model.generator: openai serves one process's weights"):
        check_data_parallel(cfg, DataParallel(rank=0, world=2))
    team = build_config({"algorithm": {"name": "teamtr"}, "model": {"generator": "openai"}})
    with pytest.raises(ConfigError, match="model.generator: a team switches adapters"):
        check_team_config(team)


def frozen_cfg(base_url: str, **openai) -> ModelSection:
    return ModelSection.model_validate({"name_or_path": "tiny", "dtype": "float32", "lora": False,
                                        "generator": "openai", "openai": {"base_url": base_url, "timeout_s": 30,
                                                                          "model": "tiny", **openai}},
                                       context={"trains": False})  # the config of slea agent / slea eval


def test_a_frozen_engine_needs_no_weights_no_logprobs_and_chat_gives_the_completions_answer(served):
    """Nothing trains: no local weights, no log-probs asked; the chat API (the server renders the messages with
    the model's template) answers what the completions API answers for the locally rendered ids."""
    from slea.config import RolloutSection
    from slea.policy.model import load_tokenizer
    from slea.policy.served import ChatPrompt, prompt_builder

    _, url = served
    tok = load_tokenizer("tiny")
    msgs = [[{"role": "system", "content": "You play a game."}, {"role": "user", "content": f"You see {x}."}]
            for x in ("a coin", "a door", "a key")]
    chat_cfg = frozen_cfg(url, api="chat")
    builder = prompt_builder(chat_cfg, tok, RolloutSection())
    ps = [builder.encode(m) for m in msgs]
    assert all(isinstance(p, ChatPrompt) and p.messages == m for p, m in zip(ps, msgs))
    from slea.policy.prompt_builder import PromptBuilder

    assert [list(p) for p in ps] == [PromptBuilder(tok).encode(m) for m in msgs]  # the ids as in training
    plain = make_generator(frozen_cfg(url), None, tok, trains=False)
    chat = make_generator(chat_cfg, None, tok, trains=False)
    plain.check()
    chat.check()
    keys = [[5, i] for i in range(3)]
    for temp in (0.0, 1.0):
        a = plain.generate([list(p) for p in ps], max_new_tokens=6, temperature=temp, rng_keys=keys,
                           stop_at_newline=False)
        b = chat.generate(ps, max_new_tokens=6, temperature=temp, rng_keys=keys, stop_at_newline=False)
        assert [g.ids for g in a] == [g.ids for g in b] and [g.text for g in a] == [g.text for g in b]
        assert all(g.logprobs == [] and len(g.ids) >= 1 for g in a + b)  # none asked for, none invented
    # the same engine in-process, on the same weights and keys: the same answers
    model, _ = load_policy(ModelSection(name_or_path="tiny", dtype="float32", lora=False))
    local = HFGenerator(model, tok, dtype="float32").generate([list(p) for p in ps], max_new_tokens=6,
                                                                 temperature=1.0, rng_keys=keys,
                                                                 stop_at_newline=False)
    assert [g.ids for g in local] == [g.ids for g in b]
    # free-text answers (the LLM extractor's), a prefill continued: the two APIs agree
    conv = [msgs[0] + [{"role": "assistant", "content": "- "}]]
    assert plain.answer_texts(conv, max_tokens=5) == chat.answer_texts(conv, max_tokens=5)
    with pytest.raises(GeneratorError, match="needs each prompt's chat messages"):
        chat.generate([list(ps[0])], max_new_tokens=2)


def test_training_through_chat_or_without_lora_is_refused(served):
    _, url = served
    from slea.policy.model import load_tokenizer

    tok = load_tokenizer("tiny")
    trainer_side = make_generator(frozen_cfg(url, api="chat"), None, tok)  # trains=True: the trainer's engine
    with pytest.raises(GeneratorError, match="model.openai.api: chat returns text"):
        trainer_side.generate([[5]], max_new_tokens=2)
    model, _ = load_policy(ModelSection(name_or_path="tiny", dtype="float32", lora=False))
    with pytest.raises(ConfigError, match="sends trained weights to the server as LoRA adapters"):
        make_generator(frozen_cfg(url), model, tok).sync_weights(model)
