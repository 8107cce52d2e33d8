"""Loading the policy, its generation engines (in-process, OpenAI-compatible, vLLM), prompts and the critic head."""
