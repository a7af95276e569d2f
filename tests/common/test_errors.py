import grpc
import pytest

from services.common import errors


class FakeRpcError(grpc.RpcError):
    def __init__(self, code, details):
        self._code, self._details = code, details

    def code(self):
        return self._code

    def details(self):
        return self._details


@pytest.mark.parametrize(
    "cls, code",
    [
        (errors.InvalidArgument, grpc.StatusCode.INVALID_ARGUMENT),
        (errors.SchemaError, grpc.StatusCode.INVALID_ARGUMENT),
        (errors.ToolNotFound, grpc.StatusCode.NOT_FOUND),
        (errors.ModelMismatch, grpc.StatusCode.FAILED_PRECONDITION),
        (errors.ResourceExhausted, grpc.StatusCode.RESOURCE_EXHAUSTED),
        (errors.Unavailable, grpc.StatusCode.UNAVAILABLE),
        (errors.DataCorruption, grpc.StatusCode.DATA_LOSS),
    ],
)
def test_every_error_carries_its_status(cls, code):
    assert cls("x").code == code


def test_rpc_error_maps_back():
    e = errors.from_rpc_error(FakeRpcError(grpc.StatusCode.NOT_FOUND, "no tool"))
    assert isinstance(e, errors.NotFound) and e.message == "no tool"
    assert type(errors.from_rpc_error(FakeRpcError(grpc.StatusCode.UNKNOWN, "?"))) is errors.NexusError
