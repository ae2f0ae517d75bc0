"""A FedML 0.9.6 deployment written the way FedML's examples are; it never imports fedbalance.

    python main.py --cf sp.yaml                                              # sp simulation
    mpirun --allow-run-as-root --oversubscribe -np 3 python main.py --cf mpi.yaml         # MPI simulation
    mpirun --allow-run-as-root --oversubscribe -np 3 python main.py --cf cross_silo.yaml  # cross-silo
    python main.py --cf cross_silo_grpc.yaml --rank 0 --role server   # cross-silo over gRPC: the
    python main.py --cf cross_silo_grpc.yaml --rank 1 --role client   # server and each silo, one
    python main.py --cf cross_silo_grpc.yaml --rank 2 --role client   # process each (grpc_ipconfig.csv)

With fedbalance installed, ``aggregator: fedloss`` in the YAML is all it takes.
"""

import data
import fedml
from fedml import FedMLRunner

if __name__ == "__main__":
    args = fedml.init()
    device = fedml.device.get_device(args)
    dataset, output_dim = data.load(args)
    model = data.model(args, output_dim)
    FedMLRunner(args, device, dataset, model).run()
