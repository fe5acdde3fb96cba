"""Will it fit: model records, checkpoints, the planner, SGLang's memory defaults, start-up logs."""
