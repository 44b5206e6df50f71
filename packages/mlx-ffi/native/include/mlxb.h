/* mlxb: the C ABI of mlx-bun over MLX C++. Rules: docs/native-abi.md.
 *
 * - An array is an opaque handle (pointer to a heap mlx::core::array). A call
 *   that makes an array returns the handle; NULL means failure.
 * - Other calls return int status: 0 ok, -1 failure (or a value >= 0 for
 *   queries). On failure mlxb_last_error() holds a thread-local message.
 * - Shapes/axes are (int32 pointer, count). Lists of handles are
 *   (uint64 pointer, count). Streams are handles too; NULL = default stream.
 * - No C++ exception crosses this boundary.
 */
#pragma once
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
#define MLXB_API extern "C" __attribute__((visibility("default")))
#else
#define MLXB_API __attribute__((visibility("default")))
#endif

typedef void* mlxb_array;
typedef void* mlxb_stream;

/* Bumped when a signature changes; the TS side refuses a library it does not know. */
#define MLXB_ABI_VERSION 2

/* errors and versions */
MLXB_API const char* mlxb_last_error(void);
MLXB_API void mlxb_clear_error(void);
MLXB_API const char* mlxb_mlx_version(void);
MLXB_API int mlxb_abi_version(void);

/* arrays */
MLXB_API mlxb_array mlxb_array_from_bytes(const void* data, size_t nbytes, const int32_t* shape, int ndim, int dtype);
MLXB_API mlxb_array mlxb_array_scalar(double value, int dtype);
MLXB_API mlxb_array mlxb_array_scalar_int(int64_t value, int dtype);
MLXB_API mlxb_array mlxb_array_retain(mlxb_array a);
MLXB_API void mlxb_array_free(mlxb_array a);
MLXB_API int mlxb_array_ndim(mlxb_array a);
MLXB_API int mlxb_array_dim(mlxb_array a, int axis);
MLXB_API int mlxb_array_dtype(mlxb_array a);
MLXB_API int64_t mlxb_array_size(mlxb_array a);
MLXB_API int64_t mlxb_array_nbytes(mlxb_array a);
MLXB_API int mlxb_array_itemsize(mlxb_array a);
/* Read-back: host_view returns an evaluated row-major handle; data_ptr its bytes. */
MLXB_API mlxb_array mlxb_array_host_view(mlxb_array a);
MLXB_API void* mlxb_array_data_ptr(mlxb_array a);
MLXB_API double mlxb_array_item_f64(mlxb_array a);
MLXB_API int mlxb_array_is_available(mlxb_array a);
MLXB_API int mlxb_array_wait(mlxb_array a);
MLXB_API int mlxb_live_handles(void);

/* evaluation */
MLXB_API int mlxb_eval(const uint64_t* arrays, int n);
MLXB_API int mlxb_async_eval(const uint64_t* arrays, int n);
MLXB_API int mlxb_export_to_dot(const char* path, const uint64_t* arrays, int n);
/* background evaluation (background.cpp): async_eval on a native worker thread. Needs the
   shared streams (mlxb_use_shared_streams makes them the calling thread's defaults). Every call
   that evaluates, waits or reads data joins the worker first. */
MLXB_API int mlxb_use_shared_streams(void);
MLXB_API int64_t mlxb_async_eval_background(const uint64_t* arrays, int n, const uint64_t* reads, int n_reads);
MLXB_API int mlxb_join_background(void);
MLXB_API int mlxb_background_values(int64_t id, double* out, int n);

/* devices and streams: device type 0 = cpu, 1 = gpu */
MLXB_API int mlxb_device_is_available(int type);
MLXB_API int mlxb_default_device_type(void);
MLXB_API int mlxb_set_default_device(int type, int index);
MLXB_API mlxb_stream mlxb_default_stream(int type);
MLXB_API mlxb_stream mlxb_new_stream(int type);
MLXB_API void mlxb_stream_free(mlxb_stream s);
MLXB_API int mlxb_set_default_stream(mlxb_stream s);
MLXB_API int mlxb_stream_index(mlxb_stream s);
MLXB_API int mlxb_stream_device_type(mlxb_stream s);
MLXB_API int mlxb_synchronize(mlxb_stream s);
/* mlx-bun's defaults for MLX environment settings the user did not set (CUDA graph size) */
MLXB_API int mlxb_apply_env_defaults(void);

/* memory (bytes) */
MLXB_API int64_t mlxb_active_memory(void);
MLXB_API int64_t mlxb_peak_memory(void);
MLXB_API int64_t mlxb_cache_memory(void);
MLXB_API int64_t mlxb_memory_limit(void);
MLXB_API int mlxb_reset_peak_memory(void);
MLXB_API int64_t mlxb_set_memory_limit(int64_t bytes);
MLXB_API int64_t mlxb_set_cache_limit(int64_t bytes);
MLXB_API int mlxb_clear_cache(void);

/* safetensors: a load result is a handle listing (name, array) pairs and metadata */
typedef void* mlxb_st;
MLXB_API mlxb_st mlxb_st_load(const char* path, mlxb_stream s);
MLXB_API int mlxb_st_count(mlxb_st h);
MLXB_API const char* mlxb_st_name(mlxb_st h, int i);
MLXB_API mlxb_array mlxb_st_array(mlxb_st h, int i);
MLXB_API int mlxb_st_meta_count(mlxb_st h);
MLXB_API const char* mlxb_st_meta_key(mlxb_st h, int i);
MLXB_API const char* mlxb_st_meta_value(mlxb_st h, int i);
MLXB_API void mlxb_st_free(mlxb_st h);
/* a writer collects arrays and metadata, then saves them to one file */
MLXB_API mlxb_st mlxb_st_writer_new(void);
MLXB_API int mlxb_st_writer_add(mlxb_st w, const char* name, mlxb_array a);
MLXB_API int mlxb_st_writer_meta(mlxb_st w, const char* key, const char* value);
MLXB_API int mlxb_st_writer_save(mlxb_st w, const char* path);
MLXB_API void mlxb_st_writer_free(mlxb_st w);
