"""Builds every server handler and client trainer class FedLab 1.3.0 ships, and prints which
ones the running process accepts and which it refuses, as a JSON object (class -> "ok" or
"refused: <message>") written to the file named by its argument. Run with and without
``FEDBALANCE_AGGREGATOR``."""

import importlib
import inspect
import json
import pkgutil
import sys

import fedlab.contrib.algorithm as alg
import torch
from fedlab.core.client.trainer import ClientTrainer, SerialClientTrainer
from fedlab.core.server.handler import ServerHandler

model = torch.nn.Linear(4, 2)
out = {}
for m in pkgutil.iter_modules(alg.__path__):
    try:
        mod = importlib.import_module(f"fedlab.contrib.algorithm.{m.name}")
    except Exception as e:
        out[m.name] = f"import failed: {e}"
        continue
    for n, cls in vars(mod).items():
        if not inspect.isclass(cls) or cls.__module__ != mod.__name__:
            continue
        if issubclass(cls, ServerHandler):
            args = (model, 2, 0.5)
        elif issubclass(cls, SerialClientTrainer):
            args = (model, 4)
        elif issubclass(cls, ClientTrainer):
            args = (model,)
        else:
            continue
        try:
            cls(*args)
            out[f"{m.name}.{n}"] = "ok"
        except ValueError as e:
            if "cannot take effect" not in str(e):  # FedLab's own error, not a refusal
                raise
            out[f"{m.name}.{n}"] = "refused: " + str(e)
        except Exception as e:
            out[f"{m.name}.{n}"] = f"other {type(e).__name__}: {e}"
with open(sys.argv[1], "w") as fh:
    json.dump(out, fh, indent=1)
