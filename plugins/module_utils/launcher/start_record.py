"""The launcher's side of the start history (readiness/start_memory.py): it records every start of
its unit, from its beginning to its verdict, in the unit's state directory (--state-dir), and
resolves the `auto` budgets from the earlier ones before the engine starts."""
import argparse
import os
from importlib import metadata

from ..common.errors import ModelWakeError
from ..host import start_history
from ..readiness.config import AUTO
from ..readiness.history import usual_line
from ..readiness.phases import NOT_STARTED
from ..readiness.start_memory import StartMemory, resolve_budgets


def seconds_or_auto(text):
    """argparse type of --timeout and --stall-timeout: seconds, or auto."""
    if text == AUTO:
        return AUTO
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError("a number of seconds or auto, got %r" % text)


def installed_version(engine):
    """The engine's version as the launcher's own interpreter (the engine's venv) has it installed:
    no engine import, only its metadata. None for `auto` or a package this Python does not have."""
    if engine not in ("sglang", "vllm"):
        return None
    try:
        return metadata.version(engine)
    except metadata.PackageNotFoundError:
        return None


def launch_memory(options, config, environ):
    """(config with its auto budgets resolved, the StartMemory or None, the budgets' derivation or None).
    systemd gives the launcher its start's InvocationID in $INVOCATION_ID: the key of its record."""
    memory = None
    if options.state_dir and not options.no_start_history:
        if not os.path.isdir(options.state_dir):
            raise ModelWakeError("state-dir: %s is not a directory (StateDirectory= creates it)" % options.state_dir)
        # The role passes the version it read from the venv (--engine-version, the compile caches' key);
        # without it, the venv the launcher runs in says it.
        version = options.engine_version or installed_version(config.engine)
        memory = StartMemory(start_history.history_path(options.state_dir), options.name,
                             config.model_path or config.model, engine=config.engine, engine_version=version, model_bytes=config.expected_bytes,
                             gpus=config.gpus, writes="launcher")
        memory.invocation = environ.get("INVOCATION_ID") or None
    config, budgets = resolve_budgets(config, memory)
    return config, memory, budgets


def said_at_start(options):
    """What the launcher says once before the engine's first look: how the auto budgets were found,
    and what the earlier starts of this model let it expect of the whole start."""
    lines = [options.budgets] if getattr(options, "budgets", None) else []
    memory = getattr(options, "start_memory", None)
    if memory is not None and memory.usual:
        lines.append("earlier starts of this model (%d): %s"
                     % (len(memory.comparable), usual_line(memory.usual, NOT_STARTED, 0.0)))
    return lines
