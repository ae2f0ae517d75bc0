"""The example FedML host's ``__main__`` (``adapters/fedml/example/main.py``) as a function, for
the test hosts that add a line around it. Import it after anything that must precede
``import fedml``."""

import sys
from pathlib import Path
from typing import Any

import fedml
from fedml import FedMLRunner

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "adapters" / "fedml" / "example"))
import data  # noqa: E402  (the example's data module)


def run_example() -> tuple[Any, Any]:
    """Run the example as its ``main.py`` does; ``(args, model)`` afterwards."""
    args = fedml.init()
    device = fedml.device.get_device(args)
    dataset, output_dim = data.load(args)
    model = data.model(args, output_dim)
    FedMLRunner(args, device, dataset, model).run()
    return args, model
