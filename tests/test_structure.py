"""The house's structure, drawn from the code's own imports: no circle, no private name taken
from another module, and the dependency directions of docs/architecture.md (common below
everything; the clients' side and the server's side never import each other, DCFL's halves
included)."""

from __future__ import annotations

import ast
from pathlib import Path

from conftest import REPO

PACKAGE = REPO / "driftfl"
CLIENT_SIDE = ("driftfl.client", "driftfl.dcfl.client", "driftfl.dcfl.condense")
SERVER_SIDE = ("driftfl.strategies", "driftfl.server", "driftfl.dcfl.strategy",
               "driftfl.dcfl.selection", "driftfl.dcfl.cka", "driftfl.dcfl.condensed",
               "driftfl.dcfl.shipped")


def module_of(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> list[tuple[str, str]]:
    """(module imported, name taken) for every driftfl import of ``path``, at any depth (a lazy
    import inside a function counts)."""
    module, found = module_of(path), []
    base = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            target = node.module or ""
            if node.level:
                target = ".".join(base[:len(base) - node.level + 1] + ([target] if target else []))
            found += [(target, alias.name) for alias in node.names]
        elif isinstance(node, ast.Import):
            found += [(alias.name, "") for alias in node.names]
    return [(m, n) for m, n in found if m == "driftfl" or m.startswith("driftfl.")]


def graph() -> dict[str, set[str]]:
    modules = {module_of(p): p for p in PACKAGE.rglob("*.py")}
    edges = {}
    for name, path in modules.items():
        targets = set()
        for module, taken in imports(path):
            full = f"{module}.{taken}"
            targets.add(full if full in modules else module)
        edges[name] = {t for t in targets if t in modules and t != name}
    return edges


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, found, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in edges:
        if v not in index:
            visit(v)
    return found


def test_the_imports_draw_no_circle():
    assert circles(graph()) == []


def test_a_circle_is_found():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_module_takes_a_private_name_of_another():
    taken = [f"{module_of(p)} takes {m}.{n}" for p in PACKAGE.rglob("*.py")
             for m, n in imports(p) if n.startswith("_") and not n.startswith("__")]
    assert taken == []


def test_the_dependency_directions_hold():
    """common imports no part above it; the clients' side and the server's side never import
    each other (they agree through common, the wire protocol, and DCFL's settings)."""
    edges = graph()

    def under(module, prefixes):
        return any(module == p or module.startswith(p + ".") for p in prefixes)

    wrong = []
    for module, targets in edges.items():
        if under(module, ("driftfl.common",)):
            wrong += [f"{module} -> {t}" for t in targets if not under(t, ("driftfl.common",))]
        if under(module, CLIENT_SIDE):
            wrong += [f"{module} -> {t}" for t in targets if under(t, SERVER_SIDE)]
        if under(module, SERVER_SIDE):
            wrong += [f"{module} -> {t}" for t in targets if under(t, CLIENT_SIDE)]
    assert wrong == []
