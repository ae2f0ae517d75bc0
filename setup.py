"""Finds the packages and ships ``fedbalance_autoload.pth`` at the top of site-packages.

Everything else is in pyproject.toml. Packages are found under each source folder of
:data:`ROOTS` (``adapters/`` is installed as ``fl_adapters``), so a new subpackage ships
without an edit here. The ``.pth`` line arms the FedLab/FedML adapters when those packages are
imported; see ``adapters/autoload.py``.
"""

import os
import shutil

from setuptools import find_packages, setup
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

#: import name -> source folder
ROOTS = {
    "fl_checks": "fl_checks",
    "fl_aggregators": "fl_aggregators",
    "fl_partitions": "fl_partitions",
    "fl_adapters": "adapters",
    "fedbalance_benchmarks": "benchmarks",
}


def packages() -> list[str]:
    found = []
    for name, folder in ROOTS.items():
        found += [name, *(f"{name}.{sub}" for sub in find_packages(folder))]
    return found


setup(cmdclass=cmdclass, package_dir=ROOTS, packages=packages())
