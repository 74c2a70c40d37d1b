// convergence: the five convergence examples of docs/convergence.md, one subcommand each.
//   convergence kernel_vs_reference|ties|padded|distill_works|divergences [--small]
//               [--device cpu|cuda|auto] [--dtype fp32|bf16] [--out DIR]
// Exit code 0 when the experiment's assertions hold, 1 when one fails, 2 on a usage error.
#include <cstdio>
#include <exception>
#include <map>
#include <string>

#include <torch/cuda.h>
#include <torch/utils.h>

#include "experiments.h"

namespace {

constexpr const char* kUsage =
    "usage: convergence kernel_vs_reference|ties|padded|distill_works|divergences "
    "[--small] [--device cpu|cuda|auto] [--dtype fp32|bf16] [--out DIR]\n"
    "  (docs/convergence.md: what each experiment shows; auto: cuda where a GPU is visible, else\n"
    "  cpu; DIR, default out/convergence, gets the CSV of each run and the runs/ of the ones that\n"
    "  train a teacher)\n";

int Usage(const std::string& message) {
  std::fprintf(stderr, "convergence: %s\n%s", message.c_str(), kUsage);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  const std::map<std::string, int (*)(const convergence::Options&)> commands = {
      {"kernel_vs_reference", convergence::KernelVsReference},
      {"ties", convergence::Ties},
      {"padded", convergence::Padded},
      {"distill_works", convergence::DistillWorks},
      {"divergences", convergence::Divergences}};
  if (argc >= 2 && (std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h")) {
    std::printf("%s", kUsage);
    return 0;
  }
  if (argc < 2) return Usage("expected a subcommand");
  if (!commands.count(argv[1])) {
    return Usage(std::string("unknown subcommand \"") + argv[1] + "\"");
  }
  convergence::Options options;
  for (int i = 2; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (arg == "--small") {
      options.small = true;
    } else if (arg == "--device") {
      options.device = value();
      // auto, as the trainer's train.device: auto.
      if (options.device == "auto") options.device = torch::cuda::is_available() ? "cuda" : "cpu";
      if (options.device != "cpu" && options.device != "cuda") {
        return Usage("--device: cpu|cuda|auto");
      }
      if (options.device == "cuda" && !torch::cuda::is_available()) {  // as the trainer's would
        return Usage("--device cuda: no CUDA device is available; use --device auto or cpu");
      }
    } else if (arg == "--dtype") {
      options.dtype = value();
      if (options.dtype != "fp32" && options.dtype != "bf16") return Usage("--dtype: fp32|bf16");
    } else if (arg == "--out") {
      options.out = value();
      if (options.out.empty()) return Usage("--out: a directory");
    } else {
      return Usage("unknown argument " + arg);
    }
  }
  try {
    return commands.at(argv[1])(options);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "convergence %s: error: %s\n", argv[1], e.what());
    return 2;
  }
}
