"""The hub-cache reader (host/hub_cache.py) on real cache layouts built in a temporary directory,
in huggingface_hub's shapes: blobs/<etag>.incomplete (older releases), blobs/<etag>.<tag>.incomplete
(newer), snapshots/<commit>/<file> links to finished blobs."""
import os
import pwd
import subprocess
import sys

import pytest

from ansible_collections.modelwake.serving.plugins.module_utils.host import hub_cache

ETAG_A = "a" * 64  # sha256 etags of LFS files
ETAG_B = "b" * 64
ETAG_C = "c" * 40  # a git sha1 etag (a small file)


def repo(cache, folder):
    path = cache / folder
    (path / "blobs").mkdir(parents=True)
    (path / "refs").mkdir()
    return path


def grow(path, size):
    with open(str(path), "ab") as handle:
        handle.write(b"\0" * (size - (path.stat().st_size if path.exists() else 0)))


@pytest.mark.parametrize("environment, home, expected", [
    ({"HF_HUB_CACHE": "/data/hub", "HF_HOME": "/x"}, "/home/svc", "/data/hub"),
    ({"HUGGINGFACE_HUB_CACHE": "/old/hub", "HF_HOME": "/x"}, "/home/svc", "/old/hub"),
    ({"HF_HOME": "/srv/hf"}, "/home/svc", "/srv/hf/hub"),
    ({"HF_HOME": "~/hf"}, "/home/svc", "/home/svc/hf/hub"),
    ({"XDG_CACHE_HOME": "/var/cache/svc"}, "/home/svc", "/var/cache/svc/huggingface/hub"),
    ({}, "/home/svc", "/home/svc/.cache/huggingface/hub"),
    ({"HOME": "/opt/engine"}, "/home/svc", "/opt/engine/.cache/huggingface/hub"),
])
def test_the_cache_is_found_in_huggingface_hubs_order(environment, home, expected):
    assert hub_cache.cache_dir(environment, home) == expected


def test_downloads_in_progress_are_found_and_grow(tmp_path):
    cache = tmp_path / "hub"
    kimi = repo(cache, "models--moonshotai--Kimi-K2.6")
    gpt2 = repo(cache, "models--gpt2")
    repo(cache, "datasets--org--data")  # not a model: never scanned
    (cache / ".locks").mkdir()
    (kimi / "blobs" / ETAG_C).write_bytes(b"{}")  # a finished blob is no download
    shard = kimi / "blobs" / (ETAG_A + ".1f2e3d4c.incomplete")
    grow(shard, 4096)
    old_style = gpt2 / "blobs" / (ETAG_B + ".incomplete")
    grow(old_style, 100)
    first = hub_cache.downloads([str(cache)])
    assert first["files"] == [
        {"repo": "gpt2", "blob": ETAG_B, "file": None, "bytes": 100, "path": str(old_style)},
        {"repo": "moonshotai/Kimi-K2.6", "blob": ETAG_A, "file": None, "bytes": 4096, "path": str(shard)},
    ]
    assert first["bytes"] == 4196 and first["expected"] is None and first["caches"] == [str(cache)]
    grow(shard, 3 * 4096)
    assert hub_cache.downloads([str(cache)])["bytes"] == 100 + 3 * 4096
    # Done: huggingface_hub renames it to the blob and links the snapshot; no longer in progress.
    os.rename(str(shard), str(kimi / "blobs" / ETAG_A))
    assert [f["repo"] for f in hub_cache.downloads([str(cache)])["files"]] == ["gpt2"]


def test_a_blob_another_revision_links_is_named(tmp_path):
    cache = tmp_path / "hub"
    kimi = repo(cache, "models--moonshotai--Kimi-K2.6")
    old = kimi / "snapshots" / "0123abcd" / "sub"
    old.mkdir(parents=True)
    os.symlink("../../../blobs/" + ETAG_A, str(old / "model-00001-of-00064.safetensors"))
    grow(kimi / "blobs" / (ETAG_A + ".9a8b7c6d.incomplete"), 10)
    grow(kimi / "blobs" / (ETAG_B + ".9a8b7c6d.incomplete"), 20)
    files = hub_cache.downloads([str(cache)])["files"]
    assert [(f["blob"], f["file"]) for f in files] == [(ETAG_A, "sub/model-00001-of-00064.safetensors"),
                                                       (ETAG_B, None)]


def test_a_missing_cache_has_no_downloads(tmp_path):
    assert hub_cache.downloads([str(tmp_path / "nowhere")]) == {
        "caches": [str(tmp_path / "nowhere")], "files": [], "bytes": 0, "expected": None}


def test_the_environment_comes_from_the_process_and_keeps_no_token(tmp_path):
    proc = tmp_path / "proc" / "77"
    proc.mkdir(parents=True)
    (proc / "environ").write_bytes(b"PATH=/usr/bin\0HF_TOKEN=hf_secret\0HF_HOME=/srv/hf\0HOME=/home/svc\0")
    (proc / "status").write_text("Name:\tpython3\nUid:\t0\t0\t0\t0\n")
    assert hub_cache.process_environment(77, str(tmp_path / "proc")) == {"HF_HOME": "/srv/hf", "HOME": "/home/svc"}
    assert hub_cache.process_environment(78, str(tmp_path / "proc")) is None
    assert hub_cache.process_home(77, str(tmp_path / "proc")) == pwd.getpwuid(0).pw_dir


def test_without_the_process_environment_the_units_environment_tells(tmp_path):
    calls = []

    def systemctl(argv, timeout):
        calls.append(argv)
        return 0, 'Environment=CUDA_VISIBLE_DEVICES=0,1 "HF_HUB_CACHE=/models/hub" HF_TOKEN=hf_x\nUser=\n', ""

    reader = hub_cache.HubCacheReader("sglang-k26.service", runner=systemctl, proc_root=str(tmp_path))
    processes = {5: {"starttime": 1}, 6: {"starttime": 2}}
    assert reader.caches(processes) == ["/models/hub"]
    assert reader.caches(processes) == ["/models/hub"]
    assert calls == [["systemctl", "show", "sglang-k26.service", "-p", "Environment", "-p", "User"]]
    assert hub_cache.parse_unit_environment("Environment=HF_HOME=/h\nUser=root\n") == (
        {"HF_HOME": "/h"}, pwd.getpwnam("root").pw_dir)


def test_a_real_process_environment_points_at_its_cache(tmp_path):
    # /proc/<pid>/environ is the environment the process started with.
    cache = tmp_path / "hub"
    proc = subprocess.Popen([sys.executable, "-c", "import sys; print('ready', flush=True); sys.stdin.read()"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, universal_newlines=True,
                            env=dict(os.environ, HF_HUB_CACHE=str(cache)))
    try:
        assert proc.stdout.readline().strip() == "ready"  # past execve(): its environment is readable
        reader = hub_cache.HubCacheReader()
        assert reader.caches({proc.pid: {"starttime": 1}}) == [str(cache)]
    finally:
        proc.stdin.close()
        proc.wait()


def test_an_engines_download_dir_is_watched_as_well(tmp_path):
    reader = hub_cache.HubCacheReader(proc_root=str(tmp_path))  # no environ readable: the default
    processes = {5: {"starttime": 1, "cmdline": "/v/bin/python3 -m vllm.entrypoints.openai.api_server "
                                                "--model org/m --download-dir /models/hub"},
                 6: {"starttime": 2, "cmdline": "python3 -m sglang.launch_server --download-dir=/fast/hub"}}
    found = reader.caches(processes)
    assert found[1:] == ["/models/hub", "/fast/hub"] and found[0].endswith("/.cache/huggingface/hub")
    assert hub_cache.download_dir("python3 -m vllm serve org/m") is None


def test_a_process_caught_in_execve_is_asked_again_not_given_the_default_cache(tmp_path):
    # Right after a fork, /proc/<pid>/environ reads empty until execve() has set up the new stack.
    proc_root = tmp_path / "proc"
    (proc_root / "42").mkdir(parents=True)
    (proc_root / "42" / "environ").write_bytes(b"")
    reader = hub_cache.HubCacheReader(proc_root=str(proc_root))
    assert reader.caches({42: {"starttime": 7}}) == []
    (proc_root / "42" / "environ").write_bytes(b"HF_HUB_CACHE=/models/hub\0PATH=/usr/bin\0")
    assert reader.caches({42: {"starttime": 7}}) == ["/models/hub"]
