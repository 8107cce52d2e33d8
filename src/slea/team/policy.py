"""A team's policy: n agents as separate LoRA adapters on one shared, frozen base model (peft multi-adapter).

Every agent is a peft adapter named after its role, built from the one ``model.lora_*`` config
(:func:`slea.policy.model.lora_config`); LoRA's B matrices start at zero, so every agent starts as the base
model. :meth:`TeamPolicy.activate` makes one adapter the active one (``set_adapter``: generation and training
forwards then run base + that adapter, and only its weights require gradients). The base weights are shared and
never trained, so n agents cost one model plus n small adapters.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch

from slea.config import ConfigError


class TeamPolicy:
    """The peft model holding one adapter per agent, its tokenizer and the agents' names (router index order)."""

    def __init__(self, model, tokenizer, agents: list[str]):
        self.model = model
        self.tok = tokenizer
        self.agents = list(agents)
        self.active: int | None = None

    # -- which agent runs ------------------------------------------------------------------------------------
    def activate(self, agent: int) -> None:
        """Make ``agent``'s adapter the active one (a no-op when it already is)."""
        if agent != self.active:
            self.model.set_adapter(self.agents[agent])
            self.active = agent

    @contextlib.contextmanager
    def acting(self, agent: int):
        """``with team.acting(j):`` runs the block with agent ``j``'s adapter active, then restores the previous."""
        before = self.active
        self.activate(agent)
        try:
            yield self.model
        finally:
            if before is not None:
                self.activate(before)

    # -- one agent's weights ---------------------------------------------------------------------------------
    def named_adapter_parameters(self, agent: int) -> dict[str, torch.nn.Parameter]:
        """Agent ``agent``'s LoRA weights by parameter name (``...lora_A.<name>.weight``, ``...lora_B.<name>...``)."""
        key = f".{self.agents[agent]}."
        return {n: p for n, p in self.model.named_parameters() if key in n and ".lora_" in n}

    def parameters(self, agent: int) -> list[torch.nn.Parameter]:
        return list(self.named_adapter_parameters(agent).values())

    def state(self, agent: int) -> dict[str, torch.Tensor]:
        """A copy of agent ``agent``'s adapter weights (to restore it, or to compare it bit for bit)."""
        return {n: p.detach().clone() for n, p in self.named_adapter_parameters(agent).items()}

    def load_state(self, agent: int, state: dict[str, torch.Tensor]) -> None:
        with torch.no_grad():
            for n, p in self.named_adapter_parameters(agent).items():
                p.copy_(state[n])

    # -- files -----------------------------------------------------------------------------------------------
    def save_adapters(self, folder: str | Path) -> list[Path]:
        """Write every agent's adapter to ``folder/<agent>.safetensors`` (peft's state-dict keys); return the paths."""
        from peft import get_peft_model_state_dict
        from safetensors.torch import save_file

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        paths = []
        for name in self.agents:
            sd = get_peft_model_state_dict(self.model, adapter_name=name)
            path = folder / f"{name}.safetensors"
            save_file({k: v.detach().cpu().contiguous() for k, v in sd.items()}, str(path))
            paths.append(path)
        return paths

    def load_adapters(self, folder: str | Path) -> None:
        """Load every agent's adapter written by :meth:`save_adapters` (safetensors only; a missing or mismatched
        file is a ``ValueError`` naming it)."""
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file

        for name in self.agents:
            path = Path(folder) / f"{name}.safetensors"
            if not path.is_file():
                raise ValueError(f"no adapter file for agent {name!r}: {path}")
            result = set_peft_model_state_dict(self.model, load_file(str(path)), adapter_name=name)
            missing = [k for k in result.missing_keys if f".{name}." in k]
            if result.unexpected_keys or missing:
                raise ValueError(f"{path}: does not fit agent {name!r} (unexpected {result.unexpected_keys[:2]}, "
                                 f"missing {missing[:2]})")


def build_team_policy(model_cfg, agents: list[str], device: str | torch.device | None = None) -> TeamPolicy:
    """Load the base model once (``model_cfg``) on ``device`` (default the CPU) and give it one LoRA adapter per
    agent name. The base is frozen, so it is stored in ``model.base_dtype`` (bf16 on CUDA by default; its linears
    in bf16 on the CPU under bf16 compute, the same numbers as fp32); every adapter is fp32 and on the base's
    device.

    The team needs LoRA (``model.lora: true``): separate full models per agent are not built here."""
    from slea.device import resolve_base_dtype, resolve_base_storage
    from slea.policy.model import add_lora, load_policy, lora_config, store_frozen_linears

    if not model_cfg.lora:
        raise ConfigError("model.lora: a team's agents are LoRA adapters on one base model; set model.lora: true")
    if len(set(agents)) != len(agents) or not agents:
        raise ConfigError(f"team: agent names must be unique and non-empty (got {agents})")
    dtype = resolve_base_dtype(model_cfg.base_dtype, device=device or "cpu", lora=True, dtype=model_cfg.dtype)
    # every adapter starts fresh on the base: the model section's init_from, which the config check refuses for a
    # team (but for a `slea compare` sub-run only when no compared algorithm reads it), loads no run's weights
    base, tok = load_policy(model_cfg.model_copy(update={"lora": False, "init_from": None}), device=device,
                            base_dtype=dtype)
    lcfg = lora_config(base, model_cfg)
    model = add_lora(base, lcfg, adapter_name=agents[0])
    for name in agents[1:]:
        model.add_adapter(name, lcfg)
    if resolve_base_storage(model_cfg.base_dtype, device=device or "cpu", lora=True,
                            dtype=model_cfg.dtype) == "bfloat16_linears":
        store_frozen_linears(model, torch.bfloat16)  # after every adapter: theirs stay fp32
    team = TeamPolicy(model, tok, agents)
    team.activate(0)
    return team
