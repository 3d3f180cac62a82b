"""One op list: every op in the compiler's table (adapter/compiler/ops/registry.cpp) has an NPU
kernel registered by the plugin, and every NPU kernel is for a compiler op, except the ops named
with a reason (the table's unregistered rows, op_coverage.cpp's plugin-only ops). The plugin
registers the compiler's ops from that table; the registrations are read back from TensorFlow's
kernel registry, so a row that no kernel class registers, or one added without deciding on
TensorFlow (no kernel class, no reason), is caught."""

import pytest

pytest.importorskip("tensorflow")


@pytest.fixture(name="lists")
def fixture_lists(npusim, tf):  # pylint: disable=unused-argument
    from tensorflow.python.framework import kernels  # pylint: disable=import-outside-toplevel

    cov = npusim._hooks.op_coverage()  # pylint: disable=protected-access
    npu = {k.op for k in kernels.get_all_registered_kernels().kernel if k.device_type == "NPU"}
    return set(cov["compiler_ops"]), npu, cov["unregistered"], cov["plugin_only"]


def _disagreements(side, other, listed):
    """Ops of `side` missing from `other` and not `listed`; `listed` ops that are in `other` or
    not in `side` (stale entries)."""
    missing = sorted(side - other - set(listed))
    stale = sorted(op for op in listed if op in other or op not in side)
    return missing, stale


def test_every_compiler_op_is_registered_or_has_a_reason(lists):
    compiler, npu, unregistered, _ = lists
    assert len(compiler) > 100 and len(npu) > 100  # both lists were really read
    missing, stale = _disagreements(compiler, npu, unregistered)
    assert not missing, f"compiler ops with neither an NPU kernel nor a reason: {missing}"
    assert not stale, f"op_coverage.cpp lists as unregistered compiler ops: {stale}"


def test_every_npu_kernel_is_a_compiler_op_or_has_a_reason(lists):
    compiler, npu, _, plugin_only = lists
    missing, stale = _disagreements(npu, compiler, plugin_only)
    assert not missing, f"NPU kernels for ops the compiler lacks, no reason given: {missing}"
    assert not stale, f"op_coverage.cpp lists as plugin-only: {stale}"


def test_every_npu_kernel_is_for_a_tensorflow_op(lists):
    # pylint: disable-next=import-outside-toplevel
    from tensorflow.python.framework import op_def_registry

    _, npu, _, _ = lists
    unknown = sorted(op for op in npu if op_def_registry.get(op) is None)
    assert not unknown, f"NPU kernels registered for ops TensorFlow does not define: {unknown}"


def test_reasons_are_one_line(lists):
    _, _, unregistered, plugin_only = lists
    for op, reason in {**unregistered, **plugin_only}.items():
        assert reason.strip() and "\n" not in reason, op
