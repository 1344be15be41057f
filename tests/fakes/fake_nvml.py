"""Build tests/fakes/fake_nvml.c into a directory as libnvidia-ml.so.1, the driver's file name.

Unit tests load it by path; playbooks, the module and the bench find it as a GPU host's loader
would, with the directory on LD_LIBRARY_PATH. Built once per directory (cc, about 0.3 s).
"""
import os
import subprocess

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fake_nvml.c")
LIBRARY_NAME = "libnvidia-ml.so.1"


def build(directory):
    """The path of libnvidia-ml.so.1 in `directory`, compiled from fake_nvml.c unless up to date."""
    os.makedirs(directory, exist_ok=True)
    library = os.path.join(directory, LIBRARY_NAME)
    if not os.path.exists(library) or os.path.getmtime(library) < os.path.getmtime(SOURCE):
        partial = library + ".partial-%d" % os.getpid()
        subprocess.run(["cc", "-shared", "-fPIC", "-O2", "-Wall", "-Werror", "-o", partial, SOURCE], check=True)
        os.replace(partial, library)
    return library
