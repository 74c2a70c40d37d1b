// liblossfns: distillation losses for LibTorch. Include this, link lossfns::lossfns.
#pragma once

#include "lossfns/defaults.h"
#include "lossfns/tvd.h"
#include "lossfns/tvd_module.h"
#include "lossfns/version.h"
