"""Data-parallel training: the process group, the gathers and FSDP sharding, and what it refuses."""
