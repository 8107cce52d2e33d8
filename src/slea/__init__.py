"""slea: multi-turn agentic RL with a self-evolving, per-step experience library."""

__version__ = "0.1.0"
