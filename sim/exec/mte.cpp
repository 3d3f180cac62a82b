// placeholder until the MTE family lands
#include "sim/exec/exec.h"
#include "common/error.h"
namespace npusim {
ExecCost plan_mte(const IssuedOp& op, const ExecContext&) { throw KernelFault("MTE not implemented yet"); }
void execute_mte(const IssuedOp&, ExecContext&) {}
}
