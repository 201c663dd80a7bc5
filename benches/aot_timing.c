/* Times one ahead-of-time compiled model for benches/aot.rs. Built with -DMODEL=name
 * -DNIN=inputs -DNOUT=outputs -DSCRATCH=bytes; `timing N [IN0.bin ...]` runs it N times
 * with one scratch buffer and prints the median nanoseconds of a call, on the inputs' raw
 * bytes read from the files (the bench writes them) or, without files, on f32 inputs
 * 1/(1 + j mod 7); with no argument it makes one call and exits (the bench times the whole
 * process). */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define CAT2(a, b) a##b
#define CAT(a, b) CAT2(a, b)

extern const size_t CAT(MODEL, _input_bytes)[];
extern const size_t CAT(MODEL, _output_bytes)[];
int CAT(MODEL, _run)(const void *const *inputs, void *const *outputs, void *scratch, size_t bytes);

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    const void *ins[NIN + 1];
    void *outs[NOUT + 1];
    for (int i = 0; i < NIN; i++) {
        size_t bytes = CAT(MODEL, _input_bytes)[i];
        float *x = malloc(bytes + 1);
        if (argc > 2 + i) {
            FILE *f = fopen(argv[2 + i], "rb");
            if (!f || fread(x, 1, bytes, f) != bytes) return 2;
            fclose(f);
        } else {
            for (size_t j = 0; j < bytes / sizeof(float); j++) x[j] = 1.0f / (float)(1 + j % 7);
        }
        ins[i] = x;
    }
    for (int i = 0; i < NOUT; i++) outs[i] = malloc(CAT(MODEL, _output_bytes)[i] + 1);
    void *scratch = malloc(SCRATCH + 16);
    int n = argc > 1 ? atoi(argv[1]) : 0;
    if (n <= 0) return CAT(MODEL, _run)(ins, outs, scratch, SCRATCH);
    double *t = malloc(sizeof(double) * (size_t)n);
    for (int i = 0; i < n; i++) {
        struct timespec a, b;
        clock_gettime(CLOCK_MONOTONIC, &a);
        if (CAT(MODEL, _run)(ins, outs, scratch, SCRATCH) != 0) return 1;
        clock_gettime(CLOCK_MONOTONIC, &b);
        t[i] = (double)(b.tv_sec - a.tv_sec) * 1e9 + (double)(b.tv_nsec - a.tv_nsec);
    }
    qsort(t, (size_t)n, sizeof(double), cmp);
    printf("%.0f\n", t[n / 2]);
    return 0;
}
