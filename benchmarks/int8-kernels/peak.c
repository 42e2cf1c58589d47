/* One core's peak for the three dot-product instructions mlc's CPU kernels use: a loop of 24 independent
   instructions on zmm8-zmm31 (more accumulators than latency x throughput needs), operands in zmm0/zmm1, in
   inline assembly so the compiler cannot spill or drop them. Prints ops/s (a multiply-add counts 2):
   vpdpbusd 16 lanes x 4 MACs, vdpbf16ps 16 x 2, vfmadd231ps 16 x 1. The best of 50 short runs (~8 ms each): on a
   shared machine a long run is interrupted and reads low.
   gcc -O2 -mavx512f peak.c -o peak && ./peak */
#include <stdio.h>
#include <time.h>

#define ITERS 1000000L
#define RUNS 50
#define R(op, n) op " %%zmm1, %%zmm0, %%zmm" #n "\n\t"
#define BODY(op) R(op, 8) R(op, 9) R(op, 10) R(op, 11) R(op, 12) R(op, 13) R(op, 14) R(op, 15) R(op, 16) \
    R(op, 17) R(op, 18) R(op, 19) R(op, 20) R(op, 21) R(op, 22) R(op, 23) R(op, 24) R(op, 25) R(op, 26)   \
    R(op, 27) R(op, 28) R(op, 29) R(op, 30) R(op, 31)
#define CLOBBER "xmm0", "xmm1", "xmm8", "xmm9", "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15", "xmm16", \
    "xmm17", "xmm18", "xmm19", "xmm20", "xmm21", "xmm22", "xmm23", "xmm24", "xmm25", "xmm26", "xmm27", "xmm28", \
    "xmm29", "xmm30", "xmm31"

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

#define RUN(op, ops_per_instruction)                                                                \
    {                                                                                               \
        double best = 1e30;                                                                         \
        for (int run = 0; run < RUNS; run++) {                                                      \
            double t0 = now();                                                                      \
            for (long i = 0; i < ITERS; i++) __asm__ volatile(BODY(op) ::: CLOBBER);                \
            double t = now() - t0;                                                                  \
            best = t < best ? t : best;                                                             \
        }                                                                                           \
        printf("%s %.4g\n", op, (double)ITERS * 24 * (ops_per_instruction) / best);                \
    }

int main(void) {
    __asm__ volatile("vpxord %%zmm0, %%zmm0, %%zmm0\n\tvpxord %%zmm1, %%zmm1, %%zmm1" ::: "xmm0", "xmm1");
    RUN("vpdpbusd", 16 * 4 * 2);
    RUN("vdpbf16ps", 16 * 2 * 2);
    RUN("vfmadd231ps", 16 * 2);
    return 0;
}
