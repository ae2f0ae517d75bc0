"""The run lifecycle every host shares, written once.

* :mod:`~fl_adapters.run.directory`: the run directory (``--out``): claiming it, refusing a
  restart that would lose records, and its files (``metrics.jsonl``, ``summary.json``, the
  aggregation record, the checkpoint).
* :mod:`~fl_adapters.run.processes`: starting a run's processes with their logs, watching them
  (one dies or the deadline passes: every one stops), and keeping them on loopback.
* :mod:`~fl_adapters.run.lifecycle`: the steps around a host's own loop: the default deadline,
  the one wording of a run that stopped, and the rows and summary every host writes.

A host supplies only how its processes (or in-process loop) start and how its rows are read.
"""
