/* asynctp C ABI: a stable, versioned C interface to the fused tensor-parallel operators, for
 * every language that is not C++ and for the Python package (which binds it with ctypes, so one
 * wheel serves every Python and PyTorch version).
 *
 * Conventions
 * - Every function returns an asynctp_status. On anything but ASYNCTP_OK, asynctp_last_error()
 *   returns this thread's message for that failure (valid until the thread's next call).
 * - Handles are opaque. A handle is used by one host thread at a time (like a CUDA stream).
 * - Tensors are plain descriptors (asynctp_tensor): data pointer, dtype tag, device, shape and
 *   strides in elements. float8 tensors travel as their bytes plus the dtype tag, so no DLPack
 *   float8 code is needed.
 * - Streams are void*: a cudaStream_t on CUDA, taken as CUDA takes it (NULL is the legacy
 *   default stream, as torch's default stream is), ignored on the CPU backend;
 *   ASYNCTP_CONTEXT_STREAM stands for the context's stream (asynctp_context_set_stream, else one
 *   of its own). An op runs on the stream it is given; its side streams fork from that stream
 *   and join back into it by events, so the caller sees one stream (and a CUDA graph captured on
 *   it holds the whole op).
 * - Outputs are allocated by the caller.
 *
 * Versioning: ASYNCTP_C_API_VERSION grows by one whenever a function or a struct changes.
 * Structs that may grow carry their own size in their first field (struct_size); callers set it
 * to sizeof the struct they were compiled against. asynctp_api_version() says which version the
 * loaded library implements.
 */
#ifndef ASYNCTP_ASYNCTP_C_H_
#define ASYNCTP_ASYNCTP_C_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define ASYNCTP_C_EXPORT __attribute__((visibility("default")))
#else
#define ASYNCTP_C_EXPORT
#endif

#define ASYNCTP_C_API_VERSION 6
#define ASYNCTP_MAX_DIMS 8
#define ASYNCTP_CONTEXT_STREAM ((void*)(intptr_t)-1)

typedef enum asynctp_status {
  ASYNCTP_OK = 0,
  ASYNCTP_ERROR_INVALID_ARGUMENT = 1, /* a bad shape, dtype, device, handle or option */
  ASYNCTP_ERROR_TIMEOUT = 2,          /* a bounded wait gave up (names rank, peer, channel) */
  ASYNCTP_ERROR_UNSUPPORTED = 3,      /* valid, but this build, backend or path asked for cannot */
  ASYNCTP_ERROR_CAPTURE = 4,          /* not allowed during CUDA-graph capture (e.g. growth) */
  ASYNCTP_ERROR_PEER = 5,             /* a peer failed or went away */
  ASYNCTP_ERROR_INTERNAL = 6          /* anything else (a CUDA, NCCL or system error, ...) */
} asynctp_status;

typedef enum asynctp_dtype {
  ASYNCTP_F32 = 0,
  ASYNCTP_BF16 = 1,
  ASYNCTP_F16 = 2,
  ASYNCTP_F8E4M3 = 3, /* float8_e4m3fn */
  ASYNCTP_F8E5M2 = 4
} asynctp_dtype;

typedef enum asynctp_device_type {
  ASYNCTP_DEVICE_CPU = 0,
  ASYNCTP_DEVICE_CUDA = 1
} asynctp_device_type;

/* Which path an op takes: AUTO measures once per problem and keeps the fastest. SPLIT is the
 * pipeline of per-chunk GEMMs beside the copy engine; NATIVE one async-input GEMM kernel;
 * FALLBACK the collective, then one GEMM (or the reverse). DEFAULT: the context's choice. A
 * SPLIT or NATIVE that cannot run the call (off its contract, or over the workspace limit) is
 * ASYNCTP_ERROR_UNSUPPORTED, the last error saying why; nothing is enqueued. */
typedef enum asynctp_path {
  ASYNCTP_PATH_DEFAULT = -1,
  ASYNCTP_PATH_AUTO = 0,
  ASYNCTP_PATH_SPLIT = 1,
  ASYNCTP_PATH_FALLBACK = 2,
  ASYNCTP_PATH_NATIVE = 3
} asynctp_path;

typedef enum asynctp_reduce_op { ASYNCTP_REDUCE_SUM = 0, ASYNCTP_REDUCE_AVG = 1 } asynctp_reduce_op;

/* A strided view; data == NULL and ndim == -1 stands for "no tensor" where one is optional. */
typedef struct asynctp_tensor {
  void* data;
  int32_t dtype;       /* asynctp_dtype */
  int32_t device_type; /* asynctp_device_type */
  int32_t device_index;
  int32_t ndim; /* 0 .. ASYNCTP_MAX_DIMS, or -1: no tensor */
  int64_t shape[ASYNCTP_MAX_DIMS];
  int64_t strides[ASYNCTP_MAX_DIMS]; /* in elements */
} asynctp_tensor;

typedef struct asynctp_group_s* asynctp_group;
typedef struct asynctp_context_s* asynctp_context;

/* ---- library ---------------------------------------------------------------------------- */

ASYNCTP_C_EXPORT int32_t asynctp_api_version(void);
/* "0.1.0" */
ASYNCTP_C_EXPORT const char* asynctp_version(void);
/* This thread's message for its last failed call ("" if none). */
ASYNCTP_C_EXPORT const char* asynctp_last_error(void);
/* Whether this build has the CUDA backend and a GPU is visible. */
ASYNCTP_C_EXPORT int32_t asynctp_cuda_available(void);

/* ---- groups ----------------------------------------------------------------------------- */

/* A key-value store of the host framework (torch.distributed's store, say) through which the
 * ranks of a group find each other. Every callback returns 0 on success and non-zero on failure
 * (a timeout: 2, as ASYNCTP_ERROR_TIMEOUT); `user` is passed back unchanged.
 *   set:   stores value (len bytes) under key.
 *   get:   waits (at most timeout_ms) until key is set, then points *value / *len at its bytes,
 *          which stay valid until the next callback on this store.
 *   add:   adds delta to the integer under key (missing: 0) and returns the sum in *result.
 *   check: *is_set = whether key is set, without waiting.
 *   erase: removes key (no error when it is missing). */
typedef struct asynctp_store_callbacks {
  int32_t struct_size;
  void* user;
  int (*set)(void* user, const char* key, const void* value, size_t len);
  int (*get)(void* user, const char* key, int64_t timeout_ms, const void** value, size_t* len);
  int (*add)(void* user, const char* key, int64_t delta, int64_t* result);
  int (*check)(void* user, const char* key, int32_t* is_set);
  int (*erase)(void* user, const char* key);
} asynctp_store_callbacks;

/* The job's group from the variables torchrun and `asynctp launch` set (RANK, WORLD_SIZE,
 * LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT) and ASYNCTP_STORE_SECRET (set by
 * `asynctp launch`; with several ranks started otherwise, the caller gives every rank the same
 * one); rank 0 serves asynctp's own store on MASTER_ADDR, to the ranks that know the secret.
 * timeout_ms bounds every wait of the group (<= 0: ASYNCTP_TIMEOUT or its default). */
ASYNCTP_C_EXPORT asynctp_status asynctp_group_from_env(int64_t timeout_ms, asynctp_group* out);

/* A group whose rendezvous goes through the caller's store (copied; the callbacks must stay
 * valid until the group is destroyed). rank / world_size: this rank's place in the group;
 * local_rank: which GPU of this node the rank drives (a context may override it). Collective
 * over the group's ranks. */
ASYNCTP_C_EXPORT asynctp_status asynctp_group_from_store(const asynctp_store_callbacks* store,
                                                         int32_t rank, int32_t world_size,
                                                         int32_t local_rank, int64_t timeout_ms,
                                                         asynctp_group* out);

/* The subgroup of `parent` made of the parent ranks ranks[0..n) (in that order: ranks[i]
 * becomes rank i). Collective over those ranks only; a rank that is not in `ranks` may not call
 * it. Several subgroups (the TP groups of a 2-D mesh) may live side by side. */
ASYNCTP_C_EXPORT asynctp_status asynctp_group_split(asynctp_group parent, const int32_t* ranks,
                                                    int32_t n, asynctp_group* out);

ASYNCTP_C_EXPORT asynctp_status asynctp_group_rank(asynctp_group group, int32_t* rank);
ASYNCTP_C_EXPORT asynctp_status asynctp_group_world_size(asynctp_group group, int32_t* world_size);
/* Releases the handle. Contexts made from it keep what they need alive. */
ASYNCTP_C_EXPORT asynctp_status asynctp_group_destroy(asynctp_group group);

/* ---- contexts --------------------------------------------------------------------------- */

typedef struct asynctp_context_options {
  int32_t struct_size;
  const char* backend;         /* "cpu", "cuda", or NULL / "auto": CUDA when a GPU is visible */
  int32_t device_index;        /* GPU to run on; -1: the group's local rank */
  int64_t max_workspace_bytes; /* per symmetric workspace; -1: ASYNCTP_MAX_WORKSPACE_MB */
  int32_t path;                /* asynctp_path; ASYNCTP_PATH_DEFAULT: ASYNCTP_PATH or auto */
  const char* dispatch_cache;  /* NULL: default location; "off": keep choices in memory */
} asynctp_context_options;

/* Fills `options` with the defaults (struct_size set). */
ASYNCTP_C_EXPORT void asynctp_context_options_init(asynctp_context_options* options);

/* Collective over the group. */
ASYNCTP_C_EXPORT asynctp_status asynctp_context_create(asynctp_group group,
                                                       const asynctp_context_options* options,
                                                       asynctp_context* out);
/* Waits for the context's work, then releases its memory (symmetric workspaces included). */
ASYNCTP_C_EXPORT asynctp_status asynctp_context_destroy(asynctp_context ctx);

/* The stream later ops run on when their own `stream` argument is ASYNCTP_CONTEXT_STREAM. */
ASYNCTP_C_EXPORT asynctp_status asynctp_context_set_stream(asynctp_context ctx, void* stream);

/* Sizes the symmetric workspaces, flags and scratch for ops of these shapes before CUDA-graph
 * capture (collective over the group). Each description is the op's arguments as they will be
 * passed; outputs may have data == NULL. A workspace that would have to grow during capture is
 * an ASYNCTP_ERROR_CAPTURE, never a reallocation. */
ASYNCTP_C_EXPORT asynctp_status asynctp_reserve_all_gather_matmul(
    asynctp_context ctx, const asynctp_tensor* a_shard, const asynctp_tensor* bs, int32_t num_bs,
    int32_t gather_dim, int32_t return_a, void* stream);
ASYNCTP_C_EXPORT asynctp_status asynctp_reserve_all_gather_matmul_swiglu(
    asynctp_context ctx, const asynctp_tensor* a_shard, const asynctp_tensor* b_gate_up,
    int32_t gather_dim, int32_t return_a, void* stream);
ASYNCTP_C_EXPORT asynctp_status asynctp_reserve_matmul_reduce_scatter(
    asynctp_context ctx, const asynctp_tensor* as, const asynctp_tensor* bs, int32_t num_products,
    int32_t scatter_dim, void* stream);

/* Blocks until every op enqueued by this context has finished; raises a device-side timeout. */
ASYNCTP_C_EXPORT asynctp_status asynctp_synchronize(asynctp_context ctx);

/* ---- fused operators ---------------------------------------------------------------------
 * Shapes (ws = world size, g = gather/scatter dim):
 *   all_gather_matmul:     A_shard [.., s@g, .., K] -AG(g)-> A [.., ws*s@g, .., K];
 *                          outs[i] = A @ Bs[i] ([K, N_i]); a_out (optional) = A.
 *   matmul_reduce_scatter: out = RS(g)(sum_i As[i] @ Bs[i]); out is the product's shape with
 *                          dim g divided by ws.
 *   scaled forms: float8 A and B with f32 scales, tensor-wise (one element) or row-wise
 *                 (A's shape with the last dim 1; B's [1, N]).
 *                 fast_accum allows the GEMMs to accumulate faster and less exactly
 *                 (torch._scaled_mm's use_fast_accum; cuBLASLt's fast float8 accumulation on
 *                 CUDA; the CPU backend accumulates in f32 either way): 0 or 1, for
 *                 all_gather_scaled_matmul one per B (NULL: 0 for every B).
 * No output may share a byte with an input or another output (nor may the collectives' out with
 * in): ASYNCTP_ERROR_INVALID_ARGUMENT, the message naming both operands and their byte ranges
 * (asynctp/ops.h, Aliasing).
 * `path`: asynctp_path. `stream`: see the conventions above. */

ASYNCTP_C_EXPORT asynctp_status asynctp_all_gather_matmul(
    asynctp_context ctx, const asynctp_tensor* a_shard, const asynctp_tensor* bs, int32_t num_bs,
    const asynctp_tensor* outs, const asynctp_tensor* a_out, int32_t gather_dim, int32_t path,
    void* stream);

/* The gate/up projection of a SwiGLU MLP with its activation fused (asynctp/ops.h,
 * all_gather_matmul_swiglu): A = AG(g)(A_shard); P = A @ b_gate_up ([K, 2N]: the gate's N
 * columns, then the up projection's); out = silu(P[.., :N]) * P[.., N:] (A's shape with the last
 * dim N), in f32, rounded once. pre_out (optional: NULL or ndim -1 for none) receives P ([.., 2N]);
 * a_out (optional) A. */
ASYNCTP_C_EXPORT asynctp_status asynctp_all_gather_matmul_swiglu(
    asynctp_context ctx, const asynctp_tensor* a_shard, const asynctp_tensor* b_gate_up,
    const asynctp_tensor* out, const asynctp_tensor* pre_out, const asynctp_tensor* a_out,
    int32_t gather_dim, int32_t path, void* stream);

/* asynctp_all_gather_matmul_swiglu's backward, on this rank alone (asynctp/ops.h,
 * swiglu_backward): grad_gate_up ([.., 2N]) = [dG | dU] of out = silu(G) * U from
 * gate_up = P = [G | U] ([.., 2N]) and grad_out ([.., N]), in f32, rounded once, in one pass.
 * grad_gate_up overlaps neither input. */
ASYNCTP_C_EXPORT asynctp_status asynctp_swiglu_backward(asynctp_context ctx,
                                                        const asynctp_tensor* grad_out,
                                                        const asynctp_tensor* gate_up,
                                                        const asynctp_tensor* grad_gate_up,
                                                        void* stream);

ASYNCTP_C_EXPORT asynctp_status asynctp_all_gather_scaled_matmul(
    asynctp_context ctx, const asynctp_tensor* a_shard, const asynctp_tensor* a_scale,
    const asynctp_tensor* bs, const asynctp_tensor* b_scales, int32_t num_bs,
    const asynctp_tensor* outs, const asynctp_tensor* a_out, int32_t gather_dim,
    const int32_t* fast_accum, int32_t path, void* stream);

/* num_products >= 1: the products are summed in f32 before the one reduce-scatter. */
ASYNCTP_C_EXPORT asynctp_status asynctp_matmul_reduce_scatter(
    asynctp_context ctx, const asynctp_tensor* as, const asynctp_tensor* bs, int32_t num_products,
    const asynctp_tensor* out, int32_t reduce_op, int32_t scatter_dim, int32_t path, void* stream);

ASYNCTP_C_EXPORT asynctp_status asynctp_scaled_matmul_reduce_scatter(
    asynctp_context ctx, const asynctp_tensor* a, const asynctp_tensor* a_scale,
    const asynctp_tensor* b, const asynctp_tensor* b_scale, const asynctp_tensor* out,
    int32_t reduce_op, int32_t scatter_dim, int32_t fast_accum, int32_t path, void* stream);

/* ---- collectives (any dim, any strides) -------------------------------------------------- */

ASYNCTP_C_EXPORT asynctp_status asynctp_all_gather(asynctp_context ctx, const asynctp_tensor* in,
                                                   const asynctp_tensor* out, int32_t dim,
                                                   void* stream);
ASYNCTP_C_EXPORT asynctp_status asynctp_reduce_scatter(asynctp_context ctx,
                                                       const asynctp_tensor* in,
                                                       const asynctp_tensor* out, int32_t reduce_op,
                                                       int32_t dim, void* stream);
ASYNCTP_C_EXPORT asynctp_status asynctp_all_reduce(asynctp_context ctx, const asynctp_tensor* inout,
                                                   int32_t reduce_op, void* stream);
/* A device barrier on `stream`: what follows it on any rank's stream runs after every rank's
 * stream has reached it (asynctp::barrier in asynctp/ops.h says when the host waits too). */
ASYNCTP_C_EXPORT asynctp_status asynctp_barrier(asynctp_context ctx, void* stream);

/* ---- what ran, and what is held ---------------------------------------------------------- */

/* The path the last call of `op` ("all_gather_matmul", "matmul_reduce_scatter", ...) took
 * (asynctp_path; -1 if it never ran), and why it fell back ("" otherwise), written into
 * reason[0..reason_len) NUL-terminated and cut to fit. */
ASYNCTP_C_EXPORT asynctp_status asynctp_last_path(asynctp_context ctx, const char* op,
                                                  int32_t* path, char* reason, size_t reason_len);

/* Every (op, path) call count as JSON ({"all_gather_matmul": {"split": 3}, ...}), written into
 * buf[0..len) NUL-terminated; *needed = the bytes it takes with the NUL. */
ASYNCTP_C_EXPORT asynctp_status asynctp_usage_json(asynctp_context ctx, char* buf, size_t len,
                                                   size_t* needed);

/* The host profile: where the host time of each fused op call goes, phase by phase (the C ABI's
 * descriptor checks, the op's memo lookup, each enqueueing step), per (op, path). On from the
 * context's creation where ASYNCTP_HOST_PROFILE is set (the context then prints it to stderr when
 * destroyed). enabled: 1 on, 0 off; either way what was gathered so far is dropped. */
ASYNCTP_C_EXPORT asynctp_status asynctp_host_profile_set(asynctp_context ctx, int32_t enabled);

/* The host profile as JSON ({"all_gather_matmul": {"native": {"calls": n, "median_us": ...,
 * "mean_us": ..., "phases": [{"from": "entry", "to": "run", "count": n, "median_us": ...,
 * "mean_us": ..., "per_call_us": ...}, ...]}}}: a call's time from entering the C ABI to
 * returning, and each phase's between two steps), written like asynctp_usage_json's. */
ASYNCTP_C_EXPORT asynctp_status asynctp_host_profile_json(asynctp_context ctx, char* buf,
                                                          size_t len, size_t* needed);

typedef struct asynctp_memory_stats {
  int32_t struct_size;
  int64_t symmetric_bytes; /* symmetric workspaces this rank holds (its own share) */
  int64_t symmetric_limit; /* per workspace */
  int64_t local_bytes;     /* scratch and flags allocated outside the caller's allocator */
} asynctp_memory_stats;

ASYNCTP_C_EXPORT asynctp_status asynctp_memory_stats_get(asynctp_context ctx,
                                                         asynctp_memory_stats* out);

/* ---- graph passes ------------------------------------------------------------------------ */

/* Runs the passes of `asynctp passes` (micro-pipeline-TP fusion, then bucketing, dead-code
 * removal and a topological sort) over an fx-graph-json document (docs/GRAPH.md).
 * options_json: a JSON object of `asynctp passes`' options, named as its flags without the
 * dashes ({"enable_last_dim": true, "enable_transpose": false, "bucket_mb": [4, 16],
 * "no_fuse": false, "strict": false}); NULL or "{}": the defaults. An unknown name or a value of
 * the wrong kind is ASYNCTP_ERROR_INVALID_ARGUMENT naming it; so is a defective graph.
 * graph_json NULL: only checks the options.
 * *out receives a NUL-terminated JSON object that the library allocated (release it with
 * asynctp_string_free): {"options": every option with the defaults filled in, "report": one
 * {"collective", "kind", "outcome", "detail"} per collective of the input (outcome "fused",
 * "bucketed", "unmatched" or "blocked": a pattern applied but something prevented it),
 * "graph": the rewritten document} ("report" and "graph" absent without a graph). */
ASYNCTP_C_EXPORT asynctp_status asynctp_run_passes(const char* graph_json, const char* options_json,
                                                   char** out);
/* Releases a string the library allocated (NULL: nothing). */
ASYNCTP_C_EXPORT void asynctp_string_free(char* s);

#ifdef __cplusplus
}
#endif

#endif /* ASYNCTP_ASYNCTP_C_H_ */
