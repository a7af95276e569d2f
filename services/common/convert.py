"""Protobuf <-> domain conversions shared by servicers and clients (the only place besides
servicers and clients that touches ``*_pb2``)."""

from __future__ import annotations

from collections.abc import Iterable

from nexus.v1 import common_pb2


def turns_from_pb(turns: Iterable[common_pb2.Turn]):
    from services.router.router import HistoryTurn

    return [HistoryTurn(role=t.role, content=t.content) for t in turns]
