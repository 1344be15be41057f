#!/usr/bin/python
# Copyright: (c) modelwake contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Make a directory hold exactly the given files, in one call to the host."""
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: file_tree
short_description: Install a set of small files under one directory in a single call
description:
  - Writes each file of I(files) under I(path) whose content, owner, group or mode differ, creating
    the directories it needs, and removes the files that match I(prune) but are not in I(files).
  - One call to the host for the whole set, also when nothing changed, where a C(ansible.builtin.copy)
    loop costs two module runs and a transfer per file.
  - A file is replaced by renaming a complete copy over it, never written in place, so a process
    that starts meanwhile reads either version, whole. Files whose content is already there are not
    touched (their modification time stays, and so does a restart decision made from it).
  - Meant for code and configuration of a few hundred kilobytes, not for large or binary payloads.
options:
  path:
    description: The root directory (absolute). Created when absent.
    type: path
    required: true
  files:
    description:
      - Relative path under I(path) -> the file's content, base64-encoded (C(lookup('ansible.builtin.file', src) | b64encode)),
        so that no templating or text conversion touches it on the way.
      - A path may not be absolute or climb out of I(path) (C(..)).
      - Instead of the content, a mapping C({content, owner, group, mode}) gives that file its own owner, group
        or mode (each key but C(content) optional, the options below where absent), e.g. an environment file
        that holds a secret, C(0600), beside files that anyone may read.
    type: dict
    required: true
  owner:
    description: Owner of the files and of the directories created.
    type: str
    default: root
  group:
    description: Group of the files and of the directories created.
    type: str
    default: root
  mode:
    description: Mode of the files, octal as a string (C("0644")).
    type: str
    default: "0644"
  dir_mode:
    description:
      - Mode of I(path) and of the directories under it that hold I(files).
      - I(path) itself is given I(owner), I(group) and I(dir_mode) also when it exists.
    type: str
    default: "0755"
  prune:
    description:
      - Shell patterns of relative paths (C(*) also matches C(/)); a file under I(path) that matches
        one and is not in I(files) is removed. Without any, nothing is removed.
    type: list
    elements: str
    default: []
author: modelwake contributors (@modelwake)
notes:
  - Supports check mode, reporting what it would write, correct and remove.
  - Supports diff mode - each file written or removed, as text, up to 100 KiB (as C(ansible.builtin.copy) shows).
"""

EXAMPLES = r"""
- name: Install the launcher's package in one call
  modelwake.serving.file_tree:
    path: /opt/modelwake/lib
    files:
      modelwake/__init__.py: "{{ lookup('ansible.builtin.file', 'modelwake/__init__.py', rstrip=False) | b64encode }}"
      modelwake-launch: "{{ lookup('ansible.builtin.file', 'modelwake-launch', rstrip=False) | b64encode }}"
    prune: ["modelwake/*.py"]
"""

RETURN = r"""
written:
  description: The relative paths written (new or changed content), sorted.
  returned: always
  type: list
  elements: str
  sample: ["modelwake/readiness/classifier.py"]
fixed:
  description: The relative paths whose content was right but whose owner, group or mode was corrected.
  returned: always
  type: list
  elements: str
removed:
  description: The relative paths removed by I(prune), sorted.
  returned: always
  type: list
  elements: str
"""

import base64
import binascii
import fnmatch
import os

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.modelwake.serving.plugins.module_utils.common.atomic import replace_file

# The largest file whose diff is shown, as Ansible's own copy and template (MAX_FILE_SIZE_FOR_DIFF).
DIFF_MAX_BYTES = 104448

ARGUMENT_SPEC = {
    "path": {"type": "path", "required": True},
    "files": {"type": "dict", "required": True},
    "owner": {"type": "str", "default": "root"},
    "group": {"type": "str", "default": "root"},
    "mode": {"type": "str", "default": "0644"},
    "dir_mode": {"type": "str", "default": "0755"},
    "prune": {"type": "list", "elements": "str", "default": []},
}


FILE_KEYS = ("content", "owner", "group", "mode")


class FileSpec:
    """One file to install: its bytes and the owner, group and mode it must have."""

    def __init__(self, content, owner, group, mode):
        self.content = content
        self.owner = owner
        self.group = group
        self.mode = mode


def decode_files(files, owner, group, mode):
    """{relative path: FileSpec} from the module's files argument, each file's own owner, group or mode
    where it gives one and owner, group, mode where not; ValueError names the bad entry."""
    decoded = {}
    for relative, value in sorted(files.items()):
        parts = relative.split("/")
        if not relative or relative.startswith("/") or ".." in parts or "" in parts:
            raise ValueError("files: %r is not a plain relative path under path (no leading /, no .., no //)" % relative)
        spec = value if isinstance(value, dict) else {"content": value}
        unknown = sorted(set(spec) - set(FILE_KEYS))
        if unknown or "content" not in spec:
            raise ValueError("files: %s takes content (base64) and optionally owner, group and mode, not %s"
                             % (relative, ", ".join(unknown) or "a mapping without content"))
        encoded = spec["content"]
        if not isinstance(encoded, str):
            raise ValueError("files: the content of %s must be a base64 string (| b64encode), not %s"
                             % (relative, type(encoded).__name__))
        try:
            content = base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError):
            raise ValueError("files: the content of %s is not base64: encode it with | b64encode" % relative)
        own_mode = parse_mode("files: the mode of %s" % relative, spec["mode"]) if "mode" in spec else mode
        decoded[relative] = FileSpec(content, spec.get("owner", owner), spec.get("group", group), own_mode)
    return decoded


def parse_mode(name, value):
    if not isinstance(value, str):
        raise ValueError("%s: %r must be an octal mode written as a string, such as \"0644\"" % (name, value))
    try:
        mode = int(value, 8)
    except ValueError:
        raise ValueError("%s: %r is not an octal mode such as \"0644\"" % (name, value))
    if not 0 <= mode <= 0o7777:
        raise ValueError("%s: %r is not a file mode (0000 to 7777)" % (name, value))
    return mode


def file_diff(relative, before, after):
    """Ansible's diff of one file (before or after None: absent), or None for a binary or large file."""
    texts = []
    for content in (before, after):
        if content is None:
            texts.append("")
            continue
        if len(content) > DIFF_MAX_BYTES:
            return None
        try:
            texts.append(content.decode("utf-8"))
        except UnicodeDecodeError:
            return None
    return {"before_header": relative, "after_header": relative, "before": texts[0], "after": texts[1]}


def current_content(target):
    """The file's bytes, or None when there is no regular file."""
    if not os.path.isfile(target) or os.path.islink(target):
        return None
    with open(target, "rb") as handle:
        return handle.read()


def plan(root, files, prune):
    """What to do: (to_write, to_check, to_remove) as sorted relative paths, and {relative path: the bytes
    there now, or None} for each file to write (its diff's before). to_check: content already there."""
    to_write, to_check, before = [], [], {}
    for relative, spec in sorted(files.items()):
        current = current_content(os.path.join(root, relative))
        if current == spec.content:
            to_check.append(relative)
        else:
            to_write.append(relative)
            before[relative] = current
    to_remove = []
    if prune and os.path.isdir(root):
        for directory, _dirs, names in os.walk(root):
            for name in names:
                relative = os.path.relpath(os.path.join(directory, name), root)
                if relative not in files and any(fnmatch.fnmatch(relative, pattern) for pattern in prune):
                    to_remove.append(relative)
    return to_write, to_check, sorted(to_remove), before


def ensure_directory(module, directory, dir_mode, owner, group):
    """Create directory and its missing parents (those created get the owner, group and mode)."""
    missing = []
    while not os.path.isdir(directory) and directory != os.path.dirname(directory):
        missing.append(directory)
        directory = os.path.dirname(directory)
    for created in reversed(missing):
        os.mkdir(created)
        set_attributes(module, created, owner, group, dir_mode)  # the mode whatever the umask


def set_attributes(module, target, owner, group, mode):
    """Owner, group and mode of target as asked; True when one of them changed."""
    changed = module.set_owner_if_different(target, owner, False)
    changed = module.set_group_if_different(target, group, changed)
    return module.set_mode_if_different(target, mode, changed)


def write_file(module, target, content, owner, group, mode):
    """Replace target by a complete new file with content (a rename: never a half-written file)."""
    replace_file(target, content, mode=None, prepare=lambda temporary: set_attributes(module, temporary, owner, group, mode))


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    params = module.params
    root = os.path.normpath(params["path"])
    try:
        if not os.path.isabs(root):
            raise ValueError("path: %r is not absolute" % params["path"])
        mode = parse_mode("mode", params["mode"])
        dir_mode = parse_mode("dir_mode", params["dir_mode"])
        files = decode_files(params["files"], params["owner"], params["group"], mode)
    except ValueError as exc:
        module.fail_json(msg=str(exc))
    if os.path.exists(root) and not os.path.isdir(root):
        module.fail_json(msg="path: %s exists and is not a directory" % root)

    to_write, to_check, to_remove, before = plan(root, files, params["prune"])
    owner, group = params["owner"], params["group"]
    diffs = []
    if module._diff:
        diffs = [file_diff(relative, before[relative], files[relative].content) for relative in to_write]
        diffs += [file_diff(relative, current_content(os.path.join(root, relative)), None) for relative in to_remove]
        diffs = [diff for diff in diffs if diff is not None]
    if not module.check_mode:
        ensure_directory(module, root, dir_mode, owner, group)
        for relative in to_write:
            target = os.path.join(root, relative)
            ensure_directory(module, os.path.dirname(target), dir_mode, owner, group)
            spec = files[relative]
            write_file(module, target, spec.content, spec.owner, spec.group, spec.mode)
    # In check mode these only tell whether they would change something.
    root_fixed = os.path.isdir(root) and set_attributes(module, root, owner, group, dir_mode)
    fixed = [relative for relative in to_check
             if set_attributes(module, os.path.join(root, relative), files[relative].owner, files[relative].group,
                               files[relative].mode)]
    if not module.check_mode:
        for relative in to_remove:
            os.unlink(os.path.join(root, relative))
    result = dict(changed=bool(to_write or fixed or to_remove or root_fixed), written=to_write, fixed=fixed,
                  removed=to_remove)
    if diffs:
        result["diff"] = diffs
    module.exit_json(**result)


if __name__ == "__main__":
    main()
