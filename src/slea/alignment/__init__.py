"""Offline alignment (tlm-DRE's pipeline, reference/papers.md §3): expert data, SFT, preference pairs against
the policy's own failures, and the alignment losses."""
