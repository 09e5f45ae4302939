"""The import graph of delayjobs keeps the layers written in docs/explanation/architecture.md.

The layers table and the extra rules are parsed from that page (between the markers
``<!-- layers:start -->`` / ``<!-- import-rules:start -->``), so the documented layering is
literally what is enforced. Every ``delayjobs/**/*.py`` but migrations is read with ``ast``:
imports at module level, inside functions and under ``if TYPE_CHECKING:`` all count. No
Django, no database, no Redis: the graph functions take a package directory, so the tests at
the bottom check the checker on small packages written to a temporary directory.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "delayjobs"
ARCHITECTURE = REPO / "docs" / "explanation" / "architecture.md"
#: The limit of issue 17 ("no module over ~400 lines").
MAX_LINES = 400
#: Modules allowed over MAX_LINES, each with its reason. Keep it empty if you can.
OVERSIZE_ALLOWED: dict[str, str] = {}
#: How a compatibility shim's docstring starts (the shims are found by it, not listed).
SHIM_MARK = "Compatibility path:"
SKIPPED_DIRS = {"migrations", "__pycache__"}


@dataclass(frozen=True)
class Module:
    name: str
    path: Path
    tree: ast.Module
    lines: int
    is_package: bool

    @property
    def is_shim(self) -> bool:
        return (ast.get_docstring(self.tree) or "").startswith(SHIM_MARK)

    @property
    def package(self) -> str:
        """The package that relative imports start from."""
        return self.name if self.is_package else self.name.rpartition(".")[0]


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    where: str  # "delayjobs/x.py:12", what every failure names
    kind: str  # "module", "function" or "typing" (under `if TYPE_CHECKING:`)
    names: tuple[str, ...]  # the names of a `from … import …`; empty for `import …`

    def __str__(self) -> str:
        what = f" ({', '.join(self.names)})" if self.names else ""
        return f"{self.where} [{self.kind}] {self.source} -> {self.target}{what}"


@dataclass(frozen=True)
class Layer:
    number: int
    name: str
    patterns: tuple[str, ...]
    may_import: frozenset[int]
    shims: bool  # the compat row: its modules are the shims, found by their docstring


@dataclass(frozen=True)
class Rule:
    kind: str  # "only" or "never"
    sources: tuple[str, ...]
    targets: tuple[str, ...]
    exceptions: tuple[str, ...] = ()


@dataclass
class Graph:
    modules: dict[str, Module]
    edges: list[Edge] = field(default_factory=list)
    private_uses: list[str] = field(default_factory=list)


# Reading the package -------------------------------------------------------------------


def read_package(root: Path) -> dict[str, Module]:
    """Every module under ``root`` (a package directory), by dotted name."""
    modules = {}
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root.parent)
        if SKIPPED_DIRS & set(relative.parts):
            continue
        parts = list(relative.with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        name = ".".join(parts[:-1] if is_package else parts)
        text = path.read_text(encoding="utf-8")
        tree = ast.parse(text, filename=str(path))
        where = relative.as_posix()
        modules[name] = Module(name, Path(where), tree, len(text.splitlines()), is_package)
    return modules


def _parents(tree: ast.AST) -> dict[ast.AST, ast.AST]:
    return {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _kind(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> str:
    kind, child, parent = "module", node, parents.get(node)
    while parent is not None:
        if isinstance(parent, ast.If) and _is_type_checking(parent.test) and child in parent.body:
            return "typing"  # a type-only import is still an edge: types keep the layers too
        if isinstance(parent, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            kind = "function"
        child, parent = parent, parents.get(parent)
    return kind


def _base(module: Module, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    package = module.package.split(".")
    package = package[: len(package) - (node.level - 1)]
    return ".".join([*package, node.module] if node.module else package)


def _targets(
    module: Module, node: ast.Import | ast.ImportFrom, known: set[str]
) -> Iterator[tuple[str, tuple[str, ...]]]:
    """(target module, names imported from it) for each module this import statement reads."""
    if isinstance(node, ast.Import):
        for alias in node.names:
            yield alias.name, ()
        return
    base = _base(module, node)
    plain: list[str] = []
    for alias in node.names:
        if f"{base}.{alias.name}" in known:
            yield f"{base}.{alias.name}", ()  # `from pkg import submodule`
        else:
            plain.append(alias.name)
    if plain:
        yield base, tuple(plain)


def _module_aliases(module: Module, known: set[str]) -> dict[str, str]:
    """Local names bound to package modules: `from delayjobs import api`, `import x.y as z`."""
    aliases = {}
    for node in ast.walk(module.tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in known:
                    aliases[alias.asname or alias.name] = alias.name
        elif isinstance(node, ast.ImportFrom):
            base = _base(module, node)
            for alias in node.names:
                if f"{base}.{alias.name}" in known:
                    aliases[alias.asname or alias.name] = f"{base}.{alias.name}"
    return aliases


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _private_attributes(module: Module, known: set[str]) -> Iterator[str]:
    """`api._check_queue`: a private name of another module, reached as an attribute."""
    aliases = _module_aliases(module, known)
    for node in ast.walk(module.tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and _private(node.attr)
        ):
            target = aliases.get(node.value.id)
            if target and target != module.name:
                yield f"{module.path}:{node.lineno} uses {target}.{node.attr}"


def build_graph(root: Path) -> Graph:
    graph = Graph(read_package(root))
    top, known = root.name, set(graph.modules)
    for module in graph.modules.values():
        parents = _parents(module.tree)
        for node in ast.walk(module.tree):
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            kind, where = _kind(node, parents), f"{module.path}:{node.lineno}"
            for target, names in _targets(module, node, known):
                if target.split(".")[0] != top or target == module.name:
                    continue
                graph.edges.append(Edge(module.name, target, where, kind, names))
                graph.private_uses += [
                    f"{where} imports {target}.{n}" for n in names if _private(n)
                ]
        graph.private_uses += _private_attributes(module, known)
    return graph


# Reading the layers from the docs -------------------------------------------------------


def _block(text: str, name: str) -> list[str]:
    match = re.search(rf"<!-- {name}:start -->\n(.*?)<!-- {name}:end -->", text, re.S)
    assert match, f"the markers <!-- {name}:start/end --> are missing from {ARCHITECTURE}"
    return [line.strip() for line in match.group(1).splitlines() if line.strip()]


def _patterns(text: str, top: str) -> tuple[str, ...]:
    tokens = re.findall(r"`([^`]+)`", text)
    return tuple(t for t in tokens if re.fullmatch(rf"{top}(\.\w+)*(\.\*)?", t))


def parse_layers(text: str, top: str = "delayjobs") -> list[Layer]:
    """The rows of the markdown table between the layers markers."""
    layers = []
    for line in _block(text, "layers")[2:]:  # past the header and the --- row
        number, name, modules, may = (cell.strip() for cell in line.strip("|").split("|"))
        ranges = re.findall(r"(\d+)(?:\s*-\s*(\d+))?", may)
        allowed = {n for a, b in ranges for n in range(int(a), int(b or a) + 1)}
        shims = SHIM_MARK in modules
        layers.append(Layer(int(number), name, _patterns(modules, top), frozenset(allowed), shims))
    return layers


def parse_rules(text: str, top: str = "delayjobs") -> list[Rule]:
    """`S` imports only `A`, `B` / `S` never imports `A`, except `B`: one rule a bullet."""
    rules = []
    for line in _block(text, "import-rules"):
        kind, sep = (
            ("only", " imports only ") if " imports only " in line else ("never", " never imports ")
        )
        assert sep in line, f"an import rule neither 'imports only' nor 'never imports': {line}"
        sources, rest = line.split(sep, 1)
        targets, *exceptions = re.split(r"\s+except\s+", rest, maxsplit=1)
        rules.append(
            Rule(
                kind,
                _patterns(sources, top),
                _patterns(targets, top),
                _patterns(" ".join(exceptions), top),
            )
        )
    return rules


def matches(pattern: str, module: str) -> bool:
    if pattern.endswith(".*"):
        return module == pattern[:-2] or module.startswith(pattern[:-1])
    return module == pattern


def _specificity(pattern: str) -> tuple[int, int]:
    return (pattern.count("."), 0 if pattern.endswith(".*") else 1)


def layer_of(module: Module, layers: list[Layer]) -> Layer | None:
    if module.is_shim:
        return next((layer for layer in layers if layer.shims), None)
    found = [
        (_specificity(p), layer.number)
        for layer in layers
        for p in layer.patterns
        if matches(p, module.name)
    ]
    return (
        next((layer for layer in layers if layer.number == max(found)[1]), None) if found else None
    )


# The checks: each returns readable failures, one a line ---------------------------------


def natural(text: str) -> list[str | int]:
    """A sort key that puts file.py:9 before file.py:10."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text)]


NO_ROW = "is in no row of the Layers table: add it to docs/explanation/architecture.md"


def unlisted(graph: Graph, layers: list[Layer]) -> list[str]:
    return [
        f"{m.path}: {m.name} {NO_ROW}"
        for m in graph.modules.values()
        if layer_of(m, layers) is None
    ]


def cycles(graph: Graph) -> list[str]:
    """Tarjan's strongly connected components; every one with more than one module fails."""
    successors: dict[str, set[str]] = {name: set() for name in graph.modules}
    for edge in graph.edges:
        if edge.target in successors:
            successors[edge.source].add(edge.target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(successors[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while (member := stack.pop()) != node:
                component.append(member)
            found.append(sorted([*component, node]))

    for name in sorted(successors):
        if name not in index:
            visit(name)
    failures = []
    for component in sorted(c for c in found if len(c) > 1):
        inside = sorted(
            (e for e in graph.edges if {e.source, e.target} <= set(component)),
            key=lambda e: natural(str(e)),
        )
        failures.append(
            f"cycle {{{', '.join(component)}}}:\n" + "\n".join(f"    {e}" for e in inside)
        )
    return failures


def upward(graph: Graph, layers: list[Layer]) -> list[str]:
    failures = []
    for edge in graph.edges:
        target = graph.modules.get(edge.target)
        if target is None:
            failures.append(f"{edge}: no such module")
            continue
        if target.is_shim:
            continue  # shim_imports() says it, and where the code lives now
        s, t = layer_of(graph.modules[edge.source], layers), layer_of(target, layers)
        if s and t and t.number not in s.may_import:
            failures.append(
                f"{edge}: layer {s.number} ({s.name}) imports layer {t.number} ({t.name})"
            )
    return failures


def broken_rules(graph: Graph, rules: list[Rule]) -> list[str]:
    failures = []
    for number, rule in enumerate(rules, 1):
        for edge in graph.edges:
            if not any(matches(p, edge.source) for p in rule.sources):
                continue
            listed = any(matches(p, edge.target) for p in rule.targets)
            excepted = any(matches(p, edge.target) for p in rule.exceptions)
            if (rule.kind == "only" and not listed) or (
                rule.kind == "never" and listed and not excepted
            ):
                wording = "imports only" if rule.kind == "only" else "never imports"
                failures.append(
                    f"{edge}: breaks import rule {number} ({rule.sources[0]} {wording} …)"
                )
    return failures


def package_inits(graph: Graph) -> list[str]:
    """A package's `__init__` re-exports its own submodules, or imports nothing."""
    return [
        f"{edge}: a package __init__ imports only its own submodules"
        for edge in graph.edges
        if graph.modules[edge.source].is_package and not edge.target.startswith(edge.source + ".")
    ]


def shim_imports(graph: Graph) -> list[str]:
    failures = []
    for edge in graph.edges:
        target = graph.modules.get(edge.target)
        if target and target.is_shim:
            home = (
                (ast.get_docstring(target.tree) or "")
                .splitlines()[0]
                .removeprefix(SHIM_MARK)
                .strip()
            )
            failures.append(f"{edge}: imports a compatibility shim ({home})")
    return failures


def oversized(graph: Graph) -> list[str]:
    return [
        f"{m.path}: {m.lines} lines (the limit is {MAX_LINES})"
        for m in graph.modules.values()
        if m.lines > MAX_LINES and m.name not in OVERSIZE_ALLOWED
    ]


# The package as it is -------------------------------------------------------------------


@cache
def _real() -> tuple[Graph, list[Layer], list[Rule]]:
    text = ARCHITECTURE.read_text(encoding="utf-8")
    return build_graph(PACKAGE), parse_layers(text), parse_rules(text)


def _assert_none(failures: list[str], what: str) -> None:
    assert not failures, f"{len(failures)} {what}:\n" + "\n".join(sorted(failures, key=natural))


def test_the_layers_table_parses() -> None:
    _, layers, rules = _real()
    assert [layer.number for layer in layers] == list(range(10)), "the Layers table lost a row"
    assert sum(layer.shims for layer in layers) == 1, (
        "exactly one row holds the compatibility shims"
    )
    assert all(layer.patterns for layer in layers if not layer.shims)
    assert all(layer.may_import for layer in layers)
    patterns = [pattern for layer in layers for pattern in layer.patterns]
    assert len(patterns) == len(set(patterns)), "a module pattern is in two rows"
    assert len(rules) >= 5 and all(rule.sources and rule.targets for rule in rules)


def test_every_module_is_in_a_layer() -> None:
    graph, layers, _ = _real()
    _assert_none(unlisted(graph, layers), "modules in no layer")


def test_no_import_cycles() -> None:
    _assert_none(cycles(_real()[0]), "import cycles")


def test_imports_keep_the_layers() -> None:
    graph, layers, _ = _real()
    _assert_none(upward(graph, layers), "imports against the layers")


def test_imports_keep_the_rules() -> None:
    graph, _, rules = _real()
    _assert_none(broken_rules(graph, rules) + package_inits(graph), "imports against the rules")


def test_nothing_imports_a_compatibility_shim() -> None:
    _assert_none(shim_imports(_real()[0]), "imports of compatibility shims")


def test_no_private_name_is_used_across_modules() -> None:
    _assert_none(_real()[0].private_uses, "private names used across modules")


def test_no_module_is_too_long() -> None:
    _assert_none(oversized(_real()[0]), f"modules over {MAX_LINES} lines")


# The checker on packages of its own ------------------------------------------------------

FAKE_DOC = """
<!-- layers:start -->
| layer | name | modules | may import |
| ---: | --- | --- | --- |
| 0 | base | `fake.low`, `fake.util.*` | 0 |
| 1 | top | `fake.high`, `fake.other`, `fake` | 0-1 |
| 2 | compat | modules whose docstring starts with "Compatibility path:" | 0-1 |
<!-- layers:end -->
<!-- import-rules:start -->
- `fake.high` never imports `fake.util.*`, except `fake.util.helpers`.
- `fake.other` imports only `fake.high` and `fake.low`.
<!-- import-rules:end -->
"""

SHIM = '"""Compatibility path: the code lives in fake.high."""\n'
CLEAN = {
    "__init__.py": '"""The facade."""\n',
    "low.py": "X = 1\n",
    "util/__init__.py": "from fake.util import helpers\n",
    "util/helpers.py": "from ..low import X\n\ndef twice() -> int:\n    return 2 * X\n",
    "util/extra.py": "",
    "high.py": "from typing import TYPE_CHECKING\nfrom fake.util.helpers import twice\n"
    "if TYPE_CHECKING:\n    from fake.low import X\n",
    "other.py": "def late() -> None:\n    from fake import high\n",
    "old.py": SHIM + "from fake.high import twice\n",
}

MESSY = {
    **CLEAN,
    # upward, and a cycle low -> high -> other -> low
    "low.py": "X = 1\n\ndef f() -> None:\n    from fake.high import twice\n",
    "high.py": "from fake.util import extra\nfrom fake.other import twice\n" + "\n" * MAX_LINES,
    "other.py": "from fake.old import twice\nfrom fake.low import _hidden\nfrom fake import low\n"
    "low._y\n",
    "stray.py": "",
}
CHECKS = ["unlisted", "cycles", "upward", "rules", "shims", "private", "size"]


def _verdicts(tmp_path: Path, files: dict[str, str]) -> dict[str, list[str]]:
    root = tmp_path / "fake"
    for name, body in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(body)
    graph = build_graph(root)
    layers, rules = parse_layers(FAKE_DOC, "fake"), parse_rules(FAKE_DOC, "fake")
    found = [
        unlisted(graph, layers),
        cycles(graph),
        upward(graph, layers),
        broken_rules(graph, rules) + package_inits(graph),
        shim_imports(graph),
        graph.private_uses,
        oversized(graph),
    ]
    return dict(zip(CHECKS, found, strict=True))


def test_a_clean_package_passes(tmp_path: Path) -> None:
    assert _verdicts(tmp_path, CLEAN) == {check: [] for check in CHECKS}


def test_a_messy_package_fails_on_each_rule(tmp_path: Path) -> None:
    found = _verdicts(tmp_path, MESSY)
    assert found["unlisted"] == [f"fake/stray.py: fake.stray {NO_ROW}"]
    assert found["cycles"] == [
        "cycle {fake.high, fake.low, fake.old, fake.other}:\n"
        "    fake/high.py:2 [module] fake.high -> fake.other (twice)\n"
        "    fake/low.py:4 [function] fake.low -> fake.high (twice)\n"
        "    fake/old.py:2 [module] fake.old -> fake.high (twice)\n"
        "    fake/other.py:1 [module] fake.other -> fake.old (twice)\n"
        "    fake/other.py:2 [module] fake.other -> fake.low (_hidden)\n"
        "    fake/other.py:3 [module] fake.other -> fake.low"
    ]
    low_to_high = "fake/low.py:4 [function] fake.low -> fake.high (twice)"
    assert found["upward"] == [f"{low_to_high}: layer 0 (base) imports layer 1 (top)"]
    assert found["rules"] == [
        "fake/high.py:1 [module] fake.high -> fake.util.extra: "
        "breaks import rule 1 (fake.high never imports …)",
        "fake/other.py:1 [module] fake.other -> fake.old (twice): "
        "breaks import rule 2 (fake.other imports only …)",
    ]
    assert found["shims"] == [
        "fake/other.py:1 [module] fake.other -> fake.old (twice): "
        "imports a compatibility shim (the code lives in fake.high.)"
    ]
    assert found["private"] == [
        "fake/other.py:2 imports fake.low._hidden",
        "fake/other.py:4 uses fake.low._y",
    ]
    lines = len(MESSY["high.py"].splitlines())
    assert found["size"] == [f"fake/high.py: {lines} lines (the limit is {MAX_LINES})"]


@pytest.mark.parametrize(
    ("pattern", "module", "expected"),
    [
        ("a.b.*", "a.b", True),
        ("a.b.*", "a.b.c.d", True),
        ("a.b.*", "a.bc", False),
        ("a.b", "a.b.c", False),
    ],
)
def test_patterns(pattern: str, module: str, expected: bool) -> None:
    assert matches(pattern, module) is expected
