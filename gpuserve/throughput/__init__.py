"""How fast: output tokens per second of a launch from its architecture, GPUs, link and workload."""
