"""Byte units, defined once: sizes are counted in bytes and shown or compared in MiB and GiB."""

MIB = 1024 * 1024
GIB = 1024 * MIB
