"""Python-environment logic for the inference_env role: versions, model formats, venv snapshots.

Runs on the managed host (standard library only, Python 3.9+). Pure functions raise
`PyEnvError`; the Ansible modules in library/ map it to `fail_json`. Anything that runs a
process takes a `run(argv) -> (rc, stdout, stderr)` callable so unit tests can script it.
"""
import json
import os
import re

from ..common.errors import ModelWakeError

# compressed-tensors `CompressionFormat` values and the first release that has each member
# (the first of compressed-tensors' git tags whose CompressionFormat has it).
FORMAT_MIN_VERSION = {
    "dense": "0.4.0",
    "int-quantized": "0.4.0",
    "pack-quantized": "0.4.0",
    "marlin-24": "0.4.0",
    "sparse-bitmask": "0.5.0",
    "float-quantized": "0.5.0",
    "naive-quantized": "0.5.0",
    "sparse-24-bitmask": "0.9.0",
    "nvfp4-pack-quantized": "0.10.0",
    "mixed-precision": "0.11.0",
    "mxfp4-pack-quantized": "0.13.0",
    "mxfp8-quantized": "0.15.0",
}
CT_QUANT_METHOD = "compressed-tensors"
PIN_VARIABLE = "inference_env_compressed_tensors_version"

_VERSION_RE = re.compile(
    r"^\s*v?(?:(?P<epoch>\d+)!)?(?P<release>\d+(?:\.\d+)*)"
    r"(?:[-_.]?(?P<pre_l>a|alpha|b|beta|c|rc|pre|preview)[-_.]?(?P<pre_n>\d*))?"
    r"(?:-(?P<post_n1>\d+)|[-_.]?(?P<post_l>post|rev|r)[-_.]?(?P<post_n2>\d*))?"
    r"(?:[-_.]?(?P<dev_l>dev)[-_.]?(?P<dev_n>\d*))?"
    r"(?:\+(?P<local>[a-z0-9]+(?:[-_.][a-z0-9]+)*))?\s*$",
    re.IGNORECASE,
)
_PRE_RANK = {"a": 0, "alpha": 0, "b": 1, "beta": 1, "c": 2, "rc": 2, "pre": 2, "preview": 2}


class PyEnvError(ModelWakeError):
    """A problem with the inputs or the environment, worded for the operator."""


def version_key(text):
    """Return a sort key for a PEP 440 version (local part ignored, as `==X` does).

    Numeric release segments compare as integers and trailing zeros do not count, so
    0.15.0.1 > 0.15.0 > 0.9.9 and 0.10 == 0.10.0; never compare versions as strings.
    """
    match = _VERSION_RE.match(str(text))
    if not match:
        raise ValueError("%r is not a valid version (PEP 440, e.g. 0.15.0.1)" % (text,))
    release = [int(part) for part in match.group("release").split(".")]
    while len(release) > 1 and release[-1] == 0:
        release.pop()
    pre_l, post_l, dev_l = match.group("pre_l"), match.group("post_l"), match.group("dev_l")
    post_n = match.group("post_n1") or match.group("post_n2")
    has_post = post_l is not None or match.group("post_n1") is not None
    if pre_l is not None:
        pre = (_PRE_RANK[pre_l.lower()], int(match.group("pre_n") or 0))
    elif dev_l is not None and not has_post:
        pre = (-1, 0)  # 1.0.dev1 sorts before 1.0a1
    else:
        pre = (3, 0)
    post = int(post_n or 0) if has_post else -1
    dev = (0, int(match.group("dev_n") or 0)) if dev_l is not None else (1, 0)
    return (int(match.group("epoch") or 0), tuple(release), pre, post, dev)


def satisfies(installed, op, wanted):
    """True when `installed` meets `op wanted` (op is '==' or '>=')."""
    if installed is None:
        return False
    have, want = version_key(installed), version_key(wanted)
    if op == "==":
        return have == want
    if op == ">=":
        return have >= want
    raise ValueError("unsupported operator %r" % (op,))


def enum_member(fmt):
    """`nvfp4-pack-quantized` -> `nvfp4_pack_quantized`, the name the engines access."""
    return fmt.replace("-", "_")


def _quantization_configs(config):
    """Yield (where, quantization_config) for the model and, for multimodal models, its text model."""
    if isinstance(config.get("quantization_config"), dict):
        yield "quantization_config", config["quantization_config"]
    text = config.get("text_config")
    if isinstance(text, dict) and isinstance(text.get("quantization_config"), dict):
        yield "text_config.quantization_config", text["quantization_config"]


def read_model_formats(config_path):
    """Return the compressed-tensors formats a model's config.json uses, as [{format, source}].

    Reads the top-level `format`, every `config_groups.<group>.format` and the
    `sparsity_config.format` of a `quant_method: compressed-tensors` config. An empty list means
    the model does not use compressed-tensors (nothing to require).
    """
    try:
        with open(config_path, "r", encoding="utf-8") as handle:
            config = json.load(handle)
    except (OSError, ValueError) as exc:
        raise PyEnvError("cannot read the model's %s: %s" % (config_path, exc))
    if not isinstance(config, dict):
        raise PyEnvError("%s is not a JSON object" % config_path)
    found = []
    for where, qconf in _quantization_configs(config):
        if qconf.get("quant_method") != CT_QUANT_METHOD:
            continue
        candidates = [(where + ".format", qconf.get("format"))]
        groups = qconf.get("config_groups") or {}
        if isinstance(groups, dict):
            for name in sorted(groups):
                if isinstance(groups[name], dict):
                    candidates.append(("%s.config_groups.%s.format" % (where, name), groups[name].get("format")))
        sparsity = qconf.get("sparsity_config")
        if isinstance(sparsity, dict):
            candidates.append((where + ".sparsity_config.format", sparsity.get("format")))
        for source, fmt in candidates:
            if fmt is None:
                continue
            if not isinstance(fmt, str):
                raise PyEnvError("%s: %s must be a string, got %r" % (config_path, source, fmt))
            found.append({"format": fmt, "source": source})
    return found


def plan_compressed_tensors(formats, pin=None):
    """Decide the compressed-tensors requirement for a model.

    Returns a dict: `op` ('==' for a pin, '>=' for a derived minimum, None when nothing is
    required), `version`, `required_by` (the format that sets the minimum), `minimum`,
    `formats` (distinct values) and `members` (enum member names to verify after install).
    A pin older than a format's first release raises PyEnvError naming the pin variable and
    the format, so the role stops before it changes anything.
    """
    if pin:
        try:
            version_key(pin)
        except ValueError as exc:
            raise PyEnvError("%s: %s" % (PIN_VARIABLE, exc))
    values = []
    for item in formats:
        if item["format"] not in values:
            values.append(item["format"])
    unknown = [fmt for fmt in values if fmt not in FORMAT_MIN_VERSION]
    if unknown and not pin:
        raise PyEnvError(
            "the model uses compressed-tensors format(s) %s that modelwake has no minimum version for; "
            "set %s to a release that supports them" % (", ".join(unknown), PIN_VARIABLE)
        )
    minimum, required_by = None, None
    for fmt in values:
        if fmt in FORMAT_MIN_VERSION and (
            minimum is None or version_key(FORMAT_MIN_VERSION[fmt]) > version_key(minimum)
        ):
            minimum, required_by = FORMAT_MIN_VERSION[fmt], fmt
    plan = {
        "formats": values,
        "members": [enum_member(fmt) for fmt in values],
        "minimum": minimum,
        "required_by": required_by,
        "op": None,
        "version": None,
    }
    if pin:
        too_new = [fmt for fmt in values if fmt in FORMAT_MIN_VERSION and version_key(pin) < version_key(FORMAT_MIN_VERSION[fmt])]
        if too_new:
            fmt = max(too_new, key=lambda f: version_key(FORMAT_MIN_VERSION[f]))
            raise PyEnvError(
                "%s=%s cannot load this model: it uses compressed-tensors format '%s', which needs "
                "compressed-tensors >= %s; raise the pin or leave it empty to derive the version from the model"
                % (PIN_VARIABLE, pin, fmt, FORMAT_MIN_VERSION[fmt])
            )
        plan.update(op="==", version=pin, required_by=required_by or PIN_VARIABLE)
    elif minimum:
        plan.update(op=">=", version=minimum)
    return plan


def canonical_name(name):
    """PEP 503 name normalisation, so `Compressed_Tensors` and `compressed-tensors` match."""
    return re.sub(r"[-_.]+", "-", name).lower()


# Runs inside the venv's interpreter (`-I -B`: ignores the caller's environment, writes no .pyc):
# every installed distribution, read from metadata, so it also works in a venv without pip.
SNAPSHOT_SCRIPT = (
    "import json, importlib.metadata as m\n"
    "print(json.dumps({d.metadata['Name']: d.version for d in m.distributions() if d.metadata['Name']}))\n"
)


def venv_python(venv):
    return os.path.join(venv, "bin", "python")


def snapshot(run, venv):
    """{canonical name: version} of every distribution installed in the venv."""
    rc, out, err = run([venv_python(venv), "-I", "-B", "-c", SNAPSHOT_SCRIPT])
    if rc != 0:
        raise PyEnvError("cannot list the packages of %s: %s" % (venv, (err or out).strip()))
    try:
        raw = json.loads(out)
    except ValueError:
        raise PyEnvError("cannot list the packages of %s: unexpected output %r" % (venv, out[:200]))
    return dict((canonical_name(name), version) for name, version in raw.items())


def snapshot_diff(before, after):
    """What changed between two snapshots: {'added': {...}, 'removed': {...}, 'changed': {name: [old, new]}}."""
    return {
        "added": dict((n, v) for n, v in after.items() if n not in before),
        "removed": dict((n, v) for n, v in before.items() if n not in after),
        "changed": dict((n, [before[n], after[n]]) for n in before if n in after and before[n] != after[n]),
    }


def rollback_plan(before, after):
    """Pip steps that turn `after` back into `before`: (names to uninstall, `name==version` to reinstall)."""
    diff = snapshot_diff(before, after)
    uninstall = sorted(diff["added"])
    reinstall = sorted("%s==%s" % (n, before[n]) for n in list(diff["removed"]) + list(diff["changed"]))
    return uninstall, reinstall


def verify_script(module, attribute, members, values):
    """Python source that imports `module`, looks up `attribute` and checks every enum member.

    Prints a JSON report and exits 1 when anything is missing, so the caller quotes exactly
    which member the installed release lacks (the K2.6 AttributeError, caught before a restart).
    """
    return (
        "import importlib, json, sys\n"
        "report = {'missing': []}\n"
        "try:\n"
        "    obj = importlib.import_module(%r)\n"
        "    for part in %r:\n"
        "        obj = getattr(obj, part)\n"
        "except Exception as exc:\n"
        "    report['error'] = '%%s: %%s' %% (type(exc).__name__, exc)\n"
        "    print(json.dumps(report)); sys.exit(1)\n"
        "for name, value in zip(%r, %r):\n"
        "    if not hasattr(obj, name):\n"
        "        report['missing'].append(name); continue\n"
        "    try:\n"
        "        obj(value)\n"
        "    except Exception:\n"
        "        report['missing'].append(name)\n"
        "print(json.dumps(report)); sys.exit(1 if report['missing'] else 0)\n"
    ) % (module, [p for p in attribute.split(".") if p], list(members), list(values))


def verify(run, venv, module, attribute="", values=()):
    """Import `module[.attribute]` in the venv and check enum `values`; return None or an error text."""
    members = [enum_member(v) for v in values]
    if not attribute:
        members, values = [], []
    rc, out, err = run([venv_python(venv), "-I", "-B", "-c", verify_script(module, attribute, members, values)])
    try:
        report = json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return "importing %s failed: %s" % (module, (err or out).strip()[-2000:])
    if report.get("error"):
        return "importing %s failed: %s" % (module, report["error"])
    if report["missing"]:
        target = "%s.%s" % (module, attribute)
        return "%s has no member(s) %s" % (target, ", ".join(report["missing"]))
    return None if rc == 0 else "verification of %s exited %d" % (module, rc)


def pip_check_conflicts(run, venv):
    """Lines of `pip check` (empty when it finds nothing): reported as warnings, never fatal."""
    rc, out, err = run([venv_python(venv), "-m", "pip", "check", "--disable-pip-version-check"])
    if rc == 0:
        return []
    return [line for line in (out + err).splitlines() if line.strip()]


class InstallFailed(PyEnvError):
    """An install or its verification failed; `result` says what was rolled back and how it ended."""

    def __init__(self, message, result):
        self.result = result
        super().__init__(message)


def pip_source_options():
    """The module options naming where pip takes packages from (pip_transaction, venv_restore)."""
    return {
        "find_links": {"type": "list", "elements": "path", "default": []},
        "no_index": {"type": "bool", "default": False},
        "index_url": {"type": "str", "default": ""},
    }


# pip run by a module: no version check against an index, never a prompt.
PIP_ENVIRONMENT = {"PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1"}


def pip_source_args(find_links=(), no_index=False, index_url=""):
    """pip options naming where packages come from (a staged wheelhouse or an index)."""
    args = ["--no-index"] if no_index else []
    if index_url:
        args += ["--index-url", index_url]
    for path in find_links:
        args += ["--find-links", path]
    return args


def protect_constraints(installed, protect, name):
    """`name==version` lines that keep each installed protected package (e.g. torch) where it is."""
    target = canonical_name(name)
    lines = []
    for pkg in protect:
        key = canonical_name(pkg)
        if key != target and key in installed:
            lines.append("%s==%s" % (key, installed[key]))
    return lines


def _tail(text, limit=3000):
    text = (text or "").strip()
    return text[-limit:]


def install_transaction(run, venv, name, op, version, source_args, constraints_file=None,
                        verify_module="", verify_attribute="", verify_values=(), check_mode=False,
                        before_install=None, install_args=()):
    """Make `name op version` true in `venv`, verified, or leave the venv exactly as it was.

    Returns a result dict (changed, before, after, diff, msg). When the install or the
    verification fails, every distribution the attempt added is removed and every one it
    replaced is reinstalled at its recorded version (`--no-deps`, from the same source), the
    venv is snapshotted again and InstallFailed says whether it is identical to before.
    `before_install()` runs only when pip is about to run (e.g. to check the wheel directories).
    `install_args` go to that pip install only (e.g. `--no-deps -r LOCK`: install an exact set).
    """
    key = canonical_name(name)
    spec = "%s%s%s" % (name, op, version)
    if not os.path.lexists(venv_python(venv)):
        if check_mode:
            return {"changed": True, "before": None, "after": None, "diff": {}, "action": "install", "msg": "would install %s into a new venv" % spec}
        raise PyEnvError("%s has no bin/python; create the venv first" % venv)
    before = snapshot(run, venv)
    installed = before.get(key)
    problem = None if satisfies(installed, op, version) else "%s is %s" % (name, installed or "not installed")
    if problem is None and verify_module:
        problem = verify(run, venv, verify_module, verify_attribute, verify_values)
    if problem is None:
        return {"changed": False, "action": "none", "before": installed, "after": installed, "diff": {},
                "msg": "%s %s already satisfies %s" % (name, installed, spec)}
    if check_mode:
        return {"changed": True, "action": "install", "before": installed, "after": None, "diff": {}, "msg": "would install %s (%s)" % (spec, problem)}
    if before_install is not None:
        before_install()
    argv = [venv_python(venv), "-m", "pip", "install", "--disable-pip-version-check", "--no-input"] + list(source_args)
    if constraints_file:
        argv += ["--constraint", constraints_file]
    rc, out, err = run(argv + list(install_args) + [spec])
    failure = None
    if rc != 0:
        failure = "pip install %s failed (rc=%d): %s" % (spec, rc, _tail(err or out))
    else:
        now = snapshot(run, venv).get(key)
        if not satisfies(now, op, version):
            failure = "after pip install, %s is %s, which does not satisfy %s" % (name, now, spec)
        elif verify_module:
            failure = verify(run, venv, verify_module, verify_attribute, verify_values)
            if failure:
                failure = "verification after installing %s %s failed: %s" % (name, now, failure)
    if failure is None:
        after = snapshot(run, venv)
        return {"changed": True, "action": "install", "before": installed, "after": after.get(key), "diff": snapshot_diff(before, after),
                "msg": "installed %s (%s)" % (spec, problem)}
    raise InstallFailed(*_roll_back(run, venv, before, source_args, failure))


def restore_snapshot(run, venv, wanted, source_args, keep=(), check_mode=False):
    """Make the venv's package set `wanted` again: uninstall what it lacks, reinstall what differs.

    Distributions named in `keep` (e.g. pip, bootstrapped into a venv that had none) are left as they
    are. Returns {"identical", "steps", "wanted" and "before" (both without `keep`), "undone" (the diff
    from `wanted` to `before`), "remaining_diff"}. With nothing to undo, or in check mode, pip is not run.
    """
    kept = set(canonical_name(name) for name in keep)

    def without_kept(packages):
        return dict((n, v) for n, v in packages.items() if n not in kept)

    wanted = without_kept(dict((canonical_name(n), str(v)) for n, v in wanted.items()))
    current = without_kept(snapshot(run, venv))
    uninstall, reinstall = rollback_plan(wanted, current)
    if check_mode or not (uninstall or reinstall):
        undone = snapshot_diff(wanted, current)
        return {"identical": current == wanted, "steps": [], "wanted": wanted, "before": current, "undone": undone,
                "remaining_diff": undone}
    steps = []
    pip = [venv_python(venv), "-m", "pip"]
    if uninstall:
        rc, out, err = run(pip + ["uninstall", "--yes", "--disable-pip-version-check"] + uninstall)
        steps.append({"cmd": "pip uninstall " + " ".join(uninstall), "rc": rc, "output": _tail(err or out, 1000)})
    if reinstall:
        rc, out, err = run(pip + ["install", "--no-deps", "--disable-pip-version-check", "--no-input"] + list(source_args) + reinstall)
        steps.append({"cmd": "pip install --no-deps " + " ".join(reinstall), "rc": rc, "output": _tail(err or out, 1000)})
    restored = without_kept(snapshot(run, venv))
    return {"identical": restored == wanted, "steps": steps, "wanted": wanted, "before": current,
            "undone": snapshot_diff(wanted, current),
            "remaining_diff": snapshot_diff(wanted, restored)}


def describe_diff(diff):
    """`a 1.0 -> 1.1, b (added) , c 2.0 (removed)`: a snapshot_diff for people, one change per package."""
    parts = ["%s %s -> %s" % (n, old, new) for n, (old, new) in sorted(diff["changed"].items())]
    parts += ["%s %s (added)" % (n, v) for n, v in sorted(diff["added"].items())]
    parts += ["%s %s (removed)" % (n, v) for n, v in sorted(diff["removed"].items())]
    return ", ".join(parts) or "no change"


def _roll_back(run, venv, before, source_args, failure):
    """Undo a failed attempt; return (message, result) for InstallFailed."""
    restore = restore_snapshot(run, venv, before, source_args)
    result = {"changed": False, "rolled_back": restore["identical"], "rollback_steps": restore["steps"],
              "attempted_diff": restore["undone"], "remaining_diff": restore["remaining_diff"]}
    undone = restore["undone"]
    if restore["identical"]:
        msg = "%s. Rolled back: the venv's packages are exactly as before (%d removed, %d reinstalled)." % (
            failure, len(undone["added"]), len(undone["removed"]) + len(undone["changed"]))
    else:
        result["changed"] = True
        msg = "%s. ROLLBACK INCOMPLETE, the venv differs from before: %s" % (
            failure, json.dumps(restore["remaining_diff"], sort_keys=True))
    return msg, result
