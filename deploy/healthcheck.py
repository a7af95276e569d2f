#!/usr/bin/env python3
"""gRPC health probe for Nexus containers: exit 0 iff the server reports SERVING.

    python healthcheck.py [HOST:PORT] [--service NAME] [--timeout SECONDS]

Used by the Dockerfiles' HEALTHCHECK and docker-compose healthchecks. ``grpcurl … Health/Check``
exits 0 for NOT_SERVING too (it only fails on transport errors), so it cannot tell "warming up"
from "ready"; this script can. Nexus servers report SERVING only after warm-up (models loaded,
registry synced). Needs only ``grpcio`` and ``grpcio-health-checking``, both in the image.

Exit codes: 0 SERVING, 1 reachable but not SERVING (or unknown service), 2 unreachable / error.
Without an address it probes 127.0.0.1 on the port of ``NEXUS_ROUTER_PORT``,
``NEXUS_COMPILER_PORT`` or ``NEXUS_ENGINE_PORT`` (whichever is set, in that order), else 50051.
"""

from __future__ import annotations

import argparse
import os
import sys


def default_addr(env: dict[str, str] | None = None) -> str:
    env = dict(os.environ) if env is None else env
    for svc in ("ROUTER", "COMPILER", "ENGINE"):
        port = env.get(f"NEXUS_{svc}_PORT")
        if port:
            return f"127.0.0.1:{port}"
    return "127.0.0.1:50051"


def check(addr: str, service: str = "", timeout_s: float = 3.0) -> tuple[int, str]:
    """``(exit_code, message)`` for one Health/Check call."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(addr) as channel:
        try:
            resp = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=service), timeout=timeout_s)
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.NOT_FOUND:
                return 1, f"{addr}: unknown service {service!r}"
            return 2, f"{addr}: {e.code().name}: {e.details()}"
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status)
    return (0 if resp.status == health_pb2.HealthCheckResponse.SERVING else 1), f"{addr}: {status}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("addr", nargs="?", default=None, help="HOST:PORT (default: from NEXUS_*_PORT)")
    p.add_argument("--service", default="", help="service name to check ('' = the whole server)")
    p.add_argument("--timeout", type=float, default=3.0, help="seconds (default: %(default)s)")
    args = p.parse_args(argv)
    code, message = check(args.addr or default_addr(), args.service, args.timeout)
    print(message, file=sys.stderr if code else sys.stdout)
    return code


if __name__ == "__main__":
    sys.exit(main())
