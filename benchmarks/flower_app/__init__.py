"""fedbalance's Flower app: ServerApp and ClientApp on fedbalance's strategy and client helper.

``pyproject.toml`` beside this file makes the folder a Flower app (``flwr run
benchmarks/flower_app ...``); its components are this installed package's modules, so they
import fedbalance like any user's app would. Needs Flower's environment (``fedbalance[flower,
bench]``).
"""
