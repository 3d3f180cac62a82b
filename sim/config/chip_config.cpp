// placeholder: the loader lands with the config work
#include "sim/config/chip_config.h"
