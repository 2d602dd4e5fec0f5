"""What a new pyACL process loads before its first call: acl's calls are generated when first
looked up, and the session imports neither numpy nor the parts a first call does not use.
Each test runs a fresh process (this one has long since looked everything up)."""

from __future__ import annotations

import json

from conftest import run_client


def output(result) -> dict:
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.splitlines()[-1])


def test_calls_are_generated_on_first_lookup_with_their_bodies_signatures(daemon):
    found = output(
        run_client(
            daemon.address,
            """
        import inspect, json
        import acl, acl.media, acl.rt, acl.rt_memory

        before = "memcpy" in vars(acl.rt)
        first = acl.rt.memcpy
        star = {}
        exec("from acl.rt import *", star)
        mismatched, names = [], 0
        for module in (acl.rt, acl.rt_memory, acl.media):
            for name in dir(module):
                function = getattr(module, name)
                if hasattr(function, "body"):
                    names += 1
                    params = inspect.signature(function.body).parameters.values()
                    body = [  # after rt, less the call site the generated function passes
                        p.name for p in params if p.kind != p.KEYWORD_ONLY
                    ][1:]
                    if (
                        list(inspect.signature(function).parameters) != body
                        or function.__name__ != name
                    ):
                        mismatched.append(f"{module.__name__}.{name}")
        print(json.dumps({
            "before": before, "after": "memcpy" in vars(acl.rt), "same": first is acl.rt.memcpy,
            "module": first.__module__, "names": names, "mismatched": mismatched,
            "memory_is_rt": acl.rt.mem_pool_create is acl.rt_memory.mem_pool_create,
            "star_has_all": {"memcpy", "mem_pool_create", "get_function_addr"} <= set(star),
            "star_calls": sorted(n for n in star if hasattr(star[n], "body")) == sorted(
                n for n in dir(acl.rt) if hasattr(getattr(acl.rt, n), "body")),
        }))
    """,
        )
    )
    assert found["before"] is False and found["after"] is True and found["same"] is True
    assert found["module"] == "acl.rt" and found["memory_is_rt"] is True
    assert found["names"] > 60 and found["mismatched"] == []
    assert found["star_has_all"] is True and found["star_calls"] is True


def test_a_first_call_imports_only_what_it_needs(daemon):
    found = output(
        run_client(
            daemon.address,
            """
        import json, sys
        import acl

        assert acl.init() == 0 and acl.rt.set_device(0) == 0
        stream, ret = acl.rt.create_stream()
        later = ("numpy", "acl.util", "acl.media", "simnpu.proto.kernel_abi",
                 "simnpu.client.buffers", "simnpu.client.kernel_modules", "simnpu.client.stream")
        loaded = [name for name in later if name in sys.modules]
        function, ret_function = acl.rt.binary_get_function(acl.SIMNPU_BUILTIN_BINARY, "add_f32")
        ptr = acl.util.bytes_to_ptr(b"simnpu")
        from simnpu import kernel
        import simnpu.client as npu
        print(json.dumps({
            "ret": ret, "loaded": loaded, "function": ret_function, "ptr": ptr > 0,
            "kernel": kernel.__module__, "Stream": npu.Stream.__module__,
            "dir": "Stream" in dir(npu),
            "util_in_dir": "util" in dir(acl), "finalize": [acl.rt.reset_device(0), acl.finalize()],
        }))
    """,
        )
    )
    assert found["ret"] == 0 and found["loaded"] == []
    assert found["function"] == 0 and found["ptr"] is True
    assert (
        found["kernel"] == "simnpu.proto.kernel_abi" and found["Stream"] == "simnpu.client.stream"
    )
    assert found["dir"] is True and found["util_in_dir"] is True and found["finalize"] == [0, 0]
