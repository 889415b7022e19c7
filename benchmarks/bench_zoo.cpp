// Inference of MXNet model-zoo networks, as MXNet 1.9.1 exports them (random
// weights, 224x224 inputs), imported with nn::SymbolBlock::imports and run by
// hybra: the time of one call, the caller waiting for the output. The files
// come from benchmarks/peers/zoo_inference.py export, and
// benchmarks/zoo_inference.sh times MXNet and PyTorch on the same networks
// in the same run.
//
//   bench_zoo --models DIR [--batches 1,2,32] [Google Benchmark flags]
//   bench_zoo --models DIR [--batches 1,2,32] --calls N
//
// --calls N times N single calls of each case after one warm-up call and
// prints each call's time, as benchmarks/peers/zoo_inference.py --calls does:
// the spread of a call, which benchmarks/zoo_under_load.sh measures beside
// competing work.
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <hybra/hybra.hpp>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace nn = hybra::nn;
namespace fs = std::filesystem;

namespace {

void run(benchmark::State& state, const std::shared_ptr<nn::SymbolBlock>& net, std::int64_t batch) {
  const hybra::Tensor x = hybra::random_uniform({batch, 3, 224, 224}, -1, 1);
  net->operator()(x).wait_to_read();  // capture and plan
  for (auto _ : state) net->operator()(x).wait_to_read();
  state.counters["images/s"] = benchmark::Counter(static_cast<double>(batch), benchmark::Counter::kIsIterationInvariantRate);
}

// The line benchmarks/zoo_calls.py reads: "<system> <case> calls_ms <t1> <t2> ...".
void print_calls(const std::string& name, std::int64_t batch, const std::shared_ptr<nn::SymbolBlock>& net, int calls) {
  const hybra::Tensor x = hybra::random_uniform({batch, 3, 224, 224}, -1, 1);
  net->operator()(x).wait_to_read();
  std::printf("hybra-%s %s/batch:%lld calls_ms", std::string(hybra::version).c_str(), name.c_str(),
              static_cast<long long>(batch));
  for (int c = 0; c < calls; ++c) {
    const auto start = std::chrono::steady_clock::now();
    net->operator()(x).wait_to_read();
    std::printf(" %.3f", std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
  }
  std::printf("\n");
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir;
  std::vector<std::int64_t> batches{1, 2, 32};
  int calls = 0;
  std::vector<char*> rest{argv[0]};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--models" && i + 1 < argc) {
      dir = argv[++i];
    } else if (a == "--calls" && i + 1 < argc) {
      calls = std::stoi(argv[++i]);
    } else if (a == "--batches" && i + 1 < argc) {
      batches.clear();
      for (std::string list = argv[++i]; !list.empty();) {
        const auto comma = list.find(',');
        batches.push_back(std::stoll(list.substr(0, comma)));
        list = comma == std::string::npos ? "" : list.substr(comma + 1);
      }
    } else {
      rest.push_back(argv[i]);
    }
  }
  if (dir.empty()) {
    std::fprintf(stderr, "usage: bench_zoo --models DIR [--batches 1,2,32] [--calls N] (DIR from benchmarks/peers/zoo_inference.py export)\n");
    return 2;
  }
  std::map<std::string, std::shared_ptr<nn::SymbolBlock>> nets;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string file = entry.path().filename().string();
    if (!file.ends_with("-symbol.json")) continue;
    const std::string name = file.substr(0, file.size() - std::string("-symbol.json").size());
    nets[name] = std::make_shared<nn::SymbolBlock>(
        nn::SymbolBlock::imports(entry.path(), {"data"}, fs::path(dir) / (name + "-0000.params")));
  }
  if (calls > 0) {
    for (const auto& [name, net] : nets)
      for (std::int64_t batch : batches) print_calls(name, batch, net, calls);
    return 0;
  }
  for (const auto& [name, net] : nets)
    for (std::int64_t batch : batches)
      benchmark::RegisterBenchmark((name + "/batch:" + std::to_string(batch)).c_str(),
                                   [net, batch](benchmark::State& s) { run(s, net, batch); })
          ->Unit(benchmark::kMillisecond)
          ->UseRealTime()
          ->MinTime(1.0);
  int count = static_cast<int>(rest.size());
  benchmark::Initialize(&count, rest.data());
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
