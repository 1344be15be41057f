"""The tests, importable from the repository root as the package `tests`.

pytest.ini puts the root on sys.path, so a test file imports what it shares with others by name:
`from tests.helpers import ROOT, free_port`. The helpers' one home is tests/helpers/.
"""
