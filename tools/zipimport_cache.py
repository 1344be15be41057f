"""A bytecode cache for code imported from a zip: the payloads of Ansible's module runs.

Ansible runs a module by handing Python a zip of the module and its module_utils; Python's zipimport
compiles every file of that zip from source on every run and never keeps the result (unlike imports
from a directory, which leave a __pycache__), and Python 3.11's zipimport compiles each module twice
(once to name its file, once to run it). The suite makes thousands of module runs on 2 cores
(docs/testing.md; the measured cost is in bench/REPORT.md, "The test suite").

Installed by tools/testhosts into every test host's system Python and by `make venv` into the
toolchain's venv (the tests' module runs on the controller), both through `install()` below: the
module and a .pth line that imports it at start-up. It wraps zipimport's compile step with a cache keyed by the source's
digest. The code objects are those compile() returned for the same bytes; only their file name is set
to the running zip's path, so tracebacks read as they would without the cache. Production hosts never
get this file: it changes how fast a module starts, not what it does.

The cache lives in $MODELWAKE_ZIPIMPORT_CACHE (the Makefile sets it under $MODELWAKE_CACHE), else in
/var/cache/modelwake-zipimport. Standard library only; any failure to read or write the cache falls
back to compiling.
"""
import marshal
import os
import sys
import zipimport

CACHE_DIR = os.path.join(os.environ.get("MODELWAKE_ZIPIMPORT_CACHE", "/var/cache/modelwake-zipimport"),
                         sys.implementation.cache_tag or "none")

# zipimport's private compile step (CPython 3.8 to 3.13); where it is missing this file does nothing.
_compile_source = getattr(zipimport, "_compile_source", None)
_code_type = type((lambda: None).__code__)


def _renamed(code, filename):
    """`code` and every code object nested in it, with co_filename set to `filename`."""
    consts = tuple(_renamed(const, filename) if isinstance(const, _code_type) else const
                   for const in code.co_consts)
    return code.replace(co_filename=filename, co_consts=consts)


def _cache_path(source):
    import hashlib  # here, not at start-up: most Python processes on a host never compile from a zip

    key = hashlib.sha256(b"%d\0" % sys.flags.optimize + source).hexdigest()
    return os.path.join(CACHE_DIR, key)


def _cached_compile_source(pathname, source):
    path = _cache_path(source)
    try:
        with open(path, "rb") as handle:
            stored = marshal.load(handle)
        if isinstance(stored, _code_type):
            return _renamed(stored, pathname)
    except (OSError, EOFError, ValueError, TypeError):
        pass
    code = _compile_source(pathname, source)
    try:
        os.makedirs(CACHE_DIR, mode=0o755, exist_ok=True)
        partial = "%s.%d.partial" % (path, os.getpid())
        with open(partial, "wb") as handle:
            marshal.dump(code, handle)
        os.replace(partial, path)  # atomic: concurrent module runs never read half a file
    except OSError:
        pass  # not writable by this user (a become_user module run): compile as without the cache
    return code


def install_startup_module(site_dir, source_path, module_name):
    """Put the file `source_path` into `site_dir` (a site-packages directory) as the module `module_name`,
    with the .pth line that imports it at every start-up of that Python (also tools/module_deps_cache.py's)."""
    os.makedirs(site_dir, exist_ok=True)
    with open(source_path) as handle:
        source = handle.read()
    with open(os.path.join(site_dir, module_name + ".py"), "w") as handle:
        handle.write(source)
    # site.py runs the .pth lines that begin with "import" at every start-up of that Python.
    with open(os.path.join(site_dir, module_name.replace("_", "-") + ".pth"), "w") as handle:
        handle.write("import %s\n" % module_name)


def install(site_dir):
    """Put this file into `site_dir` (a site-packages directory) with the .pth line that imports it."""
    install_startup_module(site_dir, __file__, "modelwake_zipimport_cache")


if _compile_source is not None:
    zipimport._compile_source = _cached_compile_source

if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "install":
        sys.exit("usage: zipimport_cache.py install SITE_PACKAGES_DIR")
    install(sys.argv[2])
