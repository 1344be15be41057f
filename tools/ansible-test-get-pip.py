"""Stands in for get-pip.py when ansible-test bootstraps pip into its sanity virtual environments.

ansible-test downloads get-pip.py from ci-files.testing.ansible.com, which this network cannot reach;
it runs a script saved under ~/.ansible/test/cache/ instead (its own error message says so). This one
does what get-pip does with the same arguments: the interpreter's bundled pip (ensurepip) installs
the pinned pip and packages from the package index.
"""
import subprocess
import sys

# get-pip's own flags; pip install does not know them.
GET_PIP_ONLY = ("--no-setuptools", "--no-wheel")

if __name__ == "__main__":
    arguments = [argument for argument in sys.argv[1:] if argument not in GET_PIP_ONLY]
    subprocess.check_call([sys.executable, "-m", "ensurepip", "--default-pip"], stdout=subprocess.DEVNULL)
    sys.exit(subprocess.call([sys.executable, "-m", "pip", "install", "--quiet"] + arguments))
