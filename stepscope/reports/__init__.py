"""Renderers: each takes an analysis result and writes one format (text table, JSON, CSV, PNG, HTML)."""
