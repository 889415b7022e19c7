// Deployment (D2L 13.1, "Exporting"): runs a model that another program
// exported, with none of that program's code. By default the files
// examples/hybrid_mlp writes; it makes the same seed-2026 input and prints
// the same outputs. A damaged file is an error naming the file and where it
// is damaged, and the exit status is 1.
//
//   deploy [SYMBOL_JSON [PARAMS]]   defaults: my_mlp-symbol.json my_mlp-0000.params
//   deploy --smoke                  the defaults (as the test suite runs it)
#include <chrono>
#include <cstdio>
#include <hybra/hybra.hpp>
#include <string>
#include <vector>

#include "../common/command_line.hpp"

namespace nn = hybra::nn;

int main(int argc, char** argv) {
  namespace po = example::po;
  po::options_description options("options");
  options.add_options()
      ("symbol", po::value<std::string>()->default_value("my_mlp-symbol.json"), "the graph (MXNet's symbol JSON)")
      ("params", po::value<std::string>()->default_value("my_mlp-0000.params"), "the weights (MXNet's .params)")
      ("smoke", "the default files, as the test suite runs it");
  po::positional_options_description files;
  files.add("symbol", 1).add("params", 1);
  const po::variables_map given = example::command_line(
      argc, argv,
      "deploy [SYMBOL_JSON [PARAMS]]: runs a model another program exported, with none of its code (by default\n"
      "the files examples/hybrid_mlp writes), on the same input; a damaged file is an error naming where.",
      options, files);
  const std::string symbol_file = given["symbol"].as<std::string>();
  const std::string param_file = given["params"].as<std::string>();

  try {
    const auto start = std::chrono::steady_clock::now();
    auto net = nn::SymbolBlock::imports(symbol_file, {"data"}, param_file);
    hybra::Generator input_generator(2026);
    hybra::Tensor x = hybra::random_normal({1, 512}, 0, 1, hybra::DType::float32, hybra::cpu(), input_generator);
    hybra::Tensor y = net(x);
    y.wait_to_read();
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();

    std::printf("imported %s (%zu parameters) and %s\n", symbol_file.c_str(), net.collect_params().size(),
                param_file.c_str());
    std::printf("import + first call: %.2f ms\n", ms);
    std::printf("the imported graph:\n%s", hybra::graph::to_string(net.graph()).c_str());
    const auto out = y.to_vector<float>();
    std::printf("outputs (%s) for the seed-2026 input:", net.output_names().front().c_str());
    for (float v : out) std::printf(" %.6f", v);
    std::printf("\n");
  } catch (const hybra::Error& e) {
    std::fprintf(stderr, "deploy: %s\n", e.what());
    return 1;
  }
  return 0;
}
