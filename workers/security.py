"""Who may call what: bearer tokens and TLS, configured from the environment alone.

The Serve config (deploy/serve_config.yaml) is shared by every deployment and shown in Ray's
dashboard, so it holds no secrets and no per-environment paths: each process reads these variables
once at start (``SecuritySettings.from_env``). Every process of a cluster needs the same values; an
embedded cluster inherits them from `specserve serve`, other clusters from wherever `ray start`
runs (KubeRay: the pod's environment, files mounted from Secrets).

Glossary:
  client API        the router's SpecServe service, health and reflection (what users call).
  internal streams  the workers' Drafter and Verifier services (proto/v1/internal.proto), which only
                    the router calls.
  TLS directory     the kubernetes.io/tls + cert-manager layout: tls.crt, tls.key, ca.crt (PEM).

Tokens travel as ``authorization: Bearer <token>`` metadata. Client-side they are attached by
interceptors rather than call credentials, because gRPC refuses call credentials on plaintext
channels and the token must work with TLS off too.
"""

from __future__ import annotations

import hmac
import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import grpc

API_TOKEN_ENV = "SPECSERVE_API_TOKEN"
API_TOKEN_FILE_ENV = "SPECSERVE_API_TOKEN_FILE"
INTERNAL_TOKEN_ENV = "SPECSERVE_INTERNAL_TOKEN"
INTERNAL_TOKEN_FILE_ENV = "SPECSERVE_INTERNAL_TOKEN_FILE"
TLS_DIR_ENV = "SPECSERVE_TLS_DIR"
TLS_SERVER_NAME_ENV = "SPECSERVE_TLS_SERVER_NAME"
# Workers are dialled by IP, which no certificate can be issued for ahead of time: internal channels
# verify this name instead, and the certificate must carry it as a DNS SAN.
INTERNAL_SERVER_NAME = "specserve-internal"
TLS_CERT, TLS_KEY, TLS_CA = "tls.crt", "tls.key", "ca.crt"
AUTHORIZATION = "authorization"  # gRPC metadata keys are lower case
BEARER = "Bearer "
# Kubernetes' gRPC readiness probes cannot send metadata; health tells nothing worth a token.
HEALTH_SERVICE = "grpc.health.v1.Health"
TARGET_NAME_OVERRIDE = "grpc.ssl_target_name_override"
_TOKEN_CHARACTERS = re.compile(r"[\x21-\x7e]+")  # an HTTP/2 header value: printable ASCII, no spaces


@dataclass(frozen=True)
class TlsFiles:
    """The PEM files of a TLS directory. A client needs only ``ca``; a server also its key pair."""

    directory: Path
    ca: bytes
    cert: bytes | None = None
    key: bytes | None = None

    @classmethod
    def load(cls, directory: Path) -> TlsFiles:
        if not directory.is_dir():
            raise ValueError(f"{TLS_DIR_ENV}={directory} is not a directory; point it at one holding "
                             f"{TLS_CERT}, {TLS_KEY} and {TLS_CA}, or unset it to turn TLS off")
        if not (directory / TLS_CA).is_file():
            raise ValueError(f"{TLS_DIR_ENV}: {directory / TLS_CA} is missing; it holds the CA that signs every "
                             f"specserve certificate (cert-manager writes it beside {TLS_CERT})")
        cert, key = directory / TLS_CERT, directory / TLS_KEY
        if cert.is_file() != key.is_file():
            missing = key if cert.is_file() else cert
            raise ValueError(f"{TLS_DIR_ENV}: {missing} is missing; {TLS_CERT} and {TLS_KEY} go together")
        ca = (directory / TLS_CA).read_bytes()
        if not cert.is_file():
            return cls(directory, ca)  # a client's directory
        return cls(directory, ca, cert.read_bytes(), key.read_bytes())

    def key_pair(self) -> tuple[bytes, bytes]:
        """(private key, certificate chain), as gRPC's credentials take them."""
        if self.cert is None or self.key is None:
            raise ValueError(f"{TLS_DIR_ENV}: {self.directory} has no {TLS_CERT} and {TLS_KEY}; a specserve server "
                             f"(router or worker) needs both, a client only {TLS_CA}")
        return self.key, self.cert

    def __repr__(self) -> str:
        return f"TlsFiles({str(self.directory)!r}, key pair {'set' if self.key else 'unset'})"


@dataclass(frozen=True)
class SecuritySettings:
    """What this process enforces and sends. Everything off by default: an open, plaintext service."""

    api_token: str | None = None
    internal_token: str | None = None
    tls: TlsFiles | None = None
    server_name: str = INTERNAL_SERVER_NAME

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> SecuritySettings:
        tls_dir = environ.get(TLS_DIR_ENV, "").strip()
        return cls(api_token=_token(environ, API_TOKEN_ENV, API_TOKEN_FILE_ENV),
                   internal_token=_token(environ, INTERNAL_TOKEN_ENV, INTERNAL_TOKEN_FILE_ENV),
                   tls=TlsFiles.load(Path(tls_dir)) if tls_dir else None,
                   server_name=environ.get(TLS_SERVER_NAME_ENV, "").strip() or INTERNAL_SERVER_NAME)

    def __repr__(self) -> str:  # never the secrets themselves
        return (f"SecuritySettings(api_token={_set(self.api_token)}, internal_token={_set(self.internal_token)}, "
                f"tls={self.tls!r}, server_name={self.server_name!r})")

    def describe(self) -> str:
        """What is on, without values: for the startup log."""
        api = "bearer token required" if self.api_token else "open (no token)"
        return f"client API: {api}, TLS {'on' if self.tls else 'off'}; {self.describe_internal()}"

    def describe_internal(self) -> str:
        token = "token required" if self.internal_token else "no token"
        return f"internal streams: {token}, mTLS {'on' if self.tls else 'off'}"

    def log_startup(self, logger: logging.Logger) -> None:
        logger.info("security: %s", self.describe())
        if not (self.internal_token or self.tls):
            logger.warning("internal streams are unauthenticated: anything that reaches a worker's port can use it; "
                           "set %s (or %s) and %s", INTERNAL_TOKEN_FILE_ENV, INTERNAL_TOKEN_ENV, TLS_DIR_ENV)

    # --- servers -------------------------------------------------------------------------------

    def api_server_credentials(self) -> grpc.ServerCredentials | None:
        """TLS for the client API (clients verify the router against ca.crt; no client certificate)."""
        return grpc.ssl_server_credentials([self.tls.key_pair()]) if self.tls else None

    def api_interceptors(self) -> tuple[grpc.aio.ServerInterceptor, ...]:
        if not self.api_token:
            return ()
        return (BearerTokenInterceptor(self.api_token, f"the token in {API_TOKEN_ENV} or {API_TOKEN_FILE_ENV}",
                                       exempt=(HEALTH_SERVICE,)),)

    def internal_server_credentials(self) -> grpc.ServerCredentials | None:
        """Mutual TLS: a worker accepts only callers presenting a certificate signed by ca.crt."""
        if not self.tls:
            return None
        return grpc.ssl_server_credentials([self.tls.key_pair()], root_certificates=self.tls.ca,
                                           require_client_auth=True)

    def internal_interceptors(self) -> tuple[grpc.aio.ServerInterceptor, ...]:
        if not self.internal_token:
            return ()
        return (BearerTokenInterceptor(self.internal_token, f"the cluster's internal token, {INTERNAL_TOKEN_ENV} or "
                                                            f"{INTERNAL_TOKEN_FILE_ENV}"),)

    # --- the router's channels to workers ------------------------------------------------------

    def internal_channel_credentials(self) -> grpc.ChannelCredentials:
        key, cert = self.tls.key_pair()
        return grpc.ssl_channel_credentials(root_certificates=self.tls.ca, private_key=key, certificate_chain=cert)


def internal_aio_channel(address: str, settings: SecuritySettings, options=()) -> grpc.aio.Channel:
    """A channel to a worker (the router's): mTLS when configured, the internal token on every call."""
    interceptors = aio_bearer_interceptors(settings.internal_token) if settings.internal_token else None
    if settings.tls:
        return grpc.aio.secure_channel(address, settings.internal_channel_credentials(),
                                       options=[*options, (TARGET_NAME_OVERRIDE, settings.server_name)],
                                       interceptors=interceptors)
    return grpc.aio.insecure_channel(address, options=list(options), interceptors=interceptors)


def internal_channel(address: str, settings: SecuritySettings, options=()) -> grpc.Channel:
    """As ``internal_aio_channel``, blocking: for tools and tests that inspect a worker."""
    if settings.tls:
        channel = grpc.secure_channel(address, settings.internal_channel_credentials(),
                                      options=[*options, (TARGET_NAME_OVERRIDE, settings.server_name)])
    else:
        channel = grpc.insecure_channel(address, options=list(options))
    return grpc.intercept_channel(channel, BearerToken(settings.internal_token)) if settings.internal_token else channel


def _token(environ: Mapping[str, str], env: str, file_env: str) -> str | None:
    value, path = environ.get(env, "").strip(), environ.get(file_env, "").strip()
    if value and path:
        raise ValueError(f"both {env} and {file_env} are set: pick one (the file, for a mounted Secret)")
    if path:
        try:
            value = Path(path).read_text().strip()
        except OSError as exc:
            raise ValueError(f"{file_env}={path} cannot be read ({exc.strerror}); mount the token there or unset "
                             f"{file_env}") from None
        if not value:
            raise ValueError(f"{file_env}={path} is empty; write the token there or unset {file_env}")
    if value and not _TOKEN_CHARACTERS.fullmatch(value):
        raise ValueError(f"{file_env if path else env}: the token must be printable ASCII without spaces "
                         f"(it travels in a gRPC metadata value)")
    return value or None


def _set(secret: str | None) -> str:
    return "set" if secret else "unset"


# --- server side: refusing calls without the token ---------------------------------------------

class BearerTokenInterceptor(grpc.aio.ServerInterceptor):
    """Answers UNAUTHENTICATED, saying what to send, to calls without ``authorization: Bearer <token>``.

    ``hint`` names where the token comes from; services in ``exempt`` (full names) need none.
    """

    def __init__(self, token: str, hint: str, exempt: tuple[str, ...] = ()) -> None:
        self._expected = token.encode()
        self._missing = f"missing credentials: send metadata '{AUTHORIZATION}: {BEARER}<token>' ({hint})"
        self._exempt = tuple(f"/{service}/" for service in exempt)

    async def intercept_service(self, continuation, details: grpc.HandlerCallDetails):
        if details.method.startswith(self._exempt):
            return await continuation(details)
        problem = self._problem(details.invocation_metadata)
        handler = await continuation(details)
        if problem is None or handler is None:  # no such method: gRPC answers UNIMPLEMENTED as usual
            return handler
        return _refusal(handler, problem)

    def _problem(self, metadata) -> str | None:
        """Why the call is refused, or None."""
        value = next((v for k, v in metadata or () if k == AUTHORIZATION), None)
        if value is None:
            return self._missing
        if isinstance(value, bytes) or not value[:len(BEARER)].lower() == BEARER.lower():
            return f"'{AUTHORIZATION}' metadata must read '{BEARER}<token>'"
        if not hmac.compare_digest(value[len(BEARER):].strip().encode(), self._expected):
            return "invalid bearer token"
        return None


def _refusal(handler: grpc.RpcMethodHandler, details: str) -> grpc.RpcMethodHandler:
    """A handler of the same kind as ``handler`` that aborts with UNAUTHENTICATED before reading anything."""

    async def abort(request_or_iterator, context: grpc.aio.ServicerContext) -> None:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, details)

    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(abort)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(abort)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(abort)
    return grpc.unary_unary_rpc_method_handler(abort)


# --- client side: sending the token ------------------------------------------------------------

class BearerToken(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor,
                  grpc.StreamUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
    """Adds the token to every call of a blocking channel (``grpc.intercept_channel``)."""

    def __init__(self, token: str) -> None:
        self._metadatum = (AUTHORIZATION, BEARER + token)

    def _with_token(self, details):
        return details._replace(metadata=(*(details.metadata or ()), self._metadatum))

    def intercept_unary_unary(self, continuation, details, request):
        return continuation(self._with_token(details), request)

    def intercept_unary_stream(self, continuation, details, request):
        return continuation(self._with_token(details), request)

    def intercept_stream_unary(self, continuation, details, request_iterator):
        return continuation(self._with_token(details), request_iterator)

    def intercept_stream_stream(self, continuation, details, request_iterator):
        return continuation(self._with_token(details), request_iterator)


class _AioBearerToken:
    def __init__(self, token: str) -> None:
        self._metadatum = (AUTHORIZATION, BEARER + token)

    def _with_token(self, details: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        return details._replace(metadata=grpc.aio.Metadata(*(details.metadata or ()), self._metadatum))


class _AioUnaryUnary(_AioBearerToken, grpc.aio.UnaryUnaryClientInterceptor):
    async def intercept_unary_unary(self, continuation, details, request):
        return await continuation(self._with_token(details), request)


class _AioUnaryStream(_AioBearerToken, grpc.aio.UnaryStreamClientInterceptor):
    async def intercept_unary_stream(self, continuation, details, request):
        return await continuation(self._with_token(details), request)


class _AioStreamUnary(_AioBearerToken, grpc.aio.StreamUnaryClientInterceptor):
    async def intercept_stream_unary(self, continuation, details, request_iterator):
        return await continuation(self._with_token(details), request_iterator)


class _AioStreamStream(_AioBearerToken, grpc.aio.StreamStreamClientInterceptor):
    async def intercept_stream_stream(self, continuation, details, request_iterator):
        return await continuation(self._with_token(details), request_iterator)


def aio_bearer_interceptors(token: str) -> list[grpc.aio.ClientInterceptor]:
    """One per call kind: a grpc.aio channel files each interceptor under the first kind it matches."""
    return [kind(token) for kind in (_AioUnaryUnary, _AioUnaryStream, _AioStreamUnary, _AioStreamStream)]
