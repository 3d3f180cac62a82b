"""FusedElementwise, the op of a fused chain of element-wise ops (adapter/tf/plugin/
kernels_fused.cpp; the contract in adapter/compiler/ops/fused_elementwise.h): its op
definition's shape function is the inputs' broadcast."""

import pytest

pytest.importorskip("tensorflow")


def test_op_definition_infers_the_broadcast_shape(tf):
    """FusedElementwise's shape function (kernels_fused.cpp): the numpy broadcast of all
    inputs, a dimension unknown where no input knows it."""
    assert tf.config.list_physical_devices("NPU")  # the plugin (and its op definitions) loaded
    g = tf.Graph()
    with g.as_default():
        def node(*shapes):
            ins = [tf.compat.v1.placeholder(tf.float32, s) for s in shapes]
            op = g._create_op_internal(  # pylint: disable=protected-access
                "FusedElementwise", ins, [tf.float32],
                attrs={"T": tf.compat.v1.AttrValue(type=tf.float32.as_datatype_enum),
                       "N": tf.compat.v1.AttrValue(i=len(ins)),
                       "steps": tf.compat.v1.AttrValue(
                           list=tf.compat.v1.AttrValue.ListValue(s=[b"Neg i0"]))})
            return op.outputs[0].shape.as_list() if op.outputs[0].shape.rank is not None \
                else None
        assert node([4, 1, 3], [5, 1], [3]) == [4, 5, 3]
        assert node([2, 3]) == [2, 3]
        assert node([None, 1], [1, 7], []) == [None, 7]
        assert node([1, 1], [1]) == [1, 1]
        assert node(None, [3]) is None
