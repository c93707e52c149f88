"""The unit tier runs offline: a test that opens a network connection fails (the other tiers have sockets)."""

from __future__ import annotations

import socket
from typing import Any

import pytest


class NetworkUsedError(AssertionError):
    """A unit test tried to reach the network."""


@pytest.fixture(autouse=True)
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    """Refuse every outgoing connection (and name lookup) for the duration of a unit test."""

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise NetworkUsedError(f"the unit tier runs offline; this test reached for the network: {args[1:]}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
