"""Linux's MAX_ARG_STRLEN bound on the server's argv and environment strings."""

from __future__ import annotations

from gpuserve.launch.exec_limits import MAX_ARG_STRLEN, args_problem, env_problem


def field_of(arg: str) -> str:
    return "extra_args[1]" if arg.startswith("x") else "model.path"


def test_one_argument_at_the_limit_passes_and_one_byte_more_is_refused() -> None:
    fits = "x" * (MAX_ARG_STRLEN - 1)  # the NUL makes it exactly 131,072
    assert args_problem(["--chat-template", fits], "V=short", field_of) is None
    field, message = args_problem(["--chat-template", fits + "x"], "V=short", field_of)
    assert field == "extra_args[1]"
    assert "131,073 bytes" in message and "MAX_ARG_STRLEN" in message


def test_bytes_not_characters_are_counted() -> None:
    word = "\u00e9" * (MAX_ARG_STRLEN // 2)  # two UTF-8 bytes each
    assert args_problem([word], "V=short", lambda a: "model.path")[0] == "model.path"


def test_the_whole_variable_names_the_field_that_gives_the_most() -> None:
    args = ["--model-path", "/m", *["x" * 1000] * 140]
    field, message = args_problem(args, "GPUSERVE_SGLANG_ARGS=" + " ".join(args), field_of)
    assert field == "extra_args"
    assert "in GPUSERVE_SGLANG_ARGS" in message


def test_an_environment_string_counts_its_name() -> None:
    value = "v" * (MAX_ARG_STRLEN - len("K=") - 1)
    assert env_problem("K", value) is None
    assert "131,073 bytes" in env_problem("K", value + "v")
