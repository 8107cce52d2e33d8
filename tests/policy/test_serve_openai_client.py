"""``slea serve tiny`` driven by the official ``openai`` Python client, as a user's program would call it: models,
chat completions through the model's chat template, completions with list prompts and ``n`` > 1, streaming as
server-sent events, and refusals in the OpenAI error shape."""

from __future__ import annotations

import pytest

from slea.testing.server import serving

openai = pytest.importorskip("openai")

HELLO = [{"role": "system", "content": "You play a text game."}, {"role": "user", "content": "You see a coin."}]


@pytest.fixture(scope="module")
def client():
    """``slea serve tiny --port 0`` in a subprocess and an ``openai.OpenAI`` client on it."""
    with serving("tiny", "--port", "0", "--dtype", "float32") as s:
        assert s.url.startswith("http://127.0.0.1:"), s.url
        yield openai.OpenAI(base_url=s.url, api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def tok():
    from slea.policy.model import load_tokenizer

    return load_tokenizer("tiny")


def test_models_list_and_retrieve(client):
    assert [m.id for m in client.models.list()] == ["tiny"]
    assert client.models.retrieve("tiny").owned_by == "slea"
    with pytest.raises(openai.NotFoundError) as e:
        client.models.retrieve("nope")
    assert e.value.body["code"] == "model_not_found"


def test_chat_applies_the_chat_template_and_equals_completions_of_the_rendered_prompt(client, tok):
    chat = client.chat.completions.create(model="tiny", messages=HELLO, max_tokens=6, temperature=0)
    assert chat.object == "chat.completion" and chat.choices[0].message.role == "assistant"
    rendered = tok.apply_chat_template(HELLO, add_generation_prompt=True, tokenize=False)
    ids = tok(rendered, add_special_tokens=False).input_ids
    plain = client.completions.create(model="tiny", prompt=ids, max_tokens=6, temperature=0)
    assert chat.choices[0].message.content == plain.choices[0].text
    assert chat.usage.prompt_tokens == len(ids) and chat.usage.completion_tokens <= 6


def test_chat_n_max_tokens_stop_and_logprobs(client):
    many = client.chat.completions.create(model="tiny", messages=HELLO, n=3, max_tokens=5, temperature=1.0, seed=4,
                                          logprobs=True)
    assert [c.index for c in many.choices] == [0, 1, 2]
    assert len({c.message.content for c in many.choices}) > 1  # three samples, not one copied
    for c in many.choices:
        lp = c.logprobs.content
        assert 1 <= len(lp) <= 5 and all(t.logprob <= 0 for t in lp)
        assert "".join(t.token for t in lp) == c.message.content or c.finish_reason == "stop"
    assert many.usage.completion_tokens == sum(len(c.logprobs.content) for c in many.choices)
    same = client.chat.completions.create(model="tiny", messages=HELLO, n=3, max_tokens=5, temperature=1.0, seed=4)
    assert [c.message.content for c in same.choices] == [c.message.content for c in many.choices]  # seeded
    assert all(c.logprobs is None for c in same.choices)  # not asked: none
    # a stop string taken from an unstopped answer: the answer ends right before it
    long = client.chat.completions.create(model="tiny", messages=HELLO, max_tokens=12, temperature=0)
    text = long.choices[0].message.content
    assert long.choices[0].finish_reason == "length" and len(text) >= 4
    stop = text[2:4]
    cut = client.chat.completions.create(model="tiny", messages=HELLO, max_tokens=12, temperature=0, stop=[stop])
    assert cut.choices[0].message.content == text[:text.index(stop)]
    assert cut.choices[0].finish_reason == "stop"


def test_completions_with_list_prompts_and_n(client):
    res = client.completions.create(model="tiny", prompt=["You see a coin.", "Goal: open the door."], n=2,
                                    max_tokens=4, temperature=0, logprobs=1)
    assert [c.index for c in res.choices] == [0, 1, 2, 3]
    texts = [c.text for c in res.choices]
    assert texts[0] == texts[1] and texts[2] == texts[3]  # greedy: prompt i's n answers agree
    for i, prompt in enumerate(["You see a coin.", "Goal: open the door."]):
        alone = client.completions.create(model="tiny", prompt=prompt, max_tokens=4, temperature=0)
        assert alone.choices[0].text == texts[2 * i]  # choice i * n + j answers prompt i
    assert all(len(c.logprobs.token_logprobs) == len(c.logprobs.tokens) >= 1 for c in res.choices)
    sampled = client.completions.create(model="tiny", prompt=["You see a coin."] * 2, n=2, max_tokens=6,
                                        temperature=1.0, seed=9)
    assert len({c.text for c in sampled.choices}) > 1


def test_streaming_is_served_as_events_that_join_to_the_answer(client):
    whole = client.completions.create(model="tiny", prompt="You see a coin.", max_tokens=6, temperature=0)
    chunks = list(client.completions.create(model="tiny", prompt="You see a coin.", max_tokens=6, temperature=0,
                                            stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == whole.choices[0].text and len(chunks) >= 3
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == whole.choices[0].finish_reason
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    chat = client.chat.completions.create(model="tiny", messages=HELLO, max_tokens=6, temperature=0)
    events = list(client.chat.completions.create(model="tiny", messages=HELLO, max_tokens=6, temperature=0,
                                                 stream=True))
    assert events[0].choices[0].delta.role == "assistant"
    assert "".join(e.choices[0].delta.content or "" for e in events) == chat.choices[0].message.content
    assert events[-1].choices[0].finish_reason == chat.choices[0].finish_reason


def test_refusals_have_the_openai_error_shape(client):
    nameless = {"type": "function", "function": {"parameters": {"type": "object", "properties": {}}}}
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="tiny", messages=HELLO, tools=[nameless])
    assert set(e.value.body) == {"message", "type", "param", "code"} and e.value.body["param"] == "tools"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="tiny", messages=HELLO, functions=[{"name": "f"}])
    assert e.value.body["param"] == "functions"  # the legacy function calling: tools instead
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="tiny", messages=HELLO, logprobs=True, top_logprobs=3)
    assert e.value.body["param"] == "top_logprobs"
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="tiny", prompt="x", stop=["a", "b", "c", "d", "e"])
    assert e.value.body["param"] == "stop"
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="nope", messages=HELLO)
    assert e.value.body["type"] == "invalid_request_error" and e.value.body["param"] == "model"
    # a refused request leaves the connection usable (its body was read)
    assert client.completions.create(model="tiny", prompt="x", max_tokens=1, temperature=0).choices


def test_tools_are_rendered_into_the_prompt_and_a_text_answer_is_content(client, tok):
    """With ``tools`` the tiny template (no tools of its own) gets the fallback rendering, the trainer's: the
    prompt grows by the schemas; the random model makes no call, so its text is the content (finish stop or
    length, no ``tool_calls``). ``tool_choice: none`` shows no tools: the prompt and answer of a request without
    them."""
    add = {"type": "function", "function": {"name": "add", "description": "Add two integers.", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}}
    plain = client.chat.completions.create(model="tiny", messages=HELLO, max_tokens=6, temperature=0)
    offered = client.chat.completions.create(model="tiny", messages=HELLO, tools=[add], max_tokens=6, temperature=0)
    c = offered.choices[0]
    assert c.message.tool_calls is None and c.finish_reason in ("stop", "length") and c.message.content is not None
    assert offered.usage.prompt_tokens > plain.usage.prompt_tokens + 20  # the schemas are in the prompt
    none = client.chat.completions.create(model="tiny", messages=HELLO, tools=[add], tool_choice="none", max_tokens=6,
                                          temperature=0)
    assert none.usage.prompt_tokens == plain.usage.prompt_tokens
    assert none.choices[0].message.content == plain.choices[0].message.content
