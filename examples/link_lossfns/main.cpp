// Uses the installed liblossfns: the TVD function and module, forward and backward.
// Exits non-zero if the tie rule or the gradient's value is wrong.
#include <cmath>
#include <cstdio>

#include <lossfns/lossfns.h>
#include <torch/types.h>

int main() {
  std::printf("liblossfns %s (headers %s)\n", lossfns::version(), LOSSFNS_VERSION);
  torch::manual_seed(0);
  torch::Tensor logits = torch::randn({8, 100}, torch::requires_grad());
  torch::Tensor teacher = torch::softmax(torch::randn({8, 100}), -1);
  torch::Tensor p = torch::softmax(logits, -1);

  torch::Tensor loss = lossfns::tvd_loss(p, teacher);  // batchmean
  loss.backward();
  std::printf("tvd_loss = %.6f, |grad logits| = %.6f\n", loss.item<double>(),
              logits.grad().norm().item<double>());
  // The same loss and gradient from plain LibTorch (no ties in random rows, where torch's abs
  // and the op's rule agree).
  torch::Tensor logits_ref = logits.detach().clone().requires_grad_(true);
  torch::Tensor loss_ref = 0.5 * (torch::softmax(logits_ref, -1) - teacher).abs().sum(-1).mean();
  loss_ref.backward();
  const double loss_err = std::abs(loss.item<double>() - loss_ref.item<double>());
  const double grad_err = (logits.grad() - logits_ref.grad()).abs().max().item<double>();
  const bool values_ok = loss_err <= 1e-6 && grad_err <= 1e-6;
  std::printf(
      "against plain LibTorch: |loss difference| %.1e, largest gradient difference %.1e: "
      "%s\n",
      loss_err, grad_err, values_ok ? "ok" : "WRONG");

  lossfns::TVDLoss module(lossfns::TVDLossOptions().reduction(torch::kSum));
  torch::Tensor p_leaf = teacher.clone().requires_grad_(true);
  torch::Tensor tied = module(p_leaf, teacher);  // student == teacher: every element a tie
  tied.backward();
  const bool ties_ok = tied.item<double>() == 0.0 && p_leaf.grad().eq(0).all().item<bool>();
  std::printf("student == teacher: loss %.1f, all gradients exactly 0: %s\n", tied.item<double>(),
              ties_ok ? "yes" : "NO");
  return ties_ok && values_ok && loss.item<double>() > 0 ? 0 : 1;
}
