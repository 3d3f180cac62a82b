"""Offline models (.om, made by `npusim compile`) run from Python: load_offline_model(path)(x).

Each call runs `npusim infer` in a child process: the simulator of this process (if TensorFlow
has created the NPU) models the chip chosen for TensorFlow, and SystemC elaborates one chip per
process, while an .om carries its own chip. The binary is $NPUSIM_BIN, else the `npusim` next to
the built plugin, else `npusim` on PATH. docs/graph_engine.md, "From Python".
"""

import json
import os
import shutil
import struct
import subprocess
import tempfile

from ._plugin import NpusimError

OM_MAGIC = b"NPUSIMOM"
_DTYPES = {"f32": "float32", "f16": "float16", "bf16": "uint16", "s32": "int32", "s16": "int16",
           "s8": "int8", "u8": "uint8", "u16": "uint16", "s64": "int64", "bool": "bool"}


def _npusim_binary(plugin_path):
    env = os.environ.get("NPUSIM_BIN")
    if env:
        if not os.access(env, os.X_OK):
            raise NpusimError(f"NPUSIM_BIN={env}: not an executable file")
        return env
    if plugin_path:
        beside = os.path.join(os.path.dirname(os.path.realpath(plugin_path)), "npusim")
        if os.access(beside, os.X_OK):
            return beside
    found = shutil.which("npusim")
    if not found:
        raise NpusimError("the npusim binary was not found (set NPUSIM_BIN, or build it next to "
                          "the plugin with scripts/setup.sh)")
    return found


def read_om_header(path):
    """The JSON header of an .om file (chip, precision, inputs, outputs, tasks, info). Checks the
    magic only: `npusim infer` checks the version, size and checksum."""
    with open(path, "rb") as f:
        prefix = f.read(40)
        if len(prefix) < 40 or prefix[:8] != OM_MAGIC:
            raise NpusimError(f"{path}: not an npusim offline model (.om)")
        (size,) = struct.unpack("<Q", prefix[32:40])
        text = f.read(size)
    try:
        return json.loads(text)
    except ValueError as e:
        raise NpusimError(f"{path}: malformed header: {e}") from None


class OfflineModel:
    """A compiled .om; call it with numpy arrays (positional in the model's input order, or by
    input name). Returns the output array, or a dict by output name if the model has several."""

    def __init__(self, path, chip=None, plugin_path=None):
        self.path = os.path.abspath(path)
        header = read_om_header(self.path)
        self.chip = header["chip"]
        self.inputs = [(i["name"], i["tensor"]["dtype"], tuple(i["tensor"]["shape"]))
                       for i in header["inputs"]]
        self.outputs = [o["name"] for o in header["outputs"]]
        self._check_chip = chip
        self._binary = _npusim_binary(plugin_path)
        self.last_stdout = ""

    def __call__(self, *args, loop=1, report_dir=None, **named):
        import numpy as np  # pylint: disable=import-outside-toplevel
        if len(args) + len(named) != len(self.inputs):
            raise NpusimError(f"{self.path} takes {len(self.inputs)} input(s) "
                              f"({', '.join(n for n, _, _ in self.inputs)}), "
                              f"{len(args) + len(named)} given")
        with tempfile.TemporaryDirectory(prefix="npusim-infer-") as tmp:
            cmd = [self._binary, "infer", self.path, "--loop", str(loop)]
            if self._check_chip:
                cmd += ["--chip", self._check_chip]
            if report_dir:
                cmd += ["--report-dir", os.path.abspath(report_dir)]
            values = dict(zip((n for n, _, _ in self.inputs), args))
            values.update(named)
            for k, (name, _, _) in enumerate(self.inputs):
                if name not in values:
                    raise NpusimError(f"{self.path}: no value for input '{name}'")
                f = os.path.join(tmp, f"in{k}.npy")
                np.save(f, np.asarray(values[name]))
                cmd += ["--input", f"{name}={f}"]
            outs = [os.path.join(tmp, f"out{k}.npy") for k in range(len(self.outputs))]
            for name, f in zip(self.outputs, outs):
                cmd += ["--output", f"{name}={f}"]
            r = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if r.returncode != 0:
                raise NpusimError(r.stderr.strip().removeprefix("npusim: error: ")
                                  or f"npusim infer exited with {r.returncode}")
            self.last_stdout = r.stdout
            results = {name: np.load(f) for name, f in zip(self.outputs, outs)}
        return results[self.outputs[0]] if len(results) == 1 else results


def load_offline_model(path, chip=None, plugin_path=None):
    """Loads an .om written by `npusim compile`. chip: if given, the model must be for it."""
    if not os.path.isfile(path):
        raise NpusimError(f"{path}: no such file")
    return OfflineModel(path, chip=chip, plugin_path=plugin_path)
