"""A tiny random-init causal LM with a tokenizer trained locally: for tests and the smoke preset.

Nothing is downloaded: a byte-level BPE is trained on generated text-game sentences, wrapped with a
ChatML template (the same markers as SmolLM2), and a ~1M-parameter Llama is built from a config.
"""

from __future__ import annotations

import random
from pathlib import Path

import torch

from slea.atomic import atomic_model_dir, cache_dir

TINY_VERSION = "v1"
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|pad|>"]

_WORDS = [
    "go", "north", "south", "east", "west", "take", "drop", "open", "close", "unlock", "insert", "put",
    "in", "on", "the", "a", "an", "of", "with", "from", "to", "coin", "key", "box", "chest", "door", "room",
    "kitchen", "cellar", "attic", "garden", "apple", "mug", "fridge", "table", "counter", "drawer", "shelf",
    "you", "are", "see", "there", "is", "here", "nothing", "your", "task", "goal", "command", "valid",
    "commands", "observation", "reply", "exactly", "one", "copied", "list", "win", "lose", "score", "moves",
    "inventory", "carrying", "look", "examine", "eat", "cook", "cut", "slice", "knife", "oven", "red",
    "blue", "green", "small", "large", "wooden", "metal", "player", "agent", "step", "strategy", "warning",
    "avoid", "when", "led", "success"
]


def _corpus(n: int = 4000, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    lines = []
    for _ in range(n):
        k = rng.randint(3, 14)
        words = [rng.choice(_WORDS) for _ in range(k)]
        if rng.random() < 0.3:
            words.append(str(rng.randint(0, 99)))
        sent = " ".join(words)
        lines.append(sent.capitalize() + rng.choice([".", "?", "!", ":", ""]))
    return lines


def build_tiny(out: str | Path, *, vocab_size: int = 1024, hidden: int = 64, layers: int = 2,
               seed: int = 0) -> Path:
    """Write a tiny model + tokenizer folder to ``out`` (loadable with ``from_pretrained``)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    bpe.train_from_iterator(_corpus(seed=seed), trainer=trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token="<|im_start|>", eos_token="<|im_end|>",
                                  pad_token="<|pad|>", unk_token="<|endoftext|>")
    tok.chat_template = CHAT_TEMPLATE
    tok.save_pretrained(out)

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(tok), hidden_size=hidden, intermediate_size=hidden * 11 // 4,
                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=4096, tie_word_embeddings=True,
                         bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                         pad_token_id=tok.pad_token_id)
    model = LlamaForCausalLM(config)
    model.save_pretrained(out, safe_serialization=True)
    return out


def tiny_model_dir() -> Path:
    """The cached tiny model folder (built on first use, deterministically)."""
    return atomic_model_dir(cache_dir() / "models" / f"tiny-{TINY_VERSION}", lambda tmp: build_tiny(tmp))
