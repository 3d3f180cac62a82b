"""tf.config.experimental.get_memory_info / reset_memory_stats for the NPU.

The plugin places every tensor with the runtime's own allocator (use_bfc_allocator = 0 in
stream_executor.cpp: 512-byte-aligned blocks whose L2 behaviour does not depend on where a tensor
lands, so a report is the same run after run; docs/tf_plugin.md, "Device memory"). TensorFlow
then wraps that allocator in its PluggableDeviceSimpleAllocator, whose statistics are always
zero and which cannot reset them. These two calls are therefore answered from the runtime
allocator's own figures for NPU devices (the bytes of live device blocks and their peak), and
passed to TensorFlow unchanged for every other device.
"""

import re

_NPU_DEVICE = re.compile(r"(?:^|[/:])NPU:(\d+)$", re.IGNORECASE)


def _is_npu(device):
    return isinstance(device, str) and _NPU_DEVICE.search(device.strip()) is not None


def install(hooks):
    from tensorflow.python.eager import context

    cls = context.Context
    if vars(cls).get("_npusim_memory_patched", False):
        return
    get_memory_info = cls.get_memory_info
    reset_memory_stats = cls.reset_memory_stats

    def npu_memory_info(self, dev):
        if not _is_npu(dev):
            return get_memory_info(self, dev)
        self.ensure_initialized()  # creates the devices (and opens the chip) like TensorFlow's
        memory = hooks.device().get("memory")
        chip = int(_NPU_DEVICE.search(dev.strip()).group(1))
        if chip > 0:  # several NPUs: chip k's allocator
            per_chip = hooks.system().get("memory", [])
            memory = per_chip[chip] if chip < len(per_chip) else None
        if memory is None:
            return get_memory_info(self, dev)
        return {"current": memory["bytes_in_use"], "peak": memory["peak_bytes_in_use"]}

    def npu_reset_memory_stats(self, dev):
        if not _is_npu(dev):
            return reset_memory_stats(self, dev)
        self.ensure_initialized()
        hooks.reset_memory_peak(int(_NPU_DEVICE.search(dev.strip()).group(1)))
        return None

    cls.get_memory_info = npu_memory_info
    cls.reset_memory_stats = npu_reset_memory_stats
    cls._npusim_memory_patched = True  # pylint: disable=protected-access
