"""modelwake: phase-aware readiness of large-model inference servers (standard library only).

Runs on the managed host's Python (3.9+). Imported by the `wait_for_model_ready` module as
`ansible.module_utils.modelwake.<mod>` and, with `module_utils/` on sys.path, as `modelwake.<mod>`;
it never imports ansible.
"""
