"""A run folder, written and read: checkpoints, the metrics log and its sinks, the sampled episodes."""
