"""`python -m modelwake launch [options] -- <engine command>`: the Type=notify launcher.

The package runs from a plain directory on the managed host (the model_service role copies it
to /opt/modelwake/lib/modelwake and sets PYTHONPATH): standard library only, Python 3.9+.
"""
import sys

USAGE = "usage: python -m modelwake launch [options] -- <engine command> (launch --help for the options)"


def main(argv):
    if argv[:1] != ["launch"]:
        sys.stderr.write(USAGE + "\n")
        return 2
    from .launcher.launch import main as launch  # only what the command needs is imported

    return launch(argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
