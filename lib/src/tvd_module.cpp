// lossfns::TVDLoss module: holds TVDLossOptions and calls lossfns::tvd_loss.
#include "lossfns/tvd_module.h"

namespace lossfns {

TVDLossImpl::TVDLossImpl(TVDLossOptions options_) : options(std::move(options_)) {}

void TVDLossImpl::reset() {}

void TVDLossImpl::pretty_print(std::ostream& stream) const {
  stream << "lossfns::TVDLoss(reduction=" << reduction_name(options.reduction())
         << ", ignore_index=" << options.ignore_index() << ")";
}

at::Tensor TVDLossImpl::forward(const at::Tensor& p, const at::Tensor& q,
                                const at::Tensor& labels) {
  return tvd_loss(p, q, options, labels);
}

}  // namespace lossfns
