"""``python -m physjax``: the ``physjax`` command, for an environment whose scripts folder
is not on ``PATH`` (or to pick the interpreter explicitly)."""

from .cli import run_command

if __name__ == "__main__":
    run_command()
