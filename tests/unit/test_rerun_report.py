"""tests/integration/conftest.py prints the failure of a test that passed on its rerun (make test's
`--reruns 1`): a real pytest run, with pytest-rerunfailures, on a test that fails once."""
import os
import shutil
import subprocess
import sys

from tests.helpers import ROOT

SECTION = "failed before passing on a rerun"

FLAKY = '''
import os

def test_fails_once():
    marker = os.path.join(os.path.dirname(__file__), "failed-once")
    if not os.path.exists(marker):
        open(marker, "w").close()
        assert False, "the first attempt's cause: guest did not answer"
'''


def run_with_reruns(directory, test_source):
    """pytest with one rerun on a file of `test_source` beside a copy of the integration conftest."""
    shutil.copy(os.path.join(ROOT, "tests", "integration", "conftest.py"), str(directory / "conftest.py"))
    (directory / "test_it.py").write_text(test_source)
    # Without the plugins these tests do not use, pytest starts in a fraction of the time.
    argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:testinfra", "-p", "no:xdist",
            "--reruns", "1", "-rR", str(directory)]
    proc = subprocess.run(argv, cwd=str(directory), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          universal_newlines=True, timeout=120)
    assert proc.returncode == 0, proc.stdout
    return proc.stdout


def test_a_failure_that_passed_on_its_rerun_is_printed_at_the_end(tmp_path):
    out = run_with_reruns(tmp_path, FLAKY)
    assert "1 passed, 1 rerun" in out
    section = out.split(SECTION, 1)
    assert len(section) == 2, out
    assert "test_it.py::test_fails_once" in section[1]
    assert "the first attempt's cause: guest did not answer" in section[1]


def test_a_run_without_reruns_prints_no_such_section(tmp_path):
    out = run_with_reruns(tmp_path, "def test_fine():\n    pass\n")
    assert "1 passed" in out and SECTION not in out
