// A stand-in for the CUDA driver (libcuda.so.1), for testing on machines
// with no GPU what hybra does around the GPU: enumerating devices, memory
// and its caching, copies through pinned staging, loading PTX, launching,
// ordering work between streams and the host, and reporting errors. It has
// two "GPUs" whose memory is host memory (HYBRA_FAKE_CUDA_MEMORY bytes each,
// default 64 MiB). Each stream is a thread that runs what is queued on it in
// order, later than the call that queued it, as a GPU does: copies, memsets,
// the stand-in cuBLAS's products (hybra_fake_cuda_on_stream), event records
// and waits. A launch is recorded, not run, so what kernels compute is
// checked only on a real GPU (tests/gpu). Reading a result before waiting for
// it is a race that ThreadSanitizer reports, and freeing memory that queued
// work still uses a use-after-free that AddressSanitizer reports. Stream
// capture records a stream's work into a graph that cuGraphLaunch queues.
// The test hooks at the end let a test inject a device error and count calls.
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace {

using CUresult = int;
constexpr CUresult success = 0, invalid_value = 1, out_of_memory = 2, not_initialized = 3, invalid_device = 101,
                   invalid_context = 201, invalid_ptx = 218, not_found = 500, illegal_address = 700;
constexpr int gpus = 2;

struct Module {
  std::string ptx;
};
struct Function {
  std::string name;
  std::vector<std::size_t> params;  // their sizes in bytes, as the PTX declares them
};

struct State {
  std::mutex mutex;
  bool initialised = false;
  std::size_t capacity = 64u << 20;
  std::size_t used[gpus] = {};
  std::map<unsigned long long, std::pair<int, std::size_t>> blocks;  // pointer -> GPU, bytes
  std::map<std::string, long> calls;
  CUresult next_sync_error = success;
  CUresult more_than_capacity = out_of_memory;  // what a request larger than a GPU's memory gets
  std::deque<Module> modules;  // what the handles point at, kept for the process, as the driver keeps them
  std::deque<Function> functions;
  std::string last_launch;
  std::vector<std::vector<unsigned char>> last_launch_params;  // copied at the call, as the driver copies them
  std::map<void*, std::vector<std::function<void()>>> capturing;  // stream -> what it recorded so far
};

struct Graph {
  std::vector<std::function<void()>> work;
};

// Static TLS (initial-exec), not the dynamic kind a dlopen'd library gets by
// default: with the latter, LeakSanitizer's exit check (GCC 12) crashes
// reading the dynamic TLS of an application thread that used it.
#define HYBRA_FAKE_STATIC_TLS __attribute__((tls_model("initial-exec")))

thread_local int current HYBRA_FAKE_STATIC_TLS = -1;  // the GPU of the calling thread's context

State& state() {
  static State* s = [] {
    auto* s = new State;
    if (const char* v = std::getenv("HYBRA_FAKE_CUDA_MEMORY")) s->capacity = std::strtoull(v, nullptr, 10);
    return s;
  }();
  return *s;
}

void count(const char* call) {
  std::lock_guard g(state().mutex);
  ++state().calls[call];
}

// Contexts are the GPU's number plus one, cast to a pointer.
int gpu_of(void* context) { return static_cast<int>(reinterpret_cast<std::intptr_t>(context)) - 1; }

// A stream: a thread running its work in order. Streams live as long as
// the process, as hybra's do.
class Stream {
 public:
  Stream() : thread_([this] { run(); }) { thread_.detach(); }

  void queue(std::function<void()> work) {
    std::lock_guard g(mutex_);
    work_.push_back(std::move(work));
    changed_.notify_all();
  }

  // Blocks until everything queued so far has run.
  void drain() {
    std::unique_lock l(mutex_);
    changed_.wait(l, [&] { return work_.empty() && !busy_; });
  }

 private:
  void run() {
    std::unique_lock l(mutex_);
    for (;;) {
      changed_.wait(l, [&] { return !work_.empty(); });
      std::function<void()> work = std::move(work_.front());
      work_.pop_front();
      busy_ = true;
      l.unlock();
      work();
      l.lock();
      busy_ = false;
      changed_.notify_all();
    }
  }

  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<std::function<void()>> work_;
  bool busy_ = false;
  std::thread thread_;
};

// An event: the number of times it was recorded, and of the records its
// stream has reached.
struct Event {
  std::mutex mutex;
  std::condition_variable reached;
  std::uint64_t recorded = 0, completed = 0;

  void wait_for(std::uint64_t record) {
    std::unique_lock l(mutex);
    reached.wait(l, [&] { return completed >= record; });
  }
};

// The sizes of entry `name`'s parameters, from its declaration in the PTX:
// ".param .u64 x", ".param .f32 x", ".param .align 8 .b8 x[24]".
std::vector<std::size_t> param_sizes(const std::string& ptx, const std::string& name) {
  const auto start = ptx.find(".entry " + name + "(");
  const std::string declaration = ptx.substr(start, ptx.find(')', start) - start);
  std::vector<std::size_t> sizes;
  for (auto at = declaration.find(".param"); at != std::string::npos; at = declaration.find(".param", at + 1)) {
    const std::string param = declaration.substr(at, declaration.find_first_of(",\n", at) - at);
    if (const auto bracket = param.find('['); bracket != std::string::npos) {
      sizes.push_back(std::strtoull(param.c_str() + bracket + 1, nullptr, 10));
    } else {
      const auto type = param.find_first_of("usfb", param.find(" .") + 2);
      sizes.push_back(std::strtoull(param.c_str() + type + 1, nullptr, 10) / 8);
    }
  }
  return sizes;
}

// Queues work on the stream, or records it when the stream is being captured.
void on_stream(void* stream, std::function<void()> work) {
  {
    State& s = state();
    std::lock_guard g(s.mutex);
    if (auto it = s.capturing.find(stream); it != s.capturing.end()) {
      it->second.push_back(std::move(work));
      return;
    }
  }
  static_cast<Stream*>(stream)->queue(std::move(work));
}

// The injected error, if one is pending (hybra_fake_cuda_fail_next_sync), for a wait that `call` names.
CUresult sync_result(const char* call) {
  State& s = state();
  std::lock_guard g(s.mutex);
  ++s.calls[call];
  CUresult r = s.next_sync_error;
  s.next_sync_error = success;
  return r;
}

// The driver's calls on memory, streams, events, modules and graphs work in
// the calling thread's current context, and fail without one: so do these,
// so that a thread of hybra's that never bound its GPU is found here, not on
// a GPU. Each such refusal is counted as "no context: CALL".
CUresult needs_context(const char* call) {
  if (current >= 0) return success;
  std::lock_guard g(state().mutex);
  ++state().calls[std::string("no context: ") + call];
  std::fprintf(stderr, "fake CUDA driver: %s called by a thread with no current context\n", call);
  return invalid_context;
}

}  // namespace

// For the stand-in cuBLAS: its products go through the stream like copies.
void hybra_fake_cuda_on_stream(void* stream, std::function<void()> work) { on_stream(stream, std::move(work)); }

extern "C" {

CUresult cuInit(unsigned) {
  std::lock_guard g(state().mutex);
  state().initialised = true;
  return success;
}
CUresult cuDriverGetVersion(int* v) {
  *v = 13000;
  return success;
}
CUresult cuGetErrorName(CUresult r, const char** name) {
  switch (r) {
    case success: *name = "CUDA_SUCCESS"; return success;
    case invalid_value: *name = "CUDA_ERROR_INVALID_VALUE"; return success;
    case out_of_memory: *name = "CUDA_ERROR_OUT_OF_MEMORY"; return success;
    case not_initialized: *name = "CUDA_ERROR_NOT_INITIALIZED"; return success;
    case invalid_device: *name = "CUDA_ERROR_INVALID_DEVICE"; return success;
    case invalid_context: *name = "CUDA_ERROR_INVALID_CONTEXT"; return success;
    case invalid_ptx: *name = "CUDA_ERROR_INVALID_PTX"; return success;
    case not_found: *name = "CUDA_ERROR_NOT_FOUND"; return success;
    case illegal_address: *name = "CUDA_ERROR_ILLEGAL_ADDRESS"; return success;
  }
  *name = nullptr;
  return invalid_value;
}
CUresult cuGetErrorString(CUresult r, const char** text) {
  *text = r == illegal_address ? "an illegal memory access was encountered" : "fake driver error";
  return success;
}
CUresult cuDeviceGetCount(int* n) {
  std::lock_guard g(state().mutex);
  if (!state().initialised) return not_initialized;
  *n = gpus;
  return success;
}
CUresult cuDeviceGet(int* device, int ordinal) {
  if (ordinal < 0 || ordinal >= gpus) return invalid_device;
  *device = ordinal;
  return success;
}
CUresult cuDeviceGetName(char* name, int length, int device) {
  std::snprintf(name, static_cast<std::size_t>(length), "hybra fake GPU %d", device);
  return success;
}
CUresult cuDeviceGetAttribute(int* value, int attribute, int) {
  *value = attribute == 75 ? 9 : attribute == 76 ? 0 : attribute == 16 ? 4 : 0;
  return success;
}
CUresult cuDeviceTotalMem_v2(std::size_t* bytes, int) {
  *bytes = state().capacity;
  return success;
}
CUresult cuDeviceCanAccessPeer(int* can, int, int) {
  *can = 1;
  return success;
}
CUresult cuDevicePrimaryCtxRetain(void** context, int device) {
  *context = reinterpret_cast<void*>(static_cast<std::intptr_t>(device + 1));
  return success;
}
CUresult cuCtxSetCurrent(void* context) {
  std::lock_guard g(state().mutex);
  current = gpu_of(context);
  return success;
}
CUresult cuCtxEnablePeerAccess(void*, unsigned) { return needs_context("cuCtxEnablePeerAccess"); }

CUresult cuMemAlloc_v2(unsigned long long* p, std::size_t bytes) {
  if (const CUresult r = needs_context("cuMemAlloc"); r != success) return r;
  State& s = state();
  std::lock_guard g(s.mutex);
  ++s.calls["cuMemAlloc"];
  if (bytes > s.capacity) return s.more_than_capacity;
  if (bytes > s.capacity - s.used[current]) return out_of_memory;
  void* block = std::aligned_alloc(256, (bytes + 255) / 256 * 256);  // the driver's alignment, at least
  if (!block) return out_of_memory;
  *p = reinterpret_cast<unsigned long long>(block);
  s.used[current] += bytes;
  s.blocks[*p] = {current, bytes};
  return success;
}
CUresult cuMemFree_v2(unsigned long long p) {
  if (const CUresult r = needs_context("cuMemFree"); r != success) return r;
  State& s = state();
  std::lock_guard g(s.mutex);
  ++s.calls["cuMemFree"];
  auto it = s.blocks.find(p);
  if (it == s.blocks.end()) return invalid_value;
  s.used[it->second.first] -= it->second.second;
  s.blocks.erase(it);
  std::free(reinterpret_cast<void*>(p));
  return success;
}
CUresult cuMemGetInfo_v2(std::size_t* free, std::size_t* total) {
  if (const CUresult r = needs_context("cuMemGetInfo"); r != success) return r;
  State& s = state();
  std::lock_guard g(s.mutex);
  *total = s.capacity;
  *free = s.capacity - s.used[current];
  return success;
}
CUresult cuMemHostAlloc(void** p, std::size_t bytes, unsigned) {
  if (const CUresult r = needs_context("cuMemHostAlloc"); r != success) return r;
  count("cuMemHostAlloc");
  *p = std::malloc(bytes);
  return *p ? success : out_of_memory;
}
CUresult cuMemFreeHost(void* p) {
  if (const CUresult r = needs_context("cuMemFreeHost"); r != success) return r;
  std::free(p);
  return success;
}
CUresult cuMemcpyHtoDAsync_v2(unsigned long long dst, const void* src, std::size_t bytes, void* stream) {
  if (const CUresult r = needs_context("cuMemcpyHtoDAsync"); r != success) return r;
  count("cuMemcpyHtoDAsync");
  on_stream(stream, [=] { std::memcpy(reinterpret_cast<void*>(dst), src, bytes); });
  return success;
}
CUresult cuMemcpyDtoHAsync_v2(void* dst, unsigned long long src, std::size_t bytes, void* stream) {
  if (const CUresult r = needs_context("cuMemcpyDtoHAsync"); r != success) return r;
  count("cuMemcpyDtoHAsync");
  on_stream(stream, [=] { std::memcpy(dst, reinterpret_cast<const void*>(src), bytes); });
  return success;
}
CUresult cuMemcpyDtoDAsync_v2(unsigned long long dst, unsigned long long src, std::size_t bytes, void* stream) {
  if (const CUresult r = needs_context("cuMemcpyDtoDAsync"); r != success) return r;
  count("cuMemcpyDtoDAsync");
  on_stream(stream, [=] { std::memmove(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), bytes); });
  return success;
}
CUresult cuMemcpyPeerAsync(unsigned long long dst, void*, unsigned long long src, void*, std::size_t bytes,
                           void* stream) {
  if (const CUresult r = needs_context("cuMemcpyPeerAsync"); r != success) return r;
  count("cuMemcpyPeerAsync");
  on_stream(stream, [=] { std::memmove(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), bytes); });
  return success;
}
CUresult cuMemsetD8Async(unsigned long long dst, unsigned char value, std::size_t elements, void* stream) {
  if (const CUresult r = needs_context("cuMemsetD8Async"); r != success) return r;
  count("cuMemsetD8Async");
  on_stream(stream, [=] { std::memset(reinterpret_cast<void*>(dst), value, elements); });
  return success;
}
CUresult cuMemsetD16Async(unsigned long long dst, unsigned short value, std::size_t elements, void* stream) {
  if (const CUresult r = needs_context("cuMemsetD16Async"); r != success) return r;
  count("cuMemsetD16Async");
  on_stream(stream, [=] {
    auto* p = reinterpret_cast<unsigned short*>(dst);
    for (std::size_t i = 0; i < elements; ++i) p[i] = value;
  });
  return success;
}
CUresult cuMemsetD32Async(unsigned long long dst, unsigned value, std::size_t elements, void* stream) {
  if (const CUresult r = needs_context("cuMemsetD32Async"); r != success) return r;
  count("cuMemsetD32Async");
  on_stream(stream, [=] {
    auto* p = reinterpret_cast<unsigned*>(dst);
    for (std::size_t i = 0; i < elements; ++i) p[i] = value;
  });
  return success;
}
CUresult cuStreamCreate(void** stream, unsigned) {
  if (const CUresult r = needs_context("cuStreamCreate"); r != success) return r;
  *stream = new Stream;
  return success;
}
CUresult cuStreamSynchronize(void* stream) {
  if (const CUresult r = needs_context("cuStreamSynchronize"); r != success) return r;
  static_cast<Stream*>(stream)->drain();
  return sync_result("cuStreamSynchronize");
}
CUresult cuEventCreate(void** event, unsigned) {
  if (const CUresult r = needs_context("cuEventCreate"); r != success) return r;
  *event = new Event;
  return success;
}
CUresult cuEventRecord(void* event, void* stream) {
  if (const CUresult r = needs_context("cuEventRecord"); r != success) return r;
  auto* e = static_cast<Event*>(event);
  std::uint64_t record;
  {
    std::lock_guard g(e->mutex);
    record = ++e->recorded;
  }
  on_stream(stream, [e, record] {
    std::lock_guard g(e->mutex);
    e->completed = std::max(e->completed, record);
    e->reached.notify_all();
  });
  return success;
}
CUresult cuEventSynchronize(void* event) {
  if (const CUresult r = needs_context("cuEventSynchronize"); r != success) return r;
  auto* e = static_cast<Event*>(event);
  std::uint64_t record;
  {
    std::lock_guard g(e->mutex);
    record = e->recorded;
  }
  e->wait_for(record);
  return sync_result("cuEventSynchronize");
}
CUresult cuStreamWaitEvent(void* stream, void* event, unsigned) {
  if (const CUresult r = needs_context("cuStreamWaitEvent"); r != success) return r;
  count("cuStreamWaitEvent");
  auto* e = static_cast<Event*>(event);
  std::uint64_t record;
  {
    std::lock_guard g(e->mutex);
    record = e->recorded;
  }
  on_stream(stream, [e, record] { e->wait_for(record); });
  return success;
}

CUresult cuModuleLoadData(void** module, const void* image) {
  if (const CUresult r = needs_context("cuModuleLoadData"); r != success) return r;
  count("cuModuleLoadData");
  std::string ptx(static_cast<const char*>(image));
  if (ptx.find(".entry") == std::string::npos) return invalid_ptx;
  std::lock_guard g(state().mutex);
  *module = &state().modules.emplace_back(Module{std::move(ptx)});
  return success;
}
CUresult cuModuleGetFunction(void** function, void* module, const char* name) {
  if (const CUresult r = needs_context("cuModuleGetFunction"); r != success) return r;
  const std::string& ptx = static_cast<Module*>(module)->ptx;
  if (ptx.find(std::string(".entry ") + name + "(") == std::string::npos) return not_found;
  std::lock_guard g(state().mutex);
  *function = &state().functions.emplace_back(Function{name, param_sizes(ptx, name)});
  return success;
}
CUresult cuLaunchKernel(void* function, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                        void* stream, void** kernel_params, void**) {
  if (const CUresult r = needs_context("cuLaunchKernel"); r != success) return r;
  count("cuLaunchKernel");
  const Function& f = *static_cast<Function*>(function);
  const std::string name = f.name;
  {
    std::vector<std::vector<unsigned char>> params;
    for (std::size_t i = 0; i < f.params.size(); ++i) {
      const auto* bytes = static_cast<const unsigned char*>(kernel_params[i]);
      params.emplace_back(bytes, bytes + f.params[i]);
    }
    std::lock_guard g(state().mutex);
    state().last_launch_params = std::move(params);
  }
  on_stream(stream, [name] {
    State& s = state();
    std::lock_guard g(s.mutex);
    ++s.calls["kernels run"];
    s.last_launch = name;
  });
  return success;
}

CUresult cuStreamBeginCapture_v2(void* stream, int) {
  if (const CUresult r = needs_context("cuStreamBeginCapture"); r != success) return r;
  State& s = state();
  std::lock_guard g(s.mutex);
  ++s.calls["cuStreamBeginCapture"];
  if (!s.capturing.emplace(stream, std::vector<std::function<void()>>{}).second) return invalid_value;
  return success;
}
CUresult cuStreamEndCapture(void* stream, void** graph) {
  if (const CUresult r = needs_context("cuStreamEndCapture"); r != success) return r;
  State& s = state();
  std::lock_guard g(s.mutex);
  auto it = s.capturing.find(stream);
  if (it == s.capturing.end()) return invalid_value;
  *graph = new Graph{std::move(it->second)};
  s.capturing.erase(it);
  return success;
}
CUresult cuGraphInstantiateWithFlags(void** exec, void* graph, unsigned long long) {
  if (const CUresult r = needs_context("cuGraphInstantiateWithFlags"); r != success) return r;
  *exec = new Graph(*static_cast<Graph*>(graph));
  return success;
}
CUresult cuGraphLaunch(void* exec, void* stream) {
  if (const CUresult r = needs_context("cuGraphLaunch"); r != success) return r;
  count("cuGraphLaunch");
  for (const auto& work : static_cast<Graph*>(exec)->work) on_stream(stream, work);
  return success;
}
CUresult cuGraphExecDestroy(void* exec) {
  if (const CUresult r = needs_context("cuGraphExecDestroy"); r != success) return r;
  delete static_cast<Graph*>(exec);
  return success;
}
CUresult cuGraphDestroy(void* graph) {
  if (const CUresult r = needs_context("cuGraphDestroy"); r != success) return r;
  delete static_cast<Graph*>(graph);
  return success;
}

// Test hooks.
// The next wait for a stream or an event reports r, as a device-side error would.
void hybra_fake_cuda_fail_next_sync(CUresult r) {
  std::lock_guard g(state().mutex);
  state().next_sync_error = r;
}
// What a request for more memory than a GPU has gets from now on: the driver's
// out of memory, or (as some drivers answer) an invalid value.
void hybra_fake_cuda_refuse_more_than_capacity_with(CUresult r) {
  std::lock_guard g(state().mutex);
  state().more_than_capacity = r;
}
// For the stand-in cuBLAS: whether the stream's work is being captured into a graph.
bool hybra_fake_cuda_capturing(void* stream) {
  std::lock_guard g(state().mutex);
  return state().capturing.count(stream) != 0;
}
// For the stand-in NCCL, which sums on the host: waits for what the stream has queued.
void hybra_fake_cuda_drain(void* stream) { static_cast<Stream*>(stream)->drain(); }
long hybra_fake_cuda_calls(const char* call) {
  std::lock_guard g(state().mutex);
  return state().calls[call];
}
// Parameter i of the latest launch: its size, its bytes copied to `out` (up to `capacity`); -1 if it has none.
long hybra_fake_cuda_last_launch_param(int i, void* out, long capacity) {
  std::lock_guard g(state().mutex);
  const auto& params = state().last_launch_params;
  if (i < 0 || static_cast<std::size_t>(i) >= params.size()) return -1;
  const auto& p = params[static_cast<std::size_t>(i)];
  std::memcpy(out, p.data(), std::min<std::size_t>(p.size(), static_cast<std::size_t>(capacity)));
  return static_cast<long>(p.size());
}
const char* hybra_fake_cuda_last_launch() {
  std::lock_guard g(state().mutex);
  static thread_local std::string copy HYBRA_FAKE_STATIC_TLS;
  copy = state().last_launch;
  return copy.c_str();
}
}
