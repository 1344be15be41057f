"""Running host commands (nvidia-smi, systemctl, journalctl) behind one injectable callable.

Every reader takes `runner(argv, timeout) -> (rc, stdout, stderr)`; tests pass scripted runners.
"""
import os
import shutil
import subprocess


def run_command(argv, timeout=30):
    """Run argv without a shell; a missing program is rc 127, like a shell would say."""
    if shutil.which(argv[0]) is None:
        return 127, "", "%s: command not found" % argv[0]
    env = dict(os.environ, LC_ALL="C", SYSTEMD_COLORS="0", SYSTEMD_PAGER="")
    try:
        proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                              timeout=timeout, universal_newlines=True, errors="replace", check=False)
    except subprocess.TimeoutExpired:
        return 124, "", "%s: timed out after %s s" % (argv[0], timeout)
    return proc.returncode, proc.stdout, proc.stderr
