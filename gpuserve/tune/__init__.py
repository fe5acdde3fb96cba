"""The tuner: search a host's launch space (docs/tune.md)."""
