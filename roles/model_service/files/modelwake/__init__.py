"""modelwake on a managed host: the Type=notify launcher's package (standard library only, Python 3.9+).

The model_service role installs it under /opt/modelwake/lib/modelwake: this file, __main__.py, and the
collection's module_utils subpackages the launcher imports (common, host, readiness, launcher), which
use relative imports only, so they run under this name as they do under
ansible_collections.modelwake.serving.plugins.module_utils. It never imports ansible.
"""
