"""Operating a served host: what the remove deploy takes off it."""
