"""Chat templates with tool support, for tests that must not download a real tokenizer: the markers and layout of
Qwen2.5's (tools in the system turn, ``<tool_call>`` blocks, tool results as ``<tool_response>`` user turns) and
the markers of Llama-3.1's, put on a copy of the tiny test tokenizer by :func:`with_template`."""

from __future__ import annotations

import copy

QWEN_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n{{ messages[0]['content'] }}\n\n# Tools\n<tools>"
    "{%- for t in tools %}\n{{ t | tojson }}{%- endfor %}\n</tools>\nFor each function call, return a json object "
    "within <tool_call></tool_call> XML tags.<|im_end|>\n{%- endif %}"
    "{%- for m in messages %}"
    "{%- if m['role'] == 'system' %}{%- if not tools %}<|im_start|>system\n{{ m['content'] }}<|im_end|>\n{%- endif %}"
    "{%- elif m['role'] == 'assistant' and m.get('tool_calls') %}<|im_start|>assistant\n"
    "{%- for tc in m['tool_calls'] %}<tool_call>\n{\"name\": \"{{ tc['function']['name'] }}\", \"arguments\": "
    "{{ tc['function']['arguments'] | tojson }}}\n</tool_call>{%- endfor %}<|im_end|>\n"
    "{%- elif m['role'] == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m['content'] }}\n</tool_response><|im_end|>\n"
    "{%- else %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{%- endif %}"
    "{%- endfor %}{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}"
)
LLAMA_TEMPLATE = (  # the markers of Llama-3.1's template that matter here
    "{%- if tools %}Environment: ipython{%- endif %}{%- for m in messages %}<|start_header_id|>{{ m['role'] }}"
    "<|end_header_id|>{{ m['content'] }}{%- if m.get('tool_calls') %}<|python_tag|>{%- endif %}<|eot_id|>"
    "{%- endfor %}"
)




def with_template(tokenizer, template: str):
    """A copy of ``tokenizer`` with ``template`` as its chat template."""
    tok = copy.deepcopy(tokenizer)
    tok.chat_template = template
    return tok
