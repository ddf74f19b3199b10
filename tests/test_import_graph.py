"""No import circles between longmoe's modules (files), anywhere in the package.

import-linter's contracts forbid imports between packages; a circle inside one package (two files
that import each other, even for types only) is what this test catches. The graph is grimp's (the one
import-linter builds), so imports under ``TYPE_CHECKING`` and inside functions count too.
"""

from __future__ import annotations

import grimp


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components with more than one module (iterative: no recursion limit)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            for w in children:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
    return out


def one_cycle(graph: dict[str, set[str]], component: list[str]) -> list[str]:
    """A concrete circle through the component's first module: ``a -> b -> ... -> a``."""
    members, start = set(component), component[0]
    paths = {start: [start]}
    frontier = [start]
    while frontier:  # breadth-first within the component: the shortest way back to start
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & members):
                if w == start:
                    return [*paths[v], start]
                if w not in paths:
                    paths[w] = [*paths[v], w]
                    nxt.append(w)
        frontier = nxt
    return component


def import_graph() -> dict[str, set[str]]:
    g = grimp.build_graph("longmoe", cache_dir=None)
    return {m: set(g.find_modules_directly_imported_by(m)) for m in g.modules}


def test_strongly_connected_finds_circles_and_only_them():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}, "f": set()}
    assert strongly_connected(graph) == [["a", "b", "c"]]
    assert one_cycle(graph, ["a", "b", "c"]) == ["a", "b", "c", "a"]


def test_no_import_circles_between_longmoe_modules():
    graph = import_graph()
    bad = strongly_connected(graph)
    assert not bad, "import circles (break each by moving the shared piece below both):\n" + "\n".join(
        " -> ".join(one_cycle(graph, c)) for c in bad
    )
