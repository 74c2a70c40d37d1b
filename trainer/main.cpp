// distill_trainer: the front door. Parses the command line, loads the config, calls Run, and
// turns any failure into one line on stderr and a non-zero exit. All logic is in the library.
#include <chrono>
#include <csignal>
#include <exception>
#include <filesystem>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include <c10/util/Exception.h>
#include <torch/cuda.h>
#include <CLI/CLI.hpp>

#include "distill/config.h"
#include "distill/distributed.h"
#include "distill/memory_estimate.h"
#include "distill/run.h"
#include "distill/signals.h"

namespace {

// The errors' advice to "resume with the same command" (a stop by a signal, a full disk) made
// true for this command: with --fresh it would delete the run and start over, with
// train.resume=false it would refuse the run.
std::string WithResumeAdvice(std::string text, bool fresh, bool resume) {
  std::string fix;
  if (fresh) fix += " without --fresh (which would delete the run and start over)";
  if (!resume) fix += std::string(fresh ? " and" : "") + " with train.resume=true";
  const std::string same = "the same command";
  for (size_t at = fix.empty() ? std::string::npos : text.find(same); at != std::string::npos;
       at = text.find(same, at + same.size() + fix.size())) {
    text.insert(at + same.size(), fix);
  }
  return text;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "distill_trainer: knowledge distillation on LibTorch, configured by YAML.\n"
      "Without --config it runs the embedded configs/quickstart.yaml (pretrain a teacher, distil "
      "a student, compare with hard-label training)."};
  std::string config_path;
  std::vector<std::string> overrides;
  bool print_config = false;
  distill::RunFlags flags;
  app.add_option("-c,--config", config_path, "YAML config file");
  app.add_option("overrides", overrides, "key.path=value overrides, validated like the file");
  app.add_flag("--print-config", print_config, "print the resolved config and exit");
  bool print_reference = false;
  app.add_flag("--print-config-reference", print_reference,
               "print every key as the Markdown tables of docs/config.md and exit");
  app.add_flag("--fresh", flags.fresh,
               "delete an existing run in train.out_dir and start over (instead of resuming); "
               "refused, deleting nothing, where the directory holds files the trainer did not "
               "write");
  app.add_flag("-q,--quiet", flags.quiet, "no progress output; only warnings and the final table");
  app.add_option("--profile-steps", flags.profile_steps,
                 "after --profile-skip steps: N steps under the Kineto profiler (a chrome trace), "
                 "then N steps timed per phase with a device sync at every phase boundary, into "
                 "<out_dir>/profile/; 0 (default): off")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 30));
  app.add_option("--profile-skip", flags.profile_skip,
                 "warm-up steps of each run before --profile-steps starts (default 3)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 30));
  bool no_memory_check = false;
  app.add_flag("--no-memory-check", no_memory_check,
               "train even when the start-up memory estimate exceeds the device's memory");
  std::string export_run, export_out;
  CLI::App* export_cmd = app.add_subcommand(
      "export",
      "write the student of a finished (or checkpointed) run as a Hugging Face "
      "directory (config.json + model.safetensors + the teacher's tokenizer files)");
  export_cmd->add_option("run_dir", export_run, "the run's train.out_dir")->required();
  export_cmd->add_option("out_dir", export_out, "a new directory to write")->required();
  app.set_version_flag(
      "--version", [] { return distill::VersionText(); },
      "print the versions (distill_trainer, the liblossfns it loaded, LibTorch) and the CUDA "
      "devices it sees, then exit");
  app.footer("Config keys (key = default, meaning, accepted values):\n" + distill::ConfigHelp());

  // A file-size limit (ulimit -f) makes a write fail with EFBIG, which file_io.cpp reports
  // naming the file; SIGXFSZ's default action would kill the process first, mid-write.
  std::signal(SIGXFSZ, SIG_IGN);
  // SIGTERM / SIGINT / SIGHUP outside a training loop: one line instead of a silent death (inside
  // one, the step finishes and a checkpoint is written: StopSignals).
  distill::ExitOnStopSignals();
  distill::ExplainBusErrors();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help prints and exits 0; a command-line error (an unknown flag, a missing argument)
    // prints CLI11's message and exits 2, as a config error does (CLI11's own codes are 100+).
    return app.exit(e) == 0 ? 0 : 2;
  }
  // Command-line mistakes CLI11 accepts: exit 2 with one line, as its own errors.
  if (*export_cmd) {
    // The export reads the run's own config.yaml: anything given before "export" would be
    // ignored silently.
    std::vector<std::string> given;
    for (const CLI::Option* option : app.get_options()) {
      if (option->count() > 0) given.push_back(option->get_name());
    }
    if (!given.empty()) {
      std::string names;
      for (const std::string& name : given) names += (names.empty() ? "" : ", ") + name;
      std::cerr << "distill_trainer: export takes the run directory and a new directory only; "
                << names << " given before \"export\" would not apply to it (the run's own "
                << "config.yaml decides what is exported): leave "
                << (given.size() > 1 ? "them" : "it") << " out\n";
      return 2;
    }
  } else if (print_reference && (app.count("--config") > 0 || !overrides.empty())) {
    // The reference is the schema's defaults: a config or overrides would be ignored silently.
    std::cerr << "distill_trainer: --print-config-reference prints every key's default and "
                 "takes no config; use --print-config to see the resolved config of "
              << (app.count("--config") > 0
                      ? "--config " + config_path + (overrides.empty() ? "" : " with the overrides")
                      : "the overrides")
              << "\n";
    return 2;
  } else if (app.count("--config") > 0 && config_path.empty()) {
    std::cerr << "distill_trainer: --config: expected a YAML file, got an empty path (an unset "
                 "shell variable?); leave --config out to run the embedded quickstart\n";
    return 2;
  }
  // A word where a subcommand could stand ("exprot") reads as an override: say both. (Not a
  // config file given without --config: the override's error says that.)
  for (const std::string& word : overrides) {
    std::error_code ec;
    if (!word.empty() && !std::filesystem::is_regular_file(word, ec) &&
        word.find_first_not_of("abcdefghijklmnopqrstuvwxyz-_") == std::string::npos) {
      std::cerr << "distill_trainer: \"" << word
                << "\" is neither a key.path=value override nor a subcommand (the one "
                   "subcommand: distill_trainer export <run_dir> <out_dir>)\n";
      return 2;
    }
  }
  bool resume = true;                     // train.resume of the config run (for the errors' advice)
  std::optional<distill::Config> parsed;  // for the errors: where keys were set
  try {
    if (print_reference) {
      std::cout << distill::ConfigReference();
      return 0;
    }
    if (*export_cmd) {
      const std::string checkpoint = distill::ExportRun(export_run, export_out);
      std::cout << "exported " << checkpoint << " to " << export_out << '\n';
      return 0;
    }
    const distill::Config config =
        config_path.empty() ? distill::ParseConfig(distill::QuickstartYaml(),
                                                   "configs/quickstart.yaml (embedded)", overrides)
                            : distill::LoadConfigFile(config_path, overrides);
    if (print_config) {
      std::cout << distill::ConfigToYaml(config);
      return 0;
    }
    // Under torchrun: the process group (data-parallel); otherwise a no-op single process.
    const auto distributed = distill::Distributed::FromEnvironment(
        std::chrono::seconds(config.train.collective_timeout_s));
    flags.distributed = distributed.get();
    flags.memory_check = !no_memory_check;
    resume = config.train.resume;
    parsed = config;
    distill::Run(config, flags, std::cout);
    return 0;
  } catch (const distill::Interrupted& e) {
    std::cerr << "distill_trainer: " << WithResumeAdvice(e.what(), flags.fresh, resume) << '\n';
    std::cout.flush();
    // As the signal's default action: a shell script stops on a child's SIGINT, a parent sees the
    // signal (its status, 143 / 130 in a shell).
    distill::DieBySignal(e.signal());
  } catch (const distill::ConfigError& e) {
    // (A run-start check's, train.cuda_graph: true on the CPU, gets where the key was set;
    // the parser's carry it already.)
    std::cerr << "distill_trainer: config error: "
              << (parsed ? distill::WithWhereGiven(*parsed, e.what()) : std::string(e.what()))
              << '\n';
    return 2;
  } catch (const c10::Error& e) {
    // (Out of memory in a training step is a MemoryError with what needs less memory; outside
    // one the models, a checkpoint being loaded, an evaluation's batch or the export do not fit.)
    std::cerr << "distill_trainer: "
              << (distill::IsOutOfMemory(e) ? "out of memory outside a training step (start-up, "
                                              "an evaluation, a checkpoint, the export): "
                                            : "")
              << e.what_without_backtrace() << '\n';
    return 1;
  } catch (const std::exception& e) {
    const std::string what = parsed ? distill::WithWhereGiven(*parsed, e.what()) : e.what();
    std::cerr << "distill_trainer: " << WithResumeAdvice(what, flags.fresh, resume) << '\n';
    return 1;
  }
}
