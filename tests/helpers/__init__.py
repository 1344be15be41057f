"""What the tests (and the bench) share: the repository's paths, a free loopback port, and the wait
for a condition up to a deadline. Each helper is written here once and imported where it is used,
in the way community.general keeps tests/unit/plugins/modules/utils.py.

Standard library only, so that any test or bench/ script can import it. The heavier helpers are
modules of this package, imported by name (each says what it needs):

- modules: AnsibleModule's exits patched into exceptions, to run a module's main() in-process;
- traces: replayed snapshot traces for the classifier, the waiter and the launcher;
- fakes: the fake NVML calls (tests/fakes/nvml_api.py), a fresh copy per test;
- launcher_package: the launcher laid out as the model_service role installs it;
- notify_listener: a real sd_notify receiver;
- simharness: the simulated engine as a real process;
- forked_server: a real server whose port a forked worker serves, not the process started;
- guesthost: a systemd test host and playbook runs against it;
- podman_guest: Podman on a test host and the simulated engine's image for it;
- envkit: small wheels, venvs and playbook runs for the inference_env tests;
- realengine: the pytest fixture of the real vLLM CPU build's venv.
"""
from tests.helpers.network import free_port
from tests.helpers.paths import (ANSIBLE, ANSIBLE_PLAYBOOK, FAKES, FIXTURES, ROOT, SIM_PATH, SIM_WHEELS, TESTHOSTS,
                                 TOOLS, VENV_BIN)
from tests.helpers.waiting import poll, until

__all__ = ["ANSIBLE", "ANSIBLE_PLAYBOOK", "FAKES", "FIXTURES", "ROOT", "SIM_PATH", "SIM_WHEELS", "TESTHOSTS", "TOOLS", "VENV_BIN",
           "free_port", "poll", "until"]
