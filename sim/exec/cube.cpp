// placeholder until the cube family lands
#include "sim/exec/exec.h"
#include "common/error.h"
namespace npusim {
ExecCost plan_cube(const IssuedOp& op, const ExecContext&) { throw KernelFault("mmad not implemented yet"); }
void execute_cube(const IssuedOp&, ExecContext&) {}
}
