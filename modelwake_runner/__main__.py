"""python -m modelwake_runner: see modelwake_runner/cli.py."""
import sys

from modelwake_runner.cli import main

sys.exit(main())
