"""``python -m tiermem``: the command line, as the ``tiermem`` script runs it."""

from tiermem.interfaces.cli import main

if __name__ == "__main__":  # importing the module (tools that walk packages) runs nothing
    main()
