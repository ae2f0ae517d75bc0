"""fedbalance's Flower app: ServerApp and ClientApp on fedbalance's strategy and client helper.

``pyproject.toml`` beside this file makes the folder a Flower app (``flwr run
benchmarks/flower_app ...``); its components are this installed package's modules, so they
import fedbalance like any user's app would. Needs Flower's environment (``fedbalance[flower,
bench]``).
"""

#: How the simulation's engine finds the messages for its virtual nodes (``simulate``):
#: ``index`` (fedbalance's, one scan of the stored messages a pass, the default) or ``flower``
#: (Flower's, one query per node). Here, not in ``simulate``: read without flwr installed.
POLLING_ENV, POLLING = "FEDBALANCE_FLOWER_POLLING", ("index", "flower")
