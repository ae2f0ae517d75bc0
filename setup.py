"""Ships ``fedbalance_autoload.pth`` at the top of site-packages (wheel and editable installs).

Everything else is in pyproject.toml. The ``.pth`` line arms the FedLab/FedML adapters when
those packages are imported; see ``adapters/autoload.py``.
"""

import os
import shutil

from setuptools import setup
from setuptools.command.build_py import build_py

PTH = "fedbalance_autoload.pth"


class BuildPyWithPth(build_py):
    def run(self):
        super().run()
        self.copy_file(PTH, os.path.join(self.build_lib, PTH), preserve_mode=0)

    def get_outputs(self, *args, **kwargs):
        return [*super().get_outputs(*args, **kwargs), os.path.join(self.build_lib, PTH)]


cmdclass = {"build_py": BuildPyWithPth}
try:  # editable installs (pip install -e) build their wheel with editable_wheel
    from setuptools.command.editable_wheel import editable_wheel

    class EditableWheelWithPth(editable_wheel):
        def _run_build_commands(self, dist_name, unpacked_wheel, build_lib, tmp_dir):
            out = super()._run_build_commands(dist_name, unpacked_wheel, build_lib, tmp_dir)
            shutil.copy(PTH, os.path.join(unpacked_wheel, PTH))
            return out

    cmdclass["editable_wheel"] = EditableWheelWithPth
except ImportError:  # pragma: no cover - setuptools < 64
    pass

setup(cmdclass=cmdclass)
