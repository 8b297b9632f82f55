"""`python3 bench/gpu_check ...` (or `python3 -m gpu_check` from bench/): the checks' command line (runner.py)."""

from __future__ import annotations

import sys
from pathlib import Path

# Run as a folder, Python puts the folder itself first on sys.path, where its modules (environment.py, shared.py)
# could shadow installed ones: the folder above takes its place, so they import only as gpu_check.<name>.
sys.path[0] = str(Path(__file__).resolve().parents[1])

from gpu_check.runner import main  # noqa: E402

sys.exit(main())
