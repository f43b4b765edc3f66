// The op contexts moved to the public header remat/op_context.hpp; this name stays for the detail headers that
// include it.
#pragma once

#include "remat/op_context.hpp"
