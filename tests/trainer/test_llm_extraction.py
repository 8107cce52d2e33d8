"""The LLM extractor through one training iteration on the tiny model: base weights (LoRA off), chat template,
multi-line answers with their own token budget, per-trajectory rule fallback, lessons admitted."""

from pathlib import Path

import pytest

from slea.config import load_config

SMOKE = str(Path(__file__).resolve().parents[2] / "configs" / "smoke.yaml")
OVER = ["eval.before=false", "eval.greedy=false", "env.max_steps=2", "experience.mode=step",
        "experience.extractor=llm", "experience.warmup_iters=0", "experience.min_entries=1",
        "experience.extract_max_new_tokens=8", "train.iterations=1", "rollout.groups=1", "rollout.group_size=2"]


def _lora_off(model) -> bool:
    layers = [m for m in model.modules() if hasattr(m, "lora_A") and hasattr(m, "disable_adapters")]
    return bool(layers) and all(m.disable_adapters for m in layers)


@pytest.mark.slow
def test_llm_extractor_end_to_end_through_one_iteration(tmp_path, monkeypatch):
    pytest.importorskip("textworld")
    from slea.experience.engine import experience_manager
    from slea.policy.generation import HFGenerator
    from slea.trainer import rl

    calls = []
    real = HFGenerator.generate

    def spy(self, prompts, **kw):
        if kw.get("stop_at_newline") is False:  # the extractor's calls (rollouts stop at the first newline)
            calls.append({"text": [self.tok.decode(p) for p in prompts], "kw": kw, "lora_off": _lora_off(self.model),
                          "model": self.model})
        return real(self, prompts, **kw)

    monkeypatch.setattr(HFGenerator, "generate", spy)
    t = rl.Trainer(load_config(SMOKE, OVER + [f"run.dir={tmp_path / 'run'}"]))
    assert t.experience.extractor.__class__.__name__ == "LLMExtractor"
    m = t.iteration(0)

    n_sel = m["library/selected_pos"] + m["library/selected_neg"]
    assert n_sel > 0 and len(calls) == 1  # one batched call per evolution step, one prompt per trajectory
    call = calls[0]
    assert len(call["text"]) == n_sel
    assert call["model"] is t.model and call["lora_off"]  # the policy's base weights: adapters disabled
    assert not _lora_off(t.model)  # ... only for that call
    assert call["kw"]["max_new_tokens"] == 8 and call["kw"]["temperature"] == 0.0
    for text in call["text"]:  # chat template: system + user, the answer opened with the "- " prefill
        assert text.startswith("<|im_start|>system\nYou coach agents") and "<|im_start|>user\n" in text
        assert text.endswith("<|im_start|>assistant\n- ")
    # every selected trajectory gave LLM lessons or fell back to the rules; the library learned something
    assert m["library/extract_llm_answers"] == n_sel
    assert m.get("library/extract_fallback", 0) <= n_sel
    assert m["library/size"] > 0 and m["library/added"] > 0

    # a separately named extractor model is loaded once, frozen, and is not the policy
    cfg2 = load_config(SMOKE, OVER + [f"run.dir={tmp_path / 'run2'}", "experience.extractor_model=tiny"])
    with experience_manager(t.spec, tmp_path / "run2", t.generator, experience=cfg2.experience,
                            model_cfg=cfg2.model) as exp:
        answers = exp.generate_text(["Say something.", [{"role": "system", "content": "Be brief."},
                                                        {"role": "user", "content": "Hi"}]])
        assert len(answers) == 2 and all(isinstance(a, str) for a in answers)
        assert calls[-1]["model"] is not t.model and not any(p.requires_grad for p in calls[-1]["model"].parameters())
        assert calls[-1]["text"][0].startswith("<|im_start|>user\nSay something.")
    t.log.close()
