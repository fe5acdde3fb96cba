"""CLI subcommands: one module each, discovered by ``gpuserve.cli``.

A module here exposes ``register(subparsers) -> None``; the parser it adds sets
``func=callable(args) -> int`` with ``set_defaults``. No shared list to edit.
"""
