"""One error hierarchy for every Nexus service.

Each class carries the ``grpc.StatusCode`` it maps to. Domain code raises these;
one server interceptor (``services.common.server.ErrorInterceptor``) turns them
into gRPC statuses, and ``from_rpc_error`` maps an ``RpcError`` back on the client.

    NexusError                      INTERNAL (a bug, never a user mistake)
    ├── InvalidArgument             INVALID_ARGUMENT
    │   └── SchemaError             INVALID_ARGUMENT (a tool / JSON Schema is malformed)
    ├── NotFound                    NOT_FOUND
    │   ├── ToolNotFound            NOT_FOUND
    │   └── ArtifactNotFound        NOT_FOUND
    ├── FailedPrecondition          FAILED_PRECONDITION
    │   ├── ModelMismatch           FAILED_PRECONDITION (.atb compiled for another model)
    │   └── EmptyRegistry           FAILED_PRECONDITION
    ├── ResourceExhausted           RESOURCE_EXHAUSTED (too large, too many)
    ├── Unavailable                 UNAVAILABLE (store or peer service down)
    ├── DeadlineExceeded            DEADLINE_EXCEEDED
    ├── Unauthenticated             UNAUTHENTICATED
    └── DataCorruption              DATA_LOSS (checksum mismatch on read)
"""

from __future__ import annotations

import grpc


class NexusError(Exception):
    """Base of every Nexus error; an unexpected one is a bug (INTERNAL)."""

    code: grpc.StatusCode = grpc.StatusCode.INTERNAL

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class InvalidArgument(NexusError):
    code = grpc.StatusCode.INVALID_ARGUMENT


class SchemaError(InvalidArgument):
    """A tool definition or its JSON Schema is malformed."""


class NotFound(NexusError):
    code = grpc.StatusCode.NOT_FOUND


class ToolNotFound(NotFound):
    pass


class ArtifactNotFound(NotFound):
    pass


class FailedPrecondition(NexusError):
    code = grpc.StatusCode.FAILED_PRECONDITION


class ModelMismatch(FailedPrecondition):
    pass


class EmptyRegistry(FailedPrecondition):
    pass


class ResourceExhausted(NexusError):
    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class Unavailable(NexusError):
    code = grpc.StatusCode.UNAVAILABLE


class DeadlineExceeded(NexusError):
    code = grpc.StatusCode.DEADLINE_EXCEEDED


class Unauthenticated(NexusError):
    code = grpc.StatusCode.UNAUTHENTICATED


class DataCorruption(NexusError):
    code = grpc.StatusCode.DATA_LOSS


_BY_CODE: dict[grpc.StatusCode, type[NexusError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPrecondition,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhausted,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceeded,
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
    grpc.StatusCode.DATA_LOSS: DataCorruption,
}


def from_rpc_error(err: grpc.RpcError) -> NexusError:
    """Map a client-side ``RpcError`` back to the matching ``NexusError`` class."""
    code = err.code() if hasattr(err, "code") else grpc.StatusCode.UNKNOWN
    details = err.details() if hasattr(err, "details") else str(err)
    cls = _BY_CODE.get(code, NexusError)
    return cls(details or str(code))
