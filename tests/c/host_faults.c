/* A C host written from the header alone, with SIGPIPE left at its default action (a write
 * to a dead pipe would kill it): worker processes killed between runs, the only worker
 * dead, a worker executable that exits at once (with SIGPIPE default and ignored), sizes at
 * their limits, bad loads, and the library's messages going to the log callback only.
 * Usage: host_faults WEIGHTS FLASHDIFF_EXE EXITS_AT_ONCE_EXE
 * Prints "host ok" and the number of log lines; exits non-zero on any failed check. */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include "flashdiff.h"

static int failed = 0;
#define EXPECT(cond)                                                 \
  do {                                                               \
    if (!(cond)) {                                                   \
      char msg_[512];                                                \
      fd_last_error_detail(msg_, sizeof msg_);                       \
      printf("FAILED line %d: %s (%s)\n", __LINE__, #cond, msg_);    \
      failed++;                                                      \
    }                                                                \
  } while (0)

static int log_lines = 0;
static void on_log(void *user, uint32_t level, const char *message) {
  (void)user;
  if (level >= 1 && level <= 3 && message && message[0]) log_lines++;
}

/* Kills (SIGKILL) up to `max` child processes of this process; returns how many. */
static int kill_children(int max) {
  DIR *d = opendir("/proc");
  int n = 0;
  if (!d) return 0;
  struct dirent *ent;
  while ((ent = readdir(d)) && n < max) {
    char path[300], buf[512];
    long pid = strtol(ent->d_name, NULL, 10);
    if (pid <= 0) continue;
    snprintf(path, sizeof path, "/proc/%ld/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f) continue;
    size_t got = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[got] = 0;
    char *close_paren = strrchr(buf, ')');
    if (!close_paren) continue;
    char state;
    long ppid;
    if (sscanf(close_paren + 1, " %c %ld", &state, &ppid) != 2) continue;
    if (ppid == (long)getpid() && state != 'Z') {
      if (kill((pid_t)pid, SIGKILL) == 0) n++;
    }
  }
  closedir(d);
  return n;
}

static void pause_briefly(void) {
  struct timespec ts = {0, 100000000L};
  nanosleep(&ts, NULL);
}

static fd_request_config small(uint64_t seed) {
  fd_request_config rc = fd_request_config_default();
  rc.steps = 8;
  rc.warmup = 2;
  rc.patches = 4;
  rc.seed = seed;
  return rc;
}

/* Submits `n` requests from `first`, runs, and returns how many finished. */
static int run_batch(const fd_engine *e, uint64_t first, int n) {
  const char *prompt = "a red circle top left on a white background";
  for (int i = 0; i < n; i++) {
    fd_request_config rc = small(first + (uint64_t)i);
    EXPECT(fd_engine_submit(e, first + (uint64_t)i, prompt, &rc) == FD_OK);
  }
  EXPECT(fd_engine_run(e) == FD_OK);
  int done = 0;
  for (int i = 0; i < n; i++) {
    fd_request_state st = FD_REQUEST_UNKNOWN;
    EXPECT(fd_engine_poll(e, first + (uint64_t)i, &st) == FD_OK);
    if (st == FD_REQUEST_DONE) done++;
    fd_engine_release(e, first + (uint64_t)i);
  }
  return done;
}

int main(int argc, char **argv) {
  if (argc < 4) {
    fprintf(stderr, "usage: %s WEIGHTS FLASHDIFF_EXE EXITS_AT_ONCE_EXE\n", argv[0]);
    return 2;
  }
  alarm(240); /* a hang is a failure, not a stuck test */

  /* 1. A worker killed between runs, with two workers: nothing lost, no SIGPIPE. */
  fd_engine_config ec = fd_engine_config_default();
  ec.weights = argv[1];
  ec.workers = 2;
  ec.processes = true;
  ec.worker_exe = argv[2];
  fd_engine *e = NULL;
  EXPECT(fd_engine_new(&ec, &e) == FD_OK);
  if (!e) return 1;
  EXPECT(run_batch(e, 1, 2) == 2);
  EXPECT(kill_children(1) == 1);
  pause_briefly();
  EXPECT(run_batch(e, 10, 3) == 3);
  /* Both killed between runs. */
  EXPECT(kill_children(8) == 2);
  pause_briefly();
  EXPECT(run_batch(e, 20, 2) == 2);
  fd_engine_free(&e);
  int silent_lines = log_lines;

  /* 2. The only worker dead, now with the log callback set: its loss is a log line. */
  EXPECT(fd_set_log_callback(on_log, NULL) == FD_OK);
  ec.workers = 1;
  EXPECT(fd_engine_new(&ec, &e) == FD_OK);
  if (!e) return 1;
  EXPECT(run_batch(e, 1, 1) == 1);
  EXPECT(kill_children(1) == 1);
  pause_briefly();
  EXPECT(run_batch(e, 2, 2) == 2);
  fd_engine_free(&e);
  EXPECT(log_lines > silent_lines);
  EXPECT(fd_set_log_callback(NULL, NULL) == FD_OK);

  /* 3. A worker executable that exits at once: an error from the run, soon, not a storm;
   *    first with SIGPIPE at its default, then ignored. */
  for (int round = 0; round < 2; round++) {
    if (round == 1) signal(SIGPIPE, SIG_IGN);
    ec.workers = 2;
    ec.worker_exe = argv[3];
    e = NULL;
    fd_status st = fd_engine_new(&ec, &e);
    if (st == FD_OK) {
      EXPECT(run_batch(e, 1, 2) == 0);
      EXPECT(run_batch(e, 5, 1) == 0); /* a later request: another bounded try */
      fd_engine_free(&e);
    } else {
      EXPECT(st == FD_ERR_CONFIG);
    }
  }
  signal(SIGPIPE, SIG_DFL);

  /* 4. Sizes have bounds: errors, not an abort on allocation. */
  fd_gate *g = NULL;
  EXPECT(fd_gate_new(4294967295u, NULL, &g) == FD_ERR_PATCH_COUNT && g == NULL);
  EXPECT(fd_gate_new(1u << 21, NULL, &g) == FD_ERR_PATCH_COUNT && g == NULL);
  EXPECT(fd_gate_new(1000, NULL, &g) == FD_OK);
  fd_gate_free(&g);
  fd_scheduler_config sc = fd_scheduler_config_default();
  sc.workers = 4294967295u;
  fd_scheduler *s = NULL;
  EXPECT(fd_scheduler_new(&sc, &s) == FD_ERR_CONFIG && s == NULL);
  sc = fd_scheduler_config_default();
  sc.max_requests = (size_t)-1;
  EXPECT(fd_scheduler_new(&sc, &s) == FD_ERR_CONFIG && s == NULL);
  sc = fd_scheduler_config_default();
  sc.max_attempts = 4294967295u;
  EXPECT(fd_scheduler_new(&sc, &s) == FD_ERR_CONFIG && s == NULL);

  fd_layout *layout = NULL;
  EXPECT(fd_partition_uniform(1, 65535, 65535, 4, &layout) == FD_ERR_GRID && layout == NULL);
  EXPECT(fd_partition_uniform(1, 4096, 4097, 4, &layout) == FD_ERR_GRID && layout == NULL);

  /* 5. Loads must be finite and >= 0. */
  float eps = -1;
  EXPECT(fd_load_epsilon_for(NULL, NAN, &eps) == FD_ERR_VALUE);
  EXPECT(fd_load_epsilon_for(NULL, -1.0f, &eps) == FD_ERR_VALUE);
  EXPECT(fd_load_epsilon_for(NULL, INFINITY, &eps) == FD_ERR_VALUE);
  EXPECT(fd_load_epsilon_for(NULL, 1.0f, &eps) == FD_OK && eps > 0 && eps <= 1);

  /* 6. A poison run of the scheduler: the third loss of a running monotask fails it. */
  sc = fd_scheduler_config_default();
  sc.workers = 1;
  sc.max_attempts = 3;
  EXPECT(fd_scheduler_new(&sc, &s) == FD_OK);
  if (s) {
    EXPECT(fd_scheduler_submit(s, 7, 0, 1.0) == FD_OK);
    uint32_t w = 0;
    for (int i = 0; i < 3; i++) {
      fd_assignment a;
      bool has = false;
      EXPECT(fd_scheduler_next(s, w, &a, &has) == FD_OK && has);
      fd_lost lost;
      EXPECT(fd_scheduler_lose_worker(s, w, &lost) == FD_OK);
      EXPECT(lost.request_failed == (i == 2));
      if (i == 2) EXPECT(lost.failed_request == 7);
      EXPECT(fd_scheduler_add_worker(s, &w) == FD_OK);
    }
    fd_scheduler_free(&s);
  }

  printf("log lines: %d\n", log_lines);
  if (failed)
    printf("host FAILED (%d)\n", failed);
  else
    printf("host ok\n");
  return failed ? 1 : 0;
}
