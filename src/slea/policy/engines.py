"""One generator interface, chosen by ``model.generator``; every caller builds its engine here.

A generator has ``model`` and ``tok`` (the local policy and tokenizer), ``calls`` (batched calls made),
``generate(prompts, *, max_new_tokens, temperature, top_p, top_k, rng_keys, stop_at_newline) -> [Generation]``
(token ids and the per-token log-probs ``log_softmax(logits / T)`` of each answer), and ``sync_weights(model)``,
which the trainer calls after every update: the engine then generates with the model's new weights.

- ``hf`` (default): :class:`slea.policy.generation.HFGenerator`, in-process over the training model itself, so
  ``sync_weights`` has nothing to do.
- ``openai``: :class:`slea.policy.openai_engine.OpenAIGenerator`, an OpenAI-compatible completions server
  (``slea serve``, vLLM's, llama.cpp's); ``sync_weights`` saves the LoRA adapter (safetensors) and asks the
  server to load it.
- ``vllm``: :class:`slea.policy.vllm_server.VLLMGenerator`, the ``openai`` engine on a vLLM server that it
  starts (``model.vllm``) and stops on :meth:`close` (or at exit); weights sync as LoRA adapters, as for openai.

A served generator has ``close()``; :func:`close_generator` calls it where there is one (a served engine frees its connection and
sync folder, a managed vLLM server stops).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from slea.config import ModelSection


def make_generator(model_cfg: ModelSection, model, tok, *, stop_at_newline: bool = True, backend: str | None = None,
                   max_batch: int = 32, server=None, trains: bool = True):
    """The generator ``model_cfg.generator`` names, over ``model``/``tok``. ``backend`` overrides the choice
    (the experience extractor runs the base weights in-process: ``backend="hf"``). ``max_batch``: the hf engine's
    rows decoded together (``rollout.max_batch``); ``server``: a managed vLLM server started earlier
    (:func:`start_server`). ``trains=False`` (``slea agent``, ``slea eval``): a served engine neither asks for
    nor requires log-probs, and may talk chat completions (``model.openai.api: chat``)."""
    name = backend or model_cfg.generator
    if name == "hf":
        from slea.policy.generation import HFGenerator

        return HFGenerator(model, tok, dtype=model_cfg.dtype, stop_at_newline=stop_at_newline, max_batch=max_batch)
    if name == "openai":
        from slea.policy.openai_engine import OpenAIGenerator

        return OpenAIGenerator(model, tok, model_cfg.openai, stop_at_newline=stop_at_newline, trains=trains)
    if name == "vllm":
        from slea.device import model_device
        from slea.policy.vllm_server import VLLMGenerator

        return VLLMGenerator(model, tok, model_cfg, stop_at_newline=stop_at_newline, server=server,
                             device=model_device(model))
    raise ValueError(f"model.generator: no engine {name!r} (hf, openai, vllm)")


def start_server(model_cfg: ModelSection, device):
    """The managed vLLM server of ``model.generator: vllm``, started before the trainer loads its model onto
    ``device`` (so vLLM's start-up memory check does not count the trainer's weights); None for other engines."""
    if model_cfg.generator != "vllm":
        return None
    from slea.policy.vllm_server import ManagedVLLM

    return ManagedVLLM(model_cfg, device)


def sleep_generator(generator) -> None:
    """Before an update: a served engine whose server sleeps (vLLM sleep mode) frees its GPU memory; it wakes
    at the weight sync that follows. The in-process engine has nothing to free."""
    sleep = getattr(generator, "sleep", None)
    if sleep is not None:
        sleep()


def close_generator(generator) -> None:
    """``generator.close()`` where it has one (the in-process engine holds nothing to free)."""
    close = getattr(generator, "close", None)
    if close is not None:
        close()
