"""The NPU as a TensorFlow device: listed, memory figures, tensors copied there and back,
configure() rules, import order (child processes)."""

import json
import os
import textwrap

import numpy as np
import pytest
import yaml

pytest.importorskip("tensorflow")

from conftest import TEST_CHIP, chip_config, config_bytes, run_child  # noqa: E402  pylint: disable=wrong-import-position


def test_npu_is_listed_once(tf):
    devices = tf.config.list_physical_devices("NPU")
    assert [d.device_type for d in devices] == ["NPU"]
    assert devices[0].name.endswith("NPU:0")
    assert any(d.name.endswith("NPU:0") for d in tf.config.list_logical_devices("NPU"))


def test_device_runs_the_configured_chip(npusim, tf):
    with tf.device("/NPU:0"):
        tf.identity(tf.zeros([4]))  # make sure the device exists
    info = npusim.device_info()
    assert info["open"]
    assert info["settings"]["chip"] == TEST_CHIP
    assert info["chip_identity"].startswith(TEST_CHIP + ":")
    # The config's memory.hbm.bytes (tiny: 1 GiB).
    assert info["hbm_bytes"] == config_bytes(chip_config()["memory"]["hbm"]["bytes"])


def test_memory_info_counts_a_tensor_on_the_npu(tf):
    before = tf.config.experimental.get_memory_info("NPU:0")
    assert set(before) >= {"current", "peak"}
    with tf.device("/NPU:0"):
        t = tf.identity(tf.ones([256, 1024], dtype=tf.float32))  # 1 MiB
    during = tf.config.experimental.get_memory_info("NPU:0")
    assert during["current"] - before["current"] >= 256 * 1024 * 4
    assert during["peak"] >= during["current"]
    del t


def test_reset_memory_stats_restarts_the_peak(tf):
    with tf.device("/NPU:0"):
        t = tf.identity(tf.ones([256, 1024], dtype=tf.float32))  # 1 MiB
    del t  # freed: the peak keeps it, the current figure drops
    tf.config.experimental.reset_memory_stats("NPU:0")
    after_reset = tf.config.experimental.get_memory_info("/device:NPU:0")
    assert after_reset["peak"] == after_reset["current"]
    with tf.device("/NPU:0"):
        u = tf.identity(tf.ones([512, 1024], dtype=tf.float32))  # 2 MiB
    peak = tf.config.experimental.get_memory_info("NPU:0")["peak"]
    assert peak - after_reset["current"] >= 512 * 1024 * 4
    del u
    later = tf.config.experimental.get_memory_info("NPU:0")
    assert later["peak"] == peak and later["current"] < peak


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.uint8, np.int64, np.bool_])
def test_tensor_round_trip_through_npu_memory(tf, dtype):
    rng = np.random.default_rng(7)
    host = (rng.standard_normal((33, 17)) * 50).astype(dtype)
    with tf.device("/NPU:0"):
        on_npu = tf.identity(tf.constant(host))
    assert on_npu.device.endswith("device:NPU:0")
    back = on_npu.numpy()
    assert back.dtype == host.dtype
    np.testing.assert_array_equal(back, host)


def test_a_test_without_the_fixture_opens_the_test_chip():
    """This test asks for no fixture: were it the first of its process to run an NPU op, it
    would open the NPU with the process's settings, and the tests after it (which ask for the
    test chip) would fail if that were another chip. conftest.py sets the test chip (tiny, or
    $NPUSIM_TEST_CHIP) when it loads, so the test files run in any order in one process."""
    import npusim  # pylint: disable=import-outside-toplevel,redefined-outer-name
    import tensorflow as tf  # pylint: disable=import-outside-toplevel,redefined-outer-name

    with tf.device("/NPU:0"):
        tf.identity(tf.zeros([1])).numpy()
    assert npusim.device_info()["settings"]["chip"] == TEST_CHIP


def test_large_tensor_round_trip(tf):
    host = np.arange(1 << 20, dtype=np.float32)  # 4 MiB: many pages
    with tf.device("/NPU:0"):
        on_npu = tf.identity(tf.constant(host))
    np.testing.assert_array_equal(on_npu.numpy(), host)


def test_configure_cannot_change_an_open_device(npusim, tf):
    with tf.device("/NPU:0"):
        tf.identity(tf.zeros([1]))
    npusim.configure(chip=TEST_CHIP)  # the same config: fine
    # The error names the setting that would change, both values, and the rule.
    other = "910b" if TEST_CHIP != "910b" else "tiny"
    with pytest.raises(npusim.NpusimError, match=rf"already in use.*chip '{TEST_CHIP}' -> "
                                                 rf"'{other}'.*one chip config per process"):
        npusim.configure(chip=other)
    with pytest.raises(npusim.NpusimError, match=r"already in use.*overrides \[\] -> "
                                                 r"\['memory.hbm.gbps=900'\]"):
        npusim.configure(overrides={"memory.hbm.gbps": 900})
    assert npusim.device_info()["settings"]["chip"] == TEST_CHIP


@pytest.mark.parametrize("imports", ["import tensorflow as tf\nimport npusim",
                                     "import npusim\nimport tensorflow as tf"],
                         ids=["tensorflow_first", "npusim_first"])
def test_import_order_and_configure_before_first_op(imports):
    # Either import order works; configure() checks the chip at once and applies overrides.
    result = run_child(imports + textwrap.dedent("""
        try:
            npusim.configure(chip="no_such_chip")
        except npusim.NpusimError as e:
            print("BAD_CHIP", "no_such_chip" in str(e))
        npusim.configure(chip="tiny", overrides={"memory.hbm.bytes": "512 MiB"})
        assert not npusim.device_info()["open"]
        with tf.device("/NPU:0"):
            x = tf.identity(tf.constant([1.0, 2.0]))
        print("VALUES", x.numpy().tolist())
        info = npusim.device_info()
        print("HBM", info["hbm_bytes"], info["settings"]["overrides"])
    """))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "BAD_CHIP True" in result.stdout
    assert "VALUES [1.0, 2.0]" in result.stdout
    assert f"HBM {512 << 20} ['memory.hbm.bytes=512 MiB']" in result.stdout


def test_import_after_the_first_op_is_a_clear_error():
    result = run_child(textwrap.dedent("""
        import tensorflow as tf
        tf.constant(1.0) + 1.0  # TensorFlow creates its devices here
        try:
            import npusim
        except Exception as e:
            print(type(e).__name__, str(e))
    """))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "NpusimError" in result.stdout
    assert "before `import npusim`" in result.stdout


def test_a_cpu_op_before_any_fixture_leaves_the_npu_to_later_tests():
    """The tests' process as pytest starts it: conftest.py loads, then the first test runs a
    TensorFlow op on the CPU (a reference) without the `npusim` or `tf` fixture, which creates
    TensorFlow's devices. A later test's `import npusim` and its NPU ops must still work, so
    that the test files pass in any order in one process (run after such a test, they failed
    with "already created its devices ... before `import npusim`"). conftest.py is loaded from
    its file, as pytest loads it, in a fresh Python."""
    conftest = os.path.join(os.path.dirname(os.path.abspath(__file__)), "conftest.py")
    result = run_child(textwrap.dedent(f"""
        import importlib.util
        spec = importlib.util.spec_from_file_location("conftest", {conftest!r})
        spec.loader.exec_module(importlib.util.module_from_spec(spec))
        import tensorflow as tf
        tf.constant(1.0) + 1.0  # TensorFlow creates its devices here
        import npusim
        with tf.device("/NPU:0"):
            y = tf.identity(tf.constant([1.0, 2.0])) * 3.0
        print("DEVICE", y.device.endswith("NPU:0"), npusim.device_info()["open"])
        print("VALUES", y.numpy().tolist())
    """))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "DEVICE True True" in result.stdout
    assert "VALUES [3.0, 6.0]" in result.stdout


def test_write_report(npusim, tf, tmp_path):
    with tf.device("/NPU:0"):
        (tf.constant(np.ones(64, np.float32)) * 2.0).numpy()
    assert npusim.write_report(tmp_path) == tmp_path
    assert yaml.safe_load((tmp_path / "chip.yaml").read_text())["name"] == TEST_CHIP
    launches = json.loads((tmp_path / "launches.json").read_text())
    assert launches and all("counters" in r for r in launches)
    # launches.json holds each launch's counters flat: the tree's leaves by dotted name.
    trees = npusim.launch_records(with_counters=True)
    assert len(trees) == len(launches)
    for flat, rec in zip(launches, trees):
        leaves = {}

        def walk(node, prefix):
            for k, v in node.items():
                if isinstance(v, dict) and "value" in v and "unit" in v:
                    leaves[prefix + k] = v["value"]
                elif isinstance(v, dict):
                    walk(v, prefix + k + ".")

        walk(rec["counters"]["chip"], "")
        assert leaves and flat["counters"] == leaves
    assert json.loads((tmp_path / "device.json").read_text())["open"]
    assert json.loads((tmp_path / "compiled_ops.json").read_text())["entries"] >= 1
