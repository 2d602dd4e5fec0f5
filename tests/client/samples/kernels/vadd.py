"""A simnpu kernel module (the "binary" kernel_launch.py loads with binary_load_from_file)."""

import numpy as np

from simnpu import kernel


@kernel("ptr", "ptr", "ptr", "u32")
def vadd(ctx, x, y, z, n):
    share = -(-n // ctx.block_num)
    start = ctx.block_idx * share
    count = max(0, min(n, start + share) - start)
    if count:
        np.add(
            ctx.gm(x + 4 * start, "float32", count, access="r"),
            ctx.gm(y + 4 * start, "float32", count, access="r"),
            out=ctx.gm(z + 4 * start, "float32", count),
        )
