"""tools/install.py: pip's settings carried over to uv, or pip does the install."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("install_tool", ROOT / "tools" / "install.py")
assert spec is not None and spec.loader is not None
install = importlib.util.module_from_spec(spec)
spec.loader.exec_module(install)


def test_pip_settings_become_uv_flags_and_environment() -> None:
    flags, env = install.uv_arguments(
        {
            "index-url": "https://example.org/simple",
            "extra-index-url": "file:///a/simple file:///b/simple",
            "find-links": "/wheels",
            "constraint": "/c.txt",
            "cert": "/ca.crt",
            "default-timeout": "180",
            "disable-pip-version-check": "1",
            "no-index": "false",
        }
    )
    assert flags == [
        "--index-strategy",
        "unsafe-best-match",
        "--index-url",
        "https://example.org/simple",
        "--extra-index-url",
        "file:///a/simple",
        "--extra-index-url",
        "file:///b/simple",
        "--find-links",
        "/wheels",
        "--constraint",
        "/c.txt",
    ]
    assert env == {"SSL_CERT_FILE": "/ca.crt", "UV_HTTP_TIMEOUT": "180"}


def test_a_pip_setting_uv_cannot_take_is_named_and_uv_is_not_used(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PIP_TRUSTED_HOST", "mirror.example.org")
    monkeypatch.setenv("PIP_FIND_LINKS", "/from-env")
    settings = install.pip_settings(Path(sys.executable))
    assert settings["find-links"] == "/from-env"  # the environment outranks pip's files
    with pytest.raises(ValueError, match="trusted-host='mirror.example.org'"):
        install.uv_arguments(settings)
    why = install.install_with_uv(Path(sys.executable), ["nothing-is-installed"])
    assert why == "pip setting trusted-host='mirror.example.org' has no uv equivalent here"


def test_fedbalance_installer_pip_skips_uv(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FEDBALANCE_INSTALLER", "pip")
    assert install.install_with_uv(Path(sys.executable), ["x"]) == "FEDBALANCE_INSTALLER=pip"
