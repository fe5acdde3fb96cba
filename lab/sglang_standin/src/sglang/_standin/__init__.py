"""Internals of the lab's SGLang stand-in (standard library only)."""
