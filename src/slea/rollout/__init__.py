"""The multi-turn rollout loop: N task groups × G copies, one batched generation call per turn."""
