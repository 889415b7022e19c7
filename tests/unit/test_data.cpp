// The data layer: IDX files (raw and gzipped, every element type, every way a
// file can be malformed), Fashion-MNIST (crafted files that do not belong
// together, and the real dataset, which scripts/setup.sh installs), and the
// DataLoader (order, shuffling per seed and epoch, the last batch, prefetching
// on a worker thread, leaving an epoch early, failures reaching the loop),
// and NumPy's .npy and .npz files (NumPy's own, hybra's, malformed ones).
#include <doctest/doctest.h>
#include <zlib.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <hybra/data.hpp>
#include <hybra/eager.hpp>
#include <iterator>
#include <limits>
#include <numeric>
#include <optional>
#include <ranges>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "reference.hpp"

using namespace hybra;
namespace fs = std::filesystem;

namespace {

using test::ScratchDir;

// A doctest matcher for messages that contain `text`.
doctest::Contains contains(const std::string& text) { return doctest::Contains(text.c_str()); }

// An IDX header: two zero bytes, the type code, ndim, the extents (big-endian).
std::string idx_header(unsigned char type, const std::vector<std::uint32_t>& extents) {
  std::string bytes{'\0', '\0', static_cast<char>(type), static_cast<char>(extents.size())};
  for (std::uint32_t e : extents)
    for (int shift = 24; shift >= 0; shift -= 8) bytes += static_cast<char>(e >> shift);
  return bytes;
}

// Values as IDX stores them: big-endian, in Stored's width.
template <class Stored>
std::string big_endian(const std::vector<Stored>& values) {
  using Word = std::conditional_t<sizeof(Stored) == 1, std::uint8_t,
                                  std::conditional_t<sizeof(Stored) == 2, std::uint16_t,
                                                     std::conditional_t<sizeof(Stored) == 4, std::uint32_t, std::uint64_t>>>;
  std::string bytes;
  for (Stored v : values) {
    const auto word = std::bit_cast<Word>(v);
    for (int shift = 8 * (static_cast<int>(sizeof(Word)) - 1); shift >= 0; shift -= 8)
      bytes += static_cast<char>(word >> shift);
  }
  return bytes;
}

void write_raw(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

void write_gzip(const std::string& path, const std::string& bytes) {
  gzFile file = gzopen(path.c_str(), "wb");
  REQUIRE(file != nullptr);
  REQUIRE(gzwrite(file, bytes.data(), static_cast<unsigned>(bytes.size())) == static_cast<int>(bytes.size()));
  REQUIRE(gzclose(file) == Z_OK);
}

// The bytes gzip compresses `bytes` to.
std::string gzipped(const std::string& bytes) {
  ScratchDir dir;
  write_gzip(dir / "x.gz", bytes);
  return io::read_file(dir / "x.gz");
}

// Writes `bytes` raw and gzipped, reads both back, and checks they agree.
Tensor round_trip(const std::string& bytes) {
  ScratchDir dir;
  write_raw(dir / "raw.idx", bytes);
  write_gzip(dir / "packed.idx.gz", bytes);
  Tensor raw = data::read_idx(dir / "raw.idx");
  Tensor packed = data::read_idx(dir / "packed.idx.gz");
  CHECK(raw.shape() == packed.shape());
  CHECK(raw.dtype() == packed.dtype());
  CHECK(raw.to_vector<double>() == packed.to_vector<double>());
  return raw;
}

}  // namespace

TEST_CASE("read_idx: every IDX element type, raw and gzipped") {
  std::vector<std::uint8_t> bytes(24);
  std::iota(bytes.begin(), bytes.end(), std::uint8_t{230});  // wraps past 255
  Tensor ubyte = round_trip(idx_header(0x08, {2, 3, 4}) + big_endian(bytes));
  CHECK(ubyte.dtype() == DType::uint8);
  CHECK(ubyte.shape() == Shape{2, 3, 4});
  CHECK(ubyte.to_vector<std::uint8_t>() == bytes);

  Tensor sbyte = round_trip(idx_header(0x09, {4}) + big_endian(std::vector<std::int8_t>{-128, -1, 0, 127}));
  CHECK(sbyte.dtype() == DType::int32);
  CHECK(sbyte.to_vector<std::int32_t>() == std::vector<std::int32_t>{-128, -1, 0, 127});

  Tensor shorts = round_trip(idx_header(0x0B, {2, 2}) + big_endian(std::vector<std::int16_t>{-32768, -2, 300, 32767}));
  CHECK(shorts.dtype() == DType::int32);
  CHECK(shorts.shape() == Shape{2, 2});
  CHECK(shorts.to_vector<std::int32_t>() == std::vector<std::int32_t>{-32768, -2, 300, 32767});

  const std::vector<std::int32_t> ints{std::numeric_limits<std::int32_t>::min(), -7, 65536,
                                       std::numeric_limits<std::int32_t>::max()};
  Tensor int32s = round_trip(idx_header(0x0C, {1, 4}) + big_endian(ints));
  CHECK(int32s.dtype() == DType::int32);
  CHECK(int32s.to_vector<std::int32_t>() == ints);

  const std::vector<float> floats{1.5f, -0.0f, 3.25e-5f, -std::numeric_limits<float>::infinity(), 1e38f};
  Tensor float32s = round_trip(idx_header(0x0D, {5}) + big_endian(floats));
  CHECK(float32s.dtype() == DType::float32);
  CHECK(float32s.to_vector<float>() == floats);
  CHECK(std::signbit(float32s.to_vector<float>()[1]));

  const std::vector<double> doubles{0.1, -1e300, 4.9e-324};
  Tensor float64s = round_trip(idx_header(0x0E, {3, 1, 1}) + big_endian(doubles));
  CHECK(float64s.dtype() == DType::float64);
  CHECK(float64s.shape() == Shape{3, 1, 1});
  CHECK(float64s.to_vector<double>() == doubles);

  Tensor empty = round_trip(idx_header(0x08, {0, 28, 28}));
  CHECK(empty.shape() == Shape{0, 28, 28});
}

TEST_CASE("read_idx: gzip is recognised by its magic bytes, not by the file's name") {
  ScratchDir dir;
  const std::string bytes = idx_header(0x08, {3}) + "\x01\x02\x03";
  write_gzip(dir / "packed.idx", bytes);
  write_raw(dir / "plain.gz", bytes);
  // Two gzip members one after the other read as their concatenation, as with gzip -d.
  write_raw(dir / "two-members.gz", gzipped(idx_header(0x08, {3}) + "\x01") + gzipped("\x02\x03"));
  for (const char* name : {"packed.idx", "plain.gz", "two-members.gz"}) {
    CAPTURE(name);
    CHECK(data::read_idx(dir / name).to_vector<int>() == std::vector<int>{1, 2, 3});
  }
}

TEST_CASE("read_idx: a malformed file is an error naming the file and the offset") {
  using namespace std::string_literals;
  ScratchDir dir;
  auto read_raw = [&](const std::string& bytes) {
    write_raw(dir / "bad.idx", bytes);
    return data::read_idx(dir / "bad.idx");
  };
  auto read_gzipped = [&](const std::string& bytes) {
    write_gzip(dir / "bad.idx.gz", bytes);
    return data::read_idx(dir / "bad.idx.gz");
  };

  CHECK_THROWS_WITH_AS(data::read_idx(dir / "missing.idx"),
                       contains("cannot read '" + dir / "missing.idx" + "': No such file or directory"), io::FileError);
  CHECK_THROWS_WITH_AS(data::read_idx(dir.path), contains("it is a directory"), io::FileError);

  CHECK_THROWS_WITH_AS(read_raw("\0\0\x08"s),
                       contains("IDX file '" + dir / "bad.idx" +
                                "': offset 3: the file ends inside the 4-byte magic number (it has 3 bytes)"),
                       io::FormatError);
  CHECK_THROWS_WITH_AS(read_raw("\x01\x02\x08\x01\0\0\0\x01\x05"s),
                       contains("bad.idx': offset 0: the magic number starts with 0x01 0x02, not 0x00 0x00"),
                       io::FormatError);
  CHECK_THROWS_WITH_AS(read_raw(idx_header(0x0A, {1}) + "\x05"),
                       contains("bad.idx': offset 2: unknown type code 0x0A (IDX defines 0x08 unsigned byte"),
                       io::FormatError);
  CHECK_THROWS_WITH_AS(read_raw(idx_header(0x08, {})), contains("bad.idx': offset 3: 0 dimensions"), io::FormatError);
  CHECK_THROWS_WITH_AS(read_raw(idx_header(0x08, std::vector<std::uint32_t>(33, 1)) + "\x05"),
                       contains("bad.idx': offset 3: 33 dimensions; hybra reads IDX arrays of 1 to 32"),
                       io::FormatError);
  // Three extents announced, two present: the header would be 16 bytes.
  CHECK_THROWS_WITH_AS(read_raw(idx_header(0x08, {60000, 28, 28}).substr(0, 12)),
                       contains("bad.idx': offset 12: the file ends inside the header, which has 3 extents and so 16 bytes"),
                       io::FormatError);
  CHECK_THROWS_WITH_AS(read_raw(idx_header(0x08, {10, 10}) + std::string(50, 'x')),
                       contains("bad.idx': offset 62: the file ends after 50 bytes of values, too few for the "
                                "header's (10, 10) array of unsigned bytes (1 byte each): truncated"),
                       io::FormatError);
  // A partial value: 11 bytes hold 2 of the 3 floats.
  CHECK_THROWS_WITH_AS(read_raw(idx_header(0x0D, {3}) + std::string(11, 'x')),
                       contains("offset 19: the file ends after 11 bytes of values, too few for the header's (3,) "
                                "array of floats (4 bytes each)"),
                       io::FormatError);
  // Extents whose product overflows 64 bits are caught as too large for the file, not multiplied out.
  CHECK_THROWS_WITH_AS(read_raw(idx_header(0x0E, {0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF}) + std::string(16, 'x')),
                       contains("offset 32: the file ends after 16 bytes of values, too few for the header's "
                                "(4294967295, 4294967295, 4294967295) array of doubles"),
                       io::FormatError);
  CHECK_THROWS_WITH_AS(read_raw(idx_header(0x08, {2, 2}) + "abcdef"),
                       contains("bad.idx': offset 16: trailing 2 bytes after the header's (2, 2) array of unsigned bytes"),
                       io::FormatError);
  // In a gzip file, offsets count the decompressed IDX bytes.
  CHECK_THROWS_WITH_AS(read_gzipped(idx_header(0x08, {2, 2}) + "abcdef"),
                       contains("bad.idx.gz': offset 16: trailing 2 bytes"), io::FormatError);
  CHECK_THROWS_WITH_AS(read_gzipped(idx_header(0x0C, {2, 2}) + "abc"),
                       contains("bad.idx.gz': offset 15: the file ends after 3 bytes of values"), io::FormatError);
}

TEST_CASE("read_idx: a broken gzip stream is an error naming its compressed offset") {
  ScratchDir dir;
  std::string values(5000, '\0');
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = static_cast<char>(i * i % 251);
  const std::string good = gzipped(idx_header(0x08, {5000}) + values);
  REQUIRE(good.size() > 100);
  auto read = [&](const std::string& compressed) {
    write_raw(dir / "bad.gz", compressed);
    return data::read_idx(dir / "bad.gz");
  };
  const std::string where = "IDX file '" + dir / "bad.gz" + "': gzip stream: compressed offset ";
  CHECK(read(good).size() == 5000);

  // The trailer's CRC-32 (the 8th to 5th bytes from the end) no longer matches.
  std::string wrong_crc = good;
  wrong_crc[good.size() - 8] ^= 0x55;
  CHECK_THROWS_WITH_AS(read(wrong_crc), contains(where + std::to_string(good.size() - 4) +
                                                 ": corrupt data (zlib: incorrect data check)"),
                       io::FormatError);
  CHECK_THROWS_WITH_AS(read(good.substr(0, good.size() - 10)),
                       contains(where + std::to_string(good.size() - 10) +
                                ": the file ends before the gzip stream does (truncated)"),
                       io::FormatError);
  CHECK_THROWS_WITH_AS(read("\x1f\x8b"), contains(where + "2: the file ends before the gzip stream does"),
                       io::FormatError);
  CHECK_THROWS_WITH_AS(read(good + "junk!"),
                       contains(where + std::to_string(good.size()) +
                                ": trailing 5 bytes after the gzip stream, not another gzip member"),
                       io::FormatError);
  // Compression method 7 in the header (only 8, deflate, exists); zlib
  // reports it once it has read the header's first 4 bytes.
  std::string wrong_method = good;
  wrong_method[2] = 7;
  CHECK_THROWS_WITH_AS(read(wrong_method), contains(where + "4: corrupt data (zlib: unknown compression method)"),
                       io::FormatError);
  // Garbage in the middle of the deflate data: whatever zlib notices first, it is reported, never a crash.
  for (std::size_t at : {std::size_t{12}, good.size() / 2, good.size() - 20}) {
    std::string damaged = good;
    for (std::size_t k = 0; k < 6; ++k) damaged[at + k] = static_cast<char>(~damaged[at + k]);
    CAPTURE(at);
    CHECK_THROWS_WITH_AS(read(damaged), contains("IDX file '" + dir / "bad.gz" + "': "), io::FormatError);
  }
}

namespace {

// Writes a train set of Fashion-MNIST's file names into `dir`: images as the
// given IDX bytes, labels as the given IDX bytes.
void write_fashion_files(const ScratchDir& dir, const std::string& images, const std::string& labels) {
  write_gzip(dir / "train-images-idx3-ubyte.gz", images);
  write_gzip(dir / "train-labels-idx1-ubyte.gz", labels);
}

std::string images_idx(std::uint32_t n) {
  std::string pixels(std::size_t{n} * 28 * 28, '\0');
  for (std::size_t i = 0; i < pixels.size(); ++i) pixels[i] = static_cast<char>(i % 256);
  return idx_header(0x08, {n, 28, 28}) + pixels;
}

std::string labels_idx(const std::vector<std::uint8_t>& labels) {
  return idx_header(0x08, {static_cast<std::uint32_t>(labels.size())}) + big_endian(labels);
}

}  // namespace

TEST_CASE("FashionMNIST: images scaled to [0, 1] in (N, 1, 28, 28), labels as int32") {
  ScratchDir dir;
  write_fashion_files(dir, images_idx(3), labels_idx({9, 0, 3}));
  const data::FashionMNIST set(true, dir.path);
  CHECK(set.size() == 3);
  CHECK(set.images().shape() == Shape{3, 1, 28, 28});
  CHECK(set.images().dtype() == DType::float32);
  CHECK(set.labels().shape() == Shape{3});
  CHECK(set.labels().dtype() == DType::int32);
  CHECK(set.labels().to_vector<std::int32_t>() == std::vector<std::int32_t>{9, 0, 3});
  const auto pixels = set.images().to_vector<float>();
  for (std::size_t i : {std::size_t{0}, std::size_t{51}, std::size_t{255}, std::size_t{256 + 128}, pixels.size() - 1})
    CHECK(pixels[i] == static_cast<float>(i % 256) / 255.0f);
  CHECK(data::FashionMNIST::text_labels[9] == "Ankle boot");
  CHECK(data::FashionMNIST::text_labels[0] == "T-shirt/top");
  // It is an ArrayDataset: the loader takes it as one.
  const data::ArrayDataset plain = set;
  CHECK(plain.data().storage() == set.images().storage());
}

TEST_CASE("FashionMNIST: files that are missing or do not belong together name both files") {
  ScratchDir dir;
  const std::string files = "FashionMNIST: images '" + dir / "train-images-idx3-ubyte.gz" + "', labels '" +
                            dir / "train-labels-idx1-ubyte.gz" + "': ";
  auto load = [&](const std::string& images, const std::string& labels) {
    write_fashion_files(dir, images, labels);
    return data::FashionMNIST(true, dir.path);
  };
  CHECK_THROWS_WITH_AS(load(images_idx(3), labels_idx({1, 2})), contains(files + "3 images but 2 labels"),
                       io::FormatError);
  CHECK_THROWS_WITH_AS(load(idx_header(0x08, {3, 784}) + std::string(3 * 784, 'x'), labels_idx({1, 2, 3})),
                       contains(files + "the images file holds a (3, 784) uint8 array, not (N, 28, 28) uint8"),
                       io::FormatError);
  CHECK_THROWS_WITH_AS(load(idx_header(0x08, {1, 27, 29}) + std::string(27 * 29, 'x'), labels_idx({1})),
                       contains(files + "the images file holds a (1, 27, 29) uint8 array"), io::FormatError);
  CHECK_THROWS_WITH_AS(load(idx_header(0x0C, {1, 28, 28}) + std::string(4 * 784, 'x'), labels_idx({1})),
                       contains(files + "the images file holds a (1, 28, 28) int32 array"), io::FormatError);
  CHECK_THROWS_WITH_AS(load(images_idx(2), idx_header(0x08, {2, 1}) + "\x01\x02"),
                       contains(files + "the labels file holds a (2, 1) uint8 array, not (N,) uint8"), io::FormatError);
  CHECK_THROWS_WITH_AS(load(images_idx(3), labels_idx({9, 10, 0})),
                       contains(files + "label 1 is 10; Fashion-MNIST's classes are 0 to 9"), io::FormatError);
  // A malformed file is read_idx's error, naming that file.
  CHECK_THROWS_WITH_AS(load(images_idx(2), labels_idx({1, 2}) + "x"),
                       contains("IDX file '" + dir / "train-labels-idx1-ubyte.gz" + "': offset 10: trailing 1 byte after"),
                       io::FormatError);
  CHECK_THROWS_WITH_AS(data::FashionMNIST(false, dir.path),
                       contains("FashionMNIST: cannot read '" + dir / "t10k-images-idx3-ubyte.gz" +
                                "': No such file or directory (the dataset is looked for in '" + dir.path.string() +
                                "'; pass the directory that holds its files as `root`)"),
                       io::FileError);
}

// The real dataset is a declared dependency (scripts/setup.sh installs the
// Debian package dataset-fashion-mnist), so its absence fails the test. The
// expected sums were computed independently with Python's gzip module.
TEST_CASE("FashionMNIST: the real dataset") {
  const fs::path root = "/usr/share/datasets/fashion-mnist";
  REQUIRE_MESSAGE(fs::is_directory(root), root.string(),
                  " does not exist: run scripts/setup.sh, which installs the package dataset-fashion-mnist");

  struct Expected {
    bool train;
    std::size_t n;
    std::vector<std::int32_t> first_labels;
    std::int64_t weighted_label_sum;  // sum of i * label_i: the order of the labels
    std::int64_t pixel_sum;           // of the files' bytes 0..255
    std::int64_t first_image_sum;
  };
  for (const Expected& expected : {Expected{true, 60000, {9, 0, 0, 3, 0, 2, 7, 2, 5, 5}, 8087216427, 3431114169, 76247},
                                   Expected{false, 10000, {9, 2, 1, 1, 6, 1, 4, 6, 5, 7}, 225732341, 573469082, 33456}}) {
    CAPTURE(expected.train);
    const data::FashionMNIST set(expected.train, root);
    REQUIRE(set.size() == expected.n);
    const auto n = static_cast<std::int64_t>(expected.n);
    CHECK(set.images().shape() == Shape{n, 1, 28, 28});
    CHECK(set.labels().shape() == Shape{n});

    const auto labels = set.labels().to_vector<std::int32_t>();
    CHECK(std::vector<std::int32_t>(labels.begin(), labels.begin() + 10) == expected.first_labels);
    std::vector<std::int64_t> per_class(10);
    std::int64_t weighted = 0;
    for (std::size_t i = 0; i < labels.size(); ++i) {
      ++per_class[static_cast<std::size_t>(labels[i])];
      weighted += static_cast<std::int64_t>(i) * labels[i];
    }
    CHECK(per_class == std::vector<std::int64_t>(10, n / 10));  // balanced: 6000 or 1000 of each class
    CHECK(weighted == expected.weighted_label_sum);
    CHECK(data::FashionMNIST::text_labels[static_cast<std::size_t>(labels[0])] == "Ankle boot");

    // Scaling by 1/255 keeps each grey level recoverable exactly.
    const float* pixels = set.images().data<float>();
    std::int64_t pixel_sum = 0, first_image_sum = 0;
    float low = 1, high = 0;
    for (std::int64_t i = 0; i < n * 784; ++i) {
      const auto grey = static_cast<std::int64_t>(std::lround(pixels[i] * 255.0f));
      pixel_sum += grey;
      if (i < 784) first_image_sum += grey;
      low = std::min(low, pixels[i]);
      high = std::max(high, pixels[i]);
    }
    CHECK(pixel_sum == expected.pixel_sum);
    CHECK(first_image_sum == expected.first_image_sum);
    CHECK(low == 0.0f);
    CHECK(high == 1.0f);

    // One shuffled epoch: every sample once, the last batch the remainder.
    data::DataLoader loader(set, 256, {.shuffle = true, .seed = 1});
    CHECK(loader.size() == (expected.n + 255) / 256);
    std::int64_t samples = 0, label_sum = 0;
    std::size_t batches = 0;
    for (auto& [X, y] : loader) {
      const std::int64_t rows = ++batches < loader.size() ? 256 : n % 256;
      CHECK(X.shape() == Shape{rows, 1, 28, 28});
      CHECK(y.shape() == Shape{rows});
      samples += rows;
      for (std::int32_t label : y.to_vector<std::int32_t>()) label_sum += label;
    }
    CHECK(samples == n);
    CHECK(label_sum == 45 * n / 10);
  }
  // read_idx gives the file's own array.
  const Tensor raw = data::read_idx(root / "t10k-images-idx3-ubyte.gz");
  CHECK(raw.shape() == Shape{10000, 28, 28});
  CHECK(raw.dtype() == DType::uint8);
  const auto bytes = raw.to_vector<std::uint8_t>();
  CHECK(std::accumulate(bytes.begin(), bytes.end(), std::int64_t{0}) == 573469082);
}

namespace {

// n samples: row i of the data is i * width, ..., i * width + width - 1
// (float32) and its label is i (int32).
data::ArrayDataset numbered(std::int64_t n, std::int64_t width = 3) {
  std::vector<float> rows(static_cast<std::size_t>(n * width));
  std::iota(rows.begin(), rows.end(), 0.0f);
  std::vector<std::int32_t> labels(static_cast<std::size_t>(n));
  std::iota(labels.begin(), labels.end(), 0);
  return {array(rows, Shape{n, width}), array(labels, Shape{n})};
}

using Labels = std::vector<std::vector<std::int32_t>>;

// One epoch of a loader over numbered(): each batch's labels, after checking
// that every row arrived with its own label.
Labels epoch(data::DataLoader& loader) {
  Labels batches;
  for (auto& [X, y] : loader) {
    REQUIRE(X.ndim() == 2);
    REQUIRE(y.shape() == Shape{X.shape()[0]});
    CHECK(X.is_contiguous());
    const auto labels = y.to_vector<std::int32_t>();
    const auto rows = X.to_vector<float>();
    const auto width = static_cast<std::size_t>(X.shape()[1]);
    bool rows_match = true;
    for (std::size_t r = 0; r < labels.size(); ++r)
      for (std::size_t k = 0; k < width; ++k)
        rows_match &= rows[r * width + k] == static_cast<float>(static_cast<std::size_t>(labels[r]) * width + k);
    CHECK(rows_match);
    batches.push_back(labels);
  }
  return batches;
}

std::vector<std::int32_t> flat(const Labels& batches) {
  std::vector<std::int32_t> all;
  for (const auto& b : batches) all.insert(all.end(), b.begin(), b.end());
  return all;
}

std::vector<std::int32_t> iota_labels(std::int32_t n) {
  std::vector<std::int32_t> v(static_cast<std::size_t>(n));
  std::iota(v.begin(), v.end(), 0);
  return v;
}

std::size_t threads_in_process() {
  const fs::directory_iterator tasks("/proc/self/task");
  return static_cast<std::size_t>(std::distance(begin(tasks), end(tasks)));
}

// The thread count once it has come down to `expected`, or after 2 s: a
// joined thread can still be listed in /proc for a moment (the join returns
// when the thread clears its id, before the kernel removes its task), which
// a loaded machine stretches. A thread left running still fails the check.
std::size_t threads_settled_at(std::size_t expected) {
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  std::size_t n = threads_in_process();
  while (n != expected && std::chrono::steady_clock::now() < give_up) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    n = threads_in_process();
  }
  return n;
}

}  // namespace

// A loader is a std::ranges::input_range: range-for and the ranges algorithms take it.
static_assert(std::ranges::input_range<data::DataLoader>);

TEST_CASE("DataLoader: batches in the dataset's order; the last one is smaller unless drop_last") {
  data::DataLoader loader(numbered(10), 4);
  CHECK(loader.size() == 3);
  CHECK(loader.batch_size() == 4);
  const Labels in_order{{0, 1, 2, 3}, {4, 5, 6, 7}, {8, 9}};
  CHECK(epoch(loader) == in_order);
  CHECK(epoch(loader) == in_order);  // without shuffle every epoch is alike

  auto first = loader.begin();
  CHECK(first->first.shape() == Shape{4, 3});
  CHECK(first->first.dtype() == DType::float32);
  CHECK(first->second.dtype() == DType::int32);

  data::DataLoader dropping(numbered(10), 4, {.drop_last = true});
  CHECK(dropping.size() == 2);
  CHECK(epoch(dropping) == Labels{{0, 1, 2, 3}, {4, 5, 6, 7}});
  data::DataLoader even(numbered(8), 4, {.drop_last = true});
  CHECK(even.size() == 2);
  CHECK(epoch(even) == Labels{{0, 1, 2, 3}, {4, 5, 6, 7}});

  data::DataLoader larger(numbered(3), 5);
  CHECK(larger.size() == 1);
  CHECK(epoch(larger) == Labels{{0, 1, 2}});
  data::DataLoader larger_dropping(numbered(3), 5, {.drop_last = true});
  CHECK(larger_dropping.size() == 0);
  CHECK(epoch(larger_dropping).empty());
  data::DataLoader none(numbered(0), 4);
  CHECK(none.size() == 0);
  CHECK(none.begin() == none.end());
}

TEST_CASE("DataLoader: shuffling visits every sample once per epoch, in an order set by the seed and the epoch") {
  auto shuffled = [](std::uint64_t seed, bool drop_last = false) {
    return data::DataLoader(numbered(103), 10, {.shuffle = true, .seed = seed, .drop_last = drop_last});
  };
  data::DataLoader loader = shuffled(7);
  CHECK(loader.size() == 11);
  Labels epochs[3];
  for (Labels& e : epochs) {
    e = epoch(loader);
    REQUIRE(e.size() == 11);
    CHECK(e.back().size() == 3);
    std::vector<std::int32_t> all = flat(e);
    CHECK(all != iota_labels(103));
    std::sort(all.begin(), all.end());
    CHECK(all == iota_labels(103));
  }
  CHECK(epochs[0] != epochs[1]);
  CHECK(epochs[1] != epochs[2]);
  CHECK(epochs[0] != epochs[2]);

  data::DataLoader same_seed = shuffled(7);
  CHECK(epoch(same_seed) == epochs[0]);
  CHECK(epoch(same_seed) == epochs[1]);
  data::DataLoader other_seed = shuffled(8);
  CHECK(epoch(other_seed) != epochs[0]);
  data::DataLoader resumed = shuffled(7);  // a run resumed after two epochs
  resumed.set_next_epoch(2);
  CHECK(epoch(resumed) == epochs[2]);
  CHECK(resumed.next_epoch() == 3);

  // drop_last leaves out the end of the same order.
  data::DataLoader dropping = shuffled(7, true);
  CHECK(dropping.size() == 10);
  const std::vector<std::int32_t> kept = flat(epoch(dropping));
  const std::vector<std::int32_t> all = flat(epochs[0]);
  CHECK(kept == std::vector<std::int32_t>(all.begin(), all.begin() + 100));
}

TEST_CASE("DataLoader: prefetching changes when batches are made, not what they hold") {
  const data::ArrayDataset set = numbered(57, 5);
  using Values = std::vector<std::pair<std::vector<float>, std::vector<std::int32_t>>>;
  auto two_epochs = [&](std::size_t prefetch) {
    data::DataLoader loader(set, 8, {.shuffle = true, .seed = 3, .prefetch = prefetch});
    Values values;
    for (int e = 0; e < 2; ++e)
      for (auto& [X, y] : loader) values.emplace_back(X.to_vector<float>(), y.to_vector<std::int32_t>());
    return values;
  };
  const Values synchronous = two_epochs(0);
  CHECK(synchronous.size() == 16);
  for (std::size_t prefetch : {1, 2, 8, 100}) {
    CAPTURE(prefetch);
    CHECK(two_epochs(prefetch) == synchronous);
  }
}

TEST_CASE("DataLoader: leaving an epoch early stops its worker") {
  zeros({1}).wait_to_read();  // the engine's own threads exist before counting
  // Large enough that the worker is still making batches when the loop leaves.
  const data::ArrayDataset set = numbered(4000, 256);
  const std::size_t before = threads_in_process();
  data::DataLoader loader(set, 16, {.prefetch = 4});
  {
    auto it = loader.begin();
    CHECK(threads_in_process() == before + 1);
    CHECK(it->second.to_vector<std::int32_t>() == iota_labels(16));
  }
  CHECK(threads_settled_at(before) == before);
  int taken = 0;
  for (auto& batch : loader)
    if (++taken == 3 && batch.first.defined()) break;
  CHECK(threads_settled_at(before) == before);

  // An abandoned epoch still counts: the next loop is the next epoch.
  data::DataLoader shuffled(set, 16, {.shuffle = true, .seed = 5, .prefetch = 3});
  data::DataLoader twin(set, 16, {.shuffle = true, .seed = 5, .prefetch = 0});
  {
    auto it = shuffled.begin();
    ++it;
  }
  epoch(twin);
  const Labels second_epoch = epoch(twin);
  CHECK(epoch(shuffled) == second_epoch);

  // An epoch's iterator owns what it needs: it outlives its loader.
  std::optional<data::DataLoader> owner(std::in_place, set, 1000, data::DataLoaderOptions{.prefetch = 2});
  auto it = owner->begin();
  owner.reset();
  std::int64_t rows = 0;
  for (; it != std::default_sentinel; ++it) rows += it->first.shape()[0];
  CHECK(rows == 4000);

  // Starting and abandoning epochs over and over neither hangs nor leaks.
  for (int round = 0; round < 50; ++round) {
    auto started = loader.begin();
    if (round % 2 == 1) ++started;
  }
  CHECK(threads_settled_at(before) == before);
}

TEST_CASE("DataLoader: a failure while making batches is thrown in the loop") {
  for (std::size_t prefetch : {0, 2}) {
    CAPTURE(prefetch);
    // The dataset's inputs are a future whose op fails: the loader waits for
    // them before copying rows (on the worker, with prefetch).
    Tensor broken({6, 2});
    push_op("explode", {}, {broken}, [] { fail<ValueError>("the detonator was pressed"); });
    data::DataLoader loader({broken, array(iota_labels(6), Shape{6})}, 2, {.prefetch = prefetch});
    const char* message = "engine op 'explode' on cpu(0) failed: the detonator was pressed";
    CHECK_THROWS_WITH_AS(loader.begin(), contains(message), ValueError);
    auto loop = [&] {
      for (auto& [X, y] : loader) CHECK(X.defined());
    };
    CHECK_THROWS_WITH_AS(loop(), contains(message), ValueError);
  }
}

TEST_CASE("DataLoader and ArrayDataset: invalid arguments") {
  CHECK_THROWS_WITH_AS(data::DataLoader(numbered(4), 0), contains("DataLoader: batch_size must be at least 1"),
                       ValueError);
  const data::ArrayDataset on_meta(Tensor({4, 2}, DType::float32, meta()), Tensor({4}, DType::int32, meta()));
  CHECK_THROWS_WITH_AS(data::DataLoader(on_meta, 2), contains("DataLoader: the dataset lives on meta"), DeviceError);

  const Tensor rows = zeros({5, 3});
  CHECK_THROWS_WITH_AS(data::ArrayDataset(rows, zeros({4}, DType::int32)),
                       contains("ArrayDataset: data of shape (5, 3) has 5 samples but labels of shape (4,) have 4"),
                       ShapeError);
  CHECK_THROWS_WITH_AS(data::ArrayDataset(rows, zeros({}, DType::int32)),
                       contains("ArrayDataset: labels is 0-d"), ShapeError);
  CHECK_THROWS_WITH_AS(data::ArrayDataset(transpose(zeros({3, 5})), zeros({5})),
                       contains("ArrayDataset: data of shape (5, 3) is a non-contiguous view; call contiguous() first"),
                       ValueError);
  CHECK_THROWS_WITH_AS(data::ArrayDataset(Tensor(), zeros({5})),
                       contains("ArrayDataset: data is an empty tensor"), ValueError);
  // A contiguous slice of rows is fine: its rows start at the view's offset.
  const data::ArrayDataset set = numbered(10);
  data::DataLoader part(data::ArrayDataset(slice(set.data(), 0, 4, 10), slice(set.labels(), 0, 4, 10)), 4);
  CHECK(epoch(part) == Labels{{4, 5, 6, 7}, {8, 9}});
}

namespace {
fs::path numpy_file(const std::string& name) { return fs::path(HYBRA_TEST_DATA_DIR) / "numpy" / name; }

std::string file_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}
}  // namespace

// The files of tests/data/numpy were written by NumPy 1.23.5 (make.py there).
TEST_CASE("npy: NumPy's files of every dtype hybra has, C and Fortran order, big-endian, 0-d and empty") {
  const Tensor a = io::load_npy(numpy_file("float32_2x3.npy"));
  CHECK(a.dtype() == DType::float32);
  CHECK(a.shape() == Shape{2, 3});
  CHECK(a.to_vector<float>() == std::vector<float>{0, 0.25f, 0.5f, 0.75f, 1, 1.25f});
  const Tensor b = io::load_npy(numpy_file("int64_4.npy"));
  CHECK(b.to_vector<std::int64_t>() == std::vector<std::int64_t>{-3, 0, 7, std::int64_t{1} << 40});
  const Tensor f = io::load_npy(numpy_file("float64_fortran_2x3.npy"));
  CHECK(f.shape() == Shape{2, 3});
  CHECK(f.to_vector<double>() == std::vector<double>{0.5, 1.5, 2.5, 3.5, 4.5, 5.5});
  const Tensor big = io::load_npy(numpy_file("int32_big_endian_3.npy"));
  CHECK(big.dtype() == DType::int32);
  CHECK(big.to_vector<std::int32_t>() == std::vector<std::int32_t>{1, -2, 65536});
  const Tensor flags = io::load_npy(numpy_file("bool_2x2.npy"));
  CHECK(flags.dtype() == DType::uint8);
  CHECK(flags.to_vector<int>() == std::vector<int>{1, 0, 0, 1});
  const Tensor scalar = io::load_npy(numpy_file("float64_scalar.npy"));
  CHECK(scalar.shape() == Shape{});
  CHECK(scalar.item<double>() == 2.25);
  CHECK(io::load_npy(numpy_file("uint8_0x3.npy")).shape() == Shape{0, 3});
  CHECK_THROWS_WITH_AS(io::load_npy(numpy_file("int16_2.npy")),
                       contains("int16_2.npy': offset 10: dtype '<i2' has no hybra dtype"), DTypeError);
}

TEST_CASE("npy: hybra writes the bytes NumPy writes, and reads back every dtype and views") {
  ScratchDir dir;
  for (const char* name : {"float32_2x3.npy", "int64_4.npy", "float64_scalar.npy", "uint8_0x3.npy"}) {
    CAPTURE(name);
    io::save_npy(dir / name, io::load_npy(numpy_file(name)));
    CHECK(file_bytes(dir / name) == file_bytes(numpy_file(name)));
  }
  const Tensor x = reshape(arange(0, 24, 1, DType::float64), {2, 3, 4});
  for (DType d : {DType::float32, DType::float64, DType::int32, DType::int64, DType::uint8}) {
    CAPTURE(name(d));
    const Tensor view = transpose(x.astype(d), {2, 0, 1});  // not contiguous: written row-major
    io::save_npy(dir / "v.npy", view);
    const Tensor back = io::load_npy(dir / "v.npy");
    CHECK(back.dtype() == d);
    CHECK(back.shape() == Shape{4, 2, 3});
    CHECK(back.to_vector<double>() == view.to_vector<double>());
    CHECK((file_bytes(dir / "v.npy").size() - 24 * size_of(d)) % 64 == 0);  // the values start on a 64-byte boundary
  }
}

TEST_CASE("npz: np.savez and np.savez_compressed archives, and hybra's, read back under np.load's names") {
  for (const char* name : {"arrays.npz", "arrays_compressed.npz"}) {
    CAPTURE(name);
    const auto arrays = io::load_npz(numpy_file(name));
    REQUIRE(arrays.size() == 2);
    CHECK(arrays[0].first == "x");
    CHECK(arrays[0].second.to_vector<float>() == std::vector<float>{0, 1, 2, 3});
    CHECK(arrays[0].second.shape() == Shape{2, 2});
    CHECK(arrays[1].first == "y");
    CHECK(arrays[1].second.to_vector<std::int32_t>() == std::vector<std::int32_t>{5, 6, 7});
  }
  ScratchDir dir;
  const std::vector<std::pair<std::string, Tensor>> mine{{"weights", random_normal({3, 4})},
                                                          {"labels", array<std::int64_t>({1, 2})}};
  io::save_npz(dir / "mine.npz", mine);
  const auto back = io::load_npz(dir / "mine.npz");
  REQUIRE(back.size() == 2);
  CHECK(back[0].first == "weights");
  CHECK(back[0].second.to_vector<float>() == mine[0].second.to_vector<float>());
  CHECK(back[1].second.to_vector<std::int64_t>() == std::vector<std::int64_t>{1, 2});
  CHECK_THROWS_WITH_AS(io::save_npz(dir / "twice.npz", std::vector<std::pair<std::string, Tensor>>{
                                                           {"a", ones({1})}, {"a", ones({2})}}),
                       contains("save_npz: two arrays are named 'a'"), ValueError);
  CHECK_FALSE(fs::exists(dir / "twice.npz"));
}

TEST_CASE("npy and npz: a malformed file is a FormatError naming the file, the member and the offset") {
  ScratchDir dir;
  const std::string good = file_bytes(numpy_file("float32_2x3.npy"));
  write_raw(dir / "magic.npy", "NUMPY" + good.substr(5));
  CHECK_THROWS_WITH_AS(io::load_npy(dir / "magic.npy"), contains("magic.npy': offset 0: not a .npy file"), io::FormatError);
  write_raw(dir / "short.npy", good.substr(0, good.size() - 4));
  CHECK_THROWS_WITH_AS(io::load_npy(dir / "short.npy"),
                       contains("short.npy': offset 128: shape (2, 3) needs 24 bytes of values, the file has 20"),
                       io::FormatError);
  write_raw(dir / "header.npy", good.substr(0, 40));
  CHECK_THROWS_WITH_AS(io::load_npy(dir / "header.npy"), contains("offset 8: a header of 118 bytes runs past the end"),
                       io::FormatError);
  std::string structured = good;
  structured.replace(structured.find("'<f4'"), 5, "[('a'");
  write_raw(dir / "structured.npy", structured);
  CHECK_THROWS_WITH_AS(io::load_npy(dir / "structured.npy"), contains("is not a simple dtype string"), io::FormatError);
  CHECK_THROWS_AS(io::load_npy(dir / "missing.npy"), io::FileError);

  // A flipped byte in a member's values fails its CRC-32; a cut archive has no end record.
  std::string archive = file_bytes(numpy_file("arrays.npz"));
  const std::size_t values = archive.find("NUMPY") + 200;
  archive[values] = static_cast<char>(archive[values] ^ 1);
  write_raw(dir / "flipped.npz", archive);
  CHECK_THROWS_WITH_AS(io::load_npz(dir / "flipped.npz"), contains("fails its CRC-32 check"), io::FormatError);
  write_raw(dir / "cut.npz", file_bytes(numpy_file("arrays.npz")).substr(0, 300));
  CHECK_THROWS_WITH_AS(io::load_npz(dir / "cut.npz"), contains("cut.npz': offset 300: no ZIP end-of-central-directory record"),
                       io::FormatError);
  // A member's own errors name the member.
  const std::vector<std::pair<std::string, Tensor>> one{{"x", ones({2})}};
  io::save_npz(dir / "one.npz", one);
  std::string bad = file_bytes(dir / "one.npz");
  bad.replace(bad.find("'<f4'"), 5, "'<i2'");
  write_raw(dir / "bad.npz", bad);
  CHECK_THROWS_AS(io::load_npz(dir / "bad.npz"), io::FormatError);  // the CRC-32 sees the change first
}

namespace {
// A user's own dataset: sample i is a 2x3 image whose every pixel is i, labelled i % 4.
class Constant : public data::Dataset {
 public:
  explicit Constant(std::size_t n) : n_(n) {}
  std::size_t size() const override { return n_; }
  data::Sample item(std::size_t i) const override {
    return {full({1, 2, 3}, static_cast<float>(i)), full({}, static_cast<std::int32_t>(i % 4), DType::int32)};
  }

 private:
  std::size_t n_;
};
}  // namespace

TEST_CASE("Dataset: a user's dataset and a FunctionDataset batch as an ArrayDataset does, with any number of workers") {
  data::DataLoader loader(Constant(10), 4, {.shuffle = true, .seed = 2});
  std::vector<float> seen;
  for (auto& [X, y] : loader) {
    CHECK(X.shape() == Shape{X.shape()[0], 1, 2, 3});
    const auto pixels = X.to_vector<float>();
    const auto labels = y.to_vector<std::int32_t>();
    for (std::size_t r = 0; r < labels.size(); ++r) {
      CHECK(pixels[r * 6] == pixels[r * 6 + 5]);
      CHECK(labels[r] == static_cast<std::int32_t>(pixels[r * 6]) % 4);
      seen.push_back(pixels[r * 6]);
    }
  }
  std::sort(seen.begin(), seen.end());
  CHECK(seen == std::vector<float>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9});

  // The same batches, made by the consumer, one worker or four.
  const data::FunctionDataset made(37, [](std::size_t i) {
    return data::Sample{array<float>({static_cast<float>(i), -static_cast<float>(i)}), array<std::int64_t>({std::int64_t(i)})};
  });
  auto batches = [&](std::size_t workers, std::size_t prefetch) {
    data::DataLoader l(made, 5, {.shuffle = true, .seed = 4, .prefetch = prefetch, .workers = workers});
    std::vector<std::vector<float>> all;
    for (int e = 0; e < 2; ++e)
      for (auto& [X, y] : l) all.push_back(X.to_vector<float>());
    return all;
  };
  const auto alone = batches(0, 2);
  CHECK(alone.size() == 16);
  for (const auto& [workers, prefetch] : {std::pair<std::size_t, std::size_t>{1, 2}, {4, 2}, {4, 8}, {3, 100}}) {
    CAPTURE(workers);
    CAPTURE(prefetch);
    CHECK(batches(workers, prefetch) == alone);
  }

  // Samples of different shapes cannot be stacked.
  const data::FunctionDataset ragged(3, [](std::size_t i) { return data::Sample{zeros({static_cast<std::int64_t>(i) + 1}), zeros({})}; });
  data::DataLoader ragged_loader(ragged, 3, {.workers = 2});
  CHECK_THROWS_WITH_AS(ragged_loader.begin(),
                       contains("DataLoader: the input of sample 1 is (2,) float32, that of sample 0 in the same batch (1,) "
                                "float32: a batch stacks samples of one shape"),
                       ShapeError);
  CHECK_THROWS_WITH_AS(data::FunctionDataset(3, nullptr), contains("no function to make samples with"), ValueError);
}

TEST_CASE("transforms: ToTensor, Normalize, RandomFlipLeftRight and RandomCrop, run by the workers per sample and epoch") {
  data::SampleRandom random(1, 0, 0);
  // A 2x3 RGB image, (height, width, channels) uint8.
  const Tensor hwc = array<std::uint8_t>({0, 255, 51, 102, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 255, 255, 255}, Shape{2, 3, 3});
  const Tensor chw = data::transforms::ToTensor()(hwc, random);
  CHECK(chw.shape() == Shape{3, 2, 3});
  const auto v = chw.to_vector<float>();
  CHECK(v[0] == 0.0f);
  CHECK(v[1] == 0.4f);         // the red of pixel (0, 1)
  CHECK(v[6] == 1.0f);         // the green of pixel (0, 0)
  CHECK(v[12] == 0.2f);        // the blue of pixel (0, 0)
  CHECK(v[17] == 1.0f);        // the blue of pixel (1, 2)
  const Tensor normal = data::transforms::Normalize({0.5, 0, 1}, {0.5, 2, 1})(chw, random);
  CHECK(normal.to_vector<float>()[0] == -1.0f);
  CHECK(normal.to_vector<float>()[6] == 0.5f);
  CHECK(normal.to_vector<float>()[12] == doctest::Approx(0.2 - 1));

  const Tensor image = reshape(arange(1, 13, 1), {1, 3, 4});
  int flipped = 0;
  for (std::uint64_t sample = 0; sample < 200; ++sample) {
    data::SampleRandom r(9, 0, sample);
    const auto out = data::transforms::RandomFlipLeftRight()(image, r).to_vector<float>();
    if (out[0] == 4) {
      CHECK(out == std::vector<float>{4, 3, 2, 1, 8, 7, 6, 5, 12, 11, 10, 9});
      ++flipped;
    }
  }
  CHECK(flipped > 70);
  CHECK(flipped < 130);
  // A 2x2 window of the image padded by 1: every place appears, zeros where it reaches the padding.
  std::set<std::vector<float>> windows;
  for (std::uint64_t sample = 0; sample < 300; ++sample) {
    data::SampleRandom r(9, 1, sample);
    windows.insert(data::transforms::RandomCrop(2, 2, 1)(image, r).to_vector<float>());
  }
  CHECK(windows.size() == 4 * 5);
  CHECK_FALSE(windows.contains(std::vector<float>{0, 0, 0, 0}));  // a window always holds a pixel
  CHECK(windows.contains(std::vector<float>{0, 0, 0, 1}));     // the top left corner, padded
  CHECK(windows.contains(std::vector<float>{6, 7, 10, 11}));    // inside
  CHECK(windows.contains(std::vector<float>{12, 0, 0, 0}));     // the bottom right corner, padded
  CHECK_THROWS_WITH_AS(data::transforms::RandomCrop(5, 5)(image, random), contains("a 5x5 window does not fit an image of 3x4"),
                       ShapeError);
  CHECK_THROWS_AS(data::transforms::Normalize({0.5}, {0})(image, random), ValueError);
  CHECK_THROWS_WITH_AS(data::transforms::Normalize({0, 0}, {1, 1})(image, random), contains("2 means for an image of 1 channels"),
                       ShapeError);

  // Through a loader: each sample's crop and flip depend on the seed, the epoch and the sample, not on the workers.
  const data::ArrayDataset images(reshape(arange(0, 8 * 12, 1), {8, 1, 3, 4}), arange(0, 8, 1, DType::int32));
  const data::Transform augment =
      data::transforms::Compose({data::transforms::RandomCrop(3, 4, 1), data::transforms::RandomFlipLeftRight()});
  auto run = [&](std::size_t workers) {
    data::DataLoader l(images, 3, {.shuffle = true, .seed = 6, .workers = workers, .transform = augment});
    std::vector<std::vector<float>> all;
    for (int e = 0; e < 2; ++e)
      for (auto& [X, y] : l) {
        CHECK(X.shape()[1] == 1);
        all.push_back(X.to_vector<float>());
      }
    return all;
  };
  const auto alone = run(0);
  CHECK(run(3) == alone);
  CHECK(std::vector<std::vector<float>>(alone.begin(), alone.begin() + 3) !=
        std::vector<std::vector<float>>(alone.begin() + 3, alone.end()));  // another epoch, other crops
}

TEST_CASE("from_blob: a user's memory as a tensor, without a copy; its release runs when the last tensor is gone") {
  std::vector<float> memory{1, 2, 3, 4, 5, 6};
  int released = 0;
  {
    Tensor t = from_blob(memory.data(), {2, 3}, [&](void* p) {
      CHECK(p == memory.data());
      ++released;
    });
    CHECK(t.raw_data() == memory.data());
    Tensor doubled = t * 2;
    t.assign(t + 10);  // written in place
    waitall();
    CHECK(memory == std::vector<float>{11, 12, 13, 14, 15, 16});
    CHECK(doubled.to_vector<float>() == std::vector<float>{2, 4, 6, 8, 10, 12});
    const Tensor row = slice(t, 0, 1, 2);  // a view keeps the memory
    t = Tensor();
    CHECK(released == 0);
    CHECK(row.to_vector<float>() == std::vector<float>{14, 15, 16});
  }
  CHECK(released == 1);
  // Borrowed: no release; a dataset over it batches without a copy of its own.
  std::vector<std::int64_t> labels{0, 1, 2};
  const data::ArrayDataset set(from_blob(memory.data(), {3, 2}), from_blob(labels.data(), {3}));
  data::DataLoader loader(set, 3);
  CHECK((*loader.begin()).first.to_vector<float>() == memory);
  CHECK_THROWS_WITH_AS(from_blob(reinterpret_cast<char*>(memory.data()) + 2, {2}, DType::float32),
                       contains("is not aligned to float32's 4 bytes"), ValueError);
  CHECK_THROWS_WITH_AS(from_blob(static_cast<float*>(nullptr), {2}), contains("from_blob: a null pointer for shape (2,)"),
                       ValueError);
  CHECK_THROWS_WITH_AS(from_blob(memory.data(), {2}, {}, cuda(0)), contains("from_blob: cuda(0) is not a CPU device"),
                       DeviceError);
}
