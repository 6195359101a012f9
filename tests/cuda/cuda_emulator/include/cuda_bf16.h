#pragma once
#include "emulated_cuda.h"
