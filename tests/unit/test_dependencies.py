"""The runtime dependencies are what the product imports.

pyproject.toml's ``dependencies`` must name every third-party package that gpuserve/
or roles/ imports (a deploy host installs nothing else), and nothing more, except
constraints the tested pyinfra needs, each with a comment saying why. The host scripts
(gpuserve/data/scripts/) are stdlib-only and run on the host, so they are left out.
"""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

#: Distribution name -> the top-level module it installs, where they differ.
IMPORT_NAMES = {"pyyaml": "yaml"}

#: Optional imports: guarded by ImportError with an install hint (``gpuserve[plot]``).
OPTIONAL = {"matplotlib"}


def _third_party_imports(roots: list[Path]) -> set[str]:
    names: set[str] = set()
    for root in roots:
        for path in root.rglob("*.py"):
            if "data/scripts" in path.as_posix():
                continue
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    names.update(a.name.split(".")[0] for a in node.names)
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names.add(node.module.split(".")[0])
    local = {"gpuserve", "roles"}
    return {n for n in names if n not in sys.stdlib_module_names and n not in local}


def _dependency_lines() -> list[str]:
    """The raw lines of the ``dependencies`` array (comments kept)."""
    text = (REPO / "pyproject.toml").read_text()
    block = re.search(r"^dependencies = \[\n(.*?)^\]", text, re.S | re.M)
    assert block, "pyproject.toml: no dependencies array"
    return [line.strip() for line in block.group(1).splitlines() if line.strip()]


def _distribution(requirement: str) -> str:
    return re.split(r"[<>=!~\[; ]", requirement, maxsplit=1)[0].lower()


def test_every_import_of_the_product_is_a_runtime_dependency():
    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    modules = {IMPORT_NAMES.get(_distribution(r), _distribution(r)) for r in declared}
    imported = _third_party_imports([REPO / "gpuserve", REPO / "roles"])
    missing = sorted(imported - modules - OPTIONAL - {"pyinfra_cli"})  # pyinfra's CLI
    assert not missing, f"pyproject.toml dependencies: imported but not declared: {missing}"


def test_every_runtime_dependency_is_imported_or_says_why():
    imported = _third_party_imports([REPO / "gpuserve", REPO / "roles"])
    unexplained = []
    for line in _dependency_lines():
        requirement = line.split("#", 1)[0].strip().strip(",").strip('"')
        name = _distribution(requirement)
        if IMPORT_NAMES.get(name, name) not in imported and "#" not in line:
            unexplained.append(name)
    assert not unexplained, (
        f"pyproject.toml dependencies: not imported by gpuserve/ or roles/ and no comment "
        f"saying which tested constraint they are: {unexplained}")


def test_the_import_scan_sees_third_party_and_skips_the_standard_library(tmp_path):
    (tmp_path / "m.py").write_text("import os\nimport yaml.constructor\nfrom jinja2 import X\n"
                                   "from . import sibling\n")
    assert _third_party_imports([tmp_path]) == {"yaml", "jinja2"}
