/* Runs two models compiled ahead of time by smelt (a transformer MLP block and a causal
 * attention block) from plain C, and prints their outputs.
 *
 *   smelt compile examples/models/mlp_block.smelt --target cpu --out DIR --name mlp
 *   smelt compile examples/models/attention.smelt --target cpu --out DIR --name attention
 *   cc -O2 -I DIR examples/aot/c/main.c DIR/mlp.o DIR/attention.o $(cat DIR/link-flags.txt)
 *
 * Input j of a model holds ((7 i + 3 j) mod 17 - 8) / 8 at element i: values every
 * language writes exactly, so a caller in any language can feed the same inputs
 * (examples/aot/rust prints the same lines). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "attention.h"
#include "mlp.h"

typedef int (*run_fn)(const void *const *, void *const *, void *, size_t);
typedef const char *(*error_fn)(int);

static float *input(size_t bytes, int j) {
    size_t n = bytes / sizeof(float);
    float *x = malloc(bytes > 0 ? bytes : 1);
    for (size_t i = 0; i < n; i++) x[i] = (float)((int)((7 * i + 3 * (size_t)j) % 17) - 8) / 8.0f;
    return x;
}

/* Runs a model on the fixed inputs and prints each output as `name output: values`. */
static int run(const char *name, run_fn f, error_fn err, int n_in, const size_t *in_bytes,
               int n_out, const size_t *out_bytes, const char *const *out_names, size_t scratch_bytes) {
    const void *ins[16];
    void *outs[16];
    for (int j = 0; j < n_in; j++) ins[j] = input(in_bytes[j], j);
    for (int j = 0; j < n_out; j++) outs[j] = malloc(out_bytes[j] > 0 ? out_bytes[j] : 1);
    /* a scratch of the stated size: the call does not allocate */
    void *scratch = malloc(scratch_bytes > 0 ? scratch_bytes : 1);
    int rc = f(ins, outs, scratch, scratch_bytes);
    if (rc != 0) {
        fprintf(stderr, "%s: %s\n", name, err(rc));
        return rc;
    }
    for (int j = 0; j < n_out; j++) {
        printf("%s %s:", name, out_names[j]);
        const float *y = outs[j];
        for (size_t i = 0; i < out_bytes[j] / sizeof(float); i++) printf(" %.6f", y[i]);
        printf("\n");
    }
    /* bad arguments get error codes, not crashes */
    printf("%s null inputs: %d (%s)\n", name, f(NULL, outs, scratch, scratch_bytes), err(f(NULL, outs, scratch, scratch_bytes)));
    printf("%s small scratch: %d (%s)\n", name, f(ins, outs, scratch, scratch_bytes / 2), err(f(ins, outs, scratch, scratch_bytes / 2)));
    /* NULL scratch: the call allocates its own */
    printf("%s null scratch: %d\n", name, f(ins, outs, NULL, 0));
    for (int j = 0; j < n_in; j++) free((void *)ins[j]);
    for (int j = 0; j < n_out; j++) free(outs[j]);
    free(scratch);
    return 0;
}

int main(void) {
    const char *mlp_outs[] = MLP_OUTPUT_NAMES;
    const char *att_outs[] = ATTENTION_OUTPUT_NAMES;
    int rc = run("mlp", mlp_run, mlp_error_string, MLP_NUM_INPUTS, mlp_input_bytes, MLP_NUM_OUTPUTS,
                 mlp_output_bytes, mlp_outs, MLP_SCRATCH_BYTES);
    if (rc == 0)
        rc = run("attention", attention_run, attention_error_string, ATTENTION_NUM_INPUTS,
                 attention_input_bytes, ATTENTION_NUM_OUTPUTS, attention_output_bytes, att_outs,
                 ATTENTION_SCRATCH_BYTES);
    return rc;
}
