// liblossfns: distillation losses for LibTorch. Include this, link lossfns::lossfns.
#pragma once

#include "lossfns/cross_entropy.h"
#include "lossfns/defaults.h"
#include "lossfns/distill.h"
#include "lossfns/distill_module.h"
#include "lossfns/fused_linear.h"
#include "lossfns/reduction.h"
#include "lossfns/tvd.h"
#include "lossfns/tvd_module.h"
#include "lossfns/version.h"
