"""Run failures that are the operator's to fix (a setting, a folder): reported as one line, exit code 1."""

from __future__ import annotations


class RunError(RuntimeError):
    """The run cannot go on for a reason its message states in full; no traceback helps (see service.serve)."""
