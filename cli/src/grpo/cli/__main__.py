"""`python -m grpo.cli`: the `grpo` command."""

import sys

from grpo.cli.main import main

sys.exit(main())
