"""``flower-superlink`` with its Control API closed to every caller but the run's own.

Flower's open-source SuperLink (1.41, 1.42) authenticates Control API callers only with the
OIDC plugin of Flower Enterprise; without it every request is served as the one anonymous
account (``NoOpControlAuthnPlugin``), so any process that reaches the port may start a run of
its own app on the deployment's SuperNodes, register a SuperNode key of its own, stop the run or
read its logs. A TLS server certificate does not change that: it authenticates the server, not
the caller.

``python -m fl_adapters.flower.superlink TOKEN_FILE [flower-superlink arguments]`` runs Flower's
own ``flower-superlink`` with :class:`RunTokenAuthn` as its Control API authentication plugin:
a request is served only if it carries the run's token as a bearer token, and the account it
is served as is the anonymous one every other part of the open-source SuperLink expects. The
``flwr`` command sends the token it finds in its credential store (``$FLWR_HOME/
credentials.yaml``, written by the runner with mode 0600) for a connection whose
authentication type is ``oidc``: the mechanism Flower's CLI uses after ``flwr login``, no
change to it. The Fleet API (SuperNodes, authenticated by their keys) and the Runtime API
(the SuperLink's own ``flower-superexec``) are not Control routes and are left as they are.

Flower loads the plugin through ``load_control_authn_plugin`` in ``flwr.superlink.cli.
flower_superlink``; if a Flower release moves it, this refuses to start rather than start open.
"""

from __future__ import annotations

import base64
import hmac
import importlib
import sys
from collections.abc import Sequence
from pathlib import Path

import yaml
from flwr.common.constant import ACCESS_TOKEN_KEY, NOOP_ACCOUNT_NAME, NOOP_FLWR_AID
from flwr.supercore.auth.typing import (
    AccountAuthCredentials,
    AccountAuthLoginDetails,
    AccountInfo,
)
from flwr.supercore.error import ApiErrorCode, FlowerError
from flwr.superlink.auth_plugin import ControlAuthnPlugin

from fl_adapters.flower.pki import write_private

#: The ``flwr`` CLI's authentication type that sends a stored bearer token (its OIDC plugin).
CLI_AUTHN_TYPE = "oidc"
#: The ``flwr`` CLI's credential-store keys for a connection (``flwr.cli.constant``).
STORE_KEYS = {
    "authn-type": "flower.account-auth.%s.authn-type",
    "access": "flower.account-auth.%s.oidc-access-token",
    "refresh": "flower.account-auth.%s.oidc-refresh-token",
}


class RunTokenAuthn(ControlAuthnPlugin):
    """Serve a Control API request only when its bearer token is the run's ``token``."""

    def __init__(self, token: str = "") -> None:
        if len(token) < 16:
            raise ValueError("the Control API token must have at least 16 characters")
        self._token = token.encode()

    def get_login_details(self) -> AccountAuthLoginDetails | None:
        return None  # no login: the token is handed out by the runner, not obtained

    def validate_tokens_in_metadata(
        self, metadata: Sequence[tuple[str, str | bytes]]
    ) -> tuple[bool, AccountInfo | None]:
        tokens = [v for k, v in metadata if k == ACCESS_TOKEN_KEY]
        if len(tokens) != 1:
            return False, None
        given = tokens[0].encode() if isinstance(tokens[0], str) else tokens[0]
        if not hmac.compare_digest(given, self._token):
            return False, None
        return True, AccountInfo(flwr_aid=NOOP_FLWR_AID, account_name=NOOP_ACCOUNT_NAME)

    def get_auth_tokens(self, device_code: str) -> AccountAuthCredentials | None:
        raise FlowerError(ApiErrorCode.NO_ACCOUNT_AUTH, "this SuperLink hands out no tokens")

    def refresh_tokens(
        self, metadata: Sequence[tuple[str, str | bytes]]
    ) -> tuple[Sequence[tuple[str, str | bytes]] | None, AccountInfo | None]:
        return None, None  # a refused token stays refused


def write_cli_credentials(flwr_home: Path, address: str, token: str) -> Path:
    """Store ``token`` for the SuperLink at ``address`` in the ``flwr`` CLI's credential store
    under ``flwr_home`` (mode 0600), as ``flwr login`` would: every ``flwr`` command run with
    that ``FLWR_HOME`` then sends it."""
    encoded = {
        STORE_KEYS["authn-type"] % address: CLI_AUTHN_TYPE,
        STORE_KEYS["access"] % address: token,
        # The CLI sends a request only with both tokens stored; the SuperLink refreshes none.
        STORE_KEYS["refresh"] % address: "none",
    }
    path = flwr_home / "credentials.yaml"
    write_private(
        path,
        yaml.safe_dump(
            {k: base64.b64encode(v.encode()).decode("ascii") for k, v in encoded.items()}
        ).encode(),
    )
    return path


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if not args:
        sys.exit("usage: python -m fl_adapters.flower.superlink TOKEN_FILE [flower-superlink args]")
    token = Path(args[0]).read_text(encoding="ascii").strip()
    plugin = RunTokenAuthn(token)
    # The module (the package's name of the same spelling is its function)
    cli = importlib.import_module("flwr.superlink.cli.flower_superlink")

    if not callable(getattr(cli, "load_control_authn_plugin", None)):
        sys.exit(
            "fedbalance cannot close this Flower release's Control API "
            "(flwr.superlink.cli.flower_superlink.load_control_authn_plugin is gone): not "
            "starting an open SuperLink"
        )
    cli.load_control_authn_plugin = lambda: plugin  # type: ignore[attr-defined]
    sys.argv = ["flower-superlink", *args[1:]]
    cli.flower_superlink()


if __name__ == "__main__":
    main()
