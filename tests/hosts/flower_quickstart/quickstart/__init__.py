"""quickstart: a Flower / PyTorch app, as `flwr new` makes one."""
