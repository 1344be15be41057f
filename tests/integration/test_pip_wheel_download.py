"""The pip_wheels lookup on a controller that has no pip wheel: its own pip downloads one from the
index it is configured for, once; without an index in reach it says so by returning none.

Real pip, the controller's configuration: the same index the controller's own `pip install` uses.
"""
import os
import subprocess
import sys
import zipfile

from ansible_collections.modelwake.serving.plugins.lookup.pip_wheels import pip_wheels

# pip's own configuration files ignored and an index on a closed port: no index within reach.
NO_INDEX = {"PIP_CONFIG_FILE": os.devnull, "PIP_FIND_LINKS": "", "PIP_EXTRA_INDEX_URL": "",
            "PIP_INDEX_URL": "http://127.0.0.1:9/simple/"}


def test_a_controller_without_a_wheel_downloads_one_and_keeps_it(tmp_path, monkeypatch):
    empty = tmp_path / "empty"
    empty.mkdir()
    cache = tmp_path / "pip-wheels"
    found = pip_wheels(bundle=str(empty), distribution=str(empty), download_dir=str(cache))
    assert len(found) == 1 and os.path.dirname(found[0]) == str(cache), found
    with zipfile.ZipFile(found[0]) as wheel:
        assert "pip/__main__.py" in wheel.namelist()
    # The wheel runs pip from inside itself, as inference_env runs it on a host without pip.
    version = subprocess.run([sys.executable, os.path.join(found[0], "pip"), "--version"],
                             stdout=subprocess.PIPE, universal_newlines=True, check=True).stdout
    assert version.startswith("pip ") and found[0] in version
    # The next run finds it without an index.
    for name, value in NO_INDEX.items():
        monkeypatch.setenv(name, value)
    again = pip_wheels(bundle=str(empty), distribution=str(empty), download_dir=str(cache))
    assert again == found and os.listdir(str(cache)) == [os.path.basename(found[0])]


def test_without_an_index_in_reach_there_is_none(tmp_path, monkeypatch):
    for name, value in NO_INDEX.items():
        monkeypatch.setenv(name, value)
    empty = tmp_path / "empty"
    empty.mkdir()
    cache = tmp_path / "pip-wheels"
    assert pip_wheels(bundle=str(empty), distribution=str(empty), download_dir=str(cache)) == []
    assert os.listdir(str(cache)) == []
