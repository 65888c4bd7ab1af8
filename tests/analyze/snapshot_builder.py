"""Small CUDA allocator snapshots built in code, with the structure torch.cuda.memory._dump_snapshot writes."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

USER = "/home/me/project/model.py"
TORCH = "/venv/lib/python3.11/site-packages/torch/nn/modules/module.py"


def frames(*user: tuple[int, str], forward: bool = False) -> list[dict[str, Any]]:
    """A stack: torch internals innermost, then the user's frames (innermost first)."""
    out = [{"filename": TORCH, "line": 1750, "name": "_call_impl"}]
    out += [{"filename": USER, "line": line, "name": name} for line, name in user]
    return out


def entry(action: str, addr: int, size: int, *, t: int, stack: list[dict[str, Any]] | None = None,
          **extra: Any) -> dict[str, Any]:
    e = {"action": action, "addr": addr, "size": size, "stream": 0, "time_us": t, "frames": stack or []}
    e.update(extra)
    return e


def block(address: int, size: int, state: str, stack: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"address": address, "size": size, "requested_size": size, "state": state, "frames": stack or []}


def segment(address: int, blocks: list[dict[str, Any]], device: int = 0) -> dict[str, Any]:
    total = sum(b["size"] for b in blocks)
    allocated = sum(b["size"] for b in blocks if b["state"] == "active_allocated")
    return {"device": device, "address": address, "total_size": total, "allocated_size": allocated,
            "active_size": allocated, "requested_size": allocated, "stream": 0, "segment_type": "large",
            "segment_pool_id": (0, 0), "is_expandable": False, "frames": [], "blocks": blocks}


def write(path: Path, data: Any) -> Path:
    path.write_bytes(pickle.dumps(data))
    return path
