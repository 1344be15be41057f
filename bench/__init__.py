"""`make bench`, run from the repository root as `python -m bench.run`: its modules import each other,
the tests' helpers and the tools by name (`from bench import report`, `from tests.helpers import ...`)."""
