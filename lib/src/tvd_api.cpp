// Public C++ API of the TVD loss: a thin typed call into the registered op, so C++ and Python
// share one code path (checks, autograd, dispatch).
#include <ATen/core/dispatch/Dispatcher.h>

#include "lossfns/tvd.h"

namespace lossfns {

at::Tensor tvd_loss(const at::Tensor& p, const at::Tensor& q, const TVDLossOptions& options,
                    const std::optional<at::Tensor>& labels) {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("lossfns::tvd_loss", "")
          .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
                            int64_t, c10::string_view)>();
  return op.call(p, q, labels, options.ignore_index(), reduction_name(options.reduction()));
}

}  // namespace lossfns
