/* A generic driver of one ahead-of-time compiled model, for tests/aot.rs. Built with
 * -DMODEL=name -DNIN=inputs -DNOUT=outputs -DSCRATCH=bytes; run as
 *   driver IN0.bin .. OUT0.bin ..
 * It reads each input's bytes, runs the model with a scratch of the stated size, writes
 * each output's bytes, then prints the result codes of calls with bad arguments. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CAT2(a, b) a##b
#define CAT(a, b) CAT2(a, b)

extern const size_t CAT(MODEL, _input_bytes)[];
extern const size_t CAT(MODEL, _output_bytes)[];
int CAT(MODEL, _run)(const void *const *inputs, void *const *outputs, void *scratch, size_t bytes);
const char *CAT(MODEL, _error_string)(int code);

static void *read_file(const char *path, size_t want) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    void *p = malloc(want > 0 ? want : 1);
    size_t got = fread(p, 1, want, f);
    int extra = fgetc(f);
    fclose(f);
    if (got != want || extra != EOF) {
        fprintf(stderr, "%s: expected %zu bytes\n", path, want);
        exit(3);
    }
    return p;
}

/* One of several threads calling the model at once, each with its own outputs and scratch. */
struct job {
    const void *const *ins;
    void *outs[NOUT + 1];
    int rc;
};

static void *call(void *arg) {
    struct job *j = arg;
    void *scratch = malloc(SCRATCH > 0 ? SCRATCH : 1);
    for (int rep = 0; rep < 20 && j->rc == 0; rep++)
        j->rc = CAT(MODEL, _run)(j->ins, j->outs, scratch, SCRATCH);
    free(scratch);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 1 + NIN + NOUT) {
        fprintf(stderr, "usage: driver %d inputs %d outputs\n", NIN, NOUT);
        return 2;
    }
    const void *ins[NIN + 1];
    void *outs[NOUT + 1];
    for (int i = 0; i < NIN; i++) ins[i] = read_file(argv[1 + i], CAT(MODEL, _input_bytes)[i]);
    for (int i = 0; i < NOUT; i++) outs[i] = calloc(1, CAT(MODEL, _output_bytes)[i] + 1);
    /* malloc's alignment is what the header asks for */
    void *scratch = malloc(SCRATCH > 0 ? SCRATCH : 1);
    int rc = CAT(MODEL, _run)(ins, outs, scratch, SCRATCH);
    if (rc != 0) {
        fprintf(stderr, "run: %s\n", CAT(MODEL, _error_string)(rc));
        return 1;
    }
    for (int i = 0; i < NOUT; i++) {
        FILE *f = fopen(argv[1 + NIN + i], "wb");
        fwrite(outs[i], 1, CAT(MODEL, _output_bytes)[i], f);
        fclose(f);
    }
    /* four threads at once, each with its own scratch, give the same bytes */
    struct job jobs[4];
    pthread_t th[4];
    for (int t = 0; t < 4; t++) {
        jobs[t].ins = ins;
        jobs[t].rc = 0;
        for (int i = 0; i < NOUT; i++) jobs[t].outs[i] = calloc(1, CAT(MODEL, _output_bytes)[i] + 1);
        pthread_create(&th[t], NULL, call, &jobs[t]);
    }
    int same = 1;
    for (int t = 0; t < 4; t++) {
        pthread_join(th[t], NULL);
        same &= jobs[t].rc == 0;
        for (int i = 0; i < NOUT; i++)
            same &= memcmp(jobs[t].outs[i], outs[i], CAT(MODEL, _output_bytes)[i]) == 0;
    }
    printf("threads_agree %d\n", same);
    /* the error codes of bad arguments */
    const void *null_in[NIN + 1];
    for (int i = 0; i < NIN; i++) null_in[i] = NULL;
    printf("null_inputs %d\n", CAT(MODEL, _run)(NULL, outs, scratch, SCRATCH));
    printf("null_outputs %d\n", CAT(MODEL, _run)(ins, NULL, scratch, SCRATCH));
    printf("null_entry %d\n", NIN > 0 ? CAT(MODEL, _run)(null_in, outs, scratch, SCRATCH) : 1);
    printf("small_scratch %d\n", CAT(MODEL, _run)(ins, outs, scratch, SCRATCH - 1));
    char *big = malloc(SCRATCH + 64);
    printf("misaligned_scratch %d\n", CAT(MODEL, _run)(ins, outs, big + 1, SCRATCH));
    printf("null_scratch %d\n", CAT(MODEL, _run)(ins, outs, NULL, 0));
    printf("message %s\n", CAT(MODEL, _error_string)(2));
    return 0;
}
