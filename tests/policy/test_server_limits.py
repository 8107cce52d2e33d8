"""``slea serve``'s limits, key and adapter folder, in process: the engine stops generating when asked between two
decode steps (with the numerics of an uncancelled call), never decodes or draws uniforms past the model's context,
and the server refuses what it must (401, 403, 413, 414, 429, 504) in the OpenAI error shape. The hostile requests
of the audit against a ``slea serve`` process are tests/reliability/test_serve_hostile.py."""

from __future__ import annotations

import contextlib
import threading
import time

import httpx
import pytest

from slea.policy.generation import GenerationCancelled
from slea.policy.openai_protocol import RequestError
from slea.policy.server import ServeSettings, load_engine, make_server


@pytest.fixture(scope="module")
def engine():
    return load_engine("tiny", dtype="float32")


class Running:
    """A server over ``engine`` with ``settings`` in a thread, as a context manager: ``.url``, ``.client``."""

    def __init__(self, engine, settings: ServeSettings):
        self.server = make_server(engine, "127.0.0.1", 0, settings)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self):
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.client = httpx.Client(base_url=self.url, timeout=30)
        return self

    def __exit__(self, *exc):
        self.client.close()
        self.server.shutdown()
        self.server.server_close()


def test_a_cancelled_generation_stops_between_decode_steps_and_an_uncancelled_one_is_unchanged(engine):
    gen, tok = engine.gen, engine.tok
    prompts = [tok("You see a coin.", add_special_tokens=False).input_ids] * 2
    keys = [[1, 2], [1, 3]]
    plain = gen.generate(prompts, max_new_tokens=8, temperature=1.0, rng_keys=keys, stop_at_newline=False)
    never = gen.generate(prompts, max_new_tokens=8, temperature=1.0, rng_keys=keys, stop_at_newline=False,
                         cancel=lambda: False)
    assert [g.ids for g in never] == [g.ids for g in plain] and [g.logprobs for g in never] == [g.logprobs
                                                                                                  for g in plain]
    asked = []

    def after_three() -> bool:
        asked.append(1)
        return len(asked) > 3

    with pytest.raises(GenerationCancelled, match="after 3 tokens"):
        gen.generate(prompts, max_new_tokens=500, temperature=0.0, stop_at_newline=False, cancel=after_three)
    assert len(asked) == 4  # once before the prefill, then after each decode step


def test_no_row_decodes_or_draws_uniforms_past_the_context(engine, monkeypatch):
    from slea.policy import generation

    drawn = []
    real = generation.row_uniforms
    monkeypatch.setattr(generation, "row_uniforms", lambda key, n: (drawn.append(n), real(key, n))[1])
    context = generation.context_length(engine.model)
    prompt = [5 + i % 500 for i in range(context - 3)]  # three tokens of room left
    out = engine.gen.generate([prompt], max_new_tokens=10**9, temperature=1.0, rng_keys=[[7]], stop_at_newline=False,
                              top_k=1)
    assert drawn == [3] and len(out[0].ids) <= 3
    # the uniforms of a capped call are the first ones of its stream: the same draws as an uncapped short call
    assert (real([7], 3) == real([7], 10)[:3]).all()


def test_engine_refusals_are_400s_naming_the_field(engine):
    cases = [({"prompt": "a\udcffb"}, "prompt"), ({"prompt": "ab", "temperature": float("nan")}, "temperature"),
             ({"prompt": "ab", "temperature": float("inf")}, "temperature"), ({"prompt": "ab", "top_p": float("nan")},
                                                                             "top_p"),
             ({"prompt": "ab", "logprobs": 1000}, "logprobs"), ({"prompt": "ab", "n": 10**6}, "n"),
             ({"prompt": "ab", "max_tokens": 10**8, "seed": 1}, "max_tokens"), ({"prompt": "ab", "n": "3"}, "n"),
             ({"prompt": "ab", "stop": ["x" * 300]}, "stop"), ({"prompt": "ab", "temperature": 1e-40}, "temperature"),
             ({"prompt": [[5, 6]] * 40, "n": 20}, "n"), ({"prompt": "ab", "rng_keys": [[-1]]}, "rng_keys")]
    for body, param in cases:
        with pytest.raises(RequestError) as e:
            engine.complete(body)
        assert e.value.status == 400 and e.value.param == param, (body, str(e.value))
    with pytest.raises(RequestError, match="maximum context length is 4096"):
        engine.chat({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5000})
    with pytest.raises(RequestError) as e:
        engine.chat({"messages": [{"role": "user", "content": "a\udcff"}]})
    assert e.value.param == "messages"


def test_a_chat_without_max_tokens_gets_what_the_context_leaves(engine):
    def rendered(k: int) -> int:
        msgs = [{"role": "user", "content": "word " * k}]
        return len(engine.tok(engine.tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True),
                              add_special_tokens=False).input_ids)

    per = rendered(101) - rendered(100)
    k = 100 + (4090 - rendered(100)) // per  # a prompt a few tokens short of the 4096-token context
    assert 4096 - 256 < rendered(k) < 4096
    res = engine.chat({"messages": [{"role": "user", "content": "word " * k}], "temperature": 0})
    used = res["usage"]
    assert used["prompt_tokens"] + used["completion_tokens"] <= 4096 and used["completion_tokens"] >= 1


def test_the_request_log_keeps_only_the_latest(engine):
    with Running(engine, ServeSettings(max_log=5)) as s:
        for i in range(12):
            s.client.get(f"/is_sleeping?i={i}")
        s.client.get("/x" * 20000)  # a 40,000-character URL: 414, and a short log line
    calls = list(engine.calls)
    assert len(calls) == 5 and calls[-2] == "GET /is_sleeping?i=11" and len(calls[-1]) <= 200


def test_an_api_key_is_required_on_every_route_but_health(engine):
    with Running(engine, ServeSettings(api_key="s3cret")) as s:
        for method, path in [("GET", "/v1/models"), ("POST", "/v1/completions"), ("POST", "/sleep"),
                             ("POST", "/v1/load_lora_adapter"), ("GET", "/is_sleeping")]:
            r = s.client.request(method, path, json={"prompt": "a"})
            assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key", path
        wrong = s.client.get("/v1/models", headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401
        ok = s.client.get("/v1/models", headers={"Authorization": "Bearer s3cret"})
        assert ok.status_code == 200 and ok.json()["data"][0]["id"] == "tiny"
        assert s.client.get("/health").status_code == 200


def test_adapters_load_only_when_enabled_and_only_from_under_the_folder(engine, tmp_path):
    from slea.config import ModelSection
    from slea.policy.adapters import save_adapter
    from slea.policy.model import load_policy

    model, _ = load_policy(ModelSection(name_or_path="tiny", dtype="float32", lora=True, lora_r=4, lora_alpha=8,
                                        lora_targets=["q_proj", "v_proj"]))
    root, outside = tmp_path / "adapters", tmp_path / "elsewhere"
    root.mkdir()
    save_adapter(model, outside / "a")
    (root / "link").symlink_to(outside / "a")  # a way out of the folder
    with Running(engine, ServeSettings()) as s:
        r = s.client.post("/v1/load_lora_adapter", json={"lora_name": "a", "lora_path": str(outside / "a")})
        assert r.status_code == 403 and r.json()["error"]["code"] == "lora_loading_disabled"
    with Running(engine, ServeSettings(lora_dir=root)) as s:
        for path in (outside / "a", root / "link", root / ".." / "elsewhere" / "a"):
            r = s.client.post("/v1/load_lora_adapter", json={"lora_name": "a", "lora_path": str(path)})
            assert r.status_code == 403 and r.json()["error"]["param"] == "lora_path", path
        save_adapter(model, root / "b")
        r = s.client.post("/v1/load_lora_adapter", json={"lora_name": "b", "lora_path": str(root / "b")})
        assert r.status_code == 200 and "b" in [m["id"] for m in s.client.get("/v1/models").json()["data"]]
        assert s.client.post("/v1/unload_lora_adapter", json={"lora_name": "b"}).status_code == 200
    assert engine.lora is None


def test_a_body_past_the_limit_is_413_and_a_request_past_its_time_is_504(engine):
    with Running(engine, ServeSettings(max_body_bytes=1000, request_timeout_s=1.0)) as s:
        r = s.client.post("/v1/completions", content=b'{"prompt": "' + b"a" * 2000 + b'"}')
        assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
        t0 = time.perf_counter()
        r = s.client.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 4000, "temperature": 0, "n": 32})
        assert r.status_code == 504 and r.json()["error"]["code"] == "timeout"
        assert time.perf_counter() - t0 < 5
        ok = s.client.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 2, "temperature": 0})
        assert ok.status_code == 200 and len(ok.json()["choices"]) == 1


def test_a_full_queue_is_429_and_the_server_answers_afterwards(engine):
    with Running(engine, ServeSettings(max_queue=2, request_timeout_s=3.0)) as s:
        codes: list[int] = []

        def one():
            with httpx.Client(base_url=s.url, timeout=30) as c:
                codes.append(c.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 4000, "n": 32,
                                                             "temperature": 0}).status_code)

        threads = [threading.Thread(target=one) for _ in range(6)]
        for t in threads:
            t.start()
            time.sleep(0.05)
        for t in threads:
            t.join(timeout=30)
        assert sorted(codes).count(429) >= 3 and set(codes) <= {429, 503, 504}, codes
        ok = s.client.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 2, "temperature": 0})
        assert ok.status_code == 200


def test_serve_help_lists_the_limits():
    from typer.testing import CliRunner

    from slea.cli import app

    out = CliRunner().invoke(app, ["serve", "--help"], env={"COLUMNS": "200"}).output
    for option in ("--api-key", "SLEA_API_KEY", "--lora-dir", "--max-model-len", "--max-n", "--max-logprobs",
                   "--max-body-mb", "--max-prompt-tokens", "--max-stops", "--max-queue", "--request-timeout",
                   "--checkpoint", "--max-in-flight", "--header-timeout", "--max-idle-connections",
                   "--max-prompt-chars", "--max-messages", "--max-tool-chars"):
        assert option in out, option


def test_idle_connections_past_the_cap_are_closed_oldest_first(engine):
    from slea.testing.serve_hostile import closed_by_server, health, held

    with Running(engine, ServeSettings(max_idle_connections=4, header_timeout_s=30)) as s:
        port = s.server.server_address[1]
        with held(port, 7) as socks:
            assert closed_by_server(socks[:3], 2.0) == 3  # the three oldest made way for the newer ones
            assert closed_by_server(socks[3:], 0.3) == 0
            assert health(port) == 200  # this newest connection closes the oldest of the four left


def test_a_connection_must_send_its_headers_within_the_header_timeout_trickle_or_not(engine):
    from slea.testing.serve_hostile import closed_by_server, held

    with Running(engine, ServeSettings(header_timeout_s=1.0)) as s:
        with held(s.server.server_address[1], 1, b"GET /v1/mo") as socks:
            t0 = time.perf_counter()
            for _ in range(6):  # a byte every 0.4 s does not extend the timeout (it would: closed after 3.4 s)
                time.sleep(0.4)
                with contextlib.suppress(OSError):
                    socks[0].sendall(b"d")
            assert closed_by_server(socks, 2.0) == 1 and time.perf_counter() - t0 < 3.0
        assert s.client.get("/v1/models").status_code == 200


def test_requests_in_flight_are_bounded_and_health_is_never_refused(engine):
    """Requests that sent their headers but not their body are in flight: past ``max_in_flight`` a request is a
    503, ``/health`` is answered all the same, and a stalled body is a 408 after the header timeout."""
    from slea.testing.serve_hostile import held, request, statuses

    head = request("POST", "/v1/completions", headers={"Content-Length": "50"})  # and the body never comes
    with Running(engine, ServeSettings(max_in_flight=2, header_timeout_s=1.5)) as s:
        with held(s.server.server_address[1], 2, head) as socks:
            r = s.client.get("/v1/models")
            assert r.status_code == 503 and r.json()["error"]["code"] == "server_busy"
            assert s.client.get("/health").status_code == 200
            assert [statuses(x.recv(4096)) for x in socks] == [[408], [408]]
        assert s.client.get("/v1/models").status_code == 200


def _renders(engine, monkeypatch) -> list[bool]:
    """Record each chat rendering: whether the engine was generating for another request meanwhile."""
    seen, real = [], engine._render

    def render(*args, **kwargs):
        seen.append(engine.lock.locked())
        return real(*args, **kwargs)

    monkeypatch.setattr(engine, "_render", render)
    return seen


def test_oversized_chats_are_refused_before_rendering_or_tokenizing(engine, monkeypatch):
    """An 8 MB chat, 128 tools of 60 KB, 2,000 messages: 400s naming the limit, and nothing rendered (before: an 8
    MB chat held the engine 7-12 s, the tools 11.6 s, each refused only after its prompt was rendered and
    tokenized)."""
    renders = _renders(engine, monkeypatch)
    tool = {"type": "function", "function": {"name": "t", "description": "d" * 60_000,
                                             "parameters": {"type": "object"}}}
    hi = [{"role": "user", "content": "hi"}]
    cases = [({"messages": [{"role": "user", "content": "word " * 1_550_000}]}, "messages", "--max-prompt-chars"),
             ({"messages": hi, "tools": [{**tool, "function": {**tool["function"], "name": f"t{i}"}}
                                         for i in range(128)]}, "tools", "--max-tool-chars"),
             ({"messages": hi * 2000}, "messages", "--max-messages")]
    with Running(engine, ServeSettings()) as s:
        for body, param, option in cases:
            t0 = time.perf_counter()
            r = s.client.post("/v1/chat/completions", json={**body, "max_tokens": 2})
            err = r.json()["error"]
            assert r.status_code == 400 and err["param"] == param and option in err["message"], err
            assert time.perf_counter() - t0 < 2.0 and renders == [], (option, time.perf_counter() - t0, renders)
        r = s.client.post("/v1/completions", json={"prompt": "word " * 100_000, "max_tokens": 2})
        assert r.status_code == 400 and "--max-prompt-chars" in r.json()["error"]["message"]


def test_the_character_cap_refuses_nothing_the_token_cap_takes(engine):
    """No token decodes to more characters than :func:`longest_token_chars` counts, so a prompt past the default
    cap (max prompt tokens x that) has more tokens than the token cap takes; at the cap it passes the check."""
    from slea.policy.serve_caps import check_text, longest_token_chars

    tok = engine.tok
    longest = longest_token_chars(tok)
    assert max(len(tok.decode([i])) for i in range(len(tok))) <= longest
    assert engine.caps.prompt_chars == engine.max_prompt * longest == 4095 * longest
    check_text("a" * engine.caps.prompt_chars, engine.caps, "prompt")
    with pytest.raises(RequestError, match=r"prompt: \d+ characters, more than this server takes"):
        check_text("a" * (engine.caps.prompt_chars + 1), engine.caps, "prompt")


def test_prompts_are_tokenized_off_the_engine_and_within_the_request_timeout(engine, monkeypatch):
    """A chat is rendered while another request generates (before: only once the engine was free), and a
    rendering past the request's time limit is a 504 at the limit."""
    renders = _renders(engine, monkeypatch)
    chat = {"messages": [{"role": "user", "content": "You see a coin."}], "max_tokens": 2, "temperature": 0}
    with Running(engine, ServeSettings(request_timeout_s=3.0)) as s:
        long = threading.Thread(target=lambda: s.client.post("/v1/completions", json={
            "prompt": "Hi", "max_tokens": 4000, "n": 32, "temperature": 0}))
        long.start()
        time.sleep(1.0)  # generating, until its time limit (3 s)
        with httpx.Client(base_url=s.url, timeout=30) as other:
            assert other.post("/v1/chat/completions", json=chat).status_code == 200  # once the other one stopped
        long.join()
        assert renders == [True]
        real = engine._render
        monkeypatch.setattr(engine, "_render", lambda *a, **k: (time.sleep(4.0), real(*a, **k))[1])
        t0 = time.perf_counter()
        r = s.client.post("/v1/chat/completions", json=chat)
        assert r.status_code == 504 and r.json()["error"]["code"] == "timeout" and time.perf_counter() - t0 < 3.8


def _lora(folder, r: int = 4, seed: int = 0):
    """A LoRA adapter of the tiny model in ``folder`` (rank ``r`` on q_proj and v_proj, random B: it changes the
    answers); returns the folder."""
    import torch

    from slea.config import ModelSection
    from slea.policy.adapters import save_adapter
    from slea.policy.model import load_policy

    model, _ = load_policy(ModelSection(name_or_path="tiny", dtype="float32", lora=True, lora_r=r, lora_alpha=8,
                                        lora_targets=["q_proj", "v_proj"]))
    gen = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        if "lora_B" in name:
            p.data = torch.randn(p.shape, generator=gen) * 0.5
    return save_adapter(model, folder)


def _bad_adapters(root, embed_shape) -> dict:
    """Adapter folders the server must refuse, by the reason it must name."""
    import json

    import torch
    from safetensors.torch import load_file, save_file

    def edit(name, state=None, config=None):
        folder = _lora(root / name)
        if state is not None:
            save_file(state(load_file(str(folder / "adapter_model.safetensors"))), str(folder / "adapter_model.safetensors"))
        if config is not None:
            raw = json.loads((folder / "adapter_config.json").read_text())
            (folder / "adapter_config.json").write_text(json.dumps(config(raw)))
        return folder

    shape = _lora(root / "shape", r=8)  # its tensors are rank 8, its config says 4
    (shape / "adapter_config.json").write_text((shape / "adapter_config.json").read_text().replace('"r": 8', '"r": 4'))
    embed = "base_model.model.model.embed_tokens.weight"  # the base model's own name for its embeddings
    return {"not a LoRA tensor": edit("embed", state=lambda s: {**s, embed: torch.zeros(embed_shape)}),
            "has shape": shape,
            "NaN": edit("nan", state=lambda s: {k: torch.full_like(v, float("nan")) for k, v in s.items()}),
            "modules_to_save": edit("save", config=lambda c: {**c, "modules_to_save": ["lm_head"]})}


def test_a_refused_adapter_changes_nothing(engine, tmp_path):
    """An adapter holding the base's embeddings, one whose tensors do not fit its config, an all-NaN one and one
    with modules_to_save: each a 400 naming the file and the reason, and the served adapter, the base model and
    /v1/models are as before (before: the embeddings overwrote the base model, the size mismatch was a 500 that
    left the adapter half-overwritten and listed, the NaN adapter loaded and its log-prob requests were 500s)."""
    root = tmp_path / "adapters"
    good, bad = _lora(root / "good"), _bad_adapters(root, engine.model.get_input_embeddings().weight.shape)

    def answers(client) -> dict:
        ask = {"prompt": "You see a coin.", "max_tokens": 6, "temperature": 0, "logprobs": 1}
        got = {m: client.post("/v1/completions", json={**ask, "model": m}).json()["choices"][0]["logprobs"]
               for m in ("tiny", "good")}
        return {"answers": got, "models": client.get("/v1/models").json()["data"]}

    with Running(engine, ServeSettings(lora_dir=root)) as s:
        assert s.client.post("/v1/load_lora_adapter", json={"lora_name": "good", "lora_path": str(good)}
                             ).status_code == 200
        before = answers(s.client)
        assert before["answers"]["tiny"] != before["answers"]["good"]
        for reason, folder in bad.items():
            r = s.client.post("/v1/load_lora_adapter", json={"lora_name": folder.name, "lora_path": str(folder)})
            assert r.status_code == 400, (reason, r.status_code, r.text)
            err = r.json()["error"]
            assert str(folder) in err["message"] and reason in err["message"], (reason, err)
            assert answers(s.client) == before, reason
        assert s.client.post("/v1/unload_lora_adapter", json={"lora_name": "good"}).status_code == 200


def _hold_decoding(engine, monkeypatch, at: int = 0) -> dict:
    """Count the engine's forward passes (``steps``); the ``at``-th waits until ``release`` is set, at most 10 s
    (``timed_out`` when it gave up)."""
    state = {"steps": 0, "release": threading.Event(), "timed_out": False}
    real = engine.gen._forward

    def forward(*args, **kwargs):
        state["steps"] += 1
        if state["steps"] == at:
            state["timed_out"] = not state["release"].wait(10)
        return real(*args, **kwargs)

    monkeypatch.setattr(engine.gen, "_forward", forward)
    return state


def _events(lines) -> list[dict]:
    import json

    return [json.loads(line[6:]) for line in lines if line.startswith("data: {")]


def test_streamed_tokens_are_sent_as_they_are_decoded(engine, monkeypatch):
    """The engine is held at its 20th decode step: ten chunks reach the client meanwhile (before: the first byte
    came once the whole answer was built), and the chunks join to the unstreamed answers."""
    body = {"prompt": "Hi", "max_tokens": 300, "n": 2, "temperature": 1.0, "seed": 5}
    with Running(engine, ServeSettings()) as s:
        whole = s.client.post("/v1/completions", json={**body, "return_token_ids": True}).json()["choices"]
        assert max(len(c["token_ids"]) for c in whole) >= 40  # the generation runs past the held step
        hold = _hold_decoding(engine, monkeypatch, at=20)
        chunks, early = [], None
        with s.client.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
            for line in r.iter_lines():
                chunks += _events([line])
                if early is None and len(chunks) >= 10:
                    early = not hold["timed_out"]
                    hold["release"].set()
    assert early, "no chunk arrived while the engine was held at its 20th step"
    assert ["".join(c["choices"][0]["text"] for c in chunks if c["choices"][0]["index"] == i) for i in (0, 1)] == \
        [c["text"] for c in whole]
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"][0]["finish_reason"]] == \
        [c["finish_reason"] for c in whole]


def test_a_client_that_leaves_a_stream_stops_its_generation_and_a_late_one_gets_an_error_event(engine, monkeypatch):
    long = {"prompt": "Hi", "max_tokens": 4000, "n": 32, "temperature": 1.0, "seed": 5, "stream": True}
    hold = _hold_decoding(engine, monkeypatch)
    with Running(engine, ServeSettings(request_timeout_s=3.0)) as s:
        with s.client.stream("POST", "/v1/completions", json=long) as r:
            lines = r.iter_lines()
            first = [next(x for x in lines if x.startswith("data: {")) for _ in range(3)]
        time.sleep(1.0)
        stopped_at = hold["steps"]
        time.sleep(0.5)
        assert len(first) == 3 and hold["steps"] == stopped_at < 1000, (stopped_at, hold["steps"])
        assert s.client.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 2}).status_code == 200
        with s.client.stream("POST", "/v1/completions", json=long) as r:  # runs past its 3 s
            assert r.status_code == 200
            data = [x[6:] for x in r.iter_lines() if x.startswith("data: ")]
    assert data[-1] == "[DONE]" and _events(["data: " + data[-2]])[0]["error"]["code"] == "timeout"
