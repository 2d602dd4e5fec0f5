"""Compile proto/simnpu/v1/npu.proto into proto/npu_pb2.py (the module simnpu.proto.npu_pb2).

Usage: python proto/generate.py   (setup.py runs it at every install).
The .proto imports only protobuf's own descriptor.proto (for the `required` field option),
whose Python module ships with protobuf, so the generated module imports nothing generated
and can live under any package name.
"""

import pathlib
import shutil
import tempfile

HERE = pathlib.Path(__file__).resolve().parent
SOURCE = "simnpu/v1/npu.proto"


def generate() -> None:
    import grpc_tools
    from grpc_tools import protoc

    well_known = pathlib.Path(grpc_tools.__file__).parent / "_proto"  # descriptor.proto
    with tempfile.TemporaryDirectory() as out:
        args = [
            "protoc",
            f"-I{HERE}",
            f"-I{well_known}",
            f"--python_out={out}",
            f"--pyi_out={out}",
            str(HERE / SOURCE),
        ]
        if protoc.main(args) != 0:
            raise RuntimeError(f"protoc failed on {SOURCE}")
        for suffix in (".py", ".pyi"):
            shutil.copyfile(
                pathlib.Path(out) / f"simnpu/v1/npu_pb2{suffix}", HERE / f"npu_pb2{suffix}"
            )


if __name__ == "__main__":
    generate()
