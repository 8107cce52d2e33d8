"""From envs to an iteration's episodes: the multi-turn loop (N task groups × G copies, one batched generation call
per turn), the rollout schemes that play an iteration's rounds, and dynamic sampling's refill."""
