"""A model behind an OpenAI-compatible server as the played policy of commands that train nothing (``slea
agent``, ``slea eval``): what is loaded locally, how prompts travel, and who writes the library's lessons.

- Weights: a served model is *frozen* when nothing trained is to be shown (no checkpoint, no ``init_from``):
  then no weights load here, none go to the server and no LoRA adapter is involved (:func:`needs_weights`);
  only the tokenizer loads (:func:`load_tokenizer_or_none`), and with ``model.openai.api: chat`` not even that
  is required. A run's trained adapter still travels as in training (``OpenAIGenerator.sync_weights``).
- Prompts: with ``api: completions`` the prompt goes as token ids (or text) of the local chat template, as in
  training. With ``api: chat`` each prompt is the same chat messages :class:`slea.policy.prompt_builder.PromptBuilder`
  builds (the env's instructions, the retrieved experiences in the system message, the turn history, the
  observation) and the server applies its own chat template: :class:`ChatPromptBuilder` hands the engine a
  :class:`ChatPrompt`, the prompt ids (empty without a tokenizer) carrying the messages. A tool env's turn goes
  as OpenAI tool calling: its schemas as the request's ``tools``, the past calls and results as assistant
  ``tool_calls`` and ``role: "tool"`` messages; the answer's ``tool_calls`` come back as the text the rollout
  parses (``OpenAIGenerator`` with ``api: chat``).
- Lessons: ``experience.extractor: llm`` asks the served model (:func:`served_text`) when no local weights
  answer it: a frozen served policy, or a second served model named by ``model.openai.extractor_model`` /
  ``extractor_base_url``. The rule extractor stays the fallback for every answer that yields no lesson.
"""

from __future__ import annotations

import logging
import zlib
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from slea.policy import tool_calls
from slea.policy.prompt_builder import PromptBuilder

if TYPE_CHECKING:
    from slea.config import ExperienceSection, ModelSection, RolloutSection

log = logging.getLogger(__name__)
SERVED = ("openai", "vllm")


class ChatPrompt(list):
    """Prompt token ids (a list, as every engine takes) that also carry the chat ``messages`` they render and, for
    a tool env, the ``tool_parser`` its answers are read in (the served answer's ``tool_calls`` are written back
    in it)."""

    def __init__(self, ids: Sequence[int], messages: list[dict[str, Any]], tool_parser=None):
        super().__init__(ids)
        self.messages = messages
        self.tool_parser = tool_parser


class ChatPromptBuilder(PromptBuilder):
    """The rollout prompt builder whose prompts keep their chat messages (``model.openai.api: chat``); without a
    tokenizer the ids are empty and only the messages travel. A tool env's messages are always in the tools
    format (the schemas, assistant ``tool_calls``, ``role: "tool"`` results): they travel as the request's
    ``tools`` and the server renders them (its template's tools rendering, or ``slea serve``'s fallback); the
    local ids are the same rendering (:func:`slea.policy.tool_calls.render`)."""

    def tool_syntax(self) -> tuple[tool_calls.ToolParser, bool]:
        return tool_calls.parser_for(self.tokenizer, self.tool_parser), True

    def encode(self, messages: list[dict[str, Any]]) -> list[int]:
        schemas = messages[0].get("tools") if messages else None
        parser = self.tool_syntax()[0] if schemas else None
        if self.tokenizer is None:
            ids: list[int] = []
        elif schemas and parser is not None:  # a parser exactly when there are schemas
            text = tool_calls.render(self.tokenizer, messages, schemas, parser)
            ids = list(self.tokenizer(text, add_special_tokens=False).input_ids)
        else:
            ids = super().encode(messages)
        return ChatPrompt(ids, [dict(m) for m in messages], parser)


def chat_api(model_cfg: ModelSection) -> bool:
    return model_cfg.generator in SERVED and model_cfg.openai.api == "chat"


def prompt_builder(model_cfg: ModelSection, tok, rollout: RolloutSection) -> PromptBuilder:
    """The builder a run's rollouts use (:meth:`PromptBuilder.from_rollout`), keeping messages for chat."""
    cls = ChatPromptBuilder if chat_api(model_cfg) else PromptBuilder
    return cls.from_rollout(tok, rollout)


def needs_weights(model_cfg: ModelSection, adapter_dir=None) -> bool:
    """Whether the played model's weights load here: always in-process (``hf``); for a served model only when
    trained weights (a checkpoint, ``model.init_from``) must reach the server."""
    return model_cfg.generator not in SERVED or adapter_dir is not None or model_cfg.init_from is not None


def load_tokenizer_or_none(model_cfg: ModelSection):
    """The local tokenizer of ``model.tokenizer`` / ``model.name_or_path``; ``None`` when it is not here and
    the chat API needs none (with ``api: completions`` a missing tokenizer is an error: the prompts are its ids)."""
    from slea.policy.model import load_tokenizer

    name = model_cfg.tokenizer or model_cfg.name_or_path
    why = "not here" if not tokenizer_here(name) else ""
    if not why:
        try:
            return load_tokenizer(name)
        except (OSError, ValueError) as exc:
            why = type(exc).__name__
    if not chat_api(model_cfg):
        from slea.config import ConfigError

        raise ConfigError(f"model.name_or_path: no tokenizer for {name!r} ({why}); model.openai.api: completions "
                          f"sends the local tokenizer's ids (set model.tokenizer to a local folder, or "
                          f"model.openai.api: chat)")
    log.info("no local tokenizer for %s: chat messages only, no token counts", name)
    return None


def tokenizer_here(name: str) -> bool:
    """Whether a tokenizer named ``name`` loads without the network: ``embedded``, ``tiny``, a folder, or a name
    in the local Hugging Face cache (never a download attempt, which offline costs a minute of retries)."""
    from pathlib import Path

    if name in ("embedded", "tiny") or Path(name).is_dir():
        return True
    if name.count("/") != 1:
        return False
    try:
        from huggingface_hub import try_to_load_from_cache

        return isinstance(try_to_load_from_cache(name, "tokenizer_config.json"), str)
    except Exception:  # noqa: BLE001  (not a valid repo id: not cached)
        return False


def served_text(generator, *, model_cfg: ModelSection,
                experience: ExperienceSection) -> Callable[[list], list[str]] | None:
    """``generate_text`` for ``experience.extractor: llm`` answered by a server, or ``None`` when local weights
    answer (``experience.extractor_model``, or the played model's own weights). A second served model
    (``model.openai.extractor_model`` / ``extractor_base_url``) gets its own client; otherwise the played
    model's server answers. Greedy unless ``experience.extract_temperature`` > 0 (then keyed by the prompt)."""
    if model_cfg.generator not in SERVED or experience.extractor_model is not None:
        return None
    o = model_cfg.openai
    second = o.extractor_model is not None or o.extractor_base_url is not None
    if not second and getattr(generator, "model", None) is not None:
        return None  # the played model's base weights are here: the trainer's in-process extractor
    client = generator
    if second:
        from slea.policy.openai_engine import OpenAIGenerator

        settings = o.model_copy(update={"base_url": o.extractor_base_url or o.base_url,
                                        "model": o.extractor_model})
        client = OpenAIGenerator(None, generator.tok, settings, stop_at_newline=False, trains=False)
    x = experience

    def generate_text(prompts: list) -> list[str]:
        keys = None
        if x.extract_temperature > 0:
            keys = [[zlib.crc32(repr(p).encode("utf-8", "replace"))] for p in prompts]
        return client.answer_texts(prompts, max_tokens=x.extract_max_new_tokens,
                                   temperature=x.extract_temperature, rng_keys=keys)

    return generate_text


def played_policy(adapter_dir=None, *, model_cfg: ModelSection, rollout: RolloutSection, device=None):
    """``(model | None, tokenizer | None, prompt builder, generator)`` of a command that trains nothing: the
    weights load only when :func:`needs_weights` (then a served engine receives a trained adapter), the engine
    neither asks for nor requires log-probs, and a served one is checked against what ``model.openai.api``
    needs before any episode (:meth:`OpenAIGenerator.check`). Raises ConfigError / GeneratorError (one line)."""
    from slea.policy.engines import close_generator, make_generator
    from slea.policy.model import load_policy

    model = None
    if needs_weights(model_cfg, adapter_dir):
        model, tok = load_policy(model_cfg, adapter_dir=adapter_dir, device=device)
        model.requires_grad_(False).eval()
    else:
        tok = load_tokenizer_or_none(model_cfg)
    builder = prompt_builder(model_cfg, tok, rollout)
    generator = make_generator(model_cfg, model, tok, max_batch=rollout.max_batch, trains=False)
    try:
        if model_cfg.generator in SERVED:
            generator.check()
            if model is not None and hasattr(model, "peft_config"):
                generator.sync_weights(model)  # a run's trained adapter reaches the server
            elif model is not None:
                from slea.config import ConfigError

                raise ConfigError(f"model.generator: {model_cfg.generator}: a fully fine-tuned run's weights "
                                  f"(model.lora: false) cannot be sent to a server as an adapter; play it "
                                  f"in-process (model.generator: hf)")
    except BaseException:
        close_generator(generator)
        raise
    return model, tok, builder, generator
