"""hgemm.Client: the synchronous client, Calls' methods with their steps done by blocking calls.
Thread-safe (see Client)."""
import functools
import time
from typing import TYPE_CHECKING, Any, Callable, TypeVar, Union

from . import _calls, _resident, _stream

if TYPE_CHECKING:  # typing has them from Python 3.10; type checkers bring typing_extensions
    from typing_extensions import Concatenate, ParamSpec
    _P = ParamSpec("_P")
_R = TypeVar("_R")


def _run(steps):
    """Does the steps of a Calls generator one by one; returns what the generator returns."""
    value, error = None, None
    while True:
        try:
            step = steps.send(value) if error is None else steps.throw(error)
        except StopIteration as finished:
            return finished.value
        try:
            value, error = _do(step), None
        except BaseException as e:  # thrown into the generator, whose finally blocks run
            value, error = None, e


def _do(step):
    if isinstance(step, _calls.Sleep):
        time.sleep(step.seconds)
        return None
    if isinstance(step, _calls.AllOf):
        return [_run(s) for s in step.steps]
    if isinstance(step, _calls.Native):
        return step.fn(*step.args)
    call = step.method(step.request, timeout=step.timeout, metadata=step.metadata)
    if step.on_response is None:
        return call
    for response in call:
        step.on_response(response)


def _blocking(steps: "Callable[Concatenate[_calls.Calls, _P], _R]"
              ) -> "Callable[Concatenate[Client, _P], _R]":
    """Calls.<method> as the Client method that runs it here (its signature and result, for a
    type checker too: a Calls method is annotated with what the client returns)."""
    @functools.wraps(steps)
    def method(self, *args, **kwargs):
        return _run(steps(self._calls, *args, **kwargs))
    return method


class Client:
    """A client of an hgemm-serve server or of several replicas (hgemm.v1.GemmService).
    Thread-safe: one Client may be used from many threads at once (calls are independent).

        with hgemm.Client("127.0.0.1:50051") as c:
            C = c.gemm(A, B)

    Replicas: a call naming a ResidentMatrix goes to the replica that holds it (the address in
    its handle), over a channel of its own made with the same options; every other call is
    balanced over the target (round_robin). A GEMM of matrices on two replicas raises
    FailedPrecondition before anything is sent: upload the second with replica=the first. A
    call naming a matrix of a replica that cannot be reached raises Unavailable saying so (its
    matrices are gone if it is; upload them again).

    Args:
      target: "host:port" (any gRPC target, e.g. "dns:///svc:50051"; several replicas:
        "ipv4:10.0.0.1:50051,10.0.0.2:50051" or a DNS name that resolves to all of them).
      tls: True for TLS with the system's root certificates; implied by tls_ca / tls_cert.
      tls_ca: PEM file of the CA that signed the server's certificate.
      tls_cert, tls_key: PEM files of this client's certificate and key (mTLS).
      tls_server_name: the name to check the server's certificate against, if not the target's.
      token: sent as "authorization: Bearer <token>" on every call; token_file: read it from a
        file; neither: $HGEMM_TOKEN if set.
      client_id: sent as "x-client-id" (owner of resident matrices when authentication is off).
      traceparent: a W3C trace context ("00-<32 hex>-<16 hex>-<2 hex>") sent with every call;
        the server logs it with the call (and ignores a malformed one).
      timeout: default deadline in seconds for every call (None: none); each method's timeout=
        overrides it.
      mode: "auto" (unary for small GEMMs, GemmStream above unary_limit_bytes or the server's
        message limit), "unary" or "stream"; each gemm's mode= overrides it.
      unary_limit_bytes: in mode "auto", GEMMs whose operands or C pass this go on a stream.
      chunk_bytes: size of the chunks operands and uploads are sent in (1 MiB, as recommended).
      retries: tries in all for an UNAVAILABLE answer (see RetryPolicy); 1 turns retries off.
      progress: None (a tqdm bar for transfers over 256 MiB when tqdm is installed), True, False.
      channel_options: extra gRPC channel arguments. Message size limits are already lifted.
        A client with channel_options makes every call through grpcio.
      shared_memory: None (on for a "unix:" target: the server's Unix socket on this host),
        True (required: a unix: target) or False. On, shared_buffer() hands out arrays in
        shared memory, and a GEMM's operands and C that live there, or are at least
        shared_memory_min_bytes (default 1 MiB; copied through a region the client keeps),
        are named in the Gemm call instead of sent (server: --allow_shared_memory; where it
        refuses, GEMMs of ordinary arrays go as bytes). Regions are unregistered on close().
      ring: None (on unless $HGEMM_RING=0), True or False. On the native core, a GEMM whose A,
        B and C are all in shared memory (no C input, details=False) goes through a submission
        ring shared by the client's threads (one entry in shared memory, no gRPC call per
        GEMM; opened at first use, closed on close()), else as a Gemm call naming the regions.

    Core: GEMMs, gemm_many, resident matrices (upload, download, matrices, release) go through
    the native core (libhgemm_client.so, the GIL released for the call) when hgemm.info()
    reports it, else through grpcio; hgemm.info()["features"] says which core serves what.
    """

    def __init__(self, target: str = "127.0.0.1:50051", **options: Any) -> None:
        self._calls = _calls.Calls(self, True, target, **options)
        self._config = self._calls.config

    # The target's grpcio stub, its channel made at first use (tests wrap its methods).
    _stub = property(lambda self: self._calls.routes.stub(""))

    # Lifetime.
    def close(self) -> None:
        _run(self._calls.release_regions())
        for channel in self._calls.routes.channels():
            channel.close()
        if self._calls.native is not None:
            self._calls.native.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def stream(self, *, replica: Union[None, str, _resident.ResidentMatrix] = None
               ) -> _stream.Stream:
        """An hgemm.Stream: one GemmStream kept open for many GEMMs, pipelined
        (`with c.stream() as s: C = s.gemm(A, B)`; s.submit(A, B) returns a Future). For many
        GEMMs over time from a loop or several threads, without a stream's setup per GEMM.
        replica: over several replicas, where the stream goes (a ResidentMatrix or an address);
        default: where its first GEMM's matrices live, else the target."""
        return _stream.Stream(self, None if replica is None else _resident.replica_of(replica))

    gemm = _blocking(_calls.Calls.gemm)
    gemm_many = _blocking(_calls.Calls.gemm_many)
    gemm_batched = _blocking(_calls.Calls.gemm_batched)
    gemm_grouped = _blocking(_calls.Calls.gemm_grouped)
    prepare = _blocking(_calls.Calls.prepare)
    upload = _blocking(_calls.Calls.upload)
    download = _blocking(_calls.Calls.download)
    release = _blocking(_calls.Calls.release)
    matrices = _blocking(_calls.Calls.matrices)
    info = _blocking(_calls.Calls.info)
    kernels = _blocking(_calls.Calls.kernels)
    shared_buffer = _blocking(_calls.Calls.shared_buffer)
    cuda_gemm = _blocking(_calls.Calls.cuda_gemm)
    regions = _blocking(_calls.Calls.regions)
