"""The workflow graph the planner cuts: components, data-flow edges, collapsed cycles.

Sub-graphs are bitmasks over the graph's nodes (bit i = node i, nodes in
topological order). A cut of sub-graph S is a non-empty proper subset A of S
such that every edge between A and S \\ A goes from A to B = S \\ A, i.e. A is
down-closed in S. Chains have exactly the V-1 prefix cuts.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property

from loomrl.errors import PlanError

__all__ = [
    "MAX_CUT_PAIRS",
    "MAX_GRAPH_NODES",
    "GraphNode",
    "GraphTooLarge",
    "WorkGraph",
    "check_search_size",
    "search_size_problem",
    "strongly_connected",
    "undeclared_cycles",
]

# The search keeps a sub-graph as a bitmask of its nodes in numpy's int64: 63 nodes at most.
MAX_GRAPH_NODES = 63
# The exact search tries every cut of every sub-graph it reaches. PLANNER.md: enumerating them is
# exponential, "fine for the <= 12 components of real RL"; 3^12 bounds the (sub-graph, cut) pairs
# of every graph of 12 nodes, edges or none. Past it the search runs for half an hour and more
# (10 components without edges, 59,049 pairs, took 73 s; 13 have 1.6 million, 20 have 3.5
# billion), so a larger graph must be ordered enough by its edges to stay under it (a chain of
# 63 nodes has 41,664).
MAX_CUT_PAIRS = 3**12


def strongly_connected(names: Sequence[str], edges: Iterable[tuple[str, str]]) -> list[set[str]]:
    """Strongly connected components (each a set of names), via reachability closure."""
    idx = {n: i for i, n in enumerate(names)}
    reach = [1 << i for i in range(len(names))]
    for a, b in edges:
        reach[idx[a]] |= 1 << idx[b]
    changed = True
    while changed:  # transitive closure; graphs here have a dozen nodes
        changed = False
        for i in range(len(names)):
            r = reach[i]
            acc = r
            m = r
            while m:
                low = m & -m
                acc |= reach[low.bit_length() - 1]
                m ^= low
            if acc != r:
                reach[i] = acc
                changed = True
    out: list[set[str]] = []
    done = 0
    for i in range(len(names)):
        if done >> i & 1:
            continue
        comp = {j for j in range(len(names)) if reach[i] >> j & 1 and reach[j] >> i & 1}
        for j in comp:
            done |= 1 << j
        out.append({names[j] for j in comp})
    return out


def undeclared_cycles(
    names: Sequence[str], edges: Iterable[tuple[str, str]], cycles
) -> list[set[str]]:
    """Strongly connected components of size > 1 that are not exactly a declared cycle. A
    declared cycle a <-> b counts as edges both ways: a path from it and back (a -> c -> b)
    closes a loop through its collapsed node, which no plan can order."""
    declared = [set(c.members) for c in cycles]
    both = [(a, b) for c in cycles for a, b in (tuple(c.members), tuple(c.members)[::-1])]
    return [
        s for s in strongly_connected(names, [*edges, *both]) if len(s) > 1 and s not in declared
    ]


class GraphTooLarge(PlanError):
    """The workflow graph is past what the exact search can take (``search_size_problem``)."""


def check_search_size(profile) -> None:
    """Raise ``GraphTooLarge`` when the search cannot take ``profile``'s graph."""
    problem = search_size_problem(list(profile.components), profile.edges, profile.cycles)
    if problem is not None:
        raise GraphTooLarge(problem)


def search_size_problem(component_names: Sequence[str], edges, cycles=()) -> str | None:
    """Why the exact search cannot take this workflow graph (None: it can): more than
    ``MAX_GRAPH_NODES`` nodes, or more than ``MAX_CUT_PAIRS`` (sub-graph, cut) pairs to try.
    Graphs of at most 12 nodes always pass, at no cost; a larger one costs at most about a
    second to count (its pairs counted up to the limit)."""
    nodes = len(component_names) - len(cycles)  # a declared 2-cycle is one node
    if nodes > MAX_GRAPH_NODES:
        return (
            f"the workflow graph has {nodes:,} nodes (components, a declared cycle counting as "
            f"one), more than the planner's {MAX_GRAPH_NODES} (its search keeps sub-graphs as "
            "64-bit masks); merge components, or plan parts of the workflow apart"
        )
    if 3**nodes <= MAX_CUT_PAIRS:
        return None
    graph = WorkGraph(component_names, edges, cycles)
    if graph.is_chain or _cut_pairs(graph, MAX_CUT_PAIRS) <= MAX_CUT_PAIRS:
        return None
    n_edges = len(graph.edges)
    return (
        f"the workflow graph's {nodes} nodes and {n_edges} edge(s) between them can be cut in "
        f"more than {MAX_CUT_PAIRS:,} ways (no graph of 12 nodes or fewer has as many), and the "
        "exact search tries every one: it would run for half an hour or far longer; add the "
        "data-flow edges the graph lacks (components that run one after another), or merge "
        "components"
    )


def _cuts_up_to(graph: WorkGraph, s: int, limit: int) -> list[int]:
    """Upstream sides of the cuts of sub-graph ``s`` (its down-closed subsets but the empty one
    and ``s``), at most ``limit + 1`` of them. Depth first over s's nodes in topological order:
    a node may join once every predecessor of it in ``s`` has; no subset that is not
    down-closed is ever made (``WorkGraph.cuts`` tests all 2^|s| of them)."""
    members = graph.members(s)
    pred = [graph.pred[i] & s for i in members]
    out: list[int] = []
    stack = [(0, 0)]
    while stack:
        k, a = stack.pop()
        if k == len(members):
            if a and a != s:
                out.append(a)
                if len(out) > limit:
                    break
            continue
        stack.append((k + 1, a))
        if pred[k] & ~a == 0:
            stack.append((k + 1, a | 1 << members[k]))
    return out


def _cut_pairs(graph: WorkGraph, limit: int) -> int:
    """The (sub-graph, cut) pairs the search tries, counted up to ``limit + 1``: every cut of
    every sub-graph that cuts from the whole graph reach."""
    seen, todo, total = {graph.full}, [graph.full], 0
    while todo:
        s = todo.pop()
        cuts = _cuts_up_to(graph, s, limit - total)
        total += len(cuts)
        if total > limit:
            return total
        for a in cuts:
            for x in (a, s & ~a):
                if x not in seen:
                    seen.add(x)
                    todo.append(x)
    return total


@dataclass(frozen=True)
class GraphNode:
    """A node of the collapsed graph: one component, or one declared 2-cycle."""

    name: str
    members: tuple[str, ...]  # (component,) or (a, b) for a cycle
    steps: int = 1  # cycle steps per iteration

    @property
    def is_cycle(self) -> bool:
        return len(self.members) == 2


class WorkGraph:
    """Collapsed DAG of a profile, with cut enumeration over bitmask sub-graphs."""

    def __init__(self, component_names: Sequence[str], edges, cycles=()):
        clash = sorted({c.name for c in cycles} & set(component_names))
        if clash:  # load_profile refuses such names first; a profile built in code may not
            raise ValueError(
                f"component name(s) {clash} equal a cycle node's name; rename the component(s)"
            )
        in_cycle = {}
        nodes: list[GraphNode] = []
        for c in cycles:
            node = GraphNode(c.name, tuple(c.members), c.steps)
            for m in c.members:
                in_cycle[m] = node
        added = set()
        for name in component_names:
            node = in_cycle.get(name) or GraphNode(name, (name,))
            if node.name not in added:
                added.add(node.name)
                nodes.append(node)
        owner = {m: n.name for n in nodes for m in n.members}
        dag_edges = {(owner[a], owner[b]) for a, b in edges if owner[a] != owner[b]}
        # Topological order (Kahn), stable with respect to declaration order.
        names = [n.name for n in nodes]
        indeg = {n: 0 for n in names}
        for _, b in dag_edges:
            indeg[b] += 1
        order: list[str] = []
        ready = [n for n in names if indeg[n] == 0]
        while ready:
            n = ready.pop(0)
            order.append(n)
            for a, b in sorted(dag_edges, key=lambda e: names.index(e[1])):
                if a == n:
                    indeg[b] -= 1
                    if indeg[b] == 0:
                        ready.append(b)
        if len(order) != len(names):
            raise ValueError("edges contain an undeclared cycle")  # load_profile reports it first
        by_name = {n.name: n for n in nodes}
        self.nodes: tuple[GraphNode, ...] = tuple(by_name[n] for n in order)
        self.index = {n.name: i for i, n in enumerate(self.nodes)}
        self.edges = tuple(sorted((self.index[a], self.index[b]) for a, b in dag_edges))
        self.pred = [0] * len(self.nodes)
        for a, b in self.edges:
            self.pred[b] |= 1 << a
        self.full = (1 << len(self.nodes)) - 1
        self._cuts: dict[int, tuple[int, ...]] = {}

    @classmethod
    def from_profile(cls, profile) -> WorkGraph:
        return cls(list(profile.components), profile.edges, profile.cycles)

    def __len__(self) -> int:
        return len(self.nodes)

    @cached_property
    def is_chain(self) -> bool:
        """True when the edges make one path through all nodes in topological order."""
        v = len(self.nodes)
        return set(self.edges) >= {(i, i + 1) for i in range(v - 1)}

    def members(self, mask: int) -> list[int]:
        return [i for i in range(len(self.nodes)) if mask >> i & 1]

    def is_down_closed(self, a: int, s: int) -> bool:
        """No edge of sub-graph ``s`` enters ``a`` from ``s \\ a``."""
        m = a
        while m:
            low = m & -m
            i = low.bit_length() - 1
            if self.pred[i] & s & ~a:
                return False
            m ^= low
        return True

    def cuts(self, s: int) -> tuple[int, ...]:
        """Upstream sides A of every s-t cut of sub-graph ``s`` (B = s & ~A)."""
        hit = self._cuts.get(s)
        if hit is not None:
            return hit
        out = []
        if self.is_chain:
            # Any sub-graph reached by cutting a chain is an interval; its cuts are prefixes.
            acc = 0
            for i in self.members(s)[:-1]:
                acc |= 1 << i
                out.append(acc)
        else:
            a = (s - 1) & s
            while a:
                if self.is_down_closed(a, s):
                    out.append(a)
                a = (a - 1) & s
            out.sort()
        res = tuple(out)
        self._cuts[s] = res
        return res

    def reachable_subgraphs(self) -> list[int]:
        """Every sub-graph reachable from the full graph by repeated cuts, children first."""
        seen: set[int] = set()
        order: list[int] = []

        def visit(s: int) -> None:
            if s in seen:
                return
            seen.add(s)
            for a in self.cuts(s):
                visit(a)
                visit(s & ~a)
            order.append(s)

        visit(self.full)
        return order
