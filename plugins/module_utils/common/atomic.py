"""One way to replace a file on the host: a reader (the controller's cat, node_exporter's textfile
collector, the next run) never sees half of it, and a failed write leaves the file as it was.

The new content goes to a temporary file in the same directory (a rename is atomic only within one
filesystem), which is given its mode (and, by `prepare`, whatever else it needs) before it is renamed
over the target. On any error the temporary file is removed and the error raised.
"""
import os
import tempfile


def replace_file(path, data, mode=0o644, prepare=None):
    """Replace `path` by a complete new file holding `data` (str, written as UTF-8, or bytes).
    mode: its permission bits (None keeps mkstemp's 0600); prepare(temporary): called on the written
    file before the rename (an owner or a group to set). Raises OSError."""
    directory = os.path.dirname(path) or "."
    handle, temporary = tempfile.mkstemp(dir=directory, prefix=".%s." % os.path.basename(path), suffix=".tmp")
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(data.encode("utf-8") if isinstance(data, str) else data)
        if mode is not None:
            os.chmod(temporary, mode)
        if prepare is not None:
            prepare(temporary)
        os.replace(temporary, path)
    except BaseException:
        try:
            os.unlink(temporary)
        except OSError:
            pass
        raise
