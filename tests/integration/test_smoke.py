"""The shortest end-to-end path: a kernel on a stream, results checked."""

import numpy as np


def test_add_on_a_stream(npu):
    with npu.Device(0):
        stream = npu.Stream()
        a = np.arange(4096, dtype=np.float32)
        x = npu.DeviceBuffer.from_array(a)
        y = npu.DeviceBuffer.from_array(np.full(4096, 2, np.float32))
        z = npu.DeviceBuffer(a.nbytes)
        npu.builtin("add_f32").launch(3, x, y, z, 4096, stream=stream)
        stream.synchronize()
        assert np.array_equal(z.to_numpy(np.float32), a + 2)
        stream.destroy()
        for buffer in (x, y, z):
            buffer.free()
