"""The committed stubs are exactly what protoc generates from the .proto files (no drift)."""

from pathlib import Path

from specserve.proto.generate import PROTO_ROOT, generate


def test_committed_stubs_match_the_proto_files(tmp_path):
    written = generate(tmp_path)
    assert {p.name for p in written} >= {"specserve_pb2.py", "specserve_pb2_grpc.py", "internal_pb2.py",
                                          "internal_pb2_grpc.py"}
    stale = [str(p) for p in written if (tmp_path / p).read_bytes() != (PROTO_ROOT / p).read_bytes()]
    assert not stale, f"stubs out of date: {stale}; run `python -m specserve.proto.generate` and commit them"


def test_stubs_import_under_the_package_namespace():
    from specserve.proto.v1 import internal_pb2, specserve_pb2, specserve_pb2_grpc

    assert specserve_pb2.DESCRIPTOR.package == "specserve.v1"
    assert internal_pb2.DESCRIPTOR.package == "specserve.v1.internal"
    assert hasattr(specserve_pb2_grpc, "SpecServeStub")
    assert Path(specserve_pb2.__file__).parent == PROTO_ROOT / "v1"
