/*
 * triad: the memory-bound job of bench/run's `interference` experiment.
 *
 *   triad SECONDS [MIB_PER_ARRAY [INTERVAL_MS]]
 *   triad --spin SECONDS
 *
 * Three arrays of doubles, each MIB_PER_ARRAY MiB (default 64), far larger than the last-level
 * cache so that every pass goes to DRAM; each thread repeats a[i] = b[i] + s * c[i] over its own
 * slice until SECONDS have passed (0: until SIGTERM or SIGINT). One thread per CPU the process
 * may run on (taskset picks them), each pinned to its CPU, so the job's own threads never
 * migrate. Bandwidth is counted as STREAM counts a triad: 24 bytes per element (two 8-byte
 * loads, one 8-byte store; the store's write-allocate read is not counted).
 *
 * Output, one line each, flushed at once so the harness reads them as they come:
 *   ready threads=N array_mib=M interval_ms=I      arrays allocated and touched; timing starts
 *   sample T0 T1 MB_PER_S                          every INTERVAL_MS (default 100): the bandwidth
 *                                                  between two wall-clock instants (CLOCK_REALTIME,
 *                                                  seconds since the epoch, so the harness can
 *                                                  match them with fio's report), 10^6 bytes/s
 *   total SECONDS MB_PER_S CHECKSUM                the whole run, at the end
 *
 * SIGSTOP/SIGCONT may pause it: the sample spanning the pause shows the loss; the harness only
 * uses samples that lie wholly inside its measurement windows.
 *
 * --spin is the control load: one thread per CPU of the process, each pinned, each running a
 * chain of multiplications in registers, with no memory traffic at all. Whatever it costs a
 * triad on other cores is not memory contention (a hypervisor that time-slices or overcommits
 * vCPUs, SMT siblings, a shared power budget); the harness reads the I/O rows above it.
 * It prints "ready spin threads=N", then "total SECONDS spin" at the end.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define BYTES_PER_ELEMENT 24.0
/* Elements done between two counter updates: 512 KiB of each array, small next to a 100 ms
 * sample (thousands of updates), large enough that the atomic add costs nothing. */
#define CHUNK_ELEMENTS (1 << 16)
#define MAX_THREADS 1024

struct counter {
    _Atomic uint64_t elements;
    char pad[64 - sizeof(uint64_t)]; /* one cache line each: no false sharing between threads */
};

struct worker {
    pthread_t thread;
    int cpu;
    size_t lo, hi;
};

static double *a, *b, *c;
static struct counter counters[MAX_THREADS];
static struct worker workers[MAX_THREADS];
static pthread_barrier_t ready;
static atomic_int stop_flag;
static volatile sig_atomic_t signalled;

static void on_signal(int sig) {
    (void)sig;
    signalled = 1;
    atomic_store(&stop_flag, 1);
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static uint64_t elements_done(int threads) {
    uint64_t sum = 0;
    for (int t = 0; t < threads; t++)
        sum += atomic_load_explicit(&counters[t].elements, memory_order_relaxed);
    return sum;
}

static void pin_self(int cpu) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    pthread_setaffinity_np(pthread_self(), sizeof set, &set);
}

static void *work(void *arg) {
    struct worker *w = arg;
    int index = (int)(w - workers);
    pin_self(w->cpu);
    /* First touch from the thread that will use the slice: its pages land on its NUMA node. */
    for (size_t i = w->lo; i < w->hi; i++) {
        a[i] = 0.0;
        b[i] = 1.0;
        c[i] = 2.0;
    }
    pthread_barrier_wait(&ready);
    const double s = 3.0;
    while (!atomic_load_explicit(&stop_flag, memory_order_relaxed)) {
        for (size_t lo = w->lo; lo < w->hi; lo += CHUNK_ELEMENTS) {
            size_t hi = lo + CHUNK_ELEMENTS < w->hi ? lo + CHUNK_ELEMENTS : w->hi;
            for (size_t i = lo; i < hi; i++)
                a[i] = b[i] + s * c[i];
            /* The compiler must not merge or drop passes that store the same values again. */
            __asm__ volatile("" ::: "memory");
            atomic_fetch_add_explicit(&counters[index].elements, hi - lo, memory_order_relaxed);
            if (atomic_load_explicit(&stop_flag, memory_order_relaxed))
                break;
        }
    }
    return NULL;
}

static _Atomic uint64_t spin_sink; /* keeps the spin loop's result alive */

static void *spin(void *arg) {
    struct worker *w = arg;
    pin_self(w->cpu);
    pthread_barrier_wait(&ready);
    uint64_t x = (uint64_t)w->cpu + 1;
    while (!atomic_load_explicit(&stop_flag, memory_order_relaxed))
        for (int i = 0; i < (1 << 20); i++)
            x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    atomic_fetch_add(&spin_sink, x);
    return NULL;
}

/* The CPUs this process may use, in order; one worker each. */
static int job_cpus(int *cpus) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) != 0) {
        cpus[0] = 0;
        return 1;
    }
    int n = 0;
    for (int cpu = 0; cpu < CPU_SETSIZE && n < MAX_THREADS; cpu++)
        if (CPU_ISSET(cpu, &set))
            cpus[n++] = cpu;
    return n;
}

static double *alloc_array(size_t elements) {
    void *p = NULL;
    if (posix_memalign(&p, 2 << 20, elements * sizeof(double)) != 0) {
        fprintf(stderr, "triad: cannot allocate %zu MiB\n", (elements * sizeof(double)) >> 20);
        exit(1);
    }
    return p;
}

static void sleep_until(double t) {
    struct timespec ts;
    ts.tv_sec = (time_t)t;
    ts.tv_nsec = (long)((t - (double)ts.tv_sec) * 1e9);
    while (!signalled && clock_nanosleep(CLOCK_REALTIME, TIMER_ABSTIME, &ts, NULL) == EINTR)
        ;
}

static void start_workers(int threads, size_t n, const int *cpus, void *(*fn)(void *)) {
    pthread_barrier_init(&ready, NULL, (unsigned)threads + 1);
    for (int t = 0; t < threads; t++) {
        workers[t].cpu = cpus[t];
        workers[t].lo = n * (size_t)t / (size_t)threads;
        workers[t].hi = n * (size_t)(t + 1) / (size_t)threads;
        if (pthread_create(&workers[t].thread, NULL, fn, &workers[t]) != 0) {
            fprintf(stderr, "triad: cannot start thread %d\n", t);
            exit(1);
        }
    }
    pthread_barrier_wait(&ready);
}

/* Print a sample every interval until the end (or a signal); returns the last instant. */
static double sample_loop(int threads, double start, uint64_t e0, double seconds,
                          double interval) {
    double t0 = start, end = seconds > 0 ? start + seconds : 0;
    while (!signalled) {
        double next = t0 + interval;
        if (end && next > end)
            next = end;
        sleep_until(next);
        double t1 = now();
        uint64_t e1 = elements_done(threads);
        if (t1 > t0)
            printf("sample %.6f %.6f %.1f\n", t0, t1, (e1 - e0) * BYTES_PER_ELEMENT / (t1 - t0) / 1e6);
        fflush(stdout);
        t0 = t1;
        e0 = e1;
        if (end && t1 >= end)
            break;
    }
    return t0;
}

static void stop_workers(int threads) {
    atomic_store(&stop_flag, 1);
    for (int t = 0; t < threads; t++)
        pthread_join(workers[t].thread, NULL);
}

static int spin_main(double seconds, int threads, const int *cpus) {
    start_workers(threads, 0, cpus, spin);
    printf("ready spin threads=%d\n", threads);
    fflush(stdout);
    double start = now();
    /* Wake every 100 ms: the signal may land on a worker thread, not on this one. */
    while (!signalled && (seconds == 0 || now() < start + seconds))
        sleep_until(seconds > 0 && start + seconds < now() + 0.1 ? start + seconds : now() + 0.1);
    stop_workers(threads);
    printf("total %.3f spin\n", now() - start);
    fflush(stdout);
    return 0;
}

static int usage(void) {
    fprintf(stderr, "usage: triad SECONDS [MIB_PER_ARRAY [INTERVAL_MS]]\n"
                    "       triad --spin SECONDS\n"
                    "SECONDS >= 0 (0: until SIGTERM), MIB_PER_ARRAY >= 1, INTERVAL_MS >= 1\n");
    return 2;
}

int main(int argc, char **argv) {
    int spinning = argc > 1 && strcmp(argv[1], "--spin") == 0;
    argv += spinning;
    argc -= spinning;
    if (argc < 2 || argc > (spinning ? 2 : 4))
        return usage();
    double seconds = atof(argv[1]);
    long mib = argc > 2 ? atol(argv[2]) : 64;
    long interval_ms = argc > 3 ? atol(argv[3]) : 100;
    if (seconds < 0 || mib < 1 || interval_ms < 1)
        return usage();
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal; /* no SA_RESTART: the sleep returns, the loop sees the flag */
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);

    static int cpus[MAX_THREADS];
    int threads = job_cpus(cpus);
    if (spinning)
        return spin_main(seconds, threads, cpus);
    size_t n = (size_t)mib << 20 >> 3;
    a = alloc_array(n);
    b = alloc_array(n);
    c = alloc_array(n);
    start_workers(threads, n, cpus, work);

    printf("ready threads=%d array_mib=%ld interval_ms=%ld\n", threads, mib, interval_ms);
    fflush(stdout);
    double start = now();
    uint64_t e0 = elements_done(threads);
    double last = sample_loop(threads, start, e0, seconds, interval_ms / 1000.0);
    uint64_t total = elements_done(threads) - e0;
    stop_workers(threads);
    double checksum = a[0] + a[n / 2] + a[n - 1];
    printf("total %.3f %.1f %.1f\n", last - start,
           last > start ? total * BYTES_PER_ELEMENT / (last - start) / 1e6 : 0.0, checksum);
    fflush(stdout);
    return 0;
}
