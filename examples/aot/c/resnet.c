/* The ResNet of examples/resnet, compiled ahead of time by smelt, driven from plain C: it
 * classifies the example's held-out images and checks its logits against the JIT's.
 *
 *   cargo run --example resnet    # trains, writes resnet.smelt, images.npy, labels.npy, out0.npy
 *   smelt compile resnet.smelt --target cpu --out DIR --name resnet
 *   cc -O2 -I DIR examples/aot/c/resnet.c DIR/resnet.o $(cat DIR/link-flags.txt) -o resnet
 *   ./resnet images.npy labels.npy out0.npy
 *
 * It prints the accuracy, the largest difference from the JIT's logits and how long the
 * first call took (the object has nothing to compile or load: only the scratch to touch). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "npy.h"
#include "resnet.h"

static const size_t IN_SHAPE[] = RESNET_INPUT_X0_SHAPE;
#define IMAGES (IN_SHAPE[0])

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s images.npy labels.npy jit_logits.npy\n", argv[0]);
        return 2;
    }
    float *images = read_npy(argv[1], resnet_input_bytes[0]);
    int64_t *labels = read_npy(argv[2], IMAGES * sizeof(int64_t));
    float *want = read_npy(argv[3], resnet_output_bytes[0]);
    if (!images || !labels || !want) {
        fprintf(stderr, "reading the .npy files: not the model's input, labels and output\n");
        return 2;
    }
    size_t classes = resnet_output_bytes[0] / sizeof(float) / IMAGES;
    float *logits = malloc(resnet_output_bytes[0]);
    void *scratch = aligned_alloc(64, (RESNET_SCRATCH_BYTES + 63) / 64 * 64);
    const void *ins[] = {images};
    void *outs[] = {logits};
    double t0 = now_ms();
    int rc = resnet_run(ins, outs, scratch, RESNET_SCRATCH_BYTES);
    double first = now_ms() - t0;
    if (rc != RESNET_OK) {
        fprintf(stderr, "resnet_run: %s\n", resnet_error_string(rc));
        return 1;
    }
    size_t right = 0, same = 0;
    double worst = 0.0;
    for (size_t i = 0; i < IMAGES; i++) {
        const float *row = logits + i * classes;
        size_t best = 0;
        for (size_t c = 1; c < classes; c++)
            if (row[c] > row[best]) best = c;
        right += (int64_t)best == labels[i];
        for (size_t c = 0; c < classes; c++) {
            double d = fabs((double)row[c] - (double)want[i * classes + c]);
            if (!(d <= worst)) worst = d; /* NaN counts as the worst */
            same += row[c] == want[i * classes + c];
        }
    }
    printf("%zu held-out images: accuracy %.1f%%\n", IMAGES, 100.0 * right / IMAGES);
    printf("logits against the JIT's: %zu of %zu equal, largest difference %.2e\n", same,
           IMAGES * classes, worst);
    printf("first call: %.2f ms\n", first);
    free(images);
    free(labels);
    free(want);
    free(logits);
    free(scratch);
    return worst <= 1e-5 ? 0 : 1;
}
