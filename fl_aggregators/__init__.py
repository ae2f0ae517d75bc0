"""Server-side aggregation for federated learning (torch; no FL framework imported)."""

BUILTIN_AGGREGATORS: tuple[type, ...] = ()

__all__ = ["BUILTIN_AGGREGATORS"]
