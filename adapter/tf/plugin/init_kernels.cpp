// TF_InitKernel: registers every NPU kernel family. The list is explicit (no self-registering
// statics), so a family that is not registered is visible here.
#include <string>

#include "adapter/tf/plugin/kernel_families.h"
#include "adapter/tf/plugin/plugin_device.h"

extern "C" __attribute__((visibility("default"))) void TF_InitKernel() {
  using namespace npusim::tf;
  using Register = npusim::rt::Status (*)();
  for (Register r :
       {register_compiler_op_kernels, register_variable_kernels, register_resource_variable_kernels,
        register_host_routed_kernels, register_bitcast_kernels, register_tensor_list_kernels,
        register_npu_graph_kernel, register_collective_kernels, register_gen_mask_kernel}) {
    npusim::rt::Status st = r();
    // TF_InitKernel cannot fail; a family that did not register is reported and skipped, and
    // its ops then fall back to the CPU under soft placement.
    if (!st.ok()) log_error("TF_InitKernel: " + st.message());
  }
}
