/* Generating with libflashdiff's engine from C: one FlashDiff request and its full-computation
 * reference, then the report and how far apart the two images are.
 * Usage: engine_example WEIGHTS.safetensors */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "flashdiff.h"

#define CHECK(call)                                                                   \
  do {                                                                                \
    fd_status st_ = (call);                                                           \
    if (st_ != FD_OK) {                                                               \
      char msg_[512];                                                                 \
      fd_last_error_detail(msg_, sizeof msg_);                                        \
      fprintf(stderr, "%s failed (%u): %s\n", #call, (unsigned)st_, msg_);            \
      return 1;                                                                       \
    }                                                                                 \
  } while (0)

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s WEIGHTS\n", argv[0]);
    return 2;
  }
  fd_engine_config ec = fd_engine_config_default();
  ec.weights = argv[1];
  ec.workers = 2;
  fd_engine *e = NULL;
  CHECK(fd_engine_new(&ec, &e));

  const char *prompt = "a red circle top left and a blue square bottom right on a white background";
  fd_request_config rc = fd_request_config_default();
  rc.steps = 20;
  rc.warmup = 3;
  rc.patches = 4;
  rc.seed = 42;
  rc.epsilon = 0.3; /* 20 steps move block 0's input more per step than the default allows */
  CHECK(fd_engine_submit(e, 1, prompt, &rc));
  rc.mode = 2; /* full computation, same seed */
  CHECK(fd_engine_submit(e, 2, prompt, &rc));
  fd_request_state st;
  CHECK(fd_engine_poll(e, 1, &st));
  if (st != FD_REQUEST_PENDING) return 1;
  CHECK(fd_engine_run(e));

  uint32_t side = 0;
  CHECK(fd_engine_image_side(e, &side));
  size_t n = (size_t)side * side * 3;
  float *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b);
  if (!a || !b) return 1;
  fd_report ra, rb;
  CHECK(fd_engine_result(e, 1, a, n, &ra));
  CHECK(fd_engine_result(e, 2, b, n, &rb));
  double mse = 0;
  for (size_t i = 0; i < n; i++) mse += (a[i] - b[i]) * (a[i] - b[i]);
  mse /= (double)n;
  printf("flashdiff: %u patches, %llu of %llu patch-steps computed, %.1f ms\n", ra.patches,
         (unsigned long long)ra.computed, (unsigned long long)ra.patch_steps, ra.latency_ms);
  printf("full:      %u patch, %.1f ms\n", rb.patches, rb.latency_ms);
  printf("PSNR vs full: %.2f dB\n", mse > 0 ? 10.0 * log10(1.0 / mse) : INFINITY);
  CHECK(fd_engine_release(e, 1));
  CHECK(fd_engine_release(e, 2));
  free(a);
  free(b);
  fd_engine_free(&e);
  return ra.computed < ra.patch_steps && rb.computed == rb.patch_steps ? 0 : 1;
}
