#!/usr/bin/python
# Copyright: (c) modelwake contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Check a model directory and measure how fast this host reads it (GPU preflight)."""
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: model_dir_facts
short_description: Check that a model directory is whole and measure the disk's read rate
description:
  - Checks that the directory exists, that C(config.json) and C(model.safetensors.index.json)
    parse, that every shard the index names (without an index, every C(*.safetensors)) is present,
    and that each shard is whole - its header's length prefix and JSON are valid, every tensor's
    C(data_offsets) match its dtype and shape and cover the data back to back up to the file's end,
    the last MiB of its data is not all zeros (a preallocated, never written download), and it
    holds every tensor the index maps to it - then sums the shards' sizes.
  - Reads headers and at most 1 MiB of each shard's data, so a 548 GB model takes seconds.
  - With I(verify_checksums), also hashes every shard that has a published SHA-256 in the directory
    (a C(SHA256SUMS) file, or the C(.cache/huggingface/download/*.metadata) a Hugging Face download
    leaves) and refuses a mismatch. A verified shard is remembered by size and mtime in
    I(state_dir), so an unchanged copy is hashed once.
  - Measures the cold sequential read rate of the model's own shards where they live - up to
    I(read_sample_mib) in all, for at most I(read_seconds), with I(read_readers) parallel readers
    as a fast loader reads - after dropping the sample from the page cache with
    C(posix_fadvise(DONTNEED)) and checking with C(mincore) that it is out; the expected load time
    comes from that rate. A sample that stayed cached (dirty pages of files written moments ago, or
    mapped by a running process) is reported as warm and gives no expected load time.
  - A cold rate is remembered in I(state_dir) with the shards' names, sizes and mtimes. For
    I(read_rate_max_age_hours) a later run on the same copy reports it (C(read_how) says how old it
    is) and reads nothing, so a re-run neither waits for the sample nor drops it from the page cache.
    The record is a cache of a measurement, not a change of the host, and is never reported as C(changed).
  - Also reports MemAvailable against the model's size and how much of the model the page cache holds.
  - Never writes the model; it writes only its records (verified shards, the last cold rate) in I(state_dir).
options:
  path:
    description: Absolute path of the model directory.
    type: path
    required: true
  read_sample_mib:
    description: MiB of the shards to read for the rate measurement; 0 skips it.
    type: int
    default: 2048
  read_readers:
    description: Parallel readers of the rate measurement, each on its own shard or range.
    type: int
    default: 4
  read_seconds:
    description: At most this many seconds of reading for the rate measurement.
    type: float
    default: 10
  read_rate_max_age_hours:
    description:
      - How long a cold rate measured on the same shards stands for a new measurement; 0 measures every run.
    type: float
    default: 24
  verify_checksums:
    description:
      - Hash every shard that has a published SHA-256 and refuse a mismatch (reads the whole model once).
      - Without any published sum in the directory it warns and checks the headers only.
    type: bool
    default: false
  state_dir:
    description: Host directory of the records of verified shards and of the last cold rate (never inside the model directory).
    type: path
    default: /var/lib/modelwake/model-checks
author: modelwake contributors (@modelwake)
notes:
  - Supports check mode (no record is written then).
"""

EXAMPLES = r"""
- name: Check the model and measure the read rate
  modelwake.serving.model_dir_facts:
    path: /root/models/Kimi-K2.6
    read_sample_mib: 2048
  register: gpu_preflight_model
"""

RETURN = r"""
shard_count:
  description: Shards the index names (or *.safetensors files without an index).
  returned: always
  type: int
missing:
  description: Shards named in the index that are not in the directory.
  returned: always
  type: list
  elements: str
damaged:
  description: Shards that are present but not whole, each with the reason ({name, reason}).
  returned: always
  type: list
  elements: dict
problems:
  description: Readable problems, one per missing set or damaged shard (the shard's name, then why); empty when the directory is whole.
  returned: always
  type: list
  elements: str
total_bytes:
  description: Sum of the shards' sizes.
  returned: always
  type: int
index_total_size:
  description: The index's metadata.total_size, when it has one.
  returned: always
  type: int
checksums:
  description:
    - With I(verify_checksums) - C(source) of the sums (C(SHA256SUMS) or the Hugging Face metadata,
      null when none), shards C(checked) now, C(remembered) from an earlier verification,
      C(unverified) (no published sum) and C(mismatched) ({name, reason}).
  returned: when verify_checksums
  type: dict
read_bytes:
  description: Bytes read for the measurement.
  returned: always
  type: int
read_seconds:
  description: Seconds the measured read took.
  returned: always
  type: float
read_rate_mib:
  description: Measured read rate in MiB/s, cold or warm (null when not measured).
  returned: always
  type: float
read_readers:
  description: Parallel readers the measurement used.
  returned: always
  type: int
read_cold:
  description: Whether the sample was out of the page cache before the read (checked with mincore); null when not measured.
  returned: always
  type: bool
read_how:
  description:
    - How the sample was made cold, or why it was not (the rate is then the cache's).
    - "C(remembered: read cold 2h03m ago) when an earlier run's cold rate of the same shards stands for it."
  returned: always
  type: str
disk_rate_bytes_per_s:
  description: The disk's cold read rate in bytes/s (null when not measured or warm); the wait compares the load with it.
  returned: always
  type: int
mem_available_bytes:
  description: The host's MemAvailable.
  returned: always
  type: int
mem_holds_model:
  description: MemAvailable divided by the model's size (null for an empty model).
  returned: always
  type: float
page_cache_fraction:
  description: Share of the shards the page cache held before the measurement (mincore; null when it cannot tell).
  returned: always
  type: float
summary:
  description: The figures in one line (size, the disk's rate cold or warm, expected load, memory, page cache).
  returned: always
  type: str
expected_load_seconds:
  description: total_bytes at the measured cold rate (null when not measured or warm).
  returned: always
  type: float
expected_load:
  description: expected_load_seconds, readable (e.g. 16m05s).
  returned: always
  type: str
"""

import os
import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.modelwake.serving.plugins.module_utils.common.errors import InputError
from ansible_collections.modelwake.serving.plugins.module_utils.common.units import MIB
from ansible_collections.modelwake.serving.plugins.module_utils.preflight import checksums
from ansible_collections.modelwake.serving.plugins.module_utils.preflight.modeldir import (
    inspect, problems, remember_rate, remembered_rate, storage_figures, storage_summary)


ARGUMENT_SPEC = {
    "path": {"type": "path", "required": True},
    "read_sample_mib": {"type": "int", "default": 2048},
    "read_readers": {"type": "int", "default": 4},
    "read_seconds": {"type": "float", "default": 10},
    "verify_checksums": {"type": "bool", "default": False},
    "state_dir": {"type": "path", "default": "/var/lib/modelwake/model-checks"},
    "read_rate_max_age_hours": {"type": "float", "default": 24},
}


def main():
    module = AnsibleModule(
        argument_spec=ARGUMENT_SPEC,
        supports_check_mode=True,
    )
    path = module.params["path"]
    sample_mib = module.params["read_sample_mib"]
    if not os.path.isabs(path):
        module.fail_json(msg="path must be absolute, got %r" % path)
    if sample_mib < 0:
        module.fail_json(msg="read_sample_mib must be 0 or more, got %d" % sample_mib)
    if module.params["read_readers"] < 1 or module.params["read_seconds"] <= 0:
        module.fail_json(msg="read_readers must be 1 or more and read_seconds more than 0, got %d and %s"
                         % (module.params["read_readers"], module.params["read_seconds"]))
    try:
        found = inspect(path)
    except InputError as exc:
        module.fail_json(msg=str(exc))
    result = dict(found, problems=problems(found))
    result.pop("shards")
    changed = False
    if module.params["verify_checksums"] and not result["problems"]:
        names = [shard["name"] for shard in found["shards"]]
        state_dir = module.params["state_dir"]
        if module.check_mode:
            state_dir = os.path.join(module.tmpdir, "model-checks")
        try:
            verified = checksums.verify(path, names, state_dir)
        except InputError as exc:
            module.fail_json(msg=str(exc))
        changed = verified.pop("recorded") and not module.check_mode
        result["checksums"] = verified
        result["problems"] += ["%s: %s" % (m["name"], m["reason"]) for m in verified["mismatched"]]
        if verified["source"] is None:
            module.warn("verify_checksums: %s has no SHA256SUMS and no Hugging Face download metadata: "
                        "only the shards' headers were checked" % path)
    # A damaged model is refused anyway: its rate is not worth the reading.
    sample_bytes = sample_mib * MIB if not result["problems"] else 0
    now = time.time()
    remembered = None
    if sample_bytes:
        remembered = remembered_rate(module.params["state_dir"], path, found,
                                     module.params["read_rate_max_age_hours"] * 3600, now)
    figures = storage_figures(path, found, sample_bytes, readers=module.params["read_readers"],
                              max_seconds=module.params["read_seconds"], remembered=remembered)
    if sample_bytes and remembered is None and module.params["read_rate_max_age_hours"] > 0 and not module.check_mode:
        try:
            remember_rate(module.params["state_dir"], path, found, figures, now)
        except OSError as exc:
            module.warn("the cold read rate could not be remembered in %s (%s): the next run measures it again"
                        % (module.params["state_dir"], exc))
    result.update(figures)
    result["summary"] = storage_summary(path, result)
    module.exit_json(changed=changed, **result)


if __name__ == "__main__":
    main()
