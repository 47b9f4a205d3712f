/* Bad input through every export: each call must return its documented status and leave a
 * detail that names what was wrong. Exits non-zero on the first surprise. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "flashdiff.h"

unsigned second_unit_version(void);

static int failures = 0;
static int checks = 0;

static void expect(const char *what, fd_status got, fd_status want, const char *detail_has) {
  char detail[512];
  size_t n = fd_last_error_detail(detail, sizeof detail);
  checks++;
  if (got != want) {
    fprintf(stderr, "FAIL %s: status %u, expected %u (%s)\n", what, (unsigned)got,
            (unsigned)want, detail);
    failures++;
    return;
  }
  if (want != FD_OK && (n == 0 || (detail_has && !strstr(detail, detail_has)))) {
    fprintf(stderr, "FAIL %s: detail \"%s\" does not mention \"%s\"\n", what, detail,
            detail_has ? detail_has : "(anything)");
    failures++;
    return;
  }
  printf("ok   %-48s -> %2u %s\n", what, (unsigned)got, detail);
}

int main(int argc, char **argv) {
  const char *weights = argc > 1 ? argv[1] : NULL;
  float map[64];
  for (int i = 0; i < 64; i++) map[i] = (float)(i % 8) / 8.0f;
  fd_layout *layout = NULL;

  /* Versions agree across header, library and a second translation unit. */
  if (fd_version() != FLASHDIFF_VERSION || second_unit_version() != FLASHDIFF_VERSION ||
      strcmp(fd_version_string(), FLASHDIFF_VERSION_STRING) != 0) {
    fprintf(stderr, "FAIL version mismatch\n");
    return 1;
  }

  /* Status messages: every code has one; buffers are NUL-terminated and truncated. */
  char buf[8];
  size_t full = 0;
  expect("status_message truncates", fd_status_message(FD_ERR_NULL, buf, sizeof buf, &full), FD_OK, NULL);
  if (strlen(buf) != sizeof buf - 1 || full <= sizeof buf) failures++, fprintf(stderr, "FAIL truncation\n");
  expect("status_message NULL buffer, zero length", fd_status_message(FD_ERR_NULL, NULL, 0, &full), FD_OK, NULL);
  expect("status_message NULL buffer, length 8", fd_status_message(0, NULL, 8, NULL), FD_ERR_NULL, "buf");
  char msg[128];
  fd_status_message(fd_status_last() + 7, msg, sizeof msg, NULL);
  if (strcmp(msg, "unknown status code") != 0) failures++, fprintf(stderr, "FAIL unknown code\n");

  /* Partitioner. */
  expect("partition NULL saliency", fd_partition_saliency(1, 8, 8, NULL, 64, 4, &layout), FD_ERR_NULL, "saliency");
  expect("partition wrong length", fd_partition_saliency(1, 8, 8, map, 63, 4, &layout), FD_ERR_LENGTH, "63");
  expect("partition R = 0", fd_partition_saliency(1, 8, 8, map, 64, 0, &layout), FD_ERR_PATCH_COUNT, "R = 0");
  expect("partition R > tokens", fd_partition_saliency(1, 8, 8, map, 64, 65, &layout), FD_ERR_PATCH_COUNT, "64");
  expect("partition zero grid", fd_partition_saliency(0, 8, 8, map, 64, 4, &layout), FD_ERR_GRID, "0x8x8");
  expect("partition huge grid", fd_partition_uniform(65536, 65536, 65536, 4, &layout), FD_ERR_GRID, "65536");
  map[5] = NAN;
  expect("partition NaN", fd_partition_saliency(1, 8, 8, map, 64, 4, &layout), FD_ERR_VALUE, "saliency[5]");
  map[5] = INFINITY;
  expect("partition inf", fd_partition_saliency(1, 8, 8, map, 64, 4, &layout), FD_ERR_VALUE, "inf");
  map[5] = 0.5f;
  expect("partition NULL out", fd_partition_saliency(1, 8, 8, map, 64, 4, NULL), FD_ERR_NULL, "layout_out");
  if (layout != NULL) failures++, fprintf(stderr, "FAIL layout written on failure\n");
  expect("partition ok", fd_partition_saliency(1, 8, 8, map, 64, 4, &layout), FD_OK, NULL);
  const uint32_t *toks = NULL;
  size_t len = 0;
  expect("patch_tokens out of range", fd_layout_patch_tokens(layout, 4, &toks, &len), FD_ERR_INDEX, "patch 4");
  expect("patch_tokens NULL out", fd_layout_patch_tokens(layout, 0, NULL, &len), FD_ERR_NULL, "tokens_out");
  expect("patch_of NULL layout", fd_layout_patch_of(NULL, &toks, &len), FD_ERR_NULL, "layout");
  fd_layout_free(&layout);
  if (layout != NULL) failures++, fprintf(stderr, "FAIL free did not NULL the handle\n");
  expect("use after free is a NULL handle", fd_layout_patch_of(layout, &toks, &len), FD_ERR_NULL, "layout");
  fd_layout_free(&layout); /* double free of a NULLed handle: no-op */
  fd_layout_free(NULL);
  if (fd_layout_patches(NULL) != 0 || fd_layout_tokens(NULL) != 0) failures++, fprintf(stderr, "FAIL NULL counts\n");

  const char *words[3] = {"a", "red", NULL};
  bool mask[3];
  expect("salient_mask NULL word", fd_salient_mask(words, 3, mask), FD_ERR_NULL, "words[2]");
  const char *bad_utf8[1] = {"\xff\xfe"};
  expect("salient_mask bad UTF-8", fd_salient_mask(bad_utf8, 1, mask), FD_ERR_UTF8, "words[0]");
  expect("salient_mask empty (NULL, 0)", fd_salient_mask(NULL, 0, NULL), FD_OK, NULL);
  const char *fw[2] = {"the", "on"};
  float attn[4 * 2] = {0};
  bool fmask[2];
  float sal[4];
  expect("salient_mask function words", fd_salient_mask(fw, 2, fmask), FD_OK, NULL);
  expect("saliency_map no salient word", fd_saliency_map(attn, 8, 4, fmask, 2, sal, 4), FD_ERR_NO_SALIENT, "uniform");
  fmask[0] = true;
  expect("saliency_map out too small", fd_saliency_map(attn, 8, 4, fmask, 2, sal, 3), FD_ERR_LENGTH, "saliency_out");
  expect("saliency_map huge length", fd_saliency_map(attn, (size_t)-1, 4, fmask, 2, sal, 4), FD_ERR_LENGTH, "attn");
  attn[3] = -1.0f;
  expect("saliency_map negative", fd_saliency_map(attn, 8, 4, fmask, 2, sal, 4), FD_ERR_VALUE, "attn[3]");

  fd_granularity *g = NULL;
  expect("granularity r_min > r_max", fd_granularity_new(9, 4, 0, &g), FD_ERR_CONFIG, "r_min");
  expect("granularity ok", fd_granularity_new(2, 16, 0, &g), FD_OK, NULL);
  uint32_t r = 0;
  expect("granularity current", fd_granularity_current(g, &r), FD_OK, NULL);
  expect("granularity NaN cost", fd_granularity_observe(g, r, NAN, NULL), FD_ERR_VALUE, "cost");
  fd_granularity_free(&g);
  fd_granularity_free(&g);

  /* Gate. */
  fd_gate *gate = NULL;
  fd_gate_config gc = fd_gate_config_default();
  expect("gate zero patches", fd_gate_new(0, &gc, &gate), FD_ERR_PATCH_COUNT, "at least one");
  gc.epsilon = NAN;
  expect("gate NaN epsilon", fd_gate_new(4, &gc, &gate), FD_ERR_CONFIG, "epsilon");
  gc = fd_gate_config_default();
  gc.eta = -1.0f;
  expect("gate negative eta", fd_gate_new(4, &gc, &gate), FD_ERR_CONFIG, "eta");
  expect("gate defaults (NULL cfg)", fd_gate_new(4, NULL, &gate), FD_OK, NULL);
  bool active[4];
  expect("decide wrong buffer length", fd_gate_decide(gate, active, 3, NULL), FD_ERR_LENGTH, "4");
  expect("decide NULL buffer", fd_gate_decide(gate, NULL, 4, NULL), FD_ERR_NULL, "active_out");
  expect("decide ok", fd_gate_decide(gate, active, 4, NULL), FD_OK, NULL);
  expect("observe patch out of range", fd_gate_observe(gate, 9, 0.5f), FD_ERR_INDEX, "patch 9");
  expect("observe NaN", fd_gate_observe(gate, 0, NAN), FD_ERR_VALUE, "patch 0");
  expect("observe_all wrong length", fd_gate_observe_all(gate, map, 5), FD_ERR_LENGTH, "5");
  expect("set_epsilon > 1", fd_gate_set_epsilon(gate, 1.5f), FD_ERR_CONFIG, "1.5");
  expect("observe NULL gate", fd_gate_observe(NULL, 0, 0.5f), FD_ERR_NULL, "gate");
  float eps = 0;
  fd_load_epsilon le = fd_load_epsilon_default();
  le.eps_min = 0.5f;
  expect("load epsilon bad bounds", fd_load_epsilon_for(&le, 1.0f, &eps), FD_ERR_CONFIG, "eps_min");
  expect("load epsilon defaults", fd_load_epsilon_for(NULL, 0.7f, &eps), FD_OK, NULL);
  expect("load epsilon NaN load", fd_load_epsilon_for(NULL, NAN, &eps), FD_ERR_VALUE, "load");
  expect("load epsilon negative load", fd_load_epsilon_for(NULL, -1.0f, &eps), FD_ERR_VALUE, "load");
  expect("load epsilon infinite load", fd_load_epsilon_for(NULL, INFINITY, &eps), FD_ERR_VALUE, "load");
  fd_gate_free(&gate);
  fd_gate_free(NULL);

  /* Scheduler. */
  fd_scheduler *s = NULL;
  fd_scheduler_config sc = fd_scheduler_config_default();
  sc.workers = 0;
  expect("scheduler zero workers", fd_scheduler_new(&sc, &s), FD_ERR_CONFIG, "workers");
  sc = fd_scheduler_config_default();
  sc.switch_cost = NAN;
  expect("scheduler NaN switch cost", fd_scheduler_new(&sc, &s), FD_ERR_CONFIG, "switch_cost");
  sc = fd_scheduler_config_default();
  sc.max_requests = 1;
  expect("scheduler ok", fd_scheduler_new(&sc, &s), FD_OK, NULL);
  expect("submit priority 200", fd_scheduler_submit(s, 1, 200, 1.0), FD_ERR_VALUE, "priority 200");
  expect("submit NaN cost", fd_scheduler_submit(s, 1, 0, NAN), FD_ERR_VALUE, "cost");
  expect("submit ok", fd_scheduler_submit(s, 1, 0, 1.0), FD_OK, NULL);
  expect("submit duplicate", fd_scheduler_submit(s, 1, 0, 1.0), FD_ERR_DUPLICATE_REQUEST, "1");
  expect("submit over admission", fd_scheduler_submit(s, 2, 0, 1.0), FD_ERR_FULL, "requests");
  fd_patch_cost pc[2] = {{0, 1.0}, {0, 1.0}};
  expect("step before warm-up", fd_scheduler_submit_step(s, 1, 5, pc, 1), FD_ERR_BARRIER, "previous step");
  fd_assignment a;
  bool has = false;
  expect("next unknown worker", fd_scheduler_next(s, 7, &a, &has), FD_ERR_UNKNOWN_WORKER, "worker 7");
  expect("next NULL out", fd_scheduler_next(s, 0, NULL, &has), FD_ERR_NULL, "assignment_out");
  expect("next ok", fd_scheduler_next(s, 0, &a, &has), FD_OK, NULL);
  expect("next while busy", fd_scheduler_next(s, 0, &a, &has), FD_ERR_BUSY, "worker 0");
  fd_completion c;
  fd_tag wrong = a.tag;
  wrong.patch = 3;
  expect("fail a tag not running", fd_scheduler_fail(s, 0, wrong, &c), FD_ERR_NOT_RUNNING, "patch 3");
  expect("complete ok", fd_scheduler_complete(s, 0, a.tag, &c), FD_OK, NULL);
  if (c != FD_COMPLETION_WARMUP_DONE) failures++, fprintf(stderr, "FAIL completion kind\n");
  expect("complete repeated is stale", fd_scheduler_complete(s, 0, a.tag, &c), FD_OK, NULL);
  if (c != FD_COMPLETION_STALE) failures++, fprintf(stderr, "FAIL repeated completion not stale\n");
  expect("step with repeated patch", fd_scheduler_submit_step(s, 1, 5, pc, 2), FD_ERR_BAD_PATCHES, "unique");
  expect("step with no patch", fd_scheduler_submit_step(s, 1, 5, NULL, 0), FD_ERR_BAD_PATCHES, "at least one");
  expect("step NULL patches", fd_scheduler_submit_step(s, 1, 5, NULL, 2), FD_ERR_NULL, "patches");
  expect("step unknown request", fd_scheduler_submit_step(s, 9, 5, pc, 1), FD_ERR_UNKNOWN_REQUEST, "9");
  expect("step ok", fd_scheduler_submit_step(s, 1, 5, pc, 1), FD_OK, NULL);
  expect("finish in flight", fd_scheduler_finish(s, 1), FD_ERR_NOT_IDLE, "in flight");
  size_t requeued = 0;
  expect("worker lost", fd_scheduler_worker_lost(s, 0, &requeued), FD_OK, NULL);
  expect("next on lost worker", fd_scheduler_next(s, 0, &a, &has), FD_ERR_WORKER_DEAD, "lost");
  uint32_t w = 0;
  expect("add worker", fd_scheduler_add_worker(s, &w), FD_OK, NULL);
  expect("cancel", fd_scheduler_cancel(s, 1), FD_OK, NULL);
  expect("cancel twice", fd_scheduler_cancel(s, 1), FD_ERR_UNKNOWN_REQUEST, "1");
  fd_load load;
  expect("load NULL out", fd_scheduler_load(s, NULL), FD_ERR_NULL, "load_out");
  expect("load ok", fd_scheduler_load(s, &load), FD_OK, NULL);
  fd_scheduler_free(&s);
  expect("use after free", fd_scheduler_submit(s, 1, 0, 1.0), FD_ERR_NULL, "scheduler");
  fd_scheduler_free(&s);

  /* Engine. */
  fd_engine *eng = NULL;
  fd_engine_config ec = fd_engine_config_default();
  ec.weights = "/nonexistent/model.safetensors";
  expect("engine missing weights", fd_engine_new(&ec, &eng), FD_ERR_CONFIG, "cannot read weights");
  ec.weights = weights;
  ec.workers = 0;
  expect("engine zero workers", fd_engine_new(&ec, &eng), FD_ERR_CONFIG, "--workers");
  ec.workers = 1;
  ec.processes = true;
  expect("engine processes without exe", fd_engine_new(&ec, &eng), FD_ERR_NULL, "worker_exe");
  ec.processes = false;
  expect("engine NULL out", fd_engine_new(&ec, NULL), FD_ERR_NULL, "out");
  expect("engine ok", fd_engine_new(&ec, &eng), FD_OK, NULL);
  fd_request_config rq = fd_request_config_default();
  rq.steps = 6;
  rq.warmup = 2;
  expect("submit unknown word", fd_engine_submit(eng, 1, "a red dragon on a white background", &rq), FD_ERR_VALUE, "dragon");
  expect("submit NULL prompt", fd_engine_submit(eng, 1, NULL, &rq), FD_ERR_NULL, "prompt");
  rq.mode = FD_MODE_DBCACHE + 1;
  expect("submit bad mode", fd_engine_submit(eng, 1, "a red circle top on a white background", &rq), FD_ERR_VALUE, "mode 11");
  rq.mode = 0;
  rq.reuse = 2;
  expect("submit bad reuse", fd_engine_submit(eng, 1, "a red circle top on a white background", &rq), FD_ERR_VALUE, "reuse 2");
  rq.reuse = 0;
  rq.epsilon = NAN;
  expect("submit NaN epsilon", fd_engine_submit(eng, 1, "a red circle top on a white background", &rq), FD_ERR_CONFIG, "\"epsilon\" NaN");
  rq.epsilon = 0.05f;
  rq.warmup = 6;
  expect("submit warm-up >= steps", fd_engine_submit(eng, 1, "a red circle top on a white background", &rq), FD_ERR_CONFIG, "\"warmup\" 6");
  rq.warmup = 2;
  expect("submit ok", fd_engine_submit(eng, 1, "a red circle top on a white background", &rq), FD_OK, NULL);
  expect("submit duplicate id", fd_engine_submit(eng, 1, "a red circle top on a white background", &rq), FD_ERR_DUPLICATE_REQUEST, "1");
  float img[32 * 32 * 3];
  expect("result while pending", fd_engine_result(eng, 1, img, sizeof img / sizeof img[0], NULL), FD_ERR_NOT_IDLE, "pending");
  expect("submit second", fd_engine_submit(eng, 2, "a blue cross center on a black background", &rq), FD_OK, NULL);
  expect("cancel second", fd_engine_cancel(eng, 2), FD_OK, NULL);
  expect("cancel unknown", fd_engine_cancel(eng, 99), FD_ERR_UNKNOWN_REQUEST, "99");
  expect("run", fd_engine_run(eng), FD_OK, NULL);
  fd_request_state rs;
  expect("poll cancelled", fd_engine_poll(eng, 2, &rs), FD_OK, NULL);
  if (rs != FD_REQUEST_FAILED) failures++, fprintf(stderr, "FAIL cancelled request not FAILED\n");
  expect("result of cancelled", fd_engine_result(eng, 2, NULL, 0, NULL), FD_ERR_VALUE, "cancelled");
  expect("result wrong buffer", fd_engine_result(eng, 1, img, 7, NULL), FD_ERR_LENGTH, "7");
  expect("result unknown", fd_engine_result(eng, 5, NULL, 0, NULL), FD_ERR_UNKNOWN_REQUEST, "5");
  expect("result ok", fd_engine_result(eng, 1, img, sizeof img / sizeof img[0], NULL), FD_OK, NULL);
  expect("release", fd_engine_release(eng, 1), FD_OK, NULL);
  expect("release twice", fd_engine_release(eng, 1), FD_ERR_UNKNOWN_REQUEST, "1");
  fd_engine_free(&eng);
  expect("engine use after free", fd_engine_run(eng), FD_ERR_NULL, "engine");
  fd_engine_free(&eng);

  printf("%d passed, %d failed\n", checks - failures, failures);
  return failures == 0 ? 0 : 1;
}
