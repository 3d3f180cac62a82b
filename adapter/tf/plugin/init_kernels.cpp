// TF_InitKernel: registers every NPU kernel family. The list is explicit (no self-registering
// statics), so a family that is not registered is visible here.
#include <string>

#include "adapter/tf/plugin/graph_fusion.h"
#include "adapter/tf/plugin/kernel_families.h"
#include "adapter/tf/plugin/plugin_device.h"

extern "C" __attribute__((visibility("default"))) void TF_InitKernel() {
  using namespace npusim::tf;
  using Register = npusim::rt::Status (*)();
  for (Register r : {register_binary_kernels, register_unary_kernels, register_cast_kernels,
                     register_matmul_kernels, register_nn_kernels, register_reduce_kernels,
                     register_variable_kernels, register_conv_kernels, register_layout_kernels,
                     register_composed_kernels,
                     register_resource_variable_kernels, register_optimizer_kernels,
                     register_int64_kernels, register_host_routed_kernels,
                     register_random_kernels, register_bitcast_kernels,
                     register_fused_kernels}) {
    npusim::rt::Status st = r();
    // TF_InitKernel cannot fail; a family that did not register is reported and skipped, and
    // its ops then fall back to the CPU under soft placement.
    if (!st.ok()) log_error("TF_InitKernel: " + st.message());
  }
}
