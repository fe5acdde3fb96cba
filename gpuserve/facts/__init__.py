"""pyinfra facts about a GPU host; the only place in gpuserve that imports pyinfra.

Facts run read-only commands and hand the text to the pure parsers in
``gpuserve.parsers``. A missing tool or unparseable output gives the fact's absent value
(None or empty), never a failed host (docs/architecture.md, "pyinfra facts").
"""
