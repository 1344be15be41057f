"""Exceptions of the readiness logic; the module's main() maps them to fail_json."""


class ModelWakeError(Exception):
    """Base class: anything the readiness logic reports as a clear, user-facing failure."""


class InputError(ModelWakeError):
    """A module option is invalid. Raised before anything is observed, so nothing changed."""

    def __init__(self, field, message):
        self.field = field
        self.message = message
        super().__init__("%s: %s" % (field, message))
