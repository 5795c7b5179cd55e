"""The planner: workload profiles in, the fastest temporal / spatial / hybrid plan out.

Run it as ``loomrl plan PROFILE --devices N`` or ``python -m loomrl.plan PROFILE``.
The planner never imports torch or Ray; it needs numpy and pyyaml (matplotlib
only for ``--timeline``).
"""

from __future__ import annotations

from loomrl.plan.cost import Evaluation, evaluate
from loomrl.plan.graph import WorkGraph
from loomrl.plan.plan import Interval, Node, Plan, cycle, layout, leaf, mode_of, spatial, temporal
from loomrl.plan.profile import (
    MAX_DEVICES,
    ComponentProfile,
    CycleSpec,
    FitReport,
    WorkloadProfile,
    fit_component,
    fit_profile,
    load_profile,
)
from loomrl.plan.search import MODES, exhaustive, fixed_plan, plan_for_mode, search, search_all
from loomrl.plan.simulate import SimResult, predicted_timeline, simulate

__all__ = [
    "MAX_DEVICES",
    "MODES",
    "ComponentProfile",
    "CycleSpec",
    "Evaluation",
    "FitReport",
    "Interval",
    "Node",
    "Plan",
    "SimResult",
    "WorkGraph",
    "WorkloadProfile",
    "cycle",
    "evaluate",
    "exhaustive",
    "fit_component",
    "fit_profile",
    "fixed_plan",
    "layout",
    "leaf",
    "load_profile",
    "mode_of",
    "plan_for_mode",
    "predicted_timeline",
    "search",
    "search_all",
    "simulate",
    "spatial",
    "temporal",
]
