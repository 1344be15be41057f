"""The integration tests: real processes, the simulated engine, real venvs, Ansible and systemd test hosts."""
