"""A cache of which module_utils each Python file imports, for Ansible's payload builder on the controller.

Before a module runs, Ansible builds its payload: it parses the module and every module_utils file the
module reaches into a syntax tree, to find what each one imports (ansible.executor.module_common's
recursive_finder). It keeps the payload only for the rest of the one playbook run, so every run parses
Ansible's own module_utils (about 55 files behind `basic`) again for each module it uses: about 0.13 to
0.22 s of the controller's CPU per module and run, 2.4 s of the 9.9 s of user CPU that an unchanged
deploy-k26.yml spends on its controller (measured on the 2-core test machine, bench/REPORT.md, "The test
suite"). The suite runs Ansible hundreds of times on 2 cores.

This keeps, per file, what Ansible's own import finder found in it: keyed by the Ansible version, the
file's dotted name, whether it is a package's __init__, and its source's digest. Everything else runs as
it does without the cache (which file each import resolves to, collection redirects, the payload's
contents): only the parse and the walk of a file whose exact bytes were walked before are skipped, and a
file that changes is parsed again. tests/unit/test_module_deps_cache.py checks that every payload the
toolchain builds is byte for byte the one Ansible builds without it.

Installed by `make venv` into the toolchain's venv only (never on a managed host, never shipped with the
collection): this file and a .pth line that imports it at start-up (`module_deps_cache.py install
SITE_DIR`); it patches ansible.executor.module_common when, and only when, a process imports it. The cache lives in
$MODELWAKE_MODULE_DEPS_CACHE (the Makefile sets it under $MODELWAKE_CACHE); `off` turns it off (`make bench`
measures Ansible as an operator runs it). Standard library only; a cache entry that cannot be read or
written is computed as without the cache.
"""
import hashlib
import importlib.util
import marshal
import os
import sys

CACHE_DIR = os.environ.get("MODELWAKE_MODULE_DEPS_CACHE",
                           os.path.join(os.path.expanduser("~"), ".cache", "modelwake", "module-deps"))
PATCHED_MODULE = "ansible.executor.module_common"
# Set on the patched module, and on the finder that waits for it: one patch, whichever copy of this file
# (the installed one, or tools/ imported by a test) comes first.
MARKER = "_modelwake_module_deps_cache"


class _Source(object):
    """What Ansible's `_compile_module_ast` was given, parsed only when something needs the tree: the
    import finder on a cache miss, or the module metadata reader (which reads `body` only where Ansible's
    experimental module metadata is turned on)."""

    def __init__(self, name, source, compile_tree):
        self.name = name
        self.source = source
        self._compile_tree = compile_tree
        data = source if isinstance(source, bytes) else source.encode("utf-8", "surrogateescape")
        self.digest = hashlib.sha256(data).hexdigest()

    def tree(self):
        return self._compile_tree(self.name, self.source)

    @property
    def body(self):
        return self.tree().body


def _entry_path(version, source, module_fqn, is_pkg_init):
    key = "%s\0%s\0%s\0%s\0%s" % (version, source.name, source.digest, module_fqn, bool(is_pkg_init))
    return os.path.join(CACHE_DIR, hashlib.sha256(key.encode("utf-8")).hexdigest())


def _load(path):
    try:
        with open(path, "rb") as handle:
            submodules, optional_imports = marshal.load(handle)
        return set(submodules), set(optional_imports)
    except (OSError, EOFError, ValueError, TypeError):
        return None


def _store(path, submodules, optional_imports):
    try:
        os.makedirs(CACHE_DIR, mode=0o700, exist_ok=True)
        partial = "%s.%d.partial" % (path, os.getpid())
        with open(partial, "wb") as handle:
            marshal.dump((sorted(submodules), sorted(optional_imports)), handle)
        os.replace(partial, path)  # atomic: concurrent playbook runs never read half an entry
    except OSError:
        pass


def patch(module_common, version):
    """Defer `module_common`'s parse, and answer its import finder from the cache (ansible-core 2.19)."""
    compile_tree = module_common._compile_module_ast
    find_imports = module_common.ModuleDepFinder.__init__

    def deferred_compile(module_name, source_code):
        return _Source(module_name, source_code, compile_tree)

    def cached_find_imports(self, module_fqn, source, is_pkg_init=False, *args, **kwargs):
        if not isinstance(source, _Source):
            return find_imports(self, module_fqn, source, is_pkg_init, *args, **kwargs)
        path = _entry_path(version, source, module_fqn, is_pkg_init)
        found = _load(path)
        if found is None:
            find_imports(self, module_fqn, source.tree(), is_pkg_init, *args, **kwargs)
            _store(path, self.submodules, self.optional_imports)
            return None
        # The attributes recursive_finder reads, and those the finder itself sets.
        self.submodules, self.optional_imports = found
        self.module_fqn, self.is_pkg_init = module_fqn, is_pkg_init
        return None

    module_common._compile_module_ast = deferred_compile
    module_common.ModuleDepFinder.__init__ = cached_find_imports


class _PatchOnImport(object):
    """A meta path finder that lets Python import module_common as usual, then patches it."""

    def find_spec(self, name, path=None, target=None):
        if name != PATCHED_MODULE:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        execute = spec.loader.exec_module

        def exec_module(module):
            execute(module)
            names = ("_compile_module_ast", "ModuleDepFinder")
            # Another layout (another Ansible) is left as it is.
            if all(hasattr(module, name) for name in names) and not getattr(module, MARKER, False):
                from ansible.release import __version__
                patch(module, __version__)
                setattr(module, MARKER, True)

        spec.loader.exec_module = exec_module
        return spec


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "install":
        sys.exit("usage: module_deps_cache.py install SITE_PACKAGES_DIR")
    # Installed as zipimport_cache.py is: this file and its .pth line (run from tools/, beside it).
    from zipimport_cache import install_startup_module
    install_startup_module(sys.argv[2], __file__, "modelwake_module_deps_cache")
elif (CACHE_DIR != "off" and PATCHED_MODULE not in sys.modules
      and not any(getattr(finder, MARKER, False) for finder in sys.meta_path)):
    _finder = _PatchOnImport()
    setattr(_finder, MARKER, True)
    sys.meta_path.insert(0, _finder)
