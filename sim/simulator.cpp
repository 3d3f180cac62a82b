// placeholder: the SystemC model lands with the chip work
#include "sim/simulator.h"
