// placeholder until the vector family lands
#include "sim/exec/exec.h"
#include "common/error.h"
namespace npusim {
ExecCost plan_vector(const IssuedOp& op, const ExecContext&) { throw KernelFault("vector not implemented yet"); }
void execute_vector(const IssuedOp&, ExecContext&) {}
}
