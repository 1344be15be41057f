"""The pip_wheels lookup's order of places, without a download (the download: tests/integration/test_pip_wheel_download.py)."""
import os

from ansible_collections.modelwake.serving.plugins.lookup.pip_wheels import pip_wheels


def place(tmp_path, name, *versions):
    directory = tmp_path / name
    directory.mkdir()
    for version in versions:
        (directory / ("pip-%s-py3-none-any.whl" % version)).write_bytes(b"")
    (directory / "setuptools-80.9.0-py3-none-any.whl").write_bytes(b"")  # not pip: never returned
    return str(directory)


def names(paths):
    return [os.path.relpath(path, os.path.dirname(os.path.dirname(path))) for path in paths]


def test_places_in_order_each_newest_first_by_version(tmp_path):
    wheelhouse = place(tmp_path, "wheelhouse", "9.0.1", "23.2.1")
    bundle = place(tmp_path, "bundle", "24.0")
    distribution = place(tmp_path, "distribution", "23.0.1")
    downloaded = place(tmp_path, "downloaded", "26.3")
    found = pip_wheels([wheelhouse, ""], bundle=bundle, distribution=distribution, download_dir=downloaded)
    assert names(found) == ["wheelhouse/pip-23.2.1-py3-none-any.whl", "wheelhouse/pip-9.0.1-py3-none-any.whl",
                            "bundle/pip-24.0-py3-none-any.whl", "distribution/pip-23.0.1-py3-none-any.whl",
                            "downloaded/pip-26.3-py3-none-any.whl"]


def test_no_download_where_the_controller_has_a_wheel(tmp_path):
    bundle = place(tmp_path, "bundle", "24.0")
    download_dir = tmp_path / "cache"
    assert names(pip_wheels(bundle=bundle, distribution=str(tmp_path / "none"), download_dir=str(download_dir))) == [
        "bundle/pip-24.0-py3-none-any.whl"]
    assert not download_dir.exists()


def test_an_empty_download_dir_turns_the_download_off(tmp_path):
    empty = place(tmp_path, "empty")
    assert pip_wheels(bundle=empty, distribution=empty, download_dir="") == []
