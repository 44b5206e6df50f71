// Graph compilation of a function defined in TypeScript (mx::compile over a bun:ffi JSCallback).
//
// MLX traces the function synchronously inside the first call (and again for each new
// input shape/dtype unless shapeless), on the calling thread: the trampoline below hands the
// tracer inputs to the JS callback as fresh handles and collects the outputs it pushes. MLX
// never keeps or calls the function afterwards except from a later compiled call, which is
// again on the calling thread. See docs/compile.md.
#include "ops_internal.h"

using namespace mlxb;

// inputs: handles the callee takes ownership of; out: an ArrayList the callee pushes outputs
// into (mlxb_list_push). Returns 0 on success, nonzero when the JS function threw.
typedef int (*mlxb_trace_fn)(const uint64_t* inputs, int n_inputs, void* out);

namespace {
using Fn = std::function<std::vector<mx::array>(const std::vector<mx::array>&)>;

struct TraceFailed : std::runtime_error {
  TraceFailed() : std::runtime_error("the traced function threw (see the JavaScript error)") {}
};

struct Compiled {
  mlxb_trace_fn cb;
  bool shapeless;
  Fn fn;
  int traces = 0;

  Fn make() {
    auto* self = this;
    // A capturing lambda: mx::compile gives it its own cache id and erases that cache
    // entry when the last copy of the compiled function goes away.
    Fn body = [self](const std::vector<mx::array>& ins) {
      self->traces++;
      std::vector<uint64_t> hs;
      hs.reserve(ins.size());
      for (auto& a : ins) hs.push_back(reinterpret_cast<uint64_t>(wrap(a)));
      ArrayList out;
      int rc = self->cb(hs.data(), static_cast<int>(hs.size()), &out);
      if (rc != 0) throw TraceFailed();
      return out;
    };
    return mx::compile(std::move(body), shapeless);
  }
};
}  // namespace

MLXB_API void* mlxb_compile_new(void* cb, int shapeless) {
  MLXB_GUARD(nullptr, {
    if (!cb) throw std::invalid_argument("null callback");
    auto* c = new Compiled{reinterpret_cast<mlxb_trace_fn>(cb), shapeless != 0, {}};
    c->fn = c->make();
    return c;
  })
}

// Call the compiled function; returns an array list (see ops_list.cpp).
MLXB_API void* mlxb_compile_call(void* h, const uint64_t* inputs, int n) {
  auto* c = static_cast<Compiled*>(h);
  try {
    if (!c) throw std::invalid_argument("null compiled function");
    // MLX creates a thread's default stream lazily, and the first lookup (inside the compile
    // cache's find) does not match later ones, which costs one spurious retrace. Look it up first.
    (void)mx::default_stream(mx::default_device());
    return wrap_list(c->fn(arrays_from(inputs, n)));
  } catch (const std::exception& e) {
    // A failed trace leaves MLX's cache entry for these input shapes marked as filled but
    // empty; start over with a fresh compiled function (its old cache entries are erased).
    if (c) c->fn = c->make();
    mlxb::set_error(__func__, e.what());
    return nullptr;
  }
}

// How many times the function has been traced (a test hook: cached calls do not trace).
MLXB_API int mlxb_compile_traces(void* h) {
  MLXB_GUARD(-1, {
    if (!h) throw std::invalid_argument("null compiled function");
    return static_cast<Compiled*>(h)->traces;
  })
}

MLXB_API void mlxb_compile_free(void* h) {
  delete static_cast<Compiled*>(h);
}

// 0 disabled, 1 no_simplify, 2 no_fuse, 3 enabled (mx::CompileMode order).
MLXB_API int mlxb_set_compile_mode(int mode) {
  MLXB_GUARD(-1, {
    if (mode < 0 || mode > 3) throw std::invalid_argument("compile mode must be 0..3");
    mx::set_compile_mode(static_cast<mx::CompileMode>(mode));
    return 0;
  })
}
