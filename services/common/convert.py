"""Protobuf <-> domain conversions shared by servicers and clients (the only place besides
servicers and clients that touches ``*_pb2``)."""

from __future__ import annotations

from collections.abc import Iterable

from nexus.v1 import common_pb2


def turns_from_pb(turns: Iterable[common_pb2.Turn]):
    from services.router.router import HistoryTurn

    return [HistoryTurn(role=t.role, content=t.content) for t in turns]


def turns_to_pb(turns: Iterable[dict]) -> list[common_pb2.Turn]:
    return [common_pb2.Turn(role=str(t.get("role", "")), content=str(t.get("content", ""))) for t in turns]
