"""loomrl: one logical RL workflow, planned into temporal, spatial or hybrid execution.

Public names live here; the machinery is in the modules named after each concept.
Importing ``loomrl`` never imports torch: the runtime core and the planner run
without it, and only engines/workers that train models pull it in.
"""

from __future__ import annotations

__version__ = "0.1.0"

_LAZY = {
    "Cluster": ("loomrl.cluster", "Cluster"),
    "Device": ("loomrl.cluster", "Device"),
    "Worker": ("loomrl.worker", "Worker"),
    "WorkerGroup": ("loomrl.worker", "WorkerGroup"),
    "Handle": ("loomrl.worker", "Handle"),
    "wait": ("loomrl.worker", "wait"),
    "dispatch": ("loomrl.worker", "dispatch"),
    "RemoteError": ("loomrl.errors", "RemoteError"),
    "WorkerDiedError": ("loomrl.errors", "WorkerDiedError"),
    "ChannelPeerDied": ("loomrl.errors", "ChannelPeerDied"),
    "ChannelItemLost": ("loomrl.errors", "ChannelItemLost"),
    "ConfigError": ("loomrl.errors", "ConfigError"),
    "Channel": ("loomrl.channel", "Channel"),
    "DeviceLock": ("loomrl.lock", "DeviceLock"),
    "Flow": ("loomrl.flow", "Flow"),
    "WeightSync": ("loomrl.weights", "WeightSync"),
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str):
    # Lazy so that `import loomrl` stays cheap (no Ray, no torch) for the CLI and the planner.
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        value = getattr(importlib.import_module(module), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'loomrl' has no attribute {name!r}")
