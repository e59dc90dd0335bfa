/* The C ABI from C: the header compiles as C (no C++ in it), and a single-rank job runs an
 * all_gather_matmul, a bad call and the library queries through it. Exits non-zero, saying why,
 * on the first failure. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "asynctp/asynctp_c.h"

#define CHECK(cond)                                                                     \
  do {                                                                                  \
    if (!(cond)) {                                                                      \
      fprintf(stderr, "%s:%d: %s failed (last error: %s)\n", __FILE__, __LINE__, #cond, \
              asynctp_last_error());                                                    \
      exit(1);                                                                          \
    }                                                                                   \
  } while (0)

static asynctp_tensor matrix(float* data, int64_t rows, int64_t cols) {
  asynctp_tensor t;
  memset(&t, 0, sizeof(t));
  t.data = data;
  t.dtype = ASYNCTP_F32;
  t.device_type = ASYNCTP_DEVICE_CPU;
  t.device_index = 0;
  t.ndim = 2;
  t.shape[0] = rows;
  t.shape[1] = cols;
  t.strides[0] = cols;
  t.strides[1] = 1;
  return t;
}

int main(void) {
  asynctp_group group = NULL;
  asynctp_context ctx = NULL;
  asynctp_context_options options;
  float a[2 * 3] = {1, 2, 3, 4, 5, 6};
  float b[3 * 2] = {1, 0, 0, 1, 1, 1};
  float out[2 * 2] = {0};
  const float want[2 * 2] = {4, 5, 10, 11};
  asynctp_tensor ad, bd, od, bad;
  int32_t path = -2;
  char reason[64];
  int i;

  CHECK(asynctp_api_version() == ASYNCTP_C_API_VERSION);
  CHECK(strcmp(asynctp_version(), "0.1.0") == 0);
  CHECK(strcmp(asynctp_last_error(), "") == 0);
  CHECK(asynctp_group_rank(NULL, NULL) == ASYNCTP_ERROR_INVALID_ARGUMENT);
  CHECK(strstr(asynctp_last_error(), "is NULL") != NULL);

  /* No torchrun variables: a job of one rank. */
  CHECK(asynctp_group_from_env(0, &group) == ASYNCTP_OK);
  asynctp_context_options_init(&options);
  CHECK(options.struct_size == (int32_t)sizeof(options));
  options.backend = "cpu";
  options.dispatch_cache = "off";
  CHECK(asynctp_context_create(group, &options, &ctx) == ASYNCTP_OK);

  ad = matrix(a, 2, 3);
  bd = matrix(b, 3, 2);
  od = matrix(out, 2, 2);
  CHECK(asynctp_all_gather_matmul(ctx, &ad, &bd, 1, &od, NULL, 0, ASYNCTP_PATH_DEFAULT,
                                  ASYNCTP_CONTEXT_STREAM) == ASYNCTP_OK);
  CHECK(asynctp_synchronize(ctx) == ASYNCTP_OK); /* the op runs on the context's stream */
  for (i = 0; i < 4; ++i)
    CHECK(out[i] == want[i]);
  CHECK(asynctp_last_path(ctx, "all_gather_matmul", &path, reason, sizeof(reason)) == ASYNCTP_OK);
  CHECK(path >= ASYNCTP_PATH_SPLIT);

  bad = ad;
  bad.dtype = 42;
  CHECK(asynctp_all_gather_matmul(ctx, &bad, &bd, 1, &od, NULL, 0, ASYNCTP_PATH_DEFAULT,
                                  ASYNCTP_CONTEXT_STREAM) == ASYNCTP_ERROR_INVALID_ARGUMENT);
  CHECK(strstr(asynctp_last_error(), "a_shard.dtype is 42") != NULL);

  CHECK(asynctp_context_destroy(ctx) == ASYNCTP_OK);
  CHECK(asynctp_group_destroy(group) == ASYNCTP_OK);
  printf("OK\n");
  return 0;
}
