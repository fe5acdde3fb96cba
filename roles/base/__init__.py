"""The code every deploy shares, no role of its own: the one batched prefetch
(prefetch.py), files and units put only when they differ (managed.py), the dry run's
notes (planned.py, preview.py), the run's context (run_context.py), the inventory
(inventory.py), the interpreter choice's host reads (interpreter.py), long host jobs
(progress.py), failures and connection errors in one line (failure.py, connection.py).
The role contract: docs/architecture.md, "A role"."""
