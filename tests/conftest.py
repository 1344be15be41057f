"""Shared pytest set-up: import the collection from the checkout, without installing it.

The repository is the modelwake.serving collection: ansible_collections/modelwake/serving links back
to its root, so with the root on sys.path `ansible_collections.modelwake.serving.plugins...` imports
the source tree (plain namespace packages: no Ansible needed, as on a managed host).
"""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
