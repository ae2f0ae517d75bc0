"""The aggregation audit log: one JSON line per aggregation when ``FEDBALANCE_RECORD`` is set.

Every host adapter records through :func:`record`, so a user audits what ran the same way in
FedLab, FedML, Flower or plain Python::

    FEDBALANCE_RECORD=/tmp/agg.jsonl fedbalance run config.yaml

``fedbalance run`` also keeps the run's own copy, ``--out/aggregations.jsonl``, on every host
(it sets ``FEDBALANCE_RUN_RECORD``, which its processes inherit): the user's file and the run's
receive the same lines.

Each line: ``{"host", "round", "aggregator", "clients", "num_samples", "metrics", "weights",
"rejected", "skipped", "elapsed_s", "aggregate_s"}`` plus aggregator-specific keys (e.g.
Astraea's ``mediators``). Weights are the ones applied, after any bounding, and sum to 1 over
accepted clients. ``elapsed_s`` (seconds since the aggregator was made) and ``aggregate_s``
(seconds this aggregation took) are wall times: no two runs share them.
"""

from __future__ import annotations

import json
import logging
import math
import os
from typing import Any

from fl_checks import ParameterError

log = logging.getLogger(__name__)
ENV = "FEDBALANCE_RECORD"
#: The run directory's copy of the record, set by ``fedbalance run`` (not for users to set).
RUN_ENV = "FEDBALANCE_RUN_RECORD"


def jsonable(value: Any) -> Any:
    """``value`` as JSON can hold it, the same in every record fedbalance writes (the
    aggregation record, ``metrics.jsonl``, ``summary.json``): a non-finite float is ``null``
    (JSON has no NaN or infinity), a 0-d tensor or numpy scalar its number, anything else
    unknown its ``str``."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if hasattr(value, "item") and callable(value.item):
        return jsonable(value.item())
    if isinstance(value, (int, str, bool)) or value is None:
        return value
    return str(value)


def check_target(path: str | None = None, env: str = ENV) -> None:
    """Refuse, before any training, a record path (by default the one in ``env``) that cannot
    hold the record: not a regular file (``/dev/full``, a directory) or not writable. A
    ``ValueError`` names it."""
    path = path or os.environ.get(env)
    if not path:
        return
    if os.path.exists(path) and not os.path.isfile(path):
        raise ParameterError(f"{env}={path} is not a regular file")
    try:
        with open(path, "a", encoding="utf-8"):
            pass
    except OSError as e:
        raise ParameterError(f"{env}={path} cannot be written ({e.strerror or e})") from None


_failed: set[str] = set()


def targets() -> list[str]:
    """Where records go: ``$FEDBALANCE_RECORD`` and the run's ``$FEDBALANCE_RUN_RECORD``."""
    paths = [os.environ.get(ENV), os.environ.get(RUN_ENV)]
    found = [p for p in paths if p]
    if len(found) == 2 and os.path.abspath(found[0]) == os.path.abspath(found[1]):
        return found[:1]
    return found


def record(entry: dict[str, Any], path: str | None = None) -> None:
    """Append ``entry`` as one JSON line to ``path``, or to each of :func:`targets`.

    A write that fails (a full disk) is logged once per path and the run goes on: the
    aggregation, the model and the host's checkpoint do not depend on the audit log.
    """
    paths = [path] if path else targets()
    if not paths:
        return
    line = json.dumps(jsonable(entry), allow_nan=False)
    for target in paths:
        # One write call per line, opened in append mode: lines from several processes
        # (FedLab cross-process, MPI ranks) do not interleave within a line.
        try:
            with open(target, "a", encoding="utf-8") as fh:
                fh.write(line + "\n")
        except OSError as e:
            if target not in _failed:
                _failed.add(target)
                log.error("aggregation record not written to %s (%s); the run goes on", target, e)
