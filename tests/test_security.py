"""Authentication and TLS (workers/security.py): tokens, TLS and mTLS on real gRPC servers with
certificates made here; no pickle in the package; and a real cluster with everything on, whose
logs, stats and metrics must not hold a secret."""

from __future__ import annotations

import ast
import asyncio
import datetime
import ipaddress
import os
import secrets
import shutil
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
import ray
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio

from specserve.cluster.bringup import serve_config
from specserve.cluster.client import SpecServeClient
from specserve.cluster.config import DEFAULT_CONFIG_FILE
from specserve.workers.security import (API_TOKEN_ENV, API_TOKEN_FILE_ENV, INTERNAL_SERVER_NAME, INTERNAL_TOKEN_ENV,
                                        INTERNAL_TOKEN_FILE_ENV, TLS_DIR_ENV, BearerToken, SecuritySettings,
                                        TlsFiles, internal_aio_channel, internal_channel)
from specserve.proto.v1 import specserve_pb2 as pb
from specserve.proto.v1 import specserve_pb2_grpc as rpc
from specserve.workers.grpc_host import BackgroundServer

from conftest import free_port, serve_in_subprocess

TOKEN = "s3cret-api-token"
MISSING = ("missing credentials: send metadata 'authorization: Bearer <token>' "
           f"(the token in {API_TOKEN_ENV} or {API_TOKEN_FILE_ENV})")


# --- certificates ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Pem:
    cert: bytes
    key: bytes


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def make_ca(common: str = "specserve test CA") -> tuple[Pem, ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(_name(common)).issuer_name(_name(common))
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
            .sign(key, hashes.SHA256()))
    return _pem(cert, key), key, cert


def make_leaf(ca_key, ca_cert, dns: tuple[str, ...], ips: tuple[str, ...] = ()) -> Pem:
    """A certificate for server and client use (cert-manager's usages: server auth, client auth)."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    names = [x509.DNSName(d) for d in dns] + [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
    cert = (x509.CertificateBuilder().subject_name(_name(dns[0])).issuer_name(ca_cert.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                           critical=False)
            .sign(ca_key, hashes.SHA256()))
    return _pem(cert, key)


def _pem(cert: x509.Certificate, key) -> Pem:
    return Pem(cert.public_bytes(serialization.Encoding.PEM),
               key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                 serialization.NoEncryption()))


def write_tls_dir(directory: Path, ca: Pem, leaf: Pem | None) -> Path:
    """The kubernetes.io/tls + cert-manager layout."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "ca.crt").write_bytes(ca.cert)
    if leaf:
        (directory / "tls.crt").write_bytes(leaf.cert)
        (directory / "tls.key").write_bytes(leaf.key)
    return directory


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """A CA, a certificate for localhost and the internal name only (no IP SAN), and a rogue CA."""
    ca, ca_key, ca_cert = make_ca()
    leaf = make_leaf(ca_key, ca_cert, ("localhost", INTERNAL_SERVER_NAME))
    rogue, rogue_key, rogue_cert = make_ca("not specserve's CA")
    root = tmp_path_factory.mktemp("pki")
    stranger = make_leaf(rogue_key, rogue_cert, (INTERNAL_SERVER_NAME,))
    return {"dir": write_tls_dir(root / "good", ca, leaf), "ca": ca, "leaf": leaf,
            "rogue_dir": write_tls_dir(root / "rogue", rogue, stranger)}


# --- a server with one method of each kind, and the real health service ----------------------

def _add_echo_and_health(server: grpc.aio.Server) -> None:
    async def unary(request, context):
        return request

    async def server_stream(request, context):
        yield request
        yield request

    async def bidi(requests, context):
        async for request in requests:
            yield request

    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("test.Echo", {
        "Unary": grpc.unary_unary_rpc_method_handler(unary),
        "ServerStream": grpc.unary_stream_rpc_method_handler(server_stream),
        "Bidi": grpc.stream_stream_rpc_method_handler(bidi),
    }),))
    health = health_aio.HealthServicer()  # SERVING for "" by default
    health_pb2_grpc.add_HealthServicer_to_server(health, server)


@pytest.fixture
def start():
    """start(credentials, interceptors) -> port of an echo + health server on 127.0.0.1."""
    servers = []

    def _start(credentials=None, interceptors=()) -> int:
        server = BackgroundServer(_add_echo_and_health, "127.0.0.1", 0, "test-grpc", credentials, interceptors)
        servers.append(server)
        return server.port

    yield _start
    for server in servers:
        server.stop(0)


def call_each_kind(channel: grpc.Channel, metadata=()) -> list:
    """The three kinds of call, each with its answer or the RpcError it raised."""
    kinds = {
        "unary": lambda: channel.unary_unary("/test.Echo/Unary")(b"hi", metadata=metadata, timeout=10),
        "server stream": lambda: list(channel.unary_stream("/test.Echo/ServerStream")(b"hi", metadata=metadata,
                                                                                      timeout=10)),
        "bidi": lambda: list(channel.stream_stream("/test.Echo/Bidi")(iter([b"a", b"b"]), metadata=metadata,
                                                                     timeout=10)),
    }
    results = []
    for run in kinds.values():
        try:
            results.append(run())
        except grpc.RpcError as exc:
            results.append(exc)
    return results


def codes(results: list) -> list:
    return [r.code() if isinstance(r, grpc.RpcError) else grpc.StatusCode.OK for r in results]


def health(channel: grpc.Channel) -> int:
    return health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10).status


# --- tokens ----------------------------------------------------------------------------------

def test_the_api_token_is_required_on_every_kind_of_call_but_health(start):
    port = start(interceptors=SecuritySettings(api_token=TOKEN).api_interceptors())
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        missing = call_each_kind(channel)
        assert codes(missing) == [grpc.StatusCode.UNAUTHENTICATED] * 3
        assert {r.details() for r in missing} == {MISSING}
        wrong = call_each_kind(channel, metadata=(("authorization", "Bearer not-the-token"),))
        assert codes(wrong) == [grpc.StatusCode.UNAUTHENTICATED] * 3
        assert {r.details() for r in wrong} == {"invalid bearer token"}
        (malformed,) = {r.details() for r in call_each_kind(channel, metadata=(("authorization", TOKEN),))}
        assert malformed == "'authorization' metadata must read 'Bearer <token>'"
        assert call_each_kind(channel, metadata=(("authorization", f"Bearer {TOKEN}"),)) == [b"hi", [b"hi", b"hi"],
                                                                                           [b"a", b"b"]]
        assert health(channel) == health_pb2.HealthCheckResponse.SERVING  # no token: Kubernetes' probes send none
    with grpc.intercept_channel(grpc.insecure_channel(f"127.0.0.1:{port}"), BearerToken(TOKEN)) as channel:
        assert codes(call_each_kind(channel)) == [grpc.StatusCode.OK] * 3  # the client-side interceptor


def test_an_unknown_method_is_unimplemented_with_or_without_a_token(start):
    port = start(interceptors=SecuritySettings(api_token=TOKEN).api_interceptors())
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        with pytest.raises(grpc.RpcError) as caught:
            channel.unary_unary("/test.Echo/Nothing")(b"", timeout=10)
        assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_the_internal_token_is_sent_by_the_internal_channels(start):
    settings = SecuritySettings(internal_token="cluster-token")
    port = start(interceptors=settings.internal_interceptors())
    address = f"127.0.0.1:{port}"
    with grpc.insecure_channel(address) as channel:
        refused = call_each_kind(channel)
    assert codes(refused) == [grpc.StatusCode.UNAUTHENTICATED] * 3
    assert INTERNAL_TOKEN_ENV in refused[0].details()
    with internal_channel(address, settings) as channel:
        assert codes(call_each_kind(channel)) == [grpc.StatusCode.OK] * 3
    assert asyncio.run(_aio_calls(address, settings)) == [b"hi", [b"hi", b"hi"], [b"a", b"b"]]
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        asyncio.run(_aio_calls(address, SecuritySettings()))
    assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED


async def _aio_calls(address: str, settings: SecuritySettings) -> list:
    """What the router does: a unary call (Score, Inspect) and a bidirectional stream (Draft, Verify)."""
    async with internal_aio_channel(address, settings) as channel:
        unary = await channel.unary_unary("/test.Echo/Unary")(b"hi", timeout=10)
        streamed = [r async for r in channel.unary_stream("/test.Echo/ServerStream")(b"hi", timeout=10)]
        call = channel.stream_stream("/test.Echo/Bidi")(timeout=10)
        replies = []
        for message in (b"a", b"b"):  # write, read: as a session steps
            await call.write(message)
            replies.append(await call.read())
        await call.done_writing()
        return [unary, streamed, replies]


# --- TLS and mutual TLS ----------------------------------------------------------------------

def test_the_client_api_over_tls_needs_the_ca(start, pki):
    settings = SecuritySettings.from_env({TLS_DIR_ENV: str(pki["dir"])})
    port = start(credentials=settings.api_server_credentials())
    with grpc.secure_channel(f"localhost:{port}", grpc.ssl_channel_credentials()) as channel:  # system roots only
        assert codes(call_each_kind(channel)) == [grpc.StatusCode.UNAVAILABLE] * 3
    with grpc.insecure_channel(f"localhost:{port}") as channel:  # plaintext at a TLS port
        assert codes(call_each_kind(channel)) == [grpc.StatusCode.UNAVAILABLE] * 3
    ca_only = grpc.ssl_channel_credentials(root_certificates=pki["ca"].cert)
    with grpc.secure_channel(f"localhost:{port}", ca_only) as channel:
        assert codes(call_each_kind(channel)) == [grpc.StatusCode.OK] * 3


def test_internal_streams_need_a_client_certificate_signed_by_the_ca(start, pki):
    settings = SecuritySettings.from_env({TLS_DIR_ENV: str(pki["dir"])})
    port = start(credentials=settings.internal_server_credentials())
    address = f"127.0.0.1:{port}"  # by IP, as the router dials workers: verified under the internal name
    with internal_channel(address, settings) as channel:
        assert codes(call_each_kind(channel)) == [grpc.StatusCode.OK] * 3
    assert asyncio.run(_aio_calls(address, settings))[0] == b"hi"
    override = (("grpc.ssl_target_name_override", INTERNAL_SERVER_NAME),)
    ca_only = grpc.ssl_channel_credentials(root_certificates=pki["ca"].cert)
    with grpc.secure_channel(address, ca_only, options=override) as channel:
        assert codes(call_each_kind(channel)) == [grpc.StatusCode.UNAVAILABLE] * 3
    rogue = pki["rogue_dir"]
    stranger = grpc.ssl_channel_credentials(pki["ca"].cert, (rogue / "tls.key").read_bytes(),
                                            (rogue / "tls.crt").read_bytes())
    with grpc.secure_channel(address, stranger, options=override) as channel:
        assert codes(call_each_kind(channel)) == [grpc.StatusCode.UNAVAILABLE] * 3


def test_the_client_takes_token_and_ca_from_the_environment(start, pki, monkeypatch):
    class Stats(rpc.SpecServeServicer):
        async def GetStats(self, request, context):
            return pb.ServiceStats(requests_in_flight=7)

    def add(server):
        _add_echo_and_health(server)
        rpc.add_SpecServeServicer_to_server(Stats(), server)

    settings = SecuritySettings(api_token=TOKEN, tls=TlsFiles.load(pki["dir"]))
    server = BackgroundServer(add, "127.0.0.1", 0, "test-grpc", settings.api_server_credentials(),
                              settings.api_interceptors())
    try:
        address = f"localhost:{server.port}"
        monkeypatch.setenv(API_TOKEN_ENV, TOKEN)
        monkeypatch.setenv(TLS_DIR_ENV, str(pki["dir"]))
        client = SpecServeClient(address)
        assert client.stats().requests_in_flight == 7 and client.health() == health_pb2.HealthCheckResponse.SERVING
        client.close()
        wrong = SpecServeClient(address, token="not-it")
        with pytest.raises(grpc.RpcError) as caught:
            wrong.stats()
        assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
        wrong.close()
        from specserve.cluster.probe import main as probe

        assert probe([f"127.0.0.1:{server.port}"]) == 0  # by IP: verified under the internal name
        monkeypatch.delenv(TLS_DIR_ENV)
        assert probe([f"127.0.0.1:{server.port}"]) == 1  # plaintext at a TLS port
    finally:
        server.stop(0)


# --- settings from the environment -----------------------------------------------------------

def test_settings_from_the_environment(tmp_path, pki):
    assert SecuritySettings.from_env({}) == SecuritySettings()
    assert SecuritySettings.from_env({API_TOKEN_ENV: ""}).api_token is None  # empty: the API is open
    token_file = tmp_path / "token"
    token_file.write_text(f"  {TOKEN}\n")  # as `echo` or an editor leaves it
    settings = SecuritySettings.from_env({API_TOKEN_FILE_ENV: str(token_file), INTERNAL_TOKEN_ENV: "internal-1",
                                          TLS_DIR_ENV: str(pki["dir"])})
    assert (settings.api_token, settings.internal_token) == (TOKEN, "internal-1")
    assert settings.tls.ca == pki["ca"].cert and settings.tls.key_pair() == (pki["leaf"].key, pki["leaf"].cert)
    assert settings.describe() == "client API: bearer token required, TLS on; internal streams: token required, mTLS on"
    shown = repr(settings)
    assert TOKEN not in shown and "internal-1" not in shown and "PRIVATE KEY" not in shown
    assert "api_token=set" in shown and "internal_token=set" in shown
    assert repr(SecuritySettings()).startswith("SecuritySettings(api_token=unset, internal_token=unset, tls=None")


@pytest.mark.parametrize("env, message", [
    ({API_TOKEN_ENV: "a", API_TOKEN_FILE_ENV: "/x"},
     f"both {API_TOKEN_ENV} and {API_TOKEN_FILE_ENV} are set: pick one"),
    ({INTERNAL_TOKEN_ENV: "a", INTERNAL_TOKEN_FILE_ENV: "/x"}, "pick one"),
    ({INTERNAL_TOKEN_FILE_ENV: "/nonexistent/token"}, f"{INTERNAL_TOKEN_FILE_ENV}=/nonexistent/token cannot be read"),
    ({API_TOKEN_ENV: "two words"}, "printable ASCII without spaces"),
    ({API_TOKEN_ENV: "caf\u00e9"}, "printable ASCII without spaces"),
    ({TLS_DIR_ENV: "/nonexistent/tls"}, f"{TLS_DIR_ENV}=/nonexistent/tls is not a directory"),
])
def test_bad_settings_say_what_to_fix(env, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        SecuritySettings.from_env(env)


def test_missing_and_empty_files_are_named(tmp_path, pki):
    empty = tmp_path / "empty"
    empty.write_text("\n")
    with pytest.raises(ValueError, match=f"{API_TOKEN_FILE_ENV}={empty} is empty"):
        SecuritySettings.from_env({API_TOKEN_FILE_ENV: str(empty)})
    bare = tmp_path / "bare"
    bare.mkdir()
    with pytest.raises(ValueError, match=f"{bare / 'ca.crt'} is missing"):
        SecuritySettings.from_env({TLS_DIR_ENV: str(bare)})
    (bare / "ca.crt").write_bytes(pki["ca"].cert)
    (bare / "tls.crt").write_bytes(pki["leaf"].cert)
    with pytest.raises(ValueError, match=f"{bare / 'tls.key'} is missing"):
        SecuritySettings.from_env({TLS_DIR_ENV: str(bare)})
    (bare / "tls.crt").unlink()
    client_side = SecuritySettings.from_env({TLS_DIR_ENV: str(bare)})  # a client needs ca.crt alone
    with pytest.raises(ValueError, match="has no tls.crt and tls.key; a specserve server"):
        client_side.internal_server_credentials()


# --- nothing unpickles -----------------------------------------------------------------------

PACKAGE_DIRS = ("cluster", "router", "workers", "proto", "bench")
PICKLING_MODULES = {"pickle", "cPickle", "_pickle", "cloudpickle", "dill", "shelve", "joblib"}


def unsafe_loads(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, what) for every way in ``tree`` to turn bytes into objects by pickle."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, f"import {a.name}") for a in node.names if a.name.split(".")[0] in PICKLING_MODULES]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in PICKLING_MODULES:
            found.append((node.lineno, f"from {node.module} import"))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            owner = node.func.value.id if isinstance(node.func.value, ast.Name) else ""
            keywords = {k.arg: k.value for k in node.keywords}
            name = f"{owner}.{node.func.attr}"
            if name == "torch.load" and not _is_true(keywords.get("weights_only")):
                found.append((node.lineno, "torch.load without weights_only=True"))
            elif name in ("np.load", "numpy.load") and not _is_false(keywords.get("allow_pickle", ast.Constant(False))):
                found.append((node.lineno, f"{name} with allow_pickle"))
            elif name in ("yaml.load", "yaml.unsafe_load", "yaml.full_load", "yaml.load_all"):
                found.append((node.lineno, f"{name} (use yaml.safe_load)"))
    return found


def _is_true(node) -> bool:
    return isinstance(node, ast.Constant) and node.value is True


def _is_false(node) -> bool:
    return isinstance(node, ast.Constant) and node.value is False


def test_no_package_code_can_unpickle():
    """Only protobuf messages cross the service's sockets, and files are read as safetensors, npz
    without pickle, JSON or safe YAML. (Ray pickles its own calls between the cluster's processes,
    behind Ray's token authentication: not bytes from clients.)"""
    repo = Path(__file__).resolve().parent.parent
    found = [f"{path.relative_to(repo)}:{line}: {what}"
             for folder in PACKAGE_DIRS for path in sorted((repo / folder).rglob("*.py"))
             for line, what in unsafe_loads(ast.parse(path.read_text(), str(path)))]
    assert found == []


def test_the_pickle_scan_finds_each_way():
    source = ("import pickle\nfrom dill import loads\nimport torch\ntorch.load(f)\ntorch.load(f, weights_only=True)\n"
              "np.load(f, allow_pickle=True)\nnp.load(f)\nyaml.load(s)\nyaml.safe_load(s)\n")
    assert [line for line, _ in unsafe_loads(ast.parse(source))] == [1, 2, 4, 6, 8]


# --- a real cluster with everything on -------------------------------------------------------

METRICS_WAIT_SECONDS = 30.0  # the embedded cluster reports every 2 s


# A secured cluster of its own (~70 s on an AMD EPYC 2-core host): with the slow suite; the
# secrets' and certificates' unit tests above run by default.
@pytest.mark.slow
def test_a_secured_cluster_refuses_strangers_and_no_secret_reaches_logs_stats_or_metrics(
        tiny_zoo, specserve_home, tmp_path, monkeypatch):
    """`specserve serve` with the API token, the internal token from a file and a TLS directory."""
    from specserve.proto.v1 import internal_pb2, internal_pb2_grpc

    ca, ca_key, ca_cert = make_ca()
    node_ip = ray.util.get_node_ip_address()  # Ray's node address: what the router and the workers advertise
    leaf = make_leaf(ca_key, ca_cert, ("localhost", INTERNAL_SERVER_NAME), tuple({"127.0.0.1", node_ip}))
    tls_dir = write_tls_dir(tmp_path / "tls", ca, leaf)
    api_token, internal_token = secrets.token_urlsafe(24), secrets.token_urlsafe(24)
    (tmp_path / "internal-token").write_text(internal_token + "\n")
    security = {API_TOKEN_ENV: api_token, INTERNAL_TOKEN_FILE_ENV: str(tmp_path / "internal-token"),
                TLS_DIR_ENV: str(tls_dir)}
    for name, value in security.items():  # for the client serve_in_subprocess makes from the ready line
        monkeypatch.setenv(name, value)
    # Its own Ray temp dir, to search its logs; short, since Ray's socket paths must fit in 107 bytes.
    ray_tmp = Path(tempfile.mkdtemp(prefix="ss-", dir="/tmp"))
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | {
        "SPECSERVE_HOME": specserve_home, "RAY_TMPDIR": str(ray_tmp)}
    metrics_port = free_port()
    log = tmp_path / "serve.log"
    request = pb.GenerateRequest(prompt="SELECT name FROM", max_tokens=8)
    # The default config with eager drafts, as the session's service runs them: compiling their
    # passes (tests/test_graphs.py) would add ~15 s before the ready line and test nothing of security.
    config = tmp_path / "eager-drafts.yaml"
    config.write_text(yaml.safe_dump(serve_config(DEFAULT_CONFIG_FILE,
                                                  overrides={"draft_pool": {"batching": {"compiled": False}}})))
    try:
        with serve_in_subprocess(["--config", str(config), "--zoo", str(tiny_zoo.root), "--port", "0",
                                  "--metrics-port", str(metrics_port)], env, log) as (client, _):
            # Token and TLS from the environment; the router's Draft and Verify streams over mTLS with its token.
            on = client.generate(pb.GenerateRequest(prompt="SELECT name FROM", max_tokens=8, task="sql", draft="sql",
                                                    speculation=pb.SPECULATION_ON), timeout=60)
            off = client.generate(pb.GenerateRequest(prompt="SELECT name FROM", max_tokens=8,
                                                     speculation=pb.SPECULATION_OFF), timeout=60)
            assert on.stats.proposed_tokens > 0 and list(on.token_ids) == list(off.token_ids) != []
            assert [c.token_ids for c in client.stream(request, timeout=60)]
            with grpc.secure_channel(client.address, grpc.ssl_channel_credentials(ca.cert)) as channel:
                stub = rpc.SpecServeStub(channel)
                wrong = (("authorization", "Bearer wrong"),)
                for metadata, message in (((), MISSING), (wrong, "invalid bearer token")):
                    with pytest.raises(grpc.RpcError) as caught:
                        stub.Generate(request, metadata=metadata, timeout=30)
                    assert (caught.value.code(), caught.value.details()) == (grpc.StatusCode.UNAUTHENTICATED, message)
            stats = client.stats()
            assert {w.kind for w in stats.workers} == {"target", "draft"}
            certificate_only = SecuritySettings(tls=TlsFiles.load(tls_dir))
            ca_only = grpc.ssl_channel_credentials(ca.cert)
            for worker in stats.workers:
                stub_of = internal_pb2_grpc.VerifierStub if worker.kind == "target" else internal_pb2_grpc.DrafterStub
                with internal_channel(worker.address, SecuritySettings.from_env()) as channel:  # the router's way
                    assert stub_of(channel).Inspect(internal_pb2.InspectRequest(), timeout=10).worker_id
                with internal_channel(worker.address, certificate_only) as channel:
                    with pytest.raises(grpc.RpcError) as caught:
                        stub_of(channel).Inspect(internal_pb2.InspectRequest(), timeout=10)
                    assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED, worker.worker_id
                with grpc.secure_channel(worker.address, ca_only,
                                         options=(("grpc.ssl_target_name_override", INTERNAL_SERVER_NAME),)) as channel:
                    with pytest.raises(grpc.RpcError) as caught:
                        stub_of(channel).Inspect(internal_pb2.InspectRequest(), timeout=10)
                    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE, worker.worker_id  # no handshake
            metrics = scrape_when_reported(metrics_port)
        secrets_ = [api_token.encode(), internal_token.encode(), leaf.key.splitlines()[1]]
        assert not [s for s in secrets_ if s in stats.SerializeToString() or s in str(stats).encode()]
        assert not [s for s in secrets_ if s in metrics]
        files = [log, *(p for p in ray_tmp.rglob("*") if p.is_file() and not p.is_symlink())]
        assert len([p for p in files if p.suffix in (".log", ".err", ".out")]) > 5, "no Ray logs to search"
        assert "security: client API: bearer token required, TLS on" in log.read_text()
        leaked = [str(p) for p in files if any(s in p.read_bytes() for s in secrets_)]
        assert leaked == []
    except BaseException:
        print(f"the cluster's Ray logs are kept in {ray_tmp}")
        raise
    shutil.rmtree(ray_tmp, ignore_errors=True)


def scrape_when_reported(port: int) -> bytes:
    """The metrics text once the router's specserve_ metrics are in it."""
    deadline = time.monotonic() + METRICS_WAIT_SECONDS
    while b"ray_specserve_requests_total" not in (body := urllib.request.urlopen(
            f"http://127.0.0.1:{port}/metrics", timeout=10).read()):
        assert time.monotonic() < deadline, f"no specserve metrics at :{port}/metrics"
        time.sleep(1.0)
    return body
