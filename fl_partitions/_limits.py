"""Upper limits that keep every partition's work bounded, and the checks that enforce them.

Every partitioner parameter that scales the work (retries, classes, clients, components)
has a documented ceiling, so no input can make a partition run for minutes or exhaust
memory: a value above it is a ``ParameterError`` naming the parameter, the allowed range and
the value received. The ceilings sit well above what any experiment of this project uses;
with them, a partition of up to 10^6 labels takes at most a few seconds whatever the
parameters (the slowest case found, a full 10^7-cell count matrix at beta < 0.1, about 2 s
on a shared 2-core machine; ``tests/test_bounds.py`` runs the worst cases).

Redraws for a minimum client size are bounded twice: by ``max_tries`` (at most
:data:`MAX_TRIES`) and by a work budget counted in Dirichlet components drawn
(:func:`redraw_limit`), after which the constructive top-up takes over. The budget counts
draws, not seconds, so a seed gives the same partition on every machine.
"""

from __future__ import annotations

#: Largest number of classes (labels are class ids below it). Per-class steps are Python
#: loops; 10^4 covers ImageNet-1k and iNaturalist 2021's 10,000 species.
MAX_CLASSES = 10_000
#: Largest number of clients. Per-client steps (local splits, label_quantity's class choice)
#: are Python loops over the clients, each drawing from one random stream in order.
MAX_CLIENTS = 10_000
#: Largest clients x classes count matrix (a partition stores it: 80 MB of int64 at most).
MAX_CELLS = 10_000_000
#: Largest ``max_tries`` of a redraw loop.
MAX_TRIES = 1000
#: Redraw work allowed, in Dirichlet components drawn; see :func:`redraw_limit`. A component
#: costs 15-100 ns (beta below 0.1 draws beta variates, the slowest), so this is < 1 s.
REDRAW_BUDGET = 1 << 23
#: What one Dirichlet draw costs beyond its components: the Python step around it (~20 us
#: per class), in components.
DRAW_OVERHEAD = 256


def redraw_limit(max_tries: int, draws_per_try: int, components: int) -> int:
    """How many times a redraw loop may draw: ``max_tries``, less if the budget runs out.

    One try makes ``draws_per_try`` Dirichlet draws of ``components`` components each. The
    loop stops once ``tries x draws_per_try x (components + DRAW_OVERHEAD)`` would exceed
    :data:`REDRAW_BUDGET`, but always draws at least once. For 10 classes the budget allows
    the default 100 tries up to 8,000 clients, so results of common sizes are exactly those
    of an unbudgeted loop.
    """
    per_try = max(draws_per_try, 1) * (components + DRAW_OVERHEAD)
    return max(1, min(max_tries, REDRAW_BUDGET // per_try))
