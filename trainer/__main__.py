"""``python -m trainer`` is the ``geartrain`` command."""

from trainer.cli.command import main

if __name__ == "__main__":
    main()
