"""After the CANN runtime's example/2_advanced_features/label/0_simple_label: labels on a
persistent stream bound to a model run instance, and a jump chosen by an index in device
memory.

A persistent stream is bound to a new model (aclmdlRIBuildBegin) as its head; two labels
are made and put in a label list; on the stream go a switch-by-index task reading the
branch index (1) from device memory, then the two labels and the end-of-graph task. The
model is built, replayed once on another stream and synchronized; then everything is
released in reverse order, each release checked.
"""

import struct
import sys

import acl

DEVICE_ID = 0
BRANCH_INDEX = 1
LABEL_COUNT = 2


def check(ret, call):
    """Stop the program (status 1) when an acl call did not succeed."""
    if ret != acl.ACL_SUCCESS:
        raise RuntimeError(f"{call} failed with ret = {ret} ({acl.get_recent_err_msg()})")


def build_and_run(made):
    """Everything up to the replay; `made` collects what has to be released."""
    check(acl.init(), "acl.init")
    made["acl"] = True
    print("[INFO]  ACL initialized.")
    check(acl.rt.set_device(DEVICE_ID), "acl.rt.set_device")
    made["device"] = True
    print(f"[INFO]  Device {DEVICE_ID} selected.")
    made["context"], ret = acl.rt.create_context(DEVICE_ID)
    check(ret, "acl.rt.create_context")
    print(f"[INFO]  Context created on device {DEVICE_ID}.")
    made["label_stream"], ret = acl.rt.create_stream_with_config(0, acl.ACL_STREAM_PERSISTENT)
    check(ret, "acl.rt.create_stream_with_config")
    print("[INFO]  Persistent label stream created.")
    made["execute_stream"], ret = acl.rt.create_stream()
    check(ret, "acl.rt.create_stream")
    print("[INFO]  Execute stream created.")

    made["model"], ret = acl.mdl.ri_build_begin(0)
    check(ret, "acl.mdl.ri_build_begin")
    print("[INFO]  Model runtime instance build started.")
    check(
        acl.mdl.ri_bind_stream(made["model"], made["label_stream"], acl.ACL_MODEL_STREAM_FLAG_HEAD),
        "acl.mdl.ri_bind_stream",
    )
    made["bound"] = True
    print("[INFO]  Persistent label stream bound to the model runtime instance.")

    made["index"], ret = acl.rt.malloc(4, acl.ACL_MEM_MALLOC_HUGE_FIRST)
    check(ret, "acl.rt.malloc")
    print("[INFO]  Allocated device memory for branch index.")
    index = struct.pack("<I", BRANCH_INDEX)
    check(
        acl.rt.memcpy(
            made["index"], 4, acl.util.bytes_to_ptr(index), 4, acl.ACL_MEMCPY_HOST_TO_DEVICE
        ),
        "acl.rt.memcpy",
    )
    print(f"[INFO]  Copied branch index {BRANCH_INDEX} from host to device.")

    made["labels"] = []
    for number in range(LABEL_COUNT):
        label, ret = acl.rt.create_label()
        check(ret, "acl.rt.create_label")
        made["labels"].append(label)
        print(f"[INFO]  Created label {number}.")
    made["label_list"], ret = acl.rt.create_label_list(made["labels"], LABEL_COUNT)
    check(ret, "acl.rt.create_label_list")
    print(f"[INFO]  Created label list with {LABEL_COUNT} labels.")

    check(
        acl.rt.switch_label_by_index(
            made["index"], LABEL_COUNT, made["label_list"], made["label_stream"]
        ),
        "acl.rt.switch_label_by_index",
    )
    print(f"[INFO]  Submitted switch-label task with branch index {BRANCH_INDEX}.")
    for number, label in enumerate(made["labels"]):
        check(acl.rt.set_label(label, made["label_stream"]), "acl.rt.set_label")
        print(f"[INFO]  Set label {number} on the persistent stream.")
    check(acl.mdl.ri_end_task(made["model"], made["label_stream"]), "acl.mdl.ri_end_task")
    check(acl.mdl.ri_build_end(made["model"], None), "acl.mdl.ri_build_end")
    print("[INFO]  Model runtime instance build finished.")

    check(
        acl.mdl.ri_execute_async(made["model"], made["execute_stream"]),
        "acl.mdl.ri_execute_async",
    )
    check(acl.rt.synchronize_stream(made["execute_stream"]), "acl.rt.synchronize_stream")
    print(f"[INFO]  Switch label executed successfully with branch index {BRANCH_INDEX}.")


def release(made):
    """Release what was made, newest first; False if a release failed."""
    steps = []
    if made.get("bound"):
        steps.append(
            (
                "acl.mdl.ri_unbind_stream",
                acl.mdl.ri_unbind_stream,
                made["model"],
                made["label_stream"],
            )
        )
    if "model" in made:
        steps.append(("acl.mdl.ri_destroy", acl.mdl.ri_destroy, made["model"]))
    if "label_list" in made:
        steps.append(("acl.rt.destroy_label_list", acl.rt.destroy_label_list, made["label_list"]))
    for label in reversed(made.get("labels", [])):
        steps.append(("acl.rt.destroy_label", acl.rt.destroy_label, label))
    if "index" in made:
        steps.append(("acl.rt.free", acl.rt.free, made["index"]))
    for name in ("execute_stream", "label_stream"):
        if name in made:
            steps.append(("acl.rt.destroy_stream", acl.rt.destroy_stream, made[name]))
    if "context" in made:
        steps.append(("acl.rt.destroy_context", acl.rt.destroy_context, made["context"]))
    if made.get("device"):
        steps.append(("acl.rt.reset_device_force", acl.rt.reset_device_force, DEVICE_ID))
    if made.get("acl"):
        steps.append(("acl.finalize", acl.finalize))
    ok = True
    for name, call, *args in steps:
        ret = call(*args)
        if ret != acl.ACL_SUCCESS:
            print(f"[ERROR] Operation failed: {name} returned error code {ret}")
            ok = False
    return ok


def main():
    made = {}
    ok = True
    try:
        build_and_run(made)
    except RuntimeError as error:
        print(f"[ERROR] {error}")
        ok = False
    ok = release(made) and ok
    if not ok:
        sys.exit(1)
    print("[INFO]  Run the simple_label sample successfully.")


if __name__ == "__main__":
    main()
