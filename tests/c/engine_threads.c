/* A C server loop around one shared fd_engine: requests arrive while others run.
 *
 * The main thread serves: it admits what has arrived, advances the engine one round with
 * fd_engine_step, and collects finished images. An "arrivals" thread submits requests over
 * time (half of them with the pointer-and-length call), a "client" thread polls and cancels
 * some while they run, and finally a second phase runs fd_engine_run on one thread while
 * another cancels and submits. Then the status codes of the awkward call orders.
 * Usage: engine_threads WEIGHTS.safetensors (built with -fsanitize=thread in the tests). */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "flashdiff.h"

#define REQUESTS 12
#define FAIL(...)                 \
  do {                            \
    fprintf(stderr, __VA_ARGS__); \
    exit(1);                      \
  } while (0)

static void check(fd_status st, const char *what) {
  if (st != FD_OK) {
    char msg[512];
    fd_last_error_detail(msg, sizeof msg);
    FAIL("%s failed (%u): %s\n", what, (unsigned)st, msg);
  }
}

static fd_engine *engine;
static atomic_int submitted;
static atomic_int stop;

static void nap(long ms) {
  struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&t, NULL);
}

static fd_request_config small(uint64_t seed) {
  fd_request_config rc = fd_request_config_default();
  rc.steps = 12;
  rc.warmup = 2;
  rc.patches = 8;
  rc.seed = seed;
  return rc;
}

static void *arrivals(void *arg) {
  (void)arg;
  static const char prompt[] = "a red circle left on a white background";
  for (uint64_t id = 1; id <= REQUESTS; id++) {
    fd_request_config rc = small(id);
    if (id % 2)
      check(fd_engine_submit(engine, id, prompt, &rc), "fd_engine_submit");
    else
      check(fd_engine_submit_n(engine, id, prompt, strlen(prompt), &rc), "fd_engine_submit_n");
    atomic_fetch_add(&submitted, 1);
    nap(15);
  }
  return NULL;
}

static void *client(void *arg) {
  (void)arg;
  /* Poll everything while it runs; cancel request 3 and 8 once they are pending. */
  int cancelled3 = 0, cancelled8 = 0;
  while (!atomic_load(&stop)) {
    for (uint64_t id = 1; id <= REQUESTS; id++) {
      fd_request_state st;
      check(fd_engine_poll(engine, id, &st), "fd_engine_poll");
      if (st == FD_REQUEST_PENDING && ((id == 3 && !cancelled3) || (id == 8 && !cancelled8))) {
        /* Between the poll and the cancel the serving loop may finish the request
         * (FD_ERR_FINISHED) or finish and release it (FD_ERR_UNKNOWN_REQUEST). */
        fd_status c = fd_engine_cancel(engine, id);
        if (c != FD_OK && c != FD_ERR_FINISHED && c != FD_ERR_UNKNOWN_REQUEST)
          check(c, "fd_engine_cancel");
        if (id == 3) cancelled3 = 1;
        if (id == 8) cancelled8 = 1;
      }
    }
    nap(2);
  }
  return NULL;
}

static void *runner(void *arg) {
  (void)arg;
  check(fd_engine_run(engine), "fd_engine_run");
  return NULL;
}

int main(int argc, char **argv) {
  if (argc < 2) FAIL("usage: %s WEIGHTS\n", argv[0]);
  fd_engine_config ec = fd_engine_config_default();
  ec.weights = argv[1];
  check(fd_engine_new(&ec, &engine), "fd_engine_new");
  uint32_t side = 0;
  check(fd_engine_image_side(engine, &side), "fd_engine_image_side");
  size_t n = (size_t)side * side * 3;
  float *rgb = malloc(n * sizeof *rgb);
  if (!rgb) FAIL("out of memory\n");

  /* Phase 1: the serving loop. */
  pthread_t a, c;
  pthread_create(&a, NULL, arrivals, NULL);
  pthread_create(&c, NULL, client, NULL);
  int done = 0, failed = 0, seen[REQUESTS + 1] = {0};
  while (done + failed < REQUESTS) {
    size_t pending = 0;
    check(fd_engine_step(engine, 5, &pending), "fd_engine_step");
    for (uint64_t id = 1; id <= REQUESTS; id++) {
      fd_request_state st;
      check(fd_engine_poll(engine, id, &st), "fd_engine_poll");
      if (seen[id] || (st != FD_REQUEST_DONE && st != FD_REQUEST_FAILED)) continue;
      seen[id] = 1;
      if (st == FD_REQUEST_DONE) {
        fd_report rep;
        check(fd_engine_result(engine, id, rgb, n, &rep), "fd_engine_result");
        if (rep.id != id || rep.computed == 0) FAIL("bad report for %llu\n", (unsigned long long)id);
        done++;
        /* A finished request can no longer be cancelled. */
        if (fd_engine_cancel(engine, id) != FD_ERR_FINISHED) FAIL("cancel after finish\n");
      } else {
        failed++;
      }
      check(fd_engine_release(engine, id), "fd_engine_release");
    }
    if (pending == 0 && atomic_load(&submitted) < REQUESTS) nap(1);
  }
  atomic_store(&stop, 1);
  pthread_join(a, NULL);
  pthread_join(c, NULL);
  printf("served %d, cancelled %d, while requests kept arriving\n", done, failed);
  if (done < REQUESTS - 2) FAIL("too few served\n");

  /* Phase 2: fd_engine_run on one thread; another cancels and submits meanwhile. */
  fd_request_config rc = small(99);
  check(fd_engine_submit(engine, 100, "a blue square center on a black background", &rc), "submit 100");
  check(fd_engine_submit(engine, 101, "a blue square center on a black background", &rc), "submit 101");
  pthread_t r;
  pthread_create(&r, NULL, runner, NULL);
  fd_status cs = fd_engine_cancel(engine, 101);
  if (cs != FD_OK && cs != FD_ERR_FINISHED) check(cs, "cancel 101");
  fd_status ss = fd_engine_submit(engine, 102, "a green cross top on a white background", &rc);
  check(ss, "submit 102 during run");
  pthread_join(r, NULL);
  /* fd_engine_run returned: 102 may have been admitted after its last round; finish it. */
  check(fd_engine_run(engine), "fd_engine_run");
  fd_request_state st;
  check(fd_engine_poll(engine, 100, &st), "poll 100");
  if (st != FD_REQUEST_DONE) FAIL("100 not done\n");
  check(fd_engine_poll(engine, 102, &st), "poll 102");
  if (st != FD_REQUEST_DONE) FAIL("102 not done\n");

  /* Awkward call orders get codes that say what happened. */
  check(fd_engine_submit(engine, 200, "a red circle left on a white background", &rc), "submit 200");
  if (fd_engine_release(engine, 200) != FD_ERR_NOT_IDLE) FAIL("release while pending\n");
  if (fd_engine_result(engine, 200, rgb, n, NULL) != FD_ERR_NOT_IDLE) FAIL("result while pending\n");
  check(fd_engine_cancel(engine, 200), "cancel 200");
  check(fd_engine_poll(engine, 200, &st), "poll 200");
  if (st != FD_REQUEST_FAILED) FAIL("cancelled request does not read as failed\n");
  check(fd_engine_release(engine, 200), "release 200");
  if (fd_engine_cancel(engine, 200) != FD_ERR_UNKNOWN_REQUEST) FAIL("cancel after release\n");
  static const char nul[] = "a red circle\0 left on a white background";
  if (fd_engine_submit_n(engine, 201, nul, sizeof nul - 1, &rc) != FD_ERR_VALUE) FAIL("embedded NUL accepted\n");
  size_t left = 1;
  check(fd_engine_step(engine, 0, &left), "step when idle");
  if (left != 0) FAIL("idle engine reports pending work\n");
  if (fd_engine_step(engine, 60000, NULL) != FD_ERR_VALUE) FAIL("timeout out of range accepted\n");

  /* The request schema as JSON: a work budget, which fd_request_config has no field for.
     20 steps, 3 warm-up, budget 0.31 of the FLOPs: 6 steps computed (0.308 with the
     signal), 3 of the 17 after the warm-up. */
  static const char budgeted[] =
      "{\"prompt\": \"a red circle left on a white background\", \"steps\": 20, "
      "\"warmup\": 3, \"patches\": 4, \"budget\": 0.31}";
  check(fd_engine_submit_json(engine, 300, budgeted, strlen(budgeted)), "submit_json 300");
  check(fd_engine_run(engine), "run 300");
  fd_report rep;
  check(fd_engine_result(engine, 300, NULL, 0, &rep), "result 300");
  if (rep.patch_steps != 17 * 4 || rep.computed != 3 * 4)
    FAIL("budget 0.31: %llu of %llu patch-steps computed, expected 12 of 68\n",
         (unsigned long long)rep.computed, (unsigned long long)rep.patch_steps);
  /* The whole report as JSON, sized first with no buffer: its FLOPs are within the budget. */
  size_t json_n = 0;
  check(fd_engine_report_json(engine, 300, NULL, 0, &json_n), "report_json size");
  if (json_n < 2) FAIL("report_json: %zu bytes\n", json_n);
  char *json = malloc(json_n + 1);
  if (!json) FAIL("malloc\n");
  size_t json_again = 0;
  check(fd_engine_report_json(engine, 300, json, json_n + 1, &json_again), "report_json");
  if (json_again != json_n || strlen(json) != json_n || json[0] != '{')
    FAIL("report_json: %zu then %zu bytes: %s\n", json_n, json_again, json);
  const char *frac = strstr(json, "\"flops_fraction\":");
  if (!frac) FAIL("report_json has no flops_fraction: %s\n", json);
  double flops = strtod(frac + strlen("\"flops_fraction\":"), NULL);
  if (!(flops > 0.2 && flops <= 0.31)) FAIL("budget 0.31 ran %f of the FLOPs: %s\n", flops, json);
  /* Truncated into a small buffer: NUL-terminated, the full length still reported. */
  char small[8];
  check(fd_engine_report_json(engine, 300, small, sizeof small, &json_again), "report_json small");
  if (strlen(small) != sizeof small - 1 || json_again != json_n)
    FAIL("report_json truncated: \"%s\", %zu of %zu\n", small, json_again, json_n);
  free(json);
  if (fd_engine_report_json(engine, 987654, NULL, 0, NULL) == FD_OK)
    FAIL("report_json of an unknown request succeeded\n");
  check(fd_engine_release(engine, 300), "release 300");
  /* Second-order forecasts, which fd_request_config's reuse (0 or 1) does not name: whole-step
     caching with skipped steps along the parabola through their last three computations
     ends like any request, and skips steps. */
  static const char second[] =
      "{\"prompt\": \"a red circle left on a white background\", \"steps\": 20, "
      "\"warmup\": 3, \"mode\": \"teacache\", \"cache_threshold\": 0.3, "
      "\"reuse\": \"extrapolate2\"}";
  check(fd_engine_submit_json(engine, 303, second, strlen(second)), "submit_json 303");
  check(fd_engine_run(engine), "run 303");
  check(fd_engine_result(engine, 303, NULL, 0, &rep), "result 303");
  if (rep.computed >= rep.patch_steps)
    FAIL("extrapolate2: %llu of %llu patch-steps computed, expected skipped steps\n",
         (unsigned long long)rep.computed, (unsigned long long)rep.patch_steps);
  check(fd_engine_release(engine, 303), "release 303");
  /* A warm-up left out is the model's, fitted to the steps, as over HTTP and JSON lines:
     four steps leave room for three, where the generic default would not fit. */
  static const char fitted[] =
      "{\"prompt\": \"a red circle left on a white background\", \"steps\": 4}";
  check(fd_engine_submit_json(engine, 304, fitted, strlen(fitted)), "submit_json 304");
  check(fd_engine_run(engine), "run 304");
  check(fd_engine_result(engine, 304, NULL, 0, &rep), "result 304");
  if (rep.steps != 4 || rep.warmup != 3)
    FAIL("a left-out warm-up of 4 steps: %u warm-up steps of %u, expected 3 of 4\n",
         (unsigned)rep.warmup, (unsigned)rep.steps);
  check(fd_engine_release(engine, 304), "release 304");
  static const char *refused[][2] = {
      {"{\"prompt\": \"a red circle\", \"reuse\": \"extrapolate3\"}", "reuse"},
      {"{\"prompt\": \"a red circle\", \"budget\": 2}", "budget"},
      {"{\"prompt\": \"a red circle\", \"budget\": 0.5, \"mode\": \"teacache\"}", "budget"},
      {"{\"budget\": 0.5}", "prompt"},
      {"{\"prompt\": \"a red circle\", \"model\": \"tinyvideo\"}", "model"},
      {"{\"prompt\": \"a red circle\", \"budgett\": 0.5}", "budgett"},
      {"[1, 2]", "request"},
      {"{\"prompt\": ", "JSON"},
  };
  for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
    fd_status st = fd_engine_submit_json(engine, 301, refused[i][0], strlen(refused[i][0]));
    char detail[512];
    fd_last_error_detail(detail, sizeof detail);
    if (st == FD_OK || strstr(detail, refused[i][1]) == NULL)
      FAIL("submit_json accepted or did not name '%s': %s -> %d %s\n", refused[i][1],
           refused[i][0], (int)st, detail);
  }
  if (fd_engine_submit_json(engine, 302, NULL, 0) == FD_OK) FAIL("empty JSON accepted\n");

  free(rgb);
  fd_engine_free(&engine);
  if (engine != NULL) FAIL("free did not NULL the handle\n");
  printf("threads ok\n");
  return 0;
}
