"""Where stepscope keeps what it derives on this machine: a leaf module, so that the cache (`cache`) and the
remote-input copies (`remote`) can both name the place without importing each other."""

from __future__ import annotations

import os
from pathlib import Path


def default_cache_dir() -> Path:
    """Where raw traces are ingested on the fly: $XDG_CACHE_HOME/stepscope or ~/.cache/stepscope.

    The cache only saves time; its location never changes a result.
    """
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "stepscope"


#: where URL inputs are mirrored under the cache directory (`remote`), their files counted and evicted with its
#: entries (`cache`)
MIRROR = "remote"

__all__ = ["MIRROR", "default_cache_dir"]
