"""Downloads in progress in a Hugging Face hub cache: which files, and how many bytes so far.

Why: an engine given a hub id (`vllm serve org/name`, SGLang `--model-path org/name`) downloads the
weights before it loads them, with its progress bars off. huggingface_hub writes each file to
`<cache>/models--<org>--<name>/blobs/<etag>.incomplete` and renames it to `blobs/<etag>` when it is
complete (huggingface_hub `file_download.py`, `hf_hub_download`: `incomplete_path=Path(blob_path +
".incomplete")`); releases since its PR #4228 add a per-process tag, `<etag>.<8 hex>.incomplete`.
The growth of those files is the download's progress.

Where the cache is (huggingface_hub `constants.py`): `HF_HUB_CACHE`, else the older
`HUGGINGFACE_HUB_CACHE`, else `$HF_HOME/hub`, else `$XDG_CACHE_HOME/huggingface/hub`, else
`~/.cache/huggingface/hub` in the home of the user the engine runs as. The environment is the
engine process's own (/proc/<pid>/environ, readable by root or the same user), else the unit's
`Environment=`; only these few variables are kept, never a token. An engine started with
`--download-dir DIR` (vLLM, SGLang) passes DIR to huggingface_hub as its cache_dir: watched too.

What the disk cannot tell:
- The file's name in the repository: the `snapshots/<commit>/<file>` link to the blob is made only
  after the download completes. It is known only when another revision already links that blob.
- The expected size: huggingface_hub learns it from the HEAD request's headers and keeps it in
  memory; nothing on disk holds it while the file downloads. So `expected` is None here; a caller
  that knows it (a log line, the request) fills it in.
The scan is cheap and bounded: the cache's top level, and `blobs/` of at most MAX_REPOS repos.
"""
import os
import pwd
import shlex

from ..common.command import run_command

REPO_PREFIX = "models--"
INCOMPLETE = ".incomplete"
MAX_REPOS = 512  # repos looked at per cache per look: a shared cache can hold many
MAX_SNAPSHOT_LINKS = 4096  # links read per repo when naming a blob
ENVIRONMENT_KEYS = ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME", "HOME")


def cache_dir(environment, home=None):
    """The hub cache an environment points at (huggingface_hub's order). home: the user's home,
    for `~` and the default when the environment has no HOME."""
    home = environment.get("HOME") or home or "/root"

    def expand(path):
        if path == "~" or path.startswith("~/"):
            return home + path[1:]
        return path

    for key in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if environment.get(key):
            return expand(environment[key])
    if environment.get("HF_HOME"):
        return os.path.join(expand(environment["HF_HOME"]), "hub")
    base = expand(environment.get("XDG_CACHE_HOME") or os.path.join(home, ".cache"))
    return os.path.join(base, "huggingface", "hub")


def process_environment(pid, proc_root="/proc"):
    """The cache-locating variables of a running process ({} of ENVIRONMENT_KEYS), or None when
    /proc/<pid>/environ cannot be read (another user's process without privileges, or gone)."""
    try:
        with open(os.path.join(proc_root, str(pid), "environ"), "rb") as handle:
            raw = handle.read()
    except OSError:
        return None
    if not raw:
        # A process caught in execve() shows no environment yet (its new stack is not set up):
        # unknown, not empty, or the default cache would be taken for it for good.
        return None
    found = {}
    for entry in raw.split(b"\0"):
        key, sep, value = entry.decode("utf-8", "replace").partition("=")
        if sep and key in ENVIRONMENT_KEYS:
            found[key] = value
    return found


def environment_pending(pid, proc_root="/proc"):
    """Whether /proc/<pid>/environ reads, but empty: a process still in execve()."""
    try:
        with open(os.path.join(proc_root, str(pid), "environ"), "rb") as handle:
            return not handle.read(1)
    except OSError:
        return False


def process_home(pid, proc_root="/proc"):
    """The home directory of the user a process runs as (its real uid), or None."""
    try:
        with open(os.path.join(proc_root, str(pid), "status")) as handle:
            for line in handle:
                if line.startswith("Uid:"):
                    return pwd.getpwuid(int(line.split()[1])).pw_dir
    except (OSError, ValueError, KeyError, IndexError):
        pass
    return None


def parse_unit_environment(show_text):
    """`systemctl show -p Environment -p User` output -> (the cache-locating variables, the home
    of User=, or of root when the unit sets none)."""
    found, user = {}, None
    for line in show_text.splitlines():
        key, _sep, value = line.partition("=")
        if key == "Environment":
            try:
                words = shlex.split(value)
            except ValueError:
                words = value.split()
            for word in words:
                name, sep, setting = word.partition("=")
                if sep and name in ENVIRONMENT_KEYS:
                    found[name] = setting
        elif key == "User":
            user = value.strip() or None
    try:
        home = pwd.getpwnam(user or "root").pw_dir
    except KeyError:
        home = None
    return found, home


def unit_cache_dir(unit, runner=run_command):
    """The hub cache a systemd unit's Environment= and User= point at, or None when systemctl fails."""
    rc, out, _err = runner(["systemctl", "show", unit, "-p", "Environment", "-p", "User"], 30)
    if rc != 0:
        return None
    environment, home = parse_unit_environment(out)
    return cache_dir(environment, home)


def download_dir(cmdline):
    """The `--download-dir DIR` (or `--download-dir=DIR`) of a command line, or None."""
    words = (cmdline or "").split()
    for index, word in enumerate(words):
        if word == "--download-dir" and index + 1 < len(words):
            return words[index + 1]
        if word.startswith("--download-dir="):
            return word.split("=", 1)[1]
    return None


def repo_id(folder):
    """`models--org--name` -> `org/name` (hub repo ids may not contain `--`)."""
    return "/".join(folder[len(REPO_PREFIX):].split("--"))


def blob_of(incomplete_name):
    """`<etag>.incomplete` or `<etag>.<tag>.incomplete` -> `<etag>` (etags hold no dot)."""
    return incomplete_name.split(".", 1)[0]


def _names_of_blobs(repo_dir, blobs):
    """{etag: file name in the repo} for the blobs an existing snapshot link already points at."""
    names = {}
    snapshots = os.path.join(repo_dir, "snapshots")
    seen = 0
    for dirpath, _dirs, files in os.walk(snapshots):
        for name in files:
            seen += 1
            if seen > MAX_SNAPSHOT_LINKS:
                return names
            path = os.path.join(dirpath, name)
            try:
                target = os.path.basename(os.readlink(path))
            except OSError:
                continue
            if target in blobs and target not in names:
                # snapshots/<commit>/<file in the repo>
                names[target] = os.path.relpath(path, snapshots).split(os.sep, 1)[-1]
    return names


def scan(cache):
    """The downloads in progress in one cache: [{"repo", "blob", "file", "bytes", "path"}], sorted by path.
    A missing or unreadable cache has none."""
    try:
        entries = sorted(entry for entry in os.listdir(cache) if entry.startswith(REPO_PREFIX))[:MAX_REPOS]
    except OSError:
        return []
    found = []
    for folder in entries:
        repo_dir = os.path.join(cache, folder)
        blobs_dir = os.path.join(repo_dir, "blobs")
        try:
            names = [name for name in os.listdir(blobs_dir) if name.endswith(INCOMPLETE)]
        except OSError:
            continue
        in_progress = []
        for name in sorted(names):
            path = os.path.join(blobs_dir, name)
            try:
                size = os.stat(path).st_size
            except OSError:
                continue  # completed and renamed between the listing and the stat
            in_progress.append({"repo": repo_id(folder), "blob": blob_of(name), "file": None, "bytes": size,
                                "path": path})
        if in_progress:
            known = _names_of_blobs(repo_dir, set(item["blob"] for item in in_progress))
            for item in in_progress:
                item["file"] = known.get(item["blob"])
            found.extend(in_progress)
    return found


def downloads(caches):
    """One look at every cache: {"caches", "files", "bytes" (sum of the files'), "expected" (None:
    see the module's docstring)}."""
    files = []
    for cache in caches:
        files.extend(scan(cache))
    return {"caches": list(caches), "files": files, "bytes": sum(item["bytes"] for item in files), "expected": None}


class HubCacheReader(object):
    """Finds the caches a server's processes use and reports their downloads in progress.

    The cache of each process is worked out once (its environment does not change); processes
    whose environment cannot be read fall back to the unit's Environment= (asked once), else to
    the default in their user's home."""

    MAX_CACHES = 4  # distinct caches watched: the engine and its ranks share one, or two with --download-dir

    def __init__(self, unit=None, runner=run_command, proc_root="/proc"):
        self.unit = unit
        self.runner = runner
        self.proc_root = proc_root
        self.by_process = {}  # "pid:starttime" -> cache dir
        self.unit_cache = None
        self.unit_asked = False

    def _cache_of(self, pid):
        environment = process_environment(pid, self.proc_root)
        if environment is not None:
            return cache_dir(environment, process_home(pid, self.proc_root))
        if environment_pending(pid, self.proc_root):
            return None  # readable soon (a process in execve()): ask again at the next look
        if self.unit:
            if not self.unit_asked:
                self.unit_asked = True
                self.unit_cache = unit_cache_dir(self.unit, self.runner)
            if self.unit_cache:
                return self.unit_cache
        return cache_dir({}, process_home(pid, self.proc_root))

    def caches(self, processes):
        """The distinct caches of {pid: info} (procfs.read_process), in pid order."""
        found = []
        current = {}
        for pid in sorted(processes):
            key = "%d:%d" % (pid, processes[pid].get("starttime") or 0)
            current[key] = self.by_process.get(key) or self._cache_of(pid)
            for cache in (current[key], download_dir(processes[pid].get("cmdline"))):
                if cache and cache not in found:
                    found.append(cache)
        self.by_process = current  # forget processes that have gone
        return found[:self.MAX_CACHES]

    def read(self, processes):
        """{pid: info} -> downloads() of their caches."""
        return downloads(self.caches(processes))
