"""stepscope: offline trace analysis for PyTorch profiler traces."""

__version__ = "0.1.0"
