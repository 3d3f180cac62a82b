"""The TensorFlow frontend of `npusim compile` (docs/graph_engine.md, "Frontend").

Loads a SavedModel (Keras `model.export()` or `tf.saved_model.save`), takes one signature,
fixes its input shapes, freezes the variables into constants, lets TensorFlow's grappler fold
constants (with static shapes a Keras batch norm's arithmetic folds into the convolution's filter
and one per-channel add), and writes the graph in the engine's input format:

  OUT/graph.json   {"format": "npusim-graph", "version": 1, "inputs": [...], "outputs": [...],
                    "nodes": [{"name", "op", "inputs": ["node:port"], "attrs": {...},
                               "outputs": [{"dtype", "shape"}], "value": "weights/N.npy"}]}
  OUT/weights/N.npy  the value of each Const node

Attribute values are tagged: {"i": int}, {"f": float}, {"b": bool}, {"s": str},
{"ints": [...]}, {"strs": [...]}, {"type": "f32"}; attributes of other kinds (shapes, tensors,
functions) are left out. Exit status 1 with one line on stderr for bad input.

    python tools/npusim_compile_frontend.py SAVED_MODEL_DIR OUT [--signature NAME]
        [--input-shape NAME:1,224,224,3 ...]
"""

import argparse
import json
import math
import os
import sys

DTYPES = {"float32": "f32", "float16": "f16", "bfloat16": "bf16", "int32": "s32", "int16": "s16",
          "int8": "s8", "uint8": "u8", "uint16": "u16", "int64": "s64", "bool": "bool"}

# Ops whose output shape is a function of static shapes alone: with the input shapes fixed they
# become constants before grappler runs (grappler leaves Shape of a fed placeholder alone).
SHAPE_OPS = ("Shape", "Size", "Rank")


class FrontendError(Exception):
    pass


def parse_input_shapes(items):
    shapes = {}
    for item in items or []:
        name, sep, dims = item.rpartition(":")
        if not sep or not name:
            raise FrontendError(f"--input-shape '{item}': expected NAME:D0,D1,... e.g. x:1,224,224,3")
        try:
            shapes[name] = [int(d) for d in dims.split(",") if d.strip()]
        except ValueError:
            raise FrontendError(f"--input-shape '{item}': dimensions must be integers") from None
        if any(d <= 0 for d in shapes[name]):
            raise FrontendError(f"--input-shape '{item}': dimensions must be positive")
    return shapes


def fixed_specs(tf, signature, shapes):
    """The signature's inputs with every dimension known: --input-shape, else batch 1 for an
    unknown leading dimension; another unknown dimension is an error naming the input."""
    specs = {}
    inputs = signature.structured_input_signature[1]
    unknown = sorted(set(shapes) - set(inputs))
    if unknown:
        raise FrontendError(f"--input-shape names {', '.join(unknown)}; the signature's inputs "
                            f"are {', '.join(sorted(inputs))}")
    for name, spec in sorted(inputs.items()):
        dims = spec.shape.as_list()
        if name in shapes:
            given = shapes[name]
            if len(given) != len(dims) or any(d is not None and d != g
                                              for d, g in zip(dims, given)):
                raise FrontendError(f"--input-shape {name}: {given} does not fit the signature's "
                                    f"shape {dims}")
            dims = given
        elif dims and dims[0] is None:
            dims = [1] + dims[1:]
        if any(d is None for d in dims):
            raise FrontendError(f"input {name} has shape {spec.shape.as_list()}: give it with "
                                f"--input-shape {name}:" + ",".join("N" for _ in dims))
        specs[name] = tf.TensorSpec(dims, spec.dtype, name=name)
    return specs


def freeze(tf, signature, specs):
    from tensorflow.python.framework.convert_to_constants import (  # pylint: disable=import-outside-toplevel
        convert_variables_to_constants_v2)
    concrete = tf.function(lambda **kw: signature(**kw)).get_concrete_function(**specs)
    return convert_variables_to_constants_v2(concrete)


def graph_shapes(tf, graph_def):
    """{tensor name: (dtype name, static shape or None)} of every node output."""
    g = tf.Graph()
    with g.as_default():
        tf.graph_util.import_graph_def(graph_def, name="")
    out = {}
    for op in g.get_operations():
        for t in op.outputs:
            dims = t.shape.as_list() if t.shape.rank is not None else None
            out[t.name] = (t.dtype.name, dims)
    return out


def fold_shape_ops(tf, graph_def):
    """Replaces Shape/Size/Rank of tensors with static shapes by Const nodes."""
    shapes = graph_shapes(tf, graph_def)
    for node in graph_def.node:
        if node.op not in SHAPE_OPS or not node.input:
            continue
        src = node.input[0] if ":" in node.input[0] else node.input[0] + ":0"
        _, dims = shapes.get(src, (None, None))
        if dims is None or any(d is None for d in dims):
            continue
        out_type = node.attr["out_type"].type if "out_type" in node.attr else tf.int32.as_datatype_enum
        value = {"Shape": dims, "Size": math.prod(dims), "Rank": len(dims)}[node.op]
        const = tf.make_tensor_proto(value, dtype=tf.dtypes.as_dtype(out_type))
        name = node.name
        node.Clear()
        node.name = name
        node.op = "Const"
        node.attr["dtype"].type = const.dtype
        node.attr["value"].tensor.CopyFrom(const)


def grappler_fold(tf, graph_def, graph, fetches):
    from tensorflow.core.protobuf import config_pb2, meta_graph_pb2  # pylint: disable=import-outside-toplevel
    from tensorflow.python.grappler import tf_optimizer  # pylint: disable=import-outside-toplevel
    meta = tf.compat.v1.train.export_meta_graph(graph_def=graph_def, graph=graph)
    fetch = meta_graph_pb2.CollectionDef()
    fetch.node_list.value.extend(fetches)
    meta.collection_def["train_op"].CopyFrom(fetch)
    config = config_pb2.ConfigProto()
    rewrite = config.graph_options.rewrite_options
    rewrite.optimizers[:] = ["constfold", "dependency", "constfold"]
    return tf_optimizer.OptimizeGraph(config, meta)


def attr_json(tf, value):
    kind = value.WhichOneof("value")
    if kind == "i":
        return {"i": int(value.i)}
    if kind == "f":
        return {"f": float(value.f)}
    if kind == "b":
        return {"b": bool(value.b)}
    if kind == "s":
        return {"s": value.s.decode("utf-8", "replace")}
    if kind == "type":
        return {"type": DTYPES.get(tf.dtypes.as_dtype(value.type).name, "unsupported")}
    if kind == "list":
        if value.list.i or not (value.list.s or value.list.type):
            return {"ints": [int(i) for i in value.list.i]}
        if value.list.s:
            return {"strs": [s.decode("utf-8", "replace") for s in value.list.s]}
    return None


def write_graph(tf, graph_def, inputs, outputs, out_dir):
    import numpy as np  # pylint: disable=import-outside-toplevel
    shapes = graph_shapes(tf, graph_def)
    os.makedirs(os.path.join(out_dir, "weights"), exist_ok=True)
    nodes = []
    for node in graph_def.node:
        outs = []
        for port in range(64):
            key = f"{node.name}:{port}"
            if key not in shapes:
                break
            dtype, dims = shapes[key]
            outs.append({"dtype": DTYPES.get(dtype, dtype), "shape": dims})
        entry = {"name": node.name, "op": node.op,
                 "inputs": [i if ":" in i or i.startswith("^") else i + ":0" for i in node.input],
                 "attrs": {}, "outputs": outs}
        for key, value in sorted(node.attr.items()):
            if node.op == "Const" and key == "value":
                continue
            j = attr_json(tf, value)
            if j is not None:
                entry["attrs"][key] = j
        if node.op == "Const":
            array = tf.make_ndarray(node.attr["value"].tensor)
            if array.dtype.name not in DTYPES:
                array = array.astype(object)  # the engine rejects it, naming the node
            path = os.path.join("weights", f"{len(nodes)}.npy")
            if array.dtype != object:
                np.save(os.path.join(out_dir, path), np.ascontiguousarray(array))
                entry["value"] = path
        nodes.append(entry)
    graph = {"format": "npusim-graph", "version": 1, "inputs": inputs, "outputs": outputs,
             "nodes": nodes}
    with open(os.path.join(out_dir, "graph.json"), "w", encoding="utf-8") as f:
        json.dump(graph, f, indent=1)


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    ap.add_argument("saved_model")
    ap.add_argument("out")
    ap.add_argument("--signature", default="serving_default")
    ap.add_argument("--input-shape", action="append")
    args = ap.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    shapes = parse_input_shapes(args.input_shape)
    if not os.path.isfile(os.path.join(args.saved_model, "saved_model.pb")):
        raise FrontendError(f"{args.saved_model}: not a SavedModel directory (no saved_model.pb)")
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    loaded = tf.saved_model.load(args.saved_model)
    if args.signature not in loaded.signatures:
        raise FrontendError(f"{args.saved_model}: no signature '{args.signature}' (it has "
                            f"{', '.join(sorted(loaded.signatures)) or 'none'})")
    signature = loaded.signatures[args.signature]
    specs = fixed_specs(tf, signature, shapes)
    frozen = freeze(tf, signature, specs)
    graph_def = frozen.graph.as_graph_def()
    fold_shape_ops(tf, graph_def)
    output_names = sorted(signature.structured_outputs)
    fetches = [t.name for t in frozen.outputs]
    graph_def = grappler_fold(tf, graph_def, frozen.graph, fetches)
    by_name = {t.name.split(":")[0]: t for t in frozen.inputs}
    inputs = [{"name": name, "tensor": by_name[name].name,
               "dtype": DTYPES.get(spec.dtype.name, spec.dtype.name), "shape": spec.shape.as_list()}
              for name, spec in sorted(specs.items())]
    outputs = [{"name": name, "tensor": t} for name, t in zip(output_names, fetches)]
    write_graph(tf, graph_def, inputs, outputs, args.out)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except FrontendError as e:
        print(f"npusim compile: {e}", file=sys.stderr)
        sys.exit(1)
