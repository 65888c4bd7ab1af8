"""The capture shim: the only part of stepscope that imports torch, and only when a capture starts.

    from stepscope.capture import profile_steps
    with profile_steps("runs/exp1") as prof:
        for batch in loader:
            train_step(batch)
            prof.step()
"""

from stepscope.capture.session import CaptureOptions, ProfileSession, profile_steps

__all__ = ["CaptureOptions", "ProfileSession", "profile_steps"]
