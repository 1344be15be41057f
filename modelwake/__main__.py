"""python -m modelwake: see modelwake/cli.py."""
import sys

from modelwake.cli import main

sys.exit(main())
