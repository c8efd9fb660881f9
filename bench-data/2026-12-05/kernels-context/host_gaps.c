// Two threads spin reading the clock; each gap over 5 ms (the thread did not run) is printed with its start.
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static double t0, seconds;
static void *spin(void *arg) {
    long id = (long)arg; double last = now(), total = 0; int n = 0;
    while (last - t0 < seconds) {
        double t = now();
        if (t - last > 0.005) { printf("thread %ld gap %.1f ms at %.3f s\n", id, (t - last) * 1e3, last - t0); total += t - last; n++; }
        last = t;
    }
    printf("thread %ld: %d gaps, %.0f ms of %.0f s\n", id, n, total * 1e3, seconds);
    return NULL;
}
int main(int argc, char **argv) {
    seconds = argc > 1 ? atof(argv[1]) : 10; int threads = argc > 2 ? atoi(argv[2]) : 2;
    pthread_t th[8]; t0 = now();
    for (long i = 0; i < threads; i++) pthread_create(&th[i], NULL, spin, (void *)i);
    for (int i = 0; i < threads; i++) pthread_join(th[i], NULL);
    return 0;
}
