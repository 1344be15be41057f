"""Shared pytest set-up: make the project's pure-Python code importable without Ansible.

module_utils/modelwake is written to run on a managed host with the standard library alone, so the
unit tests import it directly from the source tree.
"""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "module_utils"))
sys.path.insert(0, os.path.join(ROOT, "library"))
