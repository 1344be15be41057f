"""One licence everywhere: the collection's (galaxy.yml), its roles' metas, its plugins' headers and
the LICENSE file say the same."""
import glob
import os

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SPDX = "GPL-3.0-or-later"
PLUGIN_HEADER = "# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)"


def load(path):
    with open(os.path.join(ROOT, path)) as handle:
        return yaml.safe_load(handle)


def test_the_collection_and_every_role_carry_one_licence():
    assert load("galaxy.yml")["license"] == [SPDX]
    roles = sorted(glob.glob(os.path.join(ROOT, "roles", "*", "meta", "main.yml")))
    assert roles
    assert dict((path, load(path)["galaxy_info"]["license"]) for path in roles) == dict((path, SPDX) for path in roles)


def test_the_license_file_and_every_plugin_say_the_same():
    with open(os.path.join(ROOT, "LICENSE")) as handle:
        head = handle.read(400)
    assert "GNU GENERAL PUBLIC LICENSE" in head and "Version 3" in head
    plugins = glob.glob(os.path.join(ROOT, "plugins", "*", "*.py"))
    lacking = []
    for path in plugins:
        if os.path.basename(path) == "__init__.py":
            continue
        with open(path) as handle:
            if PLUGIN_HEADER not in handle.read(400):
                lacking.append(os.path.relpath(path, ROOT))
    assert plugins and lacking == []
