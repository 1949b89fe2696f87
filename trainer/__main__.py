"""``python -m trainer`` is the ``geartrain`` command."""

from trainer.cli.app import main

if __name__ == "__main__":
    main()
