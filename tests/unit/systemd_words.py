"""What systemd really runs for the SGLang unit, modelled on systemd's own C parsers
(not on gpuserve's quoting, so the round trip is a real check):

- an ExecStart= value (systemd.service(5), "Command lines"): backslash-newline joins
  lines, words split at whitespace, "..." and '...' quote, ``$$`` is ``$`` and ``%%``
  is ``%`` (the only specifier and variable forms gpuserve emits);
- an EnvironmentFile= assignment (src/basic/env-file.c, ``parse_env_file_internal``):
  ``KEY=value`` plain (a backslash escapes the next character) or ``KEY="..."`` (a
  backslash escapes only ``"``, ``\\``, backquote and ``$``; before a newline it joins
  lines; before anything else it stays);
- a word ``$VAR`` of ExecStart= (src/basic/env-util.c, ``replace_env_argv``): the value
  split by ``extract_first_word(EXTRACT_UNQUOTE|EXTRACT_RELAX)``, where whitespace
  separates, "..." and '...' quote, and a backslash escapes the next character, inside
  quotes too.

The lab checks the same path end to end: its SGLang stand-in runs under real systemd.
"""

from __future__ import annotations

import shlex

WHITESPACE = " \t\n\r"
SHELL_NEED_ESCAPE = '"\\`$'


def exec_start_words(value: str) -> list[str]:
    """The words of an ExecStart= value as gpuserve renders it."""
    text = value.replace("\\\n", " ")
    return shlex.split(text.replace("$$", "\0DOLLAR\0").replace("%%", "%"), posix=True)


def env_value(env_text: str, key: str) -> str | None:
    """The value of ``key`` in an EnvironmentFile (the last assignment wins)."""
    found = None
    lines = iter(env_text.splitlines(keepends=True))
    for line in lines:
        if line.lstrip().startswith(("#", ";")) or "=" not in line:
            continue
        name, rest = line.split("=", 1)
        if name.strip() != key:
            continue
        rest = rest.lstrip(" \t")
        if not rest.startswith('"'):
            out, i = [], 0
            while i < len(rest):
                c = rest[i]
                if c == "\\" and i + 1 < len(rest):
                    if rest[i + 1] != "\n":
                        out.append(rest[i + 1])
                    i += 2
                    continue
                if c in "\r\n":
                    break
                out.append(c)
                i += 1
            found = "".join(out).rstrip(WHITESPACE)
            continue
        out, i, text = [], 1, rest
        while True:
            if i >= len(text):  # a quoted value goes on over the next line
                text += next(lines)
            c = text[i]
            if c == '"':
                break
            if c == "\\":
                n = text[i + 1] if i + 1 < len(text) else next(lines)[0]
                if n in SHELL_NEED_ESCAPE:
                    out.append(n)
                elif n != "\n":
                    out.extend((c, n))
                i += 2
                continue
            out.append(c)
            i += 1
        found = "".join(out)
    return found


def split_variable(value: str) -> list[str]:
    """``extract_first_word`` with EXTRACT_UNQUOTE|EXTRACT_RELAX, repeated."""
    words: list[str] = []
    i, n = 0, len(value)
    while True:
        while i < n and value[i] in WHITESPACE:
            i += 1
        if i >= n:
            return words
        word, quote = [], None
        while i < n:
            c = value[i]
            if c == "\\":
                if i + 1 < n:
                    word.append(value[i + 1])
                i += 2
                continue
            if quote:
                if c == quote:
                    quote = None
                else:
                    word.append(c)
            elif c in "'\"":
                quote = c
            elif c in WHITESPACE:
                break
            else:
                word.append(c)
            i += 1
        words.append("".join(word))


def server_argv(unit_text: str, env_text: str) -> list[str]:
    """The argv systemd starts: ExecStart= with each ``$VAR`` word replaced by the
    EnvironmentFile's value split into words (an unset variable gives no word)."""
    joined = unit_text.replace("\\\n", " ")
    line = next(x for x in joined.splitlines() if x.startswith("ExecStart="))
    argv: list[str] = []
    for word in exec_start_words(line.split("=", 1)[1]):
        if word.startswith("\0DOLLAR\0"):
            argv.append("$" + word[len("\0DOLLAR\0"):])
        elif word.startswith("$") and not word.startswith("${"):
            value = env_value(env_text, word[1:])
            argv += split_variable(value) if value is not None else []
        else:
            argv.append(word.replace("\0DOLLAR\0", "$"))
    return argv
