"""modelwake as a program: the project's playbooks run through ansible-runner, with their events as
JSON lines (`python -m modelwake_runner deploy|status|stop`, modelwake_runner/cli.py).

Controller side only, and not part of the collection (galaxy.yml leaves it out): it runs this
checkout's playbooks. Not named `modelwake`: that is the launcher's package on the managed hosts
(`python -m modelwake launch`, roles/model_service/files/modelwake/), which the launcher's tests run
from this checkout. The events it writes are made from ansible-runner's in modelwake_runner/events.py.
"""
