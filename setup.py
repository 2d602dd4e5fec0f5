"""Build hook: compile proto/simnpu/v1/npu.proto into simnpu.proto.npu_pb2 at install time.

Runs for `pip install .` and `pip install -e .` alike (both call build_py), so a fresh
clone never needs a separate generation step. proto/generate.py is the same step by hand.
"""

import importlib.util
import pathlib

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = pathlib.Path(__file__).parent


class BuildWithProto(build_py):
    def run(self):
        spec = importlib.util.spec_from_file_location("generate", ROOT / "proto" / "generate.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        module.generate()
        super().run()


setup(cmdclass={"build_py": BuildWithProto})
