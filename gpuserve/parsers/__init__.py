"""Pure parsers of real host-tool output (one module per tool).

Every parser takes the tool's stdout (a string or a list of lines), returns typed data
and raises :class:`gpuserve.parsers.common.ParseError` (a ``ValueError``) naming the
offending line when the text is not what the tool prints. Parsers never run anything;
``gpuserve.facts`` runs the commands and turns a ``ParseError`` into an absent value.
"""
