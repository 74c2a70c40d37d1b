// A short tour of the TVD loss: forward, backward, and the tie rule (gradient exactly 0 where the
// student equals the teacher). Runs on CUDA when there is one, else on the CPU.
#include <iostream>

#include <torch/cuda.h>
#include <torch/types.h>

#include "lossfns/lossfns.h"

int main() {
  const torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  std::cout << "lossfns " << lossfns::version() << " on " << device << "\n\n";
  torch::manual_seed(0);
  const int64_t BT = 4, V = 8;
  auto opts = torch::TensorOptions().device(device);

  // 1) A student and a teacher distribution over V tokens for BT positions.
  torch::Tensor student_logits = torch::randn({BT, V}, opts).requires_grad_(true);
  torch::Tensor teacher = torch::softmax(torch::randn({BT, V}, opts), -1);
  torch::Tensor p = torch::softmax(student_logits, -1);
  torch::Tensor loss = lossfns::tvd_loss(p, teacher);
  loss.backward();
  std::cout << "1) TVD(student, teacher), batchmean over " << BT << " rows: " << loss.item<float>()
            << "\n"
            << "   grad norm w.r.t. the student logits: "
            << student_logits.grad().norm().item<float>() << "\n\n";

  // 2) Self-distillation at step 0: the student equals the teacher, every element a tie.
  torch::Tensor p_leaf = teacher.clone().requires_grad_(true);
  torch::Tensor tie_loss = lossfns::tvd_loss(p_leaf, teacher);
  tie_loss.backward();
  std::cout << "2) student == teacher: loss " << tie_loss.item<float>() << ", max |grad| "
            << p_leaf.grad().abs().max().item<float>()
            << " (exactly 0: d|x|/dx at 0 is taken as 0)\n\n";

  // 3) Padded vocabulary: trailing slots are 0.0 in both distributions; they get no gradient.
  torch::Tensor pad = torch::zeros({BT, 4}, opts);
  torch::Tensor pp = torch::cat({p.detach(), pad}, 1).requires_grad_(true);
  torch::Tensor qq = torch::cat({teacher, pad}, 1);
  torch::Tensor labels = torch::tensor({0, 1, -100, 3}, opts.dtype(torch::kLong));
  lossfns::TVDLoss loss_fn(lossfns::TVDLossOptions().reduction(torch::kSum));
  torch::Tensor padded_loss = loss_fn(pp, qq, labels);
  padded_loss.backward();
  std::cout << "3) " << *loss_fn << " with row 2 ignored: loss " << padded_loss.item<float>()
            << "\n"
            << "   grad of padded slots: max |grad| "
            << pp.grad().slice(1, V).abs().max().item<float>()
            << "; grad of the ignored row: max |grad| " << pp.grad()[2].abs().max().item<float>()
            << "\n"
            << "   grad of row 0 (+-0.5 where p != q):\n"
            << pp.grad()[0].view({1, -1}) << "\n";
  return 0;
}
