"""Unit-test set-up: let `ansible.module_utils.modelwake` resolve to this repo's module_utils.

At run time Ansible's module_utils finder ships module_utils/modelwake with the module; here
the same import path is made to work by adding the repo's module_utils to the package path.
"""
import os

try:
    import ansible.module_utils
except ImportError:  # the module_utils tests also run on a bare Python 3.9 (managed-host compatibility)
    ansible = None

MODULE_UTILS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "module_utils")
if ansible is not None and MODULE_UTILS not in ansible.module_utils.__path__:
    ansible.module_utils.__path__.append(MODULE_UTILS)
