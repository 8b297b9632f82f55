"""What the README and the Makefile tell a compose user agree with each other: one duration for `make
test-compose`, Compose v1 named as working, and a way to copy a run's results out of its volume (the compose suite
runs those commands for real: tests/compose/test_compose_stack.py)."""

from __future__ import annotations

import re
from pathlib import Path

from tests.support.readme_examples import README, compose_results_commands

MAKEFILE = Path(__file__).resolve().parents[3] / "Makefile"


def test_make_test_compose_takes_one_stated_time() -> None:
    """It was written three ways: 15 minutes (Makefile), 5 (the README's target list) and 4 (its measurement)."""
    readme = README.read_text()
    stated = {
        "Makefile": re.search(r"^# The images through `docker compose up`.*?~(\d+) min", MAKEFILE.read_text(), re.M),
        "README targets": re.search(r"^make test-compose .*?~(\d+) min", readme, re.M),
        "README measurement": re.search(r"(\d+) minutes for the whole test with images cached", readme),
    }
    minutes = {where: int(found.group(1)) for where, found in stated.items() if found}
    assert len(minutes) == 3 and len(set(minutes.values())) == 1, minutes


def test_the_readme_says_how_to_get_results_out_and_that_compose_v1_works() -> None:
    block = compose_results_commands()
    assert "summary.json" in block and "report.md" in block and "*.png" in block
    assert "ps -a -q trainer" in block  # an exited trainer (a finished run) is still found
    compose = README.read_text().split("* **Compose**", 1)[1].split("\n* **Helm**", 1)[0]
    assert "Compose v1 (`docker-compose`" in compose
