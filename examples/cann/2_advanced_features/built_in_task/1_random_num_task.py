"""Follows the CANN runtime's example/2_advanced_features/built_in_task/1_random_num_task:
random number tasks on a stream (acl.rt.random_num_async) -- a normal distribution of
float32, a truncated normal of bfloat16, uniform float16 and int32 distributions and a
dropout bitmask -- sharing one 16-byte Philox counter in device memory. simnpu's generator
is its own Philox4x32-10 (docs/acl.md), so the numbers are not the hardware's; each run
with seed 0 prints the same ones."""

import struct
import sys

import numpy as np

import acl

ACL_SUCCESS = 0
ACL_MEM_MALLOC_HUGE_FIRST = 0
ACL_MEMCPY_DEVICE_TO_HOST = 2
ACL_FLOAT = 0
ACL_FLOAT16 = 1
ACL_INT32 = 3
ACL_BF16 = 27
DROPOUT_BITMASK, UNIFORM, NORMAL, TRUNCATED_NORMAL = 0, 1, 2, 3
COUNTER_SIZE = 16
SHOWN = 5


def check(ret, what):
    if ret != ACL_SUCCESS:
        print(f"{what} failed with error code {ret}")
        sys.exit(1)


def value(data, size):
    """An aclrtRandomParaInfo holding an immediate value of `size` bytes."""
    return {"is_addr": 0, "value_or_addr": data, "size": size}


def task_info(data_type, func_type, param_info, seed, num, counter, output):
    return {
        "data_type": data_type,
        "random_num_func_para_info": {"func_type": func_type, "param_info": param_info},
        "random_para_addr": 0,
        "random_result_addr": output,
        "random_counter_addr": counter,
        "random_seed": value(struct.pack("<Q", seed), 8),
        "random_num": value(struct.pack("<Q", num), 8),
    }


def normal_float(mean, stddev, truncated, seed, num, counter, output, stream):
    info = task_info(
        ACL_FLOAT,
        TRUNCATED_NORMAL if truncated else NORMAL,
        {
            "normal_dis_info": {
                "mean": value(struct.pack("<f", mean), 4),
                "stddev": value(struct.pack("<f", stddev), 4),
            }
        },
        seed,
        num,
        counter,
        output,
    )
    return acl.rt.random_num_async(info, stream, 0)


def normal_bf16(mean, stddev, truncated, seed, num, counter, output, stream):
    info = task_info(
        ACL_BF16,
        TRUNCATED_NORMAL if truncated else NORMAL,
        {
            "normal_dis_info": {
                "mean": value(struct.pack("<H", mean), 2),
                "stddev": value(struct.pack("<H", stddev), 2),
            }
        },
        seed,
        num,
        counter,
        output,
    )
    return acl.rt.random_num_async(info, stream, 0)


def uniform_fp16(low, high, seed, num, counter, output, stream):
    info = task_info(
        ACL_FLOAT16,
        UNIFORM,
        {
            "uniform_dis_info": {
                "min": value(struct.pack("<H", low), 2),
                "max": value(struct.pack("<H", high), 2),
            }
        },
        seed,
        num,
        counter,
        output,
    )
    return acl.rt.random_num_async(info, stream, 0)


def uniform_int32(low, high, seed, num, counter, output, stream):
    info = task_info(
        ACL_INT32,
        UNIFORM,
        {
            "uniform_dis_info": {
                "min": value(struct.pack("<i", low), 4),
                "max": value(struct.pack("<i", high), 4),
            }
        },
        seed,
        num,
        counter,
        output,
    )
    return acl.rt.random_num_async(info, stream, 0)


def dropout_bitmask(ratio, seed, num, counter, output, stream):
    info = task_info(
        ACL_FLOAT,
        DROPOUT_BITMASK,
        {"dropout_bitmask_info": {"dropout_ration": value(struct.pack("<f", ratio), 4)}},
        seed,
        num,
        counter,
        output,
    )
    return acl.rt.random_num_async(info, stream, 0)


def fetch(stream, output, size, dtype):
    """Wait for the stream, then the results as a numpy array of `dtype`."""
    check(acl.rt.synchronize_stream(stream), "acl.rt.synchronize_stream")
    host = bytes(size)
    check(
        acl.rt.memcpy(acl.util.bytes_to_ptr(host), size, output, size, ACL_MEMCPY_DEVICE_TO_HOST),
        "acl.rt.memcpy",
    )
    return np.frombuffer(host, dtype)


def main():
    check(acl.init(), "acl.init")
    check(acl.rt.set_device(0), "acl.rt.set_device")
    stream, ret = acl.rt.create_stream()
    check(ret, "acl.rt.create_stream")

    seed, num = 0, 128
    size = num * 8  # room for the widest data type
    output, ret = acl.rt.malloc(size, ACL_MEM_MALLOC_HUGE_FIRST)
    check(ret, "acl.rt.malloc")
    counter, ret = acl.rt.malloc(COUNTER_SIZE, ACL_MEM_MALLOC_HUGE_FIRST)
    check(ret, "acl.rt.malloc")
    check(acl.rt.memset(counter, COUNTER_SIZE, 0, COUNTER_SIZE), "acl.rt.memset")
    wrong = []

    print("Gen normal distribution random num, data type: float ")
    check(normal_float(3.0, 2.0, False, seed, num, counter, output, stream), "normal float")
    floats = fetch(stream, output, size, np.float32)[:num]
    for index in range(SHOWN):
        print(f"Random result[{index}] = {floats[index]:f}")
    if not np.all(np.isfinite(floats)) or abs(float(floats.mean()) - 3.0) > 1.0:
        wrong.append(f"normal float32 numbers of mean {floats.mean()}, expected near 3")

    print("\nGen truncated normal distribution random num, data type: BF16 ")
    bf16_one, bf16_two = 0x3F80, 0x4000
    check(normal_bf16(bf16_one, bf16_two, True, seed, num, counter, output, stream), "normal bf16")
    bits = fetch(stream, output, size, np.uint16)[:num]
    for index in range(SHOWN):
        print(f"Random result[{index}] = {int(bits[index]):#x}")
    as_float = (bits.astype(np.uint32) << 16).view(np.float32)
    if np.any(as_float < -3.0) or np.any(as_float > 5.0):
        wrong.append("truncated normal bf16 numbers outside mean +- 2 stddev [-3, 5]")

    print("\nGen uniform distribution random num, data type: FP16 ")
    fp16_one, fp16_two = 0x3C00, 0x4000
    check(uniform_fp16(fp16_one, fp16_two, seed, num, counter, output, stream), "uniform fp16")
    halves = fetch(stream, output, size, np.uint16)[:num]
    for index in range(SHOWN):
        print(f"Random result[{index}] = {int(halves[index]):#x}")
    if np.any(halves.view(np.float16) < 1.0) or np.any(halves.view(np.float16) > 2.0):
        wrong.append("uniform fp16 numbers outside [1, 2]")

    print("\nGen uniform distribution random num, data type: INT32 ")
    check(uniform_int32(1, 100, seed, num, counter, output, stream), "uniform int32")
    ints = fetch(stream, output, size, np.int32)[:num]
    for index in range(SHOWN):
        print(f"Random result[{index}] = {int(ints[index])}")
    if np.any(ints < 1) or np.any(ints >= 100):
        wrong.append("uniform int32 numbers outside [1, 100)")

    print("\nGen dropout bitmask, output data type: UINT8 ")
    check(dropout_bitmask(0.4, seed, num, counter, output, stream), "dropout bitmask")
    mask = fetch(stream, output, size, np.uint8)[: num // 8]
    for index in range(SHOWN):
        print(f"Random result[{index}] = {int(mask[index])}")
    kept = int(np.unpackbits(mask).sum())
    if not 0.4 * num <= kept <= 0.8 * num:
        wrong.append(f"dropout bitmask keeps {kept} of {num}, expected about 60%")

    acl.rt.free(output)
    acl.rt.free(counter)
    acl.rt.destroy_stream(stream)
    acl.rt.reset_device_force(0)
    acl.finalize()
    for line in wrong:
        print(f"Wrong result: {line}")
    if wrong:
        return 1
    print("Sample Run Successfully.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
