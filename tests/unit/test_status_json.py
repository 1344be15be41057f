"""playbooks/status.yml's JSON document and python -m modelwake_runner's status verdicts say the same
things by the same names: every key a runner verdict carries is a key of the document's objects,
and both take them from wait_for_model_ready's documented result."""
import os

import yaml

from ansible_collections.modelwake.serving.plugins.modules import wait_for_model_ready
from modelwake_runner.events import LOOK_KEYS, VERDICT_KEYS

from tests.helpers import ROOT


def status_keys():
    with open(os.path.join(ROOT, "playbooks", "status.yml")) as handle:
        play = yaml.safe_load(handle)[0]
    return play["vars"]["_modelwake_status_keys"]


def test_the_document_holds_every_key_of_the_runners_verdicts():
    assert set(VERDICT_KEYS) <= set(status_keys())


def test_the_document_holds_only_documented_result_keys_and_never_the_invocation():
    documented = set(yaml.safe_load(wait_for_model_ready.RETURN)) | {"unit"}  # unit: the action plugin's
    keys = set(status_keys())
    assert keys <= documented, keys - documented
    assert "invocation" not in keys and "api_key" not in keys
    # What a look knows of the load, as a runner progress event names it.
    assert set(LOOK_KEYS) - {"log_line"} <= keys, set(LOOK_KEYS) - keys
