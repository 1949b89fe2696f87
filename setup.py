"""Ships ``geartrain-excepthook.pth`` beside the packages (all other metadata is in pyproject.toml).

setuptools installs no ``.pth`` file of a project's own, so ``build_py`` copies it: into the wheel's
root for a normal build, into the editable wheel (``pip install -e``) beside its own ``.pth``.
"""

from __future__ import annotations

import os

from setuptools import setup
from setuptools.command.build_py import build_py

PTH = "geartrain-excepthook.pth"


class BuildPyWithPth(build_py):
    """``build_py``, plus the start-up line that names a user's file hiding a geartrain package."""

    def run(self) -> None:
        super().run()
        # An editable build installs from the unpacked wheel (`install_lib`); its build folder is thrown away.
        target = self.get_finalized_command("install").install_lib if self.editable_mode else self.build_lib
        self.copy_file(PTH, os.path.join(target, PTH), preserve_mode=False)


setup(cmdclass={"build_py": BuildPyWithPth})
