// TensorFlow's C++ graph headers (GraphDef, NodeDef, op registry, grappler's item) for the
// plugin's graph passes (graph_optimizer.cpp, graph_cluster.cpp), which are built against
// TensorFlow's C++ API with the wheel's defines (CMakeLists.txt). Their warnings are
// TensorFlow's, so they are silenced here, around the includes only.
#pragma once

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wsign-compare"
#pragma GCC diagnostic ignored "-Winterference-size"
#include "tensorflow/c/experimental/grappler/grappler.h"
#include "tensorflow/core/framework/attr_value.pb.h"
#include "tensorflow/core/framework/graph.pb.h"
#include "tensorflow/core/framework/memory_types.h"
#include "tensorflow/core/framework/node_def.pb.h"
#include "tensorflow/core/framework/node_def_util.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor.pb.h"
#include "tensorflow/core/framework/types.h"
#include "tensorflow/core/framework/types.pb.h"
#include "tensorflow/core/grappler/grappler_item.h"
#pragma GCC diagnostic pop
