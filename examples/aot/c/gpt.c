/* The GPT of examples/gpt, compiled ahead of time by smelt, driven from plain C: it checks
 * the object's logits against the JIT's on the example's held-out batch, then writes text
 * one token at a time (a loop of calls, the next token chosen here).
 *
 *   cargo run --example gpt                      # trains, writes gpt.smelt, idx.npy, out0.npy
 *   smelt compile gpt.smelt --target cpu --out DIR --name gpt
 *   cc -O2 -I DIR examples/aot/c/gpt.c DIR/gpt.o $(cat DIR/link-flags.txt) -o gpt
 *   ./gpt check idx.npy out0.npy                 # logits of the object against the JIT's
 *   ./gpt generate "12+34=" [temperature seed]   # greedy at temperature 0
 *
 * The model takes a fixed window of GPT_INPUT_X0_SHAPE tokens (batch, positions); it is
 * causal, so the logits at position p depend on tokens 0..p only: a prompt sits at the
 * start of row 0 and the rest of the window is padding that no earlier position sees. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpt.h"
#include "npy.h"

static const char VOCAB[] = "0123456789+=;";
#define VOCAB_SIZE 13

static const size_t IN_SHAPE[] = GPT_INPUT_X0_SHAPE;
#define BATCH (IN_SHAPE[0])
#define CTX (IN_SHAPE[1])

static int run(const int64_t *tokens, float *logits, void *scratch) {
    const void *ins[] = {tokens};
    void *outs[] = {logits};
    int rc = gpt_run(ins, outs, scratch, GPT_SCRATCH_BYTES);
    if (rc != GPT_OK) fprintf(stderr, "gpt_run: %s\n", gpt_error_string(rc));
    return rc;
}

/* Logits of the object on the example's batch against the JIT's (`smelt run`). */
static int check(const char *idx_path, const char *want_path, void *scratch) {
    int64_t *tokens = read_npy(idx_path, gpt_input_bytes[0]);
    float *want = read_npy(want_path, gpt_output_bytes[0]);
    if (!tokens || !want) {
        fprintf(stderr, "reading %s or %s: not a .npy of the model's input and output\n", idx_path,
                want_path);
        return 2;
    }
    float *got = malloc(gpt_output_bytes[0]);
    if (run(tokens, got, scratch) != GPT_OK) return 1;
    size_t n = gpt_output_bytes[0] / sizeof(float);
    double worst = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - (double)want[i]);
        if (!(d <= worst)) worst = d; /* NaN counts as the worst */
    }
    printf("logits of %zu positions, largest difference from the JIT: %.2e\n", n / VOCAB_SIZE,
           worst);
    free(tokens);
    free(want);
    free(got);
    return worst <= 1e-4 ? 0 : 1;
}

/* A uniform draw in [0, 1) from a 64-bit xorshift state. */
static double uniform(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return (double)(*s >> 11) / 9007199254740992.0;
}

/* The next token from one position's logits: the largest at temperature 0, else a draw
 * from softmax(logits / temperature). */
static int choose(const float *logits, double temperature, uint64_t *state) {
    int best = 0;
    for (int v = 1; v < VOCAB_SIZE; v++)
        if (logits[v] > logits[best]) best = v;
    if (temperature <= 0.0) return best;
    double p[VOCAB_SIZE], sum = 0.0;
    for (int v = 0; v < VOCAB_SIZE; v++) {
        p[v] = exp(((double)logits[v] - (double)logits[best]) / temperature);
        sum += p[v];
    }
    double u = uniform(state) * sum;
    for (int v = 0; v < VOCAB_SIZE; v++) {
        if (u < p[v]) return v;
        u -= p[v];
    }
    return best;
}

static int generate(const char *prompt, double temperature, uint64_t seed, void *scratch) {
    size_t len = strlen(prompt);
    if (len == 0 || len >= CTX) {
        fprintf(stderr, "the prompt needs 1 to %zu characters\n", CTX - 1);
        return 2;
    }
    int64_t *tokens = calloc(BATCH * CTX, sizeof(int64_t));
    float *logits = malloc(gpt_output_bytes[0]);
    for (size_t i = 0; i < len; i++) {
        const char *at = strchr(VOCAB, prompt[i]);
        if (!at) {
            fprintf(stderr, "'%c' is not in the vocabulary \"%s\"\n", prompt[i], VOCAB);
            return 2;
        }
        tokens[i] = at - VOCAB;
    }
    uint64_t state = seed ? seed : 1;
    printf("%s", prompt);
    for (size_t p = len; p < CTX; p++) {
        if (run(tokens, logits, scratch) != GPT_OK) return 1;
        int next = choose(logits + (p - 1) * VOCAB_SIZE, temperature, &state);
        tokens[p] = next;
        putchar(VOCAB[next]);
    }
    putchar('\n');
    free(tokens);
    free(logits);
    return 0;
}

int main(int argc, char **argv) {
    void *scratch = malloc(GPT_SCRATCH_BYTES);
    int rc = 2;
    if (argc == 4 && strcmp(argv[1], "check") == 0) {
        rc = check(argv[2], argv[3], scratch);
    } else if (argc >= 3 && strcmp(argv[1], "generate") == 0) {
        double temperature = argc > 3 ? atof(argv[3]) : 0.0;
        uint64_t seed = argc > 4 ? strtoull(argv[4], NULL, 10) : 1;
        rc = generate(argv[2], temperature, seed, scratch);
    } else {
        fprintf(stderr, "usage: %s check IDX.npy LOGITS.npy | generate PROMPT [TEMPERATURE SEED]\n",
                argv[0]);
    }
    free(scratch);
    return rc;
}
