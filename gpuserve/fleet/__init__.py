"""Fleets: several GPU hosts as one service (multi-node launches)."""
