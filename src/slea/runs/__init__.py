"""A run folder, written and read: its layout (folder.py), checkpoints, the metrics log and its sinks, the sampled
episodes."""
