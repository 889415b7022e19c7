// The CUDA groundwork that needs no GPU: the driver probed at run time (on a
// machine without one, the status says why), NVRTC compiling to PTX for
// sm_90, its errors, the kernel cache's memory and disk halves (with
// corrupt, foreign, truncated and evicted entries), and every elementwise op
// of the table generated as CUDA and compiled for sm_90.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <hybra/hybra.hpp>
#include <string>
#include <unistd.h>

using namespace hybra;
namespace fs = std::filesystem;

namespace {

const std::string saxpy = R"(extern "C" __global__ void saxpy(float a, const float* x, float* y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}
)";

// A fresh directory, removed at the end of the test.
struct TempDir {
  fs::path path = fs::temp_directory_path() / ("hybra-kernel-cache-" + std::to_string(::getpid()));
  TempDir() {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
};

std::string read(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}
void write(const fs::path& p, const std::string& bytes) {
  std::ofstream(p, std::ios::binary | std::ios::trunc) << bytes;
}

}  // namespace

TEST_CASE("cuda: the driver is probed at run time; with no GPU the status says why") {
  const auto& s = backend::cuda::driver_status();
  CHECK(s.gpus.empty() == !s.problem.empty());
  if (s.library.empty()) CHECK(s.problem.find("libcuda.so.1") != std::string::npos);
  MESSAGE("CUDA driver: ", s.gpus.empty() ? s.problem : s.gpus.front().name);
}

TEST_CASE("cuda: NVRTC compiles CUDA C++ to PTX for sm_90 without a GPU") {
  const auto& nvrtc = backend::cuda::nvrtc();
  REQUIRE_MESSAGE(nvrtc.loaded(), "NVRTC (the CUDA toolkit) is needed: ", nvrtc.problem());
  const std::string ptx = nvrtc.compile_ptx(saxpy, "saxpy.cu", "compute_90");
  CHECK(ptx.find(".target sm_90") != std::string::npos);
  CHECK(ptx.find(".entry saxpy") != std::string::npos);
  CHECK(ptx.find("fma.rn.f32") != std::string::npos);
}

TEST_CASE("cuda: HYBRA_DEBUG=3 prints each program's source before it is compiled") {
  TempDir dir;
  const fs::path log = dir.path / "stderr.txt";
  std::fflush(stderr);
  const int saved = ::dup(2);
  REQUIRE(std::freopen(log.c_str(), "w", stderr));
  const int was = debug::level();
  debug::set_level(debug::code);
  backend::cuda::nvrtc().compile_ptx(saxpy, "verbose.cu", "compute_90");
  debug::set_level(debug::timings);
  backend::cuda::nvrtc().compile_ptx(saxpy, "quiet.cu", "compute_90");
  debug::set_level(was);
  std::fflush(stderr);
  ::dup2(saved, 2);
  ::close(saved);
  const std::string printed = read(log);
  CHECK(printed.find("hybra: NVRTC program verbose.cu for compute_90") != std::string::npos);
  CHECK(printed.find("y[i] = a * x[i] + y[i];") != std::string::npos);
  CHECK(printed.find("quiet.cu") == std::string::npos);
}

TEST_CASE("cuda: an NVRTC failure carries the compiler's log and the numbered source") {
  const std::string bad = "extern \"C\" __global__ void broken(float* y) {\n  y[0] = undeclared;\n}\n";
  try {
    backend::cuda::nvrtc().compile_ptx(bad, "broken.cu", "compute_90");
    FAIL("NVRTC accepted an undeclared identifier");
  } catch (const CompileError& e) {
    const std::string what = e.what();
    CHECK(what.find("NVRTC could not compile broken.cu for compute_90") != std::string::npos);
    CHECK(what.find("identifier \"undeclared\" is undefined") != std::string::npos);
    CHECK(what.find("2:   y[0] = undeclared;") != std::string::npos);
  }
}

TEST_CASE("cuda: the kernel cache serves memory, then disk to a new process, and rebuilds bad entries") {
  TempDir dir;
  int builds = 0;
  auto build = [&] {
    ++builds;
    return backend::cuda::nvrtc().compile_ptx(saxpy, "saxpy.cu", "compute_90");
  };
  const std::string key = "test key: saxpy for compute_90";
  backend::cuda::KernelCache first(dir.path, 1 << 20);
  const std::string ptx = first.get(key, build);
  CHECK(first.get(key, build) == ptx);
  CHECK(builds == 1);
  CHECK(first.stats().memory_hits == 1);
  REQUIRE(fs::exists(first.path_of(key)));

  // Another process: the disk entry, no compile.
  backend::cuda::KernelCache second(dir.path, 1 << 20);
  CHECK(second.get(key, build) == ptx);
  CHECK(builds == 1);
  CHECK(second.stats().disk_hits == 1);

  // A flipped byte in the code, a truncated file, an entry for another key
  // under this key's name, a wrong magic: each is rejected and rebuilt.
  const std::string good = read(first.path_of(key));
  std::string flipped = good, foreign = good, magic = good;
  flipped[flipped.size() - 10] ^= 1;
  foreign[16] ^= 1;  // inside the stored key text
  magic[0] = 'X';
  int expected_builds = 1;
  for (const std::string& bad : {flipped, good.substr(0, good.size() / 2), foreign, magic, std::string()}) {
    write(first.path_of(key), bad);
    backend::cuda::KernelCache fresh(dir.path, 1 << 20);
    CHECK(fresh.get(key, build) == ptx);
    CHECK(fresh.stats().rejected == 1);
    CHECK(builds == ++expected_builds);
    CHECK(read(first.path_of(key)) == good);  // rewritten whole
  }
}

TEST_CASE("cuda: cuda_ptx compiles once per source and architecture") {
  TempDir dir;
  backend::cuda::KernelCache cache(dir.path, 1 << 20);
  const std::string a = backend::cuda::cuda_ptx(saxpy, "saxpy.cu", "compute_90", cache);
  CHECK(backend::cuda::cuda_ptx(saxpy, "saxpy.cu", "compute_90", cache) == a);
  CHECK(cache.stats().builds == 1);
  CHECK(cache.stats().memory_hits == 1);
  const std::string b = backend::cuda::cuda_ptx(saxpy, "saxpy.cu", "compute_80", cache);
  CHECK(cache.stats().builds == 2);
  CHECK(b.find(".target sm_80") != std::string::npos);
}

TEST_CASE("cuda: the kernel cache stays within its size bound, dropping the least recently used") {
  TempDir dir;
  const std::string code(1000, 'p');
  backend::cuda::KernelCache cache(dir.path, 2500);  // room for two entries of ~1050 bytes
  cache.get("a", [&] { return code; });
  fs::last_write_time(cache.path_of("a"), fs::file_time_type::clock::now() - std::chrono::hours(2));
  cache.get("b", [&] { return code; });
  fs::last_write_time(cache.path_of("b"), fs::file_time_type::clock::now() - std::chrono::hours(1));
  cache.get("c", [&] { return code; });
  CHECK_FALSE(fs::exists(cache.path_of("a")));
  CHECK(fs::exists(cache.path_of("b")));
  CHECK(fs::exists(cache.path_of("c")));
  // A cache whose directory cannot be made still builds and keeps in memory.
  backend::cuda::KernelCache nowhere(dir.path / "file" / "below", 1 << 20);
  write(dir.path / "file", "not a directory");
  int builds = 0;
  CHECK(nowhere.get("k", [&] { return ++builds, std::string("code"); }) == "code");
  CHECK(nowhere.get("k", [&] { return ++builds, std::string("code"); }) == "code");
  CHECK(builds == 1);
}

TEST_CASE("cuda: every elementwise op of the table compiles to a CUDA kernel for sm_90, in every dtype it takes") {
  TempDir dir;
  backend::cuda::KernelCache cache(dir.path, 16 << 20);
  const auto count = static_cast<int>(std::tuple_size_v<op::elementwise_ops>);
  int compiled = 0;
  for (DType d : {DType::float32, DType::float64, DType::int32, DType::int64, DType::uint8}) {
    CAPTURE(name(d));
    std::vector<backend::cuda::CudaKernel> kernels;
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      auto add = [&]<class Op>(Op, int index) {
        if (Op::rule == op::promote_float && !is_floating(d)) return;  // such ops are given floats
        backend::cpu::FusedProgram p;
        p.dtype = d;
        p.inputs = Op::arity;
        p.code = {{index, Op::arity, {0, 1, 2}}};
        p.registers = p.result = Op::arity;
        p.registers += 1;
        kernels.push_back(expr::cuda_elementwise_kernel(p));
      };
      (add(std::tuple_element_t<I, op::elementwise_ops>{}, static_cast<int>(I)), ...);
    }(std::make_index_sequence<count>{});
    const std::string ptx =
        backend::cuda::cuda_ptx(backend::cuda::cuda_program(kernels), "elementwise_ops.cu", "compute_90", cache);
    CHECK(ptx.find(".target sm_90") != std::string::npos);
    for (const auto& k : kernels) {
      CAPTURE(k.definition);
      CHECK(ptx.find(".entry " + k.name) != std::string::npos);
    }
    compiled += static_cast<int>(kernels.size());
  }
  const int float_only = []<std::size_t... I>(std::index_sequence<I...>) {  // ops that make floats of integers
    return ((std::tuple_element_t<I, op::elementwise_ops>::rule == op::promote_float ? 1 : 0) + ...);
  }(std::make_index_sequence<count>{});
  CHECK(compiled == 5 * count - 3 * float_only);
}

TEST_CASE("cuda: a fused program is one kernel, named by its body, with its constants exact") {
  // relu(a * b + 2.5), as fusion makes it: registers a, b, 2.5, a*b, +, relu.
  backend::cpu::FusedProgram p;
  p.inputs = 2;
  p.constants = {{2, 2.5, 0}};
  auto index = [](auto op) { return op::elementwise_index<decltype(op)>(); };
  p.code = {{index(op::multiply{}), 3, {0, 1, 0}}, {index(op::add{}), 4, {3, 2, 0}}, {index(op::relu{}), 5, {4, 0, 0}}};
  p.registers = 6;
  p.result = 5;
  const backend::cuda::CudaKernel k = expr::cuda_elementwise_kernel(p);
  CHECK(k.definition.find("hybra::op::multiply::apply<T>(r0, r1)") != std::string::npos);
  CHECK(k.definition.find("const T r2 = T(0x1.4p+1);") != std::string::npos);
  CHECK(expr::cuda_elementwise_kernel(p).name == k.name);
  p.constants[0].real = 3.5;
  CHECK(expr::cuda_elementwise_kernel(p).name != k.name);
  p.constants[0].real = 2.5;
  TempDir dir;
  backend::cuda::KernelCache cache(dir.path, 1 << 20);
  const std::string ptx = backend::cuda::cuda_ptx(backend::cuda::cuda_program({k}), "relu_fma.cu", "compute_90", cache);
  CHECK(ptx.find(".entry " + k.name) != std::string::npos);
  CHECK(ptx.find("0f40200000") != std::string::npos);  // 2.5f, inlined by the compiler
  // Infinities and NaN have no literal (an optimiser's default clipping is to ±inf): written by their bits.
  for (double special : {-HUGE_VAL, HUGE_VAL, std::nan("")}) {
    p.constants[0].real = special;
    const backend::cuda::CudaKernel clipped = expr::cuda_elementwise_kernel(p);
    CHECK(clipped.definition.find("__longlong_as_double(0x") != std::string::npos);
    CHECK(backend::cuda::cuda_ptx(backend::cuda::cuda_program({clipped}), "special.cu", "compute_90", cache)
              .find(".entry " + clipped.name) != std::string::npos);
  }
  p.code[0].op = 999;
  CHECK_THROWS_WITH_AS(expr::cuda_elementwise_kernel(p), doctest::Contains("op #999"), ValueError);
}

TEST_CASE("cuda: a conversion between every pair of dtypes compiles to a CUDA kernel for sm_90") {
  const DType dtypes[] = {DType::float32, DType::float64, DType::int32,   DType::int64,
                          DType::uint8,   DType::float16, DType::bfloat16};
  std::vector<backend::cuda::CudaKernel> kernels;
  for (DType from : dtypes)
    for (DType to : dtypes)
      if (from != to) kernels.push_back(backend::cuda::cuda_convert_kernel(from, to));
  const std::string ptx = backend::cuda::cuda_ptx(backend::cuda::cuda_program(kernels), "conversions.cu");
  for (const auto& k : kernels) CHECK(ptx.find(".entry " + k.name) != std::string::npos);
  CHECK(kernels.size() == 42);
}

TEST_CASE("cuda: a broadcast operand or a view is read through its strides, which are constants of the kernel") {
  // a (2 x 3, contiguous) + b (3, broadcast along rows) + c^T (a 3 x 2 tensor transposed).
  Tensor a = ones({2, 3}), b = ones({3}), c = ones({3, 2});
  const auto p = expr::fused_program(a + b + transpose(c));
  const std::vector<Strides> strides{{}, detail::broadcast_strides(b, {2, 3}), detail::broadcast_strides(transpose(c), {2, 3})};
  const backend::cuda::CudaKernel k = expr::cuda_elementwise_kernel(p, {2, 3}, strides);
  CHECK(k.definition.find("const long long c1 = rest % 3LL; rest /= 3LL;") != std::string::npos);
  CHECK(k.definition.find("const long long c0 = rest;") != std::string::npos);
  CHECK(k.definition.find("const T r0 = in0[i];") != std::string::npos);
  CHECK(k.definition.find("const T r1 = in1[c1 * 1LL];") != std::string::npos);
  CHECK(k.definition.find("const T r2 = in2[c0 * 1LL + c1 * 2LL];") != std::string::npos);
  CHECK(k.name != expr::cuda_elementwise_kernel(p).name);
  TempDir dir;
  backend::cuda::KernelCache cache(dir.path, 1 << 20);
  CHECK(backend::cuda::cuda_ptx(backend::cuda::cuda_program({k}), "strided.cu", "compute_90", cache)
            .find(".entry " + k.name) != std::string::npos);
  const std::vector<Strides> wrong{{}, {1}, {}};
  CHECK_THROWS_WITH_AS(expr::cuda_elementwise_kernel(p, {2, 3}, wrong), doctest::Contains("strides for 1 dims"),
                       ShapeError);
}

TEST_CASE("cuda: an eager expression becomes one CUDA kernel, from its type") {
  Tensor a = ones({4}), b = ones({4});
  const auto p = expr::fused_program(relu(a * b + 2));
  CHECK(p.inputs == 2);
  CHECK(p.code.size() == 3);
  REQUIRE(p.constants.size() == 1);
  CHECK(p.constants[0].real == 2.0);
  const backend::cuda::CudaKernel k = expr::cuda_elementwise_kernel(p);
  CHECK(k.definition.find("const T r3 = T(0x1p+1);") != std::string::npos);
  CHECK(k.definition.find("const T r5 = static_cast<T>(hybra::op::relu::apply<T>(r4));") != std::string::npos);
  CHECK(k.definition.find("out[i] = r5;") != std::string::npos);
  CHECK(k.definition.find("out[i3] = r5_3;") != std::string::npos);  // contiguous operands: four elements a turn
  // An eager expression's kernel takes its constants as parameters: one kernel for every value of them.
  const backend::cuda::CudaKernel taking = expr::cuda_elementwise_kernel(p, {}, {}, expr::KernelConstants::parameters);
  CHECK(taking.definition.find("long long n, float k0)") != std::string::npos);
  CHECK(taking.definition.find("const T r3 = k0;") != std::string::npos);
  CHECK(taking.definition.find("0x1p+1") == std::string::npos);
  CHECK(taking.name != k.name);
  TempDir dir;
  backend::cuda::KernelCache cache(dir.path, 1 << 20);
  CHECK(backend::cuda::cuda_ptx(backend::cuda::cuda_program({k}), "eager.cu", "compute_90", cache)
            .find(".entry " + k.name) != std::string::npos);
  CHECK(backend::cuda::cuda_ptx(backend::cuda::cuda_program({taking}), "taking.cu", "compute_90", cache)
            .find(".param .f32") != std::string::npos);

  Tensor i = ones({4}, DType::int32);
  CHECK_THROWS_WITH_AS(expr::fused_program(a + i), doctest::Contains("mixes float32 and int32"), DTypeError);
  CHECK_THROWS_WITH_AS(expr::fused_program(exp(i)), doctest::Contains("computes another dtype"), DTypeError);
  CHECK(expr::fused_program(i * 3 - i).dtype == DType::int32);
}

// In a process of its own (ctest's unit_cuda_relocated), with HYBRA_INCLUDE_DIR
// and HYBRA_KERNELS_DIR naming a copy of include/ and kernels/ that holds a
// marker file each, as a moved build or the GPU bundle has them.
TEST_SUITE("cuda relocated" * doctest::skip()) {
  TEST_CASE("cuda relocated: NVRTC compiles from the headers and kernels/ that HYBRA_INCLUDE_DIR and HYBRA_KERNELS_DIR name") {
    const char* include = std::getenv("HYBRA_INCLUDE_DIR");
    const char* kernels = std::getenv("HYBRA_KERNELS_DIR");
    REQUIRE_MESSAGE((include && kernels), "run with HYBRA_INCLUDE_DIR and HYBRA_KERNELS_DIR set");
    CHECK(backend::cuda::hybra_include_dir() == include);
    CHECK(fs::path(backend::cuda::kernels_parent_dir()) / "kernels" == fs::path(kernels).lexically_normal());
    // The markers are in the copies alone: the compile reads from there.
    TempDir dir;
    backend::cuda::KernelCache cache(dir.path, 1 << 20);
    const std::string source = "#include <hybra/relocated_marker.hpp>\n#include <kernels/relocated_marker.cuh>\n"
                               "#include <hybra/ops/elementwise.hpp>\n"
                               "extern \"C\" __global__ void k(float* x) { x[0] = hybra::op::exp::apply<float>(x[0]); }\n";
    CHECK(backend::cuda::cuda_ptx(source, "relocated.cu", "compute_90", cache).find(".entry k") != std::string::npos);
  }
}
