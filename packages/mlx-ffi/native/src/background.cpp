// Background evaluation: async_eval of a decode step on a native worker thread, so that the
// JavaScript thread builds step t+2's graph while MLX encodes step t+1 (on a GPU, encoding the
// kernels is most of a small model's step). See docs/background-eval.md.
//
// Safety rests on two rules. (1) One evaluator at a time: every entry point that evaluates,
// waits or reads data calls join_background() first, so MLX never sees two threads evaluating.
// (2) The arrays must live on streams made by mx::new_thread_unsafe_stream (MLX 0.32 keeps the
// command encoders of ordinary streams per thread); mlxb_use_shared_streams() makes those the
// calling thread's defaults. While the worker encodes, the caller only builds graphs (creating
// arrays from the step's outputs reads their shapes and dtypes, which evaluation never changes)
// and frees handles (atomic reference counts).
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <mutex>
#include <algorithm>
#include <optional>
#include <thread>

#include "internal.h"

using namespace mlxb;

namespace {
struct Worker {
  std::mutex m;
  std::condition_variable cv;
  std::vector<mx::array> job;
  std::vector<mx::array> reads;  // read after scheduling the job (the previous step's tokens)
  bool has_job = false;
  // What each job's `read` held, by job id (a ring: a decode loop asks for the value of its own
  // job, which a later job of another caller may have followed).
  static constexpr int64_t kValues = 64;
  std::vector<double> values[kValues];
  int64_t current = 0;  // id of the last job handed over
  std::atomic<bool> busy{false};
  std::string error;  // of the last job; reported by the next join
  std::optional<mx::Stream> gpu, cpu;

  Worker() {
    // Never joined: the process may exit with the worker parked on its condition variable.
    std::thread([this] { loop(); }).detach();
  }
  void loop() {
    bool pinned = false;
    for (;;) {
      std::vector<mx::array> arrays;
      std::vector<mx::array> r;
      int64_t id = 0;
      {
        std::unique_lock lk(m);
        cv.wait(lk, [this] { return has_job; });
        arrays = std::move(job);
        job.clear();
        r = std::move(reads);
        reads.clear();
        id = current;
        has_job = false;
      }
      auto& vals = values[id % kValues];
      vals.assign(r.size(), std::nan(""));
      try {
        if (!pinned) {
          // eval_impl looks up this thread's default stream; make it the shared one.
          if (gpu) mx::set_default_stream(*gpu);
          if (cpu) mx::set_default_stream(*cpu);
          pinned = true;
        }
        mx::async_eval(std::move(arrays));
        // Reading here, not on the caller's thread: the array is an input of the graph just
        // scheduled, and reading it changes its status and event, which eval_impl reads.
        for (size_t i = 0; i < r.size(); i++) vals[i] = item_as_double(r[i]);
      } catch (const std::exception& e) {
        error = e.what();
      } catch (...) {
        error = "unknown C++ exception";
      }
      arrays.clear();
      r.clear();
      busy.store(false, std::memory_order_release);
      busy.notify_all();
    }
  }
};
Worker* worker = nullptr;  // made by mlxb_use_shared_streams, never destroyed
}  // namespace

namespace mlxb {
void join_background() {
  if (!worker) return;
  if (worker->busy.load(std::memory_order_acquire)) worker->busy.wait(true, std::memory_order_acquire);
  if (!worker->error.empty()) {
    std::string e = std::move(worker->error);
    worker->error.clear();
    throw std::runtime_error("an earlier background async_eval failed: " + e);
  }
}
}  // namespace mlxb

// Make streams usable from any thread (one per device of this build) the calling thread's
// defaults, and start the worker. Idempotent. Returns 0, or -1 with the error set.
MLXB_API int mlxb_use_shared_streams(void) {
  MLXB_GUARD(-1, {
    static std::once_flag once;
    std::call_once(once, [] {
      auto* w = new Worker();
      w->cpu = mx::new_thread_unsafe_stream(mx::Device::cpu);
      if (mx::is_available(mx::Device::gpu)) w->gpu = mx::new_thread_unsafe_stream(mx::Device::gpu);
      worker = w;
    });
    join_background();
    mx::set_default_stream(*worker->cpu);
    if (worker->gpu) mx::set_default_stream(*worker->gpu);
    return 0;
  })
}

// async_eval on the worker; returns once the job is handed over (after joining the previous one).
// `reads` (n_reads of them, size 1 each): arrays whose values the worker reads after scheduling
// the job; mlxb_background_values returns them. Returns the job's id (> 0), or -1 with the error set.
MLXB_API int64_t mlxb_async_eval_background(const uint64_t* arrays, int n, const uint64_t* reads, int n_reads) {
  MLXB_GUARD(-1, {
    if (!worker) throw std::logic_error("background eval needs mlxb_use_shared_streams() first");
    if (n < 0 || n_reads < 0) throw std::invalid_argument("negative array count");
    join_background();
    std::vector<mx::array> v, r;
    v.reserve(n);
    for (int i = 0; i < n; i++) v.push_back(arr(reinterpret_cast<mlxb_array>(arrays[i])));
    r.reserve(n_reads);
    for (int i = 0; i < n_reads; i++) {
      auto& x = arr(reinterpret_cast<mlxb_array>(reads[i]));
      if (x.size() != 1) throw std::invalid_argument("background read " + std::to_string(i) + " has size " + std::to_string(x.size()) + ", not 1");
      r.push_back(x);
    }
    int64_t id;
    {
      std::lock_guard lk(worker->m);
      worker->job = std::move(v);
      worker->reads = std::move(r);
      id = ++worker->current;
      worker->has_job = true;
      worker->busy.store(true, std::memory_order_release);
    }
    worker->cv.notify_one();
    return id;
  })
}

// Wait until the worker has handed its job to MLX (not until the GPU is done).
MLXB_API int mlxb_join_background(void) {
  MLXB_GUARD(-1, {
    join_background();
    return 0;
  })
}

// The values job `id` read (joining first) into out[0..n); n must be the job's n_reads.
MLXB_API int mlxb_background_values(int64_t id, double* out, int n) {
  MLXB_GUARD(-1, {
    if (!worker || id <= 0 || id > worker->current) throw std::invalid_argument("no background job " + std::to_string(id));
    if (worker->current - id >= Worker::kValues) throw std::invalid_argument("background job " + std::to_string(id) + " is too old to read");
    join_background();
    auto& vals = worker->values[id % Worker::kValues];
    if (static_cast<size_t>(n) != vals.size()) throw std::invalid_argument("background job " + std::to_string(id) + " read " + std::to_string(vals.size()) + " values, not " + std::to_string(n));
    std::copy(vals.begin(), vals.end(), out);
    return 0;
  })
}
