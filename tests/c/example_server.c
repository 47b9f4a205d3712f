/* A tiny C "serving stack" that uses libflashdiff's policies with its own attention buffers.
 *
 * Three requests arrive; each runs a warm-up (here: fake cross-attention that lights up where
 * its object is), gets a saliency layout of 8 patches, and then denoises steps 5..29: the gate
 * picks the active patches from fake self-attention importances, the scheduler packs every
 * request's active patch-steps onto two workers. The numbers are made up; the calls are real.
 *
 * Build: cc -std=c11 -Iinclude tests/c/example_server.c target/release/libflashdiff.a \
 *           -lpthread -ldl -lm -o example_server
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flashdiff.h"

#define GRID 16
#define TOKENS (GRID * GRID)
#define PATCHES 8
#define WORKERS 2
#define REQUESTS 3
#define WARMUP_STEPS 5
#define STEPS 30

#define CHECK(call)                                                                   \
  do {                                                                                \
    fd_status st_ = (call);                                                           \
    if (st_ != FD_OK) {                                                               \
      char msg_[256];                                                                 \
      fd_last_error_detail(msg_, sizeof msg_);                                        \
      fprintf(stderr, "%s:%d: %s failed with status %u: %s\n", __FILE__, __LINE__,   \
              #call, (unsigned)st_, msg_);                                            \
      exit(1);                                                                        \
    }                                                                                 \
  } while (0)

typedef struct request {
  uint64_t id;
  const char *words[8];
  size_t n_words;
  int obj_y, obj_x, obj_size; /* where the fake attention puts the object */
  fd_layout *layout;
  fd_gate *gate;
  uint32_t step; /* last step opened */
  int done;
  unsigned long patch_steps;
} request;

/* The serving stack's own warm-up: cross-attention from each latent token to each word. The
 * object's noun (word 2) attends strongly to the object's square. */
static void fake_cross_attention(const request *r, float *attn) {
  for (int t = 0; t < TOKENS; t++) {
    int y = t / GRID, x = t % GRID;
    int inside = y >= r->obj_y && y < r->obj_y + r->obj_size && x >= r->obj_x &&
                 x < r->obj_x + r->obj_size;
    for (size_t w = 0; w < r->n_words; w++)
      attn[t * r->n_words + w] = (w == 2 && inside) ? 0.8f : 0.05f;
  }
}

/* Self-attention importance of a patch after it ran: the patch holding the object keeps
 * changing, the background settles. */
static float fake_importance(const request *r, uint32_t patch, uint32_t step) {
  const uint32_t *map;
  size_t n;
  CHECK(fd_layout_patch_of(r->layout, &map, &n));
  uint32_t object_patch = map[r->obj_y * GRID + r->obj_x];
  return patch == object_patch ? 0.3f + 0.02f * (float)step : 0.2f + 0.001f * (float)(step % 2);
}

static void open_step(fd_scheduler *s, request *r) {
  bool active[PATCHES];
  uint32_t n_active = 0;
  fd_patch_cost list[PATCHES];
  CHECK(fd_gate_decide(r->gate, active, PATCHES, &n_active));
  size_t n = 0;
  for (uint32_t p = 0; p < PATCHES; p++) {
    if (!active[p]) continue;
    const uint32_t *toks;
    size_t len;
    CHECK(fd_layout_patch_tokens(r->layout, p, &toks, &len));
    list[n].patch = p;
    list[n].cost = (double)len / TOKENS; /* cost proportional to tokens */
    n++;
  }
  r->step = r->step == 0 ? WARMUP_STEPS : r->step + 1;
  r->patch_steps += n;
  CHECK(fd_scheduler_submit_step(s, r->id, r->step, list, n));
  printf("request %llu step %2u: %u of %d patches active\n", (unsigned long long)r->id,
         r->step, n_active, PATCHES);
}

static void after_warmup(request *r) {
  float attn[TOKENS * 8];
  bool salient[8];
  float saliency[TOKENS];
  fake_cross_attention(r, attn);
  CHECK(fd_salient_mask(r->words, r->n_words, salient));
  CHECK(fd_saliency_map(attn, TOKENS * r->n_words, TOKENS, salient, r->n_words, saliency,
                        TOKENS));
  CHECK(fd_partition_saliency(1, GRID, GRID, saliency, TOKENS, PATCHES, &r->layout));
  fd_gate_config cfg = fd_gate_config_default();
  cfg.epsilon = 0.1f;
  cfg.max_skip = 3;
  CHECK(fd_gate_new(PATCHES, &cfg, &r->gate));
}

int main(void) {
  printf("libflashdiff %s (header %s)\n", fd_version_string(), FLASHDIFF_VERSION_STRING);
  if (fd_version() != FLASHDIFF_VERSION) {
    fprintf(stderr, "library %u and header %u disagree\n", fd_version(), FLASHDIFF_VERSION);
    return 1;
  }
  request reqs[REQUESTS] = {
      {1, {"a", "red", "circle", "top", "left", "on", "a", "blue"}, 8, 1, 1, 5, 0, 0, 0, 0, 0},
      {2, {"a", "green", "square", "bottom", "right", NULL, NULL, NULL}, 5, 10, 10, 4, 0, 0, 0, 0, 0},
      {3, {"the", "yellow", "cross", "in", "the", "center", NULL, NULL}, 6, 6, 6, 4, 0, 0, 0, 0, 0},
  };
  fd_scheduler_config scfg = fd_scheduler_config_default();
  scfg.workers = WORKERS;
  fd_scheduler *s = NULL;
  CHECK(fd_scheduler_new(&scfg, &s));
  for (int i = 0; i < REQUESTS; i++)
    CHECK(fd_scheduler_submit(s, reqs[i].id, (uint8_t)(i == 2 ? 5 : 1), 1.0));

  int finished = 0;
  while (finished < REQUESTS) {
    for (uint32_t w = 0; w < WORKERS; w++) {
      fd_assignment a;
      bool has = false;
      CHECK(fd_scheduler_next(s, w, &a, &has));
      if (!has) continue;
      request *r = NULL;
      for (int i = 0; i < REQUESTS; i++)
        if (reqs[i].id == a.tag.request) r = &reqs[i];
      /* "Run" the monotask, then report it. */
      if (a.tag.patch != FD_WARMUP_PATCH)
        CHECK(fd_gate_observe(r->gate, a.tag.patch, fake_importance(r, a.tag.patch, a.tag.step)));
      fd_completion c;
      CHECK(fd_scheduler_complete(s, w, a.tag, &c));
      if (c == FD_COMPLETION_WARMUP_DONE) {
        after_warmup(r);
        open_step(s, r);
      } else if (c == FD_COMPLETION_STEP_DONE) {
        if (r->step + 1 < STEPS) {
          open_step(s, r);
        } else {
          CHECK(fd_scheduler_finish(s, r->id));
          r->done = 1;
          finished++;
        }
      }
    }
  }
  unsigned long total = 0, computed = 0;
  for (int i = 0; i < REQUESTS; i++) {
    unsigned long all = (unsigned long)(STEPS - WARMUP_STEPS) * PATCHES;
    printf("request %llu: %lu of %lu patch-steps computed (%.0f%% skipped)\n",
           (unsigned long long)reqs[i].id, reqs[i].patch_steps, all,
           100.0 * (double)(all - reqs[i].patch_steps) / (double)all);
    total += all;
    computed += reqs[i].patch_steps;
    fd_gate_free(&reqs[i].gate);
    fd_layout_free(&reqs[i].layout);
  }
  fd_load load;
  CHECK(fd_scheduler_load(s, &load));
  fd_scheduler_free(&s);
  printf("all requests: %lu of %lu patch-steps computed; %zu requests left admitted\n", computed,
         total, load.requests);
  return computed < total && load.requests == 0 ? 0 : 1;
}
