"""Secret launch flags: resolved like SGLang's parser, judged by the resolved option.

Regression tests: ``--api-k sk-...`` (an argparse abbreviation) passed both
secret filters, while ``--max-total-tokens`` and ``--tokenizer-path`` were refused as
secrets because their names contain "token".
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuserve.errors import InputError
from gpuserve.launch import secrets
from gpuserve.launch.catalog import available_versions, load_catalog
from gpuserve.launch.profiles import load_profile
from gpuserve.measure.results import launch_hash, strip_secret_args

KEY = "sk-abbrev-0123456789abcdef"
CATALOGS = [load_catalog(v) for v in available_versions()]
IDS = [c.version for c in CATALOGS]


def secret_set(catalog) -> set[str]:
    return {f for o in secrets.secret_options(catalog) for f in o.flags}


@pytest.mark.parametrize("catalog", CATALOGS, ids=IDS)
def test_every_catalog_has_exactly_the_known_secret_options(catalog) -> None:
    # the rule over each catalog finds the options whose help says they carry a secret,
    # and KNOWN_SECRET_FLAGS (the judge without a catalog) covers all of them
    assert secret_set(catalog) == {"--api-key", "--admin-api-key", "--ssl-keyfile-password"}
    assert secret_set(catalog) <= set(secrets.KNOWN_SECRET_FLAGS)
    for option in catalog.options:
        words = (option.help or "").lower()
        if option.takes_value and any(w in words for w in ("password", "api key", "secret")):
            assert secrets.is_secret_option(option), option.flags


@pytest.mark.parametrize("catalog", CATALOGS, ids=IDS)
def test_no_option_of_any_catalog_is_a_false_positive(catalog) -> None:
    # with this catalog, and with the conservative judge that has no catalog at hand
    secret = secret_set(catalog)
    for flag in sorted(catalog.flags):
        want = [flag] if flag in secret else []
        for judge in (catalog, None):
            got = [s.flag for s in secrets.secret_flags([flag, "v"], judge)]
            assert got == want, (flag, judge)
            got = [s.flag for s in secrets.secret_flags([f"{flag}=v"], judge)]
            assert got == want, (flag, judge)


@pytest.mark.parametrize("catalog", CATALOGS, ids=IDS)
def test_every_abbreviation_argparse_accepts_is_judged_like_its_option(catalog) -> None:
    parser = catalog.parser(complete=False)
    for option in secrets.secret_options(catalog):
        for flag in option.flags:
            for end in range(3, len(flag)):
                prefix = flag[:end]
                hits = [f for f in catalog.flags | {"--help"} if f.startswith(prefix)]
                if len(hits) != 1:
                    continue  # argparse refuses an ambiguous prefix
                # argparse itself stores the value under the secret option's dest
                assert getattr(parser.parse_args([prefix, KEY]), option.dest) == KEY
                for judge in (catalog, None):
                    hit = secrets.secret_flags([prefix, KEY], judge)
                    assert [(h.flag, h.given) for h in hit] == [(flag, prefix)], prefix
                if end - 2 >= secrets.MIN_ABBREV:  # the rule alone, for future versions
                    assert secrets._by_rule(prefix) == flag


def test_ambiguous_prefix_naming_a_secret_counts_as_secret() -> None:
    # argparse refuses it, but repeats the whole argument (value included) in its message
    catalog = load_catalog("0.5.23")
    with pytest.raises(ValueError, match="ambiguous"):
        catalog.parse(["--ssl-keyf=" + KEY], complete=False)
    assert [h.flag for h in secrets.secret_flags(["--ssl-keyf=" + KEY], catalog)] == [
        "--ssl-keyfile-password"]


def test_unknown_flag_that_names_a_secret_is_secret_without_a_catalog() -> None:
    hits = secrets.secret_flags(["--hf-token", "x", "--my-password=y", "--apikey", "z",
                                 "--admin-api", "w"])
    assert [h.given for h in hits] == ["--hf-token", "--my-password", "--apikey", "--admin-api"]


def test_split_and_redact_remove_values_in_both_spellings() -> None:
    argv = ["--model-path", "/m", "--api-k", KEY, "--admin-api-ke=" + KEY + "2",
            "--max-total-tokens", "4096", "--tokenizer-path", "/x"]
    kept, values = secrets.split_secret_args(argv, load_catalog("0.5.23"))
    assert kept == ["--model-path", "/m", "--max-total-tokens", "4096", "--tokenizer-path", "/x"]
    assert values == [KEY, KEY + "2"]
    shown = secrets.redact_args(argv, load_catalog("0.5.23"))
    assert KEY not in " ".join(shown)
    assert shown[2:5] == ["--api-k", "<redacted>", "--admin-api-ke=<redacted>"]


def test_launch_hash_ignores_abbreviated_keys_and_keeps_token_settings() -> None:
    base = ["--model-path", "/m", "--max-total-tokens", "4096", "--tokenizer-path", "/x"]
    assert strip_secret_args(base) == base
    assert launch_hash(base + ["--api-k", KEY], {}) == launch_hash(base, {})
    assert launch_hash(base + ["--admin-api-k=" + KEY], {}) == launch_hash(base, {})
    # the token-named settings are part of the launch: changing one changes the hash
    assert launch_hash(base, {}) != launch_hash(base[:3] + ["8192"] + base[4:], {})
    assert launch_hash(base, {}) != launch_hash(base[:5] + ["/y"], {})


def test_long_argument_lists_are_judged_in_linear_time() -> None:
    # 200k distinct unknown flags: a binary search each, no scan of every spelling
    args = [f"--x{i}" for i in range(200_000)]
    assert secrets.secret_flags(args, load_catalog("0.5.23")) == []


# --------------------------------------------------------------- profiles (regressions)


def write(tmp_path: Path, name: str, body: str) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(body)
    return path


@pytest.mark.parametrize("args", [
    f"[--api-k, {KEY}]", f"[--api-ke={KEY}]", f"[--admin-api-k, {KEY}]",
    f"[--ssl-keyfile-pass, {KEY}]", f"[--api-key, {KEY}]",
])
def test_profile_with_a_secret_flag_is_refused_without_printing_it(tmp_path, args) -> None:
    path = write(tmp_path, "p", f"model:\n  path: /m\nextra_args: {args}\n")
    with pytest.raises(InputError) as info:
        load_profile(path)
    exc = info.value
    assert (Path(exc.file).name, exc.line, exc.field) == ("p.yaml", 3, "extra_args[0]")
    assert "secret" in exc.message and "sglang_api_key" in exc.message
    assert KEY not in str(exc)


def test_abbreviation_is_named_with_the_option_it_resolves_to(tmp_path) -> None:
    path = write(tmp_path, "p", f"model:\n  path: /m\nextra_args:\n  - --api-k\n  - {KEY}\n")
    with pytest.raises(InputError) as info:
        load_profile(path)
    assert "--api-k (an abbreviation of --api-key)" in info.value.message
    assert info.value.line == 4


def test_token_named_settings_are_accepted(tmp_path) -> None:
    path = write(tmp_path, "p", "model:\n  path: /m\nsglang_versions: ['0.5.23']\n"
                 "extra_args: [--max-total-tokens, '4096', --tokenizer-path, /x]\n")
    profile = load_profile(path)
    assert profile.extra_args == ["--max-total-tokens", "4096", "--tokenizer-path", "/x"]


@pytest.mark.parametrize("stem", ["bad\nExecStartPre=evil", "-dash", "a b", "x" * 65, "é"])
def test_profile_names_outside_the_safe_pattern_are_refused(tmp_path, stem) -> None:
    path = tmp_path / f"{stem}.yaml"
    path.write_text("model:\n  path: /m\n")
    with pytest.raises(InputError) as info:
        load_profile(path)
    assert info.value.field == "name" and info.value.file == str(path)
    assert "rename the file" in info.value.message


def test_safe_profile_names_load(tmp_path) -> None:
    for stem in ("a", "glm5-nvfp4_tp8.v2", "x" * 64):
        assert load_profile(write(tmp_path, stem, "model:\n  path: /m\n")).name == stem


def test_the_arguments_variable_is_reserved_in_a_profile_env(tmp_path) -> None:
    """The unit passes the server's arguments in GPUSERVE_SGLANG_ARGS: a profile that
    set it would replace them; refused when the profile loads (render, doctor, check)."""
    path = write(tmp_path, "p", "model:\n  path: /m\nenv:\n  GPUSERVE_SGLANG_ARGS: --x\n")
    with pytest.raises(InputError) as info:
        load_profile(path)
    assert info.value.field == "env.GPUSERVE_SGLANG_ARGS" and "reserved" in info.value.message
