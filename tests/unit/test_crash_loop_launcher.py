"""The launcher as the unit runs it (`python -m modelwake launch`, installed as the role installs it),
started again and again like Restart= would, each time with an engine that dies at start with the
error a file names: the third start with the same error exits 7 and says the loop, another error
starts the count again, and the textfile counts every failed start."""
import os
import subprocess
import sys

import pytest

from ansible_collections.modelwake.serving.plugins.module_utils.host import failed_starts
from ansible_collections.modelwake.serving.plugins.module_utils.launcher.exit_codes import EXIT_CRASH_LOOP, EXIT_FAILED

from tests.helpers import launcher_package
from tests.helpers.network import free_port as closed_port

UNIT = "crashloop-test.service"
# An engine that prints a traceback ending in the error of its file and exits 1, as a crashing one does.
ENGINE = ("import sys; error = open(sys.argv[1]).read().strip(); "
          "print('Traceback (most recent call last):'); print('  File \"/opt/x/worker.py\", line 46, in load'); "
          "print(error, flush=True); sys.exit(1)")
OOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate %s GiB. GPU 0 has a total capacity of 95.59 GiB"
CUDA = "RuntimeError: CUDA error: an illegal memory access was encountered"


@pytest.fixture(scope="module")
def pythonpath(tmp_path_factory):
    return launcher_package.install(str(tmp_path_factory.mktemp("launcher")))


class Unit(object):
    def __init__(self, tmp_path, pythonpath):
        self.state = tmp_path / "state"
        self.state.mkdir()
        self.error = tmp_path / "error"
        self.textfile = tmp_path / "modelwake.prom"
        self.pythonpath = pythonpath

    def start(self, error):
        """One start, as systemd's Restart= makes it: (exit status, the launcher's log)."""
        self.error.write_text(error)
        argv = [sys.executable, "-m", "modelwake", "launch", "--url", "http://127.0.0.1:%d" % closed_port(),
                "--poll-interval", "0.2", "--stall-timeout", "10", "--name", UNIT, "--textfile", str(self.textfile),
                "--state-dir", str(self.state), "--crash-loop-starts", "3",
                "--", sys.executable, "-c", ENGINE, str(self.error)]
        environ = dict(os.environ, PYTHONPATH=self.pythonpath)
        environ.pop("NOTIFY_SOCKET", None)
        proc = subprocess.run(argv, env=environ, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              universal_newlines=True, timeout=60)
        return proc.returncode, proc.stderr

    def metric(self, name):
        for line in self.textfile.read_text().splitlines():
            if line.startswith('%s{name="%s"} ' % (name, UNIT)):
                return float(line.split()[-1])
        return None


def test_the_same_error_three_times_stops_the_loop_and_another_error_starts_the_count_again(tmp_path, pythonpath):
    unit = Unit(tmp_path, pythonpath)
    assert unit.start(OOM % "2.31")[0] == EXIT_FAILED
    code, log = unit.start(OOM % "1.50")
    assert code == EXIT_FAILED and "failed start 2 of 3 in a row" in log, log
    assert unit.metric("modelwake_failed_starts_total") == 2 and unit.metric("modelwake_crash_loop") == 0
    # Another error: the count starts again at 1; two more of it, and the loop is stopped.
    code, log = unit.start(CUDA)
    assert code == EXIT_FAILED and "failed start 1 of 3 in a row" in log, log
    assert unit.start(CUDA)[0] == EXIT_FAILED
    code, log = unit.start(CUDA)
    assert code == EXIT_CRASH_LOOP, log
    said = [line for line in log.splitlines() if line.startswith("modelwake: crash loop: ")]
    assert len(said) == 1 and said[0].endswith(", each %s, stopped" % CUDA), log
    assert said[0].startswith("modelwake: crash loop: 3 failed starts in "), log
    assert "exiting 7: the unit's RestartPreventExitStatus= ends the loop" in log
    record = failed_starts.read_record(str(unit.state))
    assert record["stopped"]["message"] == said[0][len("modelwake: "):]
    assert CUDA in record["evidence"]
    assert [start["cause"] for start in record["starts"]] == [OOM % "2.31", OOM % "1.50", CUDA, CUDA, CUDA]
    assert unit.metric("modelwake_failed_starts_total") == 5 and unit.metric("modelwake_crash_loop") == 1
