"""The one exception hierarchy of modelwake: every clear, user-facing failure is a ModelWakeError, and
each module's main() maps it to fail_json (the launcher to its exit status). Subclasses live beside the
code that raises them (SystemdError, NvmlError, PyEnvError, NotifyError, ShardDamaged, completion_load's LoadError);
tests/unit/test_layout.py checks that no other exception class is defined."""


class ModelWakeError(Exception):
    """Base class: anything modelwake reports as a clear, user-facing failure."""


class InputError(ModelWakeError):
    """A module option is invalid. Raised before anything is observed, so nothing changed."""

    def __init__(self, field, message):
        self.field = field
        self.message = message
        super().__init__("%s: %s" % (field, message))
