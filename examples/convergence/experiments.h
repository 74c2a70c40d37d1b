// The five convergence experiments. Each prints a short table and one "PASS <name>" or
// "FAIL <name>" line, writes <out>/<name>_<dtype>.csv (per-step metrics) and returns the exit
// code (0 on PASS). See docs/convergence.md for what each shows and the numbers measured.
#pragma once

#include "harness.h"

namespace convergence {

int KernelVsReference(const Options& options);  // 1. lossfns op vs composite reference
int Ties(const Options& options);               // 2. sign(0) = 0 vs the legacy two-way sign
int Padded(const Options& options);             // 3. padded vocabulary vs unpadded
int DistillWorks(const Options& options);       // 4. distilled vs hard labels vs entropy floor
int Divergences(const Options& options);        // 5. distill_loss, every divergence, vs float64

}  // namespace convergence
