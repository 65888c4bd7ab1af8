"""Only the compiled fast path of ingest lives here; everything else is in pyproject.toml.

The extension is optional: where it cannot be compiled (no C compiler), stepscope installs without it and
ingest takes its pure-Python path (same tables, slower)."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("stepscope.analyze._scan", ["stepscope/analyze/_scan.c"], optional=True,
                             extra_compile_args=["-O2"])])
