#pragma once
// A training run as its user watches and keeps it: a bar per epoch (batches
// done, samples a second, the loss so far, the time the epoch has left), a
// line per finished epoch, and the learning curve as a CSV file and an SVG
// plot. Both files are replaced atomically after every epoch, so a run
// stopped at any point leaves the curve of every epoch it finished. A resumed
// run (first_epoch > 1) keeps the CSV's rows of the epochs before it, so its
// files show the whole run.
//
// Progress shows and keeps; the caller measures. The columns are named once;
// each finished epoch gives one value per column, in their order.
#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iterator>
#include <optional>
#include <sstream>
#include <string>
#include <unistd.h>
#include <utility>
#include <vector>

#include "../core/error.hpp"
#include "../io/file.hpp"

namespace hybra {

struct ProgressColumn {
  std::string name;      // the CSV header's cell and the epoch line's label: letters, digits and '_'
  bool plotted = true;   // a line of the SVG plot, whose one axis starts at 0
};

struct ProgressOptions {
  int epochs = 1;                        // the run's last epoch
  std::size_t batches = 1;               // in each epoch
  std::vector<ProgressColumn> columns;   // what each finished epoch reports
  std::string csv, svg;                  // the learning curve's files; empty: not written
  int first_epoch = 1;                   // a resumed run's first epoch
  std::FILE* out = stdout;               // nullptr prints nothing (a process that is not the leader)
  std::optional<bool> redraw;            // the bar redrawn in place during an epoch; unset: when out is a terminal
};

class Progress {
 public:
  explicit Progress(ProgressOptions options) : o_(std::move(options)) {
    check_options();
    redraw_ = o_.redraw.value_or(o_.out && isatty(fileno(o_.out)));
    next_epoch_ = o_.first_epoch;
    if (o_.first_epoch > 1 && !o_.csv.empty() && std::filesystem::exists(o_.csv)) keep_earlier_rows();
  }

  void begin_epoch(int epoch) {
    if (epoch != next_epoch_ || epoch > o_.epochs)
      fail<ValueError>("Progress: begin_epoch(", epoch, ") where epoch ", next_epoch_, " of ", o_.epochs, " was next");
    epoch_ = epoch;
    start_ = std::chrono::steady_clock::now();
  }

  // This epoch so far: the batches and samples done and the mean loss over
  // them. Drawn when the bar is redrawn in place, and always once the epoch's
  // batches are all done.
  void update(std::size_t batches_done, std::int64_t samples_done, double loss) {
    in_epoch("update");
    if (batches_done > o_.batches)
      fail<ValueError>("Progress: update with ", batches_done, " batches done of an epoch of ", o_.batches);
    const bool done = batches_done == o_.batches;
    if (!o_.out || !(redraw_ || done)) return;
    const double elapsed = epoch_seconds();
    const double rate = elapsed > 0 ? static_cast<double>(samples_done) / elapsed : 0;
    const auto filled = static_cast<std::size_t>(bar_width * batches_done / o_.batches);
    const std::string time = done ? duration(elapsed) : "ETA " + eta(elapsed, batches_done);
    // Redrawn in place, the line is padded to its longest, so a shorter one leaves no characters behind.
    std::fprintf(o_.out, "%sepoch %d/%d [%s%s] %3zu%% %9.0f samples/s  loss %.4f  %-*s%s", redraw_ ? "\r" : "", epoch_,
                 o_.epochs, std::string(filled, '#').c_str(), std::string(bar_width - filled, '.').c_str(),
                 100 * batches_done / o_.batches, rate, loss, redraw_ ? 12 : 0, time.c_str(),
                 done || !redraw_ ? "\n" : "");
    std::fflush(o_.out);
  }

  // The finished epoch's values, one per column: printed as a line, added to
  // the curve and its files.
  void end_epoch(const std::vector<double>& values) {
    in_epoch("end_epoch");
    if (values.size() != o_.columns.size())
      fail<ValueError>("Progress: end_epoch with ", values.size(), " values for the ", o_.columns.size(), " columns ",
                       header());
    rows_.push_back({epoch_, values});
    if (o_.out) {
      std::fprintf(o_.out, "epoch %d:", epoch_);
      for (std::size_t c = 0; c < values.size(); ++c)
        std::fprintf(o_.out, "%s %s %.4g", c ? "," : "", o_.columns[c].name.c_str(), values[c]);
      std::fprintf(o_.out, "\n");
      std::fflush(o_.out);
    }
    if (!o_.csv.empty()) io::write_file_atomically(o_.csv, csv_text());
    if (!o_.svg.empty()) io::write_file_atomically(o_.svg, svg_text());
    next_epoch_ = epoch_ + 1;
    epoch_ = 0;
  }

  // Whether update() draws every call, or only an epoch's last: a caller
  // whose loss so far costs a wait asks before it measures.
  bool redraws() const { return redraw_ && o_.out; }

  // Seconds since begin_epoch.
  double epoch_seconds() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }

  struct Row {
    int epoch;
    std::vector<double> values;
  };
  // Every epoch's row so far, a resumed run's earlier ones first.
  const std::vector<Row>& curve() const { return rows_; }

 private:
  static constexpr std::size_t bar_width = 30;

  void check_options() const {
    if (o_.epochs < 1 || o_.batches < 1)
      fail<ValueError>("Progress: ", o_.epochs, " epochs of ", o_.batches, " batches; each must be at least 1");
    if (o_.first_epoch < 1 || o_.first_epoch > o_.epochs)
      fail<ValueError>("Progress: first_epoch ", o_.first_epoch, " is not one of the epochs 1 to ", o_.epochs);
    if (o_.columns.empty()) fail<ValueError>("Progress: no columns");
    for (std::size_t c = 0; c < o_.columns.size(); ++c) {
      const std::string& name = o_.columns[c].name;
      const bool word = !name.empty() && std::all_of(name.begin(), name.end(), [](char ch) {
        return std::isalnum(static_cast<unsigned char>(ch)) || ch == '_';
      });
      if (!word || name == "epoch")
        fail<ValueError>("Progress: column name '", name, "' is not a word of letters, digits and '_' (nor 'epoch')");
      for (std::size_t d = 0; d < c; ++d)
        if (o_.columns[d].name == name) fail<ValueError>("Progress: column '", name, "' is named twice");
    }
  }

  void in_epoch(const char* what) const {
    if (epoch_ == 0) fail<ValueError>("Progress: ", what, " outside an epoch (call begin_epoch first)");
  }

  std::string header() const {
    std::string h = "epoch";
    for (const auto& c : o_.columns) h += "," + c.name;
    return h;
  }

  static std::string duration(double seconds) {
    const auto s = static_cast<long long>(std::llround(seconds));
    char text[32];
    if (s >= 3600)
      std::snprintf(text, sizeof text, "%lld:%02lld:%02lld", s / 3600, s / 60 % 60, s % 60);
    else
      std::snprintf(text, sizeof text, "%lld:%02lld", s / 60, s % 60);
    return text;
  }

  std::string eta(double elapsed, std::size_t batches_done) const {
    if (batches_done == 0) return "?";
    return duration(elapsed * static_cast<double>(o_.batches - batches_done) / static_cast<double>(batches_done));
  }

  // The rows of the epochs before this run's first, from the CSV an earlier
  // run of the same columns wrote; rows of later epochs are dropped, as this
  // run trains them again.
  void keep_earlier_rows() {
    std::istringstream text(io::read_file(o_.csv));
    std::string line;
    std::getline(text, line);
    if (line != header())
      fail<ValueError>("Progress: ", o_.csv, " has the columns '", line, "', not '", header(),
                       "': it is the curve of another run (give this run another CSV file)");
    for (std::size_t number = 2; std::getline(text, line); ++number) {
      Row row = parse_row(line, number);
      if (row.epoch < o_.first_epoch) rows_.push_back(std::move(row));
    }
  }

  Row parse_row(const std::string& line, std::size_t number) const {
    std::vector<std::string> cells;
    std::istringstream fields(line);
    for (std::string cell; std::getline(fields, cell, ',');) cells.push_back(cell);
    auto bad = [&] {
      fail<ValueError>("Progress: line ", number, " of ", o_.csv, " ('", line, "') is not an epoch and ",
                       o_.columns.size(), " numbers");
    };
    if (cells.size() != o_.columns.size() + 1) bad();
    Row row{0, {}};
    for (std::size_t c = 0; c < cells.size(); ++c) {
      char* end = nullptr;
      const double v = std::strtod(cells[c].c_str(), &end);
      if (cells[c].empty() || *end != '\0') bad();
      if (c == 0) {
        if (v != std::floor(v) || v < 1 || v > 1e9) bad();
        row.epoch = static_cast<int>(v);
      } else {
        row.values.push_back(v);
      }
    }
    return row;
  }

  std::string csv_text() const {
    std::ostringstream out;
    out << header() << '\n';
    for (const auto& r : rows_) {
      out << r.epoch;
      for (double v : r.values) out << ',' << v;
      out << '\n';
    }
    return out.str();
  }

  // The plotted columns over the epochs, on one axis from 0 to the largest
  // value rounded up (at least 1: accuracies and most losses share it).
  std::string svg_text() const {
    const double w = 640, h = 400, left = 50, right = 20, top = 20, bottom = 40;
    static constexpr const char* colors[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b"};
    double top_value = 1;
    for (const auto& r : rows_)
      for (std::size_t c = 0; c < r.values.size(); ++c)
        if (o_.columns[c].plotted && std::isfinite(r.values[c]))
          top_value = std::max(top_value, std::ceil(r.values[c]));
    const int first = rows_.front().epoch, last = rows_.back().epoch;
    auto x = [&](int epoch) {
      return left + (last == first ? 0.5 : static_cast<double>(epoch - first) / (last - first)) * (w - left - right);
    };
    auto y = [&](double v) { return top + (1 - v / top_value) * (h - top - bottom); };
    std::ostringstream out;
    out << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << w << "\" height=\"" << h
        << "\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
        << "<line x1=\"" << left << "\" y1=\"" << h - bottom << "\" x2=\"" << w - right << "\" y2=\"" << h - bottom
        << "\" stroke=\"black\"/>\n<line x1=\"" << left << "\" y1=\"" << top << "\" x2=\"" << left << "\" y2=\""
        << h - bottom << "\" stroke=\"black\"/>\n";
    for (int k = 0; k <= 5; ++k)
      out << "<text x=\"" << left - 6 << "\" y=\"" << y(top_value * k / 5) + 4 << "\" text-anchor=\"end\">"
          << top_value * k / 5 << "</text>\n";
    const int step = std::max(1, (last - first + 1 + 19) / 20);  // at most 20 epoch labels
    for (int e = first; e <= last; e += step)
      out << "<text x=\"" << x(e) << "\" y=\"" << h - bottom + 16 << "\" text-anchor=\"middle\">" << e << "</text>\n";
    out << "<text x=\"" << (w + left) / 2 << "\" y=\"" << h - 6 << "\" text-anchor=\"middle\">epoch</text>\n";
    std::size_t line = 0;
    for (std::size_t c = 0; c < o_.columns.size(); ++c) {
      if (!o_.columns[c].plotted) continue;
      const char* color = colors[line % std::size(colors)];
      out << "<polyline fill=\"none\" stroke=\"" << color << "\" stroke-width=\"2\" points=\"";
      for (const auto& r : rows_)
        if (std::isfinite(r.values[c])) out << x(r.epoch) << ',' << y(r.values[c]) << ' ';
      out << "\"/>\n<text x=\"" << w - right - 90 << "\" y=\"" << top + 14 + 16 * line << "\" fill=\"" << color
          << "\">" << o_.columns[c].name << "</text>\n";
      ++line;
    }
    out << "</svg>\n";
    return out.str();
  }

  ProgressOptions o_;
  bool redraw_ = false;
  int next_epoch_ = 1, epoch_ = 0;
  std::chrono::steady_clock::time_point start_{};
  std::vector<Row> rows_;
};

}  // namespace hybra
