"""Plan trees and the frozen, printable ``Plan`` the planner returns.

A plan is a binary tree over the workflow (``leaf`` / ``temporal`` / ``spatial``
nodes, plus ``cycle`` nodes for collapsed 2-cycles) and one micro-batch size.
Every node owns a contiguous device range ``[start, start + n)``. Build trees
with :func:`leaf`, :func:`temporal`, :func:`spatial`, :func:`cycle` and place
them with :func:`layout`; cost them with ``loomrl.plan.cost.evaluate``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

__all__ = [
    "Interval",
    "Node",
    "Plan",
    "cycle",
    "layout",
    "leaf",
    "mode_of",
    "spatial",
    "temporal",
]

OPS = ("leaf", "temporal", "spatial", "cycle")


@dataclass(frozen=True)
class Node:
    """One node of a plan tree.

    ``n`` devices starting at ``start``. A leaf runs on its first ``used`` devices
    (``used <= n``; None lets ``evaluate`` pick the best valid count). A cycle
    node runs ``members`` either co-located on its first ``used`` devices
    (``split`` None) or split into ``split[0]`` + ``split[1]`` devices with
    ``groups`` batch groups taking turns.
    """

    op: str
    n: int
    start: int = 0
    component: str | None = None
    children: tuple[Node, ...] = ()
    used: int | None = None
    members: tuple[str, ...] = ()
    split: tuple[int, int] | None = None
    groups: int = 1

    def __post_init__(self) -> None:
        if self.op not in OPS:
            raise ValueError(f"Node.op must be one of {OPS}, got {self.op!r}")
        if self.op in ("temporal", "spatial") and len(self.children) != 2:
            raise ValueError(f"a {self.op} node needs exactly 2 children, got {len(self.children)}")

    @property
    def devices(self) -> list[int]:
        """Device indices of this node's range (for a leaf: the ones it runs on)."""
        if self.op == "leaf":
            return list(range(self.start, self.start + (self.used or self.n)))
        return list(range(self.start, self.start + self.n))

    def leaves(self) -> list[Node]:
        if self.op in ("leaf", "cycle"):
            return [self]
        return [x for c in self.children for x in c.leaves()]

    def components(self) -> list[str]:
        out: list[str] = []
        for x in self.leaves():
            out.extend(x.members if x.op == "cycle" else [x.component])  # type: ignore[list-item]
        return out

    def member_devices(self) -> dict[str, list[int]]:
        """For a leaf or cycle node: component -> device indices it runs on."""
        if self.op == "leaf":
            return {self.component: self.devices}  # type: ignore[dict-item]
        if self.op == "cycle":
            if self.split is None:
                devs = list(range(self.start, self.start + (self.used or self.n)))
                return {m: devs for m in self.members}
            a, b = self.split
            return {
                self.members[0]: list(range(self.start, self.start + a)),
                self.members[1]: list(range(self.start + a, self.start + a + b)),
            }
        raise ValueError("member_devices is defined for leaf and cycle nodes")

    def to_dict(self) -> dict[str, Any]:
        # Every node carries PLANNER.md's four keys; "component" is null on temporal and spatial
        # nodes, which place sub-trees, not one component.
        d: dict[str, Any] = {"op": self.op, "component": None, "n": self.n, "devices": self.devices}
        if self.op == "leaf":
            d["component"] = self.component
            d["used"] = self.used
        elif self.op == "cycle":
            # PLANNER.md's tree has only leaf, temporal and spatial nodes: a cycle is written as
            # its members' leaves, side by side when split (spatial), on the same devices when
            # co-located (temporal); the "cycle" key keeps what from_dict needs to rebuild it.
            d["op"] = "temporal" if self.split is None else "spatial"
            d["cycle"] = {
                "name": self.component,
                "members": list(self.members),
                "split": list(self.split) if self.split else None,
                "groups": self.groups,
                "used": self.used,
            }
            d["children"] = [
                {
                    "op": "leaf",
                    "component": m,
                    "n": len(devs),
                    "devices": devs,
                    "used": len(devs),
                    "children": [],
                }
                for m, devs in self.member_devices().items()
            ]
            return d
        d["children"] = [c.to_dict() for c in self.children]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Node:
        devs = d.get("devices") or [0]
        if [int(x) for x in devs] != list(range(int(devs[0]), int(devs[0]) + len(devs))):
            # A node holds one range of devices (start, n): a list with gaps cannot be placed.
            raise ValueError(
                f"node {d.get('component') or d.get('op')!r}: devices {list(devs)} are not one "
                "contiguous range of indices (such as [2, 3, 4])"
            )
        if int(devs[0]) < 0:
            raise ValueError(
                f"node {d.get('component') or d.get('op')!r}: devices {list(devs)} are negative"
            )
        if isinstance(d.get("cycle"), dict):  # a cycle as to_dict writes it: its members' leaves
            c = d["cycle"]
            return cls(
                op="cycle",
                n=int(d.get("n", len(devs))),
                start=int(devs[0]) if devs else 0,
                component=c.get("name"),
                used=c.get("used"),
                members=tuple(c.get("members") or ()),
                split=tuple(c["split"]) if c.get("split") else None,  # type: ignore[arg-type]
                groups=int(c.get("groups", 1)),
            )
        return cls(
            op=d["op"],
            n=int(d.get("n", len(devs))),
            start=int(devs[0]) if devs else 0,
            component=d.get("component"),
            children=tuple(cls.from_dict(c) for c in d.get("children", [])),
            used=d.get("used"),
            members=tuple(d.get("members") or ()),
            split=tuple(d["split"]) if d.get("split") else None,  # type: ignore[arg-type]
            groups=int(d.get("groups", 1)),
        )

    def label(self) -> str:
        r = f"[{self.start}..{self.start + self.n - 1}]" if self.n > 1 else f"[{self.start}]"
        if self.op == "leaf":
            u = self.used or self.n
            idle = f", {self.n - u} idle" if u < self.n else ""
            return f"{self.component}  devices {_rng(self.start, u)} ({u} dev{idle})"
        if self.op == "cycle":
            if self.split is None:
                u = self.used or self.n
                return f"cycle {self.component} co-located on {_rng(self.start, u)}"
            a, b = self.split
            return (
                f"cycle {self.component} split {self.members[0]} {_rng(self.start, a)} | "
                f"{self.members[1]} {_rng(self.start + a, b)}, {self.groups} group(s)"
            )
        return f"{self.op} {r} ({self.n} dev)"

    def pretty(self, indent: int = 0) -> str:
        lines = ["  " * indent + self.label()]
        for c in self.children:
            lines.append(c.pretty(indent + 1))
        return "\n".join(lines)


def _rng(start: int, n: int) -> str:
    if n == 0:
        return "host CPU cores"
    return f"[{start}]" if n == 1 else f"[{start}..{start + n - 1}]"


# ----------------------------------------------------------------------- builders


def leaf(component: str, n: int, used: int | None = None) -> Node:
    """``component`` given ``n`` devices, running on ``used`` of them (None: best valid count)."""
    return Node("leaf", int(n), component=component, used=used)


def temporal(a: Node, b: Node) -> Node:
    """``a`` then ``b`` on the same devices (``a`` upstream)."""
    return Node("temporal", max(a.n, b.n), children=(a, b))


def spatial(a: Node, b: Node, n: int | None = None) -> Node:
    """``a`` and ``b`` concurrently on disjoint devices (``a`` upstream), streaming micro-batches."""
    return Node("spatial", int(n if n is not None else a.n + b.n), children=(a, b))


def cycle(
    a: str,
    b: str,
    n: int,
    split: tuple[int, int] | None = None,
    groups: int = 1,
    used: int | None = None,
) -> Node:
    """The 2-cycle ``a <-> b`` on ``n`` devices: co-located (``split`` None) or split with ``groups`` ring groups."""
    return Node(
        "cycle",
        int(n),
        component=f"{a}<->{b}",
        members=(a, b),
        split=split,
        groups=groups,
        used=used,
    )


def layout(node: Node, start: int = 0, devices_per_node: int | None = None) -> Node:
    """Assign contiguous device ranges top-down.

    Spatial children get disjoint ranges; the downstream child starts on a node
    boundary when ``devices_per_node`` is given and the room allows it.
    """
    if node.op in ("leaf", "cycle"):
        return replace(node, start=start)
    a, b = node.children
    if node.op == "temporal":
        return replace(
            node,
            start=start,
            children=(layout(a, start, devices_per_node), layout(b, start, devices_per_node)),
        )
    off = a.n
    if devices_per_node and off % devices_per_node:
        aligned = -(-off // devices_per_node) * devices_per_node
        if aligned + b.n <= node.n:
            off = aligned
    return replace(
        node,
        start=start,
        children=(layout(a, start, devices_per_node), layout(b, start + off, devices_per_node)),
    )


def mode_of(node: Node) -> str:
    """'temporal', 'spatial' or 'hybrid' from the kinds of nodes the tree uses.

    Co-located cycles count as temporal, split cycles as spatial; a single leaf is temporal.
    """
    kinds = _kinds(node)
    if kinds == 3:
        return "hybrid"
    return "spatial" if kinds == 2 else "temporal"


def _kinds(node: Node) -> int:
    if node.op == "leaf":
        return 0
    if node.op == "cycle":
        return 1 if node.split is None else 2
    own = 1 if node.op == "temporal" else 2
    return own | _kinds(node.children[0]) | _kinds(node.children[1])


# ----------------------------------------------------------------------- the plan


@dataclass(frozen=True)
class Interval:
    """One predicted (or measured) busy interval of a component on a device range."""

    component: str
    devices: tuple[int, int]  # [first, last + 1)
    start: float
    end: float
    micro_batch: int  # -1 for an offload/onload switch
    kind: str = "run"  # "run" | "switch"


@dataclass(frozen=True)
class Plan:
    """The planner's answer: a laid-out tree, micro-batch size and predicted iteration time."""

    tree: Node
    micro_batch: int
    predicted_s: float
    devices: int
    batch: int
    mode: str
    memory_gb: float = 0.0
    modes: dict[str, float | None] = field(default_factory=dict, compare=False)
    search_s: float = field(default=0.0, compare=False)
    timeline: tuple[Interval, ...] = field(default=(), compare=False)
    method: str = field(default="dp", compare=False)

    @property
    def num_micro_batches(self) -> int:
        return self.batch // self.micro_batch

    def assignment(self) -> dict[str, list[int]]:
        """component -> device indices it runs on."""
        out: dict[str, list[int]] = {}
        for x in self.tree.leaves():
            out.update(x.member_devices())
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "predicted_s": self.predicted_s,
            "micro_batch": self.micro_batch,
            "num_micro_batches": self.num_micro_batches,
            "batch": self.batch,
            "devices": self.devices,
            "mode": self.mode,
            "memory_gb": self.memory_gb,
            "tree": self.tree.to_dict(),
            "assignment": self.assignment(),
            "modes": dict(self.modes),
            "search_s": self.search_s,
            "method": self.method,
            "timeline": [
                {
                    "component": i.component,
                    "devices": list(i.devices),
                    "start": i.start,
                    "end": i.end,
                    "micro_batch": i.micro_batch,
                    "kind": i.kind,
                }
                for i in self.timeline
            ],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Plan:
        return cls(
            tree=Node.from_dict(d["tree"]),
            micro_batch=int(d["micro_batch"]),
            predicted_s=float(d["predicted_s"]),
            devices=int(d.get("devices", len(d["tree"].get("devices", [])))),
            batch=int(d.get("batch", d["micro_batch"])),
            mode=d.get("mode", "hybrid"),
            memory_gb=float(d.get("memory_gb", 0.0)),
            modes=dict(d.get("modes", {})),
            search_s=float(d.get("search_s", 0.0)),
            timeline=tuple(
                Interval(
                    i["component"],
                    tuple(i["devices"]),  # type: ignore[arg-type]
                    float(i["start"]),
                    float(i["end"]),
                    int(i["micro_batch"]),
                    i.get("kind", "run"),
                )
                for i in d.get("timeline", [])
            ),
            method=d.get("method", "dp"),
        )

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    def save(self, path: str | Path) -> None:
        """Write JSON (``.json``, in any case) or YAML (anything else)."""
        from loomrl.config import atomic_write_text

        p = Path(path)
        if p.suffix.lower() == ".json":
            text = self.to_json()
        else:
            import yaml

            text = yaml.safe_dump(self.to_dict(), sort_keys=False)
        # Whole or not at all: a plan file cut short (Ctrl-C, a full disk) would not load
        atomic_write_text(p, text)

    def device_problems(self, devices: int) -> list[str]:
        """Why this plan cannot run on a cluster of ``devices`` devices (empty: it can)."""
        problems = []
        if self.devices > devices:
            problems.append(f"the plan uses {self.devices} devices but the cluster has {devices}")
        for c, devs in sorted(self.assignment().items()):
            if devs and max(devs) >= devices:
                problems.append(
                    f"the plan places {c!r} on devices {devs}, but the cluster's devices are "
                    f"0..{devices - 1}"
                )
        return problems

    @classmethod
    def load(cls, path: str | Path) -> Plan:
        """Read a plan file (JSON for ``.json``, else YAML); ``PlanError`` naming the file and
        what is wrong when it is not one."""
        import yaml

        from loomrl.config import DuplicateKeyError, load_json, load_yaml
        from loomrl.errors import PlanError

        p = Path(path)
        fix = "write one with `loomrl plan PROFILE --devices N --save plan.json`"
        try:
            text = p.read_text(encoding="utf-8")
            d = load_json(text) if p.suffix.lower() == ".json" else load_yaml(text)
        except DuplicateKeyError as e:
            raise PlanError(f"plan file {str(p)!r}: {e.message()}") from None
        except (OSError, UnicodeDecodeError, ValueError, yaml.YAMLError) as e:
            from loomrl.plan.profile import parse_error_text

            raise PlanError(
                f"plan file {str(p)!r} cannot be read: {parse_error_text(e)}; {fix}"
            ) from None
        if isinstance(d, dict) and "components" in d and "tree" not in d:
            raise PlanError(
                f"plan file {str(p)!r} is a workload profile, not a plan: plan from it with "
                f"run.profile={p}, or {fix}"
            )
        if not isinstance(d, dict) or "tree" not in d or "micro_batch" not in d:
            raise PlanError(
                f"plan file {str(p)!r} is not a plan (a mapping with 'tree', 'micro_batch' and "
                f"'predicted_s'); {fix}"
            )
        try:
            return cls.from_dict(d)
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:
            what = f"missing key {e}" if isinstance(e, KeyError) else str(e)
            raise PlanError(f"plan file {str(p)!r} is not a valid plan: {what}; {fix}") from None

    def __str__(self) -> str:
        lines = [
            f"plan ({self.mode}) on {self.devices} devices: micro-batch {self.micro_batch} "
            f"({self.num_micro_batches} micro-batches of batch {self.batch}), "
            f"predicted {self.predicted_s:.4f} s/iteration, peak memory {self.memory_gb:.1f} GB/device",
            self.tree.pretty(1),
        ]
        return "\n".join(lines)
