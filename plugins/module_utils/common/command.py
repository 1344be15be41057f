"""Running host commands (nvidia-smi, systemctl, journalctl) behind one injectable callable.

Every reader takes `runner(argv, timeout) -> (rc, stdout, stderr)`; tests pass scripted runners.
"""
import os
import shutil
import subprocess

TIMED_OUT = 124  # the rc of a command that did not finish in its time, as timeout(1) says it
# How long a killed command is given to die and close its output. A process blocked in the kernel
# (state D: nvidia-smi on a wedged driver) cannot die until the kernel lets go of it; it is left
# behind rather than waited for.
KILL_GRACE = 2.0


def run_command(argv, timeout=30):
    """Run argv without a shell; a missing program is rc 127, like a shell would say, one that did
    not finish in `timeout` seconds rc 124. Never waits longer than timeout + KILL_GRACE (subprocess.run
    would wait without end for a killed process that the kernel holds)."""
    if shutil.which(argv[0]) is None:
        return 127, "", "%s: command not found" % argv[0]
    env = dict(os.environ, LC_ALL="C", SYSTEMD_COLORS="0", SYSTEMD_PAGER="")
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=env, universal_newlines=True, errors="replace")
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        try:
            proc.communicate(timeout=KILL_GRACE)  # reaped, and its output closed
        except subprocess.TimeoutExpired:
            # Unkillable for now: its pipes are closed here, and subprocess reaps it whenever it dies.
            for pipe in (proc.stdout, proc.stderr):
                pipe.close()
        return TIMED_OUT, "", "%s: timed out after %s s" % (argv[0], timeout)
    return proc.returncode, out, err
