"""Finding and loading the TensorFlow plugin (libnpusim_tf_plugin.so), and its ctypes hooks.

TensorFlow creates its devices once per process, when the first op runs (or
tf.config.list_logical_devices() is called); a PluggableDevice library loaded after that is
registered but never becomes a device. So load() refuses, with an error saying why, when
TensorFlow's devices already exist, and otherwise loads the plugin with TensorFlow's own loader
(tensorflow.python.framework.load_library.load_pluggable_device_library: it registers the
StreamExecutor platform and the kernels, then refreshes the list of physical devices).
"""

import ctypes
import json
import os
import site
import sysconfig

PLUGIN_FILE = "libnpusim_tf_plugin.so"
# Where adapter/tf/python/install_dev.py (run by scripts/setup.sh) links the built plugin.
INSTALL_DIR = "npusim_plugin"


class NpusimError(RuntimeError):
    """The NPU cannot be provided as asked (plugin missing, loaded too late, config clash)."""


def _site_dirs():
    dirs = []
    try:
        dirs += site.getsitepackages()
    except AttributeError:  # some virtualenv versions
        pass
    for name in ("purelib", "platlib"):
        dirs.append(sysconfig.get_path(name))
    seen, out = set(), []
    for d in dirs:
        if d and d not in seen:
            seen.add(d)
            out.append(d)
    return out


def find_plugin():
    """Path of the plugin: $NPUSIM_TF_PLUGIN, else <site-packages>/npusim_plugin/."""
    env = os.environ.get("NPUSIM_TF_PLUGIN")
    if env:
        if not os.path.isfile(env):
            raise NpusimError(f"NPUSIM_TF_PLUGIN={env}: no such file")
        return os.path.realpath(env)
    looked = []
    for d in _site_dirs():
        p = os.path.join(d, INSTALL_DIR, PLUGIN_FILE)
        looked.append(p)
        if os.path.isfile(p):
            return os.path.realpath(p)
    raise NpusimError(
        f"the TensorFlow plugin {PLUGIN_FILE} was not found (looked at NPUSIM_TF_PLUGIN and "
        + ", ".join(looked)
        + "). scripts/setup.sh builds and installs it when the Python environment has "
        "tensorflow; or set NPUSIM_TF_PLUGIN to a built libnpusim_tf_plugin.so."
    )


def _is_loaded(path):
    try:
        ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
        return True
    except OSError:
        return False


def _devices_created():
    """True once TensorFlow's eager context has created its devices."""
    from tensorflow.python.eager import context

    return context.context()._context_handle is not None  # pylint: disable=protected-access


def load(path):
    """Makes the plugin's NPU device available to TensorFlow (imports tensorflow if needed)."""
    import tensorflow  # noqa: F401  (its import loads site-packages/tensorflow-plugins)

    if _is_loaded(path):
        # Already loaded, e.g. through TF_PLUGGABLE_DEVICE_LIBRARY_PATH at TensorFlow's import.
        return
    if _devices_created():
        raise NpusimError(
            "TensorFlow has already created its devices (an op ran, or "
            "tf.config.list_logical_devices() was called) before `import npusim`, so the NPU "
            "can no longer appear in this process. Import npusim before running any TensorFlow "
            "op (importing tensorflow first is fine), or set "
            f"TF_PLUGGABLE_DEVICE_LIBRARY_PATH={path} before starting Python."
        )
    from tensorflow.python.framework import load_library

    load_library.load_pluggable_device_library(path)


class Hooks:
    """The plugin's npusim_tf_* C functions (python_hooks.cpp), read from the loaded library."""

    def __init__(self, path):
        self._lib = ctypes.CDLL(path)
        for name in ("npusim_tf_device_json", "npusim_tf_launch_records_json",
                     "npusim_tf_compiled_ops_json", "npusim_tf_chip_config_yaml",
                     "npusim_tf_counters_json", "npusim_tf_check_env_settings",
                     "npusim_tf_cpu_fallback_ops_json", "npusim_tf_op_coverage_json",
                     "npusim_tf_system_json", "npusim_tf_host_cpu_json"):
            getattr(self._lib, name).restype = ctypes.c_void_p
        self._lib.npusim_tf_launch_records_json.argtypes = [ctypes.c_int, ctypes.c_int]
        self._lib.npusim_tf_host_cpu_json.argtypes = [ctypes.c_int]
        self._lib.npusim_tf_free.argtypes = [ctypes.c_void_p]
        self._lib.npusim_tf_free.restype = None
        self._lib.npusim_tf_clear_launch_records.restype = None
        self._lib.npusim_tf_clear_cpu_fallback_ops.restype = None
        self._lib.npusim_tf_reset_memory_peak.restype = ctypes.c_int
        self._lib.npusim_tf_reset_memory_peak.argtypes = [ctypes.c_int]

    def _text(self, ptr):
        if not ptr:
            return None
        try:
            return ctypes.string_at(ptr).decode("utf-8")
        finally:
            self._lib.npusim_tf_free(ptr)

    def _json(self, ptr):
        text = self._text(ptr)
        return None if text is None else json.loads(text)

    def device(self):
        return self._json(self._lib.npusim_tf_device_json())

    def launch_records(self, with_counters, chip=0):
        mode = 2 if with_counters == "flat" else 1 if with_counters else 0
        return self._json(self._lib.npusim_tf_launch_records_json(mode, chip))

    def reset_memory_peak(self, chip=0):
        return bool(self._lib.npusim_tf_reset_memory_peak(chip))

    def clear_launch_records(self):
        self._lib.npusim_tf_clear_launch_records()

    def compiled_ops(self):
        return self._json(self._lib.npusim_tf_compiled_ops_json())

    def host_cpu_seconds(self, reset):
        return self._json(self._lib.npusim_tf_host_cpu_json(1 if reset else 0))

    def check_env_settings(self):
        """None if the NPUSIM_* settings in the environment load, else the error message."""
        return self._text(self._lib.npusim_tf_check_env_settings())

    def chip_config_yaml(self):
        return self._text(self._lib.npusim_tf_chip_config_yaml())

    def counters(self):
        return self._json(self._lib.npusim_tf_counters_json())

    def system(self):
        """The NPUs as a system of chips: links' counters, peer copies, collectives."""
        return self._json(self._lib.npusim_tf_system_json())

    def cpu_fallback_ops(self):
        """{op type: nodes} soft placement put on the CPU for want of an NPU kernel."""
        return self._json(self._lib.npusim_tf_cpu_fallback_ops_json())

    def clear_cpu_fallback_ops(self):
        self._lib.npusim_tf_clear_cpu_fallback_ops()

    def op_coverage(self):
        """The compiler's op list and the plugin's deliberate exceptions (op_coverage.h)."""
        return self._json(self._lib.npusim_tf_op_coverage_json())
