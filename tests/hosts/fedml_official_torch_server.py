"""Shaped like FedML 0.9.6's cross-silo ``custom_data_and_model/torch_server.py``, launched as its
``run_server.sh`` does: ``python torch_server.py --cf CFG --rank 0`` (no ``--role``: FedML's
server never reads it). Data come from the example's offline loader instead of FedML's
download; nothing else differs, and nothing here names fedbalance."""

import sys
from pathlib import Path

import fedml
from fedml.cross_silo import Server

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "adapters" / "fedml" / "example"))
import data  # noqa: E402  (the example's offline data module)

if __name__ == "__main__":
    args = fedml.init()
    device = fedml.device.get_device(args)
    dataset, output_dim = data.load(args)
    model = data.model(args, output_dim)
    Server(args, device, dataset, model).run()
