"""tools/zipimport_cache.py: the test hosts' bytecode cache for code imported from a zip.

Each case runs fresh interpreters, as Ansible's module runs are: the first compiles and stores, the
next reads the stored code, and what runs is the same either way (results, line numbers, and the
file names in a traceback, which name the zip being run, not the one that filled the cache).
"""
import marshal
import os
import subprocess
import sys
import zipfile

from tests.helpers import TOOLS as HOOK_DIR

MODULE = b'''\
def answer(x):
    return x * 2


def fail():
    raise RuntimeError("from the payload")  # line 6
'''

RUN = '''\
import sys, traceback
sys.path.insert(0, %(hook)r)
import zipimport_cache
sys.path.insert(0, %(zip)r)
import payload
print(payload.answer(21))
try:
    payload.fail()
except RuntimeError:
    frame = traceback.extract_tb(sys.exc_info()[2])[-1]
    print(frame.filename, frame.lineno)
'''


def payload_zip(path, source=MODULE):
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("payload.py", source)
    return str(path)


def run(zip_path, cache):
    env = dict(os.environ, MODELWAKE_ZIPIMPORT_CACHE=str(cache))
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    out = subprocess.run([sys.executable, "-c", RUN % {"hook": HOOK_DIR, "zip": zip_path}],
                         env=env, check=True, stdout=subprocess.PIPE, text=True).stdout
    return out.splitlines()


def stored(cache):
    return sorted(name for _, _, names in os.walk(cache) for name in names)


def test_the_first_run_stores_and_the_next_reads_with_the_running_zips_file_name(tmp_path):
    cache = tmp_path / "cache"
    first = payload_zip(tmp_path / "first.zip")
    assert run(first, cache) == ["42", "%s/payload.py 6" % first]
    assert len(stored(cache)) == 1

    # Another payload with the same source, as Ansible's next module run is: served from the cache.
    entry = os.path.join(cache, os.listdir(cache)[0], stored(cache)[0])
    before = os.stat(entry).st_mtime_ns
    second = payload_zip(tmp_path / "second.zip")
    assert run(second, cache) == ["42", "%s/payload.py 6" % second]
    assert stored(cache) == [os.path.basename(entry)]
    assert os.stat(entry).st_mtime_ns == before


def test_changed_source_is_compiled_again(tmp_path):
    cache = tmp_path / "cache"
    run(payload_zip(tmp_path / "a.zip"), cache)
    changed = MODULE.replace(b"x * 2", b"x * 3")
    assert run(payload_zip(tmp_path / "b.zip", changed), cache)[0] == "63"
    assert len(stored(cache)) == 2


def test_an_unwritable_or_damaged_cache_falls_back_to_compiling(tmp_path):
    blocked = tmp_path / "not-a-dir"
    blocked.write_text("")
    assert run(payload_zip(tmp_path / "a.zip"), blocked)[0] == "42"

    cache = tmp_path / "cache"
    run(payload_zip(tmp_path / "b.zip"), cache)
    (entry,) = [os.path.join(root, name) for root, _, names in os.walk(cache) for name in names]
    for damage in (b"\x00garbage", marshal.dumps(7)):  # unreadable, and readable but not code
        with open(entry, "wb") as handle:
            handle.write(damage)
        assert run(payload_zip(tmp_path / "c.zip"), cache)[0] == "42"


def test_install_puts_the_module_and_its_pth_line_where_site_runs_them(tmp_path):
    site_dir = tmp_path / "site-packages"
    subprocess.run([sys.executable, os.path.join(HOOK_DIR, "zipimport_cache.py"), "install", str(site_dir)], check=True)
    # site.addsitedir is what site.py does for a site-packages directory at start-up.
    out = subprocess.run([sys.executable, "-c", "import site, zipimport; site.addsitedir(%r); "
                          "print(zipimport._compile_source.__name__)" % str(site_dir)],
                         check=True, stdout=subprocess.PIPE, text=True).stdout
    assert out.strip() == "_cached_compile_source"
