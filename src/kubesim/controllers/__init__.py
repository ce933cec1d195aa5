"""Core controllers that run inside kubesim, reading and writing the store directly."""
