/* A small pthread pool: the calling thread and up to (threads - 1) workers share the items of
 * one job, each taking the next item from an atomic counter.
 *
 * Why not OpenMP: libgomp's spinning workers fight numpy's OpenBLAS threads (a step measured
 * at 11 ms took 164 ms).  Why dynamic items and a caller that works too: when another process
 * holds a core, a worker that is not scheduled simply takes no item and the caller does the
 * rest, so a busy machine costs speed in proportion, never a stall on a sleeping thread.
 * After a job a worker spins for a short while (SPIN_US, 100 us; OPTCLI_POOL_SPIN_US overrides,
 * 0 turns it off) before it sleeps on a condition variable: on the VMs we measure, waking a
 * sleeping thread takes tens of microseconds, as long as a whole depthwise layer, and a model's
 * native steps follow each other a few microseconds apart.  Measured (2 threads, minimum of 20
 * runs): a 14x14 depthwise layer 43 -> 29 us, MobileNetV2 8.5 -> 6.4 ms, the mediapipe hand
 * landmark model 5.6 -> 4.2 ms.  The spin is bounded, so a BLAS call between native steps (the
 * transformers' MatMuls) waits at most that long for the core; onnxruntime's pool spins too.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <time.h>
#include <unistd.h>
#include <stdlib.h>

#include "optcli_native.h"

#define MAX_THREADS 64
#define SPIN_US 100 /* a worker's spin after a job, before it sleeps (see the top of this file) */

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t wake;
    int started;            /* workers created */
    int64_t spin_ns;        /* how long a worker spins after a job (set before the first worker starts) */
    pthread_t tid[MAX_THREADS];
    uint32_t born[MAX_THREADS]; /* the generation when each worker was created: its first job is the next */
    /* the current job: written by the caller under mu, before the generation is published */
    opt_item_fn fn;
    void *ctx;
    int64_t nitems;
    int helpers;            /* workers that may take part (threads - 1) */
    /* (generation << 32) | next item: one word, so a late worker cannot take an item of the
     * next job with the previous job's context */
    _Atomic uint64_t cursor;
    _Atomic int64_t done;   /* items finished in this job */
    _Atomic uint32_t generation;
} pool_t;

static pool_t P = {.mu = PTHREAD_MUTEX_INITIALIZER, .wake = PTHREAD_COND_INITIALIZER};
static _Atomic int g_threads = 0; /* 0: not yet set, use the CPUs this process may run on */
static pthread_mutex_t g_run_mu = PTHREAD_MUTEX_INITIALIZER; /* one job at a time */

static int default_threads(void) {
#ifdef __linux__
    cpu_set_t set; /* the CPUs this process may run on (taskset, cgroups' cpusets) */
    if (sched_getaffinity(0, sizeof set, &set) == 0) {
        int n = CPU_COUNT(&set);
        if (n > 0) return n < MAX_THREADS ? n : MAX_THREADS;
    }
#endif
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : (n < MAX_THREADS ? (int)n : MAX_THREADS);
}

OPT_API int optcli_get_num_threads(void) {
    int n = atomic_load(&g_threads);
    return n > 0 ? n : default_threads();
}

OPT_API int optcli_set_num_threads(int n) {
    int old = optcli_get_num_threads();
    if (n < 1) n = 1;
    if (n > MAX_THREADS) n = MAX_THREADS;
    atomic_store(&g_threads, n);
    return old;
}

/* Take items of generation gen until none is left; returns how many were done. */
static int64_t take_items(uint32_t gen, opt_item_fn fn, void *ctx, int64_t nitems) {
    int64_t mine = 0;
    uint64_t cur = atomic_load(&P.cursor);
    for (;;) {
        if ((uint32_t)(cur >> 32) != gen) break;
        int64_t item = (int64_t)(cur & 0xffffffffu);
        if (item >= nitems) break;
        if (!atomic_compare_exchange_weak(&P.cursor, &cur, cur + 1)) continue;
        fn(ctx, item);
        mine++;
        cur = atomic_load(&P.cursor);
    }
    return mine;
}

/* A spin-wait hint: the core's other hyperthread (if any) gets the cycles. */
static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static int64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

/* Spin until a job newer than `seen` is published or P.spin_ns has passed (the clock is read
 * every 64 pauses: a pause is tens of cycles, a clock read through the vDSO about as much).
 * Every 16 pauses the worker yields its CPU: on a quiet machine sched_yield returns at once (no
 * measurable cost), and on a busy one the processes waiting for this CPU (or the caller itself)
 * run instead of the spin.  Without it, on a machine kept busy by two compilers, MobileNetV2's
 * median runs with spinning workers were 1.3-1.9x those with sleeping ones. */
static void spin_for_job(uint32_t seen) {
    if (P.spin_ns <= 0) return;
    int64_t end = now_ns() + P.spin_ns;
    for (unsigned i = 1; atomic_load(&P.generation) == seen; i++) {
        cpu_relax();
        if (i % 16 == 0) sched_yield();
        if (i % 64 == 0 && now_ns() > end) return;
    }
}

static void *worker(void *arg) {
    int id = (int)(intptr_t)arg;
    pthread_mutex_lock(&P.mu);
    /* not the generation now: the job that created this worker may already be published */
    uint32_t seen = P.born[id];
    pthread_mutex_unlock(&P.mu);
    for (;;) {
        spin_for_job(seen);
        pthread_mutex_lock(&P.mu);
        while (atomic_load(&P.generation) == seen) pthread_cond_wait(&P.wake, &P.mu);
        /* the newest job, read with its generation: the caller publishes both under mu */
        uint32_t gen = seen = atomic_load(&P.generation);
        opt_item_fn fn = P.fn;
        void *ctx = P.ctx;
        int64_t nitems = P.nitems;
        int helpers = P.helpers;
        pthread_mutex_unlock(&P.mu);
        if (id >= helpers || fn == NULL) continue;
        int64_t n = take_items(gen, fn, ctx, nitems);
        if (n) atomic_fetch_add(&P.done, n);
    }
    return NULL;
}

static void after_fork_child(void) {
    /* threads do not survive fork: start over with none */
    pthread_mutex_init(&P.mu, NULL);
    pthread_cond_init(&P.wake, NULL);
    pthread_mutex_init(&g_run_mu, NULL);
    P.started = 0; /* a job then runs on the caller alone until new workers start */
}

static void register_fork_handler(void) { pthread_atfork(NULL, NULL, after_fork_child); }

static int start_workers(int want) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, register_fork_handler);
    if (want > MAX_THREADS - 1) want = MAX_THREADS - 1;
    if (P.started == 0) {
        const char *env = getenv("OPTCLI_POOL_SPIN_US");
        long us = env && *env ? atol(env) : SPIN_US;
        P.spin_ns = us > 0 ? (int64_t)(us < 1000000 ? us : 1000000) * 1000 : 0;
    }
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 256 * 1024);
    while (P.started < want) {
        P.born[P.started] = atomic_load(&P.generation);
        if (pthread_create(&P.tid[P.started], &attr, worker, (void *)(intptr_t)P.started) != 0) break;
        pthread_detach(P.tid[P.started]);
#ifdef __linux__
        pthread_setname_np(P.tid[P.started], "optcli-pool"); /* for top -H, perf and the tests */
#endif
        P.started++;
    }
    pthread_attr_destroy(&attr);
    return P.started;
}

OPT_API int optcli_pool_workers(void) { return P.started; }

void opt_parallel(opt_item_fn fn, void *ctx, int64_t nitems, int max_threads) {
    if (nitems <= 0) return;
    int threads = optcli_get_num_threads();
    if (max_threads > 0 && threads > max_threads) threads = max_threads;
    if ((int64_t)threads > nitems) threads = (int)nitems;
    if (threads <= 1 || nitems > 0xffffffffLL) {
        for (int64_t i = 0; i < nitems; i++) fn(ctx, i);
        return;
    }
    if (pthread_mutex_trylock(&g_run_mu) != 0) {
        /* another thread's job holds the pool (two predictors run at once): run this one here */
        for (int64_t i = 0; i < nitems; i++) fn(ctx, i);
        return;
    }
    pthread_mutex_lock(&P.mu);
    int helpers = start_workers(threads - 1);
    if (helpers > threads - 1) helpers = threads - 1; /* workers started for a larger pool sit out */
    uint32_t gen = atomic_load(&P.generation) + 1;
    P.fn = fn;
    P.ctx = ctx;
    P.nitems = nitems;
    P.helpers = helpers;
    atomic_store(&P.done, 0);
    atomic_store(&P.cursor, (uint64_t)gen << 32);
    atomic_store(&P.generation, gen);
    pthread_cond_broadcast(&P.wake);
    pthread_mutex_unlock(&P.mu);

    int64_t mine = take_items(gen, fn, ctx, nitems);
    /* wait only for items a worker actually took: idle or unscheduled workers are not waited for */
    int64_t target = nitems - mine;
    for (unsigned spin = 0; atomic_load(&P.done) < target; spin++) {
        if (spin < 2000) {
            cpu_relax();
        } else {
            sched_yield();
        }
    }
    pthread_mutex_lock(&P.mu);
    P.fn = NULL; /* a worker waking late finds no job */
    pthread_mutex_unlock(&P.mu);
    pthread_mutex_unlock(&g_run_mu);
}

/* For the tests: a job of nitems items that each sleep sleep_us and then count themselves, so that
 * workers certainly take some.  Returns how many items had finished when opt_parallel returned
 * (all of them, or the caller did not wait); stats[0] gets how many the calling thread ran,
 * stats[1] the most items that ran at once (the threads that took part). */
typedef struct {
    pthread_t caller;
    _Atomic int64_t finished, by_caller, running, most;
    int sleep_us;
} selftest_t;

static void selftest_item(void *ctx, int64_t item) {
    selftest_t *t = ctx;
    (void)item;
    int64_t now = atomic_fetch_add(&t->running, 1) + 1, most = atomic_load(&t->most);
    while (now > most && !atomic_compare_exchange_weak(&t->most, &most, now)) {
    }
    struct timespec ts = {0, (long)t->sleep_us * 1000L};
    nanosleep(&ts, NULL);
    atomic_fetch_sub(&t->running, 1);
    if (pthread_equal(pthread_self(), t->caller)) atomic_fetch_add(&t->by_caller, 1);
    atomic_fetch_add(&t->finished, 1);
}

OPT_API int64_t optcli_pool_selftest(int64_t nitems, int sleep_us, int64_t *stats) {
    selftest_t t = {.caller = pthread_self(), .sleep_us = sleep_us};
    opt_parallel(selftest_item, &t, nitems, 0);
    int64_t done = atomic_load(&t.finished);
    stats[0] = atomic_load(&t.by_caller);
    stats[1] = atomic_load(&t.most);
    /* the caller may have returned early (a bug the tests look for): let stragglers finish
     * before t goes out of scope */
    while (atomic_load(&t.finished) < nitems) sched_yield();
    return done;
}

int opt_cpu_has_avx512(void) {
#if defined(__x86_64__)
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
           __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("fma");
#else
    return 0;
#endif
}
