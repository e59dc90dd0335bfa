/* The C ABI from an installed asynctp: each rank gathers every rank's row of two values.
 * Run it with `asynctp launch -n 2 -- ./all_gather_c`. */
#include <stdio.h>
#include <string.h>

#include <asynctp/asynctp_c.h>

#define CHECK(call)                                                    \
  do {                                                                 \
    if ((call) != ASYNCTP_OK) {                                        \
      fprintf(stderr, "%s failed: %s\n", #call, asynctp_last_error()); \
      return 1;                                                        \
    }                                                                  \
  } while (0)

static asynctp_tensor rows(float* data, int64_t n) {
  asynctp_tensor t;
  memset(&t, 0, sizeof(t));
  t.data = data;
  t.dtype = ASYNCTP_F32;
  t.device_type = ASYNCTP_DEVICE_CPU;
  t.ndim = 2;
  t.shape[0] = n;
  t.shape[1] = 2;
  t.strides[0] = 2;
  t.strides[1] = 1;
  return t;
}

int main(void) {
  asynctp_group group;
  asynctp_context ctx;
  asynctp_context_options options;
  int32_t rank, ws, r;
  float in[2], out[2 * 64];
  asynctp_tensor in_d, out_d;

  CHECK(asynctp_group_from_env(0, &group));
  CHECK(asynctp_group_rank(group, &rank));
  CHECK(asynctp_group_world_size(group, &ws));
  if (ws > 64) return 1;
  asynctp_context_options_init(&options);
  options.backend = "cpu";
  CHECK(asynctp_context_create(group, &options, &ctx));
  in[0] = (float)rank;
  in[1] = (float)(10 * rank);
  in_d = rows(in, 1);
  out_d = rows(out, ws);
  CHECK(asynctp_all_gather(ctx, &in_d, &out_d, 0, ASYNCTP_CONTEXT_STREAM));
  CHECK(asynctp_synchronize(ctx)); /* the ops return once enqueued */
  for (r = 0; r < ws; ++r) {
    if (out[2 * r] != (float)r || out[2 * r + 1] != (float)(10 * r)) {
      fprintf(stderr, "rank %d: row %d is (%g, %g)\n", rank, r, out[2 * r], out[2 * r + 1]);
      return 1;
    }
  }
  CHECK(asynctp_context_destroy(ctx));
  CHECK(asynctp_group_destroy(group));
  printf("rank %d of %d: C OK\n", rank, ws);
  return 0;
}
