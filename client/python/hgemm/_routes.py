"""Where calls go: Routes (the target's channel and one per replica), the replica of a
gemm_many group or a stream session, and what an unreachable replica means.

Thread safety: Routes is thread-safe (a lock around its replica channels); the functions keep
no state.
"""
import threading
from typing import Dict, Optional

from . import _errors, _wire
from ._config import ClientConfig
from ._spec import Spec


class Routes:
    """The grpcio channels of one client: the target's, over which calls naming no handle are
    balanced (round_robin), and one per replica for the calls naming its handles, each made
    with ClientConfig.make_channel at first use and kept (a client on the native core makes
    none unless a call goes through grpcio). Thread-safe."""

    def __init__(self, config: ClientConfig, aio: bool):
        self._config = config
        self._aio = aio  # channels of grpc.aio, else of grpc (imported at the first channel)
        self._lock = threading.Lock()
        self._routes = {}  # replica ("": the target) → (channel, stub)

    def stub(self, replica: str):
        """The stub for `replica` ("": the target's)."""
        with self._lock:
            route = self._routes.get(replica)
            if route is None:
                import grpc  # only here: the native core's clients never load grpcio
                import grpc.aio
                from ._proto import hgemm_pb2_grpc as pb_grpc
                channel = self._config.make_channel(replica or self._config.target,
                                                    grpc.aio if self._aio else grpc)
                route = self._routes[replica] = (
                    channel, _wire.Stub(channel, pb_grpc.GemmServiceStub(channel)))
            return route[1]

    def channels(self) -> list:
        """The channels made so far."""
        with self._lock:
            return [channel for channel, _ in self._routes.values()]


def explain_unreachable(err: _errors.Error, replica: str) -> _errors.Error:
    """A call to `replica` that did not reach it: say what that means for its matrices. An
    UNAVAILABLE the replica itself sent (queue full, shutting down) stays as it is."""
    if not replica or not isinstance(err, _errors.Unavailable) or _errors.sent_by_server(err):
        return err
    out = _errors.Unavailable(f"replica {replica} cannot be reached ({err.message}): if it is "
                              f"gone, the resident matrices it held went with it; upload them "
                              f"again", index=err.index)
    out.__cause__ = err
    return out


def by_replica(specs: Dict[int, Spec]):
    """gemm_many's GEMMs grouped by the replica each must run on, in the order each replica
    is first named: ({replica: {index: spec}}, {index: FailedPrecondition})."""
    groups: Dict[str, Dict[int, Spec]] = {}
    refused: Dict[int, _errors.Error] = {}
    for i, spec in specs.items():
        try:
            groups.setdefault(spec.replica(), {})[i] = spec
        except _errors.FailedPrecondition as err:
            err.index = i
            refused[i] = err
    return groups, refused


def session_replica(bound: Optional[str], spec: Spec) -> str:
    """The replica a session's stream goes to once `spec` is on it: `bound` (None: not yet
    chosen, so the spec's). FailedPrecondition when the spec names matrices of another replica."""
    wanted = spec.replica()
    if bound is None:
        return wanted
    if wanted and wanted != bound:
        where = f"replica {bound}" if bound else "the client's target"
        raise _errors.FailedPrecondition(
            f"this stream goes to {where}, and the GEMM names matrices on replica {wanted}: "
            f"open a stream there (client.stream(replica=...))")
    return bound
