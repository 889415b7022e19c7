#pragma once
// The training program of the examples that train on Fashion-MNIST
// (train_lenet, train_resnet): D2L's "multi-GPU" and "concise multi-GPU"
// chapters on hybra's CPU devices, GPUs or a mix. A main() gives the model and
// its defaults; this runs the rest: options, data, Trainer over split_and_load,
// a progress bar per epoch, the learning curve as CSV and SVG, and training
// across processes under mpirun where the program links hybra::mpi.
//
//   PROGRAM [--devices cpu0,cpu1 | cuda0,cuda1] [--epochs N] [--batch-size B] [--lr X]
//           [--hybridize | --no-hybridize] [--train-size N] [--test-size N]
//           [--csv FILE] [--svg FILE] [--data DIR] [--seed N] [--save PREFIX] [--resume PREFIX]
//           [--smoke] [the model's own options]
//
// Each epoch prints a progress bar (samples/s, loss), then the test accuracy
// and the mean time of a training step after the first; the learning curve goes to the CSV
// file (epoch,loss,train_acc,test_acc,seconds,step_ms) and to an SVG plot next
// to it. --save writes the weights and the Trainer's state after every epoch
// (PREFIX.params, PREFIX.states); --resume reads them and runs the epochs
// after theirs up to --epochs, ending where the uninterrupted run would.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <hybra/data.hpp>
#include <hybra/hybra.hpp>
#include <hybra/nn/loss.hpp>
#include <hybra/optim/sgd.hpp>
#include <hybra/optim/trainer.hpp>
#include <hybra/parallel/split.hpp>
#include <iostream>
#include <string>
#include <unistd.h>
#include <vector>
#ifdef HYBRA_WITH_MPI
#include <hybra/parallel/mpi.hpp>
#endif

namespace example {

namespace nn = hybra::nn;
using hybra::Tensor;

struct Options {
  std::vector<hybra::Device> devices{hybra::cpu(0)};
  int epochs = 10;
  std::int64_t batch_size = 256;
  double lr = 0.1;
  bool hybridize = true;
  std::int64_t train_size = 0, test_size = 0;  // 0: the whole set
  std::string csv, svg;
  std::string data = "/usr/share/datasets/fashion-mnist";
  bool smoke = false;
  std::uint64_t seed = 7;     // the initial weights'; the data's order takes seed + 35
  std::string save, resume;   // file prefixes: PREFIX.params and PREFIX.states
};

// What a program trains and how: its name, the defaults of its options, its
// --smoke run, and its own options (a flag, and how to read its value).
struct Program {
  std::string name, model;
  Options defaults;
  Options smoke;                 // the smoke run's devices, epochs, batch size, lr, train and test sizes
  double smoke_accuracy = 0.5;   // the test accuracy a smoke run must reach
  std::vector<std::pair<std::string, std::function<void(const std::string&)>>> model_options;
  std::string model_usage;
};

[[noreturn]] inline void usage(const Program& p, const std::string& why) {
  std::cerr << p.name << ": " << why << "\nusage: " << p.name
            << " [--devices cpu0,cpu1 | cuda0,cuda1] [--epochs N] [--batch-size B] [--lr X] "
               "[--hybridize | --no-hybridize] [--train-size N] [--test-size N] [--csv FILE] [--svg FILE] "
               "[--data DIR] [--seed N] [--save PREFIX] [--resume PREFIX] [--smoke]"
            << p.model_usage << "\n";
  std::exit(2);
}

inline double positive_number(const Program& p, const std::string& flag, const std::string& text) {
  try {
    std::size_t used = 0;
    double v = std::stod(text, &used);
    if (used == text.size() && v > 0) return v;
  } catch (const std::exception&) {
  }
  usage(p, flag + " takes a positive number, not '" + text + "'");
}

inline Options parse(const Program& p, int argc, char** argv) {
  Options o = p.defaults;
  auto value = [&](int& i) -> std::string {
    if (i + 1 >= argc) usage(p, std::string(argv[i]) + " needs a value");
    return argv[++i];
  };
  auto number = [&](const std::string& flag, const std::string& text) { return positive_number(p, flag, text); };
  bool devices_given = false;  // --smoke's devices are only a default
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--devices") {
      devices_given = true;
      o.devices.clear();
      std::string list = value(i);
      for (std::size_t at = 0; at <= list.size();) {
        const std::size_t comma = std::min(list.find(',', at), list.size());
        const std::string d = list.substr(at, comma - at);
        const std::size_t digits = d.rfind("cpu", 0) == 0 ? 3 : d.rfind("cuda", 0) == 0 ? 4 : 0;
        if (digits == 0 || d.size() == digits || d.size() > digits + 2 ||
            d.find_first_not_of("0123456789", digits) != std::string::npos)
          usage(p, "device '" + d + "' is not cpuN or cudaN");
        const int id = std::stoi(d.substr(digits));
        o.devices.push_back(digits == 3 ? hybra::cpu(id) : hybra::cuda(id));
        at = comma + 1;
      }
    } else if (a == "--epochs") {
      o.epochs = static_cast<int>(number(a, value(i)));
    } else if (a == "--batch-size") {
      o.batch_size = static_cast<std::int64_t>(number(a, value(i)));
    } else if (a == "--lr") {
      o.lr = number(a, value(i));
    } else if (a == "--hybridize") {
      o.hybridize = true;
    } else if (a == "--no-hybridize") {
      o.hybridize = false;
    } else if (a == "--train-size") {
      o.train_size = static_cast<std::int64_t>(number(a, value(i)));
    } else if (a == "--test-size") {
      o.test_size = static_cast<std::int64_t>(number(a, value(i)));
    } else if (a == "--csv") {
      o.csv = value(i);
    } else if (a == "--svg") {
      o.svg = value(i);
    } else if (a == "--data") {
      o.data = value(i);
    } else if (a == "--seed") {
      const std::string text = value(i);
      if (text.empty() || text.find_first_not_of("0123456789") != std::string::npos || text.size() > 19)
        usage(p, "--seed takes a whole number, not '" + text + "'");
      o.seed = std::stoull(text);
    } else if (a == "--save") {
      o.save = value(i);
    } else if (a == "--resume") {
      o.resume = value(i);
    } else if (a == "--smoke") {
      o.smoke = true;
      o.epochs = p.smoke.epochs;
      o.lr = p.smoke.lr;
      o.batch_size = p.smoke.batch_size;
      o.train_size = p.smoke.train_size;
      o.test_size = p.smoke.test_size;
    } else {
      auto own = std::find_if(p.model_options.begin(), p.model_options.end(), [&](const auto& m) { return m.first == a; });
      if (own == p.model_options.end()) usage(p, "unknown option '" + a + "'");
      own->second(value(i));
    }
  }
  if (o.smoke && !devices_given) o.devices = p.smoke.devices;
  if (o.csv.empty()) o.csv = p.name + ".csv";
  if (o.svg.empty()) o.svg = std::filesystem::path(o.csv).replace_extension(".svg").string();
  return o;
}

// The first n samples of a dataset.
inline hybra::data::ArrayDataset head(const hybra::data::ArrayDataset& d, std::int64_t n) {
  n = std::min<std::int64_t>(n, static_cast<std::int64_t>(d.size()));
  return {hybra::slice(d.data(), 0, 0, n).copy(), hybra::slice(d.labels(), 0, 0, n).copy()};
}

inline double accuracy(nn::HybridSequential& net, hybra::data::DataLoader& loader, const std::vector<hybra::Device>& devices) {
  std::vector<Tensor> correct;
  std::int64_t seen = 0;
  for (auto& [X, y] : loader) {
    auto xs = hybra::split_and_load(X, devices), ys = hybra::split_and_load(y, devices);
    for (std::size_t k = 0; k < xs.size(); ++k) {
      Tensor hits = hybra::sum(hybra::argmax(net(xs[k]), 1) == ys[k].astype(hybra::DType::int64));
      correct.push_back(hits);
    }
    seen += X.shape()[0];
  }
  double total = 0;
  for (const auto& c : correct) total += c.item<double>();
  return total / static_cast<double>(seen);
}

struct EpochResult {
  double loss, train_acc, test_acc, seconds, step_ms;
};

inline void write_svg(const std::string& path, const std::vector<EpochResult>& curve) {
  const double w = 640, h = 400, left = 50, right = 20, top = 20, bottom = 40;
  double top_loss = 0;
  for (const auto& e : curve) top_loss = std::max(top_loss, e.loss);
  top_loss = std::max(1.0, std::ceil(top_loss));
  const double top_value = std::max(1.0, top_loss);
  auto x = [&](std::size_t i) {
    return left + (curve.size() <= 1 ? 0.5 : static_cast<double>(i) / static_cast<double>(curve.size() - 1)) *
                      (w - left - right);
  };
  auto y = [&](double v) { return top + (1 - v / top_value) * (h - top - bottom); };
  std::ofstream out(path);
  out << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << w << "\" height=\"" << h << "\" font-family=\"sans-serif\" font-size=\"12\">\n"
      << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
      << "<line x1=\"" << left << "\" y1=\"" << h - bottom << "\" x2=\"" << w - right << "\" y2=\"" << h - bottom << "\" stroke=\"black\"/>\n"
      << "<line x1=\"" << left << "\" y1=\"" << top << "\" x2=\"" << left << "\" y2=\"" << h - bottom << "\" stroke=\"black\"/>\n";
  for (double v = 0; v <= top_value + 1e-9; v += top_value / 5)
    out << "<text x=\"" << left - 6 << "\" y=\"" << y(v) + 4 << "\" text-anchor=\"end\">" << v << "</text>\n";
  for (std::size_t i = 0; i < curve.size(); ++i)
    out << "<text x=\"" << x(i) << "\" y=\"" << h - bottom + 16 << "\" text-anchor=\"middle\">" << i + 1 << "</text>\n";
  out << "<text x=\"" << (w + left) / 2 << "\" y=\"" << h - 6 << "\" text-anchor=\"middle\">epoch</text>\n";
  const struct {
    const char* name;
    const char* color;
    double EpochResult::*field;
  } series[] = {{"train loss", "#1f77b4", &EpochResult::loss},
                {"train acc", "#ff7f0e", &EpochResult::train_acc},
                {"test acc", "#2ca02c", &EpochResult::test_acc}};
  int row = 0;
  for (const auto& s : series) {
    out << "<polyline fill=\"none\" stroke=\"" << s.color << "\" stroke-width=\"2\" points=\"";
    for (std::size_t i = 0; i < curve.size(); ++i) out << x(i) << ',' << y(curve[i].*s.field) << ' ';
    out << "\"/>\n<text x=\"" << w - right - 90 << "\" y=\"" << top + 14 + 16 * row++ << "\" fill=\"" << s.color << "\">"
        << s.name << "</text>\n";
  }
  out << "</svg>\n";
  if (!out) throw hybra::io::FileError("cannot write '" + path + "'");
}

// This process's place among the processes training together (one, without MPI).
struct Processes {
#ifdef HYBRA_WITH_MPI
  hybra::mpi::Environment env;
  hybra::mpi::Communicator world;
  Processes(int& argc, char**& argv) : env(argc, argv) {}
  int rank() const { return world.rank(); }
  int size() const { return world.size(); }
  void sum(const Tensor& t) const { world.allreduce(t); }
#else
  Processes(int&, char**&) {}
  int rank() const { return 0; }
  int size() const { return 1; }
  void sum(const Tensor&) const {}
#endif
};

// Trains the model `build` makes as the options say; returns main()'s status.
inline int train(int argc, char** argv, const Program& program, const std::function<nn::HybridSequential()>& build) try {
  Processes processes(argc, argv);
  const Options o = parse(program, argc, argv);
  const bool leader = processes.rank() == 0;
  hybra::data::FashionMNIST train_set(true, o.data), test_set(false, o.data);
  hybra::data::ArrayDataset train = train_set, test = test_set;
  if (o.train_size) train = head(train, o.train_size);
  if (o.test_size) test = head(test, o.test_size);
  hybra::data::DataLoader train_loader(train, static_cast<std::size_t>(o.batch_size),
                                       {.shuffle = true, .seed = o.seed + 35});
  hybra::data::DataLoader test_loader(test, 1000);

  hybra::seed(o.seed);
  nn::HybridSequential net = build();
  net.initialize(nn::init::Xavier(), o.devices);
  // Deferred shapes: one predict-mode call per device completes every
  // parameter, on every device, before a resumed run's values replace them.
  for (auto d : o.devices) net(hybra::zeros({1, 1, 28, 28}, hybra::DType::float32, d));
  if (!o.resume.empty()) net.load_parameters(o.resume + ".params");
  if (o.hybridize) net.hybridize();
  hybra::Trainer trainer(net.collect_params(), "sgd", {{"learning_rate", o.lr}, {"momentum", 0.9}});
  if (processes.size() > 1) trainer.set_process_reducer([&processes](Tensor& g) { processes.sum(g); });
  const nn::SoftmaxCrossEntropyLoss loss_fn;
  // A resumed run continues after the epochs its files hold, with the data
  // in the orders the uninterrupted run would have seen.
  int first_epoch = 1;
  if (!o.resume.empty()) {
    trainer.load_states(o.resume + ".states");
    const auto steps = static_cast<std::size_t>(trainer.optimizer().num_update());
    if (steps % train_loader.size() != 0)
      throw hybra::ValueError("--resume " + o.resume + ": its " + std::to_string(steps) + " steps are not whole epochs of " +
                              std::to_string(train_loader.size()) + " batches (another batch size or training set?)");
    first_epoch = static_cast<int>(steps / train_loader.size()) + 1;
    if (first_epoch > o.epochs)
      throw hybra::ValueError("--resume " + o.resume + " holds " + std::to_string(first_epoch - 1) +
                              " epochs already; --epochs " + std::to_string(o.epochs) + " leaves none to run");
    train_loader.set_next_epoch(static_cast<std::uint64_t>(first_epoch - 1));
  }

  if (leader) {
    std::printf("%s on Fashion-MNIST: %zu training / %zu test images, %s, batch %lld on", program.model.c_str(),
                train.size(), test.size(), o.hybridize ? "hybridized" : "eager", static_cast<long long>(o.batch_size));
    for (auto d : o.devices) std::cout << ' ' << d;
    if (processes.size() > 1) std::printf(" in each of %d processes", processes.size());
    std::printf(", lr %g", o.lr);
    if (first_epoch > 1) std::printf(", resumed after epoch %d of %s", first_epoch - 1, o.resume.c_str());
    std::printf("\n");
  }
  const bool tty = leader && isatty(fileno(stdout));
  std::vector<EpochResult> curve;
  for (int epoch = first_epoch; epoch <= o.epochs; ++epoch) {
    const auto start = std::chrono::steady_clock::now();
    std::vector<Tensor> loss_sums, hit_sums;
    std::vector<std::size_t> step_losses;  // where each step's losses start in loss_sums
    std::int64_t samples = 0, local_samples = 0;
    std::size_t batch = 0;
    auto seconds = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
    // Over this process's devices, then, at the end of the epoch, over the
    // processes: the progress bar is the leader's alone, and a collective
    // that only the leader joined would never return.
    auto total = [&](const std::vector<Tensor>& parts, bool all_processes) {
      Tensor s = hybra::zeros({}, hybra::DType::float64);
      for (const auto& t : parts) s = s + t.to(hybra::cpu(0)).astype(hybra::DType::float64);
      if (all_processes) processes.sum(s);
      return s.item<double>();
    };
    auto report = [&](bool last) {
      const double loss = total(loss_sums, last) / static_cast<double>(last ? samples : local_samples);
      if (std::isnan(loss))
        throw hybra::ValueError("training diverged: the loss is NaN in epoch " + std::to_string(epoch) + " (batch " +
                                std::to_string(batch) + "); lower the learning rate (--lr)");
      if (!leader) return loss;
      const int width = 30, done = static_cast<int>(width * batch / train_loader.size());
      std::printf("%sepoch %d/%d [%s%s] %3zu%% %8.0f samples/s  loss %.4f%s", tty ? "\r" : "", epoch, o.epochs,
                  std::string(static_cast<std::size_t>(done), '#').c_str(),
                  std::string(static_cast<std::size_t>(width - done), '.').c_str(), 100 * batch / train_loader.size(),
                  static_cast<double>(samples) / seconds(), loss, last || !tty ? "\n" : "");
      std::fflush(stdout);
      return loss;
    };
    // The steps' pace: from the end of the first step (which captures and
    // compiles, hybridized) to the end of the last, waited for. Each step is
    // pushed while the ones before it run, so a step's own time is not seen.
    std::chrono::steady_clock::time_point after_first;
    for (auto& [batch_X, batch_y] : train_loader) {
      // At most one step ahead of the engine: each step pushed holds its
      // activations until it runs, so an unbounded lead held the whole
      // epoch's (7 GB for 32 steps of the book's ResNet-18 at batch 64).
      if (batch >= 2) loss_sums[step_losses[batch - 2]].wait_to_read();
      // This process's share of the batch (all of it without MPI).
      const std::int64_t rows = batch_X.shape()[0], from = rows * processes.rank() / processes.size(),
                         to = rows * (processes.rank() + 1) / processes.size();
      const Tensor X = hybra::slice(batch_X, 0, from, to), y = hybra::slice(batch_y, 0, from, to);
      auto xs = hybra::split_and_load(X, o.devices), ys = hybra::split_and_load(y, o.devices);
      std::vector<Tensor> losses, outs;
      {
        hybra::autograd::record rec;
        for (std::size_t k = 0; k < xs.size(); ++k) {
          outs.push_back(net(xs[k]));
          losses.push_back(loss_fn(outs.back(), ys[k]));
        }
      }
      for (auto& l : losses) l.backward();
      trainer.step(rows);
      step_losses.push_back(loss_sums.size());
      for (std::size_t k = 0; k < xs.size(); ++k) {
        loss_sums.push_back(hybra::sum(losses[k]));
        hit_sums.push_back(hybra::sum(hybra::argmax(outs[k], 1) == ys[k].astype(hybra::DType::int64)));
      }
      samples += rows;
      local_samples += X.shape()[0];
      ++batch;
      if (batch == 1) {
        hybra::waitall();
        after_first = std::chrono::steady_clock::now();
      }
      if (tty && batch % 20 == 0) report(false);
    }
    hybra::waitall();
    const double step_ms = batch > 1 ? std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() -
                                                                               after_first).count() /
                                           static_cast<double>(batch - 1)
                                     : 0;
    const double loss = report(true);
    const double train_acc = total(hit_sums, true) / static_cast<double>(samples);
    // Each process has the same weights, so each measures the whole test set; one prints it.
    const double epoch_seconds = seconds();
    const double test_acc = accuracy(net, test_loader, o.devices);
    if (leader)
      std::printf("epoch %d: loss %.4f, train acc %.4f, test acc %.4f, %.1f s, %.1f ms a step after the first\n", epoch,
                  loss, train_acc, test_acc, epoch_seconds, step_ms);
    curve.push_back({loss, train_acc, test_acc, epoch_seconds, step_ms});
    if (leader && !o.save.empty()) {
      net.save_parameters(o.save + ".params");
      trainer.save_states(o.save + ".states");
    }
  }

  if (!leader) return 0;
  std::ofstream csv(o.csv);
  csv << "epoch,loss,train_acc,test_acc,seconds,step_ms\n";
  for (std::size_t i = 0; i < curve.size(); ++i)
    csv << static_cast<std::size_t>(first_epoch) + i << ',' << curve[i].loss << ',' << curve[i].train_acc << ','
        << curve[i].test_acc << ',' << curve[i].seconds << ',' << curve[i].step_ms << '\n';
  if (!csv) throw hybra::io::FileError("cannot write '" + o.csv + "'");
  write_svg(o.svg, curve);
  std::printf("learning curve: %s, %s\n", o.csv.c_str(), o.svg.c_str());
  if (o.smoke && curve.back().test_acc < program.smoke_accuracy) {
    std::fprintf(stderr, "%s: test accuracy %.3f after the smoke epoch: it did not learn (at least %.2f expected)\n",
                 program.name.c_str(), curve.back().test_acc, program.smoke_accuracy);
    return 1;
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "%s: %s\n", program.name.c_str(), e.what());
  return 1;
}

}  // namespace example
