"""The capture shim: the only part of stepscope that imports torch, and only when a capture starts.

    from stepscope.capture import profile_steps

    with profile_steps("runs/exp1", baseline=5, wait=1, warmup=2, active=3) as prof:
        for batch in loader:
            train_step(batch)
            prof.step()

Importing this package does not import torch (a test checks it).
"""

from stepscope.capture.options import CaptureOptions
from stepscope.capture.session import ProfileSession, profile_steps

__all__ = ["CaptureOptions", "ProfileSession", "profile_steps"]
