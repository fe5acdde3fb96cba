"""The bounded loader refuses hostile documents cheaply, with the file and line named."""

from __future__ import annotations

import pytest
import yaml

from gpuserve import safeload
from gpuserve.errors import InputError

LAUGHS = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{c}: &{c} [{', '.join([f'*{p}'] * 10)}]\n"
    for p, c in zip("abcdefgh", "bcdefghi", strict=True)
)


def refused(text: str | bytes, limits: safeload.Limits = safeload.CONFIG) -> InputError:
    with pytest.raises(InputError) as info:
        safeload.load_yaml(text, "in.yaml", limits)
    assert info.value.file == "in.yaml"
    return info.value


def test_billion_laughs_is_refused_from_its_expanded_size() -> None:
    error = refused(LAUGHS)
    assert "YAML nodes" in error.message
    assert error.line is not None and error.line <= 6


def test_a_few_ordinary_aliases_still_work() -> None:
    text = "base: &b {a: 1, b: [1, 2]}\nx: {<<: *b, c: 3}\ny: *b\n"
    assert safeload.load_yaml(text, "in.yaml") == {
        "base": {"a": 1, "b": [1, 2]},
        "x": {"a": 1, "b": [1, 2], "c": 3},
        "y": {"a": 1, "b": [1, 2]},
    }


def test_alias_budget_and_recursive_alias() -> None:
    one_alias = safeload.CONFIG.but(max_aliases=1)
    assert "aliases" in refused("a: &a 1\nb: [*a, *a]\n", one_alias).message
    assert "recursive" in refused("&a [*a]\n").message


DEEP_MAP = "a:\n" + "".join(" " * i + "b:\n" for i in range(1, 300))


@pytest.mark.parametrize("text", ["[" * 100_000, DEEP_MAP])
def test_deep_yaml_is_refused_before_recursion(text: str) -> None:
    error = refused(text)
    assert "nested too deeply" in error.message
    assert error.line is not None


def test_alias_to_a_deep_node_counts_its_depth() -> None:
    limits = safeload.CONFIG.but(max_depth=4)
    text = "a: &a [[[1]]]\nb: [[*a]]\n"
    assert "nested too deeply" in refused(text, limits).message
    assert safeload.load_yaml("a: &a [[1]]\nb: *a\n", "in.yaml", limits)["b"] == [[1]]


@pytest.mark.parametrize("value", [".nan", ".inf", "-.Inf", "1.0e+999"])
def test_non_finite_yaml_floats_are_refused_with_the_line(value: str) -> None:
    error = refused(f"ok: 1\nx: {value}\n")
    assert error.line == 2 and "finite" in error.message


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("x: \"a\x01\"\n", "control character U+0001"),
        (b"x: \xff\n", "not UTF-8"),
        ("x: " + "9" * 5000 + "\n", "integer too long"),
        ("x: !!python/object/apply:os.system [true]\n", "constructor"),
        ("x: [\n", "invalid YAML"),
        ("x: *nope\n", "undefined alias"),
    ],
)
def test_other_bad_yaml_is_an_input_error(text: str | bytes, words: str) -> None:
    assert words in refused(text).message


def test_size_limit_is_checked_before_parsing(tmp_path) -> None:
    path = tmp_path / "big.yaml"
    path.write_text("x: " + "y" * 2000 + "\n")
    with pytest.raises(InputError, match="too large") as info:
        safeload.load_yaml_file(path, safeload.CONFIG.but(max_bytes=1000))
    assert info.value.file == str(path)


def test_compose_keeps_marks_for_line_numbers() -> None:
    loader, node = safeload.compose_yaml("a: 1\nb: [2]\n", "p.yaml")
    try:
        assert isinstance(node, yaml.MappingNode)
        assert node.value[1][0].start_mark.line == 1
        assert safeload.construct(loader, node.value[1][1]) == [2]
    finally:
        loader.dispose()


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("[" * 200_000, "nested too deeply"),
        ('{"a": [NaN]}', "NaN is not a finite number"),
        ('{"a": -Infinity}', "finite"),
        ('{"a": 1e999}', "1e999 is not a finite number"),
        ("9" * 5000, "invalid JSON value"),
        ('{"a": ', "invalid JSON"),
        (b'{"a": "\xff"}', "not UTF-8"),
    ],
)
def test_bad_json_is_an_input_error(text: str | bytes, words: str) -> None:
    with pytest.raises(InputError) as info:
        safeload.loads_json(text, "in.json")
    assert info.value.file == "in.json"
    assert words in info.value.message


def test_json_brackets_inside_strings_do_not_count_as_depth() -> None:
    text = '{"a": "' + "[" * 1000 + '", "b": ["\\"[["]}'
    assert safeload.loads_json(text, "in.json")["b"] == ['"[[']
    assert safeload.json_depth_exceeds("[[[]]]", 2) == 1
    assert safeload.json_depth_exceeds('["\\"", [[1]]]', 3) is None


def test_json_line_given_by_the_caller_is_kept() -> None:
    with pytest.raises(InputError) as info:
        safeload.loads_json("[NaN]", "r.jsonl", line=7)
    assert info.value.line == 7


@pytest.mark.parametrize("text, field, line", [
    ("a: !!python/object/apply:os.system [echo]\n", "a", 1),     # a list: was dropped
    ("a:\n  b: !!map {c: 1}\n", "a.b", 2),                        # a mapping: was dropped
    ("a: [1, !!str 2]\n", "a[1]", 1),                             # even a standard tag
    ("!custom {a: 1}\n", None, 1),                                # the root
])
def test_a_tag_on_any_node_is_refused_naming_its_field(text: str, field: str | None,
                                                       line: int) -> None:
    with pytest.raises(InputError) as caught:
        safeload.load_yaml(text, "f.yaml")
    assert caught.value.field == field and caught.value.line == line
    assert "is not allowed" in caught.value.message
