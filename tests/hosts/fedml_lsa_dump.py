"""FedML's cross-silo example under LightSecAgg, keeping what the test compares (test only).

Each client saves the model it trained (before scaling and masking) as
``$FEDBALANCE_DUMP/r{round}_c{rank}.pt`` and a digest of its mask as ``r{round}_c{rank}.mask``;
the server saves each round's unmasked result as ``r{round}_server.pt``. With
``FEDBALANCE_BAD_LOSS=[ROUND@]RANK:JSON`` (e.g. ``1:"text"``, ``2@1:NaN``, ``1:[1, 2]``) silo RANK
sends that value as its validation loss in the clear phase (in round ROUND, else every round);
with ``FEDBALANCE_INFLATE=[ROUND@]RANK:FACTOR`` silo RANK multiplies the model it masks by
FACTOR. The hooks are installed before ``import fedml`` arms fedbalance.
"""

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import torch

from fl_adapters.fedml import secure

OUT = Path(os.environ["FEDBALANCE_DUMP"])
_train, _reconstruct = secure.client_train, secure.reconstruct


def switch(name: str, silo: Any) -> str | None:
    """The value of test switch ``name`` (``[ROUND@]RANK:VALUE``) for this silo this round."""
    when, _, rest = os.environ.get(name, "").rpartition("@")
    rank, _, value = rest.partition(":")
    if not rank or int(rank) != silo.get_sender_id():
        return None
    return value if not when or int(when) == silo.round_idx + 1 else None


def client_train(self: Any, original: Any) -> Any:
    bad = switch("FEDBALANCE_BAD_LOSS", self)
    if bad is not None:
        send = self.send_message

        def send_bad(msg: Any) -> None:
            msg.add_params(secure.KEY_METRICS["val_loss"], json.loads(bad))
            send(msg)

        self.send_message = send_bad  # this call's clear-phase message only
        try:
            _train(self, original)
        finally:
            del self.send_message
    else:
        _train(self, original)
    factor = switch("FEDBALANCE_INFLATE", self)
    if factor is not None:
        model, n = self._fedbalance_trained
        self._fedbalance_trained = ({k: v * float(factor) for k, v in model.items()}, n)
    model = self._fedbalance_trained[0]
    name = f"r{self.round_idx + 1}_c{self.get_sender_id()}"
    torch.save(dict(model), OUT / f"{name}.pt")
    (OUT / f"{name}.mask").write_text(hashlib.sha256(self.local_mask.tobytes()).hexdigest())


def reconstruct(self: Any, original: Any, *a: Any) -> Any:
    params = _reconstruct(self, original, *a)
    rounds = len(list(OUT.glob("r*_server.pt")))
    torch.save(dict(params), OUT / f"r{rounds + 1}_server.pt")
    return params


swap = {secure.client_train: client_train, secure.reconstruct: reconstruct}
secure.TARGETS = tuple((m, c, meth, swap.get(r, r)) for m, c, meth, r in secure.TARGETS)

# Importing the example imports fedml, which arms fedbalance with the hooks above.
from fedml_example_run import run_example  # noqa: E402

if __name__ == "__main__":
    run_example()
