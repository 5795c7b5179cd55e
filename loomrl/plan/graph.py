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

__all__ = ["GraphNode", "WorkGraph", "strongly_connected", "undeclared_cycles"]


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
    """Strongly connected components of size > 1 that are not exactly a declared cycle."""
    declared = [set(c.members) for c in cycles]
    return [s for s in strongly_connected(names, list(edges)) if len(s) > 1 and s not in declared]


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
