"""The shape rules of docs/architecture.md, checked on the source (ast, nothing imported):

- imports run one way, deploy -> roles -> gpuserve: no gpuserve module imports roles/
  (``gpuserve.roles``, which pyproject.toml maps roles/ to), lab/ or deploy/, and no
  roles/ or deploy/ module imports lab/ or deploy/ (imports inside functions count too);
- roles/ has one import path, ``gpuserve.roles``: nothing imports a top-level ``roles``
  (two names would load every role twice, with two module states);
- no import circle among gpuserve's modules, among roles' modules, nor among the host
  scripts under gpuserve/data/scripts (uploaded side by side, they import each other by
  bare name);
- no function over 80 lines in gpuserve/, roles/ or deploy/;
- no function in gpuserve/ or roles/ over 8 parameters, no ``_private`` name taken from
  another module, no ``__all__`` re-exporting another module's names;
- roles read host data (``host.data``) only in the deploys (roles/deploys/) and the one
  shared reader (roles/base/inventory.py): a role takes what its plan read.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MAX_FUNCTION_LINES = 80
UPWARD = {"roles", "lab", "deploy"}
# roles/ is the package gpuserve.roles (pyproject.toml's package-dir)
MAPPED = {"roles": "gpuserve.roles"}
# every directory of Python the repository has
EVERYWHERE = ("gpuserve", "roles", "deploy", "tests", "bench", "tools", "lab", "inventory")


@functools.cache
def _tree(path: Path) -> ast.Module:
    """``path``'s syntax tree, parsed once for every check that walks it (the checks only
    read the trees; parsing every file again per check was most of this module's CPU)."""
    return ast.parse(path.read_text(), str(path))


def _sources(base: str) -> list[Path]:
    return sorted((REPO / base).rglob("*.py"))


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    parts[0] = MAPPED.get(parts[0], parts[0])
    return ".".join(parts)


def _is_roles(target: str, names: list[str]) -> bool:
    """An import of gpuserve.roles (``import gpuserve.roles.x``, ``from gpuserve import
    roles``)."""
    return (target == "gpuserve.roles" or target.startswith("gpuserve.roles.")
            or (target == "gpuserve" and "roles" in names))


def _imported(tree: ast.AST, module: str, is_package: bool) -> list[tuple[int, str, list[str]]]:
    """(line, module, names) of every import in ``tree``, at any depth, relative ones
    resolved against ``module``."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            target = node.module or ""
            if node.level:
                base = module.split(".")
                if not is_package:
                    base = base[:-1]
                base = base[:len(base) - (node.level - 1)]
                target = ".".join([*base, target] if target else base)
            found.append((node.lineno, target, [a.name for a in node.names]))
    return found


def _graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the modules of the same set it imports (``from pkg import mod`` is an
    edge to ``pkg.mod`` when that is a module, else to ``pkg``)."""
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        tree = _tree(path)
        edges = set()
        for _, target, names in _imported(tree, name, path.name == "__init__.py"):
            subs = [f"{target}.{n}" for n in names if f"{target}.{n}" in modules]
            if subs:
                edges.update(subs)
            elif target in modules:
                edges.add(target)
        edges.discard(name)
        graph[name] = edges
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected component with more than one module (Tarjan), each
    reported as one circle through it."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                components.append(component)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return [_circle(graph, set(c)) for c in components]


def _circle(graph: dict[str, set[str]], members: set[str]) -> list[str]:
    """One import circle inside a strongly connected component: a -> b -> ... -> a."""
    start = min(members)
    path, seen = [start], {start}
    while True:
        nxt = sorted(graph[path[-1]] & members)
        back = [n for n in nxt if n == start]
        if back and len(path) > 1:
            return [*path, start]
        fresh = [n for n in nxt if n not in seen]
        if not fresh:  # closes on an earlier module: report from there
            loop = next(n for n in nxt if n in seen)
            return [*path[path.index(loop):], loop]
        path.append(fresh[0])
        seen.add(fresh[0])


def _package_modules(base: str) -> dict[str, Path]:
    return {_module_name(p): p for p in _sources(base)}


def test_gpuserve_imports_nothing_above_it():
    found = []
    for path in _sources("gpuserve"):
        tree = _tree(path)
        for line, target, names in _imported(tree, _module_name(path),
                                             path.name == "__init__.py"):
            if target.split(".")[0] in UPWARD or _is_roles(target, names):
                found.append(f"{path.relative_to(REPO)}:{line}: imports {target}")
    assert not found, ("gpuserve/ must not import roles/ (gpuserve.roles), lab/ or deploy/:\n"
                       + "\n".join(found))


def test_roles_are_imported_as_gpuserve_roles_only():
    found = []
    for base in EVERYWHERE:
        for path in _sources(base):
            tree = _tree(path)
            for line, target, _ in _imported(tree, _module_name(path),
                                             path.name == "__init__.py"):
                if target.split(".")[0] == "roles":
                    found.append(f"{path.relative_to(REPO)}:{line}: imports {target}")
    assert not found, "import gpuserve.roles, never a top-level roles:\n" + "\n".join(found)


def test_roles_and_deploy_import_no_lab():
    found = []
    for base in ("roles", "deploy"):
        for path in _sources(base):
            tree = _tree(path)
            for line, target, _ in _imported(tree, _module_name(path),
                                             path.name == "__init__.py"):
                if target.split(".")[0] in {"lab", "deploy"}:
                    found.append(f"{path.relative_to(REPO)}:{line}: imports {target}")
    assert not found, "roles/ and deploy/ must not import lab/ or deploy/:\n" + "\n".join(found)


def test_no_import_circle_in_gpuserve():
    cycles = _cycles(_graph(_package_modules("gpuserve")))
    assert not cycles, "import circles in gpuserve/:\n" + "\n".join(
        " -> ".join(c) for c in cycles)


def test_no_import_circle_in_roles():
    cycles = _cycles(_graph(_package_modules("roles")))
    assert not cycles, "import circles in roles/:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_no_import_circle_among_host_scripts():
    scripts = {p.stem: p for p in sorted((REPO / "gpuserve/data/scripts").glob("*.py"))}
    cycles = _cycles(_graph(scripts))
    assert not cycles, "import circles among gpuserve/data/scripts:\n" + "\n".join(
        " -> ".join(c) for c in cycles)


def test_no_function_over_80_lines():
    long = []
    for base in ("gpuserve", "roles", "deploy"):
        for path in _sources(base):
            for node in ast.walk(_tree(path)):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    lines = node.end_lineno - node.lineno + 1
                    if lines > MAX_FUNCTION_LINES:
                        long.append(f"{path.relative_to(REPO)}:{node.lineno}: {node.name} "
                                    f"({lines} lines)")
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines:\n" + "\n".join(long)


def test_the_checks_find_what_they_look_for():
    """The scanners themselves: a circle, a lazy upward import, a relative import."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c", "a"]]
    tree = ast.parse("def f():\n    from roles.x import y\nfrom . import z\n")
    assert _imported(tree, "gpuserve.pkg.mod", False) == [
        (3, "gpuserve.pkg", ["z"]), (2, "roles.x", ["y"])]
    assert _is_roles("gpuserve.roles.checks", []) and _is_roles("gpuserve", ["roles"])
    assert not _is_roles("gpuserve.rolesx", []) and not _is_roles("gpuserve", ["paths"])
    assert _module_name(REPO / "roles/checks/bench.py") == "gpuserve.roles.checks.bench"


def _package_graph(graph: dict[str, set[str]], depth: int) -> dict[str, set[str]]:
    """The module graph folded to packages ``depth`` names deep (``gpuserve.launch``):
    an edge between two packages when any module of one imports any module of the
    other. Top-level modules (``gpuserve.errors``) stay themselves."""
    def package(name: str) -> str:
        return ".".join(name.split(".")[:depth])

    folded: dict[str, set[str]] = {}
    for name, edges in graph.items():
        mine = package(name)
        folded.setdefault(mine, set()).update(package(e) for e in edges)
    for name, edges in folded.items():
        edges.discard(name)
        for edge in edges:
            folded.setdefault(edge, set())
    return folded


def test_no_import_circle_among_gpuserve_packages():
    """The domain packages are layered, not only their files: a package's modules never
    import a package that imports it back (host, launch and measure once formed a ring)."""
    graph = _package_graph(_graph(_package_modules("gpuserve")), 2)
    graph.pop("gpuserve", None)
    for edges in graph.values():
        edges.discard("gpuserve")  # gpuserve/__init__.py is the version string
    cycles = _cycles(graph)
    assert not cycles, "import circles among gpuserve's packages:\n" + "\n".join(
        " -> ".join(c) for c in cycles)


def test_the_package_fold_finds_a_ring_of_packages():
    modules = {"p.a.x": {"p.b.y"}, "p.b.y": {"p.c.z"}, "p.c.z": {"p.a.w"}, "p.a.w": set()}
    assert _cycles(_package_graph(modules, 2)) == [["p.a", "p.b", "p.c", "p.a"]]


# ----------------------------------------------------------------------------- shapes

#: Files exempt from the three checks below (path prefixes): none.
ELSEWHERE: tuple[str, ...] = ()
#: The published import path of the deploys (``from gpuserve.roles.deploys import
#: serve_sglang`` in a pyinfra project's own deploy file, docs/deploys.md): the one
#: module whose ``__all__`` gathers names defined next to it, on purpose.
PUBLIC_ENTRY = ("roles/deploys/__init__.py",)
MAX_PARAMETERS = 8
PRODUCT = ("gpuserve", "roles", "deploy")


def _elsewhere(path: Path) -> bool:
    return str(path.relative_to(REPO)).startswith(ELSEWHERE)


def _parameters(node: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    """Every parameter of a function (``*args`` and ``**kwargs`` count one each), less a
    method's ``self`` or ``cls``."""
    a = node.args
    names = [p.arg for p in (*a.posonlyargs, *a.args, *a.kwonlyargs)]
    names += [f"*{p.arg}" for p in (a.vararg, a.kwarg) if p is not None]
    return names[1:] if names[:1] in (["self"], ["cls"]) else names


def _too_many(tree: ast.AST) -> list[tuple[int, str, int]]:
    return [(n.lineno, n.name, len(_parameters(n))) for n in ast.walk(tree)
            if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
            and len(_parameters(n)) > MAX_PARAMETERS]


def test_no_function_takes_more_than_8_parameters():
    """More than 8 parameters are the fields of a value passed one by one: group them in
    a dataclass (gpuserve.memory.planner.PlanRequest, MemorySettings, measure's Served)."""
    found = []
    for base in ("gpuserve", "roles"):
        for path in _sources(base):
            if _elsewhere(path):
                continue
            for line, name, count in _too_many(_tree(path)):
                found.append(f"{path.relative_to(REPO)}:{line}: {name} ({count} parameters)")
    assert not found, (f"functions over {MAX_PARAMETERS} parameters (group them in a "
                       "dataclass):\n" + "\n".join(found))


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _private_imports(tree: ast.AST, module: str, is_package: bool,
                     modules: set[str]) -> list[tuple[int, str]]:
    """(line, what) for each private name this module takes from another of ``modules``:
    ``from m import _x``, and ``m._x`` on a module it imported (``import a.m as m``,
    ``from a import m``)."""
    found, aliases = [], {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            aliases.update({a.asname: a.name for a in node.names
                            if a.name in modules and a.asname})
        elif isinstance(node, ast.ImportFrom):
            target = _imported(ast.Module([node], []), module, is_package)[0][1]
            for alias in node.names:
                if f"{target}.{alias.name}" in modules:
                    aliases[alias.asname or alias.name] = f"{target}.{alias.name}"
                elif target in modules and target != module and _is_private(alias.name):
                    found.append((node.lineno, f"{target}.{alias.name}"))
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id in aliases and _is_private(node.attr)
                and aliases[node.value.id] != module):
            found.append((node.lineno, f"{aliases[node.value.id]}.{node.attr}"))
    return sorted(set(found))


def _product_modules() -> dict[str, Path]:
    return {n: p for base in PRODUCT for n, p in _package_modules(base).items()}


def test_no_private_name_is_imported_across_modules():
    """A ``_name`` is its module's own: another module that needs it needs a public name
    (and the tests that need it import it from its module, as they may)."""
    modules = _product_modules()
    owners = {p: n for n, p in modules.items()}
    found = []
    for path, name in owners.items():
        if _elsewhere(path):
            continue
        tree = _tree(path)
        for line, what in _private_imports(tree, name, path.name == "__init__.py",
                                           set(modules)):
            provider = modules.get(what.rsplit(".", 1)[0])
            if provider is not None and _elsewhere(provider):
                continue
            found.append(f"{path.relative_to(REPO)}:{line}: {what}")
    assert not found, "private names imported from another module:\n" + "\n".join(found)


def _reexports(tree: ast.AST, module: str, is_package: bool,
               modules: set[str]) -> list[tuple[str, str]]:
    """(name, its module) for each name in ``__all__`` that this module only imports from
    another of ``modules``: a facade's re-export."""
    listed: list[str] = []
    for node in tree.body:
        if isinstance(node, ast.Assign | ast.AnnAssign) and any(
                isinstance(t, ast.Name) and t.id == "__all__"
                for t in (node.targets if isinstance(node, ast.Assign) else [node.target])):
            listed = [e.value for e in node.value.elts if isinstance(e, ast.Constant)]
    imported = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom):
            target = _imported(ast.Module([node], []), module, is_package)[0][1]
            if target in modules:
                imported.update({a.asname or a.name: target for a in node.names})
    return [(name, imported[name]) for name in listed if name in imported]


def test_no_module_re_exports_another_modules_names():
    """``__all__`` lists what a module defines: a name listed there but imported from
    another module of the product is a second home for it (two ``UNIT_NAME``s); its
    users import it from where it is defined."""
    modules = _product_modules()
    found = []
    for name, path in modules.items():
        if _elsewhere(path) or str(path.relative_to(REPO)) in PUBLIC_ENTRY:
            continue
        tree = _tree(path)
        for what, source in _reexports(tree, name, path.name == "__init__.py", set(modules)):
            found.append(f"{path.relative_to(REPO)}: {what} (defined in {source})")
    assert not found, "re-exported names (import them from their module):\n" + "\n".join(found)


def test_the_shape_checks_find_what_they_look_for():
    """The three scanners above on small sources: too many parameters (a method's self
    not counted), a private import in both spellings, a re-export in ``__all__``."""
    tree = ast.parse("def f(a, b, c, d, e, f, g, h, *i): pass\n"
                     "class C:\n    def m(self, a, b, c, d, e, f, g, h): pass\n"
                     "def g(a, b, c, d, e, f, g, h, i): pass\n")
    assert _too_many(tree) == [(1, "f", 9), (4, "g", 9)]
    modules = {"p.a", "p.b"}
    tree = ast.parse("from p.b import _x, y\nimport p.b as b\nfrom p import b as c\n"
                     "b._z\nc._w\nb.__doc__\n")
    assert _private_imports(tree, "p.a", False, modules) == [
        (1, "p.b._x"), (4, "p.b._z"), (5, "p.b._w")]
    tree = ast.parse("from p.b import x, y\ndef z(): pass\n__all__ = ['x', 'z']\n")
    assert _reexports(tree, "p.a", False, modules) == [("x", "p.b")]


#: where roles/ may read ``host.data``: the deploys, which plan, and the shared reader
HOST_DATA_READERS = ("roles/deploys/", "roles/base/inventory.py")


def _host_data_reads(tree: ast.AST) -> list[int]:
    """Lines of every ``host.data`` in ``tree``."""
    return [node.lineno for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and node.attr == "data"
            and isinstance(node.value, ast.Name) and node.value.id == "host"]


def test_roles_read_host_data_only_where_they_plan():
    """A role below the deploys takes what the deploy's plan read (the plan's secrets,
    trusted mirrors, keyring digest, interpreter wish), never ``host.data`` again: one
    reading, validated once, before any change."""
    found = [f"{path.relative_to(REPO)}:{line}"
             for path in _sources("roles")
             if not str(path.relative_to(REPO)).startswith(HOST_DATA_READERS)
             for line in _host_data_reads(_tree(path))]
    assert not found, "host.data read below the deploys:\n" + "\n".join(found)
    # the scanner finds both spellings it must
    assert _host_data_reads(ast.parse("x = host.data.get('a')\ny = host.data.dict()")) == [1, 2]
