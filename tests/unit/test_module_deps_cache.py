"""tools/module_deps_cache.py: the toolchain's cache of which module_utils each file imports.

Each case builds Ansible's payloads (recursive_finder, as a playbook run does before a module runs) in
fresh interpreters: without the cache, with an empty one and with the one that run filled. The payloads
must be the same bytes in every case, for every module of the collection and the builtins deploy-k26.yml
uses; a file whose source changes is parsed again, not answered from the cache.
"""
import json
import os
import subprocess
import sys

from tests.helpers import ROOT, TOOLS

MODULES = sorted("modelwake.serving." + name[:-len(".py")] for name in os.listdir(os.path.join(ROOT, "plugins", "modules"))
                 if name.endswith(".py") and not name.startswith("_")) + [
    "ansible.builtin.file", "ansible.builtin.stat", "ansible.builtin.copy", "ansible.builtin.command",
    "ansible.builtin.systemd_service", "ansible.builtin.getent", "ansible.builtin.slurp"]

# Build each module's payload as Ansible's _find_module_utils does (the same finder, into a zip), then
# print every file of it with its content's digest, and how many files the finder parsed.
BUILD = '''\
import datetime, hashlib, io, json, sys, zipfile
sys.path.insert(0, %(tools)r)
import module_deps_cache  # before Ansible, as the .pth line imports it at start-up
from ansible.executor import module_common
from ansible._internal._ansiballz import _builder
from ansible._internal._datatag._tags import Origin
from ansible.plugins import loader

parsed = []
def counting_compile(source, filename, mode, flags=0, *args, **kwargs):
    parsed.append(filename)
    return compile(source, filename, mode, flags, *args, **kwargs)
module_common.compile = counting_compile  # the name _compile_module_ast calls, found before the builtin

loader.init_plugin_loader([%(root)r])
payloads = {}
when = datetime.datetime(2026, 12, 6, tzinfo=datetime.timezone.utc)
for name in %(modules)r:
    path = loader.module_loader.find_plugin(name)
    with open(path, "rb") as handle:
        data = handle.read()
    archive = zipfile.ZipFile(io.BytesIO(), "w", zipfile.ZIP_STORED)
    fqn = module_common._get_ansible_module_fqn(path)
    module_common.recursive_finder(name.rsplit(".", 1)[1], fqn, Origin(path=path).tag(data), archive, when,
                                   _builder.ExtensionManager.create(task_vars={}))
    payloads[name] = sorted((info.filename, hashlib.sha256(archive.read(info.filename)).hexdigest())
                            for info in archive.infolist())
print(json.dumps({"payloads": payloads, "parsed": len(parsed)}))
'''


def build(cache, modules=MODULES, root=ROOT):
    env = dict(os.environ, MODELWAKE_MODULE_DEPS_CACHE=str(cache), ANSIBLE_COLLECTIONS_PATH=root)
    out = subprocess.run([sys.executable, "-c", BUILD % {"tools": TOOLS, "root": root, "modules": modules}],
                         env=env, check=True, stdout=subprocess.PIPE, text=True).stdout
    return json.loads(out.splitlines()[-1])


def test_payloads_are_the_same_bytes_without_the_cache_with_an_empty_one_and_with_a_filled_one(tmp_path):
    cache = tmp_path / "cache"
    plain = build("off")
    first = build(cache)
    again = build(cache)
    assert plain["payloads"] == first["payloads"] == again["payloads"]
    # Every module reaches module_utils: the payloads are not trivially equal.
    assert all(len(files) > 20 for files in plain["payloads"].values()), plain["payloads"]
    # Without the cache every module's build parses Ansible's own module_utils again; the empty cache
    # parsed each file once (the first module's build kept them for the next), the filled one nothing.
    assert plain["parsed"] > 20 * len(MODULES)
    assert len(MODULES) < first["parsed"] < plain["parsed"] / 3
    assert again["parsed"] == 0
    assert len(os.listdir(cache)) >= first["parsed"]


def test_a_changed_file_is_parsed_again_and_its_new_imports_are_in_the_payload(tmp_path):
    # A collection of one module and one module_utils file, in the layout Ansible loads collections from.
    root = tmp_path / "collections"
    package = root / "ansible_collections" / "mw" / "t" / "plugins"
    (package / "modules").mkdir(parents=True)
    (package / "module_utils").mkdir()
    (package / "modules" / "probe.py").write_text(
        "from ansible.module_utils.basic import AnsibleModule\n"
        "from ansible_collections.mw.t.plugins.module_utils.helper import answer\n")
    helper = package / "module_utils" / "helper.py"
    helper.write_text("def answer():\n    return 42\n")
    cache = tmp_path / "cache"

    def files():
        return [name for name, _digest in build(cache, ["mw.t.probe"], str(root))["payloads"]["mw.t.probe"]]

    before = files()
    assert "ansible/module_utils/urls.py" not in before
    # The helper now imports another module_utils file: the cached answer for its old source is not used.
    helper.write_text("from ansible.module_utils.urls import open_url\n\n\ndef answer():\n    return 42\n")
    after = files()
    assert "ansible/module_utils/urls.py" in after
    assert set(before) < set(after)
    assert after == [name for name, _digest in build("off", ["mw.t.probe"], str(root))["payloads"]["mw.t.probe"]]
