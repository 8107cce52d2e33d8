"""Check that a Hugging Face model folder is one slea can train, before a run loads it.

    python docs/howto/check_model.py PATH [--targets q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj]

What slea needs, and where it reads it:
- weights in safetensors (``model.safetensors`` or shards with an index): slea never unpickles a
  ``pytorch_model.bin`` (slea/policy/model.py loads with ``use_safetensors=True``);
- a tokenizer whose chat template renders the prompts (slea/policy/prompt_builder.py calls ``apply_chat_template``;
  there is no fallback);
- module names for the LoRA adapters (``model.lora_targets``): targets that are not modules of the model are
  dropped, and none left is a config error. The default names are those of Llama, Qwen and SmolLM.

Prints one line per requirement and exits 0 when all hold, 2 when one does not. It reads config.json and the
tokenizer only; no weights are loaded.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

DEFAULT_TARGETS = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("path", type=Path)
    ap.add_argument("--targets", default=DEFAULT_TARGETS, help="model.lora_targets, comma-separated")
    args = ap.parse_args()
    path: Path = args.path
    if not (path / "config.json").is_file():
        print(f"{path}: no config.json, not a Hugging Face model folder")
        return 2
    ok = True

    shards = sorted(p.name for p in path.glob("*.safetensors"))
    pickles = sorted(p.name for p in path.glob("*.bin"))
    ok &= bool(shards)
    print(f"safetensors weights: {', '.join(shards) if shards else 'NONE'}"
          + (f" (ignored, never unpickled: {', '.join(pickles)})" if pickles else ""))

    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    template = bool(getattr(tok, "chat_template", None))
    ok &= template
    if template:
        text = tok.apply_chat_template([{"role": "system", "content": "S"}, {"role": "user", "content": "U"}],
                                       add_generation_prompt=True, tokenize=False)
        print(f"chat template: yes ({len(tok(text).input_ids)} tokens for a two-message prompt)")
    else:
        print("chat template: NONE (slea renders every prompt with it; add one to tokenizer_config.json)")

    # the module names, from an empty (meta-device) model built from config.json: no weights are read
    import torch

    config = AutoConfig.from_pretrained(path)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    names = {n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    wanted = [t.strip() for t in args.targets.split(",") if t.strip()]
    found = [t for t in wanted if t in names]
    ok &= bool(found)
    print(f"LoRA targets found: {', '.join(found) or 'NONE'}"
          + (f"; not modules of this model: {', '.join(t for t in wanted if t not in found)}" if len(found) < len(wanted) else "")
          + f" (its linear layers: {', '.join(sorted(names))})")
    print(f"layers: {config.num_hidden_layers} (model.lora_layers: N puts adapters on the top N)")
    return 0 if ok else 2


if __name__ == "__main__":
    sys.exit(main())
