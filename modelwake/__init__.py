"""modelwake as a program: the project's playbooks run through ansible-runner, with their events as
JSON lines (`python -m modelwake deploy|status|stop`, modelwake/cli.py).

Controller side only, and not part of the collection (galaxy.yml leaves it out): it runs this
checkout's playbooks. The events it writes are made from ansible-runner's in modelwake/events.py.
"""
