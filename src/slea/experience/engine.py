"""The trainer's experience manager, with the text engine its LLM extractor asks (``experience.extractor: llm``).

Used by the RL trainer and by ``slea agent`` (a served agent's library learns as the trainer's does).
"""

from __future__ import annotations

import contextlib
import zlib
from pathlib import Path
from typing import TYPE_CHECKING

from slea.device import model_device
from slea.policy.engines import make_generator
from slea.policy.model import load_policy
from slea.runs.folder import RunFolder

if TYPE_CHECKING:
    from slea.algorithms.registry import AlgorithmSpec
    from slea.config import ExperienceSection, ModelSection
    from slea.experience.manager import ExperienceManager


def experience_manager(spec: AlgorithmSpec, run_dir: Path, generator, *, experience: ExperienceSection,
                       model_cfg: ModelSection) -> ExperienceManager | None:
    """The experience manager, with the ``generate_text`` its extractor asks (``experience.extractor: llm``).

    ``generate_text(prompts) -> texts``: a prompt is a user message or chat messages (a last assistant message is
    a prefill the answer continues); rendered with the tokenizer's chat template; answered multi-line (EOS stops
    it) within ``experience.extract_max_new_tokens``, greedy unless ``experience.extract_temperature`` > 0 (then
    keyed by the prompt, reproducible); by the policy's base weights (LoRA adapters disabled for the call), or by
    ``experience.extractor_model`` (loaded once, frozen, on first use; also the base without LoRA), or by a server
    (:func:`slea.policy.served.served_text`: a frozen served policy's own, or ``model.openai.extractor_model``)."""
    if experience.mode == "off" and "clusters" not in spec.needs:
        return None
    from slea.experience.manager import ExperienceManager
    from slea.policy.served import served_text

    x = experience
    # a served model writes the lessons (slea/policy/served.py)
    served = served_text(generator, model_cfg=model_cfg, experience=experience)
    if served is not None:
        return ExperienceManager(x, RunFolder(run_dir).library, generate_text=served)
    engine: list = []  # [(in-process generator, disable_adapter?)], built on first use

    def extractor_engine():
        if not engine:
            if x.extractor_model is None and hasattr(generator.model, "disable_adapter"):
                # the base weights in-process, whatever engine the rollouts use
                engine.append((make_generator(model_cfg, generator.model, generator.tok, stop_at_newline=False,
                                              backend="hf"), True))
            else:
                name = x.extractor_model or model_cfg.name_or_path
                mcfg = model_cfg.model_copy(update={"name_or_path": name, "lora": False, "tokenizer": (
                    model_cfg.tokenizer if x.extractor_model is None else None)})
                model, tok = load_policy(mcfg, device=model_device(generator.model))
                model.requires_grad_(False).eval()
                engine.append((make_generator(model_cfg, model, tok, stop_at_newline=False, backend="hf"), False))
        return engine[0]

    def render(tok, prompt) -> str:
        msgs = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
        prefill = ""
        if len(msgs) > 1 and msgs[-1].get("role") == "assistant":
            prefill = msgs.pop()["content"]
        if getattr(tok, "chat_template", None):
            text = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
        else:
            text = "\n\n".join(m["content"] for m in msgs) + "\n\n"
        return text + prefill

    def generate_text(prompts: list) -> list[str]:
        gen, base = extractor_engine()
        texts = [render(gen.tok, p) for p in prompts]
        ids = [gen.tok(t, add_special_tokens=False).input_ids for t in texts]
        temp = x.extract_temperature
        keys = [[zlib.crc32(t.encode("utf-8", "replace"))] for t in texts] if temp > 0 else None
        with gen.model.disable_adapter() if base else contextlib.nullcontext():
            outs = gen.generate(ids, max_new_tokens=x.extract_max_new_tokens, temperature=temp, rng_keys=keys,
                                stop_at_newline=False)
        return [g.text for g in outs]

    return ExperienceManager(experience, RunFolder(run_dir).library, generate_text=generate_text)
