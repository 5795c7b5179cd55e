"""Reading stored benchmark results: ``.json`` files and gzipped ``.json.gz`` ones alike (the
GPU calls' JSON under docs/results/gpu/h100 and h200 is kept gzipped: the whole repository
travels to the GPU machine beside its wheels, under a size limit)."""

from __future__ import annotations

import gzip
import json
from typing import Any


def load_json(path: str) -> Any:
    """The JSON document at ``path``, gunzipped first when the name ends in ``.gz``."""
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        return json.load(f)
