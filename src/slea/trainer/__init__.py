"""The trainers (on-policy RL, TeamTR), their update, checkpoints, metrics and comparisons."""
